//! Running the script under mlua against the fake Redis: a Lua 5.1 state
//! with Redis' `struct` library and the fake `redis` global
//! (`fake_redis.lua`), the script loaded as `EVALSHA` or as a Redis 7
//! function library (`load_library.lua`); the fake clock, calls with their
//! replies converted as Redis does, and the store read and written directly.

use mlua::{Function, Lua, Table, Value};
use rl_core::limit::Limit;
use rl_core::redis::{
    charge_args, charge_function_name, charge_script, function_library, function_name, parse_charge_reply, parse_reply,
    script_args, Call, ChargeReply, LineArg, ScriptReply, LIMIT_SCRIPT,
};
use rl_core::verdict::Outcome;

use crate::struct_lib::struct_lib;

/// The fake Redis: the commands the script may use, with Redis' argument and
/// reply conversions, lazy expiry on `fake.now` (µs), a write counter, and
/// Redis' protection against globals.
const FAKE_REDIS: &str = include_str!("fake_redis.lua");

/// Loads a function library as Redis 7 does: while it loads, no global but
/// `redis.register_function` is in reach; then the registered function is
/// called with (keys, args), call after call, its upvalues kept.
const LOAD_LIBRARY: &str = include_str!("load_library.lua");

/// How the fake Redis runs the script: as `EVALSHA` runs it (a chunk over the
/// globals `KEYS` and `ARGV`, fresh each call), or as Redis 7 runs a function
/// library (`FUNCTION LOAD` once, then `FCALL`).
#[derive(Clone, Copy, PartialEq, Debug)]
pub(crate) enum Mode {
    Eval,
    Function,
}

/// A fake Redis with the script loaded.
pub(crate) struct Redis {
    lua: Lua,
    script: Function,
    /// The charge call: the library's function, or its script.
    charge: Function,
    mode: Mode,
    pub(crate) fake: Table,
}

impl Redis {
    /// The script as a function library, as the module runs it on Redis 7.
    pub(crate) fn new() -> Redis {
        Redis::with(Mode::Function)
    }

    pub(crate) fn with(mode: Mode) -> Redis {
        let lua = Lua::new();
        lua.globals().set("struct", struct_lib(&lua)).unwrap();
        lua.load(FAKE_REDIS).set_name("fake_redis").exec().unwrap();
        let (script, charge) = match mode {
            Mode::Eval => (
                lua.load(LIMIT_SCRIPT).set_name("limit.lua").into_function().unwrap(),
                lua.load(charge_script()).set_name("charge.lua").into_function().unwrap(),
            ),
            Mode::Function => {
                let (name, f, c): (String, Function, Function) =
                    lua.load(LOAD_LIBRARY).set_name("load_library").call(function_library()).unwrap();
                assert_eq!(name, function_name());
                assert_eq!(format!("{name}_charge"), charge_function_name());
                (f, c)
            }
        };
        let fake = lua.globals().raw_get("fake").unwrap();
        Redis { lua, script, charge, mode, fake }
    }

    pub(crate) fn set_now(&self, now_us: u64) {
        self.fake.set("now", now_us as f64).unwrap();
    }

    pub(crate) fn writes(&self) -> u64 {
        self.fake.get::<f64>("writes").unwrap() as u64
    }

    /// How many times the script called `cmd`.
    pub(crate) fn count(&self, cmd: &str) -> u64 {
        let count: Table = self.fake.get("count").unwrap();
        count.get::<Option<f64>>(cmd).unwrap().unwrap_or(0.0) as u64
    }

    pub(crate) fn snapshot(&self) -> String {
        self.fake.get::<Function>("snapshot").unwrap().call(()).unwrap()
    }

    fn helper(&self, name: &str, key: &str) -> Value {
        self.fake.get::<Function>(name).unwrap().call(key.to_owned()).unwrap()
    }

    /// The key's absolute expiry time in µs (every key must have one).
    pub(crate) fn expiry(&self, key: &str) -> Option<u64> {
        match self.helper("expiry", key) {
            Value::Boolean(false) => None,
            v => Some(number(&v) as u64),
        }
    }

    /// The expiry (ms) a string state carries in its value.
    pub(crate) fn stored_expiry(&self, key: &str) -> Option<u64> {
        match self.helper("stored_expiry", key) {
            Value::Boolean(false) => None,
            v => Some(number(&v) as u64),
        }
    }

    /// The key's value: a string state's words (the raw string if the
    /// script did not write it), or a list joined by spaces.
    pub(crate) fn value(&self, key: &str) -> Option<String> {
        match self.helper("value", key) {
            Value::String(s) => Some(s.to_str().unwrap().to_owned()),
            _ => None,
        }
    }

    pub(crate) fn kind(&self, key: &str) -> Option<String> {
        match self.helper("kind", key) {
            Value::String(s) => Some(s.to_str().unwrap().to_owned()),
            _ => None,
        }
    }

