"""Failpoints for fault tests: off unless ``HB_FAILPOINTS`` is set (``docs/failpoints.md``).

``HB_FAILPOINTS="checkpoint.before_commit=stop@3"``: SIGSTOP (``kill``: SIGKILL) the third
time that point is reached. Inside ``failpoints_within(scope)`` a point is reached as
``scope.name`` too. A stop waits for other threads to leave ``not_stopped_inside()``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator

__all__ = ["failpoint", "failpoints_within", "not_stopped_inside"]

_ACTIONS = {"stop": signal.SIGSTOP, "kill": signal.SIGKILL}
_hits: dict[str, int] = {}
_scope = threading.local()  # the scope of the calls this thread is in, if any
_unstoppable = threading.RLock()  # held across not_stopped_inside() blocks, and by a stop


def _armed() -> dict[str, tuple[str, int]]:
    spec = os.environ.get("HB_FAILPOINTS", "")
    points = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, _, action = item.partition("=")
        action, _, nth = action.partition("@")
        points[name] = (action, int(nth) if nth.isdigit() else 1)
    return points


def failpoint(name: str) -> None:
    """Act on the failpoint called name (or scope.name) if it is armed and this is its turn."""
    if "HB_FAILPOINTS" not in os.environ:
        return
    scope: str | None = getattr(_scope, "name", None)
    armed = _armed()
    for point in (name,) if scope is None else (name, f"{scope}.{name}"):
        action = armed.get(point)
        if action is None or action[0] not in _ACTIONS:
            continue
        _hits[point] = _hits.get(point, 0) + 1
        if _hits[point] == action[1]:
            # Aimed at this thread, not the process: a process-directed signal may be
            # taken by another thread while this one runs on past the failpoint. The
            # process stops as the call returns, before this thread lets go of the lock.
            with _unstoppable:
                signal.pthread_kill(threading.get_ident(), _ACTIONS[action[0]])


@contextlib.contextmanager
def failpoints_within(scope: str) -> Iterator[None]:
    """The points this thread reaches inside are reached as ``scope.<point>`` too."""
    outer = getattr(_scope, "name", None)
    _scope.name = scope
    try:
        yield
    finally:
        _scope.name = outer


@contextlib.contextmanager
def not_stopped_inside() -> Iterator[None]:
    """A failpoint's stop in another thread of this process waits until the block ends
    (one inside it, in this thread, does not: it aims at that point)."""
    if "HB_FAILPOINTS" not in os.environ:
        yield
        return
    with _unstoppable:
        yield
