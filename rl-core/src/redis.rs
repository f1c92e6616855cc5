//! The Redis backend's protocol: a Lua script that checks (and commits) every
//! `rl_limit` line of a request atomically, in one `FCALL` (Redis 7+, see
//! [`function_library`]) or `EVALSHA`, with the same
//! state machines as [`crate::limit`], plus the Rust side of its interface:
//! keys, arguments and reply.
//!
//! # Script interface
//!
//! One call checks (and commits) one or more requests: nginx sends the
//! requests that arrived in one event-loop iteration together, so the call's
//! own cost (`FCALL` or `EVALSHA`, `TIME`, the round trip) is shared by the batch.
//! Requests are evaluated in order, at the same `now`; each is all-or-nothing
//! across its lines.
//!
//! - `KEYS`: every line's state key (see [`state_key`]), request by request.
//! - `ARGV[1]`: `"1"` = check every line of a request and commit all of them
//!   iff all admit; `"0"` = check only, never write (first phase of a
//!   two-phase check across Redis Cluster slots).
//! - `ARGV[2]`: now in microseconds; `""` or `"0"` = Redis `TIME` (one clock
//!   for the whole fleet).
//! - `ARGV[3]`: the call's deadline, in microseconds of the same clock; `""`
//!   = none. A call that runs after it (`now > deadline`) checks nothing and
//!   writes nothing (see *Deadlines* below).
//! - then per request its lines, one argument each: `"algorithm count
//!   period_us burst cost queue flags"` (flags: the sum of 1 for a dry-run
//!   line, 2 for a varying one, 4 for a `charge=after` line's check, 8
//!   for a line that reports [`Outcome::next_us`]; [`write_spec`]; the requests of a location share
//!   it, and the script parses each distinct string once per call); a request
//!   of other than one line is preceded by its number of lines; `n ≥ 2`
//!   consecutive requests of one line each with the same string are sent as
//!   `"-n"` and the string once ([`write_args`]).
//!
//! It returns `{now_us, then per line: remaining, reset_us, -2 if admitted
//! else the retry-after in µs or -1 (never), the delay in µs (0: at
//! once), and [`Outcome::next_us`] (flag 8; else 0)}`, or `{-1, now_us}` for a call past its deadline, see
//! [`parse_reply`]. A request is admitted iff all its enforced lines admit
//! it (dry-run lines, flag 1, never reject it); then the enforced lines
//! are committed, and the dry-run lines that admit it
//! ([`crate::verdict::combine`]). Each line's outcome is [`Limit::check`]'s
//! at the script's `now` (after the requests before it in the call); the
//! commits are [`Limit::commit`]s. A rejected request writes nothing.
//! In a call that commits, a line that admits its request but is not
//! charged (the request is rejected, or the line is `charge=after`)
//! reports what its state has left instead ([`Outcome::uncharged`] of
//! [`Limit::left`]); a line that reports `next_us` reports
//! [`Limit::next_us`] of its state after the call's writes.
//! A `charge=after` line's check ([`LineArg::check_only`], flag 4) is
//! `Limit::check` of a cost of 1, whatever its cost, and is never
//! committed: its cost is charged after the response, by the charge call.
//!
//! # The charge call
//!
//! Costs known only after the response (`charge=after`) are charged by a
//! second entry point of the same script: `FCALL` [`charge_function_name`]
//! (the library registers both functions) or `EVALSHA` of
//! [`charge_script`]. Each line is charged in full, beyond the burst if
//! need be ([`Limit::overdraw`]), and the key's TTL covers the repayment.
//!
//! - `KEYS`: every line's state key.
//! - `ARGV[1]`: now in microseconds; `""` = Redis `TIME`.
//! - then per line `"algorithm count period_us burst cost queue flags"`
//!   ([`write_charge_args`]).
//!
//! There is no deadline: a charge is as good late as early, and the
//! caller holds no request while it waits. The reply is `{now_us, then per
//! line 1 if charged, 0 if refused}` ([`parse_charge_reply`]). The script
//! refuses, writing nothing for it, a malformed line, a `sliding_log` line
//! (a log cannot hold an overdraft), a line [`exact`] refuses, a cost of
//! [`MAX_EXACT`] or more, or a charge that would take the state beyond
//! [`MAX_EXACT`] (the buckets' amount, scaled by the period; `gcra`'s `TAT −
//! now`; the windows' count), past which it would no longer be exact.
//!
//! # Deadlines
//!
//! The caller waits a bounded time for a reply, then answers the requests
//! as failed; a call still queued in Redis would run later all the same,
//! and charge requests that were refused. So a call carries the time after
//! which its caller no longer waits for it, on Redis' clock, and a call
//! that runs later does nothing: its requests are answered as failed and
//! charged nothing. The caller translates its own (monotonic) give-up time
//! into Redis time with the offset it learns from each reply's `now_us`
//! ([`clock::Offset`]), which errs early, never late, while Redis' clock
//! does not step back; and it stops waiting some time after that deadline,
//! for the reply's way back.
//!
//! State: the O(1) algorithms keep [`Limit::state_words`] words and the
//! key's expiry (ms of the Redis clock) as a string of a 0 byte and
//! little-endian doubles (exact for integers below 2^53; Lua's `struct`
//! packs them far faster than it formats digits). `sliding_log` keeps a LIST
//! of admission timestamps, newest first. Every key lives at least until its
//! reset time + [`TTL_MARGIN_MS`], when its state reads as fresh, so expiry
//! never changes a decision, and at most [`TTL_SLACK_MS`] longer, so memory
//! stays bounded: see [`expiry_after_write`]. A write that keeps the expiry
//! overwrites the value in place (`SETRANGE`), which costs Redis much less
//! than `SET ... PX`.
//!
//! # Exactness
//!
//! Redis runs Lua 5.1, whose numbers are doubles: integers are exact up to
//! 2^53. The script's outcomes are identical to rl-core's when `now ≤`
//! [`MAX_EXACT`] (until the year 2112) and the limit passes [`exact`]:
//! count, period and burst below 2^53, and
//!
//! | algorithm                       | condition                                  |
//! |---------------------------------|--------------------------------------------|
//! | `fixed`, `sliding_log`          | `W` = ⌈burst·period/count⌉ ≤ 2^52          |
//! | `sliding`                       | `W` ≤ 2^51                                 |
//! | `token_bucket`, `leaky_bucket`  | (burst + queue)·period ≤ 2^52              |
//! | `gcra`                          | (burst + queue)·⌈period/count⌉ ≤ 2^52      |
//!
//! The script rejects a line outside these ranges (or with malformed
//! arguments) with no retry-after: it fails closed and never over-admits.
//! Configurations should therefore be checked with [`exact`] up front.

