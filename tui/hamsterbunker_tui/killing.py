"""The kill switch's target: the active node, if its process runs on this machine."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .model import ClusterModel

__all__ = ["KillTarget", "kill_target"]


@dataclass(frozen=True)
class KillTarget:
    node: str | None
    pid: int | None
    reason: str  # why the button is disabled, or what it will do


def kill_target(model: ClusterModel) -> KillTarget:
    """The active node if its process runs on this machine, else why it cannot be killed."""
    if model.lease_error is not None:
        return KillTarget(None, None, "the lease record is unreadable")
    active = model.active_node()
    if active is None:
        return KillTarget(None, None, "no active node")
    if active.host != model.hostname:
        return KillTarget(None, None, f"{active.node} runs on {active.host}, not on this machine")
    if not _is_node_process(active.pid):
        return KillTarget(None, None, f"{active.node}'s process {active.pid} is not running here")
    return KillTarget(active.node, active.pid, f"kill {active.node} (pid {active.pid})")


def _is_node_process(pid: int) -> bool:
    """Whether pid is alive and still a node (the number may have been reused since)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists, owned by someone else
    try:
        command = _read_proc(pid, "cmdline")
    except FileNotFoundError:
        return False  # it ended meanwhile
    except OSError:
        return True  # no /proc here: trust the heartbeat
    # Between fork and exec a child still shows its parent's command line (and
    # during exec, none): a reused pid caught there must not pass for a node.
    if command == _parent_command(pid):
        return False
    argv = command.split(b"\0")
    return any(b"hamsterbunker" in arg or os.path.basename(arg) == b"hb" for arg in argv)


def _parent_command(pid: int) -> bytes | None:
    """The command line of pid's parent process, or None if it cannot be read."""
    try:
        parent = int(_read_proc(pid, "stat").rsplit(b")", 1)[1].split()[1])
        return _read_proc(parent, "cmdline")
    except (OSError, ValueError, IndexError):
        return None


def _read_proc(pid: int, name: str) -> bytes:
    with open(f"/proc/{pid}/{name}", "rb") as file:
        return file.read()
