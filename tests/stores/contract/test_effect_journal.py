"""The effect journal's part of the store contract (put_effect, read_effects), on every backend.

The journal holds one step's effect records until that step's checkpoint is
accepted; it is fenced as a checkpoint is (DESIGN.md invariants 1 and 8).
"""

from __future__ import annotations

import pytest

from hamsterbunker.core.errors import Fenced, StoreError
from hamsterbunker.core.limits import MAX_EFFECT_BYTES, MAX_EFFECTS_PER_STEP, MAX_SEQ
from hamsterbunker.records import LeaseRecord
from hamsterbunker.stores.base import Fence
from hamsterbunker.stores.interface import Store

from .conftest import Opener


def lease(holder: str | None, epoch: int, session: str = "s1") -> LeaseRecord:
    return LeaseRecord(holder=holder, region="eu", session=session, epoch=epoch, ttl_ms=2000)


def held(store: Store, holder: str = "n1", epoch: int = 1) -> Fence:
    record = store.cas_lease("a", None, lease(holder, epoch))
    return Fence(holder=holder, session=record.session, epoch=record.epoch)


def test_no_journal_at_first(store: Store) -> None:
    """A step nobody journaled has no records."""
    assert store.read_effects("a", 1) == {}


def test_records_under_the_current_fence_are_read_back(store: Store, open_second: Opener) -> None:
    """Each (index, kind) record comes back, byte for byte, to another client."""
    fence = held(store)
    store.put_effect("a", fence, 7, 0, "intent", b"i0")
    store.put_effect("a", fence, 7, 0, "outcome", b"o0")
    store.put_effect("a", fence, 7, 1, "outcome", b"\x00\xff" * 100)
    assert open_second().read_effects("a", 7) == {
        (0, "intent"): b"i0",
        (0, "outcome"): b"o0",
        (1, "outcome"): b"\x00\xff" * 100,
    }


def test_a_record_is_replaced_under_its_key(store: Store) -> None:
    """Writing (seq, index, kind) again replaces the record (a retried write is idempotent)."""
    fence = held(store)
    store.put_effect("a", fence, 1, 0, "outcome", b"first")
    store.put_effect("a", fence, 1, 0, "outcome", b"second")
    assert store.read_effects("a", 1) == {(0, "outcome"): b"second"}


def test_each_step_has_its_own_journal(store: Store) -> None:
    """read_effects(seq) shows only that step's records."""
    fence = held(store)
    for seq in (2, 3, 10):
        store.put_effect("a", fence, seq, 0, "outcome", f"s{seq}".encode())
    assert store.read_effects("a", 3) == {(0, "outcome"): b"s3"}
    assert store.read_effects("a", 10) == {(0, "outcome"): b"s10"}
    assert store.read_effects("a", 4) == {}


@pytest.mark.parametrize(
    "stale",
    [
        Fence(holder="n1", session="s1", epoch=1),  # old epoch
        Fence(holder="n2", session="s1", epoch=2),  # wrong holder
        Fence(holder="n1", session="s0", epoch=2),  # wrong session
        Fence(holder="n1", session="s1", epoch=3),  # an epoch from the future
    ],
    ids=["old-epoch", "wrong-holder", "wrong-session", "future-epoch"],
)
def test_a_record_under_a_stale_fence_is_fenced(store: Store, stale: Fence) -> None:
    """An effect record whose fence is not the lease's raises Fenced and stores nothing."""
    first = store.cas_lease("a", None, lease("n1", 1))
    store.cas_lease("a", first.version, lease("n1", 2))
    with pytest.raises(Fenced):
        store.put_effect("a", stale, 1, 0, "intent", b"stale")
    assert store.read_effects("a", 1) == {}


def test_a_record_without_a_lease_or_after_release_is_fenced(store: Store) -> None:
    """No lease record, or a released one, takes no effect record."""
    with pytest.raises(Fenced):
        store.put_effect("a", Fence("n1", "s1", 1), 1, 0, "intent", b"no lease")
    fence = held(store)
    current = store.read_lease("a")
    assert current is not None
    store.cas_lease("a", current.version, lease(None, 1))
    with pytest.raises(Fenced):
        store.put_effect("a", fence, 1, 0, "intent", b"after release")
    assert store.read_effects("a", 1) == {}


