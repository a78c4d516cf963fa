"""The lineage of terms on a synced folder (hamsterbunker.records.lineage): what carries the agent
on, what is kept aside, the same answer whatever order the facts arrive in."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from hamsterbunker.records.lineage import (
    Aside,
    ChainChoice,
    CheckpointRef,
    TermId,
    TermStart,
    applicable_choice,
    lineage,
)


def t(text: str) -> TermId:
    epoch, node = text.split("@")
    return TermId(int(epoch), node)


def ref(text: str, seq: int) -> CheckpointRef:
    return CheckpointRef(t(text), seq)


def start(text: str, base: CheckpointRef | None = None) -> TermStart:
    return TermStart(t(text), base)


def test_a_history_of_clean_takeovers_carries_every_checkpoint_and_keeps_none_aside() -> None:
    found = lineage(
        [start("1@a"), start("2@b", ref("1@a", 5)), start("3@a", ref("2@b", 9))],
        {t("1@a"): range(1, 6), t("2@b"): range(6, 10), t("3@a"): range(10, 13)},
    )
    assert found.winner == t("3@a")
    assert [r.seq for r in found.carried] == list(range(12, 0, -1))
    assert found.carried[0] == ref("3@a", 12)
    assert not found.diverged and not found.unplaced


def test_a_checkpoint_that_reached_the_new_leader_after_its_restore_is_kept_aside() -> None:
    # a published 6 and died; b restored from 5 before 6 had synced.
    found = lineage(
        [start("1@a"), start("2@b", ref("1@a", 5))],
        {t("1@a"): [4, 5, 6], t("2@b"): [6, 7]},
    )
    assert found.carried == (ref("2@b", 7), ref("2@b", 6), ref("1@a", 5), ref("1@a", 4))
    assert found.aside == (Aside(t("1@a"), (6,), ref("1@a", 5)),)
    assert found.diverged


def test_a_partitioned_old_leader_s_steps_are_kept_aside_and_the_new_term_wins() -> None:
    # a kept stepping through a partition; b took epoch 2 from a's checkpoint 3.
    found = lineage(
        [start("1@a"), start("2@b", ref("1@a", 3))],
        {t("1@a"): range(1, 11), t("2@b"): [4, 5, 6]},
    )
    assert found.winner == t("2@b")
    assert found.carried[0] == ref("2@b", 6)
    (aside,) = found.aside
    assert aside.term == t("1@a") and aside.seqs == tuple(range(4, 11))
    assert aside.forked_at == ref("1@a", 3)
    assert "1@a" in aside.describe() and "4..10" in aside.describe()


def test_two_takeovers_of_one_epoch_are_settled_by_node_id_and_the_loser_kept_whole() -> None:
    base = ref("1@c", 3)
    found = lineage(
        [start("1@c"), start("2@a", base), start("2@b", base)],
        {t("1@c"): [3], t("2@a"): [4, 5, 6, 7], t("2@b"): [4]},
    )
    assert found.winner == t("2@b")
    assert found.carried == (ref("2@b", 4), ref("1@c", 3))
    assert found.aside == (Aside(t("2@a"), (4, 5, 6, 7), base),)


def test_checkpoints_whose_term_record_has_not_arrived_are_unplaced_not_diverged() -> None:
    found = lineage([start("1@a")], {t("1@a"): [1, 2], t("5@z"): [3]})
    assert found.winner == t("1@a")
    assert not found.diverged
    assert found.unplaced == (Aside(t("5@z"), (3,), None),)
    nothing_known = lineage([], {t("1@a"): [1]})
    assert nothing_known.winner is None and nothing_known.carried == ()
    assert nothing_known.unplaced == (Aside(t("1@a"), (1,), None),)


def test_a_lineage_term_whose_record_is_missing_still_carries_up_to_its_successor_s_base() -> None:
    found = lineage([start("2@b", ref("1@a", 2))], {t("1@a"): [1, 2, 3], t("2@b"): [3]})
    assert found.carried == (ref("2@b", 3), ref("1@a", 2), ref("1@a", 1))
    assert found.aside == (Aside(t("1@a"), (3,), ref("1@a", 2)),)


def test_bases_forged_into_a_cycle_end_the_walk() -> None:
    found = lineage(
        [start("2@a", ref("3@b", 1)), start("3@b", ref("2@a", 1))],
        {t("2@a"): [1, 2], t("3@b"): [1, 2]},
    )
    assert found.winner == t("3@b")
    assert set(found.carried) == {ref("3@b", 1), ref("3@b", 2), ref("2@a", 1)}
    assert found.aside == (Aside(t("2@a"), (2,), ref("2@a", 1)),)


terms = st.builds(TermId, st.integers(1, 6), st.sampled_from("abc"))


@st.composite
def histories(draw: st.DrawFn) -> tuple[list[TermStart], dict[TermId, list[int]]]:
    chains = draw(st.dictionaries(terms, st.lists(st.integers(1, 30), max_size=6), max_size=6))
    known = list(chains) + draw(st.lists(terms, max_size=3))
    starts = []
    for term in draw(st.lists(st.sampled_from(known))) if known else []:  # repeats: forged
        base = draw(
            st.none() | st.builds(CheckpointRef, st.sampled_from(known), st.integers(0, 30))
        )
        starts.append(TermStart(term, base))
    return starts, chains


@settings(max_examples=200, deadline=None)
@given(histories(), st.randoms())
def test_every_checkpoint_is_carried_aside_or_unplaced_once_whatever_the_order(
    history: tuple[list[TermStart], dict[TermId, list[int]]], rng: random.Random
) -> None:
    starts, chains = history
    found = lineage(starts, chains)
    placed = [*found.carried]
    for group in (*found.aside, *found.unplaced):
        placed += [CheckpointRef(group.term, seq) for seq in group.seqs]
    held = [CheckpointRef(term, seq) for term, seqs in chains.items() for seq in set(seqs)]
    assert sorted(placed) == sorted(held)
    assert list(found.carried) == sorted(found.carried, key=lambda r: (r.seq, r.term), reverse=True)
    if found.winner is not None:
        assert found.winner == max(s.term for s in starts)
        assert {CheckpointRef(found.winner, s) for s in chains.get(found.winner, [])} <= set(
            found.carried
        )
    shuffled = list(starts)
    rng.shuffle(shuffled)
    reordered = {term: list(reversed(seqs)) for term, seqs in reversed(list(chains.items()))}
    assert lineage(shuffled, reordered) == found


def test_a_chosen_checkpoint_carries_the_agent_on_and_the_winners_steps_past_it_go_aside() -> None:
    # A partition: b's term 3 won over a's term 2 (both began from 1@a's seq 5); the
    # operator chose a's chain, its newest checkpoint 9.
    starts = [start("1@a"), start("2@a", ref("1@a", 5)), start("3@b", ref("1@a", 5))]
    chains = {t("1@a"): range(1, 6), t("2@a"): range(6, 10), t("3@b"): range(6, 8)}
    natural = lineage(starts, chains)
    assert natural.carried[0] == ref("3@b", 7)
    assert natural.aside == (Aside(t("2@a"), (6, 7, 8, 9), ref("1@a", 5)),)
    chosen = lineage(starts, chains, ref("2@a", 9))
    assert chosen.chosen == ref("2@a", 9)
    assert [r.seq for r in chosen.carried] == list(range(9, 0, -1))
    assert chosen.aside == (Aside(t("3@b"), (6, 7), ref("1@a", 5)),)
    # Behind the winner's own newest (a checkpoint that never arrives): the rest aside.
    back = lineage(starts, chains, ref("3@b", 6))
    assert back.carried[0] == ref("3@b", 6)
    assert Aside(t("3@b"), (7,), ref("3@b", 6)) in back.aside


def test_only_a_choice_made_after_the_winning_term_applies() -> None:
    made_after_2 = ChainChoice(t("2@a"), ref("1@a", 3))
    made_after_3 = ChainChoice(t("3@b"), ref("2@a", 9))
    other_machine = ChainChoice(t("3@b"), ref("2@a", 8))
    assert applicable_choice([made_after_2], t("3@b")) is None  # spent: a term began since
    assert applicable_choice([made_after_2, made_after_3], t("3@b")) == made_after_3
    # Two machines chose differently: every node takes the same one.
    assert applicable_choice([other_machine, made_after_3], t("3@b")) == made_after_3
    assert applicable_choice([made_after_3, other_machine], t("3@b")) == made_after_3
    assert applicable_choice([], None) is None
