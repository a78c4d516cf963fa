"""The file backend as a syncdir node's subtree: opened in a synced folder, and read-only.

Another node's subtree is that machine's files, brought by a sync tool: a
backend opened ``read_only`` reads them with no lock and writes nothing at all
(no ``kv/``, no lock file, no redo log finished or set aside, no temp file
swept). A plain file store in a synced folder stays refused; a syncdir
subtree (``in_synced_folder``) is not.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from hamsterbunker.core.errors import StoreError, StoreUnsafe
from hamsterbunker.core.limits import STALE_TEMP_AGE_S
from hamsterbunker.core.read_bounds import ReadBound
from hamsterbunker.stores.backend import Compare, Get, Put, Scan, ScanResult, Txn
from hamsterbunker.stores.backends.file import FileBackend
from hamsterbunker.stores.backends.file_redo import encode, write_log

WIDE = ReadBound(100, 1024, 100 * 1024)


def snapshot(root: Path) -> dict[str, tuple[int, bytes | None, int]]:
    """Every path under root: its mode, its bytes (files), its mtime (ns)."""
    found = {}
    for path in sorted(root.rglob("*")):
        info = path.lstat()
        data = path.read_bytes() if path.is_file() and not path.is_symlink() else None
        found[str(path.relative_to(root))] = (info.st_mode, data, info.st_mtime_ns)
    return found


def test_a_read_only_backend_reads_and_writes_nothing_not_even_a_lock(tmp_path: Path) -> None:
    """Keys written by a writer are read back by a read-only backend (get, scan, a commit's
    compares and reads); a redo log a crash left, a stale temp file and the missing lock
    file are left as they are; a commit that writes is refused."""
    root = tmp_path / "peer"
    writer = FileBackend(root)
    assert writer.commit(Txn(writes=[Put("a/1", b"one"), Put("a/2", b"two")])).succeeded
    (root / ".lock").unlink()
    folder = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        write_log(folder, root, encode([("a/3", b"three")]))  # a crash left it
    finally:
        os.close(folder)
    stale = root / "tmp-hb-0123456789abcdef"
    stale.write_bytes(b"a write a crash cut short")
    old = time.time() - 10 * STALE_TEMP_AGE_S
    os.utime(stale, (old, old))
    before = snapshot(root)

    reader = FileBackend(root, create=False, read_only=True, in_synced_folder=True)
    assert reader.get("a/1", 100) == b"one"
    assert reader.get("a/3", 100) is None  # the redo log is not finished here
    assert [key for key, _ in reader.scan("a/", WIDE).items] == ["a/1", "a/2"]
    result = reader.commit(
        Txn(compares=[Compare("a/1", b"one")], reads=[Get("a/2", 100), Scan("a/", WIDE)])
    )
    assert result.succeeded and result.reads[0] == b"two"
    assert not reader.commit(Txn(compares=[Compare("a/1", b"other")])).succeeded
    with pytest.raises(StoreError, match="opened to read"):
        reader.commit(Txn(writes=[Put("a/9", b"nine")]))
    assert snapshot(root) == before

    FileBackend(root)  # a writer's open finishes the log: what the reader left alone
    assert writer.get("a/3", 100) == b"three"


def test_a_read_only_backend_on_a_subtree_with_no_keys_yet_reads_none(tmp_path: Path) -> None:
    """A subtree the sync has brought no keys of yet reads as empty, and stays empty."""
    root = tmp_path / "peer"
    root.mkdir()
    reader = FileBackend(root, create=False, read_only=True)
    assert reader.get("a/1", 100) is None
    assert reader.scan("a/", WIDE) == ScanResult()
    assert reader.commit(Txn(compares=[Compare("a/1", None)], reads=[Get("a/1", 9)])).reads == [
        None
    ]
    assert list(root.iterdir()) == []
    with pytest.raises(ValueError, match="creates nothing"):
        FileBackend(root, create=True, read_only=True)


def test_a_synced_folder_is_refused_but_to_a_syncdir_subtree(tmp_path: Path) -> None:
    """In a folder Syncthing keeps (.stfolder) a file store is refused; a syncdir node's
    subtree (in_synced_folder) opens there."""
    (tmp_path / ".stfolder").mkdir()
    with pytest.raises(StoreUnsafe, match="synced folder"):
        FileBackend(tmp_path / "store")
    assert not (tmp_path / "store" / "kv").exists()
    subtree = FileBackend(tmp_path / "store", in_synced_folder=True)
    assert subtree.commit(Txn(writes=[Put("k", b"v")])).succeeded
