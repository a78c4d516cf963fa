"""The one error tree of HamsterBunker.

    HamsterbunkerError
    ├── ConfigError            bad flag, URL, timing, agent path (a user mistake)
    │   └── SecretTooShort     secret under 8 characters, refused before anything starts
    ├── StoreError             anything the store could not do
    │   ├── StoreUnavailable   the store cannot be reached or did not answer in time
    │   ├── StoreUnsafe        the location cannot give mutual exclusion (a synced folder)
    │   ├── CorruptRecord      a lease, cluster or event record that does not parse
    │   │   └── UnreadableLease  the lease record does not parse: names what is stored instead
    │   ├── LeaseConflict      compare-and-set lost: the record changed since it was read
    │   ├── ClusterChanged     the cluster record changed since it was read (a rotation's CAS)
    │   ├── InboxFull          an admission over the inbox's count or byte limit
    │   ├── NotNextNumber      an admission raced another: its number was taken
    │   └── Fenced             a write under an epoch that is no longer the lease's
    ├── SealError              a checkpoint could not be sealed or opened
    │   ├── WrongSecret        the secret does not match the cluster's key-check value
    │   └── Tampered           a checkpoint failed to authenticate (edited, truncated,
    │                          moved to another agent, or replayed under another number)
    ├── NoUsableCheckpoint     checkpoints exist but none authenticates: refuse to resume
    │   └── StoreRegressed     the store holds less than this node saw accepted: refuse
    ├── StepLost               raised in a step by current_step().check(): the step may no
    │                          longer be published (renew deadline passed, lease lost)
    ├── EffectError            a journaled effect's problem (EffectInterrupted, ...)
    ├── InboxError             a step used its inbox wrongly
    ├── UnknownRequest         no admission of a request id is known
    └── ControlRefused         an operator's request that cannot be carried out now

Backend errors are translated at the store boundary with ``raise ... from exc``.
"""

from __future__ import annotations

__all__ = [
    "ClusterChanged",
    "ConfigError",
    "ControlRefused",
    "CorruptRecord",
    "EffectError",
    "EffectFailed",
    "EffectInterrupted",
    "EffectMismatch",
    "Fenced",
    "HamsterbunkerError",
    "InboxError",
    "InboxFull",
    "LeaseConflict",
    "NoUsableCheckpoint",
    "NotNextNumber",
    "SealError",
    "SecretTooShort",
    "StepLost",
    "StoreError",
    "StoreRegressed",
    "StoreUnavailable",
    "StoreUnsafe",
    "Tampered",
    "UnknownRequest",
    "UnreadableLease",
    "WrongSecret",
]


class HamsterbunkerError(Exception):
    """Base of every error this package raises on purpose."""


class ConfigError(HamsterbunkerError):
    """A user mistake in flags, URLs, timing or agent paths."""


class SecretTooShort(ConfigError):
    """The network secret is shorter than 8 characters."""


class StoreError(HamsterbunkerError):
    """The store could not do what was asked."""


class StoreUnavailable(StoreError):
    """The store cannot be reached, or did not answer in time."""


class StoreUnsafe(StoreError):
    """The store's location cannot give mutual exclusion (for example a synced folder)."""


class CorruptRecord(StoreError):
    """A record in the store does not parse or has the wrong shape."""


class UnreadableLease(CorruptRecord):
    """The lease record does not parse. ``found`` names what is stored instead (a digest, a
    revision: it changes with what is stored), for ``Store.replace_unreadable_lease``."""

    def __init__(self, message: str, found: str) -> None:
        super().__init__(message)
        self.found = found


class InboxFull(StoreError):
    """An admission was refused: the inbox holds its limit of unconsumed submissions or bytes."""


class NotNextNumber(StoreError):
    """An admission named a number that is not the inbox's next one: nothing was admitted."""

    def __init__(self, number: int, next_number: int) -> None:
        super().__init__(f"submission number {number} is not the next one ({next_number})")
        self.number, self.next_number = number, next_number


class LeaseConflict(StoreError):
    """A compare-and-set of the lease lost: the record changed since it was read."""


class ClusterChanged(StoreError):
    """The cluster record is no longer the one a compare-and-set expected (nothing written)."""


class Fenced(StoreError):
    """A write under an epoch that is no longer the current lease's: the writer must step down."""


class SealError(HamsterbunkerError):
    """A checkpoint could not be sealed or opened."""


class StateNotJson(SealError):
    """The agent's state cannot be encoded as JSON (a step returned it): the agent's own
    failure, backed off and handed over as a failing step is."""


class WrongSecret(SealError):
    """The secret does not match the key-check value in the cluster record."""


class Tampered(SealError):
    """A sealed checkpoint failed to authenticate or does not match where it was found."""


class NoUsableCheckpoint(HamsterbunkerError):
    """Checkpoints exist but none authenticates: the node refuses to resume from init()."""


class StoreRegressed(NoUsableCheckpoint):
    """The store's newest checkpoint is behind one this node saw accepted (or all are gone)."""


class AgentInitFailed(HamsterbunkerError):
    """The agent's init() raised: no state to start from. Backed off and retried as a failing
    step is (``--max-step-failures``); the agent's own exception is the cause."""


class StepLost(HamsterbunkerError):
    """The running step may no longer be published: its lease's renew deadline passed, or the
    lease was lost. Raised by ``current_step().check()`` so a long sync step can stop early."""


class EffectError(HamsterbunkerError):
    """Something about a journaled effect (``current_step().effect``) the step must hear of."""


class EffectInterrupted(EffectError):
    """A ``replay="interrupted"`` effect was started before a crash or stop and its outcome
    is unknown: it may or may not have happened. It is never called again for this step."""

    def __init__(self, name: str, seq: int, index: int) -> None:
        super().__init__(
            f"effect {name!r} (number {index} of step {seq}) was started before the last "
            "leader stopped and its outcome is unknown: it may or may not have happened"
        )
        self.name, self.seq, self.index = name, seq, index


class EffectMismatch(EffectError):
    """A replay called its effects in another order or under other names than the journal."""

    def __init__(self, seq: int, index: int, recorded: str, called: str) -> None:
        super().__init__(
            f"step {seq} called effect {called!r} as number {index}, but the journal of its "
            f"earlier run has {recorded!r} there: a step must call its effects in the same "
            "order with the same names on every run"
        )
        self.seq, self.index, self.recorded, self.called = seq, index, recorded, called


class EffectFailed(EffectError):
    """The effect's function raised; its type and message are recorded and raised again on
    every replay of the step (the first run chains the original exception)."""

    def __init__(self, name: str, error_type: str, message: str) -> None:
        super().__init__(f"effect {name!r} failed: {error_type}: {message}")
        self.name, self.error_type, self.message = name, error_type, message


class InboxError(HamsterbunkerError):
    """A step used its inbox wrongly (consumed a number it was not shown, a reply too big)."""


class UnknownRequest(HamsterbunkerError):
    """No admission of this request id is known: never submitted, or compacted long ago."""


class ControlRefused(HamsterbunkerError):
    """An operator request (hb switchover, pause, forget) refused for now: nothing was changed."""
