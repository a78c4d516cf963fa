"""Every node's subtree of a syncdir folder, each a record-layer store over a file backend
with retention by epoch: this node's written as a file store writes, every other
node's opened ``read_only`` (nothing written there, no lock taken, its redo log left
alone: docs/syncdir.md, "Layout"). A subtree in the earlier layout is refused.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

from ...core.errors import ConfigError, CorruptRecord, StoreError
from ...records import check_record_name
from .._reported import ReportedOnce
from ..backends.earlier import earlier_store
from ..backends.file import FileBackend, earlier_layout
from ..layer import RecordStore
from .layout import NODES, is_sync_file, node_entries, os_errors

__all__ = ["Subtrees", "refuse_earlier_subtrees"]

R = TypeVar("R")


def _earlier_subtree(root: Path, node: str) -> ConfigError | None:
    """The refusal of node's subtree if it is in the earlier layout, else None."""
    found = earlier_layout(root / NODES / node)
    if found is None:
        return None
    return earlier_store(f"syncdir store {root}", f"the subtree of node {node} has {found}")


@os_errors
def refuse_earlier_subtrees(root: Path) -> None:
    """ConfigError if any node's subtree under root is in the earlier layout."""
    for name in sorted(node_entries(root)):
        refusal = None if is_sync_file(name) else _earlier_subtree(root, name)
        if refusal is not None:
            raise refusal


class Subtrees:
    """One syncdir store's subtrees: its own (``mine``, None if it has none) and the others,
    opened to read as they appear under ``nodes/`` (listed on each call, the stores cached)."""

    def __init__(
        self,
        root: Path,
        node: str,
        problems: ReportedOnce,
        store: Callable[[FileBackend], RecordStore],
        *,
        create: bool,
        lock_timeout: float,
    ) -> None:
        """store: the record store a subtree's backend is read and written by."""
        self._root, self._node, self._problems = root, node, problems
        self._store, self._lock_timeout = store, lock_timeout
        self._peers: dict[str, RecordStore] = {}
        self._peers_lock = threading.Lock()
        own = root / NODES / node
        self.mine: RecordStore | None = None
        if create or (node and own.is_dir()):
            self.mine = self._open(own, create=create, read_only=False)

    def _open(self, where: Path, *, create: bool = False, read_only: bool = True) -> RecordStore:
        backend = FileBackend(
            where,
            create=create,
            lock_timeout=self._lock_timeout,
            in_synced_folder=True,
            read_only=read_only,
        )
        return self._store(backend)

    def all(self) -> dict[str, RecordStore]:
        """Every node's subtree, this node's included (if it has one), by node id."""
        found = dict(self.peers())
        if self.mine is not None:
            found[self._node] = self.mine
        return dict(sorted(found.items()))

    @os_errors
    def peers(self) -> dict[str, RecordStore]:
        """Every other node's subtree, by node id: junk under ``nodes/`` reported, skipped."""
        found: dict[str, RecordStore] = {}
        for name, is_dir in sorted(node_entries(self._root).items()):
            if name == self._node or is_sync_file(name):
                continue
            store = self._peer(name, is_dir)
            if store is not None:
                found[name] = store
        return found

    def _peer(self, name: str, is_dir: bool) -> RecordStore | None:
        where = self._root / NODES / name
        try:
            check_record_name(name)
        except CorruptRecord:
            self._problems(f"{where} is not named by a node id: skipped")
            return None
        if not is_dir:
            self._problems(f"{where} is not a directory (a symlink or a file): skipped")
            return None
        with self._peers_lock:
            store = self._peers.get(name)
        if store is not None:
            return store
        refusal = _earlier_subtree(self._root, name)
        if refusal is not None:  # brought since the store was opened
            raise StoreError(str(refusal))
        try:
            store = self._open(where)
        except ConfigError as exc:  # gone since the listing, or made unreadable
            self._problems(f"subtree of node {name} skipped: {exc}")
            return None
        with self._peers_lock:
            return self._peers.setdefault(name, store)

    def each(
        self,
        what: str,
        read: Callable[[RecordStore], R],
        subtrees: Mapping[str, RecordStore] | None = None,
    ) -> dict[str, R]:
        """read of each subtree (node -> result), of every one unless subtrees are given;
        one that is junk is reported and left out."""
        results: dict[str, R] = {}
        for node, store in (self.all() if subtrees is None else subtrees).items():
            try:
                results[node] = read(store)
            except CorruptRecord as exc:
                self._problems(f"{what} of node {node} skipped: {exc}")
        return results

    def close(self) -> None:
        for store in self.all().values():
            store.close()
