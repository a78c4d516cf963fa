"""python -m hamsterbunker_tui: the same as hb-tui."""

from .cli import main

raise SystemExit(main())
