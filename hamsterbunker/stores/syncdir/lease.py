"""The syncdir store's lease: every node's claim, the winning one, and this node's writes.

**Lease.** ``read`` is the winning claim among every node's claim, with the
merged version (``claims``: the order and why the version is a sum). A node's
claim is its subtree's lease record, and what it publishes of it for the
other machines (``published``): this node reads its own lease record, the
others' newest published claims. ``cas`` reads every claim, compares the merged
version, and writes the own claim through the own file store's compare-and-set
against the own claim's version *as read in that same snapshot*. That
compare-and-set is what makes the check and the write one step among this
node's writers (threads, processes, store objects): any of them that wrote the
own claim in between makes it fail. No lock of ours is needed beyond the file
store's: other nodes' claims arrive whenever the sync tool brings them, and
one arriving between the read and the write is the same as one arriving just
after it. It returns the merged record as of that snapshot with the new
claim in it (the written claim itself whenever it wins, as a renewal's does).
Every claim written is then published.

**Fences.** A fenced write (``put_checkpoint``, ``put_effect``) is checked
against the winning claim first (``check_fence``: Fenced if the lease moved
on), then handed to the own file store, which checks it against the own claim
under its lease lock. A node handed the lease (a switchover) has no own claim
of that term until its first renewal: the first fenced write *confirms* the
hand-over by writing the winning claim as its own claim (the merged version
moves on: the keeper's next renewal finds the record its own and adopts it). A
large checkpoint is written with no lock of ours held: renewals are never held
up. The check cannot be atomic with other machines' writes (docs/syncdir.md).
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
from ..dirs.fileio import os_errors_as_store_errors
from ..layer import RecordStore
from .claims import merged_lease
from .published import ClaimPublisher, read_published

__all__ = ["CLAIMS_KEPT_DELAYS", "MIN_CLAIMS_KEPT_S", "ClaimsLease"]

# A published claim is kept this many stated sync delays (at least MIN_CLAIMS_KEPT_S)
# before its node removes it: long enough to have synced.
CLAIMS_KEPT_DELAYS = 3
MIN_CLAIMS_KEPT_S = 5.0

_os_errors_as_store_errors = os_errors_as_store_errors("syncdir store")


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
        """From now on, leave out of agent's lease every claim problem names a problem of."""
        self._checks[agent] = problem

    def claims(self, agent: str) -> dict[str, LeaseRecord]:
        """Every node's claim on the agent's lease (node -> claim).

        A node never removes its claim, but a sync tool may leave it missing or
        unreadable for a moment (seen under Syncthing), and a writer without the
        secret may remove it: a claim seen once stays as it was last read until
        another reading of it replaces it. A standby then times the lease from the
        last change it saw, as on any store, instead of taking a live leader's lease
        for a free one.
        """
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

    @_os_errors_as_store_errors
    def _claim_of(self, node: str, store: RecordStore, agent: str) -> LeaseRecord | None:
        """node's claim: its own lease record for this node; another's newest published
        claim, else its lease record (``published``). This node's own claim is published again at
        its first reading by this process: a crash may have cut its publish off."""
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
        """Write new as this node's claim by compare-and-set against own (its claim as last
        read). Only this node writes its claim, and it is skipped while unreadable, so the
        caller's comparison was made without it: an unreadable one is replaced as it stands,
        or a single write of junk would keep this node from ever writing its claim again.
        A first claim, and a replacement, number on above every version of the claim seen
        or published (a published claim is never rewritten under its version)."""
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

    @_os_errors_as_store_errors
    def _publish(self, agent: str, claim: LeaseRecord) -> None:
        self._publisher.publish(agent, claim)
