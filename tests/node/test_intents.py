"""The intents a node began, kept in its state directory (hamsterbunker.agent.intents)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hamsterbunker.agent.intents import BegunIntent, IntentLog
from hamsterbunker.core.errors import ConfigError


def test_an_intent_outlives_the_node_that_kept_it(tmp_path: Path) -> None:
    """An intent added is read back by a new IntentLog on the same file (a restart)."""
    path = tmp_path / "state" / "agent.intents"
    IntentLog(path).add(BegunIntent(seq=3, index=1, name="pay", epoch=2, order=5, attempt=1))
    assert IntentLog(path).of_step(3) == [BegunIntent(3, 1, "pay", 2, 5, 1)]
    assert IntentLog(path).of_step(4) == []


def test_only_the_newest_step_and_the_newest_intent_per_number_are_kept(tmp_path: Path) -> None:
    """Adding an intent lets go of other steps' intents and of an older one at its number."""
    log = IntentLog(tmp_path / "agent.intents")
    log.add(BegunIntent(3, 0, "pay", 2, 1, 1))
    log.add(BegunIntent(4, 0, "pay", 2, 2, 1))
    log.add(BegunIntent(4, 1, "mail", 2, 3, 1))
    log.add(BegunIntent(4, 1, "send", 2, 4, 1))
    assert IntentLog(tmp_path / "agent.intents").of_step(3) == []
    assert log.of_step(4) == [BegunIntent(4, 0, "pay", 2, 2, 1), BegunIntent(4, 1, "send", 2, 4, 1)]


def test_a_record_of_another_name_at_the_number_supersedes_an_intent(tmp_path: Path) -> None:
    """supersede forgets an intent at (seq, index) only if the new record names another
    effect; stale says whether there is one to forget."""
    log = IntentLog(tmp_path / "agent.intents")
    log.add(BegunIntent(4, 1, "pay", 2, 1, 1))
    assert not log.stale(4, 1, "pay") and log.stale(4, 1, "fallback")
    log.supersede(4, 1, "pay")
    assert log.of_step(4) == [BegunIntent(4, 1, "pay", 2, 1, 1)]
    log.supersede(4, 1, "fallback")
    assert log.of_step(4) == [] and IntentLog(tmp_path / "agent.intents").of_step(4) == []


def test_without_a_file_intents_are_kept_in_memory() -> None:
    """With no state directory the log keeps intents while the node runs."""
    log = IntentLog()
    log.add(BegunIntent(1, 0, "pay", 1, 1, 1))
    assert log.of_step(1) == [BegunIntent(1, 0, "pay", 1, 1, 1)]


@pytest.mark.parametrize(
    "content",
    [b"{", b'{"format": 9, "intents": []}', b'{"format": 1, "intents": [{"seq": -1}]}',
     b'{"format": 1, "intents": [{"seq": 1, "index": 0, "name": "x", "epoch": 1, '
     b'"order": "1", "attempt": 1}]}', b" " * 400_000],
    ids=["torn", "format", "fields", "types", "huge"],
)  # fmt: skip
def test_a_damaged_file_is_a_config_error_naming_it(tmp_path: Path, content: bytes) -> None:
    """A file that does not parse as intents stops the node with one line naming it."""
    path = tmp_path / "agent.intents"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=r"agent\.intents are damaged"):
        IntentLog(path)
