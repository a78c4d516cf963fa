"""The earlier file store's inbox, read as that store read it (``earlier.file``).

Layout under ``agents/<agent>/inbox``::

    admitted                             the last admitted number: 20 digits, a newline
    pending/<number:020>.hbs             header, then the sealed submission
    done/<number:020>.hbr                header, then the sealed reply (none: header only)
    ids/<sha256 of request id>.hbi       header, then the number (20 digits, a newline)
    staged/<seq:020>-<epoch:010>.hbt     what checkpoint <seq>-<epoch> consumes, unapplied

A header is 8 bytes of magic, the request id padded with spaces to
``MAX_REQUEST_ID_CHARS``, a newline. What a writer cut short is read as that store read
it: a staged record whose checkpoint is stored counts as applied, and an admission
whose index was never written is found at the last admitted number.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import stat
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ...core.errors import CorruptRecord, StoreError
from ...core.limits import (
    MAX_CONSUMED_PER_STEP,
    MAX_INBOX_COUNT,
    MAX_REPLY_BYTES,
    MAX_REQUEST_ID_CHARS,
    MAX_SUBMISSION_BYTES,
    check_checkpoint_bounds,
    check_reply_bounds,
    check_request_id,
)
from ...core.read_bounds import INBOX_READ, BoundedRead
from ...records import check_name
from ..base import AdmissionState, Consumed
from ..dirs.fileio import (
    closing_fd,
    dir_entries,
    open_regular,
    opened_dir,
    opened_subdir,
    os_errors_as_store_errors,
    pread_upto,
    read_file,
)
from . import common

__all__ = ["InboxReader", "checkpoint_name", "listed", "translated"]

_SUBMISSION, _REPLY, _NO_REPLY, _INDEX, _STAGED = (
    b"hb-sub-1", b"hb-rep-1", b"hb-rep-0", b"hb-rid-1", b"hb-stg-1",
)  # fmt: skip
_HEADER = 8 + MAX_REQUEST_ID_CHARS + 1
_INDEX_BYTES = _HEADER + 21
_PENDING_CAP = _HEADER + MAX_SUBMISSION_BYTES
_DONE_CAP = _HEADER + MAX_REPLY_BYTES
_ENTRY = struct.Struct(">QBI")  # a staged entry: number, has a reply, the reply's length
_STAGED_CAP = 8 + 2 + MAX_CONSUMED_PER_STEP * (_HEADER + _ENTRY.size + MAX_REPLY_BYTES)
_PENDING = re.compile(r"([0-9]{20})\.hbs")
_INDEX_NAME = re.compile(r"[0-9a-f]{64}\.hbi")
_STAGED_NAME = re.compile(r"([0-9]{20})-([0-9]{10})\.hbt")
_COUNTER = re.compile(rb"([0-9]{20})\n")  # admitted, and the number an index record names
# The most entries of pending/ or staged/ listed: four times a full inbox (the earlier
# store admitted no more), so its temporary files never count.
_LISTED = 4 * MAX_INBOX_COUNT
_READ_BUDGET = 2 * MAX_INBOX_COUNT  # the most files one read_inbox opens, as there
_SHUT_OUT = {errno.EACCES, errno.EPERM}  # a directory or file we may not open: junk
translated = os_errors_as_store_errors("earlier file store")


def checkpoint_name(seq: int, epoch: int) -> str:
    return f"ckpt-{seq:020d}-{epoch:010d}.hbc"


def listed(fd: int, most: int, path: Path) -> list[os.DirEntry[str]]:
    """The entries of a directory, refused (StoreError) past most: only junk makes more."""
    entries = dir_entries(fd, most + 1)
    if len(entries) > most:
        raise StoreError(f"{path} holds over {most} entries, more than the store wrote: not read")
    return entries


@dataclass
class _Dirs:
    path: Path  # agents/<agent>/inbox, for messages
    inbox: int | None = None
    pending: int | None = None
    done: int | None = None
    ids: int | None = None
    staged: int | None = None
    checkpoints: int | None = None


def _parse_header(data: bytes, magics: tuple[bytes, ...]) -> str | None:
    """The request id in a header of one of magics at the start of data, or None."""
    if len(data) < _HEADER or data[_HEADER - 1] != 0x0A or data[:8] not in magics:
        return None
    try:
        request_id = data[8 : _HEADER - 1].rstrip(b" ").decode("ascii")
    except UnicodeDecodeError:
        return None
    return None if check_request_id(request_id) else request_id


def _parse_done(data: bytes) -> tuple[str, bytes | None] | None:
    request_id = _parse_header(data, (_REPLY, _NO_REPLY))
    if request_id is None or len(data) > _DONE_CAP:
        return None
    if data[:8] == _NO_REPLY:
        return (request_id, None) if len(data) == _HEADER else None
    return request_id, data[_HEADER:]


def _parse_staged(data: bytes) -> list[Consumed] | None:
    if len(data) > _STAGED_CAP or len(data) < 10 or data[:8] != _STAGED:
        return None
    count, offset, found = int.from_bytes(data[8:10], "big"), 10, []
    if count > MAX_CONSUMED_PER_STEP:
        return None
    for _ in range(count):
        request_id = _parse_header(data[offset : offset + _HEADER], (_STAGED,))
        offset += _HEADER
        if request_id is None or len(data) < offset + _ENTRY.size:
            return None
        number, has_reply, size = _ENTRY.unpack_from(data, offset)
        offset += _ENTRY.size
        if has_reply > 1 or (not has_reply and size) or len(data) < offset + size:
            return None
        if check_reply_bounds(number, request_id, size):
            return None
        found.append(
            Consumed(number, request_id, data[offset : offset + size] if has_reply else None)
        )
        offset += size
    return found if offset == len(data) else None


class InboxReader:
    """read_inbox, read_admission and request_ids over an earlier file store's root."""

    def __init__(self, root: Path, report: Callable[[str], None]) -> None:
        self.root, self._report = root, report

    @translated
    def read_inbox(self, agent: str, after: int = 0) -> list[tuple[int, bytes]]:
        try:
            with self._dirs(agent) as dirs:
                overlay = self._overlay(dirs)
                found: BoundedRead[int] = BoundedRead(INBOX_READ)
                budget, path = _READ_BUDGET, dirs.path / "pending"
                for number, name in self._numbered(dirs.pending, _PENDING, path):
                    if number <= after or number in overlay:
                        continue
                    if found.full or budget <= 0:
                        break
                    budget -= 1
                    data = self._read(dirs.pending, name, path / name, _PENDING_CAP)
                    if data is not None and _parse_header(data, (_SUBMISSION,)) is None:
                        self._report(f"inbox: left out: {path / name} does not parse")
                    elif data is not None:
                        found.offer(number, data[_HEADER:])
                return found.entries
        except CorruptRecord as exc:
            self._report(f"inbox left out: {exc}")
            return []

    @translated
    def read_admission(self, agent: str, request_id: str) -> AdmissionState | None:
        if check_request_id(request_id) is not None:
            return None  # never admitted: admit refused it
        try:
            with self._dirs(agent) as dirs:
                return self._state(dirs, request_id, self._overlay(dirs))
        except CorruptRecord as exc:
            self._report(f"inbox left out: {exc}")
            return None

    @translated
    def request_ids(self, agent: str, most: int) -> list[str]:
        found: list[str] = []
        with self._dirs(agent) as dirs:
            # Bounded as there: junk beside the index records takes its part of the listing.
            for entry in [] if dirs.ids is None else dir_entries(dirs.ids, 2 * most):
                if _INDEX_NAME.fullmatch(entry.name):
                    parsed = self._index_record(dirs, entry.name)
                    if parsed is not None and len(found) < most:
                        found.append(parsed[0])
        return found

    # -- opening -------------------------------------------------------------------

    @contextlib.contextmanager
    def _dirs(self, agent: str) -> Iterator[_Dirs]:
        """The inbox's directories, open (None where absent, or junk: reported)."""
        agent_path = self.root / "agents" / check_name("agent id", agent)
        dirs = _Dirs(agent_path / "inbox")
        with contextlib.ExitStack() as stack:
            agent_fd = stack.enter_context(opened_dir(self.root, ("agents", agent)))
            if agent_fd is not None:
                dirs.inbox = self._open(stack, agent_fd, "inbox", dirs.path)
                dirs.checkpoints = self._open(
                    stack, agent_fd, "checkpoints", agent_path / "checkpoints"
                )
            if dirs.inbox is not None:
                for sub in ("pending", "done", "ids", "staged"):
                    setattr(dirs, sub, self._open(stack, dirs.inbox, sub, dirs.path / sub))
            yield dirs

    def _open(self, stack: contextlib.ExitStack, parent: int, name: str, path: Path) -> int | None:
        with self._left_out(path):
            return stack.enter_context(opened_subdir(parent, name, path))
        return None

    @contextlib.contextmanager
    def _left_out(self, path: Path) -> Iterator[None]:
        """Report, rather than raise, what makes path junk: not ours, or shut to us."""
        try:
            yield
        except CorruptRecord as exc:
            self._report(f"inbox: left out: {exc}")
        except OSError as exc:
            if exc.errno not in _SHUT_OUT:
                raise
            self._report(f"inbox: left out: cannot open {path}: {exc.strerror}")

    # -- reading -------------------------------------------------------------------

    def _read(self, fd: int | None, name: str, path: Path, cap: int) -> bytes | None:
        data = self._read_or_junk(fd, name, path, cap)
        return data if isinstance(data, bytes) else None

    def _read_or_junk(self, fd: int | None, name: str, path: Path, cap: int) -> bytes | bool | None:
        """A file's bytes; None if absent; True (junk, reported) if not a regular file in cap."""
        if fd is None:
            return None
        with self._left_out(path):
            return read_file(fd, name, path, cap)
        return True

    def _head(self, fd: int | None, name: str, path: Path) -> bytes | None:
        """The first header's bytes of a file; None if absent or junk (reported)."""
        if fd is None:
            return None
        try:
            opened = open_regular(fd, name, path)
        except FileNotFoundError:
            return None
        except (CorruptRecord, PermissionError) as exc:
            self._report(f"inbox: left out: {exc}")
            return None
        with closing_fd(opened):
            return pread_upto(opened, 0, _HEADER)

    def _numbered(
        self, fd: int | None, pattern: re.Pattern[str], path: Path
    ) -> list[tuple[int, str]]:
        """(number, name) of each entry under a numbered name, by number; junk left out."""
        entries = [] if fd is None else listed(fd, _LISTED, path)
        numbered = ((common.seq_named(pattern, entry.name), entry.name) for entry in entries)
        return sorted((number, name) for number, name in numbered if number is not None)

    def _overlay(self, dirs: _Dirs) -> dict[int, Consumed]:
        """What staged records under stored checkpoints consume: applied, for a reader."""
        overlay: dict[int, Consumed] = {}
        staged = [] if dirs.staged is None else listed(dirs.staged, _LISTED, dirs.path / "staged")
        for name in sorted(entry.name for entry in staged):
            match = _STAGED_NAME.fullmatch(name)
            if match is None or check_checkpoint_bounds(int(match[1]), int(match[2]), 0):
                continue
            if not self._has_checkpoint(dirs, int(match[1]), int(match[2])):
                continue  # never committed: the next write of that store removed it
            data = self._read(dirs.staged, name, dirs.path / "staged" / name, _STAGED_CAP)
            consumed = None if data is None else _parse_staged(data)
            if data is not None and consumed is None:
                self._report(f"inbox: left out: {dirs.path / 'staged' / name} does not parse")
            for each in consumed or ():
                overlay[each.number] = each
        return overlay

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

    def _index_record(self, dirs: _Dirs, name: str) -> tuple[str, int] | None:
        data = self._read(dirs.ids, name, dirs.path / "ids" / name, _INDEX_BYTES)
        if data is None or len(data) != _INDEX_BYTES:
            return None
        request_id, number = (
            _parse_header(data, (_INDEX,)),
            common.seq_named(_COUNTER, data[_HEADER:]),
        )
        return None if request_id is None or number is None else (request_id, number)

    def _state(
        self, dirs: _Dirs, request_id: str, overlay: dict[int, Consumed]
    ) -> AdmissionState | None:
        """request_id's state through its index, else at the last admitted number (an
        admission cut short before its index), else in the overlay."""
        name = hashlib.sha256(request_id.encode()).hexdigest() + ".hbi"
        indexed = self._index_record(dirs, name)
        if indexed is not None and indexed[0] == request_id:
            state = self._state_at(dirs, indexed[1], request_id, overlay, indexed=True)
            if state is not None:
                return state
        counter = self._read(dirs.inbox, "admitted", dirs.path / "admitted", _INDEX_BYTES)
        last = None if counter is None else common.seq_named(_COUNTER, counter)
        if last is not None:
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
        """request_id's state as the entries under number say. A consumed record there that
        does not parse counts (consumed, no reply) only when the index names it."""
        staged = overlay.get(number)
        if staged is not None and staged.request_id == request_id:
            return AdmissionState(number, consumed=True, reply=staged.reply)
        # The pending entry first: that store wrote the consumed record before removing it.
        name = f"{number:020d}.hbs"
        head = self._head(dirs.pending, name, dirs.path / "pending" / name)
        if head is not None and _parse_header(head, (_SUBMISSION,)) == request_id:
            return AdmissionState(number, consumed=False, reply=None)
        name = f"{number:020d}.hbr"
        data = self._read_or_junk(dirs.done, name, dirs.path / "done" / name, _DONE_CAP)
        parsed = _parse_done(data) if isinstance(data, bytes) else None
        if parsed is not None:
            return AdmissionState(number, True, parsed[1]) if parsed[0] == request_id else None
        if indexed and data is not None:
            self._report(f"inbox: {dirs.path / 'done' / name} does not parse: consumed, no reply")
            return AdmissionState(number, consumed=True, reply=None)
        return None
