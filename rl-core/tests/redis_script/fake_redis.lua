-- The fake Redis the tests run the script against (see the doc of
-- FAKE_REDIS in harness.rs), loaded after `struct` (struct_lib.rs).
-- (version: the Redis version it answers as, major only: before 6 it
-- knows no SET ... KEEPTTL)
fake = { now = 0, data = {}, writes = 0, calls = 0, expired = 0, count = {}, version = 7 }

local function live(key)
  local e = fake.data[key]
  if e and e.exp and fake.now >= e.exp then
    fake.data[key] = nil
    fake.expired = fake.expired + 1
    return nil
  end
  return e
end

local function typed(key, kind)
  local e = live(key)
  if e and e.kind ~= kind then
    error({ err = 'WRONGTYPE Operation against a key holding the wrong kind of value' })
  end
  return e
end

local function index(n, i)
  if i < 0 then i = n + i end
  return i
end

local function int_arg(s)
  local x = tonumber(s)
  if x == nil or x ~= math.floor(x) then
    error({ err = 'ERR value is not an integer or out of range' })
  end
  return x
end

local commands = {}

function commands.GET(key)
  local e = typed(key, 'string')
  return e and e.v or false
end

function commands.MGET(...)
  local out = {}
  for i, key in ipairs({ ... }) do
    local e = live(key)
    out[i] = (e and e.kind == 'string' and e.v) or false
  end
  return out
end

-- SET key value PX ms, or SET key value KEEPTTL (the script sets no
-- other form): the key becomes a string, with that expiry, or the one it
-- had (none if it had none, or did not exist).
function commands.SET(key, value, opt, ms, extra)
  assert(extra == nil, 'SET: one option')
  local exp
  if opt == 'PX' then
    ms = int_arg(ms)
    if ms <= 0 then error({ err = 'ERR invalid expire time in set' }) end
    exp = fake.now + ms * 1000
  else
    assert(opt == 'KEEPTTL' and ms == nil, 'SET: PX ms or KEEPTTL')
    if fake.version < 6 then error({ err = 'ERR syntax error' }) end
    local e = live(key)
    exp = e and e.exp
  end
  fake.data[key] = { kind = 'string', v = value, exp = exp }
  fake.writes = fake.writes + 1
  return { ok = 'OK' }
end

