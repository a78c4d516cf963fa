"""Nodes as real local processes: the demo's cluster, and the tests'.

Each node is ``python -m hamsterbunker run ...`` with its own log file. The
secret and the store URL (which may hold a password) travel in ``HB_SECRET``
and ``HB_STORE``, never on a command line, where every user can read them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..core.timing import DEFAULT_TIMING, LeaseTiming

__all__ = ["LocalCluster", "NodeSpec"]


@dataclass(frozen=True)
class NodeSpec:
    node: str
    region: str


@dataclass
class LocalCluster:
    store_url: str
    secret: str
    agent: str  # module:attribute
    log_dir: Path
    timing: LeaseTiming = DEFAULT_TIMING
    agent_id: str | None = None
    history: Path | None = None  # every node appends its operations here (--history)
    env: dict[str, str] = field(default_factory=dict)
    # Whichever node starts first makes the store (hb run --create-store): it is new.
    create_store: bool = True
    args: tuple[str, ...] = ()  # more `hb run` flags, e.g. ("--no-hot-standby",)
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start(
        self,
        spec: NodeSpec,
        extra_env: dict[str, str] | None = None,
        command_prefix: list[str] | None = None,
    ) -> subprocess.Popen[bytes]:
        """Start one node process (a node that ran before starts afresh).

        ``command_prefix`` runs the node under a wrapper that execs it, such as
        ``["ip", "netns", "exec", NS]`` (the process started is then the node).
        """
        self.log_dir.mkdir(parents=True, exist_ok=True)
        command = [
            *(command_prefix or []),
            sys.executable, "-m", "hamsterbunker", "run",
            "--agent", self.agent,
            "--node-id", spec.node,
            "--region", spec.region,
            "--tick-ms", str(self.timing.tick_ms),
            "--lease-ttl-ms", str(self.timing.lease_ttl_ms),
        ]  # fmt: skip
        if self.agent_id:
            command += ["--agent-id", self.agent_id]
        if self.history:
            command += ["--history", str(self.history)]
        if self.create_store:
            command.append("--create-store")
        command += self.args
        env = {
            **os.environ,
            **self.env,
            **(extra_env or {}),
            "HB_SECRET": self.secret,
            "HB_STORE": self.store_url,
        }
        env.pop("CREDENTIALS_DIRECTORY", None)
        with open(self.log_dir / f"{spec.node}.log", "ab") as log:
            process = subprocess.Popen(
                command, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log
            )
        self.processes[spec.node] = process
        return process

    def pid(self, node: str) -> int:
        return self.processes[node].pid

    def alive(self, node: str) -> bool:
        process = self.processes.get(node)
        return process is not None and process.poll() is None

    def signal(self, node: str, signum: signal.Signals) -> None:
        self.processes[node].send_signal(signum)

    def kill(self, node: str) -> None:
        """SIGKILL: the machine is gone, nothing is cleaned up."""
        process = self.processes[node]
        process.kill()
        process.wait(timeout=10)

    def stop_all(self, timeout: float = 15.0) -> dict[str, int | None]:
        """SIGTERM every live node (graceful), SIGKILL what does not stop in time."""
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGCONT)  # a paused node cannot handle SIGTERM
                process.terminate()
        codes: dict[str, int | None] = {}
        for node, process in self.processes.items():
            try:
                codes[node] = process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
                codes[node] = None
        return codes

    def log(self, node: str) -> str:
        path = self.log_dir / f"{node}.log"
        return path.read_text(errors="replace") if path.exists() else ""
