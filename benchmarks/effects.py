"""One journaled effect against one checkpoint publish of the same size, on each store."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

from hamsterbunker import FileStore
from hamsterbunker.core.limits import MAX_EFFECT_BYTES
from hamsterbunker.lease import LeaseKeeper, Outcome
from hamsterbunker.node.calls import NodeCalls
from hamsterbunker.sealing import EffectAt, Sealer, new_cluster_record
from hamsterbunker.stores import Fence, Store, open_store

from .backends import _server
from .common import (
    SECRET,
    BenchmarkError,
    Check,
    Result,
    Table,
    json_state_of_size,
    ms,
    percentile,
    temp_dir,
)

NAME = "effects"
TITLE = "Journaled effect against a checkpoint publish, per store (file, etcd, Redis)"
BACKENDS = ("file", "etcd", "redis")
SIZES = (100, 64 * 1024)  # the compact JSON of the effect's result and of the state
RATIO_TARGET = 1.2  # (the issue) one journaled effect ≤ 1.2 × one checkpoint publish
STEPS = {"file": 200, "etcd": 120, "redis": 200}
QUICK_STEPS = 15
WARMUP_STEPS = 3
BUDGET_S, QUICK_BUDGET_S = 12.0, 4.0  # per store and size
EFFECT_NAME = "llm.call"

METHOD = f"""\
What a leader pays to record one completed journaled effect, against what it pays to
publish a checkpoint, with a result and a state of the same size: about 100 bytes
(compact JSON) and 64 KiB. In this process, on each store (the file store in a
temporary directory on this machine's disk; etcd and Redis started by the benchmark on
loopback, as in the per-store benchmark above), a `LeaseKeeper` takes the lease of a
fresh agent, and then each round is one step *s* of an agent whose step calls
journaled effects, in the order a node runs it:

* **effect**: the step's first effect's outcome recorded, the calls
  `TermJournal.write` makes: `Sealer.seal_effect`, then the fenced
  `Store.put_effect`, in one call on the node's store pool (`NodeCalls`, as the
  node does), timed from the call to its return. This is the cost the goal is about.
* **further effect**: a second effect of the same step recorded the same way (on
  the file store the step's journal directory exists by then); reported.
* **publish**: the step's checkpoint, the calls the term's `_publish` makes:
  `Sealer.seal` on the worker pool, then the fenced `Store.put_checkpoint` on the
  store pool, which also removes the step's journal (as it does after every step
  that called effects).
* **plain publish**: then the checkpoint of a step *s* + 1 that called no effect
  (nothing to remove); reported, for comparison.

Effect and publish so alternate, each one following a write of the other kind. Each
part (sealing, the store call) is timed on its own as well. {WARMUP_STEPS} untimed
steps first; then up to {"/".join(str(STEPS[b]) for b in BACKENDS)} steps per size on
file/etcd/Redis ({QUICK_STEPS} with `--quick`), within {BUDGET_S:.0f} s per store and
size. The lease is held, not renewed, throughout (the fence is holder, session and
epoch; nothing else writes).

What the two store calls do, per store (the difference is what the ratio shows):

* **file**: `put_effect` writes the record to a temporary file in the step's journal
  directory (`effects/<seq>/`) and fsyncs it, takes the lease lock, checks the fence,
  renames it into place and fsyncs the directory; the step's *first* effect makes
  that directory first (`mkdir`, then an fsync of `effects/`): 3 fsyncs, a further
  effect 2. `put_checkpoint` makes 2 fsyncs (the temporary file, the directory after
  the rename), and also lists the retained checkpoints under the lock, removes the
  oldest beyond five and, once durable, removes the step's journal (its files and
  directory; not synced: the next write's fsync commits that).
* **etcd**: `put_effect` is one txn (compare the fence key, put the record);
  `put_checkpoint` is two round trips, a read (the names of the checkpoints, the
  descriptions, the fence) then a txn that compares the fence and puts the blob and
  its description, deletes the journal range of the step and older and the
  checkpoints beyond retention. Each txn that writes is a Raft commit: an fsync of
  the one member's WAL.
