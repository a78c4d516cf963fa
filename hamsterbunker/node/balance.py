"""Spreading the leases of a host's agents over the node processes that keep them.

Once a round (a lease TTL), a host leading at least two more than a live standby
of one of its agents hands agents over by switchover, at most ``MAX_PER_ROUND``
a round, reading at most ``MAX_READS_PER_ROUND`` agents' heartbeats
(docs/design.md, "The node").
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from ..core.clock import Clock
from ..core.errors import StoreError
from ..records import Heartbeat
from ..stores import Store
from .runtime import Runtime

__all__ = ["Balancer"]

log = logging.getLogger("hamsterbunker")

MAX_PER_ROUND = 8  # agents a host hands over in one round
MAX_READS_PER_ROUND = 2 * MAX_PER_ROUND + 1  # heartbeat reads a round makes at most


class Balancer:
    """One host's side of spreading the leases (see the module's docstring)."""

    def __init__(
        self, runtimes: Sequence[Runtime], store: Store, clock: Clock, period_s: float
    ) -> None:
        self._runtimes, self._store, self._clock = list(runtimes), store, clock
        self._period_s = period_s
        # agent -> (when this host last read its heartbeats, each node's beat count then)
        self._read_at: dict[str, tuple[float, dict[str, int]]] = {}
        self._round_s = 0.0  # how long the last round took (its reads)
        self._load: tuple[float, tuple[int, int]] | None = None  # (when counted, load)
        # Its own thread, not asyncio's default pool, which the end of asyncio.run waits for.
        self._reads = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hb-balance")

    def load(self) -> tuple[int, int]:
        """(agents this host leads, agents it keeps): what its heartbeats tell (counted at
        most every tenth of a round: every agent's heartbeat asks)."""
        now = self._clock.monotonic()
        if self._load is None or now - self._load[0] > self._period_s / 10:
            leads = sum(runtime.leading for runtime in self._runtimes)
            self._load = (now, (leads, len(self._runtimes)))
        return self._load[1]

    async def run(self) -> None:
        """A round every period until cancelled; a store error skips a round."""
        try:
            while True:
                await asyncio.sleep(self._period_s)
                try:
                    await self.round()
                except StoreError as exc:
                    log.debug("balancing skipped a round: %s", exc)
        finally:
            self._reads.shutdown(wait=False, cancel_futures=True)

    async def round(self) -> int:
        """Hand over what this host leads beyond its share; the number handed over."""
        started = self._clock.monotonic()
        try:
            return await self._round()
        finally:
            self._round_s = self._clock.monotonic() - started

    async def _round(self) -> int:
        led = [runtime for runtime in self._runtimes if runtime.leading]
        ours = len(led)
        live: dict[str, int] = {}  # node -> the agents it leads, for the nodes seen live
        given: dict[str, int] = {}  # what this round hands to each node, not yet in its beats
        handed = 0
        for reads, runtime in enumerate(led):
            if handed == MAX_PER_ROUND or ours < 2 or reads == MAX_READS_PER_ROUND:
                break
            beats = await asyncio.get_running_loop().run_in_executor(
                self._reads, self._store.list_heartbeats, runtime.agent_id
            )
            live.update(self._moved(runtime.agent_id, beats))
            if live and all(leads + given.get(n, 0) > ours - 2 for n, leads in live.items()):
                break  # no live node leads two fewer than this host: even already
            takers = [
                beat.node
                for beat in beats
                if beat.node in live and beat.role == "standby" and beat.lease_session
            ]
            if not takers:
                continue
            target = min(takers, key=lambda node: (live[node] + given.get(node, 0), node))
            if ours - (live[target] + given.get(target, 0)) < 2:
                continue
            if runtime.hand_over_to(target, beats):
                ours -= 1
                handed += 1
                given[target] = given.get(target, 0) + 1
        return handed

    def _moved(self, agent: str, beats: list[Heartbeat]) -> dict[str, int]:
        """The nodes (of hosts) whose heartbeat for agent moved since this host's previous
        read of it, if that read was at most two rounds ago: each with the agents it leads."""
        now = self._clock.monotonic()
        previous = self._read_at.get(agent)
        self._read_at[agent] = (now, {beat.node: beat.beats for beat in beats})
        if previous is None or now - previous[0] > 2 * self._period_s + self._round_s:
            return {}
        return {
            beat.node: beat.host_leads
            for beat in beats
            if beat.host_agents > 0 and previous[1].get(beat.node, beat.beats) != beat.beats
        }
