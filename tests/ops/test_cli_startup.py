"""``hb`` starts fast: ``import hamsterbunker`` and the command line import what a command
needs only when it runs (PEP 562 attributes in ``hamsterbunker``, the commands' modules
named in ``hamsterbunker.cli.main``), and nothing public went missing on the way."""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import hamsterbunker
from hamsterbunker.cli import context, control
from hamsterbunker.cli.parsers import build_parser
from hamsterbunker.lease.control import open_control
from hamsterbunker.records import Heartbeat, LeaseRecord
from hamsterbunker.sealing import Sealer, new_cluster_record
from hamsterbunker.stores import Store, open_store
from tests.support.agents import AGENT, SECRET

cli_main = importlib.import_module("hamsterbunker.cli.main")  # the package's main is the function


def modules_after(statement: str) -> set[str]:
    """The hamsterbunker modules a fresh interpreter holds after running statement."""
    code = f"{statement}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    found = json.loads(done.stdout)
    return {name for name in found if name.partition(".")[0] == "hamsterbunker"}


def test_the_command_line_imports_no_node_and_no_command_until_one_runs() -> None:
    loaded = modules_after("import hamsterbunker.cli.main")
    assert "hamsterbunker.node.runtime" not in loaded
    commands = {
        "acceptance", "chain", "control", "forget", "history", "migrate", "node", "rotate",
        "status", "submit",
    }  # fmt: skip
    assert not {f"hamsterbunker.cli.{name}" for name in commands} & loaded


def test_the_parser_of_another_command_imports_no_node_config() -> None:
    """hb run's and hb init's defaults come from the node's config: only they import it."""
    parse = "from hamsterbunker.cli.parsers import build_parser\nbuild_parser"
    assert "hamsterbunker.ops.provision" not in modules_after(f"{parse}('switchover')")
    assert "hamsterbunker.ops.provision" in modules_after(f"{parse}('init')")


def test_import_hamsterbunker_imports_none_of_its_parts_until_asked() -> None:
    loaded = modules_after("import hamsterbunker")
    assert loaded == {"hamsterbunker"}
    assert "hamsterbunker.node.runtime" in modules_after("from hamsterbunker import Runtime")


def test_every_public_name_is_importable_as_before() -> None:
    names = ", ".join(hamsterbunker.__all__)
    loaded = modules_after(f"from hamsterbunker import {names}\nfrom hamsterbunker import *")
    assert "hamsterbunker.node.runtime" in loaded
    for name in hamsterbunker.__all__:
        assert getattr(hamsterbunker, name) is not None
        assert name in dir(hamsterbunker)
    with pytest.raises(AttributeError, match="has no attribute 'Nothing'"):
        hamsterbunker.Nothing  # type: ignore[attr-defined]  # noqa: B018


def commands() -> list[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sorted(sub.choices)


def test_every_command_of_the_parser_runs_a_function_that_exists() -> None:
    for name in commands():
        if name == "demo":
            continue
        where = cli_main._COMMANDS.get(name) or cli_main._SECRET_COMMANDS[name]
        assert callable(cli_main._command(where)), name


@pytest.mark.parametrize("command", commands())
def test_every_command_still_has_its_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        cli_main.main([command, "--help"])
    assert done.value.code == 0
    assert f"usage: hb {command}" in capsys.readouterr().out


def test_hb_switchover_loads_no_lease_code_before_its_key_derives() -> None:
    """The lease package loads while the key derives (hb switchover's first store read)."""
    loaded = modules_after("import hamsterbunker.cli.main, hamsterbunker.cli.control")
    assert not {name for name in loaded if name.startswith("hamsterbunker.lease")}


def test_hb_switchover_judges_liveness_while_its_key_derives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The key's derivation (scrypt, some 0.1 s) runs beside the command's reads of the
    store: here it goes on only once the heartbeats were read, which a derivation done
    before those reads never sees."""
    url = (tmp_path / "store").as_uri()
    store = live_leader_and_standby(url)
    heartbeats_read = threading.Event()
    opened = context.open_store

    def opening(*args: Any, **kwargs: Any) -> Store:
        found = opened(*args, **kwargs)
        listed = found.list_heartbeats

        def listing(agent: str) -> list[Heartbeat]:
            heartbeats_read.set()
            return listed(agent)

        found.list_heartbeats = listing  # type: ignore[method-assign]
        return found

    def deriving(*args: Any) -> Sealer:
        assert heartbeats_read.wait(timeout=10), "the key was derived before the store's reads"
        return Sealer(*args)

    monkeypatch.setattr(context, "open_store", opening)
    monkeypatch.setattr(context, "Sealer", deriving)
    args = build_parser("switchover").parse_args(
        ["switchover", "--store", url, "--agent-id", AGENT, "--to", "b"]
    )
    assert control.switchover(args, lambda: SECRET) == 0
    assert "switchover from a to b asked (epoch 3)" in capsys.readouterr().out
    lease = store.read_lease(AGENT)
    assert lease is not None
    cluster = store.read_cluster()
    assert cluster is not None
    asked = open_control(Sealer(SECRET, cluster), lease.control, AGENT)
    assert (asked.switchover_to, asked.switchover_epoch) == ("b", 3)
    store.close()


def live_leader_and_standby(url: str) -> Store:
    """A file store at url whose agent's leader a and standby b wrote their records just now."""
    store = open_store(url)
    store.create_cluster(new_cluster_record(SECRET))
    now = time.time()
    lease = LeaseRecord(holder="a", region="r1", session="0a1b", epoch=3, ttl_ms=2000, written=now)
    store.cas_lease(AGENT, None, lease)
    for node, role, session in (("a", "active", "0a1b"), ("b", "standby", "ffff")):
        store.put_heartbeat(AGENT, Heartbeat(
            node=node, region="r1", host="h", pid=1, role=role, epoch=3, seq=7, leader="a",
            time=now, lease_session=session,
        ))  # fmt: skip
    return store
