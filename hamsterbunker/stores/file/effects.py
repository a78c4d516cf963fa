"""The file store's effect journal: ``agents/<agent>/effects/<seq>/<index>-<kind>.hbe``.

One directory per step (its seq in 20 digits), one file per record (the
effect's index in 4 digits and its kind, "intent" or "outcome"), so a replay
lists one directory and a checkpoint drops whole directories. A record is
written and synced under a temporary name before the lease lock is taken;
only the fence check and the rename happen under the lock, as for a
checkpoint.

Nothing here is trusted (DESIGN.md invariant 10). A read opens only
``effects/<seq>``, never through a symlink, lists at most ``_LISTED`` of its
entries (past that it opens only the names a record can have), and reads only
regular files under record names within bounds, each up to
``MAX_EFFECT_BYTES``, through a ``BoundedRead`` of ``read_bounds.EFFECTS_READ``
(at most ``2 * MAX_EFFECTS_PER_STEP`` files, and its byte total). Anything
else is logged once and left out; so is a step directory that cannot be
opened because of what was planted there or its permissions. A file or a
symlink planted where a step's directory goes is removed by the write that
needs the directory. Removal (after a checkpoint is durable, outside the lease
lock) is best effort and bounded per call: what it leaves is logged, and a
later checkpoint goes on with it. A step's directory goes whole, with any
temporary file a crashed write left in it.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from ...errors import CorruptRecord, StoreError
from ...limits import EFFECT_KINDS, MAX_EFFECTS_PER_STEP, check_effect_bounds
from ...read_bounds import EFFECTS_READ, BoundedRead
from ..base import Fence, check_fence
from .fileio import (
    TMP_PREFIX,
    closing_fd,
    dir_entries,
    discard,
    make_subdir,
    opened_subdir,
    read_file,
    write_temp,
)
from .layout import (
    EFFECT_NAME,
    STEP_NAME,
    agent_parts,
    effect_name,
    effect_name_problem,
    is_sync_copy,
    step_name,
)
from .lease import lease_in, lease_locked
from .tree import StoreTree

__all__ = ["EffectFiles"]

_EVERY_NAME = [(index, kind) for index in range(MAX_EFFECTS_PER_STEP) for kind in EFFECT_KINDS]
# The most entries of one directory listed by one call: four times what a step's
# records can be, so temporary files a crash left beside them never count.
_LISTED = 4 * len(_EVERY_NAME)
# The most entries one removal unlinks (a step's records and the directories
# holding them): more than one whole step, so a normal checkpoint removes all.
_REMOVALS = _LISTED
# What opening a directory answers when its permissions keep us out: junk as
# much as a symlink planted there, so the journal is left out, not raised.
_SHUT_OUT = {errno.EACCES, errno.EPERM}


class EffectFiles:
    """Store.put_effect and read_effects, and the removal put_checkpoint does, in a tree."""

    def __init__(self, tree: StoreTree, *, lock_timeout: float) -> None:
        self._tree = tree
        self._lock_timeout = lock_timeout

    def put(self, agent: str, fence: Fence, seq: int, index: int, kind: str, blob: bytes) -> None:
        problem = check_effect_bounds(seq, index, kind, len(blob))
        if problem is not None:
            raise StoreError(problem)  # before anything is written
        agent_dir = self._tree.agent_dir(agent)
        effects = agent_dir / "effects"
        with (
            self._tree.writing(*agent_parts(agent)) as agent_fd,
            closing_fd(make_subdir(agent_fd, "effects", effects)) as effects_fd,
            closing_fd(self._step_dir(effects_fd, effects / step_name(seq))) as step,
        ):
            # No sweep here: a temp file a crash left goes with its step's directory.
            tmp = write_temp(step, blob, durable=True)
            try:
                with lease_locked(agent_fd, agent_dir, agent, self._lock_timeout):
                    check_fence(lease_in(agent_fd, agent_dir), fence, seq)
                    os.replace(tmp, effect_name(index, kind), src_dir_fd=step, dst_dir_fd=step)
                    os.fsync(step)
            finally:
                discard(step, tmp)

    def _step_dir(self, effects: int, path: Path) -> int:
        """The step's directory, made where absent (durably).

        A file or a symlink under its name is junk (only we write there, and
        only directories): it is removed, not followed, so that it cannot keep
        the step from journaling its effects.
        """
        try:
            return make_subdir(effects, path.name, path)
        except CorruptRecord as exc:
            self._tree.report(f"{exc}; removed, so that the step can journal its effects")
            discard(effects, path.name)
            return make_subdir(effects, path.name, path)

    def read(self, agent: str, seq: int) -> dict[tuple[int, str], bytes]:
        if check_effect_bounds(seq, 0, EFFECT_KINDS[0], 0) is not None:
            return {}  # no step directory can have this name
        path = self._tree.agent_dir(agent) / "effects" / step_name(seq)
        try:
            with self._tree.reading(*agent_parts(agent, "effects", step_name(seq))) as step:
                if step is None:
                    return {}
                journal: BoundedRead[tuple[int, str]] = BoundedRead(EFFECTS_READ)
                for index, kind in self._names(step, path):
                    if journal.full:
                        break
                    data = self._read(step, path / effect_name(index, kind))
                    if data is not None:
                        journal.offer((index, kind), data)
                if journal.stopped:
                    self._tree.report(
                        f"{path}: stopped reading at {journal.total} bytes, the most one read "
                        "of a step's journal takes"
                    )
                return dict(journal.entries)
        except CorruptRecord as exc:
            self._tree.report(f"effect journal left out: {exc}")
        except OSError as exc:
            if exc.errno not in _SHUT_OUT:
                raise
            self._tree.report(f"effect journal left out: cannot open {path}: {exc.strerror}")
        return {}

    def remove_through(self, agent: str, seq: int) -> None:
        """Remove the journal of every step at or below seq; log, never raise, what fails."""
        path = self._tree.agent_dir(agent) / "effects"
        try:
            with self._tree.reading(*agent_parts(agent, "effects")) as effects:
                if effects is not None:
                    self._remove_steps(effects, path, seq)
        except (OSError, StoreError) as exc:
            self._tree.report(f"could not remove the effect journal in {path}: {exc}")

    # -- reading ---------------------------------------------------------------

    def _names(self, step: int, path: Path) -> list[tuple[int, str]]:
        """The (index, kind) of each record name in the step directory, sorted.

        Past _LISTED entries (planted) the listing stops, and every name a
        record can have is tried instead: bounded either way.
        """
        entries = dir_entries(step, limit=_LISTED + 1)
        if len(entries) > _LISTED:
            self._tree.report(f"{path} holds over {_LISTED} entries: reading only record names")
            return _EVERY_NAME
        found, junk = [], []
        for name in sorted(entry.name for entry in entries):
            match = EFFECT_NAME.fullmatch(name)
            problem = "not an effect record name" if match is None else effect_name_problem(match)
            if problem is None and match is not None:
                found.append((int(match[1]), match[2]))
            elif not name.startswith(TMP_PREFIX) and not is_sync_copy(name):
                junk.append(f"{path / name}: {problem}")
        if junk:  # one message a directory: planted names must not use up the reports
            more = f" (and {len(junk) - 1} more entries)" if len(junk) > 1 else ""
            self._tree.report(f"ignoring {junk[0]}{more}")
        return sorted(found)

    def _read(self, step: int, path: Path) -> bytes | None:
        """A record's bytes; None (reported) if absent, not a regular file, unreadable or too big."""
        try:
            return read_file(step, path.name, path, EFFECTS_READ.entry_bytes)
        except CorruptRecord as exc:
            self._tree.report(f"effect record left out: {exc}")
        except OSError as exc:
            if exc.errno not in _SHUT_OUT:
                raise
            self._tree.report(f"effect record left out: cannot open {path}: {exc.strerror}")
        return None

    # -- removing --------------------------------------------------------------

    def _remove_steps(self, effects: int, path: Path, seq: int) -> None:
        """Step seq's directory by its name, then others at or below it that a listing finds.

        By name first: a step's own checkpoint removes its journal however much
        was planted beside it. The listing finds what a crash or a fenced
        writer left; past _LISTED entries it may miss some (only planted
        entries make it that long), which stay on disk, never read.
        """
        budget = self._remove_step(effects, path / step_name(seq), _REMOVALS)
        for entry in dir_entries(effects, limit=_LISTED):
            if not (STEP_NAME.fullmatch(entry.name) and int(entry.name) <= seq):
                continue
            if budget <= 0:
                self._tree.report(f"effect journal in {path}: more to remove than one call does")
                return
            budget = self._remove_step(effects, path / entry.name, budget)

    def _remove_step(self, effects: int, path: Path, budget: int) -> int:
        """Remove a step's directory, spending at most budget removals; the budget left.

        A failure is logged, never raised: the others go on.
        """
        try:
            return budget - self._remove_one(effects, path, budget)
        except (OSError, StoreError) as exc:
            self._tree.report(f"could not remove {path}: {exc}")
            return budget - 1

    def _remove_one(self, effects: int, path: Path, budget: int) -> int:
        """Remove a step's directory (or what was planted under its name); the removals used."""
        try:
            with opened_subdir(effects, path.name, path) as step:
                if step is None:
                    return 0  # removed by another node just now
                used = self._clear(step, path, budget)
        except CorruptRecord:  # a file or a symlink under a step's name: junk
            discard(effects, path.name)
            return 1
        try:
            os.rmdir(path.name, dir_fd=effects)
        except FileNotFoundError:
            pass
        except OSError as exc:  # more than the budget, or a junk directory that is not empty
            self._tree.report(f"could not remove {path}: {exc.strerror}")
        return used + 1

    def _clear(self, step: int, path: Path, budget: int) -> int:
        """Remove up to budget entries of a step's directory (a directory only if empty)."""
        entries = dir_entries(step, limit=budget)
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    os.rmdir(entry.name, dir_fd=step)  # junk
                else:
                    os.unlink(entry.name, dir_fd=step)
            except FileNotFoundError:
                pass
            except OSError as exc:
                self._tree.report(f"could not remove {path / entry.name}: {exc.strerror}")
        return len(entries)
