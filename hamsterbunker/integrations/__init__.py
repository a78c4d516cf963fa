"""Adapters that journal and fence the agents of other frameworks (extras: pydantic-ai, langgraph)."""