pub mod clock;

use std::fmt::Write as _;
use std::hash::Hasher;

use siphasher::sip::SipHasher13;
use smallvec::SmallVec;

use crate::limit::wait::Lane;
use crate::limit::{Algorithm, Limit, Outcome};

pub mod holders;
mod reply;

pub use reply::{check_line, max_delay_us, max_reset_us, max_retry_after_us, OutOfRange, CLOCK_STEP_US, OVERDRAWN};

/// The Lua script (for `SCRIPT LOAD` / `EVALSHA`).
pub const LIMIT_SCRIPT: &str = include_str!("redis/limit.lua");

/// The lease call (`lease`), which the function library and
/// [`lease_script`] append to the script's body: a decision's `EVAL` does
/// without it.
const LEASE_LUA: &str = include_str!("redis/lease.lua");

/// The give-backs and heartbeats of `rl_conn` lines (`conn_put`), which the
/// function library and [`conn_script`] append to the script's body.
const CONN_LUA: &str = include_str!("redis/conn.lua");

/// The script's last line: as `EVAL` runs it, its body checks the call's
/// `KEYS` and `ARGV`.
const EVAL_TAIL: &str = "return limit(KEYS, ARGV)\n";

/// The script's body, without its last line.
fn script_body() -> &'static str {
    LIMIT_SCRIPT.strip_suffix(EVAL_TAIL).unwrap_or(LIMIT_SCRIPT)
}

/// The charge call as a script (for `SCRIPT LOAD` / `EVALSHA`): the same
/// body, its last line calling the charge.
pub fn charge_script() -> String {
    format!("{}return charge(KEYS, ARGV)\n", script_body())
}

/// The charge call's function in the library ([`function_library`]).
pub fn charge_function_name() -> String {
    format!("{}_charge", function_name())
}

/// The undo call as a script (for `SCRIPT LOAD` / `EVALSHA`): the same
/// body, its last line calling the undo.
pub fn undo_script() -> String {
    format!("{}return undo(KEYS, ARGV)\n", script_body())
}

/// The undo call's function in the library ([`function_library`]).
pub fn undo_function_name() -> String {
    format!("{}_undo", function_name())
}

/// The lease call as a script (for `SCRIPT LOAD` / `EVALSHA`): the same
/// body, its last line calling the lease.
pub fn lease_script() -> String {
    format!("{}{LEASE_LUA}return lease(KEYS, ARGV)\n", script_body())
}

/// The lease call's function in the library ([`function_library`]).
pub fn lease_function_name() -> String {
    format!("{}_lease", function_name())
}

/// The heartbeat as a script (for `SCRIPT LOAD` / `EVALSHA`).
pub fn beat_script() -> String {
    format!("{}{LEASE_LUA}return beat(KEYS, ARGV)\n", script_body())
}

/// The heartbeat's function in the library ([`function_library`]).
pub fn beat_function_name() -> String {
    format!("{}_beat", function_name())
}

/// The give-backs and heartbeats of `rl_conn` lines as a script (for
/// `SCRIPT LOAD` / `EVALSHA`).
pub fn conn_script() -> String {
    format!("{}{CONN_LUA}return conn_put(KEYS, ARGV)\n", script_body())
}

/// The function of `rl_conn`'s give-backs and heartbeats in the library
/// ([`function_library`]).
pub fn conn_function_name() -> String {
    format!("{}_conn", function_name())
}

/// Appends to `out` the membership key of the nodes of a zone named
/// `zone` (the heartbeat's `KEYS[1]`): the prefix, a hash tag of its own
/// (one Cluster slot), the zone's name.
pub fn write_members_key(out: &mut String, prefix: &str, zone: &str) {
    let _ = write!(out, "{prefix}{{nodes}}:{zone}");
}

