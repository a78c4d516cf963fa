"""``hb-tui``'s user mistakes: one line on stderr, exit 2, no traceback, nothing started."""

from __future__ import annotations

import contextlib
import os
import pty
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hamsterbunker_tui.cli import _build_parser, _target

from hamsterbunker import FileStore
from hamsterbunker.core.errors import ConfigError
from hamsterbunker.records import LeaseRecord

HB_TUI = Path(sys.executable).with_name("hb-tui")


def run_tui(*args: str, env: dict[str, str] | None = None, pre: str = "") -> tuple[int, str, str]:
    """Run hb-tui's main in a fresh interpreter; pre runs first (to hide Textual, say)."""
    code = f"{pre}\nimport sys\nfrom hamsterbunker_tui.cli import main\nsys.exit(main())"
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        env={**os.environ, **(env or {})},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=30,
    )
    return done.returncode, done.stdout, done.stderr


def assert_one_line(code: int, err: str, *fragments: str) -> None:
    assert code == 2, err
    assert len(err.splitlines()) == 1, err
    assert "Traceback" not in err
    assert err.startswith("hb-tui: error: "), err
    for fragment in fragments:
        assert fragment in err, err


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        ((), ("one of the arguments --store --instance --demo is required",)),
        (("--store", "file:///srv/x", "--demo"), ("not allowed with argument",)),
        (("--store", "file:relative/dir", "--agent-id", "a"), ("needs an absolute path",)),
        (("--store", "s3://bucket", "--agent-id", "a"), ("unknown scheme 's3'",)),
        (("--store", "file:///nonexistent/hb", "--agent-id", "a"), ("does not exist",)),
        (("--store", "file:///tmp"), ("--agent-id is required with --store",)),
        (("--store", "file:///tmp", "--agent-id", "no/slash"), ("invalid agent id 'no/slash'",)),
        (("--demo", "--agent-id", "a"), ("--agent-id cannot be combined with --demo",)),
        (("--instance", "nowhere"), ("nowhere.toml does not exist", "hb init nowhere")),
        (
            ("--store", "file:///tmp", "--agent-id", "a", "--secret-file", "/nonexistent/s"),
            ("secret file /nonexistent/s does not exist",),
        ),
    ],
    ids=[
        "nothing",
        "two-sources",
        "relative-url",
        "unknown-scheme",
        "missing-store",
        "no-agent-id",
        "bad-agent-id",
        "demo-with-agent-id",
        "missing-instance",
        "missing-secret-file",
    ],
)
def test_user_mistakes_print_one_line_and_exit_2(
    tmp_path: Path, args: tuple[str, ...], fragments: tuple[str, ...]
) -> None:
    code, out, err = run_tui(*args, env={"CONFIGURATION_DIRECTORY": str(tmp_path)})
    assert out == ""
    assert_one_line(code, err, *fragments)


def test_a_mistyped_agent_id_is_one_line_naming_the_agents_held(tmp_path: Path) -> None:
    """Not an empty monitor of an agent that does not exist: exit 2 naming those that do."""
    store = FileStore(tmp_path / "store")
    store.cas_lease("counter", None, LeaseRecord(None, "eu", "s", epoch=1, ttl_ms=2000))
    url = (tmp_path / "store").as_uri()
    code, out, err = run_tui("--store", url, "--agent-id", "countr")
    assert out == ""
    assert_one_line(code, err, f"store {url} holds no records of agent 'countr'; it holds: counter")


def test_without_textual_it_says_how_to_install_it() -> None:
    code, _, err = run_tui(
        "--store", "file:///tmp", "--agent-id", "a", pre="import sys; sys.modules['textual'] = None"
    )
    assert_one_line(code, err, "needs Textual", "pip install 'hamsterbunker[tui]'")


