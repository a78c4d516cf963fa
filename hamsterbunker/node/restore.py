"""What a new term resumes from: the newest checkpoint that authenticates, and no less.

A restore reads the store's checkpoints newest first and resumes from the
first one the secret opens; it refuses to resume behind what this node knows
the store accepted (DESIGN.md invariant 10), unless that loss was accepted
with ``hb accept-loss``. The same reading decides whether a publish whose
answer was lost landed after all.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..acceptance import Acceptance, open_acceptance
from ..agent import Agent, State, StepContext
from ..errors import CorruptRecord, HamsterbunkerError, NoUsableCheckpoint, StoreRegressed, Tampered
from ..inbox import ConsumedMarks
from ..lease import LeaseKeeper
from ..notify import Notifier
from ..reach import Reach
from ..records import CheckpointInfo
from ..sealing import Sealer
from ..stores import RestoreRead, Store
from .calls import NodeCalls
from .state import Standing

__all__ = ["LeaseBehind", "Progress", "Restorer"]

# How much longer systemd should wait for a stop, granted before each
# checkpoint a restore reads: a restore that makes progress is never cut
# short by TimeoutStopSec, one that hangs still is.
RESTORE_READ_ALLOWANCE_S = 30.0


@dataclass
class Progress:
    """The state the next step starts from, and the highest seq already in the store."""

    state: State
    seq: int
    resumed: bool = True  # False: started from init()
    epoch: int = 0  # the epoch of the checkpoint at seq (0: none)
    accepted_loss: str = ""  # the id of a loss acceptance honoured by this restore
    # The agent's consumed submissions as of that checkpoint (sealed in it).
    marks: ConsumedMarks = field(default_factory=ConsumedMarks)


Opened = tuple[State, ConsumedMarks]


@dataclass(frozen=True)
class _Read:
    infos: list[CheckpointInfo]  # newest first
    forgiving: Acceptance | None
    newest: tuple[CheckpointInfo, bytes] | None  # the first of infos, read


class LeaseBehind(HamsterbunkerError):
    """The lease record is behind an authenticated checkpoint: take the lease again, above it."""


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
    ) -> None:
        self._agent, self._agent_id, self._store, self._sealer = agent, agent_id, store, sealer
        self._keeper, self._calls, self._standing = keeper, calls, standing
        self._emit = emit
        self._notifier = notifier

    async def _read(self, taken: RestoreRead | None) -> _Read:
        """The checkpoints listed, the loss acceptance, and the newest checkpoint's blob: as
        the store held them when the lease was taken (taken), or read now."""
        read = taken
        if read is None:
            read = await self._calls.io(self._store.read_for_restore, self._agent_id)
        newest = None if read.newest is None else (read.infos[0], read.newest)
        return _Read(read.infos, self._acceptance(read), newest)

    async def restore(self, epoch: int, taken: RestoreRead | None = None) -> Progress:
        """The newest checkpoint that authenticates, or init() on a store that never had one.

        Only authenticated checkpoints count: one that fails to authenticate is
        reported (checkpoint.rejected) and skipped, and it moves neither the
        next seq nor the next epoch. The node refuses (StoreRegressed) when the
        newest that authenticates is behind what it knows the store accepted,
        whether the newer ones are gone or damaged, unless that loss was
        accepted with ``hb accept-loss``. A store error ends the attempt
        (StoreError): skipping what could not be read could resume behind. taken:
        what the acquisition of the lease for epoch read, if the store read with it.
        """
        self._notifier.extend_timeout(RESTORE_READ_ALLOWANCE_S)
        read = await self._read(taken)
        # The loss acceptance, while it forgives what this restore finds; None once it does not.
        infos, forgiving = read.infos, read.forgiving
        reach = self._keeper.reach()
        if forgiving is not None and not forgiving.forgives(reach):
            forgiving = None
        found: tuple[CheckpointInfo, Opened] | None = None
        damaged: list[CheckpointInfo] = []
        # Newest first by epoch, then seq: after an accepted loss the new line numbers
        # on from below the given-up one, under higher epochs.
        for info in infos:
            blob = read.newest[1] if read.newest is not None and read.newest[0] == info else None
            opened = await self._open_stored(info, blob)
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
            if not infos and reach == Reach():
                state = await self._calls.work(self._agent.init)
                self._emit("agent.started")
                return Progress(state, 0, resumed=False)
            if reach == Reach():
                raise NoUsableCheckpoint(
                    f"agent {self._agent_id}: {len(infos)} checkpoints are stored but none "
                    "authenticates; refusing to start over from init(). Restore the store from a "
                    "backup or remove the agent's checkpoints deliberately."
                )
            raise self._regressed(Reach(), reach, damaged)
        info, (state, marks) = found
        if info.epoch >= epoch:
            # The lease record went back behind an authenticated checkpoint: this term's
            # epoch may have been used before. Take the lease again, above it.
            self._keeper.learn_epoch(info.epoch)
            reason = (
                f"an authenticated checkpoint names epoch {info.epoch}, not below this "
                f"lease's {epoch}: the lease record went back"
            )
            self._emit("store.regressed", reason=reason)
            raise LeaseBehind(reason)
        newest = Reach(info.seq, info.epoch)
        if newest.seq < reach.seq or newest.epoch < reach.epoch:
            raise self._regressed(newest, reach, damaged)
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
        return Progress(state, info.seq, epoch=info.epoch, accepted_loss=accepted, marks=marks)

    async def landed(self, context: StepContext) -> Progress | None:
        """The checkpoint of this term at or past context.seq, if a failed write landed after all.

        Only this node writes under this epoch, so such a checkpoint that
        authenticates is ours: from this attempt, or from an earlier one whose
        answer was lost. What the store holds is adopted, read back and opened
        (an earlier attempt may have stored another state for the same seq), so
        that the next step builds on the store's state and numbers on from it
        instead of offering the same seq again forever.
        """
        try:
            infos = await self._calls.io(self._store.list_checkpoints, self._agent_id)
            ours = next((i for i in infos if i.epoch == context.epoch), None)
            if ours is None or ours.seq < context.seq:
                return None
            blob = await self._calls.io(self._store.read_checkpoint, self._agent_id, ours)
            state, marks = await self._calls.work(self._open, blob, ours)
        except HamsterbunkerError:
            return None  # cannot tell now: retried as unpublished, and asked again then
        return Progress(state, ours.seq, epoch=ours.epoch, marks=marks)

    def _open(self, blob: bytes, info: CheckpointInfo) -> Opened:
        """The state and consumed marks of a checkpoint found as info; Tampered if not that."""
        state, inbox = self._sealer.open_checkpoint(blob, self._agent_id, info.epoch, info.seq)
        return state, ConsumedMarks.from_json(inbox)

    async def _open_stored(self, info: CheckpointInfo, blob: bytes | None = None) -> Opened | None:
        """One stored checkpoint (read already: blob) opened, or None (reported) if it does
        not authenticate."""
        try:
            self._notifier.extend_timeout(RESTORE_READ_ALLOWANCE_S)
            if blob is None:
                blob = await self._calls.io(self._store.read_checkpoint, self._agent_id, info)
            return await self._calls.work(self._open, blob, info)
        except (Tampered, CorruptRecord) as exc:
            self._emit("checkpoint.rejected", checkpoint_seq=info.seq, error=str(exc))
            return None

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
            f"agent {self._agent_id}: the store's newest checkpoint {which}is seq {newest.seq} "
            f"of epoch {newest.epoch}, behind seq {reach.seq} of epoch {reach.epoch} that was "
            "seen accepted: the store went back in time (restored from an old backup, lost "
            f"acknowledged writes, or its newest checkpoints are damaged).{unreadable} Refusing "
            "to resume behind it. Bring the store back; or, to accept the loss, stop every node "
            f"and run hb accept-loss --store URL --agent-id {self._agent_id}."
        )
