"""A store an earlier version wrote is refused, never read as an empty store (which would
start its agents afresh): docs/design.md, "One record layer over a small backend interface".
"""

from __future__ import annotations

from ...core.errors import ConfigError

__all__ = ["earlier_store"]


def earlier_store(store: str, found: str) -> ConfigError:
    """The one-line refusal of store (as it may be shown), in which found is the marker."""
    return ConfigError(
        f"{store} was written by an earlier version of HamsterBunker ({found}), in a layout "
        "this version does not read: stop its nodes and copy it into a new, empty store "
        "(another directory, prefix or database) with `hb migrate-store --from URL --to "
        "NEW-URL`, then start this version's nodes on that one"
    )
