"""A history of a node's store operations, for fault analysis (``hb run --history FILE``).

One JSON line per completed operation: node, op (``acquire``, ``restore``,
``publish``), epoch, seq, start and end on the node's clock, outcome. Both
times come from one clock, the node's (CLOCK_BOOTTIME unless a test injects
another), which every process of one machine shares, so the histories of
several local nodes can be appended to one file and compared.
An operation cut short by a crash has no line: its outcome is unknown.
Lines are appended with O_APPEND in one write each, so nodes never interleave.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .clock import Clock, MonotonicClock

__all__ = ["HistoryWriter", "Op", "read_history"]


@dataclass(frozen=True)
class Op:
    node: str
    op: str
    epoch: int
    seq: int
    start: float
    end: float
    outcome: str
    detail: dict[str, Any] = field(default_factory=dict)


class HistoryWriter:
    def __init__(self, path: str | os.PathLike[str], clock: Clock | None = None) -> None:
        """``clock``: the clock the caller's start times come from; ends are taken on it too."""
        self.path = Path(path)
        self.clock = clock or MonotonicClock()

    def record(
        self, node: str, op: str, epoch: int, seq: int, start: float, outcome: str, **detail: Any
    ) -> None:
        line = Op(node, op, epoch, seq, start, self.clock.monotonic(), outcome, detail)
        data = (json.dumps(asdict(line), separators=(",", ":")) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)


def read_history(path: str | os.PathLike[str]) -> list[Op]:
    """Every complete line of a history file (a torn last line from a crash is skipped)."""
    ops = []
    for line in Path(path).read_text().splitlines():
        try:
            ops.append(Op(**json.loads(line)))
        except (json.JSONDecodeError, TypeError):
            continue
    return ops
