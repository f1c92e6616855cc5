//! Running the script under mlua against the fake Redis: a Lua 5.1 state
//! with Redis' `struct` library and the fake `redis` global
//! (`fake_redis.lua`), the script loaded as `EVALSHA` or as a Redis 7
//! function library (`load_library.lua`); the fake clock, calls with their
//! replies converted as Redis does, and the store read and written directly.

use std::collections::BTreeMap;

use mlua::{Function, Lua, Table, Value};
use rl_core::limit::Limit;
use rl_core::redis::{
    charge_args, charge_function_name, charge_script, conn_args, conn_function_name, conn_script, function_library,
    function_name, lease_function_name, lease_script, parse_charge_reply, parse_conn_reply, parse_reply, script_args,
    undo_function_name, undo_script, write_memo_key, Call, ChargeReply, HoldOp, LineArg, ScriptReply, LIMIT_SCRIPT,
};
use rl_core::verdict::Outcome;

use crate::struct_lib::struct_lib;

/// The fake Redis: the commands the script may use, with Redis' argument and
/// reply conversions, lazy expiry on `fake.now` (µs), a write counter, and
/// Redis' protection against globals.
const FAKE_REDIS: &str = include_str!("fake_redis.lua");

/// Loads a function library as Redis 7 does: while it loads, no global but
/// `redis.register_function` is in reach; then the registered functions are
/// called with (keys, args), call after call, their upvalues kept.
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
    /// The undo call: the library's function, or its script.
    undo: Function,
    /// The lease call: the library's function, or its script.
    lease: Function,
    /// rl_conn's give-backs and heartbeats (`conn_put`): the library's
    /// function, or its script.
    conn: Function,
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
        let (script, charge, undo, lease, conn) = match mode {
            Mode::Eval => (
                lua.load(LIMIT_SCRIPT).set_name("limit.lua").into_function().unwrap(),
                lua.load(charge_script()).set_name("charge.lua").into_function().unwrap(),
                lua.load(undo_script()).set_name("undo.lua").into_function().unwrap(),
                lua.load(lease_script()).set_name("lease.lua").into_function().unwrap(),
                lua.load(conn_script()).set_name("conn.lua").into_function().unwrap(),
            ),
            Mode::Function => {
                let (name, f, c, u, l, n): (String, Function, Function, Function, Function, Function) =
                    lua.load(LOAD_LIBRARY).set_name("load_library").call(function_library()).unwrap();
                assert_eq!(name, function_name());
                assert_eq!(format!("{name}_charge"), charge_function_name());
                assert_eq!(format!("{name}_undo"), undo_function_name());
                assert_eq!(format!("{name}_lease"), lease_function_name());
                assert_eq!(format!("{name}_conn"), conn_function_name());
                (f, c, u, l, n)
            }
        };
        let fake = lua.globals().raw_get("fake").unwrap();
        Redis { lua, script, charge, undo, lease, conn, mode, fake }
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

    /// [`Redis::snapshot`] but for the key `except` (a memo).
    pub(crate) fn snapshot_except(&self, except: &str) -> String {
        self.fake.get::<Function>("snapshot").unwrap().call(except.to_owned()).unwrap()
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

    /// The undo call's raw reply (see [`Redis::eval`]).
    pub(crate) fn eval_undo(&self, keys: &[String], args: &[String]) -> Vec<i64> {
        integers(self.call_undo_table(keys, args))
    }

    /// The undo call's reply table as the script returns it.
    pub(crate) fn call_undo_table(&self, keys: &[String], args: &[String]) -> Table {
        self.call_table(&self.undo, keys, args)
    }

    /// The lease call's raw reply (see [`Redis::eval`]).
    pub(crate) fn eval_lease(&self, keys: &[String], args: &[String]) -> Vec<i64> {
        integers(self.call_table(&self.lease, keys, args))
    }

    /// `conn_put`'s raw reply (see [`Redis::eval`]).
    pub(crate) fn eval_conn(&self, keys: &[String], args: &[String]) -> Vec<i64> {
        integers(self.call_conn_table(keys, args))
    }

    /// `conn_put`'s reply table as the script returns it (an error reply
    /// too: `err`).
    pub(crate) fn call_conn_table(&self, keys: &[String], args: &[String]) -> Table {
        self.call_table(&self.conn, keys, args)
    }

    /// `worker`'s `conn_put` call at `now` (by Redis `TIME` with
    /// `use_time`): `ops[i]` on `keys[i]`, its fields living `life_ms` when
    /// written. The units it reclaimed from lapsed fields.
    pub(crate) fn conn_put(
        &self,
        keys: &[String],
        ops: &[HoldOp],
        worker: &str,
        life_ms: u64,
        now: u64,
        use_time: bool,
    ) -> u64 {
        assert_eq!(keys.len(), ops.len());
        self.set_now(now);
        let args = conn_args(ops, worker, life_ms, (!use_time).then_some(now));
        let reply = self.eval_conn(keys, &args);
        let (at, reclaimed) = parse_conn_reply(&reply).expect("a well-formed conn_put reply");
        assert_eq!(at, now);
        reclaimed
    }

    /// A hash's fields (field to value), or `None` if the key is missing or
    /// not a hash.
    pub(crate) fn hash(&self, key: &str) -> Option<BTreeMap<String, String>> {
        match self.helper("hash", key) {
            Value::Table(t) => Some(t.pairs::<String, String>().map(Result::unwrap).collect()),
            Value::Boolean(false) => None,
            v => panic!("hash {v:?}"),
        }
    }

    /// What PTTL answers for the key at the fake's now: -2 missing, -1 no
    /// expiry, else the ms left.
    pub(crate) fn pttl(&self, key: &str) -> i64 {
        number(&self.helper("pttl", key)) as i64
    }

    /// `f` (the script, the charge, the undo, the lease or `conn_put`)
    /// called as FCALL or EVALSHA.
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
            ScriptReply::Done { requests, .. } => {
                Some(requests.into_iter().map(|(a, l, ..)| (a, l.to_vec())).collect())
            }
            ScriptReply::Late { .. } => None,
        }
    }
}

