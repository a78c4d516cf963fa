"""The history checker: a clean history passes, and each rule catches its violation."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from hamsterbunker.core.history import HistoryWriter, Op, read_history
from hamsterbunker.ops.checker import check, main


def op(node: str, kind: str, epoch: int, seq: int, start: float, end: float, outcome: str = "ok",
       **detail: object) -> Op:  # fmt: skip
    return Op(node, kind, epoch, seq, start, end, outcome, dict(detail))


def clean_history() -> list[Op]:
    """a leads epoch 1 (seq 1-2), dies; b takes epoch 2, resumes from 2, publishes 3-4."""
    return [
        op("a", "acquire", 1, 0, 0.0, 0.1),
        op("a", "restore", 1, 0, 0.1, 0.2, "started", from_seq=0, next_seq=1),
        op("a", "publish", 1, 1, 0.3, 0.4),
        op("a", "publish", 1, 2, 0.5, 0.6),
        op("b", "acquire", 2, 0, 3.0, 3.1),
        op("b", "restore", 2, 2, 3.1, 3.2, "resumed", from_seq=2, next_seq=3),
        op("b", "publish", 2, 3, 3.3, 3.4),
        op("b", "publish", 2, 4, 3.5, 3.6),
    ]


def test_a_clean_history_has_no_violations() -> None:
    """A kill-and-takeover history that keeps every rule passes."""
    assert check(clean_history()) == []


def test_two_writers_in_one_epoch_are_caught() -> None:
    """Accepted publishes from two nodes under one epoch are a violation."""
    history = [*clean_history(), op("a", "publish", 2, 5, 3.7, 3.8)]
    assert any("epoch 2 has accepted publishes from ['a', 'b']" in v for v in check(history))


def test_an_epoch_going_back_in_store_order_is_caught() -> None:
    """A higher seq accepted under a lower epoch than the seq before it is a violation."""
    history = [*clean_history(), op("c", "publish", 1, 5, 3.7, 3.8)]
    assert any("epoch went back" in v for v in check(history))


def test_a_seq_accepted_twice_is_caught() -> None:
    """Two accepted publishes of one seq are a violation."""
    history = [*clean_history(), op("b", "publish", 2, 4, 3.7, 3.8)]
    assert any("seq 4 accepted twice" in v for v in check(history))


def test_a_stale_write_accepted_after_a_takeover_is_caught() -> None:
    """A publish under epoch 1 that started after epoch 2 was acquired must not be accepted."""
    history = [
        *clean_history()[:4],
        op("b", "acquire", 2, 0, 3.0, 3.1),
        op("a", "publish", 1, 3, 3.15, 3.16),  # the zombie, after b's acquire: accepted
        op("b", "restore", 2, 3, 3.2, 3.3, "resumed", from_seq=3, next_seq=4),
        op("b", "publish", 2, 4, 3.4, 3.5),
    ]
    assert any("started after b acquired epoch 2" in v for v in check(history))


def test_a_fenced_stale_write_is_fine() -> None:
    """The same stale write, refused by the store (outcome fenced), is no violation."""
    history = [*clean_history(), op("a", "publish", 1, 3, 3.15, 3.16, "fenced")]
    assert check(history) == []


def test_resuming_behind_an_acknowledged_checkpoint_is_caught() -> None:
    """A restore from seq 1 after seq 2 was acknowledged is a violation."""
    history = clean_history()
    history[5] = op("b", "restore", 2, 1, 3.1, 3.2, "resumed", from_seq=1, next_seq=3)
    assert any("behind accepted checkpoint 2" in v for v in check(history))


def test_starting_over_from_init_after_a_checkpoint_is_caught() -> None:
    """A restore that started from init() although checkpoints were accepted is a violation."""
    history = clean_history()
    history[5] = op("b", "restore", 2, 0, 3.1, 3.2, "started", from_seq=0, next_seq=1)
    assert any("started over from init()" in v for v in check(history))


def test_a_term_not_continuing_from_its_restore_is_caught() -> None:
    """A term whose first accepted publish skips the seq its restore continues at is caught."""
    history = clean_history()
    history[6] = op("b", "publish", 2, 5, 3.3, 3.4)
    history[7] = op("b", "publish", 2, 6, 3.5, 3.6)
    assert any("continue at seq 3 but its first accepted publish is seq 5" in v
               for v in check(history))  # fmt: skip


def test_history_round_trips_through_the_file_and_the_command(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """Lines written by HistoryWriter read back, and `python -m hamsterbunker.ops.checker` judges them."""
    path = tmp_path / "history.jsonl"
    writer = HistoryWriter(path)
    writer.record("a", "acquire", 1, 0, 0.0, "ok")
    writer.record("a", "restore", 1, 0, 0.0, "started", from_seq=0, next_seq=1)
    writer.record("a", "publish", 1, 1, 0.0, "ok")
    with open(path, "a") as torn:
        torn.write('{"node": "a", "op": "pub\n')  # not a whole record: skipped
    ops = read_history(path)
    assert [o.op for o in ops] == ["acquire", "restore", "publish"]
    assert main([str(path)]) == 0
    assert "0 violations" in capsys.readouterr().out
    writer.record("b", "publish", 1, 2, 0.0, "ok")  # a second writer in epoch 1
    assert main([str(path)]) == 1
    assert "VIOLATION" in capsys.readouterr().out


def accepted_loss_history(honoured: bool) -> list[Op]:
    """a publishes 1-4 under epoch 1; 3 and 4 are lost and the loss accepted (epoch 3 written by
    hb accept-loss); b resumes from 2 under epoch 4 and publishes 3-4 again."""
    detail = {"accepted_loss": "0123abcd"} if honoured else {}
    return [
        op("a", "acquire", 1, 0, 0.0, 0.1),
        op("a", "restore", 1, 0, 0.1, 0.2, "started", from_seq=0, next_seq=1),
        *(op("a", "publish", 1, seq, seq, seq + 0.1) for seq in (1, 2, 3, 4)),
        op("b", "acquire", 4, 0, 9.0, 9.1),
        op("b", "restore", 4, 2, 9.1, 9.2, "resumed", from_seq=2, next_seq=3, **detail),
        op("b", "publish", 4, 3, 9.3, 9.4),
        op("b", "publish", 4, 4, 9.5, 9.6),
        op("c", "acquire", 5, 0, 12.0, 12.1),
        op("c", "restore", 5, 4, 12.1, 12.2, "resumed", from_seq=4, next_seq=5),
    ]


def test_a_loss_accepted_on_purpose_starts_a_new_line() -> None:
    """A restore that honoured an accepted loss may resume behind, and the line after it may
    number again from there: no violation. Without the acceptance the same history is one."""
    assert check(accepted_loss_history(honoured=True)) == []
    violations = check(accepted_loss_history(honoured=False))
    assert any("seq 3 accepted twice" in v for v in violations), violations
    assert any("behind accepted checkpoint 4" in v for v in violations), violations


def test_a_restore_after_an_accepted_loss_is_still_held_to_the_new_line() -> None:
    """After the accepted loss, a restore behind what the new line had accepted is caught."""
    history = accepted_loss_history(honoured=True)
    history[-1] = op("c", "restore", 5, 3, 12.1, 12.2, "resumed", from_seq=3, next_seq=4)
    assert any("behind accepted checkpoint 4" in v for v in check(history))


# -- effects ------------------------------------------------------------------------


def effect_history() -> list[Op]:
    """a calls two effects of step 3 and dies before its checkpoint; b replays both."""
    return [
        *clean_history()[:4],
        op("a", "effect_start", 1, 3, 0.7, 0.7, "started", key="k0", replay="safe"),
        op("a", "effect", 1, 3, 0.7, 0.8, "ok", key="k0", digest="d0"),
        op("a", "effect_start", 1, 3, 0.9, 0.9, "started", key="k1", replay="interrupted"),
        op("b", "acquire", 2, 0, 3.0, 3.1),
        op("b", "restore", 2, 2, 3.1, 3.2, "resumed", from_seq=2, next_seq=3),
        op("b", "effect", 2, 3, 3.3, 3.3, "replayed", key="k0", digest="d0"),
        op("b", "effect", 2, 3, 3.3, 3.3, "interrupted", key="k1"),
        op("b", "publish", 2, 3, 3.4, 3.5),
    ]


def test_a_clean_replay_of_effects_has_no_violations() -> None:
    """Recorded outcomes replayed as recorded, an interrupted effect reported, not called."""
    assert check(effect_history()) == []


def test_an_interrupted_effect_called_twice_is_caught() -> None:
    """A second call of an interrupted effect's key is a violation."""
    again = op("b", "effect_start", 2, 3, 3.3, 3.3, "started", key="k1", replay="interrupted")
    assert any("interrupted effect k1 was called 2 times" in v
               for v in check([*effect_history(), again]))  # fmt: skip


