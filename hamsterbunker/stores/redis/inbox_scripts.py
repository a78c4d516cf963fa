"""The Lua scripts of the Redis store's inbox (``hamsterbunker.stores.redis.inbox``).

The keys are told in that module's docstring; every script takes the inbox's
keys in one order, ``INBOX_KEYS``. As the store's other scripts, these never
raise a Lua error on what a store writer without the secret put in the keys
(keys of another type, fields that are not numbers as we write them, values of
any size): each value is measured (``HSTRLEN``) before it is fetched, and every
check comes before the first write, so a script that refuses has changed
nothing, but for a junk counter ADMIT rebuilt from the stored entries (written
even when it refuses, so that the counter never goes back).

``CONSUME`` is not a script of its own: it is the part of the checkpoint script
(``scripts.PUT_CHECKPOINT``) that runs once the fenced checkpoint is written,
in the same atomic step.
"""

from __future__ import annotations

__all__ = [
    "ADMIT",
    "CONSUME",
    "INBOX_HELPERS",
    "INBOX_KEYS",
    "READ_ADMISSION",
    "READ_INBOX",
    "READ_REPLIES",
]

# The inbox's keys (under P:agent:A:), in the order every script takes them.
INBOX_KEYS = (
    "inbox",
    "inbox:pending",
    "inbox:numbers",
    "inbox:ids",
    "inbox:consumed",
    "inbox:replies",
    "inbox:kept",
)

# Lua helpers. number_in(key, field, max): the number stored under a hash field
# as we write one (decimal digits, no leading zero, at most max), 0 if the
# field is absent, nil for anything else; measured before it is fetched.
# usable(key, kind): whether key is of that kind or absent.
INBOX_HELPERS = """
local function number_in(key, field, max)
  local size = redis.call('HSTRLEN', key, field)
  if size == 0 then
    if redis.call('HEXISTS', key, field) == 0 then
      return 0
    end
    return nil
  end
  if size > 16 then
    return nil
  end
  local text = redis.call('HGET', key, field)
  if not string.match(text, '^%d+$') or (#text > 1 and string.sub(text, 1, 1) == '0') then
    return nil
  end
  local n = tonumber(text)
  if n > max then
    return nil
  end
  return n
end
local function usable(key, kind)
  local found = redis.call('TYPE', key)['ok']
  return found == kind or found == 'none'
end
"""

