"""Where the record layer keeps each record, as backend keys (``stores.backend``).

One agent's records are under ``agents/<agent>/``; numbers are zero-padded so
that key order is number order::

    cluster                              the cluster record
    index/<agent>                        empty: the agent has records (list_agents)
    agents/<agent>/lease                 the lease record (its version inside)
    agents/<agent>/fence                 [holder, session, epoch] of the lease: what a
                                         fenced write compares
    agents/<agent>/ckpt/<seq>-<epoch>-<size>-<written ms>  a checkpoint's sealed bytes,
                                         described by its name: a listing reads no value
    agents/<agent>/effects/<seq>/<index>-<kind>  the effect journal of step seq
    agents/<agent>/acceptance            the loss-acceptance record
    agents/<agent>/beats/<node>          a node's heartbeat
    agents/<agent>/events/<node>/<pos>   a node's event log, by position
    agents/<agent>/inbox/last            the number last admitted
    agents/<agent>/inbox/admitted        "count bytes" of every admission ever
    agents/<agent>/inbox/consumed        "count bytes" of every consumption ever
    agents/<agent>/inbox/kept            how many consumed records are kept
    agents/<agent>/inbox/pending/<n>     an unconsumed submission's sealed bytes
    agents/<agent>/inbox/ids/<request>   "number size" of a request id admitted
    agents/<agent>/inbox/done/<n>-<request>  a consumed submission's reply: "-" for
                                         none, or "+" and the sealed reply
"""

from __future__ import annotations

import re

from ...records import CheckpointInfo, check_name
from ..backend import prefix_end

__all__ = ["CLUSTER", "INDEX", "AgentKeys", "number", "parse_number"]

CLUSTER = "cluster"
INDEX = "index/"

_DIGITS = 20
_NUMBER = re.compile(r"[0-9]{20}")
_LATEST_MS = 10**13 - 1
_CHECKPOINT = re.compile(r"([0-9]{20})-([0-9]{10})-([0-9]{10})-([0-9]{13})")


def number(n: int) -> str:
    """n as a key segment: 20 digits, so that key order is number order."""
    return f"{n:0{_DIGITS}d}"


def parse_number(segment: str) -> int | None:
    """The number a segment names, or None if it is not one we write."""
    return int(segment) if _NUMBER.fullmatch(segment) else None


class AgentKeys:
    """The keys of one agent's records (the agent id checked once, here)."""

    def __init__(self, agent: str) -> None:
        self.agent = check_name("agent id", agent)
        base = self.base = f"agents/{agent}/"
        self.index = INDEX + agent
        self.lease = base + "lease"
        self.fence = base + "fence"
        self.acceptance = base + "acceptance"
        self.ckpt = base + "ckpt/"
        self.effects = base + "effects/"
        self.beats = base + "beats/"
        self.events = base + "events/"
        inbox = base + "inbox/"
        self.last = inbox + "last"
        self.admitted = inbox + "admitted"
        self.consumed = inbox + "consumed"
        self.kept = inbox + "kept"
        self.pending = inbox + "pending/"
        self.ids = inbox + "ids/"
        self.done = inbox + "done/"

    def waited_for(self, key: str) -> bool:
        """Whether a change of key is one a node waiting for its inbox or a client waiting
        for a reply waits for: a submission or a reply (or a folder holding them)."""
        return any(key.startswith(f) or f.startswith(key + "/") for f in (self.pending, self.done))

    def checkpoint(self, info: CheckpointInfo) -> str:
        written_ms = min(max(round(info.written * 1000), 0), _LATEST_MS)  # a clock gone wild
        return f"{self.ckpt}{number(info.seq)}-{info.epoch:010d}-{info.size:010d}-{written_ms:013d}"

    def checkpoints_of(self, seq: int, epoch: int) -> str:
        """What the key of each checkpoint of seq under epoch starts with (one, unless planted)."""
        return f"{self.ckpt}{number(seq)}-{epoch:010d}-"

    def checkpoints_below(self, seq: int) -> tuple[str, str]:
        """The key range of every checkpoint of a seq below seq."""
        return self.ckpt, self.ckpt + number(seq)

    def checkpoint_info(self, key: str) -> CheckpointInfo | None:
        """The checkpoint a key of ckpt/ names (its seq, epoch, size and time), or None if
        its name is none we write."""
        named = _CHECKPOINT.fullmatch(key[len(self.ckpt) :]) if key.startswith(self.ckpt) else None
        if named is None:
            return None
        seq, epoch, size, written_ms = map(int, named.groups())
        return CheckpointInfo(epoch=epoch, seq=seq, size=size, written=written_ms / 1000)

    def step(self, seq: int) -> str:
        """The folder of step seq's effect journal."""
        return f"{self.effects}{number(seq)}/"

    def effect(self, seq: int, index: int, kind: str) -> str:
        return f"{self.step(seq)}{index:04d}-{kind}"

    def steps_through(self, seq: int) -> tuple[str, str]:
        """The key range of the effect journals of every step at or below seq."""
        return self.effects, self.step(seq + 1)

    def beat(self, node: str) -> str:
        return self.beats + check_name("node id", node)

    def node_events(self, node: str) -> str:
        return f"{self.events}{check_name('node id', node)}/"

    def event(self, node: str, position: int) -> str:
        return self.node_events(node) + number(position)

    def submission(self, n: int) -> str:
        return self.pending + number(n)

    def request(self, request_id: str) -> str:
        return self.ids + request_id

    def reply(self, n: int, request_id: str) -> str:
        """Where the reply to submission n, of request_id, is kept once it is consumed."""
        return f"{self.replies_of(n)}{request_id}"

    def replies_of(self, n: int) -> str:
        """What the key of each reply to submission n starts with (one, unless planted)."""
        return f"{self.done}{number(n)}-"

    def done_below(self, n: int) -> str:
        """The first key after the replies of every submission numbered below n."""
        return self.done + number(n)


def folder_range(folder: str) -> tuple[str, str]:
    """The key range of everything in folder (``/``-terminated)."""
    return folder, prefix_end(folder)
