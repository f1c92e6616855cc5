-- nginx-rl: check (and commit) every rl_limit line of one request, atomically.
--
-- The same state machines as rl-core/src/limit/*.rs, over integer
-- microseconds, so that for the same sequence of (time, cost) this script
-- makes the same decisions and reports the same remaining / reset /
-- retry-after as rl-core's `Limit::check` / `Limit::acquire`.
--
-- KEYS[i]  the state key of line i.
-- ARGV[1]  "1": check every line, commit all iff all admit; else check only
--          (never writes).
-- ARGV[2]  now in microseconds; "" or "0" = Redis TIME.
-- ARGV[3 + 5*(i-1) ...]  line i: algorithm, count, period_us, burst, cost.
--
-- Returns {all_admitted, now_ms, then per line: admitted, remaining,
-- reset_us, retry_after_us (-1 = none)}, all integers.
--
-- State: for fixed / sliding / token_bucket / leaky_bucket / gcra a string
-- of rl-core's u64 state words, space-separated (missing key = zeroes); for
-- sliding_log a LIST of the admission timestamps, newest first. Every write
-- sets a TTL of the key's reset time + 1000 ms: by then the state reads as
-- fresh, so expiry never changes a decision. A rejected request, or mode
-- "0", writes nothing.
--
-- Exactness. Lua 5.1 numbers are doubles, exact for integers up to 2^53.
-- With E = 2^52 (now <= E is true until the year 2112), results are exact
-- (identical to rl-core) when count, period_us and burst are integers in
-- [1, 2^53), cost is an integer >= 0, now <= E, and:
--   fixed, sliding_log         W = ceil(burst*period_us/count) <= E
--   sliding                    W <= E/2
--   token_bucket, leaky_bucket burst*period_us <= E
--   gcra                       burst*ceil(period_us/count) <= E
-- (then every intermediate value stays <= 2^53; the few products that can
-- exceed it, e.g. sliding's prev*(W-e), are computed exactly by muldiv).
-- A line outside these ranges, or with malformed arguments, is rejected
-- (fail closed: admitted 0, retry -1), so the script never over-admits;
-- rl_core::redis::exact() tells which limits are in range.

if redis.replicate_commands then
  -- Redis 3.2-4.x: allow writes after TIME (effects replication; later
  -- versions always do this).
  pcall(redis.replicate_commands)
end

local floor, ceil, min, max = math.floor, math.ceil, math.min, math.max
local TWO53 = 9007199254740992
local E = 4503599627370496
local MARGIN_MS = 1000

-- Integers as redis.call arguments: tostring() would print 14 digits.
local function int(x)
  return string.format('%.0f', x)
end

-- An integer argument in [lo, 2^53), or nil.
local function arg_int(s, lo)
  local x = tonumber(s)
  if x and x == floor(x) and x >= lo and x < TWO53 then
    return x
  end
  return nil
end

-- floor(a*b/d) and (a*b mod d), for integers 0 <= a, b < 2^53 and
-- 1 <= d < 2^53: the remainder is always exact, the quotient when < 2^53.
local function muldiv(a, b, d)
  local p = a * b
  if p < TWO53 then
    local q = floor(p / d)
    return q, p - q * d
  end
  -- a*b = aq*b*d + ar*b; then ar*b = qq*d + r by the bits of b, high first.
  local aq = floor(a / d)
  local ar = a - aq * d
  local bits, n, rest = {}, 0, b
  while rest > 0 do
    local bit = rest % 2
    n = n + 1
    bits[n] = bit
    rest = (rest - bit) / 2
  end
  local qq, r = 0, 0
  for i = n, 1, -1 do
    qq = qq + qq
    if r >= d - r then
      r, qq = r - (d - r), qq + 1
    else
      r = r + r
    end
    if bits[i] == 1 then
      if r >= d - ar then
        r, qq = r - (d - ar), qq + 1
      else
        r = r + ar
      end
    end
  end
  return aq * b + qq, r
end

-- ceil(a*b/d), exact when < 2^53.
local function muldiv_ceil(a, b, d)
  local q, r = muldiv(a, b, d)
  if r > 0 then
    return q + 1
  end
  return q
end

-- W = ceil(burst*period/count), exact when < 2^53.
local function window(g)
  return muldiv_ceil(g.burst, g.period, g.count)
end

-- PEXPIRE value for a key whose state is fresh again in reset_us.
local function ttl_ms(reset_us)
  return int(ceil(reset_us / 1000) + MARGIN_MS)
end

-- A state word as stored (written by this script), sanitized.
local function word(s)
  local x = tonumber(s)
  if x == nil or x ~= x or x < 0 then
    return 0
  end
  return floor(min(x, TWO53))
end

-- The first n state words of a string key; missing key or words = 0.
local function read_words(key, n)
  local w, i = {}, 0
  local v = redis.pcall('GET', key)
  if type(v) == 'string' then
    for s in string.gmatch(v, '%S+') do
      if i == n then
        break
      end
      i = i + 1
      w[i] = word(s)
    end
  end
  for j = i + 1, n do
    w[j] = 0
  end
  return w
end

local function write_words(key, w, reset_us)
  local parts = {}
  for i = 1, #w do
    parts[i] = int(w[i])
  end
  redis.call('SET', key, table.concat(parts, ' '), 'PX', ttl_ms(reset_us))
end

local function admit(remaining, reset, commit)
  return { admitted = true, remaining = remaining, reset = reset, commit = commit }
end

local function reject(remaining, reset, retry)
  return { admitted = false, remaining = remaining, reset = reset, retry = retry }
end

-- Each algorithm: setup(g) fills derived constants into g (count, period,
-- burst) and returns false when outside the exact range; check(key, g, now,
-- cost) returns the outcome and, when admitted, commit(reset_us).
local algorithms = {}

-- fixed: state {k + 1, used}; windows [k*W, (k+1)*W).
algorithms.fixed = {
  setup = function(g)
    g.W = window(g)
    return g.W <= E
  end,
  check = function(key, g, now, cost)
    local W, B = g.W, g.burst
    local s = read_words(key, 2)
    local k, used = floor(now / W), 0
    if s[1] >= 1 and s[1] - 1 >= k then
      k, used = s[1] - 1, min(s[2], B)
    end
    local to_end = max(0, (k + 1) * W - now)
    local free = B - used
    if cost <= free then
      local reset = to_end
      if used + cost == 0 then
        reset = 0
      end
      return admit(free - cost, reset, function(r)
        write_words(key, { k + 1, used + cost }, r)
      end)
    end
    local reset = to_end
    if used == 0 then
      reset = 0
    end
    return reject(free, reset, cost <= B and to_end or nil)
  end,
}

-- sliding: state {k + 1, curr, prev}; admitted iff
-- prev*(W-e) + (curr+cost)*W <= B*W, i.e. curr + cost + ceil(prev*(W-e)/W) <= B.
algorithms.sliding = {
  setup = function(g)
    g.W = window(g)
    return g.W <= E / 2
  end,
  check = function(key, g, now, cost)
    local W, B = g.W, g.burst
    local s = read_words(key, 3)
    local k = floor(now / W)
    local curr, prev = 0, 0
    if s[1] >= 1 then
      local sk = s[1] - 1
      if sk >= k then
        k, curr, prev = sk, s[2], s[3]
      elseif sk + 1 == k then
        prev = s[2]
      end
    end
    curr, prev = min(curr, B), min(prev, B)
    local lead = k * W - now -- start - now: until(off) = max(0, lead + off)
    local elapsed = max(0, -lead)
    -- ceil of the previous window's weighted count
    local pw = muldiv_ceil(prev, max(0, W - elapsed), W)
    local function reset(c)
      if c == 0 and prev == 0 then
        return 0
      elseif c == 0 then
        return max(0, lead + W)
      end
      return max(0, lead + 2 * W)
    end
    if curr + cost + pw <= B then
      return admit(B - curr - cost - pw, reset(curr + cost), function(r)
        write_words(key, { k + 1, curr + cost, prev }, r)
      end)
    end
    local retry = nil
    if cost <= B then
      -- smallest offset e < W into a window whose previous count is pc
      -- with pc*(W-e) <= room*W; nil if none.
      local function first_fit(pc, room)
        local slack = W
        if pc > 0 and room < pc then
          slack = muldiv(room, W, pc)
        end
        if slack > 0 then
          return W - slack
        end
        return nil
      end
      local here = nil
      if curr + cost <= B then
        here = first_fit(prev, B - curr - cost)
      end
      local offset = here
      if offset == nil then
        local nxt = first_fit(curr, B - cost)
        if nxt then
          offset = W + nxt
        else
          offset = 2 * W
        end
      end
      retry = max(1, lead + offset)
    end
    return reject(max(0, B - curr - pw), reset(curr), retry)
  end,
}

-- sliding_log: a LIST of timestamps, newest first; an entry t counts
-- during [t, t+W).
algorithms.sliding_log = {
  setup = function(g)
    g.W = window(g)
    return g.burst <= 65536 and g.W <= E
  end,
  check = function(key, g, now, cost)
    local W, B = g.W, g.burst
    local n = redis.pcall('LLEN', key)
    local wrongtype = type(n) ~= 'number'
    if wrongtype then
      n = 0
    end
    n = min(n, B)
    local cache = {}
    local function at(i)
      local t = cache[i]
      if t == nil then
        t = word(redis.call('LINDEX', key, int(i)))
        cache[i] = t
      end
      return t
    end
    -- live = the leading (newest) entries not yet expired
    local lo, hi = 0, n
    while lo < hi do
      local mid = floor((lo + hi) / 2)
      if at(mid) + W <= now then
        hi = mid
      else
        lo = mid + 1
      end
    end
    local live = lo
    local newest = nil
    if n > 0 then
      newest = at(0)
    end
    local free = B - live
    if cost <= free then
      local stamp = now
      if newest then
        stamp = max(newest, now)
      end
      local last = newest
      if cost > 0 then
        last = stamp
      end
      local reset = 0
      if live + cost > 0 then
        reset = max(0, last + W - now)
      end
      return admit(free - cost, reset, function(r)
        if wrongtype then
          redis.call('DEL', key)
        end
        local s, left = int(stamp), cost
        while left > 0 do
          local chunk = {}
          for i = 1, min(left, 512) do
            chunk[i] = s
          end
          left = left - #chunk
          redis.call('LPUSH', key, unpack(chunk))
        end
        redis.call('LTRIM', key, 0, int(live + cost - 1))
        redis.call('PEXPIRE', key, ttl_ms(r))
      end)
    end
    local reset = 0
    if live > 0 then
      reset = max(0, newest + W - now)
    end
    local retry = nil
    if cost <= B then
      -- until the oldest live + cost - B live entries have expired
      retry = max(1, at(B - cost) + W - now)
    end
    return reject(free, reset, retry)
  end,
}

-- token_bucket / leaky_bucket: state {used, last}, amounts scaled by the
-- period (one request = period units, capacity burst*period).
local bucket = {
  setup = function(g)
    g.cap = g.burst * g.period
    return g.cap <= E
  end,
  check = function(key, g, now, cost)
    local c, p, B, cap = g.count, g.period, g.burst, g.cap
    local s = read_words(key, 2)
    local used, last = min(s[1], cap), s[2]
    if now > last then
      local refill = (now - last) * c -- inexact only when > 2^53 > used
      if refill >= used then
        used = 0
      else
        used = used - refill
      end
    end
    local at, lag = max(now, last), max(0, last - now)
    local function drain(amount)
      if amount == 0 then
        return 0
      end
      return lag + ceil(amount / c)
    end
    if cost <= B and cost * p <= cap - used then
      local after = used + cost * p
      return admit(floor((cap - after) / p), drain(after), function(r)
        write_words(key, { after, at }, r)
      end)
    end
    local retry = nil
    if cost <= B then
      retry = drain(used - (B - cost) * p)
    end
    return reject(floor((cap - used) / p), drain(used), retry)
  end,
}
algorithms.token_bucket = bucket
algorithms.leaky_bucket = bucket

-- gcra: state {TAT}; T = ceil(period/count); admitted iff
-- max(TAT, now) + cost*T - now <= B*T.
algorithms.gcra = {
  setup = function(g)
    g.T = ceil(g.period / g.count)
    g.BT = g.burst * g.T
    return g.BT <= E
  end,
  check = function(key, g, now, cost)
    local T, B, BT = g.T, g.burst, g.BT
    local s = read_words(key, 1)
    local backlog = max(0, s[1] - now)
    if cost <= B and backlog <= (B - cost) * T then
      local charged = backlog + cost * T
      return admit(floor((BT - charged) / T), charged, function(r)
        write_words(key, { now + charged }, r)
      end)
    end
    local retry = nil
    if cost <= B then
      retry = backlog - (B - cost) * T
    end
    return reject(floor(max(0, BT - backlog) / T), backlog, retry)
  end,
}

-- The clock.
local now = tonumber(ARGV[2])
if now and now >= 1 then
  now = floor(now)
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- Line i's outcome; fail closed on bad arguments or out of the exact range.
local function line(i)
  local base = 3 + 5 * (i - 1)
  local alg = algorithms[ARGV[base]]
  local g = {
    count = arg_int(ARGV[base + 1], 1),
    period = arg_int(ARGV[base + 2], 1),
    burst = arg_int(ARGV[base + 3], 1),
  }
  local cost = tonumber(ARGV[base + 4])
  if not (alg and g.count and g.period and g.burst and cost and cost >= 0
      and cost == floor(cost) and now <= E and alg.setup(g)) then
    return reject(0, 0, nil)
  end
  local o = alg.check(KEYS[i], g, now, cost)
  if cost == 0 then
    -- charges nothing: passes even over the limit, and writes nothing
    o.admitted, o.retry, o.commit = true, nil, nil
  end
  return o
end

local outcomes, all = {}, true
for i = 1, #KEYS do
  outcomes[i] = line(i)
  all = all and outcomes[i].admitted
end

if all and ARGV[1] == '1' then
  for i = 1, #KEYS do
    local o = outcomes[i]
    if o.commit then
      o.commit(o.reset)
    end
  end
end

local reply = { all and 1 or 0, floor(now / 1000) }
for i = 1, #KEYS do
  local o = outcomes[i]
  local n = #reply
  reply[n + 1] = o.admitted and 1 or 0
  reply[n + 2] = o.remaining
  reply[n + 3] = o.reset
  reply[n + 4] = o.retry or -1
end
return reply
