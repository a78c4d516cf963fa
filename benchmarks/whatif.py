"""Experiments behind the analysis of missed targets in docs/benchmarks.md (not benchmarks).

    python -m benchmarks.whatif standby [--seconds 20]   # what a standby's CPU goes to
    python -m benchmarks.whatif seal                     # what Sealer.seal's time goes to
    python -m benchmarks.whatif watch-latency            # a lease.json rename → wake-up
    python -m benchmarks.whatif handover [--count 40]    # released → acquired, in parts

They change no library code: ``standby`` runs an experimental third node, the
library's own ``Runtime`` over a ``FileStore`` subclass whose ``watch`` is
varied, beside an unchanged leader and standby; ``handover`` runs three nodes
whose ``Runtime`` subclass only logs when the watch wakes it and when its ticks
run; ``watch-latency`` times watchfiles and a plain inotify reader on a bare
directory; ``seal`` profiles ``Sealer.seal`` and, if ``orjson`` happens to be
importable, times a seal that encodes with it instead (orjson is not a
dependency; nothing installs it).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import ctypes
import io
import json
import os
import pstats
import signal
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from .common import SECRET, Table, json_state_of_size, median, render_text

VARIANTS = {
    "as-is": "the library's watch: watchfiles, recursive, 20 ms step, filter after the wake",
    "inotify-lease": "inotify read on the event loop (no thread, no polling), agent dir only, "
    "waking the runtime only when lease.json changes",
    "inotify-released": "as inotify-lease, but the watcher reads lease.json itself (a few "
    "hundred bytes, on the loop) and wakes the runtime only when the lease is released",
    "no-watch": "no watch at all: ticks only (a released lease is seen at the next tick)",
}


# -- the experimental node (runs in its own process) --------------------------------


def _node(store_dir: str, variant: str, node: str) -> int:
    from hamsterbunker import FileStore, Runtime
    from hamsterbunker.demo import CounterAgent
    from hamsterbunker.records import LeaseRecord

    counts = {"lease reads": 0, "wakes": 0}

    class Store(FileStore):
        def read_lease(self, agent: str) -> LeaseRecord | None:
            counts["lease reads"] += 1
            return super().read_lease(agent)

        async def watch(self, agent: str) -> AsyncIterator[None]:
            if variant == "no-watch":
                await asyncio.Event().wait()
            directory = self._writable_dir(agent)
            if variant == "as-is":
                source = super().watch(agent)
            elif variant == "inotify-lease":
                source = _inotify(directory, "lease.json")
            else:
                source = _released(directory)
            async for _ in source:
                counts["wakes"] += 1
                yield None

    runtime = Runtime(
        node_id=node,
        region="whatif",
        store=Store(store_dir),
        agent=CounterAgent(),
        secret=os.environ["HB_SECRET"],
    )
    started = time.monotonic()
    runtime.run()  # until SIGTERM
    elapsed = time.monotonic() - started
    print(json.dumps({k: v / elapsed for k, v in counts.items()}), flush=True)
    return 0


async def _inotify(directory: Path, name: str) -> AsyncIterator[None]:
    """Yield when the file name in directory is renamed into place or removed (Linux inotify)."""
    libc = ctypes.CDLL(None, use_errno=True)
    in_nonblock, in_cloexec = 0o4000, 0o2000000
    # IN_MOVED_TO | IN_DELETE: the store replaces lease.json by rename, so temp files being
    # written and the lock file's open/close (every renewal and checkpoint) wake nothing.
    mask = 0x80 | 0x200
    fd = libc.inotify_init1(in_nonblock | in_cloexec)
    if fd < 0 or libc.inotify_add_watch(fd, str(directory).encode(), mask) < 0:
        raise OSError(ctypes.get_errno(), "inotify")
    changed = asyncio.Event()
    wanted = name.encode()

    def readable() -> None:
        while True:
            try:
                data = os.read(fd, 65536)
            except BlockingIOError:
                return
            offset = 0
            while offset < len(data):
                length = struct.unpack_from("iIII", data, offset)[3]
                if data[offset + 16 : offset + 16 + length].rstrip(b"\0") == wanted:
                    changed.set()
                offset += 16 + length

    loop = asyncio.get_running_loop()
    loop.add_reader(fd, readable)
    try:
        while True:
            await changed.wait()
            changed.clear()
            yield None
    finally:
        loop.remove_reader(fd)
        os.close(fd)


async def _released(directory: Path) -> AsyncIterator[None]:
    """Yield only when lease.json changed and now has no holder (a released lease)."""
    async for _ in _inotify(directory, "lease.json"):
        try:
            holder = json.loads((directory / "lease.json").read_bytes()).get("holder", "")
        except (OSError, ValueError):
            holder = None  # unreadable: let the runtime look
        if holder is None:
            yield None


def _idle_awatch(step_ms: int) -> int:
    """Only an awatch of an empty directory that never changes, as the library configures it."""
    import watchfiles

    async def main() -> None:
        with tempfile.TemporaryDirectory() as empty:
            async for _ in watchfiles.awatch(empty, step=step_ms, debounce=200):
                pass

    asyncio.run(main())
    return 0


# -- standby: drive the experiment ---------------------------------------------------


def standby(seconds: float) -> None:
    from .nodes import AGENT_ID, NODES, bench_cluster
    from .standby import _usage

    rows: list[list[str]] = []

    def measure(pids: dict[str, int]) -> dict[str, tuple[float, float]]:
        before = {k: _usage(p) for k, p in pids.items()}
        time.sleep(seconds)
        after = {k: _usage(p) for k, p in pids.items()}
        return {
            k: (
                100 * (after[k].cpu_s - before[k].cpu_s) / seconds,
                (after[k].switches - before[k].switches) / seconds,
            )
            for k in pids
        }

    with bench_cluster("whatif") as cluster:
        cluster.ready_leader()
        ours = NODES[2].node
        cluster.process(ours).terminate()
        cluster.process(ours).wait(timeout=15)
        del cluster.cluster.processes[ours]  # the experimental node takes its place
        for variant in VARIANTS:
            env = {**os.environ, "HB_SECRET": SECRET}
            process = subprocess.Popen(
                [sys.executable, "-m", "benchmarks.whatif", "node",
                 str(cluster.workdir / "store"), variant, ours],
                env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                cwd=Path(__file__).resolve().parent.parent,
            )  # fmt: skip
            try:
                time.sleep(4)  # start-up done: imports, scrypt
                lease = cluster.store.read_lease(AGENT_ID)
                assert lease is not None and lease.holder is not None
                if lease.holder == ours:
                    raise RuntimeError("the experimental node leads: it must be a standby")
                standby_node = next(s.node for s in NODES[:2] if s.node != lease.holder)
                usage = measure({"ours": process.pid, "std": cluster.process(standby_node).pid})
            finally:
                process.send_signal(signal.SIGTERM)
                out, _ = process.communicate(timeout=20)
            counts = json.loads(out.decode().strip().splitlines()[-1])
            rows.append(
                [
                    f"{variant}: {VARIANTS[variant]}",
                    f"{usage['ours'][0]:.2f}",
                    f"{usage['ours'][1]:.0f}",
                    f"{counts['wakes']:.1f}",
                    f"{counts['lease reads']:.1f}",
                    f"{usage['std'][0]:.2f}",
                ]
            )
    for step in (20, 200):
        process = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.whatif", "idle-awatch", str(step)],
            cwd=Path(__file__).resolve().parent.parent,
        )
        try:
            time.sleep(2)
            usage = measure({"idle": process.pid})
        finally:
            process.terminate()
            process.wait(timeout=15)
        rows.append(
            [
                f"an idle watchfiles.awatch alone (step {step} ms), no runtime, no changes",
                f"{usage['idle'][0]:.2f}",
                f"{usage['idle'][1]:.0f}",
                "",
                "",
                "",
            ]
        )
    print(
        render_text(
            Table(
                f"A standby's CPU by watch variant, {seconds:.0f} s each, "
                "beside a leader stepping CounterAgent",
                [
                    "variant",
                    "CPU %",
                    "ctx sw/s",
                    "wakes/s",
                    "lease reads/s",
                    "unchanged standby CPU % (same window)",
                ],
                rows,
            )
        )
    )


# -- handover: where does released → acquired go? ---------------------------------------

HOG = "while True: pass"


def _handover_node(store: str, node: str, history: str) -> int:
    """The library's Runtime, logging when its watch wakes it and when its ticks run."""
    from hamsterbunker import Runtime
    from hamsterbunker.demo import CounterAgent

    class Node(Runtime):
        async def _watch(self) -> None:  # the library's _watch, plus one line of logging
            assert self._wake is not None
            async for _ in self.store.watch(self.agent_id):
                print(f"WAKE {time.monotonic():.6f}", file=sys.stderr, flush=True)
                self._wake.set()

        async def _sleep_until(self, deadline: float) -> None:
            # The library's _sleep_until, logging a wake-up that arrived while the node was
            # busy (a tick, a heartbeat) and that the clear() below drops unseen.
            assert self._stopping is not None and self._wake is not None
            while not self._stopping.is_set():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                if self._wake.is_set() and self.keeper.held is None:
                    print(f"CLEARED {time.monotonic():.6f}", file=sys.stderr, flush=True)
                self._wake.clear()
                waiters = [asyncio.ensure_future(self._stopping.wait())]
                if self.keeper.held is None:
                    waiters.append(asyncio.ensure_future(self._wake.wait()))
                done, pending = await asyncio.wait(
                    waiters, timeout=remaining, return_when=asyncio.FIRST_COMPLETED
                )
                for waiter in pending:
                    waiter.cancel()
                if done and self.keeper.held is None:
                    return

        async def _keeper_call(self, fn: Callable[..., Any], *args: Any) -> Any:
            standby, started = self.keeper.held is None, time.monotonic()
            result = await super()._keeper_call(fn, *args)
            if standby and fn == self.keeper.tick:
                print(f"TICK {started:.6f} {time.monotonic():.6f}", file=sys.stderr, flush=True)
            return result

    Node(
        node_id=node,
        region="whatif",
        store=store,
        agent=CounterAgent(),
        secret=os.environ["HB_SECRET"],
        history=history,
    ).run()
    return 0


