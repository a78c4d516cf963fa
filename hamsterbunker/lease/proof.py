"""A lease record's proof: its writer's signature over what steers a node beyond one TTL.

Every node, ``hb accept-loss`` and ``hb pause`` hold the secret, and sign each
lease record they write. A record's epoch and reach (how far the checkpoints
are known to go) outlive it: a node remembers them, across restarts too, and
refuses to resume behind that reach or to take an epoch below that epoch. So a
node learns them only from a record whose proof opens: a record written
without the secret, naming reach 10^15 or epoch 9,999,999,999, would otherwise
stop every node for good with one write. The proof also covers who holds the
lease and for how long, so that an unproven record holds no node back longer
than the node's own TTL. What it leaves out changes without a re-signing or
is signed on its own: ``renewals`` and ``history`` (display), ``control`` (an
operator's request, signed by itself: ``hamsterbunker.lease.control``), and the
store's ``version``.
"""

from __future__ import annotations

import json
from dataclasses import replace

from ..core.errors import Tampered
from ..records import LeaseRecord
from ..sealing import Sealer

__all__ = ["LeaseProof"]

_KIND = "lease-proof"


class LeaseProof:
    """Signs and checks one agent's lease records with the cluster key."""

    def __init__(self, sealer: Sealer, agent: str) -> None:
        self._sealer, self._agent = sealer, agent
        self._checked: tuple[LeaseRecord, str | None] | None = None  # the last record checked
        self._problems: list[str] = []  # records whose proof did not open, not yet drained
        self._reported_version = -1  # the version of the last one reported

    def signed(self, record: LeaseRecord) -> LeaseRecord:
        """record with its proof, under the cluster's current key."""
        return replace(record, proof=self._sealer.tag_record(_KIND, self._payload(record)))

    def problem(self, record: LeaseRecord) -> str | None:
        """Why record's proof does not open (for this agent, as it stands), or None."""
        if not record.proof:
            return "it carries no proof (written without the secret, or by an older version)"
        try:
            self._sealer.check_tag(_KIND, self._payload(record), record.proof)
        except Tampered as exc:
            return str(exc)
        return None

    def proves(self, record: LeaseRecord) -> bool:
        """Whether record's proof opens: each record checked once (a keeper looks at the
        same record every tick), a failure reported once per record version."""
        if self._checked is None or self._checked[0] != record:
            problem = self.problem(record)
            if problem is not None and record.version != self._reported_version:
                self._reported_version = record.version
                self._problems.append(
                    f"epoch {record.epoch}, holder {record.holder!r}, version {record.version}: "
                    f"{problem}"
                )
            self._checked = (record, problem)
        return self._checked[1] is None

    def drain_problems(self) -> list[str]:
        """The records proves() found unproven since the last call (for lease.unproven)."""
        found, self._problems = self._problems, []
        return found

    def _payload(self, record: LeaseRecord) -> bytes:
        signed = [
            self._agent,
            record.holder,
            record.session,
            record.epoch,
            record.ttl_ms,
            record.seq,
            record.seq_epoch,
            record.successor,
            record.handoff,
        ]
        return json.dumps(signed, separators=(",", ":")).encode()
