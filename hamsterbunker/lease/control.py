"""What an operator asks of an agent's leader: pause, resume, switch over (``hb pause``, ...).

A request is signed with the cluster key and written into the lease record's ``control``
field by compare-and-set (``docs/design.md``, "Operator requests ride the lease's
compare-and-set"). ``paused`` holds from term to term; ``switchover_to`` only for the term
``switchover_epoch``; ``revision`` only grows, and a node obeys and passes on only the newest
request it has seen.
"""

from __future__ import annotations

import secrets
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from ..core.errors import ControlRefused, CorruptRecord, LeaseConflict, Tampered
from ..core.timing import DEFAULT_LEASE_TTL_MS
from ..records import Heartbeat, LeaseRecord, check_name, parse_json
from ..records.parsing import dump_compact
from ..sealing import Sealer
from ..stores import Store
from .observe import MAX_WATCH_S
from .proof import LeaseProof

__all__ = [
    "Control",
    "ControlRefused",
    "ControlView",
    "ask_switchover",
    "is_paused",
    "judge_switchover",
    "open_control",
    "request_switchover",
    "set_paused",
]

_KIND = "control"
# A request retried this often when renewals keep changing the record under it.
MAX_WRITE_TRIES = 50
# How often the request's liveness checks read the store.
POLL_S = 0.05
# A record dated further ahead of this machine's wall clock is not judged by its age: the
# clocks disagree, and the watch decides.
MAX_AHEAD_S = 0.5


@dataclass(frozen=True)
class Control:
    agent: str
    revision: int
    paused: bool = False
    switchover_to: str | None = None
    switchover_epoch: int = 0  # the term the switchover is for
    id: str = ""
    time: float = 0.0  # the asking machine's wall clock: display only
    by: str = ""  # the asking host: display only


def sign_control(sealer: Sealer, control: Control) -> str:
    return sealer.sign_record(_KIND, dump_compact(control)).decode()


def open_control(sealer: Sealer, text: str, agent: str) -> Control:
    """The request in a lease record's control field, authenticated and for agent; else Tampered."""
    payload = sealer.open_record(_KIND, text.encode())
    try:
        doc = parse_json(payload, "control record")
        found = Control(**doc)
        _check_types(found)
    except (CorruptRecord, TypeError, ValueError) as exc:
        # Signed with our key, so written by our own code: a newer format, or a bug.
        raise Tampered(f"control record does not parse: {exc}") from exc
    if found.agent != agent:
        raise Tampered(f"control record is for agent {found.agent!r}, not {agent!r}")
    return found


def _check_types(control: Control) -> None:
    kinds: dict[str, type | tuple[type, ...]] = {
        "agent": str, "revision": int, "paused": bool, "switchover_epoch": int,
        "id": str, "time": (int, float), "by": str,
    }  # fmt: skip
    for name, kind in kinds.items():
        if not isinstance(getattr(control, name), kind):
            raise TypeError(f"field {name!r} has the wrong type")
    if control.switchover_to is not None and not isinstance(control.switchover_to, str):
        raise TypeError("field 'switchover_to' has the wrong type")


class ControlView:
    """A node's reading of the control field of each lease record it sees: the newest
    revision it authenticated holds; a field that does not authenticate, or an older request,
    changes nothing (reported once in ``problems``). ``text`` and ``remember`` keep it in the
    node's memory; ``carried`` writes it into every lease record. Safe from any thread."""

    def __init__(self, sealer: Sealer, agent: str) -> None:
        self._sealer, self._agent = sealer, agent
        self.current: Control | None = None
        self.text = ""  # the signed request current came in ("" while there is none)
        self._last_text: str | None = None
        self.problems: list[str] = []
        self._lock = threading.Lock()

    def remember(self, text: str) -> None:
        """Start from the request this node saw last before a restart (``memory``)."""
        if text:
            with self._lock:
                self._take(text, "the remembered control request")

    def read(self, record: LeaseRecord | None) -> Control | None:
        """The request in force after seeing record."""
        with self._lock:
            self._see("" if record is None else record.control)
            return self.current

    def carried(self, found: str) -> str:
        """The control field for a lease record written over one whose field was found: found
        if it holds the newest request seen here, else that newest request ("" if none)."""
        with self._lock:
            self._see(found)
            return self.text

    def _see(self, text: str) -> None:
        # A field seen just before is not opened (or reported) again at every renewal.
        if text and text != self._last_text:
            self._last_text = text
            self._take(text, "a control request")

    def _take(self, text: str, what: str) -> None:
        """Make the request in text current if it authenticates and is not older."""
        try:
            found = open_control(self._sealer, text, self._agent)
        except Tampered as exc:
            self.problems.append(f"ignored {what}: {exc}")
            return
        if self.current is not None and found.revision < self.current.revision:
            self.problems.append(
                f"ignored {what} of revision {found.revision}, older than "
                f"{self.current.revision} (put back by someone else?)"
            )
            return
        self.current, self.text = found, text

    @property
    def paused(self) -> bool:
        return self.current is not None and self.current.paused

    def switchover_for(self, epoch: int) -> str | None:
        """The node to hand the lease of epoch to, if an operator asked for that."""
        control = self.current
        if control is None or control.switchover_epoch != epoch:
            return None
        return control.switchover_to

    def drain_problems(self) -> list[str]:
        with self._lock:
            found, self.problems = self.problems, []
        return found


