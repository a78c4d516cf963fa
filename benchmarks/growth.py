"""Growth with state size: publish and restore time from 1 KiB to 64 MiB, per store, and a fit."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hamsterbunker import FileStore
from hamsterbunker.errors import StoreError
from hamsterbunker.lease import LeaseKeeper, Outcome
from hamsterbunker.limits import MAX_CHECKPOINT_BYTES
from hamsterbunker.sealing import Sealer, new_cluster_record
from hamsterbunker.stores import Store, open_store

from .backends import _server
from .common import (
    SECRET,
    BenchmarkError,
    Check,
    Result,
    Table,
    json_state_of_size,
    median,
    ms,
    percentile,
    temp_dir,
)

NAME = "growth"
TITLE = "Growth with state size: publish and restore, 1 KiB to 64 MiB, per store"
AGENT = "bench-growth"
KIB, MIB = 1024, 1024 * 1024
SIZES = (1 * KIB, 16 * KIB, 256 * KIB, 1 * MIB, 4 * MIB, 16 * MIB, 64 * MIB)
QUICK_SIZES = tuple(size for size in SIZES if size <= 4 * MIB)
ROUNDS = {1 * KIB: 40, 16 * KIB: 40, 256 * KIB: 30, 1 * MIB: 20, 4 * MIB: 12, 16 * MIB: 8,
          64 * MIB: 6}  # fmt: skip
QUICK_ROUNDS = 3
WARMUP_ROUNDS = 2  # untimed: connections, caches, the first files of a size
BUDGET_S, QUICK_BUDGET_S = 40.0, 5.0  # per store and size, after the warm-up
STORES = ("file", "redis", "etcd")
# etcd's default --max-request-bytes: the benchmark's member is started without the
# flag (tests/support/etcd_server.py), as hamsterbunker's messages assume.
ETCD_REQUEST_LIMIT = 3 * MIB // 2
ETCD_TXN_ROOM = 64 * KIB  # the rest of put_checkpoint's txn: description, compares, deletes
LINEAR_BOUND = 0.25  # "linear": every median within ±25 % of the fitted line
PLOT = Path(__file__).resolve().parent.parent / "docs" / "growth.png"
# Operations in the tables and fits, in order; publish = seal + put, restore = list + read + open.
OPERATIONS = ("publish", "seal", "put", "restore", "list", "read", "open")
PLOTTED = ("publish", "restore")

METHOD = f"""\
In one process, for each store in turn (file: a `FileStore` in a temporary
directory on this machine's disk; Redis and etcd: a private server started by the
benchmark on loopback, as the backends benchmark above does, Redis without
persistence, one etcd member fsyncing its log), a `LeaseKeeper` takes a fresh
agent's lease, and for each state size, from small to large, rounds of:

* **publish**, what a leader does per step: `Sealer.seal` of the state (**seal**:
  JSON encoding, AES-256-GCM) then the fenced `put_checkpoint` (**put**);
* **restore**, what a new leader does (the public calls of
  `hamsterbunker/node/restore.py`): `list_checkpoints` (**list**), `read_checkpoint` of the
  newest (**read**), and `Sealer.open_checkpoint` of its bytes (**open**: authenticate,
  decrypt, JSON decoding). The restored state is compared with the published one
  (untimed). The restore also reads the loss acceptance, a small record, alongside
  the list; it is left out here as it does not grow with the state.

