"""hb migrate-store: an earlier version's store (file, Redis, etcd) copied into this version's
layout, on every backend; what the copy holds is what the source held, a node can go on
from it, a running node or a target in use refuses, and a copy cut short runs again."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hamsterbunker.errors import ConfigError, StoreError
from hamsterbunker.records import Heartbeat
from hamsterbunker.sealing import Sealer, new_cluster_record
from hamsterbunker.stores import Fence
from hamsterbunker.stores.backend import Txn, TxnResult
from hamsterbunker.stores.base import Consumed, Store
from hamsterbunker.stores.layer import RecordStore
from hamsterbunker.stores.migrate import SourceStore, migrate, open_migration
from tests.support.agents import SECRET
from tests.support.cli import hb_env, run_hb
from tests.support.records import fence_of, lease

AGENTS = ("a1", "a2")
KEEP_REPLIES = 3  # the earlier stores' default keeps 10,000: a small one prunes here


def _urls(kind: str, tmp_path: Path) -> tuple[str, str]:
    """(an earlier store's URL, an empty store's URL of the same kind)."""
    if kind == "file":
        return (tmp_path / "earlier").as_uri(), (tmp_path / "new").as_uri()
    if kind == "redis":
        from tests.support.redis_server import redis_url

        return redis_url(), redis_url()  # two prefixes
    if kind == "etcd":
        from tests.support.etcd_server import etcd_url

        return etcd_url(), etcd_url()
    from tests.support.postgres_server import postgres_url

    return (tmp_path / "earlier").as_uri(), postgres_url()


KINDS = ["file", "redis", "etcd", "file-to-postgres"]


@pytest.fixture(params=KINDS)
def stores(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[SourceStore, RecordStore]]:
    source_url, target_url = _urls(request.param, tmp_path)
    if source_url.startswith("file:"):
        (tmp_path / "earlier").mkdir()
    source = _earlier(source_url)
    source.create_cluster(new_cluster_record(SECRET))
    source.close()
    opened = open_migration(source_url, target_url)
    yield opened
    for store in opened:
        store.close()


def _earlier(url: str) -> SourceStore:
    """An earlier version's store, as that version opened it, keeping few replies."""
    if url.startswith("redis"):
        from hamsterbunker.stores.redis import RedisStore

        return RedisStore(url, keep_replies=KEEP_REPLIES)
    if url.startswith("etcd"):
        from hamsterbunker.stores.etcd import EtcdStore

        return EtcdStore(url, keep_replies=KEEP_REPLIES)
    from hamsterbunker.stores import file_store_path
    from hamsterbunker.stores.file import FileStore

    return FileStore(file_store_path(url), keep_replies=KEEP_REPLIES)


def _history(source: Store, sealer: Sealer, agent: str) -> Fence:
    """What a node of the earlier version left: a lease at epoch 3, four checkpoints (one
    under epoch 2), consumed submissions (one pruned, one without a reply), two pending,
    a journaled effect of the step in flight, a loss acceptance, a heartbeat."""
    old = fence_of(source.cas_lease(agent, None, lease("n0", 2)))
    now = time.time()

    def submit(n: int) -> bytes:
        blob = sealer.seal_submission(agent, n, f"r{n}", {"n": n}, now)
        assert source.admit(agent, f"r{n}", n, blob) == (n, False)
        return blob

    def reply(n: int) -> bytes:
        return sealer.seal_reply(agent, n, f"r{n}", {"done": n})

    for n in range(1, 7):
        submit(n)
    source.put_checkpoint(agent, old, 1, b"state 1", consumed=[Consumed(1, "r1", reply(1))])
    held = source.read_lease(agent)
    assert held is not None
    fence = fence_of(source.cas_lease(agent, held.version, lease("n1", 3, session="s3")))
    source.put_checkpoint(agent, fence, 2, b"state 2", consumed=[Consumed(2, "r2", None)])
    source.put_checkpoint(agent, fence, 3, b"state 3", consumed=[Consumed(3, "r3", reply(3))])
    source.put_checkpoint(agent, fence, 4, b"state 4", consumed=[Consumed(4, "r4", reply(4))])
    source.put_effect(agent, fence, 5, 0, "intent", b"sealed intent")
    source.put_acceptance(agent, b'{"accepted": "as it was"}')
    source.put_heartbeat(agent, _beat(1))
    return fence


