"""Failpoints for fault tests: off unless ``HB_FAILPOINTS`` is set.

``HB_FAILPOINTS="checkpoint.before_commit=stop"`` makes the process stop itself
(SIGSTOP) the first time it reaches that point; ``=kill`` kills it (SIGKILL).
Several are separated by commas. See docs/failpoints.md for the points.
"""

from __future__ import annotations

import os
import signal

__all__ = ["failpoint"]

_ACTIONS = {"stop": signal.SIGSTOP, "kill": signal.SIGKILL}
_fired: set[str] = set()


def _armed() -> dict[str, str]:
    spec = os.environ.get("HB_FAILPOINTS", "")
    points = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, _, action = item.partition("=")
        points[name] = action
    return points


def failpoint(name: str) -> None:
    """Act on the failpoint called name if it is armed and has not fired yet."""
    if "HB_FAILPOINTS" not in os.environ or name in _fired:
        return
    action = _armed().get(name)
    if action in _ACTIONS:
        _fired.add(name)
        os.kill(os.getpid(), _ACTIONS[action])
