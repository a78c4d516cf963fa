"""A node's own small files (its memory of a store, its intents): replaced atomically and
durably, and the temporary files a crash left behind swept."""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
import time
from pathlib import Path

from .limits import STALE_TEMP_AGE_S

__all__ = ["replace_file", "sweep_temps"]


def replace_file(path: Path, text: str, temp_prefix: str) -> None:
    """Replace path with text: a temporary file, fsync, rename, directory fsync."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=temp_prefix)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    directory = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(directory)  # the rename itself outlives a crash
    finally:
        os.close(directory)


def sweep_temps(directory: Path, temp_prefix: str) -> None:
    """Remove replace_file's temporary files older than STALE_TEMP_AGE_S: a crash left them.
    OSError if the directory cannot be listed or one cannot be removed."""
    cutoff = time.time() - STALE_TEMP_AGE_S
    for temp in directory.glob(f"{temp_prefix}*"):
        with contextlib.suppress(FileNotFoundError):  # another process swept it first
            st = temp.lstat()
            if stat.S_ISREG(st.st_mode) and st.st_mtime < cutoff:
                temp.unlink()
