"""A lease record's proof: its writer's signature, with the cluster key, over what steers a
node beyond one TTL (agent, holder, session, epoch, TTL, reach, successor, hand-off).

Left out: ``renewals`` and ``history`` (display), ``control`` (signed on its own), the
store's ``version``. Why epochs and reach are learned only from proven records:
``docs/design.md``, "Leases, effects and sealing in the code".
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
