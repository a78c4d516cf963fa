"""Rotating the cluster's secret online: ``hb rotate-secret begin | commit | finish``
(``docs/design.md``, "Rotating the secret").
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ..core.errors import (
    ClusterChanged,
    ConfigError,
    ControlRefused,
    CorruptRecord,
    LeaseConflict,
    SealError,
    StoreError,
    Tampered,
)
from ..core.failpoints import failpoint
from ..lease.acceptance import Acceptance, open_acceptance, seal_acceptance
from ..lease.control import Control, open_control, sign_control
from ..records import MAX_CLUSTER_KEYS, ClusterRecord, LeaseRecord
from ..sealing import Sealer, read_header, sealed_key_id
from ..sealing.keyring import Keyring
from ..stores import Store
from .nodes import LiveNode, live_nodes, wait_until_sealing
from .reseal import Resealed, old_replies, reseal_inbox, reseal_journal, reseal_replies

__all__ = ["Resealed", "Rotation"]

Say = Callable[[str], None]
# How many times commit re-reads a checkpoint that changed under it before it gives up.
RESEAL_TRIES = 3
# How many times commit writes a control request signed again when renewals keep
# changing the lease record under it (as hb pause does).
MAX_CONTROL_TRIES = 50


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
            begun = self._replace(
                key_id=new_id,
                key_check=newest.check,
                accepted=(record.current, *record.accepted),
                rotation="begun",
            )
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
            failpoint("rotation.before_record")
            self._replace(rotation="committed")
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
        reseal_journal(self._store, self._sealer, agent, done)
        reseal_inbox(self._store, self._sealer, agent, done)
        reseal_replies(self._store, self._sealer, agent, done)
        done.control = self._resign_control(agent)
        return done

    def _resign_control(self, agent: str) -> bool:
        """Sign the lease record's control request again with the current key where an old one
        signed it, by compare-and-set as ``hb pause`` writes it. True once written; False if
        there is nothing to sign again, or the lease kept changing (finish then refuses)."""
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
        self._replace(
            accepted=(),
            retired=(*record.accepted, *record.retired)[:MAX_CLUSTER_KEYS],
            rotation="",
        )
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
        replies = [
            n
            for n, blob in old_replies(self._store, self._sealer, agent)
            if self._opens(blob, agent, n)
        ]
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
        """The agent's loss acceptance if an old key signed it and no checkpoint that
        authenticates was published above its epoch (a restore may still need it)."""
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

    def _replace(self, **changes: Any) -> ClusterRecord:
        """The cluster record with changes, one generation up, written by compare-and-set."""
        new = replace(self.record, generation=self.record.generation + 1, macs=(), **changes)
        signed = self._sealer.keys.sign(new)
        try:
            self._store.replace_cluster(self.record, signed)
        except ClusterChanged as exc:
            raise ControlRefused(
                f"{exc}: another rotate-secret ran meanwhile? nothing was changed; run it again"
            ) from exc
        self._sealer.adopt(signed)
        return signed
