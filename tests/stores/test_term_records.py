"""Term records (hamsterbunker.sealing.term_records): only a record signed for this agent and term counts."""

from __future__ import annotations

import pytest

from hamsterbunker.core.errors import Tampered
from hamsterbunker.records.lineage import ChainChoice, CheckpointRef, TermId, TermStart
from hamsterbunker.sealing import Sealer, new_cluster_record
from hamsterbunker.sealing.term_records import (
    open_chain_choice,
    open_term_start,
    seal_chain_choice,
    seal_term_start,
)

SECRET = "term-record-secret"


@pytest.fixture(scope="module")
def sealer() -> Sealer:
    return Sealer(SECRET, new_cluster_record(SECRET))


START = TermStart(TermId(7, "laptop"), CheckpointRef(TermId(6, "server"), 41))


def test_a_signed_term_record_opens_as_written(sealer: Sealer) -> None:
    data = seal_term_start(sealer, "agent-a", START)
    assert open_term_start(sealer, data, "agent-a", START.term) == START
    first = TermStart(TermId(1, "server"), None)
    assert open_term_start(sealer, seal_term_start(sealer, "a", first), "a", first.term) == first


@pytest.mark.parametrize(
    ("agent", "term"),
    [("agent-b", START.term), ("agent-a", TermId(8, "laptop")), ("agent-a", TermId(7, "server"))],
)
def test_a_record_found_under_another_agent_or_term_is_refused(
    sealer: Sealer, agent: str, term: TermId
) -> None:
    data = seal_term_start(sealer, "agent-a", START)
    with pytest.raises(Tampered):
        open_term_start(sealer, data, agent, term)


def test_an_edited_or_unsigned_record_is_refused(sealer: Sealer) -> None:
    data = seal_term_start(sealer, "agent-a", START)
    edited = data.replace(b"41", b"99")
    forged = b'{"agent":"agent-a","epoch":7,"node":"laptop","base":null}\n' + b"0" * 64
    other_key = Sealer(SECRET, new_cluster_record(SECRET))
    for bad in (
        edited,
        forged,
        b"",
        b"\n",
        data[:-1],
        seal_term_start(other_key, "agent-a", START),
    ):
        with pytest.raises(Tampered):
            open_term_start(sealer, bad, "agent-a", START.term)


@pytest.mark.parametrize(
    "payload",
    [
        b"[]",
        b'{"agent":"a","epoch":-1,"node":"n","base":null}',
        b'{"agent":"a","epoch":true,"node":"n","base":null}',
        b'{"agent":"a","epoch":1,"node":"../n","base":null}',
        b'{"agent":"a","epoch":1,"node":"n","base":[1,"n"]}',
        b'{"agent":"a","epoch":1,"node":"n","base":[1,"n",1e300]}',
        b'{"agent":"a","epoch":1,"node":"n"}',
        b"[" * 5000,
    ],
)
def test_a_signed_record_that_does_not_parse_is_refused_not_raised(
    sealer: Sealer, payload: bytes
) -> None:
    with pytest.raises(Tampered):
        open_term_start(sealer, sealer.sign_record("term-start", payload), "a", TermId(1, "n"))


CHOICE = ChainChoice(TermId(9, "server"), CheckpointRef(TermId(8, "laptop"), 57))


def test_a_signed_chain_choice_opens_as_written_only_where_it_was_made(sealer: Sealer) -> None:
    data = seal_chain_choice(sealer, "agent-a", CHOICE)
    assert open_chain_choice(sealer, data, "agent-a", 9) == CHOICE
    for agent, epoch in (("agent-b", 9), ("agent-a", 10)):  # moved to another agent or term
        with pytest.raises(Tampered):
            open_chain_choice(sealer, data, agent, epoch)


def test_an_edited_unsigned_or_term_record_chain_choice_is_refused(sealer: Sealer) -> None:
    data = seal_chain_choice(sealer, "agent-a", CHOICE)
    payload, _, tag = data.rpartition(b"\n")
    edited = payload.replace(b"57", b"12") + b"\n" + tag
    as_term_record = seal_term_start(sealer, "agent-a", START)
    for bad in (edited, payload, b"", as_term_record, data[:-1]):
        with pytest.raises(Tampered):
            open_chain_choice(sealer, bad, "agent-a", 9)
    with pytest.raises(Tampered):  # a choice is no term record either
        open_term_start(sealer, data, "agent-a", START.term)
