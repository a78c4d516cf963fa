"""The file store, one module per part; ``store`` holds ``FileStore`` and the key layout."""

from .location import Mount, mount_of
from .store import GUARANTEES, FileStore

__all__ = ["GUARANTEES", "FileStore", "Mount", "mount_of"]
