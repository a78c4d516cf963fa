"""``hb-tui``: the live monitor of a HamsterBunker cluster (Textual)."""
