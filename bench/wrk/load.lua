-- wrk script for every throughput scenario of `make bench` (bench/run.sh).
--
--   wrk ... -s load.lua URL -- NKEYS [count]
--
-- NKEYS = 0: the same request every time (one key: the client address).
-- NKEYS = zN: the same, with keys drawn by Zipf's law (s = 1).
-- NKEYS = N: each request carries `X-User: u<random 1..N>`; up to 100,000
-- keys the N requests are formatted once, in init, so that the client does
-- about the same work per request as with one key (a request formatted in
-- Lua each time costs wrk, which shares CPU 1 with Redis, a few µs more).
-- The script is the same for every scenario so that the client does the
-- same work everywhere. It prints one machine-readable line at the end,
-- read by run.sh:
--   RESULT requests=.. duration_us=.. p50_us=.. p99_us=.. n200=.. n429=.. n5xx=.. nother=..
--          err_connect=.. err_read=.. err_write=.. err_timeout=.. err_status=..
-- err_status is wrk's own count of responses with a status of 400 or above.
-- With `count`, the script also counts each status (n200 ... nother);
-- without it those are -1. Counting needs wrk's `response` callback, for
-- which wrk copies every response's header fields and body into a Lua
-- table: work that grows with the fields a response carries, so a server
-- sending more fields would look slower for what its client does. wrk
-- skips that copy when `response` is nil after init (wrk's SCRIPTING).

local threads = {}
local counter = 0

function setup(thread)
   counter = counter + 1
   thread:set("id", counter)
   table.insert(threads, thread)
end

local fixed_req
local reqs
local nkeys = 0
local rnd = math.random

local function keyed(i)
   return wrk.format(nil, nil, { ["X-User"] = "u" .. i })
end

-- Zipf (s = 1) draws of keys 1..n, enough that cycling through them at
-- random costs the client what a uniform key does.
local zipf
local ZIPF_DRAWS = 100000

local function zipf_draws(n)
   local cdf, sum = {}, 0
   for i = 1, n do
      sum = sum + 1 / i
      cdf[i] = sum
   end
   local draws = {}
   for d = 1, ZIPF_DRAWS do
      local u, lo, hi = math.random() * sum, 1, n
      while lo < hi do
         local mid = math.floor((lo + hi) / 2)
         if cdf[mid] < u then lo = mid + 1 else hi = mid end
      end
      draws[d] = lo
   end
   return draws
end

function init(args)
   local spec = args[1] or "0"
   -- `zN`: N keys drawn by Zipf's law (key i about 1/i as often as key 1).
   if spec:sub(1, 1) == "z" then
      nkeys = tonumber(spec:sub(2)) or 0
      math.randomseed(os.time() * 1000 + (id or 0))
      zipf = zipf_draws(nkeys)
   else
      nkeys = tonumber(spec) or 0
   end
   counted = (args[2] == "count") and 1 or 0
   if counted == 0 then
      response = nil
   end
   math.randomseed(os.time() * 1000 + (id or 0))
   if nkeys <= 0 then
      fixed_req = wrk.format()
   elseif nkeys <= 100000 then
      reqs = {}
      for i = 1, nkeys do
         reqs[i] = keyed(i)
      end
   end
end

function request()
   if fixed_req then
      return fixed_req
   elseif zipf then
      return reqs[zipf[rnd(ZIPF_DRAWS)]]
   elseif reqs then
      return reqs[rnd(nkeys)]
   end
   return keyed(rnd(nkeys))
end

n200, n429, n5xx, nother = 0, 0, 0, 0

function response(status, headers, body)
   if status == 200 then
      n200 = n200 + 1
   elseif status == 429 then
      n429 = n429 + 1
   elseif status >= 500 then
      n5xx = n5xx + 1
   else
      nother = nother + 1
   end
end

function done(summary, latency, requests)
   local c = { n200 = 0, n429 = 0, n5xx = 0, nother = 0 }
   for _, t in ipairs(threads) do
      for k, _ in pairs(c) do
         c[k] = c[k] + (t:get(k) or 0)
      end
   end
   if threads[1] and threads[1]:get("counted") ~= 1 then
      c = { n200 = -1, n429 = -1, n5xx = -1, nother = -1 }
   end
   local e = summary.errors
   io.write(string.format(
      "RESULT requests=%d duration_us=%d p50_us=%d p99_us=%d n200=%d n429=%d n5xx=%d nother=%d " ..
      "err_connect=%d err_read=%d err_write=%d err_timeout=%d err_status=%d\n",
      summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
      c.n200, c.n429, c.n5xx, c.nother, e.connect, e.read, e.write, e.timeout, e.status))
end
