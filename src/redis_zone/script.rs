//! The limit script on the wire: its arguments and keys, `FCALL` of the
//! library (Redis 7+) or `EVALSHA`/`EVAL`, and the reply.

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use redis::aio::ConnectionLike;
use redis::{Cmd, Script, Value};
use rl_core::redis::{
    beat_function_name, beat_script, charge_function_name, charge_script, check_line, conn_function_name, conn_script,
    function_library, function_name, lease_function_name, lease_script, parse_beat_reply, parse_charge_reply,
    parse_conn_reply, parse_lease_reply, parse_reply, undo_function_name, undo_script, write_args, write_charge_args,
    write_conn_args, write_lease_args, write_memo_key, write_state_key, Arg, Call, HoldOp, LeaseArg, LeaseGrant,
    LineArg, Lives, RequestReply, ScriptReply, LIMIT_SCRIPT, REPLY_PER_LINE,
};

use super::clock::Clock;
use super::conn::{broken, Conn};
use super::{JobLine, JobShape, LeaseKey, RedisError};

/// The name of a call that changes state: the script keeps what the call
/// did under it (its memo), so that a copy sent again after a lost reply
/// answers what the first did rather than applying twice, and an undo can
/// take the call back. Unique to the call whatever nginx sent it: a
/// worker's random number, then its count of calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallId(u64, u64);

impl CallId {
    /// `n` names in a row, the first returned ([`CallId::nth`] the others).
    pub fn reserve(n: usize) -> CallId {
        static WORKER: AtomicU64 = AtomicU64::new(0);
        static CALLS: AtomicU64 = AtomicU64::new(0);
        let mut worker = WORKER.load(Ordering::Relaxed);
        if worker == 0 {
            // Drawn in the worker (not in the master, before the fork that
            // would give every worker the same one): std's random keys, the
            // process and the time.
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u32(std::process::id());
            h.write_u128(
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos(),
            );
            worker = h.finish() | 1;
            WORKER.store(worker, Ordering::Relaxed);
        }
        CallId(worker, CALLS.fetch_add(n as u64, Ordering::Relaxed))
    }

    /// The i-th of the names reserved with this one.
    pub fn nth(self, i: usize) -> CallId {
        CallId(self.0, self.1.wrapping_add(i as u64))
    }
}

/// Adds to `cmd` the memo key of a call whose first state key is `first`.
fn memo_arg(cmd: &mut Cmd, first: &str, id: CallId) {
    let mut key = String::with_capacity(first.len() + 40);
    write_memo_key(&mut key, first, (id.0, id.1));
    cmd.arg(key.as_str());
}

