"""put_checkpoint with a blob in pieces (``hamsterbunker.core.blob``), on every backend: what is
stored is exactly the joined bytes, and a blob whose making fails stores nothing."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from hamsterbunker.core.blob import BlobPieces
from hamsterbunker.core.errors import StoreError
from hamsterbunker.core.limits import MAX_CHECKPOINT_BYTES
from hamsterbunker.records import LeaseRecord
from hamsterbunker.stores.base import Fence
from hamsterbunker.stores.interface import Store

from .conftest import Opener

KIB = 1024
# Pieces as a seal makes them: a prefix, whole MiB-ish pieces and a short last one, a tag.
PIECES = [b"HBCP-prefix", os.urandom(300 * KIB), os.urandom(300 * KIB), b"short", b"t" * 16]
TMP_PREFIX = "tmp-hb-"


class Boom(Exception):
    """What a blob's maker raised midway."""


def held(store: Store, agent: str = "a") -> Fence:
    record = store.cas_lease(
        agent, None, LeaseRecord(holder="n1", region="eu", session="s1", epoch=2, ttl_ms=2000)
    )
    return Fence(holder="n1", session="s1", epoch=record.epoch)


def in_pieces(pieces: list[bytes]) -> BlobPieces:
    return BlobPieces(sum(len(p) for p in pieces), iter(pieces))


def failing_midway(pieces: list[bytes]) -> BlobPieces:
    def made() -> Iterator[bytes]:
        yield from pieces[:2]
        raise Boom("the encryption failed")

    return BlobPieces(sum(len(p) for p in pieces), made())


def temp_files(tmp_path: Path) -> list[Path]:
    return [path for path in tmp_path.rglob(f"{TMP_PREFIX}*") if path.is_file()]


def test_pieces_are_stored_as_their_joined_bytes(store: Store, open_second: Opener) -> None:
    """A checkpoint put in pieces reads back, from another client, as the pieces joined."""
    fence = held(store)
    info = store.put_checkpoint("a", fence, 1, in_pieces(PIECES))
    joined = b"".join(PIECES)
    assert (info.epoch, info.seq, info.size) == (2, 1, len(joined))
    other = open_second()
    [listed] = other.list_checkpoints("a")
    assert listed.size == len(joined)
    assert other.read_checkpoint("a", listed) == joined


def test_a_blob_whose_making_fails_stores_nothing(store: Store, tmp_path: Path) -> None:
    """The maker's exception comes out; no checkpoint and no temporary file is left; the
    next put of the same seq is stored."""
    fence = held(store)
    with pytest.raises(Boom):
        store.put_checkpoint("a", fence, 1, failing_midway(PIECES))
    assert store.list_checkpoints("a") == []
    assert temp_files(tmp_path) == []
    store.put_checkpoint("a", fence, 1, in_pieces(PIECES))
    [info] = store.list_checkpoints("a")
    assert store.read_checkpoint("a", info) == b"".join(PIECES)
    assert temp_files(tmp_path) == []


def test_pieces_short_of_their_length_store_nothing(store: Store, tmp_path: Path) -> None:
    """Pieces that do not add up to the length given: ValueError, nothing stored."""
    fence = held(store)
    blob = BlobPieces(len(b"".join(PIECES)) + 1, iter(PIECES))
    with pytest.raises(ValueError):
        store.put_checkpoint("a", fence, 1, blob)
    assert store.list_checkpoints("a") == []
    assert temp_files(tmp_path) == []


def test_pieces_over_the_size_bound_are_refused_before_any_is_made(store: Store) -> None:
    """A length over MAX_CHECKPOINT_BYTES is refused (StoreError) before a piece is made."""
    fence = held(store)
    made: list[int] = []

    def never() -> Iterator[bytes]:
        made.append(1)
        yield b"x"

    with pytest.raises(StoreError, match="checkpoint"):
        store.put_checkpoint("a", fence, 1, BlobPieces(MAX_CHECKPOINT_BYTES + 1, never()))
    assert made == []
    assert store.list_checkpoints("a") == []
