"""A store an earlier version wrote is refused, never read as an empty store.

This version keeps every record in the record layer's layout (``stores.layer.keys``)
on a backend. A store an earlier version wrote holds the same records elsewhere: at
the directory's root beside no ``kv/``, under Redis keys ``P:...`` beside the
backend's ``{P}:...``, under the etcd prefix by names of its own and with no index
of agents. Read by this version it would look empty, and a node would start its
agents afresh: silent loss of their state. So each backend looks for the earlier
layout's marker before its first read and refuses the store; ``hb migrate-store``
(``stores.migrate``, reading through ``stores.earlier``) copies it into this
version's layout.
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
