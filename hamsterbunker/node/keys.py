"""Following the cluster's keys while the node runs: a rotation's new key seals from the
next publish.

The record is read every ``period_s``; once a new current key authenticates the node
seals with it (``Sealer.adopt``) and says so in its heartbeat. Asked to follow a key it
does not hold, the node stops and says why (``refusal``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from ..core.errors import SealError, StoreError, StoreRegressed
from ..sealing import Sealer
from .calls import NodeCalls
from .cluster import Cluster
from .state import Standing

__all__ = ["KeyFollower", "show_keys"]

log = logging.getLogger("hamsterbunker")
Emit = Callable[..., None]


def show_keys(standing: Standing, sealer: Sealer) -> None:
    """What the heartbeat says of this node's keys: those it holds, the one it seals with."""
    standing.keys = sealer.held_key_ids()
    standing.sealing = sealer.key_id


class KeyFollower:
    """Reads the cluster record now and then and follows a rotation's steps."""

    def __init__(
        self,
        cluster: Cluster,
        sealer: Sealer,
        standing: Standing,
        calls: NodeCalls,
        *,
        emit: Emit,
        stop: Callable[[], None],
        period_s: float,
    ) -> None:
        self._cluster, self._sealer, self._standing = cluster, sealer, standing
        self._calls, self._emit, self._stop = calls, emit, stop
        self._period_s = period_s
        self._regressed = False  # said once until the store holds the newer record again
        self._shown = sealer.cluster.generation  # the generation the heartbeat shows
        # Why the node stopped, if a rotation's key it lacks was made current: re-raised
        # once the node has stopped, so that ``hb run`` exits as a refused start does.
        self.refusal: SealError | None = None

    async def run(self) -> None:
        """Follow until cancelled (or until a key this node lacks is made current)."""
        while True:
            await asyncio.sleep(self._period_s)
            if not await self.once():
                return

    async def once(self, found: bytes | None = None) -> bool:
        """One read of the record (found: read along with the lease); False if the node
        must stop."""
        # A record read along with the lease is followed on the worker pool: with nothing
        # to read, it must not queue behind the store calls of a takeover's first moments.
        call = self._calls.io if found is None else self._calls.work
        try:
            await call(self._cluster.follow, found)
        except StoreRegressed as exc:
            if not self._regressed:
                self._emit("store.regressed", reason=str(exc))
            self._regressed = True
            return True
        except SealError as exc:
            # It cannot seal with the cluster's key: it must not step or publish any more.
            self._emit("node.refused", reason=str(exc))
            self.refusal = exc
            self._stop()
            return False
        except StoreError as exc:
            log.debug("cluster record not read: %s", exc)  # the next period reads again
            return True
        self._regressed = False
        record = self._sealer.cluster
        if record.generation != self._shown:  # followed here, or by the sealer on its own
            self._shown = record.generation
            show_keys(self._standing, self._sealer)
            self._emit(
                "cluster.keys_changed",
                key_id=record.key_id,
                generation=record.generation,
                rotation=record.rotation or "none",
            )
        return True
