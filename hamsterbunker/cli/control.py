"""``hb switchover``, ``pause`` and ``resume``: an operator's hand on the lease (the command
line's side of ``hamsterbunker.lease.control``)."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from ..records import LeaseRecord, check_name
from ..sealing.keyring import Secret
from ..stores import Store
from .args import agent_target
from .context import EXIT_TIMEOUT, known_agent, opened_store, sealer_deriving, store_sealer

__all__ = ["pause", "switchover"]

# The lease code is imported by each command as it runs: hb switchover loads it while the
# key derives.

_POLL_S = 0.02


def switchover(args: argparse.Namespace, read_secret: Callable[[], Secret]) -> int:
    if args.to is not None:
        check_name("node id", args.to)
    url, agent = agent_target(args, writes="a switchover")
    with opened_store(url) as store:
        with sealer_deriving(store, read_secret()) as sealer:
            # Loaded and judged while the key derives: only the request needs the key.
            from ..lease.control import ask_switchover, judge_switchover

            known_agent(store, agent)
            before = store.read_lease(agent)
            judged, target = judge_switchover(store, agent, args.to)
            ask_switchover(store, sealer.result(), agent, judged, target)
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
    from ..lease.control import is_paused, set_paused

    paused = args.command == "pause"
    url, agent = agent_target(args, writes=f"hb {args.command}")
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
