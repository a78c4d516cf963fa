"""The node loop: keeps (or watches for) the lease, beats, and stops gracefully.

One pass per tick, or earlier when the store hints at a change. A leader's term runs
as a task of its own; how it ended comes back here, and only the loop sets the node's
role. A stop releases the lease and drops the heartbeat within the stop's budget.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from ..core.clock import Clock
from ..core.errors import HamsterbunkerError, StoreError
from ..core.failpoints import failpoint
from ..core.timing import LeaseTiming
from ..lease import LeaseKeeper, Outcome, TickResult
from ..lease.control import ControlView
from ..records import ClusterRecord, Heartbeat, LeaseRecord
from ..stores import HeardLease, Store
from .calls import NodeCalls
from .cluster import Cluster, NodeMemory
from .events import EventSink
from .hot_copy import HotCopy
from .leaving import Leaving
from .notify import Notifier
from .pacing import Pacing
from .state import Identity, Signals, Standing
from .stopping import StopRequest
from .term import Ending, LeaderTerm
from .watchdog import Watchdog, status_text

__all__ = ["NodeLoop"]

log = logging.getLogger("hamsterbunker")


class NodeLoop(Leaving):
    """One run of the node loop, made once the cluster record is open."""

    def __init__(
        self,
        *,
        identity: Identity,
        store: Store,
        keeper: LeaseKeeper,
        calls: NodeCalls,
        sink: EventSink,
        standing: Standing,
        signals: Signals,
        stop: StopRequest,
        cluster: Cluster,
        cluster_record: ClusterRecord,
        control: ControlView,
        memory: NodeMemory | None,
        new_term: Callable[..., LeaderTerm],  # (epoch, contested=...)
        notifier: Notifier,
        watchdog: Watchdog,
        timing: LeaseTiming,
        clock: Clock,
        hot: HotCopy | None = None,
    ) -> None:
        self._id, self._store, self._keeper, self._calls = identity, store, keeper, calls
        self._sink, self._standing, self._signals, self._stop = sink, standing, signals, stop
        self._cluster, self._cluster_record, self._memory = cluster, cluster_record, memory
        self._control = control
        self._new_term, self._notifier, self._watchdog = new_term, notifier, watchdog
        self._timing, self._clock, self._hot = timing, clock, hot
        self._term: LeaderTerm | None = None  # the newest term, ended or not
        self._leader: asyncio.Task[None] | None = None  # runs a term while we hold the lease
        self._watcher: asyncio.Task[None] | None = None  # the store watch, as the role needs
        self._heard = HeardLease()  # the records the watch carried, until the next look
        self._beat_owed = False  # a heartbeat held by a hush: written as it ends
        self._target_beats: asyncio.Future[list[Heartbeat]] | None = None
        self._pacing = Pacing(keeper, standing, timing, clock)

    async def run(self, ready: threading.Event) -> None:
        """Go online, keep the lease until a stop, then shut down; ready is set once online."""
        emit = self._sink.emit
        writer = asyncio.create_task(self._sink.write(), name="hb-events")
        self._watch_as(leading=False)
        for warning in self._store.warnings:
            emit("store.warning", message=warning)
        emit("node.online", region=self._id.region, host=self._id.host, pid=os.getpid())
        self._notifier.ready()  # store reachable, secret verified
        ready.set()
        try:
            await self._keep_lease_until_stopped()
        finally:
            if self._watcher is not None:
                self._watcher.cancel()
            if self._memory is not None:
                await self._memory.save(self._cluster_record, force=True)  # all it saw, at last
            await self._shutdown(writer)

    def _set_role(self, role: str) -> None:
        if role != self._standing.role:
            leading, led = role == "active", self._standing.role == "active"
            if leading != led and role != "stopping":
                self._watch_as(leading=leading)
            self._standing.role = role
            if role == "standby":
                self._sink.emit("node.standby")

    # -- keeping the lease -------------------------------------------------------

    async def _keep_lease_until_stopped(self) -> None:
        """Keep the lease until a stop; a pass hung in a store call is given up then."""
        keeping = asyncio.create_task(self._keep_lease(), name="hb-keep-lease")
        stopping = asyncio.ensure_future(self._signals.stopping.wait())
        try:
            await asyncio.wait([keeping, stopping], return_when=asyncio.FIRST_COMPLETED)
            # The lease is kept while the step in flight finishes within the grace.
            grace = self._stop.grace() if self._finishing() else 0.0
            self._sink.emit("node.stopping", grace_ms=round(grace * 1000))
            if not keeping.done() and not await self._within_budget(
                keeping, "the lease loop", extra=grace
            ):
                keeping.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await keeping
                return
            keeping.result()  # re-raises what ended the node
        finally:
            stopping.cancel()

    async def _keep_lease(self) -> None:
        failpoint("node.before_first_tick")
        try:
            await self._keep_lease_passes()
        except asyncio.CancelledError:
            # Given up during a stop (a store call hung): the term ends with the loop.
            if self._leader is not None:
                self._end_term()
                self._leader.cancel()
            raise
        self._notifier.stopping()
        self._notifier.status("stopping · handing over the lease")
        if self._leader is not None:
            await self._finish_leading(self._leader)

    async def _keep_lease_passes(self) -> None:
        """A pass per tick (or earlier, when the store hints at a change) until a stop."""
        keeper, emit = self._keeper, self._sink.emit
        store_ok = True
        pacing = self._pacing
        while not self._signals.stopping.is_set() or self._finishing():
            woken = self._signals.wake.is_set()
            self._signals.wake.clear()  # this pass reads the lease: later changes wake us
            tick_start = self._watchdog.pass_began()
            if not woken and self._clock.monotonic() < pacing.read_at():
                await self._beat_if_due(tick_start)
                self._watchdog.pass_ended()
                await self._sleep_until(pacing.wake_at())
                continue
            pacing.last_read = tick_start
            result: TickResult | None = None
            failure: str | None = None
            try:
                result = await self._calls.keeper(keeper.tick, self._heard.take())
            except StoreError as exc:
                failure = str(exc)
            if result is not None and result.outcome is Outcome.RENEWED:  # for the metrics
                self._sink.measured("renewal", self._clock.monotonic() - tick_start)
            if result is not None and result.store_error:
                failure = result.store_error  # a leader's failed renewal is a result, not an error
            if failure is not None and store_ok:
                emit("store.error", error=failure)
            elif failure is None and not store_ok:
                emit("store.recovered")
            store_ok = failure is None
            for unproven in keeper.drain_unproven():
                emit("lease.unproven", reason=unproven)
            regressions = keeper.drain_regressions()
            for regression in regressions:
                emit("store.regressed", reason=regression)
            if regressions:
                await self._calls.io(self._cluster.check, self._cluster_record, self._id.node)
            if result is not None:
                # Before the memory is saved: a newer operator's request is kept at once.
                self._follow_control(result.record)
            if self._memory is not None:
                await self._memory.save(self._cluster_record)
            if result is not None:
                self._act_on(result, tick_start)
            leader = self._leader
            if leader is not None and leader.done():
                error = None if leader.cancelled() else leader.exception()
                self._leader = None
                if error is not None:
                    raise error  # NoUsableCheckpoint, or a bug: stop the node loudly
            await self._beat_if_due(tick_start)
            self._notifier.status(
                "stopping · finishing the step in flight"
                if self._finishing()
                else status_text(self._standing, keeper)
            )
            self._watchdog.pass_ended()
            await self._sleep_until(pacing.wake_at())

    async def _beat_if_due(self, pass_start: float) -> None:
        self._beat_owed = False
        if self._pacing.beat_due(pass_start):
            if self._sink.hushed():
                # The lease is changing hands: the pass after the hush tells the role.
                self._pacing.beat_held()
                self._beat_owed = True
            else:
                await self._sink.beat()

    def _act_on(self, result: TickResult, tick_start: float) -> None:
        """What one tick of the lease keeper means for the node: a term begins or ends."""
        emit = self._sink.emit
        if result.record is not None:
            self._standing.epoch_seen = max(self._standing.epoch_seen, result.record.epoch)
        match result.outcome:
            case Outcome.ACQUIRED if result.record is not None:
                epoch = result.record.epoch
                self._sink.record("acquire", epoch, self._standing.seq, tick_start, "ok")
                self._end_term()  # a previous term still publishing must end first
                self._sink.hush()  # until the term's first step has begun (LeaderTerm)
                self._term = term = self._new_term(epoch, contested=result.reason != "switchover")
                self._set_role("active")
                if result.replaced:
                    emit("lease.replaced_unreadable", found=result.replaced)
                emit("lease.acquired", via=result.reason, **_takeover_detail(result.record))
                if result.reason == "switchover":
                    failpoint("switchover.after_acquire")
                if self._keeper.unconfirmed:
                    self._pacing.last_read = float("-inf")  # renew now, beside the restore
                if self._standing.paused:
                    emit("agent.paused", reason="paused before this term")
                self._leader = asyncio.create_task(
                    self._run_term(term, previous=self._leader), name="hb-leader"
                )
            case Outcome.RENEWED:
                self._signals.renewed.set()
                self._switch_over_if_asked(result.record)
            case Outcome.RENEW_FAILED:
                emit("lease.renew_failed", error=result.reason)
            case Outcome.LOST:
                self._end_term()
                emit("lease.lost", reason=result.reason)
                self._set_role("standby")
            case Outcome.STANDBY:
                self._set_role("standby")
                if self._hot is not None:
                    self._hot.follow(result.record)

    def _follow_control(self, record: LeaseRecord | None) -> None:
        """An operator's request in the lease record: a pause, a resume (hamsterbunker.lease.control)."""
        if record is None:
            return
        self._control.read(record)
        for problem in self._control.drain_problems():
            self._sink.emit("control.ignored", reason=problem)
        paused = self._control.paused
        if paused != self._standing.paused:
            self._standing.paused = paused
            self._signals.control_changed.set()
            if self._keeper.held is not None:
                self._sink.emit("agent.paused" if paused else "agent.unpaused")

    def _switch_over_if_asked(self, record: LeaseRecord | None) -> None:
        """An operator asked this term to hand the lease over: the term finishes its step."""
        term = self._term
        if record is None or term is None or term.epoch != record.epoch:
            return
        target = self._control.switchover_for(record.epoch)
        if target is not None and target != self._id.node and not term.leaving.is_set():
            beats = asyncio.ensure_future(
                self._calls.io(self._store.list_heartbeats, self._id.agent)
            )  # read while the term finishes: _hand_over needs the target's session
            self._start_hand_over(term, target, beats)

    def rebase(self, epoch: int, reason: str) -> bool:
        """End this node's term at epoch for a new one that restores afresh (a chain choice
        made while it led); False if this node does not lead at epoch now."""
        term, held = self._term, self._keeper.held
        if term is None or held is None or term.epoch != epoch or held.epoch != epoch:
            return False
        if term.leaving.is_set() or self._signals.stopping.is_set():
            return False
        term.rebase(reason)
        return True

    def hand_over_to(self, target: str, beats: list[Heartbeat]) -> bool:
        """Hand the lease to target as a switchover does, unasked (a host spreading its
        agents' leases: hamsterbunker.node.balance); beats: the agent's heartbeats, just
        read. False if this node does not lead now, or is handing over or stopping."""
        term, held = self._term, self._keeper.held
        if (
            term is None
            or held is None
            or term.epoch != held.epoch
            or term.leaving.is_set()
            or self._signals.stopping.is_set()
        ):
            return False
        read: asyncio.Future[list[Heartbeat]] = asyncio.get_running_loop().create_future()
        read.set_result(beats)
        self._start_hand_over(term, target, read, by="balance")
        return True

    def _start_hand_over(
        self,
        term: LeaderTerm,
        target: str,
        beats: asyncio.Future[list[Heartbeat]],
        **why: Any,
    ) -> None:
        failpoint("switchover.asked")
        self._sink.emit("lease.switchover_asked", to=target, **why)
        self._sink.hush()  # until the hand-over (_hand_over)
        term.hand_over(target)
        self._target_beats = beats

    def _finishing(self) -> bool:
        """Whether a stop waits for the term, which finishes and publishes its step in flight."""
        leader = self._leader
        # A finished term needs no more renewals: the stop releases the lease at once; nor
        # one whose last publish released it (or that lost it).
        stopping = self._signals.stopping.is_set()
        held = self._keeper.held is not None
        return stopping and held and leader is not None and not leader.done()

    async def _sleep_until(self, deadline: float) -> None:
        stopping, wake = self._signals.stopping, self._signals.wake
        while not stopping.is_set() or self._finishing():
            remaining = deadline - self._clock.monotonic()
            if remaining <= 0:
                return
            if wake.is_set():  # never cleared unseen: a change during the pass counts
                if self._keeper.held is None or stopping.is_set():
                    return  # a standby looks at once: a released lease is taken now
                # Cleared before the read, so a change after it wakes us again.
                wake.clear()
                changed = await self._changed_under_us()
                if changed is None:
                    continue  # our own renewal woke us
                held = self._keeper.held
                if held is None or held.version != changed.version:
                    return  # not our term any more: renew now, and find out
                self._follow_control(changed)  # an operator's request, adopted
                self._switch_over_if_asked(changed)
                continue
            waiters: list[asyncio.Future[Any]] = []
            if self._leader is not None and stopping.is_set():
                # Wake when the term has published its last step (the task is not ours to
                # cancel here: wait() on it is).
                waiters.append(asyncio.ensure_future(asyncio.wait([self._leader])))
            else:
                waiters.append(asyncio.ensure_future(stopping.wait()))
            # A store change wakes a standby, so a released lease is taken at once;
            # and a leader, so an operator's request is seen at once.
            waiters.append(asyncio.ensure_future(wake.wait()))
            if self._beat_owed:
                waiters.append(asyncio.ensure_future(self._sink.until_quiet()))  # then beat
            done, pending = await asyncio.wait(
                waiters, timeout=remaining, return_when=asyncio.FIRST_COMPLETED
            )
            for waiter in pending:
                waiter.cancel()
            if done and not wake.is_set():
                return  # stopping, or (stopping) the term published its last step

    async def _changed_under_us(self) -> LeaseRecord | None:
        """The lease record if someone else wrote it since our last write, adopted if it is
        still our term (a leader's own renewals wake it too: None then)."""
        try:
            return await self._calls.keeper(self._keeper.changed_under_us, self._heard.take())
        except StoreError:
            return None  # the next renewal finds out

    def _watch_as(self, *, leading: bool) -> None:
        """(Re)start the store watch for the role: see _watch."""
        if self._watcher is not None:
            self._watcher.cancel()  # a change while the next one starts is seen at a tick
        self._pacing.watch_works = True
        self._watcher = asyncio.create_task(self._watch(leading), name="hb-watch")

    async def _watch(self, leading: bool) -> None:
        """Wake the loop when the lease record changes: a standby for every renewal (it times
        the expiry from the last change it saw), a leader only for another term or an
        operator's request. A record the watch carries spares the read that would follow.
        """
        try:
            if leading:
                # A new term restores first: setting a watch up (etcd: a thread, HTTP
                # requests) would slow it, and the term's renewals see any change.
                await self._sink.until_quiet()
            watch = self._store.watch(self._id.agent, lease_only=True, terms_only=leading)
            async for record in watch:
                self._heard.add(record)
                if self._hot is not None and not leading:
                    self._hot.follow(record)  # a release: fetched beside the acquire
                self._signals.wake.set()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the watch is only a hint: fall back to ticks
            log.warning("%s: store watch stopped (%s); relying on ticks", self._id.node, exc)
        self._pacing.watch_works = False

    # -- terms -------------------------------------------------------------------

    def _end_term(self) -> None:
        if self._term is not None:
            self._term.end()

    async def _run_term(self, term: LeaderTerm, previous: asyncio.Task[None] | None) -> None:
        """Lead for one term, then act on how it ended."""
        if previous is not None:
            # The previous term may still be inside a store write: let it end
            # (it is fenced now) without holding up the keeper's renewals.
            with contextlib.suppress(asyncio.CancelledError, HamsterbunkerError):
                await previous
        ended = await term.lead()
        match ended.how:
            case Ending.FENCED:
                await self._fenced(ended)
            case Ending.GAVE_UP:
                await self._give_up(ended)
            case Ending.HANDED_OVER:
                await self._hand_over(ended)


def _takeover_detail(record: LeaseRecord) -> dict[str, Any]:
    """The previous holder and the gap, from the takeover the record names last (ours)."""
    taken = record.history[-1] if record.history else None
    if taken is None or taken.epoch != record.epoch:
        return {}
    return {"gap_ms": taken.gap_ms, **({"from": taken.from_} if taken.from_ else {})}
