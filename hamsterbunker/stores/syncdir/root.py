"""The root of a syncdir folder: its marker and the cluster record, each written once and
never rewritten (a sync tool would keep one of two copies and rename the other).
"""

from __future__ import annotations

import os
from pathlib import Path

from ...core.errors import StoreError
from ...core.limits import MAX_RECORD_BYTES
from ...records import ClusterRecord
from ..dirs.fileio import dir_entries, discard, opened_dir, read_file, write_temp
from .layout import CLUSTER, MARKER, MARKER_TEXT, MAX_NODE_ENTRIES, NODES, is_cluster_copy

__all__ = ["check_mode", "create_once", "link_once", "read_cluster_bytes", "read_cluster_record"]


def check_mode(root: Path, create: bool) -> None:
    """Mark the folder as a syncdir store (once, with create), or refuse one that is
    something else: StoreError naming what was found."""
    with opened_dir(root, ()) as root_fd:
        if root_fd is None:
            raise StoreError(f"syncdir store directory {root} does not exist")
        if read_file(root_fd, MARKER, root / MARKER, MAX_RECORD_BYTES) is not None:
            return
        # A sync tool brings files in any order: other nodes' subtrees (nodes/) may
        # arrive before the marker. A cluster record without either, or keys (kv/), are a
        # file store's (the earlier one kept agents/), or a sync not far enough yet.
        names = {e.name for e in dir_entries(root_fd, MAX_NODE_ENTRIES)}
        if NODES not in names and names & {"kv", "agents", CLUSTER}:
            raise StoreError(
                f"{root} holds a file:// store (no {MARKER}, no {NODES}/), or a syncdir folder "
                "the sync has not brought yet: a syncdir store needs a folder of its own"
            )
        if not create and NODES not in names:
            raise StoreError(f"{root} is not a syncdir store: {MARKER} is missing")
        if create:
            link_once(root_fd, MARKER, MARKER_TEXT)


def read_cluster_record(root: Path) -> ClusterRecord | None:
    """The cluster record, or None; StoreError if the sync left a conflict copy of it."""
    data = read_cluster_bytes(root)
    return None if data is None else ClusterRecord.from_json(data)


def read_cluster_bytes(root: Path) -> bytes | None:
    """The cluster record's bytes, unparsed, as read_cluster_record reads them."""
    with opened_dir(root, ()) as root_fd:
        if root_fd is None:
            return None
        copies = [e.name for e in dir_entries(root_fd, MAX_NODE_ENTRIES) if is_cluster_copy(e.name)]
        if copies:
            raise StoreError(
                f"{root / sorted(copies)[0]} is a sync-conflict copy of the cluster record: two "
                "nodes each created one on folders that were not yet synced. Keep one (remove "
                f"the copy, or replace {CLUSTER} with it) on every machine, then start the "
                "nodes again"
            )
        return read_file(root_fd, CLUSTER, root / CLUSTER, MAX_RECORD_BYTES)


def create_once(root: Path, name: str, data: bytes, parts: tuple[str, ...] = ()) -> None:
    """Write name at the root (or in its folder parts, made if need be) durably unless it
    exists: left as it is if it does."""
    with opened_dir(root, parts, create=bool(parts)) as folder_fd:
        if folder_fd is None:
            raise StoreError(f"syncdir store directory {root} does not exist")
        link_once(folder_fd, name, data)


def link_once(folder_fd: int, name: str, data: bytes) -> bool:
    """Create name in the folder with data, durably, unless it exists: whether it did."""
    tmp = write_temp(folder_fd, data, durable=True)
    try:
        # Fails if the name exists: create-if-absent in one step, never a rewrite.
        os.link(tmp, name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd, follow_symlinks=False)
        os.fsync(folder_fd)
        return True
    except FileExistsError:
        return False
    finally:
        discard(folder_fd, tmp)
