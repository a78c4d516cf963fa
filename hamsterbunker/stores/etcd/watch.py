"""The etcd store's watch: a thread per watch that keeps an etcd watch stream open.

``EtcdStore.watch`` turns its hints into an async iterator; this module is the
thread that follows a key or range in etcd and calls hint() after a change.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import replace

import requests
from etcd3gw.client import Etcd3Client
from etcd3gw.exceptions import Etcd3Exception
from etcd3gw.types import Event as WatchEvent
from etcd3gw.watch import Watcher

from ...errors import CorruptRecord
from ...records import LeaseRecord
from .._terms import TermChanges
from ..backends.etcd_connection import EtcdConnection
from .kv import revision

__all__ = ["Follower", "lease_in", "term_changes"]

log = logging.getLogger("hamsterbunker.stores.etcd")

_WATCH_RETRY_S = (0.1, 2.0)  # backoff bounds while the watch cannot be set up


class Follower(threading.Thread):
    """Keeps an etcd watch on one key or range open, calling hint() after every change.

    etcd3gw's watcher is a blocking HTTP stream read in a thread; this thread
    sets it up, renews it every renew_s (from the last revision seen, so
    nothing is missed between two streams), and backs off while etcd cannot be
    reached. A watch is a hint: failures are logged, never raised. wanted, if
    given, picks the events worth a hint (a change unseen between two streams
    is hinted all the same). hint is given the event, or None for a change
    found unwatched (between two streams).
    """

    def __init__(
        self,
        connection: EtcdConnection,
        key: str,
        range_end: str | None,
        hint: Callable[[WatchEvent | None], None],
        *,
        renew_s: float,
        wanted: Callable[[WatchEvent], bool] | None = None,
    ) -> None:
        super().__init__(name=f"hb-etcd-watch {key}", daemon=True)
        self._connection = connection
        self._renew_s = renew_s
        self._key = key
        self._range_end = range_end
        self._hint = hint
        self._wanted = wanted  # which changes to hint (default: all)
        self._stopping = threading.Event()
        self._seen = 0  # the highest revision whose changes were hinted

    def stop(self) -> None:
        """Ask the thread to end; it closes its stream within one HTTP timeout at most."""
        self._stopping.set()

    def run(self) -> None:
        delay = _WATCH_RETRY_S[0]
        caught_up = False
        while not self._stopping.is_set():
            connection, endpoint = self._connection, self._connection.current
            # Reads of an idle stream wait for the next renewal, and a little longer.
            client = connection.client(endpoint, self._renew_s + connection.target.timeout)
            watcher = None
            try:
                self._catch_up(client, hint_missed=caught_up)
                caught_up = True
                watcher = Watcher(
                    client,
                    self._key,
                    self._on_event,
                    range_end=self._range_end,
                    start_revision=self._seen + 1,
                )
                delay = _WATCH_RETRY_S[0]
                self._stopping.wait(self._renew_s)
            except (Etcd3Exception, requests.RequestException, ValueError, KeyError) as exc:
                log.info("etcd watch of %s failed (%s); retrying in %.1f s", self._key, exc, delay)
                connection.next_endpoint(endpoint)
                self._stopping.wait(delay)
                delay = min(delay * 2, _WATCH_RETRY_S[1])
            finally:
                if watcher is not None:
                    watcher.stop()
                client.session.close()

    def _catch_up(self, client: Etcd3Client, *, hint_missed: bool) -> None:
        """Start the next stream at the current revision; hint if a key changed unwatched."""
        now = int(client.status()["header"]["revision"])
        if hint_missed:
            newest = client.get(
                self._key,
                metadata=True,
                range_end=self._range_end,
                sort_order="descend",
                sort_target="mod",
                limit=1,
                keys_only=True,
            )
            if newest and int(newest[0][1]["mod_revision"]) > self._seen:
                self._hint(None)
        self._seen = max(self._seen, now)

    def _on_event(self, event: WatchEvent) -> None:
        self._seen = max(self._seen, int(event["kv"]["mod_revision"]))
        if self._wanted is None or self._wanted(event):
            self._hint(event)


def term_changes() -> Callable[[WatchEvent], bool]:
    """Whether an event of the lease key changes its term (see TermChanges), judged from
    the value the event carries: a renewal wakes nobody, and nothing is read."""
    terms = TermChanges()

    def changed(event: WatchEvent) -> bool:
        value = None if event.get("type") == "DELETE" else event["kv"].get("value")
        return terms.changed(value)

    return changed


def lease_in(event: WatchEvent | None) -> LeaseRecord | None:
    """The lease record a watch event of the lease key carries, its version set (None if
    the key was deleted, the record does not parse, or there is no event: read then)."""
    if event is None or event.get("type") == "DELETE":
        return None
    kv = event["kv"]
    try:
        return replace(LeaseRecord.from_json(kv.get("value") or b""), version=revision(kv))
    except CorruptRecord:
        return None  # the node's read reports it
