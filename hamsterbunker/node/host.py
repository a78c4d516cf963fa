"""``Host``: the nodes of several agents in one process (``hb run`` with ``[[agents]]``).

A ``Runtime`` per agent, each with a lease of its own; an agent that stops with an
error is reported at once while the others go on. Towards systemd the host is one
service: READY=1 once every agent is online, the watchdog pinged only while every
running agent's lease loop makes progress, one STATUS= line for all.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Sequence

from ..core.errors import ConfigError
from .balance import Balancer
from .notify import Notifier
from .runtime import Runtime

__all__ = ["AgentNotifier", "Host", "HostNotifier", "check_distinct"]

log = logging.getLogger("hamsterbunker")

# STATUS= is one line for every agent: cut beyond this many characters.
MAX_STATUS_CHARS = 400


def check_distinct(agent_ids: Sequence[str]) -> None:
    """ConfigError unless there is at least one agent id and none is given twice."""
    if not agent_ids:
        raise ConfigError("a host needs at least one agent")
    seen: set[str] = set()
    for agent_id in agent_ids:
        if agent_id in seen:
            raise ConfigError(f"agent id {agent_id!r} is given twice: each agent needs its own")
        seen.add(agent_id)


class HostNotifier:
    """Gathers the agents' notifications into the one service systemd sees."""

    def __init__(self, notifier: Notifier, agents: Sequence[str]) -> None:
        self._notifier = notifier
        self._agents = list(agents)
        self._running = set(agents)
        self._ready: set[str] = set()
        self._pinged: set[str] = set()
        self._status: dict[str, str] = {}

    def for_agent(self, agent: str) -> AgentNotifier:
        return AgentNotifier(self, agent)

    def ended(self, agent: str) -> None:
        """The agent's node has stopped: it is waited for no more."""
        self._running.discard(agent)
        self._check_ready()
        self._check_pinged()

    def ready(self, agent: str) -> None:
        self._ready.add(agent)
        self._check_ready()

    def status(self, agent: str, text: str) -> None:
        self._status[agent] = " ".join(text.split())
        line = "; ".join(f"{a}: {self._status[a]}" for a in self._agents if a in self._status)
        if len(line) > MAX_STATUS_CHARS:
            line = line[: MAX_STATUS_CHARS - 1] + "…"
        self._notifier.status(line)

    def watchdog(self, agent: str) -> None:
        self._pinged.add(agent)
        self._check_pinged()

    def stopping(self) -> None:
        self._notifier.stopping()

    def extend_timeout(self, seconds: float) -> None:
        self._notifier.extend_timeout(seconds)

    def _check_ready(self) -> None:
        if self._running and self._running <= self._ready:
            self._notifier.ready()

    def _check_pinged(self) -> None:
        # A ping only when every running agent's own watchdog pinged since the last one:
        # one stalled lease loop withholds it, as it would for a node of one agent.
        if self._running and self._running <= self._pinged:
            self._pinged.clear()
            self._notifier.watchdog()


class AgentNotifier(Notifier):
    """One agent's notifier in a host: its calls go to the HostNotifier."""

    def __init__(self, host: HostNotifier, agent: str) -> None:
        super().__init__(None, host._notifier.watchdog_usec)
        self._host, self._agent = host, agent

    @property
    def enabled(self) -> bool:
        return self._host._notifier.enabled

    @property
    def watchdog_interval(self) -> float | None:
        return self._host._notifier.watchdog_interval

    def ready(self) -> None:
        self._host.ready(self._agent)

    def status(self, text: str) -> None:
        self._host.status(self._agent, text)

    def watchdog(self) -> None:
        self._host.watchdog(self._agent)

    def stopping(self) -> None:
        self._host.stopping()

    def extend_timeout(self, seconds: float) -> None:
        self._host.extend_timeout(seconds)

    def close(self) -> None:
        pass  # the host's notifier is closed by its owner


class Host:
    """Several agents' nodes in one process, on one event loop."""

    def __init__(self, runtimes: Sequence[Runtime], notifier: HostNotifier) -> None:
        check_distinct([runtime.agent_id for runtime in runtimes])
        self.runtimes = list(runtimes)
        self._notifier = notifier
        first = self.runtimes[0]
        self.balancer = Balancer(self.runtimes, first.store, first.clock, first.timing.lease_ttl_s)
        for runtime in self.runtimes:
            runtime.load = self.balancer.load

    def run(self) -> None:
        """Run every agent's node in the foreground until SIGTERM or SIGINT; the first
        error any of them stopped with is raised once all have stopped."""
        asyncio.run(self.serve(install_signal_handlers=True))

    def request_stop(self) -> None:
        """Stop every agent's node gracefully; safe from any thread."""
        for runtime in self.runtimes:
            runtime.request_stop()

    async def serve(self, install_signal_handlers: bool = False) -> None:
        if install_signal_handlers:
            loop = asyncio.get_running_loop()
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, self._signalled)
        tasks = {
            asyncio.create_task(runtime.serve(), name=f"hb-{runtime.agent_id}"): runtime
            for runtime in self.runtimes
        }
        for task in tasks:
            task.add_done_callback(lambda done: self._ended(tasks[done], done))
        balancing = asyncio.create_task(self.balancer.run(), name="hb-balance")
        try:
            await asyncio.wait(tasks)
        finally:
            balancing.cancel()
        errors = [task.exception() for task in tasks if not task.cancelled()]
        first = next((error for error in errors if error is not None), None)
        if first is not None:
            raise first

    def _signalled(self) -> None:
        for runtime in self.runtimes:
            runtime.signal_stop()

    def _ended(self, runtime: Runtime, task: asyncio.Task[None]) -> None:
        self._notifier.ended(runtime.agent_id)
        error = None if task.cancelled() else task.exception()
        if error is not None:
            # The others go on: each agent's lease is its own.
            log.error("%s: the node of agent %s stopped: %s",
                      runtime.node_id, runtime.agent_id, error)  # fmt: skip
