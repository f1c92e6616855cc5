//! Configuration: what the directives ([`directives`]) leave behind for the
//! request path, merged per location and finished in postconfiguration.
//!
//! Imports run one way: `line` ← `conf` ← `shm`, `redis_zone` are read
//! here only to declare zones; nothing under `conf` is imported by them.

pub mod directives;
pub mod redis;

use core::ffi::c_void;
use core::sync::atomic::AtomicU64;
use core::{mem, ptr};
use std::collections::HashMap;
use std::fmt::{self, Write as _};

use ngx::ffi::{ngx_conf_t, ngx_log_t, ngx_pool_cleanup_add, ngx_uint_t, NGX_LOG_EMERG, NGX_LOG_ERR, NGX_LOG_INFO};
use ngx::ngx_log_error;

use crate::line::{Backend, HeadersMode, Line, LineId, Stage};
use crate::redis_zone::RedisZone;
use crate::shm::Zone;

/// Text from the configuration as a message quotes it: control characters
/// escaped (a message is one line) and cut after [`Quote::MAX`] bytes, so
/// that nginx, which truncates long configuration messages, does not cut
/// off the reason and the directive that follow.
pub struct Quote<'a>(pub &'a str);

impl Quote<'_> {
    pub const MAX: usize = 255;
}

impl fmt::Display for Quote<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut end = self.0.len().min(Quote::MAX);
        while !self.0.is_char_boundary(end) {
            end -= 1;
        }
        for c in self.0[..end].chars() {
            if c.is_control() {
                write!(f, "{}", c.escape_default())?;
            } else {
                f.write_char(c)?;
            }
        }
        if end < self.0.len() {
            f.write_str("...")?;
        }
        Ok(())
    }
}

/// Boxed zones: their addresses are kept elsewhere (the shm zone's `data`)
/// and must not move.
#[derive(Default)]
#[allow(clippy::vec_box)]
pub struct MainConf {
    pub zones: Vec<Box<Zone>>,
    pub redis: Vec<Box<RedisZone>>,
    /// Every `rl_limit` line, in configuration order; [`LineId`] indexes it.
    pub lines: Vec<Line>,
    /// Location configurations that have lines, sorted by zone at postconfiguration.
    pub locs: Vec<*mut LocConf>,
    /// `rl_metrics`: the counters' rows.
    pub metrics: crate::metrics::store::Metrics,
    /// The index of the variable that carries a request's context across
    /// internal redirects (set in postconfiguration).
    pub ctx_var: Option<ngx_uint_t>,
}

impl MainConf {
    pub fn line(&self, id: LineId) -> Option<&Line> {
        id.of(&self.lines)
    }
}

pub struct LocConf {
    /// Lines of this level; empty means "inherit".
    pub lines: Vec<LineId>,
    /// Some line is on a Redis zone (set at postconfiguration).
    pub has_redis: bool,
    /// Some line is `after_auth` (set at postconfiguration).
    pub after_auth: bool,
    /// Some line has a queue: a request may be delayed (set at postconfiguration).
    pub may_delay: bool,
    /// Some line is dry-run, or the location is (set at postconfiguration):
    /// an admitted request may have a line that would have limited it.
    pub may_dry_run: bool,
    pub status: ngx_uint_t,
    pub headers: Option<HeadersMode>,
    /// `rl_dry_run`: every line of the location is dry-run.
    pub dry_run: Option<bool>,
    /// The level of the "limiting requests" line (`rl_log_level`).
    pub log_level: ngx_uint_t,
    /// `rl_quota`: the location reads its lines, it does not enforce them
    /// (not inherited: it is the location's content handler).
    pub quota: bool,
}

impl Default for LocConf {
    fn default() -> Self {
        LocConf {
            lines: Vec::new(),
            has_redis: false,
            after_auth: false,
            may_delay: false,
            may_dry_run: false,
            status: ngx_uint_t::MAX,
            headers: None,
            dry_run: None,
            log_level: ngx_uint_t::MAX,
            quota: false,
        }
    }
}

pub const DEFAULT_STATUS: ngx_uint_t = 429;

/// Redis zones one nginx may declare (a request tracks them in a 64-bit mask).
pub const MAX_REDIS_ZONES: usize = 64;

impl ngx::http::Merge for LocConf {
    fn merge(&mut self, prev: &LocConf) -> Result<(), ngx::http::MergeConfigError> {
        LocConf::merge(self, prev);
        Ok(())
    }
}