/// The heartbeat's reply: when Redis ran it (µs of its clock) and how
/// many nodes are live; `None` if it is malformed.
pub fn parse_beat_reply(reply: &[i64]) -> Option<(u64, u64)> {
    match reply {
        [now, nodes] => Some((u64::try_from(*now).ok()?, u64::try_from(*nodes).ok()?)),
        _ => None,
    }
}

/// Appends to `out` the memo key of a call whose first state key is
/// `first_key`, named `id` (unique to the call, whatever nginx sent it):
/// the state key up to its hash tag (`prefix{tag}`: the whole key if it has
/// none), then `:c:` and the name, so that it hashes to the same Cluster
/// slot, and no state key has its form. The script keeps there what the
/// call did (see the script's header), so that a copy sent again after a
/// lost reply is not applied twice, and an undo can take the call back.
pub fn write_memo_key(out: &mut String, first_key: &str, id: (u64, u64)) {
    let tagged = first_key.find('{').and_then(|open| first_key[open..].find('}').map(|close| open + close + 1));
    out.push_str(&first_key[..tagged.unwrap_or(first_key.len())]);
    // Writing to a String cannot fail.
    let _ = write!(out, ":c:{:016x}{:x}", id.0, id.1);
}

/// The script's name as a Redis function (library and function): `rl_` and
/// a hash of its text, so that nginx servers running different versions of
/// the module on one Redis each call their own.
pub fn function_name() -> String {
    let mut h = SipHasher13::new_with_keys(0, 0);
    h.write(LIMIT_SCRIPT.as_bytes());
    h.write(LEASE_LUA.as_bytes());
    h.write(CONN_LUA.as_bytes());
    format!("rl_{:016x}", h.finish())
}

/// The script as a Redis 7 function library, for `FUNCTION LOAD` and then
/// `FCALL` [`function_name`] with the same keys and arguments as `EVALSHA`.
/// The same body, but Redis builds its helper functions once, when it loads
/// the library, rather than on every call, and the parsed lines stay from
/// call to call: a call costs Redis about a third less when it carries one
/// request, 8% less with nine.
/// It also registers the charge call, [`charge_function_name`], and the
/// undo call, [`undo_function_name`].
pub fn function_library() -> String {
    let name = function_name();
    let body = script_body();
    format!(
        "#!lua name={name}\n{body}{LEASE_LUA}{CONN_LUA}redis.register_function('{name}', limit)\n\
         redis.register_function('{name}_charge', charge)\n\
         redis.register_function('{name}_undo', undo)\n\
         redis.register_function('{name}_lease', lease)\n\
         redis.register_function('{name}_beat', beat)\n\
         redis.register_function('{name}_conn', conn_put)\n"
    )
}

/// Added to every key's reset time to get its TTL.
pub const TTL_MARGIN_MS: u64 = 1000;

/// How much longer than needed a key may live: when a write needs a later
/// expiry, the script sets this much more, so that a busy key's TTL is set
/// about once per `TTL_SLACK_MS` rather than on every write.
pub const TTL_SLACK_MS: u64 = 1000;

/// The expiry (ms of the Redis clock) of a string state key after a write at
/// `now_us` of a state that resets in `reset_us`, when the key had expiry
/// `prev_ms` (0: missing, or not known from its value): kept while it covers
/// the reset time + [`TTL_MARGIN_MS`], else that + [`TTL_SLACK_MS`]. Both
/// times round up to the ms: `now` cut to its ms would let the key expire up
/// to 999 µs before the reset time + the margin, and a request from a clock
/// stepped back by less than the margin read the state fresh too early.
/// (`sliding_log` keys get exactly the reset time + [`TTL_MARGIN_MS`], the
/// same rounded up.)
pub fn expiry_after_write(prev_ms: u64, now_us: u64, reset_us: u64) -> u64 {
    let need = now_us.div_ceil(1000) + reset_us.div_ceil(1000) + TTL_MARGIN_MS;
    if prev_ms < need {
        need + TTL_SLACK_MS
    } else {
        prev_ms
    }
}

/// Bound on the script's intermediate values (2^52 µs ≈ year 2112 as a Unix
/// time): see the module docs.
pub const MAX_EXACT: u64 = 1 << 52;

/// Whether the script evaluates `limit` exactly like rl-core (for any
/// `now ≤` [`MAX_EXACT`]); the script rejects the lines for which this is
/// false. A [`Limit::varying`] bucket or `gcra` line is exact as long as the
/// state it converts stays within the range too (what another scale's
/// charges come to in its own); a conversion beyond it rejects that
/// request.
pub fn exact(limit: &Limit) -> bool {
    let rate = limit.rate();
    let burst = limit.burst();
    let small = |x: u64| x < 2 * MAX_EXACT;
    if !(small(rate.count) && small(rate.period_us) && small(burst)) {
        return false;
    }
    let bound = u128::from(MAX_EXACT);
    let window = u128::from(limit.window_us());
    // Queued units count: the state holds up to burst + queue.
    let held = u128::from(burst) + u128::from(limit.queue());
    match limit.algorithm() {
        _ if !small(limit.queue()) => false,
        // A varying line's count carries from window to window as it is.
        Algorithm::Fixed | Algorithm::Sliding if limit.is_varying() && u128::from(burst) > bound => false,
        // A varying bucket's tag packs its rate: a double holds it up to
        // this bound.
        Algorithm::TokenBucket | Algorithm::LeakyBucket if u128::from(limit.tag()) > bound => false,
        Algorithm::Fixed | Algorithm::SlidingLog => window <= bound,
        Algorithm::Sliding => window <= bound / 2,
        Algorithm::TokenBucket | Algorithm::LeakyBucket => held * u128::from(rate.period_us) <= bound,
        Algorithm::Gcra => held * u128::from(rate.period_us.div_ceil(rate.count)) <= bound,
        // (its fields' counts are exact to 2^52, far beyond any max)
        Algorithm::Concurrent => burst <= MAX_EXACT,
    }
}

