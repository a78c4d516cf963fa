"""``hb switchover``, ``hb pause``/``resume`` and ``hb history`` against real node processes.

Three ``hb run`` processes on each backend (file, Redis, etcd); the commands run
as a user would run them. Every cluster's history is held to the checker by the
``local_cluster`` fixture (one writer per epoch, no step published twice).

The slow tier (real processes): what these commands ask of a node is proved
in-process on every backend by tests/node/test_control.py, in the fast tier.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from hamsterbunker.core.timing import LeaseTiming
from hamsterbunker.ops.local import LocalCluster, NodeSpec
from hamsterbunker.records import LeaseRecord
from hamsterbunker.stores import Store, open_store
from tests.support import wait_until
from tests.support.cli import hb_env, run_hb
from tests.support.etcd_server import etcd_url
from tests.support.redis_server import redis_url

AGENT = "journal"  # hb_test_agents:JournalCounter
TIMING = LeaseTiming(tick_ms=100, lease_ttl_ms=800)
NODES = [NodeSpec("node-a", "eu"), NodeSpec("node-b", "us"), NodeSpec("node-c", "ap")]
MakeCluster = Callable[..., LocalCluster]

pytestmark = pytest.mark.multiprocess


@pytest.fixture(params=["file", "redis", "etcd"])
def running(request: pytest.FixtureRequest, local_cluster: MakeCluster) -> LocalCluster:
    """Three nodes of one agent; node-a leads and has stepped, b and c beat."""
    url = {"file": None, "redis": redis_url, "etcd": etcd_url}[request.param]
    cluster = local_cluster(store_url=url() if url else None, timing=TIMING)
    store = open_store(cluster.store_url)
    cluster.start(NODES[0])
    wait_until(lambda: holder(store) == "node-a" and seq(store) >= 2, "node-a to lead and step")
    for spec in NODES[1:]:
        cluster.start(spec)
    wait_until(lambda: len(store.list_heartbeats(AGENT)) == 3, "three heartbeats")
    store.close()
    return cluster


def holder(store: Store) -> str | None:
    lease = store.read_lease(AGENT)
    return None if lease is None else lease.holder


def seq(store: Store) -> int:
    return max((i.seq for i in store.list_checkpoints(AGENT)), default=0)


def lease_of(store: Store) -> LeaseRecord:
    lease = store.read_lease(AGENT)
    assert lease is not None
    return lease


def hb(cluster: LocalCluster, *args: str, secret: bool = True) -> tuple[int, str, str]:
    env = hb_env(HB_STORE=cluster.store_url, **({"HB_SECRET": cluster.secret} if secret else {}))
    done = run_hb([*args, "--agent-id", AGENT], env=env, timeout=60)
    return done.returncode, done.stdout, done.stderr


def test_switchover_moves_the_lease_to_the_named_standby_and_history_shows_it(
    running: LocalCluster,
) -> None:
    store = open_store(running.store_url)
    epoch = lease_of(store).epoch
    code, out, err = hb(running, "switchover", "--to", "node-c", "--wait", "--timeout", "20")
    assert code == 0, err
    assert "switchover from node-a to node-c asked" in out
    assert f"node-c leads at epoch {epoch + 1}" in out
    switched = seq(store)
    wait_until(lambda: seq(store) >= switched + 2, "node-c to step")
    assert holder(store) == "node-c"

    code, out, err = hb(running, "history", "--json", secret=False)
    assert code == 0, err
    newest = json.loads(out.splitlines()[0])
    assert {k: newest[k] for k in ("epoch", "from", "to", "via")} == {
        "epoch": epoch + 1, "from": "node-a", "to": "node-c", "via": "switchover",
    }  # fmt: skip
    code, out, _ = hb(running, "history", secret=False)
    assert code == 0 and "switchover" in out.splitlines()[1] and "node-c" in out
    store.close()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (
            ["--to", "node-z"],
            "no node node-z keeps agent 'journal' (it has no heartbeat in the store)",
        ),
        (["--to", "node-a"], "node-a leads agent 'journal' already"),
    ],
    ids=["unknown-target", "the-leader"],
)
def test_a_refused_switchover_exits_1_and_changes_nothing(
    running: LocalCluster, args: list[str], says: str
) -> None:
    store = open_store(running.store_url)
    code, out, err = hb(running, "switchover", *args)
    assert code == 1, (out, err)
    assert says in err and err.count("\n") == 1 and "Traceback" not in err
    lease = lease_of(store)
    assert (lease.holder, lease.control) == ("node-a", "")
    store.close()


def test_control_commands_without_the_secret_exit_2(running: LocalCluster) -> None:
    for command in (["switchover", "--to", "node-b"], ["pause"], ["resume"]):
        code, _, err = hb(running, *command, secret=False)
        assert code == 2 and "no secret given" in err, (command, err)
    assert lease_of(open_store(running.store_url)).control == ""


def test_a_paused_leader_killed_is_replaced_by_one_that_starts_paused(
    running: LocalCluster,
) -> None:
    store = open_store(running.store_url)
    code, out, err = hb(running, "pause")
    assert code == 0 and "paused" in out, err
    wait_until(lambda: all(h.paused for h in store.list_heartbeats(AGENT)), "paused heartbeats")
    # The step in flight at the pause may still publish: a few renewals later it has.
    renewals = lease_of(store).renewals
    wait_until(lambda: lease_of(store).renewals >= renewals + 3, "3 renewals")
    stood = seq(store)
    running.signal("node-a", signal.SIGKILL)
    wait_until(lambda: holder(store) in ("node-b", "node-c"), "a standby to take over", 20)
    taken = lease_of(store)
    assert taken.history[-1].via == "expired"
    # Many renewals of the new term later, still not one step.
    wait_until(lambda: lease_of(store).renewals >= taken.renewals + 20, "20 renewals", 20)
    assert seq(store) == stood
    code, out, _ = hb(running, "status", secret=False)
    assert "paused: the leader keeps the lease and does not step" in out, out
    assert f"{taken.holder}  " in out and "active (paused)" in out, out
    code, out, err = hb(running, "resume")
    assert code == 0 and "resumed" in out, err
    wait_until(lambda: seq(store) >= stood + 3, "the new leader to step again")
    # node-a's last heartbeat, from before its death, says paused for ever.
    live = lambda: [h for h in store.list_heartbeats(AGENT) if h.node != "node-a"]  # noqa: E731
    wait_until(lambda: not any(h.paused for h in live()), "the live nodes to beat unpaused")
    store.close()


def test_history_of_an_agent_the_store_does_not_hold_is_a_usage_error(tmp_path: Path) -> None:
    """Not "no takeovers recorded", exit 0: a mistyped agent id is one line, exit 2."""
    store_dir = tmp_path / "store"
    open_store(store_dir.as_uri()).close()
    done = run_hb(["history", "--agent-id", "nobody", "--store", store_dir.as_uri()])
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.splitlines() == [
        f"hb history: error: store {store_dir.as_uri()} holds no records of agent 'nobody'; "
        "it holds no agents"
    ]
