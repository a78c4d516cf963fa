"""Sealing in pieces (``Sealer.seal_pieces``): the same checkpoint format as ``seal``, made
piece by piece as a store takes the pieces (``hamsterbunker.core.blob``)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from hamsterbunker.core.blob import BlobPieces
from hamsterbunker.core.errors import SealError, Tampered
from hamsterbunker.records import ClusterRecord
from hamsterbunker.sealing import Sealer, gcm_pieces, new_cluster_record

SECRET = "correct horse battery staple"
AGENT, EPOCH, SEQ = "agent-1", 3, 17
MIB = 1024 * 1024
# One piece (below the one-shot bound), and several (3.5 MiB: three whole pieces and a part).
SIZES = [10, 3 * MIB + MIB // 2]


@pytest.fixture(scope="module")
def cluster() -> ClusterRecord:
    return new_cluster_record(SECRET)


@pytest.fixture(scope="module")
def sealer(cluster: ClusterRecord) -> Sealer:
    return Sealer(SECRET, cluster)


def state_of(size: int) -> dict[str, Any]:
    return {"data": "x" * size, "n": 7}


@pytest.mark.parametrize("size", [0, 1, 15, 16, 17, MIB - 1, MIB, MIB + 1, 2 * MIB + 5])
@pytest.mark.parametrize("piece", [1000, 4096, MIB])  # pieces of whole GCM blocks or not
def test_gcm_in_pieces_is_one_shot_gcm(size: int, piece: int) -> None:
    """The streaming GCM's ciphertext pieces and tag join to AESGCM.encrypt's bytes."""
    key, nonce, plaintext = os.urandom(32), os.urandom(12), os.urandom(size)
    joined = b"".join(gcm_pieces(key, nonce, plaintext, b"associated", piece))
    assert joined == AESGCM(key).encrypt(nonce, plaintext, b"associated")


@pytest.mark.parametrize("size", SIZES)
def test_pieces_join_to_what_seal_gives(
    sealer: Sealer, size: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the same time and nonce, the pieces join to exactly seal()'s bytes."""
    monkeypatch.setattr(time, "time", lambda: 1_800_000_000.25)
    monkeypatch.setattr(os, "urandom", lambda n: bytes(range(n)))
    state = state_of(size)
    blob = sealer.seal_pieces(AGENT, EPOCH, SEQ, state)
    length = len(blob)
    joined = bytes(blob)
    assert len(joined) == length
    assert joined == sealer.seal(AGENT, EPOCH, SEQ, state)


@pytest.mark.parametrize("size", SIZES)
def test_pieces_open_with_open(sealer: Sealer, size: int) -> None:
    """The joined pieces open with Sealer.open, inbox marks included."""
    state = state_of(size)
    assert sealer.open(bytes(sealer.seal_pieces(AGENT, EPOCH, SEQ, state)), AGENT, EPOCH, SEQ) == (
        state
    )
    marks = {"through": 4}
    blob = bytes(sealer.seal_pieces(AGENT, EPOCH, SEQ, state, inbox=marks))
    assert sealer.open_checkpoint(blob, AGENT, EPOCH, SEQ) == (state, marks)


@pytest.mark.parametrize("size", SIZES)
def test_a_bit_flipped_in_any_piece_is_tampered(sealer: Sealer, size: int) -> None:
    """One bit changed at the start, middle or end of any piece: Tampered."""
    pieces = list(sealer.seal_pieces(AGENT, EPOCH, SEQ, state_of(size)))
    if size > MIB:
        assert len(pieces) > 3  # the prefix and nonce, the ciphertext pieces, the tag
    for index, piece in enumerate(pieces):
        for at in {0, len(piece) // 2, len(piece) - 1}:
            changed = bytearray(piece)
            changed[at] ^= 0x01
            joined = b"".join([*pieces[:index], bytes(changed), *pieces[index + 1 :]])
            with pytest.raises(Tampered):
                sealer.open(joined, AGENT, EPOCH, SEQ)


def test_a_state_that_is_not_json_is_refused_before_any_piece(sealer: Sealer) -> None:
    """seal_pieces raises SealError itself, not when the store takes the pieces."""
    with pytest.raises(SealError):
        sealer.seal_pieces(AGENT, EPOCH, SEQ, {"bad": object()})


def test_each_seal_has_a_fresh_nonce(sealer: Sealer) -> None:
    """Two seals of the same state differ (fresh random nonce)."""
    state = state_of(2 * MIB)
    first = bytes(sealer.seal_pieces(AGENT, EPOCH, SEQ, state))
    assert first != bytes(sealer.seal_pieces(AGENT, EPOCH, SEQ, state))


def test_pieces_are_made_once(sealer: Sealer) -> None:
    """A second iteration of the same pieces raises RuntimeError."""
    blob = sealer.seal_pieces(AGENT, EPOCH, SEQ, state_of(10))
    bytes(blob)
    with pytest.raises(RuntimeError):
        bytes(blob)


def test_pieces_that_do_not_add_up_raise_after_the_last() -> None:
    """Pieces shorter or longer than the length given raise ValueError, at the end."""
    short = BlobPieces(10, [b"abc", b"def"])
    with pytest.raises(ValueError, match="10 bytes"):
        bytes(short)
    taken: list[bytes] = []

    def long() -> Iterator[bytes]:
        yield b"abcdef"
        yield b"ghijkl"
        taken.append(b"after")  # never: the second piece overruns already
        yield b"mn"

    with pytest.raises(ValueError, match="10 bytes"):
        for _piece in BlobPieces(10, long()):
            pass
    assert taken == []
