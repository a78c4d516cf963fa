"""The log level of each event type: the one table that decides what `journalctl -p` shows.

Under journald the level becomes the line's syslog priority (hamsterbunker.core.logs):
``journalctl -p warning`` shows what needs a look (a lost lease, a store error,
a failing agent), ``-p err`` what is going wrong now, ``-p crit`` what no
restart fixes (the store went back in time). Role changes are INFO; what
happens every step is DEBUG, shown only with ``hb run --log-level debug``.
"""

from __future__ import annotations

from logging import CRITICAL, DEBUG, ERROR, INFO, WARNING

__all__ = ["DEFAULT_PRIORITY", "EVENT_PRIORITIES", "event_priority"]

# An event type not named here (a new one) is logged at INFO: shown by default.
DEFAULT_PRIORITY = INFO

EVENT_PRIORITIES: dict[str, int] = {
    # Every step, or every message: routine.
    "agent.step": DEBUG,
    "checkpoint.published": DEBUG,
    "inbox.admitted": DEBUG,
    "inbox.consumed": DEBUG,
    # Role changes and what a node says once per run or term.
    "node.online": INFO,
    "node.standby": INFO,
    "node.stopping": INFO,
    "node.offline": INFO,
    "agent.started": INFO,
    "agent.resumed": INFO,
    "agent.yielded": INFO,
    "lease.acquired": INFO,
    "lease.released": INFO,
    "effect.replayed": INFO,
    "store.recovered": INFO,
    "agent.paused": INFO,
    "cluster.keys_changed": INFO,
    "agent.unpaused": INFO,
    "lease.switchover_asked": INFO,
    # Needs a look: the node goes on, but something was lost or refused.
    "lease.renew_failed": WARNING,
    "lease.lost": WARNING,
    "lease.given_up": WARNING,
    "lease.unproven": WARNING,
    "store.warning": WARNING,
    "store.created": WARNING,
    "checkpoint.rejected": WARNING,
    "term_record.rejected": WARNING,
    "store.diverged": WARNING,
    "effect.rejected": WARNING,
    "effect.lost": WARNING,
    "effect.interrupted": WARNING,
    "inbox.rejected": WARNING,
    "inbox.gave_up": WARNING,
    "store.loss_accepted": WARNING,
    "chain.chosen": WARNING,
    "control.ignored": WARNING,
    "lease.replaced_unreadable": WARNING,
    # Going wrong now: the store does not answer, a publish failed, the agent keeps failing.
    "store.error": ERROR,
    "checkpoint.failed": ERROR,
    "node.fenced": ERROR,
    "agent.failing": ERROR,
    "acceptance.rejected": ERROR,
    "node.refused": ERROR,
    # No restart fixes it: the store went back in time and the node refuses to resume behind.
    "store.regressed": CRITICAL,
}


def event_priority(kind: str) -> int:
    """The logging level of an event of type ``kind``."""
    return EVENT_PRIORITIES.get(kind, DEFAULT_PRIORITY)
