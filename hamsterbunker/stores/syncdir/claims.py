"""Leadership by claims: the lease a node sees is the winning claim among every node's.

Each node's ``lease.json`` in its own subtree is its *claim*: a lease record
only it writes. A claim's holder is usually its writer; it is another node
for a hand-over (a switchover writes the successor's next term in the
successor's name) and None for a release. The order, the same on every node
that holds the same claims:

1. the highest epoch;
2. at the same epoch, a claim whose holder is the node that wrote it before
   one written for another holder (a hand-over, or a release): the successor's
   own renewal then takes over from the claim that handed it the lease;
3. then the highest node id (as ``hamsterbunker.records.lineage`` orders terms).

The merged record's version is the sum of every claim's own version. Each
claim's own version only grows (its file store's compare-and-set writes the
one it replaces + 1), so the sum changes whenever any claim changes, never
goes back, and a compare-and-set against it fails once any claim arrived
since the read. (A claim that stops parsing, or a subtree removed, makes it go
back; the lease keeper reports that as the store going back.)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from ...records import LeaseRecord

__all__ = ["claim_order", "merged_lease", "winning_node"]


def claim_order(node: str, claim: LeaseRecord) -> tuple[int, bool, str]:
    """The key the winning claim has the highest of: (epoch, written by its holder, node id)."""
    return (claim.epoch, claim.holder == node, node)


def winning_node(claims: Mapping[str, LeaseRecord]) -> str | None:
    """The node whose claim wins among claims (node -> its claim); None if there are none."""
    if not claims:
        return None
    return max(claims, key=lambda node: claim_order(node, claims[node]))


def merged_lease(claims: Mapping[str, LeaseRecord]) -> LeaseRecord | None:
    """The winning claim with the merged version (the sum of every claim's); None if none."""
    node = winning_node(claims)
    if node is None:
        return None
    return replace(claims[node], version=sum(claim.version for claim in claims.values()))
