//! Redis zones (`rl_zone NAME redis=URL ...`): what a zone is at run time,
//! and its I/O, all on the worker's own event loop (no thread, no tokio
//! runtime): the requests' side ([`worker`]: submitting jobs, suspending
//! and resuming requests), the calls ([`calls`], as `ngx::async_` tasks),
//! and the connections (nginx connections: [`peer`], [`open`], [`conn`],
//! [`zone_conn`]; Cluster and Sentinel).
//!
//! Nothing here reads the configuration module: `directives::redis` builds a
//! [`RedisZone`] and the phase handlers (`access`) hand jobs in.

mod calls;
mod clock;
mod cluster;
mod cluster_link;
mod conn;
pub mod holds;
mod inbox;
mod memcached;
mod open;
mod peer;
mod script;
mod sentinel;
mod timers;
mod tls;
mod worker;
mod zone_conn;

use core::cell::Cell;
use core::fmt;
use std::sync::Arc;
use std::time::Duration;

use ngx::ffi::{ngx_cycle, ngx_log_t, ngx_time, NGX_LOG_ERR};
use ngx::ngx_log_error;
use rl_core::limit::Limit;
use rl_core::redis::RequestReply;
use smallvec::SmallVec;

pub use self::conn::{McAddr, Target};
pub use self::tls::client_config as tls_config;
pub use self::worker::{
    beat, charge, exit_worker, init_worker, lease, post_flush, resume, start_holds, submit, suspend, Hooks,
};

/// A Redis zone as configured.
pub struct RedisZone {
    pub name: String,
    /// The URL with any password replaced by `***`, for messages.
    pub shown: String,
    pub spec: ZoneSpec,
    pub on_error_allow: bool,
    /// The zone has `rl_conn` lines: the workers keep what they hold of it
    /// ([`holds`]).
    pub holds: bool,
    /// Errors seen by this worker (timeouts included).
    errors: Cell<u64>,
    /// Log throttling: the second of the last message and messages in it.
    log_second: Cell<i64>,
    log_count: Cell<u32>,
    /// The same for `charge=after` charges, apart: a storm of failed
    /// requests does not hide that charges failed.
    charge_log_second: Cell<i64>,
    charge_log_count: Cell<u32>,
}

/// Messages a zone logs per second at most.
const LOG_PER_SECOND: u32 = 3;

impl RedisZone {
    pub fn new(name: &str, shown: String, spec: ZoneSpec, on_error_allow: bool) -> RedisZone {
        RedisZone {
            name: name.to_string(),
            shown,
            spec,
            on_error_allow,
            holds: false,
            errors: Cell::new(0),
            log_second: Cell::new(0),
            log_count: Cell::new(0),
            charge_log_second: Cell::new(0),
            charge_log_count: Cell::new(0),
        }
    }

    /// Counts a failure and logs it, a few lines per second at most.
    pub fn failed(&self, log: *mut ngx_log_t, e: &RedisError) {
        self.failed_doing(log, e, if self.on_error_allow { "allowing request" } else { "denying request" });
    }

    /// [`RedisZone::failed`], saying what is done instead (`action`).
    pub fn failed_doing(&self, log: *mut ngx_log_t, e: &RedisError, action: &str) {
        self.errors.set(self.errors.get() + 1);
        if budget(&self.log_second, &self.log_count) {
            self.log_failure(log, e, action);
        }
    }

    /// A `charge=after` charge failed (`lines` lines): logged within a
    /// budget of its own, saying whether the cost is known not charged.
    pub fn charge_failed(&self, log: *mut ngx_log_t, e: &RedisError, lines: usize) {
        self.errors.set(self.errors.get() + 1);
        if budget(&self.charge_log_second, &self.charge_log_count) {
            let action = match (e.not_applied(), lines) {
                (true, 1) => "the cost of a request is not charged".to_string(),
                (true, n) => format!("the costs of {n} requests are not charged"),
                (false, 1) => "the cost of a request may or may not be charged".to_string(),
                (false, n) => format!("the costs of {n} requests may or may not be charged"),
            };
            self.log_failure(log, e, &action);
        }
    }

    /// The undo of a call whose requests were answered per `on_error`
    /// failed (for one of its requests): logged within the charges' budget.
    pub fn undo_failed(&self, log: *mut ngx_log_t, e: &RedisError) {
        self.errors.set(self.errors.get() + 1);
        if budget(&self.charge_log_second, &self.charge_log_count) {
            self.log_failure(log, e, "a request refused or answered per on_error may have been charged");
        }
    }

    /// What the zone is on, as messages and metrics name it.
    pub fn store(&self) -> &'static str {
        match self.spec.target {
            Target::Memcached(_) => "memcached",
            _ => "redis",
        }
    }

    /// A Memcached zone.
    pub fn is_memcached(&self) -> bool {
        matches!(self.spec.target, Target::Memcached(_))
    }

    fn log_failure(&self, log: *mut ngx_log_t, e: &RedisError, action: &str) {
        let shown = match e {
            RedisError::At(server, _) => server.as_str(),
            _ => self.shown.as_str(),
        };
        let e = Shown(e.inner(), self.spec.timeout);
        ngx_log_error!(
            NGX_LOG_ERR,
            log,
            "rl_zone \"{}\" {} {} failed: {}, {} ({} errors so far)",
            self.name,
            self.store(),
            shown,
            e,
            action,
            self.errors.get()
        );
    }
}

