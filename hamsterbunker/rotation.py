"""Rotating the cluster's secret online: ``hb rotate-secret begin | commit | finish``.

1. begin: every live node already holds the new secret (its heartbeat names
   the new key id); the record is changed to seal with the new key, the old
   one still accepted; then every live node is waited for until it seals
   with the new key, so every checkpoint published after begin is under it
   (a node begin did not see beating, one starting meanwhile, reads the
   record again as it takes the lease).
2. commit: every retained checkpoint of every agent that is still under an
   old key is sealed again under the new one (``Store.reseal_checkpoint``,
   compared with the bytes opened: never over a newer checkpoint, never
   bringing back one retention removed), and so are the effect journal of
   the step in flight (``Store.reseal_effect``), the unconsumed
   submissions (``Store.reseal_submission``) and the kept replies of the
   consumed ones (``Store.read_replies``, page by page, and
   ``Store.reseal_reply``); the lease record's control request (``hb pause``,
   a switchover) signed under an old key is signed again with the current
   one, the same request and revision, by compare-and-set of the lease
   record as ``hb pause`` writes it; then the record says committed.
3. finish: nothing retained is under an old key, no submission sealed
   under one waits unconsumed (one that commit could not re-seal: finish
   waits for the agent to consume it), no kept reply that authenticates and
   no control request is under one (commit again), and no loss acceptance
   signed under one may still be needed: until a checkpoint that
   authenticates is published above its epoch (a restore then finds that
   one first, and the acceptance forgives nothing), finish refuses and says
   to wait. The store has no compare-and-set for the acceptance record, so
   it is never rewritten here. Then the old key is dropped from the accepted
   ones (kept as retired, to name it to a node that still holds only that
   one). A client holding only the new secret then reads every kept reply,
   and a node holding only it honours the control request.

Each step is a compare-and-set of the cluster record against the one read,
raising its generation (``hamsterbunker.cluster_keys``), and refuses with a
ControlRefused naming what is missing until it is safe; each can be run
again after a crash at any point and goes on from where the store is.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

from .acceptance import Acceptance, open_acceptance, seal_acceptance
from .control import Control, open_control, sign_control
from .errors import (
    ClusterChanged,
    ConfigError,
    ControlRefused,
    CorruptRecord,
    LeaseConflict,
    SealError,
    StoreError,
    Tampered,
)
from .failpoints import failpoint
from .keyring import Keyring
from .records import MAX_CLUSTER_KEYS, ClusterRecord, LeaseRecord
from .rotation_nodes import LiveNode, live_nodes, wait_until_sealing
from .sealing import EffectAt, Sealer, read_header, sealed_key_id
from .stores import Store
from .stores.reseal import REPLY_PAGE

__all__ = ["Resealed", "Rotation"]

Say = Callable[[str], None]
# How many times commit re-reads a checkpoint that changed under it before it gives up.
RESEAL_TRIES = 3
# How many times commit writes a control request signed again when renewals keep
# changing the lease record under it (as hb pause does).
MAX_CONTROL_TRIES = 50


@dataclass
class Resealed:
    """What commit did to one agent's retained checkpoints."""

    agent: str
    resealed: int = 0
    current: int = 0  # already under the current key
    gone: int = 0  # removed by retention (or replaced) before it could be re-sealed
    unopened: int = 0  # did not authenticate: junk, left as it is
    effects: int = 0  # effect-journal records of the step in flight re-sealed
    submissions: int = 0  # unconsumed submissions re-sealed
    replies: int = 0  # replies of consumed submissions re-sealed
    replies_unopened: int = 0  # replies under an old key that did not authenticate: left
    control: bool = False  # the lease record's control request signed again

    def describe(self, key_id: str) -> str:
        text = (
            f"agent {self.agent}: {self.resealed} checkpoints re-sealed, {self.current} "
            f"already under key id {key_id}"
        )
        if self.gone:
            text += f", {self.gone} gone meanwhile"
        if self.unopened:
            text += f", {self.unopened} that do not authenticate left as they are"
        if self.effects:
            text += f"; {self.effects} effect-journal records re-sealed"
        if self.submissions:
            text += f"; {self.submissions} unconsumed submissions re-sealed"
        if self.replies:
            text += f"; {self.replies} replies to consumed submissions re-sealed"
        if self.replies_unopened:
            text += f"; {self.replies_unopened} replies that do not authenticate left as they are"
        if self.control:
            text += "; the control request (hb pause, switchover) signed again"
        return text


