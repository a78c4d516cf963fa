"""What a node remembers of a store across its own restarts: the highest epoch and reach
seen, the cluster record and the newest operator's request, so that it notices a store that
went back, or was emptied, while it was down, and obeys no older request put back. Kept with
``--state-dir`` (or ``$STATE_DIRECTORY``), one file per store URL and agent id.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from ..core.clock import Clock, MonotonicClock
from ..core.durable import replace_file, sweep_temps
from ..core.errors import ConfigError, CorruptRecord
from ..core.reach import Reach
from ..records import MAX_CONTROL_CHARS, ClusterRecord, parse_json

__all__ = ["Memory", "MemoryFile"]

FORMAT = 1
# A standby sees the reach move with every renewal of a busy leader; an fsynced
# write per tick on every node is not worth it, since a reach a few seconds old
# still catches a store emptied, or rolled back further than that. A new epoch
# or cluster record, or an operator's request, is kept at once.
REACH_SAVE_INTERVAL_S = 5.0
# Temporary files of save; those older than STALE_TEMP_AGE_S are swept on load.
_TEMP_PREFIX = ".memory-"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Memory:
    epoch: int = 0  # the highest epoch seen
    reach: Reach = field(default_factory=Reach)  # how far the checkpoints were seen to reach
    cluster: ClusterRecord | None = None
    control: str = ""  # the newest operator's request seen, as signed ("" if none)


class MemoryFile:
    """A node's memory of one agent on one store, in ``directory``."""

    def __init__(
        self, directory: Path, store_url: str, agent_id: str, *, clock: Clock | None = None
    ) -> None:
        """``clock``: the node's, on which REACH_SAVE_INTERVAL_S is timed."""
        digest = hashlib.sha256(f"{store_url}\0{agent_id}".encode()).hexdigest()[:16]
        self.path = directory / f"{agent_id}-{digest}.json"
        self.store_url, self.agent_id = store_url, agent_id
        self._saved: Memory | None = None
        self._saved_at = 0.0
        self._clock = clock or MonotonicClock()

    def load(self) -> Memory:
        """The remembered state (nothing if there is no file yet); ConfigError if it is
        damaged. Temporary files a crash left are swept first."""
        _sweep_temps(self.path.parent)
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return Memory()
        except OSError as exc:
            raise ConfigError(f"cannot read the node's memory {self.path}: {exc}") from exc
        try:
            doc = parse_json(data, "memory file")
            if doc["format"] != FORMAT:
                raise ValueError(f"format {doc['format']!r}, not {FORMAT}")
            cluster = doc["cluster"]
            memory = Memory(
                epoch=_count(doc["epoch"]),
                reach=Reach(_count(doc["seq"]), _count(doc["seq_epoch"])),
                cluster=None if cluster is None else ClusterRecord.from_json(cluster.encode()),
                control=_text(doc.get("control", "")),  # absent from files saved before it was kept
            )
        except KeyError as exc:
            raise self._damaged(f"no field {exc}") from exc
        except (ValueError, TypeError, AttributeError, CorruptRecord) as exc:
            raise self._damaged(str(exc)) from exc
        self._saved = memory
        return memory

    def _damaged(self, problem: str) -> ConfigError:
        return ConfigError(
            f"the node's memory {self.path} is damaged ({problem}); remove it to start "
            "without memory of this store"
        )

    def due(self, memory: Memory, *, force: bool = False) -> bool:
        """Whether save would write: something changed, and for a change of the reach
        alone, REACH_SAVE_INTERVAL_S have passed (or it is forced)."""
        saved = self._saved
        if memory == saved:
            return False
        return (
            force
            or saved is None
            or (memory.epoch, memory.cluster, memory.control)
            != (saved.epoch, saved.cluster, saved.control)
            or self._clock.monotonic() - self._saved_at >= REACH_SAVE_INTERVAL_S
        )

    def save(self, memory: Memory, *, force: bool = False) -> None:
        """Replace the file atomically (temp file, fsync, rename), if it is due."""
        if not self.due(memory, force=force):
            return
        doc = {
            "format": FORMAT,
            "store": self.store_url,
            "agent": self.agent_id,
            "epoch": memory.epoch,
            "seq": memory.reach.seq,
            "seq_epoch": memory.reach.epoch,
            "cluster": None if memory.cluster is None else memory.cluster.to_json().decode(),
            "control": memory.control,
        }
        replace_file(self.path, json.dumps(doc, indent=1), _TEMP_PREFIX)
        self._saved, self._saved_at = memory, self._clock.monotonic()


def _sweep_temps(directory: Path) -> None:
    """Housekeeping: a failure is logged, and loading goes on."""
    try:
        sweep_temps(directory, _TEMP_PREFIX)
    except OSError as exc:
        log.warning("could not remove old temporary files in %s: %s", directory, exc)


def _text(value: object) -> str:
    if not isinstance(value, str) or len(value) > MAX_CONTROL_CHARS:
        raise ValueError(f"field 'control' is not a string of at most {MAX_CONTROL_CHARS}")
    return value


def _count(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{value!r} is not a count")
    return value
