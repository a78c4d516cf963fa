"""Fenced checkpoints with their retention, and the effect journal, on a backend
(docs/design.md, "One record layer over a small backend interface").
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence

from ...core.blob import Blob
from ...core.errors import Fenced, LeaseConflict, StoreError
from ...core.failpoints import failpoint, failpoints_within
from ...core.limits import MAX_CHECKPOINT_BYTES, check_checkpoint_bounds, check_effect_bounds
from ...core.read_bounds import CHECKPOINT_NAMES_READ, CHECKPOINT_READ, EFFECTS_READ
from ...records import CheckpointInfo
from ..backend import Compare, DeleteRange, Get, Put, Scan, ScanResult, Txn
from ..base import (
    Consumed,
    Fence,
    TakenJournals,
    check_consumed,
    check_own_epoch,
    describe_fence_text,
    refuse,
)
from .base import Layer, Settings, bounded_records
from .consumption import Consumption
from .keys import AgentKeys, parse_number

__all__ = [
    "journals_in",
    "list_checkpoints",
    "listed_in",
    "put_checkpoint",
    "put_effect",
    "read_checkpoint",
    "read_checkpoint_from",
    "read_effects",
    "remember_listing",
]

# The biggest checkpoint whose consumption is guessed (one commit, not two): joined, so
# that a wrong guess can write it again; a bigger one's write costs more than a read.
_GUESSED_BYTES = 1 << 20


# A lease write made in a checkpoint's commit: its compare, and its writes.
LeaseWrite = tuple[Compare, list[Put]]


def put_checkpoint(
    layer: Layer,
    keys: AgentKeys,
    fence: Fence,
    seq: int,
    blob: Blob,
    consumed: Sequence[Consumed],
    lease: LeaseWrite | None = None,
) -> CheckpointInfo:
    """Store.put_checkpoint: the fence compared, retention, the journal, the consumed; and
    lease, if given (LeaseConflict, storing nothing, if its compare fails)."""
    refuse(check_checkpoint_bounds(seq, fence.epoch, len(blob)) or check_consumed(consumed))
    text = fence.to_text()
    written = layer.written.pop(keys.agent, None)  # set again once this one is committed
    listed: list[CheckpointInfo] | None = None
    if written is not None and written[0] == text and seq > written[1]:
        # Only the fence's holder writes checkpoints: its last commit left what a listing finds.
        listed = written[2]
    consumption = Consumption(layer, keys, consumed, text)
    small = len(blob) <= _GUESSED_BYTES
    if listed is not None and small and consumption.guess():
        blob = bytes(blob)  # a wrong guess writes it again, and pieces are made once
        info = _commit(layer, keys, fence, seq, blob, listed, consumption, lease)
        if info is not None:
            return info
        consumption = Consumption(layer, keys, consumed, text)  # it guessed wrong: read
    reads = consumption.reads()
    if listed is None:
        reads = [Get(keys.fence, 256), Scan(keys.ckpt, CHECKPOINT_NAMES_READ), *reads]
    found = layer.commit(Txn(reads=reads)).reads if reads else []
    if listed is None:
        now, listing = found.pop(0), found.pop(0)
        # A writer fenced out learns so first, whatever junk its own epoch's listing holds.
        if now != text.encode():
            raise _refused(fence, seq, now)
        assert isinstance(listing, ScanResult)
        listed = listed_in(layer, keys, listing)
    check_own_epoch(listed, fence.epoch, seq)
    consumption.found(found)
    info = _commit(layer, keys, fence, seq, blob, listed, consumption, lease)
    if info is None:
        raise StoreError("the store refused a checkpoint's commit under the fence it holds")
    return info


def _commit(
    layer: Layer,
    keys: AgentKeys,
    fence: Fence,
    seq: int,
    blob: Blob,
    listed: list[CheckpointInfo],
    consumption: Consumption,
    lease: LeaseWrite | None,
) -> CheckpointInfo | None:
    """The checkpoint's commit; None if the fence held but a record the consumption
    compared did not (refused if the fence did not; LeaseConflict if lease's compare
    may be what failed)."""
    text = fence.to_text()
    written_ms = round(time.time() * 1000)
    info = CheckpointInfo(epoch=fence.epoch, seq=seq, size=len(blob), written=written_ms / 1000)
    removals, left = _retention(keys, listed, info, layer.settings)
    writes = [Put(keys.checkpoint(info), blob), *consumption.writes()]
    compares = [Compare(keys.fence, text.encode()), *consumption.compares]
    if lease is not None:
        compares.append(lease[0])
        writes += lease[1]
    txn = Txn(
        compares=compares,
        writes=writes,
        reads=[Get(keys.fence, 256)],
        tidy=[*removals, DeleteRange(*keys.steps_through(seq))],
    )
    failpoint("checkpoint.before_commit")
    with failpoints_within("inbox.commit" if consumption.consumed else "checkpoint"):
        result = layer.commit(txn)
    if not result.succeeded:
        now = result.reads[0]
        if now == text.encode() and lease is not None:
            raise LeaseConflict(f"the lease record of {keys.agent!r} changed since it was read")
        if now == text.encode() and consumption.guessed:
            return None
        raise _refused(fence, seq, now)
    consumption.committed()
    layer.written[keys.agent] = (text, seq, [*left, info])
    return info


def _refused(fence: Fence, seq: int, now: object) -> Fenced:
    """The refusal of a write under fence, naming the fence a commit read (now)."""
    return fence.refused(seq, describe_fence_text(now if isinstance(now, bytes) else None))


def _retention(
    keys: AgentKeys, listed: list[CheckpointInfo], new: CheckpointInfo, settings: Settings
) -> tuple[list[DeleteRange], list[CheckpointInfo]]:
    """The removals that keep the newest keep_checkpoints at or below new's seq, and the
    listed checkpoints they leave (new aside): everything below the oldest kept, listed or
    not; another epoch's of new's seq. per_epoch: only new's epoch's listed ones go."""
    keep = settings.keep_checkpoints
    if settings.per_epoch:
        own = sorted(
            (info for info in listed if info.epoch == new.epoch and info.seq < new.seq),
            key=lambda info: info.seq,
            reverse=True,
        )
        removed = own[keep - 1 :]
        left = [info for info in listed if info not in removed]
        return [DeleteRange(keys.checkpoint(info)) for info in removed], left
    kept = sorted({info.seq for info in listed if info.seq < new.seq} | {new.seq}, reverse=True)
    oldest = kept[:keep][-1]  # the seq of the oldest checkpoint kept
    replaced = [info for info in listed if info.seq == new.seq and info.epoch != new.epoch]
    removals = [
        DeleteRange(*keys.checkpoints_below(oldest)),
        *(DeleteRange(keys.checkpoint(info)) for info in replaced),
    ]
    return removals, [info for info in listed if info.seq >= oldest and info.seq != new.seq]


def list_checkpoints(layer: Layer, keys: AgentKeys, fence: str | None) -> list[CheckpointInfo]:
    """Store.list_checkpoints: newest first, by seq then epoch; remembered as read under
    fence (``remember_listing``)."""
    listed = listed_in(layer, keys, layer.backend.scan(keys.ckpt, CHECKPOINT_NAMES_READ))
    remember_listing(layer, keys.agent, fence, listed)
    return sorted(listed, key=lambda info: (info.seq, info.epoch), reverse=True)


def remember_listing(
    layer: Layer, agent: str, fence: str | None, listed: list[CheckpointInfo]
) -> None:
    """A listing read after this client wrote fence (as it took the lease): the term's
    first checkpoint then needs no listing of its own."""
    known = layer.written.get(agent)
    if fence is not None and (known is None or known[0] != fence):
        layer.written[agent] = (fence, max((info.seq for info in listed), default=0), listed)


def listed_in(layer: Layer, keys: AgentKeys, found: ScanResult) -> list[CheckpointInfo]:
    """The checkpoints a listing of names found that parse and are within the limits; the
    rest logged."""
    listed = []
    for key in found.keys:
        info = keys.checkpoint_info(key)
        problem = (
            "a name we do not write"
            if info is None
            else check_checkpoint_bounds(info.seq, info.epoch, info.size)
        )
        if problem is not None:
            layer.reported(f"leaving out checkpoint entry {key} of {keys.agent}: {problem}")
            continue
        assert info is not None
        listed.append(info)
    if found.more:
        layer.reported(f"checkpoints of {keys.agent}: stopped listing at the read bound")
    return listed


def read_checkpoint(layer: Layer, keys: AgentKeys, info: CheckpointInfo) -> bytes:
    """Store.read_checkpoint: the sealed bytes, within MAX_CHECKPOINT_BYTES."""
    what = f"checkpoint {info.seq} of {keys.agent!r}"
    data = layer.get(keys.checkpoint(info), MAX_CHECKPOINT_BYTES, what)
    if data is None:
        raise StoreError(f"{what} is no longer retained")
    return data


def read_checkpoint_from(
    layer: Layer, keys: AgentKeys, seq: int, epoch: int
) -> tuple[CheckpointInfo, bytes] | None:
    """Store.read_checkpoint_from, in one scan: the first key from seq under epoch on."""
    found = layer.backend.scan(keys.ckpt, CHECKPOINT_READ, after=keys.checkpoints_of(seq, epoch))
    for key, blob in found.items:
        info = keys.checkpoint_info(key)
        if info is not None and check_checkpoint_bounds(info.seq, info.epoch, info.size) is None:
            return info, blob
    return None  # none, or a name we do not write (read as the listing leaves it out)


def put_effect(
    layer: Layer, keys: AgentKeys, fence: Fence, seq: int, index: int, kind: str, blob: bytes
) -> None:
    """Store.put_effect: one journal record, under the fence."""
    refuse(check_effect_bounds(seq, index, kind, len(blob)))
    result = layer.commit(
        Txn(
            compares=[Compare(keys.fence, fence.to_text().encode())],
            writes=[Put(keys.effect(seq, index, kind), bytes(blob))],
            reads=[Get(keys.fence, 256)],
        )
    )
    if not result.succeeded:
        raise _refused(fence, seq, result.reads[0])


def read_effects(layer: Layer, keys: AgentKeys, seq: int) -> dict[tuple[int, str], bytes]:
    """Store.read_effects: step seq's journal within EFFECTS_READ; junk logged and left out."""
    what = f"the effect journal of step {seq} of {keys.agent}"
    record = functools.partial(_effect_record, seq)
    return dict(bounded_records(layer, keys.step(seq), EFFECTS_READ, record, what))


