"""Failpoints for fault tests: off unless ``HB_FAILPOINTS`` is set.

``HB_FAILPOINTS="checkpoint.before_commit=stop"`` makes the process stop itself
(SIGSTOP) the first time it reaches that point; ``=kill`` kills it (SIGKILL);
``=stop@3`` acts on the third time instead. Several are separated by commas.
See docs/failpoints.md for the points.
"""

from __future__ import annotations

import os
import signal
import threading

__all__ = ["failpoint"]

_ACTIONS = {"stop": signal.SIGSTOP, "kill": signal.SIGKILL}
_hits: dict[str, int] = {}


def _armed() -> dict[str, tuple[str, int]]:
    spec = os.environ.get("HB_FAILPOINTS", "")
    points = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, _, action = item.partition("=")
        action, _, nth = action.partition("@")
        points[name] = (action, int(nth) if nth.isdigit() else 1)
    return points


def failpoint(name: str) -> None:
    """Act on the failpoint called name if it is armed and this is its turn."""
    if "HB_FAILPOINTS" not in os.environ:
        return
    armed = _armed().get(name)
    if armed is None or armed[0] not in _ACTIONS:
        return
    _hits[name] = _hits.get(name, 0) + 1
    if _hits[name] == armed[1]:
        # Aimed at this thread, not the process: a process-directed signal may be
        # taken by another thread while this one runs on past the failpoint.
        signal.pthread_kill(threading.get_ident(), _ACTIONS[armed[0]])
