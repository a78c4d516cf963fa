"""``hb rotate-secret`` and ``hb run`` as an operator meets them during a rotation (issue 19).

Each refusal is one line naming what is missing, with no traceback, and
changes nothing: begin while a live node lacks the new secret; a node that
starts with only the new secret before begin, or only the old one after;
a key list edited in the store. ``hb status`` shows the key and the step. A
reply consumed before begin is read with the new secret alone after finish.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path

import pytest

from hamsterbunker import FileStore
from hamsterbunker.ops.local import LocalCluster, NodeSpec
from hamsterbunker.records import ClusterRecord, LeaseRecord
from hamsterbunker.rotation import Rotation
from hamsterbunker.sealing import Sealer, new_cluster_record
from hamsterbunker.sealing.keyring import Keyring
from hamsterbunker.stores import Consumed, Fence
from tests.support import wait_until
from tests.support.cli import AGENT, AGENT_ID, FAST, hb_env, run_hb
from tests.support.raw_store import RawRecords

pytestmark = pytest.mark.multiprocess

OLD, NEW = "the-old-secret-of-this-cluster", "the-new-secret-of-this-cluster"
MakeCluster = Callable[..., LocalCluster]


def quiet(_line: str) -> None:
    """Rotation's say: nothing printed."""


def store_with(tmp_path: Path, *steps: str) -> tuple[FileStore, ClusterRecord]:
    """A file store whose cluster record was made with OLD, then taken through steps."""
    store = FileStore(tmp_path / "store")
    first = store.create_cluster(new_cluster_record(OLD))
    for step in steps:
        rotation = Rotation(store, AGENT_ID, Keyring((NEW, OLD)), say=quiet)
        getattr(rotation, step)(*(() if step == "finish" else (5,)))
    return store, first


def hb_run(store: FileStore, **secrets: str) -> tuple[int, str]:
    """hb run of the counter on store with the secrets given; (exit status, stderr)."""
    env = hb_env(HB_STORE=store.root.as_uri(), **secrets)
    done = run_hb(["run", "--agent", AGENT, "--node-id", "late", "--region", "eu", *FAST],
                  env=env)  # fmt: skip
    return done.returncode, done.stderr


def one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert "Traceback" not in stderr and len(lines) == 1, stderr
    return lines[0]


def test_begin_is_refused_while_a_live_node_lacks_the_new_secret(
    local_cluster: MakeCluster,
) -> None:
    """Both nodes run with the old secret only: begin names them and changes nothing."""
    cluster = local_cluster()
    cluster.secret = OLD
    for spec in (NodeSpec("node-a", "eu"), NodeSpec("node-b", "us")):
        cluster.start(spec)
    store = FileStore(cluster.store_url.removeprefix("file://"))
    wait_until(lambda: len(store.list_heartbeats("journal")) == 2, "both nodes to beat")
    before = store.read_cluster()
    env = hb_env(HB_SECRET=NEW, HB_SECRET_PREVIOUS=OLD, HB_STORE=cluster.store_url)
    done = run_hb(["rotate-secret", "begin", "--agent-id", "journal"], env=env)
    assert done.returncode == 1, done.stdout + done.stderr
    line = one_line(done.stderr)
    assert "not every live node holds the new secret" in line
    assert "node-a (agent journal)" in line and "node-b (agent journal)" in line
    assert "nothing was changed" in line
    assert store.read_cluster() == before


def test_begin_with_the_secrets_in_the_wrong_order_is_refused(tmp_path: Path) -> None:
    """The current secret given as the newest: refused, saying which goes first."""
    store, first = store_with(tmp_path)
    env = hb_env(HB_SECRET=OLD, HB_SECRET_PREVIOUS=NEW, HB_STORE=store.root.as_uri())
    done = run_hb(["rotate-secret", "begin", "--agent-id", AGENT_ID], env=env)
    assert done.returncode == 1
    assert "is the cluster's current one" in one_line(done.stderr)
    assert store.read_cluster() == first


def test_rotate_secret_without_a_secret_is_a_usage_error(tmp_path: Path) -> None:
    """No secret given: exit 2, one line."""
    store, _first = store_with(tmp_path)
    done = run_hb(["rotate-secret", "commit", "--agent-id", AGENT_ID],
                  env=hb_env(HB_STORE=store.root.as_uri()))  # fmt: skip
    assert done.returncode == 2
    assert "no secret given" in one_line(done.stderr)


def test_a_node_with_only_the_new_secret_before_begin_is_told_to_keep_the_old(
    tmp_path: Path,
) -> None:
    """Before begin the new secret alone opens nothing: exit 2, the fix named, no lease taken."""
    store, _first = store_with(tmp_path)
    code, stderr = hb_run(store, HB_SECRET=NEW)
    assert code == 2
    assert "needs the current one too, as HB_SECRET_PREVIOUS" in one_line(stderr)
    assert store.read_lease(AGENT_ID) is None


