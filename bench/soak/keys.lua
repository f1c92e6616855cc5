-- wrk script of the million-key soak (bench/soak.sh):
--
--   wrk -tT ... -s keys.lua URL -- MODE NKEYS LIMIT T [MARK]
--
-- Every request carries `X-User: u<i>`, i in 1..NKEYS, formatted per request
-- (a million keys are too many to format in init, as bench/wrk/load.lua does
-- up to 100,000).
--   MODE = fill:   thread t of T sends u<t>, u<t+T>, u<t+2T>, ...: every key
--                  once, so the zone holds every key; then stops.
--   MODE = random: a random key each request, but one request in 100 goes
--                  to one of 10 hot keys (u1..u10, about 400 a minute each
--                  at 7,000 req/s: their limit of 100 a minute rejects most);
--                  each thread stops after LIMIT / T responses (0: only
--                  wrk's -d stops it).
-- A thread that stops creates the file MARK.<thread id>: wrk itself waits for
-- the end of -d unless sent SIGINT, which bench/soak.sh sends once every
-- thread has left its file.
-- Prints the same machine-readable line as load.lua:
--   RESULT requests=.. duration_us=.. p50_us=.. p99_us=.. n200=.. n429=.. n5xx=.. nother=..
--          err_connect=.. err_read=.. err_write=.. err_timeout=..

local threads = {}
local counter = 0

function setup(thread)
   counter = counter + 1
   thread:set("id", counter)
   table.insert(threads, thread)
end

local mode, nkeys, limit, nthreads, mark = "random", 1, 0, 1, nil
local next_key = 0
local rnd = math.random

function init(args)
   mode = args[1] or "random"
   nkeys = tonumber(args[2] or "1") or 1
   nthreads = tonumber(args[4] or "1") or 1
   limit = math.ceil((tonumber(args[3] or "0") or 0) / nthreads)
   mark = args[5]
   math.randomseed(os.time() * 1000 + (id or 0))
   if mode == "fill" then
      -- This thread's keys: id, id + T, id + 2T, ... up to nkeys.
      next_key = id or 1
      local mine = 0
      if next_key <= nkeys then
         mine = math.floor((nkeys - next_key) / nthreads) + 1
      end
      limit = mine
   end
end

function request()
   local k
   if mode == "fill" and next_key <= nkeys then
      k = next_key
      next_key = next_key + nthreads
   else
      -- random mode, or a fill thread whose connections still want a
      -- request after its last key was sent.
      if mode == "random" and rnd(100) == 1 then
         k = rnd(math.min(10, nkeys))
      else
         k = rnd(nkeys)
      end
   end
   return wrk.format(nil, nil, { ["X-User"] = "u" .. k })
end

n200, n429, n5xx, nother = 0, 0, 0, 0
local answered = 0

function response(status, headers, body)
   answered = answered + 1
   if status == 200 then
      n200 = n200 + 1
   elseif status == 429 then
      n429 = n429 + 1
   elseif status >= 500 then
      n5xx = n5xx + 1
   else
      nother = nother + 1
   end
   if limit > 0 and answered == limit then
      if mark then
         local f = io.open(mark .. "." .. (id or 0), "w")
         if f then
            f:close()
         end
      end
      wrk.thread:stop()
   end
end

function done(summary, latency, requests)
   local c = { n200 = 0, n429 = 0, n5xx = 0, nother = 0 }
   for _, t in ipairs(threads) do
      for k, _ in pairs(c) do
         c[k] = c[k] + (t:get(k) or 0)
      end
   end
   local e = summary.errors
   io.write(string.format(
      "RESULT requests=%d duration_us=%d p50_us=%d p99_us=%d n200=%d n429=%d n5xx=%d nother=%d " ..
      "err_connect=%d err_read=%d err_write=%d err_timeout=%d\n",
      summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
      c.n200, c.n429, c.n5xx, c.nother, e.connect, e.read, e.write, e.timeout))
end
