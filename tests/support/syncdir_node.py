"""One node on a syncdir folder, as a process of its own (SIGKILL-able like a machine):
``python -m tests.support.syncdir_node --root DIR --node ID --history FILE ...``.

It keeps ``hamsterbunker.demo:CounterAgent`` through the library (a ``Runtime`` on
a ``SyncDirStore``), so the Syncthing scenarios test the store and the node
without depending on how ``hb run`` is configured.
"""

from __future__ import annotations

import argparse
import logging

from hamsterbunker.core.timing import LeaseTiming
from hamsterbunker.demo import CounterAgent
from hamsterbunker.runtime import Runtime
from hamsterbunker.stores.syncdir import SyncDirStore
from tests.support.server_process import die_with_parent

SECRET = "syncdir-scenario-secret"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", required=True)
    parser.add_argument("--node", required=True)
    parser.add_argument("--history", required=True)
    parser.add_argument("--sync-delay-ms", type=int, required=True)
    parser.add_argument("--tick-ms", type=int, required=True)
    parser.add_argument("--lease-ttl-ms", type=int, required=True)
    args = parser.parse_args()
    die_with_parent()
    logging.basicConfig(level=logging.INFO, format=f"{args.node} %(levelname)s %(message)s")
    store = SyncDirStore(args.root, args.node, sync_delay_ms=args.sync_delay_ms)
    Runtime(
        node_id=args.node,
        region=args.node,
        store=store,
        agent=CounterAgent(),
        secret=SECRET,
        timing=LeaseTiming(tick_ms=args.tick_ms, lease_ttl_ms=args.lease_ttl_ms),
        history=args.history,
        stop_grace_ms=5_000,
    ).run()


if __name__ == "__main__":
    main()
