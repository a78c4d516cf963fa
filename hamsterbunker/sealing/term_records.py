"""A term's record on a synced folder (where the term started) and the operator's chain
choice (``hb choose-chain``), signed with the cluster key and opened only as the record of the
agent and term its place names (``docs/syncdir.md``, "Chains, lineage and divergence").
"""

from __future__ import annotations

import json
from typing import Any

from ..core.errors import CorruptRecord, Tampered
from ..core.limits import MAX_EPOCH, MAX_SEQ
from ..records import check_record_name, parse_json
from ..records.lineage import ChainChoice, CheckpointRef, TermId, TermStart
from . import Sealer

__all__ = ["open_chain_choice", "open_term_start", "seal_chain_choice", "seal_term_start"]

_KIND = "term-start"
_CHOICE = "chain-choice"


def seal_term_start(sealer: Sealer, agent: str, start: TermStart) -> bytes:
    doc = {
        "agent": agent,
        "epoch": start.term.epoch,
        "node": start.term.node,
        "base": _ref(start.base),
    }
    return sealer.sign_record(_KIND, json.dumps(doc, separators=(",", ":")).encode())


def open_term_start(sealer: Sealer, data: bytes, agent: str, term: TermId) -> TermStart:
    """The record in data, authenticated, for agent and term; Tampered otherwise."""
    payload = sealer.open_record(_KIND, data)
    try:
        doc = parse_json(payload, "term record")
        found = TermStart(
            TermId(_count(doc["epoch"], MAX_EPOCH), check_record_name(doc["node"])),
            _base(doc["base"]),
        )
        named = doc["agent"]
    except (CorruptRecord, KeyError, TypeError, ValueError) as exc:
        # Signed with our key, so written by our own code: a newer format, or a bug.
        raise Tampered(f"term record does not parse: {exc}") from exc
    if named != agent or found.term != term:
        raise Tampered(
            f"term record for agent {named!r}, term {found.term} found as the record of "
            f"agent {agent!r}, term {term}"
        )
    return found


def seal_chain_choice(sealer: Sealer, agent: str, choice: ChainChoice) -> bytes:
    doc = {
        "agent": agent,
        "after": [choice.after.epoch, choice.after.node],
        "base": _ref(choice.base),
    }
    return sealer.sign_record(_CHOICE, json.dumps(doc, separators=(",", ":")).encode())


def open_chain_choice(sealer: Sealer, data: bytes, agent: str, epoch: int) -> ChainChoice:
    """The choice in data, authenticated, for agent, made while the term of epoch won
    (the epoch its place names); Tampered otherwise."""
    payload = sealer.open_record(_CHOICE, data)
    try:
        doc = parse_json(payload, "chain choice")
        after_epoch, after_node = doc["after"]
        after = TermId(_count(after_epoch, MAX_EPOCH), check_record_name(after_node))
        base = _base(doc["base"])
        named = doc["agent"]
    except (CorruptRecord, KeyError, TypeError, ValueError) as exc:
        raise Tampered(f"chain choice does not parse: {exc}") from exc
    if base is None or named != agent or after.epoch != epoch:
        raise Tampered(
            f"chain choice for agent {named!r} after term {after} found as agent {agent!r}'s "
            f"choice after a term of epoch {epoch}"
        )
    return ChainChoice(after, base)


def _ref(ref: CheckpointRef | None) -> list[Any] | None:
    return None if ref is None else [ref.term.epoch, ref.term.node, ref.seq]


def _base(value: Any) -> CheckpointRef | None:
    if value is None:
        return None
    epoch, node, seq = value
    return CheckpointRef(
        TermId(_count(epoch, MAX_EPOCH), check_record_name(node)), _count(seq, MAX_SEQ)
    )


def _count(value: Any, most: int) -> int:
    if type(value) is not int or not 0 <= value <= most:
        raise ValueError(f"{value!r} is not a number in 0..{most}")
    return value