The state is one dict whose sealed checkpoint is the nominal size (its JSON is the
size less the seal's header, nonce and tag; at 64 MiB the sealed bytes stay just under
`MAX_CHECKPOINT_BYTES`, {MAX_CHECKPOINT_BYTES // MIB} MiB, the most a node publishes or
reads back). {WARMUP_ROUNDS} untimed rounds per size, then
{"/".join(str(n) for n in ROUNDS.values())} timed rounds for the sizes
{", ".join(f"{s // KIB} KiB" if s < MIB else f"{s // MIB} MiB" for s in SIZES)}, stopping
early after {BUDGET_S:.0f} s of a size (`--quick`: sizes up to 4 MiB,
{QUICK_ROUNDS} rounds). The tables give medians (p90 of publish and restore). The
restore runs in the publishing process right after a publish: the file store's
reads come from the page cache, as they would for a standby on the same machine.

Per store and operation a line *time = intercept + constant × size* is fitted by least
squares on the relative error (each median weighs the same whatever its size, so
the small sizes set the intercept and the large ones the constant); the fit table
gives the constant in ms per MiB, the intercept, the point farthest from the line
(relative to the line) and R² (on the linear scale). Target (the issue names no
number): publish and restore are linear, every median within ±{LINEAR_BOUND * 100:.0f} % of
the line. The plot (drawn by a full run into `docs/growth.png`, log-log: a slope of
one is linear) shows the medians and the fitted lines.

![Publish and restore time against state size, per store](growth.png)
"""


def _label(size: int) -> str:
    return f"{size // MIB} MiB" if size >= MIB else f"{size // KIB} KiB"


# -- measuring ------------------------------------------------------------------------


class _Bench:
    """Publish and restore of one agent on one store, under one held lease."""

    def __init__(self, store: Store) -> None:
        self.store = store
        record = store.read_cluster() or store.create_cluster(new_cluster_record(SECRET))
        self.sealer = Sealer(SECRET, record)
        keeper = LeaseKeeper(store, AGENT, "bench-1", "local")
        if keeper.tick().outcome is not Outcome.ACQUIRED:
            raise BenchmarkError(f"could not acquire the lease of a fresh agent on {store!r}")
        self.fence = keeper.fence()
        self.seq = 0
        # What the seal adds to the state's JSON (header, nonce, tag), a few bytes spare.
        self.overhead = len(self.sealer.seal(AGENT, 1, 1, json_state_of_size(KIB))) - KIB + 16

    def state(self, size: int) -> dict[str, str]:
        """A state whose sealed checkpoint is just under size bytes."""
        return json_state_of_size(size - self.overhead)

    def publish(self, state: dict[str, Any]) -> tuple[dict[str, float], int]:
        """seal, put and publish times (seconds), and the sealed size."""
        self.seq += 1
        started = time.perf_counter()
        blob = self.sealer.seal(AGENT, self.fence.epoch, self.seq, state)
        sealed = time.perf_counter()
        self.store.put_checkpoint(AGENT, self.fence, self.seq, blob)
        put = time.perf_counter()
        return {"seal": sealed - started, "put": put - sealed, "publish": put - started}, len(blob)

    def restore(self) -> tuple[dict[str, float], dict[str, Any]]:
        """list, read, open and restore times (seconds), and the state restored."""
        started = time.perf_counter()
        infos = self.store.list_checkpoints(AGENT)
        if not infos:
            raise BenchmarkError("no checkpoint listed after a publish")
        newest = max(infos, key=lambda info: (info.epoch, info.seq))  # as restore.py orders
        listed = time.perf_counter()
        blob = self.store.read_checkpoint(AGENT, newest)
        read = time.perf_counter()
        state, _inbox = self.sealer.open_checkpoint(blob, AGENT, newest.epoch, newest.seq)
        opened = time.perf_counter()
        times = {"list": listed - started, "read": read - listed, "open": opened - read,
                 "restore": opened - started}  # fmt: skip
        return times, state


@dataclass
class _Point:
    size: int
    sealed_bytes: int
    times: dict[str, list[float]]  # seconds, per operation

    def p50(self, operation: str) -> float:
        return median(self.times[operation])


def _measure(bench: _Bench, size: int, rounds: int, budget_s: float) -> _Point:
    state = bench.state(size)
    for _ in range(WARMUP_ROUNDS):
        bench.publish(state)
        bench.restore()
    times: dict[str, list[float]] = {operation: [] for operation in OPERATIONS}
    sealed_bytes = 0
    deadline = time.monotonic() + budget_s
    for i in range(rounds):
        if i > 0 and time.monotonic() > deadline:
            break
        published, sealed_bytes = bench.publish(state)
        restored, back = bench.restore()
        if back != state:
            raise BenchmarkError(f"the state restored at {_label(size)} is not the one published")
        for operation, seconds in (published | restored).items():
            times[operation].append(seconds)
    return _Point(size, sealed_bytes, times)


def _etcd_refusal(bench: _Bench, size: int) -> str:
    """What etcd answers to one publish of a checkpoint of size (expected: a refusal)."""
    try:
        bench.publish(bench.state(size))
    except StoreError as exc:
        return f"refused ({str(exc).split('. etcd takes')[0]})"
    return "accepted (the limit is higher than assumed)"


@contextmanager
def _store(backend: str, root: Path) -> Iterator[Store]:
    """A fresh store of backend (a private server for Redis and etcd), closed afterwards."""
    if backend == "file":
        store: Store = FileStore(root / "store")
        try:
            yield store
        finally:
            store.close()
        return
    with _server(backend) as url:
        store = open_store(url)
        try:
            yield store
        finally:
            store.close()


def _sizes_for(backend: str, sizes: Sequence[int]) -> list[int]:
    if backend != "etcd":
        return list(sizes)
    return [size for size in sizes if size + ETCD_TXN_ROOM <= ETCD_REQUEST_LIMIT]


# -- the fit ---------------------------------------------------------------------------


@dataclass
class _Fit:
    intercept_s: float
    per_mib_s: float
    worst: float  # the largest relative deviation of a median from the line (signed)
    worst_size: int
    r2: float

    def at(self, size: int) -> float:
        return self.intercept_s + self.per_mib_s * size / MIB

    @property
    def linear(self) -> bool:
        return abs(self.worst) <= LINEAR_BOUND


def _fit(sizes: Sequence[int], times_s: Sequence[float]) -> _Fit:
    """Weighted least squares of t = a + b·x, weights 1/t²: the relative error counts."""
    xs = [size / MIB for size in sizes]
    ws = [1 / (t * t) for t in times_s]
    s, sx = sum(ws), sum(w * x for w, x in zip(ws, xs, strict=True))
    sy = sum(w * t for w, t in zip(ws, times_s, strict=True))
    sxx = sum(w * x * x for w, x in zip(ws, xs, strict=True))
    sxy = sum(w * x * t for w, x, t in zip(ws, xs, times_s, strict=True))
    det = s * sxx - sx * sx
    if len(xs) < 2 or det == 0:
        raise BenchmarkError("a line needs at least two sizes")
    per_mib = (s * sxy - sx * sy) / det
    intercept = (sy - per_mib * sx) / s
    fitted = [intercept + per_mib * x for x in xs]
    deviations = [
        t / f - 1 if f > 0 else float("inf") for t, f in zip(times_s, fitted, strict=True)
    ]
    worst_i = max(range(len(xs)), key=lambda i: abs(deviations[i]))
    mean = sum(times_s) / len(times_s)
    total = sum((t - mean) ** 2 for t in times_s)
    residual = sum((t - f) ** 2 for t, f in zip(times_s, fitted, strict=True))
    r2 = 1 - residual / total if total > 0 else 1.0
    return _Fit(intercept, per_mib, deviations[worst_i], sizes[worst_i], r2)


# -- the plot ---------------------------------------------------------------------------


def _plot(results: dict[str, list[_Point]], fits: dict[tuple[str, str], _Fit], path: Path) -> str:
    """Draw the medians and fitted lines into path; what happened, for the notes."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display
        import matplotlib.pyplot as plt
    except ImportError:
        return "plot not drawn: matplotlib is not installed (pip install -e '.[bench]')"
    colours = {"file": "tab:blue", "redis": "tab:red", "etcd": "tab:green"}
    figure, axes = plt.subplots(1, len(PLOTTED), figsize=(10, 4.2), sharey=True)
    for ax, operation in zip(axes, PLOTTED, strict=True):
        for backend, points in results.items():
            sizes = [p.size for p in points]
            fit = fits[(backend, operation)]
            ax.plot([s / MIB for s in sizes], [p.p50(operation) * 1000 for p in points], "o",
                    color=colours[backend], label=f"{backend} (median)")  # fmt: skip
            dense = [sizes[0] * (sizes[-1] / sizes[0]) ** (i / 60) for i in range(61)]
            ax.plot([s / MIB for s in dense], [fit.at(s) * 1000 for s in dense], "--",
                    color=colours[backend], linewidth=1,
                    label=f"{backend} fit: {fit.intercept_s * 1000:.2f} ms + "
                          f"{fit.per_mib_s * 1000:.2f} ms/MiB")  # fmt: skip
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(
            f"{operation} ({'seal + put' if operation == 'publish' else 'list + read + open'})"
        )
        ax.set_xlabel("sealed checkpoint (MiB)")
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    axes[0].set_ylabel("median time (ms)")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return f"plot written to {path} ({path.stat().st_size // 1024} KB)"


# -- the result ---------------------------------------------------------------------------


def _store_table(backend: str, points: Sequence[_Point], note: str) -> Table:
    rows = []
    for p in points:
        rows.append(
            [
                _label(p.size),
                f"{p.sealed_bytes:,}",
                str(len(p.times["publish"])),
                ms(p.p50("seal")),
                ms(p.p50("put")),
                ms(p.p50("publish")),
                ms(percentile(p.times["publish"], 90)),
                ms(p.p50("list")),
                ms(p.p50("read")),
                ms(p.p50("open")),
                ms(p.p50("restore")),
                ms(percentile(p.times["restore"], 90)),
            ]
        )
    return Table(
        f"Publish and restore on {backend}{note} (medians)",
        ["state", "sealed bytes", "rounds", "seal ms", "put ms", "publish ms", "publish p90",
         "list ms", "read ms", "open ms", "restore ms", "restore p90"],
        rows,
    )  # fmt: skip


def _fit_table(fits: dict[tuple[str, str], _Fit], results: dict[str, list[_Point]]) -> Table:
    rows = []
    for (backend, operation), fit in fits.items():
        points = results[backend]
        rows.append(
            [
                f"{backend}: {operation}",
                f"{_label(points[0].size)}–{_label(points[-1].size)}",
                f"{fit.per_mib_s * 1000:.2f}",
                f"{fit.intercept_s * 1000:.3f}",
                f"{fit.worst * 100:+.0f} % at {_label(fit.worst_size)}",
                f"{fit.r2:.4f}",
                "yes" if fit.linear else "no",
            ]
        )
    return Table(
        f"Fitted lines: time = intercept + constant × size (least relative squares); "
        f"linear: every median within ±{LINEAR_BOUND * 100:.0f} %",
        ["store: operation", "sizes", "constant ms/MiB", "intercept ms",
         "farthest median from the line", "R²", "linear"],
        rows,
    )  # fmt: skip


def _checks(fits: dict[tuple[str, str], _Fit], results: dict[str, list[_Point]]) -> list[Check]:
    checks = []
    for backend, points in results.items():
        largest = points[-1]
        for operation in PLOTTED:
            fit = fits[(backend, operation)]
            checks.append(
                Check(
                    f"{backend}: {operation} time linear in size",
                    f"{fit.per_mib_s * 1000:.2f} ms/MiB + {fit.intercept_s * 1000:.2f} ms; "
                    f"farthest {fit.worst * 100:+.0f} % at {_label(fit.worst_size)} "
                    f"({_label(largest.size)}: {ms(largest.p50(operation))} ms)",
                    f"every median within ±{LINEAR_BOUND * 100:.0f} % of the line",
                    fit.linear,
                )
            )
    return checks


def _measure_store(
    backend: str, sizes: Sequence[int], quick: bool, root: Path, notes: list[str]
) -> list[_Point]:
    budget_s = QUICK_BUDGET_S if quick else BUDGET_S
    points = []
    with _store(backend, root) as store:
        bench = _Bench(store)
        for size in _sizes_for(backend, sizes):
            rounds = QUICK_ROUNDS if quick else ROUNDS[size]
            point = _measure(bench, size, rounds, budget_s)
            if len(point.times["publish"]) < rounds:
                notes.append(
                    f"{backend}, {_label(size)}: time budget of {budget_s:.0f} s reached after "
                    f"{len(point.times['publish'])} rounds"
                )
            points.append(point)
        absent = [size for size in sizes if size not in _sizes_for(backend, sizes)]
        if absent:
            notes.append(
                f"etcd: {', '.join(_label(s) for s in absent)} absent: one put_checkpoint is "
                f"one etcd txn, and the benchmark's member runs with etcd's default "
                f"--max-request-bytes of 1.5 MiB (hamsterbunker's own limit, "
                f"MAX_CHECKPOINT_BYTES, is {MAX_CHECKPOINT_BYTES // MIB} MiB); a publish of "
                f"{_label(absent[0])} tried once: {_etcd_refusal(bench, absent[0])}"
            )
    return points


def _draw(results: dict[str, list[_Point]], fits: dict[tuple[str, str], _Fit], quick: bool) -> str:
    if not quick:
        return _plot(results, fits, PLOT)
    # A smoke run draws too, so that the plotting is tried, but into a temp dir only.
    with tempfile.TemporaryDirectory(prefix="hb-bench-growth-plot-") as scratch:
        drawn = _plot(results, fits, Path(scratch) / "growth.png")
    return f"{drawn} (--quick: a temporary file, removed; docs/ untouched)"


def run(quick: bool) -> Result:
    sizes = QUICK_SIZES if quick else SIZES
    notes: list[str] = []
    results: dict[str, list[_Point]] = {}
    with temp_dir(NAME) as root:
        for backend in STORES:
            results[backend] = _measure_store(backend, sizes, quick, root, notes)
    fits = {
        (backend, operation): _fit([p.size for p in points], [p.p50(operation) for p in points])
        for backend, points in results.items()
        for operation in OPERATIONS
    }
    etcd_note = f" (up to {_label(results['etcd'][-1].size)}: its request limit)"
    tables = [
        _store_table(backend, points, etcd_note if backend == "etcd" else "")
        for backend, points in results.items()
    ]
    tables.append(_fit_table(fits, results))
    notes.append(_draw(results, fits, quick))
    return Result(NAME, TITLE, METHOD, tables, _checks(fits, results), notes)
