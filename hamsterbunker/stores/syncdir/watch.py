"""One watch over every node's subtree: each subtree's store watch and, for another node,
its folder of published claims, merged; a hint, never proof.

The subtrees are listed again every ``RELIST_S``: a subtree that arrives is watched from
then on, and its arrival is itself a change. A watch that ends or fails is started again
at the next listing.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import stat
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from pathlib import Path

from ...core.errors import StoreError
from ..dirs.lease_watch import open_lease_watch
from ..dirs.location import mount_of
from ..interface import Store
from .layout import log
from .published import is_claim_name

__all__ = ["RELIST_S", "claim_changes", "merged_watch"]

RELIST_S = 1.0
_FOLDER_RETRY_S = 0.5  # how often a claims watch looks for its folder until it is made


async def merged_watch(
    subtrees: Callable[[], Mapping[str, Store]],
    agent: str,
    *,
    lease_only: bool,
    terms_only: bool,
    own: str = "",
    claims_of: Callable[[str], Path] | None = None,
    relist_s: float = RELIST_S,
) -> AsyncIterator[None]:
    """Yield None whenever any subtree's watch yields, or a new subtree appears; own: this
    node's subtree, the one whose watch keeps terms_only; claims_of: the folder of a node's
    published claims of agent, watched for every node but own."""
    following = _Following(agent)
    try:
        first = True
        while True:
            for node, store in (await _listed(subtrees)).items():
                arrived = (node, "store") not in following.tasks
                # Another node's claim is read from what it published: its own lease record
                # is no term to keep, and a change of its published claims is a hint to look.
                terms = terms_only and node == own
                watch = functools.partial(
                    store.watch, agent, lease_only=lease_only, terms_only=terms
                )
                following.keep(node, "store", watch)
                if claims_of is not None and node != own:
                    following.keep(
                        node, "claims", functools.partial(claim_changes, claims_of(node))
                    )
                if not first and arrived:
                    following.woken.set()  # a subtree that arrived: its records may be new
            first = False
            if await following.woken_within(relist_s):
                yield None
    finally:
        await following.close()


async def _listed(subtrees: Callable[[], Mapping[str, Store]]) -> Mapping[str, Store]:
    try:
        return await asyncio.to_thread(subtrees)
    except StoreError as exc:
        log.warning("could not list the node subtrees to watch: %s", exc)
        return {}


class _Following:
    """The watches a merged watch follows, by (node, kind), each a task that sets woken."""

    def __init__(self, agent: str) -> None:
        self.agent = agent
        self.woken = asyncio.Event()
        self.tasks: dict[tuple[str, str], asyncio.Task[None]] = {}

    def keep(self, node: str, kind: str, start: Callable[[], AsyncIterator[object]]) -> None:
        """Follow start()'s changes, unless a task follows (node, kind) still."""
        task = self.tasks.get((node, kind))
        if task is None or task.done():
            self.tasks[node, kind] = asyncio.create_task(self._follow(node, start()))

    async def _follow(self, node: str, changes: AsyncIterator[object]) -> None:
        try:
            async for _ in changes:
                self.woken.set()
        except (OSError, StoreError) as exc:  # watched again at the next listing
            log.warning("watch of node %s's records of %s failed: %s", node, self.agent, exc)
        finally:
            if isinstance(changes, AsyncGenerator):  # closed now, not when collected
                await changes.aclose()

    async def woken_within(self, timeout_s: float) -> bool:
        """Whether a change came (by now, or within timeout_s); cleared for the next."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.woken.wait(), timeout=timeout_s)
        woken = self.woken.is_set()
        self.woken.clear()
        return woken

    async def close(self) -> None:
        for task in self.tasks.values():
            task.cancel()
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)


async def claim_changes(folder: Path) -> AsyncIterator[None]:
    """Yield when a claim is published into folder or removed from it; waits (reading only)
    for the folder to be made. inotify sees this machine's writes only: on NFS it polls."""
    import watchfiles  # only here: a node that never watches never loads it

    while True:
        while not _is_plain_dir(folder):
            await asyncio.sleep(_FOLDER_RETRY_S)
        names = open_lease_watch(folder, is_claim_name)
        if names is None:
            break  # watchfiles instead
        async with contextlib.aclosing(names):
            async for _ in names:  # ends when the folder goes
                yield None
        yield None  # gone, or replaced: look again
    while not _is_plain_dir(folder):  # gone again since it was looked for
        await asyncio.sleep(_FOLDER_RETRY_S)
    async for _batch in watchfiles.awatch(
        folder,
        watch_filter=lambda _change, path: is_claim_name(os.path.basename(path)),
        step=20,
        debounce=200,
        force_polling=mount_of(folder).fstype.startswith("nfs"),
        poll_delay_ms=100,
        recursive=False,
    ):
        yield None


def _is_plain_dir(path: Path) -> bool:
    try:
        return stat.S_ISDIR(path.lstat().st_mode)
    except OSError:
        return False
