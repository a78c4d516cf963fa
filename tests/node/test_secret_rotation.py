"""Keyrings and the cluster's key list (issue 19): several secrets, one current key.

A record as today's code writes it keeps opening; a rotation's records are
authenticated under every key they list; a node is told exactly which secret
it lacks. Records are built with ``hamsterbunker.rotation.Rotation`` on a
memory store with no live nodes (the waits for nodes are tested with real
processes in tests/faults/test_rotation_faults.py).
"""

from __future__ import annotations

import asyncio
import base64
import json
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from hamsterbunker.core.errors import (
    ConfigError,
    ControlRefused,
    SecretTooShort,
    StoreRegressed,
    Tampered,
    WrongSecret,
)
from hamsterbunker.core.limits import MAX_CONSUMED_PER_STEP
from hamsterbunker.core.reach import Reach
from hamsterbunker.core.timing import LeaseTiming
from hamsterbunker.lease import LeaseKeeper
from hamsterbunker.lease.acceptance import new_acceptance, seal_acceptance
from hamsterbunker.lease.control import Control, ControlView, open_control, set_paused, sign_control
from hamsterbunker.lease.proof import LeaseProof
from hamsterbunker.node.calls import NodeCalls
from hamsterbunker.node.cluster import Cluster
from hamsterbunker.node.keys import KeyFollower, show_keys
from hamsterbunker.node.state import Standing
from hamsterbunker.ops.client import Client
from hamsterbunker.records import ClusterRecord, KeyEntry, LeaseRecord
from hamsterbunker.rotation import Rotation
from hamsterbunker.runtime import Runtime
from hamsterbunker.sealing import EffectAt, Sealer, new_cluster_record, read_header, sealed_key_id
from hamsterbunker.sealing.cluster_keys import legacy_key_id
from hamsterbunker.sealing.keyring import Keyring, Secret, read_keyring
from hamsterbunker.stores import Consumed, Fence
from hamsterbunker.stores.reseal import REPLY_PAGE
from hamsterbunker.testing import MemoryStore
from tests.support import wait_until
from tests.support.agents import Recorder, SyncAgent

OLD, NEW = "the old secret of the cluster", "the new secret of the cluster"
AGENT = "rotating"
BOTH = Keyring((NEW, OLD))


def quiet(_line: str) -> None:
    """Rotation's say: nothing printed in unit tests."""


@pytest.fixture(scope="module")
def first() -> ClusterRecord:
    return new_cluster_record(OLD)


def rotated(first: ClusterRecord, *steps: str) -> tuple[MemoryStore, ClusterRecord]:
    """A memory store holding first, then the record after each of steps."""
    store = MemoryStore()
    store.create_cluster(first)
    return rotated_on(store, *steps)


def rotated_on(store: MemoryStore, *steps: str) -> tuple[MemoryStore, ClusterRecord]:
    """store, then its record after each of steps."""
    for step in steps:
        rotation = Rotation(store, AGENT, BOTH, say=quiet)
        if step == "begin":
            rotation.begin(timeout_s=1)
        elif step == "commit":
            rotation.commit(timeout_s=1)
        else:
            rotation.finish()
    record = store.read_cluster()
    assert record is not None
    return store, record


# -- the keyring -------------------------------------------------------------------


def test_a_secret_file_holds_one_secret_a_line_newest_first(tmp_path: Path, monkeypatch) -> None:
    """Lines of a secret file are the keyring's secrets in order; blank lines are skipped."""
    monkeypatch.delenv("HB_SECRET", raising=False)
    monkeypatch.delenv("HB_SECRET_PREVIOUS", raising=False)
    path = tmp_path / "secret"
    path.write_text(f"{NEW}\r\n\n{OLD}\n")
    assert read_keyring(path).secrets == (NEW, OLD)


