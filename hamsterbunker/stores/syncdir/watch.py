"""One watch over every node's subtree: each subtree's file-store watch, merged.

The subtrees are listed again every ``RELIST_S``: a node whose subtree the
sync tool brings later is watched from then on, and its arrival is itself a
change (its claim may already be there, and its own watch would not report a
file that was there when it started). A subtree's watch that ends or fails is
started again at the next listing. Like every watch, a hint, never proof.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping

from ...errors import StoreError
from ..base import Store
from .layout import log

__all__ = ["RELIST_S", "merged_watch"]

RELIST_S = 1.0


async def merged_watch(
    subtrees: Callable[[], Mapping[str, Store]],
    agent: str,
    *,
    lease_only: bool,
    terms_only: bool,
    own: str = "",
    relist_s: float = RELIST_S,
) -> AsyncIterator[None]:
    """Yield None whenever any subtree's watch yields, or a new subtree appears; own: this
    node's subtree, the one whose watch keeps terms_only."""
    woken = asyncio.Event()
    following: dict[str, asyncio.Task[None]] = {}

    async def follow(node: str, store: Store) -> None:
        # Only the own subtree's lease.json is current here: another node's claim is read
        # from what it published (``published``), so any change of its is a hint to look.
        changes = store.watch(agent, lease_only=lease_only, terms_only=terms_only and node == own)
        try:
            async for _ in changes:
                woken.set()
        except (OSError, StoreError) as exc:  # watched again at the next listing
            log.warning("watch of node %s's records of %s failed: %s", node, agent, exc)
        finally:
            if isinstance(changes, AsyncGenerator):  # closed now, not when collected
                await changes.aclose()

    try:
        first = True
        while True:
            try:
                current = await asyncio.to_thread(subtrees)
            except StoreError as exc:
                log.warning("could not list the node subtrees to watch: %s", exc)
                current = {}
            for node, store in current.items():
                task = following.get(node)
                if task is not None and not task.done():
                    continue
                following[node] = asyncio.create_task(follow(node, store))
                if not first and task is None:
                    woken.set()  # a subtree that arrived: its records may be new
            first = False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(woken.wait(), timeout=relist_s)
            if woken.is_set():
                woken.clear()
                yield None
    finally:
        for task in following.values():
            task.cancel()
        await asyncio.gather(*following.values(), return_exceptions=True)
