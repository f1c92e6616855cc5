-- nginx-rl: check (and commit) every rl_limit line of one or more requests,
-- each request atomically and all of them in one call.
--
-- The same state machines as rl-core/src/limit/*.rs, over integer
-- microseconds, so that for the same sequence of (time, cost) this script
-- makes the same decisions and reports the same remaining / reset /
-- retry-after as rl-core's `Limit::check` / `Limit::acquire`.
--
-- ARGV[1]  "1": check every line of a request, commit all of them iff all
--          admit; "2": the same, the call named by its last key, its memo
--          (see "Applied once" below); else check only (never writes).
-- ARGV[2]  now in microseconds; "" or "0" = Redis TIME.
-- ARGV[3]  the call's deadline, in microseconds of the same clock; "" =
--          none. A call that runs later (now > deadline) checks nothing,
--          writes nothing, and returns {-1, now}: by then its caller no
--          longer waits for it (it answers its requests as failed).
-- Then per request, in order: its lines, each one argument
-- "algorithm count period_us burst cost queue flags" (flags: the sum of 1
-- for a dry-run line, 2 for a varying one, 4 for a charge=after line's
-- check, 8 for a line that reports the wait for one more unit, i.e. 0 to
-- 15; plus 32 and a last field "kept" for a request that must leave kept
-- units of the budget to the classes above its own, rl-core's
-- Limit::acquire_keeping, see `kept_run` below;
-- or "algorithm count period_us burst units 0 16 life": not a line of
-- the request but a lease asked with it, right after the line of its key,
-- see `grant` below; queue 0 but
-- for the buckets and gcra; the same string for every
-- request with the same limit and cost, so parsed once per call); a
-- request of other than one line is preceded by its number of lines; n
-- consecutive requests of one line each with the same string may be sent
-- as "-n" then that string once.
-- KEYS     the state key of every line, in the same order.
--
-- Requests are evaluated one after another at the same `now`, as if they
-- arrived in that order in the same microsecond: a request sees the
-- writes of the requests before it.
--
-- Returns {now (us), then per line: remaining, reset_us, -2 if admitted
-- else the retry-after in us or -1 (never), the delay in us (0: at once),
-- and for a line of flag 8 the wait until one more unit passes at once
-- (rl-core's Limit::next_us of its state after the call's writes; 0 when
-- full, and for a line without the flag); for a lease asked with a
-- request, the units granted, the words to give them back with, the
-- lease's life left and the line's reset after the grant}, all integers.
-- In a call that commits, a line that admits its request but is not
-- charged (the request is rejected, or the line is a charge=after check)
-- reports what its state has left: remaining, reset and wait of a cost of
-- 0. A request is
-- admitted iff all its enforced (not dry-run) lines admit it; then its
-- enforced lines are committed, and its dry-run lines that admit it. A queue=N line (buckets, gcra) admits beyond
-- the burst, delayed, what conforms to the rate within N emission
-- intervals, charged at arrival (rl-core's Limit::with_queue). A
-- charge=after line (flag 4) checks a cost of 1 whatever its cost field,
-- and is never charged here: its cost is charged after the response.
--
-- The charge call (`charge` below: the library's function NAME_charge, or
-- this script with its last line calling `charge`) charges costs known
-- only after the response, in full, beyond the burst if need be (rl-core's
-- Limit::overdraw): the state records the overdraft and the decisions see
-- it until it is repaid.
-- ARGV[1]  now in microseconds; "" or "0" = Redis TIME.
-- Then per line one argument, as above (its queue and flags do not change
--          the charge).
-- KEYS     the state key of every line, in the same order.
-- No deadline: a charge is as good late as early. Returns {now, then per
-- line 1 if charged (a cost of 0 charges nothing), 0 if refused without
-- writing: a malformed line, sliding_log (it cannot hold an overdraft), a
-- line out of the exact range, a cost >= 2^52, or a charge that would take
-- the state beyond 2^52 (the buckets: used*period; gcra: TAT - now), past
-- which the script would no longer be exact}. The key's TTL covers the
-- overdraft's repayment, as a decision's write does.
--
-- Applied once. A call that commits (mode "2"), and a charge given one key
-- more than its lines, name themselves by their last key, the memo key
-- (rl_core::redis::write_memo_key: unique to the call, in its first state
-- key's hash slot), which nginx keeps for every copy of the call it sends.
-- The memo is looked up first, before the deadline: a call that finds one
-- is a copy of one that ran (whose reply was lost on the way), and returns
-- what that one returned, writing nothing; one that finds the mark "u" of
-- an undone call returns as a late call does ({-1, now}), writing nothing.
-- A call that charged something (or granted a lease) leaves its memo for
-- 10 s beyond its deadline (a charge: 10 s): two doubles (the reply's length n, and d),
-- the reply's n integers, then d numbers: per line charged, its index in
-- KEYS and the words v1, v2 its algorithm returned, from which `undo` finds
-- the charge (not a lease granted with a request: an undone call leaves it
-- charged, units nginx never spends). A call that charged nothing leaves none: run again, it is
-- still applied once.
-- The undo call (`undo`: the library's NAME_undo) takes back what a call
-- did, for requests nginx answered without its reply (per `on_error`):
-- KEYS the call's state keys then its memo key; ARGV now ("" = TIME) then
-- one line per key, as the charge call takes them. With a memo: every line
-- charged is refunded (rl-core's Limit::refund) and the memo becomes "u";
-- without one: the call has not run, and "u" (for 70 s, beyond any
-- deadline) makes sure it never will; "u": nothing (undone before).
-- Returns {now, 1 taken back | 0 had not run | 2 undone before}.
--
-- The lease call (the library's NAME_lease; issue #38's fleet mode,
-- rl-core's lease.rs) is in lease.lua, which the library and the lease
-- script append to this body (the EVAL of a decision does without it).
--
-- A varying line (rl-core's Limit::varying: its rate and burst change from
-- request to request) keeps one more state word, its tag: the scale its
-- used amount is counted in as of the last write (W for fixed and sliding,
-- the rate, packed, for the buckets, T for gcra; none for sliding_log). A
-- line whose own tag differs from a non-zero tag first converts the state
-- to its own scale, rounding the used amount up, exactly as rl-core's
-- limit/vary.rs (the buckets' drained at the writer's rate up to now); a
-- write stores its own tag. Its keys are not any static line's. From the
-- reset its last write saw on, before the key expires, a state then reads
-- as fresh under any values, but sliding_log's under a longer window
-- (which still counts older timestamps).
--
-- State: for fixed / sliding / token_bucket / leaky_bucket / gcra a string
-- of a 0 byte, then rl-core's u64 state words and the key's expiry (ms of
-- the Redis clock) as little-endian doubles (missing key = zeroes; a text
-- of digits, as older versions wrote, still reads); for sliding_log a LIST
-- of the admission timestamps, newest first. A key lives at least until its
-- reset time + 1000 ms, when the state reads as fresh, so expiry never
-- changes a decision: a write that needs a later expiry sets that + 1000 ms
-- (SET ... PX), the next writes keep it and overwrite the value in place
-- (SETRANGE, of the same length), so a busy key's TTL is set about once a
-- second (rl_core::redis::expiry_after_write). A sliding_log write sets its
-- TTL to reset + 1000 ms. A rejected request, or mode "0", writes nothing.
-- A key of the wrong type reads as fresh.
--
-- Exactness. Lua 5.1 numbers are doubles, exact for integers up to 2^53.
-- With E = 2^52 (now <= E is true until the year 2112), results are exact
-- (identical to rl-core) when count, period_us and burst are integers in
-- [1, 2^53), cost is an integer >= 0, now <= E, and:
--   fixed, sliding_log         W = ceil(burst*period_us/count) <= E
--   sliding                    W <= E/2
--   token_bucket, leaky_bucket (burst+queue)*period_us <= E
--   gcra                       (burst+queue)*ceil(period_us/count) <= E
-- (then every intermediate value stays <= 2^53; the few products that can
-- exceed it, e.g. sliding's prev*(W-e), are computed exactly by muldiv).
-- A varying line's conversion is exact too when, besides, burst <= E for
-- fixed and sliding, the tag <= E for the buckets, and the converted
-- amount (what the writer's rate leaves of used, times period / the
-- writer's period, for the buckets; (TAT-now)*T/tag for gcra) is <= E; a
-- line whose conversion exceeds E is rejected (fail closed).
-- A line outside these ranges, or with malformed arguments, is rejected
-- (fail closed: admitted 0, retry -1), so the script never over-admits;
-- rl_core::redis::exact() tells which limits are in range.
--
-- Runs as EVAL runs it (the last line), or, all but the last line, as a
-- Redis 7 function library: rl_core::redis::function_library() names it
-- and registers `limit`. Loading a library may not touch globals, hence
-- the library functions bound by the first call; the helpers then live from
-- call to call, and so do the parsed lines (`specs`, a bounded few).
--
-- Cost. One call serves a whole batch of requests (nginx sends those that
-- arrived in one event-loop iteration), so the call's own cost (FCALL or
-- EVALSHA, TIME, MGET, its tables, and for EVALSHA its helper functions) is
-- paid once per batch. In Redis' Lua every table access costs about a
-- hundred machine instructions, and a table or closure built, or a C
-- function called, about a thousand: per line the script does as few of
-- each as it can. Each distinct line string is parsed once per call (or
-- library), with its algorithm's constants (W, T, capacity) and its
-- algorithm's function; per line it calls that function, straight-line
-- code (one Lua call a line: within noise of inlining them, measured in
-- bench/LUA.md, where the library builds the functions once) (math.min / max /
-- floor / ceil are inlined as comparisons and `x - x % 1`, which give the
-- same results on the finite values they see); a state is unpacked and
-- packed by one struct call each. A key that only one line of the call
-- uses is written at once; a key several lines share is kept as numbers and
-- written once, at the end. A request of one line (the usual one) takes a
-- path of its own, without what a request of several lines keeps until all
-- its lines are read; a call of one key keeps its tables, and its reply's,
-- from call to call (bench/README.md, bench/redis_profile.sh: what each of
-- these saves, and what Redis itself costs a call).
-- Redis calls: TIME (unless now is given) and MGET of the distinct keys once
-- per call (GET for a call of one key), then per written key one SETRANGE
-- (or SET ... PX about once a second; sliding_log: LLEN, LINDEX, LPUSH,
-- LTRIM, PEXPIRE per line); a named call GET and (if it charged) SET ... PX
-- of its memo; an undo also LREM (sliding_log).

local TWO53 = 9007199254740992
local E = 4503599627370496
-- math.floor and struct's functions, bound by the first call (a library
-- cannot reach them while Redis loads it).
local floor, pack, unpack_

-- The call's state, set by every call (in a library the helpers below
-- outlive a call). now: us; ms: now in ms, cut; ms_up: now in ms, rounded
-- up (a key's expiry counts from it: from ms, a key could expire up to
-- 999 us short of its reset time + the margin); commit: mode "1".
local now, ms, ms_up, commit
-- Whether the call took or renewed a place in a waiting line (see
-- `concurrent`): its memo is kept.
local placed = false
-- The reply so far, and its length.
local reply, nreply

-- The call's distinct keys: slot[key] = j, names[j] = key, in order of first
-- use; cur[j] the string MGET read (false: missing, or of another type; nil:
-- read it again, after a sliding_log line used the key; cur1 is cur for a
-- call of one key). In a library these tables outlive a call, each call
-- clearing the previous one's entries: in Redis' Lua a table built, grown
-- and collected costs more than a few entries cleared.
local slot, names, cur, cur1, nslots = {}, {}, nil, {}, 0
-- A key that only one line of the call uses is written at once. The others'
-- states are kept as numbers and SET once at the end (with the last write's
-- value and expiry, as if each request had written it): slot j's record is
-- R[7j-6 .. 7j] = the state's shape (its algorithm, with a '+' for a
-- varying line's), w1, w2, w3, w4, expiry, and the expiry the key had
-- before the call (-1 once the shape changed); R[7j] = true marks such a
-- slot before its first write. (One flat table: in Redis' Lua a table per
-- key, or a C function call such as type(), costs about as much as the
-- rest of a line's work.)
local R = {}
-- Whether a key of the call is shared by several lines (then R holds records).
local shared = false

-- Stored form: a 0 byte, then the state's words and the key's expiry (ms of
-- the Redis clock) as little-endian doubles, exact below 2^53 (struct's C
-- code packs and unpacks them several times faster than Lua formats or
-- parses digits).
-- The number of words of each shape of state: the algorithm's, and one
-- more (the scale tag) for a varying line's.
local NW = {
  gcra = 1, fixed = 2, sliding = 3, token_bucket = 2, leaky_bucket = 2,
  ['gcra+'] = 2, ['fixed+'] = 3, ['sliding+'] = 4, ['token_bucket+'] = 3, ['leaky_bucket+'] = 3,
}
-- A state of n words w1.. and expiry x, stored.
local function packed(n, w1, w2, w3, w4, x)
  if n == 1 then
    return pack('<Bdd', 0, w1, x)
  elseif n == 2 then
    return pack('<Bddd', 0, w1, w2, x)
  elseif n == 3 then
    return pack('<Bdddd', 0, w1, w2, w3, x)
  end
  return pack('<Bddddd', 0, w1, w2, w3, w4, x)
end
local function encode(j)
  local o = 7 * j
  return packed(NW[R[o - 6]], R[o - 5], R[o - 4], R[o - 3], R[o - 2], R[o - 1])
end

-- A word of a state written by someone else: >= 0, floored, at most 2^53;
-- anything else (NaN included) reads as 0.
local function clamp(x)
  if x and x >= 0 then
    if TWO53 < x then x = TWO53 end
    return x - x % 1
  end
  return 0
end

-- The state words of slot j for a line whose state has shape `alg` and `n`
-- words (a missing key, or missing words, read as 0; so does a static
-- line's tag, the word after its own). Sets `sx` to the key's expiry as
-- stored with the state (0: unknown).
local sx = 0
local function state(j, alg, n)
  local o = 7 * j
  local a = R[o - 6]
  if a == alg then
    sx = R[o - 1]
    return R[o - 5], R[o - 4], R[o - 3], R[o - 2]
  end
  local v
  if a then
    -- (another algorithm's numbers: only a key that changed algorithm)
    v = encode(j)
  else
    v = cur[j]
    if v == nil then
      v = redis.pcall('GET', names[j])
      if type(v) ~= 'string' then v = false end
      cur[j] = v
    end
  end
  sx = 0
  if not v then
    return 0, 0, 0, 0
  end
  if #v == 9 + 8 * n then
    local m, w1, w2, w3, w4, x
    -- (the shapes of one and two words, checked alone: the checks of the
    -- zero words cost Redis' Lua more than the branch)
    if n == 2 then
      m, w1, w2, x = unpack_('<Bddd', v)
      if m == 0 then
        if 0 < x then sx = x end
        if 0 <= w1 and 0 <= w2 and w1 <= TWO53 and w2 <= TWO53 and w1 % 1 == 0 and w2 % 1 == 0 then
          return w1, w2, 0, 0
        end
        return clamp(w1), clamp(w2), 0, 0
      end
      w3, w4 = 0, 0
    elseif n == 1 then
      m, w1, x = unpack_('<Bdd', v)
      if m == 0 then
        if 0 < x then sx = x end
        if 0 <= w1 and w1 <= TWO53 and w1 % 1 == 0 then
          return w1, 0, 0, 0
        end
        return clamp(w1), 0, 0, 0
      end
      w2, w3, w4 = 0, 0, 0
    elseif n == 3 then
      m, w1, w2, w3, x = unpack_('<Bdddd', v)
      w4 = 0
    else
      m, w1, w2, w3, w4, x = unpack_('<Bddddd', v)
    end
    if m == 0 then
      if 0 < x then sx = x end
      if 0 <= w1 and 0 <= w2 and 0 <= w3 and 0 <= w4 and w1 <= TWO53 and w2 <= TWO53 and w3 <= TWO53
          and w4 <= TWO53 and w1 % 1 == 0 and w2 % 1 == 0 and w3 % 1 == 0 and w4 % 1 == 0 then
        return w1, w2, w3, w4
      end
      return clamp(w1), clamp(w2), clamp(w3), clamp(w4)
    end
  end
  if string.byte(v, 1) == 0 then
    -- another shape's binary state reads as fresh
    return 0, 0, 0, 0
  end
  -- Text: words as digits (as an older version of this script wrote them),
  -- or anything else, token by token (the words of the state's shape only).
  local w1, w2, w3 = string.match(v, '^%s*(%S*)%s*(%S*)%s*(%S*)')
  w1, w2, w3 = clamp(tonumber(w1)), clamp(tonumber(w2)), clamp(tonumber(w3))
  if n < 3 then w3 = 0 end
  if n < 2 then w2 = 0 end
  return w1, w2, w3, 0
end

-- Commits a line `lim` of slot j whose state is back to full in rst us, so
-- that the key must live until ceil(now / 1000) + ceil(rst / 1000) + 1000 ms
-- of the Redis clock. sliding_log: `val`
-- pushes the entries, and the TTL is set. Else the new state v1, v2, v3
-- (then a varying line's tag) of a state read with expiry x0: the expiry is kept while it
-- suffices, else set TTL_SLACK ms beyond the need, so that a busy key's TTL
-- is set about once per TTL_SLACK, and its other writes overwrite the value
-- in place (SETRANGE costs Redis much less than SET ... PX).
local TTL_SLACK = 1000
-- A TTL in ms as PX's argument (%d below 10^8: a C long may be 32-bit).
local function ttl(x)
  if x < 100000000 then
    return string.format('%d', x)
  end
  return string.format('%.0f', x)
end
local function put(j, lim, val, v1, v2, v3, x0, rst)
  local alg = lim[1]
  local t = rst / 1000
  local tc = t - t % 1
  if tc < t then tc = tc + 1 end
  local x = ms_up + tc + 1000
  if alg == 'sliding_log' then
    val()
    redis.call('PEXPIRE', names[j], ttl(x - ms))
    return
  end
  if alg == 'concurrent' then
    -- (its fields' lives are its expiry)
    val()
    return
  end
  if x0 < x then
    x = x + TTL_SLACK
  else
    x = x0
  end
  -- A varying line's tag: the scale it counts its state in, after the
  -- algorithm's words.
  local shape, n, v4 = lim[11], lim[12], 0
  if lim[13] then
    if n == 2 then
      v2 = lim[13]
    elseif n == 3 then
      v3 = lim[13]
    else
      v4 = lim[13]
    end
  end
  local o = 7 * j
  local a = nil
  if shared then a = R[o - 6] end
  if a == nil and not (shared and R[o]) then
    -- The call's only line on this key: written at once.
    local v
    if n == 2 then
      v = pack('<Bddd', 0, v1, v2, x)
    else
      v = packed(n, v1, v2, v3, v4, x)
    end
    if x == x0 then
      redis.call('SETRANGE', names[j], '0', v)
    else
      redis.call('SET', names[j], v, 'PX', ttl(x - ms))
    end
    return
  end
  if a == nil then
    R[o] = x0
  elseif a ~= shape then
    R[o] = -1
  end
  R[o - 6], R[o - 5], R[o - 4], R[o - 3], R[o - 2], R[o - 1] = shape, v1, v2, v3, v4, x
end

-- Writes slot j's record (there must be one) and forgets it: in place when
-- the key keeps its expiry (then it holds this algorithm's state, of the same
-- length), else SET ... PX.
local function flush(j)
  local o = 7 * j
  local x = R[o - 1]
  if x == R[o] then
    redis.call('SETRANGE', names[j], '0', encode(j))
  else
    redis.call('SET', names[j], encode(j), 'PX', ttl(x - ms))
  end
  R[o - 6] = nil
end

-- The buckets' time to drain `amount` at `c` per us after `lag` us: 0 if
-- amount is 0, else lag + ceil(amount / c).
local function drain(amount, c, lag)
  if amount == 0 then
    return 0
  end
  local y = amount / c
  local yc = y - y % 1
  if yc < y then yc = yc + 1 end
  return lag + yc
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

-- A varying bucket line's tag: its rate (count c, period p) packed as
-- rl-core's limit/vary.rs rate_tag packs it. The low two bits say which
-- form: 1, a period of a unit (s, m, h, d): 4 * its index, then 16 *
-- (c - 1); 2, another period below 2^32: 4 * p, then 2^34 * (c - 1) (c - 1
-- below 2^30); 0, any other rate: 4 * p alone. Exact while at most 2^53;
-- a line whose tag is above E fails closed.
local UNITS = { 1000000, 60000000, 3600000000, 86400000000 }
local function rate_tag(c, p)
  for i = 1, 4 do
    if p == UNITS[i] then
      return 16 * (c - 1) + 4 * (i - 1) + 1
    end
  end
  if p < 4294967296 and c - 1 < 1073741824 then
    return 17179869184 * (c - 1) + 4 * p + 2
  end
  return 4 * p
end

-- A varying bucket's used amount s1 at last = s2, written under the rate
-- that tag tg packs, as a line of period p counts it at now (rl-core's
-- limit/vary.rs): drained up to now at the writer's rate, as the writer
-- reads it, then scaled by p / the writer's period, rounded up, with last
-- = max(now, last); a tag of the period alone scales it only, last kept.
-- nil when the amount leaves the exact range.
local function rebucket(s1, s2, tg, p)
  local f = tg % 4
  local x = (tg - f) / 4
  local tp, tc = x, false
  if f == 1 then
    local i = x % 4
    tp, tc = UNITS[i + 1], (x - i) / 4 + 1
  elseif f == 2 then
    tp = x % 4294967296
    tc = (x - tp) / 4294967296 + 1
  end
  if tp < 1 then tp = 1 end
  if tc and now > s2 then
    local drained = (now - s2) * tc -- inexact only when > 2^53 >= s1
    if drained >= s1 then
      s1 = 0
    else
      s1 = s1 - drained
    end
    s2 = now
  end
  local q, r = muldiv(s1, p, tp)
  if r > 0 then q = q + 1 end
  if E < q then
    return nil
  end
  return q, s2
end

-- The algorithms, one function each: the outcome of a request of `cost`
-- on the line `lim`, whose key `key` is the call's slot j: ok (the line is
-- in range), admitted, remaining, reset_us, retry-after (-1: never), the
-- delay, and what to write if admitted and committing (`val`: true for the
-- words v1, v2, v3, or for sliding_log a function that pushes the entries;
-- `put` writes either). Built once per library (or EVAL), called through
-- the parsed line (its 10th field).

-- gcra
local function gcra(lim, j, key, cost)
  local b, K, QK = lim[4], lim[6], lim[8]
  local ok, adm, rem, rst, rty, val, v1, v2, v3, dly, nxt = false, false, 0, 0, -1, nil, 0, 0, 0, 0, 0
  -- state {TAT}; T = ceil(period/count); admitted at once iff
  -- max(TAT, now) + cost*T - now <= B*T, else delayed by the excess
  -- iff it is at most Q*T.
  local T, BT = K, lim[7]
  if T then
    ok = true
    local s, tg = state(j, lim[11], lim[12])
    if tg ~= 0 and tg ~= T and now < s then
      -- a varying line's backlog counted in another T: in this one,
      -- rounded up
      local q, r = muldiv(s - now, T, tg)
      if r > 0 then q = q + 1 end
      if E < q then
        return false, false, 0, 0, -1, 0, nil, 0, 0, 0, 0
      end
      s = now + q
    end
    local backlog = s - now
    if not (0 < backlog) then backlog = 0 end
    if cost <= b and backlog <= (b - cost) * T then
      local charged = backlog + cost * T
      local x = (BT - charged) / T
      adm, rem, rst = true, x - x % 1, charged
      if commit then
        val, v1 = true, now + charged
      end
    elseif cost <= b and backlog - (b - cost) * T <= QK then
      local charged = backlog + cost * T
      adm, rem, rst, dly = true, 0, charged, charged - BT
      if commit then
        val, v1 = true, now + charged
      end
    else
      if cost <= b then
        rty = backlog - (b - cost) * T - QK
      end
      local x = BT - backlog
      if not (0 < x) then x = 0 end
      x = x / T
      rem, rst = x - x % 1, backlog
    end
    if lim[15] and rem < b then
      -- the next unit: the backlog down to (b - rem - 1)*T
      nxt = rst - (b - rem - 1) * T
    end
  end
  return ok, adm, rem, rst, rty, dly, val, v1, v2, v3, nxt
end

-- fixed
local function fixed(lim, j, key, cost)
  local b, W = lim[4], lim[6]
  local ok, adm, rem, rst, rty, val, v1, v2, v3, dly, nxt = false, false, 0, 0, -1, nil, 0, 0, 0, 0, 0
  -- W = ceil(burst*period/count)
  -- state {k + 1, used}; windows [k*W, (k+1)*W).
  if W then
    ok = true
    local s1, s2, tg = state(j, lim[11], lim[12])
    local k = now / W
    k = k - k % 1
    if tg ~= 0 and tg ~= W then
      -- a varying line's window of another W: its count carries into the
      -- window of this W containing now, if it has not ended
      if s1 >= 1 and s1 * tg > now then
        s1 = k + 1
      else
        s1, s2 = 0, 0
      end
    end
    local used = 0
    if s1 >= 1 and s1 - 1 >= k then
      -- (read as it is above the burst: an overdraft, counted until the
      -- window ends)
      k, used = s1 - 1, s2
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
      if not (0 < rem) then rem = 0 end
      if used == 0 then rst = 0 end
      if cost <= b then rty = to_end end
    end
    if lim[15] then
      -- the next unit: the end of the window (0 when nothing counts)
      nxt = rst
    end
  end
  return ok, adm, rem, rst, rty, dly, val, v1, v2, v3, nxt
end

-- sliding's wait for a request of `cost` <= b that does not fit now, from
-- a window starting `lead` us from now (k*W - now) that counts curr with
-- prev before it: later in this window, else in the next (where curr
-- becomes prev), else two windows on; at least 1. first_fit(pc, room): the
-- smallest offset e < W into a window whose previous count is pc with
-- pc*(W-e) <= room*W; none if slack = 0.
local function wait(b, W, lead, curr, prev, cost)
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
  local w = lead + offset
  if not (1 < w) then w = 1 end
  return w
end

-- sliding
local function sliding(lim, j, key, cost)
  local alg, b, K, QK = lim[1], lim[4], lim[6], lim[8]
  local ok, adm, rem, rst, rty, val, v1, v2, v3, dly, nxt = false, false, 0, 0, -1, nil, 0, 0, 0, 0, 0
  -- W = ceil(burst*period/count)
  local W = K
  -- state {k + 1, curr, prev}; admitted iff
  -- prev*(W-e) + (curr+cost)*W <= B*W, i.e.
  -- curr + cost + ceil(prev*(W-e)/W) <= B.
  if W then
    ok = true
    local s1, s2, s3, tg = state(j, lim[11], lim[12])
    local k = now / W
    k = k - k % 1
    if tg ~= 0 and tg ~= W then
      -- a varying line's windows of another W: the estimate at now,
      -- rounded up, carries into the window of this W containing now
      local kt = now / tg
      kt = kt - kt % 1
      local win, curr, prev = kt, 0, 0
      if s1 >= 1 then
        local sk = s1 - 1
        if sk >= kt then
          win, curr, prev = sk, s2, s3
        elseif sk + 1 == kt then
          prev = s2
        end
      end
      -- (read as they are above the burst: an overdraft carries over)
      local span = tg
      if win == kt then span = tg - (now - kt * tg) end
      local pw, r = muldiv(prev, span, tg)
      if r > 0 then pw = pw + 1 end
      s1, s2, s3 = k + 1, curr + pw, 0
    end
    local curr, prev = 0, 0
    if s1 >= 1 then
      local sk = s1 - 1
      if sk >= k then
        k, curr, prev = sk, s2, s3
      elseif sk + 1 == k then
        prev = s2
      end
    end
    -- (curr and prev are read as they are above the burst: an overdraft
    -- weighs in until the window after the one charged ends)
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
        rty = wait(b, W, lead, curr, prev, cost)
      end
      rem = b - curr - pw
      if not (0 < rem) then rem = 0 end
    end
    if lim[15] and rem < b then
      -- the next unit: the wait of rem + 1 after the charge
      nxt = wait(b, W, lead, cc, prev, rem + 1)
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
  return ok, adm, rem, rst, rty, dly, val, v1, v2, v3, nxt
end

-- sliding_log
local function sliding_log(lim, j, key, cost)
  local alg, b, K, QK = lim[1], lim[4], lim[6], lim[8]
  local ok, adm, rem, rst, rty, val, v1, v2, v3, dly, nxt = false, false, 0, 0, -1, nil, 0, 0, 0, 0, 0
  -- W = ceil(burst*period/count)
  local W = K
  if W then
    -- sliding_log: a LIST of timestamps, newest first; an entry t
    -- counts during [t, t+W).
    ok = true
    local B, fmt = b, string.format
    -- (a string state pending here only if a key changed algorithm:
    -- keys name theirs) written first, and read again after
    if R[7 * j - 6] then
      flush(j)
    end
    cur[j] = nil
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
      if lim[15] and live + cost > 0 then
        -- the next unit: the oldest live entry's expiry, after the charge
        local oldest = stamp
        if live > 0 then oldest = at(live - 1) end
        nxt = math.max(1, oldest + W - now)
      end
      if commit then
        -- (v1: the stamp, for a refund)
        v1 = stamp
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
      if lim[15] and live > 0 then
        nxt = math.max(1, at(live - 1) + W - now)
      end
    end
  end
  return ok, adm, rem, rst, rty, dly, val, v1, v2, v3, nxt
end

-- concurrent (rl_conn on a Redis zone): the units of a key held by
-- requests in flight, a HASH with one field per nginx worker holding some
-- (named by the line: host:pid:random), its value "count gen deadline
-- set": the units the worker holds; the generation of its last heartbeat Redis
-- applied (or of its last change, when that was newer); when the field
-- lapses unless renewed (ms of the Redis clock: a take, a give-back or a
-- heartbeat renews it); 1 if the count was set by that heartbeat (else 0).
-- A field lapsed, or malformed, is a worker gone: its units are given back
-- (reclaimed, reported in the line's fifth reply value) by the first call
-- that commits on the key. A worker's heartbeat (`conn_put`'s "s") sets
-- what it holds by its own count (its held units and takes in flight): a
-- take sent before that heartbeat (its gen below the field's) is counted
-- in it already, so it writes nothing, and is let in while what is held
-- (its units among them) is within max (the heartbeat may have come
-- first, and set more than max: then it is refused, and the worker's
-- correction gives its units back). The
-- line's words: max as count and burst, lim[18] the worker, lim[19] the
-- generation the take was sent in, lim[20] the field's life (ms).
-- Keys are read by HGETALL (MGET reads them as missing); a key of another
-- type reads as empty, and is replaced by a write.
-- A line with a queue (`queue=`) keeps its waiting line in the same key:
-- a field "#ticket" per place, "cost deadline" (ms: it lapses unless its
-- request looks again), and "#" the next ticket (rl-core's
-- redis::holders, which says how a request is let in from the line).
-- A line of classes (`classes=`) has a field per worker and class (the
-- worker's name and "/k", k its class, 0 the highest), and a place its
-- class ("cost deadline k"); a field or place that names none (or none of
-- the line's) is of the lowest class.
-- A key of fields: the units the live ones hold, this worker's field
-- (count, gen, set flag; gen -1: none), the names of the fields lapsed
-- (places too), the units they held, whether the key is of another type,
-- the live places as (ticket, cost, deadline, class) quadruples (nil:
-- none), the next ticket, and for a line of `n` classes the units the
-- live fields of each class hold (by class, from 0).
local function holders(key, me, n)
  local all = redis.pcall('HGETALL', key)
  local held, mine, mg, mset, lapsed, freed, places, nextt = 0, 0, -1, '0', nil, 0, nil, 1
  local byclass = nil
  if n then
    byclass = {}
    for j = 0, n - 1 do byclass[j] = 0 end
  end
  if type(all) ~= 'table' or all.err then
    return held, mine, mg, mset, lapsed, freed, true, places, nextt, byclass
  end
  local low = (n or 1) - 1
  for i = 1, #all, 2 do
    local name = all[i]
    if string.byte(name, 1) == 35 then
      -- ("#": the waiting line's)
      if name == '#' then
        nextt = tonumber(all[i + 1]) or 1
      else
        local t = tonumber(string.sub(name, 2))
        local c, d, k = string.match(all[i + 1], '^(%d+) (%d+) ?(%d*)$')
        c, d, k = tonumber(c), tonumber(d), tonumber(k)
        if t and c and d and ms <= d then
          if not k or k > low then k = low end
          places = places or {}
          local q = #places
          places[q + 1], places[q + 2], places[q + 3], places[q + 4] = t, c, d, k
        else
          lapsed = lapsed or {}
          lapsed[#lapsed + 1] = name
        end
      end
    else
      local c, g, d, st = string.match(all[i + 1], '^(%d+) (%d+) (%d+) ([01])$')
      c, g, d = tonumber(c), tonumber(g), tonumber(d)
      if c and g and d and ms <= d then
        held = held + c
        if name == me then
          mine, mg, mset = c, g, st
        end
        if byclass then
          local k = tonumber(string.match(name, '/(%d+)$'))
          if not k or k > low then k = low end
          byclass[k] = byclass[k] + c
        end
      else
        lapsed = lapsed or {}
        lapsed[#lapsed + 1] = name
        if c then freed = freed + c end
      end
    end
  end
  return held, mine, mg, mset, lapsed, freed, false, places, nextt, byclass
end
-- A field's value.
local function holding(count, gen, life, set)
  return string.format('%.0f %.0f %.0f %s', count, gen, ms + life, set)
end
-- Makes a key of fields live at least `life` ms more (and a margin).
local function hold_key(key, life)
  local t = redis.call('PTTL', key)
  if t < life + 1000 then
    redis.call('PEXPIRE', key, ttl(life + 2000))
  end
end
-- A place's deadline: `left` ms of its wait and a second from now, at
-- most the fields' life.
local function place_deadline(left, life)
  return ms + math.min(left + 1000, life)
end
-- A place's value: its units, its deadline, and on a line of classes its
-- class.
local function place_value(cost, d, k)
  if k then
    return string.format('%.0f %.0f %.0f', cost, d, k)
  end
  return string.format('%.0f %.0f', cost, d)
end
-- A take committed is in its call's memo (a copy must not take twice);
-- an undo leaves it (its line, without the worker, does not parse as one):
-- the worker's heartbeat sets what it holds. A line with a queue (lim[21],
-- lim[22] the request's ticket, 0 when it arrives, lim[23] the ms its wait
-- has left) may wait: its request is let in when its units and those of
-- every live place ahead of it fit in what is free; else it keeps its
-- place (renewed once half its life is gone), or takes one if the line has
-- one free (code -3: the ticket as the reset, the places ahead as the
-- delay), or is refused (its place gone, or the line full). A place taken
-- or renewed is written at once, whatever the call's other lines decide
-- (nginx sends a waiting line alone), and keeps the call's memo (a copy
-- must find the same ticket).
-- A line of classes (lim[24] the request's class k, lim[25] the classes'
-- places and reserves, lim[26] how many; the worker's field its field of
-- class k): what is free for class k leaves the unused reserve of every
-- class above it (its reserve less what its fields hold); the places
-- ahead are those of the classes above and the earlier ones of its own;
-- an arrival takes a place only within its class's places and if its
-- units fit in what the reserves above leave of max, and when the line's
-- places are all taken it takes the newest place of the lowest class
-- below its own that has one (whose request finds it gone at its next
-- look), or is refused.
local function concurrent(lim, j, key, cost)
  local b, me, gen, life, Q, tk, lft = lim[4], lim[18], lim[19], lim[20], lim[21], lim[22], lim[23]
  local k, lanes, n = lim[24], lim[25], lim[26]
  -- (a string state of this key pending, were a key ever shared: written first)
  if R[7 * j - 6] then
    flush(j)
  end
  cur[j] = nil
  local held, mine, mg, mset, lapsed, freed, wrongtype, places, nextt, byclass = holders(key, me, n)
  if commit and lapsed then
    -- (their workers are gone: the units go back whatever this line decides)
    redis.call('HDEL', key, unpack(lapsed))
  end
  if not commit then freed = 0 end
  -- A take its worker's last heartbeat counted already.
  local need = cost
  if gen < mg then need = 0 end
  -- The unused reserves of the classes above, and all their reserves.
  local unused, kept = 0, 0
  if k then
    for c = 0, k - 1 do
      local r = lanes[2 * c + 2]
      kept = kept + r
      if r > byclass[c] then unused = unused + r - byclass[c] end
    end
  end
  -- The live places ahead (every one of its class and above for an
  -- arrival): how many, their units; the request's own place (its units,
  -- its deadline); how many places, and of its class.
  local nahead, ahead, own, od, nplaces, mine_places = 0, 0, nil, 0, 0, 0
  if places then
    nplaces = #places / 4
    for i = 1, #places, 4 do
      local t, pk = places[i], places[i + 3]
      if tk > 0 and t == tk then
        own, od = places[i + 1], places[i + 2]
      elseif (k and pk < k) or ((not k or pk == k) and (tk == 0 or t < tk)) then
        nahead, ahead = nahead + 1, ahead + places[i + 1]
      end
      if k and pk == k then mine_places = mine_places + 1 end
    end
  end
  local avail = b - held - unused - ahead
  if avail < 0 then avail = 0 end
  if tk > 0 and not own then
    return true, false, avail, 0, -1, 0, nil, 0, 0, 0, freed
  end
  -- (a take its worker's heartbeat counted is in `held` already: let in
  -- only while what is held, with it, is within max; that heartbeat may
  -- have reached Redis before it, and set the field beyond max)
  if cost == 0 or need <= b - held - unused - ahead then
    local val = nil
    if commit and cost > 0 and (need > 0 or tk > 0) then
      val = function()
        if wrongtype then
          redis.call('DEL', key)
        end
        if tk > 0 then
          redis.call('HDEL', key, '#' .. tk)
        end
        if need > 0 then
          -- (a take of a newer generation than the field's: that heartbeat
          -- did not set the count)
          local g, st = mg, mset
          if mg < gen then g, st = gen, '0' end
          redis.call('HSET', key, me, holding(mine + need, g, life, st))
          hold_key(key, life)
        end
      end
    end
    return true, true, avail - need, 0, -1, 0, val, 0, 0, 0, freed
  end
  if own then
    -- (renewed once half its life is gone, if that gains a second: late in
    -- a wait, the deadline stays at its end)
    local d = place_deadline(lft, life)
    if commit and cost > 0 and od - ms < floor(life / 2) and d >= od + 1000 then
      redis.call('HSET', key, '#' .. tk, place_value(own, d, k))
      hold_key(key, life)
      placed = true
    end
    return true, false, avail, tk, -3, nahead, nil, 0, 0, 0, freed
  end
  -- (a request that asks for more than the reserves above leave of max
  -- never fits: no place)
  if not (Q > 0 and commit and cost > 0 and cost <= b - kept) then
    return true, false, avail, 0, -1, 0, nil, 0, 0, 0, freed
  end
  if k and mine_places >= lanes[2 * k + 1] then
    return true, false, avail, 0, -1, 0, nil, 0, 0, 0, freed
  end
  if nplaces >= Q then
    -- The places of the classes below, newest of the lowest first: as
    -- many as it takes to free one.
    local below = {}
    if k and places then
      for i = 1, #places, 4 do
        if places[i + 3] > k then
          below[#below + 1] = { places[i + 3], places[i] }
        end
      end
    end
    local want = nplaces - Q + 1
    if #below < want then
      return true, false, avail, 0, -1, 0, nil, 0, 0, 0, freed
    end
    table.sort(below, function(x, y)
      if x[1] ~= y[1] then return x[1] > y[1] end
      return x[2] > y[2]
    end)
    for i = 1, want do
      redis.call('HDEL', key, '#' .. below[i][2])
    end
  end
  if wrongtype then
    redis.call('DEL', key)
  end
  local t = nextt
  if t < 1 then t = 1 end
  redis.call('HSET', key, '#' .. t, place_value(cost, place_deadline(lft, life), k), '#',
    string.format('%.0f', t + 1))
  hold_key(key, life)
  placed = true
  return true, false, avail, t, -3, nahead, nil, 0, 0, 0, freed
end

-- token_bucket and leaky_bucket
local function bucket(lim, j, key, cost)
  local alg, b, K, QK = lim[1], lim[4], lim[6], lim[8]
  local ok, adm, rem, rst, rty, val, v1, v2, v3, dly, nxt = false, false, 0, 0, -1, nil, 0, 0, 0, 0, 0
  -- state {used, last}, amounts scaled by the period (one request =
  -- period units, capacity burst*period).
  local cap, c, p = K, lim[2], lim[3]
  if cap then
    ok = true
    local s1, s2, tg = state(j, lim[11], lim[12])
    if tg ~= 0 and tg ~= lim[13] then
      -- a varying line's amount written at another rate: drained at that
      -- rate, then scaled by this period, rounded up
      s1, s2 = rebucket(s1, s2, tg, p)
      if not s1 then
        return false, false, 0, 0, -1, 0, nil, 0, 0, 0, 0
      end
    end
    -- (read as it is above the capacity: units a line with a
    -- larger queue queued)
    local used, last = s1, s2
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
      local amount
    local over = used + cost * p - cap
    if cost <= b and over <= QK then
      local after = used + cost * p
      if over <= 0 then
        local x = (cap - after) / p
        rem = x - x % 1
      else
        rem, dly = 0, drain(over, c, lag)
      end
      adm, amount = true, after
      if commit then
        local at = now
        if now < last then at = last end
        val, v1, v2 = true, after, at
      end
    else
      if cost <= b then
        rty = drain(over - QK, c, lag)
      end
      local x = (cap - used) / p
      if not (0 < x) then x = 0 end
      rem, amount = x - x % 1, used
    end
    rst = drain(amount, c, lag)
    if lim[15] and rem < b then
      -- the next unit: the amount down to (b - rem - 1)*p
      nxt = drain(amount + (rem + 1) * p - cap, c, lag)
    end
  end
  return ok, adm, rem, rst, rty, dly, val, v1, v2, v3, nxt
end

local by_name = {
  gcra = gcra, fixed = fixed, sliding = sliding, sliding_log = sliding_log,
  token_bucket = bucket, leaky_bucket = bucket, concurrent = concurrent,
}

-- The arguments after ARGV[3], by their string, parsed once per call: a
-- line "algorithm count period_us burst cost queue flags" (count,
-- period_us, burst integers in [1, 2^53), cost and queue integers >= 0,
-- flags 0 to 7) as {algorithm, count, period_us, burst, cost, K, BT, QK,
-- dry, function, shape, words, tag, after, next}, where K is
-- the algorithm's constant (W = ceil(burst*period/count) for fixed /
-- sliding / sliding_log, T = ceil(period/count) for gcra, with BT =
-- burst*T; burst*period for the buckets), or false when out of the exact
-- range; QK the queue scaled as the state (queue*T for gcra, queue*period
-- for the buckets); dry true for a dry-run line (flag 1); then the
-- algorithm's function (nil: unknown); the state's shape (the algorithm,
-- with '+' for a varying line's, flag 2), its number of words, and a
-- varying line's tag (its scale: W, T or the packed rate; false for a static
-- line); after true for a charge=after line's check (flag 4); next true for
-- a line that reports the wait for one more unit (flag 8); a malformed
-- line as
-- false; a number of lines as {0, n}, a run "-n" as {-1, n}; nil for a
-- malformed number.
local specs, nspecs = {}, 0
-- A concurrent line (rl_conn): "concurrent count period_us max cost queue
-- flags worker gen life ticket left", flags the sum of 64, 1 for a dry-run
-- line and 8 for one that reports the wait for one more unit (none: the
-- fifth value is what the line reclaimed); the worker (no space), its
-- generation and its fields' life (ms) as lim[18], lim[19], lim[20]; the
-- queue (0: the request never waits), its ticket and the ms its wait has
-- left as lim[21], lim[22], lim[23]; on a line of classes " k n" then n
-- times " places reserve" after them: the request's class (0 the highest),
-- and each class's places in the waiting line and reserve, as lim[24],
-- lim[26] and lim[25] (flat) (see `concurrent`).
local function parse_conn(s)
  local w1, w2, w3, w4, wq, w5, me, w6, w7, w8, w9, rest =
    string.match(s, '^concurrent (%d+) (%d+) (%d+) (%d+) (%d+) (%d+) (%S+) (%d+) (%d+) (%d+) (%d+)(.*)$')
  local c, p, b, x, f, gen, life = tonumber(w1), tonumber(w2), tonumber(w3), tonumber(w4), tonumber(w5),
    tonumber(w6), tonumber(w7)
  local q, tk, lft = tonumber(wq), tonumber(w8), tonumber(w9)
  if not (c and p and b and x and f and gen and life and q and tk and lft and c >= 1 and p >= 1 and b >= 1
      and b < E and x < E and gen < E and life >= 1 and life < E and q < E and tk < E and lft < E
      and (f == 64 or f == 65 or f == 72 or f == 73)) then
    return false
  end
  -- A line of classes: " k n" and per class " places reserve".
  local k, lanes, n = nil, nil, nil
  if rest ~= '' then
    local wk, wn, more = string.match(rest, '^ (%d+) (%d+)(.*)$')
    k, n = tonumber(wk), tonumber(wn)
    if not (k and n and n >= 2 and n <= 16 and k < n) then
      return false
    end
    lanes = {}
    for i = 1, n do
      local wp, wr, after = string.match(more, '^ (%d+) (%d+)(.*)$')
      local pl, r = tonumber(wp), tonumber(wr)
      if not (pl and r and pl < E and r < E) then
        return false
      end
      lanes[2 * i - 1], lanes[2 * i] = pl, r
      more = after
    end
    if more ~= '' then
      return false
    end
  end
  return { 'concurrent', c, p, b, x, b, false, 0, f % 2 == 1, concurrent, 'concurrent', 0, false, false, false,
    false, false, me, gen, life, q, tk, lft, k, lanes, n }
end
local function parse(s)
  local n = tonumber(s)
  if n then
    if n % 1 ~= 0 then
      return nil
    elseif n < 0 then
      return { -1, -n }
    end
    return { 0, n }
  end
  if string.sub(s, 1, 11) == 'concurrent ' then
    return parse_conn(s)
  end
  local a, w1, w2, w3, w4, w5, w6, w7 = string.match(s, '^(%S+) (%S+) (%S+) (%S+) (%S+) (%S+) (%d+) ?(%d*)$')
  local c, p, b, x, q, f = tonumber(w1), tonumber(w2), tonumber(w3), tonumber(w4), tonumber(w5), tonumber(w6)
  -- flags: the sum of 1 dry-run, 2 varying, 4 charge-after check (checks a
  -- cost of 1, never charges), 8 next (reports the wait for one more
  -- unit), 16 a lease asked with the request (then a last field, its life
  -- in us; 2 the only other bit it may have), 32 a request that must leave units of the budget to the
  -- classes above its own (then a last field, how many); no other bit is
  -- known
  if not (f and f <= 63 and w6 == string.format('%d', f)) then
    return false
  end
  local life, kept = false, false
  if f >= 32 then
    kept = tonumber(w7)
    if not (kept and kept >= 1 and kept < TWO53 and w7 == string.format('%d', kept) and f % 32 < 16) then
      return false
    end
  elseif f >= 16 then
    life = tonumber(w7)
    if not (life and life >= 1 and life < TWO53 and w7 == string.format('%d', life) and (f == 16 or f == 18)) then
      return false
    end
  elseif w7 ~= '' then
    return false
  end
  if not (c and p and b and x and q
      and c % 1 == 0 and c >= 1 and c < TWO53
      and p % 1 == 0 and p >= 1 and p < TWO53
      and b % 1 == 0 and b >= 1 and b < TWO53
      and x % 1 == 0 and x >= 0 and x < TWO53
      and q % 1 == 0 and q >= 0 and q < TWO53) then
    return false
  end
  local K, BT, QK = false, false, 0
  if a == 'gcra' then
    local T = p / c
    local Ti = T - T % 1
    if Ti < T then Ti = Ti + 1 end
    if (b + q) * Ti <= E then
      K, BT, QK = Ti, b * Ti, q * Ti
    end
  elseif q > 0 then
    -- (only the buckets and gcra queue)
    K = false
  elseif a == 'fixed' or a == 'sliding' or a == 'sliding_log' then
    local W, r = muldiv(b, p, c)
    if r > 0 then W = W + 1 end
    if (a == 'fixed' and W <= E) or (a == 'sliding' and W <= E / 2)
        or (a == 'sliding_log' and b <= 65536 and W <= E) then
      K = W
    end
  end
  if (a == 'token_bucket' or a == 'leaky_bucket') and (b + q) * p <= E then
    K, QK = b * p, q * p
  end
  -- A varying line's state shape ends with its tag, the scale it counts
  -- in (sliding_log's timestamps need none); the buckets' packs their rate
  -- (rate_tag), exact up to E.
  local shape, tag = a, false
  if f % 4 >= 2 and a ~= 'sliding_log' then
    shape = a .. '+'
    if a == 'gcra' then
      tag = K
    elseif a == 'token_bucket' or a == 'leaky_bucket' then
      tag = rate_tag(c, p)
      if E < tag then tag = false end
    elseif b <= E then
      tag = K
    end
    if not tag then K = false end
  end
  return { a, c, p, b, x, K, BT, QK, f % 2 == 1, by_name[a], shape, NW[shape] or 0, tag, f % 8 >= 4, f % 16 >= 8, life,
    kept }
end

-- parse(s), kept in `specs` (nil, a malformed number, is not kept).
local function parsed(s)
  local lim = specs[s]
  if lim == nil then
    lim = parse(s)
    if lim ~= nil then
      specs[s], nspecs = lim, nspecs + 1
    end
  end
  return lim
end

-- The line an argument s gives (false: none, malformed, or a number).
local function line(s)
  local lim = s and parsed(s)
  if not lim or lim[1] == 0 or lim[1] == -1 then
    return false
  end
  return lim
end

-- The outcome of a request of `cost` on `lim` (its algorithm, lim[10]), and
-- for a line of classes (lim[17], the units the reserves of the classes
-- above the request's keep) that of rl-core's Limit::acquire_keeping: it
-- passes only where cost + kept would, checked without writing, and is
-- then decided (and written, when committing) for cost alone; what it is
-- told is left is what its class may still spend.
local function kept_run(lim, j, key, cost)
  local kept = lim[17]
  if not kept then
    return lim[10](lim, j, key, cost)
  end
  -- (a cost of 0 spends nothing: it passes as on any line)
  local wide = cost + kept
  if cost == 0 then wide = 0 end
  local c = commit
  commit = false
  local ok, adm, rem, rst, rty, dly, val, v1, v2, v3, nxt = lim[10](lim, j, key, wide)
  commit = c
  if ok and adm then
    ok, adm, rem, rst, rty, dly, val, v1, v2, v3, nxt = lim[10](lim, j, key, cost)
  end
  rem = rem - kept
  if rem < 0 then rem = 0 end
  return ok, adm, rem, rst, rty, dly, val, v1, v2, v3, nxt
end

-- A call's start: binds the library functions, and sets the clock from
-- `t` (the call's now argument; "" = Redis TIME).
local old_redis
local function start(t)
  if not pack then
    floor, pack, unpack_ = math.floor, struct.pack, struct.unpack
    -- Redis 3.2-4.x: allow writes after TIME (effects replication; later
    -- versions always do this, and from 7.0, which has REDIS_VERSION_NUM,
    -- the call is a no-op). Asked once per library: two lookups in the
    -- `redis` table cost a call more than the rest of its start.
    old_redis = redis.replicate_commands and not redis.REDIS_VERSION_NUM
  end
  if old_redis then
    pcall(redis.replicate_commands)
  end
  -- The clock.
  now = nil
  if t ~= '' then
    now = tonumber(t)
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
  ms_up = ms
  if ms * 1000 < now then ms_up = ms + 1 end
end

-- Reads every distinct key of the call, and clears the call's records.
local function read(KEYS)
  -- (an entry is cleared only where there is one: in Lua 5.1 t[k] = nil
  -- for an absent k adds k, and grows the table)
  if nslots > 1 or #KEYS > 1 then
    slot, names, R = {}, {}, {}
  elseif nslots == 1 then
    slot[names[1]] = nil
    if shared then
      -- (R holds a record only in a call that shares a key)
      if R[7] ~= nil then R[7] = nil end
      if R[1] ~= nil then R[1] = nil end
    end
  end
  cur, nslots, shared = nil, 0, false
  sx = 0
  if nspecs > 64 then
    -- (a library keeps the parsed lines from call to call: a few)
    specs, nspecs = {}, 0
  end

  -- Read every distinct key with MGET, 256 at a time (one call instead of a
  -- GET each; MGET answers nil for a key of another type, which GET reads as
  -- fresh too). A call of one key leaves it to `state`'s GET, which costs
  -- Redis less than MGET.
  local nkeys, n = #KEYS, 0
  if nkeys == 1 then
    local key = KEYS[1]
    slot[key], names[1], nslots, cur = 1, key, 1, cur1
    if cur1[1] ~= nil then cur1[1] = nil end
    return
  end
  for i = 1, nkeys + 1 do
    local key = KEYS[i]
    if key then
      local j = slot[key]
      if j == nil then
        nslots = nslots + 1
        slot[key], names[nslots] = nslots, key
        n = n + 1
      else
        R[7 * j], shared = true, true
      end
    end
    if n == 256 or (i > nkeys and n > 0) then
      local got = redis.call('MGET', unpack(names, nslots - n + 1, nslots))
      if cur == nil then
        cur = got
      else
        for j = 1, n do
          cur[nslots - n + j] = got[j]
        end
      end
      n = 0
    end
  end
  cur = cur or {}
end

-- Writes the records of the keys several lines of the call shared (none
-- unless a key is: `shared`).
local function flush_all()
  if not shared then
    return
  end
  for j = 1, nslots do
    if R[7 * j - 6] then
      flush(j)
    end
  end
end

-- Replaces the outcome at reply[n] of a line `lim` on slot j (key `key`)
-- that admits its request but is not charged with what its state has left:
-- the check of a cost of 0 (rl-core's Outcome::uncharged of Limit::left).
local function left(n, lim, j, key)
  local _, _, rem, rst, _, _, _, _, _, _, nxt = lim[10](lim, j, key, 0)
  if lim[18] then
    -- (a concurrent line's fifth value: what it reclaimed, kept)
    nxt = reply[n + 4]
  end
  if lim[17] then
    -- (what the request's class may spend: the reserves above it kept)
    rem = rem - lim[17]
    if rem < 0 then rem = 0 end
  end
  reply[n], reply[n + 1], reply[n + 4] = rem, rst, nxt
end

-- A call's memo (mode "2" of `limit`, and `charge` given one more key):
-- the key (the call's last KEYS entry, which names the call), and what the
-- call committed: per line charged, its index in KEYS and the words v1, v2
-- its algorithm returned (from which `refund_line` finds the charge).
local memo, done, ndone = nil, {}, 0
-- How long a memo outlives its call's deadline (ms): a re-sent copy, or
-- the undo of a call nginx gave up on, comes within it.
local MEMO_MS = 10000
-- How long the mark of an undone (or never run) call lives (ms): longer
-- than any call's deadline (a timeout is at most 60 s), so that a copy
-- still on its way cannot apply it after its undo.
local UNDONE_MS = '70000'
-- struct formats of n doubles, kept.
local fmts = {}
local function doubles(n)
  local f = fmts[n]
  if f == nil then
    f = '<' .. string.rep('d', n)
    fmts[n] = f
  end
  return f
end
-- t[1 .. n] packed as doubles (256 at a time: a C function's arguments
-- are bounded), appended to parts.
local function pack_all(parts, t, n)
  local i = 0
  while i < n do
    local c = n - i
    if c > 256 then c = 256 end
    parts[#parts + 1] = pack(doubles(c), unpack(t, i + 1, i + c))
    i = i + c
  end
end
-- n doubles of v from pos on, as a table; and the position after them.
local function unpack_all(v, pos, n)
  local t, i = {}, 0
  while i < n do
    local c = n - i
    if c > 256 then c = 256 end
    local got = { unpack_(doubles(c), v, pos) }
    for q = 1, c do
      t[i + q] = got[q]
    end
    pos = got[c + 1]
    i = i + c
  end
  return t, pos
end
-- Stores the memo of a call that replies out[1 .. nout], for ms ms: two
-- doubles (nout, ndone), the reply, then `done`.
-- (A call of one request of one line, the usual one, packs its memo in
-- one struct call: in Redis' Lua every table and string built costs about
-- a thousand instructions, and the memo's SET alone about 18,000.)
local function remember(out, nout, ms)
  local v
  if nout == 6 and ndone == 3 then
    v = pack('<ddddddddddd', 6, 3, out[1], out[2], out[3], out[4], out[5], out[6], done[1], done[2], done[3])
  else
    local parts = { pack('<dd', nout, ndone) }
    pack_all(parts, out, nout)
    pack_all(parts, done, ndone)
    v = table.concat(parts)
  end
  redis.call('SET', memo, v, 'PX', ttl(ms))
end
-- A memo read back: the reply, and `done`; nil if v is none (the mark of
-- an undone call, or not ours).
local function recall(v)
  if #v < 16 then
    return nil
  end
  local nout, nd = unpack_('<dd', v)
  if not (nout >= 1 and nd >= 0 and #v == 16 + 8 * (nout + nd)) then
    return nil
  end
  local out, pos = unpack_all(v, 17, nout)
  return out, (unpack_all(v, pos, nd))
end
-- The memo key of the call: popped from KEYS, and looked up. Returns the
-- reply to give at once: the memo's reply for a repeat; for an undone
-- call, as for a late one, {-1, now}; nil to run the call.
local function repeat_of(KEYS)
  local n = #KEYS
  memo, ndone = KEYS[n], 0
  KEYS[n] = nil
  local v = redis.call('GET', memo)
  if not v then
    return nil
  end
  local out = recall(v)
  if out then
    return out
  end
  return { -1, now }
end

-- A lease asked with a request (a line of flag 16 whose cost is the units
-- wanted and whose last field is the lease's life; lease.lua's call, for
-- one key, in the request's call): the most units up to that cost the line
-- admits at once after the request's lines, charged as one request. Sets
-- reply[n ..] to the units granted, the words v1, v2 to give them back
-- with, the lease's life left (us: to the end of its window for fixed and
-- sliding) and the line's reset after the grant; zeroes: none (and in a
-- call that does not commit).
local granted = false
local function grant(n, lim, j, key)
  if not (commit and key and lim[10] and lim[1] ~= 'sliding_log' and now <= E) then
    return
  end
  commit = false
  local ok, _, rem = lim[10](lim, j, key, 0)
  commit = true
  local g = 0
  if ok then
    g = lim[5]
    if rem < g then g = rem end
    if g < 0 then g = 0 end
    g = g - g % 1
  end
  while g >= 1 do
    local ok, adm, _, rst, _, dly, val, v1, v2, v3 = lim[10](lim, j, key, g)
    if ok and adm and dly == 0 and val then
      put(j, lim, val, v1, v2, v3, sx, rst)
      -- (remembered with the call, but not as a charge an undo takes back:
      -- its cost is not the line's, and a grant nginx never got is only
      -- wasted)
      granted = true
      local ends = now + lim[16]
      if lim[1] == 'fixed' or lim[1] == 'sliding' then
        local W = lim[6]
        local w = now / W
        w = w - w % 1
        if (w + 1) * W < ends then ends = (w + 1) * W end
      end
      reply[n], reply[n + 1], reply[n + 2], reply[n + 3], reply[n + 4] = g, v1, v2, ends - now, rst
      return
    end
    -- (the remaining at once is exact: only out of range would it not
    -- admit; fewer units then, halved)
    g = g - g % 2
    g = g / 2
  end
end

-- Checks (and commits) the requests of one call: the script's body.
local function limit(KEYS, ARGV)
  start(ARGV[2])

  -- Mode "2": a commit that names itself by its last key (its memo). A
  -- repeat of a call that ran (its reply lost on the way) answers what
  -- the call did, whatever the deadline.
  local mode = ARGV[1]
  memo = nil
  if mode == '2' then
    if #KEYS < 2 then
      return redis.error_reply('rl: malformed arguments')
    end
    local again = repeat_of(KEYS)
    if again then
      return again
    end
  end

  -- The deadline: checked before anything is read.
  local deadline = ARGV[3]
  if deadline and deadline ~= '' then
    deadline = tonumber(deadline)
    if not deadline then
      return redis.error_reply('rl: malformed arguments')
    end
    if now > deadline then
      return { -1, now }
    end
  else
    deadline = now
  end

  commit = mode == '1' or mode == '2'
  granted = false
  placed = false
  local nargs = #ARGV
  -- (sized for a request of one line: a table grown entry by entry costs
  -- Redis' Lua a resize at 2, 3 and 5 entries; the unused ones are cleared
  -- at the end)
  reply, nreply = { now, 0, 0, 0, 0, 0 }, 1
  read(KEYS)
  -- The next ARGV and KEYS to read; the requests left in a run, their line,
  -- and how far a line advances ARGV (0 in a run).
  local argi, k = 4, 0
  local run, rlim, step = 0, nil, 1

  while run > 0 or argi <= nargs do
    -- One request: one line, or its number of lines then its lines.
    local lim
    local nlines = 1
    if run > 0 then
      run, lim = run - 1, rlim
    else
      lim = parsed(ARGV[argi])
      if lim == nil then
        return redis.error_reply('rl: malformed arguments')
      end
      step = 1
      if lim and lim[1] == 0 then
        nlines, lim = lim[2], nil
        argi = argi + 1
      elseif lim and lim[1] == -1 then
        -- A run: this request and the next n - 1, one line each.
        if lim[2] > #KEYS then
          return redis.error_reply('rl: malformed arguments')
        end
        run = lim[2] - 1
        rlim = line(ARGV[argi + 1])
        lim, argi, step = rlim, argi + 2, 0
        if run < 0 then
          -- "-0": no request
          run = 0
          nlines = 0
        end
      end
    end
    if nlines == 1 then
      -- The usual request, one line: committed at once (a lone dry-run
      -- line admits the request, and is committed iff it admits it too).
      -- (Its own path: what a request of several lines keeps, and checks
      -- once all are read, costs Redis' Lua a few thousand instructions a
      -- request.)
      argi = argi + step
      k = k + 1
      local key = KEYS[k]
      local n = nreply + 1
      nreply = n + 4
      if key and lim and lim[10] and now <= E and not lim[16] then
        local cost, after = lim[5], lim[14]
        if after then
          -- a charge=after line's check: one unit left admits; its cost
          -- is charged later, by `charge`
          cost = 1
        end
        local j = slot[key]
        local ok, adm, rem, rst, rty, dly, val, v1, v2, v3, nxt = kept_run(lim, j, key, cost)
        if ok and cost == 0 then
          -- charges nothing: passes at once even over the limit, and writes
          -- nothing
          adm, rty, val, dly = true, -1, nil, 0
        end
        if adm then
          if val and not after then
            put(j, lim, val, v1, v2, v3, sx, rst)
            if memo then
              done[ndone + 1], done[ndone + 2], done[ndone + 3] = k, v1, v2
              ndone = ndone + 3
            end
          end
          reply[n], reply[n + 1], reply[n + 2], reply[n + 3], reply[n + 4] = rem, rst, -2, dly, nxt
          if commit and after then
            -- a charge=after line's check, not charged: what it has left
            left(n, lim, j, key)
          end
        else
          -- (a request waiting in a concurrent line's waiting line: the
          -- places ahead of it)
          if rty ~= -3 then dly = 0 end
          reply[n], reply[n + 1], reply[n + 2], reply[n + 3], reply[n + 4] = rem, rst, rty, dly, nxt
        end
      else
        -- no key, a malformed line, an unknown algorithm, beyond 2^52 us,
        -- or a lease asked with no request: fails closed
        reply[n], reply[n + 1], reply[n + 2], reply[n + 3], reply[n + 4] = 0, 0, -1, 0, 0
      end
    else
      -- reply[at ...]: per line 5 values.
      local at = nreply + 1
      nreply = nreply + 5 * nlines
      -- Several lines: all enforced lines admitted so far, and the pending
      -- writes (the lines that admit, dry-run or not) as (slot,
      -- what, reset_us, algorithm, v1, v2, v3, expiry read) tuples (see `val`
      -- below).
      local all, pending, npending = 1, nil, 0
      -- (and, for what they have left if they are not charged, the lines that
      -- admit it as (reply index, line, slot) triples)
      local admits, nadmits = nil, 0
      -- (and the leases asked with it, as (reply index, line, KEYS index)
      -- triples)
      local grants, ngrants = nil, 0

      for i = 1, nlines do
        lim = line(ARGV[argi])
        argi = argi + step
        if lim and lim[16] then
          -- A lease asked with the request: granted after its lines
          -- (below), whatever they decide.
          k = k + 1
          local n = at + 5 * i - 5
          reply[n], reply[n + 1], reply[n + 2], reply[n + 3], reply[n + 4] = 0, 0, 0, 0, 0
          grants = grants or {}
          grants[ngrants + 1], grants[ngrants + 2], grants[ngrants + 3] = n, lim, k
          ngrants = ngrants + 3
        else
          local alg, b, cost, K, QK
          if lim then
            alg, b, cost, K, QK = lim[1], lim[4], lim[5], lim[6], lim[8]
            if lim[14] then
              -- a charge=after line's check: one unit left admits
              cost = 1
            end
          end
          k = k + 1
          local key = KEYS[k]
          local j = slot[key]
          -- The line's outcome; `val` says what to write if admitted and
          -- committing: true for the words v1, v2, v3, or for sliding_log a
          -- function that pushes the entries (`put` writes either).
          local ok, adm, rem, rst, rty, val, v1, v2, v3 = false, false, 0, 0, -1, nil, 0, 0, 0
          -- (the delay: a queued line's admission beyond the burst; the wait
          -- for one more unit, if the line reports it)
          local dly, nxt = 0, 0

          if key and lim and lim[10] and now <= E then
            ok, adm, rem, rst, rty, dly, val, v1, v2, v3, nxt = kept_run(lim, j, key, cost)
            if lim[14] then
              -- a charge=after line: its cost is charged later, by `charge`
              val = nil
            end
            if ok and cost == 0 then
              -- charges nothing: passes at once even over the limit, and writes
              -- nothing
              adm, rty, val, dly = true, -1, nil, 0
            end
          end

          local n = at + 5 * i - 5
          if adm then
            reply[n], reply[n + 1], reply[n + 2], reply[n + 3], reply[n + 4] = rem, rst, -2, dly, nxt
            if val then
              pending = pending or {}
              local q = npending
              pending[q + 1], pending[q + 2], pending[q + 3], pending[q + 4] = j, val, rst, lim
              pending[q + 5], pending[q + 6], pending[q + 7], pending[q + 8] = v1, v2, v3, sx
              pending[q + 9] = k
              npending = q + 9
            end
            if commit and lim then
              admits = admits or {}
              admits[nadmits + 1], admits[nadmits + 2], admits[nadmits + 3] = n, lim, j
              nadmits = nadmits + 3
            end
          else
            if rty ~= -3 then dly = 0 end
            reply[n], reply[n + 1], reply[n + 2], reply[n + 3], reply[n + 4] = rem, rst, rty, dly, nxt
            if not (lim and lim[9]) then
              all = 0
            end
          end
        end
      end

      -- The lines that admit the request but are not charged (all of them if
      -- it is rejected, else the charge=after lines' checks) report what
      -- they have left.
      for q = 1, nadmits, 3 do
        local lim = admits[q + 1]
        if all == 0 or lim[14] then
          local j = admits[q + 2]
          left(admits[q], lim, j, names[j])
        end
      end

      if all == 1 then
        for q = 1, npending, 9 do
          put(pending[q], pending[q + 3], pending[q + 1], pending[q + 4], pending[q + 5], pending[q + 6],
            pending[q + 7], pending[q + 2])
          if memo then
            done[ndone + 1], done[ndone + 2], done[ndone + 3] = pending[q + 8], pending[q + 4], pending[q + 5]
            ndone = ndone + 3
          end
        end
      end
      for q = 1, ngrants, 3 do
        local k = grants[q + 2]
        grant(grants[q], grants[q + 1], slot[KEYS[k]], KEYS[k])
      end
    end
  end

  flush_all()
  for i = nreply + 1, 6 do
    reply[i] = nil
  end
  -- (a call that charged nothing, and granted no lease, needs no memo:
  -- run again, it is still applied once)
  if memo and (ndone > 0 or granted or placed) then
    remember(reply, nreply, MEMO_MS + floor((deadline - now) / 1000))
  end
  return reply
end

-- The state words s1, s2, s3 of slot j as the line `lim` counts them at
-- now: a varying line's state written under another tag converted to the
-- line's own scale, the used amount rounded up (rl-core's limit/vary.rs,
-- as the algorithms above convert it); nil when the conversion leaves the
-- exact range.
local function scaled(lim, j)
  local alg, tag, n = lim[1], lim[13], lim[12]
  local s1, s2, s3, s4 = state(j, lim[11], n)
  if not tag then
    return s1, s2, s3
  end
  local tg = s4
  if n == 2 then
    tg, s2 = s2, 0
  elseif n == 3 then
    tg, s3 = s3, 0
  end
  if tg == 0 or tg == tag then
    return s1, s2, s3
  end
  local k = now / tag
  k = k - k % 1
  if alg == 'gcra' then
    if now < s1 then
      local q, r = muldiv(s1 - now, tag, tg)
      if r > 0 then q = q + 1 end
      if E < q then
        return nil
      end
      s1 = now + q
    end
  elseif alg == 'fixed' then
    if s1 >= 1 and s1 * tg > now then
      s1 = k + 1
    else
      s1, s2 = 0, 0
    end
  elseif alg == 'sliding' then
    local kt = now / tg
    kt = kt - kt % 1
    local win, curr, prev = kt, 0, 0
    if s1 >= 1 then
      local sk = s1 - 1
      if sk >= kt then
        win, curr, prev = sk, s2, s3
      elseif sk + 1 == kt then
        prev = s2
      end
    end
    local span = tg
    if win == kt then span = tg - (now - kt * tg) end
    local pw, r = muldiv(prev, span, tg)
    if r > 0 then pw = pw + 1 end
    s1, s2, s3 = k + 1, curr + pw, 0
  else
    s1, s2 = rebucket(s1, s2, tg, lim[3])
    if not s1 then
      return nil
    end
  end
  return s1, s2, s3
end

-- The state of slot j after a charge of `cost` on the line `lim`, in full
-- whatever the state (rl-core's Limit::overdraw): ok (charged: false for
-- sliding_log, a line out of the exact range, or a state that would pass
-- E), the words v1, v2, v3, and the reset (us) of the state after it.
local function overdraw(lim, j, cost)
  local alg, K = lim[1], lim[6]
  if not K or E <= cost then
    return false
  end
  local s1, s2, s3 = scaled(lim, j)
  if not s1 then
    return false
  end
  if alg == 'fixed' or alg == 'sliding' then
    local k = now / K
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
    curr = curr + cost
    if E < curr then
      return false
    end
    -- fixed: until the window ends; sliding: until the next one does
    local rst = (k + 1) * K - now
    if alg == 'fixed' then
      prev = 0
    else
      rst = rst + K
    end
    if not (0 < rst) then rst = 0 end
    return true, k + 1, curr, prev, rst
  elseif alg == 'token_bucket' or alg == 'leaky_bucket' then
    local c, p = lim[2], lim[3]
    local used, last = s1, s2
    if now > last then
      local refill = (now - last) * c
      if refill >= used then
        used = 0
      else
        used = used - refill
      end
    end
    local lag, at = last - now, last
    if not (0 < lag) then lag, at = 0, now end
    used = used + cost * p
    if E < used then
      return false
    end
    return true, used, at, 0, drain(used, c, lag)
  elseif alg == 'gcra' then
    local backlog = s1 - now
    if not (0 < backlog) then backlog = 0 end
    backlog = backlog + cost * K
    if E < backlog then
      return false
    end
    return true, now + backlog, 0, 0, backlog
  end
  return false
end

-- Charges the costs of one call, line by line (see the header): the charge
-- call's body.
local function charge(KEYS, ARGV)
  start(ARGV[1])
  -- One key more than lines: the last is the call's memo, and a repeat of
  -- a charge that ran answers what it did.
  memo = nil
  if #KEYS == #ARGV and #KEYS >= 2 then
    local again = repeat_of(KEYS)
    if again then
      return again
    end
  end
  if #ARGV ~= #KEYS + 1 then
    return redis.error_reply('rl: malformed arguments')
  end
  read(KEYS)
  local out, wrote = { now }, false
  for i = 1, #KEYS do
    local lim = line(ARGV[i + 1])
    local done = 0
    -- (in range, and not sliding_log)
    if lim and now <= E and lim[6] and lim[1] ~= 'sliding_log' then
      local cost, j = lim[5], slot[KEYS[i]]
      if cost == 0 then
        done = 1
      else
        local ok, v1, v2, v3, rst = overdraw(lim, j, cost)
        if ok then
          put(j, lim, true, v1, v2, v3, sx, rst)
          done, wrote = 1, true
        end
      end
    end
    out[i + 1] = done
  end
  flush_all()
  if memo and wrote then
    remember(out, #KEYS + 1, MEMO_MS)
  end
  return out
end

-- Takes back, on slot j (key `key`), the charge of `cost` that a line
-- `lim` committed leaving the words v1, v2 (rl-core's Limit::refund, the
-- charge found from them: the window k + 1 = v1 for fixed and sliding,
-- the stamp v1 for sliding_log, at = v2 and below = v1 - cost*period for
-- the buckets, at = v1 - cost*T for gcra). A varying line's state must
-- still be in its own scale (its tag), and the buckets' charged last
-- then. Returns whether it took anything back.
local function refund_line(lim, j, key, cost, v1, v2)
  local alg, K = lim[1], lim[6]
  if cost == 0 or not K then
    return false
  end
  if alg == 'sliding_log' then
    if R[7 * j - 6] then
      flush(j)
    end
    cur[j] = nil
    local n = redis.pcall('LREM', key, cost, string.format('%.0f', v1))
    return type(n) == 'number' and n > 0
  end
  local n, tag = lim[12], lim[13]
  local s1, s2, s3, s4 = state(j, lim[11], n)
  local x0 = sx
  if tag then
    local tg = s4
    if n == 2 then
      tg = s2
    elseif n == 3 then
      tg = s3
    end
    if tg ~= tag then
      return false
    end
  end
  local rst
  if alg == 'fixed' then
    if s1 ~= v1 then
      return false
    end
    s2 = s2 - cost
    if s2 < 0 then s2 = 0 end
    rst = s1 * K - now
  elseif alg == 'sliding' then
    if s1 == v1 then
      s2 = s2 - cost
      if s2 < 0 then s2 = 0 end
    elseif s1 == v1 + 1 then
      s3 = s3 - cost
      if s3 < 0 then s3 = 0 end
    else
      return false
    end
    rst = (s1 + 1) * K - now
  elseif alg == 'token_bucket' or alg == 'leaky_bucket' then
    local c, p = lim[2], lim[3]
    -- (older than the charge: a state created afresh since; a varying
    -- line's, once another request has charged it since, which may have
    -- drained it at another rate: rl-core's vary::refund)
    if s2 < v2 or (tag and s2 ~= v2) then
      return false
    end
    local lost = (s2 - v2) * c - (v1 - cost * p)
    if not (0 < lost) then lost = 0 end
    local back = cost * p - lost
    if not (0 < back) then
      return false
    end
    s1 = s1 - back
    if s1 < 0 then s1 = 0 end
    local lag = s2 - now
    if not (0 < lag) then lag = 0 end
    rst = drain(s1, c, lag)
  elseif alg == 'gcra' then
    local lost = now - (v1 - cost * K)
    if not (0 < lost) then lost = 0 end
    local back = cost * K - lost
    if not (0 < back) or s1 == 0 then
      return false
    end
    s1 = s1 - back
    if s1 < 0 then s1 = 0 end
    rst = s1 - now
  else
    return false
  end
  if not (0 < rst) then rst = 0 end
  put(j, lim, true, s1, s2, s3, x0, rst)
  return true
end

-- Takes back what a call named by its memo (the last key) committed: the
-- undo of a call whose requests nginx answered without its reply
-- (`on_error`). ARGV: now (as `charge`), then the call's lines, one
-- argument each as `charge` takes them (with the cost each request put on
-- it), in the order of the call's KEYS, which come before the memo. A call
-- that has not run (yet) is marked so that it never will; one undone
-- already is left as it is. Returns {now, 1 if it took the call back, 0 if
-- the call had not run, 2 if it was undone already (or its memo is gone)}.
local function undo(KEYS, ARGV)
  start(ARGV[1])
  if #KEYS < 2 or #ARGV ~= #KEYS then
    return redis.error_reply('rl: malformed arguments')
  end
  memo = KEYS[#KEYS]
  KEYS[#KEYS] = nil
  local v = redis.call('GET', memo)
  if not v then
    redis.call('SET', memo, 'u', 'PX', UNDONE_MS)
    return { now, 0 }
  end
  local out, d = recall(v)
  if not out then
    return { now, 2 }
  end
  -- Marked undone first, as a call undone before it runs, for longer than
  -- any copy of the call can still come in time (not SET ... KEEPTTL,
  -- which Redis before 6.0 refuses: the undo would fail after its refunds,
  -- leave the memo, and each retry refund the call again; marked first, an
  -- undo that fails half-way refunds less, never twice).
  redis.call('SET', memo, 'u', 'PX', UNDONE_MS)
  read(KEYS)
  for q = 1, #d - 2, 3 do
    local k = d[q]
    local key, lim = KEYS[k], line(ARGV[k + 1])
    if key and lim and now <= E then
      refund_line(lim, slot[key], key, lim[5], d[q + 1], d[q + 2])
    end
  end
  flush_all()
  return { now, 1 }
end

return limit(KEYS, ARGV)
