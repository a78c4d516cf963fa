"""A node's claim as the other machines read it: ``published/AGENT/claim.VERSION.json``, a
new file at each write, never rewritten (docs/syncdir.md, "Published claims": a sync tool
is slow at a file rewritten every tick).

A node removes its own older claims once they have had ``keep_s`` to sync, on this
process's monotonic clock, always keeping the newest ``KEEP_NEWEST``; an earlier
process's, and any above the version just written, go at once. Reads are bounded
(``MAX_CLAIM_ENTRIES`` names, the newest within ``read_bounds.CLAIMS_READ``); a claim
that does not parse is reported and the next older one read.
"""

from __future__ import annotations

import collections
import contextlib
import os
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ...core.errors import CorruptRecord, StoreError
from ...core.limits import MAX_CLAIMS_TRIED, MAX_RECORD_BYTES
from ...core.read_bounds import CLAIMS_READ
from ...records import LeaseRecord
from ..dirs.fileio import dir_entries, discard, opened_dir, read_file, write_temp
from ..dirs.location import is_sync_copy
from .layout import published_parts

__all__ = [
    "KEEP_NEWEST",
    "MAX_CLAIMS_TRIED",
    "MAX_CLAIM_ENTRIES",
    "ClaimPublisher",
    "is_claim_name",
    "read_published",
]

CLAIM_NAME = re.compile(r"claim\.([0-9]{20})\.json")
KEEP_NEWEST = 2
MAX_CLAIM_ENTRIES = 65_536  # the names looked at; those read are CLAIMS_READ's


def claim_name(version: int) -> str:
    return f"claim.{version:020d}.json"


def is_claim_name(name: str) -> bool:
    """A published claim's name (a sync tool's copy of one is not)."""
    return CLAIM_NAME.fullmatch(name) is not None and not is_sync_copy(name)


def _versions(agent_fd: int) -> dict[int, str]:
    names = [entry.name for entry in dir_entries(agent_fd, MAX_CLAIM_ENTRIES)]
    return {int(name.split(".")[1]): name for name in names if is_claim_name(name)}


def read_published(
    root: Path, node: str, agent: str, report: Callable[[str], None]
) -> LeaseRecord | None:
    """The newest published claim of node for agent that parses; None if there is none
    (the caller reads node's lease record then). Nothing below root is followed."""
    parts = published_parts(node, agent)
    where = root.joinpath(*parts)
    with opened_dir(root, parts) as agent_fd:
        if agent_fd is None:
            return None
        versions = _versions(agent_fd)
        for version in sorted(versions, reverse=True)[: CLAIMS_READ.count]:
            name = versions[version]
            try:
                data = read_file(agent_fd, name, where / name, CLAIMS_READ.entry_bytes)
                if data is None:
                    continue  # removed as it was listed: an older one is there
                claim = LeaseRecord.from_json(data)
            except (CorruptRecord, ValueError) as exc:
                report(f"claim {where / name} skipped: {exc}")
                continue
            if claim.version != version:
                report(f"claim {where / name} skipped: it holds version {claim.version}")
                continue
            return claim
    return None


class ClaimPublisher:
    """Publishes one node's claims in its subtree and removes those that have synced."""

    def __init__(self, root: Path, node: str, keep_s: float) -> None:
        self._root, self._node, self._keep_s = root, node, keep_s
        self._lock = threading.Lock()
        # By agent: (when written, version) of the claims this process published.
        self._written: dict[str, collections.deque[tuple[float, int]]] = {}

    def has_published(self, agent: str) -> bool:
        """Whether this process published a claim of agent yet."""
        with self._lock:
            return agent in self._written

    def publish(self, agent: str, claim: LeaseRecord) -> None:
        """Create claim.VERSION.json for claim (the same bytes again: a no-op), then remove
        what has had its time to sync (see the module)."""
        parts = published_parts(self._node, agent)
        name = claim_name(claim.version)
        data = claim.to_json()
        with self._lock, opened_dir(self._root, parts, create=True) as agent_fd:
            assert agent_fd is not None  # made
            tmp = write_temp(agent_fd, data, durable=True)
            try:
                stored = read_file(
                    agent_fd, name, self._root.joinpath(*parts, name), MAX_RECORD_BYTES
                )
                if stored is None:
                    # Renamed into place, as the sync tool does: a lease watch wakes on it
                    # (a link would not). Only this node writes its versions, each from its
                    # own compare-and-set, so nothing else renames this name meanwhile.
                    os.rename(tmp, name, src_dir_fd=agent_fd, dst_dir_fd=agent_fd)
                    os.fsync(agent_fd)
                elif stored != data:  # never replaced
                    raise StoreError(
                        f"claim {name} of {agent!r} exists with other contents: "
                        "the lease record went back in version"
                    )
            finally:
                discard(agent_fd, tmp)
            self._prune(agent, agent_fd, claim.version)

    def _prune(self, agent: str, agent_fd: int, version: int) -> None:
        now = time.monotonic()
        written = self._written.setdefault(agent, collections.deque())
        written.append((now, version))
        on_disk = _versions(agent_fd)
        newest = sorted((v for v in on_disk if v <= version), reverse=True)[:KEEP_NEWEST]
        young = {v for when, v in written if now - when < self._keep_s}
        while written and now - written[0][0] >= self._keep_s:
            written.popleft()
        for old, old_name in on_disk.items():
            # Kept: the newest, and this process's own older ones still syncing; gone: an
            # earlier process's, and any above version (a lease record that went back).
            if old in newest or (old in young and old < version):
                continue
            with contextlib.suppress(FileNotFoundError):
                os.unlink(old_name, dir_fd=agent_fd)
