//! The access-phase handler: evaluates every `rl_limit` line of the location
//! for the request, all-or-nothing, and remembers the outcome for the
//! response headers.

use core::ffi::c_void;
use core::{mem, ptr, slice};

use ngx::core::Status;
use ngx::ffi::{
    ngx_current_msec, ngx_http_complex_value, ngx_http_request_t, ngx_log_t, ngx_pcalloc, ngx_pool_cleanup_add,
    ngx_str_t, ngx_time, NGX_LOG_ERR,
};
use ngx::http::{HttpModule, HttpModuleLocationConf, HttpModuleMainConf, Request};
use ngx::ngx_log_error;

use crate::config::{HeadersMode, Line};
use crate::zone::Locked;
use crate::Module;

/// Distinct zones one location may use (their locks are held together).
pub const MAX_ZONES_PER_LOCATION: usize = 16;

/// The outcome of one line for this request.
#[derive(Clone, Copy, Default)]
pub struct LineResult {
    /// The key was non-empty and the line was evaluated.
    pub active: bool,
    pub admitted: bool,
    pub remaining: u64,
    pub reset_us: u64,
    pub retry_after_us: u64,
    hash: [u64; 2],
    lock: usize,
}

/// Per-request state, allocated from the request pool and kept across
/// internal redirects (see [`get_ctx`]).
pub struct Ctx {
    pub lines: *const *const Line,
    pub results: *mut LineResult,
    pub n: usize,
    pub rejected: bool,
    pub headers: HeadersMode,
    /// Unix time of the decision, seconds.
    pub now_unix: i64,
}

impl Ctx {
    /// Each line with its outcome.
    pub fn iter(&self) -> impl Iterator<Item = (&Line, &LineResult)> {
        // SAFETY: both arrays have n elements: lines from the location configuration (alive for
        // the cycle), results from the request pool.
        let (lines, results) = unsafe { (slice::from_raw_parts(self.lines, self.n), slice::from_raw_parts(self.results, self.n)) };
        // SAFETY: configuration lines live as long as the cycle.
        lines.iter().map(|l| unsafe { &**l }).zip(results.iter())
    }
}

/// Marks the request-pool cleanup that carries our context, so that it can
/// be found again after an internal redirect wipes `r->ctx`.
extern "C" fn ctx_marker(_data: *mut c_void) {}

/// The request's context: from `r->ctx`, or recovered from the pool after an
/// internal redirect (index, try_files, error_page) so that a request is
/// counted once.
pub fn get_ctx(r: &Request) -> Option<&'static mut Ctx> {
    let raw: *const ngx_http_request_t = r.into();
    let index = Module::module().ctx_index;
    // SAFETY: r->ctx has one slot per http module; ours holds NULL or a pool-allocated Ctx.
    let ctx = unsafe { *(*raw).ctx.add(index) }.cast::<Ctx>();
    // SAFETY: see above; the Ctx lives as long as the request.
    if let Some(ctx) = unsafe { ctx.as_mut() } {
        return Some(ctx);
    }
    // SAFETY: the request and its pool are valid; the cleanup list is a linked list owned by the pool.
    let mut c = unsafe { (*(*raw).pool).cleanup };
    // SAFETY: as above.
    while let Some(cl) = unsafe { c.as_ref() } {
        // The marker is compared by address: one definition in this crate, built as a single
        // codegen unit, so the address is unique.
        if cl.handler.map(|f| f as usize) == Some(ctx_marker as extern "C" fn(*mut c_void) as usize) && !cl.data.is_null() {
            r.set_module_ctx(cl.data, Module::module());
            // SAFETY: set by new_ctx below to a pool-allocated Ctx.
            return Some(unsafe { &mut *cl.data.cast::<Ctx>() });
        }
        c = cl.next;
    }
    None
}

fn new_ctx(r: &Request, lines: &[*const Line], headers: HeadersMode) -> Option<&'static mut Ctx> {
    let raw: *const ngx_http_request_t = r.into();
    // SAFETY: the request pool is valid for the request's lifetime.
    let pool = unsafe { (*raw).pool };
    let size = mem::size_of::<Ctx>() + lines.len() * mem::size_of::<LineResult>();
    // SAFETY: pool is valid; zeroed memory is a valid LineResult array and is initialised below.
    let ctx = unsafe { ngx_pcalloc(pool, size) }.cast::<Ctx>();
    if ctx.is_null() {
        return None;
    }
    // SAFETY: ngx_pcalloc aligns to NGX_ALIGNMENT (pointer size); Ctx and LineResult need 8.
    let results = unsafe { ctx.add(1).cast::<LineResult>() };
    // SAFETY: ctx points to size bytes.
    unsafe {
        ptr::write(ctx, Ctx { lines: lines.as_ptr(), results, n: lines.len(), rejected: false, headers, now_unix: ngx_time() as i64 })
    };
    // SAFETY: as above.
    let cln = unsafe { ngx_pool_cleanup_add(pool, 0) };
    // SAFETY: ngx_pool_cleanup_add returns NULL or a cleanup entry of the pool.
    let cln = unsafe { cln.as_mut() }?;
    cln.handler = Some(ctx_marker);
    cln.data = ctx.cast();
    r.set_module_ctx(ctx.cast(), Module::module());
    // SAFETY: initialised above.
    Some(unsafe { &mut *ctx })
}

ngx::http_request_handler!(access_handler, access);

/// The access-phase handler, for registration in postconfiguration.
pub fn access_handler_pt() -> ngx::ffi::ngx_http_handler_pt {
    Some(access_handler)
}

