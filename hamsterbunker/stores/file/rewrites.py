"""The file store's compare-and-set rewrites: the cluster record, and a re-sealed checkpoint.

The cluster record is replaced under a lock of its own (``cluster.lock`` in the
store root, an OFD lock like the lease's), read, compared and renamed over
while it is held. A re-sealed checkpoint is written and synced under a
temporary name first; the agent's lease lock (the one ``put_checkpoint`` and
its retention hold) is held only to compare the stored bytes and rename.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import struct
import time
from collections.abc import Iterator
from pathlib import Path

from ...errors import ClusterChanged, StoreError, StoreUnavailable
from ...failpoints import failpoint
from ...limits import (
    MAX_CHECKPOINT_BYTES,
    MAX_EFFECT_BYTES,
    MAX_RECORD_BYTES,
    check_effect_bounds,
)
from ...records import CheckpointInfo, ClusterRecord
from ..base import check_reseal
from ..reseal import check_resealed_submission
from .fileio import discard, open_regular, read_file, write_temp
from .inbox_records import HEADER_BYTES, PENDING_CAP, pending_name
from .layout import agent_parts, checkpoint_name, effect_name, step_name
from .lease import lease_locked
from .tree import StoreTree

__all__ = ["FileRewrites"]

# struct flock for F_OFD_SETLK: whole file, write lock, l_pid 0 (Linux, 64-bit off_t).
_WRITE_LOCK = struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
_LOCK_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class FileRewrites:
    """Store.replace_cluster and the re-seals (checkpoint, effect, submission) in a store's tree."""

    def __init__(self, tree: StoreTree, *, lock_timeout: float) -> None:
        self._tree, self._lock_timeout = tree, lock_timeout

    def replace_cluster(self, expected: ClusterRecord, new: ClusterRecord) -> ClusterRecord:
        path = self._tree.root / "cluster.json"
        with self._tree.writing() as root_fd:
            tmp = write_temp(root_fd, new.to_json(), durable=True)
            try:
                with self._cluster_locked(root_fd):
                    if read_file(root_fd, "cluster.json", path, MAX_RECORD_BYTES) != (
                        expected.to_json()
                    ):
                        raise ClusterChanged(f"the cluster record in {path} changed since it "
                                             "was read")  # fmt: skip
                    os.replace(tmp, "cluster.json", src_dir_fd=root_fd, dst_dir_fd=root_fd)
                    os.fsync(root_fd)
            finally:
                discard(root_fd, tmp)
        return new

    def reseal_checkpoint(self, agent: str, info: CheckpointInfo, old: bytes, new: bytes) -> bool:
        check_reseal(info, old, new)
        name = checkpoint_name(info.seq, info.epoch)
        agent_dir = self._tree.agent_dir(agent)
        with (
            self._tree.reading(*agent_parts(agent)) as agent_fd,
            self._tree.reading(*agent_parts(agent, "checkpoints")) as directory,
        ):
            if agent_fd is None or directory is None:
                return False
            tmp = write_temp(directory, new, durable=True, points="reseal")
            try:
                failpoint("reseal.before_commit")
                with lease_locked(agent_fd, agent_dir, agent, self._lock_timeout):
                    path = agent_dir / "checkpoints" / name
                    if read_file(directory, name, path, MAX_CHECKPOINT_BYTES) != old:
                        return False  # removed by retention, or another checkpoint now
                    # Its time is the checkpoint's (the listing reads it), not the re-seal's.
                    was = os.stat(name, dir_fd=directory, follow_symlinks=False)
                    os.utime(tmp, ns=(was.st_atime_ns, was.st_mtime_ns), dir_fd=directory)
                    os.replace(tmp, name, src_dir_fd=directory, dst_dir_fd=directory)
                    failpoint("reseal.after_rename")
                    os.fsync(directory)
                    return True
            finally:
                discard(directory, tmp)

    def reseal_effect(
        self, agent: str, seq: int, index: int, kind: str, old: bytes, new: bytes
    ) -> bool:
        problem = check_effect_bounds(seq, index, kind, len(new))
        if problem is not None:
            raise StoreError(problem)
        name, step = effect_name(index, kind), step_name(seq)
        agent_dir = self._tree.agent_dir(agent)
        with (
            self._tree.reading(*agent_parts(agent)) as agent_fd,
            self._tree.reading(*agent_parts(agent, "effects", step)) as directory,
        ):
            if agent_fd is None or directory is None:
                return False
            tmp = write_temp(directory, new, durable=True)
            try:
                failpoint("reseal.before_commit")
                with lease_locked(agent_fd, agent_dir, agent, self._lock_timeout):
                    path = agent_dir / "effects" / step / name
                    if read_file(directory, name, path, MAX_EFFECT_BYTES) != old:
                        return False  # removed with its step, or rewritten by the leader
                    os.replace(tmp, name, src_dir_fd=directory, dst_dir_fd=directory)
                    os.fsync(directory)
                    return True
            finally:
                discard(directory, tmp)

    def reseal_submission(self, agent: str, number: int, old: bytes, new: bytes) -> bool:
        check_resealed_submission(number, old, new)
        name = pending_name(number)
        agent_dir = self._tree.agent_dir(agent)
        path = agent_dir / "inbox" / "pending" / name
        with (
            self._tree.reading(*agent_parts(agent)) as agent_fd,
            self._tree.reading(*agent_parts(agent, "inbox", "pending")) as directory,
        ):
            if agent_fd is None or directory is None:
                return False
            # The entry is its header (which names the request id), then the sealed bytes.
            seen = read_file(directory, name, path, PENDING_CAP)
            if seen is None or seen[HEADER_BYTES:] != old:
                return False
            tmp = write_temp(directory, seen[:HEADER_BYTES] + new, durable=True)
            try:
                failpoint("reseal.before_commit")
                with lease_locked(agent_fd, agent_dir, agent, self._lock_timeout):
                    if read_file(directory, name, path, PENDING_CAP) != seen:
                        return False  # consumed, or another entry now
                    os.replace(tmp, name, src_dir_fd=directory, dst_dir_fd=directory)
                    os.fsync(directory)
                    return True
            finally:
                discard(directory, tmp)

    @contextlib.contextmanager
    def _cluster_locked(self, root_fd: int) -> Iterator[None]:
        """Hold the cluster record's lock, waiting at most the lock timeout."""
        path = Path(self._tree.root) / "cluster.lock"
        fd = open_regular(root_fd, "cluster.lock", path, _LOCK_FLAGS)
        try:
            deadline = time.monotonic() + self._lock_timeout
            while True:
                try:
                    fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _WRITE_LOCK)
                    break
                except OSError as exc:
                    if exc.errno not in (errno.EACCES, errno.EAGAIN):
                        raise StoreUnavailable(f"cannot lock {path}: {exc.strerror}") from exc
                    if time.monotonic() > deadline:
                        raise StoreUnavailable(
                            f"{path} held elsewhere for {self._lock_timeout} s"
                        ) from exc
                    time.sleep(0.002)
            yield
        finally:
            os.close(fd)  # closing the description releases its lock
