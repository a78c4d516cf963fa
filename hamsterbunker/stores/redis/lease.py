"""The Redis store's lease hash read whole, and replaced when it cannot be read.

The hash holds ``record`` (the JSON), ``version`` (what ``CAS_LEASE`` compares),
``fence`` and ``term``. A record is read with the version of its ``version``
field, since that is what a compare-and-set must name; so a hash whose version
field is missing or no number is as unreadable as one whose record does not
parse, and so is a key of another type: no compare-and-set could ever match it.

What such a key is (``UnreadableLease.found``) is ``FOUND``'s answer: its type,
and for a hash a SHA-1 of each of those two fields (their sizes, for fields over
the record limit, never fetched). Any write of those fields changes it, save
one that puts back the same bytes, which leaves the record as unreadable as it
was. ``REPLACE_UNREADABLE_LEASE`` compares it in the script that writes.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from ...errors import UnreadableLease
from ...limits import MAX_NUMBER, MAX_RECORD_BYTES
from ...records import LeaseRecord
from ..base import parse_lease
from .replies import raw, text

__all__ = ["READ_LEASE", "REPLACE_UNREADABLE_LEASE", "lease_in_answer"]

# A version field as cas_lease writes it (at most 19 digits: MAX_NUMBER's).
_VERSION = re.compile(rb"0|[1-9][0-9]{0,18}")
_VERSION_CAP = 24  # bytes of a version field a read fetches at most

_FOUND = """
local function found(key, cap)
  local kind = redis.call('TYPE', key)['ok']
  if kind ~= 'hash' then
    return kind
  end
  local parts = {'hash'}
  for _, field in ipairs({'record', 'version'}) do
    local size = redis.call('HSTRLEN', key, field)
    if size > cap then
      parts[#parts + 1] = 'size:' .. size
    else
      parts[#parts + 1] = redis.sha1hex(redis.call('HGET', key, field) or '')
    end
  end
  return table.concat(parts, ' ')
end
"""

# KEYS: lease hash. ARGV: the record limit, the version field limit. Returns {} for
# no key, else {found, 'type', kind}, {found, 'size', size of record or version}
# or {found, 'ok', record, version} (either '' when absent).
READ_LEASE = (
    _FOUND
    + """
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind == 'none' then
  return {}
end
local cap, version_cap = tonumber(ARGV[1]), tonumber(ARGV[2])
local what = found(KEYS[1], cap)
if kind ~= 'hash' then
  return {what, 'type', kind}
end
local record_size = redis.call('HSTRLEN', KEYS[1], 'record')
local version_size = redis.call('HSTRLEN', KEYS[1], 'version')
if record_size > cap or version_size > version_cap then
  return {what, 'size', math.max(record_size, version_size)}
end
return {what, 'ok', redis.call('HGET', KEYS[1], 'record') or '',
  redis.call('HGET', KEYS[1], 'version') or ''}
"""
)

# KEYS: lease hash. ARGV: found, the record limit, then CAS_LEASE's ARGV from the record
# on (record, fence, version, term, term channel, channels). Returns {'ok'}, or
# {'conflict'} if the key is no longer what found names. The key is dropped whole
# first (UNLINK: freed off the script's path), with whatever else was planted in it.
REPLACE_UNREADABLE_LEASE = (
    _FOUND
    + """
if found(KEYS[1], tonumber(ARGV[2])) ~= ARGV[1] then
  return {'conflict'}
end
redis.call('UNLINK', KEYS[1])
redis.call('HSET', KEYS[1], 'record', ARGV[3], 'fence', ARGV[4], 'version', ARGV[5],
  'term', ARGV[6])
for i = 7, #ARGV do
  redis.call('PUBLISH', ARGV[i], ARGV[3])
end
return {'ok'}
"""
)

READ_ARGS = [MAX_RECORD_BYTES, _VERSION_CAP]


def lease_in_answer(answer: list[Any]) -> LeaseRecord | None:
    """The lease record a READ_LEASE answer holds, with its version field's version;
    None for no key, UnreadableLease for anything else."""
    if not answer:
        return None
    found, how = text(answer[0]), text(answer[1])
    if how == "type":
        raise UnreadableLease(f"lease record is stored as a Redis {text(answer[2])}", found)
    if how == "size":
        raise UnreadableLease(
            f"lease record is {answer[2]} bytes, above the limit of {MAX_RECORD_BYTES} bytes",
            found,
        )
    record = parse_lease(raw(answer[2]), lambda: found)
    version = raw(answer[3])
    if not _VERSION.fullmatch(version) or int(version) > MAX_NUMBER:
        raise UnreadableLease(
            f"lease record's version field {version[:_VERSION_CAP]!r} is not a version", found
        )
    return replace(record, version=int(version))
