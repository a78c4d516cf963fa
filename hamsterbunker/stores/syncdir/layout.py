"""The syncdir store's names: its marker, the cluster record, node subtrees, sync-tool files.

A node's subtree ``nodes/NODE/`` is a record-layer file store beside ``published/AGENT/``,
its records written once under new names for the other machines (``published``,
``terms``). Only names we write are ever taken as ours; a sync tool's own files are
never read as records nor taken as node ids (``sync_files`` lists them for reports).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from ...records import check_name
from ..dirs.fileio import dir_entries, opened_dir, os_errors_as_store_errors
from ..dirs.location import SYNCDIR_MARKER, is_sync_copy

__all__ = [
    "CLUSTER",
    "MARKER",
    "MARKER_TEXT",
    "MAX_NODE_ENTRIES",
    "MAX_WALKED",
    "NODES",
    "PUBLISHED",
    "is_cluster_copy",
    "is_sync_file",
    "log",
    "node_entries",
    "os_errors",
    "published_parts",
    "sync_files",
]

log = logging.getLogger("hamsterbunker.stores.syncdir")
os_errors = os_errors_as_store_errors("syncdir store")  # OSError as a StoreError

MARKER = (
    SYNCDIR_MARKER  # marks the mode: a synced folder of node subtrees (a file store refuses it)
)
MARKER_TEXT = b"hamsterbunker syncdir 1\n"
CLUSTER = "cluster.json"  # written once, by the first node on an empty folder
NODES = "nodes"  # nodes/NODE/ is a file store that NODE alone writes
PUBLISHED = "published"  # nodes/NODE/published/AGENT/: claims, term records, chain choices

# The most entries of nodes/ read per listing, whatever was planted there.
MAX_NODE_ENTRIES = 1024
# The most entries sync_files looks at in the whole tree.
MAX_WALKED = 100_000

_SYNC_DIRS = (".stfolder", ".stversions")  # Syncthing's folder marker and version archive


def published_parts(node: str, agent: str, *sub: str) -> tuple[str, ...]:
    """The path components, under the root, of node's published records of agent (or of
    sub below them); the agent id checked."""
    return (NODES, node, PUBLISHED, check_name("agent id", agent), *sub)


def node_entries(root: Path) -> dict[str, bool]:
    """The names under root's ``nodes/`` (the first MAX_NODE_ENTRIES), each with whether it
    is a directory (no symlink followed); {} if there is no ``nodes/``."""
    with opened_dir(root, (NODES,)) as nodes_fd:
        entries = [] if nodes_fd is None else dir_entries(nodes_fd, MAX_NODE_ENTRIES)
        return {e.name: e.is_dir(follow_symlinks=False) for e in entries}


def is_sync_file(name: str) -> bool:
    """A sync tool's own file: a conflict copy, a temporary file, a marker or an archive."""
    return (
        is_sync_copy(name)  # *.sync-conflict-*, * (conflicted copy*, Nextcloud's (conflict
        or name in _SYNC_DIRS
        or (name.startswith(".syncthing.") and name.endswith(".tmp"))
        or (name.startswith("~syncthing~") and name.endswith(".tmp"))
    )


def is_cluster_copy(name: str) -> bool:
    """A sync tool's conflict copy of the cluster record (two first starts, unsynced)."""
    return name.startswith("cluster") and is_sync_copy(name)


def sync_files(root: Path) -> list[str]:
    """The sync tool's files under root (paths relative to it), sorted; a bounded walk
    that follows no symlink and does not look into a sync tool's own directories."""
    found: list[str] = []
    budget = MAX_WALKED
    for folder, dirs, files in os.walk(root):
        for name in (*dirs, *files):
            if is_sync_file(name):
                found.append(os.path.relpath(os.path.join(folder, name), root))
        budget -= len(dirs) + len(files)
        if budget <= 0:
            log.warning("stopped looking for sync-tool files after %d entries", MAX_WALKED)
            break
        dirs[:] = sorted(d for d in dirs if not is_sync_file(d))
    return sorted(found)