def handover(count: int) -> None:
    """SIGTERM handovers between three instrumented nodes, without and with a CPU hog."""
    from hamsterbunker.local import LocalCluster, NodeSpec

    from .common import percentile
    from .nodes import bench_cluster, takeovers

    class Cluster(LocalCluster):
        def start(
            self, spec: NodeSpec, extra_env: dict[str, str] | None = None
        ) -> subprocess.Popen[bytes]:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            env = {**os.environ, "HB_SECRET": self.secret}
            command = [sys.executable, "-m", "benchmarks.whatif", "handover-node",
                       self.store_url, spec.node, str(self.history)]  # fmt: skip
            with open(self.log_dir / f"{spec.node}.log", "ab") as log:
                process = subprocess.Popen(
                    command,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    cwd=Path(__file__).resolve().parent.parent,
                )
            self.processes[spec.node] = process
            return process

    rows = []
    for hogs in (0, 1):
        hog_processes = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(hogs)]
        try:
            with bench_cluster("whatif-handover", cluster_class=Cluster) as cluster:
                samples, _ = takeovers(cluster, signal.SIGTERM, count, budget_s=600, seed=3)
                cluster.stop_all()
                logs = {node: cluster.cluster.log(node) for node in cluster.cluster.processes}
        finally:
            for hog in hog_processes:
                hog.kill()
                hog.wait(timeout=10)
        wakes = {
            n: [float(x.split()[1]) for x in t.splitlines() if x.startswith("WAKE ")]
            for n, t in logs.items()
        }
        ticks = {
            n: [(float(x.split()[1]), float(x.split()[2])) for x in t.splitlines() if x.startswith("TICK ")]
            for n, t in logs.items()
        }  # fmt: skip
        cleared = {
            n: [float(x.split()[1]) for x in t.splitlines() if x.startswith("CLEARED ")]
            for n, t in logs.items()
        }
        parts: dict[str, list[float]] = {"to wake": [], "wake to tick": [], "tick": []}
        total = []
        lost = 0
        for sample in samples:
            if sample.released is None:
                continue
            released, acquired = sample.sent + sample.released, sample.sent + sample.acquired
            lost += any(released <= t <= acquired for t in cleared[sample.new])
            tick = max((t for t in ticks[sample.new] if t[0] <= acquired), default=None)
            wake = min((w for w in wakes[sample.new] if released <= w <= acquired), default=None)
            if tick is None or wake is None:
                continue
            total.append(acquired - released)
            parts["to wake"].append(wake - released)
            parts["wake to tick"].append(tick[0] - wake)
            parts["tick"].append(acquired - tick[0])
        for label, values in [("released → acquired", total), *parts.items()]:
            rows.append(
                [
                    f"{hogs} CPU hog{'s' if hogs != 1 else ''}",
                    label,
                    str(len(values)),
                    f"{median(values) * 1000:.1f}",
                    f"{percentile(values, 99) * 1000:.1f}",
                    f"{max(values) * 1000:.1f}",
                    str(lost) if label == "released → acquired" else "",
                ]
            )
    print(
        render_text(
            Table(
                f"Graceful handover, {count} SIGTERMs: lease released (old leader's event) → the "
                "new leader's first watch wake-up after it → start of the tick that acquired → "
                "acquired",
                [
                    "load",
                    "part",
                    "n",
                    "p50 ms",
                    "p99 ms",
                    "max ms",
                    "wake-up cleared unseen in between",
                ],
                rows,
            )
        )
    )


