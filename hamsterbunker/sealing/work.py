"""Sealing the records of work: inbox submissions, their replies, effect-journal records,
each header (associated data) naming where the record belongs, so that it opens nowhere else.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from ..core.errors import SealError, Tampered
from .formats import (
    EFFECT_MAGIC,
    PREFIX,
    REPLY_MAGIC,
    SUBMISSION_MAGIC,
    Key,
    framed,
    named_key_id,
    opened,
    prefix_of,
    unframed,
)

__all__ = ["EffectAt", "OpenedEffect", "OpenedSubmission", "WorkSealing"]


@dataclass(frozen=True)
class OpenedSubmission:
    """An authentic submission: its number, request id, payload and the submitter's time."""

    number: int
    request_id: str
    payload: Any
    submitted: float  # the submitter's wall clock: display only


@dataclass(frozen=True)
class OpenedEffect:
    """An authentic effect-journal record: the epoch it was written under, its name, payload."""

    epoch: int
    name: str
    payload: Any


@dataclass(frozen=True)
class EffectAt:
    """Where an effect-journal record belongs: agent, step, index, kind and the effect's name;
    on a store that keeps a chain per node (``Store.chains``), the node whose journal it is
    in (None elsewhere: the header then names none)."""

    agent: str
    seq: int
    index: int
    kind: str
    name: str = ""
    node: str | None = None

    def header(self) -> dict[str, Any]:
        header: dict[str, Any] = {
            "agent": self.agent,
            "seq": self.seq,
            "index": self.index,
            "kind": self.kind,
            "name": self.name,
        }
        if self.node is not None:
            header["node"] = self.node
        return header


