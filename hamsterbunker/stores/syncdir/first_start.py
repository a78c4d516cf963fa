"""The first start on a syncdir folder: which node creates the cluster record
(docs/syncdir.md, "The first start").

Each machine has its own copy of the folder, so two nodes that each create the record
leave a sync conflict. A node that may create it announces so in its own subtree
(``nodes/NODE/first-start``, unless another node announced first), waits twice the sync
delay for the other announcements to arrive, and creates the record only if its id sorts
first among the announcers; every other node waits for the sync to bring the record. A
wait is a StoreUnavailable, which a node's start tries again; nothing here sleeps.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Iterable
from pathlib import Path

from ...core.errors import StoreUnavailable
from .layout import MAX_WALKED, NODES, is_sync_file, node_entries
from .root import create_once

__all__ = ["ANNOUNCEMENT", "FirstStart", "being_synced"]

ANNOUNCEMENT = "first-start"  # nodes/NODE/first-start: NODE may create the cluster record
ANNOUNCEMENT_TEXT = b"hamsterbunker: this node may create the cluster record\n"
# What a node's subtree may hold before its node wrote a record (temp files aside).
_NOT_RECORDS = (ANNOUNCEMENT, ".lock", ".redo")


def being_synced(root: Path) -> bool:
    """Whether the folder shows a sync at work before a node opens it: Syncthing's
    ``.stfolder``, or a node's subtree (a folder with neither is taken for a typo)."""
    return (root / ".stfolder").exists() or bool(node_entries(root))


def announced(root: Path, node: str) -> bool:
    """Whether node's subtree holds its first-start announcement (a regular file: its
    bytes say nothing more)."""
    try:
        return stat.S_ISREG(os.lstat(root / NODES / node / ANNOUNCEMENT).st_mode)
    except OSError:
        return False


def holds_records(root: Path, node: str) -> bool:
    """Whether node's subtree holds any file its node wrote once the cluster record was
    there (a lease, a heartbeat, an event...): then a cluster exists on its machine."""
    budget = MAX_WALKED
    for _folder, dirs, files in os.walk(root / NODES / node):
        for name in files:
            temp = name.startswith("tmp-hb-") or is_sync_file(name)
            if name not in _NOT_RECORDS and not temp:
                return True
        budget -= len(dirs) + len(files)
        if budget <= 0:
            return True  # that much is no empty subtree
        dirs[:] = [d for d in dirs if not is_sync_file(d)]
    return False


def _shown(nodes: list[str]) -> str:
    listed = ", ".join(nodes[:5]) + (", ..." if len(nodes) > 5 else "")
    return f"node {listed}" if len(nodes) == 1 else f"nodes {listed}"


class FirstStart:
    """One node's part in settling who creates the cluster record (see the module)."""

    def __init__(self, root: Path, node: str, wait_s: float) -> None:
        """wait_s: how long after announcing the node waits for other announcements."""
        self._root, self._node, self._wait_s = root, node, wait_s
        self._announced_at: float | None = None  # time.monotonic(): this process's clock

    def settle(self, peers: Iterable[str]) -> None:
        """Return if this node creates the cluster record now; else StoreUnavailable saying
        what it waits for. peers: the other nodes' subtrees in this copy of the folder."""
        others = sorted(peers)
        working = [node for node in others if holds_records(self._root, node)]
        if working:
            raise StoreUnavailable(
                f"{self._root} holds the records of {_shown(working)} but no cluster "
                "record yet: waiting for the sync to bring it rather than create a second one "
                "(which would leave a sync conflict)"
            )
        announcers = [node for node in others if announced(self._root, node)]
        if self._announced_at is None:
            # A node that sees another's announcement before its own stays out: so every
            # announcer announced within a sync delay of the others, and sees them all in
            # twice that. Its own, from an earlier start, keeps it in.
            if announcers and not announced(self._root, self._node):
                raise self._waiting_for(announcers[0])
            create_once(self._root, ANNOUNCEMENT, ANNOUNCEMENT_TEXT, (NODES, self._node))
            self._announced_at = time.monotonic()
        left = self._wait_s - (time.monotonic() - self._announced_at)
        if left > 0:
            raise StoreUnavailable(
                f"no cluster record in {self._root} yet: node {self._node} announced it may "
                f"create one ({NODES}/{self._node}/{ANNOUNCEMENT}) and waits {left:.1f} s more "
                "for other nodes starting on this folder at the same time to show"
            )
        first = min([*announcers, self._node])
        if first != self._node:
            raise self._waiting_for(first)

    def _waiting_for(self, node: str) -> StoreUnavailable:
        return StoreUnavailable(
            f"no cluster record in {self._root} yet: node {node} creates it (the first by id of "
            "the nodes that announced a first start); waiting for the sync to bring it (if "
            f"node {node} will never start, remove {NODES}/{node}/{ANNOUNCEMENT} from the folder)"
        )
