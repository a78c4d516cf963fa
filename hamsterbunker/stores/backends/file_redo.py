"""The file backend's redo log, ``<root>/.redo``: a commit of several keys, listed durably
before the first is made (docs/design.md, "The file backend").

Layout: ``MAGIC``, the body's length (8 bytes, big-endian) and its SHA-256, then the
body: one JSON line of ``[key, "put", length]``, ``[key, "tmp", temp name]`` or
``[key, "del", null]``, then the inline values in order.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import re
import struct
from pathlib import Path

from ...core.errors import CorruptRecord, StoreError
from ..backend import key_problem
from ..dirs import fileio

__all__ = [
    "INLINE_BYTES",
    "LOG_NAME",
    "MAX_LOG_BYTES",
    "Ops",
    "clear_log",
    "decode",
    "encode",
    "log_pending",
    "syncfs",
    "write_log",
]

LOG_NAME = ".redo"
MAGIC = b"HB-REDO\x01"
# Values up to this size go in the log; larger ones (checkpoints) in temp files synced
# before the lock is taken, so that the lock is not held while they are written.
INLINE_BYTES = 256 * 1024
MAX_LOG_BYTES = 64 * 1024 * 1024
_HEAD = struct.Struct(">8sQ32s")
_TEMP_NAME = re.compile(re.escape(fileio.TMP_PREFIX) + r"[0-9a-f]{12}")
_LOG_FLAGS = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_LIBC = ctypes.CDLL(None, use_errno=True)

# Each key's final state in a commit: a temp file (in the root) renamed onto it, its value
# (written in place by a temp file of its own), or None: removed.
Ops = list[tuple[str, str | bytes | None]]


def encode(ops: Ops) -> bytes:
    """The log of ops; StoreError if it would be larger than a log may be."""
    listed: list[list[object]] = []
    values: list[bytes] = []
    for key, op in ops:
        if isinstance(op, bytes):
            listed.append([key, "put", len(op)])
            values.append(op)
        else:
            listed.append([key, "del", None] if op is None else [key, "tmp", op])
    body = json.dumps(listed).encode() + b"\n" + b"".join(values)
    if _HEAD.size + len(body) > MAX_LOG_BYTES:
        raise StoreError(f"a commit of {len(ops)} writes is more than a redo log takes")
    return _HEAD.pack(MAGIC, len(body), hashlib.sha256(body).digest()) + body


def decode(data: bytes) -> Ops | None:
    """The ops of a whole log of ours; None for anything else (cut short, or planted)."""
    if len(data) < _HEAD.size:
        return None
    magic, length, digest = _HEAD.unpack_from(data)
    body = data[_HEAD.size :]
    if magic != MAGIC or length != len(body) or hashlib.sha256(body).digest() != digest:
        return None
    listing, _newline, values = body.partition(b"\n")
    try:
        listed = json.loads(listing)
        ops: Ops = []
        at = 0
        for key, kind, arg in listed:
            if not isinstance(key, str) or key_problem(key) is not None:
                return None
            if kind == "put" and type(arg) is int and 0 <= arg <= len(values) - at:
                ops.append((key, values[at : at + arg]))
                at += arg
            elif kind == "tmp" and isinstance(arg, str) and _TEMP_NAME.fullmatch(arg):
                ops.append((key, arg))
            elif kind == "del" and arg is None:
                ops.append((key, None))
            else:
                return None
    except (ValueError, TypeError):
        return None
    return ops if at == len(values) else None


def write_log(root_fd: int, root: Path, data: bytes) -> None:
    """Write data as the log, durably, in place (the log file stays: no directory sync)."""
    path = root / LOG_NAME
    try:
        fd, made = fileio.open_regular(root_fd, LOG_NAME, path, _LOG_FLAGS), False
    except FileNotFoundError:
        fd, made = fileio.open_regular(root_fd, LOG_NAME, path, _LOG_FLAGS | os.O_CREAT), True
    with fileio.closing_fd(fd):
        fileio.write_all(fd, data)
        os.ftruncate(fd, len(data))
        os.fdatasync(fd)
    if made:
        os.fsync(root_fd)


def clear_log(root_fd: int, root: Path) -> None:
    """Empty the log, durably: a log left whole would be made again over later commits."""
    try:
        fd = fileio.open_regular(root_fd, LOG_NAME, root / LOG_NAME, _LOG_FLAGS)
    except (FileNotFoundError, CorruptRecord):
        return  # no log of ours there
    with fileio.closing_fd(fd):
        os.ftruncate(fd, 0)
        os.fdatasync(fd)


def log_pending(root: Path) -> bool:
    """Whether a redo log is in the root (a commit is being made, or was cut short)."""
    try:
        return os.lstat(root / LOG_NAME).st_size > 0
    except FileNotFoundError:
        return False


def syncfs(fd: int) -> None:
    """Make all that was written to fd's file system durable (Linux syncfs(2)): one sync
    for a commit's keys and folders, where an fsync of each costs one apiece."""
    if _LIBC.syncfs(fd) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
