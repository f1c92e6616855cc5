//! Configuration: what the directives (`crate::directives`) leave behind
//! for the request path, merged per location ([`LocConf::merge`]) and
//! finished in postconfiguration ([`finish`]); [`ConfError`], a refusal in
//! nginx's words, logged in one place.
//!
//! Imports run one way: `line`, `shm`, `redis_zone`, `lease` ← `conf` ←
//! `directives` (the directives fill the configuration; nothing here knows
//! them).

mod error;
mod finish;

use ngx::ffi::{ngx_uint_t, NGX_LOG_ERR, NGX_LOG_INFO};

pub(crate) use self::error::refuse;
pub use self::error::{after_parsing, at_directive, ConfError};
pub use self::finish::finish;
use crate::lease::LeaseZone;
use crate::line::{HeadersMode, Line, LineId};
use crate::redis_zone::RedisZone;
use crate::shm::Zone;

/// Boxed zones: their addresses are kept elsewhere (the shm zone's `data`)
/// and must not move.
#[derive(Default)]
#[allow(clippy::vec_box)]
pub struct MainConf {
    pub zones: Vec<Box<Zone>>,
    pub redis: Vec<Box<RedisZone>>,
    /// The Redis zones in lease mode.
    pub leases: Vec<LeaseZone>,
    /// Every `rl_limit` line, in configuration order; [`LineId`] indexes it.
    pub lines: Vec<Line>,
    /// Location configurations that have lines, sorted by zone at postconfiguration.
    pub locs: Vec<*mut LocConf>,
    /// `rl_metrics`: the counters' rows.
    pub metrics: crate::metrics::store::Metrics,
    /// The index of the variable that carries a request's context across
    /// internal redirects (set in postconfiguration).
    pub ctx_var: Option<ngx_uint_t>,
    /// The `http` block's `resolver` and its `resolver_timeout`, if it has
    /// one: Redis zones resolve their host names with it.
    pub resolver: Option<(core::ptr::NonNull<ngx::ffi::ngx_resolver_t>, ngx::ffi::ngx_msec_t)>,
}

impl MainConf {
    pub fn line(&self, id: LineId) -> Option<&Line> {
        id.of(&self.lines)
    }
}

/// `rl_status`, `rl_headers`, `rl_dry_run` and `rl_log_level` as a level
/// gives them, `None` where it does not (the directives refuse a second
/// one). Merging fills each one not given from the enclosing levels; the
/// defaults are applied where the values are read ([`LocConf::status`],
/// [`LocConf::headers`], ...), so that an unset value never looks set.
#[derive(Clone, Copy, Default)]
pub struct Given {
    pub status: Option<ngx_uint_t>,
    pub headers: Option<HeadersMode>,
    pub dry_run: Option<bool>,
    pub log_level: Option<ngx_uint_t>,
}

pub struct LocConf {
    /// The `rl_limit` lines of this level; empty means "inherit" them.
    pub limits: Vec<LineId>,
    /// The `rl_conn` lines of this level; empty means "inherit" them.
    pub conns: Vec<LineId>,
    /// Once merged, the lines that apply: the `rl_limit` lines, then the
    /// `rl_conn` lines, each inherited on its own.
    pub lines: Vec<LineId>,
    /// Some line is on a Redis zone (set at postconfiguration).
    pub has_redis: bool,
    /// Some line is an `rl_conn` line: what it holds is given back when the
    /// request ends (set at postconfiguration).
    pub has_conn: bool,
    /// Some `rl_conn` line is decided by its waiting line (it has a queue or
    /// classes, [`crate::line::Line::waits`]): a request may wait for a
    /// slot before the other lines are decided (set at postconfiguration).
    pub conn_queue: bool,
    /// One of them is on a Redis zone.
    pub redis_queue: bool,
    /// Some line is `after_auth` (set at postconfiguration).
    pub after_auth: bool,
    /// Some line has a queue: a request may be delayed (set at postconfiguration).
    pub may_delay: bool,
    /// Some line is dry-run, or the location is (set at postconfiguration):
    /// an admitted request may have a line that would have limited it.
    pub may_dry_run: bool,
    /// What the directives of this level (and, once merged, of the
    /// enclosing ones) set.
    pub given: Given,
    /// The status of a rejected request: `rl_status` once merged, else the
    /// default.
    pub status: ngx_uint_t,
    /// The level of the "limiting requests" line: `rl_log_level` once
    /// merged, else the default.
    pub log_level: ngx_uint_t,
    /// `rl_quota`: the location reads its lines, it does not enforce them
    /// (not inherited: it is the location's content handler).
    pub quota: bool,
}

impl Default for LocConf {
    fn default() -> Self {
        LocConf {
            limits: Vec::new(),
            conns: Vec::new(),
            lines: Vec::new(),
            has_redis: false,
            has_conn: false,
            conn_queue: false,
            redis_queue: false,
            after_auth: false,
            may_delay: false,
            may_dry_run: false,
            given: Given::default(),
            status: DEFAULT_STATUS,
            log_level: DEFAULT_LOG_LEVEL,
            quota: false,
        }
    }
}

pub const DEFAULT_STATUS: ngx_uint_t = 429;
const DEFAULT_LOG_LEVEL: ngx_uint_t = NGX_LOG_ERR as ngx_uint_t;

/// Redis zones one nginx may declare (a request tracks them in a 64-bit mask).
pub const MAX_REDIS_ZONES: usize = 64;

impl ngx::http::Merge for LocConf {
    fn merge(&mut self, prev: &LocConf) -> Result<(), ngx::http::MergeConfigError> {
        LocConf::merge(self, prev);
        Ok(())
    }
}

impl LocConf {
    /// Merges with the enclosing level, as nginx does for `limit_req` and
    /// `limit_conn`: lines at an inner level replace the outer ones, the
    /// `rl_limit` and the `rl_conn` lines each on their own; a value not
    /// given here is the enclosing level's, else the default.
    pub fn merge(&mut self, prev: &LocConf) {
        if self.limits.is_empty() {
            self.limits = prev.limits.clone();
        }
        if self.conns.is_empty() {
            self.conns = prev.conns.clone();
        }
        self.lines = self.limits.iter().chain(&self.conns).copied().collect();
        let (given, outer) = (&mut self.given, &prev.given);
        given.status = given.status.or(outer.status);
        given.headers = given.headers.or(outer.headers);
        given.dry_run = given.dry_run.or(outer.dry_run);
        given.log_level = given.log_level.or(outer.log_level);
        self.status = given.status.unwrap_or(DEFAULT_STATUS);
        self.log_level = given.log_level.unwrap_or(DEFAULT_LOG_LEVEL);
    }

    pub fn dry_run(&self) -> bool {
        self.given.dry_run.unwrap_or(false)
    }

    /// The level of the "delaying request" line: one below `rl_log_level`,
    /// `info` staying `info`, as `limit_req_log_level` has it.
    pub fn delay_log_level(&self) -> ngx_uint_t {
        (self.log_level + 1).min(NGX_LOG_INFO as ngx_uint_t)
    }

    pub fn headers(&self) -> HeadersMode {
        self.given.headers.unwrap_or(HeadersMode::LEGACY)
    }
}
