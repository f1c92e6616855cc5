-- The OpenResty-style peer of `make bench`: rate limiting in Lua
-- (lua-nginx-module) with the state in Redis, one EVALSHA per request over
-- a pooled connection (lua-resty-redis, packaged by Debian as
-- `require "nginx.redis"`). This is what users of Redis-backed limits
-- typically run instead of a native module.
--
--   init_by_lua_block   { require("rlpeer").init{ port = 6379 } }
--   access_by_lua_block { require("rlpeer").fixed(limit, window_ms) }
--   access_by_lua_block { require("rlpeer").token_bucket(rate_per_s, burst) }
--   access_by_lua_block { require("rlpeer").conn(max) }
--   log_by_lua_block    { require("rlpeer").conn_leave() }
--
-- The key is $http_x_user when present, else $remote_addr. A rejected
-- request gets 429; a Redis failure gets 500 (the bench counts 5xx as broken).

local redis = require "nginx.redis"

local M = {}

-- Fixed window: INCR, the first hit of a window sets its expiry.
-- KEYS[1] key, ARGV[1] limit, ARGV[2] window (ms). Returns remaining, or -1.
local FIXED = [[
local n = redis.call('INCR', KEYS[1])
if n == 1 then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
local limit = tonumber(ARGV[1])
if n > limit then return -1 end
return limit - n
]]

-- Token bucket: a hash {t = tokens, ts = last refill (ms)}.
-- KEYS[1] key, ARGV[1] rate (tokens/ms), ARGV[2] burst, ARGV[3] now (ms).
-- Returns remaining tokens (floored), or -1.
local TOKEN_BUCKET = [[
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local now = tonumber(ARGV[3])
local s = redis.call('HMGET', KEYS[1], 't', 'ts')
local tokens = tonumber(s[1])
local ts = tonumber(s[2])
if tokens == nil or ts == nil then tokens = burst; ts = now end
if now > ts then tokens = math.min(burst, tokens + (now - ts) * rate) end
local ret = -1
if tokens >= 1 then tokens = tokens - 1; ret = math.floor(tokens) end
redis.call('HSET', KEYS[1], 't', tostring(tokens), 'ts', tostring(now))
redis.call('PEXPIRE', KEYS[1], math.ceil(burst / rate) + 1000)
return ret
]]

local function hex(s)
   return (s:gsub(".", function(c) return string.format("%02x", c:byte()) end))
end

local host, port = "127.0.0.1", 6379
local sha = {}

function M.init(opts)
   port = opts.port or port
   host = opts.host or host
   sha.fixed = hex(ngx.sha1_bin(FIXED))
   sha.token_bucket = hex(ngx.sha1_bin(TOKEN_BUCKET))
   sha.conn = hex(ngx.sha1_bin(CONN_TAKE))
end

local function fail(msg, err)
   ngx.log(ngx.ERR, "rlpeer: ", msg, ": ", err)
   return ngx.exit(500)
end

local function run(name, script, key, ...)
   local red = redis:new()
   red:set_timeout(1000)
   local ok, err = red:connect(host, port)
   if not ok then
      return fail("connect", err)
   end
   local res
   res, err = red:evalsha(sha[name], 1, key, ...)
   if not res and err and err:find("NOSCRIPT", 1, true) then
      res, err = red:eval(script, 1, key, ...)
   end
   if not res then
      return fail("eval " .. name, err)
   end
   red:set_keepalive(60000, 256)
   if res < 0 then
      return ngx.exit(429)
   end
end

local function key(prefix)
   return prefix .. (ngx.var.http_x_user or ngx.var.remote_addr)
end

function M.fixed(limit, window_ms)
   return run("fixed", FIXED, key("rlpeer:fw:"), limit, window_ms)
end

function M.token_bucket(rate_per_s, burst)
   return run("token_bucket", TOKEN_BUCKET, key("rlpeer:tb:"), rate_per_s / 1000, burst,
              string.format("%.3f", ngx.now() * 1000))
end

-- Requests in flight, as APISIX's limit-conn plugin keeps them in Redis:
-- INCR in the access phase (over max: DECR at once, and refused), DECR when
-- the request is logged, from a timer (no cosocket in the log phase). A
-- node that dies leaves its units counted (APISIX #12823).
local CONN_TAKE = [[
local n = redis.call('INCR', KEYS[1])
if n > tonumber(ARGV[1]) then redis.call('DECR', KEYS[1]); return -1 end
return tonumber(ARGV[1]) - n
]]

function M.conn(max)
   local k = key("rlpeer:c:")
   ngx.ctx.rlpeer_conn = k
   return run("conn", CONN_TAKE, k, max)
end

local function leave(premature, k)
   if premature then
      return
   end
   local red = redis:new()
   red:set_timeout(1000)
   local ok, err = red:connect(host, port)
   if not ok then
      ngx.log(ngx.ERR, "rlpeer: connect: ", err)
      return
   end
   red:decr(k)
   red:set_keepalive(60000, 256)
end

function M.conn_leave()
   local k = ngx.ctx.rlpeer_conn
   if k and ngx.status ~= 429 then
      ngx.timer.at(0, leave, k)
   end
end

return M