# -- watch latency: from a lease.json rename to the wake-up ------------------------------


def watch_latency(rounds: int) -> None:
    """Rename lease.json into a directory and time the wake-up, with and without other traffic."""
    rows = []
    for noise_ms in (0, 10):
        for name in (
            "watchfiles (as the store: step 20 ms, debounce 200 ms)",
            "inotify on the loop",
        ):
            delays = asyncio.run(_latency(name.startswith("inotify"), noise_ms, rounds))
            rows.append(
                [
                    name,
                    "none" if not noise_ms else f"another file appended every {noise_ms} ms",
                    f"{median(delays) * 1000:.1f}",
                    f"{max(delays) * 1000:.1f}",
                ]
            )
    print(
        render_text(
            Table(
                f"Delay from a rename of lease.json to the watcher's wake-up ({rounds} renames)",
                ["watcher", "other changes in the directory", "median ms", "max ms"],
                rows,
            )
        )
    )


async def _latency(inotify: bool, noise_ms: int, rounds: int) -> list[float]:
    import watchfiles

    from hamsterbunker.stores.file import _watch_filter

    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        if inotify:
            source = _inotify(directory, "lease.json")
        else:
            source = (
                None
                async for _ in watchfiles.awatch(
                    directory, watch_filter=_watch_filter, step=20, debounce=200, recursive=True
                )
            )
        woke = asyncio.Event()

        async def consume() -> None:
            async for _ in source:
                woke.set()

        async def noise() -> None:
            with open(directory / "events.jsonl", "ab") as out:
                while True:
                    out.write(b"{}\n")
                    out.flush()
                    await asyncio.sleep(noise_ms / 1000)

        consumer = asyncio.create_task(consume())
        noiser = asyncio.create_task(noise()) if noise_ms else None
        delays = []
        try:
            await asyncio.sleep(0.5)
            for n in range(rounds):
                await asyncio.sleep(0.3)
                woke.clear()
                (directory / "tmp-hb-x").write_bytes(b"{}")
                started = time.monotonic()
                os.replace(directory / "tmp-hb-x", directory / "lease.json")
                try:
                    await asyncio.wait_for(woke.wait(), timeout=2)
                except TimeoutError:
                    raise RuntimeError(f"no wake-up for rename {n}") from None
                delays.append(time.monotonic() - started)
        finally:
            consumer.cancel()
            if noiser is not None:
                noiser.cancel()
            await asyncio.gather(consumer, *([noiser] if noiser else []), return_exceptions=True)
        return delays


