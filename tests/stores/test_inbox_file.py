"""The file store's inbox across crashes, and against what is planted under its keys.

Crashes: a child process opens the store and admits or publishes with
``HB_FAILPOINTS=<point>=kill``, so it dies by SIGKILL exactly there, at each
step of the file backend's commit; a node opening the store next finishes the
redo log a crash left; this process then checks the contract (DESIGN.md
invariant 9). An admission is either wholly visible or absent and admitted
once when retried; a consumption is either wholly applied, its replies
readable, or wholly absent, and absent only when its checkpoint is.

Planted contents (DESIGN.md invariant 10): symlinks, FIFOs, folders, oversized
files and names or bytes that do not parse, under the inbox's keys
(``stores.layer.keys``, ``ROOT/kv/``); reads skip them without hanging.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hamsterbunker.core.errors import CorruptRecord, NotNextNumber
from hamsterbunker.core.limits import MAX_REPLY_BYTES, MAX_SUBMISSION_BYTES
from hamsterbunker.stores.base import AdmissionState, Consumed, Fence
from hamsterbunker.stores.layer.files import FileStore
from hamsterbunker.stores.layer.keys import AgentKeys
from tests.support.raw_store import file_key
from tests.support.records import fence_of, lease

pytestmark = pytest.mark.timeout(60)  # a FIFO read would otherwise hang

AGENT = "a"
KEYS = AgentKeys(AGENT)
KEEP_REPLIES = 4


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "store"


def open_store(root: Path) -> FileStore:
    """A node's client: its open finishes a commit a crash cut short."""
    return FileStore(root, keep_replies=KEEP_REPLIES, lock_timeout=30.0)


@pytest.fixture
def store(root: Path) -> FileStore:
    return open_store(root)