def test_the_installed_script_refuses_a_bad_url() -> None:
    assert HB_TUI.exists(), f"{HB_TUI} is missing: pyproject declares it, pip installs it"
    done = subprocess.run(
        [str(HB_TUI), "--store", "ftp://x", "--agent-id", "a"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert_one_line(done.returncode, done.stderr, "unknown scheme 'ftp'")


# -- where --instance looks (in process: nothing to run) --------------------------


def test_instance_gives_store_and_agent_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONFIGURATION_DIRECTORY", str(tmp_path))
    (tmp_path / "one.toml").write_text(
        'store = "file:///srv/hb"\nagent = "mypkg:Agent"\nagent_id = "summariser"\n'
    )
    args = _build_parser().parse_args(["--instance", "one"])
    target = _target(args)
    assert (target.store_url, target.agent_id) == ("file:///srv/hb", "summariser")
    # --agent-id overrides the file's
    args = _build_parser().parse_args(["--instance", "one", "--agent-id", "other"])
    assert _target(args).agent_id == "other"


def test_instance_without_agent_id_takes_the_agents_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONFIGURATION_DIRECTORY", str(tmp_path))
    (tmp_path / "demo.toml").write_text(
        'store = "file:///srv/hb"\nagent = "hamsterbunker.demo:CounterAgent"\n'
    )
    assert _target(_build_parser().parse_args(["--instance", "demo"])).agent_id == "counter"
    (tmp_path / "gone.toml").write_text('store = "file:///srv/hb"\nagent = "no_such_mod:Agent"\n')
    with pytest.raises(ConfigError, match="or pass --agent-id"):
        _target(_build_parser().parse_args(["--instance", "gone"]))


# -- the demo's lifecycle ---------------------------------------------------------


@pytest.mark.multiprocess
@pytest.mark.parametrize("how", ["q", "SIGTERM"])
def test_demo_stops_its_nodes_and_removes_its_store_on_exit(tmp_path: Path, how: str) -> None:
    """hb-tui --demo in a terminal (a pty): quit with q or SIGTERM, and nothing is left behind."""
    primary, secondary = pty.openpty()
    env = {**os.environ, "TMPDIR": str(tmp_path), "TERM": "xterm-256color"}
    # Textual draws on stderr: all three go to the terminal.
    tui = subprocess.Popen(
        [sys.executable, "-m", "hamsterbunker_tui", "--demo"],
        stdin=secondary,
        stdout=secondary,
        stderr=secondary,
        env=env,
        start_new_session=True,
    )
    os.close(secondary)
    terminal = bytearray()

    def read_terminal() -> None:
        if select.select([primary], [], [], 0.1)[0]:
            with contextlib.suppress(OSError):  # EIO once the last writer is gone
                terminal.extend(os.read(primary, 1 << 16))

    nodes: list[int] = []
    try:
        deadline = time.monotonic() + 20
        while len(nodes) < 3 or b"hbnk-3" not in terminal:  # three nodes, seen on screen
            assert time.monotonic() < deadline, "the demo did not come up"
            read_terminal()
            nodes = children(tui.pid)
        workdirs = list(tmp_path.glob("hb-tui-demo-*"))
        assert len(workdirs) == 1

        if how == "q":
            os.write(primary, b"q")
        else:
            tui.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 20
        while tui.poll() is None:
            assert time.monotonic() < deadline, "hb-tui did not exit"
            read_terminal()
        read_terminal()
        assert tui.returncode == 0
        assert b"hb-tui: stopping the demo nodes" in terminal
        assert [pid for pid in nodes if Path(f"/proc/{pid}").exists()] == []
        assert not workdirs[0].exists()
    finally:
        if tui.poll() is None:
            tui.kill()
            tui.wait()
        for pid in nodes:  # left only if the test failed; never a pid reused since
            with contextlib.suppress(OSError):
                if str(tmp_path).encode() in Path(f"/proc/{pid}/environ").read_bytes():
                    os.kill(pid, signal.SIGKILL)
        os.close(primary)


def children(pid: int) -> list[int]:
    """The pids of pid's child processes, from /proc."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.parent.name))
    return found
