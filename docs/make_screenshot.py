"""Make docs/hb-tui.svg: the monitor on the local demo, caught in the middle of a takeover.

Run from the repository root: ``.venv/bin/python docs/make_screenshot.py``.
It starts the three demo nodes, runs ``hb-tui`` headless, presses ``k`` once
the agent has made some progress, and saves Textual's own SVG of the screen
as soon as the new leader has resumed (epoch 2, the gap in the timeline)
while the killed node is still shown offline, before it rejoins.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Callable
from pathlib import Path

from hamsterbunker_tui.app import MonitorApp
from hamsterbunker_tui.demo import DEMO_AGENT_ID, start_demo
from textual.pilot import Pilot

from hamsterbunker.stores import open_store

OUT = Path(__file__).with_name("hb-tui.svg")
SIZE = (150, 42)


async def wait_for(pilot: Pilot[None], what: str, done: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {timeout:.0f} s waiting for {what}")
        await pilot.pause(0.05)


async def shoot(out: Path) -> None:
    run = start_demo()
    try:
        app = MonitorApp(open_store(run.store_url), DEMO_AGENT_ID, demo=run.cluster)
        assert app.demo is not None
        # Brought back later than usual, so that the picture shows it offline.
        app.demo.restart_after_s = 8.0
        async with app.run_test(size=SIZE) as pilot:
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
            out.write_text(app.export_screenshot(title="hb-tui · demo, mid-takeover"))
    finally:
        run.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    asyncio.run(shoot(args.out))
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
