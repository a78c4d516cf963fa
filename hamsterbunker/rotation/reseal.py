"""What commit re-seals besides checkpoints: the unconsumed submissions, the kept replies
and the effect journal of the step in flight, each compared with the bytes opened."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from ..core.errors import SealError
from ..sealing import EffectAt, Sealer, sealed_key_id
from ..stores import Store
from ..stores.reseal import REPLY_PAGE

__all__ = ["Resealed", "old_replies", "reseal_inbox", "reseal_journal", "reseal_replies"]


@dataclass
class Resealed:
    """What commit did to one agent's retained checkpoints."""

    agent: str
    resealed: int = 0
    current: int = 0  # already under the current key
    gone: int = 0  # removed by retention (or replaced) before it could be re-sealed
    unopened: int = 0  # did not authenticate: junk, left as it is
    effects: int = 0  # effect-journal records of the step in flight re-sealed
    submissions: int = 0  # unconsumed submissions re-sealed
    replies: int = 0  # replies of consumed submissions re-sealed
    replies_unopened: int = 0  # replies under an old key that did not authenticate: left
    control: bool = False  # the lease record's control request signed again

    def describe(self, key_id: str) -> str:
        text = (
            f"agent {self.agent}: {self.resealed} checkpoints re-sealed, {self.current} "
            f"already under key id {key_id}"
        )
        if self.gone:
            text += f", {self.gone} gone meanwhile"
        if self.unopened:
            text += f", {self.unopened} that do not authenticate left as they are"
        if self.effects:
            text += f"; {self.effects} effect-journal records re-sealed"
        if self.submissions:
            text += f"; {self.submissions} unconsumed submissions re-sealed"
        if self.replies:
            text += f"; {self.replies} replies to consumed submissions re-sealed"
        if self.replies_unopened:
            text += f"; {self.replies_unopened} replies that do not authenticate left as they are"
        if self.control:
            text += "; the control request (hb pause, switchover) signed again"
        return text


def reseal_inbox(store: Store, sealer: Sealer, agent: str, done: Resealed) -> None:
    """Seal the unconsumed submissions under an old key again, with the current one."""
    for number, blob in store.read_inbox(agent):
        if sealed_key_id(blob) in (None, sealer.key_id):
            continue
        try:
            new = sealer.reseal_submission(blob, agent, number)
        except SealError:
            continue  # junk: no key opens it, and the leader skips it too
        if len(new) == len(blob) and store.reseal_submission(agent, number, blob, new):
            done.submissions += 1


def reseal_replies(store: Store, sealer: Sealer, agent: str, done: Resealed) -> None:
    """Seal the kept replies of consumed submissions under an old key again, with the
    current one: a client holding only the new secret reads them after finish."""
    for number, blob in old_replies(store, sealer, agent):
        try:
            new = sealer.reseal_reply(blob, agent, number)
        except SealError:
            done.replies_unopened += 1  # junk: no key opens it, and no client takes it
            continue
        if store.reseal_reply(agent, number, blob, new):
            done.replies += 1


def old_replies(store: Store, sealer: Sealer, agent: str) -> Iterator[tuple[int, bytes]]:
    """The kept replies of agent whose header names a key other than the current one."""
    after: int | None = 0
    while after is not None:
        page, following = store.read_replies(agent, after, REPLY_PAGE)
        for number, blob in page:
            if sealed_key_id(blob) not in (None, sealer.key_id):
                yield number, blob
        # A page always moves on: a store that says otherwise is not followed round.
        after = following if following is not None and following > after else None


def reseal_journal(store: Store, sealer: Sealer, agent: str, done: Resealed) -> None:
    """Seal the effect journal of the step after the newest checkpoint (the only one a
    replay reads) again with the current key, where it is under an old one."""
    newest = store.list_checkpoints(agent)
    step = (newest[0].seq if newest else 0) + 1
    for (index, kind), blob in store.read_effects(agent, step).items():
        if sealed_key_id(blob) in (None, sealer.key_id):
            continue
        try:
            new = sealer.reseal_effect(blob, EffectAt(agent, step, index, kind))
        except SealError:
            continue  # junk: no key opens it, and no replay will take it
        if store.reseal_effect(agent, step, index, kind, blob, new):
            done.effects += 1
