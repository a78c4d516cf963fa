"""``hb history``: the agent's takeovers, newest first, each with its gap."""

from __future__ import annotations

import argparse
import json
from datetime import datetime

from ..lease.gap import format_gap
from ..ops.status import printable
from .args import agent_target
from .context import known_agent, opened_store

__all__ = ["history"]


def history(args: argparse.Namespace) -> int:
    url, agent = agent_target(args)
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
