"""``hb``: the command line (``main``), one module per group of commands."""

from .main import main

__all__ = ["main"]