/// One script argument, as [`write_args`] emits it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arg<'a> {
    Str(&'a str),
    Int(u64),
    /// `-n`.
    Neg(u64),
}

impl std::fmt::Display for Arg<'_> {
    /// As Redis receives it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Arg::Str(s) => f.write_str(s),
            Arg::Int(i) => write!(f, "{i}"),
            Arg::Neg(i) => write!(f, "-{i}"),
        }
    }
}

/// What a call is for, besides its requests: the script's `ARGV[1 ..= 3]`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Call {
    /// Commit the requests that all their lines admit (else check only).
    pub commit: bool,
    /// Replaces Redis `TIME` (tests).
    pub now_us: Option<u64>,
    /// Redis time (µs) after which the call must do nothing.
    pub deadline_us: Option<u64>,
    /// A commit whose last key is its memo (see [`write_memo_key`]): mode
    /// "2" rather than "1".
    pub memo: bool,
}

/// One line of a request as the script takes it: the limit, the
/// request's cost on it, whether it is dry-run, and whether it is a
/// `charge=after` line's check.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LineArg {
    pub limit: Limit,
    pub cost: u64,
    pub dry_run: bool,
    /// A `charge=after` line's admission check: admits iff a request of
    /// cost 1 would be admitted (whatever `cost`), and is never charged,
    /// even when the request is admitted. (Its outcome is checked against
    /// the range of a cost of 1: [`check_line`].)
    pub check_only: bool,
    /// The line reports [`Outcome::next_us`] (the `t` of the `RateLimit`
    /// field, which costs the script a little more).
    pub next: bool,
    /// Not a line of the request but a lease asked with it, of `cost`
    /// units at most, living this long (µs; 0: a line of the request): the
    /// lease call's grant for its key, made after the request's lines
    /// whatever they decide, and read as a [`LeaseGrant`] (see
    /// [`parse_reply`]).
    pub lease_life: u64,
    /// A line of classes: the units of the budget the request must leave
    /// to the classes above its own ([`Limit::acquire_keeping`]; 0: none).
    pub kept: u64,
    /// A [`Limit::concurrent`] line: the worker whose units the request
    /// takes (see [`Holder`]); `None` for every other line.
    pub holder: Option<Holder>,
    /// A [`Limit::concurrent`] line with a queue whose request may wait for
    /// its units (see [`Wait`]); `None`: it is let in or refused at once.
    pub wait: Option<Wait>,
    /// A [`Limit::concurrent`] line of several classes (`classes=`): the
    /// request's class and the line's (see [`ClassArg`]); `None`: one
    /// class.
    pub classes: Option<ClassArg>,
}

/// The classes of a [`Limit::concurrent`] line on Redis: the request's
/// (0 the highest; its worker's field of the key is [`Holder::worker`]
/// and "/class") and the line's, highest first, each with its places in
/// the waiting line and its reserve (see [`holders`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ClassArg {
    pub class: u8,
    pub lanes: &'static [Lane],
}

/// A take of a [`Limit::concurrent`] line that may wait in the key's
/// waiting line (its [`Limit::queue`] places): the ticket of the request's
/// place (0: it arrives, and takes a place if it must wait), and how long
/// its wait has left (ms), which bounds how long the place outlives a
/// request that stops looking. See [`holders`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Wait {
    pub ticket: u64,
    pub left_ms: u64,
}

/// Who takes the units of a [`Limit::concurrent`] line on Redis, and when:
/// the key's field is the worker's, and lives `life_ms` unless renewed;
/// `gen` is the generation of the worker's heartbeats the take is sent in
/// (a take its worker's later heartbeat counted is decided as charged
/// already: see the script's `concurrent` and `conn_put`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Holder {
    /// The worker's field name (no space): its host, process id and a random part.
    pub worker: &'static str,
    pub gen: u64,
    pub life_ms: u64,
}

impl From<(Limit, u64)> for LineArg {
    /// An enforced line.
    fn from((limit, cost): (Limit, u64)) -> Self {
        LineArg {
            limit,
            cost,
            dry_run: false,
            check_only: false,
            next: false,
            lease_life: 0,
            kept: 0,
            holder: None,
            wait: None,
            classes: None,
        }
    }
}

impl From<(Limit, u64, bool)> for LineArg {
    fn from((limit, cost, dry_run): (Limit, u64, bool)) -> Self {
        LineArg { dry_run, ..LineArg::from((limit, cost)) }
    }
}

