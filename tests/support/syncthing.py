"""Real Syncthing instances on loopback, syncing one shared folder: the test bed of ``syncdir://``.

Issue 20's store keeps a folder that Syncthing holds in step across nodes; its
tests need a real sync tool, not a fake that copies files, because what the
store must survive is Syncthing's own timing (watcher delay, index exchange,
pulls) and its behaviour across a partition. ``syncthing_mesh(root, n)``
starts n (2 or 3) ``syncthing`` processes (Debian package ``syncthing``), each
with its own home (keys, config, database, log) and its own folder under root,
all sharing one folder id, every device knowing every other by ID and
``tcp://127.0.0.1:PORT``. Without syncthing the tests skip, except in CI
(``CI=true``), where a missing server is a failure: .ci/run installs it.

Traffic stays on loopback: the GUI/REST API and the sync protocol listen on
127.0.0.1 only, on ports chosen here, and global and local discovery, relays,
NAT traversal (UPnP, NAT-PMP, STUN), usage and crash reporting, upgrade checks
and the browser are all switched off in config.xml *before* the first start
(set through the REST API afterwards, the first seconds could already reach
out). Devices and the folder are then configured through the REST API, with the
API key Syncthing generated into config.xml.

Syncthing puts files of its own in the folder, which a store must skip when it
lists the folder: the folder marker ``.stfolder`` (left in place: without it
Syncthing stops the folder, taking an empty folder for an unmounted disk),
temporaries ``.syncthing.NAME.tmp`` while a pull is under way (renamed onto
NAME when complete, so NAME never appears half-written), and
``NAME.sync-conflict-DATE-TIME-DEVICE.EXT`` when two devices changed one file
concurrently (the store never lets two nodes write one file, so it should
never see one).

A partition is ``SyncthingInstance.pause()``: on each link between the
instance and another, both ends pause the other device, which closes the
connection and makes each end refuse the other's attempts to reconnect, while
every folder keeps being watched and scanned and the other instances stay
connected among themselves. That is a cut network link, not a stopped node:
each side goes on recording its own writes and learns of the other's only
after ``resume()``, which heals in well under a second (up to ~5 s when it
follows the pause at once: Syncthing limits how soon it redials). Pausing the
folder instead would also stop the instance noticing its own writes; SIGSTOP
would be a frozen node, not a partition.

Every wait is bounded (``TIMEOUT_S`` unless told) and fails with the last lines
of each instance's log (``HOME/syncthing.log``); every process is stopped and
reaped when the ``syncthing_mesh`` block is left, however it is left.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import secrets
import signal
import statistics
import subprocess
import time
import urllib.parse
import urllib.request
import warnings
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeAlias

import pytest

from tests.support import wait_until
from tests.support.server_process import die_with_parent, free_port, require_binary

__all__ = [
    "FOLDER_ID",
    "TIMEOUT_S",
    "SyncthingInstance",
    "SyncthingMesh",
    "describe_delays",
    "require_syncthing",
    "syncthing_mesh",
]

FOLDER_ID = "hb-syncdir"
TIMEOUT_S = 60.0
START_TIMEOUT_S = 30.0
# The least Syncthing accepts: a change is scanned about a second after it is made.
WATCHER_DELAY_S = 1
# A backstop only (the watcher sees changes first): a missed inotify event costs 10 s at most.
RESCAN_INTERVAL_S = 10
# How soon a device dials a lost peer again (default 60 s): a resumed partition heals in ~1 s.
RECONNECT_INTERVAL_S = 1
LOG_TAIL_LINES = 30

IPAddress: TypeAlias = ipaddress.IPv4Address | ipaddress.IPv6Address

# Set before the first start: everything that would reach beyond loopback is off.
_LOOPBACK_ONLY_OPTIONS = {
    "globalAnnounceEnabled": "false",
    "localAnnounceEnabled": "false",
    "relaysEnabled": "false",
    "natEnabled": "false",
    "announceLANAddresses": "false",
    "stunKeepaliveStartS": "0",  # 0: no STUN
    "urAccepted": "-1",  # -1: usage reporting declined for good
    "crashReportingEnabled": "false",
    "autoUpgradeIntervalH": "0",
    "startBrowser": "false",
    "restartOnWakeup": "false",
    "setLowPriority": "false",  # no nice: delays measured here are Syncthing's, not the scheduler's
    "reconnectionIntervalS": str(RECONNECT_INTERVAL_S),
}
# Environment of each process: no upgrades, no restarts by the monitor, no default folder.
_ENV = {"STNOUPGRADE": "1", "STNORESTART": "1", "STNODEFAULTFOLDER": "1"}
# Not even a proxy named in the environment may carry the REST calls off loopback.
_LOOPBACK_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def require_syncthing() -> str:
    return require_binary("syncthing", "syncthing")


class SyncthingInstance:
    """One syncthing process: its home (keys, config, database, log), folder and REST API."""

    def __init__(self, binary: str, name: str, home: Path, folder: Path) -> None:
        self.binary = binary
        self.name = name
        self.home = home
        self.folder = folder
        self.log = home / "syncthing.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.gui_port = 0
        self.sync_port = 0
        self.api_key = ""
        self.device_id = ""
        self.peers: list[SyncthingInstance] = []
        self.dials: list[SyncthingInstance] = []  # the peers this instance dials (join)
        # Why Syncthing's filesystem watcher could not start, if it could not (check_watcher).
        self.watcher_error: str | None = None

    @property
    def address(self) -> str:
        """Where the others dial this instance (its sync protocol listener)."""
        return f"tcp://127.0.0.1:{self.sync_port}"

    def generate(self) -> None:
        """Keys and a config.xml by Syncthing's own CLI; read back its device ID and API key."""
        command = [self.binary, "generate", f"--home={self.home}", "--no-default-folder",
                   "--skip-port-probing"]  # fmt: skip
        done = subprocess.run(command, capture_output=True, env={**os.environ, **_ENV}, timeout=30)
        if done.returncode != 0:
            pytest.fail(f"syncthing generate failed: {done.stdout!r} {done.stderr!r}")
        root = ElementTree.parse(self.home / "config.xml").getroot()
        self.device_id = _text(root, "device", "id")
        self.api_key = _text(root, "gui/apikey")

    def _configure_ports(self) -> None:
        """Fresh free loopback ports and the loopback-only options, written into config.xml."""
        self.gui_port, self.sync_port = free_port(), free_port()
        config = self.home / "config.xml"
        tree = ElementTree.parse(config)
        root = tree.getroot()
        _element(root, "gui/address").text = f"127.0.0.1:{self.gui_port}"
        _element(root, "options/listenAddress").text = self.address
        for option, value in _LOOPBACK_ONLY_OPTIONS.items():
            _element(root, f"options/{option}").text = value
        tree.write(config)

    def spawn(self) -> None:
        """Start the process on fresh ports, without waiting for it (``wait_started`` does)."""
        self._configure_ports()
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                [self.binary, "serve", f"--home={self.home}", "--no-browser",
                 "--no-restart", "--no-upgrade", "--logflags=3"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env={**os.environ, **_ENV}, preexec_fn=die_with_parent,
            )  # fmt: skip

    def wait_started(self) -> None:
        """Wait (bounded) until the API answers and the instance listens for peers.

        A port free when chosen can be taken before Syncthing binds it: then
        the GUI's bind makes it exit, or the listener reports an error, and we
        try other ports.
        """
        for _attempt in range(3):
            if self._wait_listening():
                return
            self.kill()
            self.spawn()
        pytest.fail(f"{self.name} did not start within {START_TIMEOUT_S} s:\n{self.log_tail()}")

    def _wait_listening(self) -> bool:
        deadline = time.monotonic() + START_TIMEOUT_S
        while self.process is not None and self.process.poll() is None:
            if time.monotonic() > deadline:
                return False
            try:
                listeners = self.api("GET", "/rest/system/status")["connectionServiceStatus"]
            except OSError:
                listeners = {}
            status = listeners.get(self.address)
            if status is not None:
                return status.get("error") is None
            time.sleep(0.05)
        return False

    def api(self, method: str, path: str, body: object = None, **query: str) -> Any:
        """One REST call (bounded at 30 s, a scan can take a while); the decoded JSON answer."""
        url = f"http://127.0.0.1:{self.gui_port}{path}"
        if query:
            url += "?" + urllib.parse.urlencode(query)
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            url,
            data=data,
            method=method,
            headers={"X-API-Key": self.api_key, "Content-Type": "application/json"},
        )
        with _LOOPBACK_OPENER.open(request, timeout=30) as answer:
            content = answer.read()
        return json.loads(content) if content.strip() else None

    def join(self, peers: list[SyncthingInstance], dials: list[SyncthingInstance]) -> None:
        """Know every peer by ID, and share the folder with all of them; dial those in dials.

        Each pair of instances has one dialler: when both ends dial at once,
        Syncthing 1.19 can leave one connection waiting 20 s for a Hello. The
        others are known by ID alone ("dynamic": with discovery off, never
        dialled) and accepted when they call. The peers are added paused, and
        resumed (``resume``) once every instance knows every other: a peer
        dialled before it knows the dialler stalls the same 20 s.
        """
        self.peers, self.dials = peers, dials
        for peer in peers:
            self.api(
                "POST",
                "/rest/config/devices",
                {
                    "deviceID": peer.device_id,
                    "name": peer.name,
                    "paused": True,
                    "addresses": [peer.address] if peer in dials else ["dynamic"],
                },
            )
        self.folder.mkdir(parents=True, exist_ok=True)
        self.api(
            "POST",
            "/rest/config/folders",
            {
                "id": FOLDER_ID,
                "label": FOLDER_ID,
                "path": str(self.folder),
                "type": "sendreceive",
                "devices": [{"deviceID": d.device_id} for d in [self, *peers]],
                "fsWatcherEnabled": True,
                "fsWatcherDelayS": WATCHER_DELAY_S,
                "rescanIntervalS": RESCAN_INTERVAL_S,
            },
        )

    def check_watcher(self) -> None:
        """If the filesystem watcher failed, rescan every second instead, with a warning.

        Syncthing's watcher needs an inotify instance, and on a machine whose
        processes hold all ``fs.inotify.max_user_instances`` (128 by default,
        per user) it cannot have one: it retries a minute later, and meanwhile
        a change would wait for the next rescan. A rescan each second keeps
        changes crossing in about a second; the warning says the delays
        measured are not the watcher's.
        """
        self.watcher_error = self.api("GET", "/rest/db/status", folder=FOLDER_ID).get("watchError")
        if self.watcher_error:
            warnings.warn(
                f"{self.name}: Syncthing's filesystem watcher failed "
                f"({self.watcher_error}); rescanning every second instead",
                stacklevel=2,
            )
            self.api("PATCH", f"/rest/config/folders/{FOLDER_ID}", {"rescanIntervalS": 1})

    def connected_to(self, peer: SyncthingInstance) -> bool:
        """Whether this instance has a live connection to peer (as it reports it)."""
        connections = self.api("GET", "/rest/system/connections")["connections"]
        return bool(connections.get(peer.device_id, {}).get("connected"))

    def pause(self) -> None:
        """Cut this instance off from all others: both ends of each of its links pause the other.

        The dialling end pauses first, so it never redials a peer that
        refuses it (a refused dial backs off for many seconds).
        """
        for peer in self.peers:
            dialler, other = (self, peer) if peer in self.dials else (peer, self)
            dialler._set_paused(other, True)
            other._set_paused(dialler, True)

    def resume(self) -> None:
        """Heal the partition: on each link the end that does not dial resumes first.

        The dialler resumes last and, a resumed device being dialled without
        waiting for the next round, reconnects at once.
        """
        for peer in self.peers:
            dialler, other = (self, peer) if peer in self.dials else (peer, self)
            other._set_paused(dialler, False)
            dialler._set_paused(other, False)

    def _set_paused(self, peer: SyncthingInstance, paused: bool) -> None:
        self.api("POST", f"/rest/system/{'pause' if paused else 'resume'}", device=peer.device_id)

    def scan(self) -> None:
        """Scan the folder now (the call returns when the scan is done): local writes are known."""
        self.api("POST", "/rest/db/scan", folder=FOLDER_ID)

    def in_sync_with_peers(self) -> bool:
        """Idle, needing nothing, connected to every peer, and every peer complete as far as known."""
        status = self.api("GET", "/rest/db/status", folder=FOLDER_ID)
        if status.get("state") != "idle" or status.get("needTotalItems", 1) != 0:
            return False
        for peer in self.peers:
            if not self.connected_to(peer):
                return False
            completion = self.api(
                "GET", "/rest/db/completion", folder=FOLDER_ID, device=peer.device_id
            )
            if completion.get("completion") != 100 or completion.get("needItems", 1) != 0:
                return False
        return True

    def global_state(self) -> tuple[int, int, int]:
        """(files, bytes, deleted) of the folder's global state as this instance knows it."""
        status = self.api("GET", "/rest/db/status", folder=FOLDER_ID)
        return status["globalFiles"], status["globalBytes"], status["globalDeleted"]

    def write(self, relative: str, data: bytes) -> None:
        """Write a file of the folder atomically (renamed into place: never scanned half-written)."""
        target = self.folder / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = self.home / f"staging-{secrets.token_hex(4)}"
        staging.write_bytes(data)
        os.replace(staging, target)

    def read(self, relative: str) -> bytes | None:
        """The file's bytes, or None while it does not exist."""
        try:
            return (self.folder / relative).read_bytes()
        except FileNotFoundError:
            return None

    def sockets(self) -> list[tuple[str, IPAddress, IPAddress]]:
        """(protocol, local address, remote address) of every inet socket the processes hold."""
        if self.process is None or self.process.poll() is not None:
            return []
        found = []
        for pid in [self.process.pid, *_descendants(self.process.pid)]:
            inodes = set()
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                with contextlib.suppress(OSError):
                    target = os.readlink(fd)
                    if target.startswith("socket:["):
                        inodes.add(target[len("socket:[") : -1])
            for protocol in ("tcp", "tcp6", "udp", "udp6"):
                rows = Path(f"/proc/{pid}/net/{protocol}").read_text().splitlines()[1:]
                for row in rows:
                    fields = row.split()
                    if fields[9] in inodes:
                        found.append((protocol, _proc_address(fields[1]), _proc_address(fields[2])))
        return found

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except FileNotFoundError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """SIGTERM (after SIGCONT, should it be frozen), SIGKILL after 10 s; always reaped.

        The monitor passes SIGTERM on to its child and exits when the child has.
        """
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGCONT)
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        """SIGKILL the monitor and its syncthing child, as a crash, and reap.

        ``syncthing serve`` runs a monitor process that starts the real one as
        its child, in a process group of its own (even with --no-restart): the
        child is killed by pid, or it would outlive the monitor.
        """
        if self.process is None:
            return
        for pid in _descendants(self.process.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        # The monitor reaps its child and exits by itself; killed first, it would
        # leave the child a zombie for pid 1, which in a container may never reap it.
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=2)
        self.process.kill()
        self.process.wait(timeout=10)


