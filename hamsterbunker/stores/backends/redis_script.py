"""The one Lua script of the Redis backend (``backends.redis``): a whole Txn in one atomic step.

KEYS[1] is the index (a sorted set). ARGV: the prefix of value keys, the
channel, the most bytes of a value a message carries, the most members one
scan may pass over that hold no key, the most bytes of a message, then the
Txn's operations, compares first, then writes, then reads, each a word and
its arguments::

    eq KEY VALUE        absent KEY          put KEY VALUE
    del KEY             delrange MIN MAX    (ZRANGEBYLEX bounds: start up to end)
    get KEY MAX_BYTES   scan PREFIX MIN MAX COUNT ENTRY_BYTES TOTAL_BYTES

It answers ``{succeeded (1 or 0), read, ...}``: a get as ``{}`` (no value),
``{value}`` or ``{size}`` (over its bytes, unread); a scan as ``{more (1 or 0),
key, value or size, ...}``. A commit that wrote publishes one message on the
channel, what it changed: for each key ``KEY \\n``, or ``KEY SIZE \\n VALUE``
for a value small enough to carry; ``*`` where that is over the most bytes of a
message (anything may have changed). Why the script is written as it is (no
command that can fail once it writes; planted members): docs/design.md.
"""

from __future__ import annotations

__all__ = ["TXN"]

TXN = r"""
local index, value_prefix, channel = KEYS[1], ARGV[1], ARGV[2]
local carried, junk_looked, told_most = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])

-- The words and their arguments are checked whole before anything is written.
local arity = {eq = 3, absent = 2, put = 3, del = 2, delrange = 3, get = 3, scan = 7}
local i = 6
while i <= #ARGV do
  local n = arity[ARGV[i]]
  if n == nil or i + n - 1 > #ARGV then
    return redis.error_reply('not an operation at argument ' .. i)
  end
  i = i + n
end

-- An index of another type indexes nothing: it goes, and the first put makes a new one.
local kind = redis.call('TYPE', index)['ok']
if kind ~= 'zset' and kind ~= 'none' then redis.call('UNLINK', index) end
-- Lex ranges need one score, and ours are all 0: before the first range of a call, a
-- member planted with another is put back in order, a bounded number per call.
local in_order = false
local function order_index()
  if in_order then return end
  in_order = true
  for _, scores in ipairs({{'-inf', '(0'}, {'(0', '+inf'}}) do
    for _, member in ipairs(redis.call('ZRANGEBYSCORE', index, scores[1], scores[2], 'LIMIT', 0, 128)) do
      redis.call('ZADD', index, 0, member)
    end
  end
end

-- backend.key_problem: 1 to 1024 characters, /-separated names of at most 192.
local function is_key(key)
  if #key == 0 or #key > 1024 then return false end
  for name in string.gmatch(key .. '/', '([^/]*)/') do
    if #name > 192 or not string.find(name, '^[%w][%w._:@+=-]*$') then return false end
  end
  return true
end

-- The size of key's value when the key is stored (in the index, and a string), else nil.
-- value_size: the same for a key known to be in the index.
local function value_size(key)
  local value = value_prefix .. key
  local size = redis.pcall('STRLEN', value)  -- an error: a value of another type
  if type(size) ~= 'number' or (size == 0 and redis.call('EXISTS', value) == 0) then
    return nil
  end
  return size
end

local function stored_size(key)
  return redis.call('ZSCORE', index, key) and value_size(key) or nil
end

-- What the commit changed, told in one message once it is made.
local told, told_bytes = {}, 0
local function publish(key, value)
  local entry = key .. '\n'
  if value and #value <= carried then entry = key .. ' ' .. #value .. '\n' .. value end
  told_bytes = told_bytes + #entry
  if told_bytes <= told_most then table.insert(told, entry) end
end

local function delete_range(low, high)
  order_index()
  for _, member in ipairs(redis.call('ZRANGEBYLEX', index, low, high)) do
    redis.call('UNLINK', value_prefix .. member)
    if is_key(member) then publish(member) end
  end
  redis.call('ZREMRANGEBYLEX', index, low, high)
end

local function get(key, max_bytes)
  local size = stored_size(key)
  if size == nil then return {} end
  if size > max_bytes then return {size} end
  return {redis.call('GET', value_prefix .. key)}
end

-- ScanTaker's rules (backend.py), kept here so that nothing over them leaves the server.
local function scan(prefix, low, high, count, entry_bytes, room)
  order_index()
  local found, entries, looked = {0}, 0, 0
  while looked < count + junk_looked do
    local wanted = count - entries + 1
    local batch = redis.call('ZRANGEBYLEX', index, low, high, 'LIMIT', 0, wanted)
    for _, member in ipairs(batch) do
      looked = looked + 1
      low = '(' .. member
      local size = nil
      -- A member outside the prefix is one still out of order (above): passed over.
      if string.sub(member, 1, #prefix) == prefix then
        size = is_key(member) and value_size(member)
        if not size then redis.call('ZREM', index, member) end
      end
      if size then
        if entries >= count then
          found[1] = 1
          return found
        end
        entries = entries + 1
        if size > entry_bytes then
          table.insert(found, member)
          table.insert(found, size)
        elseif size > room then
          found[1] = 1
          return found
        else
          table.insert(found, member)
          table.insert(found, redis.call('GET', value_prefix .. member))
          room = room - size
        end
      end
    end
    if #batch < wanted then return found end
  end
  found[1] = 1  -- passed over as many members as one scan may: the next goes on from here
  return found
end

local held, answer = true, {0}
i = 6
while i <= #ARGV do
  local op, key = ARGV[i], ARGV[i + 1]
  if op == 'eq' then
    local want = ARGV[i + 2]
    held = held and stored_size(key) == #want and redis.call('GET', value_prefix .. key) == want
  elseif op == 'absent' then
    held = held and stored_size(key) == nil
  elseif op == 'get' then
    table.insert(answer, get(key, tonumber(ARGV[i + 2])))
  elseif op == 'scan' then
    local n = {tonumber(ARGV[i + 4]), tonumber(ARGV[i + 5]), tonumber(ARGV[i + 6])}
    table.insert(answer, scan(key, ARGV[i + 2], ARGV[i + 3], n[1], n[2], n[3]))
  elseif held and op == 'put' then
    redis.call('SET', value_prefix .. key, ARGV[i + 2])
    redis.call('ZADD', index, 0, key)
    publish(key, ARGV[i + 2])
  elseif held and op == 'del' then
    if redis.call('UNLINK', value_prefix .. key) + redis.call('ZREM', index, key) > 0 then
      publish(key)
    end
  elseif held and op == 'delrange' then
    delete_range(key, ARGV[i + 2])
  end
  i = i + arity[op]
end
if held then answer[1] = 1 end
if told_bytes > told_most then
  redis.call('PUBLISH', channel, '*')
elseif #told > 0 then
  redis.call('PUBLISH', channel, table.concat(told))
end
return answer
"""