/// Emits the script's `ARGV` for `requests` (each a request's lines: a
/// [`LineArg`], or a limit and the request's cost on it for an enforced
/// line), in the order of their `KEYS`.
pub fn write_args<R, L, T>(requests: R, call: Call, mut emit: impl FnMut(Arg<'_>))
where
    R: IntoIterator<Item = L>,
    L: IntoIterator<Item = T>,
    L::IntoIter: ExactSizeIterator,
    T: Into<LineArg>,
{
    emit(Arg::Str(match (call.commit, call.memo) {
        (true, true) => "2",
        (true, false) => "1",
        (false, _) => "0",
    }));
    for t in [call.now_us, call.deadline_us] {
        match t {
            Some(t) => emit(Arg::Int(t)),
            None => emit(Arg::Str("")),
        }
    }
    // The spec of the last line seen (requests on one location share it).
    let mut spec = Spec::default();
    // Consecutive requests of one line each, all with the same line.
    let mut run: Option<(LineArg, u64)> = None;
    for lines in requests {
        let mut lines = lines.into_iter().map(Into::into);
        if lines.len() == 1 {
            if let Some(line) = lines.next() {
                match &mut run {
                    Some((l, n)) if *l == line => *n += 1,
                    _ => {
                        flush_run(run.take(), &mut spec, &mut emit);
                        run = Some((line, 1));
                    }
                }
            }
            continue;
        }
        flush_run(run.take(), &mut spec, &mut emit);
        emit(Arg::Int(lines.len() as u64));
        for line in lines {
            emit(Arg::Str(spec.of(line)));
        }
    }
    flush_run(run, &mut spec, &mut emit);
}

/// The last line string written, kept while the next lines are the same.
#[derive(Default)]
struct Spec {
    text: String,
    of: Option<LineArg>,
}

impl Spec {
    fn of(&mut self, line: LineArg) -> &str {
        if self.of != Some(line) {
            self.text.clear();
            write_spec(&mut self.text, &line);
            self.of = Some(line);
        }
        &self.text
    }
}

/// Emits `n` requests of one `line` each: the line, or `-n` then the line.
fn flush_run(run: Option<(LineArg, u64)>, spec: &mut Spec, emit: &mut impl FnMut(Arg<'_>)) {
    let Some((line, n)) = run else { return };
    if n > 1 {
        emit(Arg::Neg(n));
    }
    emit(Arg::Str(spec.of(line)));
}

/// A line as the script takes it: `"algorithm count period_us burst cost
/// queue flags"`, `flags` being the sum of 1 for a dry-run line, 2 for a
/// [`Limit::varying`] one (whose state carries its scale tag), 4 for a
/// `charge=after` line's check and 8 for a line that reports
/// [`Outcome::next_us`], plus 32 and a last field for a line of classes
/// (`"... 32 kept"`, [`LineArg::kept`]); a lease asked with the request is
/// `"... 16 life"` (18 on a varying line); a [`Limit::concurrent`] line with its [`Holder`] is
/// `"concurrent count period_us max cost queue flags worker gen life_ms
/// ticket left_ms"`, flags 64 plus the dry-run and next bits, and the
/// queue, ticket and time left those of its [`Wait`] (all 0 for a take
/// that never waits), then on a line of classes `" class n"` and per class
/// `" places reserve"` ([`ClassArg`]).
pub fn write_spec(out: &mut String, line: &LineArg) {
    if line.lease_life > 0 {
        let (limit, rate) = (&line.limit, line.limit.rate());
        let name = limit.algorithm().name();
        let _ = write!(
            out,
            "{name} {} {} {} {} 0 {} {}",
            rate.count,
            rate.period_us,
            limit.burst(),
            line.cost,
            16 | u8::from(limit.is_varying()) << 1,
            line.lease_life
        );
        return;
    }
    if let Some(h) = line.holder {
        let (limit, rate) = (&line.limit, line.limit.rate());
        let flags = 64 | u8::from(line.dry_run) | u8::from(line.next) << 3;
        let (queue, w) = match line.wait {
            Some(w) => (limit.queue(), w),
            None => (0, Wait::default()),
        };
        let _ = write!(
            out,
            "concurrent {} {} {} {} {queue} {flags} {} {} {} {} {}",
            rate.count,
            rate.period_us,
            limit.burst(),
            line.cost,
            h.worker,
            h.gen,
            h.life_ms,
            w.ticket,
            w.left_ms
        );
        if let Some(c) = line.classes {
            let _ = write!(out, " {} {}", c.class, c.lanes.len());
            for l in c.lanes {
                let _ = write!(out, " {} {}", l.places, l.reserve);
            }
        }
        return;
    }
    let (limit, rate) = (&line.limit, line.limit.rate());
    // Writing to a String cannot fail.
    let _ = write!(
        out,
        "{} {} {} {} {} {} {}",
        limit.algorithm().name(),
        rate.count,
        rate.period_us,
        limit.burst(),
        line.cost,
        limit.queue(),
        u8::from(line.dry_run)
            | u8::from(line.limit.is_varying()) << 1
            | u8::from(line.check_only) << 2
            | u8::from(line.next) << 3
            | u8::from(line.kept > 0) << 5
    );
    if line.kept > 0 {
        let _ = write!(out, " {}", line.kept);
    }
}

/// [`write_args`] as strings.
pub fn script_args<'a, T: Copy + Into<LineArg> + 'a>(
    requests: impl IntoIterator<Item = &'a [T]>,
    call: Call,
) -> Vec<String> {
    let mut args = Vec::new();
    let requests = requests.into_iter().map(|r| r.iter().copied());
    write_args(requests, call, |a| args.push(a.to_string()));
    args
}

/// Emits the charge call's `ARGV` for `lines` (each a limit and the cost to
/// charge on it), in the order of their `KEYS`: `now_us` replaces Redis
/// `TIME` (tests).
pub fn write_charge_args(
    lines: impl IntoIterator<Item = (Limit, u64)>,
    now_us: Option<u64>,
    mut emit: impl FnMut(Arg<'_>),
) {
    match now_us {
        Some(t) => emit(Arg::Int(t)),
        None => emit(Arg::Str("")),
    }
    let mut spec = Spec::default();
    for line in lines {
        emit(Arg::Str(spec.of(line.into())));
    }
}

/// [`write_charge_args`] as strings.
pub fn charge_args(lines: impl IntoIterator<Item = (Limit, u64)>, now_us: Option<u64>) -> Vec<String> {
    let mut args = Vec::new();
    write_charge_args(lines, now_us, |a| args.push(a.to_string()));
    args
}

/// One change of a worker's hold on a key of a [`Limit::concurrent`]
/// line, in a `conn_put` call (the library's `NAME_conn`; see the script).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HoldOp {
    /// Units given back by requests that ended, in generation `gen`.
    GiveBack { units: u64, gen: u64 },
    /// Units the heartbeat of generation `gen` counted as held for takes
    /// then in flight that did not hold (refused, or answered per
    /// `on_error`).
    Correct { units: u64, gen: u64 },
    /// The heartbeat of generation `gen`: the worker holds `units`.
    Set { units: u64, gen: u64 },
    /// A request gives up its place in the key's waiting line (see
    /// [`Wait`]): it ends, or its wait is over. The worker's field is
    /// neither written nor renewed.
    Leave { ticket: u64 },
}

/// Emits the `conn_put` call's `ARGV` for `ops` (one per key, in the order
/// of their `KEYS`) of `worker`, whose fields live `life_ms`: `now_us`
/// replaces Redis `TIME` (tests).
pub fn write_conn_args<'a>(
    ops: impl IntoIterator<Item = &'a HoldOp>,
    worker: &str,
    life_ms: u64,
    now_us: Option<u64>,
    mut emit: impl FnMut(Arg<'_>),
) {
    match now_us {
        Some(t) => emit(Arg::Int(t)),
        None => emit(Arg::Str("")),
    }
    emit(Arg::Str(worker));
    emit(Arg::Int(life_ms));
    let mut text = String::new();
    for op in ops {
        text.clear();
        let (c, units, gen) = match *op {
            HoldOp::GiveBack { units, gen } => ('d', units, gen),
            HoldOp::Correct { units, gen } => ('c', units, gen),
            HoldOp::Set { units, gen } => ('s', units, gen),
            HoldOp::Leave { ticket } => ('q', ticket, 0),
        };
        let _ = write!(text, "{c} {units} {gen}");
        emit(Arg::Str(&text));
    }
}

/// [`write_conn_args`] as strings.
pub fn conn_args(ops: &[HoldOp], worker: &str, life_ms: u64, now_us: Option<u64>) -> Vec<String> {
    let mut args = Vec::new();
    write_conn_args(ops, worker, life_ms, now_us, |a| args.push(a.to_string()));
    args
}

/// The `conn_put` call's reply: when Redis ran it (µs of its clock) and
/// the units it reclaimed from lapsed fields; `None` if it is malformed.
pub fn parse_conn_reply(reply: &[i64]) -> Option<(u64, u64)> {
    match reply {
        [now, reclaimed] => Some((u64::try_from(*now).ok()?, u64::try_from(*reclaimed).ok()?)),
        _ => None,
    }
}

/// The charge call's reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChargeReply {
    /// When Redis ran the call (µs of its clock).
    pub now_us: u64,
    /// Per line: charged (a cost of 0 charges nothing and counts as
    /// charged), or refused, nothing written (see the module docs).
    pub charged: Vec<bool>,
}

/// Parses the charge call's reply for `lines` lines; `None` if it is
/// malformed (wrong length, a code other than 0 or 1, a negative time).
pub fn parse_charge_reply(reply: &[i64], lines: usize) -> Option<ChargeReply> {
    let (&now_us, rest) = reply.split_first()?;
    if rest.len() != lines {
        return None;
    }
    let charged = rest
        .iter()
        .map(|&c| match c {
            0 => Some(false),
            1 => Some(true),
            _ => None,
        })
        .collect::<Option<Vec<bool>>>()?;
    Some(ChargeReply { now_us: u64::try_from(now_us).ok()?, charged })
}

/// One key of a lease call: the line that grants leases (see
/// [`crate::lease::Leasing::line`]), the units wanted, and what the node
/// gives back of its last lease on the key: the units unspent and the
/// words that lease's grant returned ([`LeaseGrant::words`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseArg {
    pub line: Limit,
    pub want: u64,
    pub back: u64,
    pub words: (u64, u64),
}

/// How long the leases of a lease call live at most: a bucket or `gcra`
/// line's, and a `fixed` or `sliding` line's (to the end of its window at
/// most), in µs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lives {
    pub bucket_us: u64,
    pub window_us: u64,
}

