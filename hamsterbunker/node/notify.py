"""Talking to systemd (sd_notify): readiness, status, watchdog pings, stopping.

Over ``sdnotify``, made to raise (the first failure of each kind logged), to send
UTF-8, never to block, and to send each message in a datagram of its own
(docs/design.md, "The node"). Outside systemd (no ``$NOTIFY_SOCKET``) it does nothing.
"""

from __future__ import annotations

import logging
import os
from collections.abc import MutableMapping

import sdnotify

__all__ = ["Notifier"]

log = logging.getLogger("hamsterbunker.node.notify")

# The variables systemd passes to the service's main process only: removed so
# that processes the agent starts do not notify (or ping) on our behalf.
_OUR_VARIABLES = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")


class Notifier:
    """The service manager's side of the node: a no-op outside systemd."""

    def __init__(self, notify_socket: str | None, watchdog_usec: int | None = None) -> None:
        self._client: sdnotify.SystemdNotifier | None = None
        self._failed: set[str] = set()
        self._status: str | None = None
        self._stopping = False
        self.watchdog_usec = watchdog_usec
        if notify_socket:
            self._client = self._connect(notify_socket)

    @classmethod
    def from_environment(
        cls, environ: MutableMapping[str, str] | None = None, *, unset: bool = True
    ) -> Notifier:
        """Read systemd's variables; the watchdog counts only if WATCHDOG_PID is us (or unset)."""
        env = os.environ if environ is None else environ
        socket_path = env.get("NOTIFY_SOCKET")
        watchdog_usec = _watchdog_usec(env.get("WATCHDOG_USEC"), env.get("WATCHDOG_PID"))
        if unset:
            for name in _OUR_VARIABLES:
                env.pop(name, None)
        return cls(socket_path, watchdog_usec)

    @property
    def enabled(self) -> bool:
        return self._client is not None

    @property
    def watchdog_interval(self) -> float | None:
        """Seconds between pings (half of WATCHDOG_USEC), or None without a watchdog."""
        if self._client is None or self.watchdog_usec is None:
            return None
        return self.watchdog_usec / 2_000_000

    def ready(self) -> None:
        self._send("READY=1")

    def status(self, text: str) -> None:
        """Send STATUS= when the text changed (one line: newlines would end the field)."""
        line = " ".join(text.split())
        if line != self._status:
            self._status = line
            self._send(f"STATUS={line}")

    def watchdog(self) -> None:
        self._send("WATCHDOG=1")

    def stopping(self) -> None:
        if not self._stopping:
            self._stopping = True
            self._send("STOPPING=1")

    def extend_timeout(self, seconds: float) -> None:
        """Ask for ``seconds`` more before the start or stop timeout fires (from now)."""
        self._send(f"EXTEND_TIMEOUT_USEC={round(seconds * 1_000_000)}")

    def close(self) -> None:
        if self._client is not None and self._client.socket is not None:
            self._client.socket.close()
        self._client = None

    def _connect(self, notify_socket: str) -> sdnotify.SystemdNotifier | None:
        saved = os.environ.get("NOTIFY_SOCKET")
        os.environ["NOTIFY_SOCKET"] = notify_socket  # sdnotify reads only the environment
        try:
            client = sdnotify.SystemdNotifier(debug=True)
        except (OSError, TypeError, IndexError) as exc:
            log.warning("cannot reach systemd at NOTIFY_SOCKET=%s: %s", notify_socket, exc)
            return None
        finally:
            if saved is None:
                del os.environ["NOTIFY_SOCKET"]
            else:
                os.environ["NOTIFY_SOCKET"] = saved
        client.socket.setblocking(False)
        return client

    def _send(self, message: str) -> None:
        if self._client is None:
            return
        try:
            # sdnotify encodes as Latin-1: give it the Latin-1 spelling of our UTF-8.
            self._client.notify(message.encode("utf-8", "replace").decode("latin-1"))
        except OSError as exc:
            kind = message.partition("=")[0]
            if kind not in self._failed:  # once per kind: a ping every few seconds would flood
                self._failed.add(kind)
                log.warning("systemd notification %s failed: %s", kind, exc)


def _watchdog_usec(usec: str | None, pid: str | None) -> int | None:
    if not usec:
        return None
    if pid and pid != str(os.getpid()):
        return None  # the watchdog is some other process's (we were started by it)
    try:
        value = int(usec)
    except ValueError:
        log.warning("ignoring WATCHDOG_USEC=%r: not a whole number", usec)
        return None
    return value if value > 0 else None