-- The script overwrites a whole value of the same length in place (the
-- key keeps its TTL).
function commands.SETRANGE(key, offset, value)
  local e = typed(key, 'string')
  assert(e and offset == '0' and #value == #e.v, 'SETRANGE overwrites a whole value')
  e.v = value
  fake.writes = fake.writes + 1
  return #value
end

function commands.PEXPIRE(key, ms)
  local ms = int_arg(ms)
  fake.writes = fake.writes + 1
  local e = live(key)
  if not e then return 0 end
  e.exp = fake.now + ms * 1000
  return 1
end

function commands.DEL(...)
  local n = 0
  for _, key in ipairs({ ... }) do
    if live(key) then
      fake.data[key] = nil
      n = n + 1
    end
  end
  fake.writes = fake.writes + 1
  return n
end

function commands.TIME()
  local sec = math.floor(fake.now / 1000000)
  return { string.format('%.0f', sec), string.format('%.0f', fake.now - sec * 1000000) }
end

function commands.LPUSH(key, ...)
  local e = typed(key, 'list')
  if not e then
    e = { kind = 'list', v = {} }
    fake.data[key] = e
  end
  for _, x in ipairs({ ... }) do
    table.insert(e.v, 1, x)
  end
  fake.writes = fake.writes + 1
  return #e.v
end

function commands.LTRIM(key, start, stop)
  local e = typed(key, 'list')
  fake.writes = fake.writes + 1
  if not e then return { ok = 'OK' } end
  local n = #e.v
  local a, b = math.max(0, index(n, int_arg(start))), math.min(n - 1, index(n, int_arg(stop)))
  local kept = {}
  for i = a, b do
    kept[#kept + 1] = e.v[i + 1]
  end
  e.v = kept
  if #kept == 0 then fake.data[key] = nil end
  return { ok = 'OK' }
end

function commands.LINDEX(key, i)
  local e = typed(key, 'list')
  if not e then return false end
  local x = e.v[index(#e.v, int_arg(i)) + 1]
  return x or false
end

-- LREM key count value: removes the first `count` entries equal to value
-- from the head (count > 0), from the tail (count < 0), or all (0); a list
-- left empty is deleted.
function commands.LREM(key, count, value)
  local e = typed(key, 'list')
  count = int_arg(count)
  fake.writes = fake.writes + 1
  if not e then return 0 end
  local n, kept, removed = #e.v, {}, 0
  local from, to, step = 1, n, 1
  if count < 0 then from, to, step = n, 1, -1 end
  local limit = math.abs(count)
  for i = from, to, step do
    local x = e.v[i]
    if x == value and (limit == 0 or removed < limit) then
      removed = removed + 1
    else
      kept[#kept + 1] = x
    end
  end
  if step < 0 then
    local r = {}
    for i = #kept, 1, -1 do r[#r + 1] = kept[i] end
    kept = r
  end
  e.v = kept
  if #kept == 0 then fake.data[key] = nil end
  return removed
end

function commands.LLEN(key)
  local e = typed(key, 'list')
  return e and #e.v or 0
end

-- Hashes (rl_conn's keys: a field per worker): e.v maps field to value.
-- HGETALL replies field, value, ... (here sorted by field; Redis' order is
-- its own).
function commands.HGETALL(key)
  local e = typed(key, 'hash')
  local out = {}
  if not e then return out end
  local fields = {}
  for f in pairs(e.v) do fields[#fields + 1] = f end
  table.sort(fields)
  for _, f in ipairs(fields) do
    out[#out + 1] = f
    out[#out + 1] = e.v[f]
  end
  return out
end

-- HSET key field value [field value ...]: the number of fields added (a
-- new key has no expiry; an existing one keeps its own).
function commands.HSET(key, ...)
  local args = { ... }
  local n = select('#', ...)
  if n == 0 or n % 2 ~= 0 then
    error({ err = "ERR wrong number of arguments for 'hset' command" })
  end
  local e = typed(key, 'hash')
  if not e then
    e = { kind = 'hash', v = {} }
    fake.data[key] = e
  end
  local added = 0
  for i = 1, n, 2 do
    if e.v[args[i]] == nil then added = added + 1 end
    e.v[args[i]] = args[i + 1]
  end
  fake.writes = fake.writes + 1
  return added
end

-- HDEL key field [field ...]: the number of fields removed; a hash left
-- empty is deleted.
function commands.HDEL(key, ...)
  local n = select('#', ...)
  if n == 0 then
    error({ err = "ERR wrong number of arguments for 'hdel' command" })
  end
  local e = typed(key, 'hash')
  fake.writes = fake.writes + 1
  if not e then return 0 end
  local removed = 0
  for _, f in ipairs({ ... }) do
    if e.v[f] ~= nil then
      e.v[f] = nil
      removed = removed + 1
    end
  end
  if next(e.v) == nil then fake.data[key] = nil end
  return removed
end

-- PTTL key: -2 if missing, -1 if it has no expiry, else the ms left (cut:
-- the fake's clock is in us).
function commands.PTTL(key)
  local e = live(key)
  if not e then return -2 end
  if not e.exp then return -1 end
  return math.floor((e.exp - fake.now) / 1000)
end

local function call(cmd, ...)
  fake.calls = fake.calls + 1
  fake.count[string.upper(cmd)] = (fake.count[string.upper(cmd)] or 0) + 1
  local f = commands[string.upper(cmd)]
  if not f then error({ err = 'ERR unknown command ' .. cmd }) end
  local args = { ... }
  for i = 1, select('#', ...) do
    local a = args[i]
    if type(a) == 'number' then
      args[i] = string.format('%.17g', a)
    elseif type(a) ~= 'string' then
      error('Lua redis lib command arguments must be strings or integers')
    end
  end
  return f(unpack(args, 1, select('#', ...)))
end

redis = {
  error_reply = function(msg) return { err = msg } end,
  call = function(...)
    local ok, r = pcall(call, ...)
    if not ok then
      if type(r) == 'table' then r = r.err end
      error(r, 0)
    end
    return r
  end,
  pcall = function(...)
    local ok, r = pcall(call, ...)
    if not ok then
      if type(r) ~= 'table' then r = { err = tostring(r) } end
      return r
    end
    return r
  end,
}

-- Test helpers, outside the script's reach.
function fake.expiry(key)
  local e = live(key)
  return e and e.exp or false
end

-- A string state as the script writes it: its words, and the expiry it
-- carries (ms), or nil if it is not one.
local function decode(v)
  if string.byte(v, 1) ~= 0 or (#v - 1) % 8 ~= 0 then return nil end
  local fmt = '<' .. string.rep('d', (#v - 1) / 8)
  local out = { struct.unpack(fmt, v, 2) }
  out[#out] = nil -- the next position
  local x = table.remove(out)
  for i, w in ipairs(out) do out[i] = string.format('%.0f', w) end
  return table.concat(out, ' '), x
end

-- A hash's fields as "field=value", sorted, joined by `sep`.
local function fields(v, sep)
  local out = {}
  for f, x in pairs(v) do out[#out + 1] = f .. '=' .. x end
  table.sort(out)
  return table.concat(out, sep)
end

-- The words of a string state (or the raw value if the script did not
-- write it), a list joined by spaces, or a hash's "field=value" entries
-- joined by commas.
function fake.value(key)
  local e = live(key)
  if not e then return false end
  if e.kind == 'string' then return decode(e.v) or e.v end
  if e.kind == 'hash' then return fields(e.v, ',') end
  return table.concat(e.v, ' ')
end

-- A hash's fields, as a table of field to value (a copy), or false if the
-- key is missing or not a hash.
function fake.hash(key)
  local e = live(key)
  if not (e and e.kind == 'hash') then return false end
  local out = {}
  for f, x in pairs(e.v) do out[f] = x end
  return out
end

-- What PTTL answers for the key (not counted as a call of the script's).
function fake.pttl(key)
  return commands.PTTL(key)
end

-- The expiry (ms) a string state carries, or false.
function fake.stored_expiry(key)
  local e = live(key)
  if not (e and e.kind == 'string') then return false end
  local _, x = decode(e.v)
  return x or false
end

-- A memo as the script stores it: nout, ndone, the reply, then `done`
-- (per line charged: its index in KEYS, v1, v2), as a sequence of numbers;
-- or its raw value if it is not one (the mark "u" of an undone call).
function fake.memo(key)
  local e = live(key)
  if not (e and e.kind == 'string') then return false end
  local v = e.v
  if #v < 16 then return v end
  local nout, nd = struct.unpack('<dd', v)
  if #v ~= 16 + 8 * (nout + nd) then return v end
  local out = {}
  for i = 1, 2 + nout + nd do
    out[i] = (struct.unpack('<d', v, 8 * i - 7))
  end
  return out
end

function fake.kind(key)
  local e = live(key)
  return e and e.kind or false
end

-- Every live key, its kind, value and expiry, sorted (but `except`).
function fake.snapshot(except)
  local keys = {}
  for k, e in pairs(fake.data) do
    if not (e.exp and fake.now >= e.exp) and k ~= except then keys[#keys + 1] = k end
  end
  table.sort(keys)
  local out = {}
  for _, k in ipairs(keys) do
    local e = fake.data[k]
    local v = e.v
    if e.kind == 'list' then
      v = table.concat(v, ',')
    elseif e.kind == 'hash' then
      v = fields(v, ',')
    else
      local w, x = decode(v)
      if w then
        v = w .. '#' .. string.format('%.0f', x)
      elseif string.find(v, '[^\t\n\r -~]') then
        -- (a memo, or other bytes: as hex)
        v = 'hex:' .. string.gsub(v, '.', function(c) return string.format('%02x', string.byte(c)) end)
      end
    end
    out[#out + 1] = k .. '=' .. e.kind .. ':' .. v .. '@' .. tostring(e.exp)
  end
  return table.concat(out, ';')
end

-- Redis forbids scripts to create or read undefined globals.
setmetatable(_G, {
  __newindex = function(_, k) error('Script attempted to create global variable ' .. tostring(k), 2) end,
  __index = function(_, k) error('Script attempted to access nonexistent global variable ' .. tostring(k), 2) end,
})
