"""The record layer (``RecordStore`` over a backend): what each store call costs, on every backend."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from functools import cache, partial
from typing import Any

from hamsterbunker.lease import LeaseKeeper, Outcome
from hamsterbunker.sealing import EffectAt, Sealer, new_cluster_record
from hamsterbunker.stores import Fence, Store
from hamsterbunker.stores.base import Consumed
from hamsterbunker.stores.layer import RecordStore

from .common import (
    SECRET,
    BenchmarkError,
    RawWriter,
    Result,
    Table,
    json_state_of_size,
    ms,
    percentile,
    temp_dir,
)

NAME = "layer"
TITLE = "The record layer's store calls on every backend, the file store's beside a raw write"
KIB, MIB = 1024, 1024 * 1024
STORES = ("file", "redis", "etcd", "postgres")
SIDE = "layer"  # the store measured; on the file store the raw write ("raw") runs beside it
BIG = (1 * MIB, 8 * MIB)  # publish; etcd only up to 1 MiB (its request limit, as growth.py)
SMALL = (100, 64 * KIB)  # effect and publish
COUNTS = {"small": 300, 1 * MIB: 100, 8 * MIB: 40}  # timed rounds per store
QUICK_COUNTS = {"small": 25, 1 * MIB: 8, 8 * MIB: 4}
WARMUP_ROUNDS = 3
BUDGET_S, QUICK_BUDGET_S = 60.0, 10.0  # per store, for the timed rounds
INBOX_STATE = json_state_of_size(1 * KIB)  # the consuming step's checkpoint
PAYLOAD = {"question": "what is the answer?"}

METHOD = f"""\
Every store is the record layer (`hamsterbunker/stores/layer/`, `RecordStore` over one
backend of `hamsterbunker/stores/backends/`). Handover, failover and submit → consumed of
nodes are the `versions` benchmark's; this benchmark measures, in one process and one
run, what a leader and a submitter pay per store call on each backend: the file store
(`RecordStore(FileBackend)` in a temporary directory on this machine's disk), and Redis,
etcd and PostgreSQL (one server each started by the benchmark on loopback, as the
per-store benchmark starts them; PostgreSQL as `tests/support/postgres_server.py` starts
it, fsync on). On each store a `LeaseKeeper` takes the lease of each agent measured;
every write is fenced by that lease.

Each round runs every figure once; on the file store the raw write runs beside the
store's publish, the order of the two turning round by round, so machine noise hits both
alike; {WARMUP_ROUNDS} untimed rounds first. Up to {COUNTS["small"]} rounds per store
({QUICK_COUNTS["small"]} with `--quick`), the publishes of 1 MiB in the first
{COUNTS[MIB]} ({QUICK_COUNTS[MIB]}) and of 8 MiB in the first {COUNTS[8 * MIB]}
({QUICK_COUNTS[8 * MIB]}), within {BUDGET_S:.0f} s per store ({QUICK_BUDGET_S:.0f} s):

* **publish** at 1 MiB and 8 MiB of state (etcd at 1 MiB only: one checkpoint is one
  etcd request, and the member runs with etcd's default `--max-request-bytes` of
  1.5 MiB): `Sealer.seal_pieces` and the fenced `put_checkpoint`, what a leader does
  per step (as the publish benchmark times it). On the file store also the **raw**
  durable write of the same sealed bytes (`RawWriter`: temp file, fsync, rename,
  directory fsync, the oldest beyond five removed), in a directory of its own, and
  *publish / raw*: the publish benchmark's figure.
* **effect** at 100 B and 64 KiB of result: `Sealer.seal_effect` and the fenced
  `put_effect` of step *s*'s first effect, then the **publish** of step *s* with a
  state of the same size (which removes the step's journal), and *effect / publish*:
  the effects benchmark's figure, here with both calls made in this thread.
* **inbox**: `Store.admit` of a sealed submission of a small payload as the next
  number (one client, as the admissions/s of the inbox benchmark, without the
  client's `read_cluster`), then, after the leader's `read_inbox` of it (untimed), the
  **consuming checkpoint**: seal and
  `put_checkpoint` of a 1 KiB state with `consumed=` that one submission and its
  sealed reply: an in-process stand-in for submit → consumed.
* **lease**: a renewal, `LeaseKeeper.tick` of the held lease (one `cas_lease`: the
  keeper's tick cost), then one `read_lease`.

The table gives p50 (and p99 where named) in ms per backend; ratios bare.
"""

ANALYSIS = """\
What one store call sends or syncs, per operation (steady state: the lease held, the
listing and admission guesses warm), counted by wrapping the backend's calls, the Redis
client's commands, the etcd client's requests and `os.fsync`:

| operation | file: fsyncs | Redis: scripts | etcd: requests |
| --- | --- | --- | --- |
| publish | 7 | 1 | 1 |
| publish that drops the step's journal | 8 | 1 | 1 |
| a step's first effect (a further one) | 4 (2) | 1 | 1 |
| admit | 11 | 1 | 1 |
| consuming checkpoint | 13 | 2 | 2 |
| renewal (`cas_lease`) | 2 | 1 | 1 |
| `read_lease` | 0 | 1 | 1 |

* **File: fsyncs by construction.** The file backend is a general transactional map (a
  key per file, a redo log for any commit of more than one key). A publish is two keys
  written and two removed (retention): the value and the description each written and
  fsynced, the redo log written (file and root directory), the two folders fsynced, the
  log removed (root fsynced). An fsync of a small file or folder takes 0.3–0.5 ms on a
  quiet disk (`strace -T`, medians) and several times that while other work writes to it,
  so the small figures follow the machine's load; at 8 MiB the data's own write is most
  of a publish (*publish / raw*). The first effect of a step makes the journal's folders
  (`effects/`, then `effects/<seq>/`, each fsynced in its parent), which the checkpoint's
  commit removes again (a folder left empty goes, so that no key's folder lingers).
  Admission and the consuming checkpoint write four keys or more each, through the log.
  Fewer syncs per commit would need, for instance, the commit's values and its log in
  one file, or a description that is itself the commit point of a checkpoint: a change
  of the file backend's design.
* **A leader's consuming checkpoint is one commit** (after its term's first): it plans
  what it writes from what its last consumption left (the totals, the oldest replies kept
  and their request ids) and from the sizes its inbox read saw, and its commit compares
  every record it assumed; a guess a record proves wrong (a writer without the secret,
  another term's leader) costs a failed commit and the read after all
  (`layer/consumption.py`).
* **Redis: one script a call.** The backend's one script looks at each key's type and
  size before it reads it, keeps each key in a sorted-set index and publishes one notice
  per commit; the client builds the layer's keys and `Txn` and checks them. At 64 KiB
  and above the data's own cost is most of a call.
* **etcd:** one request a call, a txn of a few operations; the p99s of 300 samples move
  both ways between runs on a shared machine.
* **PostgreSQL:** small operations cost about what etcd's do; 8 MiB of checkpoint is one
  `bytea` row stored as some 4,000 TOAST chunks, WAL-logged, nearly all of its time
  waiting on the server.
"""


@dataclass
class Probe:
    """One kind of measurement, run on every side each round while round < count."""

    count: int
    calls: Mapping[str, Callable[[], dict[str, float]]]  # side -> one timed run: figure -> seconds


class _Side:
    """One store under test: a sealer, and each agent it measures under a held lease."""

    def __init__(self, store: Store) -> None:
        self.store = store
        record = store.read_cluster() or store.create_cluster(new_cluster_record(SECRET))
        self.sealer = Sealer(SECRET, record)
        self.keepers: dict[str, LeaseKeeper] = {}
        self.seqs: dict[str, int] = {}
        self.admitted = 0

    def _held(self, agent: str) -> LeaseKeeper:
        keeper = self.keepers.get(agent)
        if keeper is None:
            keeper = self.keepers[agent] = LeaseKeeper(self.store, agent, "bench-1", "local")
            if keeper.tick().outcome is not Outcome.ACQUIRED:
                raise BenchmarkError(f"could not acquire the lease of {agent} on {self.store!r}")
        return keeper

    def _next(self, agent: str) -> tuple[Fence, int]:
        fence = self._held(agent).fence()
        self.seqs[agent] = seq = self.seqs.get(agent, 0) + 1
        return fence, seq

    def publish(self, size: int) -> dict[str, float]:
        agent, state = f"bench-{size}", _state(size)
        fence, seq = self._next(agent)
        started = time.perf_counter()
        blob = self.sealer.seal_pieces(agent, fence.epoch, seq, state)
        self.store.put_checkpoint(agent, fence, seq, blob)
        return {f"publish {_size(size)}": time.perf_counter() - started}

    def effect_then_publish(self, size: int) -> dict[str, float]:
        """Step s's first effect recorded, then its checkpoint (which drops the journal)."""
        agent, value = f"bench-effect-{size}", _state(size)
        fence, seq = self._next(agent)
        at = EffectAt(agent, seq, 0, "outcome", "llm.call")
        payload = {"replay": "safe", "outcome": {"result": value}}
        started = time.perf_counter()
        record = self.sealer.seal_effect(at, fence.epoch, payload)
        self.store.put_effect(agent, fence, seq, 0, "outcome", record)
        recorded = time.perf_counter()
        blob = self.sealer.seal_pieces(agent, fence.epoch, seq, value)
        self.store.put_checkpoint(agent, fence, seq, blob)
        return {
            f"effect {_size(size)}": recorded - started,
            f"publish {_size(size)}": time.perf_counter() - recorded,
        }

    def admit_then_consume(self) -> dict[str, float]:
        agent = "bench-inbox"
        fence, seq = self._next(agent)
        n, request = self.admitted + 1, f"req-{self.admitted + 1}"
        submission = self.sealer.seal_submission(agent, n, request, PAYLOAD, time.time())
        started = time.perf_counter()
        got = self.store.admit(agent, request, n, submission)
        admitted = time.perf_counter()
        if got != (n, False):
            raise BenchmarkError(f"admission #{n} to {agent} answered {got}")
        self.admitted = n
        self.store.read_inbox(agent, n - 1)  # a leader reads what it consumes (untimed)
        reply = self.sealer.seal_reply(agent, n, request, {"n": n})
        consumed = [Consumed(n, request, reply)]
        begun = time.perf_counter()
        blob = self.sealer.seal_pieces(agent, fence.epoch, seq, INBOX_STATE)
        self.store.put_checkpoint(agent, fence, seq, blob, consumed=consumed)
        return {"admit": admitted - started, "consuming checkpoint": time.perf_counter() - begun}

    def renew_then_read(self) -> dict[str, float]:
        agent = "bench-lease"
        keeper = self._held(agent)
        started = time.perf_counter()
        outcome = keeper.tick().outcome
        renewed = time.perf_counter()
        if outcome is not Outcome.RENEWED:
            raise BenchmarkError(f"a renewal of {agent}'s lease was {outcome.value}")
        self.store.read_lease(agent)
        return {
            "renewal (cas_lease)": renewed - started,
            "read_lease": time.perf_counter() - renewed,
        }


def _raw_write(raw: RawWriter, blob: bytes, size: int) -> dict[str, float]:
    started = time.perf_counter()
    raw.write(blob)
    return {f"publish {_size(size)}": time.perf_counter() - started}


@cache
def _state(size: int) -> dict[str, str]:
    """A state (or effect result) of size bytes of JSON, made once per size."""
    return json_state_of_size(size)


def _size(size: int) -> str:
    if size >= MIB:
        return f"{size // MIB} MiB"
    return f"{size // KIB} KiB" if size >= KIB else f"{size} B"


def _probes(sides: dict[str, _Side], raw: RawWriter | None, kind: str, quick: bool) -> list[Probe]:
    counts = QUICK_COUNTS if quick else COUNTS
    probes: list[Probe] = []
    for size in BIG if kind != "etcd" else BIG[:1]:
        calls = {name: partial(side.publish, size) for name, side in sides.items()}
        if raw is not None:  # the same number of sealed bytes as a publish writes
            blob = next(iter(sides.values())).sealer.seal("bench-raw", 1, 1, _state(size))
            calls["raw"] = partial(_raw_write, raw, blob, size)
        probes.append(Probe(counts[size], calls))
    for size in SMALL:
        steps = {name: partial(side.effect_then_publish, size) for name, side in sides.items()}
        probes.append(Probe(counts["small"], steps))
    probes.append(Probe(counts["small"], {n: s.admit_then_consume for n, s in sides.items()}))
    probes.append(Probe(counts["small"], {n: s.renew_then_read for n, s in sides.items()}))
    return probes


Times = dict[str, dict[str, list[float]]]  # side -> figure -> seconds, in order


def _rounds(probes: list[Probe], budget_s: float) -> tuple[Times, list[str]]:
    """Every probe's calls, round by round, each round in another order of the sides."""
    times: Times = {}
    notes: list[str] = []
    deadline = float("inf")
    for i in range(-WARMUP_ROUNDS, max(p.count for p in probes)):
        if i == 0:  # the budget is for the timed rounds
            deadline = time.monotonic() + budget_s
        elif i > 0 and time.monotonic() > deadline:
            notes.append(f"time budget of {budget_s:.0f} s reached after {i} rounds")
            break
        for probe in probes:
            if i >= probe.count:
                continue
            calls = list(probe.calls.items())
            turn = i % len(calls)
            for side, call in calls[turn:] + calls[:turn]:
                measured = call()
                for figure, seconds in measured.items():
                    if i >= 0:
                        times.setdefault(side, {}).setdefault(figure, []).append(seconds)
    return times, notes


@contextmanager
def _server(kind: str) -> Iterator[Any]:
    """A private server of kind on loopback (stopped afterwards)."""
    from _pytest.outcomes import OutcomeException  # the test helpers fail or skip with these

    from tests.support.etcd_server import EtcdServer
    from tests.support.postgres_server import PostgresServer
    from tests.support.redis_server import RedisServer

    starts: dict[str, Callable[[], Any]] = {
        "etcd": EtcdServer.start,
        "redis": RedisServer.start,
        "postgres": PostgresServer.start,
    }
    try:
        server = starts[kind]()
    except OutcomeException as exc:
        raise BenchmarkError(f"could not start {kind}: {exc.msg}") from None
    try:
        yield server
    finally:
        server.stop()


def _stores(kind: str, stack: ExitStack) -> tuple[dict[str, Store], RawWriter | None]:
    """The record layer on one server or disk, and on disk the raw writer (closed with stack)."""
    raw = None
    if kind == "file":
        from hamsterbunker.stores.backends.file import FileBackend

        root = stack.enter_context(temp_dir(NAME))
        store: Store = RecordStore(FileBackend(root / "store"))
        raw = RawWriter(root / "raw")
    elif kind == "redis":
        from hamsterbunker.stores.backends.redis import RedisBackend

        server = stack.enter_context(_server(kind))
        store = RecordStore(RedisBackend(server.url()))
    elif kind == "etcd":
        from hamsterbunker.stores.backends.etcd import EtcdBackend

        server = stack.enter_context(_server(kind))
        store = RecordStore(EtcdBackend(server.url()))
    else:
        from hamsterbunker.stores.backends.postgres import PostgresBackend

        server = stack.enter_context(_server(kind))
        store = RecordStore(PostgresBackend(server.url()))
    stack.callback(store.close)
    return {SIDE: store}, raw


def _measure(kind: str, quick: bool) -> tuple[Times, list[str]]:
    with ExitStack() as stack:
        stores, raw = _stores(kind, stack)
        sides = {name: _Side(store) for name, store in stores.items()}
        probes = _probes(sides, raw, kind, quick)
        return _rounds(probes, QUICK_BUDGET_S if quick else BUDGET_S)


# -- the tables ---------------------------------------------------------------------------


@dataclass
class _Row:
    figure: str
    n: int
    values: dict[str, float] = field(default_factory=dict)  # side -> seconds, or a ratio
    ratio: bool = False  # values are ratios, not times


def _rows(times: Times) -> list[_Row]:
    first = times[SIDE]

    def row(figure: str, q: float, label: str) -> _Row | None:
        if figure not in first:
            return None
        return _Row(label, len(first[figure]), {SIDE: percentile(first[figure], q)})

    def ratio(label: str, over: str, under: str, under_side: str = SIDE) -> _Row | None:
        if over not in first:
            return None
        value = percentile(first[over], 50) / percentile(times[under_side][under], 50)
        return _Row(label, len(first[over]), {SIDE: value}, ratio=True)

    found: list[_Row | None] = []
    for size in BIG:
        name = f"publish {_size(size)}"
        found.append(row(name, 50, f"{name} p50"))
    for size in SMALL:
        effect, publish = f"effect {_size(size)}", f"publish {_size(size)}"
        found += [row(effect, 50, f"{effect} p50"), row(publish, 50, f"{publish} p50"),
                  ratio(f"effect / publish {_size(size)}", effect, publish)]  # fmt: skip
    for figure in ("admit", "consuming checkpoint", "renewal (cas_lease)"):
        found += [row(figure, 50, f"{figure} p50"), row(figure, 99, f"{figure} p99")]
    found.append(row("read_lease", 50, "read_lease p50"))
    if "raw" in times:  # the file store: its publish against the raw durable write
        for size in BIG:
            name = f"publish {_size(size)}"
            raw = times["raw"].get(name)
            if raw is not None:
                label = f"raw durable write {_size(size)} p50"
                found.append(_Row(label, len(raw), {SIDE: percentile(raw, 50)}))
                found.append(ratio(f"publish / raw {_size(size)}", name, name, "raw"))
    return [r for r in found if r is not None]


def _shown(row: _Row) -> str:
    value = row.values[SIDE]
    return f"{value:.2f}" if row.ratio else ms(value)


def run(quick: bool) -> Result:
    measured = {kind: _measure(kind, quick) for kind in STORES}
    notes = [f"{kind}: {note}" for kind, (_times, found) in measured.items() for note in found]
    rows_by_kind = {kind: _rows(times) for kind, (times, _notes) in measured.items()}
    figures = [row.figure for row in rows_by_kind["file"]]
    beside = []
    for figure in figures:
        cells = [figure]
        for kind in STORES:
            found = next((r for r in rows_by_kind[kind] if r.figure == figure), None)
            cells.append("—" if found is None else _shown(found))
        beside.append(cells)
    tables = [Table("The record layer on each backend (ms; ratios bare)", ["figure", *STORES],
                    beside)]  # fmt: skip
    return Result(NAME, TITLE, METHOD, tables, [], notes, ANALYSIS, analysis_always=True)
