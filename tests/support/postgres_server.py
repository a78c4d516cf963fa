"""A throwaway PostgreSQL cluster (Debian package ``postgresql``) on a free loopback port.

Tests share one server per session (``shared_postgres()``), each test in its own
table (``postgres_url()``); tests that stop a server start a private one
(``PostgresServer.start``). initdb and postgres refuse to run as root, so under
root (as in CI) the cluster's files belong to ``nobody`` and both run as it. The
server keeps fsync and synchronous_commit on, as a real one must; its only
socket besides 127.0.0.1 is a Unix socket in its own directory. A partition test
starts one in a network namespace instead (``netns=``), listening on that
namespace's address and taking password logins from its subnet. Without the
binaries the tests skip, except in CI (``CI=true``), where a missing server is a
failure: .ci/run installs it.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.netns import enter_namespace
from tests.support.server_process import die_with_parent, free_port, require_binary

__all__ = ["PostgresServer", "postgres_url", "require_postgres", "shared_postgres"]

START_TIMEOUT_S = 30.0
SUPERUSER = "postgres"
DATABASE = "postgres"


def require_postgres() -> Path:
    """The directory of the newest installed server's binaries (initdb, postgres)."""
    found = glob.glob("/usr/lib/postgresql/*/bin")
    newest_first = sorted(found, key=lambda d: int(Path(d).parent.name), reverse=True)
    return Path(require_binary("postgres", "postgresql", os.pathsep.join(newest_first))).parent


def _as_owner(owner: pwd.struct_passwd | None, netns: str | None = None) -> Callable[[], None]:
    """In the child: join network namespace netns (if given; while still root), become owner
    (when running as root), then die with the test process (in that order: a change of
    user clears the parent-death signal)."""

    def prepare() -> None:
        if netns is not None:
            enter_namespace(netns)
        if owner is not None:
            os.setgroups([])
            os.setgid(owner.pw_gid)
            os.setuid(owner.pw_uid)
        die_with_parent()

    return prepare


