"""What a store says of itself (``Store.chains``, ``Store.report``), for each kind of store.

The node, ``hb status``, ``hb-tui`` and ``hb choose-chain`` read these instead of
asking for the store's type: whether it keeps a chain per node (and its sync
delay), whether its watch is cheap enough for a monitor to keep open, and a
synced folder's node subtrees, sync-tool files and problems.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from hamsterbunker import FileStore
from hamsterbunker.ops.status import syncdir_shown
from hamsterbunker.stores import Chains, Store, StoreReport
from hamsterbunker.stores.syncdir import SyncDirStore
from hamsterbunker.testing import MemoryStore
from tests.support.syncdir import Sync

AGENT = "reported"

ONE_CHAIN: dict[str, tuple[Callable[[Path], Store], bool]] = {
    # kind: (open one, whether its watch is cheap)
    "file": (lambda tmp: FileStore(tmp / "store"), False),
    "memory": (lambda tmp: MemoryStore(), True),
}


@pytest.mark.parametrize("kind", sorted(ONE_CHAIN))
def test_a_store_with_one_chain_has_no_chains_and_says_whether_its_watch_is_cheap(
    tmp_path: Path, kind: str
) -> None:
    """A store whose one lease keeps one chain gives no chain operations and no synced
    folder (status shows no syncdir section), and says whether a monitor should watch it."""
    open_store, cheap = ONE_CHAIN[kind]
    store = open_store(tmp_path)
    try:
        assert store.chains is None
        assert store.report() == StoreReport(cheap_watch=cheap, synced_folder=None)
        assert syncdir_shown(store, AGENT) is None
    finally:
        store.close()


def test_a_synced_folder_gives_its_chains_and_reports_its_copy(tmp_path: Path) -> None:
    """A syncdir writer's chains are its own, with its sync delay; its report lists the node
    subtrees (its own included), the sync tool's files and what it skipped, and its watch
    is not cheap."""
    sync = Sync(tmp_path, delay_ms=250)
    store = sync.open("n1")
    root = sync.root("n1")
    (root / "nodes" / "n2").mkdir()
    (root / "nodes" / "not a node").mkdir()
    (root / "cluster.sync-conflict-20260101-n2.json").write_bytes(b"{}")
    chains = store.chains
    assert chains is store and chains.sync_delay_ms == 250
    report = store.report()
    assert not report.cheap_watch
    folder = report.synced_folder
    assert folder is not None
    assert folder.nodes == ("n1", "n2")
    assert folder.sync_files == ("cluster.sync-conflict-20260101-n2.json",)
    assert [p for p in folder.problems if "not a node" in p], folder.problems
    shown = syncdir_shown(store, AGENT)
    assert shown is not None and shown.nodes == ["n1", "n2"] and shown.sync_delay_ms == 250


def test_a_synced_folder_reader_has_chains_but_no_subtree_of_its_own(tmp_path: Path) -> None:
    """A reader (no node id, no sync delay: hb status, hb-tui) still reads every chain;
    it states no sync delay and reports only the subtrees the copy holds."""
    sync = Sync(tmp_path)
    sync.open("n1").close()
    reader = SyncDirStore(sync.root("n1"), create=False)
    chains = reader.chains
    assert chains is not None and chains.sync_delay_ms == 0
    assert chains.list_chains(AGENT) == {"n1": []}  # its subtree, no checkpoint yet
    folder = reader.report().synced_folder
    assert folder is not None and folder.nodes == ("n1",)
    shown = syncdir_shown(reader, None)
    assert shown is not None and shown.sync_delay_ms is None


def test_chains_is_a_capability_not_a_type_to_check(tmp_path: Path) -> None:
    """Chains cannot be checked with isinstance: callers ask the store (Store.chains)."""
    with pytest.raises(TypeError):
        isinstance(Sync(tmp_path).open("n1"), Chains)  # type: ignore[misc]
