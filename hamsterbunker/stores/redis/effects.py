"""The effect journal in Redis: the fenced write of a record, and the bounded read of a step's.

Both are Lua scripts (``scripts.PUT_EFFECT``, ``scripts.READ_EFFECTS``); the
keys are told at the top of ``hamsterbunker.stores.redis``, and the removal of
old journals is part of the checkpoint script. The script sends only the
records under the names we write, none over ``read_bounds.EFFECTS_READ``'s
bytes of one; what it sends is taken through a ``BoundedRead`` of that bound.
The store translates the errors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import redis

from ...errors import StoreError
from ...limits import EFFECT_KINDS, MAX_EFFECTS_PER_STEP, MAX_RECORD_BYTES, check_effect_bounds
from ...read_bounds import EFFECTS_READ, BoundedRead
from .._reported import ReportedOnce
from ..base import Fence, describe_fence_text
from . import scripts as _scripts
from .replies import raw, text

__all__ = ["STEPS_REMOVED_PER_CHECKPOINT", "RedisEffects", "effect_field"]

# How many older steps' journals one checkpoint removes at most (besides its own
# step's): one step a checkpoint is the rule; more are left by a crash, or planted.
STEPS_REMOVED_PER_CHECKPOINT = 16


def effect_field(index: int, kind: str) -> str:
    """A record's field in its step's journal hash."""
    return f"{index}:{kind}"


class RedisEffects:
    """The effect journals of every agent of one Redis store.

    key(agent, *parts) names the agent's keys, as the store does; changed(agent)
    is the channel its writes are announced on.
    """

    def __init__(
        self,
        client: redis.Redis,
        key: Callable[..., str],
        changed: Callable[[str], str],
        reported: ReportedOnce,
        url: str,
    ) -> None:
        self._key = key
        self._changed = changed
        self._reported = reported
        self._url = url
        self._put = client.register_script(_scripts.PUT_EFFECT)
        self._read = client.register_script(_scripts.READ_EFFECTS)

    def put(self, agent: str, fence: Fence, seq: int, index: int, kind: str, blob: bytes) -> None:
        """Store.put_effect: bounds first, then one fenced script."""
        problem = check_effect_bounds(seq, index, kind, len(blob))
        if problem is not None:  # refused before anything is sent
            raise StoreError(problem)
        answer = self._put(
            keys=[
                self._key(agent, "lease"),
                self._key(agent, "effects", str(seq)),
                self._key(agent, "effect-steps"),
            ],
            args=[
                fence.to_text(),
                effect_field(index, kind),
                bytes(blob),
                str(seq),
                self._changed(agent),
                MAX_RECORD_BYTES,
            ],
        )
        if answer[0] == b"fenced":
            now = describe_fence_text(raw(answer[1]) or None)
            raise fence.refused(seq, now)

    def read(self, agent: str, seq: int) -> dict[tuple[int, str], bytes]:
        """Store.read_effects: the records the script found under the names we write."""
        answer = self._read(
            keys=[self._key(agent, "effects", str(seq))],
            args=[EFFECTS_READ.entry_bytes, MAX_EFFECTS_PER_STEP, *EFFECT_KINDS],
        )
        if not isinstance(answer, list) or not answer:
            return {}
        if not isinstance(answer[0], int):  # {'type', kind}
            kind = text(answer[1]) if len(answer) > 1 else "?"
            self._warn(agent, seq, ("type", kind), "it is a Redis %s, not a hash", kind)
            return {}
        journal: BoundedRead[tuple[int, str]] = BoundedRead(EFFECTS_READ)
        for field, value in zip(answer[1::2], answer[2::2], strict=False):
            name = _parse_field(field)
            if name is None:  # the script sends only our names; checked again all the same
                continue
            if isinstance(value, int) or (isinstance(value, bytes) and journal.too_big(len(value))):
                size = value if isinstance(value, int) else len(value)
                self._warn(
                    agent,
                    seq,
                    (name, size),
                    "record %d:%s is %d bytes, above the limit of %d bytes: not read",
                    *name,
                    size,
                    EFFECTS_READ.entry_bytes,
                )
            elif isinstance(value, bytes) and not journal.offer(name, value) and journal.full:
                break
        if journal.stopped:
            self._warn(
                agent,
                seq,
                ("stopped", journal.total),
                "stopped reading at %d bytes, the most one read of a step's journal takes",
                journal.total,
            )
        others = answer[0] - len(answer[1::2])
        if others > 0:
            self._warn(
                agent,
                seq,
                ("others", answer[0]),
                "left out %d fields whose names are not a record's as this store writes it",
                others,
            )
        return dict(journal.entries)

    def _warn(self, agent: str, seq: int, key: object, why: str, *args: object) -> None:
        """Log once what was left out of the journal of step seq of agent."""
        self._reported.warn(
            (agent, "effects", seq, key),
            "redis store %s: effect journal of step %d of %s: " + why,
            self._url,
            seq,
            agent,
            *args,
        )


def _parse_field(field: Any) -> tuple[int, str] | None:
    """(index, kind) of a field as effect_field writes it, or None."""
    if not isinstance(field, bytes):
        return None
    index, _, kind = field.partition(b":")
    if not index.isdigit() or len(index) > 3 or (len(index) > 1 and index.startswith(b"0")):
        return None
    name = (int(index), kind.decode("ascii", "replace"))
    if check_effect_bounds(1, name[0], name[1], 0) is not None:
        return None
    return name