class Rotation:
    """One operator's rotation steps against a store, with the secrets given."""

    def __init__(
        self,
        store: Store,
        agent: str,
        keyring: Keyring,
        *,
        say: Say = print,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._store, self._agent, self._keyring = store, agent, keyring
        self._say, self._clock, self._sleep = say, clock, sleep
        record = store.read_cluster()
        if record is None:
            raise ConfigError(f"store {store.url} has no cluster record: no node has run on it")
        # Authenticates the key list, and needs every key it lists (WrongSecret names it).
        self._sealer = Sealer(keyring, record)

    @property
    def record(self) -> ClusterRecord:
        return self._sealer.cluster

    # -- begin ---------------------------------------------------------------------

    def begin(self, timeout_s: float) -> None:
        record, keys = self.record, self._sealer.keys
        newest = keys.held[0]
        new_id = keys.key_id(newest, record)
        if record.rotation:
            if record.key_id != new_id:
                raise ControlRefused(
                    f"a rotation to key id {record.key_id} is under way ({record.rotation}): "
                    "finish it first (hb rotate-secret commit, then finish)"
                )
            self._say(f"the rotation to key id {new_id} was begun already")
        else:
            if keys.find(record.current) is newest:
                raise ControlRefused(
                    f"the newest secret given (HB_SECRET, or the first line of the secret file) "
                    f"is the cluster's current one (key id {record.key_id}): give the new secret "
                    "first and the current one after it (HB_SECRET_PREVIOUS, or the next line)"
                )
            if any(keys.find(entry) is newest for entry in record.retired):
                raise ControlRefused(
                    f"the newest secret given was retired by an earlier rotation (key id "
                    f"{new_id}): rotate to a fresh secret; nothing was changed"
                )
            nodes = self._live()
            lacking = [node for node in nodes if new_id not in node.heartbeat.keys]
            if lacking:
                raise ControlRefused(
                    f"not every live node holds the new secret (key id {new_id}): "
                    + "; ".join(
                        f"{node.name} holds {', '.join(node.heartbeat.keys) or 'no key id'}"
                        for node in lacking
                    )
                    + ". Restart each with the new secret added first (see the README, "
                    "Rotating the secret); nothing was changed"
                )
            begun = replace(
                record,
                key_id=new_id,
                key_check=newest.check,
                accepted=(record.current, *record.accepted),
                generation=record.generation + 1,
                rotation="begun",
                macs=(),
            )
            self._replace(begun)
            self._say(
                f"begun: the cluster seals with key id {new_id} now (generation "
                f"{begun.generation}); key id {record.key_id} is still accepted"
            )
        self._wait_sealing(self._live(), timeout_s)

    # -- commit --------------------------------------------------------------------

    def commit(self, timeout_s: float) -> list[Resealed]:
        record = self.record
        if not record.rotation:
            raise ControlRefused(
                f"no rotation is under way (key id {record.key_id} is current): run "
                "hb rotate-secret begin first"
            )
        # A node that still seals with an old key would publish under it after commit.
        self._wait_sealing(self._live(), timeout_s)
        done = [self._reseal(agent) for agent in self._agents()]
        for each in done:
            self._say(each.describe(record.key_id))
        if record.rotation == "begun":
            committed = replace(
                record, generation=record.generation + 1, rotation="committed", macs=()
            )
            failpoint("rotation.before_record")
            self._replace(committed)
            failpoint("rotation.after_record")
        self._say(
            f"committed: every retained checkpoint is under key id {record.key_id}; "
            "run hb rotate-secret finish to drop the old key"
        )
        return done

    def _reseal(self, agent: str) -> Resealed:
        """Seal every retained checkpoint of agent under an old key again, with the current."""
        done = Resealed(agent)
        current = self._sealer.key_id
        for info in self._store.list_checkpoints(agent):
            for _try in range(RESEAL_TRIES):
                try:
                    blob = self._store.read_checkpoint(agent, info)
                except StoreError:
                    done.gone += 1  # removed by retention since it was listed
                    break
                try:
                    if read_header(blob).key_id == current:
                        done.current += 1
                        break
                    new = self._sealer.reseal_checkpoint(blob, agent, info.epoch, info.seq)
                except SealError:
                    done.unopened += 1
                    break
                if self._store.reseal_checkpoint(agent, info, blob, new):
                    done.resealed += 1
                    break
            else:
                done.gone += 1
        self._reseal_journal(agent, done)
        self._reseal_inbox(agent, done)
        self._reseal_replies(agent, done)
        done.control = self._resign_control(agent)
        return done

    def _resign_control(self, agent: str) -> bool:
        """Sign the lease record's control request (``hb pause``, a switchover) again with the
        current key where an old one signed it: the same request and revision, written by
        compare-and-set as ``hb pause`` writes it (a renewal in between: read again). True
        once written; False if there is nothing to sign again, or the lease kept changing
        (finish then refuses)."""
        for _try in range(MAX_CONTROL_TRIES):
            lease = self._lease(agent)
            control = self._old_control(agent, lease)
            if lease is None or control is None:
                return False
            signed = replace(lease, control=sign_control(self._sealer, control))
            try:
                self._store.cas_lease(agent, lease.version, signed)
            except LeaseConflict:
                continue
            return True
        return False

    def _lease(self, agent: str) -> LeaseRecord | None:
        """The agent's lease record; None if there is none, or it does not parse (no node
        takes a request from it then)."""
        try:
            return self._store.read_lease(agent)
        except CorruptRecord:
            return None

    def _old_control(self, agent: str, lease: LeaseRecord | None) -> Control | None:
        """The control request in lease if it authenticates but not under the current key
        (junk that no key opens: None, the nodes ignore it already)."""
        if lease is None or not lease.control:
            return None
        try:
            control = open_control(self._sealer, lease.control, agent)
        except Tampered:
            return None
        return None if sign_control(self._sealer, control) == lease.control else control

    def _reseal_inbox(self, agent: str, done: Resealed) -> None:
        """Seal the unconsumed submissions under an old key again, with the current one."""
        for number, blob in self._store.read_inbox(agent):
            if sealed_key_id(blob) in (None, self._sealer.key_id):
                continue
            try:
                new = self._sealer.reseal_submission(blob, agent, number)
            except SealError:
                continue  # junk: no key opens it, and the leader skips it too
            if len(new) == len(blob) and self._store.reseal_submission(agent, number, blob, new):
                done.submissions += 1

    def _reseal_replies(self, agent: str, done: Resealed) -> None:
        """Seal the kept replies of consumed submissions under an old key again, with the
        current one: a client holding only the new secret reads them after finish."""
        for number, blob in self._old_replies(agent):
            try:
                new = self._sealer.reseal_reply(blob, agent, number)
            except SealError:
                done.replies_unopened += 1  # junk: no key opens it, and no client takes it
                continue
            if self._store.reseal_reply(agent, number, blob, new):
                done.replies += 1

    def _old_replies(self, agent: str) -> Iterator[tuple[int, bytes]]:
        """The kept replies of agent whose header names a key other than the current one."""
        after: int | None = 0
        while after is not None:
            page, following = self._store.read_replies(agent, after, REPLY_PAGE)
            for number, blob in page:
                if sealed_key_id(blob) not in (None, self._sealer.key_id):
                    yield number, blob
            # A page always moves on: a store that says otherwise is not followed round.
            after = following if following is not None and following > after else None

    def _reseal_journal(self, agent: str, done: Resealed) -> None:
        """Seal the effect journal of the step after the newest checkpoint (the only one a
        replay reads) again with the current key, where it is under an old one."""
        step = self._next_step(agent)
        for (index, kind), blob in self._store.read_effects(agent, step).items():
            if sealed_key_id(blob) in (None, self._sealer.key_id):
                continue
            try:
                new = self._sealer.reseal_effect(blob, EffectAt(agent, step, index, kind))
            except SealError:
                continue  # junk: no key opens it, and no replay will take it
            if self._store.reseal_effect(agent, step, index, kind, blob, new):
                done.effects += 1

    def _next_step(self, agent: str) -> int:
        newest = self._store.list_checkpoints(agent)
        return (newest[0].seq if newest else 0) + 1

    # -- finish --------------------------------------------------------------------

    def finish(self) -> None:
        record, keys = self.record, self._sealer.keys
        retired = [entry.kid for entry in record.retired if keys.find(entry)]
        if not record.rotation and retired:  # run again after it finished (or crashed after)
            self._say(f"finished already: key id {record.key_id} is the cluster's only key; "
                      f"{', '.join(retired)} retired")  # fmt: skip
            return
        if record.rotation != "committed":
            raise ControlRefused(
                "no rotation is under way: nothing to finish"
                if not record.rotation
                else f"the rotation to key id {record.key_id} is begun but not committed: "
                "run hb rotate-secret commit first"
            )
        old = [self._old_checkpoints(agent) for agent in self._agents()]
        left = [(agent, count) for agent, count in old if count]
        if left:
            raise ControlRefused(
                "checkpoints under an old key are still retained ("
                + ", ".join(f"{count} of agent {agent}" for agent, count in left)
                + "): run hb rotate-secret commit again; nothing was changed"
            )
        for agent in self._agents():
            self._refuse_old_records(agent)
        finished = replace(
            record,
            accepted=(),
            retired=(*record.accepted, *record.retired)[:MAX_CLUSTER_KEYS],
            generation=record.generation + 1,
            rotation="",
            macs=(),
        )
        self._replace(finished)
        self._say(
            f"finished: key id {record.key_id} is the cluster's only key; "
            f"{', '.join(entry.kid for entry in record.accepted)} retired. Nodes holding only "
            "the old secret are refused from now on: remove it from every node"
        )

    def _refuse_old_records(self, agent: str) -> None:
        """ControlRefused while a record a node still needs is under an old key: the effect
        journal of the step in flight, or a submission not yet consumed."""
        old = {entry.kid for entry in self.record.accepted}
        step = self._next_step(agent)
        journal = [b for b in self._store.read_effects(agent, step).values()
                   if sealed_key_id(b) in old]  # fmt: skip
        if journal:
            raise ControlRefused(
                f"the effect journal of step {step} of agent {agent} holds {len(journal)} "
                "records under an old key: run hb rotate-secret commit again (or wait for the "
                "step's checkpoint); nothing was changed"
            )
        pending = [n for n, b in self._store.read_inbox(agent) if sealed_key_id(b) in old]
        if pending:
            raise ControlRefused(
                f"{len(pending)} submissions to agent {agent} sealed under an old key are not "
                f"yet consumed (numbers {pending[0]}..{pending[-1]}): wait until the agent "
                "has consumed them (hb status shows its inbox), then finish; nothing was changed"
            )
        replies = [n for n, blob in self._old_replies(agent) if self._opens(blob, agent, n)]
        if replies:
            raise ControlRefused(
                f"{len(replies)} replies to consumed submissions of agent {agent} are still "
                f"under an old key (numbers {replies[0]}..{replies[-1]}): run hb rotate-secret "
                "commit again; nothing was changed"
            )
        if self._old_control(agent, self._lease(agent)) is not None:
            raise ControlRefused(
                f"the control request of agent {agent} (hb pause, switchover) is signed under "
                "an old key: run hb rotate-secret commit again; nothing was changed"
            )
        acceptance = self._pending_acceptance(agent)
        if acceptance is not None:
            raise ControlRefused(
                f"the loss acceptance {acceptance.id} of agent {agent} is signed under an old "
                f"key and no checkpoint was published after it (above epoch {acceptance.epoch}): "
                "wait until a node has resumed the agent and published, then finish; nothing "
                "was changed"
            )

    def _pending_acceptance(self, agent: str) -> Acceptance | None:
        """The agent's loss acceptance if an old key signed it and a restore may still need it:
        no checkpoint that authenticates was published after it (an epoch above its own).
        Once one was, a restore finds that one first and the acceptance forgives nothing."""
        try:
            data = self._store.read_acceptance(agent)
            acceptance = None if data is None else open_acceptance(self._sealer, data, agent)
        except (CorruptRecord, Tampered):
            return None  # junk: no node takes it either
        if acceptance is None or seal_acceptance(self._sealer, acceptance) == data:
            return None
        infos = self._store.list_checkpoints(agent)
        for info in sorted(infos, key=lambda info: (info.epoch, info.seq), reverse=True):
            if info.epoch <= acceptance.epoch:
                break
            try:
                blob = self._store.read_checkpoint(agent, info)
                self._sealer.open_checkpoint(blob, agent, info.epoch, info.seq)
            except (StoreError, SealError):
                continue  # gone, or junk
            return None
        return acceptance

    def _opens(self, blob: bytes, agent: str, number: int) -> bool:
        """Whether blob authenticates as the reply to number under a key the cluster accepts
        (junk that none opens never keeps finish back)."""
        try:
            self._sealer.reseal_reply(blob, agent, number)
        except SealError:
            return False
        return True

    def _old_checkpoints(self, agent: str) -> tuple[str, int]:
        count = 0
        for info in self._store.list_checkpoints(agent):
            try:
                kid = read_header(self._store.read_checkpoint(agent, info)).key_id
            except (StoreError, SealError):
                continue  # gone, or junk that no key opens
            if kid != self._sealer.key_id and kid in {e.kid for e in self.record.accepted}:
                count += 1
        return agent, count

    # -- shared --------------------------------------------------------------------

    def _agents(self) -> list[str]:
        """Every agent of the store (they share its cluster record), the one named first."""
        others = [agent for agent in self._store.list_agents() if agent != self._agent]
        return [self._agent, *others]

    def _live(self) -> list[LiveNode]:
        self._say("watching the heartbeats for live nodes...")
        return live_nodes(self._store, self._agents(), clock=self._clock, sleep=self._sleep)

    def _wait_sealing(self, nodes: list[LiveNode], timeout_s: float) -> None:
        key_id = self._sealer.key_id
        waiting = wait_until_sealing(
            self._store, nodes, key_id, timeout_s, clock=self._clock, sleep=self._sleep
        )
        if waiting:
            late = ", ".join(
                f"{node.name} seals with {node.heartbeat.sealing or 'an unknown key'}"
                for node in waiting
            )
            raise ControlRefused(
                f"not every live node seals with key id {key_id} yet: "
                f"{late}. Run the same command again to wait on"
            )
        if nodes:
            self._say(f"every live node ({len(nodes)}) seals with key id {key_id}")

    def _replace(self, new: ClusterRecord) -> None:
        signed = self._sealer.keys.sign(new)
        try:
            self._store.replace_cluster(self.record, signed)
        except ClusterChanged as exc:
            raise ControlRefused(
                f"{exc}: another rotate-secret ran meanwhile? nothing was changed; run it again"
            ) from exc
        self._sealer.adopt(signed)
