"""Network namespaces for partition tests: a server namespace and one per node.

``Network`` creates ``hb-p-<random>-srv`` with a bridge, and for every node a
namespace ``hb-p-<random>-<node>`` joined to that bridge by a veth pair, all on
a private /24 (10.213.x.0/24) that exists only inside these namespaces: nothing
is added to the host's own namespace, and the processes inside can reach only
each other. Partitions are nftables rules in the server namespace (dropping in
both directions, or only the server's replies); ``heal`` removes them.
``close`` ends what still runs inside, deletes every namespace (their links go
with them) and checks that none is left. A child that must drop root (a
PostgreSQL server) joins a namespace itself, ``enter_namespace``, instead of
running under ``ip netns exec``.

Needs root, ``ip`` (iproute2) and ``nft`` (nftables): ``require_netns`` skips
the test without them, except in CI (``CI=true``), where that is a failure.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import secrets
import shutil
import signal
import subprocess
import time

import pytest

__all__ = ["Network", "enter_namespace", "require_netns"]

_TABLE = "hb_partition"
_TIMEOUT_S = 10.0  # for each ip/nft command
_CLONE_NEWNET = 0x40000000


def require_netns() -> None:
    """Skip (fail in CI) unless we are root with ip and nft."""
    missing = [tool for tool in ("ip", "nft") if shutil.which(tool) is None]
    why = None
    if os.geteuid() != 0:
        why = "network namespaces need root"
    elif missing:
        why = f"{', '.join(missing)} not installed (apt-get install iproute2 nftables)"
    if why is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)


def enter_namespace(ns: str) -> None:
    """Join network namespace ns (in a child, as root, before it drops root): the network
    half of ``ip netns exec`` (os.setns is Python 3.12's)."""
    fd = os.open(f"/run/netns/{ns}", os.O_RDONLY)
    try:
        if ctypes.CDLL(None, use_errno=True).setns(fd, _CLONE_NEWNET) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"setns into {ns}: {os.strerror(errno)}")
    finally:
        os.close(fd)


def _run(*command: str, stdin: str | None = None) -> str:
    done = subprocess.run(
        command, input=stdin, capture_output=True, text=True, timeout=_TIMEOUT_S, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed: {done.stderr.strip()}")
    return done.stdout


class Network:
    """A server namespace and one namespace per node, on one bridge."""

    def __init__(self, nodes: list[str]) -> None:
        self.name = f"hb-p-{secrets.token_hex(3)}"
        subnet = f"10.213.{secrets.randbelow(256)}"
        self.server = f"{self.name}-srv"
        self.server_addr = f"{subnet}.1"
        self.namespaces = {node: f"{self.name}-{node}" for node in nodes}
        self.addrs = {node: f"{subnet}.{10 + i}" for i, node in enumerate(nodes)}
        self._made: list[str] = []
        try:
            self._create()
        except BaseException:
            self.close()
            raise

    def _add_namespace(self, ns: str) -> None:
        _run("ip", "netns", "add", ns)
        self._made.append(ns)
        _run("ip", "-n", ns, "link", "set", "lo", "up")

    def _create(self) -> None:
        self._add_namespace(self.server)
        _run("ip", "-n", self.server, "link", "add", "name", "br0", "type", "bridge")
        _run("ip", "-n", self.server, "addr", "add", f"{self.server_addr}/24", "dev", "br0")
        _run("ip", "-n", self.server, "link", "set", "br0", "up")
        for i, (node, ns) in enumerate(self.namespaces.items()):
            self._add_namespace(ns)
            port = f"p{i}"
            _run("ip", "-n", self.server, "link", "add", "name", port, "type", "veth",
                 "peer", "name", "eth0", "netns", ns)  # fmt: skip
            _run("ip", "-n", self.server, "link", "set", port, "master", "br0", "up")
            _run("ip", "-n", ns, "addr", "add", f"{self.addrs[node]}/24", "dev", "eth0")
            _run("ip", "-n", ns, "link", "set", "eth0", "up")

    def prefix(self, node: str | None = None) -> list[str]:
        """The command prefix that runs a process in node's namespace (the server's for None)."""
        return ["ip", "netns", "exec", self.namespaces[node] if node else self.server]

    def partition(self, node: str, *, one_way: bool = False) -> None:
        """Drop node's traffic at the server: both ways, or (one_way) only the server's replies.

        One way, the node's packets still reach the server (requests on an open
        connection arrive and are applied) but nothing comes back.
        """
        addr = self.addrs[node]
        rules = [
            f"add table inet {_TABLE}",
            f"add chain inet {_TABLE} output {{ type filter hook output priority 0 ; }}",
            f"add rule inet {_TABLE} output ip daddr {addr} drop",
        ]
        if not one_way:
            rules += [
                f"add chain inet {_TABLE} input {{ type filter hook input priority 0 ; }}",
                f"add rule inet {_TABLE} input ip saddr {addr} drop",
            ]
        _run(*self.prefix(), "nft", "-f", "-", stdin="\n".join(rules) + "\n")

    def heal(self) -> None:
        _run(*self.prefix(), "nft", "delete", "table", "inet", _TABLE)

    def close(self) -> None:
        """End what still runs inside, delete every namespace, check none is left."""
        for ns in self._made:
            try:
                pids = _run("ip", "netns", "pids", ns).split()
            except RuntimeError:
                continue
            for pid in pids:  # only processes this test started live in its namespaces
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
        errors = []
        for ns in reversed(self._made):
            try:
                _run("ip", "netns", "del", ns)
            except RuntimeError as exc:
                errors.append(str(exc))
        self._made.clear()
        deadline = time.monotonic() + 10
        while True:
            left = [line for line in _run("ip", "netns", "list").splitlines()
                    if line.startswith(self.name)]  # fmt: skip
            if not left or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert not left and not errors, (left, errors)
