"""Moved to ``hamsterbunker.stores.tail``; every store has ``tail(agent)`` now.

Kept only while a backend still imports its names from here.
"""

from __future__ import annotations

from .stores.tail import Tail, TailRead

__all__ = ["Tail", "TailRead"]
