"""The Lua scripts of the Redis store (``hamsterbunker.stores.redis``).

Redis runs each script atomically, with nothing interleaved: that is where the
store's compare-and-set and fencing live. Each script also reads whatever a
store writer without the secret may have put in the keys it touches (fields
that are not numbers, JSON that does not decode, keys of another type, values
of any size) without a Lua error, and measures values before it returns them.
"""

from __future__ import annotations

from .inbox_scripts import CONSUME

__all__ = [
    "APPEND_EVENT",
    "BOUNDED_GET",
    "BOUNDED_HGET",
    "CAS_LEASE",
    "HEARTBEATS",
    "HELPERS",
    "LIST_CHECKPOINTS",
    "PUT_CHECKPOINT",
    "PUT_EFFECT",
    "PUT_HEARTBEAT",
    "READ_CHECKPOINT",
    "READ_EFFECTS",
    "READ_EVENTS",
    "TAIL",
]

# KEYS: lease hash. ARGV: expected version ('' for none), record JSON, fence,
# new version, the record's term (LeaseRecord.term), the channel told only when
# the term changes (a watch of terms sleeps through renewals), channels to
# publish on. The message is the record (a watcher spares a read). Returns {'ok'} or {'conflict', version},
# the version cut to 24 bytes: ours have at most 19 digits, and one a store
# writer made huge is not shipped whole on every attempt.
CAS_LEASE = """
local current = redis.pcall('HGET', KEYS[1], 'version') or ''
if type(current) == 'table' then
  return {'conflict', 'unreadable (the key is not a hash)'}
end
if current ~= ARGV[1] then
  return {'conflict', string.sub(current, 1, 24)}
end
local term = redis.call('HGET', KEYS[1], 'term')
redis.call('HSET', KEYS[1], 'record', ARGV[2], 'fence', ARGV[3], 'version', ARGV[4],
  'term', ARGV[5])
if term ~= ARGV[5] then
  redis.call('PUBLISH', ARGV[6], ARGV[2])
end
for i = 7, #ARGV do
  redis.call('PUBLISH', ARGV[i], ARGV[2])
end
return {'ok'}
"""

