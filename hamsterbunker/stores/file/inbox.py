"""The file store's inbox: admissions, and the consumption a checkpoint commits (invariant 9).

The records and their names are in ``inbox_records``. Every write happens
with the agent's lease lock held (the lock ``put_checkpoint`` uses), each file
durable (temp file, fsync, rename, directory fsync) before the next step.

An admission writes three files, in an order that makes every crash point
safe: first the last admitted number (``admitted``: a crash here leaves a gap,
a number never used), then the pending entry (which names its request id in
its header), then the request id's index. A crash before the index is written
is rolled forward by the next admission, under the lock, before it moves the
number on: the entry at the last admitted number gets its index. Until then
``read_admission`` finds it there too. Failpoints ``inbox.admit.after_number``
and ``inbox.admit.after_entry`` sit between the steps.

Consumption commits with the checkpoint, all or nothing: the checkpoint's
rename is the commit point. Under the lock, a staged record
(``staged/<seq>-<epoch>.hbt``, every consumed number, request id and reply) is
renamed into place before the checkpoint; after the checkpoint, it is applied
(a consumed record per number, its request id indexed if it is not, the
pending entry removed, each directory fsynced) and removed. What a crash
leaves is settled by the next ``put_checkpoint``, under the lock, once its
fence passed and before it stages or prunes anything: a staged record whose
checkpoint (same seq and epoch) exists is applied, one whose checkpoint does
not is removed. An apply then keeps the newest ``keep_replies`` consumed
records (by number); older ones go, their index first. Readers (who take no lock)
take a staged record whose checkpoint exists as applied, so replies are
readable as soon as the checkpoint is accepted. Failpoints
``inbox.commit.after_staged`` and ``inbox.commit.after_checkpoint``.

``reseal_reply`` (``hb rotate-secret commit``) writes the consumed record
with the new reply under a temporary name, then, under the lock, applies what
a crash left staged under a stored checkpoint (as ``put_checkpoint`` would
first: a reader takes such a reply as applied), compares the record's reply
with the one read and renames over it.

Reading, shared with readers, is in ``inbox_view``. Nothing read is trusted
(DESIGN.md invariant 10): directories are opened without following links,
files only if regular and within a cap, names and contents that do not parse
are reported once and skipped; junk planted where one of our files or
directories goes is removed by the write that needs it (a directory that is
not empty stays, and is reported).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ...errors import CorruptRecord, InboxFull, NotNextNumber, StoreError
from ...failpoints import failpoint
from ...limits import check_submission_bounds
from ..base import Consumed, inbox_full
from ..reseal import check_resealed_reply
from .fileio import closing_fd, discard, make_subdir, write_temp
from .inbox_records import (
    COUNTER_NAME,
    DONE_CAP,
    DONE_NAME,
    HEADER_BYTES,
    PENDING_CAP,
    PENDING_NAME,
    counter_bytes,
    done_bytes,
    done_name,
    head_request_id,
    index_bytes,
    index_name,
    parse_done,
    pending_bytes,
    pending_name,
    staged_bytes,
    staged_name,
)
from .inbox_view import SUBDIRS, InboxDirs, InboxView
from .layout import agent_parts, log
from .lease import lease_locked
from .tree import StoreTree

__all__ = ["InboxFiles", "Staging"]


@dataclass
class Staging:
    """put_checkpoint's inbox: its directories, and the staged record's temporary name."""

    dirs: InboxDirs
    tmp: str | None
    consumed: list[Consumed]


class InboxFiles(InboxView):
    """Store.admit, read_inbox, read_admission, and the consumption put_checkpoint commits."""

    def __init__(self, tree: StoreTree, *, keep_replies: int, lock_timeout: float) -> None:
        super().__init__(tree)
        self._keep = keep_replies
        self._lock_timeout = lock_timeout

    # -- the contract ------------------------------------------------------------

    def admit(self, agent: str, request_id: str, number: int, blob: bytes) -> tuple[int, bool]:
        problem = check_submission_bounds(number, request_id, len(blob))
        if problem is not None:
            raise StoreError(problem)  # before anything is written
        agent_dir = self._tree.agent_dir(agent)
        with contextlib.ExitStack() as stack:
            agent_fd = stack.enter_context(self._tree.writing(*agent_parts(agent)))
            dirs = self._made(stack, agent_fd, agent)
            assert dirs.pending is not None
            # Written and synced before the lock, under a temporary name: the lock is
            # held only for the checks and the renames.
            tmp = write_temp(dirs.pending, pending_bytes(request_id, blob), durable=True)
            stack.callback(discard, dirs.pending, tmp)
            with lease_locked(agent_fd, agent_dir, agent, self._lock_timeout):
                return self._admit_locked(dirs, request_id, number, tmp, len(blob))
        raise AssertionError("unreachable")  # pragma: no cover (mypy: ExitStack may swallow)

    def reseal_reply(self, agent: str, number: int, old: bytes, new: bytes) -> bool:
        """Store.reseal_reply: the consumed record rewritten with new under the lock, after
        what a crash left staged under a stored checkpoint is applied (as a reader takes it)."""
        check_resealed_reply(number, new)
        agent_dir = self._tree.agent_dir(agent)
        name = done_name(number)
        with contextlib.ExitStack() as stack:
            agent_fd = stack.enter_context(self._tree.reading(*agent_parts(agent)))
            dirs = self._opened(stack, agent_fd, agent)
            if agent_fd is None or dirs.done is None:
                return False
            path = dirs.path / "done" / name
            seen = self._read(dirs.done, name, path, DONE_CAP)
            parsed = None if seen is None else parse_done(seen)
            # Written and synced before the lock where it can be: the lock is held only to
            # compare and rename.
            tmp = None
            if parsed is not None and parsed[1] == old:
                tmp = write_temp(dirs.done, done_bytes(parsed[0], new), durable=True)
                stack.callback(discard, dirs.done, tmp)
            elif number not in self._overlay(dirs):
                return False
            failpoint("reseal.before_commit")
            with lease_locked(agent_fd, agent_dir, agent, self._lock_timeout):
                if None not in (dirs.pending, dirs.ids, dirs.staged) and self._overlay(dirs):
                    self.settle(Staging(dirs, None, []))  # what put_checkpoint does first
                now = self._read(dirs.done, name, path, DONE_CAP)
                parsed = None if now is None else parse_done(now)
                if parsed is None or parsed[1] != old:
                    return False  # removed by retention, or another record now
                if tmp is None or now != seen:
                    tmp = write_temp(dirs.done, done_bytes(parsed[0], new), durable=True)
                    stack.callback(discard, dirs.done, tmp)
                os.replace(tmp, name, src_dir_fd=dirs.done, dst_dir_fd=dirs.done)
                os.fsync(dirs.done)
                return True
        raise AssertionError("unreachable")  # pragma: no cover (mypy: ExitStack may swallow)

    # -- put_checkpoint's part, in its order -------------------------------------

    def prepare(
        self,
        stack: contextlib.ExitStack,
        agent_fd: int,
        agent: str,
        checkpoints: int,
        consumed: Sequence[Consumed],
    ) -> Staging:
        """Open the inbox (made if needed) and write the staged record's temporary file.

        Before the lock. The temporary file is removed when stack closes.
        """
        dirs = InboxDirs(self._tree.agent_dir(agent) / "inbox")
        if consumed or self._open(stack, agent_fd, "inbox", dirs.path) is not None:
            dirs = self._made(stack, agent_fd, agent)
        dirs.checkpoints = checkpoints
        staging = Staging(dirs, None, list(consumed))
        if consumed:
            assert dirs.staged is not None
            staging.tmp = write_temp(dirs.staged, staged_bytes(staging.consumed), durable=True)
            stack.callback(discard, dirs.staged, staging.tmp)
        return staging

    def settle(self, staging: Staging) -> None:
        """Under the lock, first: apply what a crash left staged under a stored checkpoint,
        and remove what it left staged under none (its checkpoint was never written)."""
        dirs = staging.dirs
        if dirs.staged is None:
            return
        names = self._staged_names(dirs)
        for (seq, epoch), name in names:
            path = dirs.path / "staged" / name
            if self._has_checkpoint(dirs, seq, epoch):
                consumed = self._staged_record(dirs, name)
                if consumed is None:
                    self._tree.report(f"{path} cannot be applied: removed")
                else:
                    log.info("applying %s, left by a checkpoint write cut short", path)
                    self._apply(dirs, consumed)
            else:
                log.info("removing %s: its checkpoint was never written", path)
            self._remove(dirs.staged, name, path)
        if names:
            os.fsync(dirs.staged)

    def stage(self, staging: Staging, seq: int, epoch: int) -> None:
        """Under the lock, before the checkpoint's rename: the staged record takes its name."""
        dirs = staging.dirs
        if staging.tmp is None or dirs.staged is None:
            return
        os.replace(
            staging.tmp, staged_name(seq, epoch), src_dir_fd=dirs.staged, dst_dir_fd=dirs.staged
        )
        os.fsync(dirs.staged)
        failpoint("inbox.commit.after_staged")

    def apply(self, staging: Staging, seq: int, epoch: int) -> None:
        """Under the lock, once the checkpoint is durable: apply the staged record and remove it.

        Never raises: the checkpoint is accepted, and what is not applied now
        (reported) is read as applied and applied by the next checkpoint.
        """
        dirs = staging.dirs
        if staging.tmp is None or dirs.staged is None:
            return
        failpoint("inbox.commit.after_checkpoint")
        name = staged_name(seq, epoch)
        try:
            self._apply(dirs, staging.consumed)
            self._remove(dirs.staged, name, dirs.path / "staged" / name)
            os.fsync(dirs.staged)
        except (OSError, StoreError) as exc:
            self._tree.report(
                f"consumption staged in {dirs.path / 'staged' / name} is left "
                f"for the next checkpoint to apply: {exc}"
            )

    # -- opening ---------------------------------------------------------------

    def _made(self, stack: contextlib.ExitStack, agent_fd: int, agent: str) -> InboxDirs:
        """The inbox's directories for writing, made where absent (junk in their place removed)."""
        agent_dir = self._tree.agent_dir(agent)
        dirs = InboxDirs(agent_dir / "inbox")
        dirs.inbox = self._make(stack, agent_fd, "inbox", dirs.path)
        dirs.checkpoints = self._open(stack, agent_fd, "checkpoints", agent_dir / "checkpoints")
        self._tree.sweep_once(agent_parts(agent, "inbox"), dirs.inbox)
        for sub in SUBDIRS:
            fd = self._make(stack, dirs.inbox, sub, dirs.path / sub)
            self._tree.sweep_once(agent_parts(agent, "inbox", sub), fd)
            setattr(dirs, sub, fd)
        return dirs

    def _make(self, stack: contextlib.ExitStack, parent: int, name: str, path: Path) -> int:
        try:
            fd = make_subdir(parent, name, path)
        except CorruptRecord as exc:  # a file or a symlink in its place: junk
            self._tree.report(f"{exc}; removed, so that the inbox can be written")
            discard(parent, name)
            fd = make_subdir(parent, name, path)
        return stack.enter_context(closing_fd(fd))

    # -- admitting -------------------------------------------------------------

    def _admit_locked(
        self, dirs: InboxDirs, request_id: str, number: int, tmp: str, size: int
    ) -> tuple[int, bool]:
        assert dirs.inbox is not None and dirs.pending is not None and dirs.ids is not None
        last = self._last(dirs)
        self._roll_forward(dirs, last)
        overlay = self._overlay(dirs)
        known = self._state(dirs, request_id, overlay)
        if known is not None:
            return known.number, True
        if number != last + 1:
            raise NotNextNumber(number, last + 1)
        count, total = self._unconsumed(dirs, overlay)
        full = inbox_full(count + 1, total + size)
        if full is not None:
            raise InboxFull(full)
        # The number first: a crash after it leaves a gap, never a number given twice.
        self._write(dirs.inbox, COUNTER_NAME, counter_bytes(number), dirs.path, required=True)
        failpoint("inbox.admit.after_number")
        self._rename(dirs.pending, tmp, pending_name(number), dirs.path / "pending")
        os.fsync(dirs.pending)
        failpoint("inbox.admit.after_entry")
        self._write(
            dirs.ids, index_name(request_id), index_bytes(request_id, number),
            dirs.path / "ids", required=True,
        )  # fmt: skip
        return number, False

    def _last(self, dirs: InboxDirs) -> int:
        """The last admitted number: the counter, unless it is missing, junk, or behind an
        entry (then the highest number an entry has)."""
        last = self._counter(dirs)
        if last is not None and not self._exists(dirs, last + 1):
            return last
        pending = self._numbered(dirs.pending, PENDING_NAME, dirs.path / "pending")
        done = self._numbered(dirs.done, DONE_NAME, dirs.path / "done")
        highest = max([number for number, _name in pending + done], default=0)
        if last is not None:
            self._tree.report(f"inbox: {dirs.path / COUNTER_NAME} is behind its entries")
        return max(last or 0, highest)

    def _exists(self, dirs: InboxDirs, number: int) -> bool:
        for fd, name in ((dirs.pending, pending_name(number)), (dirs.done, done_name(number))):
            if fd is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.stat(name, dir_fd=fd, follow_symlinks=False)
                    return True
        return False

    def _roll_forward(self, dirs: InboxDirs, last: int) -> None:
        """Index the entry at the last admitted number if its admission was cut short before."""
        if not last:
            return
        name = pending_name(last)
        head = self._head(dirs.pending, name, dirs.path / "pending" / name)
        request_id = head_request_id(head, pending=True) if isinstance(head, bytes) else None
        if request_id is None or self._state(dirs, request_id, {}, unindexed=False) is not None:
            return
        log.info("indexing request id %s, admitted as %d before a crash", request_id, last)
        assert dirs.ids is not None
        self._write(
            dirs.ids, index_name(request_id), index_bytes(request_id, last), dirs.path / "ids",
            required=True,
        )  # fmt: skip

    def _unconsumed(self, dirs: InboxDirs, overlay: dict[int, Consumed]) -> tuple[int, int]:
        """How many submissions are pending, and their sealed bytes (from the listing)."""
        count = size = 0
        assert dirs.pending is not None
        for number, name in self._numbered(dirs.pending, PENDING_NAME, dirs.path / "pending"):
            if number in overlay:
                continue
            try:
                st = os.stat(name, dir_fd=dirs.pending, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if stat.S_ISREG(st.st_mode) and HEADER_BYTES <= st.st_size <= PENDING_CAP:
                count += 1
                size += st.st_size - HEADER_BYTES
        return count, size

    # -- writing ---------------------------------------------------------------

    def _write(
        self, fd: int, name: str, data: bytes, directory: Path, *, required: bool, sync: bool = True
    ) -> bool:
        """Replace name in fd durably (sync: the directory too); False (reported) if junk
        there cannot be removed and not required (else CorruptRecord)."""
        tmp = write_temp(fd, data, durable=True)
        try:
            self._rename(fd, tmp, name, directory)
        except CorruptRecord as exc:
            if required:
                raise
            self._tree.report(str(exc))
            return False
        finally:
            discard(fd, tmp)
        if sync:
            os.fsync(fd)
        return True

    def _rename(self, fd: int, tmp: str, name: str, directory: Path) -> None:
        """Rename tmp to name in fd; an empty directory planted under name is removed."""
        try:
            os.replace(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
            return
        except OSError as exc:
            if exc.errno not in (errno.EISDIR, errno.ENOTEMPTY, errno.EEXIST):
                raise
        self._tree.report(f"{directory / name} is a directory: removed, to write there")
        try:
            os.rmdir(name, dir_fd=fd)
        except OSError as exc:
            raise CorruptRecord(
                f"{directory / name} is a directory that cannot be removed: {exc.strerror}"
            ) from exc
        os.replace(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)

    def _remove(self, fd: int, name: str, path: Path) -> None:
        """Remove a file (or an empty directory planted there); report what stays."""
        try:
            os.unlink(name, dir_fd=fd)
        except FileNotFoundError:
            pass
        except IsADirectoryError:
            try:
                os.rmdir(name, dir_fd=fd)
            except OSError as exc:
                self._tree.report(f"could not remove {path}: {exc.strerror}")

    def _apply(self, dirs: InboxDirs, consumed: Sequence[Consumed]) -> None:
        """Record each consumed (its reply kept), index its request id if it is not, remove its
        pending entry, then drop the oldest records past keep_replies. Idempotent."""
        assert dirs.done is not None and dirs.ids is not None and dirs.pending is not None
        done, ids, pending = dirs.path / "done", dirs.path / "ids", dirs.path / "pending"
        for each in consumed:
            record = done_bytes(each.request_id, each.reply)
            self._write(dirs.done, done_name(each.number), record, done, required=False, sync=False)
        os.fsync(dirs.done)
        for each in consumed:
            if self._state(dirs, each.request_id, {}, unindexed=False) is None:
                record = index_bytes(each.request_id, each.number)
                name = index_name(each.request_id)
                self._write(dirs.ids, name, record, ids, required=False, sync=False)
        os.fsync(dirs.ids)
        for each in consumed:
            self._remove(dirs.pending, pending_name(each.number), pending)
        os.fsync(dirs.pending)
        self._retain(dirs)

    def _retain(self, dirs: InboxDirs) -> None:
        """Keep the newest keep_replies consumed records; older ones go with their index."""
        assert dirs.done is not None and dirs.ids is not None
        done = dirs.path / "done"
        records = self._numbered(dirs.done, DONE_NAME, done)
        old = records[: max(len(records) - self._keep, 0)]
        if not old:
            return
        for number, name in old:
            head = self._head(dirs.done, name, done / name)
            request_id = head_request_id(head, pending=False) if isinstance(head, bytes) else None
            if request_id is not None and self._index(dirs, request_id) == number:
                self._remove(dirs.ids, index_name(request_id), dirs.path / "ids")
        os.fsync(dirs.ids)
        for _number, name in old:
            self._remove(dirs.done, name, done / name)
        os.fsync(dirs.done)