/// One script call for `requests` (each a request's lines) on keys under
/// `prefix` (see [`invoke`] for how), with the deadline `via.until`: a
/// call Redis runs later does nothing and fails as [`RedisError::Late`].
/// The first call after the zone (re)connected asks Redis `TIME` first,
/// so that it has a deadline too.
/// A reply the script cannot have sent for these lines (not an array of
/// integers, the wrong length, a value out of the line's range: see
/// [`check_line`]) is [`RedisError::Malformed`].
pub async fn call(
    mut conn: Conn,
    via: Via<'_>,
    prefix: &str,
    requests: &[&[JobLine]],
    commit: bool,
    memo: Option<CallId>,
) -> Result<Vec<RequestReply>, RedisError> {
    let memo = memo.filter(|_| commit);
    if !via.clock.known() {
        via.clock.sync(&conn).await;
    }
    let deadline_us = via.clock.deadline(via.until);
    let command = |how: How| {
        let mut cmd = match how {
            How::Fcall => redis::cmd("FCALL").arg(&via.code.function).to_owned(),
            How::Evalsha => redis::cmd("EVALSHA").arg(via.code.script.get_hash()).to_owned(),
            How::Eval => redis::cmd("EVAL").arg(LIMIT_SCRIPT).to_owned(),
        };
        let lines = requests.iter().map(|r| r.len()).sum::<usize>();
        cmd.arg(lines + usize::from(memo.is_some()));
        let mut key = String::new();
        let mut first = None;
        for line in requests.iter().flat_map(|r| r.iter()) {
            key.clear();
            write_state_key(&mut key, prefix, line.tag, line.line_id);
            cmd.arg(key.as_str());
            if first.is_none() {
                first = Some(key.clone());
            }
        }
        if let (Some(id), Some(first)) = (memo, &first) {
            memo_arg(&mut cmd, first, id);
        }
        let lines = requests.iter().map(|r| {
            r.iter().map(|l| LineArg {
                limit: l.limit,
                cost: l.cost,
                dry_run: l.dry_run,
                check_only: l.check_only,
                next: l.next,
                lease_life: l.lease_life,
                kept: l.kept,
                holder: l.holder,
                wait: l.wait,
                classes: l.classes,
            })
        });
        write_args(lines, Call { commit, now_us: None, deadline_us, memo: memo.is_some() }, |a| push_arg(&mut cmd, a));
        cmd
    };
    let sent = Instant::now();
    let reply = integers(invoke(&mut conn, via, command).await?)?;
    let received = Instant::now();
    let shapes: Vec<JobShape> = requests.iter().map(|r| JobShape(r)).collect();
    let Some(reply) = parse_reply(&reply, &shapes) else {
        let lines: usize = requests.iter().map(|r| r.len()).sum();
        let want = 1 + REPLY_PER_LINE * lines;
        return Err(RedisError::Malformed(format!("{} integers for {lines} lines, not {want}", reply.len())));
    };
    via.clock.learn(sent, received, reply.now_us());
    let replies = match reply {
        ScriptReply::Done { requests, .. } => requests,
        ScriptReply::Late { .. } => return Err(RedisError::Late),
    };
    for (lines, (_, outcomes, ..)) in requests.iter().zip(&replies) {
        for (line, outcome) in lines.iter().filter(|l| l.lease_life == 0).zip(outcomes) {
            // (a line of classes is checked for cost + kept: its wait is that of the wider request)
            check_line(&line.limit, line.cost.saturating_add(line.kept), outcome, line.deepest_queue)
                .map_err(|e| RedisError::Malformed(e.to_string()))?;
        }
    }
    Ok(replies)
}
/// The script's reply as its integers.
fn integers(reply: Value) -> Result<Vec<i64>, RedisError> {
    let malformed = |what: &Value| RedisError::Malformed(format!("{} where integers were expected", kind(what)));
    match reply {
        Value::Array(items) => items
            .into_iter()
            .map(|v| match v {
                Value::Int(i) => Ok(i),
                other => Err(malformed(&other)),
            })
            .collect(),
        other => Err(malformed(&other)),
    }
}

/// A value's RESP type, for messages.
fn kind(v: &Value) -> &'static str {
    match v {
        Value::Nil => "nil",
        Value::Int(_) => "an integer",
        Value::BulkString(_) => "a bulk string",
        Value::Array(_) => "an array",
        Value::SimpleString(_) | Value::Okay => "a simple string",
        Value::Map(_) => "a map",
        Value::Set(_) => "a set",
        Value::Double(_) => "a double",
        Value::Boolean(_) => "a boolean",
        Value::ServerError(_) => "an error",
        _ => "another type",
    }
}

/// [`call`] for one request.
pub async fn call_one(
    conn: Conn,
    via: Via<'_>,
    prefix: &str,
    lines: &[JobLine],
    commit: bool,
    memo: Option<CallId>,
) -> Result<RequestReply, RedisError> {
    let mut replies = call(conn, via, prefix, &[lines], commit, memo).await?;
    replies.pop().ok_or_else(|| RedisError::Malformed("no request in the reply".into()))
}

/// The charge call (`charge=after`): each of `lines` charged its cost in
/// full, beyond its burst if need be, with no deadline (a charge is owed
/// whenever it runs). Returns how many lines the script refused (out of
/// the range it computes exactly), which it wrote nothing for.
pub async fn charge(
    mut conn: Conn,
    via: Via<'_>,
    prefix: &str,
    lines: &[JobLine],
    memo: CallId,
) -> Result<usize, RedisError> {
    let command = |how: How| lines_command(&via.code.charge, how, prefix, lines, memo);
    let reply = integers(invoke(&mut conn, via, command).await?)?;
    let Some(reply) = parse_charge_reply(&reply, lines.len()) else {
        return Err(RedisError::Malformed(format!("{} integers for a charge of {} lines", reply.len(), lines.len())));
    };
    Ok(reply.charged.iter().filter(|c| !**c).count())
}

/// The charge call's or the undo's command (`entry`'s) for `lines`, each
/// with its cost, named `memo`: the arguments the two take.
fn lines_command(entry: &Entry, how: How, prefix: &str, lines: &[JobLine], memo: CallId) -> Cmd {
    let mut cmd = entry.command(how);
    keys_and_memo(&mut cmd, prefix, lines.iter().map(|l| (l.tag, l.line_id)), memo);
    write_charge_args(lines.iter().map(|l| (l.limit, l.cost)), None, |a| push_arg(&mut cmd, a));
    cmd
}