/// The cycle's log, for handlers that have no other.
pub(crate) fn cycle_log() -> *mut ngx_log_t {
    // SAFETY: ngx_cycle is set before any module code runs in a worker and stays valid.
    unsafe { (*ngx_cycle).log }
}

/// This host's name (empty if it has none), which names this nginx in
/// what it keeps in Redis beside its process ids.
pub fn host_name() -> String {
    let mut host = [0u8; 256];
    // SAFETY: the buffer is writable for its length; gethostname NUL-terminates what fits.
    let ok = unsafe { libc::gethostname(host.as_mut_ptr().cast(), host.len() - 1) } == 0;
    let len = host.iter().position(|&b| b == 0).unwrap_or(0);
    // (no space: the name goes in a script argument of space-separated words)
    match ok {
        true => String::from_utf8_lossy(&host[..len]).replace(' ', "_"),
        false => String::new(),
    }
}

/// Takes one line of a budget of [`LOG_PER_SECOND`] (`second`: the second
/// of the last line, `count`: lines in it); false when it is spent.
pub(super) fn budget(second: &Cell<i64>, count: &Cell<u32>) -> bool {
    let now = ngx_time() as i64;
    if second.get() != now {
        second.set(now);
        count.set(0);
    }
    let left = count.get() < LOG_PER_SECOND;
    if left {
        count.set(count.get() + 1);
    }
    left
}

/// Why a zone could not decide a request. The kind decides what happens to
/// the connection (see `ZoneConn::retrying`); the text is for the log.
#[derive(Clone, Debug)]
pub enum RedisError {
    /// The connection failed, broke, or goes to a replica (`READONLY`): a new
    /// connection may help.
    Io(String),
    /// Waiting out the back-off after a failed connection attempt.
    NotConnected { last: String },
    /// A connection attempt failed (nothing of the call was sent).
    Unreachable(String),
    /// No reply within the zone's `timeout`.
    Timeout,
    /// Redis ran the call after its deadline (see [`clock`]), so it did
    /// nothing.
    Late,
    /// The server answered with an error.
    Server(String),
    /// A Memcached server's reply is none memcached sends (what it looks
    /// like, for the log); the connection is closed.
    Protocol(String),
    /// The error of one server of a Memcached zone (its address): the log
    /// names that server, not the zone's list.
    At(String, Box<RedisError>),
    /// The reply is not one the script can have sent: not an array of
    /// integers, the wrong length, or a value out of the line's range
    /// (what is wrong, for the log).
    Malformed(String),
    /// Too many of this worker's requests wait for the zone's Redis (see
    /// `calls::MAX_WAITING`): `on_error` at once.
    Overloaded,
    /// The call did not end in time (the backstop: a call always ends by
    /// the zone's timeout).
    Unanswered,
    /// The job could not be handed in (the worker's zones are not running,
    /// or nginx had no memory for the request's cleanup).
    NotSent,
    /// The job named a zone the worker does not have.
    NoZone,
}

impl RedisError {
    /// A new connection may help.
    pub fn is_io(&self) -> bool {
        matches!(self.inner(), RedisError::Io(_))
    }

    /// The error itself, without the server it came from.
    pub fn inner(&self) -> &RedisError {
        match self {
            RedisError::At(_, e) => e.inner(),
            e => e,
        }
    }

    /// The call is known not to have changed anything in Redis: it was not
    /// sent, or Redis refused it with an error reply. Else (a timeout, a
    /// connection broken or given up with the call on it, a reply that is
    /// not the script's) Redis may have run it.
    pub fn not_applied(&self) -> bool {
        matches!(
            self.inner(),
            RedisError::NotConnected { .. }
                | RedisError::Unreachable(_)
                | RedisError::Server(_)
                | RedisError::Late
                | RedisError::Overloaded
                | RedisError::NotSent
                | RedisError::NoZone
        )
    }
}

impl fmt::Display for RedisError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RedisError::Io(e) | RedisError::Server(e) | RedisError::Unreachable(e) => f.write_str(e),
            RedisError::Protocol(e) => write!(f, "bad reply: {e}"),
            RedisError::At(_, e) => e.fmt(f),
            RedisError::NotConnected { last } => write!(f, "not connected, reconnecting after: {last}"),
            RedisError::Timeout => f.write_str("timed out"),
            RedisError::Late => f.write_str("timed out (Redis ran the call past its deadline and wrote nothing)"),
            RedisError::Malformed(what) if what.is_empty() => f.write_str("malformed script reply"),
            RedisError::Malformed(what) => write!(f, "malformed script reply: {what}"),
            RedisError::Overloaded => write!(f, "too many requests waiting ({} per worker)", calls::MAX_WAITING),
            RedisError::Unanswered => f.write_str("no reply in time"),
            RedisError::NotSent => f.write_str("the call could not be sent"),
            RedisError::NoZone => f.write_str("no such zone"),
        }
    }
}

