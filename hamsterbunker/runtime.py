"""The node runtime: heartbeat, lease keeping, stepping and sealed checkpoints.

Every node runs the same loop against the shared store. Three asyncio tasks
run side by side, so lease keeping never waits on the agent:

* the *keeper* ticks every ``tick_ms``: renews or observes/acquires the lease
  and writes the heartbeat;
* the *leader* task exists only while this node holds the lease: it restores
  the last checkpoint, then steps the agent and publishes each new state,
  fenced by epoch in the store;
* the *watcher* turns store changes into early wake-ups (a released lease is
  taken at once, not at the next tick).

Blocking store calls run on a small thread pool of their own; a sync ``step``
runs on another thread, so a slow NFS write or a long LLM call freezes neither.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import copy
import enum
import functools
import inspect
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from .acceptance import Acceptance, open_acceptance
from .agent import Agent, State, StepContext, _current
from .clock import Clock
from .errors import (
    CorruptRecord,
    Fenced,
    HamsterbunkerError,
    NoUsableCheckpoint,
    StepLost,
    StoreError,
    StoreRegressed,
    StoreUnavailable,
    Tampered,
)
from .failpoints import failpoint
from .history import HistoryWriter
from .lease import DEFAULT_TIMING, LeaseKeeper, Outcome, TickResult
from .memory import Memory, MemoryFile
from .notify import Notifier
from .reach import Reach
from .records import CheckpointInfo, ClusterRecord, Event, Heartbeat, check_name
from .sealing import Sealer, check_secret, new_cluster_record
from .stores import Fence, Store, open_store
from .timing import LeaseTiming

__all__ = ["Runtime"]

log = logging.getLogger("hamsterbunker")
T = TypeVar("T")
EventHandler = Callable[[Event], None]
_MAX_PENDING_EVENTS = 10_000
# How much longer systemd should wait for a stop, granted before each
# checkpoint a restore reads: a restore that makes progress is never cut
# short by TimeoutStopSec, one that hangs still is.
RESTORE_READ_ALLOWANCE_S = 30.0
# The most a stop waits for each store call of its shutdown (release, heartbeat),
# and for the events to be flushed, when stop() names no deadline of its own.
SHUTDOWN_CALL_S = 5.0


@dataclass
class _Progress:
    """The state the next step starts from, and the highest seq already in the store."""

    state: State
    seq: int
    resumed: bool = True  # False: started from init()
    accepted_loss: str = ""  # the id of a loss acceptance honoured by this restore


class _LeaseBehind(HamsterbunkerError):
    """The lease record is behind an authenticated checkpoint: take the lease again, above it."""


class _Stall:
    """How long a term has failed to make progress, timed on the lease's clock."""

    def __init__(self, keeper: LeaseKeeper) -> None:
        self._keeper = keeper
        self._since: float | None = None

    def for_a_ttl(self) -> bool:
        """Note one more failure; True once failures have gone on for a full lease TTL."""
        now = self._keeper.clock.monotonic()
        if self._since is None:
            self._since = now
        return now - self._since >= self._keeper.timing.lease_ttl_s

    def reset(self) -> None:
        self._since = None


class _StepEnd(enum.Enum):
    DONE = "done"
    DEADLINE = "renew deadline passed during the step"
    LOST = "lease lost or node stopping"


class _Published(enum.Enum):
    YES = "yes"
    RETRY = "retry"  # the store failed (disk full, unavailable): same step again
    FENCED = "fenced"  # the lease moved on: stop leading