def test_hb_secret_previous_follows_hb_secret(monkeypatch) -> None:
    """HB_SECRET is the newest secret, HB_SECRET_PREVIOUS the one after it."""
    monkeypatch.setenv("HB_SECRET", NEW)
    monkeypatch.setenv("HB_SECRET_PREVIOUS", OLD)
    assert read_keyring(None).secrets == (NEW, OLD)
    monkeypatch.delenv("HB_SECRET")
    with pytest.raises(ConfigError, match="HB_SECRET_PREVIOUS is set but HB_SECRET is not"):
        read_keyring(None)


def test_a_short_or_repeated_secret_in_a_file_is_refused(tmp_path: Path, monkeypatch) -> None:
    """Every line is checked; the same secret twice is a mistake, named with the file."""
    monkeypatch.delenv("HB_SECRET", raising=False)
    path = tmp_path / "secret"
    path.write_text(f"{NEW}\nshort\n")
    with pytest.raises(SecretTooShort, match=f"secret file {path}"):
        read_keyring(path)
    path.write_text(f"{NEW}\n{NEW}\n")
    with pytest.raises(ConfigError, match="the same secret is given twice"):
        read_keyring(path)


def test_a_keyring_never_shows_its_secrets() -> None:
    """repr (logs, tracebacks) names how many secrets, not what they are."""
    assert NEW not in repr(BOTH) and "2 secrets" in repr(BOTH)


# -- upgrade: today's records ------------------------------------------------------


def test_a_record_written_before_rotation_existed_opens_with_its_key_id(
    first: ClusterRecord,
) -> None:
    """A generation-0 record is written byte for byte as before, and its key id stays the
    hash of the salt, so checkpoints sealed before the upgrade open."""
    legacy = {
        "format": 1, "kdf": "scrypt", "n": first.n, "r": first.r, "p": first.p,
        "salt": first.salt, "key_id": first.key_id, "key_check": first.key_check,
        "created": first.created,
    }  # fmt: skip
    assert first.to_json() == json.dumps(legacy, separators=(",", ":"), sort_keys=True).encode()
    assert first.key_id == legacy_key_id(base64.b64decode(first.salt))
    sealer = Sealer(OLD, ClusterRecord.from_json(first.to_json()))
    blob = sealer.seal(AGENT, 1, 1, {"n": 1})
    assert read_header(blob).key_id == first.key_id
    # An extra secret the record does not know is held, not needed.
    assert Sealer(BOTH, first).open(blob, AGENT, 1, 1) == {"n": 1}


# -- begin, commit, finish: the records --------------------------------------------


def test_begin_makes_the_new_key_current_and_keeps_the_old_one_accepted(
    first: ClusterRecord,
) -> None:
    """After begin, checkpoints seal under the new key id and the old ones still open."""
    old_blob = Sealer(OLD, first).seal(AGENT, 1, 1, {"n": 1})
    _store, begun = rotated(first, "begin")
    assert (begun.generation, begun.rotation) == (1, "begun")
    assert begun.accepted == (first.current,)
    sealer = Sealer(BOTH, begun)
    assert sealer.key_id == begun.key_id != first.key_id
    assert read_header(sealer.seal(AGENT, 1, 2, {"n": 2})).key_id == begun.key_id
    assert sealer.open(old_blob, AGENT, 1, 1) == {"n": 1}


def test_begin_refuses_when_the_newest_secret_is_the_current_one(first: ClusterRecord) -> None:
    """Secrets given in the wrong order (the current one first) change nothing."""
    store = MemoryStore()
    store.create_cluster(first)
    with pytest.raises(ControlRefused, match="is the cluster's current one"):
        Rotation(store, AGENT, Keyring((OLD, NEW)), say=quiet).begin(timeout_s=1)
    assert store.read_cluster() == first


