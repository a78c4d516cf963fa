"""Asks once before a SIGKILL outside the demo: these are someone's real nodes."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static

from .killing import KillTarget

__all__ = ["ConfirmKill"]


class ConfirmKill(ModalScreen[bool]):
    """y kills, n or escape does not; dismissed with the answer."""

    DEFAULT_CSS = """
    ConfirmKill {
        align: center middle;
    }
    ConfirmKill > Vertical {
        width: auto;
        max-width: 80%;
        height: auto;
        border: thick $error;
        background: $surface;
        padding: 1 2;
    }
    ConfirmKill Horizontal {
        height: auto;
        margin-top: 1;
    }
    ConfirmKill Button {
        margin-right: 2;
    }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y", "answer(True)", "kill"),
        Binding("n,escape", "answer(False)", "keep"),
    ]

    def __init__(self, target: KillTarget) -> None:
        super().__init__()
        self.target = target

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(
                Text(f"SIGKILL {self.target.node} (pid {self.target.pid}) on this machine?")
            )
            yield Static(Text("Its lease expires and a standby takes over.", style="dim"))
            with Horizontal():
                yield Button("y: kill", id="yes", variant="error")
                yield Button("n: keep it", id="no")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, answer: bool) -> None:
        self.dismiss(answer)