def test_a_recorded_effect_called_again_is_caught() -> None:
    """Calling an effect whose outcome was recorded is a violation (a safe one too)."""
    again = op("b", "effect_start", 2, 3, 3.3, 3.3, "started", key="k0", replay="safe")
    assert any("effect k0 was called again by b" in v for v in check([*effect_history(), again]))


def test_a_safe_effect_called_again_before_its_record_is_fine() -> None:
    """A safe effect whose outcome was never recorded may be called again on replay."""
    history = [o for o in effect_history() if not (o.op == "effect" and o.outcome == "ok")]
    history = [o for o in history if o.outcome != "replayed"]
    again = op("b", "effect_start", 2, 3, 3.3, 3.3, "started", key="k0", replay="safe")
    assert check([*history, again]) == []


def test_a_replay_with_another_outcome_is_caught() -> None:
    """A replay whose outcome digest differs from the recorded one is a violation."""
    history = [
        replace(o, detail={**o.detail, "digest": "other"}) if o.outcome == "replayed" else o
        for o in effect_history()
    ]
    assert any("replayed effect k0 with another outcome" in v for v in check(history))


def test_an_effect_called_after_a_later_epoch_was_acquired_is_caught() -> None:
    """An effect started under epoch 1 after epoch 2 was acquired is a violation."""
    late = op("a", "effect_start", 1, 3, 3.2, 3.2, "started", key="k9", replay="safe")
    assert any("called effect k9 under epoch 1 after b acquired epoch 2" in v
               for v in check([*effect_history(), late]))  # fmt: skip


def inbox_history() -> list[Op]:
    """a consumes #1 with seq 2 and dies before seq 3 (consuming #2) is accepted; b's replay
    of seq 3 consumes #2."""
    history = clean_history()
    history[3] = replace(history[3], detail={"consumed": [1]})
    return [*history[:4], op("a", "publish", 1, 3, 0.7, 0.8, "failed", consumed=[2]),
            *history[4:6], replace(history[6], detail={"consumed": [2]}), *history[7:]]  # fmt: skip


def test_consumption_once_per_submission_is_clean() -> None:
    """A failed publish's consumption repeated by the next leader is not a violation."""
    assert check(inbox_history()) == []


def test_a_submission_consumed_by_two_accepted_checkpoints_is_caught() -> None:
    history = inbox_history()
    history[-1] = replace(history[-1], detail={"consumed": [1, 5]})
    assert any("submission #1 was consumed twice: by seq 2 (a) and by seq 4 (b)" in v
               for v in check(history))  # fmt: skip
