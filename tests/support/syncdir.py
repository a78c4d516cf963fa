"""Plays the sync tool between plain local folders, one per node, for syncdir tests.

Each node has a folder of its own (a machine's copy of the synced folder);
``Sync.copy`` copies one node's subtree (and the root's records, once) from
that node's folder to another, file by file, through a temporary name and a
rename, and remembers what it copied, so a test can check that nothing of
another node was ever written but by the copy. ``SyncPump`` runs copies both
ways in a thread, as a sync tool that works does.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
from pathlib import Path

from hamsterbunker.stores.syncdir import SyncDirStore
from hamsterbunker.stores.syncdir.layout import MARKER

__all__ = ["DELAY_MS", "Sync", "SyncPump"]

DELAY_MS = 1000


class Sync:
    """The sync tool between the folders of this test: each node's folder by node id."""

    def __init__(self, base: Path, delay_ms: int = DELAY_MS) -> None:
        self.base = base
        self.delay_ms = delay_ms  # what the stores it opens are told the sync delay is
        self.copied: dict[Path, bytes] = {}  # every file a copy wrote, as it wrote it
        # Files whose path in their subtree holds one of these is held back: not copied until
        # taken out of here (as a sync tool may bring a small file before a large one
        # written earlier).
        self.held_back: set[str] = set()
        self._lock = threading.Lock()  # one copy at a time (a pump's thread and the test's)

    def root(self, node: str) -> Path:
        return self.base / f"machine-{node}"

    def open(self, node: str, **options: object) -> SyncDirStore:
        """node's store on its folder; a first start creates the cluster record at once
        unless first_start_wait_ms is given (the first start's own tests give it)."""
        options.setdefault("first_start_wait_ms", 0)
        return SyncDirStore(self.root(node), node, sync_delay_ms=self.delay_ms, **options)  # type: ignore[arg-type]

    def copy(self, node: str, to: str) -> None:
        """Bring node's subtree (as on node's machine) and the root's records to machine to."""
        with self._lock:
            self._copy(node, to)

    def _copy(self, node: str, to: str) -> None:
        src, dst = self.root(node), self.root(to)
        for name in (MARKER, "cluster.json"):
            if (src / name).is_file():
                if not (dst / name).exists():
                    self._copy_file(src / name, dst / name)
                elif (dst / name).read_bytes() != (src / name).read_bytes():
                    # Two first starts: Syncthing keeps one and renames the other.
                    self._copy_file(src / name, dst / f"cluster.sync-conflict-20260101-{node}.json")
        mine, theirs = src / "nodes" / node, dst / "nodes" / node
        wanted = set()
        for folder, _dirs, names in os.walk(mine):
            for name in names:
                if name.startswith("tmp-hb-"):
                    continue  # a write in flight: the tool waits for it to settle
                path = Path(folder, name)
                if path.is_symlink() or not path.is_file():
                    continue
                target = theirs / path.relative_to(mine)
                if any(held in path.relative_to(mine).as_posix() for held in self.held_back):
                    wanted.add(target)
                    continue
                try:
                    if not target.exists() or target.read_bytes() != path.read_bytes():
                        self._copy_file(path, target)
                except FileNotFoundError:
                    continue  # removed at the source since the walk (a retention): not wanted
                wanted.add(target)
        for folder, _dirs, names in os.walk(theirs):  # removed at the source: removed here
            for name in names:
                path = Path(folder, name)
                if path not in wanted:
                    path.unlink()

    def _copy_file(self, src: Path, dst: Path) -> None:
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = dst.parent / f".syncthing.{dst.name}.tmp"
        shutil.copyfile(src, tmp)
        os.replace(tmp, dst)
        self.copied[dst] = dst.read_bytes()

    def both_ways(self, one: str, other: str) -> None:
        self.copy(one, other)
        self.copy(other, one)

    def assert_only_copies_of_others(self, node: str) -> None:
        """Every file under another node's subtree in node's folder is one the sync copied,
        as it copied it; nothing at the root but the marker, the cluster record and nodes/."""
        root = self.root(node)
        for path in sorted(root.rglob("*")):
            rel = path.relative_to(root)
            if len(rel.parts) == 1:
                assert rel.name in {MARKER, "cluster.json", "nodes"} or "sync-conflict" in rel.name
            if len(rel.parts) < 3 or rel.parts[0] != "nodes" or rel.parts[1] == node:
                continue
            if path.is_dir() and not path.is_symlink():
                continue
            assert path in self.copied, f"{rel} in {node}'s folder was not copied by the sync"
            assert path.read_bytes() == self.copied[path], f"{rel} was changed after the copy"


class SyncPump:
    """Copies every pair of nodes' subtrees both ways every period_s, in a thread, until
    stopped: the sync tool at work (``with SyncPump(sync, "n1", "n2"):``)."""

    def __init__(self, sync: Sync, *nodes: str, period_s: float = 0.05) -> None:
        self._sync, self._nodes, self._period_s = sync, nodes, period_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sync-pump", daemon=True)
        self.rounds = 0

    def _run(self) -> None:
        while not self._stop.wait(self._period_s):
            for node in self._nodes:
                for other in self._nodes:
                    if other != node and self._sync.root(node).is_dir():
                        # A file removed mid-copy (pruned) is copied on the next round.
                        with contextlib.suppress(FileNotFoundError):
                            self._sync.copy(node, other)
            self.rounds += 1

    def __enter__(self) -> SyncPump:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
