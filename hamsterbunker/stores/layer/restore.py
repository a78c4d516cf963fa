"""What a new term's restore reads first (``Store.read_for_restore``), also read in the
commit that takes the lease (``Store.take_lease``): the checkpoints listed, the loss
acceptance, the cluster record (the keys the term seals with), and the checkpoints from
the one the lease record names on (a leader killed after its last renewal published
more), within ``TAKEN_CHECKPOINT_BYTES`` in all (more would hold up the new holder's
first renewal): the newest among them is then restored with no further read.
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
# The most checkpoints read along from the one named on: a leader renews every tick, so
# those it published after its last renewal are few.
_TAKEN_CHECKPOINTS = 4


def restore_reads(keys: AgentKeys, lease: LeaseRecord | None) -> list[Get | Scan]:
    """The reads of a restore, with the checkpoint lease names (if any) and those after it
    read along."""
    reads: list[Get | Scan] = [
        Scan(keys.ckpt, CHECKPOINT_NAMES_READ),
        Get(keys.acceptance, MAX_RECORD_BYTES),
        Get(CLUSTER, MAX_RECORD_BYTES),
    ]
    if lease is not None and lease.seq:
        bound = ReadBound(_TAKEN_CHECKPOINTS, TAKEN_CHECKPOINT_BYTES, TAKEN_CHECKPOINT_BYTES)
        reads.append(Scan(keys.ckpt, bound, after=keys.checkpoints_of(lease.seq, lease.seq_epoch)))
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
