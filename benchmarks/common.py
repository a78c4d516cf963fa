"""What every benchmark shares: results, tables, percentiles, the raw durable write, the machine."""

from __future__ import annotations

import base64
import contextlib
import datetime
import os
import platform
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from hamsterbunker.core.timing import DEFAULT_TIMING
from hamsterbunker.stores.backends.file import mount_of  # where the file backend takes it

T = TypeVar("T")

TIMING = DEFAULT_TIMING  # the defaults of `hb run`
SECRET = "benchmark-secret-not-for-production"  # a secret of a throw-away local store


class BenchmarkError(RuntimeError):
    """A benchmark could not take its measurement (a node did not come up, a wait timed out)."""


@dataclass
class Table:
    title: str
    headers: Sequence[str]
    rows: Sequence[Sequence[str]] = field(default_factory=list)


@dataclass
class Check:
    """One figure held to a target."""

    figure: str
    measured: str
    target: str
    ok: bool | None  # None: reported, no target


@dataclass
class Result:
    name: str
    title: str
    method: str  # markdown: what is measured, and how (also printed)
    tables: list[Table] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    analysis: str = ""  # markdown shown when a check missed: what costs the time, what could fix it
    analysis_always: bool = False  # show the analysis even when every check passed
    seconds: float = 0.0
    load_before: str = ""
    load_after: str = ""


# -- statistics ------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile with linear interpolation between order statistics (numpy's default)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def median(values: Sequence[float]) -> float:
    return percentile(values, 50)


def ms(seconds: float) -> str:
    """Milliseconds, with two decimals below 10 ms."""
    value = seconds * 1000
    return f"{value:.2f}" if value < 10 else f"{value:.1f}"


def spread_row(label: str, values_s: Sequence[float], ttl_s: float | None = None) -> list[str]:
    """label, n, min, p50, p99, max (ms), and p50 and p99 as a ratio to the TTL if given."""
    row = [
        label,
        str(len(values_s)),
        ms(min(values_s)),
        ms(percentile(values_s, 50)),
        ms(percentile(values_s, 99)),
        ms(max(values_s)),
    ]
    if ttl_s is not None:
        row += [
            f"{percentile(values_s, 50) / ttl_s:.3f}",
            f"{percentile(values_s, 99) / ttl_s:.3f}",
        ]
    return row


SPREAD_HEADERS = ["figure", "n", "min ms", "p50 ms", "p99 ms", "max ms"]
SPREAD_TTL_HEADERS = [*SPREAD_HEADERS, "p50 / TTL", "p99 / TTL"]


# -- the raw durable write (the baseline) ------------------------------------------------


class RawWriter:
    """The least a durable atomic write can do: temp write, fsync, rename, directory fsync.

    It mirrors the file store's file lifecycle, so that both pay the same filesystem
    costs: every write makes a new file, and the oldest beyond ``keep`` is removed
    after the directory fsync (as ``put_checkpoint`` prunes). On a filesystem mounted
    with ``discard`` the freed blocks are trimmed at the next journal commit, a cost
    that whichever write commits next pays, whoever freed them.
    """

    def __init__(self, directory: Path, keep: int = 5) -> None:
        self.directory = directory
        self.keep = keep
        self.n = 0
        # The store makes its directories on its first write there, maybe not yet.
        directory.mkdir(parents=True, exist_ok=True)

    def write(self, data: bytes) -> None:
        self.n += 1
        tmp = self.directory / f".raw-tmp-{self.n:010d}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.directory / f"raw-{self.n:010d}")
        dfd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        if self.n > self.keep:
            (self.directory / f"raw-{self.n - self.keep:010d}").unlink(missing_ok=True)


def json_state_of_size(size: int) -> dict[str, str]:
    """A state dict whose compact JSON (as Sealer.seal writes it) is exactly size bytes."""
    overhead = len('{"data":""}')
    if size < overhead:
        raise ValueError(f"a state of {size} bytes is too small")
    n = size - overhead
    # Base64 text: JSON needs no escapes for it, and it does not compress.
    text = base64.b64encode(os.urandom(n * 3 // 4 + 3)).decode()[:n]
    return {"data": text}


# -- waiting, temp dirs -------------------------------------------------------------------


def wait_for(probe: Callable[[], T | None], what: str, timeout: float, every: float = 0.02) -> T:
    """Poll probe until it returns something not None/False; BenchmarkError after timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value is not None and value is not False:
            return value
        if time.monotonic() > deadline:
            raise BenchmarkError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)


@contextlib.contextmanager
def temp_dir(prefix: str) -> Iterator[Path]:
    """A fresh directory under the system temp dir, removed afterwards whatever happens."""
    path = Path(tempfile.mkdtemp(prefix=f"hb-bench-{prefix}-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


# -- the machine ------------------------------------------------------------------------


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def filesystem_of(path: Path) -> str:
    """fstype (source, options) of the mount holding path."""
    mount = mount_of(path)
    if not mount.fstype:
        return "?"
    return f"{mount.fstype} ({mount.source} on {mount.point}: {mount.options})"


def _git_revision(repo: Path) -> str:
    try:
        rev = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "--short", "HEAD"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip()  # fmt: skip
        dirty = subprocess.run(
            ["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return "?"
    return f"{rev} (with uncommitted changes)" if dirty else rev


def machine_info(repo: Path) -> list[tuple[str, str]]:
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return [
        ("date", datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")),
        ("CPUs (nproc)", str(affinity)),
        ("CPU model", _cpu_model()),
        ("kernel", f"{platform.system()} {platform.release()}"),
        ("temp dir", f"{tempfile.gettempdir()}: {filesystem_of(Path(tempfile.gettempdir()))}"),
        ("Python", f"{platform.python_implementation()} {platform.python_version()}"),
        ("revision", _git_revision(repo)),
    ]


# -- rendering ------------------------------------------------------------------------


def render_text(table: Table) -> str:
    rows = [list(table.headers), *[list(r) for r in table.rows]]
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(table.headers))]
    lines = [table.title]
    for n, row in enumerate(rows):
        cells = [
            str(cell).ljust(w) if i == 0 else str(cell).rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  " + "  ".join(cells))
        if n == 0:
            lines.append("  " + "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def render_md(table: Table) -> str:
    def esc(cell: str) -> str:
        return str(cell).replace("|", "\\|")

    align = ["---", *["---:"] * (len(table.headers) - 1)]
    lines = [
        f"**{table.title}**",
        "",
        "| " + " | ".join(esc(h) for h in table.headers) + " |",
        "| " + " | ".join(align) + " |",
    ]
    lines += ["| " + " | ".join(esc(c) for c in row) + " |" for row in table.rows]
    return "\n".join(lines)


def verdict(ok: bool | None) -> str:
    return {True: "pass", False: "MISS", None: "—"}[ok]