# KEYS: lease hash, checkpoint info hash, blob hash, effect-steps sorted set,
# then the inbox's keys (inbox_scripts.INBOX_KEYS).
# ARGV: fence, seq, info JSON, blob, how many to keep, channel, the fence's
# epoch, MAX_SEQ, MAX_RECORD_BYTES, MAX_CHECKPOINT_BYTES, the effect journal
# key prefix (a step's hash is this prefix and its seq), how many older steps'
# journals to remove at most, then the consumption's (inbox_scripts.CONSUME).
# Returns {'ok'}, {'fenced', stored fence} or
# {'seq', a stored seq of this epoch}. Whatever a store writer put in the hashes, this
# never raises a Lua error: a field that is not a seq as we write one, or a
# description that does not decode (pcall around cjson) or that the listing
# would leave out, is passed over; only a checkpoint of the fence's own epoch at
# or above seq refuses the write. Retention keeps the newest ARGV[5] at or
# below seq and never touches anything above it. A lease key of another type is
# no lease (fenced); checkpoint keys of another type are replaced. A refusing
# fence over MAX_RECORD_BYTES is sent back cut to one byte over: still
# unreadable, without its bytes.
#
# With the checkpoint written (the same atomic step, so never before it), the
# effect journal of its step and older goes: this step's hash always, and the
# hashes of the lowest steps the sorted set lists at or below seq, at most
# ARGV[12] of them (leftovers go at the next checkpoint). A member is trusted
# only as far as it names a seq as we write one: its score is not believed
# (a member that names a step above seq is scored again, right, and left for
# that step's checkpoint), and one that names no seq is dropped; a set of
# another type is dropped. Hashes go by UNLINK: a planted huge one is freed off
# the script's path.
#
# Then, still in the same step, the submissions the step consumed are consumed
# (inbox_scripts.CONSUME): all or nothing with the checkpoint, and nothing at
# all when the fence or the seq refuses it, since both are checked before the
# first write.
PUT_CHECKPOINT = (
    """
local fence = redis.pcall('HGET', KEYS[1], 'fence') or ''
if type(fence) == 'table' then
  return {'fenced', ''}
end
if fence ~= ARGV[1] then
  return {'fenced', string.sub(fence, 1, tonumber(ARGV[9]) + 1)}
end
-- A checkpoint hash someone replaced by another type holds nothing we can read.
for i = 2, 3 do
  local kind = redis.call('TYPE', KEYS[i])['ok']
  if kind ~= 'hash' and kind ~= 'none' then
    redis.call('DEL', KEYS[i])
  end
end
local seq, epoch = tonumber(ARGV[2]), tonumber(ARGV[7])
local max_seq, cap, max_size = tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])
local function seq_of(field)
  if #field > 16 or not string.match(field, '^[1-9]%d*$') then
    return nil
  end
  local n = tonumber(field)
  if n > max_seq then
    return nil
  end
  return n
end
local function finite(x)
  return type(x) == 'number' and x == x and x ~= math.huge and x ~= -math.huge
end
local function of_this_epoch(field, s)
  if redis.call('HSTRLEN', KEYS[2], field) > cap then
    return false
  end
  local ok, doc = pcall(cjson.decode, redis.call('HGET', KEYS[2], field))
  if not ok or type(doc) ~= 'table' or doc['epoch'] ~= epoch then
    return false
  end
  if doc['seq'] ~= nil and doc['seq'] ~= s then
    return false
  end
  local size = doc['size']
  return finite(size) and size >= 0 and size <= max_size and size == math.floor(size)
    and finite(doc['written'])
end
local kept = {}
for _, field in ipairs(redis.call('HKEYS', KEYS[2])) do
  local s = seq_of(field)
  if s ~= nil then
    if s >= seq and of_this_epoch(field, s) then
      return {'seq', field}
    end
    if s < seq then
      table.insert(kept, {s, field})
    end
  end
end
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
redis.call('HSET', KEYS[3], ARGV[2], ARGV[4])
table.insert(kept, {seq, ARGV[2]})
table.sort(kept, function(a, b) return a[1] > b[1] end)
for i = tonumber(ARGV[5]) + 1, #kept do
  redis.call('HDEL', KEYS[2], kept[i][2])
  redis.call('HDEL', KEYS[3], kept[i][2])
end
redis.call('UNLINK', ARGV[11] .. ARGV[2])
local steps = redis.pcall('ZRANGEBYSCORE', KEYS[4], '-inf', ARGV[2], 'LIMIT', 0, tonumber(ARGV[12]))
if steps['err'] then
  redis.call('UNLINK', KEYS[4])
else
  for _, member in ipairs(steps) do
    local s = seq_of(member)
    if s ~= nil and s > seq then
      redis.call('ZADD', KEYS[4], s, member)
    else
      if s ~= nil then
        redis.call('UNLINK', ARGV[11] .. member)
      end
      redis.call('ZREM', KEYS[4], member)
    end
  end
end
"""
    + CONSUME
    + """
redis.call('PUBLISH', ARGV[6], 'checkpoint')
return {'ok'}
"""
)

# KEYS: lease hash, the step's effect journal hash, effect-steps sorted set.
# ARGV: fence, field ("<index>:<kind>"), sealed record, seq, channel,
# MAX_RECORD_BYTES. Returns {'ok'} or {'fenced', stored fence}, fenced and cut
# as PUT_CHECKPOINT is. A journal hash or steps set of another type (put there
# by someone else) would fail every record of the step for ever: replaced.
PUT_EFFECT = """
local fence = redis.pcall('HGET', KEYS[1], 'fence') or ''
if type(fence) == 'table' then
  return {'fenced', ''}
end
if fence ~= ARGV[1] then
  return {'fenced', string.sub(fence, 1, tonumber(ARGV[6]) + 1)}
end
local wanted = {'hash', 'zset'}
for i = 2, 3 do
  local kind = redis.call('TYPE', KEYS[i])['ok']
  if kind ~= wanted[i - 1] and kind ~= 'none' then
    redis.call('UNLINK', KEYS[i])
  end
end
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
redis.call('ZADD', KEYS[3], ARGV[4], ARGV[4])
redis.call('PUBLISH', ARGV[5], 'effect')
return {'ok'}
"""

