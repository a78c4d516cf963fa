"""A blob a store is handed: bytes, or pieces made one after another while it writes them
(``Sealer.seal_pieces``). Its length is known before any piece is made, so a store checks its
bounds first; a store that writes one value (etcd, Redis) joins the pieces with ``bytes()``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TypeAlias

__all__ = ["Blob", "BlobPieces"]


class BlobPieces:
    """``length`` bytes (``len()``), made as ``pieces`` is iterated, once (then RuntimeError).

    What the maker raises comes out of the iteration, and so does a ValueError after the
    last piece if they do not add up to ``length``: a store writing them as they come commits
    nothing it has not fully received. ``bytes()`` joins them.
    """

    def __init__(self, length: int, pieces: Iterable[bytes]) -> None:
        self._length = length
        self._pieces: Iterable[bytes] | None = pieces

    def __len__(self) -> int:
        return self._length

    def __iter__(self) -> Iterator[bytes]:
        pieces, self._pieces = self._pieces, None
        if pieces is None:
            raise RuntimeError("a blob's pieces are made once, and were taken already")
        return self._checked(pieces)

    def _checked(self, pieces: Iterable[bytes]) -> Iterator[bytes]:
        made = 0
        for piece in pieces:
            made += len(piece)
            if made > self._length:
                break
            yield piece
        if made != self._length:
            raise ValueError(f"a blob of {self._length} bytes was made with {made} or more")

    def __bytes__(self) -> bytes:
        return b"".join(self)

    def __repr__(self) -> str:
        return f"BlobPieces({self._length} bytes)"


Blob: TypeAlias = bytes | BlobPieces
