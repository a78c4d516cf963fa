"""The file store's inbox across crashes, and against what is planted under its names.

Crashes: a child process opens the store and admits or publishes with
``HB_FAILPOINTS=<point>=kill``, so it dies by SIGKILL exactly there; this
process then checks the contract (DESIGN.md invariant 9). An admission is
either wholly visible or absent and admitted once when retried; a consumption
is either wholly applied, its replies readable, or wholly absent, and absent
only when its checkpoint is.

Planted contents (DESIGN.md invariant 10): symlinks, FIFOs, directories,
oversized files and names or bytes that do not parse, under every inbox name;
reads skip them without hanging, writes go on.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hamsterbunker.errors import NotNextNumber
from hamsterbunker.limits import MAX_REPLY_BYTES, MAX_SUBMISSION_BYTES
from hamsterbunker.stores.base import AdmissionState, Consumed, Fence
from hamsterbunker.stores.file import FileStore
from hamsterbunker.stores.file.fileio import TMP_PREFIX
from hamsterbunker.stores.file.inbox_records import (
    COUNTER_NAME,
    counter_bytes,
    done_name,
    index_bytes,
    index_name,
    pending_bytes,
    pending_name,
    staged_name,
)
from hamsterbunker.stores.file.layout import checkpoint_name
from tests.support.records import fence_of, lease

pytestmark = pytest.mark.timeout(60)  # a FIFO read would otherwise hang

AGENT = "a"
KEEP_REPLIES = 4


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "store"


def open_store(root: Path) -> FileStore:
    return FileStore(root, keep_replies=KEEP_REPLIES, lock_timeout=30.0)


@pytest.fixture
def store(root: Path) -> FileStore:
    return open_store(root)


def inbox(root: Path, *sub: str) -> Path:
    return root.joinpath("agents", AGENT, "inbox", *sub)


def held(store: FileStore) -> Fence:
    return fence_of(store.cas_lease(AGENT, None, lease("n1", 1)))


def admit_until_taken(store: FileStore, request_id: str, payload: bytes) -> tuple[int, bool]:
    """Admit as a client would: at number 1, then at whatever the store says is next."""
    number = 1
    for _attempt in range(10):
        try:
            return store.admit(AGENT, request_id, number, payload)
        except NotNextNumber as exc:
            number = exc.next_number
    raise AssertionError("never admitted")


# -- crashes ---------------------------------------------------------------------------

_CHILD = """
import sys
from hamsterbunker.stores.base import Consumed, Fence
from hamsterbunker.stores.file import FileStore
from hamsterbunker.stores.file.fileio import TMP_PREFIX

root, op = sys.argv[1], sys.argv[2]
store = FileStore(root, keep_replies=4, lock_timeout=30.0)
if op == "admit":
    store.admit("a", sys.argv[3], int(sys.argv[4]), b"payload of " + sys.argv[3].encode())
else:
    holder, session, epoch, seq = sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6])
    consumed = [Consumed(1, "r1", b"reply one"), Consumed(2, "r2", None)]
    store.put_checkpoint("a", Fence(holder, session, epoch), seq, b"cp", consumed)
