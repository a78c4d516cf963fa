"""A store the earlier file store wrote (``tests/data/earlier/file.tar.gz``), loaded for a test,
and what that store's own reads answered over it (``file.json``): both made once by
the generator tests/data/earlier/README.md names, while the earlier store still existed.

``expected()`` keeps bytes as base64 and records as their JSON; ``plant`` puts raw bytes
under any name in a loaded store, as someone writing the directory could.
"""

from __future__ import annotations

import base64
import functools
import json
import tarfile
from pathlib import Path
from typing import Any

__all__ = ["DATA", "bytes_of", "expected", "load_earlier_file", "plant"]

DATA = Path(__file__).resolve().parents[1] / "data" / "earlier"


def load_earlier_file(tmp_path: Path, name: str = "earlier") -> str:
    """The fixture's files, as archived, in a fresh directory tmp_path/name: its URL."""
    root = tmp_path / name
    root.mkdir()
    with tarfile.open(DATA / "file.tar.gz") as archive:
        archive.extractall(root, filter="data")  # names relative to the store's root
    return root.as_uri()


@functools.cache
def _answers() -> str:
    return (DATA / "file.json").read_text()


def expected() -> dict[str, Any]:
    """What the earlier store answered (a fresh copy each call: tests may change it)."""
    answers: dict[str, Any] = json.loads(_answers())
    return answers


def bytes_of(text: str | None) -> bytes | None:
    """Bytes as ``expected()`` keeps them (base64), or None."""
    return None if text is None else base64.b64decode(text)


def plant(url: str, path: str, data: bytes) -> Path:
    """data as the file at path under the store at url (directories made): raw, unchecked."""
    target = Path(url.removeprefix("file://")) / path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    return target
