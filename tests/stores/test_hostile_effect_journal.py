"""Hostile contents in the effect journal (DESIGN.md invariants 8 and 10).

Someone who can write the store but lacks the secret may put anything under
the journal's names. read_effects returns whatever bytes sit under a valid
name (the caller authenticates each record) and logs and leaves out the rest:
names that do not parse, numbers or kinds out of bounds, records over
MAX_EFFECT_BYTES, more indices than a step may have. The first part runs on
every backend (``raw_store.backend_store``: file, Redis, etcd); the second
plants what only a directory can hold (symlinks, FIFOs, folders, permissions) under
the journal's keys in the file store (``ROOT/kv/``; ``tests/stores/backend/
test_file_backend.py`` plants floods of names below the record layer): read_effects
never hangs or reads past its bounds, and put_checkpoint still succeeds.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hamsterbunker.core.errors import StoreError
from hamsterbunker.core.limits import MAX_EFFECT_BYTES, MAX_EFFECTS_PER_STEP
from hamsterbunker.stores import open_store
from hamsterbunker.stores.base import Fence
from hamsterbunker.stores.interface import Store
from hamsterbunker.stores.layer.files import FileStore
from hamsterbunker.stores.layer.keys import AgentKeys
from tests.support.io_probes import bytes_read_by_this_process, record_fsyncs
from tests.support.raw_store import RawStore, backend_store, file_key
from tests.support.records import fence_of, lease

__all__ = ["backend_store"]  # the fixture, used by name

pytestmark = pytest.mark.timeout(60)  # a FIFO or /dev/zero read would otherwise hang

AGENT = "a"
KEYS = AgentKeys(AGENT)
SEQ = 5


def held(store: Store) -> Fence:
    return fence_of(store.cas_lease(AGENT, None, lease("n1", 1)))


def warnings_logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if record.levelno >= logging.WARNING and record.name.startswith("hamsterbunker.stores")
    ]


@pytest.fixture
def store(backend_store: RawStore) -> Iterator[Store]:
    opened = open_store(backend_store.url)
    try:
        yield opened
    finally:
        opened.close()


# -- every backend ------------------------------------------------------------------


def test_junk_bytes_under_a_valid_name_are_returned_for_the_caller_to_authenticate(
    backend_store: RawStore, store: Store
) -> None:
    """The store cannot tell a sealed record from junk: it returns both, byte for byte."""
    store.put_effect(AGENT, held(store), SEQ, 0, "intent", b"written by the store")
    backend_store.put_effect(AGENT, SEQ, 0, "outcome", b"\x00\xffnot sealed\n" * 3)
    backend_store.put_effect(AGENT, SEQ, 1, "intent", b"")
    assert store.read_effects(AGENT, SEQ) == {
        (0, "intent"): b"written by the store",
        (0, "outcome"): b"\x00\xffnot sealed\n" * 3,
        (1, "intent"): b"",
    }


def test_a_record_over_the_size_limit_is_left_out(
    backend_store: RawStore, store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """One byte over MAX_EFFECT_BYTES is logged and left out; at the limit is returned."""
    biggest = bytes(range(256)) * (MAX_EFFECT_BYTES // 256)
    backend_store.put_effect(AGENT, SEQ, 0, "outcome", b"x" * (MAX_EFFECT_BYTES + 1))
    backend_store.put_effect(AGENT, SEQ, 1, "outcome", biggest)
    backend_store.put_effect(AGENT, SEQ, 2, "intent", b"kept")
    with caplog.at_level(logging.WARNING):
        assert store.read_effects(AGENT, SEQ) == {(1, "outcome"): biggest, (2, "intent"): b"kept"}
    assert warnings_logged(caplog)


@pytest.mark.parametrize(
    ("index", "kind"),
    [
        (-1, "outcome"),
        (MAX_EFFECTS_PER_STEP, "outcome"),
        (10**20, "intent"),
        (0, "result"),
        (0, "Outcome"),
        (0, ""),
    ],
    ids=["index-negative", "index-too-big", "index-huge", "kind-unknown", "kind-case", "no-kind"],
)
def test_a_record_under_numbers_or_a_kind_out_of_bounds_is_left_out(
    backend_store: RawStore, store: Store, caplog: pytest.LogCaptureFixture, index: int, kind: str
) -> None:
    """A name no put_effect could have written is left out, never raised: logged, or where it
    is no backend key at all (a negative index's "-001"), passed over unread by the backend."""
    backend_store.put_effect(AGENT, SEQ, index, kind, b"planted")
    backend_store.put_effect(AGENT, SEQ, 3, "outcome", b"kept")
    with caplog.at_level(logging.WARNING):
        assert store.read_effects(AGENT, SEQ) == {(3, "outcome"): b"kept"}
    assert warnings_logged(caplog) or index < 0


def test_more_indices_than_a_step_may_have_return_only_the_lowest(
    backend_store: RawStore, store: Store
) -> None:
    """A step may journal MAX_EFFECTS_PER_STEP effects; more planted ones are never returned."""
    for index in range(MAX_EFFECTS_PER_STEP + 10):
        backend_store.put_effect(AGENT, SEQ, index, "outcome", f"r{index}".encode())
    assert store.read_effects(AGENT, SEQ) == {
        (index, "outcome"): f"r{index}".encode() for index in range(MAX_EFFECTS_PER_STEP)
    }


def test_records_of_other_steps_and_agents_are_not_read(
    backend_store: RawStore, store: Store
) -> None:
    """Steps whose numbers share digits (5, 50, 55, 15) and another agent's step 5 stay apart."""
    for seq in (5, 50, 55, 15):
        backend_store.put_effect(AGENT, seq, 0, "outcome", f"a{seq}".encode())
    backend_store.put_effect("b", 5, 1, "outcome", b"b5")
    assert store.read_effects(AGENT, 5) == {(0, "outcome"): b"a5"}
    assert store.read_effects(AGENT, 50) == {(0, "outcome"): b"a50"}
    assert store.read_effects(AGENT, 4) == {}
    assert store.read_effects("b", 5) == {(1, "outcome"): b"b5"}


def test_a_checkpoint_removes_planted_journals_at_or_below_it(
    backend_store: RawStore, store: Store
) -> None:
    """Junk under the journal of published steps keeps no checkpoint out, and goes with it;
    the journal of the step after it stays."""
    fence = held(store)
    for seq in range(1, SEQ + 1):
        backend_store.put_effect(AGENT, seq, 0, "outcome", b"junk")
        backend_store.put_effect(AGENT, seq, MAX_EFFECTS_PER_STEP, "outcome", b"out of bounds")
        backend_store.put_effect(AGENT, seq, 1, "result", b"unknown kind")
        backend_store.put_effect(AGENT, seq, 2, "intent", b"x" * (MAX_EFFECT_BYTES + 1))
    store.put_effect(AGENT, fence, SEQ + 1, 0, "intent", b"next step")
    store.put_checkpoint(AGENT, fence, SEQ, b"checkpoint")
    assert [store.read_effects(AGENT, seq) for seq in range(1, SEQ + 1)] == [{}] * SEQ
    assert store.read_effects(AGENT, SEQ + 1) == {(0, "intent"): b"next step"}


# -- the file store: what only a directory can hold ------------------------------------


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "store"


@pytest.fixture
def files(root: Path) -> FileStore:
    return FileStore(root)


def step_dir(root: Path, seq: int = SEQ) -> Path:
    return file_key(root, KEYS.step(seq))


def effects_dir(root: Path) -> Path:
    return file_key(root, KEYS.effects)


def effect_path(root: Path, seq: int, index: int, kind: str) -> Path:
    return file_key(root, KEYS.effect(seq, index, kind))


def put_raw(root: Path, seq: int, index: int, kind: str, data: bytes) -> None:
    path = effect_path(root, seq, index, kind)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def publish(files: FileStore, fence: Fence, seq: int = SEQ) -> None:
    """put_checkpoint succeeds: the checkpoint is stored, the newest."""
    info = files.put_checkpoint(AGENT, fence, seq, b"checkpoint")
    newest = files.list_checkpoints(AGENT)[0]
    assert (info.seq, info.epoch) == (newest.seq, newest.epoch) == (seq, fence.epoch)


def test_a_record_is_durable_before_put_effect_returns(
    root: Path, files: FileStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """put_effect writes the record's key through a synced temp file and syncs the step's
    folder (made durably in its parent) before it returns."""
    fence = held(files)
    fsyncs = record_fsyncs(monkeypatch)
    files.put_effect(AGENT, fence, SEQ, 3, "outcome", b"sealed")
    assert effect_path(root, SEQ, 3, "outcome").read_bytes() == b"sealed"
    step = str(step_dir(root).resolve())
    assert str(effects_dir(root).resolve()) in fsyncs  # the new step folder's entry
    temp_synced = [i for i, path in enumerate(fsyncs) if "/tmp-hb-" in path]
    assert temp_synced and fsyncs[-1] == step and temp_synced[0] < len(fsyncs) - 1
    assert os.listdir(step) == [KEYS.effect(SEQ, 3, "outcome").rsplit("/", 1)[1]]
    assert not list(root.glob("tmp-hb-*"))


def test_removal_drops_whole_step_folders_and_keeps_later_steps(
    root: Path, files: FileStore
) -> None:
    """Every key under a published step's folder goes (junk included); the next step and
    names that are no keys stay, and a symlink's target is never touched."""
    fence = held(files)
    outside = root.parent / "outside"
    outside.mkdir()
    (outside / "victim").write_bytes(b"not the store's")
    for seq in (1, 2):
        put_raw(root, seq, 0, "outcome", b"o")
        (step_dir(root, seq) / "junk").write_bytes(b"junk")
        (step_dir(root, seq) / "0999-outcome").write_bytes(b"out of bounds")
    step_dir(root, 3).write_bytes(b"a file where a step folder goes")
    step_dir(root, 4).symlink_to(outside, target_is_directory=True)
    files.put_effect(AGENT, fence, SEQ + 1, 0, "intent", b"next")
    (effects_dir(root) / ".notes.txt").write_bytes(b"not ours")
    publish(files, fence)
    assert sorted(os.listdir(effects_dir(root))) == [
        ".notes.txt", step_dir(root, 4).name, step_dir(root, SEQ + 1).name,
    ]  # fmt: skip
    assert (outside / "victim").read_bytes() == b"not the store's"  # the link, not its target
    assert files.read_effects(AGENT, SEQ + 1) == {(0, "intent"): b"next"}


@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="needs /proc/self/io (Linux)")
def test_an_oversized_record_is_not_read(root: Path, files: FileStore) -> None:
    """A 1 GiB record (sparse) is left out by its size: far less than its limit is read."""
    put_raw(root, SEQ, 0, "outcome", b"")
    os.truncate(effect_path(root, SEQ, 0, "outcome"), 2**30)
    put_raw(root, SEQ, 1, "outcome", b"kept")
    before = bytes_read_by_this_process()
    assert files.read_effects(AGENT, SEQ) == {(1, "outcome"): b"kept"}
    assert bytes_read_by_this_process() - before < MAX_EFFECT_BYTES // 4


BAD_NAMES = [
    "1-outcome",
    "00001-outcome",
    "0001-outcome.bak",
    "0001-outcome-x",
    "0001_outcome",
]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_a_record_name_we_never_write_is_left_out(
    root: Path, files: FileStore, caplog: pytest.LogCaptureFixture, name: str
) -> None:
    """Only the exact names put_effect writes count: other digits, widths or shapes
    (which would read as the same index) are logged and left out."""
    put_raw(root, SEQ, 2, "intent", b"kept")
    (step_dir(root) / name).write_bytes(b"planted")
    with caplog.at_level(logging.WARNING):
        assert files.read_effects(AGENT, SEQ) == {(2, "intent"): b"kept"}
    assert any(name in message for message in warnings_logged(caplog))


def plant(path: Path, what: str, outside: Path) -> None:
    """Put `what` where a record goes."""
    if what == "symlink":
        (outside / "record").write_bytes(b"a valid-looking record elsewhere")
        path.symlink_to(outside / "record")
    elif what == "symlink-to-dev-zero":
        path.symlink_to("/dev/zero")
    elif what == "fifo":
        os.mkfifo(path)
    elif what == "empty-folder":
        path.mkdir()
    else:
        path.mkdir()
        (path / "inside").write_bytes(b"x")


PLANTED = ["symlink", "symlink-to-dev-zero", "fifo", "empty-folder", "full-folder"]


@pytest.mark.parametrize("what", PLANTED)
def test_something_not_a_file_under_a_record_name_is_left_out(
    root: Path, files: FileStore, tmp_path: Path, what: str
) -> None:
    """Not followed, not opened for long, not read: left out. The checkpoint still succeeds
    and the journal reads empty after it, the link's target untouched."""
    fence = held(files)
    outside = tmp_path / "outside"
    outside.mkdir()
    put_raw(root, SEQ, 1, "outcome", b"kept")
    plant(effect_path(root, SEQ, 0, "outcome"), what, outside)
    assert files.read_effects(AGENT, SEQ) == {(1, "outcome"): b"kept"}
    publish(files, fence)
    assert files.read_effects(AGENT, SEQ) == {}
    if what == "symlink":
        assert (outside / "record").read_bytes() == b"a valid-looking record elsewhere"


@pytest.mark.parametrize("what", ["file", "symlink", "fifo"])
def test_something_not_a_folder_where_the_step_folder_goes(
    root: Path, files: FileStore, tmp_path: Path, what: str
) -> None:
    """Not followed: read_effects finds no journal; a checkpoint still succeeds; the link's
    target is untouched."""
    fence = held(files)
    outside = tmp_path / "outside"
    outside.mkdir()
    put_raw(root, 1, 0, "outcome", b"valid-looking")  # a folder to link to
    step_dir(root, 1).rename(outside / "step")
    if what == "file":
        step_dir(root).write_bytes(b"not a folder")
    elif what == "symlink":
        step_dir(root).symlink_to(outside / "step", target_is_directory=True)
    else:
        os.mkfifo(step_dir(root))
    assert files.read_effects(AGENT, SEQ) == {}
    publish(files, fence)
    assert files.read_effects(AGENT, SEQ) == {}
    assert os.listdir(outside / "step") == [KEYS.effect(1, 0, "outcome").rsplit("/", 1)[1]]


@pytest.mark.parametrize("what", ["file", "symlink"])
def test_something_not_a_folder_where_the_effects_folder_goes(
    root: Path, files: FileStore, tmp_path: Path, what: str
) -> None:
    """read_effects finds no journal and put_checkpoint succeeds; a journal write refuses
    (StoreError, as for any folder of the store planted over) and writes nothing there."""
    fence = held(files)
    outside = tmp_path / "outside"
    outside.mkdir()
    effects_dir(root).parent.mkdir(parents=True, exist_ok=True)
    if what == "file":
        effects_dir(root).write_bytes(b"not a folder")
    else:
        effects_dir(root).symlink_to(outside, target_is_directory=True)
    assert files.read_effects(AGENT, SEQ) == {}
    with pytest.raises(StoreError):
        files.put_effect(AGENT, fence, SEQ, 0, "intent", b"refused")
    publish(files, fence)
    assert list(outside.iterdir()) == []


def shut_out(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the folder at path unreadable: by its mode, or where that does not stop this
    process (root), by failing each open of it with EACCES as the kernel would for others."""
    path.chmod(0)
    try:
        os.listdir(path)
    except PermissionError:
        return
    real_open = os.open

    def refusing(name: Any, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        if os.path.basename(os.fspath(name)) == path.name and flags & os.O_DIRECTORY:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fspath(name))
        return real_open(name, flags, mode, dir_fd=dir_fd)

    monkeypatch.setattr(os, "open", refusing)


@pytest.mark.parametrize("which", ["effects", "step"])
def test_an_unreadable_journal_folder(
    root: Path, files: FileStore, monkeypatch: pytest.MonkeyPatch, which: str
) -> None:
    """read_effects fails with a StoreError naming it, never returns another journal; once
    this node may read it again, the checkpoint removes the journal."""
    fence = held(files)
    put_raw(root, SEQ, 0, "outcome", b"o")
    folder = effects_dir(root) if which == "effects" else step_dir(root)
    try:
        shut_out(folder, monkeypatch)
        with pytest.raises(StoreError, match="ermission"):
            files.read_effects(AGENT, SEQ)
    finally:
        monkeypatch.undo()
        folder.chmod(0o755)
    publish(files, fence)
    assert files.read_effects(AGENT, SEQ) == {}
