"""Write ``etcd.json.gz``: a store the earlier etcd store wrote, and what that store read of it.

Run once, from a checkout that still has ``hamsterbunker/stores/etcd/`` (e.g. commit
d8bcd4e), with etcd installed: ``python -m tests.data.earlier.make_etcd``.

It opens the earlier ``EtcdStore`` on a fresh prefix of a throwaway etcd, writes with it
the history of ``tests/stores/test_migrate.py``'s ``_history`` for agents a1 and a2 (3
replies kept, so one is pruned), a pending submission of a1 whose bytes are not sealed,
and a checkpoint of a2 above 1 MiB (a repeating pattern: the store does not open it).
The fixture holds every key under the prefix with its value (base64; the prefix as
``PREFIX``) and, beside them, what the earlier store's own reads answered. A lease's
version is an etcd revision, which differs wherever the keys are loaded: it is recorded
as ``"mod_revision of lease"`` and compared by that meaning.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from hamsterbunker.limits import INBOX_REPLIES_KEPT, MAX_INBOX_COUNT
from hamsterbunker.sealing import Sealer, new_cluster_record
from hamsterbunker.stores.backends.etcd_connection import EtcdConnection, parse_etcd_url
from hamsterbunker.stores.etcd import EtcdStore  # the earlier store: gone after d8bcd4e
from tests.stores.test_migrate import KEEP_REPLIES, _history
from tests.support.agents import SECRET
from tests.support.etcd_server import etcd_url

OUT = Path(__file__).with_name("etcd.json.gz")
AGENTS = ("a1", "a2")
PREFIX = "PREFIX"  # stands for the store's key prefix in the fixture's keys
JUNK = ("a1", "junk", 7)  # agent, request id, number of the submission that does not open
BIG = b"hamster-bunker-" * 80_000  # 1.2 MB: above 1 MiB, under etcd's 1.5 MiB request limit
IDS = [f"r{n}" for n in range(1, 8)] + ["junk", "unknown"]


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode()


def _answers(store: EtcdStore) -> dict[str, Any]:
    """What the earlier store's reads answer, per agent, as JSON values."""
    cluster = store.read_cluster()
    assert cluster is not None
    agents: dict[str, Any] = {}
    for agent in store.list_agents():
        held = store.read_lease(agent)
        assert held is not None
        listed = store.list_checkpoints(agent)
        step = listed[0].seq + 1 if listed else 1
        pages, after = [], 0
        while page := store.read_inbox(agent, after):
            pages.append([[n, _b64(blob)] for n, blob in page])
            after = page[-1][0]
        ids = store.request_ids(agent, MAX_INBOX_COUNT + INBOX_REPLIES_KEPT)
        admissions = {}
        for request_id in sorted({*IDS, *ids}):
            state = store.read_admission(agent, request_id)
            admissions[request_id] = state and [state.number, state.consumed, _b64(state.reply)]
        agents[agent] = {
            "lease": json.loads(replace(held, version=0).to_json()),
            "lease_version": "mod_revision of lease",
            "heartbeats": [json.loads(beat.to_json()) for beat in store.list_heartbeats(agent)],
            "checkpoints": [
                {**json.loads(info.to_json()), "sha256": _digest(store.read_checkpoint(agent, info))}
                for info in listed
            ],
            "effects_step": step,
            "effects": [[i, kind, _b64(data)] for (i, kind), data in store.read_effects(agent, step).items()],
            "acceptance": _b64(store.read_acceptance(agent)),
            "inbox_pages": pages,
            "request_ids": ids,
            "admissions": admissions,
        }  # fmt: skip
    return {"cluster": json.loads(cluster.to_json()), "agents": agents}


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


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
        keys.append([PREFIX + key.removeprefix(target.prefix), _b64(value)])
    return sorted(keys)  # type: ignore[arg-type]


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
        fixture = {"keys": _dump(url), "answers": _answers(store)}
    finally:
        store.close()
    OUT.write_bytes(gzip.compress(json.dumps(fixture, indent=0).encode(), mtime=0))
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes, {len(fixture['keys'])} keys)")


if __name__ == "__main__":
    main()
