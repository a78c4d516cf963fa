"""The file store's directory tree: directories opened for reading or made for writing.

Reads never create anything (a monitor with a mistyped agent id makes no
directory). Writes make only the directories they need, durably, so that junk
planted in place of one (say ``events/``) stops only the writes that go there;
the first write through a directory, per store object, sweeps the temporary
files a crashed writer left in it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

from ...errors import CorruptRecord, StoreError
from .fileio import opened_dir, read_file, sweep_temps
from .layout import agent_parts, log

__all__ = ["StoreTree"]


class StoreTree:
    """The directories under one store root, and reading its files where one may be junk."""

    def __init__(self, root: Path, report: Callable[[str], None]) -> None:
        self.root = root
        self.report = report  # logs each distinct problem once
        self._swept: set[tuple[str, ...]] = set()  # directories written through, and swept

    def agent_dir(self, agent: str) -> Path:
        """The agent's directory, for messages and the watch: it may not exist yet."""
        return self.root.joinpath(*agent_parts(agent))

    def reading(self, *parts: str) -> contextlib.AbstractContextManager[int | None]:
        """A descriptor of root/parts for reading; None if absent (reads never create)."""
        return opened_dir(self.root, parts)

    @contextlib.contextmanager
    def writing(self, *parts: str) -> Iterator[int]:
        """A descriptor of root/parts for writing, made (durably) where absent."""
        with opened_dir(self.root, parts, create=True) as fd:
            if fd is None:
                raise StoreError(f"store directory {self.root} does not exist (any longer)")
            self.sweep_once(parts, fd)
            yield fd

    def sweep_once(self, parts: tuple[str, ...], fd: int) -> None:
        """Remove old temp files in root/parts (open as fd), the first time it is written."""
        if parts in self._swept:
            return
        path = self.root.joinpath(*parts)
        try:
            sweep_temps(fd, path)
        except OSError as exc:  # housekeeping: a failure is only logged
            log.warning("could not remove old temporary files in %s: %s", path, exc)
        self._swept.add(parts)

    def read_or_skip(self, dir_fd: int, name: str, path: Path, limit: int) -> bytes | None:
        """read_file, reporting (once) and skipping what is not a regular file within limit."""
        try:
            return read_file(dir_fd, name, path, limit)
        except CorruptRecord as exc:
            self.report(f"skipped: {exc}")
            return None