class WorkSealing:
    """The Sealer's seals and opens of work records (``Sealer`` gives the keys)."""

    def _current_key(self) -> Key:
        raise NotImplementedError

    def _key_named(self, kid: str, what: str) -> Key:
        raise NotImplementedError

    def seal_submission(
        self, agent: str, number: int, request_id: str, payload: Any, submitted: float
    ) -> bytes:
        """Seal a submission's payload as number `number` of agent's inbox: an old one
        planted again under a new number is never taken for a new submission."""
        header = {"agent": agent, "number": number, "rid": request_id}
        body = {"payload": payload, "submitted": submitted}
        return self._seal_inbox(SUBMISSION_MAGIC, header, body, "submission payload")

    def open_submission(self, blob: bytes, agent: str, number: int) -> OpenedSubmission:
        """The submission found as number of agent; Tampered if it is not that one."""
        header, body = self._open_inbox(SUBMISSION_MAGIC, blob, "submission")
        if (header.get("agent"), header.get("number")) != (agent, number):
            raise Tampered(
                f"submission sealed for agent {header.get('agent')!r} as number "
                f"{header.get('number')!r} was found as number {number} of {agent!r}"
            )
        if not isinstance(body, dict) or not isinstance(body.get("submitted"), (int, float)):
            raise Tampered("submission is damaged: no payload or time")
        return OpenedSubmission(
            number, str(header.get("rid")), body.get("payload"), float(body["submitted"])
        )

    def reseal_submission(self, blob: bytes, agent: str, number: int) -> bytes:
        """The submission found as number of agent, sealed again with the current key: the
        same request id, payload and time."""
        found = self.open_submission(blob, agent, number)
        return self.seal_submission(agent, number, found.request_id, found.payload, found.submitted)

    def seal_reply(self, agent: str, number: int, request_id: str, reply: Any) -> bytes:
        """Seal the reply to submission number (request_id) of agent."""
        header = {"agent": agent, "number": number, "rid": request_id}
        return self._seal_inbox(REPLY_MAGIC, header, {"reply": reply}, "reply")

    def open_reply(self, blob: bytes, agent: str, number: int, request_id: str) -> Any:
        """The reply found for submission number (request_id) of agent; Tampered if it is not
        that one's. The number counts as much as the request id: a request id forgotten and
        submitted again is a new submission, which the first one's reply must not answer."""
        header, body = self._open_inbox(REPLY_MAGIC, blob, "reply")
        found = (header.get("agent"), header.get("number"), header.get("rid"))
        if found != (agent, number, request_id):
            raise Tampered(
                f"reply sealed for request {found[2]!r} (#{found[1]!r}) of {found[0]!r} was "
                f"found as the reply to {request_id!r} (#{number}) of {agent!r}"
            )
        if not isinstance(body, dict) or "reply" not in body:
            raise Tampered("reply is damaged: no reply in it")
        return body["reply"]

    def reseal_reply(self, blob: bytes, agent: str, number: int) -> bytes:
        """The reply found as that to submission number of agent, sealed again with the
        current key: the same request id and reply. Tampered if it is not that one's."""
        header, body = self._open_inbox(REPLY_MAGIC, blob, "reply")
        request_id = header.get("rid")
        if (header.get("agent"), header.get("number")) != (agent, number) or not isinstance(
            request_id, str
        ):
            raise Tampered(
                f"reply sealed for submission {header.get('number')!r} of "
                f"{header.get('agent')!r} was found as the reply to {number} of {agent!r}"
            )
        if not isinstance(body, dict) or "reply" not in body:
            raise Tampered("reply is damaged: no reply in it")
        return self.seal_reply(agent, number, request_id, body["reply"])

    def _seal_inbox(self, magic: bytes, header: dict[str, Any], body: Any, what: str) -> bytes:
        try:
            plaintext = json.dumps(body, separators=(",", ":"), allow_nan=False).encode()
        except (TypeError, ValueError) as exc:
            raise SealError(f"the {what} is not JSON-serialisable: {exc}") from exc
        key = self._current_key()
        return framed(key.inbox, prefix_of(magic, {"kid": key.kid, **header}), plaintext)

    def _open_inbox(self, magic: bytes, blob: bytes, what: str) -> tuple[dict[str, Any], Any]:
        """The authenticated header and body of an inbox record; Tampered for anything else."""
        prefix, nonce, ciphertext = unframed(magic, blob, what)
        key = self._key_named(named_key_id(prefix[PREFIX.size :], what), what)
        failed = f"{what} failed to authenticate (edited, or sealed without the secret)"
        plaintext = opened(key.inbox, prefix, nonce, ciphertext, failed)
        # Authentic from here on: sealed by a holder of the secret.
        return json.loads(prefix[PREFIX.size :]), json.loads(plaintext)

    def seal_effect(self, at: EffectAt, epoch: int, payload: dict[str, Any]) -> bytes:
        """Seal one effect-journal record (an intent or an outcome) written under epoch."""
        try:
            plaintext = json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()
        except (TypeError, ValueError) as exc:
            raise SealError(f"effect record is not JSON-serialisable: {exc}") from exc
        key = self._current_key()
        header = {"kid": key.kid, **at.header(), "epoch": epoch}
        return framed(key.effect, prefix_of(EFFECT_MAGIC, header), plaintext)

    def open_effect(self, blob: bytes, at: EffectAt) -> OpenedEffect:
        """The record found as `at` (its name aside); Tampered if it is not that record.

        The sealed name comes back to be compared by the caller: another name is a replay
        that called its effects in another order, not tampering.
        """
        prefix, nonce, ciphertext = unframed(EFFECT_MAGIC, blob, "effect record")
        what = "effect record"
        key = self._key_named(named_key_id(prefix[PREFIX.size :], what), what)
        failed = "effect record failed to authenticate (edited or truncated)"
        plaintext = opened(key.effect, prefix, nonce, ciphertext, failed)
        # Authentic from here on: written by a node that holds the secret.
        header = json.loads(prefix[PREFIX.size :])
        fields = ("agent", "seq", "index", "kind", "node")  # no node: None on both sides
        sealed_as = {field: header.get(field) for field in fields}
        found_as = {field: at.header().get(field) for field in fields}
        if sealed_as != found_as:
            raise Tampered(f"effect record sealed as {sealed_as} was found as {found_as}")
        return OpenedEffect(header["epoch"], header["name"], json.loads(plaintext))

    def reseal_effect(self, blob: bytes, at: EffectAt) -> bytes:
        """The effect-journal record found as ``at`` (its name aside), sealed again with the
        current key: the same epoch, name and payload."""
        found = self.open_effect(blob, at)
        return self.seal_effect(replace(at, name=found.name), found.epoch, found.payload)
