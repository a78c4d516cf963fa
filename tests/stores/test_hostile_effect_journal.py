"""Hostile contents in the effect journal (DESIGN.md invariants 8 and 10).

Someone who can write the store but lacks the secret may put anything under
the journal's names. read_effects returns whatever bytes sit under a valid
name (the caller authenticates each record) and logs and leaves out the rest:
names that do not parse, numbers or kinds out of bounds, records over
MAX_EFFECT_BYTES, more indices than a step may have. The first part runs on
every backend (``raw_store.backend_store``: file, Redis, etcd); the second
plants what only a directory can hold (symlinks, FIFOs, directories, floods of
entries, permissions) in the older file store (``stores.file``;
``tests/stores/backend/test_file_backend.py`` plants the same in the file
backend): read_effects never raises or hangs, reads within its bounds, and
put_checkpoint still succeeds.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hamsterbunker.errors import StoreError
from hamsterbunker.limits import MAX_EFFECT_BYTES, MAX_EFFECTS_PER_STEP
from hamsterbunker.stores import open_store
from hamsterbunker.stores.base import Fence, Store
from hamsterbunker.stores.file import FileStore
from tests.support.io_probes import bytes_read_by_this_process, record_fsyncs
from tests.support.raw_store import RawFile, RawStore, backend_store
from tests.support.records import fence_of, lease

__all__ = ["backend_store"]  # the fixture, used by name

pytestmark = pytest.mark.timeout(60)  # a FIFO or /dev/zero read would otherwise hang

AGENT = "a"
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


# -- the older file store: what only a directory can hold ------------------------------


@pytest.fixture
def raw(tmp_path: Path) -> RawFile:
    return RawFile(tmp_path / "store")


@pytest.fixture
def files(raw: RawFile) -> FileStore:
    return FileStore(raw.root)


def step_dir(raw: RawFile, seq: int = SEQ) -> Path:
    return raw.root / "agents" / AGENT / "effects" / f"{seq:020d}"


def effects_dir(raw: RawFile) -> Path:
    return raw.root / "agents" / AGENT / "effects"


def publish(files: FileStore, fence: Fence, seq: int = SEQ) -> None:
    """put_checkpoint succeeds: the checkpoint is stored, the newest."""
    info = files.put_checkpoint(AGENT, fence, seq, b"checkpoint")
    newest = files.list_checkpoints(AGENT)[0]
    assert (info.seq, info.epoch) == (newest.seq, newest.epoch) == (seq, fence.epoch)


def test_records_are_durable_under_their_layout_names(
    raw: RawFile, files: FileStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """put_effect writes effects/<seq>/<index>-<kind>.hbe through a synced temp file and
    syncs the step's directory (made durably in its parent) before it returns."""
    fence = held(files)
    fsyncs = record_fsyncs(monkeypatch)
    files.put_effect(AGENT, fence, SEQ, 3, "outcome", b"sealed")
    assert raw.effect_path(AGENT, SEQ, 3, "outcome").read_bytes() == b"sealed"
    step = str(step_dir(raw))
    assert str(effects_dir(raw)) in fsyncs  # the new step directory's entry
    temp_synced = [i for i, path in enumerate(fsyncs) if path.startswith(f"{step}/tmp-hb-")]
    assert temp_synced and fsyncs[-1] == step and temp_synced[0] < len(fsyncs) - 1
    assert sorted(os.listdir(step)) == ["0003-outcome.hbe"]  # no temp file left