def planted(root: Path, key: str) -> Path:
    """The file of key, its folder made: where a store writer plants."""
    path = file_key(root, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


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
from hamsterbunker.stores.layer.files import FileStore

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

# Each step of a commit of several writes (file_backend), and whether it is made once a
# node has opened the store after a kill there.
_MADE = {
    "file_backend.commit.before_lock": False,
    "file_backend.commit.after_log": True,
    "file_backend.commit.after_op": True,
    "file_backend.commit.after_op@2": True,
    "file_backend.commit.before_log_removed": True,
}


def run_child(point: str, *args: str) -> subprocess.CompletedProcess[str]:
    name, _, nth = point.partition("@")
    env = dict(os.environ, HB_FAILPOINTS=f"{name}=kill" + (f"@{nth}" if nth else ""))
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


@pytest.mark.parametrize("point", list(_MADE))
def test_an_admission_cut_short_is_visible_wholly_or_not_and_admitted_once_on_retry(
    root: Path, store: FileStore, point: str
) -> None:
    store.admit(AGENT, "r1", 1, b"first")
    child = run_child(point, str(root), "admit", "r2", "2")
    assert killed(child), child.stderr
    node = open_store(root)
    if _MADE[point]:
        assert node.read_inbox(AGENT) == [(1, b"first"), (2, b"payload of r2")]
        assert node.read_admission(AGENT, "r2") == AdmissionState(2, consumed=False, reply=None)
        assert admit_until_taken(node, "r2", b"retried") == (2, True)
    else:
        assert node.read_inbox(AGENT) == [(1, b"first")]
        assert node.read_admission(AGENT, "r2") is None
        assert admit_until_taken(node, "r2", b"retried") == (2, False)
    assert node.admit(AGENT, "r3", 3, b"third") == (3, False)
    assert [n for n, _b in node.read_inbox(AGENT)] == [1, 2, 3]


@pytest.mark.parametrize("point", list(_MADE))
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
    node = open_store(root)
    committed = [info.seq for info in node.list_checkpoints(AGENT)] == [1]
    assert committed == _MADE[point]

    def check_consumed() -> None:
        assert node.read_inbox(AGENT) == [(3, b"p3")]
        assert node.read_admission(AGENT, "r1") == AdmissionState(1, True, b"reply one")
        assert node.read_admission(AGENT, "r2") == AdmissionState(2, True, None)
        assert node.admit(AGENT, "r1", 4, b"again") == (1, True)

    if committed:
        check_consumed()
    else:
        assert [n for n, _b in node.read_inbox(AGENT)] == [1, 2, 3]
        assert node.read_admission(AGENT, "r1") == AdmissionState(1, False, None)
        # The step is run again and published: now it consumes.
        node.put_checkpoint(
            AGENT, fence, 1, b"cp", [Consumed(1, "r1", b"reply one"), Consumed(2, "r2", None)]
        )
        check_consumed()
    assert not list(root.glob("tmp-hb-*"))


_CONSUMER = """
import sys
from hamsterbunker.stores.base import Consumed, Fence
from hamsterbunker.stores.layer.files import FileStore

root, holder, session, epoch, seq, *numbers = sys.argv[1:]
store = FileStore(root, keep_replies=4, lock_timeout=30.0)
consumed = [Consumed(int(n), f"r{n}", b"reply %s" % n.encode()) for n in numbers]
store.put_checkpoint("a", Fence(holder, session, int(epoch)), int(seq), b"cp", consumed)
print("returned")
"""


def test_a_reader_between_a_consumptions_writes_finds_each_request_pending_or_answered(
    root: Path, store: FileStore
) -> None:
    """Readers take no lock and may see a commit's writes one by one. A client proving a
    duplicate submission reads a request id's record, then its submission or its reply:
    after every single write of a consumption (the child SIGKILLed there, its redo log left
    unfinished), a request id the store knows has its submission or its reply."""
    for number in range(1, 7):
        store.admit(AGENT, f"r{number}", number, b"p%d" % number)
    fence = held(store)
    # Four consumed and answered: the next two consumed push r1 and r2 past keep_replies.
    store.put_checkpoint(AGENT, fence, 1, b"cp", [Consumed(n, f"r{n}", b"re") for n in range(1, 5)])
    cuts = 0
    for nth in range(1, 60):  # bounded: a consumption of two is far fewer writes
        copy = root.with_name(f"cut-{nth}")  # the same store before each consumption
        shutil.copytree(root, copy, symlinks=True)
        args = [str(copy), fence.holder, fence.session, str(fence.epoch), "2", "5", "6"]
        env = dict(os.environ, HB_FAILPOINTS=f"file_backend.commit.after_op=kill@{nth}")
        child = subprocess.run(
            [sys.executable, "-c", _CONSUMER, *args],
            env=env, capture_output=True, text=True, timeout=50, check=False,
        )  # fmt: skip
        if "returned" in child.stdout:
            break
        assert killed(child), child.stderr
        cuts += 1
        for n in range(1, 7):
            known = file_key(copy, KEYS.request(f"r{n}")).exists()
            pending = file_key(copy, KEYS.submission(n)).exists()
            answered = file_key(copy, KEYS.reply(n, f"r{n}")).exists()
            assert not known or pending or answered, (nth, n)
    else:
        raise AssertionError("the consumption never returned")
    assert cuts >= 6, cuts  # every write of the commit was a cut
    done = open_store(copy)
    assert done.read_admission(AGENT, "r6") == AdmissionState(6, True, b"reply 6")
    assert done.read_admission(AGENT, "r1") is None  # forgotten past keep_replies


# -- planted contents ------------------------------------------------------------------


def test_planted_pending_entries_are_skipped_and_never_block(
    root: Path, store: FileStore, tmp_path: Path
) -> None:
    store.admit(AGENT, "r1", 1, b"one")
    victim = tmp_path / "victim"
    victim.write_bytes(b"through a link")
    planted(root, KEYS.submission(2)).symlink_to(victim)
    os.mkfifo(planted(root, KEYS.submission(3)))
    planted(root, KEYS.submission(4)).mkdir()
    with open(planted(root, KEYS.submission(5)), "wb") as huge:  # sparse: over the cap
        huge.truncate(MAX_SUBMISSION_BYTES * 4)
    for junk in ("junk", "1", "0" * 20, "9" * 20, "\u0663" * 20):
        (file_key(root, KEYS.pending) / junk).write_bytes(b"x")
    conflict = KEYS.submission(7) + ".sync-conflict-20260101-000000-ABC"
    planted(root, conflict).write_bytes(b"x")
    assert store.read_inbox(AGENT) == [(1, b"one")]
    assert store.read_admission(AGENT, "forged") is None
    assert store.admit(AGENT, "r2", 2, b"two") == (2, False)  # the link is replaced
    assert store.read_inbox(AGENT) == [(1, b"one"), (2, b"two")]
    store.put_checkpoint(AGENT, held(store), 1, b"cp", [Consumed(1, "r1", b"re")])
    assert store.read_inbox(AGENT) == [(2, b"two")]
    assert victim.read_bytes() == b"through a link"


# The record layer's admission compares inbox/last, not the submission's own key: with the
# counter gone or set back it writes over an unconsumed submission.
@pytest.mark.parametrize(
    "junk",
    [
        "garbage",
        "missing",
        "fifo",
        "folder",
        "huge",
    ],
)
def test_a_planted_or_missing_counter_never_gives_a_number_twice(
    root: Path, store: FileStore, junk: str
) -> None:
    store.admit(AGENT, "r1", 1, b"one")
    store.admit(AGENT, "r2", 2, b"two")
    counter = file_key(root, KEYS.last)
    counter.unlink()
    if junk == "garbage":
        counter.write_bytes(b"\x00not a number")
    elif junk == "fifo":
        os.mkfifo(counter)
    elif junk == "folder":
        counter.mkdir()
    elif junk == "huge":
        counter.write_bytes(b"9" * 100_000)
    assert store.admit(AGENT, "r2", 3, b"dup") == (2, True)  # known by its request id
    try:
        taken = admit_until_taken(store, "r3", b"three")
    except CorruptRecord:
        taken = None  # refused, as long as the counter is junk: no number given twice
    assert taken in (None, (3, False))
    assert [n for n, _b in store.read_inbox(AGENT)] == [1, 2, 3][: 2 + (taken is not None)]
    assert store.read_inbox(AGENT)[:2] == [(1, b"one"), (2, b"two")]


def test_a_counter_behind_its_entries_never_overwrites_one(root: Path, store: FileStore) -> None:
    for number in (1, 2, 3):
        store.admit(AGENT, f"r{number}", number, b"p%d" % number)
    file_key(root, KEYS.last).write_bytes(b"1")
    with contextlib.suppress(CorruptRecord, NotNextNumber):  # refused, overwriting nothing
        admit_until_taken(store, "r4", b"four")
    assert store.read_inbox(AGENT)[:3] == [(1, b"p1"), (2, b"p2"), (3, b"p3")]
    assert store.read_admission(AGENT, "r2") == AdmissionState(2, False, None)


def test_planted_indices_do_not_raise_and_forge_no_admission(root: Path, store: FileStore) -> None:
    store.admit(AGENT, "r1", 1, b"one")
    store.admit(AGENT, "r2", 2, b"two")
    file_key(root, KEYS.request("r1")).write_bytes(b"junk")
    os.mkfifo(file_key(root, KEYS.request("fifo")))
    file_key(root, KEYS.request("dir")).mkdir()
    (file_key(root, KEYS.ids) / ".not-an-index").write_bytes(b"x")
    assert store.read_admission(AGENT, "fifo") is None
    assert store.read_admission(AGENT, "dir") is None
    assert store.read_admission(AGENT, "r2") == AdmissionState(2, False, None)
    assert store.read_admission(AGENT, "r1") is None  # damaged: reported, taken as unknown
    assert store.admit(AGENT, "dir", 3, b"new") == (3, False)  # the empty folder goes
    assert store.read_admission(AGENT, "dir") == AdmissionState(3, False, None)
    assert store.admit(AGENT, "fifo", 4, b"new") == (4, False)
    assert [n for n, _b in store.read_inbox(AGENT)] == [1, 2, 3, 4]


def test_junk_in_place_of_the_inbox_folders(root: Path, store: FileStore, tmp_path: Path) -> None:
    """A symlink in place of the inbox (to a folder holding a valid-looking inbox) is not
    followed: nothing there is read, and a write refuses, naming it, writing nothing there."""
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "pending").mkdir(parents=True)
    (elsewhere / "pending" / KEYS.submission(1).rsplit("/", 1)[1]).write_bytes(b"forged")
    (elsewhere / "ids").mkdir()
    (elsewhere / "ids" / "r9").write_bytes(b"1 6")
    inbox = file_key(root, KEYS.pending).parent
    inbox.parent.mkdir(parents=True)
    inbox.symlink_to(elsewhere)
    assert store.read_inbox(AGENT) == []
    assert store.read_admission(AGENT, "r9") is None
    with pytest.raises(CorruptRecord, match=str(inbox)):
        store.admit(AGENT, "r1", 1, b"one")
    assert sorted(str(p.relative_to(elsewhere)) for p in elsewhere.rglob("*")) == [
        "ids", "ids/r9", "pending", "pending/" + KEYS.submission(1).rsplit("/", 1)[1],
    ]  # fmt: skip


def test_a_consumed_record_that_cannot_be_read_is_consumed_with_no_reply(
    root: Path, store: FileStore
) -> None:
    for number in (1, 2):
        store.admit(AGENT, f"r{number}", number, b"p")
    fence = held(store)
    store.put_checkpoint(AGENT, fence, 1, b"cp", [Consumed(1, "r1", b"a"), Consumed(2, "r2", b"b")])
    assert store.read_inbox(AGENT) == []
    assert store.read_admission(AGENT, "r2") == AdmissionState(2, True, b"b")
    with open(file_key(root, KEYS.reply(1, "r1")), "r+b") as record:  # grown over its cap
        record.truncate(MAX_REPLY_BYTES * 2)
    assert store.read_admission(AGENT, "r1") == AdmissionState(1, True, None)
    assert store.admit(AGENT, "r1", 3, b"again") == (1, True)
