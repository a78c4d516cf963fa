"""The syncdir store's lease: every node's claim, the winning one, and this node's writes
(docs/syncdir.md, "Leadership by claims").

A node's claim is its subtree's lease record; the other machines read what it publishes
of it (``published``). ``cas`` compares the merged version and writes the own claim by
the own file store's compare-and-set against the own claim as read in the same
snapshot: among this node's writers, the check and the write are one step. A fenced
write is checked against the winning claim, then by the own file store under its lock.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

from ...core.errors import CorruptRecord, LeaseConflict, UnreadableLease
from ...records import LeaseRecord, check_name
from ..base import Fence, check_fence
from ..layer import RecordStore
from .claims import merged_lease
from .layout import os_errors
from .published import ClaimPublisher, read_published

__all__ = ["CLAIMS_KEPT_DELAYS", "MIN_CLAIMS_KEPT_S", "ClaimsLease"]

# A published claim is kept this many stated sync delays (at least MIN_CLAIMS_KEPT_S)
# before its node removes it: long enough to have synced.
CLAIMS_KEPT_DELAYS = 3
MIN_CLAIMS_KEPT_S = 5.0


class ClaimsLease:
    """One syncdir store's view of the lease (see the module)."""

    def __init__(
        self,
        root: Path,
        node: str,
        subtrees: Callable[[], Mapping[str, RecordStore]],
        writer: Callable[[], RecordStore],
        problems: Callable[[str], None],
        sync_delay_ms: int,
    ) -> None:
        """node: this node ("" for a reader); writer: its own subtree (StoreError if none)."""
        self._root, self._node = root, node
        self._subtrees, self._writer, self._problems = subtrees, writer, problems
        keep_s = max(CLAIMS_KEPT_DELAYS * sync_delay_ms / 1000, MIN_CLAIMS_KEPT_S)
        self._publisher = ClaimPublisher(root, node, keep_s)
        # The newest claim read of each node, by agent: see claims().
        self._seen: dict[str, dict[str, LeaseRecord]] = {}
        # By agent, why a claim cannot count (check_claims_with), or None if it can.
        self._checks: dict[str, Callable[[LeaseRecord], str | None]] = {}
        self._lock = threading.Lock()

    def check_claims_with(self, agent: str, problem: Callable[[LeaseRecord], str | None]) -> None:
        self._checks[agent] = problem

    def claims(self, agent: str) -> dict[str, LeaseRecord]:
        """Every node's claim on the agent's lease (node -> claim); a claim once read stays
        as last read while it is missing or unreadable (a sync tool's moment, or a removal),
        so that a live leader's lease is never taken for a free one."""
        check_name("agent id", agent)
        found: dict[str, LeaseRecord | None] = {}
        for node, store in self._subtrees().items():
            try:
                found[node] = self._claim_of(node, store, agent)
            except CorruptRecord as exc:
                self._problems(f"claim on {agent} of node {node} skipped: {exc}")
        check = self._checks.get(agent)
        for node, claim in list(found.items()):
            problem = None if check is None or claim is None else check(claim)
            if problem is not None:
                # Written without the secret: it must not win (its epoch would, for good).
                self._problems(f"claim on {agent} of node {node} left out: {problem}")
                del found[node]
        with self._lock:
            seen = self._seen.setdefault(agent, {})
            for node, claim in found.items():
                if claim is not None:
                    seen[node] = claim
            return dict(seen)

    @os_errors
    def _claim_of(self, node: str, store: RecordStore, agent: str) -> LeaseRecord | None:
        """node's claim: this node's lease record (published again at its first reading by
        this process: a crash may have cut that off); another's newest published claim, else
        its lease record."""
        if node != self._node:
            claim = read_published(self._root, node, agent, self._problems)
            if claim is not None:
                return claim
        claim = store.read_lease(agent)
        if node == self._node and claim is not None and not self._publisher.has_published(agent):
            self._publisher.publish(agent, claim)
        return claim

    def read(self, agent: str) -> LeaseRecord | None:
        """The winning claim, with the merged version."""
        return merged_lease(self.claims(agent))

    def cas(self, agent: str, expected_version: int | None, new: LeaseRecord) -> LeaseRecord:
        """Store.cas_lease: against the merged version, by the own claim's compare-and-set."""
        claims = self.claims(agent)
        current = merged_lease(claims)
        version = None if current is None else current.version
        if version != expected_version:
            raise LeaseConflict(
                f"lease of {agent!r} is at merged version {version}, not {expected_version}"
            )
        # Against the own claim as read above: fails if another writer of this node wrote since.
        claims[self._node] = written = self._write_own(agent, claims.get(self._node), new)
        self._publish(agent, written)
        result = merged_lease(claims)
        assert result is not None  # it holds the claim just written
        return result

    def check_fence(self, agent: str, fence: Fence, seq: int) -> None:
        """Fenced unless fence is the winning claim's; a hand-over to this node confirmed."""
        claims = self.claims(agent)
        winner = merged_lease(claims)
        check_fence(winner, fence, seq)
        assert winner is not None
        own = claims.get(self._node)
        if fence.matches(own):
            return
        # The lease was handed to this node by another's claim: make it this node's own
        # claim, which the own file store fences by. Lost to another writer of this node:
        # the own file store's fence check below says whether it still matches.
        with contextlib.suppress(LeaseConflict):
            written = self._write_own(agent, own, winner)
            self._publish(agent, written)

    def _write_own(self, agent: str, own: LeaseRecord | None, new: LeaseRecord) -> LeaseRecord:
        """Write new as this node's claim by compare-and-set against own (as last read). An
        unreadable claim is replaced as it stands (else one write of junk would lock this
        node out for good); a first claim or a replacement numbers on above every version
        seen or published (a published claim is never rewritten)."""
        mine = self._writer()
        found: str | None = None  # the junk replaced, by UnreadableLease.found
        try:
            if own is not None:
                return mine.cas_lease(agent, own.version, new)
            if mine.read_lease(agent) is not None:
                raise LeaseConflict(f"the claim of {self._node} on {agent!r} was written since")
        except UnreadableLease as exc:  # junk bytes: replaced against what was found
            found = exc.found
        except LeaseConflict:
            if own is None or mine.read_lease(agent) is not None:
                raise
            # Reads as none: no regular file there (a link, a FIFO, a folder), replaced.
        except CorruptRecord:
            pass  # over its bound: replaced unread
        published = read_published(self._root, self._node, agent, self._problems)
        version = 1 + max((c.version for c in (own, published) if c is not None), default=0)
        numbered = replace(new, version=version)
        if found is None:
            return mine.create_lease(agent, numbered)
        return mine.replace_unreadable_lease(agent, found, numbered)

    @os_errors
    def _publish(self, agent: str, claim: LeaseRecord) -> None:
        self._publisher.publish(agent, claim)