print("returned")
"""


def run_child(point: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, HB_FAILPOINTS=f"{point}=kill")
    return subprocess.run(
        [sys.executable, "-c", _CHILD, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=50,
        check=False,
    )


def killed(child: subprocess.CompletedProcess[str]) -> bool:
    return child.returncode == -signal.SIGKILL and "returned" not in child.stdout


@pytest.mark.parametrize("point", ["inbox.admit.after_number", "inbox.admit.after_entry"])
def test_an_admission_cut_short_is_visible_wholly_or_not_and_admitted_once_on_retry(
    root: Path, store: FileStore, point: str
) -> None:
    store.admit(AGENT, "r1", 1, b"first")
    child = run_child(point, str(root), "admit", "r2", "2")
    assert killed(child), child.stderr
    reader = open_store(root)
    listed = reader.read_inbox(AGENT)
    state = reader.read_admission(AGENT, "r2")
    if point == "inbox.admit.after_number":
        # A gap: number 2 is never used, r2 is unknown and is admitted as 3.
        assert listed == [(1, b"first")]
        assert state is None
        assert admit_until_taken(reader, "r2", b"retried") == (3, False)
        expected = [(1, b"first"), (3, b"retried")]
    else:
        # The entry is there though its index is not: it is r2's admission.
        assert listed == [(1, b"first"), (2, b"payload of r2")]
        assert state == AdmissionState(2, consumed=False, reply=None)
        assert admit_until_taken(reader, "r2", b"retried") == (2, True)
        expected = [(1, b"first"), (2, b"payload of r2")]
    assert reader.read_inbox(AGENT) == expected
    # The next admission moves the number on: r2 is still known (its index rolled forward).
    next_number = expected[-1][0] + 1
    assert reader.admit(AGENT, "r3", next_number, b"third") == (next_number, False)
    assert admit_until_taken(reader, "r2", b"again") == (expected[-1][0], True)
    assert [n for n, _b in reader.read_inbox(AGENT)] == [n for n, _b in expected] + [next_number]


def test_an_entry_consumed_before_its_index_was_written_stays_known(
    root: Path, store: FileStore
) -> None:
    """Admission of r1 cut short after its entry; a node consumes it; then r1 comes again."""
    child = run_child("inbox.admit.after_entry", str(root), "admit", "r1", "1")
    assert killed(child), child.stderr
    store.put_checkpoint(AGENT, held(store), 1, b"cp", [Consumed(1, "r1", b"done")])
    assert store.read_admission(AGENT, "r1") == AdmissionState(1, consumed=True, reply=b"done")
    assert store.admit(AGENT, "r2", 2, b"p") == (2, False)
    assert admit_until_taken(store, "r1", b"again") == (1, True)


_COMMITTED = {
    "checkpoint.before_commit": False,  # the staged record is a temporary file still
    "inbox.commit.after_staged": False,  # staged under its name, the checkpoint not renamed
    "checkpoint.after_rename": True,  # the checkpoint renamed, nothing applied
    "inbox.commit.after_checkpoint": True,  # the checkpoint durable, nothing applied
}


@pytest.mark.parametrize("point", list(_COMMITTED))
def test_a_consumption_cut_short_is_applied_wholly_or_not_with_its_checkpoint(
    root: Path, store: FileStore, point: str
) -> None:
    for number in (1, 2, 3):
        store.admit(AGENT, f"r{number}", number, b"p%d" % number)
    fence = held(store)
    child = run_child(
        point, str(root), "consume", fence.holder, fence.session, str(fence.epoch), "1"
    )
    assert killed(child), child.stderr
    reader = open_store(root)
    committed = [info.seq for info in reader.list_checkpoints(AGENT)] == [1]
    assert committed == _COMMITTED[point]
    if point == "inbox.commit.after_staged":
        assert (inbox(root, "staged") / staged_name(1, 1)).exists()  # what settling removes

    def check_consumed() -> None:
        assert reader.read_inbox(AGENT) == [(3, b"p3")]
        assert reader.read_admission(AGENT, "r1") == AdmissionState(1, True, b"reply one")
        assert reader.read_admission(AGENT, "r2") == AdmissionState(2, True, None)
        assert reader.admit(AGENT, "r1", 4, b"again") == (1, True)

    if committed:
        check_consumed()  # read before anything settled the staged record
        reader.put_checkpoint(AGENT, fence, 2, b"cp2")  # settles it
        check_consumed()
    else:
        assert [n for n, _b in reader.read_inbox(AGENT)] == [1, 2, 3]
        assert reader.read_admission(AGENT, "r1") == AdmissionState(1, False, None)
        reader.put_checkpoint(AGENT, fence, 2, b"cp2")  # settles: nothing is applied
        assert [n for n, _b in reader.read_inbox(AGENT)] == [1, 2, 3]
        assert reader.read_admission(AGENT, "r2") == AdmissionState(2, False, None)
        # The step is run again and published: now it consumes.
        reader.put_checkpoint(
            AGENT, fence, 3, b"cp3", [Consumed(1, "r1", b"reply one"), Consumed(2, "r2", None)]
        )
        check_consumed()
    staged = inbox(root, "staged")  # a crash's temporary file stays (swept when old)
    assert [p.name for p in staged.iterdir() if not p.name.startswith(TMP_PREFIX)] == []


# -- planted contents ------------------------------------------------------------------


def warnings_of(caplog: pytest.LogCaptureFixture) -> str:
    return "\n".join(r.getMessage() for r in caplog.records if r.levelname == "WARNING")


def test_planted_pending_entries_are_skipped_and_never_block(
    root: Path, store: FileStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store.admit(AGENT, "r1", 1, b"one")
    pending = inbox(root, "pending")
    victim = tmp_path / "victim"
    victim.write_bytes(pending_bytes("forged", b"through a link"))
    (pending / pending_name(2)).symlink_to(victim)
    os.mkfifo(pending / pending_name(3))
    (pending / pending_name(4)).mkdir()
    with open(pending / pending_name(5), "wb") as huge:  # sparse: over the cap
        huge.truncate(MAX_SUBMISSION_BYTES * 4)
    (pending / pending_name(6)).write_bytes(b"no header at all")
    for junk in ("junk", "1.hbs", "0" * 20 + ".hbs", "9" * 20 + ".hbs", "٣" * 20 + ".hbs"):
        (pending / junk).write_bytes(pending_bytes("junk", b"x"))
    (pending / (pending_name(7) + ".sync-conflict-20260101-000000-ABC")).write_bytes(b"x")
    assert store.read_inbox(AGENT) == [(1, b"one")]
    assert "symbolic link" in warnings_of(caplog) and "FIFO" in warnings_of(caplog)
    assert store.read_admission(AGENT, "forged") is None
    # The counter says 1 but entries sit above it: the next number passes them all.
    with pytest.raises(NotNextNumber) as refused:
        store.admit(AGENT, "r2", 2, b"two")
    assert refused.value.next_number == 7
    assert store.admit(AGENT, "r2", 7, b"two") == (7, False)
    assert store.read_inbox(AGENT) == [(1, b"one"), (7, b"two")]
    store.put_checkpoint(AGENT, held(store), 1, b"cp", [Consumed(1, "r1", b"re")])
    assert store.read_inbox(AGENT) == [(7, b"two")]
    assert victim.read_bytes() == pending_bytes("forged", b"through a link")


@pytest.mark.parametrize("junk", ["garbage", "missing", "fifo", "directory", "huge"])
def test_a_planted_or_missing_counter_never_gives_a_number_twice(
    root: Path, store: FileStore, junk: str
) -> None:
    store.admit(AGENT, "r1", 1, b"one")
    store.admit(AGENT, "r2", 2, b"two")
    counter = inbox(root, COUNTER_NAME)
    counter.unlink()
    if junk == "garbage":
        counter.write_bytes(b"\x00not a number")
    elif junk == "fifo":
        os.mkfifo(counter)
    elif junk == "directory":
        counter.mkdir()
    elif junk == "huge":
        counter.write_bytes(b"9" * 100_000)
    assert store.admit(AGENT, "r2", 3, b"dup") == (2, True)
    assert admit_until_taken(store, "r3", b"three") == (3, False)
    assert store.read_inbox(AGENT) == [(1, b"one"), (2, b"two"), (3, b"three")]


def test_a_counter_behind_its_entries_never_overwrites_one(root: Path, store: FileStore) -> None:
    for number in (1, 2, 3):
        store.admit(AGENT, f"r{number}", number, b"p%d" % number)
    inbox(root, COUNTER_NAME).write_bytes(counter_bytes(1))
    assert admit_until_taken(store, "r4", b"four") == (4, False)
    assert [n for n, _b in store.read_inbox(AGENT)] == [1, 2, 3, 4]


def test_planted_indices_do_not_raise_and_forge_no_admission(root: Path, store: FileStore) -> None:
    store.admit(AGENT, "r1", 1, b"one")
    store.admit(AGENT, "r2", 2, b"two")
    ids = inbox(root, "ids")
    (ids / index_name("r1")).write_bytes(b"junk")
    # An index naming another request id's entry is not believed.
    (ids / index_name("forged")).write_bytes(index_bytes("forged", 1))
    os.mkfifo(ids / index_name("fifo"))
    (ids / index_name("dir")).mkdir()
    (ids / "not-an-index").write_bytes(b"x")
    assert store.read_admission(AGENT, "forged") is None
    assert store.read_admission(AGENT, "fifo") is None
    assert store.read_admission(AGENT, "dir") is None
    assert store.read_admission(AGENT, "r1") is None  # damaged: taken as unknown
    assert store.read_admission(AGENT, "r2") == AdmissionState(2, False, None)
    assert store.admit(AGENT, "forged", 3, b"new") == (3, False)
    assert store.admit(AGENT, "dir", 4, b"new") == (4, False)  # the empty directory goes
    assert store.read_admission(AGENT, "dir") == AdmissionState(4, False, None)


def test_planted_staged_records_are_never_applied_unless_valid_and_are_removed(
    root: Path, store: FileStore
) -> None:
    for number in (1, 2):
        store.admit(AGENT, f"r{number}", number, b"p%d" % number)
    fence = held(store)
    store.put_checkpoint(AGENT, fence, 1, b"cp")
    staged = inbox(root, "staged")
    staged.mkdir(exist_ok=True)
    checkpoints = root / "agents" / AGENT / "checkpoints"
    # Junk under the name of a stored checkpoint, and under none; a FIFO, a directory.
    (staged / staged_name(1, 1)).write_bytes(b"\x00" * 64)
    (staged / staged_name(5, 1)).write_bytes(b"junk")
    os.mkfifo(staged / staged_name(6, 1))
    (staged / staged_name(7, 1)).mkdir()
    (checkpoints / checkpoint_name(6, 1)).write_bytes(b"junk checkpoint")
    (checkpoints / checkpoint_name(7, 1)).write_bytes(b"junk checkpoint")
    (staged / "junk-name").write_bytes(b"x")
    assert [n for n, _b in store.read_inbox(AGENT)] == [1, 2]
    assert store.read_admission(AGENT, "r1") == AdmissionState(1, False, None)
    assert store.admit(AGENT, "r3", 3, b"p3") == (3, False)
    store.put_checkpoint(AGENT, fence, 8, b"cp", [Consumed(2, "r2", b"two")])
    assert sorted(p.name for p in staged.iterdir()) == ["junk-name"]
    assert [n for n, _b in store.read_inbox(AGENT)] == [1, 3]
    assert store.read_admission(AGENT, "r2") == AdmissionState(2, True, b"two")


def test_junk_in_place_of_the_inbox_directories(
    root: Path, store: FileStore, tmp_path: Path
) -> None:
    """A symlink in place of the inbox (to a directory holding a valid-looking inbox) is
    not followed; a file in place of a subdirectory is not read; writes replace both."""
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "pending").mkdir(parents=True)
    (elsewhere / "pending" / pending_name(1)).write_bytes(pending_bytes("r9", b"forged"))
    agent_dir = root / "agents" / AGENT
    agent_dir.mkdir(parents=True)
    (agent_dir / "inbox").symlink_to(elsewhere)
    assert store.read_inbox(AGENT) == []
    assert store.read_admission(AGENT, "r9") is None
    assert store.admit(AGENT, "r1", 1, b"one") == (1, False)
    assert not (agent_dir / "inbox").is_symlink()
    assert (elsewhere / "pending" / pending_name(1)).read_bytes() == pending_bytes("r9", b"forged")
    pending = inbox(root, "pending")
    for entry in pending.iterdir():
        entry.unlink()
    pending.rmdir()
    pending.write_bytes(b"a file")
    assert store.read_inbox(AGENT) == []
    assert admit_until_taken(store, "r2", b"two") == (2, False)
    assert store.read_inbox(AGENT) == [(2, b"two")]


def test_a_consumed_record_that_cannot_be_read_is_consumed_with_no_reply(
    root: Path, store: FileStore
) -> None:
    for number in (1, 2):
        store.admit(AGENT, f"r{number}", number, b"p")
    done = inbox(root, "done")
    done.mkdir(exist_ok=True)
    (done / done_name(2)).mkdir()
    (done / done_name(2) / "keep").write_bytes(b"x")  # a directory that cannot be removed
    fence = held(store)
    store.put_checkpoint(AGENT, fence, 1, b"cp", [Consumed(1, "r1", b"a"), Consumed(2, "r2", b"b")])
    assert store.read_inbox(AGENT) == []
    assert store.read_admission(AGENT, "r1") == AdmissionState(1, True, b"a")
    assert store.read_admission(AGENT, "r2") == AdmissionState(2, True, None)
    with open(done / done_name(1), "r+b") as record:  # a reply grown over its cap
        record.truncate(MAX_REPLY_BYTES * 2)
    assert store.read_admission(AGENT, "r1") == AdmissionState(1, True, None)
    assert store.admit(AGENT, "r1", 3, b"again") == (1, True)
