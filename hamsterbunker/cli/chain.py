"""``hb choose-chain``: on a synced folder, list the chains kept aside and choose the one an
agent goes on from (``docs/syncdir.md``)."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from ..core.errors import ConfigError, ControlRefused, CorruptRecord, StoreError, Tampered
from ..node.lineage_view import LineageRead, LineageView, describe_ref
from ..ops.config import load_instance
from ..records import check_name
from ..records.lineage import ChainChoice, CheckpointRef, TermId
from ..sealing import Sealer
from ..sealing.keyring import Secret
from ..sealing.term_records import open_term_start, seal_chain_choice
from ..stores import Chains, is_syncdir_url
from .args import confirmed, store_url
from .context import EXIT_FAILURE, opened_store, store_sealer

__all__ = ["choose_chain", "plan_choice"]

_POLL_S = 0.5
_ONE_CHAIN = (
    "hb choose-chain is for syncdir:// stores: on any other store one lease keeps "
    "one chain (to give up lost checkpoints there, use hb accept-loss)"
)


def parse_term(text: str) -> TermId:
    epoch, at, node = text.partition("@")
    if not at or not epoch.isdigit() or not epoch.isascii():
        raise ConfigError(f"--term {text!r}: expected EPOCH@NODE, e.g. 7@laptop")
    return TermId(int(epoch), check_name("node id", node))


def plan_choice(read: LineageRead, term: TermId, seq: int | None) -> ChainChoice:
    """The choice of term's checkpoint seq (None: its newest here), made after the
    winning term; ConfigError if there is no such checkpoint or nothing to choose."""
    winner = read.lineage.winner
    if winner is None:
        raise ConfigError("no term record authenticates here yet: nothing to choose from")
    seqs = sorted(ref.seq for ref in read.where if ref.term == term)
    if not seqs:
        raise ConfigError(f"no checkpoint of term {term} is here (hb choose-chain lists them)")
    chosen = seqs[-1] if seq is None else seq
    if chosen not in seqs:
        held = f"{seqs[0]}..{seqs[-1]}" if len(seqs) > 1 else str(seqs[0])
        raise ConfigError(f"term {term} has no checkpoint at seq {chosen} here (it has {held})")
    base = CheckpointRef(term, chosen)
    if read.lineage.carried and read.lineage.carried[0] == base:
        raise ConfigError(f"{describe_ref(base)} is already where the agent goes on from")
    return ChainChoice(winner, base)


def describe_lineage(read: LineageRead) -> list[str]:
    """The lineage as the listing shows it: the winner, where it goes on, what is aside."""
    found = read.lineage
    if found.winner is None:
        return ["no term record authenticates here yet"]
    lines = [f"winning term: {found.winner}"]
    if found.carried:
        lines.append(f"goes on from: {describe_ref(found.carried[0])}")
    lines += [f"kept aside: {segment.describe()}" for segment in found.aside]
    if not found.aside:
        lines.append("kept aside: nothing")
    if read.choice is not None:
        lines.append(
            f"chosen, not yet taken: after term {read.choice.after}, go on from "
            f"{describe_ref(read.choice.base)}"
        )
    return lines


def _target(args: argparse.Namespace) -> tuple[str, str, str | None, int | None]:
    """(store URL, agent, node, sync delay) from the flags or the instance's config."""
    config = None if args.instance is None else load_instance(args.instance)
    if config is not None and (args.store is not None or args.node_id is not None):
        raise ConfigError("--store and --node-id cannot be combined with --instance")
    url = config.store if config is not None else store_url(args)
    if not is_syncdir_url(url):  # said before a store is opened (or found missing)
        raise ConfigError(_ONE_CHAIN)
    agent = args.agent_id or (config.agent_id if config is not None else None)
    if agent is None:
        raise ConfigError("--agent-id is required (or use --instance NAME)")
    check_name("agent id", agent)
    node = config.node_id if config is not None else args.node_id
    if args.term is not None and node is None:
        raise ConfigError("--node-id is required to choose (the choice goes in its subtree)")
    return url, agent, node, None if config is None else config.sync_delay_ms


def choose_chain(args: argparse.Namespace, read_secret: Callable[[], Secret]) -> int:
    url, agent, node, delay = _target(args)
    term = None if args.term is None else parse_term(args.term)
    with opened_store(url, node=node, sync_delay_ms=delay) as store:
        chains = store.chains
        if chains is None:
            raise ConfigError(_ONE_CHAIN)
        sealer = store_sealer(store, read_secret())
        view = LineageView(chains, sealer, agent, node or "", emit=lambda *a, **k: None)
        read = view.read()
        if term is None:
            print("\n".join(f"agent {agent}: {line}" for line in describe_lineage(read)))
            return 0
        folder = store.report().synced_folder
        if folder is None or node not in folder.nodes:
            raise ConfigError(
                f"node {node} has no subtree in {store.url}: run hb choose-chain on a machine where "
                "that node runs (the choice goes in its subtree)"
            )
        choice = plan_choice(read, term, args.seq)
        node_of, info = read.where[choice.base]
        try:
            blob = view.read_checkpoint(node_of, info)
            sealer.open_checkpoint(blob, agent, info.epoch, info.seq, node_of)
        except (Tampered, CorruptRecord) as exc:
            raise ConfigError(f"{describe_ref(choice.base)} does not authenticate: {exc}") from exc
        print(_describe_choice(read, choice))
        if not confirmed(args, "Go on from it? Type yes to go on: "):
            return EXIT_FAILURE
        data = seal_chain_choice(sealer, agent, choice)
        try:
            chains.put_chain_choice(agent, choice.after.epoch, data)
        except StoreError as exc:
            raise ControlRefused(
                f"a choice after term {choice.after} was already made on node {node}, or it "
                f"could not be written ({exc}); it applies at the next term"
            ) from exc
        print(
            f"chosen: once this has synced, the leader of term {choice.after} ends its term "
            f"and the next term goes on from {describe_ref(choice.base)}"
        )
        if not args.wait:
            return 0
        return 0 if _wait_taken(chains, sealer, agent, choice, args.timeout) else EXIT_FAILURE


def _describe_choice(read: LineageRead, choice: ChainChoice) -> str:
    now = read.lineage.carried[0] if read.lineage.carried else None
    return (
        f"agent goes on from {describe_ref(now)} (winning term {choice.after});\n"
        f"chosen instead: {describe_ref(choice.base)}. What the lineage holds past the fork "
        "is kept aside, not deleted."
    )


def _wait_taken(
    chains: Chains, sealer: Sealer, agent: str, choice: ChainChoice, timeout: float
) -> bool:
    """Whether a term began from the chosen checkpoint within timeout (it says which)."""
    until = time.monotonic() + timeout
    while time.monotonic() < until:
        for (epoch, node), data in chains.read_term_starts(agent).items():
            if epoch <= choice.after.epoch:
                continue
            try:
                start = open_term_start(sealer, data, agent, TermId(epoch, node))
            except Tampered:
                continue
            if start.base == choice.base:
                print(f"taken: term {start.term} went on from {describe_ref(choice.base)}")
                return True
        time.sleep(_POLL_S)
    print(f"no term went on from {describe_ref(choice.base)} within {timeout:g} s")
    return False
