"""The lease on a backend: read, compare-and-set, an unreadable record replaced (``RecordStore``'s
part), each write putting the term's fence beside the lease when the term changes."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import replace

from ...core.errors import CorruptRecord, LeaseConflict, StoreError, UnreadableLease
from ...core.limits import MAX_RECORD_BYTES
from ...records import LeaseRecord
from ..backend import Compare, Get, Put, Scan, ScanResult, TooLarge, Txn
from ..base import fence_text, parse_lease
from .base import Layer, must
from .checkpoints import LeaseWrite
from .keys import AgentKeys

__all__ = ["Leases"]


class Leases:
    """The lease records of ``RecordStore`` (which sets these)."""

    layer: Layer
    # Per agent, the lease record this client last wrote or read, as stored: what the
    # next cas_lease compares, without reading it first (a guess: the store decides).
    _leases: dict[str, tuple[bytes, LeaseRecord]]
    # Per agent, the fence this client's last lease write that changed it put in place.
    _fences: dict[str, str]

    def read_lease(self, agent: str) -> LeaseRecord | None:
        data = self._lease_bytes(AgentKeys(agent))
        if data is None:
            return None
        record = parse_lease(data, lambda: _found(data))
        self._leases[agent] = (data, record)
        return record

    def _lease_bytes(self, keys: AgentKeys) -> bytes | None:
        """The lease record's bytes; UnreadableLease, unread, if it is over its bound (then
        replaced against the fence beside it: replace_unreadable_lease)."""
        found = self.layer.backend.get(keys.lease, MAX_RECORD_BYTES)
        if isinstance(found, TooLarge):
            raise UnreadableLease(
                f"lease record of {keys.agent!r} is over the limit of {MAX_RECORD_BYTES} bytes",
                _oversized(found),
            )
        return found

    def cas_lease(self, agent: str, expected_version: int | None, new: LeaseRecord) -> LeaseRecord:
        return self._cas(agent, expected_version, new, [])[0]

    def _cas(
        self, agent: str, expected_version: int | None, new: LeaseRecord, reads: list[Get | Scan]
    ) -> tuple[LeaseRecord, list[bytes | TooLarge | ScanResult | None]]:
        """cas_lease, with reads made in its commit: the record stored, and what they read."""
        keys = AgentKeys(agent)
        known = self._leases.pop(agent, None)
        if known is not None and known[1].version == expected_version:
            # The record this client last wrote or read, compared byte for byte: a renewal
            # is one commit while nobody else wrote since; else read and judge, as below.
            stored = replace(new, version=known[1].version + 1)
            found = self._write_lease(keys, Compare(keys.lease, known[0]), known[1], stored, reads)
            if found is not None:
                return stored, found
        current = self._lease_bytes(keys)
        was = None if current is None else parse_lease(current, lambda: _found(current))
        version = None if was is None else was.version
        if version != expected_version:
            raise LeaseConflict(
                f"lease of {agent!r} is at version {version}, not {expected_version}"
            )
        stored = replace(new, version=(version or 0) + 1)
        found = self._write_lease(keys, Compare(keys.lease, current), was, stored, reads)
        if found is None:
            raise _changed(agent)
        return stored, found

    def _release_write(
        self, keys: AgentKeys, expected_version: int, released: LeaseRecord
    ) -> tuple[LeaseWrite, LeaseRecord] | None:
        """The compare and writes that release the lease inside another commit, and the
        record stored then; None unless this client last wrote or read expected_version."""
        known = self._leases.get(keys.agent)
        if known is None or known[1].version != expected_version:
            return None
        stored = replace(released, version=expected_version + 1)
        writes = [Put(keys.lease, stored.to_json())]
        if _fence(known[1]) != _fence(stored):
            writes.append(Put(keys.fence, _fence(stored).encode()))
        return (Compare(keys.lease, known[0]), writes), stored

    def _written(self, keys: AgentKeys, stored: LeaseRecord) -> None:
        """stored is now the lease record: what the next cas_lease compares."""
        self._leases[keys.agent] = (stored.to_json(), stored)
        self._fences[keys.agent] = _fence(stored)

    def replace_unreadable_lease(self, agent: str, found: str, new: LeaseRecord) -> LeaseRecord:
        keys = AgentKeys(agent)
        lease, fence = self.layer.read(
            Get(keys.lease, MAX_RECORD_BYTES), Get(keys.fence, MAX_RECORD_BYTES)
        )
        if isinstance(lease, TooLarge):
            # Over its bound, never read: replaced against the fence beside it. Every term's
            # first write changes the fence, so a replacement (or a new term) made meanwhile
            # fails the compare.
            if _oversized(lease) != found:
                raise _changed(agent)
            if isinstance(fence, TooLarge):
                raise CorruptRecord(
                    f"the lease record of {agent!r} and the fence beside it are both over the "
                    f"limit of {MAX_RECORD_BYTES} bytes: nothing to replace them against; "
                    "remove the lease record"
                )
            against = Compare(keys.fence, fence)
        elif lease is None or _parses(lease) or _found(lease) != found:
            raise _changed(agent)
        else:
            against = Compare(keys.lease, lease)
        if self._write_lease(keys, against, None, new) is None:
            raise _changed(agent)
        return new

    def create_lease(self, agent: str, new: LeaseRecord) -> LeaseRecord:
        """Write new as it is numbered (its own version) where no lease record can be read:
        none reads as stored (none, or on a file backend no regular file), or one over its
        bound is, which is replaced unread. LeaseConflict if another is stored. For a
        writer that numbers its record itself: a syncdir node's own claim, after junk."""
        keys = AgentKeys(agent)
        found = self.layer.backend.get(keys.lease, MAX_RECORD_BYTES)
        if isinstance(found, TooLarge):
            # Unread, it cannot be compared: replaced as it stands, fenced as any change of
            # term is (a writer that could plant it could as well remove it).
            self._write_lease(keys, None, None, new)
            return new
        absent = Compare(keys.lease, None)
        if found is not None or self._write_lease(keys, absent, None, new) is None:
            raise LeaseConflict(f"a lease record of {agent!r} is stored")
        return new

    def _write_lease(
        self,
        keys: AgentKeys,
        against: Compare | None,
        found: LeaseRecord | None,
        new: LeaseRecord,
        reads: Sequence[Get | Scan] = (),
    ) -> list[bytes | TooLarge | ScanResult | None] | None:
        """new written if against holds (None: unconditionally), its fence beside it when
        the term's changed from found's; what reads read then, or None if against failed."""
        data = new.to_json()
        writes = [Put(keys.lease, data)]
        fence = _fence(new)
        if found is None or _fence(found) != fence:
            writes.append(Put(keys.fence, fence.encode()))
        compares = [] if against is None else [against]
        txn = Txn(compares=compares, writes=writes, reads=reads)
        result = self.layer.commit_indexed(keys, txn)
        if against is None:
            must(result)  # nothing compared: only a backend's bug fails it
        if not result.succeeded:
            return None
        self._leases[keys.agent] = (data, new)
        self._fences[keys.agent] = fence
        return list(result.reads)


def _changed(agent: str) -> LeaseConflict:
    return LeaseConflict(f"the lease record of {agent!r} changed since it was read")


def _parses(data: bytes) -> bool:
    try:
        LeaseRecord.from_json(data)
    except StoreError:
        return False
    return True


def _fence(lease: LeaseRecord) -> str:
    return fence_text(lease.holder, lease.session, lease.epoch)


def _found(data: bytes) -> str:
    """What an unreadable lease record is, for replace_unreadable_lease: its digest."""
    return hashlib.sha256(data).hexdigest()


def _oversized(found: TooLarge) -> str:
    """What a lease record over its bound is, unread: its size, as the backend tells it."""
    return f"over {MAX_RECORD_BYTES} bytes: {found.size}"