# -- seal: where its time goes --------------------------------------------------------


def seal() -> None:
    from hamsterbunker.sealing import Sealer, new_cluster_record

    sealer = Sealer(SECRET, new_cluster_record(SECRET))
    for size, rounds in ((1 << 20, 50), (8 << 20, 20)):
        _seal_size(sealer, json_state_of_size(size), rounds)


def _seal_size(sealer: Any, state: dict[str, str], rounds: int) -> None:
    size = len(json.dumps(state, separators=(",", ":")))
    profile = cProfile.Profile()
    profile.enable()
    for seq in range(rounds):
        sealer.seal("whatif", 1, seq, state)
    profile.disable()
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(5)
    print(f"--- Sealer.seal of a {size >> 20} MiB state, {rounds} times, cProfile ---")
    print("\n".join(line for line in out.getvalue().splitlines()[4:] if line.strip()))
    print(
        f"Sealer.seal median {_median_ms(lambda: sealer.seal('whatif', 1, 1, state), rounds):.2f} ms"
    )
    try:
        import orjson  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        print("(orjson not importable: the comparison with it is skipped)")
        return
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    aead = AESGCM(os.urandom(32))
    prefix = b"HBCP\x01\x00\x40" + b"h" * 64

    def seal_orjson() -> bytes:
        nonce = os.urandom(12)
        return prefix + nonce + aead.encrypt(nonce, orjson.dumps(state), prefix)

    def seal_orjson_into() -> bytearray:
        plaintext = orjson.dumps(state)
        nonce = os.urandom(12)
        head = len(prefix) + len(nonce)
        blob = bytearray(head + len(plaintext) + 16)
        blob[:head] = prefix + nonce
        aead.encrypt_into(nonce, plaintext, prefix, memoryview(blob)[head:])
        return blob

    assert bytes(seal_orjson_into())[: len(prefix)] == prefix
    same = (
        orjson.dumps(state) == json.dumps(state, separators=(",", ":"), ensure_ascii=False).encode()
    )
    print(
        f"the same seal encoding with orjson: median {_median_ms(seal_orjson, rounds):.2f} ms; "
        f"with encrypt_into one buffer: {_median_ms(seal_orjson_into, rounds):.2f} ms "
        f"(orjson.dumps alone {_median_ms(lambda: orjson.dumps(state), rounds):.2f} ms; "
        f"identical bytes to json.dumps: {same})"
    )