def test_commit_reseals_every_retained_checkpoint_under_the_new_key(
    first: ClusterRecord,
) -> None:
    """Checkpoints sealed under the old key are replaced, in place, by the same states
    sealed under the new one; finish then drops the old key."""
    store, begun = rotated(first, "begin")
    old = Sealer(OLD, first)
    lease = store_lease(store)
    for seq in (1, 2, 3):
        store.put_checkpoint(AGENT, lease, seq, old.seal(AGENT, 1, seq, {"n": seq}))
    with pytest.raises(ControlRefused, match="begun but not committed"):
        Rotation(store, AGENT, BOTH, say=quiet).finish()
    done = Rotation(store, AGENT, BOTH, say=quiet).commit(timeout_s=1)
    assert done[0].resealed == 3
    sealer = Sealer(BOTH, store.read_cluster())  # type: ignore[arg-type]
    for info in store.list_checkpoints(AGENT):
        blob = store.read_checkpoint(AGENT, info)
        assert read_header(blob).key_id == begun.key_id
        assert sealer.open(blob, AGENT, info.epoch, info.seq) == {"n": info.seq}
    Rotation(store, AGENT, BOTH, say=quiet).finish()
    finished = store.read_cluster()
    assert finished is not None
    assert (finished.generation, finished.rotation, finished.accepted) == (3, "", ())
    assert Sealer(NEW, finished).key_id == begun.key_id  # the new secret alone will do
    Rotation(store, AGENT, BOTH, say=quiet).finish()  # run again (a crash after): done
    assert store.read_cluster() == finished


def store_lease(store: MemoryStore) -> Fence:
    """A lease of the agent held by epoch 1, and its fence."""
    store.cas_lease(AGENT, None, LeaseRecord("n1", "r", "s1", 1, 2000))
    return Fence("n1", "s1", 1)


# -- what a node is told it lacks --------------------------------------------------


def test_a_node_with_only_the_new_secret_before_begin_is_told_to_keep_the_current_one(
    first: ClusterRecord,
) -> None:
    """Before begin, the new secret alone does not open the cluster: the message says the
    current one is needed too."""
    with pytest.raises(WrongSecret, match="needs the current one too, as HB_SECRET_PREVIOUS"):
        Sealer(NEW, first)


def test_a_node_with_only_the_old_secret_mid_rotation_is_told_it_lacks_the_new_one(
    first: ClusterRecord,
) -> None:
    """After begin, the old secret alone is refused with the rotation named."""
    _store, begun = rotated(first, "begin")
    with pytest.raises(WrongSecret, match=r"rotation is under way.*hold only key id"):
        Sealer(OLD, begun)


def test_a_node_with_only_the_new_secret_mid_rotation_is_told_it_lacks_the_old_one(
    first: ClusterRecord,
) -> None:
    """Until finish, the previous secret is needed too: the message names its key id."""
    _store, begun = rotated(first, "begin")
    with pytest.raises(WrongSecret, match=f"lack the previous one \\(key id {first.key_id}"):
        Sealer(NEW, begun)


def test_a_node_with_only_the_old_secret_after_finish_is_told_it_was_retired(
    first: ClusterRecord,
) -> None:
    """After finish, the old secret is named as retired by the rotation."""
    _store, finished = rotated(first, "begin", "commit", "finish")
    with pytest.raises(
        WrongSecret, match=f"key id {first.key_id}, the secret given here, was retired"
    ):
        Sealer(OLD, finished)


# -- a key list edited without the secrets -----------------------------------------


@pytest.mark.parametrize(
    "edit",
    [
        "drop the accepted key",
        "swap current and accepted",
        "raise the generation",
        "change the step",
        "drop a tag",
        "retire nothing",
    ],
)
def test_a_key_list_edited_without_the_secrets_is_refused(first: ClusterRecord, edit: str) -> None:
    """Any change of a rotated record that its tags do not cover fails to authenticate."""
    _store, begun = rotated(first, "begin")
    edited = {
        "drop the accepted key": replace(begun, accepted=()),
        "swap current and accepted": replace(
            begun,
            key_id=first.key_id,
            key_check=first.key_check,
            accepted=(KeyEntry(begun.key_id, begun.key_check),),
        ),
        "raise the generation": replace(begun, generation=begun.generation + 5),
        "change the step": replace(begun, rotation="committed"),
        "drop a tag": replace(begun, macs=begun.macs[:1]),
        "retire nothing": replace(begun, retired=(first.current,)),
    }[edit]
    with pytest.raises((Tampered, WrongSecret)):
        Sealer(BOTH, ClusterRecord.from_json(edited.to_json()))


