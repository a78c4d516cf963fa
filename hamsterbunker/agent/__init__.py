"""The agent's side of a node: its step (``step``), the effects it journals
(``effects``, ``intents``) and the work handed to it (``inbox``)."""

from .step import Agent, State, StepContext, current_step, load_agent

__all__ = ["Agent", "State", "StepContext", "current_step", "load_agent"]