# KEYS: INBOX_KEYS. ARGV: request id, number, sealed submission,
# MAX_INBOX_COUNT, MAX_INBOX_BYTES, MAX_SEQ, channel, MAX_SUBMISSION_BYTES. Returns
#   {'duplicate', number}                 the request id is known: nothing stored
#   {'next', next number, rebuilt}        number is not the next one
#   {'count', '', rebuilt} / {'bytes', total, rebuilt}
#                                         admitting it would pass a limit
#   {'ok', '', rebuilt}                   stored: entry, number, request id, counter, total
# rebuilt: what of the counter's hash was junk and rebuilt from the stored entries
# ('inbox' for the hash of another type, then 'last', 'bytes', space-separated; '' for
# none). One junk write must not stop admissions for good (DESIGN.md invariant 10), so
# a counter that is not as we write it becomes the highest number among the pending and
# the kept consumed ones (never a number given twice), a byte total the sealed bytes of
# the pending entries (at most MAX_INBOX_COUNT looked at: past that, admission is
# refused anyway); the rebuilt counter is written even when the admission is refused,
# so that it never goes back. A request id whose index entry is not a number is taken
# as unknown (the admission replaces it). The pending hash or the numbers set of another
# type holds nothing readable: both are replaced, and the byte total restarts at 0; the
# other sets of another type are replaced (what they held is unreadable). A pending
# entry above the counter was never admitted (planted), so never counted in the total:
# replaced.
ADMIT = (
    INBOX_HELPERS
    + """
local state, pending, numbers, ids = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local rid, number, blob = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local max_count, max_bytes, max_seq = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local cap = tonumber(ARGV[8])
local wanted = {'hash', 'hash', 'zset', 'hash', 'hash', 'hash', 'zset'}
local fine = {}
for i = 1, 7 do
  fine[i] = usable(KEYS[i], wanted[i])
end
if fine[4] then
  local known = number_in(ids, rid, max_seq)
  if known ~= nil and known > 0 then
    return {'duplicate', string.format('%d', known)}
  end
end
-- The highest whole score of a sorted set up to max_seq (0 if none): above any of ours.
local function highest(key)
  local top = redis.call('ZREVRANGEBYSCORE', key, max_seq, '-inf', 'WITHSCORES', 'LIMIT', 0, 1)
  local score = tonumber(top[2])
  if score == nil or score < 1 then
    return 0
  end
  return math.floor(score)
end
-- The sealed bytes of the pending entries no bigger than a submission may be (bigger
-- ones are never read, so never consumed), the first max_count numbers looked at.
local function pending_bytes()
  local sum = 0
  for _, n in ipairs(redis.call('ZRANGE', numbers, 0, max_count - 1)) do
    local size = redis.call('HSTRLEN', pending, n)
    if size <= cap then
      sum = sum + size
    end
  end
  return sum
end
local reset = not (fine[2] and fine[3])
local rebuilt = {}
if not fine[1] then
  table.insert(rebuilt, 'inbox')
end
local last = fine[1] and number_in(state, 'last', max_seq) or nil
if last == nil then
  last = math.max(fine[3] and highest(numbers) or 0, fine[7] and highest(KEYS[7]) or 0)
  if fine[1] then
    table.insert(rebuilt, 'last')
  end
end
local total = fine[1] and number_in(state, 'bytes', 2^53) or nil
if total == nil and fine[1] then
  table.insert(rebuilt, 'bytes')
end
if reset then
  total = 0
elseif total == nil then
  total = pending_bytes()
end
local function set_counter(last_text, bytes)
  if not fine[1] then
    redis.call('UNLINK', state)
  end
  redis.call('HSET', state, 'last', last_text, 'bytes', string.format('%d', bytes))
end
local said = table.concat(rebuilt, ' ')
local function refuse(status, value)
  if said ~= '' then
    set_counter(string.format('%d', last), total)
  end
  return {status, value, said}
end
if number ~= last + 1 then
  return refuse('next', string.format('%d', last + 1))
end
local count = 0
if not reset then
  count = redis.call('ZCARD', numbers)
end
if count + 1 > max_count then
  return refuse('count', '')
end
if total + #blob > max_bytes and not reset then
  -- A total forged to look full (it parses) would refuse every admission for good:
  -- recount it from the pending entries (sizes only, no value is fetched).
  local counted = pending_bytes()
  if counted ~= total then
    total = counted
    table.insert(rebuilt, 'bytes')
    said = table.concat(rebuilt, ' ')
  end
end
if total + #blob > max_bytes then
  return refuse('bytes', string.format('%d', total + #blob))
end
for i = 2, 7 do
  if not fine[i] or (reset and (i == 2 or i == 3)) then
    redis.call('UNLINK', KEYS[i])
  end
end
redis.call('HSET', pending, ARGV[2], blob)
redis.call('ZADD', numbers, ARGV[2], ARGV[2])
redis.call('HSET', ids, rid, ARGV[2])
set_counter(ARGV[2], total + #blob)
redis.call('PUBLISH', ARGV[7], 'admitted')
return {'ok', '', said}
"""
)

