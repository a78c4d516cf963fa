"""A leader's publish: seal one step's state and store it, fenced by the step's epoch."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from ..agent.inbox import ConsumedMarks
from ..agent.step import State, StepContext
from ..core.clock import Clock
from ..core.errors import Fenced, HamsterbunkerError, StateNotJson
from ..core.failpoints import failpoint
from ..core.limits import RELEASE_WITH_PUBLISH_BYTES
from ..core.reach import Reach
from ..lease import LeaseKeeper
from ..records import CheckpointInfo
from ..sealing import Sealer
from ..stores import Fence, Store
from ..stores.base import Consumed
from .calls import NodeCalls
from .events import EventSink
from .inbox import TermInbox
from .progress import Progress
from .restore import Restorer
from .state import Identity, Standing

__all__ = ["NotPublished", "Publisher"]


@dataclass(frozen=True)
class NotPublished:
    error: str
    fenced: bool = False  # True: the lease moved on, stop leading; False: same step again
    # The agent's own failure (its state is not JSON): backed off as a failing step.
    agent_failed: StateNotJson | None = None


@dataclass(frozen=True)
class Publisher:
    """Publishes the steps of one term (``LeaderTerm``)."""

    identity: Identity
    store: Store
    sealer: Sealer
    keeper: LeaseKeeper
    restorer: Restorer
    calls: NodeCalls
    sink: EventSink
    standing: Standing
    inbox: TermInbox
    clock: Clock
    end_term: Callable[[], None]
    # Whether a publish now is the term's last before a stop: it releases the lease too.
    last: Callable[[], bool] = lambda: False

    async def publish(
        self, context: StepContext, state: State, marks: ConsumedMarks
    ) -> Progress | NotPublished:
        """Seal and store one step's state, fenced by the step's epoch; or why not.

        What the step consumed commits with it: its numbers sealed in the
        checkpoint's marks, its replies in the same store write.
        """
        consumed = [] if context.mailbox is None else context.mailbox.consumed
        marks, gaps = marks.adding(c.number for c in consumed)
        started = self.clock.monotonic()
        try:
            info, released = await self._put(context, state, marks, consumed)
        except Fenced as exc:
            self.sink.record("publish", context.epoch, context.seq, started, "fenced")
            # The refused term's epoch: the keeper may have seen the next one already.
            self.sink.emit("node.fenced", epoch=context.epoch, error=str(exc),
                           step_seq=context.seq)  # fmt: skip
            self.end_term()
            return NotPublished(str(exc), fenced=True)
        except StateNotJson as exc:  # sealed nothing, wrote nothing
            self.sink.record("publish", context.epoch, context.seq, started, "failed")
            return NotPublished(str(exc), agent_failed=exc)
        except HamsterbunkerError as exc:
            return await self._unsure(context, consumed, started, exc)
        numbers = [c.number for c in consumed]
        self.sink.record("publish", context.epoch, context.seq, started, "ok",
                         **({"consumed": numbers} if numbers else {}))  # fmt: skip
        self.standing.seq = info.seq
        self.keeper.learn_published(Reach(info.seq, info.epoch))
        self.sink.emit("agent.step", step_seq=info.seq)
        self.sink.emit("checkpoint.published", size=info.size)
        if released:
            self.sink.emit("lease.released")
        self.inbox.committed(consumed, marks)
        self.inbox.gave_up(gaps)
        return Progress(state, info.seq, epoch=info.epoch, marks=marks)

    async def _put(
        self, context: StepContext, state: State, marks: ConsumedMarks, consumed: list[Consumed]
    ) -> tuple[CheckpointInfo, bool]:
        """Seal the state with marks and write it with what the step consumed; the last
        publish before a stop with the lease released, in one commit where it can (True)."""
        # The state's JSON here (SealError before the store is touched); its
        # encryption inside the put, piece by piece as the store writes them.
        # Into this node's own chain on a store that keeps one per node: bound to it.
        chain = self.identity.node if self.store.chains is not None else None
        blob = await self.calls.work(
            functools.partial(self.sealer.seal_pieces, inbox=marks.to_json(), node=chain),
            self.identity.agent,
            context.epoch,
            context.seq,
            state,
        )
        # Only a consuming step passes consumption: stores wrapped by tests take four arguments.
        also = (consumed,) if consumed else ()
        if consumed:
            failpoint("inbox.before_commit")
        fence = Fence(holder=self.identity.node, session=self.keeper.session, epoch=context.epoch)
        agent, released = self.identity.agent, False
        if self.last() and len(blob) <= RELEASE_WITH_PUBLISH_BYTES:
            # In the keeper's thread: no renewal is in flight to change the record meanwhile.
            put = functools.partial(
                self.store.put_checkpoint_and_release, agent, fence, context.seq, blob, consumed
            )
            reach = Reach(context.seq, context.epoch)
            info, released = await self.calls.keeper(self.keeper.release_with, put, reach)
        else:
            info = await self.calls.io(
                self.store.put_checkpoint, agent, fence, context.seq, blob, *also
            )
        if consumed:
            failpoint("inbox.after_commit")
        return info, released

    async def _unsure(
        self, context: StepContext, consumed: list[Consumed], started: float, exc: Exception
    ) -> Progress | NotPublished:
        """After a put that raised: what landed after all (``Restorer.landed``), adopted; else
        not published, and the step is retried from the last published state.
        """
        landed = await self.restorer.landed(context)
        if landed is None:
            self.sink.record("publish", context.epoch, context.seq, started, "failed")
            self.sink.emit("checkpoint.failed", error=str(exc), step_seq=context.seq)
            return NotPublished(str(exc))
        ours = all(c.number in landed.marks for c in consumed)
        done = [c.number for c in consumed] if ours else []
        self.sink.record("publish", context.epoch, landed.seq, started, "ok", landed=True,
                         **({"consumed": done} if done else {}))  # fmt: skip
        self.standing.seq = landed.seq
        self.keeper.learn_published(Reach(landed.seq, context.epoch))
        self.sink.emit("checkpoint.published", landed_despite=str(exc), step_seq=landed.seq)
        self.inbox.committed(consumed if ours else [], landed.marks)
        return landed
