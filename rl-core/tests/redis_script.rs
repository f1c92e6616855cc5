//! The Redis Lua script (`rl_core::redis::LIMIT_SCRIPT`) held to the
//! pure-Rust model, run in Lua 5.1 (as embedded in Redis) against a fake
//! `redis` global: an in-memory store whose keys expire on a fake clock.

use std::collections::BTreeMap;

use mlua::{Function, Lua, Table, Value};
use proptest::prelude::*;
use proptest::sample::select;
use rl_core::limit::{Algorithm, Limit, Outcome};
use rl_core::parse::Rate;
use rl_core::redis::{
    exact, expiry_after_write, key_tag, parse_reply, script_args, state_key, tag_of, write_state_key, ScriptLine,
    LIMIT_SCRIPT, MAX_EXACT, TTL_MARGIN_MS, TTL_SLACK_MS,
};
use rl_core::redis::{function_library, function_name};

/// The fake Redis: the commands the script may use, with Redis' argument and
/// reply conversions, lazy expiry on `fake.now` (µs), a write counter, and
/// Redis' protection against globals.
const FAKE_REDIS: &str = r#"
fake = { now = 0, data = {}, writes = 0, calls = 0, expired = 0, count = {} }

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

function commands.SET(key, value, px, ms, extra)
  assert(px == 'PX' and extra == nil, 'the script always sets PX')
  local ms = int_arg(ms)
  if ms <= 0 then error({ err = 'ERR invalid expire time in set' }) end
  fake.data[key] = { kind = 'string', v = value, exp = fake.now + ms * 1000 }
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

function commands.LLEN(key)
  local e = typed(key, 'list')
  return e and #e.v or 0
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

-- The words of a string state (or the raw value if the script did not
-- write it), or a list joined by spaces.
function fake.value(key)
  local e = live(key)
  if not e then return false end
  if e.kind == 'string' then return decode(e.v) or e.v end
  return table.concat(e.v, ' ')
end

-- The expiry (ms) a string state carries, or false.
function fake.stored_expiry(key)
  local e = live(key)
  if not (e and e.kind == 'string') then return false end
  local _, x = decode(e.v)
  return x or false
end

function fake.kind(key)
  local e = live(key)
  return e and e.kind or false
end