def test_a_node_with_only_the_old_secret_mid_rotation_is_told_it_lacks_the_new(
    tmp_path: Path,
) -> None:
    """After begin the old secret alone is refused, the rotation named: exit 2."""
    store, _first = store_with(tmp_path, "begin")
    code, stderr = hb_run(store, HB_SECRET=OLD)
    assert code == 2
    assert "a secret rotation is under way" in one_line(stderr)
    assert store.read_lease(AGENT_ID) is None


def test_a_node_with_only_the_old_secret_after_finish_is_refused(tmp_path: Path) -> None:
    """After finish, the old secret is named as retired: exit 2."""
    store, first = store_with(tmp_path, "begin", "commit", "finish")
    code, stderr = hb_run(store, HB_SECRET=OLD)
    assert code == 2
    assert f"key id {first.key_id}, the secret given here, was retired" in one_line(stderr)


def test_a_key_list_edited_in_the_store_is_refused_at_start(tmp_path: Path) -> None:
    """The old key dropped from a rotation's record by someone without the secrets: the node
    holding both refuses (exit 2) and writes nothing."""
    store, _first = store_with(tmp_path, "begin")
    begun = store.read_cluster()
    assert begun is not None
    RawRecords(store).put_cluster(replace(begun, accepted=()).to_json())
    code, stderr = hb_run(store, HB_SECRET=NEW, HB_SECRET_PREVIOUS=OLD)
    assert code == 2
    assert "key list (generation 1) failed to authenticate" in one_line(stderr)
    assert store.read_lease(AGENT_ID) is None


def test_status_shows_the_key_and_the_rotation_under_way(local_cluster: MakeCluster) -> None:
    """hb status names the current key id, and while a rotation is under way its step and
    the next command."""
    cluster = local_cluster()
    cluster.secret, cluster.env["HB_SECRET_PREVIOUS"] = NEW, OLD
    store = FileStore(cluster.store_url.removeprefix("file://"))
    store.create_cluster(new_cluster_record(OLD))
    cluster.start(NodeSpec("node-a", "eu"))
    wait_until(partial(store.list_heartbeats, "journal"), "the node to beat")
    Rotation(store, "journal", Keyring((NEW, OLD)), say=quiet).begin(30)
    record = store.read_cluster()
    assert record is not None
    old_id = record.accepted[0].kid
    shown = run_hb(["status", "--store", cluster.store_url, "--agent-id", "journal"])
    assert f"key: {record.key_id} (generation 1)" in shown.stdout, shown.stdout
    assert f"rotation begun: {old_id} still accepted (next: hb rotate-secret commit)" in (
        shown.stdout
    )
    assert Sealer(Keyring((NEW, OLD)), record).key_id == record.key_id


def test_a_reply_consumed_before_begin_is_read_with_the_new_secret_after_finish(
    tmp_path: Path,
) -> None:
    """hb rotate-secret commit says it re-sealed the reply of a submission consumed before
    begin; after finish, hb submit --wait with the same request id and only the new secret
    prints that reply."""
    store, first = store_with(tmp_path)
    old = Sealer(OLD, first)
    store.admit(AGENT_ID, "req-1", 1, old.seal_submission(AGENT_ID, 1, "req-1", {"q": 1}, 0.0))
    store.cas_lease(AGENT_ID, None, LeaseRecord("n1", "eu", "s1", 1, 2000))
    reply = old.seal_reply(AGENT_ID, 1, "req-1", {"answer": 42})
    checkpoint = old.seal(AGENT_ID, 1, 1, {"n": 1})
    store.put_checkpoint(
        AGENT_ID, Fence("n1", "s1", 1), 1, checkpoint, [Consumed(1, "req-1", reply)]
    )
    env = hb_env(HB_SECRET=NEW, HB_SECRET_PREVIOUS=OLD, HB_STORE=store.root.as_uri())
    for step in ("begin", "commit", "finish"):
        done = run_hb(["rotate-secret", step, "--agent-id", AGENT_ID, "--timeout", "5"], env=env)
        assert done.returncode == 0, done.stdout + done.stderr
        if step == "commit":
            assert "1 replies to consumed submissions re-sealed" in done.stdout, done.stdout
    submit = ["submit", "--agent-id", AGENT_ID, "--request-id", "req-1", "--data", "{}"]
    done = run_hb([*submit, "--wait", "--timeout", "30"],
                  env=hb_env(HB_SECRET=NEW, HB_STORE=store.root.as_uri()))  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines() == [
        "already admitted as #1 (request id req-1)",
        '{"answer": 42}',
    ]
