"""``make install-systemd`` and the hardening table of ``systemd/README.md``.

The Makefile target runs for real, unprivileged, with every destination in
``tmp_path`` (``PREFIX``, ``BIN_DIR``, ``UNIT_DIR``, ``SYSUSERS_DIR``) and
stand-ins first on ``PATH``: a ``python3`` whose ``-m venv`` makes a ``pip``
that records its arguments (no network, no build), and ``systemd-sysusers`` and
``systemctl`` that record theirs (no user is created on this machine). The
real offline install with the extras runs in the nspawn system test.

The table names directives of ``systemd/hamsterbunker@.service``; a test
fails as soon as one is not in the unit as written, and ``systemd-analyze``
checks the drop-in lines it recommends.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.system.nspawn import NODE_EXTRAS

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "systemd" / "hamsterbunker@.service"
SYSTEMD_README = ROOT / "systemd" / "README.md"
INSTALLED_HB = "/opt/hamsterbunker/bin/hb"
TIMEOUT = 60

FAKE_PYTHON = """#!/bin/sh
# python3 -m venv DIR: a DIR/bin/pip that records its arguments and "installs" hb and hb-tui.
[ "$1" = "-m" ] && [ "$2" = "venv" ] || exit 64
mkdir -p "$3/bin"
cat > "$3/bin/pip" <<EOF
#!/bin/sh
echo "\\$*" >> "$3/pip.log"
touch "$3/bin/hb" "$3/bin/hb-tui"
EOF
chmod +x "$3/bin/pip"
"""

RECORDER = """#!/bin/sh
echo "$(basename "$0") $*" >> "{log}"
"""


# -- make install-systemd --------------------------------------------------------------


@pytest.fixture(scope="module")
def make() -> str:
    path = shutil.which("make")
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail("make is not installed, and CI=true requires it")
        pytest.skip("make is not installed")
    return path


def install(make: str, tmp_path: Path, *variables: str) -> dict[str, Path]:
    """Run the target with every destination under tmp_path; the places it wrote."""
    places = {
        name: tmp_path / name for name in ("prefix", "bin", "units", "sysusers", "stubs", "calls")
    }
    places["stubs"].mkdir()
    python = places["stubs"] / "python3"
    python.write_text(FAKE_PYTHON, encoding="utf-8")
    for name in ("systemd-sysusers", "systemctl"):
        (places["stubs"] / name).write_text(RECORDER.format(log=places["calls"]), encoding="utf-8")
    for stub in places["stubs"].iterdir():
        stub.chmod(0o755)
    result = subprocess.run(
        [
            make,
            "--no-print-directory",
            "-C",
            str(ROOT),
            "install-systemd",
            f"PYTHON={python}",
            f"PREFIX={places['prefix']}",
            f"BIN_DIR={places['bin']}",
            f"UNIT_DIR={places['units']}",
            f"SYSUSERS_DIR={places['sysusers']}",
            *variables,
        ],
        env={**os.environ, "PATH": f"{places['stubs']}:{os.environ['PATH']}"},
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return places


def pip_calls(places: dict[str, Path]) -> list[str]:
    return (places["prefix"] / "pip.log").read_text(encoding="utf-8").splitlines()


def node_extras() -> list[str]:
    """pyproject's extras but the developers' (`test`, `bench`) and the agents' (`pydantic-ai`,
    `langgraph`: an agent package that uses one requires it): what a node may need (hb-tui,
    the Redis, etcd and PostgreSQL clients)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    not_the_nodes = {"test", "bench", "pydantic-ai", "langgraph"}
    return sorted(set(project["optional-dependencies"]) - not_the_nodes)


def test_install_systemd_installs_the_extras_and_links_hb_and_hb_tui(make, tmp_path):
    """pip installs `.[tui,redis,etcd,postgres]` (every extra but test and bench); hb and hb-tui are
    linked."""
    places = install(make, tmp_path)
    (call,) = pip_calls(places)
    found = re.fullmatch(r"install --quiet \.\[([a-z,]+)\]", call)
    assert found, call
    assert sorted(found.group(1).split(",")) == node_extras()
    for name in ("hb", "hb-tui"):
        link = places["bin"] / name
        assert link.is_symlink(), link
        assert os.readlink(link) == str(places["prefix"] / "bin" / name)
    unit = (places["units"] / "hamsterbunker@.service").read_text(encoding="utf-8")
    assert f"ExecStart={places['prefix']}/bin/hb run --instance %i" in unit
    assert INSTALLED_HB not in unit
    conf = places["sysusers"] / "hamsterbunker.conf"
    calls = places["calls"].read_text(encoding="utf-8").splitlines()
    assert f"systemd-sysusers {conf}" in calls


def test_install_systemd_installs_the_agent_package_into_the_same_environment(make, tmp_path):
    """AGENT_PKG goes through the environment's own pip, after hamsterbunker."""
    places = install(make, tmp_path, "AGENT_PKG=mypkg==1.2")
    assert pip_calls(places)[1:] == ["install --quiet mypkg==1.2"]