    /// EVALSHA: the raw reply, converted as Redis does (numbers must be
    /// integral here; Redis would truncate them).
    pub(crate) fn eval(&self, keys: &[String], args: &[String]) -> Vec<i64> {
        integers(self.eval_table(keys, args))
    }

    /// EVALSHA or FCALL: the reply table as the script returns it.
    pub(crate) fn eval_table(&self, keys: &[String], args: &[String]) -> Table {
        self.call_table(&self.script, keys, args)
    }

    /// The charge call's raw reply (see [`Redis::eval`]).
    pub(crate) fn eval_charge(&self, keys: &[String], args: &[String]) -> Vec<i64> {
        integers(self.call_charge_table(keys, args))
    }

    /// The charge call's reply table as the script returns it.
    pub(crate) fn call_charge_table(&self, keys: &[String], args: &[String]) -> Table {
        self.call_table(&self.charge, keys, args)
    }

    /// `f` (the script or the charge) called as FCALL or EVALSHA.
    fn call_table(&self, f: &Function, keys: &[String], args: &[String]) -> Table {
        let keys = self.lua.create_sequence_from(keys.to_vec()).unwrap();
        let args = self.lua.create_sequence_from(args.to_vec()).unwrap();
        if self.mode == Mode::Function {
            return f.call((keys, args)).unwrap();
        }
        let g = self.lua.globals();
        g.raw_set("KEYS", keys).unwrap();
        g.raw_set("ARGV", args).unwrap();
        f.call(()).unwrap()
    }

    /// One charge call for `lines` (a limit and a cost each, on `keys`) at
    /// `now`, parsed: which lines it charged.
    pub(crate) fn charge(&self, keys: &[String], lines: &[(Limit, u64)], now: u64, use_time: bool) -> Vec<bool> {
        self.set_now(now);
        let args = charge_args(lines.iter().copied(), (!use_time).then_some(now));
        let reply = self.eval_charge(keys, &args);
        let ChargeReply { now_us, charged } = parse_charge_reply(&reply, lines.len()).expect("well-formed reply");
        assert_eq!(now_us, now);
        charged
    }

    /// One script call for `lines` at `now`, parsed.
    pub(crate) fn run<T: Copy + Into<LineArg>>(
        &self,
        keys: &[String],
        lines: &[T],
        now: u64,
        commit: bool,
        use_time: bool,
    ) -> (bool, Vec<Outcome>) {
        let mut out = self.run_batch(keys, &[lines], now, commit, use_time);
        assert_eq!(out.len(), 1);
        out.remove(0)
    }

    /// One script call for several requests at `now` (`keys`: every line's
    /// key, request by request), parsed.
    pub(crate) fn run_batch<T: Copy + Into<LineArg>>(
        &self,
        keys: &[String],
        requests: &[&[T]],
        now: u64,
        commit: bool,
        use_time: bool,
    ) -> Vec<(bool, Vec<Outcome>)> {
        self.run_until(keys, requests, now, commit, use_time, None).expect("no deadline, yet late")
    }

    /// [`Redis::run_batch`] for a call with a deadline: `None` if the script
    /// answered that it ran past it.
    pub(crate) fn run_until<T: Copy + Into<LineArg>>(
        &self,
        keys: &[String],
        requests: &[&[T]],
        now: u64,
        commit: bool,
        use_time: bool,
        deadline_us: Option<u64>,
    ) -> Option<Vec<(bool, Vec<Outcome>)>> {
        self.set_now(now);
        let call = Call { commit, now_us: (!use_time).then_some(now), deadline_us, memo: false };
        let args = script_args(requests.iter().copied(), call);
        let reply = self.eval(keys, &args);
        let shapes: Vec<Vec<bool>> =
            requests.iter().map(|r| r.iter().map(|&l| Into::<LineArg>::into(l).dry_run).collect()).collect();
        let shapes: Vec<&[bool]> = shapes.iter().map(Vec::as_slice).collect();
        let reply = parse_reply(&reply, &shapes).expect("well-formed reply");
        assert_eq!(reply.now_us(), now);
        match reply {
            ScriptReply::Done { requests, .. } => Some(requests.into_iter().map(|(a, l)| (a, l.to_vec())).collect()),
            ScriptReply::Late { .. } => None,
        }
    }
}

/// A reply table as Redis converts it: integers (numbers must be integral
/// here; Redis would truncate them).
fn integers(reply: Table) -> Vec<i64> {
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

fn number(v: &Value) -> f64 {
    match v {
        Value::Integer(i) => *i as f64,
        Value::Number(n) => *n,
        v => panic!("not a number: {v:?}"),
    }
}

/// Puts a raw value under `key`: a string, or with `list` a LIST of the
/// space-separated entries (newest first); it expires in 10 s.
pub(crate) fn put_raw(r: &Redis, key: &str, raw: &str, list: bool) {
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
