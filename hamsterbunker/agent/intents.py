"""The ``interrupted`` effects a node began, remembered outside the store: a store writer
without the secret cannot forge an intent but can delete one, and the node that began the
effect then treats it as interrupted all the same (``docs/design.md``, "Leases, effects and
sealing in the code"). Kept in memory, and with a state directory in a file written durably
before the effect is called.
"""

from __future__ import annotations

import contextlib
import json
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

from ..core.durable import replace_file, sweep_temps
from ..core.errors import ConfigError, CorruptRecord
from ..core.limits import MAX_EFFECTS_PER_STEP
from ..records import parse_json

__all__ = ["BegunIntent", "IntentLog"]

FORMAT = 1
_TEMP_PREFIX = ".intents-"
# The intents of one step, one per effect number (see add): a name of up to 200
# characters, each at most 12 bytes in ASCII JSON (a surrogate pair), and the numbers.
_MAX_BYTES = MAX_EFFECTS_PER_STEP * (12 * 200 + 200) + 100


@dataclass(frozen=True)
class BegunIntent:
    """An intent this node wrote to the store: where, under which term, in which order."""

    seq: int
    index: int
    name: str
    epoch: int
    order: int  # the order of the write in its term (hamsterbunker.node.journal)
    attempt: int  # the run of the step in its term that wrote it


class IntentLog:
    """The intents a node began for one agent on one store; kept in ``path`` if given.

    Safe to call from several threads: a node writes intents from its I/O threads.
    """

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._intents: list[BegunIntent] = [] if path is None else _load(path)

    def of_step(self, seq: int) -> list[BegunIntent]:
        with self._lock:
            return [intent for intent in self._intents if intent.seq == seq]

    def add(self, intent: BegunIntent) -> None:
        """Remember intent, durably once this returns (those of other steps, and one at the
        same number, are let go: a node begins effects in one step at a time)."""
        with self._lock:
            kept = [i for i in self._intents if i.seq == intent.seq and i.index != intent.index]
            self._keep([*kept, intent])

    def stale(self, seq: int, index: int, name: str) -> bool:
        """Whether an intent at (seq, index) of another name than name is kept."""
        with self._lock:
            return any((i.seq, i.index) == (seq, index) and i.name != name for i in self._intents)

    def supersede(self, seq: int, index: int, name: str) -> None:
        """Forget the intents at (seq, index) of another name than name: a later path of
        the step wrote its own record there, and the old intent must not come back."""
        with self._lock:
            kept = [i for i in self._intents if (i.seq, i.index) != (seq, index) or i.name == name]
            if len(kept) != len(self._intents):
                self._keep(kept)

    def _keep(self, intents: list[BegunIntent]) -> None:
        if self.path is not None:
            _save(self.path, intents)
        self._intents = intents


def _load(path: Path) -> list[BegunIntent]:
    with contextlib.suppress(FileNotFoundError):
        sweep_temps(path.parent, _TEMP_PREFIX)
    try:
        with open(path, "rb") as file:
            data = file.read(_MAX_BYTES + 1)
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise ConfigError(f"cannot read the node's intents {path}: {exc}") from exc
    try:
        doc = parse_json(data, "intents file", limit=_MAX_BYTES)
        if doc["format"] != FORMAT:
            raise ValueError(f"format {doc['format']!r}, not {FORMAT}")
        return [_intent(item) for item in doc["intents"]]
    except (KeyError, ValueError, TypeError, CorruptRecord) as exc:
        raise ConfigError(
            f"the node's intents {path} are damaged ({exc}); remove the file to start without "
            "them (a replay on this node then trusts the store's effect journal alone)"
        ) from exc


def _intent(item: object) -> BegunIntent:
    if not isinstance(item, dict):
        raise ValueError("an intent is not an object")
    intent = BegunIntent(**item)
    counts = (intent.seq, intent.index, intent.epoch, intent.order, intent.attempt)
    if not all(type(n) is int and n >= 0 for n in counts) or not isinstance(intent.name, str):
        raise ValueError(f"an intent has fields of the wrong type: {item}")
    return intent


def _save(path: Path, intents: list[BegunIntent]) -> None:
    doc = {"format": FORMAT, "intents": [asdict(intent) for intent in intents]}
    replace_file(path, json.dumps(doc), _TEMP_PREFIX)
