"""The backend contract (``hamsterbunker.stores.backend``), on every backend in conftest.

What the record layer relies on: a commit is all or nothing against its
compares, racing commits serialize, reads keep to their bounds whatever is
stored, and a watch hints at changes under its prefix.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest

from hamsterbunker.core.blob import BlobPieces
from hamsterbunker.core.read_bounds import ReadBound
from hamsterbunker.stores.backend import (
    Backend,
    Compare,
    DeleteRange,
    Get,
    Notice,
    Put,
    Scan,
    ScanResult,
    TooLarge,
    Txn,
    key_problem,
    prefix_end,
)

from .conftest import DURABLE, Opener

WIDE = ReadBound(100, 1024, 100 * 1024)


def put(backend: Backend, key: str, value: bytes) -> None:
    assert backend.commit(Txn(writes=[Put(key, value)])).succeeded


def keys(result: ScanResult) -> list[str]:
    return [key for key, _value in result.items]


def test_a_key_never_written_reads_as_none(backend: Backend) -> None:
    assert backend.get("a/missing", 10) is None
    assert backend.scan("a/", WIDE) == ScanResult()


def test_a_put_is_read_back_and_replaced(backend: Backend) -> None:
    put(backend, "a/k", b"one")
    assert backend.get("a/k", 10) == b"one"
    put(backend, "a/k", b"")
    assert backend.get("a/k", 10) == b""  # empty is a value, not absence


def test_a_value_over_max_bytes_is_too_large_not_read(backend: Backend) -> None:
    put(backend, "a/k", b"x" * 11)
    assert backend.get("a/k", 11) == b"x" * 11
    too_large = backend.get("a/k", 10)
    assert isinstance(too_large, TooLarge) and too_large.key == "a/k"
    assert too_large.size in (11, -1)


def test_a_scan_lists_the_keys_under_a_prefix_in_key_order(backend: Backend) -> None:
    for key in ["a/2", "a/10", "a/1", "a/b/3", "a/b-x", "ab/1", "a0", "b/1"]:
        put(backend, key, key.encode())
    result = backend.scan("a/", WIDE)
    # Key order is string order: "-" sorts before "/", so a/b-x before the keys in a/b/.
    listed = ["a/1", "a/10", "a/2", "a/b-x", "a/b/3"]
    assert result.items == [(k, k.encode()) for k in listed]
    assert not result.more and not result.too_large
    assert keys(backend.scan("a/", WIDE, after="a/10")) == ["a/2", "a/b-x", "a/b/3"]
    assert keys(backend.scan("a/", WIDE, after="a/b-x")) == ["a/b/3"]
    assert keys(backend.scan("a/", WIDE, after="a/b/3")) == []


def test_a_scan_stops_at_its_count_and_goes_on_after_the_last_key(backend: Backend) -> None:
    for n in range(7):
        put(backend, f"a/{n}", b"v")
    bound = ReadBound(3, 10, 100)
    first = backend.scan("a/", bound)
    assert keys(first) == ["a/0", "a/1", "a/2"] and first.more
    second = backend.scan("a/", bound, after="a/2")
    third = backend.scan("a/", bound, after="a/5")
    assert keys(second) == ["a/3", "a/4", "a/5"] and second.more
    assert keys(third) == ["a/6"] and not third.more


def test_a_scan_stops_before_its_total_bytes(backend: Backend) -> None:
    for n in range(5):
        put(backend, f"a/{n}", b"x" * 4)
    result = backend.scan("a/", ReadBound(10, 4, 10))
    assert keys(result) == ["a/0", "a/1"] and result.more


def test_a_scan_reports_a_value_over_its_entry_bytes_unread(backend: Backend) -> None:
    put(backend, "a/1", b"small")
    put(backend, "a/2", b"x" * 50)
    put(backend, "a/3", b"small")
    result = backend.scan("a/", ReadBound(10, 10, 100))
    assert result.items == [("a/1", b"small"), ("a/3", b"small")]
    assert [t.key for t in result.too_large] == ["a/2"]
    # Left out, it still counts towards the entries one scan looks at.
    counted = backend.scan("a/", ReadBound(2, 10, 100))
    assert keys(counted) == ["a/1"] and counted.more


def test_compares_hold_for_a_value_and_for_absence(backend: Backend) -> None:
    put(backend, "a/k", b"one")
    ok = backend.commit(
        Txn(compares=[Compare("a/k", b"one"), Compare("a/none", None)], writes=[Put("a/k", b"2")])
    )
    assert ok.succeeded and backend.get("a/k", 10) == b"2"


@pytest.mark.parametrize(
    "compare",
    [Compare("a/k", b"other"), Compare("a/k", None), Compare("a/none", b""), Compare("a/k", b"")],
)
def test_a_commit_whose_compare_fails_writes_nothing(backend: Backend, compare: Compare) -> None:
    put(backend, "a/k", b"one")
    result = backend.commit(
        Txn(
            compares=[Compare("a/k", b"one"), compare],
            writes=[Put("a/new", b"x"), DeleteRange("a/k")],
            reads=[Get("a/k", 10), Get("a/new", 10)],
        )
    )
    assert not result.succeeded
    assert result.reads == [b"one", None]  # as the store was: nothing written
    assert backend.get("a/k", 10) == b"one" and backend.get("a/new", 10) is None


def test_the_reads_of_a_commit_see_its_writes(backend: Backend) -> None:
    put(backend, "a/old", b"gone soon")
    result = backend.commit(
        Txn(
            writes=[Put("a/1", b"one"), Put("a/2", b"two"), DeleteRange("a/old")],
            reads=[Get("a/1", 10), Scan("a/", WIDE), Get("a/old", 10), Get("a/2", 1)],
        )
    )
    assert result.succeeded
    one, scan, old, two = result.reads
    assert one == b"one" and old is None and isinstance(two, TooLarge)
    assert isinstance(scan, ScanResult) and keys(scan) == ["a/1", "a/2"]


def test_writes_apply_in_order(backend: Backend) -> None:
    backend.commit(Txn(writes=[Put("a/1", b"x"), DeleteRange("a/1"), Put("a/2", b"x")]))
    backend.commit(Txn(writes=[Put("a/2", b"first"), Put("a/2", b"second")]))
    assert backend.get("a/1", 10) is None and backend.get("a/2", 10) == b"second"


def test_a_range_delete_takes_start_up_to_end(backend: Backend) -> None:
    for key in ["e/1/a", "e/1/b", "e/2/a", "e/3/a", "e/30"]:
        put(backend, key, b"v")
    backend.commit(Txn(writes=[DeleteRange("e/", "e/3")]))
    assert keys(backend.scan("e/", WIDE)) == ["e/3/a", "e/30"]
    backend.commit(Txn(writes=[DeleteRange("e/3/", prefix_end("e/3/"))]))
    assert keys(backend.scan("e/", WIDE)) == ["e/30"]
    backend.commit(Txn(writes=[DeleteRange("e/missing")]))  # nothing there: no error


def test_a_commits_tidy_up_goes_with_its_writes_and_not_without(backend: Backend) -> None:
    """Txn.tidy: removed once the commit's writes are made; a failed compare removes nothing."""
    for key in ["c/1", "c/2", "e/1/a", "e/2/a"]:
        put(backend, key, b"v")
    tidy = [DeleteRange("c/", "c/2"), DeleteRange("e/", "e/3")]
    refused = Txn(compares=[Compare("c/2", b"other")], writes=[Put("c/3", b"v")], tidy=tidy)
    assert not backend.commit(refused).succeeded
    assert keys(backend.scan("c/", WIDE)) + keys(backend.scan("e/", WIDE)) == [
        "c/1",
        "c/2",
        "e/1/a",
        "e/2/a",
    ]
    made = Txn(compares=[Compare("c/2", b"v")], writes=[Put("c/3", b"v")], tidy=tidy)
    assert backend.commit(made).succeeded
    assert keys(backend.scan("c/", WIDE)) + keys(backend.scan("e/", WIDE)) == ["c/2", "c/3"]


