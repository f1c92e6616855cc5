-- nginx-rl: the lease call (NAME_lease), appended to limit.lua's body (all
-- but its last line), whose helpers it uses: in the function library, and
-- as the lease script (with `return lease(KEYS, ARGV)` after it).
--
-- A node's leases (rl-core's lease::Leasing, issue #38): per key, gives
-- back what the node's last lease on it left unspent, then grants a new
-- one: the most units up to what the node wants that the line admits at
-- once, charged as one request. KEYS: the state keys, then the call's memo
-- key (a lease call is applied once, as a commit is). ARGV: now ("" =
-- TIME), a lease's life in us (token_bucket, leaky_bucket, gcra), the life
-- of a fixed or sliding line's lease (to the end of its window at most),
-- then per key five arguments: its line (as
-- `limit` takes one; the line that grants leases, its burst already less
-- what nginx holds back), the units wanted, the units given back (0:
-- none), and the words v1, v2 the grant of those units returned. Returns
-- {now, then per key: units granted, the words v1, v2 to give them back
-- with, the lease's life left (us: to the end of its window for fixed and
-- sliding), what the line has left at once and its reset (us) after the
-- grant, 1 if the units given back were taken back (else 0)}.
local function lease(KEYS, ARGV)
  start(ARGV[1])
  if #KEYS < 2 or #ARGV ~= 3 + 5 * (#KEYS - 1) then
    return redis.error_reply('rl: malformed arguments')
  end
  local again = repeat_of(KEYS)
  if again then
    return again
  end
  local life, wlife = tonumber(ARGV[2]), tonumber(ARGV[3])
  if not life or life < 1 or not wlife or wlife < 1 then
    return redis.error_reply('rl: malformed arguments')
  end
  read(KEYS)
  -- Every key read and written twice (given back, then granted): kept as
  -- numbers, written once at the end.
  for j = 1, nslots do
    R[7 * j] = true
  end
  shared = true
  local out = { now }
  for i = 1, #KEYS do
    local a = 3 + 5 * (i - 1)
    local key, lim = KEYS[i], line(ARGV[a + 1])
    local want, back = tonumber(ARGV[a + 2]) or 0, tonumber(ARGV[a + 3]) or 0
    local o = 7 * (i - 1) + 2
    out[o], out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5], out[o + 6] = 0, 0, 0, 0, 0, 0, 0
    if key and lim and lim[10] and lim[1] ~= 'sliding_log' and now <= E then
      local j = slot[key]
      if back >= 1 then
        local v1, v2 = tonumber(ARGV[a + 4]), tonumber(ARGV[a + 5])
        if v1 and v2 and refund_line(lim, j, key, back, v1, v2) then
          out[o + 6] = 1
        end
      end
      commit = false
      local ok, _, rem, rst = lim[10](lim, j, key, 0)
      -- (what the line has left if nothing is granted: no grant writes)
      out[o + 4], out[o + 5] = rem, rst
      local g = 0
      if ok then
        g = want
        if rem < g then g = rem end
        if g < 0 then g = 0 end
        g = g - g % 1
      end
      commit = true
      while g >= 1 do
        local ok, adm, rem, rst, _, dly, val, v1, v2, v3 = lim[10](lim, j, key, g)
        if ok and adm and dly == 0 and val then
          put(j, lim, val, v1, v2, v3, sx, rst)
          local ends = now + life
          if lim[1] == 'fixed' or lim[1] == 'sliding' then
            local W = lim[6]
            local k = now / W
            k = k - k % 1
            ends = now + wlife
            if (k + 1) * W < ends then ends = (k + 1) * W end
          end
          out[o], out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5] = g, v1, v2, ends - now, rem, rst
          break
        end
        -- (the remaining at once is exact: only out of range would it not
        -- admit; fewer units then, halved)
        g = g - g % 2
        g = g / 2
      end
    end
  end
  commit = false
  flush_all()
  -- (remembered even when it wrote nothing: a sync is rare, and a copy
  -- then answers as the call did, at its time)
  remember(out, #out, MEMO_MS)
  return out
end

-- The heartbeat (NAME_beat): a node's sync says it is alive. KEYS[1]: the
-- zone's membership set (a sorted set: node names, scored by when their
-- membership lapses, in ms of Redis' clock); ARGV: the node's name (`""`:
-- only count), how long its membership lasts without another beat (ms).
-- Lapsed nodes are dropped. Returns {now (us), the live nodes}.
local function beat(KEYS, ARGV)
  start('')
  local ttl = tonumber(ARGV[2])
  if #KEYS ~= 1 or #ARGV ~= 2 or not ttl or ttl < 1 then
    return redis.error_reply('rl: malformed arguments')
  end
  ttl = ttl - ttl % 1
  local set = KEYS[1]
  redis.call('ZREMRANGEBYSCORE', set, '-inf', '(' .. ms)
  if ARGV[1] ~= '' then
    redis.call('ZADD', set, ms + ttl, ARGV[1])
    redis.call('PEXPIRE', set, 2 * ttl)
  end
  return { now, redis.call('ZCARD', set) }
end
