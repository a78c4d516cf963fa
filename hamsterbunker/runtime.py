"""Where ``Runtime`` used to live: it is ``hamsterbunker.node`` now; this keeps old imports."""

from .node import Runtime

__all__ = ["Runtime"]