/// The memo key of a call on `keys` named `id`.
pub(crate) fn memo_key(keys: &[String], id: (u64, u64)) -> String {
    let mut out = String::new();
    write_memo_key(&mut out, &keys[0], id);
    out
}

/// What a memo key holds: the memo of a call that ran (its reply, and per
/// line charged its index in KEYS, 1-based, and the words v1, v2), the
/// mark of an undone call, or something else.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Memo {
    Ran { reply: Vec<i64>, done: Vec<(usize, u64, u64)> },
    Undone,
    Other(Vec<u8>),
}

/// What the undo call answered (its reply's second integer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Undone {
    /// The call had not run: it never will.
    NotRun = 0,
    /// The call was taken back.
    TakenBack = 1,
    /// Undone already (or its memo is gone).
    Already = 2,
}

impl Redis {
    /// A mode "2" call (a commit that names itself by its memo key) for
    /// several requests at `now` (`keys`: every line's key, request by
    /// request; `memo`: the memo key, sent last): the raw reply.
    pub(crate) fn call_memo<T: Copy + Into<LineArg>>(
        &self,
        keys: &[String],
        requests: &[&[T]],
        now: u64,
        use_time: bool,
        deadline_us: Option<u64>,
        memo: &str,
    ) -> Vec<i64> {
        self.set_now(now);
        let call = Call { commit: true, now_us: (!use_time).then_some(now), deadline_us, memo: true };
        let args = script_args(requests.iter().copied(), call);
        assert_eq!(args[0], "2");
        let mut keys = keys.to_vec();
        keys.push(memo.to_owned());
        self.eval(&keys, &args)
    }

    /// A charge call with a memo key (sent after the lines' keys): the raw
    /// reply.
    pub(crate) fn call_charge_memo(
        &self,
        keys: &[String],
        lines: &[(Limit, u64)],
        now: u64,
        use_time: bool,
        memo: &str,
    ) -> Vec<i64> {
        self.set_now(now);
        let args = charge_args(lines.iter().copied(), (!use_time).then_some(now));
        let mut keys = keys.to_vec();
        keys.push(memo.to_owned());
        self.eval_charge(&keys, &args)
    }

