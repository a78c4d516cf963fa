"""The reader of the earlier file store's layout (``stores.earlier.file``): over a store that
store wrote (``tests/data/earlier``), each read answers as that store's own did; junk is
refused or left out as there, and every listing is bounded; ``migrate`` from it gives a
store a node goes on from. No server is needed: every store here is a directory."""

from __future__ import annotations

import ast
import hashlib
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from hamsterbunker.core.errors import ConfigError, CorruptRecord, StoreError, UnreadableLease
from hamsterbunker.core.limits import (
    MAX_CHECKPOINT_BYTES,
    MAX_CHECKPOINTS_LISTED,
    MAX_EFFECT_BYTES,
    MAX_INBOX_COUNT,
    MAX_RECORD_BYTES,
)
from hamsterbunker.records import ClusterRecord, Heartbeat, LeaseRecord
from hamsterbunker.sealing import Sealer
from hamsterbunker.stores.base import MAX_LISTED_AGENTS, AdmissionState, Consumed, Fence
from hamsterbunker.stores.earlier import SourceStore, file_inbox
from hamsterbunker.stores.earlier import file as earlier_file
from hamsterbunker.stores.earlier.file import EarlierFileStore, open_earlier_file
from hamsterbunker.stores.layer.files import FileStore
from hamsterbunker.stores.migrate import Migrated, migrate
from tests.support.agents import SECRET
from tests.support.earlier_file import bytes_of, expected, load_earlier_file, plant
from tests.support.records import fence_of, lease

AGENTS = ["a1", "a2", "a3"]


@pytest.fixture
def url(tmp_path: Path) -> str:
    return load_earlier_file(tmp_path)


@pytest.fixture
def source(url: str) -> EarlierFileStore:
    return open_earlier_file(url)


def _root(url: str) -> Path:
    return Path(url.removeprefix("file://"))


def _admission(state: AdmissionState | None) -> list[Any] | None:
    if state is None:
        return None
    return [state.number, state.consumed, None if state.reply is None else state.reply]


def _recorded_admission(kept: list[Any] | None) -> list[Any] | None:
    return None if kept is None else [kept[0], kept[1], bytes_of(kept[2])]


# -- (a) every read, as the earlier store answered it ------------------------------------


def test_every_read_answers_as_the_earlier_store_did(source: EarlierFileStore) -> None:
    want = expected()
    assert source.read_cluster() == ClusterRecord.from_json(want["cluster"].encode())
    assert source.list_agents() == sorted(want["agents"]) == AGENTS
    for agent, was in want["agents"].items():
        assert source.read_lease(agent) == LeaseRecord.from_json(was["lease"].encode())
        beats = [Heartbeat.from_json(beat.encode()) for beat in was["heartbeats"]]
        assert source.list_heartbeats(agent) == beats
        listed = source.list_checkpoints(agent)
        assert [(i.seq, i.epoch, i.size) for i in listed] == [
            (c["seq"], c["epoch"], c["size"]) for c in was["checkpoints"]
        ]  # newest first
        for info, kept in zip(listed, was["checkpoints"], strict=True):
            assert abs(info.written - kept["written"]) < 1  # the file's mtime, archived
        digests = [hashlib.sha256(source.read_checkpoint(agent, i)).hexdigest() for i in listed]
        assert digests == was["checkpoint_sha256"]
        assert source.read_effects(agent, was["effects_step"]) == {
            (index, kind): bytes_of(data) for index, kind, data in was["effects"]
        }
        assert source.read_acceptance(agent) == bytes_of(was["acceptance"])
        for after, page in was["inbox_pages"]:
            assert source.read_inbox(agent, after) == [(n, bytes_of(b)) for n, b in page]
        assert sorted(source.request_ids(agent, 100)) == sorted(was["request_ids"])
        for request_id, kept in was["admissions"].items():
            got = _admission(source.read_admission(agent, request_id))
            assert got == _recorded_admission(kept), (agent, request_id)


def test_what_a_crash_left_is_read_as_the_earlier_store_read_it(source: EarlierFileStore) -> None:
    """a3: a consumption staged under a stored checkpoint counts as applied; an admission
    whose index was never written is found at the last admitted number."""
    assert [n for n, _ in source.read_inbox("a3")] == [2, 3]
    one = source.read_admission("a3", "r1")
    assert one is not None and one.consumed and one.reply is not None
    assert source.read_admission("a3", "r3") == AdmissionState(3, consumed=False, reply=None)
    assert sorted(source.request_ids("a3", 100)) == ["r1", "r2"]


