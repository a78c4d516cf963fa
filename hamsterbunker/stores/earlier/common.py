"""What the readers of the earlier file, Redis and etcd stores share."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import AnyStr

from ...core.errors import ConfigError, CorruptRecord, StoreError
from ...core.limits import EFFECT_KINDS, MAX_EFFECTS_PER_STEP, MAX_SEQ
from ...core.read_bounds import BoundedRead
from ...records import CheckpointInfo, Heartbeat
from .._reported import readable

# Every name an effect record of one step can have: a reader looks under each of these
# where planted names would crowd the records out of a bounded listing.
EVERY_EFFECT = [(index, kind) for index in range(MAX_EFFECTS_PER_STEP) for kind in EFFECT_KINDS]


def seq_named(pattern: re.Pattern[AnyStr], name: AnyStr) -> int | None:
    """The number in name, which pattern matches whole (in its first group, if it has one),
    if it is in 1..MAX_SEQ as the earlier stores wrote numbers; else None."""
    match = pattern.fullmatch(name)
    number = int(match[1 if pattern.groups else 0]) if match else 0
    return number if 0 < number <= MAX_SEQ else None


def newest_first(infos: list[CheckpointInfo]) -> list[CheckpointInfo]:
    return sorted(infos, key=lambda info: (info.seq, info.epoch), reverse=True)


def no_longer_retained(agent: str, info: CheckpointInfo) -> StoreError:
    return StoreError(f"checkpoint {info.seq} of {agent!r} is no longer retained")


def over_limit(what: str, size: int, limit: int) -> CorruptRecord:
    return CorruptRecord(f"{what} is {size} bytes, above the limit of {limit} bytes")


def already_migrated(where: str, found: str) -> ConfigError:
    """The refusal of a store in this version's layout (found: what shows it)."""
    return ConfigError(
        f"{where} is in this version's layout already ({found}): there is nothing to migrate"
    )


def heartbeats(
    stored: BoundedRead[str], report: Callable[[str, Exception], object]
) -> list[Heartbeat]:
    """The heartbeats stored (node, JSON) that parse and are their node's; report(node,
    error) for each that does not parse."""
    return list(readable(stored.entries, Heartbeat.from_json, lambda n, _d, e: report(n, e)))
