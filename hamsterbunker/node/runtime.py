"""``Runtime``: one node of a HamsterBunker cluster for one agent, as callers see it.

It checks what it is given before it touches the store, then wires the node loop
(``loop``), the leader's terms (``term``) and what serves both. ``start()`` runs the
node in a background thread, ``run()`` in the foreground until SIGTERM, ``serve()``
in a running event loop.
"""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ..agent.intents import IntentLog
from ..agent.step import Agent
from ..core.clock import Clock, MonotonicClock
from ..core.history import HistoryWriter
from ..core.http_address import HttpAddress, parse_http_address
from ..core.timing import (
    DEFAULT_STEP_RETRY,
    DEFAULT_STOP_GRACE_MS,
    DEFAULT_TIMING,
    LeaseTiming,
    StepRetry,
    check_stop_grace,
    check_sync_delay,
)
from ..lease import LeaseKeeper
from ..lease.control import ControlView
from ..lease.memory import Memory, MemoryFile
from ..records import Heartbeat, check_name
from ..records.lineage import ChainChoice
from ..rotation.nodes import KEYS_READ_TTLS
from ..sealing import Sealer
from ..sealing.keyring import Keyring, Secret
from ..stores import Store, open_store
from .calls import NodeCalls
from .cluster import Cluster, NodeMemory, check_folder_store
from .events import EventHandler, EventSink
from .hot_copy import HotCopy
from .keys import KeyFollower
from .lineage_view import DivergenceCheck, LineageView, describe_ref
from .loop import NodeLoop
from .notify import Notifier
from .probes import NodeProbes
from .restore import Restorer
from .startup import open_for_node
from .state import Identity, Signals, Standing
from .stopping import StopRequest
from .term import LeaderTerm
from .watchdog import Watchdog, status_text

if TYPE_CHECKING:  # both load prometheus_client, which a node without metrics never needs
    from .endpoints import Endpoints
    from .metrics import NodeMetrics

__all__ = ["Runtime"]

# How often a node on a store that keeps chains looks for checkpoints kept aside.
DIVERGENCE_CHECK_TTLS = 3


def _on_stop_signal(signals: Signals) -> None:
    """The first SIGTERM or SIGINT stops the node gracefully; a second cuts the grace short."""
    if signals.stopping.is_set():
        signals.hurry.set()
    signals.stopping.set()


