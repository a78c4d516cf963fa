"""hb migrate-store of a syncdir folder an earlier version wrote: each node's subtree in the
earlier file store's layout (tests/data/earlier's file fixture, written by that store)
with its published claims, term records and chain choices beside it, copied into a new
folder that this version's syncdir store reads as the earlier one was read."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from hamsterbunker.core.errors import ConfigError
from hamsterbunker.records import LeaseRecord
from hamsterbunker.stores.earlier.file import EarlierFileStore
from hamsterbunker.stores.migrate_syncdir import migrate_syncdir, open_syncdir_migration
from hamsterbunker.stores.syncdir import SyncDirStore
from hamsterbunker.stores.syncdir.layout import MARKER, MARKER_TEXT
from tests.support.agents import SECRET
from tests.support.cli import hb_env, run_hb
from tests.support.earlier_file import load_earlier_file
from tests.support.records import fence_of

AGENTS = ("a1", "a2")  # the agents of the fixture's history (tests/data/earlier/README.md)
JUNK = {("a1", 7)}  # the fixture's submission whose bytes do not open: never copied
DELAY_MS = 1000


def earlier_folder(tmp_path: Path) -> Path:
    """A syncdir folder as an earlier version left it: node n1's subtree is the fixture's
    file store, its cluster record at the folder's root, with a published claim, a term
    record and a chain choice of each agent beside its records."""
    store = Path(urlsplit(load_earlier_file(tmp_path, "fixture")).path)
    old = tmp_path / "old"
    (old / "nodes").mkdir(parents=True)
    (old / MARKER).write_bytes(MARKER_TEXT)
    (store / "cluster.json").rename(old / "cluster.json")
    store.rename(old / "nodes" / "n1")
    for agent in AGENTS:
        agent_dir = old / "nodes" / "n1" / "agents" / agent
        claim = LeaseRecord.from_json((agent_dir / "lease.json").read_bytes())
        (agent_dir / f"claim.{claim.version:020d}.json").write_bytes(claim.to_json())
        for kind in ("terms", "choices"):
            (agent_dir / kind).mkdir()
            (agent_dir / kind / "0000000003.rec").write_bytes(f"{kind} of {agent}".encode())
    return old


def files_of(root: Path) -> dict[Path, bytes]:
    return {p.relative_to(root): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_the_new_folder_holds_what_the_earlier_one_held_and_a_node_goes_on(
    tmp_path: Path,
) -> None:
    """Every node's records are in its subtree, its claim at its version, its published
    records byte for byte, the cluster record last; the earlier folder is only read; n1
    then takes the next term and publishes on it."""
    old, new = earlier_folder(tmp_path), tmp_path / "new"
    before = files_of(old)
    said: list[str] = []
    source, target = open_syncdir_migration(f"syncdir://{old}", f"syncdir://{new}")
    migrated = migrate_syncdir(source, target, SECRET, say=said.append, pause=lambda _s: None)
    assert sorted(migrated.agents) == ["a1@n1", "a2@n1", "a3@n1"]  # a3: an inbox cut short
    assert any("4 checkpoint(s)" in line and "3 published record(s)" in line for line in said)
    assert files_of(old) == before
    assert (new / "cluster.json").read_bytes() == (old / "cluster.json").read_bytes()
    assert (new / MARKER).read_bytes() == MARKER_TEXT
    earlier = EarlierFileStore(old / "nodes" / "n1")
    store = SyncDirStore(new, "n1", sync_delay_ms=DELAY_MS)
    for agent in AGENTS:
        claim = earlier.read_lease(agent)
        assert claim is not None and store.claims(agent) == {"n1": claim}
        listed = earlier.list_checkpoints(agent)
        chain = store.list_chains(agent)["n1"]
        assert [(i.seq, i.epoch, i.size) for i in chain] == [
            (i.seq, i.epoch, i.size) for i in listed
        ]
        for was, now in zip(listed, chain, strict=True):
            assert store.read_chain_checkpoint(agent, "n1", now) == earlier.read_checkpoint(
                agent, was
            )
        assert store.read_inbox(agent) == [
            entry for entry in earlier.read_inbox(agent) if (agent, entry[0]) not in JUNK
        ]
        assert store.read_acceptance(agent) == earlier.read_acceptance(agent)
        assert store.read_term_starts(agent) == {(3, "n1"): f"terms of {agent}".encode()}
        assert store.read_chain_choices(agent) == {(3, "n1"): f"choices of {agent}".encode()}
        published = new / "nodes" / "n1" / "published" / agent
        name = f"claim.{claim.version:020d}.json"
        assert (published / name).read_bytes() == (
            old / "nodes" / "n1" / "agents" / agent / name
        ).read_bytes()
    claim = store.read_lease("a1")
    assert claim is not None
    taken = store.cas_lease("a1", claim.version, replace(claim, epoch=claim.epoch + 1))
    newest = store.list_chains("a1")["n1"][0]
    store.put_checkpoint("a1", fence_of(taken), newest.seq + 1, b"the next state")
    assert store.list_chains("a1")["n1"][0].seq == newest.seq + 1


def test_the_command_line_and_what_it_refuses(tmp_path: Path) -> None:
    """hb migrate-store copies a syncdir folder into a new one; the wrong secret, a target
    that is not empty or not a syncdir URL are usage mistakes (exit 2), writing nothing."""
    old, new = earlier_folder(tmp_path), tmp_path / "new"
    args = ["migrate-store", "--from", f"syncdir://{old}", "--to", f"syncdir://{new}"]
    wrong = run_hb(args, env=hb_env(HB_SECRET="not the secret at all"))
    assert wrong.returncode == 2 and "Traceback" not in wrong.stderr, wrong.stderr
    assert not new.exists()
    to_file = run_hb([*args[:-1], (tmp_path / "f").as_uri()], env=hb_env(HB_SECRET=SECRET))
    assert to_file.returncode == 2 and "syncdir:// one" in to_file.stderr, to_file.stderr
    done = run_hb(args, env=hb_env(HB_SECRET=SECRET))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "migrated 3 agent(s) of its nodes" in done.stdout
    again = run_hb(args, env=hb_env(HB_SECRET=SECRET))
    assert again.returncode == 2 and "not empty" in again.stderr
    with pytest.raises(ConfigError, match="this version's layout"):
        source, target = open_syncdir_migration(f"syncdir://{new}", f"syncdir://{tmp_path}/x")
        migrate_syncdir(source, target, SECRET, pause=lambda _s: None)