def journals_in(layer: Layer, keys: AgentKeys, first: int, found: ScanResult) -> TakenJournals:
    """The journals of the steps from first on, as the commit that took the lease read them
    along (TAKEN_JOURNAL_READ): junk and records over the bound left out, as read_effects
    leaves them; a scan the bound cut short covers the steps below its last key's only."""
    records: dict[int, dict[tuple[int, str], bytes]] = {}
    seqs = []
    for key, blob in [*found.items, *((each.key, None) for each in found.too_large)]:
        seq_name, _, name = key[len(keys.effects) :].partition("/")
        seq = parse_number(seq_name)
        record = None if seq is None else _effect_record(seq, name)
        if seq is None or record is None or blob is None:
            layer.reported(f"leaving out {key}: not an effect record within the bounds")
            continue
        seqs.append(seq)
        records.setdefault(seq, {})[record] = blob
    through = None if not found.more else max(seqs, default=first) - 1
    return TakenJournals(first, through, records)


def _effect_record(seq: int, name: str) -> tuple[int, str] | None:
    """The (index, kind) an effect record's name under its step's folder says, if valid."""
    digits, _, kind = name.partition("-")
    if len(digits) != 4 or not digits.isdigit() or check_effect_bounds(seq, int(digits), kind, 0):
        return None
    return int(digits), kind