impl LocConf {
    /// Merges with the enclosing level, as nginx does for `limit_req`: lines
    /// at an inner level replace the outer ones.
    pub fn merge(&mut self, prev: &LocConf) {
        if self.lines.is_empty() {
            self.lines = prev.lines.clone();
        }
        if self.status == ngx_uint_t::MAX {
            self.status = if prev.status == ngx_uint_t::MAX { DEFAULT_STATUS } else { prev.status };
        }
        if self.headers.is_none() {
            self.headers = Some(prev.headers.unwrap_or(HeadersMode::LEGACY));
        }
        if self.dry_run.is_none() {
            self.dry_run = Some(prev.dry_run.unwrap_or(false));
        }
        if self.log_level == ngx_uint_t::MAX {
            self.log_level = if prev.log_level == ngx_uint_t::MAX { NGX_LOG_ERR as ngx_uint_t } else { prev.log_level };
        }
    }

    pub fn dry_run(&self) -> bool {
        self.dry_run.unwrap_or(false)
    }

    /// The level of the "delaying request" line: one below `rl_log_level`,
    /// `info` staying `info`, as `limit_req_log_level` has it.
    pub fn delay_log_level(&self) -> ngx_uint_t {
        (self.log_level + 1).min(NGX_LOG_INFO as ngx_uint_t)
    }

    pub fn headers(&self) -> HeadersMode {
        self.headers.unwrap_or(HeadersMode::LEGACY)
    }
}

/// Refuses two lines of one zone and name that differ in what a state
/// means (key, algorithm, rate, burst): they would share states.
fn check_names(log: *mut ngx_log_t, lines: &[Line]) -> Result<(), ()> {
    let mut first: HashMap<(&str, &str), &Line> = HashMap::new();
    for line in lines {
        let Some(name) = line.name.as_deref() else { continue };
        let prev = *first.entry((&line.zone_name, name)).or_insert(line);
        let differs = if prev.key_src != line.key_src {
            Some(("key", prev.key_src.clone(), line.key_src.clone()))
        } else if prev.limit.algorithm() != line.limit.algorithm() {
            Some(("algorithm", prev.limit.algorithm().to_string(), line.limit.algorithm().to_string()))
        } else if prev.rate_src != line.rate_src {
            Some(("rate", prev.rate_src.clone(), line.rate_src.clone()))
        } else if prev.burst_src != line.burst_src {
            Some(("burst", prev.burst_src.clone(), line.burst_src.clone()))
        } else {
            None
        };
        if let Some((what, was, is)) = differs {
            ngx_log_error!(
                NGX_LOG_EMERG,
                log,
                "rl_limit \"{}\" of zone \"{}\" uses {}={} while previously ({}) it used {}={} in {}",
                name,
                Quote(&line.zone_name),
                what,
                Quote(&is),
                prev.origin,
                what,
                Quote(&was),
                line.origin
            );
            return Err(());
        }
    }
    Ok(())
}

