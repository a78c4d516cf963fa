"""Checkpoints in etcd: the fenced write with its retention, and the listing.

The write's txn also removes the effect journal of its step and older (one
delete-range: the zero-padded seqs in the journal keys put them in one range),
and commits what an ``extra`` part adds (the inbox's consumption): its reads
join the write's one read, its compares and operations join the write's txn.

The steps of the write (one read of the names stored, then one txn that
compares the fence) are told at the top of ``hamsterbunker.stores.etcd``, with
the key layout. Key and description names that do not parse are skipped and
reported once; the store translates the errors.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from etcd3gw.exceptions import Etcd3Exception

from ...errors import CorruptRecord, StoreError
from ...failpoints import failpoint
from ...limits import check_checkpoint_bounds
from ...records import CheckpointInfo
from .._reported import ReportedOnce
from ..backends.etcd_connection import EtcdConnection, grpc_error, too_large
from ..base import Fence, describe_fence_text
from .kv import (
    b64,
    checkpoint_key,
    checkpoint_name,
    delete_op,
    fence_value,
    get_op,
    info_name,
    kv_key,
    pad,
    put_op,
    range_end,
    ranges,
    unb64,
)

__all__ = ["EtcdCheckpoints", "Raced", "TxnExtra"]

Ops = list[dict[str, Any]]
Kvs = list[dict[str, Any]]  # what a range request found
Infos = list[CheckpointInfo]


class TxnExtra(Protocol):
    """More to commit in a checkpoint's txn: read with the write's read, compared and written
    in its txn (all or nothing with the checkpoint)."""

    def reads(self) -> Ops:
        """Range requests to add to the write's one read."""
        ...

    def ops(self, found: list[list[dict[str, Any]]]) -> tuple[Ops, Ops]:
        """(compares, operations) for the txn, given what reads() found."""
        ...


class Raced(StoreError):
    """An extra part's compare failed (the fence and the seq were fine): read again, retry."""