class SyncthingMesh:
    """The started instances, all syncing FOLDER_ID with each other, and bounded waits on them."""

    def __init__(self, instances: list[SyncthingInstance]) -> None:
        self.instances = instances

    def __getitem__(self, index: int) -> SyncthingInstance:
        return self.instances[index]

    def __iter__(self) -> Iterator[SyncthingInstance]:
        return iter(self.instances)

    def __len__(self) -> int:
        return len(self.instances)

    def logs(self) -> str:
        """The last lines of every instance's log, for a failure message."""
        return "\n".join(f"----- {i.name} ({i.log}) -----\n{i.log_tail()}" for i in self)

    def _wait(self, probe: Callable[[], object], what: str, timeout: float) -> None:
        try:
            wait_until(probe, what, timeout)
        except pytest.fail.Exception as failure:
            pytest.fail(f"{failure.msg}\n{self.logs()}")
        except OSError as error:  # an instance's API stopped answering: it died or hangs
            pytest.fail(f"waiting for {what}: {error!r}\n{self.logs()}")

    def wait_until(
        self,
        instance: SyncthingInstance,
        relative: str,
        predicate: Callable[[bytes | None], bool],
        timeout: float = TIMEOUT_S,
    ) -> None:
        """Wait until predicate holds for the file's bytes (None: absent) on instance."""
        self._wait(
            lambda: predicate(instance.read(relative)),
            f"{relative} on {instance.name} to satisfy {predicate}",
            timeout,
        )

    def wait_for_file(
        self, instance: SyncthingInstance, relative: str, data: bytes, timeout: float = TIMEOUT_S
    ) -> None:
        """Wait until the file on instance holds exactly data."""
        self._wait(
            lambda: instance.read(relative) == data,
            f"{relative} on {instance.name} to hold its {len(data)} bytes",
            timeout,
        )

    def stays_absent(self, instance: SyncthingInstance, relative: str, seconds: float) -> bool:
        """True if the file did not appear on instance within seconds (polled, not slept through)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if (instance.folder / relative).exists():
                return False
            time.sleep(0.01)
        return not (instance.folder / relative).exists()

    def wait_connected(self, timeout: float = TIMEOUT_S) -> None:
        """Wait until every instance reports a live connection to every other."""
        self._wait(
            lambda: all(i.connected_to(p) for i in self for p in i.peers),
            "every instance to connect to every other",
            timeout,
        )

    def wait_disconnected(self, instance: SyncthingInstance, timeout: float = TIMEOUT_S) -> None:
        """Wait until instance and the others all see each other as disconnected."""
        self._wait(
            lambda: (
                not any(
                    instance.connected_to(p) or p.connected_to(instance) for p in instance.peers
                )
            ),
            f"{instance.name} to be cut off from the others",
            timeout,
        )

    def wait_in_sync(self, timeout: float = TIMEOUT_S) -> None:
        """Wait until all instances are connected, idle, need nothing and agree on the folder.

        Each instance scans first, so writes its watcher has not reported yet
        count too. Never true while an instance is paused.
        """
        try:
            for instance in self:
                instance.scan()
        except OSError as error:
            pytest.fail(f"scanning before waiting for sync: {error!r}\n{self.logs()}")

        def in_sync() -> bool:
            return (
                all(i.in_sync_with_peers() for i in self)
                and len({i.global_state() for i in self}) == 1
            )

        self._wait(in_sync, "every instance to be idle and in sync", timeout)

    def measure_delay(
        self,
        source: SyncthingInstance,
        target: SyncthingInstance,
        size: int = 1024,
        timeout: float = TIMEOUT_S,
    ) -> float:
        """Seconds from a fresh file's write on source to its byte-identical arrival on target."""
        relative = f"probe-{secrets.token_hex(6)}"
        data = secrets.token_bytes(size)
        started = time.monotonic()
        source.write(relative, data)
        self.wait_for_file(target, relative, data, timeout)
        return time.monotonic() - started

    def measure_delays(
        self, source: SyncthingInstance, target: SyncthingInstance, count: int = 5, size: int = 1024
    ) -> list[float]:
        """count delays (seconds), measured one after the other (see ``describe_delays``)."""
        return [self.measure_delay(source, target, size) for _ in range(count)]

    def stop(self) -> None:
        """Stop every instance: all are sent SIGTERM first, so they wind down together."""
        for instance in self:
            if instance.process is not None and instance.process.poll() is None:
                instance.process.send_signal(signal.SIGCONT)
                instance.process.terminate()
        for instance in self:
            instance.stop()

    def pids(self) -> list[int]:
        """The pids of every instance's processes (monitor and child) still running."""
        return [
            pid
            for i in self
            if i.process and i.process.poll() is None
            for pid in (i.process.pid, *_descendants(i.process.pid))
        ]


