"""``hb status`` in words: a cluster's snapshot (``status``) as lines for people to read,
text from the store printed with control characters escaped."""

from __future__ import annotations

from collections.abc import Sequence

from ..lease.observe import LIVE, NOT_WATCHED, Liveness
from ..records import LeaseRecord
from .status import ClusterStatus, NodeStatus, SyncDirShown, printable

__all__ = ["duration", "render", "syncdir_lines", "table"]


def duration(seconds: float) -> str:
    """4.2 s, 12 s, 3 m 05 s, 2 h 10 m, 12 d (capped: a writer's clock may be far off)."""
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes, secs = divmod(int(min(seconds, 1e9)), 60)
    if minutes < 60:
        return f"{minutes} m {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes:02d} m"
    return f"{hours // 24} d" if seconds < 1e9 else "> 10000 d"


def table(rows: Sequence[Sequence[str]], indent: str = "") -> list[str]:
    """rows as lines, each column as wide as its widest cell."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        indent + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]


def render(status: ClusterStatus) -> str:
    """The snapshot as ``hb status`` prints it for one agent."""
    lines = [f"agent {status.agent} · store {status.store}"]
    if status.liveness is not None:
        verdict = status.health + "".join(f"\n  {problem}" for problem in status.problems)
        lines.append(f"health: {verdict}")
    lines += _lease_lines(status)
    lines.append(_checkpoint_line(status))
    lines.append(_inbox_line(status))
    keys_line = _keys_line(status)
    if keys_line is not None:
        lines.append(keys_line)
    if status.syncdir is not None:
        lines.extend(syncdir_lines(status.syncdir))
    if status.paused:
        lines.append("paused: the leader keeps the lease and does not step (hb resume ends it)")
    lines.extend(
        f"refusing: {printable(r.node)} ({printable(r.event)}, {duration(r.age_s)} ago): "
        f"{printable(r.reason)}"
        for r in status.refusals
    )
    lines += _node_lines(status.nodes)
    return "\n".join(lines)


def _lease_lines(status: ClusterStatus) -> list[str]:
    lease = status.lease
    if status.lease_error is not None:
        return [f"lease: unreadable ({printable(status.lease_error)})"]
    if lease is None:
        return ["lease: never taken"]
    if lease.holder is None:
        return [f"lease: released · epoch {lease.epoch}"]
    lines = [f"lease: {printable(lease.holder)} ({printable(lease.region)}) · epoch {lease.epoch}"]
    if status.liveness is not None:
        lines.append(_liveness_line(status.liveness, lease))
    return lines


def _checkpoint_line(status: ClusterStatus) -> str:
    cp = status.checkpoint
    if cp is None:
        return "last checkpoint: none"
    return (
        f"last checkpoint: seq {cp.seq} (epoch {cp.epoch}) · {status.checkpoint_age_s:.1f} s ago"
        f" · {cp.size} B"
        # On a syncdir store: the newest of every chain, which may be one kept aside.
        + (" · the newest of any chain (syncdir: see below)" if status.syncdir else "")
    )


def _node_lines(nodes: list[NodeStatus]) -> list[str]:
    """The nodes' table, then the effects in flight and failing steps of an active one."""
    if not nodes:
        return ["nodes: none"]
    header = ("NODE", "REGION", "ROLE", "EPOCH", "SEQ", "HEARTBEAT", "HOST", "PID")
    rows = [header] + [
        (
            printable(n.node),
            printable(n.region),
            printable(n.role) + (" (paused)" if n.paused and n.role == "active" else ""),
            str(n.epoch),
            str(n.seq),
            f"{n.age_s:.1f} s ago",
            printable(n.host),
            str(n.pid),
        )
        for n in nodes
    ]
    lines = ["nodes:", *table(rows, indent="  ")]
    for n in nodes:
        if n.effects and n.role == "active":
            effects = " · ".join(
                f"{printable(name)} {printable(state)}" for name, state in n.effects
            )
            lines.append(f"effects in flight on {printable(n.node)}: {effects}")
        if n.failing and n.role == "active":
            steps = "1 step" if n.failing == 1 else f"{n.failing} steps"
            lines.append(f"failing on {printable(n.node)}: {steps} failed in a row, "
                         f"the last: {printable(n.failing_error)}")  # fmt: skip
    return lines


