"""The inbox: submit → consumed latency with an idle agent, and admissions per second, per store."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hamsterbunker import Client, current_step
from hamsterbunker.core.clock import MonotonicClock
from hamsterbunker.core.history import read_history
from hamsterbunker.ops.checker import check
from hamsterbunker.ops.local import LocalCluster, NodeSpec
from hamsterbunker.stores import Store

from .backends import _server
from .common import (
    SECRET,
    SPREAD_HEADERS,
    TIMING,
    BenchmarkError,
    Check,
    RawWriter,
    Result,
    Table,
    median,
    ms,
    percentile,
    spread_row,
    temp_dir,
    wait_for,
)

NAME = "inbox"
TITLE = "Inbox: submit → consumed latency and admissions per second, per store (file, etcd, Redis)"
BACKENDS = ("file", "etcd", "redis")
REPO = Path(__file__).resolve().parent.parent
CLOCK = MonotonicClock()  # CLOCK_BOOTTIME: the node's history and its replies use it too

AGENT = "benchmarks.inbox:InboxBenchAgent"
AGENT_ID = "inbox-bench"
NODE = NodeSpec("bench-1", "local")
WAIT_S = 30.0  # the agent's wait_for_inbox timeout: far longer than any gap between submissions
TICK_MS = TIMING.tick_ms  # the defaults of `hb run`
SUBMISSIONS, QUICK_SUBMISSIONS = 200, 30
WARMUP = 5
IDLE_MIN_S = 0.05  # the least the agent idles in wait_for_inbox before each submission
LATENCY_BUDGET_S, QUICK_LATENCY_BUDGET_S = 150.0, 40.0  # per store
RESULT_TIMEOUT_S = 30.0
ADMISSIONS, QUICK_ADMISSIONS = 500, 100  # per measurement, each on a fresh agent id
CLIENTS = 4
ROUNDS, QUICK_ROUNDS = 2, 1
RAW_WRITES, RAW_BYTES = 50, b"x" * 512  # the file store's baseline: a raw durable write
PAYLOAD = {"question": "what is the answer?", "i": 0}

METHOD = f"""\
One agent, on each store (the file store in a temporary directory on this machine's
disk; etcd and Redis started by the benchmark on loopback, as in the per-store
benchmark above, a fresh server per store), whose step idles in
`await ctx.wait_for_inbox(timeout={WAIT_S:.0f})` and consumes everything it is shown
with a small reply (the number, and the moment `wait_for_inbox` returned on the
node's clock); the step then returns and the runtime publishes its checkpoint, which
commits the consumption and the replies.

* **Submit → consumed latency** ({SUBMISSIONS} submissions per store, {QUICK_SUBMISSIONS}
  with `--quick`, after {WARMUP} untimed ones): one real node process
  (`python -m hamsterbunker run`, default tick {TICK_MS} ms and TTL
  {TIMING.lease_ttl_ms} ms, `--history`) leads the agent, with no standby. This
  process submits with `Client(url, secret)` one submission at a time: it waits
  {IDLE_MIN_S * 1000:.0f} ms plus a random part of one tick (so the agent is idle in
  `wait_for_inbox` and submissions fall at every phase of its tick), then calls
  `client.submit(...)` and `client.result(...)`. Every time is on one clock,
  CLOCK_BOOTTIME, which the node's history and the agent's reply use as well, so
  the figures split the path at:
  *admitted* (`submit()` returned), *shown* (the step's `wait_for_inbox` returned
  with it), *accepted* (the end of the node's publish of the consuming checkpoint, its
  history) and *read back* (`result()` returned the reply, woken by the store's
  watch). **Submit → consumed** is from the start of `submit()` to *accepted*, the
  moment the consumption is committed and the reply readable; **submit → reply read
  back** is to *read back*, what a submitter sees.
* **Store round trip**: in the same run, just before each submission (agent idle),
  one `read_lease` (a single-key read: one file read, one etcd range, one Redis
  script) and one `read_admission` of the previous request on the submitter's
  store connection, timed. The round trip of the target is the p50 of `read_lease`.
* **Target** (the issue): p99 of submit → consumed ≤ one tick + one store round trip
  ({TICK_MS} ms + the p50 `read_lease` of that store in this run); submit → reply read
  back is held to the same.
* **Admissions per second** ({ADMISSIONS} admissions per measurement, {QUICK_ADMISSIONS}
  with `--quick`; {ROUNDS} rounds, {QUICK_ROUNDS} with `--quick`, sequential and
  concurrent alternating; no node running, so nothing is consumed, and each
  measurement has a fresh agent id, below the inbox limit of 1,000 unconsumed): a
  small payload per `submit()` with its own request id; *sequential*: one `Client`
  in one thread; *concurrent*: {CLIENTS} threads, each with its own `Client` and store
  connection, started together at a barrier, racing for the next number (a client
  that loses learns the next number from the store and tries again). Rate =
  admissions / (the last thread's end − the first thread's start); the median over
  the rounds. Every measurement is checked: the admitted numbers are exactly 1..*n*.
  Each `submit()` is timed too: its p50 over the first and the last tenth of the
  sequential admissions shows whether admitting slows as the inbox fills. On the file
  store, {RAW_WRITES} raw durable writes (`RawWriter`, as in the publish benchmark) are
  timed after each sequential round, in the same temporary directory tree: the
  baseline of what one fsync'd write costs on that disk at that moment.
"""

ANALYSIS = """\
**Submit → consumed** is the admission, the node's wake, its `read_inbox` and the
consuming publish (parts table). The store's watch wakes the idle step: admitted →
shown takes milliseconds on etcd and Redis and tens of milliseconds on the file store,
where `watchfiles` gathers changes for its `step` of 20 ms before it yields (and the
read-back pays the same once more). The tick-bounded re-read in `TermInbox.woken` (at
least one read a tick, for a watch that misses a change) is the fallback: the notes
count the submissions shown half a tick or more after their admission, where only
that re-read could have shown them (0 in the runs measured while this was written:
the watch woke the step every time). The target, one tick plus a round trip, is the
bound for a missed hint; with the watch working the figure is far below it, and what
remains is mostly the publish (on the file store its fsyncs, on etcd a read and a
txn) and, in the tail, this shared two-core machine.

**Submit → reply read back** adds `Client.result()`, and its tail is the client's, not
the node's. `result_async` reads the admission first and only then starts its watch
(`wake = wake or asyncio.ensure_future(_next_wake(watcher))` after the first
`read_admission`), and a store's `watch` subscribes only when first iterated (Redis:
a `SUBSCRIBE` on a new connection; etcd: a watch stream in a new `Follower`). A reply
committed between that read and the completed subscription is announced to nobody,
and `result()` wakes at the next unrelated change on the agent's channel: the node's
next event flush, heartbeat or renewal (once a tick), or after `RESULT_REREAD_S` (5 s)
if nothing else writes. On Redis the node consumes and publishes within a few
milliseconds of the admission, so the window is hit often, and accepted → `result()`
returned comes close to a tick at p99 (parts table). A one-off experiment (`whatif
result-watch`: the agent and node of this benchmark, 80 submissions per store,
`result()` as it is interleaved with the same read loop whose watch was subscribed
150 ms before `submit()`) measured accepted → returned p99 320 ms as is against 8.4 ms
subscribed first on Redis (17 of 80 over 100 ms against none), 143 ms against 22 ms
on etcd, and 97 ms against 120 ms on the file store (no gain: there `watchfiles`'
own latency dominates). The fix is in the client (not made here): subscribe before
the first read and wait until the subscription is confirmed (the Redis subscribe
reply, etcd's watch `created` response; or, on etcd, watch from the read's revision).
Setting up a watch per `result()` call (a connection, a thread) also stays on the
path unless a `Client` keeps one watch per agent.

