"""Helpers the tests share: bounded waiting, process state, and the file store's lock."""

from __future__ import annotations

import contextlib
import faulthandler
import fcntl
import os
import signal
import struct
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import ParamSpec, TypeVar

import pytest

from hamsterbunker import FileStore
from hamsterbunker.ops.local import LocalCluster
from hamsterbunker.stores import Store
from hamsterbunker.stores.backend import Txn
from hamsterbunker.stores.layer import RecordStore

T = TypeVar("T")
P = ParamSpec("P")
# Put on PYTHONPATH of node processes: the agents of hb_test_agents.py live here.
SUPPORT_DIR = Path(__file__).parent
# Set by `make test`: the fast tier runs fewer fuzz examples, `make test-all` (CI) all of them.
FAST_TIER_ENV = "HB_FAST_TIER"


def fuzz_examples(full: int, fast: int) -> int:
    """How many examples a fuzz test runs: full, or fast in the fast tier (FAST_TIER_ENV)."""
    return fast if os.environ.get(FAST_TIER_ENV) else full


def wait_until(
    probe: Callable[[], T | None], what: str | Callable[[], str], timeout: float = 30.0
) -> T:
    """Poll probe every 10 ms until it returns something truthy; fail after timeout. what
    says what was awaited; a callable is asked at the timeout (the state as it ended). A
    timeout also writes every thread's stack to stderr (the test's captured output): what
    an in-process node was doing when the wait ran out."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            described = what() if callable(what) else what
            with contextlib.suppress(ValueError, OSError):  # a stderr without a file
                faulthandler.dump_traceback(sys.stderr, all_threads=True)
            pytest.fail(f"timed out after {timeout} s waiting for {described}")
        time.sleep(0.01)


@contextlib.contextmanager
def each_ended(make: Callable[P, T], end: Callable[[T], object]) -> Iterator[Callable[P, T]]:
    """make, remembering all it makes; end(each) when the block is left (for fixtures)."""
    made: list[T] = []

    def remembered(*args: P.args, **kwargs: P.kwargs) -> T:
        thing = make(*args, **kwargs)
        made.append(thing)
        return thing

    try:
        yield remembered
    finally:
        for thing in made:
            end(thing)


def store_of(cluster: LocalCluster) -> FileStore:
    return FileStore(cluster.store_url.removeprefix("file://"))


def redo_finished(store: Store) -> Store:
    """store, with what a writer killed mid-commit left finished, as the next writer (the
    next leader) finds it: a file store's redo log, which its readers leave as it is."""
    if isinstance(store, RecordStore):
        store.backend.commit(Txn())
    return store


def process_state(pid: int) -> str:
    """The state letter of a process from /proc (R, S, T for stopped, ...)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


@contextlib.contextmanager
def holding_store_lock(store_dir: Path) -> Iterator[None]:
    """Hold the file store's commit lock (``stores.backends.file``: an OFD lock on .lock),
    as a node does across each commit: no write is half made while it is held."""
    fd = os.open(store_dir / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    whole_file = struct.pack("hhqqi4x", fcntl.F_WRLCK, 0, 0, 0, 0)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                fcntl.fcntl(fd, fcntl.F_OFD_SETLK, whole_file)
                break
            except (BlockingIOError, PermissionError):  # EAGAIN or EACCES: held
                if time.monotonic() > deadline:
                    pytest.fail("the store's lock stayed busy for 10 s")
                time.sleep(0.001)
        yield
    finally:
        os.close(fd)


def pause_outside_lock(cluster: LocalCluster, node: str) -> None:
    """SIGSTOP a node at a moment it holds no store lock.

    A node paused inside the few milliseconds it holds the file store's lock
    would hold up every other node until it resumes (a stated limit of the
    file store); holding the lock ourselves while stopping it rules that out.
    """
    with holding_store_lock(Path(cluster.store_url.removeprefix("file://"))):
        cluster.signal(node, signal.SIGSTOP)
        wait_until(lambda: process_state(cluster.pid(node)) == "T", f"{node} to stop")
