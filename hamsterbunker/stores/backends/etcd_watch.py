"""The etcd backend's watch: a thread that keeps an etcd watch stream of one key range open."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import requests
from etcd3gw.client import Etcd3Client
from etcd3gw.exceptions import Etcd3Exception
from etcd3gw.types import Event as WatchEvent
from etcd3gw.watch import Watcher

from ...core.limits import MAX_RECORD_BYTES
from ..backend import Notice
from .etcd_connection import EtcdConnection, grpc_error

__all__ = ["Follower"]

log = logging.getLogger(__name__)

# etcd3gw reports no stream that died silently: each is replaced after this long, from the
# last revision seen, so a lost stream delays notices by at most this much.
WATCH_RENEW_S = 10.0
_WATCH_RETRY_S = (0.1, 2.0)  # backoff bounds while the watch cannot be set up
# A notice carries a value up to this size; a larger one (a checkpoint) is read to know.
_NOTICE_VALUE_BYTES = MAX_RECORD_BYTES


class Follower(threading.Thread):
    """Keeps an etcd watch of one key range open (etcd3gw's blocking stream, renewed every
    WATCH_RENEW_S), telling a Notice per event, and Notice(None) for what etcd can no longer
    replay (compacted). Failures are logged, never raised: a watch is a hint."""

    def __init__(
        self,
        connection: EtcdConnection,
        start: bytes,
        end: bytes,
        name_of: Callable[[bytes], str],
        tell: Callable[[Notice], None],
    ) -> None:
        super().__init__(name=f"hb-etcd-watch {start.decode(errors='replace')}", daemon=True)
        self._connection = connection
        # etcd3gw takes a range's end as text, and encodes it as latin-1: so is it decoded.
        self._start, self._end = start, end.decode("latin-1")
        self._name_of = name_of
        self._tell = tell
        self._stopping = threading.Event()
        self._seen: int | None = None  # the revision up to which every event was told

    def stop(self) -> None:
        """Ask the thread to end; it closes its stream within one HTTP timeout at most."""
        self._stopping.set()

    def run(self) -> None:
        delay = _WATCH_RETRY_S[0]
        while not self._stopping.is_set():
            connection, endpoint = self._connection, self._connection.current
            # Reads of an idle stream wait for the next renewal, and a little longer.
            client = connection.client(endpoint, WATCH_RENEW_S + connection.target.timeout)
            watcher = None
            try:
                seen = self._resume_at(client)
                watcher = Watcher(
                    client,
                    self._start,
                    self._on_event,
                    range_end=self._end,
                    start_revision=seen + 1,
                )
                delay = _WATCH_RETRY_S[0]
                self._stopping.wait(WATCH_RENEW_S)
            except (Etcd3Exception, requests.RequestException, ValueError, KeyError) as exc:
                log.info(
                    "etcd watch of %r failed (%s); retrying in %.1f s", self._start, exc, delay
                )
                connection.next_endpoint(endpoint)
                self._stopping.wait(delay)
                delay = min(delay * 2, _WATCH_RETRY_S[1])
            finally:
                if watcher is not None:
                    watcher.stop()
                client.session.close()

    def _resume_at(self, client: Etcd3Client) -> int:
        """The revision the next stream starts after: the last seen, unless etcd compacted
        what came since (a gap, told), or there was none yet (now: from now on)."""
        now = int(client.status()["header"]["revision"])
        seen = self._seen
        if seen is not None and seen < now:
            try:  # only to learn whether etcd still holds the revisions after seen
                client.get(self._start, range_end=self._end, revision=seen + 1, count_only=True)
            except Etcd3Exception as exc:
                if "compacted" not in grpc_error(exc)[1]:
                    raise
                self._tell(Notice(None))
                seen = None
        if seen is None:
            self._seen = seen = now
        return seen

    def _on_event(self, event: WatchEvent) -> None:
        if self._stopping.is_set():  # the stream's last events, read after stop()
            return
        kv = event["kv"]
        self._seen = max(self._seen or 0, int(kv["mod_revision"]))
        key = self._name_of(bytes(kv["key"]))  # etcd3gw decoded key and value already
        if event.get("type") == "DELETE":
            self._tell(Notice(key, None))
            return
        value = bytes(kv.get("value", b""))
        self._tell(Notice(key, value if len(value) <= _NOTICE_VALUE_BYTES else None))
