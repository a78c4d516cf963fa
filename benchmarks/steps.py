"""Steps per second with a durable checkpoint after every step, against the disk's raw fsync rate."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from hamsterbunker import Event, FileStore, Runtime
from hamsterbunker.sealing import Sealer, new_cluster_record

from .common import SECRET, Check, RawWriter, Result, Table, median, temp_dir, wait_for

NAME = "steps"
TITLE = "Steps per second, a checkpoint after every step"
AGENT = "bench-steps"

METHOD = """\
One in-process `hamsterbunker.Runtime` (default timing, no other node) on a `FileStore`
in a temporary directory runs an agent whose `async step` returns at once with a tiny
state (`{"n": n + 1}`, a checkpoint of about 150 sealed bytes). After the first
checkpoint and a 0.5 s warm-up, the `checkpoint.published` events passed to `on_event`
are counted for a fixed time: every one is a step whose sealed checkpoint the store
made durable. The process CPU time over the same window shows whether the loop is
bound by the disk or by the CPU.

The baseline, **raw**, is the benchmark's own durable write loop (write a temp file,
`fsync`, `rename`, `fsync` the directory) of a blob of the same size, for the same
time, in the store's checkpoint directory. Raw and runtime rounds alternate; the
figures are the medians of the rounds. No target is set for this figure.
"""

ANALYSIS = ""


class InstantCounter:
    """An agent whose step costs nothing: what is left is HamsterBunker's cost per step."""

    id = AGENT

    def init(self) -> dict[str, Any]:
        return {"n": 0}

    async def step(self, state: dict[str, Any]) -> dict[str, Any]:
        return {"n": state["n"] + 1}


def _runtime_round(store_dir: Path, duration: float, warmup: float) -> tuple[float, float]:
    """(steps per second, CPU seconds per step) of one Runtime over duration."""
    published: list[float] = []

    def on_event(event: Event) -> None:
        if event.type == "checkpoint.published":
            published.append(time.monotonic())

    node = Runtime(
        node_id="bench-1",
        region="local",
        store=FileStore(store_dir),
        agent=InstantCounter(),
        secret=SECRET,
        on_event=on_event,
    )
    node.start()
    try:
        wait_for(lambda: len(published) > 0, "the first checkpoint", timeout=30)
        start = time.monotonic() + warmup
        time.sleep(max(0.0, start - time.monotonic()))
        cpu_start = time.process_time()
        time.sleep(duration)
        end = time.monotonic()
        cpu = time.process_time() - cpu_start
    finally:
        node.stop(timeout=30)
    steps = sum(1 for t in published if start <= t < end)
    return steps / (end - start), cpu / max(steps, 1)


def _raw_round(directory: Path, blob: bytes, duration: float) -> tuple[float, float]:
    """(durable writes per second, CPU seconds per write) of the raw loop over duration."""
    count = 0
    cpu_start = time.process_time()
    start = time.monotonic()
    end = start + duration
    writer = RawWriter(directory)
    while time.monotonic() < end:
        writer.write(blob)
        count += 1
    elapsed = time.monotonic() - start
    return count / elapsed, (time.process_time() - cpu_start) / max(count, 1)


def run(quick: bool) -> Result:
    rounds, duration, warmup = (1, 2.0, 0.5) if quick else (3, 5.0, 0.5)
    raw_rates: list[float] = []
    raw_cpu: list[float] = []
    step_rates: list[float] = []
    step_cpu: list[float] = []
    with temp_dir(NAME) as root:
        store_dir = root / "store"
        store = FileStore(store_dir)
        sealer = Sealer(SECRET, store.create_cluster(new_cluster_record(SECRET)))
        blob = sealer.seal(AGENT, 1, 1, {"n": 12345})  # the size of this agent's checkpoints
        directory = root / "raw"  # beside the store, on the same filesystem
        directory.mkdir()
        for _ in range(rounds):
            rate, cpu = _raw_round(directory, blob, duration)
            raw_rates.append(rate)
            raw_cpu.append(cpu)
            rate, cpu = _runtime_round(store_dir, duration, warmup)
            step_rates.append(rate)
            step_cpu.append(cpu)
    steps, raw = median(step_rates), median(raw_rates)
    table = Table(
        f"{TITLE} ({rounds} × {duration:.0f} s each, medians)",
        ["loop", "per second", "CPU ms each", "rounds (per second)"],
        [
            [
                "raw durable write (write, fsync, rename, dir fsync)",
                f"{raw:.0f}",
                f"{median(raw_cpu) * 1000:.2f}",
                ", ".join(f"{r:.0f}" for r in raw_rates),
            ],
            [
                "Runtime steps, each checkpoint published",
                f"{steps:.0f}",
                f"{median(step_cpu) * 1000:.2f}",
                ", ".join(f"{r:.0f}" for r in step_rates),
            ],
            ["ratio steps / raw", f"{steps / raw:.2f}", "", ""],
        ],
    )
    checks = [Check("steps/s ÷ raw durable writes/s", f"{steps / raw:.2f}", "— (reported)", None)]
    notes = [
        f"sealed checkpoint size: {len(blob)} bytes",
        f"the step loop used {median(step_cpu) * 1000:.2f} ms of CPU per step, the raw loop "
        f"{median(raw_cpu) * 1000:.2f} ms per write: the raw loop waits on the disk, the step "
        "loop mostly on the CPU (no target is set here, so it was not profiled further)",
    ]
    return Result(NAME, TITLE, METHOD, [table], checks, notes, ANALYSIS)
