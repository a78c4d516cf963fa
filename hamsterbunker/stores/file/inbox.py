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
leaves is settled by the next ``put_checkpoint``, under the lock, before
anything else: a staged record whose checkpoint (same seq and epoch) exists is
applied, one whose checkpoint does not is removed. Readers (who take no lock)
take a staged record whose checkpoint exists as applied, so replies are
readable as soon as the checkpoint is accepted. Failpoints
``inbox.commit.after_staged`` and ``inbox.commit.after_checkpoint``.

Nothing read here is trusted (DESIGN.md invariant 10): directories are opened
without following links, files only if regular and within a cap, names and
contents that do not parse are reported once and skipped; junk planted where
one of our files or directories goes is removed by the write that needs it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from ...errors import CorruptRecord, InboxFull, NotNextNumber, StoreError
from ...failpoints import failpoint
from ...limits import (
    MAX_CONSUMED_PER_STEP,
    MAX_INBOX_BYTES,
    MAX_INBOX_COUNT,
    check_reply_bounds,
    check_request_id,
    check_submission_bounds,
)
from ..base import AdmissionState, Consumed
from .fileio import (
    TMP_PREFIX,
    closing_fd,
    dir_entries,
    discard,
    make_subdir,
    open_regular,
    opened_subdir,
    pread_upto,
    read_file,
    write_temp,
)
from .inbox_records import (
    COUNTER_NAME,
    DONE_CAP,
    DONE_NAME,
    HEADER_BYTES,
    INDEX_CAP,
    PENDING_CAP,
    PENDING_NAME,
    STAGED_CAP,
    STAGED_NAME,
    counter_bytes,
    done_bytes,
    done_name,
    head_request_id,
    index_bytes,
    index_name,
    number_of,
    parse_counter,
    parse_done,
    parse_index,
    parse_pending,
    parse_staged,
    pending_bytes,
    pending_name,
    staged_bytes,
    staged_key,
    staged_name,
)
from .layout import agent_parts, checkpoint_name, is_sync_copy, log
from .lease import lease_locked
from .tree import StoreTree

__all__ = ["InboxFiles", "Staging", "check_consumed"]

_SUBDIRS = ("pending", "done", "ids", "staged")
# The most files read_inbox opens in one call: planted entries cannot make it read on.
_READ_BUDGET = 2 * MAX_INBOX_COUNT
# What opening a directory answers when its permissions keep us out: junk, left out.
_SHUT_OUT = {errno.EACCES, errno.EPERM}


def check_consumed(consumed: Sequence[Consumed]) -> str | None:
    """Why a checkpoint may not carry these consumed submissions, or None if it may."""
    if len(consumed) > MAX_CONSUMED_PER_STEP:
        return (
            f"a step consumed {len(consumed)} submissions, above the limit of "
            f"{MAX_CONSUMED_PER_STEP} per step"
        )
    for each in consumed:
        size = None if each.reply is None else len(each.reply)
        problem = check_reply_bounds(each.number, each.request_id, size)
        if problem is not None:
            return problem
    return None


def _inbox_full(count: int, size: int) -> str | None:
    """Why an inbox holding count unconsumed submissions of size bytes is over its limits."""
    if count > MAX_INBOX_COUNT:
        return f"inbox is full: it holds {MAX_INBOX_COUNT} unconsumed submissions, the limit"
    if size > MAX_INBOX_BYTES:
        return (
            f"inbox is full: this submission would make its unconsumed submissions {size} "
            f"bytes, above the limit of {MAX_INBOX_BYTES} bytes ({MAX_INBOX_BYTES // 2**20} MiB)"
        )
    return None


@dataclass
class _Dirs:
    """The inbox's directories of one agent, open (None: absent, or junk reported)."""

    path: Path  # agents/<agent>/inbox, for messages
    inbox: int | None = None
    pending: int | None = None
    done: int | None = None
    ids: int | None = None
    staged: int | None = None
    checkpoints: int | None = None


@dataclass
class Staging:
    """put_checkpoint's inbox: its directories, and the staged record's temporary name."""

    dirs: _Dirs
    tmp: str | None
    consumed: list[Consumed]


class _Junk:
    """Something other than a regular file under a record's name."""


_JUNK = _Junk()


