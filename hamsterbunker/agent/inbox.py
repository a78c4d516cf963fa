"""The inbox's rules: what a step sees of its submissions and what it consumes
(DESIGN.md invariant 9). A step reads ``current_step().inbox`` and ``consume(number, reply)``
marks one consumed, with a sealed reply (``None`` included), both committed with its
checkpoint. A replay is shown what its earlier runs were shown (``docs/design.md``, "Leases,
effects and sealing in the code"). How a node reads its inbox is an ``InboxIO``
(``hamsterbunker.node.inbox``).
"""

from __future__ import annotations

import asyncio
import bisect
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..core.errors import InboxError, Tampered
from ..core.limits import MAX_CONSUMED_PER_STEP, MAX_INBOX_GAPS, MAX_REPLY_BYTES, MAX_SEQ
from ..stores.base import Consumed

__all__ = [
    "Admission",
    "ConsumedMarks",
    "InboxIO",
    "StepInbox",
    "Submission",
]


@dataclass(frozen=True)
class Submission:
    """One admitted, unconsumed submission, as a step sees it."""

    number: int
    request_id: str
    payload: Any
    submitted: float = field(default=0.0, compare=False)  # the submitter's clock: display only


@dataclass(frozen=True)
class Admission:
    """What ``Client.submit`` got: the submission's number, and whether it was known already."""

    number: int
    request_id: str
    duplicate: bool


@dataclass(frozen=True)
class ConsumedMarks:
    """Which numbers are consumed: all up to ``through``, and the runs in ``ranges`` above
    (sealed in the checkpoint). Past MAX_INBOX_GAPS runs, the oldest gap is given up."""

    through: int = 0
    ranges: tuple[tuple[int, int], ...] = ()  # sorted, disjoint, each above through + 1

    def __contains__(self, number: object) -> bool:
        if not isinstance(number, int):
            return False
        if number <= self.through:
            return True
        at = bisect.bisect_right(self.ranges, (number, MAX_SEQ + 1)) - 1
        return at >= 0 and self.ranges[at][0] <= number <= self.ranges[at][1]

    def adding(self, numbers: Iterable[int]) -> tuple[ConsumedMarks, list[tuple[int, int]]]:
        """These marks with numbers consumed too, and the gaps (first, last) given up."""
        new = [(n, n) for n in numbers if n not in self]
        if not new:
            return self, []
        runs = sorted([*self.ranges, *new])
        merged: list[tuple[int, int]] = []
        for first, last in runs:
            if merged and first <= merged[-1][1] + 1:
                merged[-1] = (merged[-1][0], max(last, merged[-1][1]))
            else:
                merged.append((first, last))
        through, given_up = self.through, []
        while merged and (merged[0][0] <= through + 1 or len(merged) > MAX_INBOX_GAPS):
            first, last = merged.pop(0)
            if first > through + 1:
                given_up.append((through + 1, first - 1))
            through = max(through, last)
        return ConsumedMarks(through, tuple(merged)), given_up

    def to_json(self) -> dict[str, Any] | None:
        """As sealed in a checkpoint; None when nothing was ever consumed."""
        if not self.through and not self.ranges:
            return None
        return {"through": self.through, "ranges": [list(r) for r in self.ranges]}

    @classmethod
    def from_json(cls, doc: dict[str, Any] | None) -> ConsumedMarks:
        """The marks a checkpoint carries (authenticated); Tampered if they are malformed."""
        if doc is None:
            return cls()
        through, ranges = doc.get("through"), doc.get("ranges")
        if not isinstance(through, int) or not _number(through, low=0):
            raise Tampered("checkpoint's inbox marks are malformed")
        if not isinstance(ranges, list):
            raise Tampered("checkpoint's inbox marks are malformed")
        pairs = []
        floor = through + 1
        for item in ranges[: MAX_INBOX_GAPS + 1]:
            if not (isinstance(item, list) and len(item) == 2 and all(map(_number, item))):
                raise Tampered("checkpoint's inbox marks have a malformed run")
            first, last = item
            if not floor < first <= last:
                raise Tampered("checkpoint's inbox marks are out of order")
            pairs.append((first, last))
            floor = last + 1
        if len(ranges) > MAX_INBOX_GAPS:
            raise Tampered("checkpoint's inbox marks have too many runs")
        return cls(through, tuple(pairs))


def _number(value: object, low: int = 1) -> bool:
    return type(value) is int and low <= value <= MAX_SEQ