function fake.snapshot()
  local keys = {}
  for k, e in pairs(fake.data) do
    if not (e.exp and fake.now >= e.exp) then keys[#keys + 1] = k end
  end
  table.sort(keys)
  local out = {}
  for _, k in ipairs(keys) do
    local e = fake.data[k]
    local v = e.v
    if e.kind == 'list' then
      v = table.concat(v, ',')
    else
      local w, x = decode(v)
      if w then v = w .. '#' .. string.format('%.0f', x) end
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
"#;

/// Loads a function library as Redis 7 does: while it loads, no global but
/// `redis.register_function` is in reach; then the registered function is
/// called with (keys, args), call after call, its upvalues kept.
const LOAD_LIBRARY: &str = r##"
local text = ...
local real = _G
local loading, registered = true, nil
local load_redis = {
  register_function = function(name, f) registered = { name, f } end,
}
local env = setmetatable({}, {
  __index = function(_, k)
    if loading then
      if k == 'redis' then return load_redis end
      error('Script attempted to access nonexistent global variable ' .. tostring(k), 2)
    end
    return real[k]
  end,
  __newindex = function(_, k) error('Attempt to modify a readonly table: ' .. tostring(k), 2) end,
})
-- Redis reads the "#!lua name=..." line itself and compiles the rest.
local name = string.match(text, '^#!lua name=([%w_]+)\n')
assert(name, 'no library name')
local chunk = assert(loadstring(string.sub(text, #name + 13), 'library'))
setfenv(chunk, env)
chunk()
loading = false
assert(registered and registered[1] == name, 'the library registers a function of its own name')
return registered[1], registered[2]
"##;

/// How the fake Redis runs the script: as `EVALSHA` runs it (a chunk over the
/// globals `KEYS` and `ARGV`, fresh each call), or as Redis 7 runs a function
/// library (`FUNCTION LOAD` once, then `FCALL`).
#[derive(Clone, Copy, PartialEq, Debug)]
enum Mode {
    Eval,
    Function,
}

/// A fake Redis with the script loaded.
struct Redis {
    lua: Lua,
    script: Function,
    mode: Mode,
    fake: Table,
}

/// Redis' `struct` library, the formats the script uses: `<` (little
/// endian), `B` (a byte), `d` (a double).
fn struct_lib(lua: &Lua) -> Table {
    fn items(fmt: &[u8]) -> impl Iterator<Item = u8> + '_ {
        assert_eq!(fmt.first(), Some(&b'<'), "struct: little endian only");
        fmt[1..].iter().map(|&c| {
            assert!(c == b'B' || c == b'd', "struct: format {}", c as char);
            c
        })
    }
    let t = lua.create_table().unwrap();
    let pack = lua
        .create_function(|lua, (fmt, args): (mlua::String, mlua::Variadic<f64>)| {
            let mut out = Vec::new();
            let mut args = args.iter();
            for c in items(&fmt.as_bytes()) {
                let x = *args.next().expect("struct.pack: too few arguments");
                match c {
                    b'B' => out.push(x as u8),
                    _ => out.extend_from_slice(&x.to_le_bytes()),
                }
            }
            lua.create_string(&out)
        })
        .unwrap();
    let unpack = lua
        .create_function(|_, (fmt, data, init): (mlua::String, mlua::String, Option<usize>)| {
            let data = data.as_bytes();
            let mut pos = init.unwrap_or(1) - 1;
            let mut out = Vec::new();
            for c in items(&fmt.as_bytes()) {
                let n = if c == b'B' { 1 } else { 8 };
                let b = data.get(pos..pos + n).expect("struct.unpack: data string too short");
                out.push(match c {
                    b'B' => f64::from(b[0]),
                    _ => f64::from_le_bytes(b.try_into().unwrap()),
                });
                pos += n;
            }
            out.push((pos + 1) as f64);
            Ok(mlua::Variadic::from_iter(out))
        })
        .unwrap();
    t.set("pack", pack).unwrap();
    t.set("unpack", unpack).unwrap();
    t
}

impl Redis {
    /// The script as a function library, as the module runs it on Redis 7.
    fn new() -> Redis {
        Redis::with(Mode::Function)
    }

    fn with(mode: Mode) -> Redis {
        let lua = Lua::new();
        lua.globals().set("struct", struct_lib(&lua)).unwrap();
        lua.load(FAKE_REDIS).set_name("fake_redis").exec().unwrap();
        let script = match mode {
            Mode::Eval => lua.load(LIMIT_SCRIPT).set_name("limit.lua").into_function().unwrap(),
            Mode::Function => {
                let (name, f): (String, Function) =
                    lua.load(LOAD_LIBRARY).set_name("load_library").call(function_library()).unwrap();
                assert_eq!(name, function_name());
                f
            }
        };
        let fake = lua.globals().raw_get("fake").unwrap();
        Redis { lua, script, mode, fake }
    }

    fn set_now(&self, now_us: u64) {
        self.fake.set("now", now_us as f64).unwrap();
    }

    fn writes(&self) -> u64 {
        self.fake.get::<f64>("writes").unwrap() as u64
    }

    /// How many times the script called `cmd`.
    fn count(&self, cmd: &str) -> u64 {
        let count: Table = self.fake.get("count").unwrap();
        count.get::<Option<f64>>(cmd).unwrap().unwrap_or(0.0) as u64
    }

    fn snapshot(&self) -> String {
        self.fake.get::<Function>("snapshot").unwrap().call(()).unwrap()
    }

    fn helper(&self, name: &str, key: &str) -> Value {
        self.fake.get::<Function>(name).unwrap().call(key.to_owned()).unwrap()
    }

    /// The key's absolute expiry time in µs (every key must have one).
    fn expiry(&self, key: &str) -> Option<u64> {
        match self.helper("expiry", key) {
            Value::Boolean(false) => None,
            v => Some(number(&v) as u64),
        }
    }

    /// The expiry (ms) a string state carries in its value.
    fn stored_expiry(&self, key: &str) -> Option<u64> {
        match self.helper("stored_expiry", key) {
            Value::Boolean(false) => None,
            v => Some(number(&v) as u64),
        }
    }

    /// The key's value: a string state's words (the raw string if the
    /// script did not write it), or a list joined by spaces.
    fn value(&self, key: &str) -> Option<String> {
        match self.helper("value", key) {
            Value::String(s) => Some(s.to_str().unwrap().to_owned()),
            _ => None,
        }
    }

    fn kind(&self, key: &str) -> Option<String> {
        match self.helper("kind", key) {
            Value::String(s) => Some(s.to_str().unwrap().to_owned()),
            _ => None,
        }
    }

    /// EVALSHA: the raw reply, converted as Redis does (numbers must be
    /// integral here; Redis would truncate them).
    fn eval(&self, keys: &[String], args: &[String]) -> Vec<i64> {
        let reply = self.eval_table(keys, args);
        assert!(reply.raw_get::<Value>("err").unwrap().is_nil(), "error reply");
        reply
            .sequence_values::<Value>()
            .map(|v| {
                let x = number(&v.unwrap());
                assert!(x.fract() == 0.0 && x.abs() < 9.3e18, "non-integral {x}");
                x as i64
            })
            .collect()
    }

    /// EVALSHA or FCALL: the reply table as the script returns it.
    fn eval_table(&self, keys: &[String], args: &[String]) -> Table {
        let keys = self.lua.create_sequence_from(keys.to_vec()).unwrap();
        let args = self.lua.create_sequence_from(args.to_vec()).unwrap();
        if self.mode == Mode::Function {
            return self.script.call((keys, args)).unwrap();
        }
        let g = self.lua.globals();
        g.raw_set("KEYS", keys).unwrap();
        g.raw_set("ARGV", args).unwrap();
        self.script.call(()).unwrap()
    }

    /// One script call for `lines` at `now`, parsed.
    fn run(
        &self,
        keys: &[String],
        lines: &[(Limit, u64)],
        now: u64,
        commit: bool,
        use_time: bool,
    ) -> (bool, Vec<ScriptLine>) {
        let mut out = self.run_batch(keys, &[lines], now, commit, use_time);
        assert_eq!(out.len(), 1);
        out.remove(0)
    }

    /// One script call for several requests at `now` (`keys`: every line's
    /// key, request by request), parsed.
    fn run_batch(
        &self,
        keys: &[String],
        requests: &[&[(Limit, u64)]],
        now: u64,
        commit: bool,
        use_time: bool,
    ) -> Vec<(bool, Vec<ScriptLine>)> {
        self.set_now(now);
        let args = script_args(requests.iter().copied(), commit, (!use_time).then_some(now));
        let reply = self.eval(keys, &args);
        let nlines: Vec<usize> = requests.iter().map(|r| r.len()).collect();
        let (now_ms, out) = parse_reply(&reply, &nlines).expect("well-formed reply");
        assert_eq!(now_ms, now / 1000);
        out.into_iter().map(|(a, l)| (a, l.to_vec())).collect()
    }
}

fn number(v: &Value) -> f64 {
    match v {
        Value::Integer(i) => *i as f64,
        Value::Number(n) => *n,
        v => panic!("not a number: {v:?}"),
    }
}

fn limit(alg: Algorithm, count: u64, period_us: u64, burst: u64) -> Limit {
    Limit::new(alg, Rate { count, period_us }, burst).unwrap()
}

fn keys(n: usize) -> Vec<String> {
    let tag = tag_of(b"client");
    (0..n).map(|i| state_key("rl:", tag, i as u64)).collect()
}

/// The model's answer in the script's terms.
fn line(o: &Outcome) -> ScriptLine {
    ScriptLine { admitted: o.admitted, remaining: o.remaining, reset_us: o.reset_us, retry_after_us: o.retry_after_us }
}

/// The model of one call: check every line; commit all iff all admit.
fn model(lines: &[(Limit, u64)], states: &mut [Vec<u64>], now: u64, commit: bool) -> (bool, Vec<ScriptLine>) {
    let outs: Vec<Outcome> = lines.iter().zip(states.iter()).map(|((l, c), s)| l.check(s, now, *c)).collect();
    let all = outs.iter().all(|o| o.admitted);
    if all && commit {
        for ((l, c), s) in lines.iter().zip(states.iter_mut()) {
            l.commit(s, now, *c);
        }
    }
    (all, outs.iter().map(line).collect())
}

/// The model's state as the script stores it: words, or log entries newest
/// first.
fn stored(l: &Limit, s: &[u64]) -> String {
    let words = match l.algorithm() {
        Algorithm::SlidingLog => {
            let n = s.len() - 2;
            let (head, len) = (s[0] as usize % n, (s[1] as usize).min(n));
            (0..len).rev().map(|i| s[2 + (head + i) % n]).collect()
        }
        _ => s.to_vec(),
    };
    let words: Vec<String> = words.iter().map(u64::to_string).collect();
    words.join(" ")
}

/// Runs both sides for one call and checks outcomes, writes and stored state.
struct Pair {
    redis: Redis,
    keys: Vec<String>,
    states: Vec<Vec<u64>>,
    /// Each string state key's expiry (ms) as the TTL policy predicts it.
    expiries: Vec<u64>,
}

impl Pair {
    fn new(lines: &[(Limit, u64)]) -> Pair {
        Pair {
            redis: Redis::new(),
            keys: keys(lines.len()),
            states: lines.iter().map(|(l, _)| vec![0; l.state_words()]).collect(),
            expiries: vec![0; lines.len()],
        }
    }

    fn step(&mut self, lines: &[(Limit, u64)], now: u64, commit: bool, use_time: bool) -> (bool, Vec<ScriptLine>) {
        self.redis.set_now(now);
        for (key, x) in self.keys.iter().zip(self.expiries.iter_mut()) {
            if self.redis.value(key).is_none() {
                *x = 0; // expired (or never written)
            }
        }
        let (snap, writes) = (self.redis.snapshot(), self.redis.writes());
        let got = self.redis.run(&self.keys, lines, now, commit, use_time);
        let want = model(lines, &mut self.states, now, commit);
        assert_eq!(got, want, "now={now} commit={commit} lines={lines:?}");
        let wrote = commit && want.0 && lines.iter().any(|(_, c)| *c > 0);
        if !wrote {
            assert_eq!(self.redis.writes(), writes, "no write expected");
            assert_eq!(self.redis.snapshot(), snap, "state changed without a write");
        }
        for (i, (l, c)) in lines.iter().enumerate() {
            let key = &self.keys[i];
            let Some(value) = self.redis.value(key) else {
                continue;
            };
            // Stored state is rl-core's, word for word.
            assert_eq!(value, stored(l, &self.states[i]), "state of line {i}");
            let kind = match l.algorithm() {
                Algorithm::SlidingLog => "list",
                _ => "string",
            };
            assert_eq!(self.redis.kind(key).as_deref(), Some(kind));
            // Every key has a TTL: for a log, reset + margin, set when
            // written; for a string state, as expiry_after_write() says,
            // and the value carries it.
            let exp = self.redis.expiry(key).expect("key without TTL");
            if l.algorithm() == Algorithm::SlidingLog {
                if wrote && *c > 0 {
                    let ttl_ms = want.1[i].reset_us.div_ceil(1000) + TTL_MARGIN_MS;
                    assert_eq!(exp, now + ttl_ms * 1000, "TTL of line {i}");
                }
                continue;
            }
            if wrote && *c > 0 {
                let x = &mut self.expiries[i];
                *x = expiry_after_write(*x, now / 1000, want.1[i].reset_us);
            }
            assert_eq!(self.redis.stored_expiry(key), Some(self.expiries[i]), "line {i}");
            assert_eq!(exp / 1000, self.expiries[i], "TTL of line {i}");
        }
        got
    }
}

/// Parameters of the table cases: 2 r/s, burst 3 (W = 1.5 s, T = 0.5 s).
fn case_limit(alg: Algorithm) -> Limit {
    limit(alg, 2, 1_000_000, 3)
}

/// A multiple of W = 1.5 s near 2023.
const T0: u64 = 1_700_000_001_000_000;

#[test]
fn cases_first_exhaust_retry_cost() {
    for alg in Algorithm::ALL {
        let l = case_limit(alg);
        let mut p = Pair::new(&[(l, 1)]);
        let one = |p: &mut Pair, now, cost| p.step(&[(l, cost)], now, true, false).1[0];
        // First request: admitted, burst - 1 left.
        let o = one(&mut p, T0, 1);
        assert!(o.admitted && o.remaining == 2 && o.retry_after_us.is_none(), "{alg}: {o:?}");
        assert!(o.reset_us > 0);
        // Exhaust the burst within the same microsecond.
        assert_eq!(one(&mut p, T0, 1).remaining, 1);
        assert_eq!(one(&mut p, T0, 1).remaining, 0);
        // Rejected, with an exact retry-after.
        let o = one(&mut p, T0 + 10, 1);
        assert!(!o.admitted && o.remaining == 0, "{alg}: {o:?}");
        let d = o.retry_after_us.expect("retry-after");
        let expect = match alg {
            Algorithm::Fixed | Algorithm::SlidingLog => 1_500_000 - 10,
            Algorithm::Sliding => 1_500_000 - 10 + 500_000,
            _ => 500_000 - 10,
        };
        assert_eq!(d, expect, "{alg}");
        // Still rejected one microsecond before, admitted at retry-after.
        assert!(!one(&mut p, T0 + 10 + d - 1, 1).admitted, "{alg}");
        assert!(one(&mut p, T0 + 10 + d, 1).admitted, "{alg}");
        // Cost 0 always passes; cost > burst never (no retry-after).
        assert!(one(&mut p, T0 + 10 + d, 0).admitted);
        let o = one(&mut p, T0 + 10 + d, 4);
        assert!(!o.admitted && o.retry_after_us.is_none(), "{alg}: {o:?}");
    }
}

#[test]
fn cases_cost_above_one() {
    for alg in Algorithm::ALL {
        let l = case_limit(alg);
        let mut p = Pair::new(&[(l, 1)]);
        let one = |p: &mut Pair, now, cost| p.step(&[(l, cost)], now, true, true).1[0];
        let o = one(&mut p, T0, 2);
        assert!(o.admitted && o.remaining == 1, "{alg}: {o:?}");
        let o = one(&mut p, T0 + 1, 2);
        assert!(!o.admitted && o.remaining == 1, "{alg}: {o:?}");
        let d = o.retry_after_us.unwrap();
        assert!(!one(&mut p, T0 + 1 + d - 1, 2).admitted, "{alg}");
        let o = one(&mut p, T0 + 1 + d, 2);
        assert!(o.admitted, "{alg}: {o:?}");
        // A full-burst request on a fresh key.
        let mut p = Pair::new(&[(l, 1)]);
        let o = p.step(&[(l, 3)], T0, true, true).1[0];
        assert!(o.admitted && o.remaining == 0, "{alg}: {o:?}");
    }
}

#[test]
fn cases_fixed_boundary() {
    let l = case_limit(Algorithm::Fixed);
    let mut p = Pair::new(&[(l, 1)]);
    let end = T0 + 1_500_000;
    // Burst at the very end of a window, then again at the start of the next.
    let o = p.step(&[(l, 3)], end - 1, true, false).1[0];
    assert!(o.admitted && o.reset_us == 1);
    let o = p.step(&[(l, 1)], end - 1, true, false).1[0];
    assert_eq!(o.retry_after_us, Some(1));
    let o = p.step(&[(l, 3)], end, true, false).1[0];
    assert!(o.admitted && o.remaining == 0 && o.reset_us == 1_500_000);
}

#[test]
fn cases_sliding_weights_previous_window() {
    let l = case_limit(Algorithm::Sliding);
    let mut p = Pair::new(&[(l, 1)]);
    p.step(&[(l, 3)], T0, true, false);
    // Half-way into the next window the previous one weighs 1.5: one fits.
    let o = p.step(&[(l, 1)], T0 + 2_250_000, true, false).1[0];
    assert!(o.admitted && o.remaining == 0, "{o:?}");
    // The next needs the previous window to weigh 1: at 2/3 of the window.
    let o = p.step(&[(l, 1)], T0 + 2_250_000, true, false).1[0];
    assert!(!o.admitted && o.retry_after_us == Some(250_000), "{o:?}");
}

/// A busy key's TTL is set about once per TTL_SLACK_MS; the writes between
/// keep its expiry (which always covers the state's reset + margin: `step`
/// checks it) and overwrite the value in place.
#[test]
fn busy_key_sets_its_ttl_once_per_slack() {
    use Algorithm::*;
    for alg in [Fixed, Sliding, TokenBucket, LeakyBucket, Gcra] {
        // 1000 r/s, burst 100 (fixed windows of 100 ms), 1 request per
        // 10 ms for 3 s: all admitted.
        let l = limit(alg, 1000, 1_000_000, 100);
        let mut p = Pair::new(&[(l, 1)]);
        for i in 0..300 {
            assert!(p.step(&[(l, 1)], T0 + i * 10_000, true, false).0, "{alg}");
        }
        let (sets, in_place) = (p.redis.count("SET"), p.redis.count("SETRANGE"));
        assert_eq!(sets + in_place, 300, "{alg}");
        assert!((3..=4).contains(&sets), "{alg}: {sets} SET ... PX in 3 s");
    }
}

#[test]
fn expired_key_reads_as_fresh() {
    for alg in Algorithm::ALL {
        let l = case_limit(alg);
        let mut p = Pair::new(&[(l, 1)]);
        let o = p.step(&[(l, 3)], T0, true, false).1[0];
        let key = p.keys[0].clone();
        let exp = p.redis.expiry(&key).unwrap();
        let slack = if alg == Algorithm::SlidingLog { 0 } else { TTL_SLACK_MS * 1000 };
        assert_eq!(exp, T0 + o.reset_us.div_ceil(1000) * 1000 + 1_000_000 + slack);
        p.redis.set_now(exp - 1);
        assert!(p.redis.value(&key).is_some(), "{alg}");
        p.redis.set_now(exp);
        assert!(p.redis.value(&key).is_none(), "{alg}");
        // The model, which never expires, agrees with the emptied store.
        let o = p.step(&[(l, 3)], exp, true, false).1[0];
        assert!(o.admitted && o.remaining == 0, "{alg}: {o:?}");
    }
}

/// Puts a raw value under `key`: a string, or with `list` a LIST of the
/// space-separated entries (newest first); it expires in 10 s.
fn put_raw(r: &Redis, key: &str, raw: &str, list: bool) {
    let code = r#"
        local key, raw, list = ...
        local e = { kind = 'string', v = raw, exp = fake.now + 10000000 }
        if list then
            e.kind, e.v = 'list', {}
            for w in string.gmatch(raw, '%S+') do e.v[#e.v + 1] = w end
        end
        fake.data[key] = e
    "#;
    r.lua.load(code).call::<()>((key.to_owned(), raw.to_owned(), list)).unwrap();
}

/// State the script did not write (another algorithm's words, whitespace,
/// exponents, fractions, junk, missing words, a key of the wrong type) reads
/// as the model's words: each of the first tokens as a number, floored, 0 if
/// it is not a non-negative number, missing words 0; a wrong type is fresh.
/// Then the first write stores the model's state word for word.
#[test]
fn foreign_state_reads_like_the_model() {
    // Plausible words at T0 for each algorithm (W = 1.5 s, T = 0.5 s).
    let k1 = T0 / 1_500_000 + 1;
    for alg in Algorithm::ALL {
        let l = case_limit(alg);
        let words: Vec<u64> = match alg {
            Algorithm::Fixed => vec![k1, 2],
            Algorithm::Sliding => vec![k1, 1, 2],
            Algorithm::TokenBucket | Algorithm::LeakyBucket => vec![1_500_000, T0 - 200_000],
            Algorithm::Gcra => vec![T0 + 700_000],
            Algorithm::SlidingLog => {
                // Only a wrong-type key: a string where a LIST belongs.
                let mut p = Pair::new(&[(l, 1)]);
                p.redis.set_now(T0);
                put_raw(&p.redis, &p.keys[0], "1 2", false);
                let o = p.step(&[(l, 3)], T0, true, false).1[0];
                assert!(o.admitted && o.remaining == 0, "{o:?}");
                continue;
            }
        };
        let n = words.len();
        let joined = |w: &[u64], sep: &str| w.iter().map(u64::to_string).collect::<Vec<_>>().join(sep);
        let with = |i: usize, x: u64| {
            let mut w = words.clone();
            w[i] = x;
            w
        };
        let mut cases: Vec<(String, Vec<u64>, bool)> = vec![
            (joined(&words, " "), words.clone(), false),
            (format!("\t {} \n", joined(&words, " \t\r ")), words.clone(), false),
            (format!("{} 77 x", joined(&words, " ")), words.clone(), false),
            (format!("{}e0", joined(&words, "e0 ")), words.clone(), false),
            (format!("{}.75", joined(&words, ".25 ")), words.clone(), false),
            (
                format!("{}", words[0]),
                with(0, words[0]).iter().take(1).chain(&vec![0; n - 1]).copied().collect(),
                false,
            ),
            (String::new(), vec![0; n], false),
            ("   ".to_owned(), vec![0; n], false),
            (joined(&words, " "), vec![0; n], true),
        ];
        for (i, bad) in ["x", "-5", "nan", "-inf"].iter().enumerate() {
            let mut toks: Vec<String> = words.iter().map(u64::to_string).collect();
            let j = i % n;
            toks[j] = bad.to_string();
            cases.push((toks.join(" "), with(j, 0), false));
        }
        for (raw, state, list) in cases {
            for cost in [1, 3] {
                let r = Redis::new();
                let k = keys(1);
                let now = T0 + 10;
                r.set_now(now);
                put_raw(&r, &k[0], &raw, list);
                let want = l.check(&state, now, cost);
                let what = format!("{alg} {raw:?} list={list} cost={cost}");
                // Check only: the model's outcome, nothing written.
                let (_, out) = r.run(&k, &[(l, cost)], now, false, false);
                assert_eq!(out[0], line(&want), "{what}");
                assert_eq!(r.writes(), 0, "{what}");
                // Commit: the same, and the model's state if admitted.
                let (_, out) = r.run(&k, &[(l, cost)], now, true, false);
                assert_eq!(out[0], line(&want), "{what}");
                if want.admitted {
                    let mut s = state.clone();
                    l.commit(&mut s, now, cost);
                    assert_eq!(r.value(&k[0]), Some(stored(&l, &s)), "{what}");
                    assert_eq!(r.kind(&k[0]).as_deref(), Some("string"), "{what}");
                    let mut ttl_ms = want.reset_us.div_ceil(1000) + TTL_MARGIN_MS;
                    if alg != Algorithm::SlidingLog {
                        ttl_ms += TTL_SLACK_MS; // the raw value carried no expiry
                    }
                    assert_eq!(r.expiry(&k[0]), Some(now + ttl_ms * 1000), "{what}");
                } else {
                    assert_eq!(r.writes(), 0, "{what}");
                }
            }
        }
    }
}

/// Words and TTLs print exactly at the edges of the script's integer
/// formatting: below 10^8, low halves with leading zeros, multiples of 10^8,
/// words of 10^8 and more besides a big first word, and up to 2^53.
#[test]
fn words_print_exactly() {
    use Algorithm::*;
    let e = MAX_EXACT;
    let t = 1_700_000_000_000_000;
    let cases: [(Limit, u64, &[u64]); 12] = [
        (limit(Gcra, 1, 1_000_000, 1), 1, &[5, 99_000_000, t, t + 99_000_000, t + 3, e]),
        // TAT = 2^53 exactly.
        (limit(Gcra, 1, e / 2, 2), 2, &[e]),
        (limit(TokenBucket, 1, 100_000_000, 3), 1, &[5, 99_999_999, t, t + 1, e]),
        (limit(LeakyBucket, 1, 7, 1 << 40), 1 << 38, &[3, t, e]),
        (limit(TokenBucket, 1, 1_000, 3), 1, &[3, t, t + 5, e]),
        (limit(Fixed, 1, 1, 200_000_000), 150_000_000, &[7, t, e]),
        (limit(Fixed, 1, 1_000, 3), 1, &[99_999_999, 100_000_000, t, t + 5, e]),
        (limit(Sliding, 1, 1, 200_000_000), 150_000_000, &[7, t + 1, e]),
        (limit(Sliding, 1, 10, 3), 1, &[99_999_999, t, t + 30, e]),
        // W = 1: the window index is now, its low half 0000000x.
        (limit(Fixed, 1, 1, 1), 1, &[t + 4, e]),
        (limit(Sliding, 1, 1, 1), 1, &[t + 4, e]),
        (limit(SlidingLog, 1, 10, 3), 1, &[5, t, e]),
    ];
    for (l, cost, times) in cases {
        let mut p = Pair::new(&[(l, cost)]);
        for &now in times {
            p.step(&[(l, cost)], now, true, false);
            p.step(&[(l, 1)], now, true, false);
        }
    }
}

#[test]
fn check_only_never_writes() {
    for alg in Algorithm::ALL {
        let l = case_limit(alg);
        let mut p = Pair::new(&[(l, 1)]);
        // On a fresh key: nothing is created.
        let o = p.step(&[(l, 1)], T0, false, false).1[0];
        assert!(o.admitted && p.redis.snapshot().is_empty(), "{alg}");
        assert_eq!(p.redis.writes(), 0);
        p.step(&[(l, 2)], T0, true, false);
        // On an existing key: admitted and rejected checks leave it alone.
        for cost in [1, 2, 3, 0] {
            let before = p.redis.snapshot();
            p.step(&[(l, cost)], T0 + 5, false, false);
            assert_eq!(p.redis.snapshot(), before);
        }
    }
}

#[test]
fn multi_line_all_or_nothing() {
    let a = limit(Algorithm::Gcra, 10, 1_000_000, 5);
    let b = limit(Algorithm::SlidingLog, 1, 1_000_000, 2);
    let c = limit(Algorithm::Fixed, 100, 60_000_000, 100);
    let lines = [(a, 1), (b, 1), (c, 1)];
    let mut p = Pair::new(&lines);
    assert!(p.step(&lines, T0, true, false).0);
    assert!(p.step(&lines, T0, true, false).0);
    // `b` rejects: nothing is charged on `a` or `c` either.
    let (all, out) = p.step(&lines, T0, true, false);
    assert!(!all && out[0].admitted && !out[1].admitted && out[2].admitted);
    assert_eq!(out[0].remaining, 2);
    assert_eq!(out[2].remaining, 97);
    assert_eq!(out[1].retry_after_us, Some(2_000_000));
}

#[test]
fn out_of_range_fails_closed() {
    let k = keys(1);
    let r = Redis::new();
    r.set_now(T0);
    let reject = vec![(T0 / 1000) as i64, 0, 0, -1];
    let bad = [
        "nope 1 1000000 1 1",
        "gcra 0 1000000 1 1",
        "gcra 1 0 1 1",
        "gcra 1 1000000 0 1",
        "gcra 1 1000000 1 -1",
        "gcra 1 1000000 1 1.5",
        "gcra 1 1000000 1 x",
        "gcra 1 1000000 x 1",
        "gcra 1 1000000 1",
        "gcra 1  1000000 1 1",
        "gcra 1 1000000 1 1 1",
        "gcra 1 1000000 9007199254740992 1",
        "gcra 1 1000000 1 9007199254740992",
        "token_bucket 1 4503599627370497 1 1",
    ];
    let args = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    for line in bad {
        assert_eq!(r.eval(&k, &args(&["1", "", line])), reject, "{line:?}");
        assert_eq!(r.eval(&k, &args(&["1", "", "1", line])), reject, "{line:?}");
    }
    // Missing arguments, or a missing key.
    assert_eq!(r.eval(&k, &args(&["1", "", "1"])), reject);
    assert_eq!(r.eval(&[], &args(&["1", "", "gcra 1 1000000 1 1"])), reject);
    // No request: just the time. A malformed line count: an error reply.
    assert_eq!(r.eval(&k, &args(&["1", ""])), [(T0 / 1000) as i64]);
    assert_eq!(r.eval(&k, &args(&["1", "", "0"])), [(T0 / 1000) as i64]);
    // A malformed count, or a run of more requests than there are keys.
    for n in ["1.5", "-1.5", "-2"] {
        let reply = r.eval_table(&k, &args(&["1", "", n, "gcra 1 1000000 1 1"]));
        let err: String = reply.raw_get("err").unwrap();
        assert_eq!(err, "rl: malformed arguments", "{n:?}");
    }
    // A run whose line is not a line: each of its requests fails closed.
    let k3 = keys(3);
    for line in ["nope 1 1000000 1 1", "2", "-1"] {
        let want: Vec<i64> = [(T0 / 1000) as i64].into_iter().chain(reject[1..].repeat(3)).collect();
        assert_eq!(r.eval(&k3, &args(&["1", "", "-3", line])), want, "{line:?}");
    }
    assert_eq!(r.eval(&k3, &args(&["1", "", "-3"])).len(), 1 + 3 * 3);
    assert_eq!(r.eval(&k, &args(&["1", "", "-0"])), [(T0 / 1000) as i64]);
    assert_eq!(r.writes(), 0);
    // Beyond 2^52 µs (year 2112) every line fails closed.
    let l = case_limit(Algorithm::Gcra);
    let (all, out) = r.run(&k, &[(l, 1)], MAX_EXACT + 1, true, false);
    assert!(!all && out[0].retry_after_us.is_none());
    let (all, _) = r.run(&k, &[(l, 1)], MAX_EXACT, true, false);
    assert!(all);
    assert_eq!(r.writes(), 1);
}

#[test]
fn exact_range_boundaries() {
    use Algorithm::*;
    let e = MAX_EXACT;
    let cases = [
        (limit(TokenBucket, 1, e, 1), true),
        (limit(TokenBucket, 1, e + 1, 1), false),
        (limit(LeakyBucket, 7, e / 4, 4), true),
        (limit(LeakyBucket, 7, e / 4 + 1, 4), false),
        (limit(Gcra, 3, 3 * (e / 8), 8), true),
        (limit(Gcra, 3, 3 * (e / 8) + 1, 8), false),
        (limit(Fixed, 2, e, 2), true),
        (limit(Fixed, 2, e + 1, 2), false),
        (limit(SlidingLog, 2, e, 2), true),
        (limit(SlidingLog, 1, e + 1, 1), false),
        (limit(Sliding, 2, e, 1), true),
        (limit(Sliding, 2, e + 1, 1), false),
        (limit(Sliding, 1, e / 2 + 1, 1), false),
        (limit(Gcra, 1 << 53, 1, 1), false),
        (limit(Gcra, (1 << 53) - 1, 1, 1), true),
        // A day's quota of 10,000.
        (limit(Sliding, 10_000, 86_400_000_000, 10_000), true),
        (limit(TokenBucket, 10_000, 86_400_000_000, 10_000), true),
    ];
    for (l, want) in cases {
        assert_eq!(exact(&l), want, "{l:?}");
        // The script agrees: a fresh key admits a lone request iff exact.
        let r = Redis::new();
        let (all, out) = r.run(&keys(1), &[(l, 1)], T0, true, false);
        assert_eq!(all, want, "{l:?}: {out:?}");
    }
}

/// Sliding with the previous window's weight `prev·(W−e)/W` beyond 2^53:
/// plain doubles would round 766.000…001 down to 766 and over-admit.
#[test]
fn sliding_products_beyond_2_53() {
    let (b, p, w) = (1000, 2_251_799_813_685, 2_251_799_813_685_000);
    let l = limit(Algorithm::Sliding, 1, p, b);
    assert_eq!(l.window_us(), w);
    // 997·(W − E) = 766·W + 1.
    let e = 521_730_949_810_667;
    let mut pair = Pair::new(&[(l, 1)]);
    assert!(pair.step(&[(l, 997)], 5, true, false).0);
    let o = pair.step(&[(l, 234)], w + e - 10, true, false).1[0];
    assert_eq!((o.admitted, o.retry_after_us), (false, Some(11)));
    let o = pair.step(&[(l, 234)], w + e, true, false).1[0];
    assert!(!o.admitted && o.remaining == 233, "{o:?}");
    let o = pair.step(&[(l, 234)], w + e + 1, true, false).1[0];
    assert!(o.admitted && o.remaining == 0, "{o:?}");
}

#[test]
fn rust_interface() {
    let tag = key_tag(b"203.0.113.7");
    assert_eq!(tag.len(), 16);
    assert!(tag.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
    assert_eq!(tag, key_tag(b"203.0.113.7"));
    assert_ne!(tag, key_tag(b"203.0.113.8"));
    // Pinned: the tag must not change across builds or hosts.
    assert_eq!(key_tag(b""), "d1fba762150c532c");
    // Keys carry the tag as hex in a Cluster hash tag; writing appends.
    let mut k = String::from("x");
    write_state_key(&mut k, "rl:", tag_of(b"203.0.113.7"), 0x2a);
    assert_eq!(k, format!("xrl:{{{tag}}}:000000000000002a"));
    assert_eq!(state_key("rl:", 0x0123456789abcdef, 0x2a), "rl:{0123456789abcdef}:000000000000002a");
    let l = limit(Algorithm::TokenBucket, 10, 60_000_000, 20);
    let g = limit(Algorithm::Gcra, 1, 1_000_000, 1);
    let (a, b): (&[(Limit, u64)], &[(Limit, u64)]) = (&[(l, 3), (g, 1)], &[(g, 2)]);
    let c: &[(Limit, u64)] = &[];
    assert_eq!(
        script_args([a, b, c, b], true, None),
        [
            "1",
            "",
            "2",
            "token_bucket 10 60000000 20 3",
            "gcra 1 1000000 1 1",
            "gcra 1 1000000 1 2",
            "0",
            "gcra 1 1000000 1 2"
        ]
    );
    assert_eq!(script_args([], false, Some(42)), ["0", "42"]);
    let ok = [5, 2, 3, -2, 0, 9, 4, 7, 8, -2, 0, 1, -1];
    let (ms, reqs) = parse_reply(&ok, &[2, 1, 0, 1]).unwrap();
    assert_eq!(ms, 5);
    assert_eq!(reqs.len(), 4);
    assert!(!reqs[0].0 && reqs[1].0 && reqs[2].0 && !reqs[3].0);
    assert_eq!(reqs[0].1[1], ScriptLine { admitted: false, remaining: 0, reset_us: 9, retry_after_us: Some(4) });
    assert_eq!(reqs[1].1[0], ScriptLine { admitted: true, remaining: 7, reset_us: 8, retry_after_us: None });
    assert_eq!(reqs[3].1[0].retry_after_us, None);
    assert!(parse_reply(&ok, &[2, 1]).is_none()); // left over
    assert!(parse_reply(&ok, &[2, 1, 2]).is_none()); // short
    assert!(parse_reply(&[5, 0, 0, -3], &[1]).is_none());
    assert!(parse_reply(&[5, -1, 0, -2], &[1]).is_none());
    assert!(parse_reply(&[-5, 0, 0, -2], &[1]).is_none());
    assert!(parse_reply(&[], &[]).is_none());
    assert_eq!(parse_reply(&[7], &[]), Some((7, vec![])));
    let (ms, reqs) = parse_reply(&[7], &[0]).unwrap();
    assert!(ms == 7 && reqs.len() == 1 && reqs[0].0 && reqs[0].1.is_empty());
}

/// A batch is the same as its requests one call each, in order, at the same
/// time: a request sees the writes of the requests before it, a rejected
/// request charges none of its lines.
/// A library keeps the lines it parsed from call to call, a bounded few:
/// many distinct lines over many calls answer as `EVALSHA` does.
#[test]
fn function_keeps_few_parsed_lines() {
    let (f, e) = (Redis::with(Mode::Function), Redis::with(Mode::Eval));
    let k = keys(1);
    for i in 0..300u64 {
        let l = limit(Algorithm::Gcra, 1 + i % 150, 1_000_000, 1 + i % 7);
        let now = T0 + i * 1000;
        assert_eq!(
            f.run(&k, &[(l, 1 + i % 3)], now, true, true),
            e.run(&k, &[(l, 1 + i % 3)], now, true, true),
            "call {i}"
        );
    }
    assert_eq!(f.snapshot(), e.snapshot());
    // The library's text: a name of its own, and the script's body.
    let lib = function_library();
    let name = function_name();
    assert!(lib.starts_with(&format!("#!lua name={name}\n")));
    assert!(name.len() == 19 && name.starts_with("rl_"));
    assert!(LIMIT_SCRIPT.ends_with("\nreturn limit(KEYS, ARGV)\n"));
    assert!(!lib.contains("return limit(KEYS, ARGV)"));
}

#[test]
fn runs_of_one_line_requests() {
    let a = limit(Algorithm::Gcra, 10, 1_000_000, 3);
    let b = limit(Algorithm::Fixed, 100, 60_000_000, 4);
    let (sa, sa2, sb) = (spec(&a, 1), spec(&a, 2), spec(&b, 1));
    let one: &[(Limit, u64)] = &[(a, 1)];
    let two: &[(Limit, u64)] = &[(a, 1), (b, 1)];
    let other: &[(Limit, u64)] = &[(a, 2)];
    // Runs of two or more requests of the same one line; the others as before.
    let batch = [one, one, one, two, one, other, other, one];
    let args = script_args(batch.iter().copied(), true, None);
    let want = ["1", "", "-3", &sa, "2", &sa, &sb, &sa, "-2", &sa2, &sa];
    assert_eq!(args, want);
    // A run is evaluated as its requests one by one: the same outcomes and state.
    let k = keys(2);
    let bkeys: Vec<String> = batch.iter().flat_map(|r| k[..r.len()].to_vec()).collect();
    let r = Redis::new();
    let got = r.run_batch(&bkeys, &batch, T0, true, true);
    let s = Redis::new();
    let mut off = 0;
    for (i, req) in batch.iter().enumerate() {
        let n = req.len();
        assert_eq!(s.run(&bkeys[off..off + n], req, T0, true, true), got[i], "request {i}");
        off += n;
    }
    assert_eq!(r.snapshot(), s.snapshot());
    let admitted: Vec<bool> = got.iter().map(|o| o.0).collect();
    assert_eq!(admitted, [true, true, true, false, false, false, false, false]);
}

fn spec(l: &Limit, cost: u64) -> String {
    let mut s = String::new();
    rl_core::redis::write_spec(&mut s, l, cost);
    s
}

#[test]
fn batch_is_requests_in_order() {
    let a = limit(Algorithm::Gcra, 10, 1_000_000, 3);
    let b = limit(Algorithm::SlidingLog, 1, 1_000_000, 2);
    let c = limit(Algorithm::Fixed, 100, 60_000_000, 4);
    let ka = keys(3);
    let (one, two): (&[(Limit, u64)], &[(Limit, u64)]) = (&[(a, 1)], &[(b, 1), (c, 1)]);
    let batch = [one, two, one, two, two, one, one];
    let bkeys: Vec<String> = batch
        .iter()
        .flat_map(|r| if r.len() == 1 { vec![ka[0].clone()] } else { vec![ka[1].clone(), ka[2].clone()] })
        .collect();
    let r = Redis::new();
    let got = r.run_batch(&bkeys, &batch, T0, true, true);
    let admitted: Vec<bool> = got.iter().map(|o| o.0).collect();
    // `a` admits 3; `b` admits 2 (then rejects, so `c` is charged only twice:
    // it would still admit one more).
    assert_eq!(admitted, [true, true, true, true, false, true, false]);
    assert_eq!(got[4].1[1].remaining, 1);
    assert_eq!(got[6].1[0].retry_after_us, Some(100_000));
    // The same, one call per request.
    let s = Redis::new();
    let mut off = 0;
    for (i, req) in batch.iter().enumerate() {
        let k = &bkeys[off..off + req.len()];
        off += req.len();
        assert_eq!(s.run(k, req, T0, true, true), got[i], "request {i}");
    }
    // Same state and TTLs, with each string key written once.
    assert_eq!(r.snapshot(), s.snapshot());
    let log_writes = 2 * 3; // LPUSH, LTRIM, PEXPIRE per admitted request
    assert_eq!(r.writes(), 2 + log_writes);
    assert_eq!(s.writes(), 3 + 2 + log_writes);

    // A key that changes algorithm within a batch (only by hand: keys name
    // their algorithm) reads and writes as if the requests came one by one.
    let g: &[(Limit, u64)] = &[(a, 1)];
    let l: &[(Limit, u64)] = &[(b, 1)];
    let batch = [g, l, g, l, g];
    let k = vec![ka[0].clone(); batch.len()];
    let r = Redis::new();
    let got = r.run_batch(&k, &batch, T0, true, true);
    let s = Redis::new();
    for (i, req) in batch.iter().enumerate() {
        assert_eq!(s.run(&k[..1], req, T0, true, true), got[i], "request {i}");
    }
    assert_eq!(r.snapshot(), s.snapshot());
}

/// A raw step: (selector, fraction, cost selector).
type Raw = (u8, u16, u8);

/// `w · permille / 1000`.
fn frac(w: u64, permille: u16) -> u64 {
    (u128::from(w) * u128::from(permille) / 1000) as u64
}

/// Replays `ops` on `lines` (costs chosen per line from each raw cost
/// selector) from `start`, comparing the script to the model at every step.
/// Stops before the clock would pass [`MAX_EXACT`]. With `jitter`, a quarter
/// of the requests see the clock stepped back by less than the TTL margin
/// (so expiry still never changes a decision).
fn replay(limits: &[Limit], ops: &[(Raw, Vec<u8>)], start: u64, jitter: bool) {
    let w = limits.iter().map(Limit::window_us).max().unwrap();
    let mut lines: Vec<(Limit, u64)> = limits.iter().map(|l| (*l, 1)).collect();
    let mut p = Pair::new(&lines);
    let (mut t, mut prev) = (start, ScriptLine::default());
    for ((sel, f, flags), costs) in ops {
        let (sel, f) = (*sel, *f);
        t = t.saturating_add(match sel % 10 {
            0 | 1 => 0,
            2 => 1 + u64::from(f % 3),
            3 => prev.retry_after_us.unwrap_or(0),
            4 => prev.retry_after_us.unwrap_or(1) - 1,
            5 => prev.reset_us,
            // Around the key's expiry: reset + margin + up to 1 ms rounding.
            6 => prev.reset_us + TTL_MARGIN_MS * 1000 + u64::from(f % 1002) - 1,
            7 | 8 => frac(w, f % 1500),
            _ => frac(w, f % 4000),
        });
        if t > MAX_EXACT {
            break;
        }
        for ((l, cost), c) in lines.iter_mut().zip(costs) {
            let b = l.burst();
            *cost = match c % 10 {
                0 => 0,
                7 => 1 + u64::from(f) % b,
                8 => b,
                9 => b + 1,
                _ => 1,
            };
        }
        let now = match jitter && flags & 6 == 0 {
            true => t.saturating_sub(frac(w, f % 2000).min(TTL_MARGIN_MS * 1000 - 1)),
            false => t,
        };
        let commit = sel >> 5 != 7;
        let (_, out) = p.step(&lines, now, commit, flags & 1 == 1);
        // Drive the clock by the first line that rejected, else the first.
        prev = out.iter().copied().find(|o| !o.admitted).unwrap_or(out[0]);
    }
}

fn algorithm() -> impl Strategy<Value = Algorithm> {
    select(Algorithm::ALL.to_vec())
}

/// Small, realistic limits (every one in the exact range).
fn small_limit() -> impl Strategy<Value = Limit> {
    (
        algorithm(),
        1u64..=20,
        prop_oneof![select(vec![1, 1_000, 1_000_000, 60_000_000, 3_600_000_000, 86_400_000_000]), 1u64..=10_000_000],
        1u64..=12,
    )
        .prop_map(|(a, c, p, b)| limit(a, c, p, b))
}

/// Log-uniform in `[1, 2^bits)`.
fn magnitude(bits: u32) -> impl Strategy<Value = u64> {
    (0..bits, any::<u64>()).prop_map(|(k, x)| (x >> (63 - k)).max(1))
}

/// Large limits near the edges of the exact range.
fn big_limit() -> impl Strategy<Value = Limit> {
    (algorithm(), magnitude(30), magnitude(53), magnitude(40)).prop_filter_map(
        "outside the exact range",
        |(a, c, p, b)| {
            let b = if a == Algorithm::SlidingLog { b % 64 + 1 } else { b };
            let l = Limit::new(a, Rate { count: c, period_us: p }, b).ok()?;
            exact(&l).then_some(l)
        },
    )
}

fn ops(lines: usize, n: usize) -> impl Strategy<Value = Vec<(Raw, Vec<u8>)>> {
    prop::collection::vec((any::<Raw>(), prop::collection::vec(any::<u8>(), lines)), 1..n)
}

/// A start time: near zero, realistic, or anywhere below 2^52.
fn start() -> impl Strategy<Value = u64> {
    prop_oneof![0u64..10_000_000, Just(T0), 0..MAX_EXACT]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(160))]

    /// One line of any algorithm: the script equals `Limit::acquire` (and
    /// `check` in mode 0) step by step, over an expiring store, also when
    /// the clock steps back a little.
    #[test]
    fn prop_single_line(
        l in small_limit(),
        ops in ops(1, 48),
        t in start(),
        jitter in any::<bool>(),
    ) {
        replay(&[l], &ops, t, jitter);
    }

    /// Large parameters and times: exact to the microsecond.
    #[test]
    fn prop_single_line_big(l in big_limit(), ops in ops(1, 24), t in start()) {
        replay(&[l], &ops, t, false);
    }

    /// Two or three lines: all checked, committed iff all admit.
    #[test]
    fn prop_multi_line(
        ls in prop::collection::vec(small_limit(), 2..=3),
        ops in ops(3, 40),
        t in start(),
        jitter in any::<bool>(),
    ) {
        replay(&ls, &ops, t, jitter);
    }

    /// The function library (`FCALL`) and the script (`EVALSHA`) answer
    /// alike and leave the same keys, call after call.
    #[test]
    fn prop_function_equals_eval(
        ls in prop::collection::vec(small_limit(), 3),
        calls in prop::collection::vec(
            (0u16..1500, prop::collection::vec((1u8..8, 0u8..4), 1..10)),
            1..10,
        ),
        t in start(),
    ) {
        let w = ls.iter().map(Limit::window_us).max().unwrap();
        let ks = keys(3);
        let (f, e) = (Redis::with(Mode::Function), Redis::with(Mode::Eval));
        let mut now = t;
        for (step, reqs) in &calls {
            now += frac(w, *step);
            prop_assume!(now <= MAX_EXACT);
            let requests: Vec<Vec<(Limit, u64)>> = reqs
                .iter()
                .map(|(mask, cost)| (0..3).filter(|i| mask & (1 << i) != 0).map(|i| (ls[i], u64::from(*cost))).collect())
                .collect();
            let bkeys: Vec<String> = reqs
                .iter()
                .flat_map(|(mask, _)| (0..3).filter(move |i| mask & (1 << i) != 0))
                .map(|i| ks[i].clone())
                .collect();
            let slices: Vec<&[(Limit, u64)]> = requests.iter().map(Vec::as_slice).collect();
            let use_time = step % 2 == 0;
            prop_assert_eq!(f.run_batch(&bkeys, &slices, now, true, use_time), e.run_batch(&bkeys, &slices, now, true, use_time));
            prop_assert_eq!(f.snapshot(), e.snapshot());
        }
    }

    /// Batches of requests, each on some of three shared lines: every batch
    /// equals the model run request by request at the batch's time.
    #[test]
    fn prop_batch(
        ls in prop::collection::vec(small_limit(), 3),
        batches in prop::collection::vec(
            (any::<u16>(), prop::collection::vec((1u8..8, prop::collection::vec(any::<u8>(), 3)), 1..12)),
            1..8,
        ),
        t in start(),
    ) {
        let w = ls.iter().map(Limit::window_us).max().unwrap();
        let ks = keys(3);
        let r = Redis::new();
        let mut states: Vec<Vec<u64>> = ls.iter().map(|l| vec![0; l.state_words()]).collect();
        let mut now = t;
        for (f, reqs) in &batches {
            now += frac(w, f % 1500);
            prop_assume!(now <= MAX_EXACT);
            let mut requests: Vec<Vec<(Limit, u64)>> = Vec::new();
            let mut which: Vec<Vec<usize>> = Vec::new();
            for (mask, costs) in reqs {
                let idx: Vec<usize> = (0..3).filter(|i| mask & (1 << i) != 0).collect();
                let lines = idx
                    .iter()
                    .map(|&i| {
                        let b = ls[i].burst();
                        let cost = match costs[i] % 8 { 0 => 0, 6 => b, 7 => b + 1, _ => 1 };
                        (ls[i], cost)
                    })
                    .collect();
                requests.push(lines);
                which.push(idx);
            }
            let bkeys: Vec<String> = which.iter().flatten().map(|&i| ks[i].clone()).collect();
            let slices: Vec<&[(Limit, u64)]> = requests.iter().map(Vec::as_slice).collect();
            let got = r.run_batch(&bkeys, &slices, now, true, false);
            for (j, (lines, idx)) in requests.iter().zip(&which).enumerate() {
                let mut sub: Vec<Vec<u64>> = idx.iter().map(|&i| states[i].clone()).collect();
                let want = model(lines, &mut sub, now, true);
                for (&i, st) in idx.iter().zip(sub) {
                    states[i] = st;
                }
                prop_assert_eq!(&got[j], &want, "batch request {}", j);
            }
            for i in 0..3 {
                if let Some(v) = r.value(&ks[i]) {
                    prop_assert_eq!(v, stored(&ls[i], &states[i]), "state of line {}", i);
                }
            }
        }
    }

    /// Runs of one-line requests (one limit, several clients): the usual
    /// batch in production, where each client has its own key and some
    /// come twice. A run answers and writes as its requests would one call
    /// each, batch after batch, TTLs included (`prop_batch` gives each limit
    /// one key, so its runs never span several keys).
    #[test]
    fn prop_runs_over_many_keys(
        l in small_limit(),
        cost_sel in 0u8..8,
        batches in prop::collection::vec((any::<u16>(), prop::collection::vec(0usize..6, 1..16)), 1..6),
        t in start(),
    ) {
        let b = l.burst();
        let cost = match cost_sel { 0 => 0, 6 => b, 7 => b + 1, _ => 1 };
        let one: &[(Limit, u64)] = &[(l, cost)];
        let ks = keys(6);
        let (r, s) = (Redis::new(), Redis::new());
        let mut now = t;
        for (f, picks) in &batches {
            now += frac(l.window_us(), f % 1500);
            prop_assume!(now <= MAX_EXACT);
            let batch = vec![one; picks.len()];
            let bkeys: Vec<String> = picks.iter().map(|&i| ks[i].clone()).collect();
            let got = r.run_batch(&bkeys, &batch, now, true, false);
            for (j, &i) in picks.iter().enumerate() {
                prop_assert_eq!(&s.run(&ks[i..=i], one, now, true, false), &got[j], "request {}", j);
            }
            prop_assert_eq!(r.snapshot(), s.snapshot());
        }
    }

    /// Any parameters: the script is exact iff `exact` says so, else it
    /// rejects (fail closed).
    #[test]
    fn prop_exact_iff_in_range(
        a in algorithm(),
        c in magnitude(60),
        p in magnitude(60),
        b in magnitude(60),
    ) {
        let b = if a == Algorithm::SlidingLog { b % 65_536 + 1 } else { b };
        let Ok(l) = Limit::new(a, Rate { count: c, period_us: p }, b) else {
            return Ok(());
        };
        let r = Redis::new();
        let lines = [(l, 1)];
        let (_, out) = r.run(&keys(1), &lines, T0, true, false);
        if exact(&l) {
            let mut s = vec![vec![0; l.state_words()]];
            prop_assert_eq!(out, model(&lines, &mut s, T0, true).1);
        } else {
            prop_assert_eq!(out[0], ScriptLine::default());
            prop_assert_eq!(r.writes(), 0);
        }
    }
}

/// Sanity: the replay reaches every kind of outcome often enough to mean
/// something (rejections with and without retry, expiries).
#[test]
fn replay_coverage() {
    let mut seen = BTreeMap::new();
    let mut expired = 0;
    for alg in Algorithm::ALL {
        let l = case_limit(alg);
        let mut p = Pair::new(&[(l, 1)]);
        let mut t = T0;
        for i in 0..60u64 {
            let cost = [1, 1, 2, 0, 4][(i % 5) as usize];
            let o = p.step(&[(l, cost)], t, true, i % 2 == 0).1[0];
            let kind = match (o.admitted, o.retry_after_us) {
                (true, _) => "admit",
                (false, Some(_)) => "retry",
                (false, None) => "never",
            };
            *seen.entry(kind).or_insert(0) += 1;
            t += match i % 7 {
                0 => o.retry_after_us.unwrap_or(0),
                3 => o.reset_us + 1_001_000,
                _ => 100_000,
            };
        }
        expired += p.redis.fake.get::<u64>("expired").unwrap();
    }
    assert!(seen.values().all(|n| *n > 10) && seen.len() == 3, "{seen:?}");
    assert!(expired >= 6, "{expired}");
}
