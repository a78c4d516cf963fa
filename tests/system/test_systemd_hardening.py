"""systemd/README.md's hardening table, under a real systemd.

A probe service with the hardening block of ``systemd/hamsterbunker@.service``
tries what the table says the block breaks (CPU pinning, ``nice``, W+X memory,
a user namespace, ``/proc/meminfo``, netlink, ``personality``) and what it says
still works (``/dev/shm``, lowering a soft rlimit). Then, row by row, the
table's own drop-in line is added and the blocked call must work.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from .nspawn import Container

pytestmark = pytest.mark.system

REPO = Path(__file__).resolve().parents[2]
UNIT_TEXT = (REPO / "systemd" / "hamsterbunker@.service").read_text(encoding="utf-8")
README = (REPO / "systemd" / "README.md").read_text(encoding="utf-8")
PROBE = "hb-hardening-probe"
OUT = "/run/hb-hardening-probe.json"

# Each check prints "ok" or the errno name it failed with.
PROBE_SCRIPT = r"""
import ctypes, errno, json, mmap, os, resource, socket

libc = ctypes.CDLL(None, use_errno=True)


def attempt(call):
    try:
        result = call()
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc.errno))
    if result is not None and result < 0:
        return errno.errorcode.get(ctypes.get_errno(), "failed")
    return "ok"


def wx():
    mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC).close()


def shm():
    with open("/dev/shm/hb-probe", "w") as file:
        file.write("x")
    os.unlink("/dev/shm/hb-probe")


def lower_soft_nofile():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 512), hard))


checks = {
    "sched_setaffinity": lambda: os.sched_setaffinity(0, os.sched_getaffinity(0)),
    "nice": lambda: os.nice(1) and None,
    "wx_memory": wx,
    "user_namespace": lambda: libc.unshare(0x10000000),  # CLONE_NEWUSER
    "proc_meminfo": lambda: open("/proc/meminfo").close(),
    "netlink": lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0).close(),
    "personality": lambda: libc.personality(0x0040000),  # ADDR_NO_RANDOMIZE
    "dev_shm": shm,
    "lower_soft_rlimit": lower_soft_nofile,
}
print(json.dumps({name: attempt(call) for name, call in checks.items()}))
"""

# check -> (how the unit's hardening makes it fail, the table's drop-in line that lets it work)
BLOCKED = {
    "sched_setaffinity": ("EPERM", "SystemCallFilter=@resources"),
    "nice": ("EPERM", "SystemCallFilter=@resources"),
    "wx_memory": ("EPERM", "MemoryDenyWriteExecute=no"),
    "user_namespace": ("EPERM", "RestrictNamespaces=user pid net"),
    "proc_meminfo": ("ENOENT", "ProcSubset=all"),
    "netlink": ("EAFNOSUPPORT", "RestrictAddressFamilies=AF_NETLINK"),
    "personality": ("EPERM", "LockPersonality=no"),
}
WORKING = ("dev_shm", "lower_soft_rlimit")


def hardening_block() -> str:
    start, end = UNIT_TEXT.index("# Hardening"), UNIT_TEXT.index("[Install]")
    return UNIT_TEXT[start:end]


def probe(box: Container, relax: str | None) -> dict[str, str]:
    """Run the probe service (with relax as a drop-in line) and return its results."""
    box.path("/opt/hb-probe.py").write_text(PROBE_SCRIPT, encoding="utf-8")
    box.path(f"/etc/systemd/system/{PROBE}.service").write_text(
        "[Service]\nType=oneshot\nUser=nobody\n"
        f"ExecStart=/usr/bin/python3 /opt/hb-probe.py\nStandardOutput=truncate:{OUT}\n"
        + hardening_block(),
        encoding="utf-8",
    )
    drop_ins = box.path(f"/etc/systemd/system/{PROBE}.service.d")
    drop_ins.mkdir(exist_ok=True)
    drop_in = drop_ins / "relax.conf"
    drop_in.unlink(missing_ok=True)
    if relax is not None:
        drop_in.write_text(f"[Service]\n{relax}\n", encoding="utf-8")
    box.run("systemctl", "daemon-reload")
    box.run("rm", "-f", OUT)
    box.run("systemctl", "start", f"{PROBE}.service", timeout=60)
    result: dict[str, str] = json.loads(box.run("cat", OUT).stdout)
    return result


def test_relax_lines_are_the_tables():
    """Each drop-in line used here is one the table recommends."""
    for _, line in BLOCKED.values():
        assert re.search(rf"\| [^\n]*`{re.escape(line)}`[^\n]*\|\n", README), line


@pytest.fixture(scope="module")
def baseline(booted: Container) -> dict[str, str]:
    return probe(booted, None)


def test_hardening_blocks_what_the_table_says(baseline):
    """Under the unit's hardening, each call the table names fails; /dev/shm and rlimits work."""
    assert {check: baseline[check] for check in BLOCKED} == {
        check: error for check, (error, _) in BLOCKED.items()
    }
    assert {check: baseline[check] for check in WORKING} == dict.fromkeys(WORKING, "ok")


@pytest.mark.parametrize("check", sorted(BLOCKED))
def test_the_tables_drop_in_line_relaxes_it(booted, baseline, check):
    """The table's drop-in line makes the blocked call work."""
    relaxed = probe(booted, BLOCKED[check][1])
    assert relaxed[check] == "ok", (check, relaxed)