def test_the_journal_is_removed_only_once_the_checkpoint_is_durable(
    raw: RawFile, files: FileStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checkpoints directory is synced (the checkpoint counts) before any step
    directory of the journal is removed."""
    fence = held(files)
    files.put_effect(AGENT, fence, SEQ, 0, "outcome", b"o")
    done = record_fsyncs(monkeypatch)
    real_rmdir = os.rmdir

    def recording_rmdir(path: str, *, dir_fd: int | None = None) -> None:
        done.append(f"rmdir {path}")
        real_rmdir(path, dir_fd=dir_fd)

    monkeypatch.setattr(os, "rmdir", recording_rmdir)
    publish(files, fence)
    checkpoints = str(raw.root / "agents" / AGENT / "checkpoints")
    assert f"rmdir {SEQ:020d}" in done
    assert done.index(checkpoints) < done.index(f"rmdir {SEQ:020d}")
    assert not step_dir(raw).exists()


def test_removal_drops_whole_step_directories_and_keeps_later_steps(
    raw: RawFile, files: FileStore
) -> None:
    """Everything under a published step's name goes (junk, stale temp files, a file or a
    symlink in place of its directory); the next step and names not ours stay."""
    fence = held(files)
    outside = raw.root.parent / "outside"
    outside.mkdir()
    (outside / "victim").write_bytes(b"not the store's")
    for seq in (1, 2):
        raw.put_effect(AGENT, seq, 0, "outcome", b"o")
        (step_dir(raw, seq) / "tmp-hb-0123456789ab").write_bytes(b"a crash left this")
        (step_dir(raw, seq) / "junk").write_bytes(b"junk")
        (step_dir(raw, seq) / "0999-outcome.hbe").write_bytes(b"out of bounds")
    step_dir(raw, 3).write_bytes(b"a file where a step directory goes")
    step_dir(raw, 4).symlink_to(outside, target_is_directory=True)
    files.put_effect(AGENT, fence, SEQ + 1, 0, "intent", b"next")
    (effects_dir(raw) / "notes.txt").write_bytes(b"not ours")
    publish(files, fence)
    assert sorted(os.listdir(effects_dir(raw))) == [f"{SEQ + 1:020d}", "notes.txt"]
    assert (outside / "victim").read_bytes() == b"not the store's"  # the link, not its target
    assert files.read_effects(AGENT, SEQ + 1) == {(0, "intent"): b"next"}


@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="needs /proc/self/io (Linux)")
def test_an_oversized_record_is_not_read(raw: RawFile, files: FileStore) -> None:
    """A 1 GiB record (sparse) is left out by its size: far less than its limit is read."""
    raw.put_effect(AGENT, SEQ, 0, "outcome", b"")
    os.truncate(raw.effect_path(AGENT, SEQ, 0, "outcome"), 2**30)
    raw.put_effect(AGENT, SEQ, 1, "outcome", b"kept")
    before = bytes_read_by_this_process()
    assert files.read_effects(AGENT, SEQ) == {(1, "outcome"): b"kept"}
    assert bytes_read_by_this_process() - before < MAX_EFFECT_BYTES // 4


BAD_NAMES = [
    "1-outcome.hbe",
    "00001-outcome.hbe",
    "\u0660\u0660\u0660\u0661-outcome.hbe",  # Arabic-Indic digits: int() reads them as 1
    "0001-outcome.hbe.bak",
    "0001-outcome",
    "0001_outcome.hbe",
]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_a_record_name_we_never_write_is_left_out(
    raw: RawFile, files: FileStore, caplog: pytest.LogCaptureFixture, name: str
) -> None:
    """Only the exact names put_effect writes count: other digits, widths or shapes
    (which would read as the same index) are logged and left out."""
    raw.put_effect(AGENT, SEQ, 2, "intent", b"kept")
    (step_dir(raw) / name).write_bytes(b"planted")
    with caplog.at_level(logging.WARNING):
        assert files.read_effects(AGENT, SEQ) == {(2, "intent"): b"kept"}
    assert any(name in message for message in warnings_logged(caplog))


def test_a_stale_temp_file_is_neither_read_nor_reported(
    raw: RawFile, files: FileStore, caplog: pytest.LogCaptureFixture
) -> None:
    raw.put_effect(AGENT, SEQ, 0, "intent", b"kept")
    (step_dir(raw) / "tmp-hb-0123456789ab").write_bytes(b"half a record")
    with caplog.at_level(logging.WARNING):
        assert files.read_effects(AGENT, SEQ) == {(0, "intent"): b"kept"}
    assert warnings_logged(caplog) == []


def plant(path: Path, what: str, outside: Path) -> None:
    """Put `what` where a record goes."""
    if what == "symlink":
        (outside / "record").write_bytes(b"a valid-looking record elsewhere")
        path.symlink_to(outside / "record")
    elif what == "symlink-to-dev-zero":
        path.symlink_to("/dev/zero")
    elif what == "fifo":
        os.mkfifo(path)
    elif what == "empty-directory":
        path.mkdir()
    else:
        path.mkdir()
        (path / "inside").write_bytes(b"x")


PLANTED = ["symlink", "symlink-to-dev-zero", "fifo", "empty-directory", "full-directory"]


@pytest.mark.parametrize("what", PLANTED)
def test_something_not_a_file_under_a_record_name_is_left_out(
    raw: RawFile, files: FileStore, tmp_path: Path, caplog: pytest.LogCaptureFixture, what: str
) -> None:
    """Not followed, not opened for long, not read: left out and logged. The checkpoint
    still succeeds and removes it (a directory only if empty), the link's target untouched."""
    fence = held(files)
    outside = tmp_path / "outside"
    outside.mkdir()
    raw.put_effect(AGENT, SEQ, 1, "outcome", b"kept")
    plant(raw.effect_path(AGENT, SEQ, 0, "outcome"), what, outside)
    with caplog.at_level(logging.WARNING):
        assert files.read_effects(AGENT, SEQ) == {(1, "outcome"): b"kept"}
    assert warnings_logged(caplog)
    publish(files, fence)
    assert files.read_effects(AGENT, SEQ) == {}
    assert step_dir(raw).exists() == (what == "full-directory")  # left, and logged
    if what == "symlink":
        assert (outside / "record").read_bytes() == b"a valid-looking record elsewhere"