@contextlib.contextmanager
def syncthing_mesh(root: Path, n: int = 2) -> Iterator[SyncthingMesh]:
    """n instances under root (node-a, node-b, ...), connected and in sync on an empty folder.

    Every process is stopped and reaped when the block is left, however it is
    left; the homes (with their logs) stay under root.
    """
    binary = require_syncthing()
    names = [f"node-{chr(ord('a') + i)}" for i in range(n)]
    instances = [
        SyncthingInstance(binary, name, root / name / "home", root / name / "folder")
        for name in names
    ]
    mesh = SyncthingMesh(instances)
    try:
        for instance in instances:
            instance.generate()
            instance.spawn()
        for instance in instances:  # started side by side: each takes a second or two
            instance.wait_started()
        for index, instance in enumerate(instances):
            peers = [peer for peer in instances if peer is not instance]
            instance.join(peers, dials=instances[:index])
        for instance in instances:
            instance.resume()
        mesh.wait_connected()
        mesh.wait_in_sync()
        for instance in instances:
            instance.check_watcher()
        yield mesh
    finally:
        mesh.stop()


def _proc_address(field: str) -> IPAddress:
    """The address of a /proc/net/{tcp,udp}[6] "HEX:PORT" field (32-bit words in host order)."""
    raw = bytes.fromhex(field.split(":")[0])
    in_order = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return ipaddress.ip_address(in_order)


