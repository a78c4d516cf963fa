"""Every backend's reads keep to hamsterbunker.read_bounds, whatever was planted in the store.

An inbox filled past what ``admit`` allows (more entries, bigger ones, more
bytes in all) is read within ``INBOX_READ``: a read stops at the bound, and the
next read, from the last number taken, goes on from there.
"""

from __future__ import annotations

from hamsterbunker.read_bounds import INBOX_READ
from hamsterbunker.stores.base import Store
from tests.support.raw_inbox import plant_submissions

AGENT = "bounded"


def test_a_read_of_the_inbox_stops_at_its_byte_total(store: Store) -> None:
    """Entries of the biggest size, past the byte total of a read: a read takes as many as
    fit in the total, and the next read, from the last number taken, takes the rest."""
    size = INBOX_READ.entry_bytes
    fitting = INBOX_READ.total_bytes // size
    plant_submissions(store, AGENT, [(n, bytes([n % 256]) * size) for n in range(1, fitting + 3)])
    first = store.read_inbox(AGENT)
    assert [number for number, _blob in first] == list(range(1, fitting + 1))
    assert sum(len(blob) for _number, blob in first) <= INBOX_READ.total_bytes
    assert first[-1][1] == bytes([fitting % 256]) * size
    rest = store.read_inbox(AGENT, after=fitting)
    assert [number for number, _blob in rest] == [fitting + 1, fitting + 2]


def test_a_read_of_the_inbox_stops_at_its_count(store: Store) -> None:
    """More small entries than a read may return: it returns the oldest, as many as the bound,
    and the next read goes on from there."""
    plant_submissions(store, AGENT, [(n, b"x%d" % n) for n in range(1, INBOX_READ.count + 4)])
    first = store.read_inbox(AGENT)
    assert [number for number, _blob in first] == list(range(1, INBOX_READ.count + 1))
    rest = store.read_inbox(AGENT, after=INBOX_READ.count)
    assert rest == [(n, b"x%d" % n) for n in range(INBOX_READ.count + 1, INBOX_READ.count + 4)]


def test_an_inbox_entry_over_its_bound_is_left_out_and_the_rest_is_read(store: Store) -> None:
    """An entry one byte over the bound of one is left out; the entries around it are read."""
    plant_submissions(
        store, AGENT, [(1, b"one"), (2, b"\0" * (INBOX_READ.entry_bytes + 1)), (3, b"three")]
    )
    assert store.read_inbox(AGENT) == [(1, b"one"), (3, b"three")]
    assert store.read_inbox(AGENT, after=1) == [(3, b"three")]
