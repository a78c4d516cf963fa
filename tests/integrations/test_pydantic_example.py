"""examples/pydantic_assistant.py, offline (its FunctionModel: no key, no network), in a
running node in-process on a MemoryStore: questions submitted with ``Client`` are
answered with its tools' results, and each run's model requests and tool calls are
journaled effects."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from hamsterbunker import Client, LeaseTiming, Runtime, current_effect
from hamsterbunker.testing import MemoryStore
from tests.support.agents import SECRET, Recorder

EXAMPLE = Path(__file__).parents[2] / "examples" / "pydantic_assistant.py"
TIMING = LeaseTiming(tick_ms=50, lease_ttl_ms=300)
WAIT_S = 20.0


@pytest.fixture
def example(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """The example module, loaded from its file (examples/ is no package), offline."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    spec = importlib.util.spec_from_file_location("pydantic_assistant", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]


def test_the_example_assistant_answers_submitted_questions_offline(example: ModuleType) -> None:
    store, events = MemoryStore(), Recorder()
    assistant = example.Assistant()
    node = Runtime(node_id="a", region="r", store=store, agent=assistant, secret=SECRET,
                   timing=TIMING, stop_grace_ms=0, on_event=events)  # fmt: skip
    node.start()
    try:
        with Client(store, SECRET) as client:
            client.submit("assistant", "what is (17 + 25) * 3, and what is a lease?", "q1")
            client.submit("assistant", {"q": "and 10 / 4?"}, "q2")
            first = client.result("assistant", "q1", timeout=WAIT_S)
            second = client.result("assistant", "q2", timeout=WAIT_S)
    finally:
        node.stop()
    assert first == {
        "answer": f"(17 + 25) * 3 is 126; a lease is {example.FACTS['lease']}.",
        "answered_by": "a",
    }
    assert second == {"answer": "10 / 4 is 2.5.", "answered_by": "a"}
    assert events.of("agent.failing") == []


class Facts(dict[str, str]):
    """The example's FACTS, noting the effect each lookup runs in."""

    def __init__(self, facts: dict[str, str], seen: list[tuple[int, str] | None]) -> None:
        super().__init__(facts)
        self.seen = seen

    def get(self, key: str, default: Any = None) -> Any:
        effect = current_effect()
        self.seen.append((effect.index, effect.name) if effect else None)
        return super().get(key, default)


def test_the_example_runs_each_model_request_and_tool_call_as_an_effect(
    example: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[int, str] | None] = []  # the effect each request and lookup ran in
    offline = example.offline_model

    def model(messages: Any, info: Any) -> Any:
        effect = current_effect()
        seen.append((effect.index, effect.name) if effect else None)
        return offline(messages, info)

    monkeypatch.setattr(example, "offline_model", model)
    monkeypatch.setattr(example, "FACTS", Facts(example.FACTS, seen))
    store = MemoryStore()
    node = Runtime(node_id="a", region="r", store=store, agent=example.Assistant(),
                   secret=SECRET, timing=TIMING, stop_grace_ms=0)  # fmt: skip
    node.start()
    try:
        with Client(store, SECRET) as client:
            client.submit("assistant", "what is an inbox?", "q1")
            answer = client.result("assistant", "q1", timeout=WAIT_S)["answer"]
    finally:
        node.stop()
    assert answer == f"an inbox is {example.FACTS['inbox']}."
    # Two model requests and the lookup between them, each inside an effect of its own.
    assert len(seen) == 3 and all(seen) and len(set(seen)) == 3, seen
    names = [name.rpartition(".")[2] for _index, name in filter(None, seen)]
    assert names == ["request", "call_tool:lookup", "request"], seen