class EtcdCheckpoints:
    """The checkpoints of every agent of one etcd store; the store translates the errors."""

    def __init__(
        self,
        connection: EtcdConnection,
        agent_prefix: Callable[[str], str],
        reported: ReportedOnce,
        keep: int,
    ) -> None:
        self._connection = connection
        self._agent_prefix = agent_prefix
        self._reported = reported
        self._keep = keep
        # By agent: the fence this client last wrote a checkpoint under, the seq, and the
        # seqs retention kept then (see put).
        self._written: dict[str, tuple[str, int, list[int]]] = {}

    def put(
        self, agent: str, fence: Fence, seq: int, blob: bytes, extra: TxnExtra | None = None
    ) -> CheckpointInfo:
        """Store.put_checkpoint: one read of the names stored, then one fenced txn; the
        read is left out after a put of this client under the same fence (a term's
        second checkpoint on), as the first put's read and what was written since tell
        what retention keeps, and nobody else writes under that fence.

        Raises Raced (nothing written) if only one of extra's compares failed.
        """
        self.check_bounds(fence, seq, blob)
        prefix = self._agent_prefix(agent)
        data, infos = prefix + "checkpoints/", prefix + "checkpoint-info/"
        fence_text = fence.to_text()
        key = checkpoint_key(prefix, seq, fence.epoch)
        info = CheckpointInfo(epoch=fence.epoch, seq=seq, size=len(blob), written=time.time())
        written = self._written.pop(agent, None)  # set again only if this put succeeds
        read: list[Kvs] = []
        replaced = False  # another epoch's checkpoint under this seq, to delete
        if extra is None and written is not None and written[0] == fence_text and seq > written[1]:
            kept = {seq, *written[2]}
        else:
            read = self._read_around(prefix, seq, extra)
            replaced, kept = self._judge_around(agent, prefix, fence, seq, read)
        journal = prefix + "effects/"
        success = [
            put_op(key, bytes(blob)),
            put_op(infos + pad(seq), info.to_json()),
            # The effect journal of this step and older, never read again: in the same
            # txn, so never before the checkpoint is committed.
            delete_op(journal, journal + pad(seq + 1)),
        ]
        newest = sorted(kept, reverse=True)
        if len(newest) > self._keep:  # everything below the oldest one kept
            cutoff = pad(newest[self._keep - 1])
            success += [delete_op(data, data + cutoff), delete_op(infos, infos + cutoff)]
        if replaced:
            # etcd refuses a txn whose delete covers its own put: the range either side of key.
            same_seq = f"{data}{pad(seq)}-"
            success += [delete_op(same_seq, key), delete_op(key + "\0", range_end(same_seq))]
        compare: list[dict[str, Any]] = [
            {
                "key": b64(prefix + "fence"),
                "target": "VALUE",
                "result": "EQUAL",
                "value": b64(fence_text),
            },
            # Nothing is overwritten: this epoch's key for seq does not exist yet.
            {"key": b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": 0},
        ]
        if extra is not None:
            more_compare, more_success = extra.ops(read[3:])
            compare += more_compare
            success += more_success
        failure = [get_op(prefix + "fence"), get_op(key, keys_only=True)]
        failpoint("checkpoint.before_commit")
        try:
            response = self._connection.txn(compare, success, failure)
        except Etcd3Exception as exc:
            if too_large(exc):
                raise StoreError(
                    f"checkpoint {seq} of {agent!r} ({len(blob)} bytes) refused by etcd: "
                    f"{grpc_error(exc)[1]}. etcd takes requests up to its --max-request-bytes "
                    "(1.5 MiB by default): raise it on every member, or keep the agent's state "
                    "smaller"
                ) from exc
            raise
        if response.get("succeeded"):
            self._written[agent] = (fence_text, seq, newest[: self._keep])
            return info
        fence_kvs, own = ranges(response)
        if fence_value(fence_kvs) != fence_text.encode():
            raise fence.refused(seq, describe_fence_text(fence_value(fence_kvs)))
        if extra is not None and not own:
            raise Raced(f"checkpoint {seq} of {agent!r}: the inbox changed while it was written")
        raise StoreError(
            f"checkpoint sequence must increase: {seq} is already stored under this epoch "
            f"({fence.epoch})"
        )

    def _read_around(self, prefix: str, seq: int, extra: TxnExtra | None) -> list[Kvs]:
        """One read of what is stored: the names of the checkpoints at or above seq (they
        say seq and epoch), of every description (for retention), the fence, and what
        extra reads."""
        data, infos = prefix + "checkpoints/", prefix + "checkpoint-info/"
        reads = [
            get_op(data + pad(seq), range_end(data), keys_only=True),
            get_op(infos, range_end(infos), keys_only=True),
            get_op(prefix + "fence"),
        ]
        return ranges(self._connection.txn([], reads + (extra.reads() if extra else [])))

    def _judge_around(
        self, agent: str, prefix: str, fence: Fence, seq: int, read: list[Kvs]
    ) -> tuple[bool, set[int]]:
        """From _read_around: whether another epoch's checkpoint is under seq (to replace),
        and the seqs described up to seq; StoreError if this epoch has one at or above."""
        data, infos = prefix + "checkpoints/", prefix + "checkpoint-info/"
        above, described, fence_kvs = read[:3]
        replaced = False
        for kv in above:
            name = kv_key(kv).removeprefix(data.encode())
            found = checkpoint_name(name)
            if found is None:
                self._warn_key(agent, kv, "checkpoint key")
                continue
            if found[1] == fence.epoch:  # this term's own: it numbers upwards, never overwrites
                if fence_value(fence_kvs) != fence.to_text().encode():
                    raise fence.refused(seq, describe_fence_text(fence_value(fence_kvs)))
                raise StoreError(
                    f"checkpoint sequence must increase: {seq} is not above {found[0]}, "
                    f"stored under this epoch ({fence.epoch})"
                )
            replaced = replaced or found[0] == seq
        kept = {seq}
        for kv in described:
            stored = info_name(kv_key(kv).removeprefix(infos.encode()))
            if stored is None:
                self._warn_key(agent, kv, "checkpoint description key")
            elif stored < seq:  # retention never reaches above the new seq
                kept.add(stored)
        return replaced, kept

    @staticmethod
    def check_bounds(fence: Fence, seq: int, blob: bytes) -> None:
        """StoreError, before anything is sent, outside check_checkpoint_bounds."""
        problem = check_checkpoint_bounds(seq, fence.epoch, len(blob))
        if problem is not None:
            raise StoreError(problem)

    def _warn_key(self, agent: str, kv: Mapping[str, Any], what: str) -> None:
        """Log once that a key under the agent's prefix does not parse (it is skipped)."""
        name = kv_key(kv)
        self._reported.warn(
            (agent, name, kv.get("mod_revision")),
            "etcd store: skipping %s %s of %s: its name is not one this store writes",
            what,
            name.decode("utf-8", "replace")[-80:],
            agent,
        )

    def list(self, agent: str) -> list[CheckpointInfo]:
        """Store.list_checkpoints: every description that parses, newest first."""
        [found] = ranges(self._connection.txn([], [self.list_op(agent)]))
        return self.listed(agent, found)

    def list_op(self, agent: str) -> dict[str, Any]:
        """The range request that reads every description (for listed)."""
        infos = self._agent_prefix(agent) + "checkpoint-info/"
        return get_op(infos, range_end(infos))

    def newest_op(self, agent: str) -> dict[str, Any]:
        """The range request that reads the checkpoint under the highest key: the highest
        seq, of the highest epoch stored under it."""
        data = self._agent_prefix(agent) + "checkpoints/"
        return get_op(data, range_end(data), sort_order="DESCEND", sort_target="KEY", limit=1)

    def listed(self, agent: str, found: Kvs) -> Infos:
        """The descriptions list_op found that parse, newest first (by seq, then epoch)."""
        infos = self._agent_prefix(agent) + "checkpoint-info/"
        listed = []
        for kv in found:
            seq = info_name(kv_key(kv).removeprefix(infos.encode()))
            if seq is None:
                self._warn_key(agent, kv, "checkpoint description key")
                continue
            try:
                listed.append(CheckpointInfo.from_json(unb64(kv.get("value", "")), seq))
            except (CorruptRecord, ValueError) as exc:  # ValueError: the gateway's base64
                # Not ours to judge further (the runtime authenticates what is listed):
                # left out, and said once.
                self._reported.warn(
                    (agent, kv_key(kv), kv.get("mod_revision")),
                    "etcd store: leaving out checkpoint %d of %s: %s",
                    seq,
                    agent,
                    exc,
                )
        return sorted(listed, key=lambda info: (info.seq, info.epoch), reverse=True)
