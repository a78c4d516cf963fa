"""``hb accept-loss``: give up checkpoints that are gone or damaged (the command line's side
of ``hamsterbunker.lease.acceptance``)."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from ..core.errors import CorruptRecord
from ..core.timing import DEFAULT_LEASE_TTL_MS
from ..lease.acceptance import accept_loss as write_acceptance
from ..lease.acceptance import plan_loss
from ..ops.status_text import duration
from ..sealing.keyring import Secret
from ..stores import Store
from .args import agent_target, confirmed
from .context import EXIT_FAILURE, known_agent, opened_store, store_sealer, warn
from .liveness import live_node, watch_window

__all__ = ["accept_loss"]


def accept_loss(args: argparse.Namespace, read_secret: Callable[[], Secret]) -> int:
    url, agent = agent_target(
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