class Runtime:
    """One node of a HamsterBunker cluster for one agent."""

    def __init__(
        self,
        *,
        node_id: str,
        region: str,
        store: Store | str,
        agent: Agent,
        secret: str,
        agent_id: str | None = None,
        timing: LeaseTiming = DEFAULT_TIMING,
        on_event: EventHandler | None = None,
        clock: Clock | None = None,
        history: str | os.PathLike[str] | None = None,
        notifier: Notifier | None = None,
        state_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        """``state_dir``: where this node keeps its memory of the store across restarts
        (see ``hamsterbunker.memory``); without one it remembers only while it runs."""
        check_secret(secret)
        self.node_id = check_name("node id", node_id)
        self.region = region
        self.agent = agent
        self.agent_id = check_name("agent id", agent_id or str(getattr(agent, "id", "")))
        self.timing = timing
        self.store: Store = open_store(store) if isinstance(store, str) else store
        self.keeper = LeaseKeeper(
            self.store,
            self.agent_id,
            self.node_id,
            region,
            timing=timing,
            clock=clock,
        )
        self._memory: MemoryFile | None = None
        self._remembered = Memory()
        self._memory_failed = False
        if state_dir is not None:
            self._memory = MemoryFile(Path(state_dir) / ".memory", self.store.url, self.agent_id)
            self._remembered = self._memory.load()
            self.keeper.remember(self._remembered.epoch, self._remembered.reach)
        self.on_event = on_event
        self._history = HistoryWriter(history) if history is not None else None
        self._notifier = notifier or Notifier(None)
        # When the current pass of the lease loop began; None while it sleeps.
        # A pass that runs too long is a stall: the watchdog pings stop.
        self._pass_started: float | None = None
        self._restored = False  # whether the current term has restored its state yet
        self.host = socket.gethostname()
        self.role = "starting"
        self.epoch_seen = 0
        self.seq = 0
        self._secret = secret
        self._sealer: Sealer | None = None
        self._event_n = 0
        self._beats = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread_id = 0
        self._stopping: asyncio.Event | None = None
        self._wake: asyncio.Event | None = None
        self._lost: asyncio.Event | None = None
        self._keeper_lock: asyncio.Lock | None = None  # LeaseKeeper is used by one call at a time
        self._renewed: asyncio.Event | None = None  # set on every successful renewal
        self._pending: asyncio.Queue[Event] | None = None
        self._io = ThreadPoolExecutor(max_workers=4, thread_name_prefix="hb-store")
        # Steps, sealing and init run here, not in asyncio's default executor, which
        # asyncio.run waits for at the end: a sync step that never returns must not
        # keep stop() from returning.
        self._work = ThreadPoolExecutor(max_workers=4, thread_name_prefix="hb-work")
        self._stop_by: float | None = None  # monotonic deadline of stop(timeout)
        self._leader: asyncio.Task[None] | None = None  # steps the agent while we hold the lease
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._stop_requested = threading.Event()
        self.ready = threading.Event()  # set once the node is online (or failed to start)
        self.stopped = threading.Event()  # set once the node loop has ended, for any reason

    # -- public control ------------------------------------------------------

    def start(self) -> None:
        """Run the node in a background thread and return at once."""
        if self._thread is not None:
            raise RuntimeError("this Runtime was already started")
        self._thread = threading.Thread(target=self._run_in_thread, name=f"hb-{self.node_id}")
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop gracefully: stop stepping, release the lease, drop the heartbeat.

        Returns within timeout whatever the store or the agent does: store calls
        that do not answer in time are given up (and said so in the log). A sync
        step still running is abandoned in its thread. Re-raises the error that
        ended the node, if one did.
        """
        # Most of the time for the shutdown's own store calls, the rest for the thread's end.
        self._stop_by = time.monotonic() + timeout * 0.8
        self.request_stop()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise TimeoutError(f"node {self.node_id} did not stop within {timeout} s")
        if self._error is not None:
            raise self._error

    def run(self) -> None:
        """Run in the foreground until SIGTERM or SIGINT, then stop gracefully."""
        asyncio.run(self.serve(install_signal_handlers=True))

    def request_stop(self) -> None:
        """Ask the node to stop; safe from any thread or a signal handler."""
        self._stop_requested.set()  # seen by serve() if its loop is not running yet
        loop, stopping = self._loop, self._stopping
        if loop is not None and stopping is not None and not loop.is_closed():
            # RuntimeError: the loop closed between the check and the call; already stopped.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(stopping.set)

    def _run_in_thread(self) -> None:
        try:
            asyncio.run(self.serve())
        except BaseException as exc:  # reported by stop()
            self._error = exc
            self.ready.set()

    # -- the node ------------------------------------------------------------

    async def serve(self, install_signal_handlers: bool = False) -> None:
        """The node's main coroutine: returns after a graceful stop."""
        self._loop = asyncio.get_running_loop()
        self._loop_thread_id = threading.get_ident()
        self._stopping, self._wake, self._lost = asyncio.Event(), asyncio.Event(), asyncio.Event()
        self._keeper_lock = asyncio.Lock()
        self._renewed = asyncio.Event()
        self._pending = asyncio.Queue(_MAX_PENDING_EVENTS)
        if self._stop_requested.is_set():
            self._stopping.set()
        if install_signal_handlers:
            for signum in (signal.SIGTERM, signal.SIGINT):
                self._loop.add_signal_handler(signum, self._stopping.set)
        watchdog = asyncio.create_task(self._ping_watchdog(), name="hb-watchdog")
        try:
            self._notifier.status("starting · opening the store")
            # The secret is checked before this node writes anything but a new
            # cluster record: a node with the wrong secret touches nothing.
            self._sealer = await self._io_call(self._open_cluster)
            writer = asyncio.create_task(self._write_events(), name="hb-events")
            watcher = asyncio.create_task(self._watch(), name="hb-watch")
            for warning in self.store.warnings:
                self._emit("store.warning", message=warning)
            self._emit("node.online", region=self.region, host=self.host, pid=os.getpid())
            self._notifier.ready()  # store reachable, secret verified
            self.ready.set()
            try:
                await self._keep_lease_until_stopped()
            finally:
                watcher.cancel()
                if self._memory is not None:
                    await self._remember(force=True)  # all it saw, at last
                await self._shutdown(writer)
        finally:
            watchdog.cancel()
            self.stopped.set()
            self._io.shutdown(wait=False, cancel_futures=True)
            self._work.shutdown(wait=False, cancel_futures=True)

    def _open_cluster(self) -> Sealer:
        if self._remembered.cluster is not None:
            cluster = self._reconcile_cluster(self._remembered.cluster)
        else:
            cluster = self.store.read_cluster() or self.store.create_cluster(
                new_cluster_record(self._secret)
            )
        sealer = Sealer(self._secret, cluster)
        # Event numbers continue across restarts of this node, so readers that
        # keep a cursor per node see the new process's events too.
        own = [e.n for e in self.store.read_events(self.agent_id) if e.node == self.node_id]
        self._event_n = max(own, default=0)
        return sealer

    def _reconcile_cluster(self, ours: ClusterRecord) -> ClusterRecord:
        """Put a lost cluster record back from what this node knows; refuse a different one.

        Without the record no node started later could open the checkpoints
        this cluster sealed; a different record means a different key.
        """
        try:
            stored = self.store.read_cluster()
        except CorruptRecord as exc:
            # Ours was verified before and is remembered: go on with it, loudly.
            self._emit("store.warning", message=f"{exc}: going on with the remembered one")
            return ours
        if stored is None:
            stored = self.store.create_cluster(ours)  # the record that won, if another did
            self._emit("store.regressed", reason="the cluster record was gone: put it back")
        if stored.key_id != ours.key_id:
            forget = (
                f" (or remove {self._memory.path} if the store was replaced deliberately)"
                if self._memory is not None
                else ""
            )
            raise StoreRegressed(
                f"agent {self.agent_id}: the store's cluster record changed from key id "
                f"{ours.key_id} to {stored.key_id}: the store was replaced or re-created; "
                f"refusing to go on with another key{forget}"
            )
        if stored != ours:
            # Same key id, other key parameters (n, r, p): not the record this node
            # verified. Unauthenticated, so ours is kept, and the change reported.
            self._emit(
                "store.warning",
                message=f"the store's cluster record differs from the one this node remembers "
                f"(n={stored.n} r={stored.r} p={stored.p}, remembered n={ours.n} r={ours.r} "
                f"p={ours.p}): going on with the remembered one",
            )
        return ours

    def _check_cluster(self) -> None:
        """After the store went back: see that the cluster record is still this one."""
        assert self._sealer is not None
        try:
            self._reconcile_cluster(self._sealer.cluster)
        except StoreError as exc:
            log.warning("%s: could not check the cluster record: %s", self.node_id, exc)

    async def _remember(self, force: bool = False) -> None:
        """Keep what this node has seen in its state directory, when a write is due."""
        assert self._sealer is not None and self._memory is not None
        seen = Memory(self.keeper.highest_epoch, self.keeper.reach(), self._sealer.cluster)
        if not self._memory.due(seen, force=force):
            return  # most passes: no thread hand-off for nothing
        try:
            await self._work_call(self._memory.save, seen, force=force)
            self._memory_failed = False
        except OSError as exc:
            # Memory only sharpens what a restarted node can notice; the agent goes on.
            if not self._memory_failed:
                log.warning("%s: cannot save its memory: %s", self.node_id, exc)
            self._memory_failed = True

    async def _keep_lease(self) -> None:
        assert self._stopping is not None and self._lost is not None
        failpoint("node.before_first_tick")
        try:
            await self._keep_lease_passes()
        except asyncio.CancelledError:
            # Given up during a stop (a store call hung): the term ends with the loop.
            if self._leader is not None:
                self._lost.set()
                self._leader.cancel()
            raise
        self._notifier.stopping()
        self._notifier.status("stopping · handing over the lease")
        if self._leader is not None:
            await self._finish_leading(self._leader)

    async def _keep_lease_passes(self) -> None:
        """A pass per tick (or earlier, when the store hints at a change) until a stop."""
        assert self._stopping is not None and self._lost is not None
        store_ok = True
        next_heartbeat = 0.0
        while not self._stopping.is_set():
            self._pass_started = tick_start = time.monotonic()
            result: TickResult | None = None
            failure: str | None = None
            try:
                result = await self._keeper_call(self.keeper.tick)
            except StoreError as exc:
                failure = str(exc)
            if result is not None and result.store_error:
                failure = result.store_error  # a leader's failed renewal is a result, not an error
            if failure is not None and store_ok:
                self._emit("store.error", error=failure)
            elif failure is None and not store_ok:
                self._emit("store.recovered")
            store_ok = failure is None
            regressions = self.keeper.drain_regressions()
            for regression in regressions:
                self._emit("store.regressed", reason=regression)
            if regressions:
                await self._io_call(self._check_cluster)
            if self._memory is not None:
                await self._remember()
            if result is not None:
                if result.record is not None:
                    self.epoch_seen = max(self.epoch_seen, result.record.epoch)
                match result.outcome:
                    case Outcome.ACQUIRED if result.record is not None:
                        self._record("acquire", result.record.epoch, self.seq, tick_start, "ok")
                        self._lost.set()  # a previous term still publishing must end first
                        self._lost = asyncio.Event()
                        self._set_role("active")
                        self._emit("lease.acquired", via=result.reason)
                        self._leader = asyncio.create_task(
                            self._lead(result.record.epoch, previous=self._leader),
                            name="hb-leader",
                        )
                    case Outcome.RENEWED:
                        assert self._renewed is not None
                        self._renewed.set()
                    case Outcome.RENEW_FAILED:
                        self._emit("lease.renew_failed", error=result.reason)
                    case Outcome.LOST:
                        self._lost.set()
                        self._emit("lease.lost", reason=result.reason)
                        self._set_role("standby")
                    case Outcome.STANDBY:
                        self._set_role("standby")
            leader = self._leader
            if leader is not None and leader.done():
                error = None if leader.cancelled() else leader.exception()
                self._leader = None
                if error is not None:
                    raise error  # NoUsableCheckpoint, or a bug: stop the node loudly
            # Heartbeats keep to the tick even when a store change woke us early,
            # or every write would wake every other node into writing again.
            if time.monotonic() >= next_heartbeat:
                next_heartbeat = time.monotonic() + self.timing.tick_s
                await self._put_heartbeat()
            self._notifier.status(self.status_text())
            self._pass_started = None
            wake_at = next_heartbeat
            expiry = self.keeper.seconds_until_expiry()
            if expiry:  # 0: expired already, and this tick could not take it: keep to the ticks
                wake_at = min(wake_at, time.monotonic() + expiry + 0.001)
            await self._sleep_until(wake_at)

    async def _sleep_until(self, deadline: float) -> None:
        assert self._stopping is not None and self._wake is not None
        while not self._stopping.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            self._wake.clear()
            waiters = [asyncio.ensure_future(self._stopping.wait())]
            # A standby wakes early on a store change, so a released lease is
            # taken at once; the leader renews on its own schedule.
            if self.keeper.held is None:
                waiters.append(asyncio.ensure_future(self._wake.wait()))
            done, pending = await asyncio.wait(
                waiters, timeout=remaining, return_when=asyncio.FIRST_COMPLETED
            )
            for waiter in pending:
                waiter.cancel()
            if done and self.keeper.held is None:
                return

    async def _keep_lease_until_stopped(self) -> None:
        """Keep the lease until a stop; a pass hung in a store call is given up then."""
        assert self._stopping is not None
        keeping = asyncio.create_task(self._keep_lease(), name="hb-keep-lease")
        stopping = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait([keeping, stopping], return_when=asyncio.FIRST_COMPLETED)
            if not keeping.done() and not await self._within_budget(keeping, "the lease loop"):
                keeping.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await keeping
                return
            keeping.result()  # re-raises what ended the node
        finally:
            stopping.cancel()

    def _budget(self) -> float:
        """How long one step of a shutdown may wait on the store: the stops' deadline halved."""
        if self._stop_by is None:
            return SHUTDOWN_CALL_S
        return max(0.05, min(SHUTDOWN_CALL_S, (self._stop_by - time.monotonic()) / 2))

    async def _within_budget(self, task: asyncio.Future[Any], what: str) -> bool:
        """Wait for task within the shutdown budget; False (logged) if it did not end."""
        done, _ = await asyncio.wait([task], timeout=self._budget())
        if not done:
            log.warning("%s: %s did not end in time during the stop; gave up on it",
                        self.node_id, what)  # fmt: skip
        return bool(done)

    async def _finish_leading(self, leader: asyncio.Task[None]) -> None:
        assert self._lost is not None
        self._lost.set()  # tells the leader task to cancel the step in flight
        if not await self._within_budget(leader, "the leader's store call"):
            leader.cancel()
        with contextlib.suppress(asyncio.CancelledError, HamsterbunkerError):
            await leader

    async def _shutdown(self, writer: asyncio.Task[None]) -> None:
        """Release the lease, drop the heartbeat, flush the events (graceful stop).

        Each store call is bounded (see _budget): a store that does not answer
        delays a stop, never blocks it.
        """
        self._notifier.stopping()
        self._set_role("stopping")
        try:
            if self.keeper.held is not None:
                released = await self._bounded(self._keeper_call(self.keeper.release))
                if released:
                    self._emit("lease.released")
            await self._bounded(
                self._io_call(self.store.remove_heartbeat, self.agent_id, self.node_id)
            )
        except StoreError as exc:
            self._emit("store.error", error=str(exc))
        self._emit("node.offline")
        assert self._pending is not None
        try:
            await asyncio.wait_for(self._pending.join(), timeout=self._budget())
        except TimeoutError:
            log.warning(
                "%s: %d events could not be written to the store",
                self.node_id,
                self._pending.qsize(),
            )
        writer.cancel()

    # -- leading -------------------------------------------------------------

    async def _lead(self, epoch: int, previous: asyncio.Task[None] | None = None) -> None:
        """Restore, then step and publish until the lease is lost or the node stops.

        A term that cannot restore or publish for a full TTL (the store refuses
        every try) gives the lease up, so that another node can try.
        """
        assert self._lost is not None and self._stopping is not None
        lost = self._lost  # this term's own signal: a later term gets a new one
        if previous is not None:
            # The previous term may still be inside a store write: let it end
            # (it is fenced now) without holding up the keeper's renewals.
            with contextlib.suppress(asyncio.CancelledError, HamsterbunkerError):
                await previous
        self._restored = False
        stall = _Stall(self.keeper)
        progress = None
        while progress is None:
            started = time.monotonic()
            try:
                progress = await self._restore(epoch)
            except NoUsableCheckpoint:
                self._record("restore", epoch, 0, started, "refused")
                raise
            except _LeaseBehind as exc:
                await self._give_up(lost, str(exc), hold_off=False)  # and take it again above
                return
            except StoreError as exc:
                # Never fall back past a checkpoint we merely failed to read: try again.
                self._emit("store.error", error=f"restore: {exc}")
                if stall.for_a_ttl():
                    await self._give_up(lost, f"could not restore for a full TTL: {exc}")
                    return
                await asyncio.sleep(self.timing.tick_s)
                if lost.is_set() or self._stopping.is_set():
                    return
        stall.reset()
        self._restored = True
        self._record(
            "restore",
            epoch,
            self.seq,
            started,
            "resumed" if progress.resumed else "started",
            from_seq=self.seq if progress.resumed else 0,
            next_seq=progress.seq + 1,
            **({"accepted_loss": progress.accepted_loss} if progress.accepted_loss else {}),
        )
        while not lost.is_set() and not self._stopping.is_set():
            if not await self._until_may_step(lost):
                return
            context = StepContext(
                self.agent_id,
                self.node_id,
                epoch,
                progress.seq + 1,
                may_publish=functools.partial(self._may_publish, epoch, lost),
            )
            step = asyncio.create_task(self._run_step(progress.state, context), name="hb-step")
            ended = await self._until_done_or_lost(step, lost)
            if ended is not _StepEnd.DONE:
                # Cancelled at the renew deadline, so that no step of ours overlaps a
                # successor's (a sync step is told through current_step().lost);
                # retried (same seq) if a renewal still succeeds.
                context.abandoned.set()
                self._emit("agent.yielded", reason=ended.value, step_seq=context.seq)
                if ended is _StepEnd.LOST:
                    return
                continue
            try:
                new_state = step.result()
            except StepLost as exc:  # the step saw current_step().lost and stopped
                self._emit("agent.yielded", reason=str(exc), step_seq=context.seq)
                continue
            except Exception as exc:  # the agent's own failure: log it, retry after a tick
                log.exception(
                    "%s: step %d of agent %s failed", self.node_id, context.seq, self.agent_id
                )
                self._emit("agent.step_failed", step_seq=context.seq, error=repr(exc))
                await asyncio.sleep(self.timing.tick_s)
                continue
            if lost.is_set() or not self.keeper.may_step():
                # The lease may already be someone else's: never publish this step.
                self._emit("agent.yielded", reason=_StepEnd.DEADLINE.value, step_seq=context.seq)
                continue
            published, stored, error = await self._publish(context, new_state, lost)
            match published:
                case _Published.YES:
                    assert stored is not None
                    progress = stored
                    stall.reset()
                case _Published.RETRY:
                    if stall.for_a_ttl():
                        await self._give_up(lost, f"could not publish for a full TTL: {error}")
                        return
                    await asyncio.sleep(self.timing.tick_s)  # same state, same seq
                case _Published.FENCED:
                    self._emit("agent.yielded", reason="fenced", step_seq=context.seq)
                    return

    def _may_publish(self, epoch: int, lost: asyncio.Event) -> bool:
        """Whether a step of this epoch could still be published (asked from any thread)."""
        held = self.keeper.held
        return (
            not lost.is_set()
            and held is not None
            and held.epoch == epoch
            and self.keeper.may_step()
        )

    async def _give_up(self, lost: asyncio.Event, reason: str, *, hold_off: bool = True) -> None:
        """End this term: release the lease so another node can try, and stand by.

        With hold_off this node takes no free lease for two TTLs, so that another
        node gets the first try; alone, it tries again after that.
        """
        lost.set()
        self._emit("lease.given_up", reason=reason)
        try:
            if await self._keeper_call(self.keeper.release):
                self._emit("lease.released")
        except StoreError as exc:  # not released: it expires a TTL after the last renewal
            self._emit("store.error", error=f"release: {exc}")
        if hold_off:
            self.keeper.hold_off(2 * self.keeper.timing.lease_ttl_s)
        self._set_role("standby")

    async def _until_may_step(self, lost: asyncio.Event) -> bool:
        """Wait until a renewal within the deadline lets us step; False if the term ends."""
        assert self._stopping is not None and self._renewed is not None
        while not self.keeper.may_step():
            if lost.is_set() or self._stopping.is_set():
                return False
            self._renewed.clear()
            waiters = [
                asyncio.ensure_future(event.wait())
                for event in (lost, self._stopping, self._renewed)
            ]
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            for waiter in waiters:
                waiter.cancel()
        return not (lost.is_set() or self._stopping.is_set())

    async def _until_done_or_lost(
        self, step: asyncio.Task[State], term_lost: asyncio.Event
    ) -> _StepEnd:
        """Wait for the step; cancel it (async) or abandon it (sync) if it may not go on."""
        assert self._stopping is not None
        lost = asyncio.ensure_future(term_lost.wait())
        stopping = asyncio.ensure_future(self._stopping.wait())
        try:
            while not step.done():
                remaining = self.keeper.seconds_until_deadline()
                if lost.done() or stopping.done():
                    step.cancel()
                    return _StepEnd.LOST
                if remaining <= 0:
                    step.cancel()
                    return _StepEnd.DEADLINE
                # Timed to the renew deadline, so a hung renewal cannot keep us stepping.
                await asyncio.wait(
                    [step, lost, stopping], timeout=remaining, return_when=asyncio.FIRST_COMPLETED
                )
            return _StepEnd.DONE
        finally:
            lost.cancel()
            stopping.cancel()

    async def _run_step(self, state: State, context: StepContext) -> State:
        _current.set(context)
        # The step gets its own copy: a discarded step must not have changed ours.
        work = copy.deepcopy(state)
        if inspect.iscoroutinefunction(self.agent.step):
            result = await self.agent.step(work)
        else:
            result = await self._work_call(self.agent.step, work)
            if inspect.isawaitable(result):
                result = await result
        if not isinstance(result, dict):
            raise TypeError(
                f"step must return the new state as a dict, not {type(result).__name__}"
            )
        return result

    async def _publish(
        self, context: StepContext, state: State, lost: asyncio.Event
    ) -> tuple[_Published, _Progress | None, str]:
        """Seal and store one step's state, fenced by the step's epoch (and why it failed)."""
        assert self._sealer is not None
        fence = Fence(holder=self.node_id, session=self.keeper.session, epoch=context.epoch)
        started = time.monotonic()
        try:
            blob = await self._work_call(
                self._sealer.seal, self.agent_id, context.epoch, context.seq, state
            )
            info = await self._io_call(
                self.store.put_checkpoint, self.agent_id, fence, context.seq, blob
            )
        except Fenced as exc:
            self._record("publish", context.epoch, context.seq, started, "fenced")
            self._emit("node.fenced", error=str(exc), step_seq=context.seq)
            lost.set()
            held = self.keeper.held
            if held is not None and held.epoch == context.epoch:
                result = await self._keeper_call(self.keeper.abandon, "fenced by the store")
                self._emit("lease.lost", reason=result.reason)
                self._set_role("standby")
            return _Published.FENCED, None, str(exc)
        except HamsterbunkerError as exc:
            # A network store's error does not prove the write was not applied.
            landed = await self._landed(context)
            if landed is not None:
                self._record("publish", context.epoch, landed.seq, started, "ok", landed=True)
                self.seq = landed.seq
                self.keeper.learn_published(Reach(landed.seq, context.epoch))
                self._emit("checkpoint.published", landed_despite=str(exc), step_seq=landed.seq)
                return _Published.YES, landed, ""
            # Not published: the step is retried from the last published state,
            # so nothing ever builds on a state the store does not hold.
            self._record("publish", context.epoch, context.seq, started, "failed")
            self._emit("checkpoint.failed", error=str(exc), step_seq=context.seq)
            return _Published.RETRY, None, str(exc)
        self._record("publish", context.epoch, context.seq, started, "ok")
        self.seq = info.seq
        self.keeper.learn_published(Reach(info.seq, info.epoch))
        self._emit("agent.step", step_seq=info.seq)
        self._emit("checkpoint.published", size=info.size)
        return _Published.YES, _Progress(state, info.seq), ""

    async def _landed(self, context: StepContext) -> _Progress | None:
        """The checkpoint of this term at or past context.seq, if a failed write landed after all.

        Only this node writes under this epoch, so such a checkpoint that
        authenticates is ours: from this attempt, or from an earlier one whose
        answer was lost. What the store holds is adopted, read back and opened
        (an earlier attempt may have stored another state for the same seq), so
        that the next step builds on the store's state and numbers on from it
        instead of offering the same seq again forever.
        """
        assert self._sealer is not None
        try:
            infos = await self._io_call(self.store.list_checkpoints, self.agent_id)
            ours = next((i for i in infos if i.epoch == context.epoch), None)
            if ours is None or ours.seq < context.seq:
                return None
            blob = await self._io_call(self.store.read_checkpoint, self.agent_id, ours)
            state = await self._work_call(
                self._sealer.open, blob, self.agent_id, ours.epoch, ours.seq
            )
        except HamsterbunkerError:
            return None  # cannot tell now: retried as unpublished, and asked again then
        return _Progress(state, ours.seq)

    async def _restore(self, epoch: int) -> _Progress:
        """The newest checkpoint that authenticates, or init() on a store that never had one.

        Only authenticated checkpoints count: one that fails to authenticate is
        reported (checkpoint.rejected) and skipped, and it moves neither the
        next seq nor the next epoch. The node refuses (StoreRegressed) when the
        newest that authenticates is behind what it knows the store accepted,
        whether the newer ones are gone or damaged, unless that loss was
        accepted with ``hb accept-loss``. A store error ends the attempt
        (StoreError): skipping what could not be read could resume behind.
        """
        assert self._sealer is not None
        self._notifier.extend_timeout(RESTORE_READ_ALLOWANCE_S)
        infos = await self._io_call(self.store.list_checkpoints, self.agent_id)
        acceptance = await self._acceptance()
        reach = self.keeper.reach()
        forgiving = acceptance is not None and acceptance.forgives(reach)
        found: tuple[CheckpointInfo, State] | None = None
        damaged: list[CheckpointInfo] = []
        # Newest first by epoch, then seq: after an accepted loss the new line numbers
        # on from below the given-up one, under higher epochs.
        for info in sorted(infos, key=lambda i: (i.epoch, i.seq), reverse=True):
            state = await self._open_stored(info)
            if state is None:
                damaged.append(info)
                continue
            if forgiving and acceptance is not None:
                if info.epoch > acceptance.epoch:
                    forgiving = False  # published after the acceptance: it forgives nothing
                elif acceptance.to_seq is not None and info.seq > acceptance.to_seq:
                    continue  # given up on purpose
            found = (info, state)
            break
        if forgiving and acceptance is not None:
            reach = acceptance.resume
        if found is None:
            if not infos and reach == Reach():
                state = await self._work_call(self.agent.init)
                self._emit("agent.started")
                return _Progress(state, 0, resumed=False)
            if reach == Reach():
                raise NoUsableCheckpoint(
                    f"agent {self.agent_id}: {len(infos)} checkpoints are stored but none "
                    "authenticates; refusing to start over from init(). Restore the store from a "
                    "backup or remove the agent's checkpoints deliberately."
                )
            raise self._regressed(Reach(), reach, damaged)
        info, state = found
        if info.epoch >= epoch:
            # The lease record went back behind an authenticated checkpoint: this term's
            # epoch may have been used before. Take the lease again, above it.
            self.keeper.learn_epoch(info.epoch)
            reason = (
                f"an authenticated checkpoint names epoch {info.epoch}, not below this "
                f"lease's {epoch}: the lease record went back"
            )
            self._emit("store.regressed", reason=reason)
            raise _LeaseBehind(reason)
        newest = Reach(info.seq, info.epoch)
        if newest.seq < reach.seq or newest.epoch < reach.epoch:
            raise self._regressed(newest, reach, damaged)
        if forgiving and acceptance is not None:
            self.keeper.accept_loss(newest)
            self._emit(
                "store.loss_accepted",
                acceptance=acceptance.id,
                from_seq=info.seq,
                from_epoch=info.epoch,
                given_up=[seq for seq, _epoch in acceptance.given_up],
            )
        self.seq = info.seq
        self.keeper.learn_published(newest)
        self._emit("agent.resumed", from_seq=info.seq, from_epoch=info.epoch, skipped=len(damaged))
        # Number on from the checkpoint resumed from: a damaged or junk one above it
        # keeps nothing out (the store refuses only our own epoch's seqs).
        honoured = acceptance.id if forgiving and acceptance is not None else ""
        return _Progress(state, info.seq, accepted_loss=honoured)

    async def _open_stored(self, info: CheckpointInfo) -> State | None:
        """The state of one stored checkpoint, or None (reported) if it does not authenticate."""
        assert self._sealer is not None
        try:
            self._notifier.extend_timeout(RESTORE_READ_ALLOWANCE_S)
            blob = await self._io_call(self.store.read_checkpoint, self.agent_id, info)
            return await self._work_call(
                self._sealer.open, blob, self.agent_id, info.epoch, info.seq
            )
        except (Tampered, CorruptRecord) as exc:
            self._emit("checkpoint.rejected", checkpoint_seq=info.seq, error=str(exc))
            return None

    async def _acceptance(self) -> Acceptance | None:
        """The authenticated loss acceptance of this agent, if the store holds one."""
        assert self._sealer is not None
        try:
            data = await self._io_call(self.store.read_acceptance, self.agent_id)
            return None if data is None else open_acceptance(self._sealer, data, self.agent_id)
        except (Tampered, CorruptRecord) as exc:
            self._emit("acceptance.rejected", error=str(exc))
            return None

    def _regressed(
        self, newest: Reach, reach: Reach, damaged: list[CheckpointInfo]
    ) -> StoreRegressed:
        """Report (store.regressed) and make the refusal to resume behind reach."""
        which = "that authenticates " if damaged else ""
        unreadable = (
            f" Checkpoints at seq {', '.join(str(i.seq) for i in damaged)} did not authenticate "
            "(damaged, or written without the secret)."
            if damaged
            else ""
        )
        self._emit(
            "store.regressed",
            reason=f"newest checkpoint {which}seq {newest.seq} of epoch {newest.epoch} < seen "
            f"seq {reach.seq} of epoch {reach.epoch}",
            damaged_seqs=[i.seq for i in damaged],
        )
        return StoreRegressed(
            f"agent {self.agent_id}: the store's newest checkpoint {which}is seq {newest.seq} "
            f"of epoch {newest.epoch}, behind seq {reach.seq} of epoch {reach.epoch} that was "
            "seen accepted: the store went back in time (restored from an old backup, lost "
            f"acknowledged writes, or its newest checkpoints are damaged).{unreadable} Refusing "
            "to resume behind it. Bring the store back; or, to accept the loss, stop every node "
            f"and run hb accept-loss --store URL --agent-id {self.agent_id}."
        )

    # -- service manager ----------------------------------------------------

    def status_text(self) -> str:
        """One line saying the role, e.g. ``standby · leader hbnk-2 (us-east) · epoch 3``."""
        held, observed = self.keeper.held, self.keeper.observed
        if held is not None:
            step = f"step {self.seq}" if self._restored else "restoring"
            return f"active · epoch {held.epoch} · {step}"
        if self.role in ("starting", "stopping"):
            return self.role
        if observed is not None and observed.holder is not None:
            leader = f"leader {observed.holder} ({observed.region})"
        else:
            leader = "no leader"
        return f"{self.role} · {leader} · epoch {self.epoch_seen}"

    async def _ping_watchdog(self) -> None:
        """WATCHDOG=1 every half WATCHDOG_USEC, but only while the lease loop makes progress.

        The loop is stalled when one pass (a lease tick and a heartbeat) has
        run for longer than the ping interval, e.g. on a store call that
        never returns; systemd then kills the node and restarts it. A loop
        blocked outright stops this task too, with the same result.
        """
        interval = self._notifier.watchdog_interval
        if interval is None:
            return
        while True:
            started = self._pass_started
            if started is None or time.monotonic() - started < interval:
                self._notifier.watchdog()
            else:
                log.error(
                    "%s: the lease loop has made no progress for %.1f s; "
                    "withholding the watchdog ping",
                    self.node_id,
                    time.monotonic() - started,
                )
            await asyncio.sleep(interval)

    # -- heartbeats, events, watch ------------------------------------------

    def _record(
        self, op: str, epoch: int, seq: int, start: float, outcome: str, **detail: Any
    ) -> None:
        if self._history is not None:
            self._history.record(self.node_id, op, epoch, seq, start, outcome, **detail)

    def _set_role(self, role: str) -> None:
        if role != self.role:
            self.role = role
            if role == "standby":
                self._emit("node.standby")

    async def _put_heartbeat(self) -> None:
        self._beats += 1
        held = self.keeper.held
        observed = self.keeper.observed
        heartbeat = Heartbeat(
            node=self.node_id,
            region=self.region,
            host=self.host,
            pid=os.getpid(),
            role=self.role,
            epoch=self.epoch_seen,
            seq=self.seq,
            leader=held.holder if held else (observed.holder if observed else None),
            time=time.time(),
            beats=self._beats,
        )
        try:
            await self._io_call(self.store.put_heartbeat, self.agent_id, heartbeat)
        except StoreError as exc:
            log.debug("%s: heartbeat not written: %s", self.node_id, exc)

    def _emit(self, kind: str, **detail: Any) -> None:
        """Record a state change: on_event, the log, and this node's event log in the store."""
        if self._loop is not None and threading.get_ident() != self._loop_thread_id:
            self._loop.call_soon_threadsafe(lambda: self._emit(kind, **detail))
            return
        self._event_n += 1
        held = self.keeper.held
        event = Event(
            node=self.node_id,
            n=self._event_n,
            type=kind,
            time=time.time(),
            epoch=held.epoch if held else self.epoch_seen,
            seq=self.seq,
            detail=detail,
        )
        log.info(
            "%s %s epoch=%d seq=%d %s",
            self.node_id,
            kind,
            event.epoch,
            event.seq,
            " ".join(f"{k}={v}" for k, v in detail.items()),
        )
        if self.on_event is not None:
            try:
                self.on_event(event)
            except Exception:
                log.exception("on_event handler failed for %s", kind)
        if self._pending is not None:
            if self._pending.full():
                self._pending.get_nowait()  # bounded: the oldest unsent event gives way
                self._pending.task_done()
            self._pending.put_nowait(event)

    async def _write_events(self) -> None:
        """Store the events in order; while the store is unreachable, hold them and retry.

        What happened during an outage (a lost lease, failed renewals) is what a
        monitor most needs to see afterwards. The queue is bounded: in a long
        outage the oldest unsent events give way (see _emit).
        """
        assert self._pending is not None
        holding = False  # said so once per outage
        while True:
            event = await self._pending.get()
            try:
                while True:
                    try:
                        await self._io_call(self.store.append_event, self.agent_id, event)
                    except StoreUnavailable as exc:
                        if not holding:
                            holding = True
                            log.warning("%s: holding events until the store answers: %s",
                                        self.node_id, exc)  # fmt: skip
                        await asyncio.sleep(self.timing.tick_s)
                        continue
                    except StoreError as exc:
                        log.warning("%s: event %s not stored: %s", self.node_id, event.type, exc)
                    holding = False
                    break
            finally:
                self._pending.task_done()

    async def _watch(self) -> None:
        assert self._wake is not None
        try:
            async for _ in self.store.watch(self.agent_id, lease_only=True):
                self._wake.set()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the watch is only a hint: fall back to ticks
            log.warning("%s: store watch stopped (%s); relying on ticks", self.node_id, exc)

    async def _keeper_call(self, fn: Callable[..., T], *args: Any) -> T:
        """Call a LeaseKeeper method in the store thread pool, one call at a time."""
        assert self._keeper_lock is not None
        async with self._keeper_lock:
            return await self._io_call(fn, *args)

    async def _bounded(self, call: Awaitable[T]) -> T:
        """A shutdown's store call, given up (StoreUnavailable) past the shutdown budget."""
        try:
            return await asyncio.wait_for(call, timeout=self._budget())
        except TimeoutError:
            raise StoreUnavailable("the store did not answer in time during the stop") from None

    async def _work_call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run fn in this node's worker threads (steps, sealing, init, memory).

        As asyncio.to_thread does, in a copy of the caller's context, so that
        current_step() works in a sync step.
        """
        loop = asyncio.get_running_loop()
        call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
        return await loop.run_in_executor(self._work, call)

    async def _io_call(self, fn: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._io, fn, *args)
        except OSError as exc:
            raise StoreError(f"store I/O failed: {exc}") from exc
