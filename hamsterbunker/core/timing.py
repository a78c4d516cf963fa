"""Lease timing, the one place its defaults live, checked once when it is made: a
``LeaseTiming`` that exists is one that was checked. Also a step's retry timing."""

from __future__ import annotations

from dataclasses import dataclass

from .errors import ConfigError
from .limits import MAX_LEASE_TTL_MS

__all__ = [
    "DEFAULT_LEASE_TTL_MS",
    "DEFAULT_MAX_STEP_FAILURES",
    "DEFAULT_STEP_RETRY",
    "DEFAULT_STEP_RETRY_MAX_MS",
    "DEFAULT_STEP_RETRY_MS",
    "DEFAULT_STOP_GRACE_MS",
    "DEFAULT_TICK_MS",
    "DEFAULT_TIMING",
    "MAX_STOP_GRACE_MS",
    "MAX_WATCH_S",
    "LeaseTiming",
    "StepRetry",
    "check_stop_grace",
    "check_sync_delay",
]

DEFAULT_TICK_MS = 400
DEFAULT_LEASE_TTL_MS = 2000
# The renew deadline as a share of the TTL: leaves the standby 0.4 × TTL of
# margin for clock-rate drift and slow writes.
RENEW_DEADLINE_SHARE = 0.6
# The longest hb status watches a lease record (a hostile ttl_ms may say 600 s).
MAX_WATCH_S = 60.0
# How long a stop lets the step in flight finish (and be published) before it is
# cancelled or abandoned: below systemd's TimeoutStopSec (30 s in our unit), with
# room left for the handover and the shutdown's store calls.
DEFAULT_STOP_GRACE_MS = 10_000
MAX_STOP_GRACE_MS = 3_600_000  # an hour: above that, a typing slip rather than a plan
# A step that raises is retried after 1 s, then 2 s, 4 s, ... up to 60 s, each ±20 %;
# after 10 failures in a row the node hands the lease over (0: never).
DEFAULT_STEP_RETRY_MS = 1_000
DEFAULT_STEP_RETRY_MAX_MS = 60_000
DEFAULT_MAX_STEP_FAILURES = 10
STEP_RETRY_JITTER = 0.2
MAX_STEP_RETRY_MS = 86_400_000  # a day


def check_stop_grace(stop_grace_ms: int) -> int:
    """The stop grace if it is within 0..MAX_STOP_GRACE_MS; ConfigError if not."""
    if isinstance(stop_grace_ms, bool) or not 0 <= stop_grace_ms <= MAX_STOP_GRACE_MS:
        raise ConfigError(f"stop grace {stop_grace_ms} ms is outside 0..{MAX_STOP_GRACE_MS} ms")
    return stop_grace_ms


@dataclass(frozen=True)
class LeaseTiming:
    """tick < renew deadline < lease TTL, in milliseconds; ConfigError if not.
    ``renew_deadline_ms`` left out (None) is 0.6 × the TTL."""

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

    @property
    def standby_period_s(self) -> float:
        """How often an idle standby writes its heartbeat: every half TTL (its liveness is
        judged over a whole TTL), at least every tick."""
        return max(self.tick_s, self.lease_ttl_s / 2)

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


def check_sync_delay(timing: LeaseTiming, sync_delay_ms: int) -> int:
    """The sync delay the user of a synced folder states, if lease_ttl ≥ 2 × (tick +
    sync_delay) (docs/syncdir.md); ConfigError naming the TTL it needs if not."""
    if isinstance(sync_delay_ms, bool) or not isinstance(sync_delay_ms, int) or sync_delay_ms < 1:
        raise ConfigError(
            f"sync_delay_ms must be a whole number of ms above 0, not {sync_delay_ms!r}"
        )
    needed = 2 * (timing.tick_ms + sync_delay_ms)
    if timing.lease_ttl_ms < needed:
        raise ConfigError(
            f"lease_ttl={timing.lease_ttl_ms} ms is too short for a folder that syncs within "
            f"{sync_delay_ms} ms: a synced folder needs lease_ttl ≥ 2 × (tick + sync delay) = "
            f"{needed} ms"
            + (
                f", more than a lease may hold ({MAX_LEASE_TTL_MS} ms): shorten the tick or "
                "the sync delay"
                if needed > MAX_LEASE_TTL_MS
                else ""
            )
        )
    return sync_delay_ms


@dataclass(frozen=True)
class StepRetry:
    """How a node retries a step that raised: the n-th retry waits ``first_ms × 2**(n-1)``
    within ±``jitter``, never above ``max_ms``; after ``max_failures`` in a row (0: never) it
    hands the lease over. ConfigError if the numbers make no sense."""

    first_ms: int = DEFAULT_STEP_RETRY_MS
    max_ms: int = DEFAULT_STEP_RETRY_MAX_MS
    max_failures: int = DEFAULT_MAX_STEP_FAILURES
    jitter: float = STEP_RETRY_JITTER

    def __post_init__(self) -> None:
        first, cap, most = self.first_ms, self.max_ms, self.max_failures
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (first, cap, most)):
            raise ConfigError(
                f"step retry must be whole numbers (got first={first!r} ms, max={cap!r} ms, "
                f"max failures={most!r})"
            )
        if not 0 < first <= cap <= MAX_STEP_RETRY_MS:
            raise ConfigError(
                f"step retry must satisfy 0 < first retry <= max retry <= {MAX_STEP_RETRY_MS} ms "
                f"(got first={first} ms, max={cap} ms)"
            )
        if most < 0:
            raise ConfigError(f"max step failures must be 0 (never) or more, not {most}")
        if not 0 <= self.jitter < 1:
            raise ConfigError(f"step retry jitter must be within 0..1, not {self.jitter}")

    @property
    def max_s(self) -> float:
        return self.max_ms / 1000


DEFAULT_STEP_RETRY = StepRetry()  # what `hb run` uses when given no step retry flags
