"""A read-only snapshot of one agent's cluster, with a health verdict: what ``hb status``
and the demo show. Needs no secret; nothing in it is authenticated, and the ages in it
(by the writers' clocks) are for people to read, never to decide on."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, replace

from ..core.errors import CorruptRecord
from ..core.timing import DEFAULT_LEASE_TTL_MS
from ..lease.observe import LIVE, NOT_WATCHED, UNKNOWN, LeaseObserver, Liveness
from ..records import CheckpointInfo, Event, Heartbeat, LeaseRecord
from ..stores import Store

__all__ = [
    "REFUSAL_EVENTS",
    "ClusterStatus",
    "KeysShown",
    "NodeStatus",
    "Refusal",
    "SyncDirShown",
    "printable",
    "snapshot",
    "superseded",
    "syncdir_shown",
]

# A node whose newest event is one of these refuses to go on until a person looks.
REFUSAL_EVENTS = frozenset({"store.regressed"})


@dataclass(frozen=True)
class NodeStatus:
    node: str
    region: str
    host: str
    pid: int
    role: str
    epoch: int
    seq: int
    age_s: float
    # The journaled effects of the step in flight (active node only): (name, state),
    # state one of running, done, failed, reused, interrupted.
    effects: tuple[tuple[str, str], ...] = ()
    # The inbox as this node's heartbeat tells it (an active node's): unconsumed
    # submissions, and how long ago the oldest was submitted (display only).
    inbox_depth: int = 0
    inbox_oldest_age_s: float | None = None
    # The steps failing in a row on this (active) node, and the last one's error.
    failing: int = 0
    failing_error: str = ""
    paused: bool = False  # as this node last saw the agent (hb pause)
    sealing: str = ""  # the key id this node seals with ("" from older nodes)


@dataclass(frozen=True)
class KeysShown:
    """The cluster's keys as its record says (not authenticated here: display only)."""

    key_id: str  # the current key, which seals
    generation: int
    rotation: str  # "", "begun", "committed"
    accepted: tuple[str, ...]  # the other keys still accepted (a rotation under way)


@dataclass(frozen=True)
class Refusal:
    node: str
    event: str
    reason: str
    age_s: float  # by the writer's clock against ours: display only


# How many kept-aside segments, as nodes reported them, status shows (the newest).
MAX_DIVERGED_SHOWN = 20
SYNCDIR_MODE = "no mutual exclusion: divergence is detected and kept aside"


@dataclass(frozen=True)
class ChainShown:
    """One term's checkpoints in one node's chain, as listed (not authenticated)."""

    node: str
    epoch: int
    from_seq: int
    to_seq: int
    count: int


@dataclass(frozen=True)
class SyncDirShown:
    """A syncdir:// store's own report (docs/syncdir.md): what ``hb status`` adds for it,
    its chains as listed and what nodes reported kept aside (``store.diverged``)."""

    mode: str  # "syncdir"
    mutual_exclusion: str
    sync_delay_ms: int | None  # None: not known here (no instance config given)
    nodes: list[str]  # the node subtrees this machine's copy holds
    sync_files: list[str]  # the sync tool's own files, relative to the root
    problems: list[str]  # what the store skipped as unreadable
    chains: list[ChainShown] = field(default_factory=list)  # empty without an agent
    # store.diverged as reported: each a dict of the event's fields plus reported_by.
    diverged: list[dict[str, object]] = field(default_factory=list)


@dataclass(frozen=True)
class ClusterStatus:
    store: str
    agent: str
    lease: LeaseRecord | None
    nodes: list[NodeStatus]
    checkpoint: CheckpointInfo | None
    checkpoint_age_s: float | None
    lease_error: str | None = None  # why the lease record could not be read (lease is None)
    # The inbox as the active node (the lease holder) last told it; None without one, or
    # while it is paused.
    inbox_depth: int | None = None
    inbox_oldest_age_s: float | None = None
    paused: bool = False  # the active node says an operator paused the agent (hb pause)
    # The lease as watched from here (None: not watched), refusals, and the verdict.
    liveness: Liveness | None = None
    refusals: list[Refusal] = field(default_factory=list)
    keys: KeysShown | None = None  # None: no cluster record, or one that does not parse
    syncdir: SyncDirShown | None = None  # a syncdir:// store's own report; None: another store
    problems: list[str] = field(default_factory=list)  # why it is degraded; empty: healthy
    health: str = "healthy"
    exit_code: int = 0  # 0 healthy, 1 degraded

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)


def _role(beat: Heartbeat, age_s: float, ttl_s: float, lease: LeaseRecord | None) -> str:
    # A node that has not written for several TTLs is gone, whatever it last said.
    if age_s > 3 * ttl_s:
        return "offline"
    return superseded(beat.role, beat.epoch, lease)


def superseded(role: str, epoch: int, lease: LeaseRecord | None) -> str:
    """role, unless the node says it is active in an epoch the lease has left behind (a
    leader killed or cut off, its last heartbeat still fresh): "superseded"."""
    if role == "active" and lease is not None and epoch < lease.epoch:
        return "superseded"
    return role


