"""The effect journal in etcd: the fenced write of a record, and the bounded read of a step's.

The keys are told at the top of ``hamsterbunker.stores.etcd``; the removal of
old journals is part of the checkpoint txn (``checkpoints``). Key names that do
not parse are skipped and reported once; a read lists no more names than
``read_bounds.EFFECTS_READ`` has entries, and takes their values through a
``BoundedRead`` of it. The store translates the errors.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from etcd3gw.exceptions import Etcd3Exception

from ...errors import StoreError
from ...limits import EFFECT_KINDS, MAX_EFFECTS_PER_STEP, check_effect_bounds
from ...read_bounds import EFFECTS_READ, BoundedRead
from .._reported import ReportedOnce
from ..backends.etcd_connection import EtcdConnection, grpc_error, too_large
from ..base import Fence, describe_fence_text
from .kv import (
    EFFECT_INDEX_DIGITS,
    TXN_OPS,
    b64,
    effect_key,
    effect_name,
    effects_prefix,
    fence_value,
    get_op,
    kv_key,
    pad,
    put_op,
    range_end,
    ranges,
    unb64,
)

__all__ = ["EtcdEffects"]

# The most keys one read of a step's journal lists: every record it may hold.
_LISTED = EFFECTS_READ.count


class EtcdEffects:
    """The effect journals of every agent of one etcd store; the store translates the errors."""

    def __init__(
        self,
        connection: EtcdConnection,
        agent_prefix: Callable[[str], str],
        reported: ReportedOnce,
    ) -> None:
        self._connection = connection
        self._agent_prefix = agent_prefix
        self._reported = reported

    def put(self, agent: str, fence: Fence, seq: int, index: int, kind: str, blob: bytes) -> None:
        """Store.put_effect: bounds first, then one txn that compares the fence key."""
        problem = check_effect_bounds(seq, index, kind, len(blob))
        if problem is not None:  # refused before anything is sent
            raise StoreError(problem)
        prefix = self._agent_prefix(agent)
        fence_text = fence.to_text()
        compare = [
            {
                "key": b64(prefix + "fence"),
                "target": "VALUE",
                "result": "EQUAL",
                "value": b64(fence_text),
            }
        ]
        success = [put_op(effect_key(prefix, seq, index, kind), bytes(blob))]
        try:
            response = self._connection.txn(compare, success, [get_op(prefix + "fence")])
        except Etcd3Exception as exc:
            if too_large(exc):
                raise StoreError(
                    f"effect record {index}:{kind} of step {seq} of {agent!r} ({len(blob)} "
                    f"bytes) refused by etcd: {grpc_error(exc)[1]}. etcd takes requests up to "
                    "its --max-request-bytes (1.5 MiB by default)"
                ) from exc
            raise
        if not response.get("succeeded"):
            [fence_kvs] = ranges(response)
            raise fence.refused(seq, describe_fence_text(fence_value(fence_kvs)))

    def read(self, agent: str, seq: int) -> dict[tuple[int, str], bytes]:
        """Store.read_effects: list the step's names (keys only, bounded), then get ours."""
        step = effects_prefix(self._agent_prefix(agent), seq)
        # Only the names an index below the bound can have, the lowest first, and no
        # more of them than the records a step may hold: planted keys cost at most that.
        # The step's other keys are only counted (count_only sends no key).
        listing = self._connection.txn(
            [],
            [
                get_op(
                    step + pad(0, EFFECT_INDEX_DIGITS),
                    step + pad(MAX_EFFECTS_PER_STEP, EFFECT_INDEX_DIGITS),
                    keys_only=True,
                    limit=_LISTED,
                ),
                get_op(step, range_end(step), count_only=True),
            ],
        )
        listed = ranges(listing)[0]
        others = _count(listing) - len(listed)
        if others > 0:
            self._warn(
                agent,
                seq,
                ("others", others),
                "left out %d keys unread: names no record of this store has, or past the first %d",
                others,
                _LISTED,
            )
        names: dict[str, tuple[int, str]] = {}
        for kv in listed:
            name = effect_name(kv_key(kv).removeprefix(step.encode()))
            if name is None:
                junk = kv_key(kv)
                self._warn(
                    agent,
                    seq,
                    (junk, kv.get("mod_revision")),
                    "skipping key %s: its name is not one this store writes",
                    junk.decode("utf-8", "replace")[-80:],
                )
            else:
                names[step + pad(name[0], EFFECT_INDEX_DIGITS) + "/" + name[1]] = name
        if len(listed) >= _LISTED and len(names) < len(listed):
            # Planted keys among the names took places of the listing: records past it
            # are looked for under every name a record can have, as many as it lists.
            names = {
                step + pad(index, EFFECT_INDEX_DIGITS) + "/" + kind: (index, kind)
                for index in range(MAX_EFFECTS_PER_STEP)
                for kind in EFFECT_KINDS
            }
        keys = list(names)
        journal: BoundedRead[tuple[int, str]] = BoundedRead(EFFECTS_READ)
        for first in range(0, len(keys), TXN_OPS):
            if journal.full:
                break
            chunk = keys[first : first + TXN_OPS]
            found = ranges(self._connection.txn([], [get_op(key) for key in chunk]))
            for key, kvs in zip(chunk, found, strict=True):
                if kvs:  # else removed since it was listed (a checkpoint)
                    self._keep(agent, seq, names[key], kvs[0], journal)
        if journal.stopped:
            self._warn(
                agent,
                seq,
                ("stopped", journal.total),
                "stopped reading at %d bytes, the most one read of a step's journal takes",
                journal.total,
            )
        return dict(journal.entries)

    def _keep(
        self,
        agent: str,
        seq: int,
        name: tuple[int, str],
        kv: Mapping[str, Any],
        journal: BoundedRead[tuple[int, str]],
    ) -> None:
        """Offer kv's value to journal as record name, unless it is over the limit or unreadable."""
        try:
            value = unb64(kv.get("value", ""))
        except ValueError:  # the gateway's base64, never expected
            self._warn(agent, seq, (name, kv.get("mod_revision")), "record %d:%s unreadable", *name)
            return
        # etcd's request limit bounds what was fetched; its own limit may be raised.
        if journal.too_big(len(value)):
            self._warn(
                agent,
                seq,
                (name, kv.get("mod_revision")),
                "record %d:%s is %d bytes, above the limit of %d bytes: left out",
                *name,
                len(value),
                EFFECTS_READ.entry_bytes,
            )
            return
        journal.offer(name, value)

    def _warn(self, agent: str, seq: int, key: object, why: str, *args: object) -> None:
        """Log once what was left out of the journal of step seq of agent."""
        self._reported.warn(
            (agent, "effects", seq, key),
            "etcd store: effect journal of step %d of %s: " + why,
            seq,
            agent,
            *args,
        )


def _count(response: Mapping[str, Any]) -> int:
    """The count of the second range of a txn response (0 if it cannot be read)."""
    responses = response.get("responses") or []
    try:
        return int(responses[1]["response_range"].get("count", 0))
    except (IndexError, KeyError, TypeError, ValueError, AttributeError):
        return 0
