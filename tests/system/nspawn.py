"""Boot a real systemd in systemd-nspawn, for tests of the unit file and its friends.

A Debian root tree made by debootstrap is cached under CACHE_ROOT (it takes a
minute or more to build); every boot runs on a throwaway overlay of it, so the
cache is never written. Commands run inside with nsenter, because the container
is not registered with machined (there is no systemd on the host to register
with). Every subprocess and every wait here is bounded.

Host quirks this copes with, learnt on a Firecracker VM without systemd as PID 1
and with a hybrid cgroup layout (v1 controllers, v2 at /sys/fs/cgroup/unified):

- With --keep-unit and no host systemd, nspawn puts its `payload` and
  `supervisor` cgroups under its own cgroup and never removes them; from the
  root cgroup two containers would share them. So nspawn is started inside a
  fresh cgroup of its own, which is also what we kill and remove at the end.
- SYSTEMD_NSPAWN_UNIFIED_HIERARCHY=1 gives the container a plain cgroup v2
  tree, as on any current distribution, instead of the host's hybrid one.
- --console=read-only copies the boot messages to our log file without a
  reader on the container's console; console-getty is masked so no login
  prompt waits on it.

This module does not import pytest: the fixture in conftest.py turns
HarnessUnavailable into a skip (or a failure on CI).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TypeVar

T = TypeVar("T")

SUITE = "bookworm"
VARIANT = "minbase"
# procps: kill, ps and pgrep inside, for tests and for debugging.
PACKAGES = ("systemd", "systemd-sysv", "dbus", "python3", "python3-venv", "make", "procps")
# Bump when the way the tree is made changes, so old caches are not reused.
CACHE_FORMAT = 1
CACHE_ROOT = Path("/var/cache/hamsterbunker-tests")
DEFAULT_MIRROR = "http://deb.debian.org/debian"

BUILD_TIMEOUT = 20 * 60.0
# The extras `make install-systemd` installs (the Makefile's EXTRAS): their wheels too.
NODE_EXTRAS = "tui,redis,etcd,postgres"
BOOT_TIMEOUT = 120.0
SHUTDOWN_TIMEOUT = 30.0
POLL_INTERVAL = 0.2

# What commands inside see instead of the host's environment (which may carry
# PIP_*, VIRTUAL_ENV and the like that mean nothing in the container).
CONTAINER_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/root",
    "LANG": "C.UTF-8",
    "TERM": "dumb",
    "SYSTEMD_PAGER": "",
    "SYSTEMD_COLORS": "0",
}


class HarnessUnavailable(Exception):
    """This machine cannot run the harness (not root, tools missing, no cache)."""


class BootError(RuntimeError):
    """The container did not come up; the message carries the tail of its log."""


class CommandFailed(subprocess.CalledProcessError):
    """A command inside the container exited non-zero; str() shows its output."""

    def __str__(self) -> str:
        return (
            f"{self.cmd!r} exited {self.returncode}\n"
            f"--- stdout ---\n{self.stdout}\n--- stderr ---\n{self.stderr}"
        )


def wait_for(probe: Callable[[], T | None], what: str, timeout: float) -> T:
    """Poll probe until it returns something truthy; TimeoutError after timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(POLL_INTERVAL)


def run_bounded(
    cmd: Sequence[str | os.PathLike[str]],
    timeout: float,
    *,
    input: str | None = None,
    env: Mapping[str, str] | None = None,
    stdout: int | IO[str] | None = subprocess.PIPE,
    pass_fds: Sequence[int] = (),
) -> subprocess.CompletedProcess[str]:
    """subprocess.run that, on timeout or any interruption, kills the whole process group.

    subprocess.run kills only the direct child; debootstrap, and nsenter with
    --pid (which forks), leave grandchildren behind that way.
    """
    proc = subprocess.Popen(
        [os.fspath(c) for c in cmd],
        stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
        stdout=stdout,
        stderr=subprocess.PIPE if stdout == subprocess.PIPE else subprocess.STDOUT,
        text=True,
        env=None if env is None else dict(env),
        start_new_session=True,
        pass_fds=pass_fds,
    )
    try:
        out, err = proc.communicate(input, timeout=timeout)
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