def test_a_record_that_claims_generation_zero_with_a_rotation_is_refused(
    first: ClusterRecord,
) -> None:
    """Generation 0 carries no tags: it may name no other key."""
    forged = replace(first, accepted=(KeyEntry("0" * 16, first.key_check),))
    with pytest.raises(Tampered, match="generation 0 names a rotation"):
        Sealer(BOTH, forged)


def test_a_running_node_refuses_a_record_rolled_back_to_an_older_generation(
    first: ClusterRecord,
) -> None:
    """adopt never goes back: the record before begin, replayed after finish, is refused."""
    _store, finished = rotated(first, "begin", "commit", "finish")
    sealer = Sealer(BOTH, finished)
    with pytest.raises(StoreRegressed, match="went back from key generation 3 to 0"):
        sealer.adopt(first)
    assert sealer.cluster == finished


# -- the effect journal and the inbox ----------------------------------------------


def test_commit_reseals_the_effect_journal_of_the_step_in_flight(first: ClusterRecord) -> None:
    """The journal a replay would read (the step after the newest checkpoint) is sealed
    again under the new key, and opens as the same record."""
    store, begun = rotated(first, "begin")
    old = Sealer(OLD, first)
    fence = store_lease(store)
    store.put_checkpoint(AGENT, fence, 1, old.seal(AGENT, 1, 1, {"n": 1}))
    at = EffectAt(AGENT, 2, 0, "outcome", "call-llm")
    store.put_effect(AGENT, fence, 2, 0, "outcome", old.seal_effect(at, 1, {"reply": "hi"}))
    done = Rotation(store, AGENT, BOTH, say=quiet).commit(timeout_s=1)
    assert done[0].effects == 1
    [blob] = store.read_effects(AGENT, 2).values()
    assert sealed_key_id(blob) == begun.key_id
    opened = Sealer(BOTH, store.read_cluster()).open_effect(blob, at)  # type: ignore[arg-type]
    assert (opened.epoch, opened.name, opened.payload) == (1, "call-llm", {"reply": "hi"})


def test_commit_reseals_the_unconsumed_submissions(first: ClusterRecord) -> None:
    """A submission admitted before begin and not yet consumed is sealed again under the
    new key, with its request id, payload and time."""
    store, begun = rotated(first, "begin")
    old = Sealer(OLD, first)
    store.admit(AGENT, "req-1", 1, old.seal_submission(AGENT, 1, "req-1", {"q": 1}, 5.0))
    done = Rotation(store, AGENT, BOTH, say=quiet).commit(timeout_s=1)
    assert done[0].submissions == 1
    [(number, blob)] = store.read_inbox(AGENT)
    assert number == 1 and sealed_key_id(blob) == begun.key_id
    opened = Sealer(BOTH, store.read_cluster()).open_submission(blob, AGENT, 1)  # type: ignore[arg-type]
    assert (opened.request_id, opened.payload, opened.submitted) == ("req-1", {"q": 1}, 5.0)


def test_finish_waits_for_submissions_sealed_under_the_old_key_to_be_consumed(
    first: ClusterRecord,
) -> None:
    """A submission sealed under the old key after commit's pass (a client that read the
    record before begin) keeps the old key: finish is refused, naming it, until the agent
    has consumed it."""
    store, _begun = rotated(first, "begin", "commit")
    old = Sealer(OLD, first)
    store.admit(AGENT, "req-1", 1, old.seal_submission(AGENT, 1, "req-1", {"q": 1}, 0.0))
    with pytest.raises(ControlRefused, match="1 submissions to agent rotating sealed under an old"):
        Rotation(store, AGENT, BOTH, say=quiet).finish()
    assert store.read_cluster().rotation == "committed"  # type: ignore[union-attr]
    fence = store_lease(store)
    new = Sealer(BOTH, store.read_cluster())  # type: ignore[arg-type]
    store.put_checkpoint(
        AGENT, fence, 1, new.seal(AGENT, 1, 1, {"n": 1}), [Consumed(1, "req-1", None)]
    )
    Rotation(store, AGENT, BOTH, say=quiet).finish()
    assert store.read_cluster().rotation == ""  # type: ignore[union-attr]