/// An error as the log shows it: a timeout with the zone's timeout.
struct Shown<'a>(&'a RedisError, Duration);

impl fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            RedisError::Timeout => write!(f, "timed out ({} ms)", self.1.as_millis()),
            RedisError::Late => write!(
                f,
                "timed out ({} ms; Redis ran the call past its deadline and wrote nothing)",
                self.1.as_millis()
            ),
            e => e.fmt(f),
        }
    }
}

/// What a zone's connections need to know of it.
#[derive(Clone)]
pub struct ZoneSpec {
    pub target: Target,
    pub timeout: Duration,
    /// Prepended to every state key.
    pub prefix: String,
    /// For `rediss` URLs: the TLS client, which trusts the zone's
    /// `ssl_trusted_certificate` (else the public roots) and shows its
    /// `ssl_certificate`.
    pub tls: Option<Arc<rustls::ClientConfig>>,
}

/// The id of a charge job, and of its replies (requests' ids start at 1).
pub const CHARGE_ID: u64 = 0;

/// The id of the replies that report an undo that failed (one per request
/// of the call; requests' ids never reach it).
pub const UNDO_ID: u64 = u64::MAX;

/// One request's lines on one Redis zone: to decide, or (`charge`) to
/// charge after the response, in full and with no reply awaited.
pub struct Job {
    pub id: u64,
    pub zone: usize,
    /// Charge the lines (a request), or only read them (an `rl_quota`
    /// read: the script's check-only mode, which writes nothing). Jobs of
    /// the two kinds never share a script call.
    pub commit: bool,
    /// A `charge=after` job: its lines are charged in full, no request
    /// waits for it (never with a read).
    pub charge: bool,
    /// Inline up to two lines: no allocation for the usual request.
    pub lines: SmallVec<[JobLine; 2]>,
}

/// A line of a job: whose state (the client key's tag, see
/// [`rl_core::redis::tag_of`], and the line's id), and what to check.
#[derive(Clone, Copy)]
pub struct JobLine {
    pub tag: u64,
    pub line_id: u64,
    pub limit: Limit,
    pub cost: u64,
    /// Charged only if it admits and the request's enforced lines do; it
    /// never rejects the request.
    pub dry_run: bool,
    /// A `charge=after` line in the access phase: admits while one unit is
    /// left, charges nothing.
    pub check_only: bool,
    /// Reports the wait for one more unit (`RateLimit`'s `t`): rl-core's
    /// `Outcome::next_us`.
    pub next: bool,
    /// [`crate::line::Line::deepest_queue`]: the reply's range.
    pub deepest_queue: u64,
    /// Not a line of the request but a lease of `cost` units at most asked
    /// with it for the line before it, living this long (µs; 0: a line of
    /// the request): rl-core's [`rl_core::redis::LineArg::lease_life`].
    pub lease_life: u64,
    /// A line of classes: the units the request leaves to the classes above
    /// its own ([`rl_core::redis::LineArg::kept`]).
    pub kept: u64,
    /// An `rl_conn` line: the worker that takes its units, and when
    /// ([`holds::take`]).
    pub holder: Option<rl_core::redis::Holder>,
    /// A waiting `rl_conn` line's place and time left (see
    /// [`rl_core::redis::Wait`]); `None`: let in or refused at once.
    pub wait: Option<rl_core::redis::Wait>,
    /// A line of classes: the request's class and the line's.
    pub classes: Option<rl_core::redis::ClassArg>,
}

/// One key of a node's sync in lease mode: whose state (as [`JobLine`]
/// names it), and what is asked of it.
#[derive(Clone, Copy)]
pub struct LeaseKey {
    pub tag: u64,
    pub line_id: u64,
    pub arg: rl_core::redis::LeaseArg,
}

/// One `conn_put` call's worth of a worker's `rl_conn` changes (see
/// [`holds`]): one op per key (a client key's tag and a line id), of
/// `worker`, whose fields live `life_ms`.
pub struct HoldBatch {
    pub ops: Vec<((u64, u64), rl_core::redis::HoldOp)>,
    pub worker: &'static str,
    pub life_ms: u64,
}

/// A request's lines as the script's reply is read: which are dry-run.
pub struct JobShape<'a>(pub &'a [JobLine]);

impl rl_core::redis::Shape for JobShape<'_> {
    fn lines(&self) -> usize {
        self.0.len()
    }
    fn dry_run(&self, i: usize) -> bool {
        self.0.get(i).is_some_and(|l| l.dry_run)
    }
    fn lease(&self, i: usize) -> bool {
        self.0.get(i).is_some_and(|l| l.lease_life > 0)
    }
}

/// A zone's answer to a job.
pub struct Reply {
    pub id: u64,
    pub zone: usize,
    pub result: Result<RequestReply, RedisError>,
}
