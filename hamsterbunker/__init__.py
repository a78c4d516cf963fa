"""HamsterBunker: keeps one long-running agent alive when the machine under it dies.

from hamsterbunker import Runtime, FileStore

node = Runtime(node_id="hbnk-1", region="eu-central", store=FileStore("/srv/hb"),
               agent=MyAgent(), secret=secret)
node.run()    # or node.start() ... node.stop()
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .agent.effects import EffectContext, current_effect
    from .agent.inbox import Admission, Submission
    from .agent.step import Agent, StepContext, current_step, load_agent
    from .core.errors import (
        ConfigError,
        CorruptRecord,
        EffectError,
        EffectFailed,
        EffectInterrupted,
        EffectMismatch,
        Fenced,
        HamsterbunkerError,
        InboxError,
        InboxFull,
        LeaseConflict,
        NoUsableCheckpoint,
        SealError,
        SecretTooShort,
        StoreError,
        StoreRegressed,
        StoreUnavailable,
        StoreUnsafe,
        Tampered,
        UnknownRequest,
        WrongSecret,
    )
    from .core.timing import LeaseTiming
    from .node import Runtime
    from .ops.client import Client
    from .records import Event, Heartbeat, LeaseRecord
    from .stores import Store, open_store
    from .stores.layer.files import FileStore

__all__ = [
    "Admission",
    "Agent",
    "Client",
    "ConfigError",
    "CorruptRecord",
    "EffectContext",
    "EffectError",
    "EffectFailed",
    "EffectInterrupted",
    "EffectMismatch",
    "Event",
    "Fenced",
    "FileStore",
    "HamsterbunkerError",
    "Heartbeat",
    "InboxError",
    "InboxFull",
    "LeaseConflict",
    "LeaseRecord",
    "LeaseTiming",
    "NoUsableCheckpoint",
    "Runtime",
    "SealError",
    "SecretTooShort",
    "StepContext",
    "Store",
    "StoreError",
    "StoreRegressed",
    "StoreUnavailable",
    "StoreUnsafe",
    "Submission",
    "Tampered",
    "UnknownRequest",
    "WrongSecret",
    "current_effect",
    "current_step",
    "load_agent",
    "open_store",
]

__version__ = "0.1.0"

# Where each public name lives. Imported when first asked for (PEP 562), so that a
# program importing one part, the command line above all, does not pay for them all.
_HOMES = {
    "Admission": ".agent.inbox",
    "Agent": ".agent.step",
    "Client": ".ops.client",
    "ConfigError": ".core.errors",
    "CorruptRecord": ".core.errors",
    "EffectContext": ".agent.effects",
    "EffectError": ".core.errors",
    "EffectFailed": ".core.errors",
    "EffectInterrupted": ".core.errors",
    "EffectMismatch": ".core.errors",
    "Event": ".records",
    "Fenced": ".core.errors",
    "FileStore": ".stores.layer.files",
    "HamsterbunkerError": ".core.errors",
    "Heartbeat": ".records",
    "InboxError": ".core.errors",
    "InboxFull": ".core.errors",
    "LeaseConflict": ".core.errors",
    "LeaseRecord": ".records",
    "LeaseTiming": ".core.timing",
    "NoUsableCheckpoint": ".core.errors",
    "Runtime": ".node",
    "SealError": ".core.errors",
    "SecretTooShort": ".core.errors",
    "StepContext": ".agent.step",
    "Store": ".stores",
    "StoreError": ".core.errors",
    "StoreRegressed": ".core.errors",
    "StoreUnavailable": ".core.errors",
    "StoreUnsafe": ".core.errors",
    "Submission": ".agent.inbox",
    "Tampered": ".core.errors",
    "UnknownRequest": ".core.errors",
    "WrongSecret": ".core.errors",
    "current_effect": ".agent.effects",
    "current_step": ".agent.step",
    "load_agent": ".agent.step",
    "open_store": ".stores",
}


def __getattr__(name: str) -> object:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home, __name__), name)
    globals()[name] = value  # asked once
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
