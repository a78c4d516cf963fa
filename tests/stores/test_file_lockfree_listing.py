"""A lock-free listing of the file store shows the folder as it stood at one moment.

A reader takes no lock (docs/design.md, "The file backend"): a scan reads the folder's
names, then opens each, and leaves out a name gone by then. A reader held up between the
two (CPU or GIL starved, as the watcher of tests/faults/test_rotation_faults.py on a loaded
CI machine) while the leader publishes ``keep_checkpoints`` more checkpoints finds the newer
names it read removed by their retention, and the ones published since are not among the
names it read: it lists only the oldest, a newest that was never the newest while it read,
below one committed before it began (the rotation test's "the newest went back").

Here the reader is held up just after its first open, deterministically: the writer
publishes in the middle of the listing (``fileio.read_upto`` wrapped). Both tests fail until
the file backend's scan lists again when a name it read is gone by the time it opens it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from hamsterbunker.core.read_bounds import ReadBound
from hamsterbunker.records import LeaseRecord
from hamsterbunker.stores import Fence, Store, open_store
from hamsterbunker.stores.backend import DeleteRange, Put, Txn
from hamsterbunker.stores.backends.file import FileBackend
from hamsterbunker.stores.dirs import fileio

AGENT = "journal"
KEEP = 5  # the record layer's keep_checkpoints
NAMES = ReadBound(100, 0, 0)  # names only, as the checkpoint listing reads them


@pytest.fixture
def held_up(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[Callable[[], Any]], None]]:
    """held_up(work): once the next file a read opens is read, work is done (once), as if
    the reader were held up there while the writer goes on."""
    waiting: list[Callable[[], Any]] = []
    read_upto = fileio.read_upto

    def reading(*args: Any) -> Any:
        found = read_upto(*args)
        while waiting:
            waiting.pop()()  # the writer's own reads pass straight through
        return found

    monkeypatch.setattr(fileio, "read_upto", reading)
    yield waiting.append
    assert not waiting, "the reader never opened a file"


def test_a_scan_of_a_folder_is_the_folder_at_one_moment(
    tmp_path: Path, held_up: Callable[[Callable[[], Any]], None]
) -> None:
    """Five keys; while the scan reads, five commits each add the next and remove the
    oldest (a retention of five): what the scan returns is one of the folder's states."""
    backend = FileBackend(tmp_path / "store")
    for n in range(1, KEEP + 1):
        assert backend.commit(Txn(writes=[Put(f"ck/{n:02d}", b"x")])).succeeded
    states = [[f"ck/{n:02d}" for n in range(first, first + KEEP)] for first in range(1, KEEP + 2)]

    def five_more() -> None:
        for n in range(KEEP + 1, 2 * KEEP + 1):
            txn = Txn(writes=[Put(f"ck/{n:02d}", b"x"), DeleteRange(f"ck/{n - KEEP:02d}")])
            assert backend.commit(txn).succeeded

    held_up(five_more)
    found = backend.scan("ck/", NAMES).keys
    assert sorted(found) in states, f"a scan returned {found}, which the folder never held"


def leader_store(url: str) -> tuple[Store, Fence]:
    store = open_store(url)
    store.cas_lease(AGENT, None, LeaseRecord("n1", "eu", "s1", epoch=1, ttl_ms=2000))
    return store, Fence("n1", "s1", 1)


def test_a_lock_free_listing_never_shows_a_newest_below_one_committed_before_it(
    tmp_path: Path, held_up: Callable[[Callable[[], Any]], None]
) -> None:
    """The rotation test's watcher, held up in one listing while the leader publishes five
    steps: its newest is never below the one published before it began."""
    url = (tmp_path / "store").as_uri()
    leader, fence = leader_store(url)
    for seq in range(1, KEEP + 1):
        leader.put_checkpoint(AGENT, fence, seq, b"sealed %d" % seq)
    watcher = open_store(url)
    assert watcher.list_checkpoints(AGENT)[0].seq == KEEP

    def five_steps() -> None:
        for seq in range(KEEP + 1, 2 * KEEP + 1):
            leader.put_checkpoint(AGENT, fence, seq, b"sealed %d" % seq)

    held_up(five_steps)
    listed = [info.seq for info in watcher.list_checkpoints(AGENT)]
    assert listed and listed[0] >= KEEP, f"the newest went back: {KEEP}, then {listed}"
    assert listed in (list(range(KEEP, 0, -1)), list(range(2 * KEEP, KEEP, -1)))
    leader.close()
    watcher.close()
