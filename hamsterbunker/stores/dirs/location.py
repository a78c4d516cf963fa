"""Where a file store's directory may be: refused in a synced folder (sync tools give no
mutual exclusion) unless it is one node's subtree of a ``syncdir://`` store, refused in a
folder marked as a syncdir store, warned about on NFS mounted with attribute caching;
refused in one line naming the path and the fix when this node may not use it.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from ...core.errors import ConfigError, StoreUnavailable, StoreUnsafe

__all__ = ["SYNCDIR_MARKER", "Mount", "check_location", "is_sync_copy", "mount_of", "open_root"]

_DENIED = {errno.EACCES, errno.EPERM, errno.EROFS}

_SYNC_MARKERS = (".stfolder", ".dropbox", ".dropbox.cache", ".sync", ".nextcloudsync.log")
SYNCDIR_MARKER = ".hamsterbunker-syncdir"  # at the root of a syncdir store's folder


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


def check_location(root: Path, *, in_synced_folder: bool = False) -> list[str]:
    """Raise StoreUnsafe for a store directory in a synced folder (unless in_synced_folder:
    a syncdir store's node subtree); warnings about its mount."""
    for folder in () if in_synced_folder else (root, *root.parents):
        for marker in (SYNCDIR_MARKER, *_SYNC_MARKERS):
            try:
                found = (folder / marker).exists()
            except OSError as exc:  # a directory this node may not look into
                raise _refused(root, "read", exc) from exc
            if found and marker == SYNCDIR_MARKER:
                raise StoreUnsafe(
                    f"store directory {root} is inside a syncdir store ({folder / marker} "
                    f"found): open it as syncdir://{folder}, not as a file store"
                )
            if found:
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


def open_root(root: Path, *, create: bool) -> None:
    """Make the store directory (if create) and check this node may read it (and with
    create, write it): else ConfigError naming the path and the fix; StoreUnavailable for
    other I/O errors."""
    if create:
        try:
            root.mkdir()
        except FileExistsError:
            pass  # a directory (or a file, refused below)
        except FileNotFoundError as exc:
            raise ConfigError(f"store directory {root}: its parent does not exist") from exc
        except OSError as exc:
            raise _refused(root, "create", exc) from exc
    try:
        mode = os.stat(root).st_mode
    except FileNotFoundError as exc:
        raise ConfigError(f"store directory {root} does not exist") from exc
    except OSError as exc:
        raise _refused(root, "read", exc) from exc
    if not stat.S_ISDIR(mode):
        raise ConfigError(
            f"store path {root} is not a directory: point the store URL at a directory "
            "(or move the file away and let the node make it)"
        )
    try:
        with os.scandir(root):
            pass
    except OSError as exc:
        raise _refused(root, "read", exc) from exc
    # Asked, not tried: a node that may not start must leave the store as it found it.
    effective = os.access in os.supports_effective_ids
    if create and not os.access(root, os.W_OK | os.X_OK, effective_ids=effective):
        code = errno.EROFS if os.statvfs(root).f_flag & os.ST_RDONLY else errno.EACCES
        raise _refused(root, "write", OSError(code, os.strerror(code), str(root)))


def _refused(root: Path, verb: str, exc: OSError) -> Exception:
    """The one line for a store directory this node may not use, with the fix."""
    if exc.errno not in _DENIED:
        return StoreUnavailable(f"store directory {root}: cannot {verb} it: {exc.strerror}")
    user = _user_name(os.geteuid())
    if verb == "create" and exc.errno != errno.EROFS:
        return ConfigError(
            f"store directory {root} cannot be created by user {user} ({_found(root.parent)}): "
            f"make it once as root with `mkdir {root} && chown {user}: {root} && chmod 0700 "
            f"{root}`, or choose a directory the node may write"
        )
    if exc.errno == errno.EROFS:
        return ConfigError(
            f"store directory {root} is on a file system this node may not write "
            f"(read-only for user {user}): under systemd, allow it with ReadWritePaths={root} "
            "(systemctl edit hamsterbunker@NAME), or choose a writable directory"
        )
    return ConfigError(
        f"store directory {root} cannot be {'read' if verb == 'read' else 'written'} by "
        f"user {user} ({_found(root)}): make it the node's with `chown -R {user}: {root}` and "
        f"`chmod 0700 {root}` (each parent needs o+x), or run the node as its owner"
    )


def _found(path: Path) -> str:
    """Who owns path and its mode, as a reason for a refusal."""
    try:
        info = os.stat(path)
    except OSError:
        return f"{path} is not reachable: a parent directory does not let the node through"
    return f"{path} is owned by {_user_name(info.st_uid)}, mode {stat.S_IMODE(info.st_mode):04o}"


def _user_name(uid: int) -> str:
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return str(uid)


def is_sync_copy(name: str) -> bool:
    """Syncthing, Dropbox and Nextcloud conflict copies: never one of our records."""
    return ".sync-conflict-" in name or "conflicted copy" in name or "(conflict" in name
