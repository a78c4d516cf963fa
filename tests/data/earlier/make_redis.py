"""Write tests/data/earlier/redis.json.gz: a store the earlier Redis store wrote, and its answers.

Needs a checkout that still has the earlier store, ``hamsterbunker/stores/redis/`` (e.g.
commit d8bcd4e), and redis-server. Run from the checkout's root::

    .venv/bin/python tests/data/earlier/make_redis.py

It writes, through the earlier ``RedisStore`` on a fresh prefix of a throwaway server,
the history of ``_history`` in tests/stores/test_migrate.py for agents a1 and a2 (3
replies kept, so one is pruned), a pending submission of a1 whose bytes do not open,
and for a2 a checkpoint above 1 MiB and a journal of the step after it; then dumps
every key under the prefix (by type, bytes in base64, the prefix as ``PREFIX``) beside
what the earlier store's own reads answered. ``tests/support/earlier_redis.py`` loads it.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from hamsterbunker.sealing import Sealer, new_cluster_record  # noqa: E402
from hamsterbunker.stores.redis import RedisStore  # noqa: E402
from tests.stores.test_migrate import KEEP_REPLIES, _history  # noqa: E402
from tests.support.agents import SECRET  # noqa: E402
from tests.support.redis_server import redis_url  # noqa: E402

PREFIX = "PREFIX"  # stands for the prefix in the key names dumped
AGENTS = ("a1", "a2")
REQUEST_IDS = [f"r{n}" for n in range(1, 9)]  # r1 pruned, r7 junk, r8 never admitted
BIG = b"a checkpoint above one MiB, not ciphertext; " * 25_000  # 1.1 MB, compresses


def b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode()


def write(store: RedisStore) -> None:
    cluster = store.create_cluster(new_cluster_record(SECRET))
    sealer = Sealer(SECRET, cluster)
    fences = {agent: _history(store, sealer, agent) for agent in AGENTS}
    store.admit("a1", "r7", 7, b"not sealed: a submission that does not open")
    store.put_checkpoint("a2", fences["a2"], 5, BIG)
    store.put_effect("a2", fences["a2"], 6, 0, "intent", b"sealed intent of step 6")
    store.put_effect("a2", fences["a2"], 6, 0, "outcome", b"sealed outcome of step 6")


def dump(client: Any, prefix: str) -> list[dict[str, Any]]:
    """Every key under prefix, by type, its name with the prefix as PREFIX."""
    keys = []
    for key in sorted(client.scan_iter(match=f"{prefix}:*", count=1000)):
        kind = client.type(key).decode()
        value: Any
        if kind == "string":
            value = b64(client.get(key))
        elif kind == "hash":
            value = [[b64(f), b64(v)] for f, v in sorted(client.hgetall(key).items())]
        elif kind == "list":
            value = [b64(item) for item in client.lrange(key, 0, -1)]
        elif kind == "set":
            value = sorted(b64(item) for item in client.smembers(key))
        elif kind == "zset":
            value = [[b64(m), s] for m, s in client.zrange(key, 0, -1, withscores=True)]
        else:
            raise SystemExit(f"{key!r}: a Redis {kind}, which the earlier store never wrote")
        name = PREFIX + key.decode().removeprefix(prefix)
        keys.append({"key": name, "type": kind, "value": value})
    return keys


def answers(store: RedisStore) -> dict[str, Any]:
    """What the earlier store's reads answered, JSON-able."""
    cluster = store.read_cluster()
    assert cluster is not None
    agents: dict[str, Any] = {}
    for agent in store.list_agents():
        lease = store.read_lease(agent)
        listed = store.list_checkpoints(agent)
        step = listed[0].seq + 1 if listed else 1
        pages, after = [], 0
        while page := store.read_inbox(agent, after):
            pages.append({"after": after, "entries": [[n, b64(blob)] for n, blob in page]})
            after = page[-1][0]
        admissions = {}
        for request_id in REQUEST_IDS:
            state = store.read_admission(agent, request_id)
            admissions[request_id] = (
                None if state is None else [state.number, state.consumed, b64(state.reply)]
            )
        agents[agent] = {
            "lease": None if lease is None else lease.to_json().decode(),
            "heartbeats": [beat.to_json().decode() for beat in store.list_heartbeats(agent)],
            "checkpoints": [info.to_json().decode() for info in listed],
            "checkpoint_sha256": {
                str(info.seq): hashlib.sha256(store.read_checkpoint(agent, info)).hexdigest()
                for info in listed
            },
            "effects_step": step,
            "effects": [
                [index, kind, b64(data)]
                for (index, kind), data in sorted(store.read_effects(agent, step).items())
            ],
            "acceptance": b64(store.read_acceptance(agent)),
            "inbox_pages": pages,
            "request_ids": sorted(store.request_ids(agent, 100)),  # their order is the server's
            "admissions": admissions,
        }
    return {"cluster": cluster.to_json().decode(), "agents": agents}


def main() -> None:
    store = RedisStore(redis_url(), keep_replies=KEEP_REPLIES)
    try:
        write(store)
        fixture = {
            "written_by": "hamsterbunker.stores.redis.RedisStore (tests/data/earlier/make_redis.py)",
            "prefix": PREFIX,
            "keys": dump(store._redis, store.prefix),
            "answers": answers(store),
        }
    finally:
        store.close()
    out = Path(__file__).with_name("redis.json.gz")
    data = json.dumps(fixture, indent=1, sort_keys=True).encode()
    out.write_bytes(gzip.compress(data, compresslevel=9, mtime=0))
    print(f"{out}: {len(fixture['keys'])} keys, {out.stat().st_size} bytes")


if __name__ == "__main__":
    main()
