"""Nodes of this tree against nodes of main before the record layer, side by side."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .backends import _server
from .common import BenchmarkError, Check, Result, Table, ms, percentile, temp_dir

NAME = "versions"
TITLE = "The record layer's nodes against main before it, side by side (file, Redis, etcd)"
# The newest commit of main merged into this branch: the same node, whose nodes open the
# earlier stores for file://, redis:// and etcd://; only the store layer differs.
BASELINE = "f99b7ff79234ccd688666bc26758c0821e10e765"
REPO = Path(__file__).resolve().parent.parent
STORES = ("file", "redis", "etcd")
FIGURES = {
    "handover": "graceful handover: last publish → first checkpoint, agent step excluded",
    "failover": "failover: kill → first checkpoint, agent step excluded",
    "inbox": "inbox: submit → consumed (checkpoint accepted)",
}
RATIO_TARGET = 1.10
# "etcd:handover,file:inbox": only these measurements (a re-run of one figure).
ONLY_ENV = "HB_BENCH_VERSIONS"
ROUNDS_ENV = "HB_BENCH_VERSIONS_ROUNDS"

METHOD = f"""\
The issue that brings the record layer asks that, before it replaces the stores, the
old commit and the new run side by side in one run, and that no figure be more than
10 % worse. The old side is commit `{BASELINE[:10]}` of main, the newest merged into
this branch: its nodes open the earlier stores for `file://`, `redis://` and
`etcd://`, and the rest of the node is this tree's, so only the store layer differs
(a first run against an older commit also counted what the node itself does since
at the start of a term: it reads the cluster's keys and the first step's journal).
It is unpacked from this repository's
history into a temporary directory (`git archive`); the new side is this tree. Each
measurement runs in a process of its own whose `PYTHONPATH` is its side's tree, so
that process and the node processes it starts (`python -m hamsterbunker run`) run
that side's code; both use this virtual environment's libraries.