def test_a_scan_of_names_only_names_every_key_and_no_value(backend: Backend) -> None:
    """A bound of 0 entry bytes: each key as an empty item or as too large, nothing more."""
    for key, size in [("n/1", 3), ("n/2", 1000), ("n/3", 0)]:
        put(backend, key, b"x" * size)
    found = backend.scan("n/", ReadBound(10, 0, 0))
    assert all(value == b"" for _key, value in found.items)
    names = sorted([key for key, _value in found.items] + [each.key for each in found.too_large])
    assert names == ["n/1", "n/2", "n/3"] and not found.more


def test_a_blob_made_in_pieces_is_stored_whole(backend: Backend) -> None:
    pieces = BlobPieces(6, iter([b"ab", b"cd", b"ef"]))
    assert backend.commit(Txn(writes=[Put("a/blob", pieces)])).succeeded
    assert backend.get("a/blob", 6) == b"abcdef"


def test_a_blob_whose_maker_fails_stores_nothing(backend: Backend) -> None:
    put(backend, "a/blob", b"before")

    def failing() -> Iterator[bytes]:
        yield b"ab"
        raise OSError("the maker failed")

    with pytest.raises(OSError, match="the maker failed"):
        backend.commit(Txn(writes=[Put("a/other", b"x"), Put("a/blob", BlobPieces(6, failing()))]))
    assert backend.get("a/blob", 10) == b"before" and backend.get("a/other", 10) is None


