"""A node's memory of a store across its own restarts (``hamsterbunker.lease.memory``)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from hamsterbunker.core.errors import ConfigError
from hamsterbunker.core.limits import STALE_TEMP_AGE_S
from hamsterbunker.core.reach import Reach
from hamsterbunker.lease.memory import Memory, MemoryFile
from hamsterbunker.records import MAX_CONTROL_CHARS
from hamsterbunker.sealing import new_cluster_record
from tests.support.io_probes import record_fsyncs

URL = "redis://127.0.0.1:6379/0?prefix=p"


def test_what_was_saved_is_loaded_by_the_next_process(tmp_path: Path) -> None:
    cluster = new_cluster_record("a secret of the cluster")
    MemoryFile(tmp_path, URL, "journal").save(Memory(epoch=7, reach=Reach(42, 6), cluster=cluster))
    assert MemoryFile(tmp_path, URL, "journal").load() == Memory(7, Reach(42, 6), cluster)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp left


def test_nothing_saved_is_nothing_remembered(tmp_path: Path) -> None:
    assert MemoryFile(tmp_path / "missing", URL, "journal").load() == Memory()


def test_each_store_and_agent_has_its_own_memory(tmp_path: Path) -> None:
    MemoryFile(tmp_path, URL, "journal").save(Memory(epoch=3, reach=Reach(9, 3)))
    assert MemoryFile(tmp_path, URL + "x", "journal").load() == Memory()
    assert MemoryFile(tmp_path, URL, "other").load() == Memory()


def test_only_a_new_epoch_or_a_forced_save_is_written_at_once(tmp_path: Path) -> None:
    """The reach moves with every renewal a standby reads: it is written at most every
    REACH_SAVE_INTERVAL_S (or when forced, on stop); a new epoch at once, never in place."""
    memory = MemoryFile(tmp_path, URL, "journal")
    memory.save(Memory(epoch=1, reach=Reach(1, 1)))
    inode = memory.path.stat().st_ino
    memory.save(Memory(epoch=1, reach=Reach(2, 1)))
    assert memory.path.stat().st_ino == inode  # the reach alone: not yet
    memory.save(Memory(epoch=2, reach=Reach(2, 1)))
    assert memory.path.stat().st_ino != inode  # replaced, never written in place
    memory.save(Memory(epoch=2, reach=Reach(3, 2)), force=True)
    assert MemoryFile(tmp_path, URL, "journal").load() == Memory(2, Reach(3, 2))


def test_an_operators_request_is_kept_at_once_and_loaded_by_the_next_process(
    tmp_path: Path,
) -> None:
    """A new control request seen is written at once (like a new epoch), not when the reach
    would be, and the next process loads it as it was signed."""
    memory = MemoryFile(tmp_path, URL, "journal")
    memory.save(Memory(epoch=1, reach=Reach(1, 1)))
    inode = memory.path.stat().st_ino
    memory.save(Memory(epoch=1, reach=Reach(1, 1), control="the signed resume"))
    assert memory.path.stat().st_ino != inode
    loaded = MemoryFile(tmp_path, URL, "journal").load()
    assert loaded == Memory(1, Reach(1, 1), control="the signed resume")


def test_a_memory_saved_before_requests_were_kept_loads_with_none(tmp_path: Path) -> None:
    """A memory file without the control field (saved by an older version) still loads."""
    memory = MemoryFile(tmp_path, URL, "journal")
    memory.save(Memory(epoch=4, reach=Reach(8, 4)))
    doc = json.loads(memory.path.read_text())
    del doc["control"]
    memory.path.write_text(json.dumps(doc))
    assert MemoryFile(tmp_path, URL, "journal").load() == Memory(4, Reach(8, 4))


@pytest.mark.parametrize(
    "damage",
    [
        lambda doc: "{not json",
        lambda doc: json.dumps({**doc, "format": 99}),
        lambda doc: json.dumps({**doc, "seq": -1}),
        lambda doc: json.dumps({**doc, "epoch": True}),
        lambda doc: json.dumps({**doc, "cluster": '{"format": 1}'}),
        lambda doc: json.dumps({k: v for k, v in doc.items() if k != "epoch"}),
        lambda doc: json.dumps({**doc, "control": {"paused": True}}),
        lambda doc: json.dumps({**doc, "control": "x" * (MAX_CONTROL_CHARS + 1)}),
    ],
    ids=["not-json", "format", "negative", "bool", "cluster", "missing", "control", "long"],
)
def test_a_damaged_memory_is_a_clear_error_naming_the_file(tmp_path: Path, damage) -> None:
    memory = MemoryFile(tmp_path, URL, "journal")
    memory.save(
        Memory(epoch=2, reach=Reach(5, 2), cluster=new_cluster_record("a secret of the cluster"))
    )
    memory.path.write_text(damage(json.loads(memory.path.read_text())))
    with pytest.raises(ConfigError, match="damaged") as caught:
        memory.load()
    assert str(memory.path) in str(caught.value) and "remove it" in str(caught.value)


def test_old_temporary_memory_files_are_swept_when_the_memory_loads(tmp_path: Path) -> None:
    memory = MemoryFile(tmp_path, URL, "journal")
    memory.save(Memory(epoch=1))
    old, recent = tmp_path / ".memory-old", tmp_path / ".memory-recent"
    for path, age in ((old, STALE_TEMP_AGE_S + 60), (recent, 1.0)):
        path.write_text("{")
        os.utime(path, (time.time() - age, time.time() - age))
    assert MemoryFile(tmp_path, URL, "journal").load() == Memory(epoch=1)
    assert not old.exists() and recent.exists()


@pytest.mark.skipif(not Path("/proc/self/fd").exists(), reason="needs /proc/self/fd (Linux)")
def test_the_memory_files_directory_is_fsynced_after_its_rename(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced = record_fsyncs(monkeypatch)
    MemoryFile(tmp_path / "state", URL, "journal").save(Memory(epoch=1))
    assert str((tmp_path / "state").resolve()) in synced
