"""The record layer: every record of the store contract laid out, once, over a backend."""

from .store import RecordStore

__all__ = ["RecordStore"]
