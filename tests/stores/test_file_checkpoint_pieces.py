"""The file store writes a checkpoint in pieces as the pieces are made (``hamsterbunker.core.blob``):
each is in the temporary file before the next is made, and the commit comes after the last."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from hamsterbunker.core.blob import BlobPieces
from hamsterbunker.records import LeaseRecord
from hamsterbunker.stores.base import Fence
from hamsterbunker.stores.layer.files import FileStore

KIB = 1024
PIECES = [b"prefix", os.urandom(512 * KIB), os.urandom(512 * KIB), b"tag"]


def test_each_piece_is_written_before_the_next_is_made(tmp_path: Path) -> None:
    """When a piece is asked for, the temporary file holds all before it, and no checkpoint
    is listed yet; once the last is made, the checkpoint is the pieces joined."""
    store = FileStore(tmp_path / "store")
    record = store.cas_lease(
        "a", None, LeaseRecord(holder="n1", region="eu", session="s1", epoch=1, ttl_ms=2000)
    )
    fence = Fence(holder="n1", session="s1", epoch=record.epoch)
    temps = tmp_path / "store"  # the file backend writes its temp files in the root
    seen: list[int] = []

    def made() -> Iterator[bytes]:
        for piece in PIECES:
            [temp] = list(temps.glob("tmp-hb-*")) or [None]
            seen.append(-1 if temp is None else temp.stat().st_size)
            assert store.list_checkpoints("a") == []
            yield piece

    store.put_checkpoint("a", fence, 1, BlobPieces(sum(map(len, PIECES)), made()))
    sizes = [len(piece) for piece in PIECES]
    assert seen == [sum(sizes[:i]) for i in range(len(PIECES))]
    [info] = store.list_checkpoints("a")
    assert store.read_checkpoint("a", info) == b"".join(PIECES)
    assert list(temps.glob("tmp-hb-*")) == []
    store.close()