/// Adds one script argument to `cmd`, numbers as Redis integers.
fn push_arg(cmd: &mut Cmd, a: Arg<'_>) {
    match a {
        Arg::Str(s) => cmd.arg(s),
        Arg::Int(i) => cmd.arg(i),
        // A run's length: at most a batch.
        Arg::Neg(n) => cmd.arg(-(n as i64)),
    };
}

/// Adds to `cmd` the number of keys, the state keys of `keys` (each a
/// client key's tag and a line id) and the call's memo key.
fn keys_and_memo(cmd: &mut Cmd, prefix: &str, keys: impl ExactSizeIterator<Item = (u64, u64)>, memo: CallId) {
    cmd.arg(keys.len() + 1);
    let mut key = String::new();
    let mut first = String::new();
    for (tag, line_id) in keys {
        key.clear();
        write_state_key(&mut key, prefix, tag, line_id);
        cmd.arg(key.as_str());
        if first.is_empty() {
            first.push_str(&key);
        }
    }
    memo_arg(cmd, &first, memo);
}

/// The lease call (`NAME_lease`) for `keys`, named `memo` (a copy sent
/// again answers what the first did: nothing is granted or given back
/// twice); a lease lives as `lives` says at most. Each key's grant, in order. A
/// grant above what was wanted is not one the script can have made.
pub async fn lease(
    mut conn: Conn,
    via: Via<'_>,
    prefix: &str,
    keys: &[LeaseKey],
    lives: Lives,
    memo: CallId,
) -> Result<Vec<LeaseGrant>, RedisError> {
    let args: Vec<LeaseArg> = keys.iter().map(|k| k.arg).collect();
    let command = |how: How| {
        let mut cmd = via.code.lease.command(how);
        keys_and_memo(&mut cmd, prefix, keys.iter().map(|k| (k.tag, k.line_id)), memo);
        write_lease_args(&args, None, lives, |a| push_arg(&mut cmd, a));
        cmd
    };
    let reply = integers(invoke(&mut conn, via, command).await?)?;
    let Some((_, grants)) = parse_lease_reply(&reply, keys.len()) else {
        return Err(RedisError::Malformed(format!("{} integers for a lease call of {} keys", reply.len(), keys.len())));
    };
    if let Some((k, g)) =
        keys.iter().zip(&grants).find(|(k, g)| g.units > k.arg.want || g.life_us > lives.of(&k.arg.line))
    {
        return Err(RedisError::Malformed(format!(
            "a grant of {} units for {} us where {} units for {} us were asked",
            g.units,
            g.life_us,
            k.arg.want,
            lives.of(&k.arg.line)
        )));
    }
    Ok(grants)
}

/// The heartbeat (`NAME_beat`) of node `node` (`""`: only count) on the
/// membership set `key`, its membership lasting `ttl_ms`: how many nodes
/// are live. It changes nothing a copy could change twice: it is not named.
pub async fn beat(mut conn: Conn, via: Via<'_>, key: &str, node: &str, ttl_ms: u64) -> Result<u64, RedisError> {
    let command = |how: How| {
        let mut cmd = via.code.beat.command(how);
        cmd.arg(1).arg(key).arg(node).arg(ttl_ms);
        cmd
    };
    let reply = integers(invoke(&mut conn, via, command).await?)?;
    parse_beat_reply(&reply)
        .map(|(_, nodes)| nodes)
        .ok_or_else(|| RedisError::Malformed(format!("{} integers where a heartbeat's 2 were expected", reply.len())))
}

/// The give-backs, corrections and heartbeats of a worker's `rl_conn`
/// units (`NAME_conn`): `ops`, one per key (a client key's tag and a line
/// id), of `worker`, whose fields live `life_ms`. The units Redis reclaimed
/// from the lapsed fields of those keys (workers gone). Not named: see
/// [`super::holds`] for why a copy is never sent.
pub async fn conn_put(
    mut conn: Conn,
    via: Via<'_>,
    prefix: &str,
    ops: &[((u64, u64), HoldOp)],
    worker: &str,
    life_ms: u64,
) -> Result<u64, RedisError> {
    let command = |how: How| {
        let mut cmd = via.code.conn.command(how);
        cmd.arg(ops.len());
        let mut key = String::new();
        for ((tag, line_id), _) in ops {
            key.clear();
            write_state_key(&mut key, prefix, *tag, *line_id);
            cmd.arg(key.as_str());
        }
        write_conn_args(ops.iter().map(|(_, op)| op), worker, life_ms, None, |a| push_arg(&mut cmd, a));
        cmd
    };
    let reply = integers(invoke(&mut conn, via, command).await?)?;
    parse_conn_reply(&reply)
        .map(|(_, reclaimed)| reclaimed)
        .ok_or_else(|| RedisError::Malformed(format!("{} integers where a give-back's 2 were expected", reply.len())))
}