class InboxIO(Protocol):
    """How a step's inbox reaches the node: read what is unconsumed, wait, seal a reply."""

    def seal_reply(self, number: int, request_id: str, reply: Any) -> bytes:
        """The sealed reply to submission number (request_id)."""

    async def unconsumed(self) -> list[Submission]:
        """Everything admitted and not consumed as of the last published checkpoint."""

    def wakes(self) -> int:
        """A counter the store's watch moves on every hint of a change."""

    def closing(self) -> bool:
        """Whether the node is stopping or the term is over: a waiting step should finish."""

    async def woken(self, since: int, timeout: float) -> None:
        """Return once wakes() moved past since, or after timeout (whichever first)."""


class StepInbox:
    """One step's inbox: what it was shown, and what it consumed (committed with its checkpoint)."""

    def __init__(
        self, io: InboxIO, shown: list[Submission], runs_shown: set[int] | None = None
    ) -> None:
        """runs_shown: the numbers shown to earlier runs of this step (its journal says),
        added to here; a lower number not among them is not shown to this run."""
        self._io = io
        self._runs_shown = set() if runs_shown is None else runs_shown
        self._earlier = frozenset(self._runs_shown)
        self._top = max(self._earlier, default=0)
        self._shown = {s.number: s for s in shown if self._may_show(s.number)}
        self.consumed: list[Consumed] = []

    def _may_show(self, number: int) -> bool:
        return number > self._top or number in self._earlier

    def shown(self) -> list[Submission]:
        """The submissions this step may consume, oldest first: no more than it may still
        consume (MAX_CONSUMED_PER_STEP in all); the rest are the next step's."""
        room = MAX_CONSUMED_PER_STEP - len(self.consumed)
        taken = {c.number for c in self.consumed}
        shown = [s for n, s in sorted(self._shown.items()) if n not in taken][: max(room, 0)]
        self._runs_shown.update(s.number for s in shown)
        return shown

    def consume(self, number: int, reply: Any = None) -> None:
        """Mark submission number consumed, with an optional reply (JSON), at this step's commit."""
        found = self._shown.get(number) if isinstance(number, int) else None
        if found is None or any(c.number == number for c in self.consumed):
            raise InboxError(f"submission #{number} is not in this step's inbox (unconsumed)")
        if len(self.consumed) >= MAX_CONSUMED_PER_STEP:
            raise InboxError(
                f"a step may consume at most {MAX_CONSUMED_PER_STEP} submissions: consume "
                "the rest in the next step"
            )
        _check_json(reply)
        # A reply of None is sealed too: the sealed reply is what proves to a client that
        # this submission was consumed (a bare "consumed" mark can be written without
        # the secret, and must never read as done).
        self._runs_shown.add(number)
        sealed = self._io.seal_reply(number, found.request_id, reply)
        if len(sealed) > MAX_REPLY_BYTES:
            raise InboxError(
                f"reply to #{number} is {len(sealed)} bytes sealed, above the limit of "
                f"{MAX_REPLY_BYTES} bytes"
            )
        self.consumed.append(Consumed(number, found.request_id, sealed))

    async def wait(self, timeout: float | None) -> list[Submission]:
        """Return the step's inbox once it holds anything, or after timeout seconds (maybe []);
        early when the node stops (a planned stop publishes at once), at once with [] once the
        step consumed all it may."""
        if timeout is not None and (not isinstance(timeout, (int, float)) or timeout < 0):
            raise InboxError(f"wait_for_inbox timeout must be a number of seconds, not {timeout!r}")
        if len(self.consumed) >= MAX_CONSUMED_PER_STEP:
            await asyncio.sleep(0)  # a step that calls again in a loop still lets the node run
            return []
        loop = asyncio.get_running_loop()
        until = loop.time() + (math.inf if timeout is None else float(timeout))
        while True:
            mark = self._io.wakes()  # before reading: a change meanwhile is not missed
            for submission in await self._io.unconsumed():
                if self._may_show(submission.number):
                    self._shown.setdefault(submission.number, submission)
            left = until - loop.time()
            if self.shown() or left <= 0 or self._io.closing():
                return self.shown()
            await self._io.woken(mark, left)
            if self._io.closing():
                # The term ends: return at once. What came meanwhile stays unconsumed,
                # for the next leader.
                return self.shown()


def _check_json(value: Any) -> None:
    try:
        json.dumps(value, allow_nan=False).encode()
    except (TypeError, ValueError) as exc:
        raise InboxError(f"a reply must be JSON-serialisable: {exc}") from exc
