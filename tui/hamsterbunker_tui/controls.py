"""Switchover (``s``) and pause/resume (``p``): asked first, then done by the library.

The requests are signed with the cluster key, so the monitor needs the secret
for them (HB_SECRET or --secret-file, as ``hb`` reads it); without it the keys
say so and do nothing. The library calls block (a switchover watches the
leader and the target for up to a lease TTL; the key derivation takes a
moment), so the app runs them in a thread.
"""

from __future__ import annotations

import threading
from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, OptionList, Static
from textual.widgets.option_list import Option

from hamsterbunker.core.errors import HamsterbunkerError
from hamsterbunker.lease import control
from hamsterbunker.sealing import Sealer
from hamsterbunker.sealing.keyring import Secret
from hamsterbunker.stores import Store

from .model import ClusterModel

__all__ = ["ANY_STANDBY", "ChooseTarget", "Confirm", "Controller", "live_standbys"]

ANY_STANDBY = ""  # the answer of ChooseTarget that lets the library pick the freshest
NO_SECRET = "needs the cluster secret: set HB_SECRET or pass --secret-file"

_MODAL_CSS = """
{name} {{
    align: center middle;
}}
{name} > Vertical {{
    width: auto;
    max-width: 90%;
    height: auto;
    border: thick $warning;
    background: $surface;
    padding: 1 2;
}}
{name} Horizontal {{
    height: auto;
    margin-top: 1;
}}
{name} Button {{
    margin-right: 2;
}}
{name} OptionList {{
    height: auto;
    max-height: 10;
    width: auto;
    min-width: 40;
}}
"""


def live_standbys(model: ClusterModel) -> list[str]:
    """The standbys whose heartbeats are fresh: where a switchover may go."""
    return [n.node for n in model.nodes() if n.role == "standby" and n.health == "fresh"]


class Confirm(ModalScreen[bool]):
    """A question answered with y (do it) or n / escape (do not)."""

    DEFAULT_CSS = _MODAL_CSS.format(name="Confirm")
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y", "answer(True)", "yes"),
        Binding("n,escape", "answer(False)", "no"),
    ]

    def __init__(self, question: str, detail: str, yes: str) -> None:
        super().__init__()
        self.question, self.detail, self.yes = question, detail, yes

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(Text(self.question))
            yield Static(Text(self.detail, style="dim"))
            with Horizontal():
                yield Button(f"y: {self.yes}", id="yes", variant="warning")
                yield Button("n: keep as is", id="no")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, answer: bool) -> None:
        self.dismiss(answer)


class ChooseTarget(ModalScreen[str | None]):
    """Which live standby takes over: one by name, or the freshest; escape asks nothing."""

    DEFAULT_CSS = _MODAL_CSS.format(name="ChooseTarget")
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "cancel")]

    def __init__(self, leader: str, standbys: list[str]) -> None:
        super().__init__()
        self.leader, self.standbys = leader, standbys

    def compose(self) -> ComposeResult:
        options = [Option(f"{node} (live standby)", id=node) for node in self.standbys]
        options.append(Option("the freshest live standby", id="\0any"))
        with Vertical():
            yield Static(Text(f"Switch over from {self.leader} to which node?"))
            yield Static(
                Text(
                    "The leader finishes its step, publishes and hands the lease over. "
                    "Enter asks, escape does not.",
                    style="dim",
                )
            )
            yield OptionList(*options, id="targets")

    def on_mount(self) -> None:
        targets = self.query_one(OptionList)
        targets.highlighted = 0  # Enter at once asks for the first live standby
        targets.focus()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        chosen = event.option.id
        self.dismiss(ANY_STANDBY if chosen in (None, "\0any") else chosen)

    def action_cancel(self) -> None:
        self.dismiss(None)


class Controller:
    """The library's operator requests for one agent, with the secret the monitor was given."""

    def __init__(self, store: Store, agent: str, secret: Secret | None) -> None:
        self.store, self.agent, self.secret = store, agent, secret
        self._sealer: Sealer | None = None
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.secret is not None

    def _sealer_now(self) -> Sealer:
        assert self.secret is not None
        with self._lock:
            if self._sealer is None:
                cluster = self.store.read_cluster()
                if cluster is None:
                    raise HamsterbunkerError("the store has no cluster record yet")
                self._sealer = Sealer(self.secret, cluster)
            return self._sealer

    def switchover(self, to: str | None) -> str:
        """Blocking: ask for the switchover; the target. ControlRefused if refused."""
        return control.request_switchover(self.store, self._sealer_now(), self.agent, to=to)

    def set_paused(self, paused: bool) -> None:
        """Blocking: pause or resume the agent."""
        control.set_paused(self.store, self._sealer_now(), self.agent, paused)