# The consumption, run by scripts.PUT_CHECKPOINT once its checkpoint is written.
# KEYS[5..11]: INBOX_KEYS. ARGV[13..16]: how many consumed records
# to keep, how many older ones to remove at most, MAX_SEQ, MAX_REQUEST_ID_CHARS;
# from ARGV[17] on, (number, request id, '1' with a reply or '0', the reply or '') for each
# consumed. Each: its pending entry and number go (its bytes off the total), its
# request id is recorded, its reply kept (or none), its number added to the kept
# set, and the request id indexed unless it already names a number. Then the
# lowest kept numbers past the newest ones to keep go with their records and
# their request ids (if the id still names that number), at most as many as
# told (leftovers go at the next checkpoint, so the work is bounded whatever was
# planted). Keys of another type are replaced, as ADMIT does, except the
# counter's hash: never replaced here (the counter must not go back); a total
# that is not a number is left as it is (ADMIT rebuilds it), unless the pending
# entries were lost with their key, when it restarts at 0 with them.
CONSUME = (
    INBOX_HELPERS
    + """
do
  local state, pending, numbers, ids = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
  local consumed, replies, kept = KEYS[9], KEYS[10], KEYS[11]
  local keep, bound = tonumber(ARGV[13]), tonumber(ARGV[14])
  local max_seq, max_rid = tonumber(ARGV[15]), tonumber(ARGV[16])
  local state_fine = usable(state, 'hash')
  if not (usable(pending, 'hash') and usable(numbers, 'zset')) then
    redis.call('UNLINK', pending, numbers)
    if state_fine then
      redis.call('HSET', state, 'bytes', '0')
    end
  end
  for _, pair in ipairs({{ids, 'hash'}, {consumed, 'hash'}, {replies, 'hash'}, {kept, 'zset'}}) do
    if not usable(pair[1], pair[2]) then
      redis.call('UNLINK', pair[1])
    end
  end
  local freed = 0
  for i = 17, #ARGV, 4 do
    local n, rid = ARGV[i], ARGV[i + 1]
    freed = freed + redis.call('HSTRLEN', pending, n)
    redis.call('HDEL', pending, n)
    redis.call('ZREM', numbers, n)
    redis.call('HSET', consumed, n, rid)
    if ARGV[i + 2] == '1' then
      redis.call('HSET', replies, n, ARGV[i + 3])
    else
      redis.call('HDEL', replies, n)
    end
    redis.call('ZADD', kept, n, n)
    local known = number_in(ids, rid, max_seq)
    if known == nil or known == 0 then
      redis.call('HSET', ids, rid, n)
    end
  end
  if freed > 0 and state_fine then
    local total = number_in(state, 'bytes', 2^53)
    if total ~= nil then
      redis.call('HSET', state, 'bytes', string.format('%d', math.max(total - freed, 0)))
    end
  end
  local excess = redis.call('ZCARD', kept) - keep
  if excess > 0 then
    for _, n in ipairs(redis.call('ZRANGE', kept, 0, math.min(excess, bound) - 1)) do
      local size = redis.call('HSTRLEN', consumed, n)
      if size > 0 and size <= max_rid then
        local rid = redis.call('HGET', consumed, n)
        if redis.call('HSTRLEN', ids, rid) <= 16 and redis.call('HGET', ids, rid) == n then
          redis.call('HDEL', ids, rid)
        end
      end
      redis.call('HDEL', consumed, n)
      redis.call('HDEL', replies, n)
      redis.call('ZREM', kept, n)
    end
  end
end
"""
)

# KEYS: INBOX_KEYS. ARGV: after, MAX_INBOX_COUNT, MAX_SUBMISSION_BYTES,
# MAX_INBOX_BYTES, MAX_SEQ. Returns {'type', key name, its type} if the pending
# hash or the numbers set is of another type, else {left out, stopped, then
# number, sealed bytes pairs}: the pending numbers above after, ascending, at
# most MAX_INBOX_COUNT looked at; a member that is not a number as we write it
# (its score that number, at most MAX_SEQ) is counted in "left out" and not
# sent, a number without an entry is passed over, and an entry over
# MAX_SUBMISSION_BYTES is sent as its length (an integer), unread. Once the
# entries sent would pass MAX_INBOX_BYTES (only a planted or damaged inbox holds
# that much), the reading stops there, stopped = 1: a later read, after
# consumption, goes on from there, so no more than that leaves the server.
READ_INBOX = """
local pending, numbers = KEYS[2], KEYS[3]
for _, pair in ipairs({{pending, 'hash', 'inbox:pending'}, {numbers, 'zset', 'inbox:numbers'}}) do
  local found = redis.call('TYPE', pair[1])['ok']
  if found ~= pair[2] and found ~= 'none' then
    return {'type', pair[3], found}
  end
end
local count, cap, max_bytes = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local max_seq = tonumber(ARGV[5])
local members = redis.call(
  'ZRANGEBYSCORE', numbers, '(' .. ARGV[1], '+inf', 'WITHSCORES', 'LIMIT', 0, count)
local out = {0, 0}
local total = 0
for i = 1, #members, 2 do
  local n, score = members[i], tonumber(members[i + 1])
  local good = #n <= 16 and string.match(n, '^[1-9]%d*$') ~= nil
  if good then
    good = tonumber(n) == score and score <= max_seq
  end
  if not good then
    out[1] = out[1] + 1
  else
    local size = redis.call('HSTRLEN', pending, n)
    if size > cap then
      table.insert(out, n)
      table.insert(out, size)
    elseif size > 0 or redis.call('HEXISTS', pending, n) == 1 then
      if total + size > max_bytes then
        out[2] = 1
        break
      end
      total = total + size
      table.insert(out, n)
      table.insert(out, redis.call('HGET', pending, n))
    end
  end
end
return out
"""