def _median_ms(fn: Callable[[], Any], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return median(times) * 1000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.whatif")
    sub = parser.add_subparsers(dest="what", required=True)
    standby_parser = sub.add_parser("standby", help="a standby's CPU by watch variant")
    standby_parser.add_argument("--seconds", type=float, default=20)
    sub.add_parser("seal", help="where Sealer.seal's time goes")
    handover_parser = sub.add_parser("handover", help="where released → acquired goes")
    handover_parser.add_argument("--count", type=int, default=40)
    hnode = sub.add_parser("handover-node")  # internal
    for name in ("store", "node", "history"):
        hnode.add_argument(name)
    latency = sub.add_parser("watch-latency", help="from a lease.json rename to the wake-up")
    latency.add_argument("--rounds", type=int, default=20)
    node = sub.add_parser("node")  # internal: the experimental standby
    node.add_argument("store")
    node.add_argument("variant", choices=list(VARIANTS))
    node.add_argument("node")
    idle = sub.add_parser("idle-awatch")  # internal
    idle.add_argument("step", type=int)
    args = parser.parse_args(argv)
    if args.what == "standby":
        standby(args.seconds)
    elif args.what == "seal":
        seal()
    elif args.what == "handover":
        handover(args.count)
    elif args.what == "handover-node":
        return _handover_node(args.store, args.node, args.history)
    elif args.what == "watch-latency":
        watch_latency(args.rounds)
    elif args.what == "node":
        return _node(args.store, args.variant, args.node)
    else:
        return _idle_awatch(args.step)
    return 0


if __name__ == "__main__":
    sys.exit(main())