def _descendants(pid: int) -> list[int]:
    """The pids of pid's children and theirs, deepest first (from /proc)."""
    found: list[int] = []
    for children in Path(f"/proc/{pid}/task").glob("*/children"):
        with contextlib.suppress(OSError):
            for child in map(int, children.read_text().split()):
                found = [*_descendants(child), child, *found]
    return found


def describe_delays(delays: list[float]) -> str:
    """A one-line summary of measured delays, for a test's or a benchmark's output."""
    return (
        f"median {statistics.median(delays):.2f} s, max {max(delays):.2f} s over "
        f"{len(delays)}: " + " ".join(f"{d:.2f}" for d in delays)
    )


def _element(root: ElementTree.Element, path: str) -> ElementTree.Element:
    """The element at path, created (as Syncthing would read it) if this version lacks it."""
    found = root.find(path)
    if found is None:
        parent_path, _, tag = path.rpartition("/")
        parent = root.find(parent_path) if parent_path else root
        if parent is None:
            pytest.fail(f"config.xml has no <{parent_path}>")
        found = ElementTree.SubElement(parent, tag)
    return found


def _text(root: ElementTree.Element, path: str, attribute: str | None = None) -> str:
    found = root.find(path)
    value = None if found is None else (found.get(attribute) if attribute else found.text)
    if not value:
        pytest.fail(f"config.xml written by syncthing generate has no {path} {attribute or ''}")
    return value