impl Lives {
    /// How long a lease of `limit` lives at most.
    pub fn of(&self, limit: &Limit) -> u64 {
        match limit.algorithm() {
            Algorithm::Fixed | Algorithm::Sliding => self.window_us,
            _ => self.bucket_us,
        }
    }
}

/// Emits the lease call's `ARGV` for `keys`, in the order of their `KEYS`
/// (the memo key after them): `now_us` replaces Redis `TIME` (tests); a
/// lease lives as `lives` says at most.
pub fn write_lease_args(keys: &[LeaseArg], now_us: Option<u64>, lives: Lives, mut emit: impl FnMut(Arg<'_>)) {
    match now_us {
        Some(t) => emit(Arg::Int(t)),
        None => emit(Arg::Str("")),
    }
    emit(Arg::Int(lives.bucket_us));
    emit(Arg::Int(lives.window_us));
    let mut spec = Spec::default();
    for k in keys {
        emit(Arg::Str(spec.of((k.line, 1).into())));
        emit(Arg::Int(k.want));
        emit(Arg::Int(k.back));
        emit(Arg::Int(k.words.0));
        emit(Arg::Int(k.words.1));
    }
}

/// [`write_lease_args`] as strings.
pub fn lease_args(keys: &[LeaseArg], now_us: Option<u64>, lives: Lives) -> Vec<String> {
    let mut args = Vec::new();
    write_lease_args(keys, now_us, lives, |a| args.push(a.to_string()));
    args
}

/// One key's lease, as the lease call grants it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LeaseGrant {
    /// Units granted (0: none).
    pub units: u64,
    /// The words to give them back with ([`LeaseArg::words`]).
    pub words: (u64, u64),
    /// How long the lease lives from when Redis ran the call (µs).
    pub life_us: u64,
    /// What the line has left at once after the grant, and its reset (µs).
    pub remaining: u64,
    pub reset_us: u64,
    /// The units given back were taken back.
    pub taken_back: bool,
    /// When Redis ran the call (µs of its clock).
    pub at_us: u64,
}