class Runtime:
    """One node of a HamsterBunker cluster for one agent.

    ``state_dir``: where the node keeps its memory of the store across restarts (without
    one it remembers only while it runs). ``clock``: CLOCK_BOOTTIME by default.
    ``stop_grace_ms``: how long a stop lets the step in flight finish and be published.
    ``step_retry``: the backoff of a step that raised, and after how many failures in a
    row the lease is handed over. ``http``: HOST:PORT to serve /metrics, /health, /leader
    and /status on; ``metrics``: count without serving (``self.metrics`` is None unless
    either is given, and prometheus_client is not loaded). ``log_agent``: name the agent
    in each event's log line. ``sync_delay_ms``: required for a ``syncdir://`` store.
    ``create_store``: make a store that holds no cluster record yet, with a ``store.created``
    warning (False: a ConfigError, nothing written, not even a file store's folder).
    ``hot_standby``: as a standby, keep a copy of the newest checkpoint (``node.hot_copy``).
    """

    def __init__(
        self,
        *,
        node_id: str,
        region: str,
        store: Store | str,
        agent: Agent,
        secret: Secret,
        agent_id: str | None = None,
        timing: LeaseTiming = DEFAULT_TIMING,
        on_event: EventHandler | None = None,
        clock: Clock | None = None,
        history: str | os.PathLike[str] | None = None,
        notifier: Notifier | None = None,
        state_dir: str | os.PathLike[str] | None = None,
        stop_grace_ms: int = DEFAULT_STOP_GRACE_MS,
        step_retry: StepRetry = DEFAULT_STEP_RETRY,
        http: HttpAddress | str | None = None,
        metrics: bool = False,
        log_agent: bool = False,
        sync_delay_ms: int | None = None,
        create_store: bool = True,
        hot_standby: bool = True,
    ) -> None:
        self._secret = Keyring.of(secret)  # checked before the store is touched
        check_stop_grace(stop_grace_ms)
        self.node_id = check_name("node id", node_id)
        self.region = region
        self.agent = agent
        self.agent_id = check_name("agent id", agent_id or str(getattr(agent, "id", "")))
        self.timing = timing
        self.step_retry = step_retry
        self.clock: Clock = clock or MonotonicClock()
        if sync_delay_ms is not None:
            check_sync_delay(timing, sync_delay_ms)  # the TTL a synced folder needs
        self._create_store, self._hot_standby = create_store, hot_standby
        self._hot: HotCopy | None = None  # of the run under way
        if isinstance(store, str):
            if not create_store:
                check_folder_store(store)
            store = open_store(store, node=self.node_id, sync_delay_ms=sync_delay_ms)
        self.store: Store = store
        self.keeper = LeaseKeeper(
            self.store, self.agent_id, self.node_id, region, timing=timing, clock=self.clock
        )
        self._remember(state_dir)
        self.on_event = on_event
        self._history = HistoryWriter(history, clock=self.clock) if history is not None else None
        self._notifier = notifier or Notifier(None)
        self.host = socket.gethostname()
        self.standing = Standing()
        self._identity = Identity(self.node_id, self.region, self.host, self.agent_id)
        self._http = parse_http_address(http) if isinstance(http, str) else http
        wanted = metrics or self._http is not None
        self.metrics: NodeMetrics | None = self._new_metrics() if wanted else None
        self.endpoints: Endpoints | None = None  # while serving http
        self._log_agent = log_agent
        self._stop = StopRequest(self.clock, stop_grace_ms / 1000)
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._signals: Signals | None = None  # of the run under way
        self._node: NodeLoop | None = None  # of the run under way, once online
        # The node process's (agents led, agents kept), for its heartbeats: set by a Host.
        self.load: Callable[[], tuple[int, int]] | None = None
        self.ready = threading.Event()  # set once the node is online (or failed to start)
        self.stopped = threading.Event()  # set once the node loop has ended, for any reason

    def _remember(self, state_dir: str | os.PathLike[str] | None) -> None:
        """Load what this node remembers of the store from its earlier runs (nothing without
        state_dir), and the intents it wrote beside it: every term's."""
        self._memory_file: MemoryFile | None = None
        remembered = Memory()
        if state_dir is not None:
            self._memory_file = MemoryFile(
                Path(state_dir) / ".memory", self.store.url, self.agent_id, clock=self.clock
            )
            remembered = self._memory_file.load()
            self.keeper.remember(remembered.epoch, remembered.reach)
        self._intents = IntentLog(
            None if self._memory_file is None else self._memory_file.path.with_suffix(".intents")
        )
        self._remembered_cluster = remembered.cluster
        self._remembered_control = remembered.control

    def _new_metrics(self) -> NodeMetrics:
        from .metrics import NodeMetrics  # loads prometheus_client: only when asked for

        return NodeMetrics(self._identity, self.standing, self.keeper, self.clock)

    @property
    def role(self) -> str:
        """``starting``, ``standby``, ``active`` or ``stopping``."""
        return self.standing.role

    @property
    def seq(self) -> int:
        """The last checkpoint this node published or resumed from."""
        return self.standing.seq

    @property
    def epoch_seen(self) -> int:
        return self.standing.epoch_seen

    def status_text(self) -> str:
        """One line saying the role, e.g. ``standby · leader hbnk-2 (us-east) · epoch 3``."""
        return status_text(self.standing, self.keeper)

    # -- control -------------------------------------------------------------------

    def start(self) -> None:
        """Run the node in a background thread and return at once."""
        if self._thread is not None:
            raise RuntimeError("this Runtime was already started")
        self._thread = threading.Thread(target=self._run_in_thread, name=f"hb-{self.node_id}")
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop gracefully: stop stepping, release the lease, drop the heartbeat. Returns
        within timeout whatever the store or the agent does (store calls that do not answer
        are given up, a sync step still running is abandoned); re-raises the error that ended
        the node, if one did.
        """
        # Most of the time for the shutdown's own store calls, the rest for the thread's end.
        self._stop.ask(within=timeout * 0.8)
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise TimeoutError(f"node {self.node_id} did not stop within {timeout} s")
        if self._error is not None:
            raise self._error

    def run(self) -> None:
        """Run in the foreground until SIGTERM or SIGINT, then stop gracefully."""
        asyncio.run(self.serve(install_signal_handlers=True))

    def _rebase_for(self, choice: ChainChoice) -> None:
        """An operator chose a chain to go on from while this node's term won: end that
        term, so that the next one restores from the choice (``hb choose-chain``)."""
        node = self._node
        if node is not None and choice.after.node == self.node_id:
            node.rebase(choice.after.epoch, f"chain chosen: go on from {describe_ref(choice.base)}")

    def request_stop(self) -> None:
        """Ask the node to stop; safe from any thread or a signal handler."""
        self._stop.ask()

    @property
    def leading(self) -> bool:
        """Whether this node leads its agent now (holds the lease, its term under way)."""
        return self.keeper.held is not None and self.standing.role == "active"

    def hand_over_to(self, target: str, beats: list[Heartbeat]) -> bool:
        """Hand the lease to target as a switchover does (see NodeLoop.hand_over_to); from
        the node's event loop. False if there is nothing of ours to hand over now."""
        return self._node is not None and self._node.hand_over_to(target, beats)

    def signal_stop(self) -> None:
        """What SIGTERM does to a running node (from its event loop): the first stops it
        gracefully, a second cuts the grace short."""
        if self._signals is None:
            self.request_stop()
        else:
            _on_stop_signal(self._signals)

    def _run_in_thread(self) -> None:
        try:
            asyncio.run(self.serve())
        except BaseException as exc:  # reported by stop()
            self._error = exc
            self.ready.set()

    # -- one run -------------------------------------------------------------------

    def _serve_http(self) -> Endpoints | None:
        """Bind and serve the HTTP endpoints, if asked for (ConfigError if it cannot bind)."""
        if self._http is None:
            return None
        from .endpoints import Endpoints  # loads prometheus_client: only when serving

        assert self.metrics is not None  # made whenever http is given
        probes = NodeProbes(self._identity, self.standing, self.keeper, self.store, self.clock)
        self.endpoints = Endpoints(self._http, self.metrics, probes)
        self.endpoints.start()
        return self.endpoints

    def _control_view(self, sealer: Sealer) -> ControlView:
        """The operator's requests as this node reads them, from the newest it remembers;
        every lease record the keeper writes carries the newest one seen."""
        control = ControlView(sealer, self.agent_id)
        control.remember(self._remembered_control)
        self.keeper.carry_control_by(control.carried)
        return control

    async def serve(self, install_signal_handlers: bool = False) -> None:
        """The node's main coroutine: returns after a graceful stop."""
        signals = self._signals = Signals(stopping=self._stop.bind())
        if install_signal_handlers:
            loop = asyncio.get_running_loop()
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, functools.partial(_on_stop_signal, signals))
        endpoints: Endpoints | None = None
        calls = NodeCalls()
        watchdog = Watchdog(self._notifier, self.clock, self.node_id)
        pinging = asyncio.create_task(watchdog.run(), name="hb-watchdog")
        try:
            endpoints = self._serve_http()  # first: an address in use is a config error
            sink = self._event_sink(calls)
            cluster = Cluster(
                self.store,
                self.agent_id,
                self._secret,
                remembered=self._remembered_cluster,
                memory_path=None if self._memory_file is None else self._memory_file.path,
                emit=sink.emit,
                create=self._create_store,
            )
            sealer = await open_for_node(
                cluster, self.keeper, self.standing, calls, sink, signals.stopping,
                notifier=self._notifier, timing=self.timing, clock=self.clock,
            )  # fmt: skip
            if sealer is None:
                return  # stopped while waiting for the store
            await calls.warm(self.store.check)
            await self._run_loop(cluster, sealer, calls, sink, signals, watchdog)
        finally:
            pinging.cancel()
            if endpoints is not None:
                endpoints.stop()
            self.stopped.set()
            calls.close()

    def _event_sink(self, calls: NodeCalls) -> EventSink:
        return EventSink(
            self._identity, self.store, calls, self.keeper, self.standing,
            retry_s=self.timing.tick_s, on_event=self.on_event, history=self._history,
            metrics=self.metrics, log_agent=self._log_agent, load=self.load,
        )  # fmt: skip

    async def _run_loop(
        self,
        cluster: Cluster,
        sealer: Sealer,
        calls: NodeCalls,
        sink: EventSink,
        signals: Signals,
        watchdog: Watchdog,
    ) -> None:
        """Run the node loop, with the key follower and (on a synced folder) the divergence
        check beside it, until a graceful stop."""
        chains = self.store.chains
        if self._hot_standby and chains is None:  # a synced folder's reads are local
            self._hot = HotCopy(self.store, self.agent_id, calls)
        lineage = (
            LineageView(chains, sealer, self.agent_id, self.node_id, emit=sink.emit)
            if chains is not None
            else None
        )
        follower = KeyFollower(
            cluster, sealer, self.standing, calls,
            emit=sink.emit, stop=self.request_stop, period_s=KEYS_READ_TTLS * self.timing.lease_ttl_s,
        )  # fmt: skip
        new_term = self._new_term(sealer, calls, sink, signals, lineage, follower)
        node = self._node_loop(cluster, sealer, calls, sink, signals, watchdog, new_term)
        following = asyncio.create_task(follower.run(), name="hb-keys")
        checking = None
        if lineage is not None:
            check = DivergenceCheck(
                lineage,
                calls,
                period_s=DIVERGENCE_CHECK_TTLS * self.timing.lease_ttl_s,
                on_choice=self._rebase_for,
            )
            checking = asyncio.create_task(check.run(), name="hb-divergence")
        self._node = node
        try:
            await node.run(self.ready)
        finally:
            self._node = None
            following.cancel()
            if checking is not None:
                checking.cancel()
        if follower.refusal is not None:
            raise follower.refusal  # stopped: a key it lacks was made current

    def _node_loop(
        self,
        cluster: Cluster,
        sealer: Sealer,
        calls: NodeCalls,
        sink: EventSink,
        signals: Signals,
        watchdog: Watchdog,
        new_term: Callable[..., LeaderTerm],
    ) -> NodeLoop:
        control = self._control_view(sealer)
        memory = (
            None
            if self._memory_file is None
            else NodeMemory(self._memory_file, self.keeper, calls, self.node_id, cluster, control)
        )
        return NodeLoop(
            identity=self._identity,
            store=self.store,
            keeper=self.keeper,
            calls=calls,
            sink=sink,
            standing=self.standing,
            signals=signals,
            stop=self._stop,
            cluster=cluster,
            cluster_record=sealer.cluster,
            control=control,
            memory=memory,
            new_term=new_term,
            notifier=self._notifier,
            watchdog=watchdog,
            timing=self.timing,
            clock=self.clock,
            hot=self._hot,
        )

    def _new_term(
        self,
        sealer: Sealer,
        calls: NodeCalls,
        sink: EventSink,
        signals: Signals,
        lineage: LineageView | None,
        follower: KeyFollower,
    ) -> Callable[..., LeaderTerm]:
        """What makes each of this node's terms as leader: (epoch, contested=...)."""
        restorer = Restorer(
            self.agent, self.agent_id, self.store, sealer, self.keeper, calls, self.standing,
            emit=sink.emit, notifier=self._notifier, lineage=lineage, hot=self._hot,
        )  # fmt: skip
        return functools.partial(
            LeaderTerm,
            identity=self._identity,
            agent=self.agent,
            store=self.store,
            sealer=sealer,
            keeper=self.keeper,
            restorer=restorer,
            calls=calls,
            sink=sink,
            standing=self.standing,
            signals=signals,
            timing=self.timing,
            clock=self.clock,
            grace=self._stop.grace,
            retry=self.step_retry,
            intents=self._intents,
            follow_keys=follower.once,
        )
