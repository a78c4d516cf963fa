"""What a new term's restore reads first (``Store.read_for_restore``), also read in the
commit that takes the lease (``Store.take_lease``): the checkpoints listed, the loss
acceptance, the cluster record (the keys the term seals with), and the checkpoints from
the one the lease record names on (a leader killed after its last renewal published
more), within ``TAKEN_CHECKPOINT_BYTES`` in all (more would hold up the new holder's
first renewal): the newest among them is then restored with no further read. The take also
reads what the term's first step reads: the effect journals from the step after the named
checkpoint on (final: the same commit fences every older term off) and the inbox.
"""

from __future__ import annotations

from collections.abc import Sequence

from ...core.errors import CorruptRecord
from ...core.limits import MAX_RECORD_BYTES
from ...core.read_bounds import (
    CHECKPOINT_NAMES_READ,
    TAKEN_INBOX_READ,
    TAKEN_JOURNAL_READ,
    ReadBound,
)
from ...records import LeaseRecord
from ..backend import Get, Scan, ScanResult, TooLarge
from ..base import RestoreRead, newest_first
from .base import Layer, value_of
from .checkpoints import journals_in, listed_in, remember_listing
from .inbox import submissions_in
from .keys import CLUSTER, AgentKeys

__all__ = ["TAKEN_CHECKPOINT_BYTES", "restore_read", "restore_reads"]

TAKEN_CHECKPOINT_BYTES = 512 * 1024
# The most checkpoints read along from the one named on: a leader renews every tick, so
# those it published after its last renewal are few.
_TAKEN_CHECKPOINTS = 4


def restore_reads(
    keys: AgentKeys, lease: LeaseRecord | None, *, taking: bool = False
) -> list[Get | Scan]:
    """The reads of a restore, with the checkpoint lease names (if any) and those after it
    read along; taking (the commit that takes the lease): the first step's reads too."""
    reads: list[Get | Scan] = [
        Scan(keys.ckpt, CHECKPOINT_NAMES_READ),
        Get(keys.acceptance, MAX_RECORD_BYTES),
        Get(CLUSTER, MAX_RECORD_BYTES),
    ]
    if taking:
        first = (lease.seq if lease is not None else 0) + 1
        reads.append(Scan(keys.effects, TAKEN_JOURNAL_READ, after=keys.step(first)))
        reads.append(Scan(keys.pending, TAKEN_INBOX_READ))
    if lease is not None and lease.seq:
        bound = ReadBound(_TAKEN_CHECKPOINTS, TAKEN_CHECKPOINT_BYTES, TAKEN_CHECKPOINT_BYTES)
        reads.append(Scan(keys.ckpt, bound, after=keys.checkpoints_of(lease.seq, lease.seq_epoch)))
    return reads


def restore_read(
    layer: Layer,
    keys: AgentKeys,
    found: Sequence[bytes | TooLarge | ScanResult | None],
    fence: str | None,
    first: int | None = None,
) -> RestoreRead:
    """What restore_reads found; the listing remembered as read under fence
    (``checkpoints.remember_listing``). first: the first step whose journal the take read
    along (restore_reads with taking), None if it did not."""
    listing, acceptance, cluster = found[0], found[1], found[2]
    journals = inbox = None
    if first is not None:
        along, pending = found[3], found[4]
        assert isinstance(along, ScanResult) and isinstance(pending, ScanResult)
        journals, inbox = (
            journals_in(layer, keys, first, along),
            submissions_in(layer, keys, pending),
        )
        found = [*found[:3], *found[5:]]
    assert isinstance(listing, ScanResult) and not isinstance(acceptance, ScanResult)
    listed = listed_in(layer, keys, listing)
    remember_listing(layer, keys.agent, fence, listed)
    infos = newest_first(listed)
    problem = ""
    try:
        accepted = value_of(
            acceptance, MAX_RECORD_BYTES, f"loss-acceptance record of {keys.agent!r}"
        )
    except CorruptRecord as exc:
        accepted, problem = None, str(exc)
    newest = None
    if len(found) > 3 and infos:
        along = found[3]
        assert isinstance(along, ScanResult)
        newest = dict(along.items).get(keys.checkpoint(infos[0]))
    cluster_found = cluster if isinstance(cluster, bytes) else None  # else the term reads it
    return RestoreRead(infos, accepted, newest, problem, cluster_found, journals, inbox)