def consume_with_old_replies(
    store: MemoryStore, old: Sealer, count: int, states: Sealer | None = None
) -> None:
    """Admit count submissions (req-1, ...) and consume them in checkpoints 1, 2, ...
    (sealed by states, else by old), each with a reply sealed by old: {"answer": its
    number} for an odd one, None (consumed without a reply) for an even one."""
    fence = store_lease(store)
    consumed = []
    for number in range(1, count + 1):
        request_id = f"req-{number}"
        blob = old.seal_submission(AGENT, number, request_id, {"q": number}, 0.0)
        store.admit(AGENT, request_id, number, blob)
        answer = {"answer": number} if number % 2 else None
        reply = old.seal_reply(AGENT, number, request_id, answer)
        consumed.append(Consumed(number, request_id, reply))
    for seq, start in enumerate(range(0, count, MAX_CONSUMED_PER_STEP), start=1):
        blob = (states or old).seal(AGENT, 1, seq, {"n": seq})
        batch = consumed[start : start + MAX_CONSUMED_PER_STEP]
        store.put_checkpoint(AGENT, fence, seq, blob, batch)


def test_a_reply_sealed_before_begin_is_read_with_the_new_secret_alone_after_finish(
    first: ClusterRecord,
) -> None:
    """Replies of submissions consumed before begin (more than one page of them) are
    sealed again under the new key by commit: after finish, a client holding only the
    new secret reads each, and one consumed without a reply still reads as None."""
    store = MemoryStore()
    store.create_cluster(first)
    consume_with_old_replies(store, Sealer(OLD, first), 2 * REPLY_PAGE + 5)
    Rotation(store, AGENT, BOTH, say=quiet).begin(timeout_s=1)
    [done] = Rotation(store, AGENT, BOTH, say=quiet).commit(timeout_s=1)
    assert (done.replies, done.replies_unopened) == (2 * REPLY_PAGE + 5, 0)
    assert f"{2 * REPLY_PAGE + 5} replies to consumed submissions re-sealed" in done.describe("k")
    Rotation(store, AGENT, BOTH, say=quiet).finish()
    with Client(store, NEW) as client:
        for number in (1, 2, REPLY_PAGE + 1, 2 * REPLY_PAGE + 5):
            expected = {"answer": number} if number % 2 else None
            assert client.result(AGENT, f"req-{number}", timeout=10) == expected


def test_finish_refuses_while_a_reply_under_the_old_key_is_kept(first: ClusterRecord) -> None:
    """A reply under the old key that commit did not re-seal keeps finish back, naming it,
    until commit runs again; a reply that no key opens (junk) keeps nothing back."""
    store, _begun = rotated(first, "begin", "commit")
    new = Sealer(BOTH, store.read_cluster())  # type: ignore[arg-type]
    consume_with_old_replies(store, Sealer(OLD, first), 1, states=new)
    with pytest.raises(ControlRefused, match="1 replies to consumed submissions of agent"):
        Rotation(store, AGENT, BOTH, say=quiet).finish()
    assert store.read_cluster().rotation == "committed"  # type: ignore[union-attr]
    [(number, sealed)], _following = store.read_replies(AGENT, 0, REPLY_PAGE)
    junk = sealed[:-1] + bytes([sealed[-1] ^ 1])  # names the old key, fails to authenticate
    assert store.reseal_reply(AGENT, number, sealed, junk)
    [done] = Rotation(store, AGENT, BOTH, say=quiet).commit(timeout_s=1)
    assert (done.replies, done.replies_unopened) == (0, 1)
    Rotation(store, AGENT, BOTH, say=quiet).finish()
    assert store.read_cluster().rotation == ""  # type: ignore[union-attr]


