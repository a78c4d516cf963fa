"""The first start on a synced folder (docs/syncdir.md, "The first start"): nodes started at
the same moment on empty folders end with one cluster record and one leader, and a node
that may not make the store waits for the record the sync brings instead of exiting.

Every node is a real ``Runtime`` on a folder of its own, kept in step by
``tests.support.syncdir`` (a copy step in a thread, well within the stated delay).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from hamsterbunker.core.timing import LeaseTiming
from hamsterbunker.demo import CounterAgent
from hamsterbunker.runtime import Runtime
from hamsterbunker.stores.syncdir import SyncDirStore
from tests.support import wait_until
from tests.support.agents import SECRET, Recorder
from tests.support.syncdir import Sync, SyncPump

TIMING = LeaseTiming(tick_ms=100, lease_ttl_ms=600)
SYNC_DELAY_MS = 100  # TTL 600 ms >= 2 x (tick 100 ms + 100 ms)
WAIT_S = 30.0


class Nodes:
    """Runtimes on a Sync's folders, each stepping the demo counter; stopped at the end."""

    def __init__(self, tmp_path: Path) -> None:
        self.sync = Sync(tmp_path, delay_ms=SYNC_DELAY_MS)
        self.events = Recorder()
        self.runtimes: dict[str, Runtime] = {}

    def start(self, node: str, *, create_store: bool = True) -> Runtime:
        """node on its folder, not waited for; the store opened as ``hb run`` opens it (by
        URL) when it may not make it, else with the default first-start wait."""
        root = self.sync.root(node)
        mine = SyncDirStore(root, node, sync_delay_ms=SYNC_DELAY_MS) if create_store else None
        runtime = Runtime(
            node_id=node,
            region="r1",
            store=mine or f"syncdir://{root}",
            agent=CounterAgent(),
            secret=SECRET,
            timing=TIMING,
            on_event=self.events,
            stop_grace_ms=0,
            sync_delay_ms=SYNC_DELAY_MS,
            create_store=create_store,
        )
        self.runtimes[node] = runtime
        runtime.start()
        return runtime

    def one_leader(self) -> str | None:
        """The one node leading, once every node is online and exactly one leads."""
        runtimes = self.runtimes.values()
        leading = [node for node, runtime in self.runtimes.items() if runtime.leading]
        online = all(r.ready.is_set() and r.role in ("active", "standby") for r in runtimes)
        return leading[0] if online and len(leading) == 1 else None

    def close(self) -> None:
        for runtime in self.runtimes.values():
            with contextlib.suppress(BaseException):
                runtime.stop(timeout=20)


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[Nodes]:
    made = Nodes(tmp_path)
    try:
        yield made
    finally:
        made.close()


def test_two_nodes_started_at_once_on_empty_folders_make_one_cluster(nodes: Nodes) -> None:
    """Both may make the store, both start at the same moment: one creates the cluster
    record (store.created once), the other waits for it and joins; one leader, no
    conflict copy, the same record on both machines."""
    with SyncPump(nodes.sync, "n1", "n2"):
        nodes.start("n2")
        nodes.start("n1")
        leader = wait_until(nodes.one_leader, "both online, one leading", WAIT_S)
    records = {(nodes.sync.root(node) / "cluster.json").read_bytes() for node in ("n1", "n2")}
    assert len(records) == 1
    created = [e.node for e in nodes.events.of("store.created")]
    assert len(created) == 1
    assert leader in ("n1", "n2")
    for node in ("n1", "n2"):
        folder = nodes.runtimes[node].store.report().synced_folder
        assert folder is not None and folder.sync_files == ()
        waits = [e.detail["error"] for e in nodes.events.of("store.error", node)]
        assert len(waits) == 1 and "no cluster record" in waits[0]


def test_a_node_that_may_not_make_the_store_waits_for_the_record_the_sync_brings(
    nodes: Nodes, caplog: pytest.LogCaptureFixture
) -> None:
    """On a Syncthing folder (.stfolder) with no record yet, a node without --create-store
    waits, saying so, instead of exiting; once the first node's record syncs in it joins."""
    (nodes.sync.root("n2") / ".stfolder").mkdir(parents=True)
    with caplog.at_level("WARNING", logger="hamsterbunker"):
        joining = nodes.start("n2", create_store=False)

        def said_so() -> bool:
            return any("this node does not create one" in r.getMessage() for r in caplog.records)

        wait_until(said_so, "n2 to say it waits", WAIT_S)
    assert joining.role == "starting"
    with SyncPump(nodes.sync, "n1", "n2"):
        nodes.start("n1")
        wait_until(nodes.one_leader, "both online, one leading", WAIT_S)
    assert nodes.runtimes["n1"].leading
    waited = nodes.events.of("store.error", "n2")
    assert len(waited) == 1 and "this node does not create one" in waited[0].detail["error"]