/// Integers per key in the lease call's reply.
pub const LEASE_REPLY_PER_KEY: usize = 7;

/// Parses the lease call's reply for `keys` keys: when Redis ran it (µs
/// of its clock) and each key's lease; `None` if it is malformed.
pub fn parse_lease_reply(reply: &[i64], keys: usize) -> Option<(u64, Vec<LeaseGrant>)> {
    let (&now_us, rest) = reply.split_first()?;
    if rest.len() != keys * LEASE_REPLY_PER_KEY {
        return None;
    }
    let n = |v: i64| u64::try_from(v).ok();
    let at_us = n(now_us)?;
    let grants = rest
        .chunks_exact(LEASE_REPLY_PER_KEY)
        .map(|c| {
            Some(LeaseGrant {
                units: n(c[0])?,
                words: (n(c[1])?, n(c[2])?),
                life_us: n(c[3])?,
                remaining: n(c[4])?,
                reset_us: n(c[5])?,
                taken_back: match c[6] {
                    0 => false,
                    1 => true,
                    _ => return None,
                },
                at_us,
            })
        })
        .collect::<Option<Vec<_>>>()?;
    Some((at_us, grants))
}

/// One request's lines' outcomes (inline up to two lines: no allocation for
/// the usual request).
pub type Lines = SmallVec<[Outcome; 2]>;

/// One request's outcome: admitted (every enforced line admits it, see
/// [`crate::verdict::combine`]), each line's outcome, when Redis ran the
/// call (µs of its clock; 0 when its lines took calls to several nodes),
/// and the leases asked with it (by the index of their line among the
/// request's; the lines then are the others).
pub type RequestReply = (bool, Lines, u64, Grants);

/// The leases asked with a request, as it got them (inline: none, or one).
pub type Grants = SmallVec<[(usize, LeaseGrant); 1]>;

/// Integers per line in the script's reply.
pub const REPLY_PER_LINE: usize = 5;

/// A request's lines as [`parse_reply`] reads them: how many, and which are
/// dry-run, and which are leases asked with the request, each right after
/// its line (a number: that many enforced lines).
pub trait Shape {
    /// The request's number of lines.
    fn lines(&self) -> usize;
    /// Whether its line `i` is dry-run.
    fn dry_run(&self, i: usize) -> bool;
    /// Whether its line `i` is a lease asked with it
    /// ([`LineArg::lease_life`]).
    fn lease(&self, _i: usize) -> bool {
        false
    }
}

impl Shape for usize {
    fn lines(&self) -> usize {
        *self
    }
    fn dry_run(&self, _: usize) -> bool {
        false
    }
}

impl Shape for [bool] {
    fn lines(&self) -> usize {
        self.len()
    }
    fn dry_run(&self, i: usize) -> bool {
        self.get(i).copied().unwrap_or(false)
    }
}

impl<S: Shape + ?Sized> Shape for &S {
    fn lines(&self) -> usize {
        (**self).lines()
    }
    fn dry_run(&self, i: usize) -> bool {
        (**self).dry_run(i)
    }
    fn lease(&self, i: usize) -> bool {
        (**self).lease(i)
    }
}

/// The script's reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ScriptReply {
    /// Redis ran the call at `now_us` (µs of its clock): each request's
    /// outcome, in order.
    Done { now_us: u64, requests: Vec<RequestReply> },
    /// Redis ran the call at `now_us`, past its deadline: nothing was
    /// checked or written.
    Late { now_us: u64 },
}

