"""A node's Prometheus metrics, in a registry of its own (``hb run --http``'s ``/metrics``).

Counts and timings are derived from what the node already says: its events
(``on_event``), its store operations (``recorded``) and the two timings no
event carries (``measured``: a renewal, a step). Gauges read the node's
``Standing`` and ``LeaseKeeper`` when scraped, from the scraping thread: plain
attribute reads, never a wait on the event loop (DESIGN.md invariant 3).

Every label takes a fixed set of values: a ``via`` not in ``TAKEOVER_VIAS``
counts as ``other``, so a hostile or future event cannot grow the series.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from ..core.clock import Clock
from ..lease import LeaseKeeper
from .state import Identity, Standing

__all__ = ["TAKEOVER_VIAS", "NodeMetrics"]

PREFIX = "hamsterbunker"
# How a lease can be taken (lease.acquired's via); anything else is "other".
TAKEOVER_VIAS = ("empty", "released", "expired", "switchover", "handoff")
# Store calls take milliseconds; a slow NFS or a far etcd, seconds.
STORE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# A step may be a tick of a counter or a long LLM call.
STEP_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)


class NodeMetrics:
    """The metrics of one node (several Runtimes may share a process: one registry each)."""

    def __init__(
        self, identity: Identity, standing: Standing, keeper: LeaseKeeper, clock: Clock
    ) -> None:
        self.registry = CollectorRegistry()
        self._clock = clock
        self._gauges(identity, standing, keeper)
        r = self.registry

        def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
            return Counter(name, doc, labels, namespace=PREFIX, registry=r)

        self._steps = counter("steps", "Steps published (agent.step).")
        self._step_failures = counter("step_failures", "Steps that raised (agent.failing).")
        self._takeovers = counter("takeovers", "Leases this node took, by how.", ("via",))
        for via in (*TAKEOVER_VIAS, "other"):
            self._takeovers.labels(via)  # present at 0, so that increase() sees the first
        self._fenced = counter("fenced_writes", "Writes the store refused as fenced (node.fenced).")
        self._store_errors = counter("store_errors", "Store errors reported (store.error).")
        self._replayed = counter(
            "effects_replayed", "Journaled effects whose recorded result a replay reused."
        )
        self._interrupted = counter(
            "effects_interrupted", "Effects found interrupted by a crash (effect.interrupted)."
        )
        self._published = counter("checkpoints", "Checkpoints published.")
        self._checkpoint_bytes = Gauge("checkpoint_bytes", "Size of the last checkpoint published.",
                                       namespace=PREFIX, registry=r)  # fmt: skip

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, namespace=PREFIX, registry=r, buckets=buckets)

        renewal = "Lease renewals that succeeded, from send to answer."
        step = "Steps that ran to their end (returned or raised)."
        publish = "Checkpoint publishes the store took, seal and fenced write."
        self._timings = {
            "renewal": histogram("renewal_seconds", renewal, STORE_BUCKETS),
            "step": histogram("step_seconds", step, STEP_BUCKETS),
            "publish": histogram("publish_seconds", publish, STORE_BUCKETS),
        }

    def _gauges(self, identity: Identity, standing: Standing, keeper: LeaseKeeper) -> None:
        """The gauges read when scraped: who this node is, and where it stands."""
        r = self.registry

        def gauge(name: str, doc: str, read: Any) -> None:
            Gauge(name, doc, namespace=PREFIX, registry=r).set_function(read)

        info = Gauge("node_info", "This node: always 1, its names as labels.",
                     ["node", "region", "agent"], namespace=PREFIX, registry=r)  # fmt: skip
        info.labels(identity.node, identity.region, identity.agent).set(1)
        gauge("is_leader", "1 while this node holds the lease, else 0.",
              lambda: float(keeper.held is not None))  # fmt: skip
        gauge(
            "epoch",
            "The lease epoch this node holds, or the highest it has seen.",
            lambda: float(keeper.held.epoch if keeper.held else standing.epoch_seen),
        )
        gauge("paused", "1 while the agent is paused by an operator (hb pause), else 0.",
              lambda: float(standing.paused))  # fmt: skip
        gauge(
            "seconds_since_renewal",
            "Seconds since this node sent its last successful renewal (NaN unless leader).",
            lambda: keeper.seconds_since_renewal() if keeper.held is not None else math.nan,
        )
        gauge("inbox_depth", "Unconsumed submissions in the inbox, as the leader last read it.",
              lambda: float(standing.inbox[0]))  # fmt: skip
        gauge("step_failures_in_a_row", "Steps of the current term that failed in a row.",
              lambda: float(standing.failing[0]))  # fmt: skip

    def on_event(self, kind: str, detail: Mapping[str, Any]) -> None:
        """Count one of the node's events (called in the event loop's thread)."""
        if kind == "agent.step":
            self._steps.inc()
        elif kind == "agent.failing":
            self._step_failures.inc()
        elif kind == "lease.acquired":
            via = detail.get("via")
            self._takeovers.labels(via if via in TAKEOVER_VIAS else "other").inc()
        elif kind == "node.fenced":
            self._fenced.inc()
        elif kind == "store.error":
            self._store_errors.inc()
        elif kind == "effect.replayed":
            reused = detail.get("reused")
            self._replayed.inc(reused if isinstance(reused, int) and reused > 0 else 1)
        elif kind == "effect.interrupted":
            self._interrupted.inc()
        elif kind == "checkpoint.published":
            self._published.inc()
            size = detail.get("size")
            if isinstance(size, int):  # absent when a publish landed despite an error
                self._checkpoint_bytes.set(size)

    def recorded(self, op: str, start: float, outcome: str) -> None:
        """A store operation that began at start (the node's clock) has ended with outcome."""
        if op == "publish" and outcome == "ok":
            self.measured("publish", self._clock.monotonic() - start)

    def measured(self, what: str, seconds: float) -> None:
        """How long a renewal, a step or a publish took (``what`` names one of them)."""
        self._timings[what].observe(max(0.0, seconds))
