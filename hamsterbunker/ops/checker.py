"""Checks a recorded history (``hamsterbunker.core.history``) against the safety invariants
(its rules: docs/design.md)::

    python -m hamsterbunker.ops.checker history.jsonl
"""

from __future__ import annotations

import bisect
import itertools
import sys
from collections import defaultdict
from collections.abc import Callable

from ..core.history import Op, read_history

__all__ = ["check"]


def check(ops: list[Op]) -> list[str]:
    """Return every violation found (empty: the history is clean)."""
    accepted = sorted((o for o in ops if o.op == "publish" and o.outcome == "ok"), key=_seq)
    acquires = [o for o in ops if o.op == "acquire" and o.outcome == "ok"]
    restores = [o for o in ops if o.op == "restore"]
    # Where an accepted loss began a new line: each op belongs to the line of the last
    # such restore that started before it.
    cuts = sorted(o.start for o in restores if o.detail.get("accepted_loss"))

    def line(o: Op) -> int:
        return bisect.bisect_left(cuts, o.start)

    violations = _writer_violations(accepted)
    violations += _order_violations(accepted, line)
    violations += [
        f"{op.node} had seq {op.seq} accepted under epoch {op.epoch} although it "
        f"started after {newer.node} acquired epoch {newer.epoch}"
        for op in accepted
        for newer in _acquired_before(op, acquires)
    ]
    violations += _restore_violations(restores, accepted, line)
    violations += _effect_violations(ops, acquires, line)
    violations += _inbox_violations(accepted, line)
    return violations


def _acquired_before(op: Op, acquires: list[Op]) -> list[Op]:
    """The acquisitions of a later epoch than op's that had ended when op started."""
    return [newer for newer in acquires if newer.epoch > op.epoch and op.start > newer.end]


def _writer_violations(accepted: list[Op]) -> list[str]:
    writers: dict[int, set[str]] = defaultdict(set)
    for op in accepted:
        writers[op.epoch].add(op.node)
    return [
        f"epoch {epoch} has accepted publishes from {sorted(nodes)}"
        for epoch, nodes in sorted(writers.items())
        if len(nodes) > 1
    ]


def _order_violations(accepted: list[Op], line: Callable[[Op], int]) -> list[str]:
    violations = []
    for before, after in itertools.pairwise(sorted(accepted, key=lambda o: (line(o), o.seq))):
        if line(before) != line(after):
            continue
        if after.seq == before.seq:
            violations.append(f"seq {after.seq} accepted twice ({before.node}, {after.node})")
        if after.epoch < before.epoch:
            violations.append(
                f"epoch went back in store order: seq {before.seq} epoch {before.epoch}, "
                f"then seq {after.seq} epoch {after.epoch}"
            )
    return violations


def _restore_violations(
    restores: list[Op], accepted: list[Op], line: Callable[[Op], int]
) -> list[str]:
    """No resume behind an acknowledged checkpoint; a term numbers on from its restore."""
    violations = []
    for restore in restores:
        if restore.detail.get("accepted_loss"):
            continue  # behind on purpose
        acked = [o.seq for o in accepted if o.end < restore.start and line(o) == line(restore)]
        if not acked or restore.outcome == "refused":
            continue
        if restore.outcome == "started":
            violations.append(
                f"{restore.node} started over from init() in epoch {restore.epoch} although "
                f"checkpoint {max(acked)} had been accepted"
            )
        elif restore.detail.get("from_seq", 0) < max(acked):
            violations.append(
                f"{restore.node} resumed epoch {restore.epoch} from checkpoint "
                f"{restore.detail.get('from_seq')}, behind accepted checkpoint {max(acked)}"
            )
    for restore in restores:
        term = [o for o in accepted if o.epoch == restore.epoch and o.node == restore.node]
        next_seq = restore.detail.get("next_seq")
        if term and next_seq is not None and term[0].seq != next_seq:
            violations.append(
                f"{restore.node} restored epoch {restore.epoch} to continue at seq {next_seq} "
                f"but its first accepted publish is seq {term[0].seq}"
            )
    return violations


def _inbox_violations(accepted: list[Op], line: Callable[[Op], int]) -> list[str]:
    """A submission consumed by two accepted checkpoints was processed twice."""
    consumed_by: dict[tuple[int, int], Op] = {}
    violations = []
    for op in accepted:
        for number in op.detail.get("consumed", []):
            first = consumed_by.setdefault((line(op), number), op)
            if first is not op:
                violations.append(
                    f"submission #{number} was consumed twice: by seq {first.seq} "
                    f"({first.node}) and by seq {op.seq} ({op.node})"
                )
    return violations


def _effect_violations(ops: list[Op], acquires: list[Op], line: Callable[[Op], int]) -> list[str]:
    violations: list[str] = []
    calls: dict[tuple[int, str], list[Op]] = defaultdict(list)
    recorded: dict[tuple[int, str], list[Op]] = defaultdict(list)
    for o in ops:
        key = o.detail.get("key")
        if o.op == "effect_start":
            calls[(line(o), str(key))].append(o)
        elif o.op == "effect" and o.outcome in ("ok", "failed"):
            recorded[(line(o), str(key))].append(o)
    for (_, key), called in calls.items():
        interrupted = [o for o in called if o.detail.get("replay") == "interrupted"]
        if len(interrupted) > 1:
            violations.append(
                f"interrupted effect {key} was called {len(interrupted)} times "
                f"({', '.join(sorted({o.node for o in interrupted}))})"
            )
    for where, outcomes in recorded.items():
        done = [o for o in outcomes if o.outcome == "ok"]
        again = [s for s in calls.get(where, []) if done and s.start > min(o.end for o in done)]
        if again:
            violations.append(
                f"effect {where[1]} was called again by {again[0].node} in epoch "
                f"{again[0].epoch} after its outcome was recorded"
            )
    for o in ops:
        if o.op != "effect" or o.outcome != "replayed":
            continue
        before = [
            r for r in recorded.get((line(o), str(o.detail.get("key"))), []) if r.end < o.start
        ]
        if before and before[-1].detail.get("digest") != o.detail.get("digest"):
            violations.append(
                f"{o.node} replayed effect {o.detail.get('key')} with another outcome than "
                f"the one {before[-1].node} recorded"
            )
    for call in (c for group in calls.values() for c in group):
        newer = next(iter(_acquired_before(call, acquires)), None)
        if newer is not None:
            violations.append(
                f"{call.node} called effect {call.detail.get('key')} under epoch "
                f"{call.epoch} after {newer.node} acquired epoch {newer.epoch}"
            )
    return violations


def _seq(op: Op) -> int:
    return op.seq


def main(argv: list[str] | None = None) -> int:
    paths = sys.argv[1:] if argv is None else argv
    if not paths:
        print("usage: python -m hamsterbunker.ops.checker HISTORY.jsonl [...]", file=sys.stderr)
        return 2
    ops = [op for path in paths for op in read_history(path)]
    violations = check(ops)
    for violation in violations:
        print(f"VIOLATION: {violation}")
    published = sum(1 for o in ops if o.op == "publish" and o.outcome == "ok")
    print(f"{len(ops)} operations, {published} accepted publishes, {len(violations)} violations")
    return 1 if violations else 0


if __name__ == "__main__":
    raise SystemExit(main())
