"""Helpers for monitor tests: what the screen shows, and bounded waiting inside a Pilot."""

from __future__ import annotations

import io
import time
from collections.abc import Callable

import pytest
from rich.console import Console
from textual.app import App
from textual.pilot import Pilot
from textual.widget import Widget


def screen_text(app: App[None]) -> str:
    """The whole screen as plain text: what the operator sees (export_screenshot's render)."""
    width, height = app.size
    console = Console(width=width, height=height, file=io.StringIO(), record=True)
    console.print(app.screen._compositor.render_update(full=True))
    return console.export_text()


def widget_text(widget: Widget) -> str:
    """The text a widget shows inside its border, wrapped lines joined by single spaces."""
    region = widget.content_region
    lines = screen_text(widget.app).splitlines()[region.y : region.bottom]
    return " ".join(" ".join(line[region.x : region.right].split()) for line in lines).strip()


async def until(
    pilot: Pilot[None], what: str, probe: Callable[[], object], timeout: float = 20.0
) -> None:
    """Let the app run in 0.1 s steps until probe() is truthy; fail after timeout."""
    deadline = time.monotonic() + timeout
    while not probe():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}\n{screen_text(pilot.app)}")
        await pilot.pause(0.1)
