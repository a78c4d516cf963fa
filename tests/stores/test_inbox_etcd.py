"""The etcd store's inbox against hostile contents and interleaved writers (DESIGN.md
invariants 9 and 10).

The contract suite (tests/stores/contract/test_inbox.py) shows what every store
does; these put bytes straight under the etcd store's inbox keys (the layout is
told in ``hamsterbunker.stores.etcd.inbox``), past the contract, and check that
reads never raise or hang, that admit rebuilds a record it cannot believe from
the stored entries, and that consumption commits with the checkpoint's txn or not at all,
whatever happens between the staging of the replies and that txn.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import pytest

from hamsterbunker.errors import Fenced, NotNextNumber, StoreError
from hamsterbunker.limits import (
    MAX_INBOX_BYTES,
    MAX_INBOX_COUNT,
    MAX_RECORD_BYTES,
    MAX_REPLY_BYTES,
    MAX_SEQ,
    MAX_SUBMISSION_BYTES,
)
from hamsterbunker.records import LeaseRecord
from hamsterbunker.stores.base import AdmissionState, Consumed, Fence
from tests.support import each_ended

if TYPE_CHECKING:
    from hamsterbunker.stores.etcd import EtcdStore

pytestmark = pytest.mark.timeout(60)

Put = Callable[[str | bytes, bytes], None]  # a raw etcd put of a key under inbox/ of agent "a"
LOGGER = "hamsterbunker.stores.etcd"


def pad(number: int) -> str:
    return f"{number:020d}"


@pytest.fixture
def opened() -> Iterator[Callable[..., EtcdStore]]:
    """Open EtcdStores on one fresh prefix of the shared server (closed at the end)."""
    from hamsterbunker.stores.etcd import EtcdStore
    from tests.support.etcd_server import etcd_url

    url = etcd_url()
    with each_ended(EtcdStore, EtcdStore.close) as make:
        yield lambda **options: make(url, **options)


@pytest.fixture
def store(opened: Callable[..., EtcdStore]) -> EtcdStore:
    return opened(keep_replies=3)


def raw(store: EtcdStore) -> tuple[Put, Callable[[str], bytes | None]]:
    """put(key under the inbox, value) and get(key under the inbox), straight in etcd."""
    inbox = store._agent_prefix("a").encode() + b"inbox/"

    def put(rest: str | bytes, value: bytes) -> None:
        store._kv.put(inbox + (rest.encode() if isinstance(rest, str) else rest), value)

    def get(rest: str) -> bytes | None:
        found = store._kv.get(inbox + rest.encode())
        return found[0] if found else None

    return put, get


def held(store: EtcdStore, holder: str = "n1") -> Fence:
    record = store.cas_lease(
        "a", None, LeaseRecord(holder=holder, region="eu", session="s1", epoch=1, ttl_ms=2000)
    )
    return Fence(holder=holder, session=record.session, epoch=record.epoch)


def take_over(store: EtcdStore) -> None:
    """Another node takes the lease (epoch 2): the first one's fence is stale from now."""
    current = store.read_lease("a")
    assert current is not None
    store.cas_lease(
        "a",
        current.version,
        LeaseRecord(holder="n2", region="eu", session="s2", epoch=2, ttl_ms=2000),
    )


def admit_all(store: EtcdStore, count: int) -> None:
    for number in range(1, count + 1):
        assert store.admit("a", f"r{number}", number, b"p%d" % number) == (number, False)


# -- hostile contents -------------------------------------------------------------

JUNK_PENDING_NAMES: list[str | bytes] = [
    "zzz",
    "42",
    "9" * 20,  # above MAX_SEQ
    pad(MAX_SEQ + 1),
    pad(2) + "x",
    pad(2) + "/deeper",
    b"\xff\xfe",
]
BELOW_THE_READ = ["", pad(0)]  # before the first number: never read, so never reported