@pytest.mark.parametrize("what", ["file", "symlink", "fifo"])
def test_something_not_a_directory_where_the_step_directory_goes(
    raw: RawFile, files: FileStore, tmp_path: Path, what: str
) -> None:
    """Not followed: read_effects finds no journal; the step's next record replaces the junk
    (a link's target untouched); a checkpoint still succeeds."""
    fence = held(files)
    outside = tmp_path / "outside"
    outside.mkdir()
    raw.put_effect(AGENT, 1, 0, "outcome", b"valid-looking")  # a directory to link to
    step_dir(raw, 1).rename(outside / "step")
    effects_dir(raw).mkdir(exist_ok=True)
    if what == "file":
        step_dir(raw).write_bytes(b"not a directory")
    elif what == "symlink":
        step_dir(raw).symlink_to(outside / "step", target_is_directory=True)
    else:
        os.mkfifo(step_dir(raw))
    assert files.read_effects(AGENT, SEQ) == {}
    files.put_effect(AGENT, fence, SEQ, 0, "intent", b"mine")
    assert files.read_effects(AGENT, SEQ) == {(0, "intent"): b"mine"}
    assert sorted(os.listdir(outside / "step")) == ["0000-outcome.hbe"]
    publish(files, fence)
    assert not step_dir(raw).exists()


@pytest.mark.parametrize("what", ["file", "symlink"])
def test_something_not_a_directory_where_the_effects_directory_goes(
    raw: RawFile, files: FileStore, tmp_path: Path, what: str
) -> None:
    """read_effects finds no journal and put_checkpoint succeeds; a journal write refuses
    (StoreError, as for any directory of the store planted over) and writes nothing there."""
    fence = held(files)
    outside = tmp_path / "outside"
    outside.mkdir()
    if what == "file":
        effects_dir(raw).write_bytes(b"not a directory")
    else:
        effects_dir(raw).symlink_to(outside, target_is_directory=True)
    assert files.read_effects(AGENT, SEQ) == {}
    with pytest.raises(StoreError):
        files.put_effect(AGENT, fence, SEQ, 0, "intent", b"refused")
    publish(files, fence)
    assert list(outside.iterdir()) == []


