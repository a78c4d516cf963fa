"""Lease timing: the one place its defaults live, checked once when it is made.

A ``LeaseTiming`` is what every node of a cluster must agree on to keep one
leader: how often it ticks, how long a leader may step after its last renewal,
and how long a lease lives without one. The CLI, the config file, the demo, the
local cluster, the runtime and the lease keeper all take one; a ``LeaseTiming``
that exists is one that was checked.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import ConfigError
from .limits import MAX_LEASE_TTL_MS

__all__ = [
    "DEFAULT_LEASE_TTL_MS",
    "DEFAULT_STOP_GRACE_MS",
    "DEFAULT_TICK_MS",
    "DEFAULT_TIMING",
    "MAX_STOP_GRACE_MS",
    "LeaseTiming",
    "check_stop_grace",
]

DEFAULT_TICK_MS = 400
DEFAULT_LEASE_TTL_MS = 2000
# The renew deadline as a share of the TTL: leaves the standby 0.4 × TTL of
# margin for clock-rate drift and slow writes.
RENEW_DEADLINE_SHARE = 0.6
# How long a stop lets the step in flight finish (and be published) before it is
# cancelled or abandoned: below systemd's TimeoutStopSec (30 s in our unit), with
# room left for the handover and the shutdown's store calls.
DEFAULT_STOP_GRACE_MS = 10_000
MAX_STOP_GRACE_MS = 3_600_000  # an hour: above that, a typing slip rather than a plan


def check_stop_grace(stop_grace_ms: int) -> int:
    """The stop grace if it is within 0..MAX_STOP_GRACE_MS; ConfigError if not."""
    if isinstance(stop_grace_ms, bool) or not 0 <= stop_grace_ms <= MAX_STOP_GRACE_MS:
        raise ConfigError(f"stop grace {stop_grace_ms} ms is outside 0..{MAX_STOP_GRACE_MS} ms")
    return stop_grace_ms


@dataclass(frozen=True)
class LeaseTiming:
    """tick < renew deadline < lease TTL, in milliseconds; ConfigError if not.

    ``renew_deadline_ms`` left out (None) is 0.6 × the TTL.
    """

    tick_ms: int = DEFAULT_TICK_MS
    lease_ttl_ms: int = DEFAULT_LEASE_TTL_MS
    renew_deadline_ms: int | None = None

    def __post_init__(self) -> None:
        if self.renew_deadline_ms is None:
            deadline = round(self.lease_ttl_ms * RENEW_DEADLINE_SHARE)
            object.__setattr__(self, "renew_deadline_ms", deadline)
        self._check()

    @property
    def renew_deadline(self) -> int:
        """The renew deadline in ms (never None once made)."""
        assert self.renew_deadline_ms is not None  # set by __post_init__
        return self.renew_deadline_ms

    @property
    def tick_s(self) -> float:
        return self.tick_ms / 1000

    @property
    def lease_ttl_s(self) -> float:
        return self.lease_ttl_ms / 1000

    @property
    def renew_deadline_s(self) -> float:
        return self.renew_deadline / 1000

    def _check(self) -> None:
        """Refuse timing that cannot keep one leader: lease_ttl > renew_deadline > tick > 0."""
        tick, deadline, ttl = self.tick_ms, self.renew_deadline, self.lease_ttl_ms
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (tick, deadline, ttl)):
            raise ConfigError(
                f"lease timing must be whole milliseconds (got lease_ttl={ttl!r}, "
                f"renew_deadline={deadline!r}, tick={tick!r})"
            )
        if not (0 < tick < deadline < ttl):
            raise ConfigError(
                "lease timing must satisfy lease_ttl > renew_deadline > tick > 0 "
                f"(got lease_ttl={ttl} ms, renew_deadline={deadline} ms, tick={tick} ms)"
            )
        if ttl > MAX_LEASE_TTL_MS:
            # Every node takes a lease record with a longer TTL for a damaged one.
            raise ConfigError(
                f"lease_ttl={ttl} ms is above the most a lease record may hold, "
                f"{MAX_LEASE_TTL_MS} ms"
            )


DEFAULT_TIMING = LeaseTiming()  # what `hb run` uses when given no timing
