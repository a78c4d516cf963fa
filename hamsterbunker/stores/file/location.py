"""Where a file store's directory is: refused in a synced folder, warned about on NFS.

Sync tools (Syncthing, Dropbox, Nextcloud) give no mutual exclusion, so two
nodes could both lead: a store inside a synced folder is refused. NFS works,
but only mounted so that attribute caching cannot hide lease renewals.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ...errors import StoreUnsafe

__all__ = ["Mount", "check_location", "mount_of"]

_SYNC_MARKERS = (".stfolder", ".dropbox", ".dropbox.cache", ".sync", ".nextcloudsync.log")


@dataclass(frozen=True)
class Mount:
    fstype: str
    source: str
    point: str
    options: str  # per-mount and superblock options, comma-separated


def mount_of(path: Path) -> Mount:
    """The mount holding path (the longest matching mount point in /proc/self/mountinfo)."""
    best = Mount("", "", "", "")
    target = str(path.resolve())
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return best
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, rfields = left.split(), right.split()
        if len(fields) < 6 or len(rfields) < 3:
            continue
        point = fields[4].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best.point):
            best = Mount(rfields[0], rfields[1], point, fields[5] + "," + rfields[2])
    return best


def check_location(root: Path) -> list[str]:
    """Raise StoreUnsafe for a store directory in a synced folder; warnings about its mount."""
    for folder in (root, *root.parents):
        for marker in _SYNC_MARKERS:
            if (folder / marker).exists():
                raise StoreUnsafe(
                    f"store directory {root} is inside a synced folder ({folder / marker} "
                    "found): sync tools give no mutual exclusion, so two nodes could both "
                    "lead. Use a local directory, NFS, etcd or Redis."
                )
    mount = mount_of(root)
    if mount.fstype.startswith("nfs"):
        opts = set(mount.options.split(","))
        if not ({"noac", "actimeo=0"} & opts and "lookupcache=none" in opts):
            return [
                f"store directory {root} is on NFS without noac (or actimeo=0) and "
                "lookupcache=none: attribute caching can hide lease renewals for seconds. "
                "Mount it with -o noac,lookupcache=none."
            ]
    return []