**Admissions per second.** Admission is one atomic step on one counter per agent, so
concurrent clients add conflicts, not throughput: a client tries the number after its
own last admission, loses to a faster client (`NotNextNumber`), retries with the number
the store names, and with four clients each admission takes about three `admit` calls
(table); on etcd each try is two round trips (a read txn of the meta, consumed and
request-id keys, then the compare-and-swap txn, a Raft commit). On the file store one
admission makes six fsyncs: the payload's temporary file before the lock, then under
the agent's lock the counter (file and directory), the rename into `pending/`
(directory) and the request-id index (file and directory); the notes compare it with
a raw durable write on the same disk in the same run. Under the lock it also lists
`pending/` and stats every unconsumed entry (the count and bytes limits), so an
admission's cost grows with the inbox's depth: the last column compares the first and
the last tenth of the sequential admissions.
"""


class InboxBenchAgent:
    """Idles in wait_for_inbox; consumes all it is shown with a small reply (run by the node)."""

    id = AGENT_ID

    def init(self) -> dict[str, Any]:
        return {"consumed": 0}

    async def step(self, state: dict[str, Any]) -> dict[str, Any]:
        ctx = current_step()
        assert ctx is not None
        shown = await ctx.wait_for_inbox(timeout=WAIT_S)
        at = CLOCK.monotonic()
        for submission in shown:
            ctx.consume(submission.number, reply={"n": submission.number, "shown": at})
        return {"consumed": state["consumed"] + len(shown)}


# -- submit → consumed --------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    """One submission, on CLOCK_BOOTTIME."""

    number: int
    start: float  # submit() called
    admitted: float  # submit() returned
    shown: float  # the step's wait_for_inbox returned (the agent's reply says)
    returned: float  # result() returned
    accepted: float = 0.0  # the node's publish of the consuming checkpoint ended (its history)


@dataclass
class Latency:
    samples: list[Sample]
    read_lease: list[float]
    read_admission: list[float]
    notes: list[str]
    violations: list[str]
    consumed_once: bool
    publishes: list[float]  # duration of each consuming publish (seal + put_checkpoint)


@contextmanager
def _node(url: str) -> Iterator[tuple[LocalCluster, Path]]:
    with temp_dir(f"{NAME}-node") as workdir:
        history = workdir / "history.jsonl"
        cluster = LocalCluster(
            store_url=url,
            secret=SECRET,
            agent=AGENT,
            log_dir=workdir / "logs",
            timing=TIMING,
            history=history,
            env={"PYTHONPATH": str(REPO)},  # the node imports this module's agent
        )
        try:
            cluster.start(NODE)
            yield cluster, history
        except BaseException:
            print(f"----- last lines of {NODE.node}'s log -----")
            print("\n".join(cluster.log(NODE.node).splitlines()[-15:]))
            raise
        finally:
            cluster.stop_all()


def _submit_one(client: Client, request_id: str, i: int) -> Sample:
    start = CLOCK.monotonic()
    admission = client.submit(AGENT_ID, {**PAYLOAD, "i": i}, request_id=request_id)
    admitted = CLOCK.monotonic()
    reply = client.result(AGENT_ID, request_id, timeout=RESULT_TIMEOUT_S)
    returned = CLOCK.monotonic()
    if not isinstance(reply, dict) or reply.get("n") != admission.number:
        raise BenchmarkError(f"unexpected reply to #{admission.number}: {reply!r}")
    return Sample(admission.number, start, admitted, float(reply["shown"]), returned)


def _latency(url: str, count: int, budget_s: float, seed: int) -> Latency:
    # The client first: it makes the cluster record the node then finds.
    client = Client(url, SECRET)
    store: Store = client.store
    try:
        with _node(url) as (cluster, history):

            def leading() -> bool:
                if not cluster.alive(NODE.node):
                    raise BenchmarkError(f"{NODE.node} exited:\n{cluster.log(NODE.node)[-2000:]}")
                lease = store.read_lease(AGENT_ID)
                return lease is not None and lease.holder == NODE.node

            wait_for(leading, "the node to lead the agent", timeout=30, every=0.05)
            for i in range(WARMUP):  # the first also proves the agent steps
                _submit_one(client, f"warmup-{i}", -1)
                time.sleep(IDLE_MIN_S)
            rng = random.Random(seed)
            samples: list[Sample] = []
            lease_rt: list[float] = []
            admission_rt: list[float] = []
            notes: list[str] = []
            previous = f"warmup-{WARMUP - 1}"
            deadline = time.monotonic() + budget_s
            for i in range(count):
                if time.monotonic() > deadline:
                    notes.append(
                        f"time budget of {budget_s:.0f} s reached after {len(samples)} submissions"
                    )
                    break
                time.sleep(IDLE_MIN_S + rng.uniform(0, TIMING.tick_s))
                t0 = CLOCK.monotonic()
                store.read_lease(AGENT_ID)
                t1 = CLOCK.monotonic()
                store.read_admission(AGENT_ID, previous)
                t2 = CLOCK.monotonic()
                lease_rt.append(t1 - t0)
                admission_rt.append(t2 - t1)
                previous = f"bench-{i}"
                samples.append(_submit_one(client, previous, i))
            if not samples:
                raise BenchmarkError("no submission measured")
            cluster.stop_all()  # stopped and reaped: its history is complete
            ops = read_history(history)
    finally:
        client.close()
    consumed_by: dict[int, list[Any]] = {}
    for op in ops:
        if op.op == "publish" and op.outcome == "ok":
            for number in op.detail.get("consumed", []):
                consumed_by.setdefault(number, []).append(op)
    wanted = {s.number for s in samples}
    missing = sorted(n for n in wanted if n not in consumed_by)
    if missing:
        raise BenchmarkError(f"no accepted publish in the history consumed #{missing[:10]}")
    twice = sorted(n for n, found in consumed_by.items() if len(found) > 1)
    if twice:
        notes.append(f"consumed by more than one accepted publish: #{twice[:10]}")
    timed = [
        Sample(s.number, s.start, s.admitted, s.shown, s.returned, consumed_by[s.number][0].end)
        for s in samples
    ]
    publishes = [consumed_by[s.number][0].end - consumed_by[s.number][0].start for s in samples]
    return Latency(
        timed, lease_rt, admission_rt, notes, [str(v) for v in check(ops)], not twice, publishes
    )


# -- admissions per second ----------------------------------------------------------------


@dataclass(frozen=True)
class Admitted:
    seconds: float
    count: int
    admit_calls: int  # Store.admit calls: a lost race costs one more
    each: list[float]  # every submit() call's duration, in order (all threads)


def _admissions(url: str, agent: str, count: int, clients: int) -> Admitted:
    """count admissions to a fresh agent from clients threads, each with its own Client."""
    made = [Client(url, SECRET) for _ in range(clients)]
    calls = [0] * clients
    try:
        for k, client in enumerate(made):
            admit = client.store.admit

            def counted(*args: Any, _k: int = k, _admit: Any = admit) -> tuple[int, bool]:
                calls[_k] += 1
                return _admit(*args)  # type: ignore[no-any-return]

            client.store.admit = counted  # type: ignore[method-assign,assignment]
        barrier = threading.Barrier(clients)
        starts, ends = [0.0] * clients, [0.0] * clients
        numbers: list[list[int]] = [[] for _ in range(clients)]
        each: list[list[float]] = [[] for _ in range(clients)]
        errors: list[BaseException] = []
        share = [count // clients + (k < count % clients) for k in range(clients)]

        def work(k: int) -> None:
            try:
                barrier.wait(timeout=30)
                starts[k] = time.perf_counter()
                for j in range(share[k]):
                    t0 = time.perf_counter()
                    got = made[k].submit(agent, {**PAYLOAD, "i": j}, request_id=f"c{k}-{j}")
                    each[k].append(time.perf_counter() - t0)
                    numbers[k].append(got.number)
                ends[k] = time.perf_counter()
            except BaseException as exc:
                errors.append(exc)
                barrier.abort()

        threads = [threading.Thread(target=work, args=(k,)) for k in range(clients)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=300)
        if any(thread.is_alive() for thread in threads):
            raise BenchmarkError(f"admission threads on {agent!r} did not finish in 300 s")
        if errors:
            raise BenchmarkError(f"admissions on {agent!r} failed: {errors[0]!r}") from errors[0]
        got = sorted(n for part in numbers for n in part)
        stored = [n for n, _blob in made[0].store.read_inbox(agent, 0)]
        if got != list(range(1, count + 1)) or sorted(stored) != got:
            raise BenchmarkError(
                f"admissions on {agent!r}: numbers are not 1..{count} each once "
                f"({len(got)} returned, {len(set(got))} distinct, {len(stored)} stored)"
            )
        return Admitted(
            max(ends) - min(starts), count, sum(calls), [t for part in each for t in part]
        )
    finally:
        for client in made:
            client.close()


@dataclass
class Rates:
    sequential: list[Admitted]
    concurrent: list[Admitted]
    raw: list[float]  # file store only: raw durable writes (RawWriter), seconds each


def _rates(url: str, backend: str, count: int, rounds: int, raw_dir: Path | None) -> Rates:
    _admissions(url, f"admit-{backend}-warmup", 20, 1)
    rates = Rates([], [], [])
    raw = RawWriter(raw_dir) if raw_dir is not None else None
    for r in range(rounds):
        rates.sequential.append(_admissions(url, f"admit-{backend}-seq-{r}", count, 1))
        if raw is not None:  # the baseline, on the same disk, between the two
            for _ in range(RAW_WRITES):
                started = time.perf_counter()
                raw.write(RAW_BYTES)
                rates.raw.append(time.perf_counter() - started)
        rates.concurrent.append(_admissions(url, f"admit-{backend}-conc-{r}", count, CLIENTS))
    return rates


def _rate(runs: list[Admitted]) -> float:
    return median([a.count / a.seconds for a in runs])


# -- the run ------------------------------------------------------------------------------


def _measure(
    backend: str, url: str, quick: bool, seed: int, raw_dir: Path | None = None
) -> tuple[Latency, Rates]:
    count = QUICK_SUBMISSIONS if quick else SUBMISSIONS
    budget = QUICK_LATENCY_BUDGET_S if quick else LATENCY_BUDGET_S
    latency = _latency(url, count, budget, seed)
    admissions = QUICK_ADMISSIONS if quick else ADMISSIONS
    rates = _rates(url, backend, admissions, QUICK_ROUNDS if quick else ROUNDS, raw_dir)
    return latency, rates


def run(quick: bool) -> Result:
    measured: dict[str, tuple[Latency, Rates]] = {}
    for seed, backend in enumerate(BACKENDS, 1):
        if backend == "file":
            with temp_dir(NAME) as root:
                measured[backend] = _measure(
                    backend, (root / "store").as_uri(), quick, seed, raw_dir=root / "raw"
                )
        else:
            with _server(backend) as url:
                measured[backend] = _measure(backend, url, quick, seed)

    tick_s = TIMING.tick_s
    latency_rows: list[list[str]] = []
    part_rows: list[list[str]] = []
    rate_rows: list[list[str]] = []
    checks: list[Check] = []
    notes: list[str] = []
    for backend, (lat, rates) in measured.items():
        s = lat.samples
        consumed = [x.accepted - x.start for x in s]
        read_back = [x.returned - x.start for x in s]
        rt = percentile(lat.read_lease, 50)
        target = tick_s + rt
        latency_rows += [
            spread_row(f"{backend}: submit → consumed (checkpoint accepted)", consumed),
            spread_row(f"{backend}: submit → reply read back (result() returned)", read_back),
        ]
        parts = {
            "submit() (admission)": [x.admitted - x.start for x in s],
            "admitted → shown to the step (wake, read_inbox, open)": [
                x.shown - x.admitted for x in s
            ],
            "shown → accepted (consume, publish)": [x.accepted - x.shown for x in s],
            "  of which the publish (seal + put_checkpoint)": lat.publishes,
            "accepted → result() returned": [x.returned - x.accepted for x in s],
            "store round trip: read_lease": lat.read_lease,
            "store round trip: read_admission": lat.read_admission,
        }
        part_rows += [
            [f"{backend}: {label}", ms(percentile(v, 50)), ms(percentile(v, 99)), ms(max(v))]
            for label, v in parts.items()
        ]
        for label, values in (("submit → consumed", consumed), ("submit → reply read back",
                                                                 read_back)):  # fmt: skip
            p99 = percentile(values, 99)
            checks.append(
                Check(
                    f"{backend}: p99 {label}",
                    f"{ms(p99)} ms (p50 {ms(percentile(values, 50))} ms)",
                    f"≤ tick + round trip = {TICK_MS} + {ms(rt)} = {ms(target)} ms",
                    p99 <= target,
                )
            )
        checks.append(
            Check(
                f"{backend}: every submission consumed once; safety violations (checker)",
                f"{'yes' if lat.consumed_once else 'NO'}; {len(lat.violations)}",
                "yes; 0",
                lat.consumed_once and not lat.violations,
            )
        )
        seq, conc = _rate(rates.sequential), _rate(rates.concurrent)
        calls = sum(a.admit_calls for a in rates.concurrent) / sum(
            a.count for a in rates.concurrent
        )
        tenth = max(1, len(rates.sequential[0].each) // 10)
        first = [t for a in rates.sequential for t in a.each[:tenth]]
        last = [t for a in rates.sequential for t in a.each[-tenth:]]
        rate_rows.append(
            [backend, f"{seq:,.0f}", f"{conc:,.0f}", f"{conc / seq:.2f}",
             " / ".join(f"{a.count / a.seconds:,.0f}" for a in rates.sequential),
             " / ".join(f"{a.count / a.seconds:,.0f}" for a in rates.concurrent),
             f"{calls:.2f}", f"{ms(median(first))} / {ms(median(last))}"]
        )  # fmt: skip
        if rates.raw:
            raw_rate = 1 / median(rates.raw)
            notes.append(
                f"{backend}: in the same run and directory tree, a raw durable write of "
                f"{len(RAW_BYTES)} bytes (`RawWriter`: temp file, fsync, rename, directory "
                f"fsync) took {ms(median(rates.raw))} ms p50 ({raw_rate:,.0f}/s; "
                f"{len(rates.raw)} writes between the sequential and concurrent rounds): one "
                f"sequential admission costs {raw_rate / seq:.1f} raw durable writes"
            )
        checks.append(
            Check(
                f"{backend}: admissions/s, sequential / {CLIENTS} concurrent clients",
                f"{seq:,.0f} / {conc:,.0f}",
                "— (reported)",
                None,
            )
        )
        notes += [f"{backend}: {n}" for n in lat.notes]
        notes += [f"{backend}: checker: {v}" for v in lat.violations]
        woke = [x.shown - x.admitted for x in s]
        late = sum(w >= tick_s / 2 for w in woke)
        notes.append(
            f"{backend}: admitted → shown ≥ half a tick ({TICK_MS // 2} ms, where only the "
            f"tick-bounded re-read of `TermInbox.woken` would have shown it) in {late} of "
            f"{len(s)} submissions; the longest {ms(max(woke))} ms"
        )
    n = len(next(iter(measured.values()))[0].samples)
    notes.append(
        f"with n = {n} submissions per store, p99 interpolates between the two or three "
        "largest samples"
    )
    tables = [
        Table(
            f"Submit → consumed, one agent idle in wait_for_inbox (tick {TICK_MS} ms)",
            SPREAD_HEADERS,
            latency_rows,
        ),
        Table("Parts of the path", ["part", "p50 ms", "p99 ms", "max ms"], part_rows),
        Table(
            f"Admissions per second (no node running; median of the rounds; {CLIENTS} "
            "concurrent clients each with its own store connection)",
            ["store", "sequential /s", f"{CLIENTS} clients /s", "concurrent / sequential",
             "sequential, each round", "concurrent, each round",
             "admit calls per admission (concurrent)",
             "submit() p50 ms, first / last tenth (sequential)"],
            rate_rows,
        ),
    ]  # fmt: skip
    return Result(NAME, TITLE, METHOD, tables, checks, notes, ANALYSIS, analysis_always=True)
