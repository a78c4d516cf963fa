"""One watch over every node's subtree: each subtree's store watch and claims, merged.

The subtrees are listed again every ``RELIST_S``: a node whose subtree the
sync tool brings later is watched from then on, and its arrival is itself a
change (its claim may already be there, and its own watch would not report a
file that was there when it started). Another node's claim is read from what
it published (``published``), so its folder of published claims is watched
beside its store: inotify where it can be had, else watchfiles. A watch that
ends or fails is started again at the next listing. Like every watch, a
hint, never proof.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from pathlib import Path

from ...core.errors import StoreError
from ..dirs.lease_watch import lease_changes, open_lease_watch
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
    woken = asyncio.Event()
    following: dict[tuple[str, str], asyncio.Task[None]] = {}

    async def follow(node: str, changes: AsyncIterator[object]) -> None:
        try:
            async for _ in changes:
                woken.set()
        except (OSError, StoreError) as exc:  # watched again at the next listing
            log.warning("watch of node %s's records of %s failed: %s", node, agent, exc)
        finally:
            if isinstance(changes, AsyncGenerator):  # closed now, not when collected
                await changes.aclose()

    def watches(node: str, store: Store) -> dict[str, Callable[[], AsyncIterator[object]]]:
        # Only the own subtree's lease record is current here: another node's claim is read
        # from what it published, so any change of its is a hint to look.
        found: dict[str, Callable[[], AsyncIterator[object]]] = {
            "store": lambda: store.watch(
                agent, lease_only=lease_only, terms_only=terms_only and node == own
            )
        }
        if claims_of is not None and node != own:
            found["claims"] = lambda: claim_changes(claims_of(node))
        return found

    try:
        first = True
        while True:
            try:
                current = await asyncio.to_thread(subtrees)
            except StoreError as exc:
                log.warning("could not list the node subtrees to watch: %s", exc)
                current = {}
            for node, store in current.items():
                arrived = (node, "store") not in following
                for kind, start in watches(node, store).items():
                    task = following.get((node, kind))
                    if task is None or task.done():
                        following[node, kind] = asyncio.create_task(follow(node, start()))
                if not first and arrived:
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


async def claim_changes(folder: Path) -> AsyncIterator[None]:
    """Yield when a claim is published into folder or removed from it; waits (reading only)
    for the folder to be made. inotify sees this machine's writes only: on NFS it polls."""
    import watchfiles  # only here: a node that never watches never loads it

    polling = mount_of(folder).fstype.startswith("nfs")
    while not polling:
        while not _is_plain_dir(folder):
            await asyncio.sleep(_FOLDER_RETRY_S)
        names = open_lease_watch(folder, is_claim_name)
        if names is None:
            break
        async with contextlib.aclosing(lease_changes(names)) as changes:
            async for _ in changes:  # ends when the folder goes
                yield None
        yield None  # gone, or replaced: look again
    while not _is_plain_dir(folder):
        await asyncio.sleep(_FOLDER_RETRY_S)
    async for _batch in watchfiles.awatch(
        folder,
        watch_filter=lambda _change, path: is_claim_name(os.path.basename(path)),
        step=20,
        debounce=200,
        force_polling=polling,
        poll_delay_ms=100,
        recursive=False,
    ):
        yield None


def _is_plain_dir(path: Path) -> bool:
    try:
        return stat.S_ISDIR(path.lstat().st_mode)
    except OSError:
        return False