/// What an undo did (see [`undo`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Undone {
    /// The call had run: what it charged is taken back.
    TakenBack,
    /// The call had not run: it never will.
    NotRun,
    /// Undone before (or its memo is gone).
    Already,
}

/// The undo of the call `memo` on `lines` (its requests' lines, in its
/// order): what it committed is taken back, or, if it has not run, it is
/// marked never to. For the requests of a call that nginx answered without
/// its reply (per `on_error`), which are then never charged.
pub async fn undo(
    mut conn: Conn,
    via: Via<'_>,
    prefix: &str,
    lines: &[JobLine],
    memo: CallId,
) -> Result<Undone, RedisError> {
    let command = |how: How| lines_command(&via.code.undo, how, prefix, lines, memo);
    match integers(invoke(&mut conn, via, command).await?)?.as_slice() {
        [_, 1] => Ok(Undone::TakenBack),
        [_, 0] => Ok(Undone::NotRun),
        [_, 2] => Ok(Undone::Already),
        other => Err(RedisError::Malformed(format!("{} integers where an undo's 2 were expected", other.len()))),
    }
}

/// The limit script: as a Redis function library, and as a script.
pub struct Code {
    script: Script,
    /// The library's function (and library) name.
    function: String,
    /// The library's text, for `FUNCTION LOAD`.
    library: String,
    /// The charge call, the undo, the lease call, the heartbeat, and
    /// `rl_conn`'s give-backs and heartbeats.
    charge: Entry,
    undo: Entry,
    lease: Entry,
    beat: Entry,
    conn: Entry,
}

/// One of the library's other functions: its name, and the script that
/// runs it (`EVALSHA`/`EVAL`) and its text.
struct Entry {
    function: String,
    script: Script,
    text: String,
}

impl Entry {
    fn new(function: String, text: String) -> Entry {
        Entry { function, script: Script::new(&text), text }
    }

    /// The command that calls it, before its keys.
    fn command(&self, how: How) -> Cmd {
        match how {
            How::Fcall => redis::cmd("FCALL").arg(&self.function).to_owned(),
            How::Evalsha => redis::cmd("EVALSHA").arg(self.script.get_hash()).to_owned(),
            How::Eval => redis::cmd("EVAL").arg(&self.text).to_owned(),
        }
    }
}

impl Code {
    pub fn new() -> Code {
        Code {
            script: Script::new(LIMIT_SCRIPT),
            function: function_name(),
            library: function_library(),
            charge: Entry::new(charge_function_name(), charge_script()),
            undo: Entry::new(undo_function_name(), undo_script()),
            lease: Entry::new(lease_function_name(), lease_script()),
            beat: Entry::new(beat_function_name(), beat_script()),
            conn: Entry::new(conn_function_name(), conn_script()),
        }
    }
}

/// How a zone runs the script: `fcall` until its server shows it cannot,
/// its `loads` of the library; each call with a deadline, `until` on the
/// local clock and in Redis time by the zone's `clock`.
#[derive(Clone, Copy)]
pub struct Via<'a> {
    pub code: &'a Code,
    pub fcall: &'a AtomicBool,
    pub loads: &'a Loads,
    pub clock: &'a Clock,
    pub until: Instant,
}

/// A zone's loads of the function library: one at a time, and none by a
/// call that found no function if another call has loaded the library
/// since it was sent. Without this, every call in flight when the library
/// is missing (a worker's first calls, calls after a Redis restart or a
/// `FUNCTION FLUSH`) loaded it again, on every master of a cluster: a
/// load costs Redis milliseconds, and a herd of them ran calls past their
/// deadline.
#[derive(Default)]
pub struct Loads {
    /// Loads done so far.
    done: AtomicU64,
    one: tokio::sync::Mutex<()>,
}

#[derive(Clone, Copy)]
enum How {
    Fcall,
    Evalsha,
    Eval,
}