def snapshot(store: Store, agent: str, observer: LeaseObserver | None = None) -> ClusterStatus:
    """The agent's status; with observer, its lease watched for liveness and a verdict."""
    liveness = None
    if observer is not None:
        observed = observer.observe([agent])[agent]
        lease, lease_error, liveness = observed.lease, observed.lease_error, observed.liveness
    else:
        lease_error = None
        try:
            lease = store.read_lease(agent)
        except CorruptRecord as exc:
            # Anyone who can write the store can damage it: say so, show the rest.
            lease, lease_error = None, str(exc)
    now = time.time()
    ttl_s = (lease.ttl_ms if lease else DEFAULT_LEASE_TTL_MS) / 1000
    beats = store.list_heartbeats(agent)
    nodes = [
        NodeStatus(
            node=b.node,
            region=b.region,
            host=b.host,
            pid=b.pid,
            role=_role(b, max(0.0, now - b.time), ttl_s, lease),
            epoch=b.epoch,
            seq=b.seq,
            age_s=round(max(0.0, now - b.time), 3),
            effects=b.effects,
            inbox_depth=b.inbox_depth,
            inbox_oldest_age_s=_age(now, b.inbox_oldest),
            failing=b.failing,
            failing_error=b.failing_error,
            paused=b.paused,
            sealing=b.sealing,
        )
        for b in beats
    ]
    holder = lease.holder if lease else None
    active = next((n for n in nodes if n.node == holder and n.role == "active"), None)
    checkpoints = store.list_checkpoints(agent)
    latest = checkpoints[0] if checkpoints else None
    status = ClusterStatus(
        store=store.url,
        agent=agent,
        lease=lease,
        nodes=nodes,
        checkpoint=latest,
        checkpoint_age_s=round(max(0.0, now - latest.written), 3) if latest else None,
        lease_error=lease_error,
        # A paused leader reads no inbox: what its heartbeat says is from before the pause.
        inbox_depth=active.inbox_depth if active and not active.paused else None,
        inbox_oldest_age_s=(
            active.inbox_oldest_age_s
            if active and not active.paused and active.inbox_depth
            else None
        ),
        paused=active.paused if active else False,
        liveness=liveness,
        refusals=_refusals(store.read_events(agent), now) if observer is not None else [],
        keys=_keys(store),
        syncdir=syncdir_shown(store, agent),
    )
    return _judged(status) if observer is not None else status


def syncdir_shown(store: Store, agent: str | None) -> SyncDirShown | None:
    """A synced folder's report (None for any other store): its subtrees and sync-tool
    files, what it skipped, and with an agent its chains and what nodes reported aside."""
    kept = store.chains
    if kept is None:
        return None  # one lease keeps one chain: nothing of a synced folder's to show
    chains: list[ChainShown] = []
    diverged: list[dict[str, object]] = []
    if agent is not None:
        for node, listed in kept.list_chains(agent).items():
            by_epoch: dict[int, list[int]] = {}
            for info in listed:
                by_epoch.setdefault(info.epoch, []).append(info.seq)
            chains.extend(
                ChainShown(node, epoch, min(seqs), max(seqs), len(seqs))
                for epoch, seqs in sorted(by_epoch.items())
            )
        diverged = _diverged(store.read_events(agent))
    folder = store.report().synced_folder  # last: the reads above report problems into it
    if folder is None:
        return None
    return SyncDirShown(
        mode="syncdir",
        mutual_exclusion=SYNCDIR_MODE,
        sync_delay_ms=kept.sync_delay_ms or None,
        nodes=list(folder.nodes),
        sync_files=list(folder.sync_files),
        problems=list(folder.problems),
        chains=chains,
        diverged=diverged,
    )


def _diverged(events: list[Event]) -> list[dict[str, object]]:
    """Each kept-aside segment nodes reported (store.diverged), once, the newest last."""
    seen: dict[tuple[object, object], dict[str, object]] = {}
    for event in sorted((e for e in events if e.type == "store.diverged"), key=lambda e: e.time):
        detail = event.detail
        key = (detail.get("term"), detail.get("forked_at"))
        fields_ = {name: detail.get(name) for name in (
            "winner", "term", "node", "from_seq", "to_seq", "count", "forked_at", "aside")}  # fmt: skip
        first = seen.pop(key, None)
        reported = [] if first is None else list(first["reported_by"])  # type: ignore[call-overload]
        if event.node not in reported:
            reported.append(event.node)
        seen[key] = fields_ | {"reported_by": reported}
    return list(seen.values())[-MAX_DIVERGED_SHOWN:]


def _keys(store: Store) -> KeysShown | None:
    try:
        record = store.read_cluster()
    except CorruptRecord:
        return None
    if record is None:
        return None
    accepted = tuple(entry.kid for entry in record.accepted)
    return KeysShown(record.key_id, record.generation, record.rotation, accepted)


def _refusals(events: list[Event], now: float) -> list[Refusal]:
    newest: dict[str, Event] = {}
    for event in events:  # each node's in order: the last one stays
        newest[event.node] = event
    return [
        Refusal(e.node, e.type, str(e.detail.get("reason", ""))[:200], _age(now, e.time) or 0.0)
        for e in newest.values()
        if e.type in REFUSAL_EVENTS
    ]


def _judged(status: ClusterStatus) -> ClusterStatus:
    """status with its problems and verdict: degraded without a live leader (as far as
    watching could tell), with a failing step, or with a node refusing."""
    problems = []
    live = status.liveness
    if status.lease_error is not None:
        problems.append("no live leader known: the lease record is unreadable")
    elif live is not None and live.state not in (LIVE, UNKNOWN, NOT_WATCHED):
        problems.append(f"no live leader: the lease is {live.state}")
    for n in status.nodes:
        if n.failing and n.role == "active":
            problems.append(f"{printable(n.node)} is failing: {n.failing} steps in a row")
    for r in status.refusals:
        problems.append(f"{printable(r.node)} refuses ({printable(r.event)})")
    degraded = bool(problems)
    health = "degraded" if degraded else "healthy"
    return replace(status, problems=problems, health=health, exit_code=int(degraded))


def _age(now: float, then: float | None) -> float | None:
    return None if then is None else round(max(0.0, now - then), 3)


def printable(text: str) -> str:
    """text from the store, safe to print: a control character could drive the terminal."""
    return text if text.isprintable() else repr(text)[1:-1]
