-- nginx-rl: check (and commit) every rl_limit line of one or more requests,
-- each request atomically and all of them in one call.
--
-- The same state machines as rl-core/src/limit/*.rs, over integer
-- microseconds, so that for the same sequence of (time, cost) this script
-- makes the same decisions and reports the same remaining / reset /
-- retry-after as rl-core's `Limit::check` / `Limit::acquire`.
--
-- ARGV[1]  "1": check every line of a request, commit all of them iff all
--          admit; else check only (never writes).
-- ARGV[2]  now in microseconds; "" or "0" = Redis TIME.
-- Then per request, in order: its lines, each one argument
-- "algorithm count period_us burst cost" (the same string for every
-- request with the same limit and cost, so parsed once per call); a
-- request of other than one line is preceded by its number of lines.
-- KEYS     the state key of every line, in the same order.
--
-- Requests are evaluated one after another at the same `now`, as if they
-- arrived in that order in the same microsecond: a request sees the
-- writes of the requests before it.
--
-- Returns {now_ms, then per line: remaining, reset_us, and -2 if admitted,
-- else the retry-after in us or -1 (never)}, all integers. A request is
-- admitted (and committed) iff all its lines are.
--
-- State: for fixed / sliding / token_bucket / leaky_bucket / gcra a string
-- of rl-core's u64 state words, space-separated (missing key = zeroes); for
-- sliding_log a LIST of the admission timestamps, newest first. Every write
-- sets a TTL of the key's reset time + 1000 ms: by then the state reads as
-- fresh, so expiry never changes a decision. A rejected request, or mode
-- "0", writes nothing. A key of the wrong type reads as fresh.
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
--
-- Cost. One call serves a whole batch of requests (nginx sends those that
-- arrived in one event-loop iteration), so the call's own cost (EVALSHA,
-- TIME, its helper functions and tables) is paid once per batch. Per line
-- the script dispatches on the algorithm and runs straight-line code
-- (math.min / max / floor / ceil are inlined as comparisons and
-- `x - x % 1`, which give the same results on the finite values they see);
-- each distinct line string is parsed once per call; a state's words are
-- parsed with one pattern (plain digits as written here, else the general
-- tokenizer), and a key the call already wrote is read back as numbers.
-- Only the rare paths (sliding_log, several lines in one request) build
-- closures or tables per line. Number <-> string conversions dominate what
-- is left: digit strings are converted by arithmetic, and integers are
-- written with %d, in halves below 10^8 (a C long may be 32-bit), as %.0f
-- costs several times more. Redis calls: TIME (unless now is given) and
-- MGET of the distinct keys once, then per written key one SET ... PX
-- (sliding_log: LLEN, LINDEX, LPUSH, LTRIM, PEXPIRE per line).

if redis.replicate_commands and not redis.REDIS_VERSION_NUM then
  -- Redis 3.2-4.x: allow writes after TIME (effects replication; later
  -- versions always do this, and from 7.0, which has REDIS_VERSION_NUM,
  -- the call is a no-op).
  pcall(redis.replicate_commands)
end

local floor = math.floor
local TWO53 = 9007199254740992
local E = 4503599627370496

-- The clock.
local now, ms = ARGV[2], nil
if now == '' then
  now = nil
else
  now = tonumber(now)
end
if now and now >= 1 then
  now = floor(now)
  ms = floor(now / 1000)
else
  -- TIME replies two integer strings: arithmetic converts them.
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
  ms = now / 1000
  ms = ms - ms % 1
end

local commit = ARGV[1] == '1'
local nargs = #ARGV
-- The reply so far, and its length.
local reply, nreply = { ms }, 1
-- The string states this call has read, by key (a missing key, or one of
-- another type, is false): a key that several requests of the call use is
-- read once and written once, at the end (with the last write's value and
-- TTL, as if each request had written it). ttls[key]: the TTL of a pending
-- write.
local held, ttls = {}, {}
-- A state this call wrote is kept as numbers until the end: nk[key] its
-- algorithm, n1 / n2 / n3 its words (held[key] is then stale).
local nk, n1, n2, n3 = {}, {}, {}, {}

-- An integer word as digits (%d in halves below 10^8: a C long may be
-- 32-bit, and %.0f costs several times more).
local function word(x)
  if x < 100000000 then
    return string.format('%d', x)
  end
  local h = x / 100000000
  h = h - h % 1
  if h < 100000000 then
    return string.format('%d%08d', h, x - h * 100000000)
  end
  return string.format('%.0f', x)
end

-- The string of a state kept as numbers.
local function encode(key)
  local a = nk[key]
  if a == 'gcra' then
    return word(n1[key])
  elseif a == 'sliding' then
    return word(n1[key]) .. ' ' .. word(n2[key]) .. ' ' .. word(n3[key])
  end
  return word(n1[key]) .. ' ' .. word(n2[key])
end

-- A key's state as a string (GET, once per call), for a line whose
-- algorithm did not write it as numbers in this call.
local function str(key)
  local v = held[key]
  if nk[key] then
    -- (another algorithm's numbers: only a key that changed algorithm)
    v = encode(key)
    held[key], nk[key] = v, nil
  elseif v == nil then
    v = redis.pcall('GET', key)
    if type(v) ~= 'string' then v = false end
    held[key] = v
  end
  return v
end

-- floor(a*b/d) and (a*b mod d), exactly, for integers 0 <= a, b < 2^53 and
-- 1 <= d < 2^53 (the remainder always, the quotient when < 2^53): plain
-- doubles while a*b < 2^53, else long division by the bits of b.
local function muldiv(a, b, d)
  local p = a * b
  if p < TWO53 then
    local q = p / d
    q = q - q % 1
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

-- Plain digits, as this script writes a state of 1, 2 or 3 words.
local PLAIN = { '^(%d+)$', '^(%d+) (%d+)$', '^(%d+) (%d+) (%d+)$' }

-- A word of a state written by someone else: >= 0, floored, at most 2^53;
-- anything else reads as 0.
local function clamp(x)
  if x and x >= 0 then
    if TWO53 < x then x = TWO53 end
    return x - x % 1
  end
  return 0
end

-- The state words of `key` for a line of algorithm `alg`, whose state has
-- `n` words (a missing key, or missing words, read as 0).
local function state(key, alg, n)
  if nk[key] == alg then
    return n1[key], n2[key], n3[key]
  end
  local v = str(key)
  if not v then
    return 0, 0, 0
  end
  local w1, w2, w3 = string.match(v, PLAIN[n])
  if w1 then
    w1, w2, w3 = w1 + 0, (w2 or 0) + 0, (w3 or 0) + 0
    if TWO53 < w1 then w1 = TWO53 end
    if TWO53 < w2 then w2 = TWO53 end
    if TWO53 < w3 then w3 = TWO53 end
    return w1, w2, w3
  end
  w1, w2, w3 = string.match(v, '^%s*(%S*)%s*(%S*)%s*(%S*)')
  return clamp(tonumber(w1)), clamp(tonumber(w2)), clamp(tonumber(w3))
end

-- Read every distinct key with MGET, 256 at a time (one call instead of a
-- GET each; MGET answers nil for a key of another type, which GET reads as
-- fresh too).
do
  local nkeys, list, n = #KEYS, {}, 0
  for i = 1, nkeys + 1 do
    local key = KEYS[i]
    if key and held[key] == nil then
      held[key] = false
      n = n + 1
      list[n] = key
    end
    if n == 256 or (i > nkeys and n > 0) then
      local got = redis.call('MGET', unpack(list, 1, n))
      for j = 1, n do
        held[list[j]] = got[j] or false
      end
      n = 0
    end
  end
end
-- The lines' limits by their ARGV string (false if malformed).
local specs = {}
-- The next ARGV and KEYS to read.
local argi, k = 3, 0

while argi <= nargs do
  -- One request: one line, or its number of lines then its lines.
  local nlines = tonumber(ARGV[argi])
  if nlines then
    if nlines < 0 or nlines % 1 ~= 0 then
      return redis.error_reply('rl: malformed arguments')
    end
    argi = argi + 1
  else
    nlines = 1
  end
  -- reply[at ...]: per line 3 values.
  local at = nreply + 1
  nreply = nreply + 3 * nlines
  -- Several lines: all admitted so far, and the pending writes as (key,
  -- what, reset_us, algorithm, v1, v2, v3) tuples (see `val` below).
  local all, pending, npending = 1, nil, 0

  for i = 1, nlines do
    -- The line: "algorithm count period_us burst cost" (count, period_us,
    -- burst integers in [1, 2^53), cost an integer >= 0), parsed once per
    -- call.
    local spec = ARGV[argi]
    argi = argi + 1
    local lim = specs[spec]
    if lim == nil and spec then
      lim = false
      local a, w1, w2, w3, w4 = string.match(spec, '^(%S+) (%S+) (%S+) (%S+) (%S+)$')
      local c, p, b, x = tonumber(w1), tonumber(w2), tonumber(w3), tonumber(w4)
      if c and p and b and x
          and c % 1 == 0 and c >= 1 and c < TWO53
          and p % 1 == 0 and p >= 1 and p < TWO53
          and b % 1 == 0 and b >= 1 and b < TWO53
          and x % 1 == 0 and x >= 0 and x < TWO53 then
        lim = { a, c, p, b, x }
      end
      specs[spec] = lim
    end
    local alg, c, p, b, cost
    if lim then
      alg, c, p, b, cost = lim[1], lim[2], lim[3], lim[4], lim[5]
    end
    k = k + 1
    local key = KEYS[k]
    -- The line's outcome; `val` says what to write if admitted and
    -- committing: true for the words v1, v2, v3 (SET at the end of the
    -- call), or for sliding_log a function that pushes the entries (the TTL
    -- is set by the caller).
    local ok, adm, rem, rst, rty, val, v1, v2, v3 = false, false, 0, 0, -1, nil, 0, 0, 0

    if key and lim and now <= E then

      if alg == 'gcra' then
        -- state {TAT}; T = ceil(period/count); admitted iff
        -- max(TAT, now) + cost*T - now <= B*T.
        local T = p / c
        local Ti = T - T % 1
        if Ti < T then Ti = Ti + 1 end
        T = Ti
        local BT = b * T
        if BT <= E then
          ok = true
          local s = state(key, alg, 1)
          local backlog = s - now
          if not (0 < backlog) then backlog = 0 end
          if cost <= b and backlog <= (b - cost) * T then
            local charged = backlog + cost * T
            local x = (BT - charged) / T
            adm, rem, rst = true, x - x % 1, charged
            if commit then
              val, v1 = true, now + charged
            end
          else
            if cost <= b then
              rty = backlog - (b - cost) * T
            end
            local x = BT - backlog
            if not (0 < x) then x = 0 end
            x = x / T
            rem, rst = x - x % 1, backlog
          end
        end

      elseif alg == 'fixed' or alg == 'sliding' or alg == 'sliding_log' then
        -- W = ceil(burst*period/count)
        local W, r = muldiv(b, p, c)
        if r > 0 then W = W + 1 end

        if alg == 'fixed' then
          -- state {k + 1, used}; windows [k*W, (k+1)*W).
          if W <= E then
            ok = true
            local s1, s2 = state(key, alg, 2)
            local k = now / W
            k = k - k % 1
            local used = 0
            if s1 >= 1 and s1 - 1 >= k then
              k, used = s1 - 1, s2
              if b < used then used = b end
            end
            local to_end = (k + 1) * W - now
            if not (0 < to_end) then to_end = 0 end
            local free = b - used
            if cost <= free then
              adm, rem, rst = true, free - cost, to_end
              if used + cost == 0 then rst = 0 end
              if commit then
                val, v1, v2 = true, k + 1, used + cost
              end
            else
              rem, rst = free, to_end
              if used == 0 then rst = 0 end
              if cost <= b then rty = to_end end
            end
          end

        elseif alg == 'sliding' then
          -- state {k + 1, curr, prev}; admitted iff
          -- prev*(W-e) + (curr+cost)*W <= B*W, i.e.
          -- curr + cost + ceil(prev*(W-e)/W) <= B.
          if W <= E / 2 then
            ok = true
            local s1, s2, s3 = state(key, alg, 3)
            local k = now / W
            k = k - k % 1
            local curr, prev = 0, 0
            if s1 >= 1 then
              local sk = s1 - 1
              if sk >= k then
                k, curr, prev = sk, s2, s3
              elseif sk + 1 == k then
                prev = s2
              end
            end
            if b < curr then curr = b end
            if b < prev then prev = b end
            local lead = k * W - now -- start - now: until(off) = max(0, lead + off)
            local span = -lead -- W - max(0, elapsed), at least 0
            if not (0 < span) then span = 0 end
            span = W - span
            if not (0 < span) then span = 0 end
            -- pw: ceil of the previous window's weighted count
            local pw, r = muldiv(prev, span, W)
            if r > 0 then pw = pw + 1 end
            local cc = curr
            if curr + cost + pw <= b then
              adm, rem = true, b - curr - cost - pw
              cc = curr + cost
              if commit then
                val, v1, v2, v3 = true, k + 1, cc, prev
              end
            else
              if cost <= b then
                -- first_fit(pc, room): the smallest offset e < W into a window
                -- whose previous count is pc with pc*(W-e) <= room*W; none if
                -- slack = 0.
                local offset
                if curr + cost <= b then
                  local room, slack = b - curr - cost, W
                  if prev > 0 and room < prev then
                    slack = muldiv(room, W, prev)
                  end
                  if slack > 0 then offset = W - slack end
                end
                if offset == nil then
                  local room, slack = b - cost, W
                  if curr > 0 and room < curr then
                    slack = muldiv(room, W, curr)
                  end
                  if slack > 0 then
                    offset = W + (W - slack)
                  else
                    offset = 2 * W
                  end
                end
                rty = lead + offset
                if not (1 < rty) then rty = 1 end
              end
              rem = b - curr - pw
              if not (0 < rem) then rem = 0 end
            end
            -- reset(cc)
            if cc == 0 and prev == 0 then
              rst = 0
            elseif cc == 0 then
              rst = lead + W
              if not (0 < rst) then rst = 0 end
            else
              rst = lead + 2 * W
              if not (0 < rst) then rst = 0 end
            end
          end

        elseif b <= 65536 and W <= E then
          -- sliding_log: a LIST of timestamps, newest first; an entry t
          -- counts during [t, t+W).
          ok = true
          local B, fmt = b, string.format
          if held[key] ~= nil or nk[key] then
            -- (only if a key changed algorithm: keys name theirs)
            if ttls[key] then
              redis.call('SET', key, str(key), 'PX', string.format('%.0f', ttls[key]))
              ttls[key] = nil
            end
            held[key] = nil
          end
          local n = redis.pcall('LLEN', key)
          local wrongtype = type(n) ~= 'number'
          if wrongtype then
            n = 0
          end
          if B < n then n = B end
          local cache = {}
          local function at(j)
            local t = cache[j]
            if t == nil then
              t = tonumber(redis.call('LINDEX', key, fmt('%.0f', j)))
              if t and t >= 0 then
                if TWO53 < t then t = TWO53 end
                t = floor(t)
              else
                t = 0
              end
              cache[j] = t
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
              stamp = math.max(newest, now)
            end
            local last = newest
            if cost > 0 then
              last = stamp
            end
            adm, rem = true, free - cost
            if live + cost > 0 then
              rst = math.max(0, last + W - now)
            end
            if commit then
              val = function()
                if wrongtype then
                  redis.call('DEL', key)
                end
                local s, left = fmt('%.0f', stamp), cost
                while left > 0 do
                  local chunk = {}
                  for j = 1, math.min(left, 512) do
                    chunk[j] = s
                  end
                  left = left - #chunk
                  redis.call('LPUSH', key, unpack(chunk))
                end
                redis.call('LTRIM', key, 0, fmt('%.0f', live + cost - 1))
              end
            end
          else
            rem = free
            if live > 0 then
              rst = math.max(0, newest + W - now)
            end
            if cost <= B then
              -- until the oldest live + cost - B live entries have expired
              rty = math.max(1, at(B - cost) + W - now)
            end
          end
        end

      elseif alg == 'token_bucket' or alg == 'leaky_bucket' then
        -- state {used, last}, amounts scaled by the period (one request =
        -- period units, capacity burst*period).
        local cap = b * p
        if cap <= E then
          ok = true
          local s1, s2 = state(key, alg, 2)
          local used, last = s1, s2
          if cap < used then used = cap end
          if now > last then
            local refill = (now - last) * c -- inexact only when > 2^53 > used
            if refill >= used then
              used = 0
            else
              used = used - refill
            end
          end
          local lag = last - now
          if not (0 < lag) then lag = 0 end
          -- drain(amount) = 0 if amount == 0, else lag + ceil(amount / c)
          local amount
          if cost <= b and cost * p <= cap - used then
            local after = used + cost * p
            local x = (cap - after) / p
            adm, rem, amount = true, x - x % 1, after
            if commit then
              local at = now
              if now < last then at = last end
              val, v1, v2 = true, after, at
            end
          else
            if cost <= b then
              rty = used - (b - cost) * p
              if rty ~= 0 then
                local y = rty / c
                local yc = y - y % 1
                if yc < y then yc = yc + 1 end
                rty = lag + yc
              end
            end
            local x = (cap - used) / p
            rem, amount = x - x % 1, used
          end
          if amount ~= 0 then
            local y = amount / c
            local yc = y - y % 1
            if yc < y then yc = yc + 1 end
            rst = lag + yc
          end
        end
      end

      if ok and cost == 0 then
        -- charges nothing: passes even over the limit, and writes nothing
        adm, rty, val = true, -1, nil
      end
    end

    -- TTL (ms) of a written key: ceil(reset_us / 1000) + 1000.

    local n = at + 3 * i - 3
    if nlines == 1 then
      -- The usual case: write at once (TTL in ms: ceil(reset_us / 1000) + 1000).
      if adm and val then
        local t = rst / 1000
        local tc = t - t % 1
        if tc < t then tc = tc + 1 end
        tc = tc + 1000
        if alg == 'sliding_log' then
          val()
          redis.call('PEXPIRE', key, string.format('%.0f', tc))
        else
          nk[key], n1[key], n2[key], n3[key], ttls[key] = alg, v1, v2, v3, tc
        end
      end
      if adm then
        reply[n], reply[n + 1], reply[n + 2] = rem, rst, -2
      else
        reply[n], reply[n + 1], reply[n + 2] = rem, rst, rty
      end
    elseif adm then
      reply[n], reply[n + 1], reply[n + 2] = rem, rst, -2
      if val then
        pending = pending or {}
        local j = npending
        pending[j + 1], pending[j + 2], pending[j + 3], pending[j + 4] = key, val, rst, alg
        pending[j + 5], pending[j + 6], pending[j + 7] = v1, v2, v3
        npending = j + 7
      end
    else
      reply[n], reply[n + 1], reply[n + 2] = rem, rst, rty
      all = 0
    end
  end

  if all == 1 then
    for j = 1, npending, 7 do
      local key, val = pending[j], pending[j + 1]
      local t = pending[j + 2] / 1000
      local tc = t - t % 1
      if tc < t then tc = tc + 1 end
      tc = tc + 1000
      if type(val) == 'function' then
        val()
        redis.call('PEXPIRE', key, string.format('%.0f', tc))
      else
        nk[key], n1[key], n2[key], n3[key] = pending[j + 3], pending[j + 4], pending[j + 5], pending[j + 6]
        ttls[key] = tc
      end
    end
  end
end

for key, tc in pairs(ttls) do
  if tc < 100000000 then
    tc = string.format('%d', tc)
  else
    tc = string.format('%.0f', tc)
  end
  redis.call('SET', key, str(key), 'PX', tc)
end
return reply