/// Sends the call as `command(How::Fcall)` while the zone uses functions:
/// after `Function not found` (first call, Redis restarted, `FUNCTION
/// FLUSH`) it loads the library (on every master of a cluster) and calls
/// again, up to [`MAX_LOADS`] times. A server without functions (Redis
/// before 7.0), that does not let this user load them, or that refuses the
/// library (`ERR`) turns the zone to `EVALSHA` for good; another failure to
/// load, for this call. `EVALSHA` is followed after `NOSCRIPT` (Redis
/// restarted, `SCRIPT FLUSH`) by `EVAL` with the script's text, which runs
/// it and caches it again in one command (a `SCRIPT LOAD` then `EVALSHA`
/// could meet a second flush between the two).
async fn invoke<C: ConnectionLike + Send>(
    c: &mut C,
    via: Via<'_>,
    command: impl Fn(How) -> Cmd,
) -> Result<Value, RedisError> {
    if via.fcall.load(Ordering::Relaxed) {
        let mut seen = via.loads.done.load(Ordering::Acquire);
        let mut result = command(How::Fcall).query_async(c).await;
        if result.as_ref().is_err_and(unsupported) {
            via.fcall.store(false, Ordering::Relaxed);
        }
        // No function (yet, or no more): load the library and call again. A
        // flush can land between the load and the call (there is no atomic
        // load-and-call, as EVAL is for a script): then load again, a few times.
        let mut loads = 0;
        while loads < MAX_LOADS && result.as_ref().is_err_and(|e| detail_starts(e, "Function not found")) {
            loads += 1;
            let load = {
                let _one = via.loads.one.lock().await;
                match via.loads.done.load(Ordering::Acquire) {
                    // (loaded by another call since this one was sent: only call again)
                    done if done != seen => Ok(Value::Okay),
                    _ => {
                        let cmd = redis::cmd("FUNCTION").arg("LOAD").arg("REPLACE").arg(&via.code.library).to_owned();
                        let load = cmd.query_async::<Value>(c).await;
                        if load.is_ok() {
                            via.loads.done.fetch_add(1, Ordering::AcqRel);
                        }
                        load
                    }
                }
            };
            seen = via.loads.done.load(Ordering::Acquire);
            match load {
                Ok(_) => result = command(How::Fcall).query_async(c).await,
                Err(e) if is_io(&e) => return Err(describe(e)),
                // ERR: a server that cannot take this library (it would refuse it again).
                Err(e) if unsupported(&e) || e.code() == Some("ERR") => {
                    via.fcall.store(false, Ordering::Relaxed);
                    break;
                }
                // OOM, NOREPLICAS, BUSY, LOADING...: this call without functions, the next may load.
                Err(_) => return evalsha(c, command).await,
            }
        }
        if via.fcall.load(Ordering::Relaxed) {
            return result.map_err(describe);
        }
    }
    evalsha(c, command).await
}

/// `FUNCTION LOAD`s one call makes at most (see [`invoke`]).
const MAX_LOADS: u32 = 3;

/// `EVALSHA`, and `EVAL` after `NOSCRIPT` (see [`invoke`]).
async fn evalsha<C: ConnectionLike + Send>(c: &mut C, command: impl Fn(How) -> Cmd) -> Result<Value, RedisError> {
    let mut result = command(How::Evalsha).query_async(c).await;
    if let Err(e) = &result {
        if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) {
            result = command(How::Eval).query_async(c).await;
        }
    }
    result.map_err(describe)
}

/// A server without functions, or a user not allowed to load them.
fn unsupported(e: &redis::RedisError) -> bool {
    e.code() == Some("NOPERM") || detail_starts(e, "unknown command") || detail_starts(e, "unknown subcommand")
}

fn detail_starts(e: &redis::RedisError, text: &str) -> bool {
    e.detail().is_some_and(|d| d.get(..text.len()).is_some_and(|d| d.eq_ignore_ascii_case(text)))
}

/// A new connection may help: a broken one, or READONLY (the server was
/// demoted to a replica in a failover: reconnect to the master).
fn is_io(e: &redis::RedisError) -> bool {
    broken(e) || e.code() == Some("READONLY")
}

/// A client error as the zone reads it: [`RedisError::Io`] when a new
/// connection may help.
fn describe(e: redis::RedisError) -> RedisError {
    if e.kind() == redis::ErrorKind::Parse {
        // (the client's text calls it an "incompatible type")
        RedisError::Io(format!("protocol error: {}", e.detail().unwrap_or("unreadable reply")))
    } else if is_io(&e) {
        RedisError::Io(e.to_string())
    } else {
        RedisError::Server(e.to_string())
    }
}