/// Gives the lines with variables a word in memory every worker shares,
/// for the time each last logged a bad value (at most once a second per
/// line, whatever the workers): anonymous shared memory mapped before the
/// workers fork, unmapped with the cycle's pool. Without it (mmap failed),
/// each worker keeps its own.
fn share_log_times(cf: *mut ngx_conf_t, mcf: &mut MainConf) {
    let n = mcf.lines.iter().filter(|l| l.vars.is_some()).count();
    if n == 0 {
        return;
    }
    let bytes = n * mem::size_of::<AtomicU64>();
    // SAFETY: a new anonymous mapping, shared with the processes forked after it.
    let p = unsafe {
        libc::mmap(
            ptr::null_mut(),
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return;
    }
    // SAFETY: cf->pool is the cycle's pool, destroyed with the cycle.
    let Some(cln) = (unsafe { ngx_pool_cleanup_add((*cf).pool, mem::size_of::<Mapping>()).as_mut() }) else {
        // SAFETY: mapped above, used by nothing yet.
        unsafe { libc::munmap(p, bytes) };
        return;
    };
    // SAFETY: ngx_pool_cleanup_add allocated size_of::<Mapping>() bytes for the data.
    unsafe { cln.data.cast::<Mapping>().write(Mapping { addr: p, bytes }) };
    cln.handler = Some(unmap);
    let words = p.cast::<AtomicU64>();
    for (i, vars) in mcf.lines.iter_mut().filter_map(|l| l.vars.as_deref_mut()).enumerate() {
        // SAFETY: i < n words of the zero-filled mapping (zero is a valid AtomicU64), which lives
        // as long as the cycle's pool, as the lines do.
        unsafe { vars.share(words.add(i)) };
    }
}

/// A mapping to undo when the cycle's pool is destroyed.
struct Mapping {
    addr: *mut c_void,
    bytes: usize,
}

extern "C" fn unmap(data: *mut c_void) {
    // SAFETY: the Mapping written by share_log_times, in the cleanup's data.
    let m = unsafe { &*data.cast::<Mapping>() };
    // SAFETY: mapped by share_log_times; the lines that used it go with the same pool.
    unsafe { libc::munmap(m.addr, m.bytes) };
}

/// Resolves zone names, gives each line its identity and sorts every
/// location's lines by zone (the order in which zone locks are taken).
/// Errors are logged here, naming the directive and its `file:line` as
/// nginx does for errors found after parsing (`ngx_conf_log_error` would
/// add the position nginx has reached, the end of `http {}`).
pub fn finish(cf: *mut ngx_conf_t, mcf: &mut MainConf) -> Result<(), ()> {
    // SAFETY: cf is the http{} configuration being finished; its log is the cycle's.
    let log = unsafe { (*cf).log };
    if let Err(()) = check_names(log, &mcf.lines) {
        return Err(());
    }
    for line in mcf.lines.iter_mut() {
        let shm = mcf.zones.iter().position(|z| z.name == line.zone_name);
        let redis = mcf.redis.iter().position(|z| z.name == line.zone_name);
        line.backend = match (shm, redis) {
            (Some(i), _) => Backend::Shm(i),
            (None, Some(i)) => Backend::Redis(i),
            (None, None) => {
                // (a limit_req habit's hint before the place, where nginx's own messages end)
                let hint = rl_core::habits::limit_zone(&line.zone_name).map(|h| format!(", {h}")).unwrap_or_default();
                ngx_log_error!(
                    NGX_LOG_EMERG,
                    log,
                    "unknown zone \"{}\" in \"rl_limit\" directive{} in {}",
                    Quote(&line.zone_name),
                    hint,
                    line.origin
                );
                return Err(());
            }
        };
        line.id = line.identity();
        match line.backend {
            Backend::Shm(i) => mcf.zones[i].note_line(&line.limit),
            // A rate or burst from variables is checked per request.
            Backend::Redis(_) if !line.limit_varies() && !rl_core::redis::exact(&line.limit) => {
                ngx_log_error!(
                    NGX_LOG_EMERG,
                    log,
                    "rate {} with burst {} is out of the range a Redis zone computes exactly in \"rl_limit\" directive in {}",
                    line.limit.rate(),
                    line.limit.burst(),
                    line.origin
                );
                return Err(());
            }
            Backend::Redis(_) => {}
        }
    }
    share_log_times(cf, mcf);
    // Lines with one identity share states, queued units included, and
    // overdrafts (which only the script's exact range bounds).
    let mut deepest: HashMap<u64, u64> = HashMap::new();
    for line in &mcf.lines {
        let d = deepest.entry(line.id).or_insert(0);
        *d = match line.charge_after {
            true => rl_core::redis::OVERDRAWN,
            false => (*d).max(line.limit.queue()),
        };
    }
    for line in mcf.lines.iter_mut() {
        line.deepest_queue = deepest.get(&line.id).copied().unwrap_or(0);
    }
    let lines = &mcf.lines;
    let backend = |id: &LineId| lines.get(id.0 as usize).map(|l| l.backend);
    for &loc in &mcf.locs {
        // SAFETY: registered in merge_loc_conf; location confs live as long as the cycle.
        let loc = unsafe { &mut *loc };
        // (at most MAX_ZONES_PER_LOCATION zones: cmd_rl_limit counts them)
        loc.lines.sort_by_key(backend);
        loc.has_redis = loc.lines.iter().any(|id| matches!(backend(id), Some(Backend::Redis(_))));
        loc.after_auth =
            loc.lines.iter().any(|id| lines.get(id.0 as usize).is_some_and(|l| l.stage == Stage::AfterAuth));
        loc.may_delay = loc.lines.iter().any(|id| lines.get(id.0 as usize).is_some_and(|l| l.limit.queue() > 0));
        loc.may_dry_run =
            loc.dry_run() || loc.lines.iter().any(|id| lines.get(id.0 as usize).is_some_and(|l| l.dry_run));
    }
    for zone in mcf.zones.iter_mut() {
        if let Err(msg) = zone.check_fits() {
            ngx_log_error!(NGX_LOG_EMERG, log, "{} in \"rl_zone\" directive in {}", msg, zone.origin);
            return Err(());
        }
    }
    Ok(())
}