def test_racing_compare_and_sets_serialize(open_backend: Opener) -> None:
    """Four clients each add 1 to one counter 10 times by compare-and-set: none is lost."""
    clients = [open_backend() for _ in range(4)]
    put(clients[0], "a/counter", b"0")
    errors: list[BaseException] = []

    def add(client: Backend) -> None:
        try:
            for _ in range(10):
                for _attempt in range(1000):
                    now = client.get("a/counter", 20)
                    assert isinstance(now, bytes)
                    new = str(int(now) + 1).encode()
                    txn = Txn(compares=[Compare("a/counter", now)], writes=[Put("a/counter", new)])
                    if client.commit(txn).succeeded:
                        break
                else:
                    raise AssertionError("a compare-and-set lost 1000 times in a row")
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=add, args=(client,)) for client in clients]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors and not any(thread.is_alive() for thread in threads)
    assert clients[0].get("a/counter", 20) == b"40"


def test_another_client_reads_what_one_committed(open_backend: Opener) -> None:
    first, second = open_backend(), open_backend()
    put(first, "a/k", b"seen")
    assert second.get("a/k", 10) == b"seen"


def test_records_outlive_their_client(open_backend: Opener, backend_name: str) -> None:
    if backend_name not in DURABLE:
        pytest.skip(f"the {backend_name} backend keeps nothing once its clients are gone")
    first = open_backend()
    put(first, "a/k", b"kept")
    first.close()
    assert open_backend().get("a/k", 10) == b"kept"


def test_a_watch_hints_at_changes_under_its_prefix(open_backend: Opener) -> None:
    writer, watcher = open_backend(), open_backend()

    async def first_notice() -> Notice:
        notices = watcher.watch("w/")
        waiting = asyncio.ensure_future(anext(notices))
        await asyncio.sleep(0.3)  # the watch is in place (a notice comes later anyway)
        await asyncio.to_thread(put, writer, "x/elsewhere", b"no")
        await asyncio.to_thread(put, writer, "w/k", b"yes")
        try:
            return await asyncio.wait_for(waiting, timeout=30)
        finally:
            await notices.aclose()

    notice = asyncio.run(first_notice())
    assert notice.key in ("w/k", None)
    if notice.key is not None and notice.value is not None:
        assert notice.value == b"yes"


def test_check_passes_while_the_backend_answers(backend: Backend) -> None:
    backend.check()


def test_a_backend_states_its_guarantees(backend: Backend) -> None:
    for promise in (
        backend.guarantees.mutual_exclusion,
        backend.guarantees.durability,
        backend.guarantees.across_hosts,
    ):
        assert promise
    assert isinstance(backend.capabilities, frozenset)


@pytest.mark.parametrize(
    "key", ["", "/a", "a/", "a//b", "a/../b", "a/.b", "a/b c", "a/\u00e9", "a/" + "x" * 200]
)
def test_a_key_is_path_of_plain_names(key: str) -> None:
    assert key_problem(key) is not None


def test_plain_keys_pass() -> None:
    assert key_problem("agents/a-1/ckpt/00000000000000000001-0000000001") is None
