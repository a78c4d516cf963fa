"""Reading the file store's inbox, without the lock (the part of ``stores.file.inbox`` that
admissions, checkpoints and readers share).

A reader takes no lock: it sees each write's files appear in their order (see
``stores.file.inbox``). It takes a staged record whose checkpoint is stored as
applied (``overlay``), finds a pending entry before a consumed record (an
apply writes the record before it removes the entry), and finds an admission
cut short before its index at the last admitted number.

Nothing read is trusted (DESIGN.md invariant 10): directories are opened
without following links, files only if regular and within a cap, and names
or contents that do not parse are reported once and left out.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ...errors import CorruptRecord
from ...limits import MAX_INBOX_COUNT, check_request_id
from ...read_bounds import INBOX_READ, BoundedRead
from ..base import AdmissionState, Consumed
from ..reseal import reply_page_bounds
from .fileio import (
    TMP_PREFIX,
    closing_fd,
    dir_entries,
    open_regular,
    opened_subdir,
    pread_upto,
    read_file,
)
from .inbox_records import (
    COUNTER_NAME,
    DONE_CAP,
    DONE_NAME,
    HEADER_BYTES,
    INDEX_CAP,
    INDEX_NAME,
    PENDING_CAP,
    PENDING_NAME,
    STAGED_CAP,
    STAGED_NAME,
    done_name,
    head_request_id,
    index_name,
    number_of,
    parse_counter,
    parse_done,
    parse_index,
    parse_pending,
    parse_staged,
    pending_name,
    staged_key,
)
from .layout import agent_parts, checkpoint_name, is_sync_copy
from .tree import StoreTree

__all__ = ["JUNK", "SUBDIRS", "InboxDirs", "InboxView", "Junk"]

SUBDIRS = ("pending", "done", "ids", "staged")
# The most files read_inbox opens in one call: planted entries cannot make it read on.
_READ_BUDGET = 2 * MAX_INBOX_COUNT
# What opening a directory answers when its permissions keep us out: junk, left out.
_SHUT_OUT = {errno.EACCES, errno.EPERM}


@dataclass
class InboxDirs:
    """The inbox's directories of one agent, open (None: absent, or junk reported)."""

    path: Path  # agents/<agent>/inbox, for messages
    inbox: int | None = None
    pending: int | None = None
    done: int | None = None
    ids: int | None = None
    staged: int | None = None
    checkpoints: int | None = None


class Junk:
    """Something other than a regular file under a record's name."""


JUNK = Junk()