impl ScriptReply {
    /// When Redis ran the call (µs of its clock).
    pub fn now_us(&self) -> u64 {
        match self {
            ScriptReply::Done { now_us, .. } | ScriptReply::Late { now_us } => *now_us,
        }
    }
}

/// Parses the script's reply for requests shaped as `requests` (their
/// numbers of lines, or which of their lines are dry-run); `None` if it is
/// malformed (wrong length, negative values, unknown codes, a delay for a
/// rejected line). A request is admitted iff its enforced lines all are.
pub fn parse_reply<S: Shape>(reply: &[i64], requests: &[S]) -> Option<ScriptReply> {
    if let [-1, now_us] = *reply {
        return Some(ScriptReply::Late { now_us: u64::try_from(now_us).ok()? });
    }
    let (&now_us, mut rest) = reply.split_first()?;
    let now_us = u64::try_from(now_us).ok()?;
    let mut out = Vec::with_capacity(requests.len());
    for shape in requests {
        let len = shape.lines().checked_mul(REPLY_PER_LINE)?;
        if rest.len() < len {
            return None;
        }
        let (mine, after) = rest.split_at(len);
        rest = after;
        let mut lines = Lines::new();
        let mut grants = Grants::new();
        let mut enforced: SmallVec<[bool; 2]> = SmallVec::new();
        for (i, l) in mine.chunks_exact(REPLY_PER_LINE).enumerate() {
            if shape.lease(i) {
                // (asked with the line before it, on the same key: what that line has left,
                // less the units, is what the line has left after the grant)
                let mut g = parse_grant(l, now_us)?;
                g.remaining = lines.last()?.remaining.saturating_sub(g.units);
                grants.push((i, g));
                continue;
            }
            lines.push(parse_line(l)?);
            enforced.push(!shape.dry_run(i));
        }
        let decision = crate::verdict::combine(lines.iter().zip(&enforced).map(|(o, e)| (o, !*e)));
        out.push((decision.admitted, lines, now_us, grants));
    }
    if !rest.is_empty() {
        return None;
    }
    Some(ScriptReply::Done { now_us, requests: out })
}

/// One line's outcome in the script's reply; `None` if it is malformed. A
/// [`Limit::concurrent`] line whose request waits in the key's waiting
/// line (code -3) is not admitted, its ticket as `reset_us` and the places
/// ahead of it as `delay_us` (see [`holders::Holders::take_waiting`]).
fn parse_line(l: &[i64]) -> Option<Outcome> {
    let &[remaining, reset_us, code, delay_us, next_us] = l else { return None };
    let (admitted, retry_after_us, waits) = match code {
        -3 => (false, None, true),
        -2 => (true, None, false),
        -1 => (false, None, false),
        r => (false, Some(u64::try_from(r).ok()?), false),
    };
    let delay_us = u64::try_from(delay_us).ok()?;
    if delay_us > 0 && !admitted && !waits {
        return None;
    }
    if waits && reset_us < 1 {
        return None;
    }
    Some(Outcome {
        admitted,
        remaining: u64::try_from(remaining).ok()?,
        reset_us: u64::try_from(reset_us).ok()?,
        retry_after_us,
        delay_us,
        next_us: u64::try_from(next_us).ok()?,
    })
}

/// A lease asked with a request, in the script's reply (units, words, life
/// left, reset after the grant), Redis having run the call at `at_us`;
/// `None` if it is malformed. What the line has left is the caller's to
/// fill in (the request's line on the key, less the units).
fn parse_grant(l: &[i64], at_us: u64) -> Option<LeaseGrant> {
    let n = |v: i64| u64::try_from(v).ok();
    let &[units, v1, v2, life_us, reset_us] = l else { return None };
    Some(LeaseGrant {
        units: n(units)?,
        words: (n(v1)?, n(v2)?),
        life_us: n(life_us)?,
        remaining: 0,
        reset_us: n(reset_us)?,
        taken_back: false,
        at_us,
    })
}

/// The hash tag of a client key as a number: its SipHash-1-3 with the
/// all-zero key. Deterministic across builds and hosts, hides raw client keys
/// from Redis, and puts all of a client's lines in one Cluster slot.
pub fn tag_of(client_key: &[u8]) -> u64 {
    let mut h = SipHasher13::new_with_keys(0, 0);
    h.write(client_key);
    h.finish()
}

/// [`tag_of`] as it appears in keys: 16 hex digits.
pub fn key_tag(client_key: &[u8]) -> String {
    format!("{:016x}", tag_of(client_key))
}

/// Appends a line's state key, `{prefix}{{{tag:016x}}}:{line_id:016x}`, to
/// `out`.
pub fn write_state_key(out: &mut String, prefix: &str, tag: u64, line_id: u64) {
    out.push_str(prefix);
    // Writing to a String cannot fail.
    let _ = write!(out, "{{{tag:016x}}}:{line_id:016x}");
}

/// A line's state key (see [`write_state_key`]).
pub fn state_key(prefix: &str, tag: u64, line_id: u64) -> String {
    let mut key = String::with_capacity(prefix.len() + 40);
    write_state_key(&mut key, prefix, tag, line_id);
    key
}