# ---------------------------------------------------------------- the cached tree


def check_prerequisites() -> None:
    """Raise HarnessUnavailable saying exactly what is missing.

    debootstrap counts only while the root tree is not cached yet.
    """
    if os.geteuid() != 0:
        raise HarnessUnavailable("system tests need root (mounts, cgroups, systemd-nspawn)")
    tools = ["systemd-nspawn", "nsenter"] + ([] if cache_dir().is_dir() else ["debootstrap"])
    missing = [t for t in tools if not shutil.which(t)]
    if missing:
        packages = {"systemd-nspawn": "systemd-container", "nsenter": "util-linux"}
        raise HarnessUnavailable(
            f"system tests need {', '.join(missing)} "
            f"(apt-get install {' '.join(packages.get(t, t) for t in missing)})"
        )


def apt_mirror(suite: str = SUITE) -> str:
    """The Debian mirror this machine's apt uses for suite, so debootstrap uses it too."""
    sources = Path("/etc/apt/sources.list.d")
    for path in sorted(sources.glob("*.sources")) if sources.is_dir() else []:
        for stanza in path.read_text().split("\n\n"):
            fields: dict[str, str] = {}
            for line in stanza.splitlines():
                if line and not line.startswith("#") and ":" in line:
                    key, value = line.split(":", 1)
                    fields[key.strip().lower()] = value.strip()
            if (
                "deb" in fields.get("types", "").split()
                and suite in fields.get("suites", "").split()
            ):
                return fields["uris"].split()[0]
    for path in [Path("/etc/apt/sources.list"), *sorted(sources.glob("*.list"))]:
        for line in path.read_text().splitlines() if path.is_file() else []:
            words = re.sub(r"\[[^]]*\]", " ", line.split("#", 1)[0]).split()
            if len(words) >= 3 and words[0] == "deb" and words[2] == suite:
                return words[1]
    return DEFAULT_MIRROR


def cache_dir() -> Path:
    """Where the tree for this suite and package list lives; a new list means a new tree."""
    key = f"{CACHE_FORMAT}\n{SUITE}\n{VARIANT}\n{','.join(sorted(PACKAGES))}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return CACHE_ROOT / f"rootfs-{SUITE}-{digest}"


