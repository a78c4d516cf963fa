"""Spreading the leases of a host's agents over the node processes that keep them.

There is no scheduler. Every heartbeat says how many agents its node process
leads and keeps (``Heartbeat.host_leads``, ``host_agents``). Once a round (a
lease TTL), a host that leads agents reads the heartbeats of one of them; where
it leads at least two more than a live node that stands by for that agent, it
hands agents over to the least loaded such nodes by switchover (the target leads
at once: no TTL passes, and the fencing rules are those of any switchover), at
most ``MAX_PER_ROUND`` a round, so that the loads the heartbeats tell catch up
before the next. Each host does the same, so the leads even out to within one.

A node counts as live once its heartbeat for the agent changed between two of
this host's reads, the second at most two rounds ago, on this host's clock (a
standby beats every half TTL): its wall-clock times are never compared with ours.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from ..clock import Clock
from ..errors import StoreError
from ..records import Heartbeat
from ..stores import Store
from .runtime import Runtime

__all__ = ["Balancer"]

log = logging.getLogger("hamsterbunker")

MAX_PER_ROUND = 8  # agents a host hands over in one round


class Balancer:
    """One host's side of spreading the leases (see the module's docstring)."""

    def __init__(
        self, runtimes: Sequence[Runtime], store: Store, clock: Clock, period_s: float
    ) -> None:
        self._runtimes, self._store, self._clock = list(runtimes), store, clock
        self._period_s = period_s
        # (agent, node) -> (the beat count last read, when this host first read it)
        self._seen: dict[tuple[str, str], tuple[int, float]] = {}
        # Its own thread, not asyncio's default pool, which the end of asyncio.run waits for.
        self._reads = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hb-balance")

    def load(self) -> tuple[int, int]:
        """(agents this host leads, agents it keeps): what its heartbeats tell."""
        return sum(runtime.leading for runtime in self._runtimes), len(self._runtimes)

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
        led = [runtime for runtime in self._runtimes if runtime.leading]
        ours = len(led)
        given: dict[str, int] = {}  # what this round hands to each node, not yet in its beats
        handed = 0
        for runtime in led:
            if handed == MAX_PER_ROUND or ours < 2:
                break
            beats = await asyncio.get_running_loop().run_in_executor(
                self._reads, self._store.list_heartbeats, runtime.agent_id
            )
            takers = [
                beat
                for beat in self._live(runtime.agent_id, beats)
                if beat.role == "standby" and beat.lease_session and beat.host_agents > 0
            ]
            if not takers:
                continue
            target = min(takers, key=lambda b: (b.host_leads + given.get(b.node, 0), b.node))
            if ours - (target.host_leads + given.get(target.node, 0)) < 2:
                if handed == 0 and runtime is led[0]:
                    return 0  # even already: one read a round is all it costs
                continue
            if runtime.hand_over_to(target.node, beats):
                ours -= 1
                handed += 1
                given[target.node] = given.get(target.node, 0) + 1
        return handed

    def _live(self, agent: str, beats: list[Heartbeat]) -> list[Heartbeat]:
        """The beats of nodes whose heartbeat for agent moved since this host's last read
        of it, if that read is at most two rounds old."""
        now = self._clock.monotonic()
        live = []
        for beat in beats:
            key = (agent, beat.node)
            before = self._seen.get(key)
            if before is None or before[0] != beat.beats:
                if before is not None and now - before[1] <= 2 * self._period_s:
                    live.append(beat)
                self._seen[key] = (beat.beats, now)
        return live
