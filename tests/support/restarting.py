"""Node runtimes of one test, kept by id, restarted and checked alive: the fuzz modules' part.

Each node is kept with the store client it was given, which counts the node's
heartbeat writes (``beats``): proof that its loop goes on.
"""

from __future__ import annotations

import contextlib
from typing import Protocol

import pytest

from hamsterbunker.core.errors import NoUsableCheckpoint
from hamsterbunker.runtime import Runtime
from tests.support import wait_until

__all__ = ["BeatCounting", "RestartingNodes"]


class BeatCounting(Protocol):
    beats: int

    def close(self) -> None: ...


class RestartingNodes:
    """What a test keeps of its nodes (``start`` is the test's own)."""

    def __init__(self) -> None:
        self.nodes: dict[str, tuple[Runtime, BeatCounting]] = {}
        self.restarts = 0

    def start(self, node_id: str) -> None:
        raise NotImplementedError

    def restart(self, node_id: str) -> None:
        """Stop the node (with the stop grace it was started with) and start it again."""
        node, counter = self.nodes.pop(node_id)
        with contextlib.suppress(NoUsableCheckpoint):  # a refusal is checked when it happens
            node.stop(timeout=20)
        counter.close()
        self.restarts += 1
        self.start(node_id)

    def assert_alive(self) -> None:
        """Every node writes two more heartbeats, or ended by refusing to resume."""
        before = {node_id: counter.beats for node_id, (_node, counter) in self.nodes.items()}

        def settled() -> bool:
            return all(
                node.stopped.is_set() or counter.beats >= before[node_id] + 2
                for node_id, (node, counter) in self.nodes.items()
            )

        wait_until(settled, "every node to write heartbeats (or to have refused)", timeout=15)
        for node, _counter in self.nodes.values():
            if node.stopped.is_set():
                with pytest.raises(NoUsableCheckpoint):
                    node.stop()