# -- signed records: a control request, a loss acceptance ---------------------------


def test_commit_signs_a_control_request_made_before_begin_again(first: ClusterRecord) -> None:
    """An agent paused before begin stays paused for a node holding only the new secret
    after finish: commit signs the same request (same revision) with the new key."""
    store = MemoryStore()
    store.create_cluster(first)
    paused = set_paused(store, Sealer(OLD, first), AGENT, True)
    Rotation(store, AGENT, BOTH, say=quiet).begin(timeout_s=1)
    [done] = Rotation(store, AGENT, BOTH, say=quiet).commit(timeout_s=1)
    assert done.control and "control request" in done.describe("k")
    [again] = Rotation(store, AGENT, BOTH, say=quiet).commit(timeout_s=1)
    assert not again.control  # under the new key already: nothing written
    Rotation(store, AGENT, BOTH, say=quiet).finish()
    finished = store.read_cluster()
    assert finished is not None
    view = ControlView(Sealer(NEW, finished), AGENT)
    control = view.read(store.read_lease(AGENT))
    assert view.paused and view.drain_problems() == []
    assert control == open_control(Sealer(OLD, first), paused.control, AGENT)


def test_finish_refuses_while_a_control_request_is_signed_under_the_old_key(
    first: ClusterRecord,
) -> None:
    """A control request under the old key that commit did not sign again keeps finish
    back, naming it, until commit runs again."""
    store, _begun = rotated(first, "begin", "commit")
    signed = sign_control(Sealer(OLD, first), Control(agent=AGENT, revision=7, paused=True))
    store.cas_lease(AGENT, None, LeaseRecord(None, "", "", 0, 2000, control=signed))
    with pytest.raises(ControlRefused, match=r"control request of agent rotating .* old key"):
        Rotation(store, AGENT, BOTH, say=quiet).finish()
    Rotation(store, AGENT, BOTH, say=quiet).commit(timeout_s=1)
    Rotation(store, AGENT, BOTH, say=quiet).finish()
    assert store.read_cluster().rotation == ""  # type: ignore[union-attr]


def test_finish_waits_for_a_checkpoint_after_a_loss_acceptance_signed_under_the_old_key(
    first: ClusterRecord,
) -> None:
    """A loss acceptance signed before begin is needed by a restore until a checkpoint is
    published after it: finish is refused, naming it, until one that authenticates is."""
    store = MemoryStore()
    store.create_cluster(first)
    accepted = new_acceptance(AGENT, 5, Reach(1, 1), None, [(2, 1)])
    store.put_acceptance(AGENT, seal_acceptance(Sealer(OLD, first), accepted))
    store, begun = rotated_on(store, "begin", "commit")
    refused = f"loss acceptance {accepted.id} of agent rotating is signed under an old key"
    with pytest.raises(ControlRefused, match=refused):
        Rotation(store, AGENT, BOTH, say=quiet).finish()
    store.cas_lease(AGENT, None, LeaseRecord("n1", "r", "s6", 6, 2000))
    fence = Fence("n1", "s6", 6)
    store.put_checkpoint(AGENT, fence, 2, b"junk that names no key" * 4)
    with pytest.raises(ControlRefused, match=refused):
        Rotation(store, AGENT, BOTH, say=quiet).finish()  # junk publishes nothing
    new = Sealer(BOTH, begun)
    store.put_checkpoint(AGENT, fence, 3, new.seal(AGENT, 6, 3, {"n": 3}))
    Rotation(store, AGENT, BOTH, say=quiet).finish()
    assert store.read_cluster().rotation == ""  # type: ignore[union-attr]


# -- a running node follows the record ---------------------------------------------