# -- the operator's side -----------------------------------------------------------


def is_paused(store: Store, sealer: Sealer, agent: str) -> bool:
    """Whether the lease record carries an authentic request to pause the agent."""
    return _current_control(sealer, store.read_lease(agent), agent).paused


def set_paused(store: Store, sealer: Sealer, agent: str, paused: bool) -> LeaseRecord:
    """Pause (or resume) the agent: its leader, now and in later terms, steps no more (or
    again). With no lease record yet, a released one is written."""
    check_name("agent id", agent)

    def pausing(current: Control) -> Control:
        return replace(current, paused=paused, switchover_to=None, switchover_epoch=0)

    return _write(store, sealer, agent, pausing)


def request_switchover(
    store: Store,
    sealer: Sealer,
    agent: str,
    to: str | None = None,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    wall: Callable[[], float] = time.time,
) -> str:
    """Ask the live leader to hand the lease to the live standby to (or the freshest); the
    target. Liveness is read at once from fresh records (``_live_at_once``), else seen: the
    lease record and the target's heartbeat must change while this watches (a lease TTL at
    most). ControlRefused if there is no live leader, to is not a live standby, or to leads
    already."""
    lease, target = judge_switchover(store, agent, to, clock=clock, sleep=sleep, wall=wall)
    ask_switchover(store, sealer, agent, lease, target)
    return target


def judge_switchover(
    store: Store,
    agent: str,
    to: str | None = None,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    wall: Callable[[], float] = time.time,
) -> tuple[LeaseRecord, str]:
    """request_switchover's judgment, which needs no key: the lease of the live leader and
    the target; ControlRefused as request_switchover."""
    check_name("agent id", agent)
    if to is not None:
        check_name("node id", to)
    beats = store.list_heartbeats(agent)
    if to is not None:
        known = sorted(beat.node for beat in beats)
        if to not in known:  # said at once: no watching needed to know it is no node here
            raise ControlRefused(
                f"no node {to} keeps agent {agent!r} (it has no heartbeat in the store); its "
                f"nodes: {', '.join(known) or 'none'}"
            )
    lease = store.read_lease(agent)
    live = _live_at_once(lease, beats, to, wall())
    if live is None:
        lease, live = _watch_liveness(store, agent, to, clock, sleep)
    if lease is None or lease.holder is None:
        raise ControlRefused(f"agent {agent!r} has no leader to switch over from (the lease is "
                             f"{'not taken' if lease is None else 'released'})")  # fmt: skip
    if lease.holder not in live:
        raise ControlRefused(
            f"the leader of agent {agent!r}, {lease.holder}, did not renew its lease while "
            f"watched for {lease.ttl_ms} ms: it is not live; a standby takes over on its own"
        )
    if to == lease.holder:
        raise ControlRefused(f"{to} leads agent {agent!r} already")
    standbys = [n for n in live if n != lease.holder]
    if to is not None and to not in standbys:
        raise ControlRefused(
            f"{to} is not a live standby of agent {agent!r} (its heartbeat did not change "
            f"while watched for {lease.ttl_ms} ms); live standbys: {', '.join(standbys) or 'none'}"
        )
    if not standbys:
        raise ControlRefused(f"agent {agent!r} has no live standby to switch over to")
    return lease, to or standbys[0]


def ask_switchover(
    store: Store, sealer: Sealer, agent: str, lease: LeaseRecord, target: str
) -> None:
    """Write the request to hand lease's term to target (as judge_switchover found them);
    ControlRefused if the lease changed hands meanwhile."""

    def switching(current: Control) -> Control:
        return replace(current, switchover_to=target, switchover_epoch=lease.epoch)

    _write(store, sealer, agent, switching, holder=lease.holder, epoch=lease.epoch)