class InboxView:
    """Store.read_inbox and read_admission, and the reading admissions and checkpoints do."""

    def __init__(self, tree: StoreTree) -> None:
        self._tree = tree

    # -- the contract ------------------------------------------------------------

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

    def request_ids(self, agent: str, most: int) -> list[str]:
        """The request ids the inbox indexes (pending, or consumed and kept), at most most
        of them (``hb migrate-store``); junk passed over."""
        found: list[str] = []
        with self._reading(agent) as dirs:
            # Junk beside them takes its part of the listing's bound.
            for entry in [] if dirs.ids is None else dir_entries(dirs.ids, 2 * most):
                if INDEX_NAME.fullmatch(entry.name):
                    data = self._read(
                        dirs.ids, entry.name, dirs.path / "ids" / entry.name, INDEX_CAP
                    )
                    parsed = None if data is None else parse_index(data)
                    if parsed is not None and len(found) < most:
                        found.append(parsed[0])
        return found

    def read_replies(
        self, agent: str, after: int, limit: int
    ) -> tuple[list[tuple[int, bytes]], int | None]:
        count, scan = reply_page_bounds(limit)
        try:
            with self._reading(agent) as dirs:
                return self._replies(dirs, after, count, scan)
        except CorruptRecord as exc:
            self._tree.report(f"inbox left out: {exc}")
            return [], None

    # -- opening ---------------------------------------------------------------

    @contextlib.contextmanager
    def _reading(self, agent: str) -> Iterator[InboxDirs]:
        """The inbox's directories for reading: none is made; junk is reported and left out."""
        with contextlib.ExitStack() as stack:
            agent_fd = stack.enter_context(self._tree.reading(*agent_parts(agent)))
            yield self._opened(stack, agent_fd, agent)

    def _opened(self, stack: contextlib.ExitStack, agent_fd: int | None, agent: str) -> InboxDirs:
        """The inbox's directories in agent_fd, open until stack closes; none is made."""
        agent_dir = self._tree.agent_dir(agent)
        dirs = InboxDirs(agent_dir / "inbox")
        if agent_fd is not None:
            dirs.inbox = self._open(stack, agent_fd, "inbox", dirs.path)
            dirs.checkpoints = self._open(stack, agent_fd, "checkpoints", agent_dir / "checkpoints")
        if dirs.inbox is not None:
            for sub in SUBDIRS:
                setattr(dirs, sub, self._open(stack, dirs.inbox, sub, dirs.path / sub))
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

    # -- reading ---------------------------------------------------------------

    def _read(self, fd: int | None, name: str, path: Path, cap: int) -> bytes | None:
        """A file's bytes; None if absent, or (reported) not a regular file within cap."""
        data = self._read_or_junk(fd, name, path, cap)
        return data if isinstance(data, bytes) else None

    def _read_or_junk(self, fd: int | None, name: str, path: Path, cap: int) -> bytes | Junk | None:
        """A file's bytes; None if absent; JUNK (reported) if not a regular file within cap."""
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
        return JUNK

    def _head(self, fd: int | None, name: str, path: Path) -> bytes | Junk | None:
        """The first HEADER_BYTES of a file; None if absent, JUNK if not a regular file."""
        if fd is None:
            return None
        try:
            opened = open_regular(fd, name, path)
        except FileNotFoundError:
            return None
        except CorruptRecord as exc:
            self._tree.report(f"inbox: left out: {exc}")
            return JUNK
        except OSError as exc:
            if exc.errno not in _SHUT_OUT:
                raise
            self._tree.report(f"inbox: left out: cannot open {path}: {exc.strerror}")
            return JUNK
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

    def _staged_names(self, dirs: InboxDirs) -> list[tuple[tuple[int, int], str]]:
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

    def _has_checkpoint(self, dirs: InboxDirs, seq: int, epoch: int) -> bool:
        if dirs.checkpoints is None:
            return False
        try:
            st = os.stat(
                checkpoint_name(seq, epoch), dir_fd=dirs.checkpoints, follow_symlinks=False
            )
        except FileNotFoundError:
            return False
        return stat.S_ISREG(st.st_mode)

    def _staged_record(self, dirs: InboxDirs, name: str) -> list[Consumed] | None:
        path = dirs.path / "staged" / name
        data = self._read(dirs.staged, name, path, STAGED_CAP)
        consumed = None if data is None else parse_staged(data)
        if data is not None and consumed is None:
            self._tree.report(f"inbox: left out: {path} does not parse")
        return consumed

    def _overlay(self, dirs: InboxDirs) -> dict[int, Consumed]:
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

    def _listed(self, dirs: InboxDirs, after: int) -> list[tuple[int, bytes]]:
        overlay = self._overlay(dirs)
        found: BoundedRead[int] = BoundedRead(INBOX_READ)
        budget = _READ_BUDGET
        path = dirs.path / "pending"
        for number, name in self._numbered(dirs.pending, PENDING_NAME, path):
            if number <= after or number in overlay:
                continue
            if found.full or budget <= 0:
                break
            budget -= 1
            data = self._read(dirs.pending, name, path / name, PENDING_CAP)
            parsed = None if data is None else parse_pending(data)
            if parsed is not None:
                found.offer(number, parsed[1])
            elif data is not None:
                self._tree.report(f"inbox: left out: {path / name} does not parse")
        if found.stopped:
            self._tree.report(
                f"inbox: {path}: stopped reading at {found.total} bytes, the most one read "
                "takes: a read from the last number read goes on"
            )
        return found.entries

    def _replies(
        self, dirs: InboxDirs, after: int, count: int, scan: int
    ) -> tuple[list[tuple[int, bytes]], int | None]:
        """read_replies' page: the consumed records above after (a staged one as applied)."""
        overlay = self._overlay(dirs)
        names = dict(self._numbered(dirs.done, DONE_NAME, dirs.path / "done"))
        numbers = sorted(number for number in {*names, *overlay} if number > after)
        looked = numbers[:scan]
        found: list[tuple[int, bytes]] = []
        for index, number in enumerate(looked):
            staged = overlay.get(number)
            reply = staged.reply if staged is not None else self._reply(dirs, names[number])
            if reply is None:
                continue
            found.append((number, reply))
            if len(found) == count:
                return found, number if index + 1 < len(numbers) else None
        return found, looked[-1] if len(numbers) > len(looked) else None

    def _reply(self, dirs: InboxDirs, name: str) -> bytes | None:
        """The sealed reply of the consumed record name; None if it has none, or is junk."""
        path = dirs.path / "done" / name
        data = self._read(dirs.done, name, path, DONE_CAP)
        parsed = None if data is None else parse_done(data)
        if data is not None and parsed is None:
            self._tree.report(f"inbox: left out: {path} does not parse")
        return None if parsed is None else parsed[1]

    def _counter(self, dirs: InboxDirs) -> int | None:
        """The last admitted number as stored; None if absent or junk (reported)."""
        data = self._read(dirs.inbox, COUNTER_NAME, dirs.path / COUNTER_NAME, INDEX_CAP)
        number = None if data is None else parse_counter(data)
        if data is not None and number is None:
            self._tree.report(f"inbox: {dirs.path / COUNTER_NAME} does not parse")
        return number

    def _index(self, dirs: InboxDirs, request_id: str) -> int | None:
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
        self,
        dirs: InboxDirs,
        request_id: str,
        overlay: dict[int, Consumed],
        *,
        unindexed: bool = True,
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
        self, dirs: InboxDirs, number: int, request_id: str, overlay: dict[int, Consumed], *,
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