# KEYS: INBOX_KEYS. ARGV: request id, MAX_REPLY_BYTES, MAX_REQUEST_ID_CHARS.
# Returns {} if the request id is not indexed, {'type', key name} if a key it
# needs is of another type, {'number', its length} if the indexed number is
# over 16 bytes, else {number} for a pending one, {number, request id} for one
# consumed without a reply, {number, request id, reply} with one; a request id
# or reply over its limit comes as its length (an integer), unread.
READ_ADMISSION = """
local ids, consumed, replies = KEYS[4], KEYS[5], KEYS[6]
local names = {[4] = 'inbox:ids', [5] = 'inbox:consumed', [6] = 'inbox:replies'}
for i = 4, 6 do
  local found = redis.call('TYPE', KEYS[i])['ok']
  if found ~= 'hash' and found ~= 'none' then
    return {'type', names[i]}
  end
end
if redis.call('HEXISTS', ids, ARGV[1]) == 0 then
  return {}
end
local size = redis.call('HSTRLEN', ids, ARGV[1])
if size > 16 then
  return {'number', size}
end
local n = redis.call('HGET', ids, ARGV[1])
if redis.call('HEXISTS', consumed, n) == 0 then
  return {n}
end
local out = {n}
local rid_size = redis.call('HSTRLEN', consumed, n)
if rid_size > tonumber(ARGV[3]) then
  table.insert(out, rid_size)
else
  table.insert(out, redis.call('HGET', consumed, n))
end
if redis.call('HEXISTS', replies, n) == 1 then
  local reply_size = redis.call('HSTRLEN', replies, n)
  if reply_size > tonumber(ARGV[2]) then
    table.insert(out, reply_size)
  else
    table.insert(out, redis.call('HGET', replies, n))
  end
end
return out
"""

# KEYS: INBOX_KEYS. ARGV: after, how many kept numbers to look at, how many replies
# to send, MAX_REPLY_BYTES, MAX_SEQ. Returns {'type', key name, its type} if the
# replies hash or the kept set is of another type, else {left out, next, then
# number, sealed reply pairs}: the kept numbers above after, ascending, with a
# reply, a reply over MAX_REPLY_BYTES sent as its length (an integer), unread. A
# member that is not a number as we write it is counted in "left out". next is
# the score to read on after ('' once no kept number is left past the page).
READ_REPLIES = """
local replies, kept = KEYS[6], KEYS[7]
for _, pair in ipairs({{replies, 'hash', 'inbox:replies'}, {kept, 'zset', 'inbox:kept'}}) do
  local found = redis.call('TYPE', pair[1])['ok']
  if found ~= pair[2] and found ~= 'none' then
    return {'type', pair[3], found}
  end
end
local scan, count, cap = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local max_seq = tonumber(ARGV[5])
local members = redis.call(
  'ZRANGEBYSCORE', kept, '(' .. ARGV[1], '+inf', 'WITHSCORES', 'LIMIT', 0, scan)
local out = {0, ''}
local sent, last = 0, nil
for i = 1, #members, 2 do
  local n, score = members[i], members[i + 1]
  last = score
  local good = #n <= 16 and string.match(n, '^[1-9]%d*$') ~= nil
  if good then
    good = tonumber(n) == tonumber(score) and tonumber(score) <= max_seq
  end
  if not good then
    out[1] = out[1] + 1
  elseif redis.call('HEXISTS', replies, n) == 1 then
    local size = redis.call('HSTRLEN', replies, n)
    table.insert(out, n)
    if size > cap then
      table.insert(out, size)
    else
      table.insert(out, redis.call('HGET', replies, n))
    end
    sent = sent + 1
    if sent == count then
      break
    end
  end
end
if last ~= nil and redis.call('ZCOUNT', kept, '(' .. last, '+inf') > 0 then
  out[2] = last
end
return out
"""
