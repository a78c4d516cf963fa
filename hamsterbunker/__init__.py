"""HamsterBunker: keeps one long-running agent alive when the machine under it dies.

from hamsterbunker import Runtime, FileStore

node = Runtime(node_id="hbnk-1", region="eu-central", store=FileStore("/srv/hb"),
               agent=MyAgent(), secret=secret)
node.run()    # or node.start() ... node.stop()
"""

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
