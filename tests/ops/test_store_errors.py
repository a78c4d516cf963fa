"""A store the node cannot use is one line naming the path (or the missing extra) and the fix,
exit 2, never a traceback: in `hb run`, `hb status` and `hb-tui`, each a real process.

Permission cases need a process that file modes bind: as root (as tests often run), the
child keeps uid 0 but loses CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH (setpriv), so a
mode-0000 or 0555 directory refuses it as it would refuse the unit's hamsterbunker user.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cli import AGENT, AGENT_ID, HB, SECRET, hb_env

HB_TUI = [sys.executable, "-m", "hamsterbunker_tui"]
RUN = ["run", "--agent", AGENT, "--node-id", "n1", "--tick-ms", "100", "--lease-ttl-ms", "600",
       "--create-store"]  # fmt: skip


def _unprivileged() -> list[str]:
    """The prefix that makes file modes bind this test's child processes."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:  # util-linux is everywhere these tests run; say so if not
        pytest.skip("running as root without setpriv: file modes cannot bind a child")
    return [setpriv, "--bounding-set", "-dac_override,-dac_read_search"]


def _hb(command: list[str], *args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    done = subprocess.run(
        [*_unprivileged(), *command, *args],
        env=env or hb_env(HB_SECRET=SECRET),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done.returncode, done.stderr


def _one_line(code: int, err: str, prog: str, *fragments: str) -> str:
    assert code == 2, err
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: "), err
    for fragment in fragments:
        assert fragment in lines[0], err
    return lines[0]


def _all_three(url: str, *fragments: str, run_only: tuple[str, ...] = ()) -> None:
    """hb run, hb status and hb-tui on url each give one line with fragments."""
    _one_line(*_hb(HB, *RUN, "--store", url), "hb run", *fragments, *run_only)
    status = ["status", "--store", url, "--agent-id", AGENT_ID]
    _one_line(*_hb(HB, *status), "hb status", *fragments)
    tui = ["--store", url, "--agent-id", AGENT_ID]
    _one_line(*_hb(HB_TUI, *tui), "hb-tui", *fragments)


@pytest.fixture
def locked(tmp_path: Path) -> Iterator[Path]:
    """A store directory with mode 0000 (restored after the test, so it can be removed)."""
    store = tmp_path / "store"
    store.mkdir()
    store.chmod(0)
    yield store
    store.chmod(0o700)


def test_an_unreadable_store_directory_is_one_line_everywhere(locked: Path) -> None:
    _all_three(locked.as_uri(), str(locked), "cannot be read", "mode 0000", "chown")


def test_a_store_behind_a_directory_that_lets_no_one_through(tmp_path: Path) -> None:
    closed = tmp_path / "closed"
    (closed / "store").mkdir(parents=True)
    closed.chmod(0)
    try:
        store = closed / "store"
        _one_line(*_hb(HB, *RUN, "--store", store.as_uri()), "hb run", str(store), "chown")
        status = ["status", "--store", store.as_uri(), "--agent-id", AGENT_ID]
        _one_line(*_hb(HB, *status), "hb status", str(store), "parent directory")
        tui = ["--store", store.as_uri(), "--agent-id", AGENT_ID]
        _one_line(*_hb(HB_TUI, *tui), "hb-tui", str(store), "parent directory")
    finally:
        closed.chmod(0o700)


def test_a_store_path_that_is_a_file_is_one_line_everywhere(tmp_path: Path) -> None:
    path = tmp_path / "store"
    path.write_text("not a directory\n")
    _all_three(path.as_uri(), str(path), "is not a directory")


def test_a_store_directory_the_node_may_not_write_is_refused_at_start(tmp_path: Path) -> None:
    """Mode 0555: readers (hb status) may look; a node refuses at once, naming the fix,
    instead of failing its first write with a raw errno."""
    store = tmp_path / "store"
    store.mkdir(mode=0o555)
    store.chmod(0o555)
    try:
        line = _one_line(
            *_hb(HB, *RUN, "--store", store.as_uri()), "hb run", str(store), "cannot be written"
        )
        assert "mode 0555" in line and "chown" in line, line
        assert list(store.iterdir()) == []  # it wrote nothing
    finally:
        store.chmod(0o700)


def test_a_store_directory_under_a_parent_the_node_may_not_write(tmp_path: Path) -> None:
    parent = tmp_path / "parent"
    parent.mkdir(mode=0o555)
    parent.chmod(0o555)
    try:
        store = parent / "store"
        line = _one_line(
            *_hb(HB, *RUN, "--store", store.as_uri()), "hb run", str(store), "cannot be created"
        )
        assert "mode 0555" in line and f"mkdir {store}" in line, line
    finally:
        parent.chmod(0o700)


def _without(tmp_path: Path, *modules: str) -> dict[str, str]:
    """An environment in which importing modules fails as if they were not installed."""
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    for module in modules:
        (blocked / f"{module}.py").write_text(
            f'raise ModuleNotFoundError("No module named {module!r}", name={module!r})\n'
        )
    path = os.pathsep.join(filter(None, [str(blocked), os.environ.get("PYTHONPATH")]))
    return hb_env(HB_SECRET=SECRET, PYTHONPATH=path)


@pytest.mark.parametrize(
    ("url", "missing", "extra"),
    [
        ("etcd://127.0.0.1:1/hb", ("requests",), "etcd"),  # etcd3gw itself installed
        ("etcd://127.0.0.1:1/hb", ("etcd3gw", "requests"), "etcd"),
        ("redis://127.0.0.1:1/0", ("redis",), "redis"),
    ],
)
def test_a_backend_without_its_extra_is_one_line(
    tmp_path: Path, url: str, missing: tuple[str, ...], extra: str
) -> None:
    env = _without(tmp_path, *missing)
    fix = f"pip install 'hamsterbunker[{extra}]'"
    _one_line(*_hb(HB, *RUN, "--store", url, env=env), "hb run", fix, "(no module ")
    status = ["status", "--store", url, "--agent-id", AGENT_ID]
    _one_line(*_hb(HB, *status, env=env), "hb status", fix)
    tui = ["--store", url, "--agent-id", AGENT_ID]
    _one_line(*_hb(HB_TUI, *tui, env=env), "hb-tui", fix)