# KEYS: a step's effect journal hash. ARGV: MAX_EFFECT_BYTES,
# MAX_EFFECTS_PER_STEP, then the kinds. Returns {'type', its type} if the key
# is not a hash, else {number of fields, then field, value pairs} for the
# fields we write ("<index>:<kind>", index below MAX_EFFECTS_PER_STEP) that
# exist, a value over the limit replaced by its length (an integer). Only those
# fields are looked at, each by name: whatever else was planted in the hash,
# however much, costs nothing here and is only counted.
READ_EFFECTS = """
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind == 'none' then
  return {0}
end
if kind ~= 'hash' then
  return {'type', kind}
end
local cap = tonumber(ARGV[1])
local out = {redis.call('HLEN', KEYS[1])}
for index = 0, tonumber(ARGV[2]) - 1 do
  for k = 3, #ARGV do
    local field = string.format('%d:%s', index, ARGV[k])
    local size = redis.call('HSTRLEN', KEYS[1], field)
    if size > 0 or redis.call('HEXISTS', KEYS[1], field) == 1 then
      table.insert(out, field)
      if size > cap then
        table.insert(out, size)
      else
        table.insert(out, redis.call('HGET', KEYS[1], field))
      end
    end
  end
end
return out
"""

# KEYS: checkpoint info hash. ARGV: MAX_RECORD_BYTES. Returns field, description
# pairs; a description over the limit comes back as its length (an integer),
# unread. Returns nil if the key is not a hash.
LIST_CHECKPOINTS = """
local fields = redis.pcall('HKEYS', KEYS[1])
if fields['err'] then
  return false
end
local out = {}
for _, field in ipairs(fields) do
  local size = redis.call('HSTRLEN', KEYS[1], field)
  table.insert(out, field)
  if size > tonumber(ARGV[1]) then
    table.insert(out, size)
  else
    table.insert(out, redis.call('HGET', KEYS[1], field))
  end
end
return out
"""

# KEYS: checkpoint info hash, blob hash. ARGV: seq, MAX_RECORD_BYTES,
# MAX_CHECKPOINT_BYTES. Returns {} if either is gone, else {description, blob},
# each replaced by its length (an integer) when over its limit: the bytes of a
# huge blob never leave the server.
READ_CHECKPOINT = """
for i = 1, 2 do
  if redis.call('TYPE', KEYS[i])['ok'] ~= 'hash' or redis.call('HEXISTS', KEYS[i], ARGV[1]) == 0 then
    return {}
  end
end
local out = {}
for i, cap in ipairs({tonumber(ARGV[2]), tonumber(ARGV[3])}) do
  local size = redis.call('HSTRLEN', KEYS[i], ARGV[1])
  if size > cap then
    table.insert(out, size)
  else
    table.insert(out, redis.call('HGET', KEYS[i], ARGV[1]))
  end
end
return out
"""

# KEYS: a hash. ARGV: field, limit. Returns {} if absent, {length} (an integer)
# if over the limit, {'type', its type} if the key is not a hash, else {value}.
BOUNDED_HGET = """
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind ~= 'hash' and kind ~= 'none' then
  return {'type', kind}
end
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then
  return {}
end
local size = redis.call('HSTRLEN', KEYS[1], ARGV[1])
if size > tonumber(ARGV[2]) then
  return {size}
end
return {redis.call('HGET', KEYS[1], ARGV[1])}
"""

# KEYS: a string key. ARGV: limit. As BOUNDED_HGET, for a whole key.
BOUNDED_GET = """
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind == 'none' then
  return {}
end
if kind ~= 'string' then
  return {'type', kind}
end
local size = redis.call('STRLEN', KEYS[1])
if size > tonumber(ARGV[1]) then
  return {size}
end
return {redis.call('GET', KEYS[1])}
"""

# Lua helpers shared by the event and heartbeat readers: a node id as check_name accepts it,
# an event count as we write it (digits, exact in a double), and one node's
# list with every entry over the record limit blanked (so it is reported as
# unreadable, never shipped). A key of the wrong type reads as empty (pcall).
HELPERS = """
local function node_ok(node)
  return #node <= 64 and string.match(node, '^[A-Za-z0-9][A-Za-z0-9._-]*$') ~= nil
end
local function count_of(text)
  if #text > 15 or not string.match(text, '^%d+$') then
    return nil
  end
  return tonumber(text)
end
local function bounded_range(key, first, cap)
  local lines = redis.pcall('LRANGE', key, first, -1)
  if type(lines) ~= 'table' or lines['err'] then
    return {}
  end
  for i, line in ipairs(lines) do
    if #line > cap then
      lines[i] = ''
    end
  end
  return lines
end
local function bounded_hash(key, cap)
  local flat = redis.pcall('HGETALL', key)
  if type(flat) ~= 'table' or flat['err'] then
    return {}
  end
  for i = 2, #flat, 2 do
    if #flat[i] > cap then
      flat[i] = ''
    end
  end
  return flat
end
"""