fn access(r: &mut Request) -> Status {
    let raw: *mut ngx_http_request_t = (&mut *r).into();
    // SAFETY: the request is valid during the phase handler.
    if unsafe { (*raw).main } != raw {
        return Status::NGX_DECLINED;
    }
    let Some(lcf) = Module::location_conf(r) else {
        return Status::NGX_DECLINED;
    };
    if lcf.lines.is_empty() || get_ctx(r).is_some() {
        return Status::NGX_DECLINED;
    }
    let Some(ctx) = new_ctx(r, &lcf.lines, lcf.headers()) else {
        return Status(500);
    };
    // SAFETY: ctx.results has ctx.n elements, zeroed.
    let results = unsafe { slice::from_raw_parts_mut(ctx.results, ctx.n) };
    match decide(r, &lcf.lines, results) {
        Ok(true) => Status::NGX_DECLINED,
        Ok(false) => {
            ctx.rejected = true;
            log_rejection(r.log(), ctx);
            Status(lcf.status as isize)
        }
        Err(()) => Status(500),
    }
}

/// Evaluates the lines (sorted by zone): checks all, then commits all if
/// every one admits. Returns whether the request is admitted.
fn decide(r: &Request, lines: &[*const Line], results: &mut [LineResult]) -> Result<bool, ()> {
    let raw: *const ngx_http_request_t = r.into();
    let Some(mcf) = Module::main_conf(r) else {
        return Ok(true);
    };
    // SAFETY: ngx_current_msec is the worker's cached monotonic clock.
    let now_us = unsafe { ngx_current_msec } as u64 * 1000;
    let now_s = (now_us / 1_000_000) as u32;
    let log = r.log();

    let mut locks: [Option<Locked<'_>>; MAX_ZONES_PER_LOCATION] = [const { None }; MAX_ZONES_PER_LOCATION];
    let mut zones = [usize::MAX; MAX_ZONES_PER_LOCATION];
    let mut nlocks = 0;

    // Keys, locks and entries.
    for (line, res) in lines.iter().zip(results.iter_mut()) {
        // SAFETY: configuration lines live as long as the cycle.
        let line = unsafe { &**line };
        let mut key = ngx_str_t { len: 0, data: ptr::null_mut() };
        // SAFETY: the key was compiled at configuration time; the value is allocated in r->pool.
        if unsafe { ngx_http_complex_value(raw as *mut _, line.key, &mut key) } != 0 {
            return Err(());
        }
        if key.len == 0 {
            continue;
        }
        if nlocks == 0 || zones[nlocks - 1] != line.zone {
            if nlocks == MAX_ZONES_PER_LOCATION {
                return Err(());
            }
            let Some(zone) = mcf.zones.get(line.zone) else {
                continue;
            };
            let Some(mut locked) = zone.lock() else {
                ngx_log_error!(NGX_LOG_ERR, log, "rl_zone \"{}\" is not initialised", zone.name);
                continue;
            };
            locked.expire(now_s);
            locks[nlocks] = Some(locked);
            zones[nlocks] = line.zone;
            nlocks += 1;
        }
        let Some(locked) = locks[nlocks - 1].as_mut() else {
            continue;
        };
        res.hash = locked.table.hash_key(line.id, key.as_bytes());
        res.lock = nlocks - 1;
        res.active = locked.ensure(res.hash, &line.limit, now_s, log);
    }

    // Check every line, charging nothing.
    let mut admitted = true;
    for (line, res) in lines.iter().zip(results.iter_mut()).filter(|(_, res)| res.active) {
        // SAFETY: as above.
        let line = unsafe { &**line };
        let Some(locked) = locks[res.lock].as_mut() else {
            continue;
        };
        let Some(state) = locked.state(res.hash, &line.limit) else {
            res.active = false;
            continue;
        };
        let o = line.limit.check(state, now_us, line.cost);
        res.admitted = o.admitted;
        res.remaining = o.remaining;
        res.reset_us = o.reset_us;
        res.retry_after_us = o.retry_after_us.unwrap_or(u64::MAX);
        admitted &= o.admitted;
    }
    if !admitted {
        return Ok(false);
    }

    // Every line admits: charge them all.
    for (line, res) in lines.iter().zip(results.iter_mut()).filter(|(_, res)| res.active) {
        // SAFETY: as above.
        let line = unsafe { &**line };
        let Some(locked) = locks[res.lock].as_mut() else {
            continue;
        };
        let Some(state) = locked.state(res.hash, &line.limit) else {
            continue;
        };
        let o = line.limit.acquire(state, now_us, line.cost);
        res.remaining = o.remaining;
        res.reset_us = o.reset_us;
        let idle_at = (now_us + o.reset_us).div_ceil(1_000_000);
        locked.set_idle_at(res.hash, idle_at.min(u64::from(u32::MAX)) as u32);
    }
    Ok(true)
}

/// One line per rejection, naming the zone, as limit_req does.
fn log_rejection(log: *mut ngx_log_t, ctx: &Ctx) {
    for (line, res) in ctx.iter().filter(|(_, r)| r.active && !r.admitted) {
        ngx_log_error!(
            NGX_LOG_ERR,
            log,
            "limiting requests by zone \"{}\", rate {}, burst {}, algorithm {}, retry in {}.{:03}s",
            line.zone_name,
            line.limit.rate(),
            line.limit.burst(),
            line.limit.algorithm(),
            res.retry_after_us / 1_000_000,
            res.retry_after_us % 1_000_000 / 1000
        );
    }
}
