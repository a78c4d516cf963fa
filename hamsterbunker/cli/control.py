"""``hb switchover``, ``pause``, ``resume``, ``history`` and ``accept-loss``: an operator's
hand on the lease (the command line's side of ``hamsterbunker.lease.control`` and
``hamsterbunker.lease.acceptance``)."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from datetime import datetime

from ..core.errors import CorruptRecord
from ..core.timing import DEFAULT_LEASE_TTL_MS
from ..lease.acceptance import accept_loss as write_acceptance
from ..lease.acceptance import plan_loss
from ..lease.control import is_paused, request_switchover, set_paused
from ..lease.gap import format_gap
from ..ops.status import printable
from ..ops.status_text import duration
from ..records import LeaseRecord, check_name
from ..sealing.keyring import Secret
from ..stores import Store
from .args import confirmed, not_on_syncdir, store_url
from .context import EXIT_FAILURE, EXIT_TIMEOUT, known_agent, opened_store, store_sealer, warn
from .liveness import live_node, watch_window

__all__ = ["accept_loss", "history", "pause", "switchover"]

_POLL_S = 0.02


def _target(
    args: argparse.Namespace, writes: str | None = None, instead: str = ""
) -> tuple[str, str]:
    """The store's URL and the agent id; writes: what the command writes, refused on a
    syncdir:// store (nothing but a node writes there yet)."""
    agent = check_name("agent id", args.agent_id)
    url = store_url(args)
    if writes is not None:
        not_on_syncdir(url, writes, instead)
    return url, agent


def switchover(args: argparse.Namespace, read_secret: Callable[[], Secret]) -> int:
    if args.to is not None:
        check_name("node id", args.to)
    url, agent = _target(args, writes="a switchover")
    with opened_store(url) as store:
        sealer = store_sealer(store, read_secret())
        known_agent(store, agent)
        before = store.read_lease(agent)
        target = request_switchover(store, sealer, agent, args.to)
        epoch = 0 if before is None else before.epoch
        print(f"agent {agent}: switchover from {before and before.holder} to {target} asked "
              f"(epoch {epoch})", flush=True)  # fmt: skip
        if not args.wait:
            return 0
        started = time.monotonic()
        lease = _wait_for(store, agent, lambda r: r.holder == target and r.epoch > epoch,
                          args.timeout)  # fmt: skip
        if lease is None:
            print(f"agent {agent}: {target} did not take the lease within {args.timeout:g} s")
            return EXIT_TIMEOUT
        took = round((time.monotonic() - started) * 1000)
        print(f"agent {agent}: {target} leads at epoch {lease.epoch} ({took} ms)")
        return 0


def _wait_for(
    store: Store, agent: str, done: Callable[[LeaseRecord], bool], timeout: float
) -> LeaseRecord | None:
    """Read the lease until done says so (a CLI's short poll); None after timeout."""
    until = time.monotonic() + timeout
    while time.monotonic() < until:
        lease = store.read_lease(agent)
        if lease is not None and done(lease):
            return lease
        time.sleep(_POLL_S)
    return None


def pause(args: argparse.Namespace, read_secret: Callable[[], Secret]) -> int:
    paused = args.command == "pause"
    url, agent = _target(args, writes=f"hb {args.command}")
    with opened_store(url) as store:
        sealer = store_sealer(store, read_secret())
        known_agent(store, agent)
        already = is_paused(store, sealer, agent) == paused
        lease = set_paused(store, sealer, agent, paused)
    if already:  # written again all the same: it also drops a switchover asked meanwhile
        print(f"agent {agent}: already {'paused' if paused else 'running (not paused)'}")
    elif paused:
        leader = f"its leader {lease.holder}" if lease.holder else "the next leader"
        print(f"agent {agent}: paused; {leader} finishes its step in flight and steps no "
              "more until hb resume")  # fmt: skip
    else:
        print(f"agent {agent}: resumed")
    return 0


def history(args: argparse.Namespace) -> int:
    url, agent = _target(args)
    with opened_store(url) as store:
        lease = store.read_lease(known_agent(store, agent))
    takeovers = [] if lease is None else list(reversed(lease.history))
    if args.json:
        for takeover in takeovers:
            print(json.dumps(takeover.to_doc(), sort_keys=True))
        return 0
    if not takeovers:
        print(f"agent {agent}: no takeovers recorded")
        return 0
    rows = [
        (
            str(t.epoch),
            datetime.fromtimestamp(t.time).strftime("%Y-%m-%d %H:%M:%S"),
            printable(t.from_ or "-"),
            printable(t.to),
            printable(t.via),
            format_gap(t.gap_ms),
        )
        for t in takeovers
    ]
    header = ("epoch", "when", "from", "to", "via", "gap")
    # Each column as wide as its widest cell (a node id may be long); numbers to the right.
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    right = {0, 5}
    for row in [header, *rows]:
        cells = [
            cell.rjust(width) if i in right else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        print("  ".join(cells).rstrip())
    return 0


def accept_loss(args: argparse.Namespace, read_secret: Callable[[], Secret]) -> int:
    url, agent = _target(
        args,
        writes="accepting a loss",
        instead="; to go on from a checkpoint behind a lost one there, use hb choose-chain",
    )
    secret = read_secret()
    with opened_store(url) as store:
        sealer = store_sealer(store, secret)
        known_agent(store, agent)
        live = _live_node(store, agent)
        if live is not None:
            node, after_s = live
            warn(
                f"hb accept-loss: refused: node {node} of agent {agent} is live: its heartbeat "
                f"or events changed {duration(after_s)} into watching, as seen from here; stop "
                "every node first (nothing changed)"
            )
            return EXIT_FAILURE
        plan = plan_loss(store, sealer, agent, args.to_seq)
        print(plan.describe())
        if not confirmed(args, "Give these up? Type yes to go on: "):
            return EXIT_FAILURE
        acceptance = write_acceptance(store, sealer, plan)
    print(
        f"accepted ({acceptance.id}): nodes started now resume from seq {plan.resume.seq}; "
        "start them again"
    )
    return 0


def _live_node(store: Store, agent: str) -> tuple[str, float] | None:
    """A node of agent seen live from here (its heartbeat or events changing within a lease
    TTL), and how long into the watch: a loss is accepted only with every node stopped."""
    try:
        lease = store.read_lease(agent)
    except CorruptRecord:  # what the plan then says; watched for the default TTL
        lease = None
    ttl_s = (DEFAULT_LEASE_TTL_MS if lease is None else lease.ttl_ms) / 1000
    tail = store.tail(agent)
    return live_node(tail, tail.read(), watch_window(ttl_s), time.monotonic, time.sleep)