def follower_of(
    store: MemoryStore, secret: Secret, calls: NodeCalls | None = None
) -> tuple[KeyFollower, Standing, list[str]]:
    """A node's KeyFollower on store (its cluster opened with secret), and what it emits."""
    emitted: list[str] = []
    cluster = Cluster(store, AGENT, secret, remembered=None, memory_path=None,
                      emit=lambda kind, **_detail: emitted.append(kind))  # fmt: skip
    sealer, standing = cluster.open(), Standing()
    show_keys(standing, sealer)
    follower = KeyFollower(
        cluster, sealer, standing, calls or NodeCalls(),
        emit=lambda kind, **_detail: emitted.append(kind),
        stop=lambda: emitted.append("stop"), period_s=0.01,
    )  # fmt: skip
    return follower, standing, emitted


def test_a_running_node_seals_with_the_new_key_once_it_reads_begins_record(
    first: ClusterRecord,
) -> None:
    """The follower adopts the begun record: the heartbeat's sealing key id moves to it."""
    store = MemoryStore()
    store.create_cluster(first)
    follower, standing, emitted = follower_of(store, BOTH)
    assert standing.sealing == first.key_id
    Rotation(store, AGENT, BOTH, say=quiet).begin(timeout_s=1)
    assert asyncio.run(follower.once())
    begun = store.read_cluster()
    assert begun is not None and standing.sealing == begun.key_id != first.key_id
    assert emitted == ["cluster.keys_changed"]


def test_a_record_read_along_with_the_lease_is_followed_while_every_store_thread_is_busy(
    first: ClusterRecord,
) -> None:
    """A new term follows the keys from the record its take read: with nothing to read, that
    never waits for a store thread (a takeover's renewal, events and fetches hold them)."""
    store = MemoryStore()
    store.create_cluster(first)
    calls = NodeCalls()
    follower, standing, _emitted = follower_of(store, BOTH, calls)
    Rotation(store, AGENT, BOTH, say=quiet).begin(timeout_s=1)
    begun = store.read_cluster()
    assert begun is not None
    held = threading.Event()

    async def run() -> bool:
        busy = [asyncio.ensure_future(calls.io(held.wait, 10)) for _ in range(8)]
        try:
            return await asyncio.wait_for(follower.once(begun.to_json()), 5)
        finally:
            held.set()
            await asyncio.gather(*busy)

    assert asyncio.run(run())
    assert standing.sealing == begun.key_id


def test_a_running_node_without_the_new_secret_stops_and_says_why(first: ClusterRecord) -> None:
    """A node holding only the old secret when begin's record appears stops, and keeps the
    refusal to raise once stopped (hb run then exits 2)."""
    store = MemoryStore()
    store.create_cluster(first)
    follower, standing, emitted = follower_of(store, OLD)
    Rotation(store, AGENT, BOTH, say=quiet).begin(timeout_s=1)
    assert not asyncio.run(follower.once())
    assert emitted == ["node.refused", "stop"]
    assert isinstance(follower.refusal, WrongSecret)
    assert standing.sealing == first.key_id  # it never sealed with a key it lacks


def test_a_client_opened_before_begin_submits_under_the_new_key(first: ClusterRecord) -> None:
    """A long-lived Client follows the record: its submissions after begin are sealed with
    the new key (none left under the old one for finish to wait on)."""
    store = MemoryStore()
    store.create_cluster(first)
    client = Client(store, BOTH)
    Rotation(store, AGENT, BOTH, say=quiet).begin(timeout_s=1)
    client.submit(AGENT, {"q": 1}, request_id="req-1")
    [(_number, blob)] = store.read_inbox(AGENT)
    assert sealed_key_id(blob) == store.read_cluster().key_id != first.key_id  # type: ignore[union-attr]


