"""What a new term's restore reads first (``Store.read_for_restore``), also read in the
commit that takes the lease (``Store.take_lease``): the checkpoints listed, the loss
acceptance, the cluster record (the keys the term seals with), and the newest checkpoint
where the lease record names it and it is within ``TAKEN_CHECKPOINT_BYTES`` (a big one
would hold up the new holder's first renewal).
"""

from __future__ import annotations

from collections.abc import Sequence

from ...core.errors import CorruptRecord
from ...core.limits import MAX_RECORD_BYTES
from ...core.read_bounds import CHECKPOINT_NAMES_READ, ReadBound
from ...records import LeaseRecord
from ..backend import Get, Scan, ScanResult, TooLarge
from ..base import RestoreRead, newest_first
from .base import Layer, value_of
from .checkpoints import listed_in, remember_listing
from .keys import CLUSTER, AgentKeys

__all__ = ["TAKEN_CHECKPOINT_BYTES", "restore_read", "restore_reads"]

TAKEN_CHECKPOINT_BYTES = 512 * 1024


def restore_reads(keys: AgentKeys, lease: LeaseRecord | None) -> list[Get | Scan]:
    """The reads of a restore, with the checkpoint lease names (if any) read along."""
    reads: list[Get | Scan] = [
        Scan(keys.ckpt, CHECKPOINT_NAMES_READ),
        Get(keys.acceptance, MAX_RECORD_BYTES),
        Get(CLUSTER, MAX_RECORD_BYTES),
    ]
    if lease is not None and lease.seq:
        bound = ReadBound(1, TAKEN_CHECKPOINT_BYTES, TAKEN_CHECKPOINT_BYTES)
        reads.append(Scan(keys.checkpoints_of(lease.seq, lease.seq_epoch), bound))
    return reads


def restore_read(
    layer: Layer,
    keys: AgentKeys,
    found: Sequence[bytes | TooLarge | ScanResult | None],
    fence: str | None,
) -> RestoreRead:
    """What restore_reads found; the listing remembered as read under fence
    (``checkpoints.remember_listing``)."""
    listing, acceptance, cluster = found[0], found[1], found[2]
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
    return RestoreRead(infos, accepted, newest, problem, cluster_found)