class PostgresServer:
    """One postgres process and its data directory, in a temporary directory of its own."""

    def __init__(
        self,
        bindir: Path,
        workdir: Path,
        owner: pwd.struct_passwd | None,
        settings: list[str],
        netns: str | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        self.bindir = bindir
        self.workdir = workdir
        self.owner = owner
        self.settings = settings
        self.netns = netns
        self.host = host
        self.password = secrets.token_urlsafe(12)
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None

    @classmethod
    def start(
        cls, *settings: str, netns: str | None = None, host: str = "127.0.0.1", port: int = 0
    ) -> PostgresServer:
        """initdb a cluster, start its server on port (a free one for 0) and wait (bounded)
        until it is ready; settings (``name=value``) go to the server's command line.

        With netns, the server runs in that network namespace (tests/support/netns.py),
        listening on host there, and takes password logins from host's subnet."""
        bindir = require_postgres()
        owner = pwd.getpwnam("nobody") if os.geteuid() == 0 else None
        workdir = Path(tempfile.mkdtemp(prefix="hb-postgres-"))
        server = cls(bindir, workdir, owner, list(settings), netns, host)
        if owner is not None:
            os.chown(workdir, owner.pw_uid, owner.pw_gid)
        server._initdb()
        # A free port can be taken before the server binds it: then it exits, and we try another.
        for _attempt in range(1 if port else 3):
            if server._run(port or free_port()):
                return server
        pytest.fail(f"postgres was not ready within {START_TIMEOUT_S} s:\n{server.log_tail()}")

    def _initdb(self) -> None:
        password_file = self.workdir / "password"
        password_file.write_text(self.password)
        if self.owner is not None:
            os.chown(password_file, self.owner.pw_uid, self.owner.pw_gid)
        # The database's collation is a language's (ICU's en-US, where "-" and "/" weigh
        # nothing), so that keys sort by code point only through the table's own COLLATE "C".
        # --no-sync: initdb's closing sync of a throwaway cluster is all it skips; the
        # server then runs with fsync on.
        done = subprocess.run(
            [self.bindir / "initdb", "-D", self.workdir / "data", "-U", SUPERUSER,
             "--pwfile", password_file, "--auth-local", "trust", "--auth-host", "scram-sha-256",
             "-E", "UTF8", "--locale", "C", "--locale-provider", "icu", "--icu-locale", "en-US",
             "--no-sync"],
            capture_output=True, timeout=120, preexec_fn=_as_owner(self.owner),
        )  # fmt: skip
        if done.returncode != 0:
            pytest.fail(f"initdb failed:\n{done.stderr.decode(errors='replace')[-2000:]}")
        if self.netns is not None:
            # initdb lets in loopback clients only; "samenet": any of the server's subnets.
            with open(self.workdir / "data" / "pg_hba.conf", "a") as hba:
                hba.write("host all all samenet scram-sha-256\n")

    def _run(self, port: int) -> bool:
        """Start the server on port; whether it became ready (bounded)."""
        with open(self.workdir / "postgres.log", "ab") as log:
            self.process = subprocess.Popen(
                [self.bindir / "postgres", "-D", self.workdir / "data", "-p", str(port),
                 "-c", f"listen_addresses={self.host}", "-c", f"unix_socket_directories={self.workdir}",
                 "-c", "fsync=on", "-c", "synchronous_commit=on", "-c", "shared_buffers=16MB",
                 *[arg for setting in self.settings for arg in ("-c", setting)]],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                preexec_fn=_as_owner(self.owner, self.netns),
            )  # fmt: skip
        self.port = port
        # The server writes "ready" as the status line of its pid file once it takes
        # connections (a crashed server's file says so too, under its own pid).
        pid_file = self.workdir / "data" / "postmaster.pid"
        deadline = time.monotonic() + START_TIMEOUT_S
        while self.process.poll() is None and time.monotonic() < deadline:
            lines = pid_file.read_text().splitlines() if pid_file.exists() else []
            if (
                len(lines) >= 8
                and lines[0] == str(self.process.pid)
                and lines[7].strip() == "ready"
            ):
                return True
            time.sleep(0.02)
        self.halt()
        return False

    def url(self, table: str | None = None, query: str = "") -> str:
        """A store URL on this server: a fresh random table unless one is given."""
        table = table or f"t_{uuid.uuid4().hex}"
        return (
            f"postgresql://{SUPERUSER}:{self.password}@{self.host}:{self.port}/{DATABASE}"
            f"?table={table}" + (f"&{query}" if query else "")
        )

    def raw_conninfo(self) -> str:
        """What a client other than the store (a raw writer, a test's probe) connects with."""
        return f"postgresql://{SUPERUSER}:{self.password}@{self.host}:{self.port}/{DATABASE}"

    def halt(self) -> None:
        """Stop the server (a fast shutdown: clients are cut off), keeping its data and port."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.signal_all(signal.SIGCONT)  # a frozen server takes no other signal
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.signal_all(signal.SIGKILL)
                self.process.wait()

    def signal_all(self, signum: int) -> None:
        """Send signum to the server and every process it started (each backend leads a
        process group of its own, so not to the server's group)."""
        assert self.process is not None
        pid = self.process.pid
        children = Path(f"/proc/{pid}/task/{pid}/children")
        pids = [int(child) for child in children.read_text().split()] if children.exists() else []
        for each in [pid, *pids]:
            with contextlib.suppress(ProcessLookupError):  # a backend that just ended
                os.kill(each, signum)

    def kill(self) -> None:
        """SIGKILL the server and its processes, as a crash: the data stays for start_again."""
        assert self.process is not None
        self.signal_all(signal.SIGKILL)
        self.process.wait(timeout=10)

    def start_again(self) -> None:
        """Start a halted server on the same port and data; wait (bounded) until it is ready."""
        if not self._run(self.port):
            pytest.fail(f"postgres was not ready again within {START_TIMEOUT_S} s")

    def log_tail(self) -> str:
        log = self.workdir / "postgres.log"
        return log.read_text(errors="replace")[-2000:] if log.exists() else "(no log)"

    def stop(self) -> None:
        self.halt()
        shutil.rmtree(self.workdir, ignore_errors=True)


_shared: PostgresServer | None = None


def shared_postgres() -> PostgresServer:
    """The session's server: started on first use, stopped when the test process exits."""
    global _shared
    if _shared is None or _shared.process is None or _shared.process.poll() is not None:
        _shared = PostgresServer.start()
        atexit.register(_shared.stop)
    return _shared


def postgres_url(query: str = "") -> str:
    """A URL of the shared server, in a table no other test uses."""
    return shared_postgres().url(query=query)