def test_an_agent_or_record_never_written_reads_as_none_or_empty(
    source: EarlierFileStore,
) -> None:
    assert source.read_lease("a9") is None and source.read_acceptance("a9") is None
    assert source.list_heartbeats("a9") == [] and source.list_checkpoints("a9") == []
    assert source.read_effects("a9", 1) == {} and source.read_effects("a1", 0) == {}
    assert source.read_inbox("a9") == [] and source.request_ids("a9", 10) == []
    assert source.read_admission("a9", "r1") is None
    assert source.read_admission("a1", "not a request id!") is None
    assert source.read_acceptance("a3") is None
    info = source.list_checkpoints("a1")[0]
    with pytest.raises(StoreError, match="no longer retained"):
        source.read_checkpoint("a1", replace(info, seq=99))


def test_opening_what_is_not_an_earlier_file_store_is_one_readable_error(
    tmp_path: Path, url: str
) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        open_earlier_file(str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no store an earlier version wrote"):
        open_earlier_file((tmp_path / "empty").as_uri())
    FileStore(tmp_path / "new").close()
    with pytest.raises(ConfigError, match="this version's layout"):
        open_earlier_file(str(tmp_path / "new"))
    (tmp_path / "afile").write_text("x")
    with pytest.raises(ConfigError, match="not a directory"):
        open_earlier_file(str(tmp_path / "afile"))
    with pytest.raises(ConfigError, match="absolute path"):
        open_earlier_file("file://relative/dir")
    assert open_earlier_file(str(_root(url))).url == url  # a path as well as a URL


def test_the_reader_imports_nothing_of_the_earlier_stores_but_fileio_and_location() -> None:
    """So it keeps working once stores.file, stores.redis and stores.etcd are gone."""
    for module in (earlier_file, file_inbox):
        tree = ast.parse(Path(str(module.__file__)).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                name = "." * node.level + (node.module or "")
                assert not name.startswith(("..redis", "..etcd")), name
                if name.startswith("..file"):
                    assert name in ("..file.fileio", "..file.location"), name
            assert not isinstance(node, ast.Import) or all(
                "stores" not in alias.name for alias in node.names
            )


def test_reading_and_migrating_change_nothing_in_the_source(url: str, tmp_path: Path) -> None:
    before = _tree(_root(url))
    source = open_earlier_file(url)
    test_every_read_answers_as_the_earlier_store_did(source)
    _migrate(source, FileStore(tmp_path / "new"))
    assert _tree(_root(url)) == before


def _tree(root: Path) -> dict[str, tuple[int, int, int]]:
    found = {}
    for path in root.rglob("*"):
        st = path.lstat()
        found[str(path.relative_to(root))] = (st.st_mode, st.st_size, st.st_mtime_ns)
    return found


# -- (b) hostile contents ----------------------------------------------------------------


@pytest.mark.parametrize("data", [b"{not json", b"[]", b" " * (MAX_RECORD_BYTES + 1)])
def test_a_junk_or_oversize_cluster_or_lease_record_is_a_corrupt_record(
    url: str, data: bytes
) -> None:
    plant(url, "cluster.json", data)
    plant(url, "agents/a1/lease.json", data)
    source = open_earlier_file(url)
    with pytest.raises(CorruptRecord):
        source.read_cluster()
    with pytest.raises(UnreadableLease):
        source.read_lease("a1")


def test_a_symlink_or_fifo_under_a_record_name_is_not_followed_nor_waited_on(url: str) -> None:
    root = _root(url)
    (root / "agents/a1/lease.json").unlink()
    os.symlink(root / "agents/a2/lease.json", root / "agents/a1/lease.json")
    (root / "agents/a2/acceptance.json").unlink()
    os.mkfifo(root / "agents/a2/acceptance.json")
    source = open_earlier_file(url)
    with pytest.raises(UnreadableLease, match="symbolic link"):
        source.read_lease("a1")
    with pytest.raises(CorruptRecord, match="FIFO"):
        source.read_acceptance("a2")
    os.symlink(root / "agents/a2", root / "agents/linked")
    assert "linked" not in source.list_agents()
    with pytest.raises(CorruptRecord, match="not followed"):
        source.read_lease("linked")


def test_checkpoints_of_the_wrong_name_or_kind_are_left_out(url: str) -> None:
    was = [(i.seq, i.epoch) for i in open_earlier_file(url).list_checkpoints("a1")]
    for name in ("ckpt-9-3.hbc", "ckpt-00000000000000000009-0000000003.hbc.bak",
                 "ckpt-00000000000000000000-0000000003.hbc", "notes.txt"):  # fmt: skip
        plant(url, f"agents/a1/checkpoints/{name}", b"junk")
    (_root(url) / "agents/a1/checkpoints/ckpt-00000000000000000008-0000000003.hbc").mkdir()
    assert [(i.seq, i.epoch) for i in open_earlier_file(url).list_checkpoints("a1")] == was


def test_an_oversize_checkpoint_is_refused_unread(url: str) -> None:
    source = open_earlier_file(url)
    info = source.list_checkpoints("a1")[0]
    path = _root(url) / "agents/a1/checkpoints/ckpt-00000000000000000004-0000000003.hbc"
    os.truncate(path, MAX_CHECKPOINT_BYTES + 1)  # sparse: nothing is written
    with pytest.raises(CorruptRecord, match="over the limit"):
        source.read_checkpoint("a1", info)


def test_junk_heartbeats_effects_and_inbox_records_are_left_out(url: str) -> None:
    want = expected()["agents"]["a1"]
    plant(url, "agents/a1/heartbeats/n2.json", b"{junk")
    plant(url, "agents/a1/heartbeats/n3.json", Heartbeat(**{**_beat(), "node": "n9"}).to_json())
    plant(url, "agents/a1/heartbeats/bad name.json", _beat_json())
    plant(url, "agents/a1/effects/00000000000000000005/0001-outcome.hbe", b"")
    os.truncate(_root(url) / "agents/a1/effects/00000000000000000005/0001-outcome.hbe",
                MAX_EFFECT_BYTES + 1)  # fmt: skip
    plant(url, "agents/a1/effects/00000000000000000005/1-intent.hbe", b"wrong name")
    plant(url, "agents/a1/effects/00000000000000000005/0002-other.hbe", b"wrong kind")
    plant(url, "agents/a1/inbox/pending/00000000000000000008.hbs", b"not a header")
    plant(url, "agents/a1/inbox/pending/9.hbs", b"wrong name")
    plant(url, "agents/a1/inbox/ids/" + "0" * 64 + ".hbi", b"junk index")
    plant(url, "agents/a1/inbox/staged/00000000000000000004-0000000003.hbt", b"junk staged")
    source = open_earlier_file(url)
    assert [b.node for b in source.list_heartbeats("a1")] == ["n1"]
    assert list(source.read_effects("a1", 5)) == [(0, "intent")]
    assert [n for n, _ in source.read_inbox("a1")] == [5, 6, 7]
    assert sorted(source.request_ids("a1", 100)) == sorted(want["request_ids"])
    assert _admission(source.read_admission("a1", "r4")) == _recorded_admission(
        want["admissions"]["r4"]
    )


def _beat() -> dict[str, Any]:
    return {"node": "n3", "region": "eu", "host": "h", "pid": 1, "role": "standby",
            "epoch": 1, "seq": 0, "leader": None, "time": 0.0}  # fmt: skip


def _beat_json() -> bytes:
    return Heartbeat(**_beat()).to_json()


def _counting_listings(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int | None, int]]:
    """(limit asked, entries returned) of every directory listing the reader makes."""
    calls: list[tuple[int | None, int]] = []
    real = file_inbox.dir_entries  # type: ignore[attr-defined]

    def counted(fd: int, limit: int | None = None) -> list[os.DirEntry[str]]:
        entries = real(fd, limit)
        calls.append((limit, len(entries)))
        return entries

    monkeypatch.setattr(file_inbox, "dir_entries", counted)
    monkeypatch.setattr(earlier_file, "dir_entries", counted)
    return calls


def test_a_large_planted_listing_is_read_bounded(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past what the earlier store could have written, a listing the migration needs whole
    (checkpoints, pending submissions) is refused; agents are listed to their bound."""
    root = _root(url)
    for n in range(MAX_CHECKPOINTS_LISTED + 1):
        (root / f"agents/a1/checkpoints/junk-{n}").touch()
    for n in range(4 * MAX_INBOX_COUNT + 1):
        (root / f"agents/a2/inbox/pending/junk-{n}").touch()
    for n in range(4 * MAX_LISTED_AGENTS + 10):
        (root / f"agents/z{n:05d}").mkdir()
    calls = _counting_listings(monkeypatch)
    source = open_earlier_file(url)
    with pytest.raises(StoreError, match=f"over {MAX_CHECKPOINTS_LISTED} entries"):
        source.list_checkpoints("a1")
    with pytest.raises(StoreError, match=f"over {4 * MAX_INBOX_COUNT} entries"):
        source.read_inbox("a2")
    assert len(source.list_agents()) == MAX_LISTED_AGENTS
    assert calls and all(limit is not None and got <= limit for limit, got in calls)
    # Never more than the largest bound (checkpoints'), one entry past it to see the excess.
    assert max(got for _, got in calls) == MAX_CHECKPOINTS_LISTED + 1


# -- (c), (d) migrate from the reader ----------------------------------------------------


def _migrate(source: SourceStore, target: FileStore, **kwargs: Any) -> Migrated:
    cluster = source.read_cluster()
    assert cluster is not None
    said: list[str] = []
    kwargs.setdefault("pause", lambda _s: None)
    return migrate(source, target, Sealer(SECRET, cluster), say=said.append, **kwargs)


def test_migrate_copies_everything_the_earlier_store_held(
    source: EarlierFileStore, tmp_path: Path
) -> None:
    target = FileStore(tmp_path / "new")
    _migrate(source, target)
    want = expected()
    assert target.read_cluster() == ClusterRecord.from_json(want["cluster"].encode())
    assert sorted(target.list_agents()) == AGENTS
    for agent, was in want["agents"].items():
        now = target.read_lease(agent)
        assert now is not None
        assert replace(now, version=0) == replace(
            LeaseRecord.from_json(was["lease"].encode()), version=0
        )
        listed = target.list_checkpoints(agent)
        assert [(i.seq, i.epoch, i.size) for i in listed] == [
            (c["seq"], c["epoch"], c["size"]) for c in was["checkpoints"]
        ]
        digests = [hashlib.sha256(target.read_checkpoint(agent, i)).hexdigest() for i in listed]
        assert digests == was["checkpoint_sha256"]
        assert target.read_effects(agent, was["effects_step"]) == {
            (index, kind): bytes_of(data) for index, kind, data in was["effects"]
        }
        assert target.read_acceptance(agent) == bytes_of(was["acceptance"])
        pending = [(n, bytes_of(b)) for n, b in was["inbox_pages"][0][1]]
        assert target.read_inbox(agent) == [(n, b) for n, b in pending if n != 7 or agent != "a1"]
        for request_id, kept in was["admissions"].items():
            if request_id != "junk":
                got = _admission(target.read_admission(agent, request_id))
                assert got == _recorded_admission(kept), (agent, request_id)
        assert target.list_heartbeats(agent) == []


def test_a_node_goes_on_from_the_migrated_store(source: EarlierFileStore, tmp_path: Path) -> None:
    """The lease's epoch and the newest checkpoint are the source's; the next term fences the
    earlier one out and publishes on top."""
    target = FileStore(tmp_path / "new")
    _migrate(source, target)
    cluster = target.read_cluster()
    assert cluster is not None
    for agent in ("a1", "a2"):
        was, held = source.read_lease(agent), target.read_lease(agent)
        assert was is not None and held is not None and held.epoch == was.epoch == 3
        newest = target.list_checkpoints(agent)[0]
        assert (newest.seq, newest.epoch) == (
            source.list_checkpoints(agent)[0].seq,
            source.list_checkpoints(agent)[0].epoch,
        )
        fence = fence_of(target.cas_lease(agent, held.version, lease("n2", 4, session="s4")))
        with pytest.raises(StoreError):
            target.put_checkpoint(agent, Fence("n1", "s3", 3), newest.seq + 1, b"zombie")
        reply = Sealer(SECRET, cluster).seal_reply(agent, 5, "r5", {"done": 5})
        target.put_checkpoint(
            agent, fence, newest.seq + 1, b"next", consumed=[Consumed(5, "r5", reply)]
        )
        assert target.list_checkpoints(agent)[0].seq == newest.seq + 1
        assert [n for n, _ in target.read_inbox(agent)] == [6]
    assert target.admit("a3", "r3", 4, b"x") == (3, True)  # the unindexed admission is known


def test_the_junk_submission_is_left_out_and_said(source: EarlierFileStore, tmp_path: Path) -> None:
    target = FileStore(tmp_path / "new")
    migrated = _migrate(source, target)
    assert [line for line in migrated.left_out if line.startswith("agent a1: submission #7")]
    assert all("#7" in line for line in migrated.left_out), migrated.left_out
    assert [n for n, _ in target.read_inbox("a1")] == [5, 6]
    assert target.read_admission("a1", "junk") is None


def test_a_source_that_changes_during_the_migration_is_refused(url: str, tmp_path: Path) -> None:
    """A heartbeat planted while the source is watched: a node is running."""
    beat = Heartbeat.from_json((_root(url) / "agents/a1/heartbeats/n1.json").read_bytes())
    target = FileStore(tmp_path / "new")

    def beating(_s: float) -> None:
        plant(url, "agents/a1/heartbeats/n1.json", replace(beat, beats=beat.beats + 1).to_json())

    with pytest.raises(StoreError, match="stop every node first"):
        _migrate(open_earlier_file(url), target, pause=beating)
    assert target.read_cluster() is None