def test_makefile_extras_are_the_ones_the_system_test_wheels(make):
    """The nspawn harness builds wheels for the extras the target installs (else offline fails)."""
    result = subprocess.run(
        [make, "--no-print-directory", "-C", str(ROOT), "-n", "install-systemd", "PREFIX=/p"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, result.stderr
    assert f"/p/bin/pip install --quiet '.[{NODE_EXTRAS}]'" in result.stdout.splitlines()


# -- the hardening table ----------------------------------------------------------------

SETTING = re.compile(r"`([A-Z][A-Za-z]+)=([^`]*)`")


def unit_settings() -> set[tuple[str, str]]:
    settings = set()
    for raw in UNIT.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            settings.add((key.strip(), value.strip()))
    return settings


def table_rows() -> list[tuple[str, str, str]]:
    """(directives, what it breaks, drop-in lines) of the README's hardening table."""
    text = SYSTEMD_README.read_text(encoding="utf-8")
    start = text.index("### What the hardening breaks")
    section = text[start : text.index("\n## ", start)]
    rows = []
    for line in section.splitlines():
        if line.startswith("| `"):
            cells = [cell.strip() for cell in line.strip().strip("|").split(" | ")]
            assert len(cells) == 3, line
            rows.append((cells[0], cells[1], cells[2]))
    return rows


def test_table_covers_the_tooling_the_issue_names():
    """The table has rows, among them headless Chromium, JITs, CPU pinning, rlimits and caches."""
    rows = table_rows()
    assert len(rows) >= 10, rows
    broken = " ".join(row[1] for row in rows)
    for tool in ("Chromium", "V8", "LuaJIT", "PyPy", "numba", "sched_setaffinity", "setrlimit"):
        assert tool in broken, tool
    assert "~/.cache" in broken


def test_every_directive_of_the_table_is_in_the_unit():
    """Each `Key=value` of the first column is a line of the unit, exactly (the table cannot drift)."""
    settings = unit_settings()
    for directives, _, _ in table_rows():
        named = SETTING.findall(directives)
        assert named, directives
        for setting in named:
            assert setting in settings, f"{'='.join(setting)} is not in {UNIT.name}"


def drop_in_lines(row: tuple[str, str, str]) -> list[str]:
    lines = [f"{key}={value}" for key, value in SETTING.findall(row[2])]
    assert lines, row
    return lines


@pytest.fixture
def systemd_analyze() -> str:
    path = shutil.which("systemd-analyze")
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail("systemd-analyze is not installed, and CI=true requires it")
        pytest.skip("systemd-analyze is not installed (install systemd to run these checks)")
    return path


def unit_with_drop_in(directory: Path, lines: list[str]) -> Path:
    """The unit as an instance, ExecStart on this venv's hb, with lines as a drop-in."""
    hb = Path(sys.executable).with_name("hb")
    directory.mkdir(parents=True)
    unit = directory / "hamsterbunker@agent.service"
    unit.write_text(
        UNIT.read_text(encoding="utf-8").replace(INSTALLED_HB, str(hb)), encoding="utf-8"
    )
    if lines:
        drop_ins = directory / "hamsterbunker@agent.service.d"
        drop_ins.mkdir()
        (drop_ins / "relax.conf").write_text(
            "[Service]\n" + "".join(f"{line}\n" for line in lines), encoding="utf-8"
        )
    return unit


def analyze(analyze: str, *args: str, unit_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [analyze, *args],
        # The unit's own directory first, so its drop-in directory is read.
        env={**os.environ, "SYSTEMD_UNIT_PATH": f"{unit_path}:"},
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        stdin=subprocess.DEVNULL,
    )


def test_drop_in_lines_of_the_table_verify(systemd_analyze, tmp_path):
    """Every drop-in line of the table together: `systemd-analyze verify` prints nothing."""
    lines = [line for row in table_rows() for line in drop_in_lines(row)]
    unit = unit_with_drop_in(tmp_path / "all", lines)
    result = analyze(systemd_analyze, "verify", str(unit), unit_path=unit.parent)
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")
    # The check can fail: a misspelt key in the drop-in is reported.
    bad = unit_with_drop_in(tmp_path / "bad", ["MemoryDenyWriteExecut=no"])
    result = analyze(systemd_analyze, "verify", str(bad), unit_path=bad.parent)
    assert "MemoryDenyWriteExecut" in result.stderr


def security_findings(systemd_analyze: str, unit: Path) -> set[str]:
    result = analyze(
        systemd_analyze, "security", "--offline=true", str(unit), unit_path=unit.parent
    )
    return {line.split()[1] for line in result.stdout.splitlines() if line.startswith("✗")}


def test_each_relaxing_line_changes_the_security_report(systemd_analyze, tmp_path):
    """A drop-in line setting its row's own directive shows up in `systemd-analyze security`."""
    baseline = security_findings(systemd_analyze, unit_with_drop_in(tmp_path / "base", []))
    checked = 0
    for number, row in enumerate(table_rows()):
        own = {key for key, _ in SETTING.findall(row[0])}
        for line in drop_in_lines(row):
            if line.partition("=")[0] not in own:
                continue  # e.g. LimitNOFILE=, Environment=: not rated by security
            unit = unit_with_drop_in(tmp_path / f"row{number}-{checked}", [line])
            assert security_findings(systemd_analyze, unit) - baseline, line
            checked += 1
    assert checked >= 10, checked