def _beat(beats: int) -> Heartbeat:
    return Heartbeat(
        node="n1", region="eu", host="h", pid=1, role="active", epoch=3, seq=4, leader="n1",
        time=0.0, beats=beats,
    )  # fmt: skip


def _copy(source: SourceStore, target: RecordStore, **kwargs: object) -> list[str]:
    cluster = source.read_cluster()
    assert cluster is not None
    said: list[str] = []
    migrate(
        source, target, Sealer(SECRET, cluster), say=said.append, pause=lambda _s: None, **kwargs
    )  # type: ignore[arg-type]
    return said


def test_the_copy_holds_what_the_earlier_store_held(
    stores: tuple[SourceStore, RecordStore],
) -> None:
    source, target = stores
    cluster = source.read_cluster()
    assert cluster is not None
    sealer = Sealer(SECRET, cluster)
    for agent in AGENTS:
        _history(source, sealer, agent)
    said = _copy(source, target)
    assert any("4 checkpoint(s)" in line and "2 pending" in line for line in said), said
    assert target.read_cluster() == cluster
    assert sorted(target.list_agents()) == sorted(AGENTS)
    for agent in AGENTS:
        was, now = source.read_lease(agent), target.read_lease(agent)
        assert was is not None and now is not None
        assert (now.holder, now.session, now.epoch, now.proof) == (
            was.holder,
            was.session,
            3,
            was.proof,
        )
        listed = source.list_checkpoints(agent)
        assert [(i.seq, i.epoch, i.size) for i in target.list_checkpoints(agent)] == [
            (i.seq, i.epoch, i.size) for i in listed
        ]
        for info in listed:
            assert target.read_checkpoint(agent, info) == source.read_checkpoint(agent, info)
        assert target.read_effects(agent, 5) == source.read_effects(agent, 5)
        assert target.read_acceptance(agent) == source.read_acceptance(agent)
        assert target.read_inbox(agent) == source.read_inbox(agent)
        for n in range(1, 7):
            assert target.read_admission(agent, f"r{n}") == source.read_admission(agent, f"r{n}")
        assert target.list_heartbeats(agent) == []  # the old nodes' records stay behind


def test_a_node_goes_on_from_the_copy(stores: tuple[SourceStore, RecordStore]) -> None:
    """The next number, duplicates known, the lease's epoch counted on, a consumption."""
    source, target = stores
    cluster = source.read_cluster()
    assert cluster is not None
    sealer = Sealer(SECRET, cluster)
    _history(source, sealer, "a1")
    _copy(source, target)
    seven = sealer.seal_submission("a1", 7, "r7", {"n": 7}, time.time())
    assert target.admit("a1", "r7", 7, seven) == (7, False)
    assert target.admit("a1", "r5", 8, seven) == (5, True)  # pending: known
    assert target.admit("a1", "r2", 8, seven) == (2, True)  # consumed without a reply: known
    held = target.read_lease("a1")
    assert held is not None
    fence = fence_of(target.cas_lease("a1", held.version, lease("n2", 4, session="s4")))
    with pytest.raises(StoreError):  # the earlier term is fenced out, as on the source
        target.put_checkpoint("a1", Fence("n1", "s3", 3), 5, b"zombie")
    reply = sealer.seal_reply("a1", 5, "r5", {"done": 5})
    target.put_checkpoint("a1", fence, 5, b"state 5", consumed=[Consumed(5, "r5", reply)])
    assert [n for n, _ in target.read_inbox("a1")] == [6, 7]
    state = target.read_admission("a1", "r5")
    assert state is not None and state.consumed and state.reply == reply


def test_a_running_node_refuses_the_migration(stores: tuple[SourceStore, RecordStore]) -> None:
    """A heartbeat written while the source is watched: refused, and the target holds no
    cluster (no node would start on it)."""
    source, target = stores
    cluster = source.read_cluster()
    assert cluster is not None
    _history(source, Sealer(SECRET, cluster), "a1")

    def beating(_s: float) -> None:
        source.put_heartbeat("a1", _beat(2))

    with pytest.raises(StoreError, match="stop every node first"):
        migrate(source, target, Sealer(SECRET, cluster), say=lambda _l: None, pause=beating)
    assert target.read_cluster() is None


