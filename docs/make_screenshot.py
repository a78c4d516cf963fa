"""Make docs/hb-tui.svg (150×42) and docs/hb-tui-80x24.svg: the monitor on the local demo,
caught in the middle of a takeover.

Run from the repository root: ``.venv/bin/python docs/make_screenshot.py``.
For each size it starts the three demo nodes, runs ``hb-tui`` headless, presses
``k`` once the agent has made some progress, and saves Textual's own SVG of the
screen as soon as the new leader has resumed (epoch 2, the gap in the timeline)
while the killed node is still shown offline, before it rejoins.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path

from hamsterbunker_tui.app import MonitorApp
from hamsterbunker_tui.demo import DEMO_AGENT_ID, start_demo
from textual.pilot import Pilot

from hamsterbunker.stores import open_store

DOCS = Path(__file__).parent
SHOTS = {"hb-tui.svg": (150, 42), "hb-tui-80x24.svg": (80, 24)}  # file name -> columns, rows


async def wait_for(pilot: Pilot[None], what: str, done: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {timeout:.0f} s waiting for {what}")
        await pilot.pause(0.05)


RECT = re.compile(
    r'<rect fill="(#\w+)" x="([\d.]+)" y="([\d.]+)" width="([\d.]+)" height="([\d.]+)" '
    r'shape-rendering="crispEdges"/>'
)


def smaller(svg: str) -> str:
    """The same picture in half the bytes: Rich's per-picture prefix ("terminal-3153197955-",
    on every style, clip path and line) short, and the background of a row's cells of one
    colour in one rectangle, not one per piece of text."""
    prefix = re.search(r"terminal-\d+-", svg)
    if prefix is not None:
        svg = svg.replace(prefix.group(0), "t-")
    rects = list(RECT.finditer(svg))
    start, end = (rects[0].start(), rects[-1].end()) if rects else (0, 0)
    if svg[start:end] != "".join(rect.group(0) for rect in rects):
        return svg  # not the one run of backgrounds this was written for
    merged: list[list[str]] = []
    for rect in rects:
        fill, x, y, width, height = rect.groups()
        last = merged[-1] if merged else None
        if (
            last
            and (last[0], last[2]) == (fill, y)
            and abs(float(last[1]) + float(last[3]) - float(x)) < 0.05
        ):
            last[3] = f"{float(last[3]) + float(width):.1f}"  # the one before, made longer
            continue
        merged.append([fill, x, y, width, height])
    shapes = "".join(
        f'<rect fill="{f}" x="{x}" y="{y}" width="{w}" height="{h}" shape-rendering="crispEdges"/>'
        for f, x, y, w, h in merged
    )
    return svg[:start] + shapes + svg[end:]


async def shoot(out: Path, size: tuple[int, int]) -> None:
    run = start_demo()
    try:
        app = MonitorApp(open_store(run.store_url), DEMO_AGENT_ID, demo=run.cluster)
        assert app.demo is not None
        # Brought back later than usual, so that the picture shows it offline.
        app.demo.restart_after_s = 8.0
        async with app.run_test(size=size) as pilot:
            model = app.model
            await wait_for(
                pilot,
                "three nodes and some progress",
                lambda: (
                    len(model.nodes()) == 3
                    and (p := model.progress()) is not None
                    and p.seq >= 8
                    and model.active_node() is not None
                ),
                30,
            )
            victim = model.active_node()
            assert victim is not None
            await pilot.press("k")

            def taken_over() -> bool:
                lines = model.timeline()
                killed = [n for n in model.nodes() if n.node == victim.node]
                return (
                    len(lines) >= 2
                    and lines[-1].gap_ms is not None
                    and bool(killed)
                    and killed[0].role == "offline"
                )

            await wait_for(pilot, "the takeover", taken_over, 30)
            await pilot.pause(0.2)  # the screen catches up
            out.write_text(smaller(app.export_screenshot(title="hb-tui · demo, mid-takeover")))
    finally:
        run.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DOCS, help="directory (default: docs/)")
    parser.add_argument("--only", choices=sorted(SHOTS), help="make this one only")
    args = parser.parse_args()
    for name, size in SHOTS.items():
        if args.only in (None, name):
            asyncio.run(shoot(args.out / name, size))
            print(f"wrote {args.out / name}", file=sys.stderr)


if __name__ == "__main__":
    main()
