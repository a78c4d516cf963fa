"""Copying a syncdir folder an earlier version wrote into a new one: ``hb migrate-store``
(docs/syncdir.md, "Layout").

Each node's subtree, in the earlier file store's layout, is copied as ``stores.migrate``
copies a file store, but for its claim, which keeps its version; its published claims,
term records and chain choices, byte for byte, under ``published/AGENT/``; the marker
first and the cluster record last. Every node must be stopped on every machine, and the
sync done; the earlier folder is only read.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path

from ..core.errors import ConfigError, CorruptRecord
from ..core.limits import MAX_RECORD_BYTES, MAX_TERM_RECORD_BYTES
from ..records import ClusterRecord, check_record_name
from ..sealing import Sealer
from ..sealing.keyring import Secret
from .backends.file import FileBackend, earlier_layout
from .dirs.fileio import dir_entries, opened_dir, os_errors_as_store_errors, read_file
from .dirs.location import open_root
from .earlier.file import EarlierFileStore
from .layer import RecordStore
from .migrate import Migrated, Stopped, copy_agent
from .syncdir.layout import (
    CLUSTER,
    MARKER,
    MARKER_TEXT,
    NODES,
    is_sync_file,
    node_entries,
    published_parts,
)
from .syncdir.published import is_claim_name
from .syncdir.root import create_once, read_cluster_bytes
from .syncdir.terms import CHOICES, MAX_TERM_ENTRIES, TERMS

__all__ = ["migrate_syncdir", "open_syncdir_migration"]

_TERM_NAME = re.compile(r"[0-9]{10}\.rec")
_os_errors = os_errors_as_store_errors("syncdir migration")


def open_syncdir_migration(source_url: str, target_url: str) -> tuple[Path, Path]:
    """The earlier syncdir folder at source_url and the new one at target_url (absent or
    empty); ConfigError in one line otherwise."""
    from . import is_syncdir_url, syncdir_store_path

    if not is_syncdir_url(target_url):
        raise ConfigError(f"{target_url!r}: a syncdir folder is migrated into a syncdir:// one")
    source, target = Path(syncdir_store_path(source_url)), Path(syncdir_store_path(target_url))
    if source == target:
        raise ConfigError("migrate into another folder: --from and --to name the same one")
    open_root(source, create=False)  # ConfigError naming the path if absent or no directory
    if not (source / MARKER).is_file():
        raise ConfigError(f"{source} is not a syncdir folder: {MARKER} is missing")
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise ConfigError(f"{target} is not empty: migrate into a new, empty folder")
    return source, target


def migrate_syncdir(
    source: Path,
    target: Path,
    secret: Secret,
    *,
    say: Callable[[str], None] = print,
    pause: Callable[[float], None] = time.sleep,
) -> Migrated:
    """Copy the earlier folder source into target (see the module); ConfigError if either is
    not as it must be, StoreError if the source changed (a node is running)."""
    cluster_bytes = _os_errors(read_cluster_bytes)(source)
    if cluster_bytes is None:
        raise ConfigError(f"{source} holds no cluster record: nothing to migrate")
    cluster = ClusterRecord.from_json(cluster_bytes)
    sealer = Sealer(secret, cluster)  # WrongSecret (a usage mistake) before anything is made
    migrated = Migrated()
    sources = _earlier_subtrees(source, migrated.left_out)
    agents = {node: store.list_agents() for node, store in sources.items()}
    stopped = Stopped([(store, agents[node]) for node, store in sources.items()])
    stopped.watch(str(source), say, pause)
    (target / NODES).mkdir(parents=True, exist_ok=True)
    create_once(target, MARKER, MARKER_TEXT)
    for node, store in sources.items():
        backend = FileBackend(target / NODES / node, in_synced_folder=True)
        subtree = RecordStore(backend, per_epoch=True)
        try:
            for agent in agents[node]:
                copied = copy_agent(store, subtree, sealer, agent, migrated.left_out, numbered=True)
                records = _copy_published(source, target, node, agent, migrated.left_out)
                what = f"{copied}, {records} published record(s)"
                migrated.agents[f"{agent}@{node}"] = what
                say(f"agent {agent} of node {node}: {what}")
        finally:
            subtree.close()
    stopped.check("wrote during the copy")
    create_once(target, CLUSTER, cluster_bytes)
    return migrated


@_os_errors
def _earlier_subtrees(source: Path, left: list[str]) -> dict[str, EarlierFileStore]:
    """Each node's subtree in the earlier layout, read only (a name that is no node id left
    out and said); ConfigError for one in this version's (migrated already, in part)."""
    found: dict[str, EarlierFileStore] = {}
    for name, is_dir in sorted(node_entries(source).items()):
        if not is_dir or is_sync_file(name):
            continue
        where = source / NODES / name
        try:
            check_record_name(name)
        except CorruptRecord:
            left.append(f"{where}: not named by a node id")
            continue
        if earlier_layout(where) is not None:
            found[name] = EarlierFileStore(where)
        elif (where / "kv").exists():
            raise ConfigError(f"{where} holds this version's layout: nothing to migrate")
    return found


@_os_errors
def _copy_published(source: Path, target: Path, node: str, agent: str, left: list[str]) -> int:
    """Copy node's published claims, term records and chain choices of agent, byte for byte:
    how many; one that is not a regular file within its cap is left out and said."""
    copied = 0
    kinds: tuple[tuple[tuple[str, ...], Callable[[str], bool], int], ...] = (
        ((), is_claim_name, MAX_RECORD_BYTES),
        ((TERMS,), _is_term_name, MAX_TERM_RECORD_BYTES),
        ((CHOICES,), _is_term_name, MAX_TERM_RECORD_BYTES),
    )
    for sub, named, cap in kinds:
        parts = (NODES, node, "agents", agent, *sub)
        with opened_dir(source, parts) as folder_fd:
            if folder_fd is None:
                continue
            names = sorted(e.name for e in dir_entries(folder_fd, MAX_TERM_ENTRIES))
            for name in filter(named, names):
                where = source.joinpath(*parts, name)
                try:
                    data = read_file(folder_fd, name, where, cap)
                except CorruptRecord as exc:
                    left.append(f"node {node}, agent {agent}: {exc}")
                    continue
                if data is not None:
                    create_once(target, name, data, published_parts(node, agent, *sub))
                    copied += 1
    return copied


def _is_term_name(name: str) -> bool:
    return _TERM_NAME.fullmatch(name) is not None
