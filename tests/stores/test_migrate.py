"""hb migrate-store: a store an earlier version wrote (file, Redis, etcd; the fixtures of
tests/data/earlier, written by that version) copied into this version's layout, on every
backend; what the copy holds is what the source held, a node can go on from it, a target
in use refuses, and a copy cut short runs again. Each earlier layout's reader is tested on
its own in tests/stores/earlier (a running node refused there, on each)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hamsterbunker.core.errors import ConfigError, StoreError
from hamsterbunker.sealing import Sealer, new_cluster_record
from hamsterbunker.stores import Fence
from hamsterbunker.stores.backend import Txn, TxnResult
from hamsterbunker.stores.base import Consumed
from hamsterbunker.stores.earlier import SourceStore
from hamsterbunker.stores.earlier.file import open_earlier_file
from hamsterbunker.stores.layer import RecordStore
from hamsterbunker.stores.migrate import migrate, open_migration
from tests.support.agents import SECRET
from tests.support.cli import hb_env, run_hb
from tests.support.earlier_file import load_earlier_file
from tests.support.records import fence_of, lease

AGENTS = ("a1", "a2")  # the history tests/data/earlier/make_*.py wrote, in every fixture
JUNK = {("a1", 7)}  # the fixtures' submission whose bytes do not open: never copied


def _openable(source: SourceStore, agent: str) -> list[tuple[int, bytes]]:
    """The source's pending submissions that a copy keeps."""
    return [entry for entry in source.read_inbox(agent) if (agent, entry[0]) not in JUNK]


def _urls(kind: str, tmp_path: Path) -> tuple[str, str]:
    """(a loaded earlier store's URL, an empty store's URL of the same kind)."""
    if kind == "redis":
        from tests.support.earlier_redis import load_earlier_redis
        from tests.support.redis_server import redis_url

        return load_earlier_redis().url, redis_url()
    if kind == "etcd":
        from tests.support.earlier_etcd import load_earlier_etcd
        from tests.support.etcd_server import etcd_url

        return load_earlier_etcd(), etcd_url()
    if kind == "file":
        return load_earlier_file(tmp_path), (tmp_path / "new").as_uri()
    from tests.support.postgres_server import postgres_url

    return load_earlier_file(tmp_path), postgres_url()


KINDS = ["file", "redis", "etcd", "file-to-postgres"]


@pytest.fixture(params=KINDS)
def stores(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[SourceStore, RecordStore]]:
    opened = open_migration(*_urls(request.param, tmp_path))
    yield opened
    for store in opened:
        store.close()


def _copy(source: SourceStore, target: RecordStore) -> list[str]:
    cluster = source.read_cluster()
    assert cluster is not None
    said: list[str] = []
    migrate(source, target, Sealer(SECRET, cluster), say=said.append, pause=lambda _s: None)
    return said


def test_the_copy_holds_what_the_earlier_store_held(
    stores: tuple[SourceStore, RecordStore],
) -> None:
    source, target = stores
    cluster = source.read_cluster()
    said = _copy(source, target)
    assert any("4 checkpoint(s)" in line and "2 pending" in line for line in said), said
    assert cluster is not None and target.read_cluster() == cluster
    assert sorted(target.list_agents()) == sorted(source.list_agents())
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
        assert target.read_inbox(agent) == _openable(source, agent)
        for n in range(1, 7):
            assert target.read_admission(agent, f"r{n}") == source.read_admission(agent, f"r{n}")
        assert target.list_heartbeats(agent) == []  # the old nodes' records stay behind


def test_a_node_goes_on_from_the_copy(stores: tuple[SourceStore, RecordStore]) -> None:
    """The next number, duplicates known, the lease's epoch counted on, a consumption."""
    source, target = stores
    cluster = source.read_cluster()
    assert cluster is not None
    sealer = Sealer(SECRET, cluster)
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


def test_a_target_in_use_or_the_source_itself_is_refused(tmp_path: Path) -> None:
    earlier = load_earlier_file(tmp_path)
    with pytest.raises(ConfigError, match="another store"):
        open_migration(earlier, earlier)
    source = open_earlier_file(earlier)
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
    source = open_earlier_file(load_earlier_file(tmp_path))
    cluster = source.read_cluster()
    backend = _file_backend(tmp_path / "new")
    cut = RecordStore(_Failing(backend, after))  # type: ignore[arg-type]
    with pytest.raises(StoreError, match="killed"):
        _copy(source, cut)
    again = RecordStore(_file_backend(tmp_path / "new"))  # type: ignore[arg-type]
    assert again.read_cluster() is None
    _copy(source, again)
    assert cluster is not None and again.read_cluster() == cluster
    for agent in AGENTS:
        assert again.read_inbox(agent) == _openable(source, agent)
        for n in range(1, 7):
            assert again.read_admission(agent, f"r{n}") == source.read_admission(agent, f"r{n}")


def test_a_submission_that_does_not_open_is_left_out_and_said(tmp_path: Path) -> None:
    """The fixtures' submission #7 of a1 is junk: left out, said, the rest copied."""
    source = open_earlier_file(load_earlier_file(tmp_path))
    cluster = source.read_cluster()
    assert cluster is not None
    target = RecordStore(_file_backend(tmp_path / "new"))  # type: ignore[arg-type]
    migrated = migrate(
        source, target, Sealer(SECRET, cluster), say=lambda _l: None, pause=lambda _s: None
    )
    assert [line for line in migrated.left_out if "a1: submission #7" in line]
    assert [n for n, _ in target.read_inbox("a1")] == [5, 6]


def test_the_command_line(tmp_path: Path) -> None:
    """hb migrate-store copies; a bad URL or the wrong secret is a usage mistake, exit 2."""
    earlier, new = load_earlier_file(tmp_path), (tmp_path / "new").as_uri()
    source = open_earlier_file(earlier)
    agents = len(source.list_agents())
    source.close()
    args = ["migrate-store", "--from", earlier, "--to", new]
    wrong = run_hb(args, env=hb_env(HB_SECRET="not the secret at all"))
    assert wrong.returncode == 2 and "Traceback" not in wrong.stderr
    bad = run_hb(["migrate-store", "--from", "ftp://x", "--to", new], env=hb_env(HB_SECRET=SECRET))
    assert bad.returncode == 2 and "only file://" in bad.stderr
    done = run_hb(args, env=hb_env(HB_SECRET=SECRET))
    assert done.returncode == 0, done.stderr
    assert f"migrated {agents} agent(s)" in done.stdout
    again = run_hb(args, env=hb_env(HB_SECRET=SECRET))
    assert again.returncode == 2 and "holds a cluster already" in again.stderr
