"""Write ``etcd.json.gz``: a store the earlier etcd store wrote, and what that store read of it.

Run once, with etcd installed, from a checkout that still has both this script and
``hamsterbunker/stores/etcd/`` (this script's own commit, on d8bcd4e, has both):
``python -m tests.data.earlier.make_etcd``.

It opens the earlier ``EtcdStore`` on a fresh prefix of a throwaway etcd, writes with it
the history of ``tests/stores/test_migrate.py``'s ``_history`` for agents a1 and a2 (3
replies kept, so one is pruned), a pending submission of a1 whose bytes are not sealed,
and a checkpoint of a2 above 1 MiB (a repeating pattern: the store does not open it).
The fixture holds every key under the prefix with its value (base64; the prefix as
``PREFIX``) and, beside them, what the earlier store's own reads answered
(``tests.support.earlier_etcd.answers_of`` and ``request_ids_of``). A lease's version,
an etcd revision that differs wherever the keys are loaded, is left out there: it is
the lease key's mod_revision, and the tests compare it so.
"""

from __future__ import annotations

import base64
import gzip
import json
from pathlib import Path

from hamsterbunker.sealing import Sealer, new_cluster_record
from hamsterbunker.stores.backends.etcd_connection import EtcdConnection, parse_etcd_url
from hamsterbunker.stores.etcd import EtcdStore  # the earlier store: gone after d8bcd4e
from tests.stores.test_migrate import KEEP_REPLIES, _history
from tests.support.agents import SECRET
from tests.support.earlier_etcd import answers_of, request_ids_of
from tests.support.etcd_server import etcd_url

OUT = Path(__file__).with_name("etcd.json.gz")
AGENTS = ("a1", "a2")
PREFIX = "PREFIX"  # stands for the store's key prefix in the fixture's keys
JUNK = ("a1", "junk", 7)  # agent, request id, number of the submission that does not open
BIG = b"hamster-bunker-" * 80_000  # 1.2 MB: above 1 MiB, under etcd's 1.5 MiB request limit


def _dump(url: str) -> list[list[str]]:
    """Every key under the store's prefix and its value, base64, the prefix as PREFIX."""
    target = parse_etcd_url(url)
    connection = EtcdConnection(target)
    try:
        start = target.prefix + "/"
        end = target.prefix + "0"
        found = connection.kv.get(start, range_end=end, metadata=True)
    finally:
        connection.close()
    keys = []
    for value, meta in found:
        key = meta["key"].decode()
        keys.append([PREFIX + key.removeprefix(target.prefix), base64.b64encode(value).decode()])
    return sorted(keys)


def main() -> None:
    url = etcd_url()
    store = EtcdStore(url, keep_replies=KEEP_REPLIES)
    try:
        cluster = store.create_cluster(new_cluster_record(SECRET))
        sealer = Sealer(SECRET, cluster)
        fences = {agent: _history(store, sealer, agent) for agent in AGENTS}
        agent, request_id, number = JUNK
        assert store.admit(agent, request_id, number, b"not sealed") == (number, False)
        store.put_checkpoint("a2", fences["a2"], 5, BIG)
        fixture = {
            "keys": _dump(url),
            "answers": answers_of(store),
            "request_ids": request_ids_of(store),
        }
    finally:
        store.close()
    OUT.write_bytes(gzip.compress(json.dumps(fixture, indent=0).encode(), mtime=0))
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes, {len(fixture['keys'])} keys)")


if __name__ == "__main__":
    main()
