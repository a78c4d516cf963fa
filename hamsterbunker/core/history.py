"""A history of a node's store operations, for fault analysis (``hb run --history FILE``).

One JSON line per completed operation (node, op, epoch, seq, start and end on the node's
clock, outcome), appended with O_APPEND in one write: the local nodes of one machine share
the clock and the file. An operation cut short by a crash has no line.
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
