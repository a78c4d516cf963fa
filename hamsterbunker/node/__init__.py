"""The node: one ``Runtime`` per agent and machine, made of small parts that each do one thing.

Read ``runtime`` first: it wires the others. None of the parts refers back to
the ``Runtime`` or reaches into another's fields; each is handed what it needs.
"""

from .runtime import Runtime

__all__ = ["Runtime"]
