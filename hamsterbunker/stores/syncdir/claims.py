"""Leadership by claims: the lease a node sees is the winning claim among every node's
(docs/syncdir.md, "Leadership by claims").

The order, the same on every node holding the same claims: the highest epoch; then a
claim whose holder wrote it before one written for another (a hand-over, a release);
then the highest node id. The merged version is the sum of every claim's own, so it
changes whenever any claim does and goes back only when a claim stops parsing or a
subtree goes (which the lease keeper reports as the store going back).
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
