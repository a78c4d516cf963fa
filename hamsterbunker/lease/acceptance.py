"""A loss accepted on purpose (``hb accept-loss``): what nodes resume from afterwards.

The lease record is written anew, released under a fresh epoch E, beside an acceptance
record signed with the cluster key naming the checkpoint to resume from. A node honours it
only while everything it saw accepted is of an epoch below E (``docs/design.md``,
"Accepting a loss").
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass

from ..core.errors import CorruptRecord, HamsterbunkerError, LeaseConflict, Tampered
from ..core.limits import MAX_EPOCH
from ..core.reach import Reach
from ..core.timing import DEFAULT_LEASE_TTL_MS
from ..records import CheckpointInfo, Event, LeaseRecord, parse_json
from ..records.parsing import dump_compact
from ..sealing import Sealer
from ..stores import Store
from .proof import LeaseProof

__all__ = [
    "Acceptance",
    "LossPlan",
    "accept_loss",
    "open_acceptance",
    "plan_loss",
    "seal_acceptance",
]

# The node id under which hb accept-loss writes its event.
ACCEPTOR = "hb-accept-loss"

_KIND = "loss-acceptance"


@dataclass(frozen=True)
class Acceptance:
    agent: str
    id: str
    epoch: int  # the epoch of the lease record the acceptance wrote
    resume_seq: int
    resume_epoch: int
    to_seq: int | None  # resume from the newest checkpoint at or below this seq
    given_up: list[tuple[int, int]]  # (seq, epoch) of every checkpoint given up, for people
    time: float  # wall clock of the machine that accepted; display only

    @property
    def resume(self) -> Reach:
        return Reach(self.resume_seq, self.resume_epoch)

    def forgives(self, reach: Reach) -> bool:
        """Whether this acceptance covers a node that saw checkpoints accepted up to reach."""
        return reach.epoch < self.epoch


def new_acceptance(
    agent: str, epoch: int, resume: Reach, to_seq: int | None, given_up: list[tuple[int, int]]
) -> Acceptance:
    return Acceptance(
        agent=agent,
        id=secrets.token_hex(8),
        epoch=epoch,
        resume_seq=resume.seq,
        resume_epoch=resume.epoch,
        to_seq=to_seq,
        given_up=given_up,
        time=time.time(),
    )


def seal_acceptance(sealer: Sealer, acceptance: Acceptance) -> bytes:
    return sealer.sign_record(_KIND, dump_compact(acceptance))


def open_acceptance(sealer: Sealer, data: bytes, agent: str) -> Acceptance:
    """The acceptance in data, authenticated and for agent; Tampered otherwise."""
    payload = sealer.open_record(_KIND, data)
    try:
        doc = parse_json(payload, "loss-acceptance record")
        found = Acceptance(
            agent=doc["agent"],
            id=doc["id"],
            epoch=doc["epoch"],
            resume_seq=doc["resume_seq"],
            resume_epoch=doc["resume_epoch"],
            to_seq=doc["to_seq"],
            given_up=[(seq, epoch) for seq, epoch in doc["given_up"]],
            time=doc["time"],
        )
    except (CorruptRecord, KeyError, TypeError, ValueError) as exc:
        # Signed with our key, so written by our own code: a newer format, or a bug.
        raise Tampered(f"loss-acceptance record does not parse: {exc}") from exc
    if found.agent != agent:
        raise Tampered(f"loss-acceptance record is for agent {found.agent!r}, not {agent!r}")
    return found


@dataclass(frozen=True)
class LossPlan:
    """What ``hb accept-loss`` would give up, worked out before anything is written."""

    agent: str
    lease: LeaseRecord | None
    resume: CheckpointInfo
    given_up: list[CheckpointInfo]  # authenticated, newer than resume
    damaged: list[CheckpointInfo]  # stored, but not authenticating
    to_seq: int | None
    epoch: int  # of the released lease record the acceptance writes

    def describe(self) -> str:
        def listed(infos: list[CheckpointInfo]) -> str:
            return ", ".join(f"seq {i.seq} (epoch {i.epoch})" for i in infos) or "none"

        lease = self.lease
        lines = [
            f"agent {self.agent}: resume from checkpoint seq {self.resume.seq} "
            f"(epoch {self.resume.epoch})",
            f"  given up, newer and authenticated: {listed(self.given_up)}",
            f"  given up, damaged (do not authenticate): {listed(self.damaged)}",
        ]
        if lease is not None and (lease.seq, lease.seq_epoch) > (0, 0):
            lines.append(
                f"  the lease record says checkpoints reached seq {lease.seq} of epoch "
                f"{lease.seq_epoch}"
            )
        lines += [
            "  nodes that saw more accepted (in their memory) give that up too",
            f"  the lease is written released, at epoch {self.epoch}: stop every node first",
        ]
        return "\n".join(lines)


def plan_loss(store: Store, sealer: Sealer, agent: str, to_seq: int | None) -> LossPlan:
    """Work out what accepting the loss gives up; HamsterbunkerError if it cannot be done."""
    if store.chains is not None:
        # Its checkpoints are one chain per node, judged by lineage (docs/syncdir.md); a
        # loss there is accepted by choosing the chain to go on from, not yet built.
        raise HamsterbunkerError(
            f"agent {agent}: hb accept-loss does not work on a syncdir store yet (one chain of "
            "checkpoints per node); its chains kept aside are listed by hb status"
        )
    try:
        lease = store.read_lease(agent)
    except CorruptRecord as exc:
        raise HamsterbunkerError(
            f"agent {agent}: the lease record does not parse ({exc}): remove it, then run "
            "hb accept-loss again"
        ) from exc
    authentic: list[CheckpointInfo] = []
    damaged: list[CheckpointInfo] = []
    for info in store.list_checkpoints(agent):
        try:
            sealer.open(store.read_checkpoint(agent, info), agent, info.epoch, info.seq)
        except (Tampered, CorruptRecord):
            damaged.append(info)
            continue
        authentic.append(info)
    newest_first = sorted(authentic, key=lambda i: (i.epoch, i.seq), reverse=True)
    candidates = [i for i in newest_first if to_seq is None or i.seq <= to_seq]
    if not candidates:
        at = "" if to_seq is None else f" at or below seq {to_seq}"
        raise HamsterbunkerError(
            f"agent {agent}: no stored checkpoint{at} authenticates: there is nothing to resume "
            "from"
        )
    resume = candidates[0]
    epochs = [i.epoch for i in authentic]
    if lease is not None:
        epochs += [lease.epoch, lease.seq_epoch]
    epoch = max(epochs) + 1
    if epoch > MAX_EPOCH:
        raise HamsterbunkerError(f"agent {agent}: no epoch is left above {epoch - 1}")
    return LossPlan(
        agent=agent,
        lease=lease,
        resume=resume,
        given_up=newest_first[: newest_first.index(resume)],
        damaged=damaged,
        to_seq=to_seq,
        epoch=epoch,
    )


def accept_loss(store: Store, sealer: Sealer, plan: LossPlan) -> Acceptance:
    """Write what plan says: the released lease record first (an acceptance without it is
    never written), the signed acceptance, an event."""
    resume = Reach(plan.resume.seq, plan.resume.epoch)
    given_up = [(i.seq, i.epoch) for i in plan.given_up + plan.damaged]
    acceptance = new_acceptance(plan.agent, plan.epoch, resume, plan.to_seq, given_up)
    lease = plan.lease
    try:
        store.cas_lease(
            plan.agent,
            None if lease is None else lease.version,
            LeaseProof(sealer, plan.agent).signed(
                LeaseRecord(
                    holder=None,
                    region="",
                    session=f"accept-loss-{acceptance.id}",
                    epoch=plan.epoch,
                    ttl_ms=DEFAULT_LEASE_TTL_MS if lease is None else lease.ttl_ms,
                    seq=resume.seq,
                    seq_epoch=resume.epoch,
                    # An operator's pause, and the takeovers so far, hold on.
                    control="" if lease is None else lease.control,
                    history=() if lease is None else lease.history,
                    # No leader writes this: a takeover's gap still runs from the last one.
                    written=0.0 if lease is None else lease.written,
                )
            ),
        )
    except LeaseConflict as exc:
        raise HamsterbunkerError(
            f"agent {plan.agent}: the lease record changed meanwhile (is a node running?): "
            "stop every node and run hb accept-loss again; nothing was written"
        ) from exc
    store.put_acceptance(plan.agent, seal_acceptance(sealer, acceptance))
    own = [e.n for e in store.read_events(plan.agent) if e.node == ACCEPTOR]
    store.append_event(
        plan.agent,
        Event(
            node=ACCEPTOR,
            n=max(own, default=0) + 1,
            type="store.loss_accepted",
            time=time.time(),
            epoch=plan.epoch,
            seq=resume.seq,
            detail={
                "acceptance": acceptance.id,
                "from_seq": resume.seq,
                "from_epoch": resume.epoch,
                "given_up": [seq for seq, _epoch in given_up],
            },
        ),
    )
    return acceptance
