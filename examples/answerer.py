"""An agent that answers questions from its inbox (README: "Handing work to an agent").

Each step waits for submissions, "thinks" about each (a journaled effect that
takes a few seconds, standing in for an LLM call), and consumes it with the
answer. The answer names the node that gave it, so a takeover in the middle
shows: the question was admitted while one node led, and answered by the next.

    PYTHONPATH=examples hb run --store file:///tmp/hb --agent answerer:Answerer --create-store ...
    hb submit --store file:///tmp/hb --agent-id answerer --wait --data '"why is the sky blue?"'
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from hamsterbunker import current_step

THINK_S = float(os.environ.get("ANSWERER_THINK_S", "3"))


async def think(question: str) -> str:
    await asyncio.sleep(THINK_S)  # an LLM call would go here
    return f"{len(question.split())} words, and a good question"


class Answerer:
    id = "answerer"

    def init(self) -> dict[str, Any]:
        return {"answered": 0}

    async def step(self, state: dict[str, Any]) -> dict[str, Any]:
        ctx = current_step()
        assert ctx is not None
        for question in await ctx.wait_for_inbox(timeout=30):
            answer = await ctx.effect(f"think-{question.number}", think, str(question.payload))
            ctx.consume(question.number, reply={"answer": answer, "answered_by": ctx.node})
            state["answered"] += 1
        return state
