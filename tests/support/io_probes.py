"""What this test process did to the disk, read from /proc (Linux): bytes read, fsyncs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

__all__ = ["bytes_read_by_this_process", "record_fsyncs"]


def bytes_read_by_this_process() -> int:
    """rchar of /proc/self/io: the bytes every read(2) of this process returned."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


def record_fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record the path of each descriptor os.fsync is called on from now on (Linux /proc)."""
    paths: list[str] = []
    real_fsync = os.fsync

    def recording(fd: int) -> None:
        paths.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording)
    return paths
