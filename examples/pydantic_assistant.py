"""A PydanticAI assistant that answers questions from its inbox, with two tools: a
calculator and a lookup (README: "Handing work to an agent"; hamsterbunker.integrations).

Each question is one run of a PydanticAI agent wrapped in ``JournaledAgent``: every
model request and tool call is a journaled effect, so a node that takes over in the
middle of a run goes on from the last recorded call instead of asking the model again.
Without an API key it runs offline on a ``FunctionModel`` (a few rules standing in for an
LLM: arithmetic goes to the calculator, a known word to the lookup); with
``OPENAI_API_KEY`` set it asks ``openai:gpt-4o-mini`` (``pip install
'pydantic-ai-slim[openai]'``). Needs the extra: ``pip install -e '.[pydantic-ai]'``.

    export HB_SECRET=a-long-secret PYTHONPATH=examples
    hb run --store file:///tmp/hb-assistant --agent pydantic_assistant:Assistant \\
        --node-id node-a --region r-a --create-store &
    hb submit --store file:///tmp/hb-assistant --agent-id assistant --wait \\
        --data '"what is (17 + 25) * 3, and what is a lease?"'

Every model request and tool call that really runs logs "NODE called ...": with
``ASSISTANT_THINK_S=3`` a request takes 3 s, time to SIGKILL the leader mid-answer and
see the other node call only what was in flight (README: "PydanticAI agents").
"""

from __future__ import annotations

import ast
import asyncio
import logging
import operator
import os
import re
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models import Model
from pydantic_ai.models.function import AgentInfo, FunctionModel

from hamsterbunker import current_step
from hamsterbunker.integrations.pydantic_ai import JournaledAgent

FACTS = {
    "lease": "a record in the store naming the one node that may step the agent, for a TTL",
    "checkpoint": "the agent's state after a step, sealed and published by the leader",
    "effect": "a journaled call inside a step: a replay returns its recorded result",
    "inbox": "where submitted work waits until a step consumes it with a reply",
}

# Seconds each offline model request takes (0: at once): time to kill a node mid-answer.
THINK_S = float(os.environ.get("ASSISTANT_THINK_S", "0"))
log = logging.getLogger("assistant")


def _called(what: str) -> None:
    """Say, in the node's log, that a model request or a tool call really ran here: a
    replay's recorded results are never called, so never logged."""
    step = current_step()
    log.info("%s called %s", step.node if step else "(no step)", what)


INSTRUCTIONS = (
    "You answer questions briefly. Use the calculator for any arithmetic and the lookup "
    f"for these words: {', '.join(sorted(FACTS))}."
)

_OPERATORS: dict[type, Any] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression (numbers, + - * / ** and parentheses)."""
    _called(f"calculate({expression!r})")

    def value(node: ast.AST) -> Any:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > 64:
                raise ValueError("exponent too large")
            return _OPERATORS[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](value(node.operand))
        raise ValueError("not arithmetic")

    try:
        result = value(ast.parse(expression, mode="eval").body)
    except (SyntaxError, ValueError, ArithmeticError) as exc:
        return f"not computable ({exc})"
    return f"{result:g}" if isinstance(result, float) else str(result)


def lookup(word: str) -> str:
    """Look up what a word means here (lease, checkpoint, effect, inbox)."""
    _called(f"lookup({word!r})")
    return FACTS.get(word.lower().strip(), f"nothing known about {word!r}")


# -- the offline model: a few rules given the messages ------------------------------

# A run of digits, operators and parentheses, at least one operator between two numbers.
_ARITHMETIC = re.compile(r"[(\d][\d\s.+\-*/()]*[\d)]")


def _this_run(messages: list[ModelMessage]) -> tuple[str, dict[str, Any]]:
    """The question (the last user prompt) and the tool results since, by call id."""
    question: str = ""
    returns: dict[str, Any] = {}
    for message in messages:
        if isinstance(message, ModelRequest):
            for part in message.parts:
                if isinstance(part, UserPromptPart) and isinstance(part.content, str):
                    question, returns = part.content, {}
                elif isinstance(part, ToolReturnPart):
                    returns[part.tool_call_id] = part.content
    return question, returns


async def offline_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """First request: a tool call for each sum and each known word in the question;
    the next: the answer, from what the tools returned. Takes THINK_S, as a model would."""
    question, returns = _this_run(messages)
    _called(f"model request ({len(returns)} tool results so far)")
    await asyncio.sleep(THINK_S)
    calls = [
        ToolCallPart("calculate", {"expression": found.strip()}, tool_call_id=f"calc-{i}")
        for i, found in enumerate(_ARITHMETIC.findall(question))
        if re.search(r"\d\s*[-+*/]", found)
    ] + [
        ToolCallPart("lookup", {"word": word}, tool_call_id=f"lookup-{word}")
        for word in sorted(FACTS)
        if re.search(rf"\b{word}s?\b", question.lower())
    ]
    if not calls:
        words = ", ".join(sorted(FACTS))
        return ModelResponse(parts=[TextPart(f"I can do sums and explain these words: {words}.")])
    if not returns:
        return ModelResponse(parts=list(calls))
    answers = []
    for call in calls:
        args = call.args_as_dict()
        subject = (
            args.get("expression")
            or f"{'an' if args['word'][0] in 'aeiou' else 'a'} {args['word']}"
        )
        answers.append(f"{subject} is {returns.get(call.tool_call_id)}")
    return ModelResponse(parts=[TextPart("; ".join(answers) + ".")])


def model() -> Model | str:
    """openai:gpt-4o-mini when OPENAI_API_KEY is set, else the offline model."""
    return (
        "openai:gpt-4o-mini" if os.environ.get("OPENAI_API_KEY") else FunctionModel(offline_model)
    )


class Assistant:
    id = "assistant"

    def __init__(self) -> None:
        agent = Agent(
            model(), name="assistant", instructions=INSTRUCTIONS, tools=[calculate, lookup]
        )
        self.journaled = JournaledAgent(agent)

    def init(self) -> dict[str, Any]:
        return {"answered": 0}

    async def step(self, state: dict[str, Any]) -> dict[str, Any]:
        ctx = current_step()
        assert ctx is not None
        # One question a step: a step calls at most 128 effects, and a run is one per model
        # request and tool call. The next question's step follows at once.
        for question in (await ctx.wait_for_inbox(timeout=30))[:1]:
            payload = question.payload
            text = payload.get("q", "") if isinstance(payload, dict) else str(payload)
            result = await self.journaled.run(str(text))
            ctx.consume(question.number, reply={"answer": result.output, "answered_by": ctx.node})
            state["answered"] += 1
        return state
