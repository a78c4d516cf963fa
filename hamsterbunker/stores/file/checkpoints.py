"""The file store's checkpoints: ``agents/<agent>/checkpoints/ckpt-<seq>-<epoch>.hbc``.

A checkpoint is written and synced under a temporary name before the lease
lock is taken, so a large one never holds up lease renewals; only the fence
check and the rename happen under the lock. The seq and epoch are in the name
and the size and time in the file's metadata, so listing reads no checkpoint.
The submissions a checkpoint consumes commit with its rename (see
``stores.file.inbox``).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Sequence
from pathlib import Path

from ...blob import Blob
from ...errors import StoreError
from ...failpoints import failpoint
from ...limits import MAX_CHECKPOINT_BYTES, check_checkpoint_bounds
from ...records import CheckpointInfo
from ..base import Consumed, Fence, check_consumed, check_fence, check_own_epoch
from .fileio import closing_fd, dir_entries, discard, file_kind, make_subdir, read_file, write_temp
from .inbox import InboxFiles
from .layout import CHECKPOINT_NAME, agent_parts, checkpoint_name, checkpoint_name_problem
from .lease import lease_in, lease_locked
from .tree import StoreTree

__all__ = ["CheckpointFiles"]


class CheckpointFiles:
    """Store.put_checkpoint, list_checkpoints and read_checkpoint in a store's tree."""

    def __init__(
        self,
        tree: StoreTree,
        inbox: InboxFiles,
        *,
        keep: int,
        lock_timeout: float,
        per_epoch: bool = False,
    ) -> None:
        self._tree = tree
        self._inbox = inbox
        self._keep = keep
        self._lock_timeout = lock_timeout
        self._per_epoch = per_epoch  # retention within the new checkpoint's epoch only

    def put(
        self, agent: str, fence: Fence, seq: int, blob: Blob, consumed: Sequence[Consumed] = ()
    ) -> CheckpointInfo:
        """Store.put_checkpoint; the inbox's part is in ``stores.file.inbox``.

        The blob is written (as its pieces are made, if it comes in pieces) and
        synced under a temporary name first. Under the lock, in this order: the fence checked, what an earlier
        write cut short settled, the consumption staged, the checkpoint
        renamed (the commit point) and made durable, the staging applied.
        """
        problem = check_checkpoint_bounds(seq, fence.epoch, len(blob)) or check_consumed(consumed)
        if problem is not None:
            raise StoreError(problem)  # before anything is written
        agent_dir = self._tree.agent_dir(agent)
        path = agent_dir / "checkpoints"
        with (
            self._tree.writing(*agent_parts(agent)) as agent_fd,
            closing_fd(make_subdir(agent_fd, "checkpoints", path)) as directory,
            contextlib.ExitStack() as stack,
        ):
            self._tree.sweep_once(agent_parts(agent, "checkpoints"), directory)
            tmp = write_temp(directory, blob, durable=True, points="checkpoint")
            try:
                staging = self._inbox.prepare(stack, agent_fd, agent, directory, consumed)
                failpoint("checkpoint.before_commit")
                with lease_locked(agent_fd, agent_dir, agent, self._lock_timeout):
                    check_fence(lease_in(agent_fd, agent_dir), fence, seq)
                    self._inbox.settle(staging)
                    existing = self._scan(directory, path)
                    check_own_epoch(existing, fence.epoch, seq)
                    self._inbox.stage(staging, seq, fence.epoch)
                    os.replace(
                        tmp, checkpoint_name(seq, fence.epoch),
                        src_dir_fd=directory, dst_dir_fd=directory,
                    )  # fmt: skip
                    failpoint("checkpoint.after_rename")
                    os.fsync(directory)
                    failpoint("checkpoint.after_dir_fsync")
                    self._inbox.apply(staging, seq, fence.epoch)
                    self._prune(directory, existing, seq, fence.epoch)
                    return CheckpointInfo(
                        epoch=fence.epoch, seq=seq, size=len(blob), written=time.time()
                    )
            finally:
                discard(directory, tmp)

    def retained(self, agent: str) -> list[CheckpointInfo]:
        with self._tree.reading(*agent_parts(agent, "checkpoints")) as directory:
            if directory is None:
                return []
            return self._scan(directory, self._tree.agent_dir(agent) / "checkpoints")

    def read(self, agent: str, info: CheckpointInfo) -> bytes:
        name = checkpoint_name(info.seq, info.epoch)
        path = self._tree.agent_dir(agent) / "checkpoints" / name
        with self._tree.reading(*agent_parts(agent, "checkpoints")) as directory:
            data = None if directory is None else read_file(
                directory, name, path, MAX_CHECKPOINT_BYTES
            )  # fmt: skip
        if data is None:
            raise StoreError(f"checkpoint {info.seq} of {agent!r} is no longer retained")
        return data

    def _prune(self, directory: int, existing: list[CheckpointInfo], seq: int, epoch: int) -> None:
        """Keep the new checkpoint and the newest keep - 1 others at or below seq (with
        per_epoch, of its epoch: another epoch's are left as they are).

        Nothing above seq is removed: it is junk, or a damaged checkpoint the
        caller skipped, and either is the runtime's to judge and report.
        """
        below = [
            info
            for info in existing
            if info.seq <= seq and (not self._per_epoch or info.epoch == epoch)
        ]
        for old in below[self._keep - 1 :]:
            discard(directory, checkpoint_name(old.seq, old.epoch))

    def _scan(self, directory: int, path: Path) -> list[CheckpointInfo]:
        """The regular files under checkpoint names in range, newest first by (seq, epoch)."""
        found = []
        for entry in dir_entries(directory):
            match = CHECKPOINT_NAME.fullmatch(entry.name)
            if not match:
                continue
            problem = checkpoint_name_problem(match)
            if problem is not None:
                self._tree.report(f"ignoring {path / entry.name}: {problem}")
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue  # pruned by the writer while we listed
            kind = file_kind(st.st_mode)
            if kind is not None:
                self._tree.report(f"ignoring {path / entry.name}: {kind}, not a regular file")
                continue
            seq, epoch = int(match[1]), int(match[2])
            found.append(CheckpointInfo(epoch=epoch, seq=seq, size=st.st_size, written=st.st_mtime))
        return sorted(found, key=lambda info: (info.seq, info.epoch), reverse=True)
