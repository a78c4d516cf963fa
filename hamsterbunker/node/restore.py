"""What a new term resumes from: the newest checkpoint that authenticates, and no less.

The same reading tells whether a publish whose answer was lost landed after all. On a
store that keeps chains, only what the winning lineage carries is read
(docs/design.md, "The node").
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from dataclasses import dataclass, field

from ..agent.inbox import ConsumedMarks
from ..agent.step import Agent, State, StepContext
from ..core.errors import (
    AgentInitFailed,
    CorruptRecord,
    HamsterbunkerError,
    NoUsableCheckpoint,
    StoreError,
    StoreRegressed,
    Tampered,
)
from ..core.reach import Reach
from ..lease import LeaseKeeper
from ..lease.acceptance import Acceptance, open_acceptance
from ..records import CheckpointInfo
from ..records.lineage import CheckpointRef, TermId
from ..sealing import Sealer
from ..stores import RestoreRead, Store
from ..stores.base import newest_first
from .backoff import describe
from .calls import NodeCalls
from .hot_copy import HotCopy
from .lineage_view import LineageRead, LineageView, describe_ref
from .notify import Notifier
from .progress import BehindTheSync, LeaseBehind, Progress
from .state import Standing

__all__ = ["BehindTheSync", "LeaseBehind", "Progress", "Restorer"]

# How much longer systemd should wait for a stop, granted before each
# checkpoint a restore reads: a restore that makes progress is never cut
# short by TimeoutStopSec, one that hangs still is.
RESTORE_READ_ALLOWANCE_S = 30.0


Opened = tuple[State, ConsumedMarks]


@dataclass(frozen=True)
class _Read:
    infos: list[CheckpointInfo]  # newest first
    forgiving: Acceptance | None
    newest: tuple[CheckpointInfo, bytes] | None  # the first of infos, read
    # On a store with chains: the lineage read, and the node whose chain holds each of infos.
    lineage: LineageRead | None = None
    chain_of: dict[tuple[int, int], str] = field(default_factory=dict)


# The most kept-aside segments a restore opens to tell that what this node saw
# accepted is still held (aside) rather than lost.
_ASIDE_TRIES = 4


class _NotSyncedYet(Exception):
    """The lineage is behind what this node saw accepted: the sync may still bring it."""


class Restorer:
    """Reads one agent's checkpoints back for this node's terms."""

    def __init__(
        self,
        agent: Agent,
        agent_id: str,
        store: Store,
        sealer: Sealer,
        keeper: LeaseKeeper,
        calls: NodeCalls,
        standing: Standing,
        *,
        emit: Callable[..., None],
        notifier: Notifier,
        lineage: LineageView | None = None,
        hot: HotCopy | None = None,
    ) -> None:
        """lineage: given for a store that keeps chains (restore from the winning lineage);
        hot: this node's hot copy, as a standby fetched it."""
        self._agent, self._agent_id, self._store, self._sealer = agent, agent_id, store, sealer
        self._keeper, self._calls, self._standing = keeper, calls, standing
        self._emit = emit
        self._notifier = notifier
        self._lineage, self._hot = lineage, hot

    async def _read(self, taken: RestoreRead | None) -> _Read:
        """The checkpoints listed, the loss acceptance, and the newest checkpoint's blob: as
        the store held them when the lease was taken (taken), or read now."""
        if self._lineage is not None:
            return await self._read_lineage(self._lineage)
        read = taken
        if read is None:
            read = await self._calls.io(self._store.read_for_restore, self._agent_id)
        newest = None if read.newest is None else (read.infos[0], read.newest)
        return _Read(read.infos, self._acceptance(read), newest)

    async def _read_lineage(self, view: LineageView) -> _Read:
        """The checkpoints the winning lineage carries, newest first, and the acceptance.
        StoreError while checkpoints are stored that no term record places: the term tries
        again rather than start a second history from init().
        """
        found = await self._calls.io(functools.partial(view.read, apply_choice=True))
        view.report(found)
        carried = found.carried()
        if not carried and found.lineage.unplaced:
            waiting = ", ".join(segment.describe() for segment in found.lineage.unplaced[:3])
            raise StoreError(
                f"checkpoints are stored but no term record that authenticates places them "
                f"({waiting}): waiting for the sync to bring their records"
            )
        problem = ""
        try:
            acceptance = await self._calls.io(self._store.read_acceptance, self._agent_id)
        except CorruptRecord as exc:
            acceptance, problem = None, str(exc)
        infos = newest_first([info for _node, info in carried])
        forgiving = self._acceptance(RestoreRead(infos, acceptance, None, problem))
        chain_of = {(info.seq, info.epoch): node for node, info in carried}
        return _Read(infos, forgiving, None, found, chain_of)

    async def restore(self, epoch: int, taken: RestoreRead | None = None) -> Progress:
        """The newest checkpoint that authenticates, or init() on a store that never had one.

        Raises StoreRegressed if that is behind what this node knows the store accepted
        (unless ``hb accept-loss`` accepted it); NoUsableCheckpoint if none of those stored
        authenticates and nothing was seen accepted; LeaseBehind if one is of this epoch or
        above; StoreError if a read failed; on a synced folder BehindTheSync, after reading
        again for up to the sync delay. taken: what the acquisition of the lease for epoch
        read, if the store read with it.
        """
        if self._lineage is None:
            return await self._restore(epoch, taken, may_wait=False)
        loop = asyncio.get_running_loop()
        delay_s = self._lineage.store.sync_delay_ms / 1000
        until = loop.time() + delay_s
        while True:
            try:
                return await self._restore(epoch, None, may_wait=loop.time() < until)
            except _NotSyncedYet:
                await asyncio.sleep(min(max(delay_s / 10, 0.01), 1.0))

    async def _restore(self, epoch: int, taken: RestoreRead | None, *, may_wait: bool) -> Progress:
        """restore, once; may_wait: _NotSyncedYet rather than a refusal to resume behind."""
        self._notifier.extend_timeout(RESTORE_READ_ALLOWANCE_S)
        read = await self._read(taken)
        # The loss acceptance, while it forgives what this restore finds; None once it does not.
        forgiving = read.forgiving
        reach = self._keeper.reach()
        if forgiving is not None and not forgiving.forgives(reach):
            forgiving = None
        # A hot copy stands for the newest listed where the lease's commit did not read it.
        unread = read.infos[0] if read.infos and read.newest is None else None
        hot = await self._hot.take(unread) if self._hot is not None else None
        found: tuple[CheckpointInfo, Opened] | None = None
        damaged: list[CheckpointInfo] = []
        # Newest first by epoch, then seq: after an accepted loss the new line numbers
        # on from below the given-up one, under higher epochs.
        for info in read.infos:
            blob = read.newest[1] if read.newest is not None and read.newest[0] == info else None
            opened = await self._open_hot(info, hot) if hot and info == read.infos[0] else None
            if opened is None:
                chain = read.chain_of.get((info.seq, info.epoch))
                opened = await self._open_stored(info, blob, chain)
            if opened is None:
                damaged.append(info)
                continue
            if forgiving is not None:
                if info.epoch > forgiving.epoch:
                    forgiving = None  # published after the acceptance: it forgives nothing
                elif forgiving.to_seq is not None and info.seq > forgiving.to_seq:
                    continue  # given up on purpose
            found = (info, opened)
            break
        if forgiving is not None:
            reach = forgiving.resume
        if found is None:
            return await self._start(epoch, read, reach, damaged, may_wait=may_wait)
        return await self._resume(epoch, read, found, reach, damaged, forgiving, may_wait=may_wait)

    async def _start(
        self,
        epoch: int,
        read: _Read,
        reach: Reach,
        damaged: list[CheckpointInfo],
        *,
        may_wait: bool,
    ) -> Progress:
        """No checkpoint authenticates: start from init() where nothing was ever published
        (as far as this node knows); else refuse, or wait for the sync (may_wait)."""
        infos = read.infos
        # A lineage whose winning term began from a checkpoint never starts over.
        if (
            not infos
            and not (read.lineage is not None and read.lineage.winner_based)
            and (reach == Reach() or await self._held_aside(read, Reach(), reach))
        ):
            try:
                state = await self._calls.work(self._agent.init)
            except Exception as exc:  # the agent's own failure, said in one line
                raise AgentInitFailed(f"init() raised {describe(exc)}") from exc
            await self._write_term_start(epoch, None)
            self._emit("agent.started")
            roots = () if read.lineage is None else read.lineage.built_on(None)
            return Progress(state, 0, resumed=False, journals=roots)
        if may_wait:
            raise _NotSyncedYet
        # On a synced folder, a lineage with nothing here may be one the sync has
        # not brought yet (BehindTheSync below).
        if reach == Reach() and (read.lineage is None or infos):
            raise NoUsableCheckpoint(
                f"agent {self._agent_id}: {len(infos)} checkpoints are stored but none "
                "authenticates; refusing to start over from init(). Restore the store from a "
                "backup or remove the agent's checkpoints deliberately."
            )
        raise self._regressed(Reach(), reach, damaged, read)

    async def _resume(
        self,
        epoch: int,
        read: _Read,
        found: tuple[CheckpointInfo, Opened],
        reach: Reach,
        damaged: list[CheckpointInfo],
        forgiving: Acceptance | None,
        *,
        may_wait: bool,
    ) -> Progress:
        """Go on from the newest checkpoint that authenticates, unless it is behind what
        this node saw published (refused, or waited for: may_wait)."""
        info, (state, marks) = found
        if info.epoch >= epoch:
            raise self._lease_behind(epoch, info)
        newest = Reach(info.seq, info.epoch)
        node = read.chain_of.get((info.seq, info.epoch))
        base = None if node is None else CheckpointRef(TermId(info.epoch, node), info.seq)
        chosen = read.lineage is not None and base == read.lineage.lineage.chosen
        # What was seen accepted on a branch the lineage does not continue is still stored,
        # kept aside (store.diverged said so), not lost; a checkpoint an operator chose
        # is where to go on from. The keeper's reach is left as it is then: lowering it
        # would make this term's own lease record go back in seq.
        behind = newest.seq < reach.seq or newest.epoch < reach.epoch
        if behind and not chosen and not await self._held_aside(read, newest, reach):
            if may_wait:
                raise _NotSyncedYet
            raise self._regressed(newest, reach, damaged, read)
        journals: tuple[TermId, ...] = ()
        if base is not None:
            journals = await self._begin_from(epoch, read, base, chosen=chosen, behind=behind)
        if forgiving is not None:
            self._keeper.accept_loss(newest)
            self._emit(
                "store.loss_accepted",
                acceptance=forgiving.id,
                from_seq=info.seq,
                from_epoch=info.epoch,
                given_up=[seq for seq, _epoch in forgiving.given_up],
            )
        self._standing.seq = info.seq
        self._keeper.learn_published(newest)
        self._emit("agent.resumed", from_seq=info.seq, from_epoch=info.epoch, skipped=len(damaged))
        # Number on from the checkpoint resumed from: a damaged or junk one above it
        # keeps nothing out (the store refuses only our own epoch's seqs).
        accepted = "" if forgiving is None else forgiving.id
        return Progress(
            state, info.seq, epoch=info.epoch, accepted_loss=accepted, marks=marks,
            journals=journals,
        )  # fmt: skip

    async def _begin_from(
        self, epoch: int, read: _Read, base: CheckpointRef, *, chosen: bool, behind: bool
    ) -> tuple[TermId, ...]:
        """On a store with chains: write the term's record, beginning from base (chosen: by an
        operator, said so); the terms whose effect journals the replay of its next step reads."""
        assert read.lineage is not None  # chain_of is only filled from a lineage read
        if chosen:
            assert read.lineage.choice is not None
            self._emit(
                "chain.chosen",
                after=str(read.lineage.choice.after),
                base=describe_ref(base),
                behind_seen=behind,
            )
        await self._write_term_start(epoch, base)
        return read.lineage.built_on(base)

    def _lease_behind(self, epoch: int, info: CheckpointInfo) -> LeaseBehind:
        """An authenticated checkpoint at or above this term's epoch: the epoch may have been
        used before; the lease is taken again, above it."""
        self._keeper.learn_epoch(info.epoch)
        if self._keeper.replaced_unreadable(epoch):
            # Numbered without the lost record's epoch: nothing went back.
            return LeaseBehind(
                f"an authenticated checkpoint names epoch {info.epoch}, not below the "
                f"epoch {epoch} taken in place of an unreadable lease record"
            )
        reason = (
            f"an authenticated checkpoint names epoch {info.epoch}, not below this "
            f"lease's {epoch}: the lease record went back"
        )
        self._emit("store.regressed", reason=reason)
        return LeaseBehind(reason)

    async def landed(self, context: StepContext) -> Progress | None:
        """The checkpoint of this term at or past context.seq, if a failed write landed after
        all (only this node writes under this epoch): read back and opened, so that the next
        step builds on the store's state. None if none, or if the store cannot tell now.
        """
        view = self._lineage
        try:
            if view is None:
                infos = await self._calls.io(self._store.list_checkpoints, self._agent_id)
            else:
                infos = await self._calls.io(view.own_chain)
            ours = next((i for i in infos if i.epoch == context.epoch), None)
            if ours is None or ours.seq < context.seq:
                return None
            if view is None:
                blob = await self._calls.io(self._store.read_checkpoint, self._agent_id, ours)
            else:
                blob = await self._calls.io(view.read_checkpoint, view.node_id, ours)
            node = None if view is None else view.node_id
            state, marks = await self._calls.work(self._open, blob, ours, node)
        except HamsterbunkerError:
            return None  # cannot tell now: retried as unpublished, and asked again then
        return Progress(state, ours.seq, epoch=ours.epoch, marks=marks)

    def _open(self, blob: bytes, info: CheckpointInfo, node: str | None) -> Opened:
        """The state and consumed marks of a checkpoint found as info (in node's chain, on a
        store that keeps chains; else None); Tampered if not that."""
        state, inbox = self._sealer.open_checkpoint(
            blob, self._agent_id, info.epoch, info.seq, node
        )
        return state, ConsumedMarks.from_json(inbox)

    async def _open_hot(self, info: CheckpointInfo, blob: bytes) -> Opened | None:
        """A standby's hot copy of info opened; None if it does not (resealed since): read."""
        try:
            return await self._calls.work(self._open, blob, info, None)
        except (Tampered, CorruptRecord):
            return None

    async def _open_stored(
        self, info: CheckpointInfo, blob: bytes | None = None, node: str | None = None
    ) -> Opened | None:
        """One stored checkpoint (read already: blob; else from node's chain, if named)
        opened, or None (reported) if it does not authenticate. On a store that keeps
        chains it must name node, the node of the chain it was read from."""
        try:
            self._notifier.extend_timeout(RESTORE_READ_ALLOWANCE_S)
            if blob is None and node is not None and self._lineage is not None:
                blob = await self._calls.io(self._lineage.read_checkpoint, node, info)
            elif blob is None:
                blob = await self._calls.io(self._store.read_checkpoint, self._agent_id, info)
            chain = node if self._lineage is not None else None
            return await self._calls.work(self._open, blob, info, chain)
        except (Tampered, CorruptRecord) as exc:
            self._emit("checkpoint.rejected", checkpoint_seq=info.seq, error=str(exc))
            return None

    async def _held_aside(self, read: _Read, newest: Reach, reach: Reach) -> bool:
        """Whether a kept-aside checkpoint that authenticates takes newest as far as reach:
        what this node saw accepted is then on a branch the lineage does not continue,
        still stored, not lost. Opens at most _ASIDE_TRIES of them, the highest first."""
        found = read.lineage
        if found is None:
            return False
        tops = sorted(
            (CheckpointRef(segment.term, segment.seqs[-1]) for segment in found.lineage.aside),
            key=lambda ref: (ref.seq, ref.term),
            reverse=True,
        )
        for ref in tops[:_ASIDE_TRIES]:
            held = newest.union(Reach(ref.seq, ref.term.epoch))
            if held.seq < reach.seq or held.epoch < reach.epoch or ref not in found.where:
                continue
            node, info = found.where[ref]
            if await self._open_stored(info, None, node) is not None:
                return True
        return False

    async def _write_term_start(self, epoch: int, base: CheckpointRef | None) -> None:
        """On a store with chains: this term's record, naming where it began, before it publishes."""
        if self._lineage is not None:
            await self._calls.io(self._lineage.write_start, epoch, base)

    def _acceptance(self, read: RestoreRead) -> Acceptance | None:
        """The authenticated loss acceptance of this agent, if the store holds one."""
        try:
            if read.acceptance_problem:
                raise CorruptRecord(read.acceptance_problem)
            data = read.acceptance
            return None if data is None else open_acceptance(self._sealer, data, self._agent_id)
        except (Tampered, CorruptRecord) as exc:
            self._emit("acceptance.rejected", error=str(exc))
            return None

    def _regressed(
        self, newest: Reach, reach: Reach, damaged: list[CheckpointInfo], read: _Read
    ) -> HamsterbunkerError:
        """The refusal to resume behind reach: on a synced folder one to try again after
        (BehindTheSync), elsewhere one that stops the node, reported (store.regressed)."""
        which = "that authenticates " if damaged else ""
        unreadable = (
            f" Checkpoints at seq {', '.join(str(i.seq) for i in damaged)} did not authenticate "
            "(damaged, or written without the secret)."
            if damaged
            else ""
        )
        if read.lineage is not None:
            here = "none" if newest == Reach() else f"seq {newest.seq} of epoch {newest.epoch}"
            seen = (
                f"behind seq {reach.seq} of epoch {reach.epoch}, seen announced"
                if reach != Reach()
                else "while the winning term began from a checkpoint"
            )
            return BehindTheSync(
                f"agent {self._agent_id}: the lineage's newest checkpoint {which}here is "
                f"{here}, {seen}: the sync has not brought it yet (a partition?), or it was "
                f"removed.{unreadable} Not leading from behind it; trying again. If it is "
                "gone for good, choose where to go on from: hb choose-chain --agent-id "
                f"{self._agent_id}."
            )
        self._emit(
            "store.regressed",
            reason=f"newest checkpoint {which}seq {newest.seq} of epoch {newest.epoch} < seen "
            f"seq {reach.seq} of epoch {reach.epoch}",
            damaged_seqs=[i.seq for i in damaged],
        )
        return StoreRegressed(
            f"agent {self._agent_id}: the store's newest checkpoint {which}is seq {newest.seq} "
            f"of epoch {newest.epoch}, behind seq {reach.seq} of epoch {reach.epoch} that was "
            "seen accepted: the store went back in time (restored from an old backup, lost "
            f"acknowledged writes, or its newest checkpoints are damaged).{unreadable} Refusing "
            "to resume behind it. Bring the store back; or, to accept the loss, stop every node "
            f"and run hb accept-loss --store URL --agent-id {self._agent_id}."
        )