def test_a_takeover_fences_the_old_leaders_journal(store: Store, open_second: Opener) -> None:
    """Once another node takes the lease, the old leader's journal writes are refused;
    what it wrote before stays readable for the new leader's replay."""
    old = held(store)
    store.put_effect("a", old, 4, 0, "outcome", b"done before")
    new_client = open_second()
    current = new_client.read_lease("a")
    assert current is not None
    taken = new_client.cas_lease("a", current.version, lease("n2", 2, session="s2"))
    with pytest.raises(Fenced):
        store.put_effect("a", old, 4, 1, "outcome", b"too late")
    assert new_client.read_effects("a", 4) == {(0, "outcome"): b"done before"}
    new_client.put_effect("a", Fence("n2", "s2", taken.epoch), 4, 1, "outcome", b"n2")
    assert set(new_client.read_effects("a", 4)) == {(0, "outcome"), (1, "outcome")}


@pytest.mark.parametrize(
    ("seq", "index", "kind", "size"),
    [
        (0, 0, "outcome", 1),
        (MAX_SEQ + 1, 0, "outcome", 1),
        (1, -1, "outcome", 1),
        (1, MAX_EFFECTS_PER_STEP, "outcome", 1),
        (1, 0, "result", 1),
        (1, 0, "outcome", MAX_EFFECT_BYTES + 1),
    ],
    ids=["seq-zero", "seq-too-big", "index-negative", "index-too-big", "kind", "too-large"],
)
def test_a_record_outside_the_bounds_is_refused(
    store: Store, seq: int, index: int, kind: str, size: int
) -> None:
    """A record check_effect_bounds refuses raises StoreError (naming it) and stores nothing."""
    fence = held(store)
    with pytest.raises(StoreError) as refused:
        store.put_effect("a", fence, seq, index, kind, b"x" * size)
    assert not isinstance(refused.value, Fenced)
    assert store.read_effects("a", max(1, min(seq, MAX_SEQ))) == {}


def test_records_at_the_bounds_are_stored(store: Store, open_second: Opener) -> None:
    """The highest index, the largest size and the highest seq are all accepted."""
    fence = held(store)
    biggest = bytes(range(256)) * (MAX_EFFECT_BYTES // 256)
    store.put_effect("a", fence, MAX_SEQ, MAX_EFFECTS_PER_STEP - 1, "outcome", biggest)
    assert open_second().read_effects("a", MAX_SEQ) == {
        (MAX_EFFECTS_PER_STEP - 1, "outcome"): biggest
    }


def test_a_checkpoint_removes_its_steps_journal_and_older(
    store: Store, open_second: Opener
) -> None:
    """put_checkpoint(seq) removes the journal of seq and below, and keeps the steps above."""
    fence = held(store)
    for seq in (1, 2, 3, 4):
        store.put_effect("a", fence, seq, 0, "intent", b"i")
        store.put_effect("a", fence, seq, 0, "outcome", b"o")
    store.put_checkpoint("a", fence, 3, b"checkpoint 3")
    reader = open_second()
    assert [reader.read_effects("a", seq) for seq in (1, 2, 3)] == [{}, {}, {}]
    assert reader.read_effects("a", 4) == {(0, "intent"): b"i", (0, "outcome"): b"o"}


def test_a_refused_checkpoint_keeps_the_journal(store: Store, open_second: Opener) -> None:
    """A fenced checkpoint removes nothing: its step was not published."""
    old = held(store)
    store.put_effect("a", old, 1, 0, "outcome", b"kept")
    other = open_second()
    current = other.read_lease("a")
    assert current is not None
    other.cas_lease("a", current.version, lease("n2", 2, session="s2"))
    with pytest.raises(Fenced):
        store.put_checkpoint("a", old, 1, b"stale")
    assert other.read_effects("a", 1) == {(0, "outcome"): b"kept"}


def test_journals_of_agents_are_isolated(store: Store) -> None:
    """One agent's records are not another's, and its checkpoint removes only its own."""
    fence_a = held(store)
    record_b = store.cas_lease("b", None, lease("n1", 1))
    fence_b = Fence("n1", record_b.session, record_b.epoch)
    store.put_effect("a", fence_a, 1, 0, "outcome", b"a")
    store.put_effect("b", fence_b, 1, 0, "outcome", b"b")
    store.put_checkpoint("a", fence_a, 1, b"checkpoint")
    assert store.read_effects("a", 1) == {}
    assert store.read_effects("b", 1) == {(0, "outcome"): b"b"}