def _liveness_line(live: Liveness, lease: LeaseRecord) -> str:
    """The lease's state as watched from here: never a writer's clock (DESIGN.md invariant 2)."""
    term = f"{lease.renewals} renewals this term, {lease.epoch} acquisitions so far"
    ttl = f"TTL {duration(live.ttl_s)}"
    if live.state == LIVE:
        seen = f"changed {duration(live.changed_s_ago or 0.0)} ago, as seen from here"
    elif live.state == NOT_WATCHED:
        return f"lease is not watched (--observe-ms 0) · {term}"
    else:
        still = live.changed_s_ago if live.changed_s_ago is not None else live.watched_s
        seen = f"unchanged for {duration(still)}, as seen from here ({ttl})"
    return f"lease is {live.state}: {seen} · {term}"


def _inbox_line(status: ClusterStatus) -> str:
    if status.inbox_depth is None and status.paused:
        return "inbox: not known while paused (a paused leader does not read it)"
    if status.inbox_depth is None:
        return "inbox: not known (no active node to tell it)"
    if status.inbox_depth == 0:
        return "inbox: empty"
    line = f"inbox: {status.inbox_depth} waiting"
    if status.inbox_oldest_age_s is not None:
        line += f", oldest {duration(status.inbox_oldest_age_s)}"
    return line


def _keys_line(status: ClusterStatus) -> str | None:
    keys = status.keys
    if keys is None:
        return None
    line = f"key: {keys.key_id} (generation {keys.generation})"
    if keys.rotation:
        step = "commit" if keys.rotation == "begun" else "finish"
        line += (
            f" · rotation {keys.rotation}: {', '.join(keys.accepted)} still accepted "
            f"(next: hb rotate-secret {step})"
        )
    other = [printable(n.node) for n in status.nodes if n.sealing and n.sealing != keys.key_id]
    if other:
        line += f" · sealing with another key: {', '.join(other)}"
    return line


def syncdir_lines(shown: SyncDirShown, *, agent: bool = True) -> list[str]:
    """The syncdir section of ``hb status``: a few lines, indented under one heading."""
    lines = [f"store mode: syncdir ({shown.mutual_exclusion}; docs/syncdir.md)"]
    if shown.sync_delay_ms is not None:
        lines.append(f"  sync delay: {shown.sync_delay_ms} ms (as configured)")
    else:
        lines.append("  sync delay: not known here (hb status --instance NAME reads it)")
    lines.append("  node subtrees: " + (", ".join(printable(n) for n in shown.nodes) or "none"))
    files = shown.sync_files
    lines.append(
        "  sync-tool files: "
        + ("none" if not files else ", ".join(printable(f) for f in files[:10])
           + (f" and {len(files) - 10} more" if len(files) > 10 else "") + " (never read as ours)")
    )  # fmt: skip
    lines.append(f"  problems: {'none' if not shown.problems else len(shown.problems)}")
    lines.extend(f"    {printable(problem)}" for problem in shown.problems[:10])
    if not agent:
        return lines
    if shown.chains:
        lines.append("  chains (as listed; not authenticated, status has no secret):")
        lines.extend(
            f"    {printable(c.node)}: epoch {c.epoch}, seq {c.from_seq}..{c.to_seq} "
            f"({c.count} checkpoint{'' if c.count == 1 else 's'})"
            for c in shown.chains
        )
    else:
        lines.append("  chains: none")
    if shown.diverged:
        lines.append("  kept aside (store.diverged, as nodes reported it):")
        lines.extend(
            f"    {printable(str(d['aside']))} · winner {printable(str(d['winner']))} · forked at "
            f"{printable(str(d['forked_at'] or 'the start'))} · reported by "
            f"{', '.join(printable(str(n)) for n in d['reported_by'])}"  # type: ignore[attr-defined]
            for d in shown.diverged
        )
    else:
        lines.append("  kept aside: none reported")
    return lines
