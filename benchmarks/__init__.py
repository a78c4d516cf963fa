"""HamsterBunker's benchmarks: ``python -m benchmarks`` (or ``make bench``).

Each module measures one thing and returns a ``common.Result``; ``__main__``
runs them, prints each as tables and writes ``docs/benchmarks.md``.
"""

from __future__ import annotations

from . import (
    backends,
    effects,
    failover,
    growth,
    handover,
    inbox,
    integrations,
    layer,
    many_agents,
    publish,
    regions,
    standby,
    steps,
    switchover,
    syncdir,
    tui,
    tui_idle,
    versions,
)

__all__ = ["BENCHMARKS"]

# In the order of docs/benchmarks.md; the key is the name for --only.
BENCHMARKS = {
    module.NAME: module
    for module in (
        failover,
        handover,
        switchover,
        backends,
        publish,
        growth,
        effects,
        inbox,
        integrations,
        steps,
        standby,
        many_agents,
        tui,
        tui_idle,
        regions,
        syncdir,
        layer,
        versions,
    )
}