def _mounts_under(path: Path) -> list[Path]:
    """Mount points at or below path, deepest first (so they can be unmounted in order)."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = Path(line.split()[4].replace("\\040", " "))
        if point == path or path in point.parents:
            found.append(point)
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


def _remove_tree(path: Path) -> None:
    """rm -rf a tree we made, first unmounting whatever is left mounted in it."""
    for point in _mounts_under(path):
        run_bounded(["umount", "--lazy", point], timeout=30)
    run_bounded(["rm", "-rf", "--one-file-system", path], timeout=300)


@contextlib.contextmanager
def _cache_lock(timeout: float) -> Iterator[IO[str]]:
    """Hold CACHE_ROOT/.lock, waiting (bounded) while another pytest builds the tree."""
    CACHE_ROOT.mkdir(parents=True, exist_ok=True)
    with open(CACHE_ROOT / ".lock", "w") as lock:
        deadline = time.monotonic() + timeout
        told = False
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise HarnessUnavailable(
                        f"{CACHE_ROOT}/.lock stayed held for {timeout} s"
                    ) from None
                if not told:
                    print("nspawn: waiting for another process building the cache", file=sys.stderr)
                    told = True
                time.sleep(1)
        try:
            yield lock
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def ensure_rootfs() -> Path:
    """The cached root tree, debootstrapped first if it is not there yet.

    Built in a temporary directory beside the cache and renamed into place only
    when complete, so an interrupted build never leaves a tree that looks done.
    """
    final = cache_dir()
    if final.is_dir():
        return final
    with _cache_lock(BUILD_TIMEOUT + 60) as lock:
        if final.is_dir():  # built by someone else while we waited
            return final
        for stale in CACHE_ROOT.glob(".build-*"):  # left by an interrupted build
            _remove_tree(stale)
        mirror = apt_mirror()
        print(
            f"nspawn: building the {SUITE} root tree in {final} from {mirror} "
            f"(takes minutes, once)",
            file=sys.stderr,
        )
        started = time.monotonic()
        build = Path(tempfile.mkdtemp(prefix=f".build-{final.name}-", dir=CACHE_ROOT))
        log_path = CACHE_ROOT / f"{final.name}.build.log"
        try:
            with open(log_path, "w") as log:
                result = run_bounded(
                    [
                        "debootstrap",
                        f"--variant={VARIANT}",
                        f"--include={','.join(PACKAGES)}",
                        SUITE,
                        build / "root",
                        mirror,
                    ],
                    timeout=BUILD_TIMEOUT,
                    stdout=log,
                    # If we are SIGKILLed, debootstrap goes on; it keeps the
                    # lock, so nobody removes its tree from under it.
                    pass_fds=[lock.fileno()],
                )
            if result.returncode != 0:
                tail = "\n".join(log_path.read_text().splitlines()[-30:])
                raise HarnessUnavailable(
                    f"debootstrap failed ({result.returncode}), see {log_path}:\n{tail}"
                )
            root = build / "root"
            for deb in (root / "var/cache/apt/archives").glob("*.deb"):
                deb.unlink()
            # Each boot writes its own; an id shared by every container would be wrong.
            (root / "etc/machine-id").write_text("")
            os.rename(root, final)
        except subprocess.TimeoutExpired:
            raise HarnessUnavailable(
                f"debootstrap took more than {BUILD_TIMEOUT} s, see {log_path}"
            ) from None
        finally:
            _remove_tree(build)
        print(f"nspawn: root tree built in {time.monotonic() - started:.0f} s", file=sys.stderr)
        return final


# ---------------------------------------------------------------- one container


@dataclass
class Container:
    """A booted container: run commands in it, write files into it through root."""

    name: str
    root: Path  # host path of the container's /
    log_path: Path  # nspawn's output and the boot messages
    process: subprocess.Popen[bytes]  # systemd-nspawn
    leader: int = 0  # host pid of the container's PID 1
    _installed_from: Path | None = field(default=None, repr=False)

    def path(self, inside: str) -> Path:
        """The host path of an absolute path inside the container."""
        return self.root / inside.lstrip("/")

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError as e:
            return f"(no log: {e})"

    def run(
        self,
        *argv: str,
        check: bool = True,
        timeout: float = 60.0,
        input: str | None = None,
        user: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run argv inside, in every namespace of the container's PID 1.

        nsenter joins mount, uts, ipc, net, pid and cgroup namespaces (not user:
        the container has none of its own), so systemctl reaches the container's
        systemd over its private socket. The command starts from a clean
        environment (CONTAINER_ENV plus env); user runs it through runuser.
        Note that it is not in any of the container's cgroups.
        """
        cmd = [
            "nsenter",
            f"--target={self.leader}",
            "--mount",
            "--uts",
            "--ipc",
            "--net",
            "--pid",
            "--cgroup",
            "--",
        ]
        if user is not None:
            cmd += ["runuser", "-u", user, "--"]
        cmd += argv
        result = run_bounded(cmd, timeout, input=input, env={**CONTAINER_ENV, **(env or {})})
        if check and result.returncode != 0:
            raise CommandFailed(result.returncode, list(argv), result.stdout, result.stderr)
        return result

    def wait_until(self, predicate: Callable[[], T | None], what: str, timeout: float) -> T:
        """Poll predicate; on timeout raise with the tail of the container's log."""
        try:
            return wait_for(predicate, what, timeout)
        except TimeoutError as e:
            raise TimeoutError(f"{e}\n--- container log ---\n{self.log_tail()}") from None

    def install_project(self, repo: Path) -> None:
        """Install repo inside with its own `make install-systemd`, offline; once.

        Wheels for the project and every dependency are built on the host (same
        cp311 ABI as the container's Python), the tracked files go to /opt/src
        and the wheels to /opt/wheels; pip inside never reaches an index.
        """
        if self._installed_from == repo:
            return  # once per container: the repo does not change within a session
        wheelhouse = self.log_path.parent / "wheels"
        build_wheelhouse(repo, wheelhouse)
        copy_tracked_files(repo, self.path("/opt/src"))
        shutil.copytree(wheelhouse, self.path("/opt/wheels"), dirs_exist_ok=True)
        self.run(
            "make",
            "-C",
            "/opt/src",
            "install-systemd",
            timeout=600,
            env={"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": "/opt/wheels"},
        )
        self._installed_from = repo