The measurements are the benchmarks' own, called from each side's tree: the
**handover** and **failover** benchmarks' takeovers (`benchmarks.nodes`: three node
processes, SIGTERM or SIGKILL to the leader, the figure the benchmark holds to its
target: from the old leader's last publish, or from the kill, to the new leader's
first checkpoint without its own step) and the **inbox** benchmark's
submit → consumed latency (`benchmarks.inbox`: one node, one client, each
submission's admission until the checkpoint that consumed it was accepted). Each on
the file store (a fresh temporary directory), Redis and etcd (a fresh server on
loopback per measurement, as the backends benchmark starts them).

Rounds alternate the order of the sides (old, new; new, old; …) so that machine noise
hits both alike; each figure pools its samples over the rounds. The verdict compares
p99 (and p50, reported) of the new side against 1.10 × the old side's.
"""

# Run in each side's tree (sys.argv: figure, store URL or "", count, seed); prints the
# figure's samples in seconds as JSON. Only names both sides' benchmarks have.
DRIVER = r"""
import json, signal, sys
figure, url, count, seed = sys.argv[1], sys.argv[2] or None, int(sys.argv[3]), int(sys.argv[4])
if figure == "inbox":
    from benchmarks.inbox import _latency
    values = [x.accepted - x.start for x in _latency(url, count, 240, seed).samples]
else:
    from benchmarks.common import TIMING
    from benchmarks.nodes import bench_cluster, takeovers
    signum = signal.SIGTERM if figure == "handover" else signal.SIGKILL
    with bench_cluster("versions-" + figure, timing=TIMING, store_url=url) as cluster:
        samples, _notes = takeovers(cluster, signum, count, 360, seed=seed)
    graceful = figure == "handover"
    values = [s.published_without_step - (s.handover_start if graceful else 0.0) for s in samples]
print(json.dumps(values))
"""


@contextmanager
def _baseline_tree() -> Iterator[Path]:
    """The baseline commit's files, unpacked into a temporary directory."""
    with tempfile.TemporaryDirectory(prefix="hb-bench-baseline-") as tmp:
        archive = Path(tmp) / "baseline.tar"
        made = subprocess.run(
            ["git", "-C", str(REPO), "archive", "--output", str(archive), BASELINE],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if made.returncode != 0:
            raise BenchmarkError(f"git archive {BASELINE[:10]}: {made.stderr.strip()[:300]}")
        tree = Path(tmp) / "tree"
        with tarfile.open(archive) as tar:
            tar.extractall(tree, filter="data")
        yield tree


@contextmanager
def _store_url(store: str, workdir: Path) -> Iterator[str]:
    """A fresh store of its kind: a directory in workdir, or a fresh server on loopback."""
    if store == "file":
        yield (workdir / "store").as_uri()
        return
    with _server(store) as url:
        yield url


def _measure(tree: Path, figure: str, store: str, count: int, seed: int) -> list[float]:
    """One measurement in a process that runs tree's code; its samples in seconds."""
    with temp_dir(f"versions-{figure}") as workdir, _store_url(store, workdir) as url:
        env = {**os.environ, "PYTHONPATH": str(tree)}
        done = subprocess.run(
            [sys.executable, "-c", DRIVER, figure, url, str(count), str(seed)],
            cwd=tree,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
    if done.returncode != 0:
        raise BenchmarkError(
            f"{figure} on {store} in {tree}: exit {done.returncode}\n{done.stderr[-2000:]}"
        )
    return [float(v) for v in json.loads(done.stdout.strip().splitlines()[-1])]


def _chosen() -> list[tuple[str, str]]:
    """The (store, figure) pairs to measure: all, or those ONLY_ENV names."""
    every = [(store, figure) for store in STORES for figure in FIGURES]
    names = ", ".join(f"{s}:{f}" for s, f in every)
    given = [p.strip() for p in os.environ.get(ONLY_ENV, "").split(",") if p.strip()]
    chosen = [(p.partition(":")[0], p.partition(":")[2]) for p in given]
    unknown = [p for p, c in zip(given, chosen, strict=True) if c not in every]
    if unknown:
        raise BenchmarkError(f"{ONLY_ENV}: {', '.join(unknown)} not one of {names}")
    return [c for c in every if c in chosen] if chosen else every


def run(quick: bool) -> Result:
    rounds, count = (1, 3) if quick else (int(os.environ.get(ROUNDS_ENV, "4")), 10)
    pairs = _chosen()
    samples: dict[tuple[str, str, str], list[float]] = {}
    with _baseline_tree() as old:
        sides = {"old": old, "new": REPO}
        for round_no in range(rounds):
            order = ["old", "new"] if round_no % 2 == 0 else ["new", "old"]
            for store, figure in pairs:
                for side in order:
                    seed = 100 * round_no + list(FIGURES).index(figure)
                    got = _measure(sides[side], figure, store, count, seed)
                    samples.setdefault((store, figure, side), []).extend(got)
    rows: list[list[str]] = []
    checks: list[Check] = []
    for store, figure in pairs:
        label = FIGURES[figure]
        old_v, new_v = samples[(store, figure, "old")], samples[(store, figure, "new")]
        old99, new99 = percentile(old_v, 99), percentile(new_v, 99)
        old50, new50 = percentile(old_v, 50), percentile(new_v, 50)
        rows.append(
            [
                f"{store}: {label}",
                f"{len(old_v)} / {len(new_v)}",
                ms(old50),
                ms(new50),
                f"{new50 / old50:.2f}",
                ms(old99),
                ms(new99),
                f"{new99 / old99:.2f}",
            ]
        )
        checks.append(
            Check(
                f"{store}: p99 {label}, new / old",
                f"{new99 / old99:.2f} × ({ms(new99)} vs {ms(old99)} ms)",
                f"≤ {RATIO_TARGET} ×",
                new99 <= RATIO_TARGET * old99,
            )
        )
    table = Table(
        f"This tree against {BASELINE[:10]}, samples pooled over {rounds} rounds",
        ["figure", "n old / new", "old p50 ms", "new p50 ms", "p50 new / old",
         "old p99 ms", "new p99 ms", "p99 new / old"],
        rows,
    )  # fmt: skip
    return Result(name=NAME, title=TITLE, method=METHOD, tables=[table], checks=checks)