class InboxFiles:
    """Store.admit, read_inbox, read_admission, and the consumption put_checkpoint commits."""

    def __init__(self, tree: StoreTree, *, keep_replies: int, lock_timeout: float) -> None:
        self._tree = tree
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

    def read_inbox(self, agent: str, after: int = 0) -> list[tuple[int, bytes]]:
        try:
            with self._reading(agent) as dirs:
                return self._listed(dirs, after)
        except CorruptRecord as exc:
            self._tree.report(f"inbox left out: {exc}")
            return []

    def read_admission(self, agent: str, request_id: str) -> AdmissionState | None:
        if check_request_id(request_id) is not None:
            return None  # never admitted: admit refuses it
        try:
            with self._reading(agent) as dirs:
                return self._state(dirs, request_id, self._overlay(dirs))
        except CorruptRecord as exc:
            self._tree.report(f"inbox left out: {exc}")
            return None

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
        dirs = _Dirs(self._tree.agent_dir(agent) / "inbox")
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
        for (seq, epoch), name in self._staged_names(dirs):
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

    @contextlib.contextmanager
    def _reading(self, agent: str) -> Iterator[_Dirs]:
        """The inbox's directories for reading: none is made; junk is reported and left out."""
        agent_dir = self._tree.agent_dir(agent)
        dirs = _Dirs(agent_dir / "inbox")
        with contextlib.ExitStack() as stack:
            agent_fd = stack.enter_context(self._tree.reading(*agent_parts(agent)))
            if agent_fd is not None:
                dirs.inbox = self._open(stack, agent_fd, "inbox", dirs.path)
                dirs.checkpoints = self._open(
                    stack, agent_fd, "checkpoints", agent_dir / "checkpoints"
                )
            if dirs.inbox is not None:
                for sub in _SUBDIRS:
                    setattr(dirs, sub, self._open(stack, dirs.inbox, sub, dirs.path / sub))
            yield dirs

    def _made(self, stack: contextlib.ExitStack, agent_fd: int, agent: str) -> _Dirs:
        """The inbox's directories for writing, made where absent (junk in their place removed)."""
        agent_dir = self._tree.agent_dir(agent)
        dirs = _Dirs(agent_dir / "inbox")
        dirs.inbox = self._make(stack, agent_fd, "inbox", dirs.path)
        dirs.checkpoints = self._open(stack, agent_fd, "checkpoints", agent_dir / "checkpoints")
        self._tree.sweep_once(agent_parts(agent, "inbox"), dirs.inbox)
        for sub in _SUBDIRS:
            fd = self._make(stack, dirs.inbox, sub, dirs.path / sub)
            self._tree.sweep_once(agent_parts(agent, "inbox", sub), fd)
            setattr(dirs, sub, fd)
        return dirs

    def _open(self, stack: contextlib.ExitStack, parent: int, name: str, path: Path) -> int | None:
        try:
            return stack.enter_context(opened_subdir(parent, name, path))
        except CorruptRecord as exc:
            self._tree.report(f"inbox: left out: {exc}")
        except OSError as exc:
            if exc.errno not in _SHUT_OUT:
                raise
            self._tree.report(f"inbox: left out: cannot open {path}: {exc.strerror}")
        return None

    def _make(self, stack: contextlib.ExitStack, parent: int, name: str, path: Path) -> int:
        try:
            fd = make_subdir(parent, name, path)
        except CorruptRecord as exc:  # a file or a symlink in its place: junk
            self._tree.report(f"{exc}; removed, so that the inbox can be written")
            discard(parent, name)
            fd = make_subdir(parent, name, path)
        return stack.enter_context(closing_fd(fd))

    # -- reading ---------------------------------------------------------------

    def _read(self, fd: int | None, name: str, path: Path, cap: int) -> bytes | None:
        """A file's bytes; None if absent, or (reported) not a regular file within cap."""
        data = self._read_or_junk(fd, name, path, cap)
        return data if isinstance(data, bytes) else None

    def _read_or_junk(
        self, fd: int | None, name: str, path: Path, cap: int
    ) -> bytes | _Junk | None:
        """A file's bytes; None if absent; _JUNK (reported) if not a regular file within cap."""
        if fd is None:
            return None
        try:
            return read_file(fd, name, path, cap)
        except CorruptRecord as exc:
            self._tree.report(f"inbox: left out: {exc}")
        except OSError as exc:
            if exc.errno not in _SHUT_OUT:
                raise
            self._tree.report(f"inbox: left out: cannot open {path}: {exc.strerror}")
        return _JUNK

    def _head(self, fd: int | None, name: str, path: Path) -> bytes | _Junk | None:
        """The first HEADER_BYTES of a file; None if absent, _JUNK if not a regular file."""
        if fd is None:
            return None
        try:
            opened = open_regular(fd, name, path)
        except FileNotFoundError:
            return None
        except CorruptRecord as exc:
            self._tree.report(f"inbox: left out: {exc}")
            return _JUNK
        except OSError as exc:
            if exc.errno not in _SHUT_OUT:
                raise
            self._tree.report(f"inbox: left out: cannot open {path}: {exc.strerror}")
            return _JUNK
        with closing_fd(opened):
            return pread_upto(opened, 0, HEADER_BYTES)

    def _numbered(
        self, fd: int | None, pattern: re.Pattern[str], path: Path
    ) -> list[tuple[int, str]]:
        """(number, name) of each entry under a numbered name in fd, by number; junk reported."""
        if fd is None:
            return []
        found, junk = [], []
        for entry in dir_entries(fd):
            match = pattern.fullmatch(entry.name)
            number = None if match is None else number_of(match)
            if number is not None:
                found.append((number, entry.name))
            elif not entry.name.startswith(TMP_PREFIX) and not is_sync_copy(entry.name):
                junk.append(entry.name)
        self._report_junk(path, junk)
        return sorted(found)

    def _report_junk(self, path: Path, junk: list[str]) -> None:
        if junk:  # one message a directory: planted names must not use up the reports
            more = f" (and {len(junk) - 1} more entries)" if len(junk) > 1 else ""
            self._tree.report(f"ignoring {path / sorted(junk)[0]}{more}: not an inbox name")

    def _staged_names(self, dirs: _Dirs) -> list[tuple[tuple[int, int], str]]:
        if dirs.staged is None:
            return []
        found, junk = [], []
        for entry in dir_entries(dirs.staged):
            match = STAGED_NAME.fullmatch(entry.name)
            key = None if match is None else staged_key(match)
            if key is not None:
                found.append((key, entry.name))
            elif not entry.name.startswith(TMP_PREFIX) and not is_sync_copy(entry.name):
                junk.append(entry.name)
        self._report_junk(dirs.path / "staged", junk)
        return sorted(found)

    def _has_checkpoint(self, dirs: _Dirs, seq: int, epoch: int) -> bool:
        if dirs.checkpoints is None:
            return False
        try:
            st = os.stat(
                checkpoint_name(seq, epoch), dir_fd=dirs.checkpoints, follow_symlinks=False
            )
        except FileNotFoundError:
            return False
        return stat.S_ISREG(st.st_mode)

    def _staged_record(self, dirs: _Dirs, name: str) -> list[Consumed] | None:
        path = dirs.path / "staged" / name
        data = self._read(dirs.staged, name, path, STAGED_CAP)
        consumed = None if data is None else parse_staged(data)
        if data is not None and consumed is None:
            self._tree.report(f"inbox: left out: {path} does not parse")
        return consumed

    def _overlay(self, dirs: _Dirs) -> dict[int, Consumed]:
        """What staged records under stored checkpoints consume: applied, for a reader.

        Only after a crash between a checkpoint's rename and its apply (or during
        an apply) is there any.
        """
        overlay: dict[int, Consumed] = {}
        for (seq, epoch), name in self._staged_names(dirs):
            if self._has_checkpoint(dirs, seq, epoch):
                for each in self._staged_record(dirs, name) or ():
                    overlay[each.number] = each
        return overlay

    def _listed(self, dirs: _Dirs, after: int) -> list[tuple[int, bytes]]:
        overlay = self._overlay(dirs)
        found: list[tuple[int, bytes]] = []
        budget = _READ_BUDGET
        path = dirs.path / "pending"
        for number, name in self._numbered(dirs.pending, PENDING_NAME, path):
            if number <= after or number in overlay:
                continue
            if len(found) >= MAX_INBOX_COUNT or budget <= 0:
                break
            budget -= 1
            data = self._read(dirs.pending, name, path / name, PENDING_CAP)
            parsed = None if data is None else parse_pending(data)
            if parsed is not None:
                found.append((number, parsed[1]))
            elif data is not None:
                self._tree.report(f"inbox: left out: {path / name} does not parse")
        return found

    def _counter(self, dirs: _Dirs) -> int | None:
        """The last admitted number as stored; None if absent or junk (reported)."""
        data = self._read(dirs.inbox, COUNTER_NAME, dirs.path / COUNTER_NAME, INDEX_CAP)
        number = None if data is None else parse_counter(data)
        if data is not None and number is None:
            self._tree.report(f"inbox: {dirs.path / COUNTER_NAME} does not parse")
        return number

    def _index(self, dirs: _Dirs, request_id: str) -> int | None:
        """The number request_id's index names, or None (absent, or junk: reported)."""
        name = index_name(request_id)
        data = self._read(dirs.ids, name, dirs.path / "ids" / name, INDEX_CAP)
        parsed = None if data is None else parse_index(data)
        if parsed is not None and parsed[0] == request_id:
            return parsed[1]
        if data is not None:
            self._tree.report(f"inbox: {dirs.path / 'ids' / name} does not parse")
        return None

    def _state(
        self, dirs: _Dirs, request_id: str, overlay: dict[int, Consumed], *, unindexed: bool = True
    ) -> AdmissionState | None:
        """What is known of request_id: through its index, else (unindexed) at the last number
        admitted (an admission cut short before its index) or in the overlay."""
        number = self._index(dirs, request_id)
        if number is not None:
            state = self._state_at(dirs, number, request_id, overlay, indexed=True)
            if state is not None:
                return state
        if not unindexed:
            return None
        last = self._counter(dirs)
        if last:
            state = self._state_at(dirs, last, request_id, overlay, indexed=False)
            if state is not None:
                return state
        for each in overlay.values():
            if each.request_id == request_id:
                return AdmissionState(each.number, consumed=True, reply=each.reply)
        return None

    def _state_at(
        self, dirs: _Dirs, number: int, request_id: str, overlay: dict[int, Consumed], *,
        indexed: bool,
    ) -> AdmissionState | None:  # fmt: skip
        """request_id's state as the entries under number say; None if none is request_id's.

        A consumed record there that cannot be read counts (as consumed, no
        reply) only when the index names it: never for a request id unknown.
        """
        staged = overlay.get(number)
        if staged is not None and staged.request_id == request_id:
            return AdmissionState(number, consumed=True, reply=staged.reply)
        # The pending entry first: an apply writes the consumed record before it
        # removes the entry, so a reader never finds neither.
        name = pending_name(number)
        head = self._head(dirs.pending, name, dirs.path / "pending" / name)
        if isinstance(head, bytes) and head_request_id(head, pending=True) == request_id:
            return AdmissionState(number, consumed=False, reply=None)
        name = done_name(number)
        path = dirs.path / "done" / name
        data = self._read_or_junk(dirs.done, name, path, DONE_CAP)
        parsed = parse_done(data) if isinstance(data, bytes) else None
        if parsed is not None:
            return AdmissionState(number, True, parsed[1]) if parsed[0] == request_id else None
        if indexed and data is not None:
            self._tree.report(f"inbox: {path} does not parse: taken as consumed with no reply")
            return AdmissionState(number, consumed=True, reply=None)
        return None

    # -- admitting -------------------------------------------------------------

    def _admit_locked(
        self, dirs: _Dirs, request_id: str, number: int, tmp: str, size: int
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
        full = _inbox_full(count + 1, total + size)
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

    def _last(self, dirs: _Dirs) -> int:
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

    def _exists(self, dirs: _Dirs, number: int) -> bool:
        for fd, name in ((dirs.pending, pending_name(number)), (dirs.done, done_name(number))):
            if fd is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.stat(name, dir_fd=fd, follow_symlinks=False)
                    return True
        return False

    def _roll_forward(self, dirs: _Dirs, last: int) -> None:
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

    def _unconsumed(self, dirs: _Dirs, overlay: dict[int, Consumed]) -> tuple[int, int]:
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

    def _apply(self, dirs: _Dirs, consumed: Sequence[Consumed]) -> None:
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

    def _retain(self, dirs: _Dirs) -> None:
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