def build_wheelhouse(repo: Path, dest: Path) -> None:
    """Wheels of repo's tracked files, its dependencies and its build backend.

    Built from a copy of the tracked files, so that neither untracked files nor
    a stale build/ directory in repo end up in the wheel. The build backend
    (pyproject's build-system.requires, plus wheel for older setuptools) is
    there for a `pip install .` inside, which builds in an isolated
    environment. The host's cp311 wheels (manylinux up to glibc 2.34) install
    on bookworm's Python 3.11.2 and glibc 2.36, so the container needs no network.
    """
    pyproject = tomllib.loads((repo / "pyproject.toml").read_text())
    requires: list[str] = pyproject["build-system"]["requires"]
    with tempfile.TemporaryDirectory(prefix="hb-wheel-src-") as src:
        copy_tracked_files(repo, Path(src))
        pip_wheel = [sys.executable, "-m", "pip", "wheel", "--quiet", "-w", str(dest)]
        # redis needs async-timeout on Python < 3.11.3, as bookworm's 3.11.2 is: a newer
        # host Python skips it, so it is asked for by name.
        for what in ([f"{src}[{NODE_EXTRAS}]"], [*requires, "wheel", "async-timeout>=4.0.3"]):
            result = run_bounded([*pip_wheel, *what], timeout=600)
            if result.returncode != 0:
                raise RuntimeError(f"pip wheel {' '.join(what)} failed:\n{result.stderr}")


def copy_tracked_files(repo: Path, dest: Path) -> None:
    """Copy the files git tracks in repo (as they are in the work tree) to dest."""
    listed = run_bounded(["git", "-C", repo, "ls-files", "-z"], timeout=60)
    listed.check_returncode()
    for name in filter(None, listed.stdout.split("\0")):
        source = repo / name
        if not source.exists() and not source.is_symlink():
            continue  # deleted in the work tree
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target, follow_symlinks=False)


def _prepare_root(root: Path, name: str) -> None:
    """Give this boot its own identity, and no login prompt on the console."""
    (root / "etc/machine-id").write_text(uuid.uuid4().hex + "\n")
    (root / "etc/hostname").write_text(name + "\n")
    getty = root / "etc/systemd/system/console-getty.service"
    getty.unlink(missing_ok=True)
    getty.symlink_to("/dev/null")


def _throwaway_root(stack: contextlib.ExitStack, lower: Path, workdir: Path) -> Path:
    """A writable copy of lower: an overlay on it, or a plain copy if overlay fails.

    The cleanups go onto stack, so they run even when boot fails later.
    """
    root = workdir / "root"
    upper, work = workdir / "upper", workdir / "work"
    for d in (root, upper, work):
        d.mkdir()
    mounted = run_bounded(
        [
            "mount",
            "-t",
            "overlay",
            "overlay",
            "-o",
            f"lowerdir={lower},upperdir={upper},workdir={work}",
            root,
        ],
        timeout=30,
    )
    if mounted.returncode == 0:
        stack.callback(_cleanup_overlay, root, upper, work)
        return root
    print(f"nspawn: overlay failed ({mounted.stderr.strip()}), copying", file=sys.stderr)
    root.rmdir()
    stack.callback(_remove_tree, root)
    run_bounded(["cp", "-a", "--reflink=auto", lower, root], timeout=600).check_returncode()
    return root