* **Redis**: one Lua script each (`PUT_EFFECT`: fence check, `HSET`, `ZADD`,
  `PUBLISH`; `PUT_CHECKPOINT`: fence check, a scan of the checkpoint descriptions,
  two `HSET`s, retention, the journal's `UNLINK`, `PUBLISH`); no persistence, as the
  tests run it.

Target (the issue): one journaled effect ≤ {RATIO_TARGET} × one checkpoint publish of
the same size, judged on the medians of the same run; the p99 ratio is reported.
"""

ANALYSIS = """\
Shown when a ratio misses. The parts table splits each side into sealing (an
effect's on the store pool, in the call that stores it; a checkpoint's on the
worker pool) and the store call (on the store pool); the two seals cost the same at
the same size (`seal_effect` adds only a longer header), so a miss is in the store
call. Structurally (the list above) an effect is never more work than a checkpoint
on etcd (one round trip against two) or Redis (one script each, the effect's the
smaller); on the file store the step's *first* effect makes one fsync more than a
checkpoint (3 against 2: the new journal directory's entry in `effects/`), while a
further effect of the same step makes the same 2. Where the file store misses, that
extra fsync is the first place to look: the step's journal directory could be made
off the effect's path (when the step starts, before its first effect is due).
"""


def _size_label(size: int) -> str:
    return f"{size} B" if size < 1024 else f"{size // 1024} KiB"


class _Bench:
    """One store, one agent under one held lease, the node's two pools."""

    def __init__(self, store: Store, agent: str, calls: NodeCalls) -> None:
        self.store, self.agent, self.calls = store, agent, calls
        record = store.read_cluster() or store.create_cluster(new_cluster_record(SECRET))
        self.sealer = Sealer(SECRET, record)
        keeper = LeaseKeeper(store, agent, "bench-1", "local")
        if keeper.tick().outcome is not Outcome.ACQUIRED:
            raise BenchmarkError(f"could not acquire the lease of a fresh agent on {store!r}")
        self.fence: Fence = keeper.fence()

    async def effect(
        self, seq: int, index: int, result: Any, parts: dict[str, list[float]]
    ) -> None:
        """What TermJournal.write does for an outcome (replay="safe")."""
        payload = {"replay": "safe", "outcome": {"result": result}}
        at = EffectAt(self.agent, seq, index, "outcome", EFFECT_NAME)

        def seal_and_put() -> tuple[float, float, int]:  # one call on the store pool
            t0 = time.perf_counter()
            blob = self.sealer.seal_effect(at, self.fence.epoch, payload)
            if len(blob) > MAX_EFFECT_BYTES:
                raise BenchmarkError(f"an effect record of {len(blob)} bytes is over the limit")
            t1 = time.perf_counter()
            self.store.put_effect(self.agent, self.fence, seq, index, "outcome", blob)
            return t1 - t0, time.perf_counter() - t1, len(blob)

        sealing, putting, size = await self.calls.io(seal_and_put)
        parts["seal_effect"].append(sealing)
        parts["put_effect"].append(putting)
        parts["sealed_effect"] = [float(size)]

    async def publish(self, seq: int, state: dict[str, Any], parts: dict[str, list[float]]) -> None:
        """What the term's _publish does: seal, then the fenced put_checkpoint."""
        t0 = time.perf_counter()
        blob = await self.calls.work(self.sealer.seal, self.agent, self.fence.epoch, seq, state)
        t1 = time.perf_counter()
        await self.calls.io(self.store.put_checkpoint, self.agent, self.fence, seq, blob)
        parts["seal"].append(t1 - t0)
        parts["put_checkpoint"].append(time.perf_counter() - t1)
        parts["sealed_checkpoint"] = [float(len(blob))]


async def _timed(call: Awaitable[None]) -> float:
    started = time.perf_counter()
    await call
    return time.perf_counter() - started


async def _measure(bench: _Bench, size: int, steps: int, budget_s: float) -> Measured:
    value = json_state_of_size(size)  # {"data": ...}, size bytes of compact JSON
    times: dict[str, list[float]] = {
        k: []
        for k in ("effect", "further", "publish", "plain", "seal_effect", "put_effect", "seal",
                  "put_checkpoint")
    }  # fmt: skip
    scratch: dict[str, list[float]] = {
        k: [] for k in ("seal_effect", "put_effect", "seal", "put_checkpoint")
    }
    notes: list[str] = []
    seq = 0

    async def step(record: bool) -> None:
        nonlocal seq
        seq += 1
        parts = times if record else scratch
        effect = await _timed(bench.effect(seq, 0, value, parts))
        further = await _timed(bench.effect(seq, 1, value, scratch))
        publish = await _timed(bench.publish(seq, value, parts))
        seq += 1
        plain = await _timed(bench.publish(seq, value, scratch))
        if record:
            times["plain"].append(plain)
            times["effect"].append(effect)
            times["further"].append(further)
            times["publish"].append(publish)

    for _ in range(WARMUP_STEPS):
        await step(record=False)
    deadline = time.monotonic() + budget_s
    for _ in range(steps):
        if time.monotonic() > deadline:
            notes.append(
                f"time budget of {budget_s:.0f} s reached after {len(times['effect'])} steps"
            )
            break
        await step(record=True)
    return times, notes


Measured = tuple[dict[str, list[float]], list[str]]  # times by figure; notes


async def _run_store(store: Store, steps: int, budget_s: float) -> dict[int, Measured]:
    calls = NodeCalls()
    try:
        out: dict[int, Measured] = {}
        for size in SIZES:
            bench = _Bench(store, f"bench-effects-{size}", calls)
            out[size] = await _measure(bench, size, steps, budget_s)
        return out
    finally:
        calls.close()


def _store_results(url: str | Path, steps: int, budget_s: float) -> dict[int, Measured]:
    """url: a store URL, or the directory of a file store."""
    store: Store = FileStore(url) if isinstance(url, Path) else open_store(url)
    try:
        return asyncio.run(_run_store(store, steps, budget_s))
    finally:
        store.close()


def run(quick: bool) -> Result:
    budget_s = QUICK_BUDGET_S if quick else BUDGET_S
    measured: dict[str, dict[int, Measured]] = {}
    for backend in BACKENDS:
        steps = QUICK_STEPS if quick else STEPS[backend]
        if backend == "file":
            with temp_dir(NAME) as root:
                measured[backend] = _store_results(root / "store", steps, budget_s)
        else:
            with _server(backend) as url:
                measured[backend] = _store_results(url, steps, budget_s)

    main_rows: list[list[str]] = []
    part_rows: list[list[str]] = []
    checks: list[Check] = []
    notes: list[str] = []
    for backend, by_size in measured.items():
        for size, (t, size_notes) in by_size.items():
            label = f"{backend}, {_size_label(size)}"
            notes += [f"{label}: {n}" for n in size_notes]
            e50, e99 = percentile(t["effect"], 50), percentile(t["effect"], 99)
            p50, p99 = percentile(t["publish"], 50), percentile(t["publish"], 99)
            main_rows.append(
                [label, str(len(t["effect"])), ms(e50), ms(e99), ms(p50), ms(p99),
                 f"{e50 / p50:.2f}", f"{e99 / p99:.2f}", ms(percentile(t["further"], 50)),
                 ms(percentile(t["plain"], 50)), f"{e50 / percentile(t['plain'], 50):.2f}"]
            )  # fmt: skip
            part_rows.append(
                [label, f"{int(t['sealed_effect'][0]):,}", f"{int(t['sealed_checkpoint'][0]):,}",
                 ms(percentile(t["seal_effect"], 50)), ms(percentile(t["put_effect"], 50)),
                 ms(percentile(t["seal"], 50)), ms(percentile(t["put_checkpoint"], 50)),
                 f"{percentile(t['put_effect'], 50) / percentile(t['put_checkpoint'], 50):.2f}"]
            )  # fmt: skip
            ratio = e50 / p50
            checks.append(
                Check(
                    f"effect / publish p50, {label}",
                    f"{ratio:.2f} × ({ms(e50)} vs {ms(p50)} ms; p99 {e99 / p99:.2f} ×)",
                    f"≤ {RATIO_TARGET} ×",
                    ratio <= RATIO_TARGET,
                )
            )
    tables = [
        Table(
            "One journaled effect against one checkpoint publish of the same size",
            ["store, result/state", "steps", "effect p50 ms", "effect p99 ms", "publish p50 ms",
             "publish p99 ms", "effect / publish p50", "effect / publish p99",
             "further effect p50 ms", "plain publish p50 ms", "effect / plain publish p50"],
            main_rows,
        ),
        Table(
            "Parts (medians): sealing on the worker pool, the store call on the store pool",
            ["store, result/state", "sealed effect bytes", "sealed checkpoint bytes",
             "seal_effect ms", "put_effect ms", "seal ms", "put_checkpoint ms",
             "put_effect / put_checkpoint"],
            part_rows,
        ),
    ]  # fmt: skip
    return Result(NAME, TITLE, METHOD, tables, checks, notes, ANALYSIS)
