"""Hypothesis strategies for what a store writer without the secret might write: values that
parse as JSON but mean nothing, with the numbers that matter to bounds among them."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from hamsterbunker.core.limits import MAX_EPOCH, MAX_SEQ

__all__ = ["json_values"]


def json_values() -> st.SearchStrategy[Any]:
    """Any JSON value (NaN and huge integers included), nested a few levels at most."""
    scalars = (
        st.none()
        | st.booleans()
        | st.integers(min_value=-(2**80), max_value=2**80)
        | st.sampled_from([0, 1, 2, MAX_EPOCH, MAX_EPOCH + 1, MAX_SEQ, 2**63, -1])
        | st.floats()
        | st.text(max_size=30)
    )
    return st.recursive(
        scalars,
        lambda inner: (
            st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
        ),
        max_leaves=20,
    )
