"""Every backend's reads keep to hamsterbunker.core.read_bounds, whatever was planted in the store.

An inbox filled past what ``admit`` allows (more entries, bigger ones, more
bytes in all) is read within ``INBOX_READ``: a read stops at the bound, and the
next read, from the last number taken, goes on from there. A leader's term
(``node.inbox.TermInbox``, on a FakeClock) reads on past such junk, reports it
once, and does not read it again before every step, only every few ticks.

A step's effect journal planted past ``EFFECTS_READ`` (names no record has,
records over the bytes of one) is read within it; an agent's heartbeats, past
``HEARTBEATS_READ``, likewise.
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from hamsterbunker.core.limits import EFFECT_KINDS, MAX_EFFECTS_PER_STEP
from hamsterbunker.core.read_bounds import EFFECTS_READ, HEARTBEATS_READ, INBOX_READ
from hamsterbunker.node.inbox import RESCAN_TICKS
from hamsterbunker.records import Heartbeat
from hamsterbunker.stores.interface import Store
from tests.support.agents import AGENT
from tests.support.raw_inbox import plant_submissions
from tests.support.raw_store import raw_view
from tests.support.term_inbox import TICK_S, leading

JUNK = 200  # entries of the biggest size: more than one read takes
LOOKS = 20  # steps beginning one after another (each reads the inbox first)


def test_a_read_of_the_inbox_stops_at_its_byte_total(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """Entries of the biggest size, past the byte total of a read: a read takes as many as
    fit in the total, says it stopped, and the next read, from the last number taken, takes
    the rest."""
    size = INBOX_READ.entry_bytes
    fitting = INBOX_READ.total_bytes // size
    plant_submissions(store, AGENT, [(n, bytes([n % 256]) * size) for n in range(1, fitting + 3)])
    with caplog.at_level(logging.WARNING):
        first = store.read_inbox(AGENT)
    assert any("stopped reading" in record.getMessage() for record in caplog.records)
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


def _junk(numbers: range) -> list[tuple[int, bytes]]:
    return [(n, b"j" * INBOX_READ.entry_bytes) for n in numbers]


def test_a_term_reads_past_junk_and_not_again_before_every_step(store: Store) -> None:
    """Junk over submissions below the counter, more than one read takes: a submission
    admitted after it is shown, each junk entry is reported once, and over many steps the
    junk is read once, not at every step."""

    async def scenario() -> None:
        async with leading(store) as term:
            term.admit(1)
            plant_submissions(store, AGENT, _junk(range(2, 2 + JUNK)))
            behind = 2 + JUNK
            term.admit(behind)
            seen = []
            for _look in range(LOOKS):
                seen = await term.shown()
            assert seen == [1, behind]
            junk_bytes = JUNK * INBOX_READ.entry_bytes
            assert term.reads.bytes_read < junk_bytes + INBOX_READ.total_bytes
            assert len(term.sink.of("inbox.rejected")) == JUNK

    asyncio.run(scenario())


def test_junk_a_term_read_past_is_looked_at_again_every_few_ticks(store: Store) -> None:
    """Junk planted ahead of the counter, more than one read takes: it is not read again at
    every step, and a submission admitted in its place is shown once the term looks at
    the junk again, a few ticks later."""

    async def scenario() -> None:
        async with leading(store) as term:
            term.admit(1)
            plant_submissions(store, AGENT, _junk(range(2, 2 + JUNK)))  # ahead of the counter
            for _look in range(LOOKS):
                assert await term.shown() == [1]
            read_once = term.reads.bytes_read
            term.admit(2)  # in place of the junk planted as #2
            for _look in range(LOOKS):
                await term.shown()
            assert term.reads.bytes_read == read_once  # not read again at every step
            term.clock.advance(RESCAN_TICKS * TICK_S)
            seen = []
            for _look in range(LOOKS):
                seen = await term.shown()
            assert seen == [1, 2]
            assert len(term.sink.of("inbox.rejected")) == JUNK  # each reported once

    asyncio.run(scenario())


def test_a_step_journal_read_keeps_to_its_bound(store: Store) -> None:
    """Every record a step may hold, one of them exactly the bytes of one and one a byte over,
    beside names no record has: the read returns every record within the bound, no more
    than its count and total, and leaves out the one over and the junk names.

    The count and total held before the journal was read through ``BoundedRead`` (a bounded
    set of names, each capped): this guards a regression. On etcd the junk name took a place
    of the bounded listing and the last record went unread: that failed before."""
    seq = 5
    raw = raw_view(store)
    genuine = {
        (index, kind): b"%d:%s" % (index, kind.encode())
        for index in range(MAX_EFFECTS_PER_STEP)
        for kind in EFFECT_KINDS
    }
    genuine[(0, "intent")] = b"i" * EFFECTS_READ.entry_bytes
    over = (1, "outcome")
    planted = {
        **genuine,
        over: b"o" * (EFFECTS_READ.entry_bytes + 1),
        (MAX_EFFECTS_PER_STEP, "intent"): b"past the last index",
        (0, "junk"): b"not a kind",
    }
    for (index, kind), data in planted.items():
        raw.put_effect(AGENT, seq, index, kind, data)
    del genuine[over]
    journal = store.read_effects(AGENT, seq)
    assert journal == genuine
    assert len(journal) <= EFFECTS_READ.count
    assert sum(len(data) for data in journal.values()) <= EFFECTS_READ.total_bytes
    assert store.read_effects(AGENT, seq + 1) == {}


def _beat(node: str) -> Heartbeat:
    return Heartbeat(
        node=node, region="eu", host="h", pid=1, role="standby", epoch=1, seq=0, leader=None,
        time=0.0,
    )  # fmt: skip


def test_a_read_of_the_heartbeats_stops_at_its_count(store: Store) -> None:
    """More nodes' heartbeats than a read takes: it returns those of the lowest node ids, as
    many as the bound, within its byte total; so does a tail's read."""
    nodes = [f"n{number:04d}" for number in range(HEARTBEATS_READ.count + 3)]
    for node in reversed(nodes):
        store.put_heartbeat(AGENT, _beat(node))
    beats = store.list_heartbeats(AGENT)
    assert [beat.node for beat in beats] == nodes[: HEARTBEATS_READ.count]
    assert sum(len(beat.to_json()) for beat in beats) <= HEARTBEATS_READ.total_bytes
    tailed = store.tail(AGENT).read().heartbeats
    assert sorted(beat.node for beat in tailed) == nodes[: HEARTBEATS_READ.count]


def test_a_heartbeat_over_its_bound_is_left_out_and_the_rest_is_read(store: Store) -> None:
    """A heartbeat one byte over the bound of one is left out; those around it are read.

    Held before the heartbeats were read through ``BoundedRead`` (each read with a cap, or
    refused by the parser): this guards a regression."""
    raw = raw_view(store)
    store.put_heartbeat(AGENT, _beat("n1"))
    big = _beat("n2").to_json()
    raw.put_heartbeat(AGENT, "n2", big + b" " * (HEARTBEATS_READ.entry_bytes + 1 - len(big)))
    store.put_heartbeat(AGENT, _beat("n3"))
    assert [beat.node for beat in store.list_heartbeats(AGENT)] == ["n1", "n3"]