def shut_out(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the directory at path unreadable: by its mode, or where that does not stop this
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
def test_an_unreadable_journal_directory(
    raw: RawFile,
    files: FileStore,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    which: str,
) -> None:
    """read_effects logs it and returns no journal (as if it were removed), never raises;
    put_checkpoint still succeeds."""
    fence = held(files)
    raw.put_effect(AGENT, SEQ, 0, "outcome", b"o")
    directory = effects_dir(raw) if which == "effects" else step_dir(raw)
    try:
        shut_out(directory, monkeypatch)
        with caplog.at_level(logging.WARNING):
            assert files.read_effects(AGENT, SEQ) == {}
        assert any("permission" in m.lower() for m in warnings_logged(caplog))
        publish(files, fence)
    finally:
        monkeypatch.undo()
        directory.chmod(0o755)


class CountingScandir:
    """os.scandir, counting the entries it hands out."""

    def __init__(self, inner: Any, counts: list[int]) -> None:
        self._inner = inner
        self._counts = counts

    def __enter__(self) -> CountingScandir:
        return self

    def __exit__(self, *_exc: object) -> None:
        self._inner.close()

    def __iter__(self) -> CountingScandir:
        return self

    def __next__(self) -> os.DirEntry[str]:
        entry: os.DirEntry[str] = next(self._inner)
        self._counts[0] += 1
        return entry


@pytest.fixture
def io_counts(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[int]]:
    """Directory entries listed and files opened from now on (reset by the test)."""
    counts: dict[str, list[int]] = {"listed": [0], "opened": [0]}
    real_scandir, real_open = os.scandir, os.open

    def scandir(path: Any) -> CountingScandir:
        return CountingScandir(real_scandir(path), counts["listed"])

    def opening(*args: Any, **kwargs: Any) -> int:
        counts["opened"][0] += 1
        return real_open(*args, **kwargs)

    monkeypatch.setattr(os, "scandir", scandir)
    monkeypatch.setattr(os, "open", opening)
    return counts


FLOOD = 10_000


def flood(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for n in range(FLOOD):
        (directory / f"junk-{n:05d}").touch()


def test_a_flood_of_entries_in_a_step_directory_is_read_within_bounds(
    raw: RawFile, files: FileStore, io_counts: dict[str, list[int]]
) -> None:
    """Ten thousand planted entries: read_effects lists a bounded part, opens at most every
    name a record can have, and still returns the records."""
    raw.put_effect(AGENT, SEQ, 0, "intent", b"i")
    raw.put_effect(AGENT, SEQ, MAX_EFFECTS_PER_STEP - 1, "outcome", b"o")
    flood(step_dir(raw))
    io_counts["listed"][0] = io_counts["opened"][0] = 0
    assert files.read_effects(AGENT, SEQ) == {
        (0, "intent"): b"i",
        (MAX_EFFECTS_PER_STEP - 1, "outcome"): b"o",
    }
    assert io_counts["listed"][0] < FLOOD // 5
    assert io_counts["opened"][0] <= 2 * MAX_EFFECTS_PER_STEP + 8


@pytest.mark.parametrize("where", ["step", "effects"])
def test_a_flood_of_entries_keeps_each_checkpoint_bounded_and_drains(
    raw: RawFile, files: FileStore, io_counts: dict[str, list[int]], where: str
) -> None:
    """Ten thousand planted entries in a published step's directory (or beside the step
    directories): each checkpoint lists and removes a bounded part, none fails, and the
    published step's journal is gone after a bounded number of checkpoints."""
    fence = held(files)
    raw.put_effect(AGENT, 1, 0, "outcome", b"o")
    flood(step_dir(raw, 1) if where == "step" else effects_dir(raw))
    for seq in range(1, 30):
        io_counts["listed"][0] = 0
        publish(files, fence, seq)
        assert io_counts["listed"][0] < FLOOD // 3
        if not step_dir(raw, 1).exists():
            break
    assert not step_dir(raw, 1).exists()