# KEYS: event counts hash, heartbeats hash. ARGV: events key prefix,
# MAX_RECORD_BYTES, then (node, count already read) pairs. Returns the
# heartbeats, then for each node with new events {node, count, events}. One
# script, so the counts and the lists are read at one moment (the list keys
# are derived here, which is why Redis Cluster is not supported). Counts and
# node names that are not as we write them are passed over. A log dropped by
# hb forget: a node read before and no longer counted comes back as {node}; a
# count below the one read started afresh, and all of its list is new.
TAIL = (
    HELPERS
    + """
local cap = tonumber(ARGV[2])
local seen = {}
for i = 3, #ARGV, 2 do
  seen[ARGV[i]] = tonumber(ARGV[i + 1])
end
local out = {bounded_hash(KEYS[2], cap)}
local counts = bounded_hash(KEYS[1], cap)
local counted = {}
for i = 1, #counts, 2 do
  local node, count = counts[i], count_of(counts[i + 1])
  if count ~= nil and node_ok(node) then
    counted[node] = true
    local new = count - (seen[node] or 0)
    if new < 0 then
      new = count
    end
    if new > 0 then
      local key = ARGV[1] .. node
      local length = redis.pcall('LLEN', key)
      if type(length) ~= 'number' then
        length = 0
      end
      new = math.min(new, length)
      local lines = {}
      if new > 0 then
        lines = bounded_range(key, -new, cap)
      end
      table.insert(out, {node, count, lines})
    end
  end
end
for node, _ in pairs(seen) do
  if not counted[node] then
    table.insert(out, {node})
  end
end
return out
"""
)

# KEYS: the node's event list, event counts hash. ARGV: node, event JSON, how
# many to keep, channel. A list key of the wrong type, a count that is not an
# integer or a counts key of the wrong type (put there by someone else) would
# fail every append of this node for ever: they are started afresh instead.
APPEND_EVENT = """
local kind = redis.call('TYPE', KEYS[2])['ok']
if kind ~= 'hash' and kind ~= 'none' then
  redis.call('DEL', KEYS[2])
end
local pushed = redis.pcall('RPUSH', KEYS[1], ARGV[2])
if type(pushed) == 'table' and pushed['err'] then
  redis.call('DEL', KEYS[1])
  redis.call('RPUSH', KEYS[1], ARGV[2])
end
redis.call('LTRIM', KEYS[1], -tonumber(ARGV[3]), -1)
local counted = redis.pcall('HINCRBY', KEYS[2], ARGV[1], 1)
if type(counted) == 'table' and counted['err'] then
  redis.call('HSET', KEYS[2], ARGV[1], redis.call('LLEN', KEYS[1]))
end
redis.call('PUBLISH', ARGV[4], 'event')
return 1
"""

# KEYS: heartbeats hash. ARGV: node, heartbeat JSON ('' to remove), channel. A
# heartbeats key of another type would fail every heartbeat for ever: replaced.
PUT_HEARTBEAT = """
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind ~= 'hash' and kind ~= 'none' then
  redis.call('DEL', KEYS[1])
end
if ARGV[2] == '' then
  redis.call('HDEL', KEYS[1], ARGV[1])
else
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
end
redis.call('PUBLISH', ARGV[3], 'heartbeat')
return 1
"""

# KEYS: heartbeats hash. ARGV: MAX_RECORD_BYTES. HGETALL, with every heartbeat
# over the limit blanked.
HEARTBEATS = (
    HELPERS
    + """
return bounded_hash(KEYS[1], tonumber(ARGV[1]))
"""
)

# KEYS: event counts hash. ARGV: events key prefix, MAX_RECORD_BYTES. Returns
# {node, events} for every node whose name is as we write one.
READ_EVENTS = (
    HELPERS
    + """
local cap = tonumber(ARGV[2])
local out = {}
local nodes = redis.pcall('HKEYS', KEYS[1])
if type(nodes) ~= 'table' or nodes['err'] then
  return out
end
for _, node in ipairs(nodes) do
  if node_ok(node) then
    table.insert(out, {node, bounded_range(ARGV[1] .. node, 0, cap)})
  end
end
return out
"""
)
