"""Static checks of ``systemd/hamsterbunker@.service`` and the sysusers snippet.

``systemd-analyze`` checks the unit as installed (``ExecStart`` pointing at
this venv's ``hb``, as ``make install-systemd`` rewrites it) without running
it; the rest reads the unit's settings. Without ``systemd-analyze`` those
tests are skipped, or fail when CI=true.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hamsterbunker.ops.config import DEFAULT_CONFIG_DIR
from hamsterbunker.ops.provision import STATE_DIRECTORY

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "systemd" / "hamsterbunker@.service"
SYSUSERS = ROOT / "systemd" / "hamsterbunker.sysusers"
INSTALLED_HB = "/opt/hamsterbunker/bin/hb"
EXPOSURE = re.compile(r"Overall exposure level for \S+: (\d+(?:\.\d+)?)")


# -- helpers ----------------------------------------------------------------------


def parse_unit(text: str) -> dict[str, list[tuple[str, str]]]:
    """Section -> [(key, value), ...] in file order; repeated keys (SystemCallFilter) all kept."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], [])
            continue
        assert current is not None, f"setting before any section: {raw!r}"
        assert "=" in line, f"not a setting: {raw!r}"
        key, _, value = line.partition("=")
        current.append((key.strip(), value.strip()))
    return sections


def values(section: str, key: str) -> list[str]:
    return [v for k, v in UNIT_SETTINGS.get(section, []) if k == key]


def one(section: str, key: str) -> str:
    found = values(section, key)
    assert len(found) == 1, f"[{section}] {key}= set {len(found)} times: {found}"
    return found[0]


UNIT_TEXT = UNIT.read_text(encoding="utf-8")
UNIT_SETTINGS = parse_unit(UNIT_TEXT)


@pytest.fixture
def systemd_analyze() -> str:
    path = shutil.which("systemd-analyze")
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail("systemd-analyze is not installed, and CI=true requires it")
        pytest.skip("systemd-analyze is not installed (install systemd to run these checks)")
    return path


def installed_copy(directory: Path, text: str = UNIT_TEXT) -> Path:
    """The unit as an instance file with ExecStart pointing at this venv's hb."""
    hb = Path(sys.executable).with_name("hb")
    assert hb.exists(), hb
    assert INSTALLED_HB in text
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "hamsterbunker@agent.service"
    path.write_text(text.replace(INSTALLED_HB, str(hb)), encoding="utf-8")
    return path


def security(analyze: str, unit: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [analyze, "security", "--offline=true", "--threshold=20", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


# -- systemd-analyze ------------------------------------------------------------------


def test_unit_verifies_without_a_word(systemd_analyze, tmp_path):
    """``systemd-analyze verify`` accepts the installed unit, printing nothing at all."""
    unit = installed_copy(tmp_path)
    result = subprocess.run(
        [systemd_analyze, "verify", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


def test_unit_exposure_at_most_2(systemd_analyze, tmp_path):
    """``systemd-analyze security`` rates the unit's exposure 2.0 or lower and passes threshold 20."""
    result = security(systemd_analyze, installed_copy(tmp_path))
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    found = EXPOSURE.findall(output)
    assert len(found) == 1, output
    assert float(found[0]) <= 2.0, output


def test_unit_without_hardening_fails_the_threshold(systemd_analyze, tmp_path):
    """The same security check fails once the hardening block is removed (the check can fail)."""
    start, end = UNIT_TEXT.index("# Hardening"), UNIT_TEXT.index("[Install]")
    bare = UNIT_TEXT[:start] + UNIT_TEXT[end:]
    assert "ProtectSystem" not in bare and "SystemCallFilter" not in bare
    result = security(systemd_analyze, installed_copy(tmp_path / "bare", bare))
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    found = EXPOSURE.findall(output)
    assert found and float(found[0]) > 2.0, output


# -- the unit's settings ------------------------------------------------------------------


def test_unit_is_notify_and_execs_hb_directly():
    """Type=notify, and ExecStart runs ``hb run --instance %i`` itself: no shell, no wrapper."""
    assert one("Service", "Type") == "notify"
    assert one("Service", "NotifyAccess") == "main"
    argv = shlex.split(one("Service", "ExecStart"))
    assert argv == [INSTALLED_HB, "run", "--instance", "%i"], argv
    assert Path(argv[0]).is_absolute()
    assert not any(Path(a).name in ("sh", "bash", "env") for a in argv), argv


def test_unit_has_watchdog_and_timeouts():
    """WatchdogSec is set to a positive time, and start and stop have timeouts."""
    match = re.fullmatch(r"(\d+)(s|min)?", one("Service", "WatchdogSec"))
    assert match and int(match.group(1)) > 0
    assert values("Service", "TimeoutStartSec") and values("Service", "TimeoutStopSec")


def test_unit_restarts_on_failure_within_a_limit():
    """Restart=on-failure with a RestartSec, under a StartLimitBurst within StartLimitIntervalSec."""
    assert one("Service", "Restart") == "on-failure"
    assert one("Service", "RestartSec")
    assert int(one("Unit", "StartLimitBurst")) >= 1
    assert one("Unit", "StartLimitIntervalSec")


def test_unit_does_not_restart_after_a_config_mistake():
    """RestartPreventExitStatus includes 2, hb's exit code for a configuration mistake."""
    assert "2" in one("Service", "RestartPreventExitStatus").split()


def test_unit_loads_secret_as_credential_from_config_dir():
    """LoadCredential=secret: reads NAME.secret from the directory hb init writes to."""
    name, _, source = one("Service", "LoadCredential").partition(":")
    assert name == "secret"
    assert Path(source) == DEFAULT_CONFIG_DIR / "%i.secret"


def test_unit_runs_as_static_hamsterbunker_user():
    """User=hamsterbunker, and no DynamicUser (NFS stores need one UID on every node)."""
    assert one("Service", "User") == "hamsterbunker"
    assert values("Service", "DynamicUser") in ([], ["no"], ["false"])


def test_unit_umask_and_directories():
    """UMask=0077; ConfigurationDirectory and StateDirectory are the ones hb reads and hints at."""
    assert one("Service", "UMask") == "0077"
    assert Path("/etc") / one("Service", "ConfigurationDirectory") == DEFAULT_CONFIG_DIR
    assert Path("/var/lib") / one("Service", "StateDirectory") == STATE_DIRECTORY


def test_unit_system_call_filter_keeps_every_entry():
    """The repeated SystemCallFilter= lines allow @system-service and deny the privileged sets."""
    filters = values("Service", "SystemCallFilter")
    assert "@system-service" in filters
    denied = [f for f in filters if f.startswith("~")]
    assert denied and "@privileged" in denied[0][1:].split(), filters


def test_unit_installs_into_multi_user_target():
    """[Install] WantedBy=multi-user.target, so ``systemctl enable`` starts it at boot."""
    assert one("Install", "WantedBy") == "multi-user.target"


def test_sysusers_declares_hamsterbunker_user():
    """systemd/hamsterbunker.sysusers declares the user hamsterbunker (type u)."""
    entries = [
        line.split()
        for line in SYSUSERS.read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    users = [entry for entry in entries if entry[0] == "u"]
    assert [entry[1] for entry in users] == ["hamsterbunker"], entries
    assert users[0][-1] in ("/usr/sbin/nologin", "/sbin/nologin", "-"), users[0]
