"""A leader's term: restore, then step the agent and publish each new state, fenced by epoch.

One per epoch this node holds. It never sets the node's role: how it ended is what
``lead`` returns, and the node loop acts on it. A step still running at the renew
deadline is cancelled (async) or abandoned (sync), and never published.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import enum
import functools
import inspect
import logging
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass

from ..agent.effects import StepEffects
from ..agent.inbox import StepInbox
from ..agent.intents import IntentLog
from ..agent.step import Agent, State, StepContext, _current
from ..core.clock import Clock
from ..core.errors import AgentInitFailed, Fenced, NoUsableCheckpoint, StepLost, StoreError
from ..core.timing import DEFAULT_STEP_RETRY, LeaseTiming, StepRetry
from ..lease import LeaseKeeper
from ..sealing import Sealer
from ..stores import Fence, RestoreRead, Store
from .backoff import StepFailures, pause_for
from .calls import NodeCalls
from .events import EventSink
from .inbox import TermInbox
from .journal import TermJournal
from .progress import LeaseBehind, Progress
from .publish import Publisher
from .restore import Restorer
from .state import Identity, Signals, Standing
from .term_waits import Stall, StepEnd, TermWaits, first

__all__ = ["Ending", "LeaderTerm", "TermEnd"]

log = logging.getLogger("hamsterbunker")


class Ending(enum.Enum):
    OVER = "lease lost or node stopping"  # nothing left for the loop to do
    FENCED = "fenced by the store"  # the lease moved on under a publish
    GAVE_UP = "gave up"  # no progress for a full TTL, or the lease record went back
    HANDED_OVER = "handed over"  # an operator's switchover: release to TermEnd.successor


@dataclass(frozen=True)
class TermEnd:
    """How a term ended, for the node loop to act on."""

    how: Ending
    epoch: int
    reason: str = ""
    hold_off: bool = True  # GAVE_UP: let another node try first
    via: str = ""  # GAVE_UP: "handoff" when the agent's steps kept failing
    hold_off_s: float = 0.0  # GAVE_UP with hold_off: for how long (0: the loop's default)
    successor: str = ""  # HANDED_OVER: the node to hand the lease to


class LeaderTerm:
    """One term of this node as the agent's leader, under one lease epoch."""

    def __init__(
        self,
        epoch: int,
        *,
        identity: Identity,
        agent: Agent,
        store: Store,
        sealer: Sealer,
        keeper: LeaseKeeper,
        restorer: Restorer,
        calls: NodeCalls,
        sink: EventSink,
        standing: Standing,
        signals: Signals,
        timing: LeaseTiming,
        clock: Clock,
        grace: Callable[[], float],
        retry: StepRetry = DEFAULT_STEP_RETRY,
        contested: bool = True,
        intents: IntentLog | None = None,
        follow_keys: Callable[[bytes | None], Coroutine[None, None, bool]] | None = None,
    ) -> None:
        """contested: the lease was taken (free or expired), not handed to this node: on a
        synced folder another node may have taken the same epoch at the same moment
        (``_uncontested``). intents: the node's memory of the intents it wrote, which
        outlives the term (one of the term's own if None). follow_keys: reads the cluster
        record (or the one given, read along with the lease) and follows a rotation
        (``KeyFollower.once``); False if the node must stop."""
        self.epoch = epoch
        self._id, self._agent, self._store, self._sealer = identity, agent, store, sealer
        self._keeper, self._restorer, self._calls, self._sink = keeper, restorer, calls, sink
        self._standing, self._signals, self._timing, self._clock = standing, signals, timing, clock
        self._grace = grace  # how long a stop lets the step in flight finish
        self._began, self._contested = clock.monotonic(), contested
        self._retry, self._failures = retry, StepFailures(retry)
        self._follow_keys = follow_keys
        self._keys_read: asyncio.Task[bool] | None = None
        self.lost = asyncio.Event()  # this term's own end: a later term has its own
        # A switchover: finish the step in flight as on a stop, publish, then end.
        self.leaving = asyncio.Event()
        self._successor = ""
        self._rebase = ""  # why the term leaves for a new one of its own (rebase)
        fence = Fence(holder=identity.node, session=keeper.session, epoch=epoch)
        self._journal = TermJournal(
            identity, store, sealer, fence, calls, sink, clock, intents or IntentLog()
        )
        self._inbox = TermInbox(
            identity, store, sealer, calls, sink, standing,
            tick_s=timing.tick_s, closing=self._over, clock=clock,
        )  # fmt: skip
        self._waits = TermWaits(
            self.lost, self.leaving, signals, standing, keeper, clock, self._inbox, grace
        )
        self._publisher = Publisher(
            identity, store, sealer, keeper, restorer, calls, sink, standing, self._inbox,
            clock, self.end, lambda: signals.stopping.is_set() and not self.leaving.is_set(),
        )  # fmt: skip

    def end(self) -> None:
        """Tell the term to stop: the step in flight is cancelled, nothing more is published."""
        self.lost.set()

    def hand_over(self, successor: str) -> None:
        """End the term as a stop would (the step in flight finishes and is published),
        for the loop to release the lease to successor."""
        if not self.leaving.is_set():
            self._successor = successor
            self.leaving.set()

    def rebase(self, reason: str) -> None:
        """End the term as a stop would and give the lease up with no hold-off, so that the
        next term (this node's, most likely) restores afresh: an operator chose another
        chain to go on from (``hb choose-chain``)."""
        if not self.leaving.is_set():
            self._rebase = reason
            self.leaving.set()

    def _over(self) -> bool:
        return self._waits.over()

    async def _uncontested(self) -> bool:
        """On a synced folder, wait before the first step for the sync delay and two ticks
        (docs/design.md, "The node"), unless handed this lease. False if the term ended."""
        chains = self._store.chains
        if not (self._contested and chains is not None and chains.sync_delay_ms):
            return not self._over()
        settle_s = chains.sync_delay_ms / 1000 + 2 * self._timing.tick_s
        left = self._began + settle_s - self._clock.monotonic()
        if left > 0:
            waiting = first(self.lost, self._signals.stopping, self.leaving)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(waiting, left)
        return not self._over()

    async def lead(self) -> TermEnd:
        """Restore, then step and publish until the lease is lost or the node stops.

        A term that cannot restore or publish for a full TTL (the store refuses
        every try) gives the lease up, so that another node can try.
        """
        taken = self._keeper.read_at_taking(self.epoch)  # what the acquisition read, if any
        if self._follow_keys is not None:
            # Beside the restore, awaited before the first step (docs/design.md, "Keys").
            follow = self._follow_keys(None if taken is None else taken.cluster)
            self._keys_read = asyncio.create_task(follow, name="hb-term-keys")
        try:
            ended = await self._lead(taken)
            if ended.how is Ending.OVER and self.leaving.is_set() and not self.lost.is_set():
                if self._rebase:
                    return self._give_up(self._rebase, hold_off=False)
                return TermEnd(Ending.HANDED_OVER, self.epoch, successor=self._successor)
            return ended
        finally:
            if self._keys_read is not None:
                self._keys_read.cancel()
            self._standing.failing = (0, "")
            await self._inbox.close()

    async def _lead(self, taken: RestoreRead | None) -> TermEnd:
        stall = Stall(self._clock, self._timing.lease_ttl_s)
        progress = await self._restore(stall, taken)
        if isinstance(progress, TermEnd):
            return progress
        if not await self._uncontested():
            return TermEnd(Ending.OVER, self.epoch)
        first_seq = progress.seq + 1  # may replay a step a previous leader had started
        failed_seq = 0  # the step that last raised: its retry calls failed effects again
        while not self._over():
            if not await self._waits.until_unpaused() or not await self._waits.until_may_step():
                break
            prepared = await self._prepare_step(progress, first_seq, failed_seq)
            if prepared is None:
                if stall.for_a_ttl():
                    return self._give_up("could not read the effect journal for a full TTL")
                await asyncio.sleep(self._timing.tick_s)
                continue
            effects, context = prepared
            step, ended = await self._step(progress, effects, context)
            if ended is not StepEnd.DONE:
                # Cancelled at the renew deadline, so that no step of ours overlaps a
                # successor's (a sync step is told through current_step().lost);
                # retried (same seq) if a renewal still succeeds.
                context.abandoned.set()
                self._sink.emit("agent.yielded", reason=ended.value, step_seq=context.seq)
                if ended is StepEnd.LOST:
                    break
                continue
            try:
                new_state = step.result()
            except StepLost as exc:  # the step saw current_step().lost and stopped
                self._sink.emit("agent.yielded", reason=str(exc), step_seq=context.seq)
                continue
            except Fenced as exc:  # an effect's record was refused (said by the journal)
                self.end()
                return TermEnd(Ending.FENCED, self.epoch, str(exc))
            except Exception as exc:  # the agent's own failure: back off, or hand over
                failed_seq = context.seq
                backed_off = await self._back_off(context.seq, exc)
                if isinstance(backed_off, TermEnd):
                    return backed_off
                if not backed_off:  # the term ended meanwhile
                    break
                continue
            published = await self._publish(context, new_state, progress, stall)
            if isinstance(published, TermEnd):
                return published
            progress = published
        return TermEnd(Ending.OVER, self.epoch)

    async def _step(
        self, progress: Progress, effects: StepEffects, context: StepContext
    ) -> tuple[asyncio.Task[State], StepEnd]:
        """Run one step from progress until it is done, or the term must give it up."""
        step_began = self._clock.monotonic()
        step = asyncio.create_task(self._run_step(progress.state, context), name="hb-step")
        if self._sink.hushed():  # as the lease was acquired (NodeLoop): until the
            await asyncio.sleep(0)  # first step has begun, its writes held back
            self._sink.unhush()
        ended = await self._waits.until_done_or_lost(step)
        if ended is StepEnd.DONE:  # returned or raised: its time, for the metrics
            self._sink.measured("step", self._clock.monotonic() - step_began)
        self._journal.keep(effects)
        if effects.reused:
            self._sink.emit("effect.replayed", step_seq=context.seq, reused=effects.reused)
        return step, ended

    async def _back_off(self, seq: int, exc: Exception) -> TermEnd | bool:
        """After the agent's step seq raised: how the term ends if it hands the lease over;
        else whether the backoff was waited out (False: the term ended meanwhile)."""
        pause = self._step_failed(seq, exc)
        if self._failures.hand_over():
            return self._hand_over()
        return await pause_for(
            pause, self._clock, self._timing.tick_s, self.lost, self._signals.stopping,
            self.leaving,
        )  # fmt: skip

    async def _publish(
        self, context: StepContext, new_state: State, progress: Progress, stall: Stall
    ) -> Progress | TermEnd:
        """Publish a step that returned: what to go on from (progress again if it was not
        published, to step again), or how the term ended."""
        emit = self._sink.emit
        if self.lost.is_set() or not self._keeper.may_step():
            # The lease may already be someone else's: never publish this step.
            emit("agent.yielded", reason=StepEnd.DEADLINE.value, step_seq=context.seq)
            return progress
        published = await self._publisher.publish(context, new_state, progress.marks)
        if not isinstance(published, Progress) and published.agent_failed is not None:
            # A state that is not JSON is the step's failure, as if it had raised.
            backed_off = await self._back_off(context.seq, published.agent_failed)
            return backed_off if isinstance(backed_off, TermEnd) else progress
        self._failures.succeeded()
        self._standing.failing = (0, "")
        if isinstance(published, Progress):
            self._standing.effects = []
            stall.reset()
            return published
        if published.fenced:
            emit("agent.yielded", reason="fenced", step_seq=context.seq)
            return TermEnd(Ending.FENCED, self.epoch, published.error)
        if stall.for_a_ttl():
            return self._give_up(f"could not publish for a full TTL: {published.error}")
        await asyncio.sleep(self._timing.tick_s)  # the store failed: same state, same seq
        return progress

    async def _restore(self, stall: Stall, taken: RestoreRead | None) -> Progress | TermEnd:
        """The state to go on from (taken: what the acquisition read); or how the term ended."""
        self._standing.restored = False
        progress = None
        self._inbox.read_ahead(None if taken is None else taken.inbox)
        self._journal.taken = None if taken is None else taken.journals
        while progress is None:
            started = self._clock.monotonic()
            try:
                progress = await self._restorer.restore(self.epoch, taken)
            except NoUsableCheckpoint:
                self._sink.record("restore", self.epoch, 0, started, "refused")
                raise
            except LeaseBehind as exc:
                return self._give_up(str(exc), hold_off=False)  # and take it again above
            except AgentInitFailed as exc:  # as a failing step: back off, or hand over
                backed_off = await self._back_off(0, exc)
                if isinstance(backed_off, TermEnd):
                    return backed_off
                if not backed_off:
                    return TermEnd(Ending.OVER, self.epoch)
            except StoreError as exc:
                # Never fall back past a checkpoint we merely failed to read: try again.
                taken = None  # and read afresh
                self._sink.emit("store.error", error=f"restore: {exc}")
                if stall.for_a_ttl():
                    return self._give_up(f"could not restore for a full TTL: {exc}")
                await asyncio.sleep(self._timing.tick_s)
                if self._over():
                    return TermEnd(Ending.OVER, self.epoch)
        if self._keys_read is not None and not await self._keys_read:
            return TermEnd(Ending.OVER, self.epoch)  # the node stops: it lacks the current key
        stall.reset()
        self._standing.restored = True
        self._inbox.resume(progress.marks)
        seq = self._standing.seq
        self._sink.record(
            "restore",
            self.epoch,
            seq,
            started,
            "resumed" if progress.resumed else "started",
            from_seq=seq if progress.resumed else 0,
            next_seq=progress.seq + 1,
            **({"accepted_loss": progress.accepted_loss} if progress.accepted_loss else {}),
        )
        return progress

    async def _prepare_step(
        self, progress: Progress, first_seq: int, failed_seq: int
    ) -> tuple[StepEffects, StepContext] | None:
        """The next step's effects and context; None if its journal could not be read."""
        seq = progress.seq + 1
        # An abandoned sync step may run on in its thread: it starts no more effects.
        abandoned = threading.Event()
        journal = self._journal.for_step(
            seq, progress.epoch, first=seq == first_seq, journals=progress.journals
        )
        effects = StepEffects(
            seq,
            self._journal,
            journal,
            may_start=functools.partial(self._may_start_effects, abandoned),
            rerun_failures=failed_seq == seq,
        )
        if journal is None and not await self._read_journal(effects):
            return None
        context = StepContext(
            self._id.agent,
            self._id.node,
            self.epoch,
            seq,
            may_publish=self._may_publish,
            abandoned=abandoned,
            effects=effects,
            loop=asyncio.get_running_loop(),
            mailbox=StepInbox(self._inbox, await self._inbox.unconsumed(), self._journal.shown),
        )
        self._standing.effects = effects.shown
        return effects, context

    def _may_start_effects(self, abandoned: threading.Event) -> bool:
        """Whether a step not yet abandoned may start an effect (asked from any thread)."""
        return not abandoned.is_set() and self._may_publish()

    def _may_publish(self) -> bool:
        """Whether a step of this term could still be published (asked from any thread)."""
        held = self._keeper.held
        return (
            not self.lost.is_set()
            and held is not None
            and held.epoch == self.epoch
            and self._keeper.may_step()
        )

    async def _read_journal(self, effects: StepEffects) -> bool:
        """Read the journal of the term's first step before it runs: it may replay a step
        an earlier leader began, and is shown the submissions that run was shown (see
        hamsterbunker.agent.inbox). False if the store failed (said; tried again)."""
        try:
            await effects.load()
        except StoreError as exc:
            self._sink.emit("store.error", error=f"effect journal: {exc}")
            return False
        return True

    def _step_failed(self, seq: int, exc: Exception) -> float:
        """Count a failed step, say so (the traceback at debug); the seconds to wait."""
        pause = self._failures.failed(exc)
        failing = self._failures.now
        assert failing is not None
        self._standing.failing = (failing.count, failing.error)
        log.debug("%s: step %d of agent %s failed", self._id.node, seq, self._id.agent,
                  exc_info=exc)  # fmt: skip
        self._sink.emit(
            "agent.failing",
            step_seq=seq,
            failures=failing.count,
            error=failing.error,
            error_type=type(exc).__name__,
            retry_ms=round(pause * 1000),
        )
        return pause

    def _hand_over(self) -> TermEnd:
        """Give the lease up to another node after too many failures, and hold off taking it
        back for the longest backoff (at least the loop's default)."""
        failing = self._failures.now
        assert failing is not None
        reason = f"{failing.count} steps failed in a row, the last: {failing.error}"
        self.end()
        return TermEnd(
            Ending.GAVE_UP, self.epoch, reason, via="handoff", hold_off_s=self._retry.max_s
        )

    def _give_up(self, reason: str, *, hold_off: bool = True) -> TermEnd:
        self.end()
        return TermEnd(Ending.GAVE_UP, self.epoch, reason, hold_off)

    async def _run_step(self, state: State, context: StepContext) -> State:
        _current.set(context)
        # The step gets its own copy: a discarded step must not have changed ours.
        work = copy.deepcopy(state)
        if inspect.iscoroutinefunction(self._agent.step):
            result = await self._agent.step(work)
        else:
            result = await self._calls.work(self._agent.step, work)
            if inspect.isawaitable(result):
                result = await result
        if not isinstance(result, dict):
            raise TypeError(
                f"step must return the new state as a dict, not {type(result).__name__}"
            )
        return result