def _live_at_once(
    lease: LeaseRecord | None, beats: list[Heartbeat], to: str | None, now: float
) -> list[str] | None:
    """The holder and the standbys (to alone, if given) judged live from one read, freshest
    first; None when that read cannot tell, and the watch decides.

    Live at once: the lease record was written within its TTL and the holder's heartbeat
    is of this term (active, at the lease's epoch, naming the lease's session), the
    standby's has seen this term or the one before (standby, at either epoch), each written
    within the TTL: the most the watch allows, as it counts a node seen once within a TTL
    as live. Ages compare the writers' wall clocks with ours (``now``), so a time further
    ahead of ours than ``MAX_AHEAD_S`` is not judged (docs/design.md, "A switchover judges
    liveness at once")."""
    if lease is None or lease.holder is None:
        return None  # refused by the watch, which reads the lease again
    window_s = min(lease.ttl_ms / 1000, MAX_WATCH_S)
    by_node = {beat.node: beat for beat in beats}
    leader = by_node.get(lease.holder)
    if not _recent(lease.written, now, window_s) or not _leads(leader, lease, now, window_s):
        return None
    if to == lease.holder:
        return [lease.holder]  # refused as the leader already
    standbys = sorted(
        (
            beat
            for beat in by_node.values()
            if beat.node != lease.holder
            and (to is None or beat.node == to)
            and beat.role == "standby"
            # A standby beats every half TTL: just after a switchover, it names the last term.
            and beat.epoch >= lease.epoch - 1
            and _recent(beat.time, now, window_s)
        ),
        key=lambda beat: (-beat.time, beat.node),
    )
    if not standbys:
        return None
    return [lease.holder, *(beat.node for beat in standbys)]


def _leads(beat: Heartbeat | None, lease: LeaseRecord, now: float, window_s: float) -> bool:
    """Whether beat is a recent heartbeat of the lease's term: active, at its epoch, of the
    keeper whose session the lease names."""
    return (
        beat is not None
        and (beat.role, beat.epoch, beat.lease_session) == ("active", lease.epoch, lease.session)
        and _recent(beat.time, now, window_s)
    )


def _recent(written: float, now: float, window_s: float) -> bool:
    """Whether a record a writer dated written (its wall clock) was written within window_s
    before now (ours), the clocks agreeing within MAX_AHEAD_S; 0 (not dated) is not."""
    return written > 0 and -MAX_AHEAD_S <= now - written <= window_s


def _watch_liveness(
    store: Store,
    agent: str,
    to: str | None,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
) -> tuple[LeaseRecord | None, list[str]]:
    """The lease as last read, and the nodes whose record or heartbeat changed while watched
    (until the holder and the target, or any standby, are seen live; a TTL at most), freshest
    first."""
    started = clock()
    lease = store.read_lease(agent)
    if lease is None or lease.holder is None:
        return lease, []
    first_lease = lease.change_key()
    first_beats = {hb.node: hb.change_key() for hb in store.list_heartbeats(agent)}
    live: dict[str, float] = {}
    while clock() - started < lease.ttl_ms / 1000:
        sleep(POLL_S)
        now = clock()
        lease = store.read_lease(agent)
        if lease is None or lease.holder is None:
            return lease, []
        if lease.change_key() != first_lease:
            live.setdefault(lease.holder, now)
        for hb in store.list_heartbeats(agent):
            if hb.node in first_beats and hb.change_key() != first_beats[hb.node]:
                live.setdefault(hb.node, now)
        standby_seen = [n for n in live if n != lease.holder and (to is None or n == to)]
        if lease.holder in live and standby_seen:
            break
    # Freshest first: the standby whose heartbeat changed soonest after we looked.
    return lease, sorted(live, key=lambda node: live[node])


def _write(
    store: Store,
    sealer: Sealer,
    agent: str,
    change: Callable[[Control], Control],
    *,
    holder: str | None = None,
    epoch: int | None = None,
) -> LeaseRecord:
    """Write the changed request into the lease record by compare-and-set, retried on a race;
    holder and epoch, when given, must still be the lease's (the term that was watched)."""
    for _ in range(MAX_WRITE_TRIES):
        lease = store.read_lease(agent)
        if epoch is not None and (lease is None or (lease.holder, lease.epoch) != (holder, epoch)):
            raise ControlRefused(f"the lease of agent {agent!r} changed hands while asking; "
                                 "nothing was changed: ask again")  # fmt: skip
        current = _current_control(sealer, lease, agent)
        control = replace(
            change(current),
            agent=agent,
            # Above every revision written before, whatever the clocks say.
            revision=max(current.revision + 1, time.time_ns() // 1000),
            id=secrets.token_hex(8),
            time=time.time(),
            by=socket.gethostname(),
        )
        text = sign_control(sealer, control)
        base = lease or LeaseProof(sealer, agent).signed(
            LeaseRecord(holder=None, region="", session="", epoch=0, ttl_ms=DEFAULT_LEASE_TTL_MS)
        )
        try:
            return store.cas_lease(
                agent, None if lease is None else lease.version, replace(base, control=text)
            )
        except LeaseConflict:
            continue  # a renewal came between: read again
    raise ControlRefused(
        f"the lease of agent {agent!r} kept changing: {MAX_WRITE_TRIES} writes lost their "
        "race; nothing was changed"
    )


def _current_control(sealer: Sealer, lease: LeaseRecord | None, agent: str) -> Control:
    if lease is None or not lease.control:
        return Control(agent=agent, revision=0)
    try:
        return open_control(sealer, lease.control, agent)
    except Tampered:
        return Control(agent=agent, revision=0)  # replaced: the new revision is above it anyway
