"""FileStore: the embedded default store, the record layer over a directory."""

from __future__ import annotations

import os

from ...core.limits import INBOX_REPLIES_KEPT
from ..backends.file import FileBackend
from .store import RecordStore

__all__ = ["FileStore"]


class FileStore(RecordStore):
    """Every record in one directory on this machine (``stores.backends.file``)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        keep_checkpoints: int = 5,
        events_per_node: int = 1000,
        keep_replies: int = INBOX_REPLIES_KEPT,
        lock_timeout: float = 2.0,
        create: bool = True,
    ) -> None:
        backend = FileBackend(os.fspath(path), create=create, lock_timeout=lock_timeout)
        super().__init__(
            backend,
            keep_checkpoints=keep_checkpoints,
            events_per_node=events_per_node,
            keep_replies=keep_replies,
        )
        self.root = backend.root