def _cleanup_overlay(root: Path, upper: Path, work: Path) -> None:
    """Unmount the overlay (bounded retries while it is busy), then remove its dirs."""

    def unmounted() -> bool:
        if root not in _mounts_under(root):
            return True
        run_bounded(["umount", root], timeout=30)
        return root not in _mounts_under(root)

    try:
        wait_for(unmounted, f"{root} to unmount", timeout=10)
    except TimeoutError:
        run_bounded(["umount", "--lazy", root], timeout=30).check_returncode()
    for d in (root, upper, work):
        run_bounded(["rm", "-rf", "--one-file-system", d], timeout=300)


# ---------------------------------------------------------------- cgroups


def _own_cgroups() -> list[Path]:
    """Our cgroup in the v2 hierarchy and, on a hybrid host, in name=systemd."""
    mounts: dict[str, Path] = {}
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        before, after = line.split(" - ", 1)
        fstype, _source, options = after.split()[:3]
        point = Path(before.split()[4])
        if fstype == "cgroup2":
            mounts.setdefault("", point)
        elif fstype == "cgroup" and "name=systemd" in options.split(","):
            mounts.setdefault("name=systemd", point)
    found = []
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers in mounts:
            found.append(mounts[controllers] / path.lstrip("/"))
    if not found:
        raise HarnessUnavailable("no cgroup v2 or name=systemd hierarchy mounted")
    return found


def _make_cgroups(name: str, made: list[Path]) -> None:
    """Create cgroup name beside ours in each hierarchy, appending each to made as it is."""
    for parent in _own_cgroups():
        (parent / name).mkdir()
        made.append(parent / name)


def _kill_cgroups(cgroups: list[Path]) -> None:
    """SIGKILL every process left in our cgroups (nspawn, and the container under it)."""
    for cg in cgroups:
        if (cg / "cgroup.kill").exists():
            (cg / "cgroup.kill").write_text("1")
        else:
            for procs in cg.rglob("cgroup.procs"):
                for pid in procs.read_text().split():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGKILL)


