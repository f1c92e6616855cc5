
-- The give-backs and heartbeats of rl_conn lines (the library's NAME_conn;
-- see `concurrent` above for a key's fields). One call carries a worker's
-- changes to any number of its keys:
-- KEYS     the state keys.
-- ARGV[1]  now in microseconds; "" or "0" = Redis TIME.
-- ARGV[2]  the worker (its field in every key), ARGV[3] its fields' life
--          (ms).
-- Then per key, in order, "op units gen":
--   "d": a give-back of units (requests that ended), sent in generation
--        gen: applied unless the field is of a later generation (the
--        heartbeat of that generation counted them given back already);
--        a newer generation than the field's is taken on, its set flag
--        cleared;
--   "c": a correction: units that the heartbeat of generation gen counted
--        as held for takes then in flight, that did not hold (refused, or
--        answered per on_error): given back only if that heartbeat set the
--        field (its gen and set flag);
--   "s": the heartbeat of generation gen: the field set to units (0: the
--        field deleted) if its generation is older; else only renewed (a
--        give-back or take of that generation came first, and counts);
--   "q": "q ticket 0", a request gives up its place in the key's waiting
--        line (its field neither written nor renewed).
-- Every op the field takes renews it (the worker lives); what is not the
-- worker's own is never written but for lapsed fields, which go (and what
-- they held is counted reclaimed). Not named: a copy sent again could give
-- back twice, so nginx sends it once; what a lost one leaves is set right
-- by the worker's next heartbeat. Returns {now, units reclaimed}.
local function conn_put(KEYS, ARGV)
  start(ARGV[1])
  local me, life = ARGV[2], tonumber(ARGV[3])
  if not (me and me ~= '' and life and life >= 1 and life < E and #ARGV == #KEYS + 3) then
    return redis.error_reply('rl: malformed arguments')
  end
  local ops = {}
  for k = 1, #KEYS do
    local op, n, g = string.match(ARGV[k + 3], '^([dcsq]) (%d+) (%d+)$')
    n, g = tonumber(n), tonumber(g)
    if not (op and n and g and n < E and g < E) then
      return redis.error_reply('rl: malformed arguments')
    end
    ops[k] = { op, n, g }
  end
  local reclaimed = 0
  for k = 1, #KEYS do
    local key, op, n, g = KEYS[k], ops[k][1], ops[k][2], ops[k][3]
    local _, mine, mg, mset, lapsed, freed, wrongtype = holders(key, me)
    if not wrongtype then
      if lapsed then
        redis.call('HDEL', key, unpack(lapsed))
        reclaimed = reclaimed + freed
      end
      -- The field's new count, generation and set flag (nil: unchanged).
      local count, gen, set = nil, mg, mset
      if op == 'q' then
        redis.call('HDEL', key, '#' .. n)
      elseif op == 's' then
        if mg < g then
          count, gen, set = n, g, '1'
        elseif mg >= 0 then
          count = mine
        end
      elseif mg >= 0 then
        if op == 'd' and mg <= g then
          count = mine - n
          if mg < g then gen, set = g, '0' end
        elseif op == 'c' and mg == g and mset == '1' then
          count = mine - n
        else
          count = mine
        end
      end
      if count then
        if count <= 0 then
          redis.call('HDEL', key, me)
        else
          redis.call('HSET', key, me, holding(count, gen, life, set))
          hold_key(key, life)
        end
      end
    end
  end
  return { now, reclaimed }
end