def test_a_restarted_node_refuses_a_record_older_than_the_one_it_remembers(
    first: ClusterRecord,
) -> None:
    """The store's record rolled back to before begin while a node was down: the node that
    remembers the finished rotation (its state directory) refuses at start."""
    store, finished = rotated(first, "begin", "commit", "finish")
    rolled_back = MemoryStore()
    rolled_back.create_cluster(first)
    cluster = Cluster(rolled_back, AGENT, BOTH, remembered=finished, memory_path=None,
                      emit=lambda *_a, **_k: None)  # fmt: skip
    with pytest.raises(StoreRegressed, match="went back from key generation 3"):
        cluster.open()
    # The newer record (a rotation while it was down) is taken, once it authenticates.
    newer = Cluster(store, AGENT, BOTH, remembered=first, memory_path=None,
                    emit=lambda *_a, **_k: None)  # fmt: skip
    assert newer.open().cluster == finished


def test_begin_refuses_to_rotate_back_to_a_retired_secret(first: ClusterRecord) -> None:
    """A secret a rotation retired is not made current again."""
    store, finished = rotated(first, "begin", "commit", "finish")
    with pytest.raises(ControlRefused, match="retired by an earlier rotation"):
        Rotation(store, AGENT, Keyring((OLD, NEW)), say=quiet).begin(timeout_s=1)
    assert store.read_cluster() == finished


def test_a_standby_that_has_not_read_begins_record_yet_opens_the_new_keys_checkpoint(
    first: ClusterRecord,
) -> None:
    """A node's sealer meets a checkpoint under a key it does not know yet (begin's record
    not followed yet, and the leader died): it reads the record then and opens it."""
    store = MemoryStore()
    store.create_cluster(first)
    standby = Cluster(store, AGENT, BOTH, remembered=None, memory_path=None,
                      emit=lambda *_a, **_k: None).open()  # fmt: skip
    Rotation(store, AGENT, BOTH, say=quiet).begin(timeout_s=1)
    leader = Sealer(BOTH, store.read_cluster())  # type: ignore[arg-type]
    blob = leader.seal(AGENT, 2, 7, {"n": 7})
    assert Sealer(BOTH, first).key_id == standby.key_id == first.key_id
    with pytest.raises(Tampered, match="does not accept"):
        Sealer(BOTH, first).open(blob, AGENT, 2, 7)  # without a store to read: refused
    assert standby.open(blob, AGENT, 2, 7) == {"n": 7}
    assert standby.key_id == leader.key_id  # and it seals with the new key from now on


def test_a_node_that_read_the_record_before_begin_seals_its_term_with_the_new_key(
    first: ClusterRecord, monkeypatch
) -> None:
    """begin waits only for the nodes it sees beating; a node that read the record before
    begin but beat only after begin looked (a restart, under load) reads the keys again
    when it takes the lease: its term seals nothing under the replaced key."""
    # No periodic read of the record during the test: only the takeover's read may follow it.
    monkeypatch.setattr("hamsterbunker.node.runtime.KEYS_READ_TTLS", 1000)
    store = MemoryStore()
    store.create_cluster(first)
    _elsewhere, begun = rotated(first, "begin")
    timing = LeaseTiming(tick_ms=100, lease_ttl_ms=1000)
    holder = LeaseKeeper(store, AGENT, "node-a", "r1", timing=timing)
    holder.proof = LeaseProof(Sealer(OLD, first), AGENT)
    holder.tick()
    events = Recorder()
    node = Runtime(
        node_id="node-b", region="r1", store=store, agent=SyncAgent(AGENT),  # type: ignore[arg-type]
        secret=BOTH, timing=timing, on_event=events, stop_grace_ms=0,
    )  # fmt: skip
    node.start()
    try:
        # node-a renews until node-b has read the record and beats as a standby...
        wait_until(
            lambda: (
                holder.tick() and any(hb.node == "node-b" for hb in store.list_heartbeats(AGENT))
            ),
            "node-b beating as a standby",
        )
        store.replace_cluster(first, begun)  # ...then begin's record, and node-a dies
        events.wait("lease.acquired", "node-b")
        wait_until(lambda: store.list_checkpoints(AGENT), "node-b's first checkpoint")
        for info in store.list_checkpoints(AGENT):
            assert sealed_key_id(store.read_checkpoint(AGENT, info)) == begun.key_id != first.key_id
    finally:
        node.stop(timeout=20)