def _remove_cgroups(cgroups: list[Path]) -> None:
    """rmdir our cgroups deepest first, retrying briefly while the last processes exit."""

    def removed() -> bool:
        for cg in cgroups:
            if not cg.exists():
                continue
            for d in sorted((p for p in cg.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
                with contextlib.suppress(OSError):
                    d.rmdir()
            with contextlib.suppress(OSError):
                cg.rmdir()
        return not any(cg.exists() for cg in cgroups)

    wait_for(removed, f"cgroups {cgroups} to empty", timeout=10)


# ---------------------------------------------------------------- boot and stop


def _descendants(pid: int) -> Iterator[int]:
    todo = [pid]
    while todo:
        for children in Path(f"/proc/{todo.pop()}/task").glob("*/children"):
            with contextlib.suppress(OSError):
                for child in map(int, children.read_text().split()):
                    yield child
                    todo.append(child)


def _container_init(nspawn_pid: int) -> int | None:
    """The host pid of the process that is PID 1 in a new pid namespace under nspawn."""
    for pid in _descendants(nspawn_pid):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("NSpid:"):
                    ids = line.split()[1:]
                    if len(ids) > 1 and ids[-1] == "1":
                        return pid
    return None


def _wait_booted(container: Container, timeout: float) -> str:
    """Poll `systemctl is-system-running` until running or degraded; the state."""
    last = ""

    def settled() -> str | None:
        nonlocal last
        if container.process.poll() is not None:
            raise BootError(
                f"systemd-nspawn exited {container.process.returncode} while booting:\n"
                f"{container.log_tail()}"
            )
        try:
            result = container.run("systemctl", "is-system-running", check=False, timeout=10)
        except subprocess.TimeoutExpired:
            last = "(systemctl is-system-running did not answer in 10 s)"
            return None
        last = result.stdout.strip() or result.stderr.strip()
        return last if last in ("running", "degraded") else None

    try:
        return container.wait_until(settled, "the container to boot", timeout)
    except TimeoutError as e:
        raise BootError(f"{e}\nlast state: {last}") from None


def _stop(container: Container, cgroups: list[Path]) -> None:
    """Ask for an orderly shutdown; kill what is left after SHUTDOWN_TIMEOUT.

    SIGTERM makes nspawn send SIGRTMIN+3 to the container's systemd (an orderly
    halt). If that does not end it, the container (nspawn's `payload` cgroup)
    is killed first, so that nspawn is still there to reap its init: killed
    together, the init would be reparented to the host's PID 1, which on some
    hosts never reaps it. Then whatever is left, nspawn included.
    """
    if container.process.poll() is None:
        container.process.terminate()
        try:
            container.process.wait(SHUTDOWN_TIMEOUT)
        except subprocess.TimeoutExpired:
            print(f"nspawn: {container.name} did not stop, killing it", file=sys.stderr)
            _kill_cgroups([cg / "payload" for cg in cgroups if (cg / "payload").is_dir()])
            with contextlib.suppress(subprocess.TimeoutExpired):
                container.process.wait(10)
    _kill_cgroups(cgroups)
    with contextlib.suppress(subprocess.TimeoutExpired):
        container.process.wait(10)


@contextlib.contextmanager
def booted_container(workdir: Path) -> Iterator[Container]:
    """Boot a throwaway container on the cached tree; stop and remove it afterwards.

    workdir (empty, on a filesystem that can hold an overlay upper dir) receives
    the overlay, the wheelhouse and nspawn's log, which is kept.
    Raises HarnessUnavailable when this machine cannot run it, BootError when it
    does not boot.
    """
    check_prerequisites()
    lower = ensure_rootfs()
    name = f"hb-test-{secrets.token_hex(4)}"
    with contextlib.ExitStack() as stack:
        root = _throwaway_root(stack, lower, workdir)
        _prepare_root(root, name)
        cgroups: list[Path] = []
        stack.callback(_remove_cgroups, cgroups)
        _make_cgroups(name, cgroups)
        log_path = workdir / "nspawn.log"
        started = time.monotonic()
        with open(log_path, "wb") as log:
            # The shell moves itself into our cgroups, then becomes systemd-nspawn.
            process = subprocess.Popen(
                [
                    "sh",
                    "-c",
                    'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; '
                    'shift; exec "$@"',
                    "sh",
                    *(str(cg / "cgroup.procs") for cg in cgroups),
                    "--",
                    "systemd-nspawn",
                    "--boot",
                    "--register=no",
                    "--keep-unit",
                    f"--directory={root}",
                    f"--machine={name}",
                    "--private-network",
                    "--console=read-only",
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "SYSTEMD_NSPAWN_UNIFIED_HIERARCHY": "1"},
            )
        container = Container(name=name, root=root, log_path=log_path, process=process)
        stack.callback(_stop, container, cgroups)

        def init_pid() -> int | None:
            if process.poll() is not None:
                raise BootError(
                    f"systemd-nspawn exited {process.returncode}:\n{container.log_tail()}"
                )
            return _container_init(process.pid)

        container.leader = container.wait_until(init_pid, "the container's init", BOOT_TIMEOUT)
        state = _wait_booted(container, BOOT_TIMEOUT)
        print(f"nspawn: {name} {state} after {time.monotonic() - started:.1f} s", file=sys.stderr)
        if state == "degraded":
            failed = container.run("systemctl", "--failed", "--no-pager", check=False)
            print(f"nspawn: {name} is degraded:\n{failed.stdout}", file=sys.stderr)
        yield container