def test_junk_pending_entries_are_left_out_and_logged_once(
    store: EtcdStore, caplog: pytest.LogCaptureFixture
) -> None:
    """Keys that are no number, numbers out of range, oversized bytes: read_inbox lists
    only what the store admitted, never raises, and says so once per entry."""
    admit_all(store, 3)
    put, _get = raw(store)
    for name in JUNK_PENDING_NAMES + BELOW_THE_READ:
        put(b"pending/" + (name.encode() if isinstance(name, str) else name), b"junk")
    put("pending/" + pad(7), b"x" * (MAX_SUBMISSION_BYTES + 1))
    expected = [(1, b"p1"), (2, b"p2"), (3, b"p3")]
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert store.read_inbox("a") == expected
        first = len(caplog.records)
        assert store.read_inbox("a") == expected
    assert first == len(JUNK_PENDING_NAMES) + 1
    assert len(caplog.records) == first  # once each, not on every read
    assert store.read_inbox("a", after=2) == [(3, b"p3")]
    assert store.read_inbox("a", after=MAX_SEQ) == []
    assert store.read_inbox("a", after=10**30) == []
    assert store.read_inbox("a", after=-5) == expected


def test_a_read_of_the_inbox_looks_at_a_bounded_number_of_keys(
    store: EtcdStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Keys planted among the entries are read page by page, and no more of them than the
    bound: a read past it returns what it found, without hanging on the rest."""
    from hamsterbunker.stores.etcd import inbox as inbox_module

    monkeypatch.setattr(inbox_module, "_PAGE", 4)
    monkeypatch.setattr(inbox_module, "_SCANNED", 12)
    admit_all(store, 3)
    put, _get = raw(store)
    for k in range(20):
        put(f"pending/{pad(1)}j{k:02d}", b"junk")  # between entries 1 and 2
    assert store.read_inbox("a") == [(1, b"p1")]  # 2 and 3 are past the 12 keys looked at
    monkeypatch.setattr(inbox_module, "_SCANNED", 100)
    assert store.read_inbox("a") == [(1, b"p1"), (2, b"p2"), (3, b"p3")]  # across pages


BAD_ID_RECORDS = [
    b"{not json",
    b"[" * 60_000,
    b" " * (MAX_RECORD_BYTES + 1),
    b"\xff\xfe",
    b"null",
    b'{"n": 100000000000000000000000000000, "size": 1}',
    b'{"n": 0, "size": 1}',
    b'{"n": 1, "size": -1}',
    b'{"n": 1, "size": 1e400}',
    b'{"n": 1, "consumed": true, "reply": "../../cluster"}',
    b'{"n": "1", "consumed": true, "reply": null}',
]


@pytest.mark.parametrize("record", BAD_ID_RECORDS)
def test_a_damaged_request_id_record_is_unknown_and_replaced_by_an_admission(
    store: EtcdStore, record: bytes
) -> None:
    """read_admission takes a record that does not parse as nothing known; admit takes the
    request id as new, replacing the record, rather than refusing it for ever."""
    put, _get = raw(store)
    put("ids/r1", record)
    assert store.read_admission("a", "r1") is None
    assert store.admit("a", "r1", 1, b"p") == (1, False)
    assert store.read_admission("a", "r1") == AdmissionState(1, consumed=False, reply=None)
    assert store.admit("a", "r1", 2, b"p") == (1, True)


def test_request_ids_that_are_no_names_are_never_looked_up(store: EtcdStore) -> None:
    """A request id that would reach outside ids/ is not known, not an error."""
    put, _get = raw(store)
    put("meta", b"junk")  # what "ids/../meta" would read
    for bad in ("../meta", "", "a/b", "x" * 200):
        assert store.read_admission("a", bad) is None


BAD_COUNTS = [
    b"{not json",
    b"[" * 60_000,
    b" " * (MAX_RECORD_BYTES + 1),
    b'{"last": 1, "count": 1}',
    b'{"last": -1, "count": 0, "bytes": 0}',
    b'{"last": 1e400, "count": 1, "bytes": 1}',
    b'{"last": 99999999999999999999999, "count": 1, "bytes": 1}',
    b'{"last": 1, "count": true, "bytes": 1}',
]


def counts(get: Callable[[str], bytes | None], name: str) -> dict[str, int]:
    found = get(name)
    assert found is not None
    parsed: dict[str, int] = json.loads(found)
    return parsed


def admit_after_junk(
    store: EtcdStore, name: str, record: bytes, caplog: pytest.LogCaptureFixture
) -> Fence:
    """Admit 1..3, consume 3 (the highest number then a done entry only), plant record
    under name; the next admission goes to 4, above every stored entry, never back to a
    number given (a client starting over at 1 is told 4), the junk reported once."""
    admit_all(store, 3)
    fence = held(store)
    store.put_checkpoint("a", fence, 1, b"cp", [Consumed(3, "r3", b"re")])
    put, _get = raw(store)
    put(name, record)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        with pytest.raises(NotNextNumber) as refused:
            store.admit("a", "r4", 1, b"four")
        assert refused.value.next_number == 4
        assert store.admit("a", "r4", 4, b"four") == (4, False)
    assert [r for r in caplog.records if "rebuilt" in r.getMessage()] != []
    assert len({r.getMessage() for r in caplog.records}) == len(caplog.records)  # once each
    assert store.read_inbox("a") == [(1, b"p1"), (2, b"p2"), (4, b"four")]
    assert store.read_admission("a", "r4") == AdmissionState(4, consumed=False, reply=None)
    assert store.read_admission("a", "r3") == AdmissionState(3, consumed=True, reply=b"re")
    return fence


def consume_and_admit_on(store: EtcdStore, fence: Fence) -> None:
    """A later consumption commits (never "more consumed than admitted"), and the counts
    the limits are checked against are what is pending."""
    _put, get = raw(store)
    consumed = [Consumed(1, "r1", None), Consumed(2, "r2", None), Consumed(4, "r4", b"re4")]
    store.put_checkpoint("a", fence, 2, b"cp", consumed)
    assert store.read_inbox("a") == []
    assert store.admit("a", "r5", 5, b"five!") == (5, False)
    meta, totals = counts(get, "meta"), counts(get, "consumed")
    assert meta["last"] == 5
    assert (meta["count"] - totals["count"], meta["bytes"] - totals["bytes"]) == (1, 5)
    assert store.read_inbox("a") == [(5, b"five!")]


@pytest.mark.parametrize(
    "record",
    [*BAD_COUNTS, json.dumps({"last": MAX_SEQ + 1, "count": 0, "bytes": 0}).encode()],
)
def test_a_junk_meta_record_is_rebuilt_from_the_stored_entries(
    store: EtcdStore, record: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    """One junk write never stops admissions (DESIGN.md invariant 10): meta is rebuilt,
    its last the highest number stored, its totals consumed's plus what is pending."""
    fence = admit_after_junk(store, "meta", record, caplog)
    _put, get = raw(store)
    assert counts(get, "meta") == {"last": 4, "count": 4, "bytes": 2 + 2 + 2 + 4}
    consume_and_admit_on(store, fence)


@pytest.mark.parametrize(
    "forged",
    [{"count": MAX_INBOX_COUNT + 5, "bytes": 6}, {"count": 2, "bytes": MAX_INBOX_BYTES}],
    ids=["count", "bytes"],
)
def test_totals_forged_to_look_full_are_counted_again_before_a_refusal(
    store: EtcdStore, forged: dict[str, int]
) -> None:
    """A meta record that parses but says the inbox is full (one write) does not refuse
    admissions for good: its totals are counted again from what is pending, and the
    submission is admitted."""
    admit_all(store, 2)
    put, get = raw(store)
    put("meta", json.dumps({"last": 2, **forged}).encode())
    assert store.admit("a", "r3", 3, b"p3") == (3, False)
    assert counts(get, "meta") == {"last": 3, "count": 3, "bytes": 6}


JUNK_CONSUMED = [*BAD_COUNTS[:3], b'{"count": 5, "bytes": 0}']  # the last: above meta's


@pytest.mark.parametrize("record", JUNK_CONSUMED)
def test_a_junk_consumed_record_is_rebuilt_from_the_stored_entries(
    store: EtcdStore, record: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    """consumed's totals unbelievable (or above what was admitted): admit rebuilds meta
    on top of consumed as it is, or both from what is pending when consumed does not parse."""
    fence = admit_after_junk(store, "consumed", record, caplog)
    _put, get = raw(store)
    if record.startswith(b'{"count"'):
        assert counts(get, "meta") == {"last": 4, "count": 5 + 3, "bytes": 2 + 2 + 4}
    else:
        assert counts(get, "consumed") == {"count": 0, "bytes": 0}
        assert counts(get, "meta") == {"last": 4, "count": 3, "bytes": 2 + 2 + 4}
    consume_and_admit_on(store, fence)


@pytest.mark.parametrize("record", JUNK_CONSUMED)
def test_a_checkpoint_leaves_a_junk_consumed_record_for_admit_to_rebuild(
    store: EtcdStore, record: bytes
) -> None:
    """A checkpoint that consumes still commits, and leaves a record that does not parse
    alone (one that parses it counts on from); the next admission rebuilds what it must."""
    admit_all(store, 2)
    put, get = raw(store)
    put("consumed", record)
    store.put_checkpoint("a", held(store), 1, b"cp", [Consumed(1, "r1", b"re")])
    assert store.read_inbox("a") == [(2, b"p2")]
    assert store.read_admission("a", "r1") == AdmissionState(1, consumed=True, reply=b"re")
    parses = record.startswith(b'{"count"')
    assert get("consumed") == (b'{"count": 6, "bytes": 2}' if parses else record)
    assert store.admit("a", "r3", 3, b"p3") == (3, False)
    meta, totals = counts(get, "meta"), counts(get, "consumed")
    assert (meta["count"] - totals["count"], meta["bytes"] - totals["bytes"]) == (2, 4)


def test_junk_sorting_among_the_entries_never_lowers_the_rebuilt_number(
    store: EtcdStore,
) -> None:
    """A key that is no number but sorts above the highest entry: the rebuilt last is the
    highest number that could sort below it, never one below an entry."""
    admit_all(store, 2)
    put, get = raw(store)
    put("pending/" + pad(2)[:19] + "x", b"junk")  # above 00..02, below 00..10
    put("meta", b"junk")
    assert store.admit("a", "r3", 10, b"p") == (10, False)
    assert counts(get, "meta") == {"last": 10, "count": 3, "bytes": 5}


def test_a_lost_meta_record_never_lets_an_admission_overwrite_an_entry(
    store: EtcdStore,
) -> None:
    """With meta gone, admit would number from 1 again; the pending entries are never
    overwritten: each admission moves meta past one (NotNextNumber), and the new submission
    is admitted after them."""
    admit_all(store, 2)
    store._kv.delete(store._agent_prefix("a") + "inbox/meta")
    for taken in (1, 2):
        with pytest.raises(NotNextNumber) as refused:
            store.admit("a", "new", taken, b"other")
        assert refused.value.next_number == taken + 1
    assert store.read_admission("a", "new") is None
    assert store.admit("a", "new", 3, b"other") == (3, False)
    assert store.read_inbox("a") == [(1, b"p1"), (2, b"p2"), (3, b"other")]


def test_a_damaged_or_missing_reply_is_taken_as_none(store: EtcdStore) -> None:
    """The reply a consumed record names, over the limit or gone: consumed, no reply."""
    admit_all(store, 2)
    fence = held(store)
    store.put_checkpoint(
        "a", fence, 1, b"cp", [Consumed(1, "r1", b"one"), Consumed(2, "r2", b"two")]
    )
    put, _get = raw(store)
    ref = f"{1:010d}-{pad(1)}"
    put(f"replies/{pad(1)}/{ref}", b"x" * (MAX_REPLY_BYTES + 1))
    store._kv.delete(store._agent_prefix("a") + f"inbox/replies/{pad(2)}/{ref}")
    assert store.read_admission("a", "r1") == AdmissionState(1, consumed=True, reply=None)
    assert store.read_admission("a", "r2") == AdmissionState(2, consumed=True, reply=None)


def test_junk_among_consumed_records_is_removed_by_retention_without_a_fault(
    store: EtcdStore,
) -> None:
    """A planted done/ key that sorts first and a done record naming a junk request id are
    removed as the oldest; retention goes on keeping the newest three."""
    put, _get = raw(store)
    put("done/!", b"r1")
    put("done/" + pad(0), b"../x")
    admit_all(store, 5)
    fence = held(store)
    for n in range(1, 6):
        store.put_checkpoint("a", fence, n, b"cp", [Consumed(n, f"r{n}", b"re%d" % n)])
    kept = store._kv.get_prefix(store._agent_prefix("a") + "inbox/done/")
    assert sorted(meta["key"][-20:] for _v, meta in kept) == [pad(n).encode() for n in (3, 4, 5)]
    assert store.read_admission("a", "r2") is None
    assert store.read_admission("a", "r3") == AdmissionState(3, consumed=True, reply=b"re3")


# -- atomicity ---------------------------------------------------------------------


def _before_commit(monkeypatch: pytest.MonkeyPatch, action: Callable[[], object]) -> list[int]:
    """Run action once, just before the checkpoint's txn is sent (after the replies are
    staged); return the list that counts how often the txn was about to be sent."""
    from hamsterbunker.stores.etcd import checkpoints

    sent: list[int] = []

    def hook(name: str) -> None:
        if name == "checkpoint.before_commit":
            sent.append(1)
            if len(sent) == 1:
                action()

    monkeypatch.setattr(checkpoints, "failpoint", hook)
    return sent


def test_a_lease_lost_after_the_replies_are_staged_consumes_nothing(
    store: EtcdStore, opened: Callable[..., EtcdStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The replies are written before the checkpoint's txn; if that txn is fenced, none is
    readable, nothing is consumed, and the inbox's counts are as they were."""
    admit_all(store, 2)
    fence = held(store)
    other = opened()
    _before_commit(monkeypatch, lambda: take_over(other))
    with pytest.raises(Fenced):
        store.put_checkpoint("a", fence, 1, b"cp", [Consumed(1, "r1", b"staged")])
    assert store.list_checkpoints("a") == []
    assert other.read_inbox("a") == [(1, b"p1"), (2, b"p2")]
    assert other.read_admission("a", "r1") == AdmissionState(1, consumed=False, reply=None)
    staged = store._kv.get_prefix(store._agent_prefix("a") + "inbox/replies/")
    assert [value for value, _meta in staged] == [b"staged"]  # there, but named by nothing
    _put, get = raw(store)
    assert get("consumed") is None


def test_a_stale_writer_stages_no_reply(store: EtcdStore, opened: Callable[..., EtcdStore]) -> None:
    """Fenced before anything is written: not even a staged reply."""
    admit_all(store, 1)
    fence = held(store)
    take_over(opened())
    with pytest.raises(Fenced):
        store.put_checkpoint("a", fence, 1, b"cp", [Consumed(1, "r1", b"no")])
    assert store._kv.get_prefix(store._agent_prefix("a") + "inbox/replies/") == []


def test_a_checkpoint_refused_for_its_seq_consumes_nothing(store: EtcdStore) -> None:
    admit_all(store, 2)
    fence = held(store)
    store.put_checkpoint("a", fence, 5, b"cp")
    with pytest.raises(StoreError, match="must increase"):
        store.put_checkpoint("a", fence, 5, b"cp", [Consumed(1, "r1", b"no")])
    assert store.read_admission("a", "r1") == AdmissionState(1, consumed=False, reply=None)
    assert [n for n, _blob in store.read_inbox("a")] == [1, 2]


def test_an_entry_admitted_between_the_read_and_the_txn_is_counted_exactly(
    store: EtcdStore, opened: Callable[..., EtcdStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step consumes a number that is admitted just before its txn: the txn's compare of
    that entry fails, the write is read and sent again, and the entry is consumed and
    counted once, with its size: consumed's totals are exactly what was consumed."""
    admit_all(store, 2)
    fence = held(store)
    other = opened()
    sent = _before_commit(monkeypatch, lambda: other.admit("a", "r3", 3, b"third"))
    store.put_checkpoint("a", fence, 1, b"cp", [Consumed(1, "r1", None), Consumed(3, "r3", b"re")])
    assert len(sent) == 2
    assert other.read_inbox("a") == [(2, b"p2")]
    assert other.read_admission("a", "r3") == AdmissionState(3, consumed=True, reply=b"re")
    _put, get = raw(store)
    totals = get("consumed")
    assert totals is not None
    assert json.loads(totals) == {"count": 2, "bytes": len(b"p1") + len(b"third")}


def test_consuming_a_number_never_admitted_changes_no_count(store: EtcdStore) -> None:
    """Recorded as consumed (as the contract says), but nothing was pending, so nothing is
    taken off the unconsumed counts."""
    admit_all(store, 1)
    store.put_checkpoint("a", held(store), 1, b"cp", [Consumed(9, "r9", None)])
    assert store.read_admission("a", "r9") == AdmissionState(9, consumed=True, reply=None)
    _put, get = raw(store)
    assert get("consumed") is None
    assert store.read_inbox("a") == [(1, b"p1")]


def test_the_four_argument_checkpoint_still_writes(store: EtcdStore) -> None:
    info = store.put_checkpoint("a", held(store), 1, b"cp")
    assert (info.seq, store.read_checkpoint("a", info)) == (1, b"cp")