def test_a_target_in_use_or_the_source_itself_is_refused(tmp_path: Path) -> None:
    earlier = (tmp_path / "earlier").as_uri()
    (tmp_path / "earlier").mkdir()
    with pytest.raises(ConfigError, match="another store"):
        open_migration(earlier, earlier)
    source = _earlier(earlier)
    source.create_cluster(new_cluster_record(SECRET))
    used = RecordStore(_file_backend(tmp_path / "used"))
    used.create_cluster(new_cluster_record(SECRET))
    cluster = source.read_cluster()
    assert cluster is not None
    with pytest.raises(ConfigError, match="holds a cluster already"):
        migrate(source, used, Sealer(SECRET, cluster), say=lambda _l: None, pause=lambda _s: None)


def _file_backend(path: Path) -> object:
    from hamsterbunker.stores.backends.file import FileBackend

    return FileBackend(path)


class _Failing:
    """A backend whose commits fail from the n-th on (a migration killed midway)."""

    def __init__(self, backend: object, after: int) -> None:
        self._backend, self._left = backend, after

    def commit(self, txn: Txn) -> TxnResult:
        self._left -= 1
        if self._left < 0:
            raise StoreError("killed")
        return self._backend.commit(txn)  # type: ignore[attr-defined,no-any-return]

    def __getattr__(self, name: str) -> object:
        return getattr(self._backend, name)


@pytest.mark.parametrize("after", [0, 1, 2, 3])
def test_a_copy_cut_short_leaves_no_cluster_and_runs_again(tmp_path: Path, after: int) -> None:
    (tmp_path / "earlier").mkdir()
    source = _earlier((tmp_path / "earlier").as_uri())
    cluster = source.create_cluster(new_cluster_record(SECRET))
    sealer = Sealer(SECRET, cluster)
    for agent in AGENTS:
        _history(source, sealer, agent)
    backend = _file_backend(tmp_path / "new")
    cut = RecordStore(_Failing(backend, after))  # type: ignore[arg-type]
    with pytest.raises(StoreError, match="killed"):
        _copy(source, cut)
    again = RecordStore(_file_backend(tmp_path / "new"))  # type: ignore[arg-type]
    assert again.read_cluster() is None
    _copy(source, again)
    assert again.read_cluster() == cluster
    for agent in AGENTS:
        assert again.read_inbox(agent) == source.read_inbox(agent)
        for n in range(1, 7):
            assert again.read_admission(agent, f"r{n}") == source.read_admission(agent, f"r{n}")


def test_a_submission_that_does_not_open_is_left_out_and_said(tmp_path: Path) -> None:
    (tmp_path / "earlier").mkdir()
    source = _earlier((tmp_path / "earlier").as_uri())
    cluster = source.create_cluster(new_cluster_record(SECRET))
    source.admit("a1", "planted", 1, b"not sealed")
    target = RecordStore(_file_backend(tmp_path / "new"))  # type: ignore[arg-type]
    migrated = migrate(
        source, target, Sealer(SECRET, cluster), say=lambda _l: None, pause=lambda _s: None
    )
    assert [line for line in migrated.left_out if "submission #1" in line]
    assert target.read_inbox("a1") == []


def test_the_command_line(tmp_path: Path) -> None:
    """hb migrate-store copies; a bad URL or the wrong secret is a usage mistake, exit 2."""
    (tmp_path / "earlier").mkdir()
    source = _earlier((tmp_path / "earlier").as_uri())
    cluster = source.create_cluster(new_cluster_record(SECRET))
    _history(source, Sealer(SECRET, cluster), "a1")
    source.close()
    earlier, new = (tmp_path / "earlier").as_uri(), (tmp_path / "new").as_uri()
    args = ["migrate-store", "--from", earlier, "--to", new]
    wrong = run_hb(args, env=hb_env(HB_SECRET="not the secret at all"))
    assert wrong.returncode == 2 and "Traceback" not in wrong.stderr
    bad = run_hb(["migrate-store", "--from", "ftp://x", "--to", new], env=hb_env(HB_SECRET=SECRET))
    assert bad.returncode == 2 and "only file://" in bad.stderr
    done = run_hb(args, env=hb_env(HB_SECRET=SECRET))
    assert done.returncode == 0, done.stderr
    assert "migrated 1 agent(s)" in done.stdout
    again = run_hb(args, env=hb_env(HB_SECRET=SECRET))
    assert again.returncode == 2 and "holds a cluster already" in again.stderr
