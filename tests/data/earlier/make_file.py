"""Make ``file.tar.gz`` and ``file.json`` here: a store the earlier file store wrote, and
what that store's own reads answered over it (``tests/support/earlier_file.py`` loads both).

Needs a checkout that still has the earlier file store, ``hamsterbunker/stores/file/``
(commit d8bcd4e, say). Run it there from the repository's root::

    python tests/data/earlier/make_file.py

What the store holds: the cluster record; for agents a1 and a2 the history of
``tests/stores/test_migrate.py`` (``_history``, keeping 3 replies so one is pruned); for
a1 a pending submission whose sealed bytes do not open; for a2 a checkpoint above 1 MiB;
for a3 what crashes left: a checkpoint whose consumption is staged but not applied,
and an admission cut short before its request id was indexed.
"""

from __future__ import annotations

import base64
import hashlib
import json
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))  # the repository's root: tests and hamsterbunker

from hamsterbunker.records import CheckpointInfo  # noqa: E402
from hamsterbunker.sealing import Sealer, new_cluster_record  # noqa: E402
from hamsterbunker.stores.base import Consumed  # noqa: E402
from hamsterbunker.stores.file import FileStore  # noqa: E402
from hamsterbunker.stores.file.inbox import InboxFiles  # noqa: E402
from tests.stores.test_migrate import KEEP_REPLIES, _history  # noqa: E402
from tests.support.agents import SECRET  # noqa: E402
from tests.support.records import fence_of, lease  # noqa: E402

BIG = 1024 * 1024 + 4099  # above 1 MiB: a migration commits it alone


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode()


def _write(store: FileStore, sealer: Sealer) -> None:
    for agent in ("a1", "a2"):
        fence = _history(store, sealer, agent)
        if agent == "a1":
            assert store.admit(agent, "junk", 7, b"not a sealed submission") == (7, False)
        else:
            big = (b"a repeating pattern, not ciphertext " * (BIG // 36 + 1))[:BIG]
            store.put_checkpoint(agent, fence, 5, big)
    fence = fence_of(store.cas_lease("a3", None, lease("n0", 1)))
    blobs = {n: sealer.seal_submission("a3", n, f"r{n}", {"n": n}, time.time()) for n in (1, 2, 3)}
    for n, blob in blobs.items():
        store.admit("a3", f"r{n}", n, blob)
    # An admission cut short before its index (failpoint inbox.admit.after_entry).
    ids = store.root / "agents" / "a3" / "inbox" / "ids"
    (ids / (hashlib.sha256(b"r3").hexdigest() + ".hbi")).unlink()
    # A checkpoint made durable, its consumption staged and never applied (failpoint
    # inbox.commit.after_checkpoint).
    applying = InboxFiles.apply
    InboxFiles.apply = lambda *_args: None  # type: ignore[method-assign]
    try:
        reply = sealer.seal_reply("a3", 1, "r1", {"done": 1})
        store.put_checkpoint("a3", fence, 1, b"state 1", consumed=[Consumed(1, "r1", reply)])
    finally:
        InboxFiles.apply = applying  # type: ignore[method-assign]


def _answers(store: FileStore) -> dict[str, Any]:
    """What the earlier store's reads answered, JSON-able."""
    cluster = store.read_cluster()
    assert cluster is not None
    agents: dict[str, Any] = {}
    for agent in store.list_agents():
        held = store.read_lease(agent)
        listed = store.list_checkpoints(agent)
        step = listed[0].seq + 1 if listed else 1
        pages, after = [], 0
        while page := store.read_inbox(agent, after):
            pages.append([after, [[n, _b64(blob)] for n, blob in page]])
            after = page[-1][0]
        pages.append([after, []])
        ids = store.request_ids(agent, 100)
        asked = sorted({*ids, "junk", *(f"r{n}" for n in range(1, 8))})
        admissions = {}
        for request_id in asked:
            state = store.read_admission(agent, request_id)
            admissions[request_id] = state and [state.number, state.consumed, _b64(state.reply)]
        agents[agent] = {
            "lease": None if held is None else held.to_json().decode(),
            "heartbeats": [beat.to_json().decode() for beat in store.list_heartbeats(agent)],
            "checkpoints": [json.loads(info.to_json()) for info in listed],
            "checkpoint_sha256": [_digest(store, agent, info) for info in listed],
            "effects_step": step,
            "effects": [
                [i, k, _b64(v)] for (i, k), v in sorted(store.read_effects(agent, step).items())
            ],
            "acceptance": _b64(store.read_acceptance(agent)),
            "inbox_pages": pages,
            "request_ids": ids,
            "admissions": admissions,
        }
    return {
        "where_loaded": {
            "checkpoints.written": "the file's mtime, which the archive keeps (to the second)",
            "request_ids": "in the directory's own order: compared as a set",
        },
        "cluster": cluster.to_json().decode(),
        "agents": agents,
    }


def _digest(store: FileStore, agent: str, info: CheckpointInfo) -> str:
    return hashlib.sha256(store.read_checkpoint(agent, info)).hexdigest()


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "store"
        store = FileStore(root, keep_replies=KEEP_REPLIES)
        cluster = store.create_cluster(new_cluster_record(SECRET))
        _write(store, Sealer(SECRET, cluster))
        answers = _answers(store)
        with tarfile.open(HERE / "file.tar.gz", "w:gz", format=tarfile.PAX_FORMAT) as archive:
            for path in sorted(root.rglob("*")):
                archive.add(path, arcname=str(path.relative_to(root)), recursive=False)
    (HERE / "file.json").write_text(json.dumps(answers, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
