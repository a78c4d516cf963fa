"""What a node answers about itself over HTTP: ``/health``, ``/leader`` and ``/status``.

Read from the HTTP server's thread, never waiting on the event loop, and judged as the
node judges its lease, on its own clock. ``/status`` is ``hb status --json``
(``status.snapshot``) with the lease's liveness as this node sees it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace

from ..core.clock import Clock
from ..lease import LeaseKeeper
from ..lease.observe import EXPIRED, LIVE, LeaseObserver, Liveness, Observed
from ..ops.status import snapshot
from ..stores import Store
from .state import Identity, Standing

__all__ = ["Answer", "NodeProbes"]


@dataclass(frozen=True)
class Answer:
    ok: bool  # 200, else 503
    text: str  # one line (or a JSON document for /status)


class NodeProbes:
    """The answers of one node; every method may be called from any thread."""

    def __init__(
        self,
        identity: Identity,
        standing: Standing,
        keeper: LeaseKeeper,
        store: Store,
        clock: Clock,
    ) -> None:
        self._id, self._standing, self._keeper = identity, standing, keeper
        self._store, self._clock = store, clock
        self._since = clock.monotonic()  # when this node began to watch the lease

    def leader(self) -> Answer:
        """200 only on the node that holds the lease and may step under it (as Patroni's)."""
        held, keeper = self._keeper.held, self._keeper
        if held is not None and keeper.may_step() and self._standing.role != "stopping":
            return Answer(True, f"leader {self._id.node} · epoch {held.epoch}")
        return Answer(False, f"not the leader: {self._where()}")

    def health(self) -> Answer:
        """200 for a leader that may step, or a standby that sees a live leader; else why not."""
        role, keeper = self._standing.role, self._keeper
        if role in ("starting", "stopping"):
            return Answer(False, f"{role}")
        held = keeper.held
        if held is not None:
            failing, error = self._standing.failing
            if failing:
                return Answer(False, f"leader, but {failing} steps failed in a row: {error}")
            if not keeper.may_step():
                return Answer(False, f"leader past its renew deadline: no renewal for "
                                     f"{keeper.seconds_since_renewal():.1f} s")  # fmt: skip
            paused = " · paused" if self._standing.paused else ""
            return Answer(True, f"leader · epoch {held.epoch}{paused}")
        observed, unreadable = keeper.observed, keeper.unreadable.sighting
        if observed is None and unreadable is not None:
            return Answer(False, f"no leader: the lease record is unreadable, replaced once it "
                                 f"stands for a TTL: {unreadable.what}")  # fmt: skip
        if observed is None or observed.holder is None:
            never = observed is None
            return Answer(False, "no leader: the lease is " + ("never taken" if never else
                                                               "released"))  # fmt: skip
        if not keeper.seconds_until_expiry():
            return Answer(False, f"no live leader: the lease of {observed.holder} has not "
                                 "changed for a TTL, as seen from here")  # fmt: skip
        return Answer(True, f"standby · leader {observed.holder} · epoch {observed.epoch}")

    def status(self) -> Answer:
        """``hb status --json`` of this node's agent, judged with this node's view of the lease
        (blocking: reads the store; the caller bounds it)."""
        found = snapshot(self._store, self._id.agent, _AsThisNodeSees(self._store, self))
        doc = json.loads(found.to_json())
        doc["node"] = self._id.node  # who answers
        return Answer(found.exit_code == 0, json.dumps(doc, indent=2, sort_keys=True))

    def liveness(self, observed: Observed) -> Liveness:
        """The liveness of the lease record just read, as this node judges it."""
        lease, keeper = observed.lease, self._keeper
        if lease is None or lease.holder is None or observed.lease_error is not None:
            return observed.liveness  # never taken, released or unreadable: nothing to judge
        watched = round(self._clock.monotonic() - self._since, 3)
        ttl_s = lease.ttl_ms / 1000
        if keeper.held is not None:
            since = keeper.seconds_since_renewal()
            live = keeper.may_step()
        else:
            until = keeper.seconds_until_expiry()
            since = max(0.0, ttl_s - until) if until is not None else watched
            live = bool(until)
        changed = round(since, 3)
        return Liveness(LIVE if live else EXPIRED, watched, 1 if live else 0, changed, ttl_s)

    def _where(self) -> str:
        held, observed = self._keeper.held, self._keeper.observed
        if self._standing.role in ("starting", "stopping"):
            return self._standing.role
        if held is not None:
            return f"holds the lease of epoch {held.epoch} past its renew deadline"
        if observed is not None and observed.holder is not None:
            return f"{self._standing.role}, leader {observed.holder}"
        return f"{self._standing.role}, no leader"


class _AsThisNodeSees(LeaseObserver):
    """Reads the lease record once and judges it as the node does (no watching here)."""

    def __init__(self, store: Store, probes: NodeProbes) -> None:
        super().__init__(store, limit_s=0)
        self._probes = probes

    def observe(self, agents: Sequence[str]) -> dict[str, Observed]:
        found = super().observe(agents)
        return {a: replace(o, liveness=self._probes.liveness(o)) for a, o in found.items()}