    /// The undo of the call named `memo` on `keys` (the call's keys, in
    /// its order), each line's limit and the cost its request put on it:
    /// the reply's time and what it did.
    pub(crate) fn undo(
        &self,
        keys: &[String],
        lines: &[(Limit, u64)],
        now: u64,
        use_time: bool,
        memo: &str,
    ) -> (u64, Undone) {
        assert_eq!(keys.len(), lines.len());
        self.set_now(now);
        let args = charge_args(lines.iter().copied(), (!use_time).then_some(now));
        let mut keys = keys.to_vec();
        keys.push(memo.to_owned());
        let reply = self.eval_undo(&keys, &args);
        let code = match reply[..] {
            [_, 0] => Undone::NotRun,
            [_, 1] => Undone::TakenBack,
            [_, 2] => Undone::Already,
            _ => panic!("undo reply {reply:?}"),
        };
        (reply[0] as u64, code)
    }

    /// What the memo key holds, if anything.
    pub(crate) fn memo(&self, key: &str) -> Option<Memo> {
        let v: Value = self.fake.get::<Function>("memo").unwrap().call(key.to_owned()).unwrap();
        match v {
            Value::Boolean(false) => None,
            Value::String(s) if &s.as_bytes()[..] == b"u" => Some(Memo::Undone),
            Value::String(s) => Some(Memo::Other(s.as_bytes().to_vec())),
            Value::Table(t) => {
                let xs: Vec<f64> = t.sequence_values::<f64>().map(Result::unwrap).collect();
                assert!(xs.iter().all(|x| x.fract() == 0.0), "non-integral memo {xs:?}");
                let (nout, nd) = (xs[0] as usize, xs[1] as usize);
                assert_eq!(xs.len(), 2 + nout + nd);
                assert_eq!(nd % 3, 0, "done: triples");
                let reply = xs[2..2 + nout].iter().map(|&x| x as i64).collect();
                let done = xs[2 + nout..].chunks(3).map(|c| (c[0] as usize, c[1] as u64, c[2] as u64)).collect();
                Some(Memo::Ran { reply, done })
            }
            v => panic!("memo {v:?}"),
        }
    }
}

/// Requests' outcomes as a call answers them: admitted, and each line's.
pub(crate) type Replies = Vec<(bool, Vec<Outcome>)>;

/// The store as a call found it, for [`Redis::unchanged_since`]: every
/// key but `except` (the call's memo key, or none), and the writes so far.
pub(crate) struct Before {
    pub(crate) snap: String,
    pub(crate) writes: u64,
    pub(crate) except: String,
}

impl Redis {
    pub(crate) fn before(&self, except: &str) -> Before {
        Before { snap: self.snapshot_except(except), writes: self.writes(), except: except.to_owned() }
    }

    /// Asserts that nothing but `b`'s memo key changed since `b`, and
    /// that `extra` writes (the memo's) came since.
    pub(crate) fn unchanged_since(&self, b: &Before, extra: u64, what: &str) {
        assert_eq!(self.writes(), b.writes + extra, "{what}: writes");
        assert_eq!(self.snapshot_except(&b.except), b.snap, "{what}: the store changed");
    }
}

/// A script reply for `requests` parsed: its time, and the requests'
/// outcomes (`None`: late).
pub(crate) fn parse_script_reply<T: Copy + Into<LineArg>>(reply: &[i64], requests: &[&[T]]) -> (u64, Option<Replies>) {
    let shapes: Vec<Vec<bool>> =
        requests.iter().map(|r| r.iter().map(|&l| Into::<LineArg>::into(l).dry_run).collect()).collect();
    let shapes: Vec<&[bool]> = shapes.iter().map(Vec::as_slice).collect();
    let reply = parse_reply(reply, &shapes).expect("well-formed reply");
    match reply {
        ScriptReply::Done { now_us, requests } => {
            (now_us, Some(requests.into_iter().map(|(a, l, ..)| (a, l.to_vec())).collect()))
        }
        ScriptReply::Late { now_us } => (now_us, None),
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

/// Puts a HASH of `fields` (field, value) under `key`, as someone else
/// might have written it; it expires in 10 s.
pub(crate) fn put_hash(r: &Redis, key: &str, fields: &[(&str, &str)]) {
    let code = r#"
        local key, fields = ...
        fake.data[key] = { kind = 'hash', v = fields, exp = fake.now + 10000000 }
    "#;
    let t = r.lua.create_table().unwrap();
    for (f, v) in fields {
        t.set(*f, *v).unwrap();
    }
    r.lua.load(code).call::<()>((key.to_owned(), t)).unwrap();
}
