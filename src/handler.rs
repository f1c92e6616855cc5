//! The access-phase handler: evaluates every `rl_limit` line of the location
//! for the request, all-or-nothing, and remembers the outcome for the
//! response headers.
//!
//! Shared-memory lines are decided on the spot, under their zones' locks.
//! When the location also has Redis lines, the shared-memory lines are
//! checked first (charging nothing), the Redis lines go to the I/O thread in
//! one script call per zone, the request is suspended, and when the replies
//! are in it is resumed here: only if Redis admitted are the shared-memory
//! lines charged.

use core::ffi::c_void;
use core::{mem, ptr, slice};

use ngx::core::Status;
use ngx::ffi::{
    ngx_current_msec, ngx_http_complex_value, ngx_http_request_t, ngx_log_t, ngx_pcalloc, ngx_pool_cleanup_add,
    ngx_str_t, ngx_time, NGX_LOG_ERR,
};
use ngx::http::{HttpModule, HttpModuleLocationConf, HttpModuleMainConf, Request};
use ngx::ngx_log_error;

use crate::config::{Backend, HeadersMode, Line, MainConf};
use crate::redis_zone::io::{Job, JobLine, Reply};
use crate::zone::Locked;
use crate::Module;

/// Distinct zones one location may use (their locks are held together).
pub const MAX_ZONES_PER_LOCATION: usize = 16;

/// The outcome of one line for this request.
#[derive(Clone, Copy)]
pub struct LineResult {
    /// The key was non-empty and the line was evaluated.
    pub active: bool,
    pub admitted: bool,
    pub remaining: u64,
    pub reset_us: u64,
    pub retry_after_us: u64,
    /// The line's state was charged for this request.
    charged: bool,
    key: ngx_str_t,
    hash: [u64; 2],
    lock: usize,
}

/// Where the request is in its evaluation.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Waiting for this many Redis replies.
    Waiting(u32),
    /// Redis replies are in; the decision is still to be made.
    Replied,
    /// Decided: later passes through the access phase (internal redirects) let it through.
    Decided,
}

/// Per-request state, allocated from the request pool and kept across
/// internal redirects (see [`get_ctx`]).
pub struct Ctx {
    pub lines: *const *const Line,
    pub results: *mut LineResult,
    pub n: usize,
    pub phase: Phase,
    pub rejected: bool,
    /// A Redis zone with `on_error=deny` failed.
    pub denied_by_error: bool,
    /// Redis zones (bit = zone index) whose reply is still awaited.
    awaited: u64,
    pub headers: HeadersMode,
    /// Unix time of the decision, seconds.
    pub now_unix: i64,
}

impl Ctx {
    fn lines(&self) -> &'static [*const Line] {
        // SAFETY: lines of the location configuration, alive for the cycle.
        unsafe { slice::from_raw_parts(self.lines, self.n) }
    }

    fn results(&mut self) -> &mut [LineResult] {
        // SAFETY: n results allocated with the context in the request pool.
        unsafe { slice::from_raw_parts_mut(self.results, self.n) }
    }

    /// Each line with its outcome.
    pub fn iter(&self) -> impl Iterator<Item = (&Line, &LineResult)> {
        // SAFETY: as in `results`.
        let results = unsafe { slice::from_raw_parts(self.results, self.n) };
        // SAFETY: configuration lines live as long as the cycle.
        self.lines().iter().map(|l| unsafe { &**l }).zip(results.iter())
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
    // Only an internal redirect wipes r->ctx.
    // SAFETY: the request is valid.
    if unsafe { (*raw).internal() } == 0 {
        return None;
    }
    // SAFETY: the request and its pool are valid; the cleanup list is a linked list owned by the pool.
    let mut c = unsafe { (*(*raw).pool).cleanup };
    // SAFETY: as above.
    while let Some(cl) = unsafe { c.as_ref() } {
        // The marker is compared by address: one definition in this crate, built as a single
        // codegen unit, so the address is unique.
        if cl.handler.map(|f| f as usize) == Some(ctx_marker as extern "C" fn(*mut c_void) as usize)
            && !cl.data.is_null()
        {
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
    // SAFETY: pool is valid; zeroed memory is a valid LineResult array (no references inside).
    let ctx = unsafe { ngx_pcalloc(pool, size) }.cast::<Ctx>();
    if ctx.is_null() {
        return None;
    }
    // SAFETY: ngx_pcalloc aligns to NGX_ALIGNMENT (pointer size); Ctx and LineResult need 8.
    let results = unsafe { ctx.add(1).cast::<LineResult>() };
    let value = Ctx {
        lines: lines.as_ptr(),
        results,
        n: lines.len(),
        phase: Phase::Decided,
        rejected: false,
        denied_by_error: false,
        awaited: 0,
        headers,
        now_unix: ngx_time() as i64,
    };
    // SAFETY: ctx points to size bytes.
    unsafe { ptr::write(ctx, value) };
    // SAFETY: as above.
    let cln = unsafe { ngx_pool_cleanup_add(pool, 0).as_mut() }?;
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
    let (Some(lcf), Some(mcf)) = (Module::location_conf(r), Module::main_conf(r)) else {
        return Status::NGX_DECLINED;
    };
    // SAFETY: the request is valid.
    if lcf.lines.is_empty() && unsafe { (*raw).internal() } == 0 {
        return Status::NGX_DECLINED;
    }
    let ctx = match get_ctx(r) {
        Some(ctx) => match ctx.phase {
            Phase::Decided => return Status::NGX_DECLINED,
            Phase::Waiting(_) => return Status::NGX_AGAIN,
            Phase::Replied => ctx,
        },
        None if lcf.lines.is_empty() => return Status::NGX_DECLINED,
        None => {
            let Some(ctx) = new_ctx(r, &lcf.lines, lcf.headers()) else {
                return Status(500);
            };
            if eval_keys(raw, ctx).is_err() {
                return Status(500);
            }
            if lcf.has_redis && ctx.iter().any(|(l, res)| res.active && matches!(l.backend, Backend::Redis(_))) {
                // Nothing goes to Redis if shared memory would reject anyway.
                if let Ok(true) = shm_decide(mcf, ctx, r.log(), false) {
                    if let Some(n) = submit_redis(raw, mcf, ctx) {
                        ctx.phase = Phase::Waiting(n);
                        crate::redis_zone::suspend(raw);
                        return Status::NGX_AGAIN;
                    }
                } else {
                    for z in 0..mcf.redis.len() {
                        redis_failed(ctx, z, true);
                    }
                }
            }
            ctx
        }
    };
    ctx.phase = Phase::Decided;
    let redis_ok = !ctx.denied_by_error
        && ctx.iter().all(|(l, res)| !res.active || res.admitted || !matches!(l.backend, Backend::Redis(_)));
    let admitted = redis_ok && shm_decide(mcf, ctx, r.log(), true).unwrap_or(false);
    if admitted {
        return Status::NGX_DECLINED;
    }
    ctx.rejected = true;
    uncharge(ctx);
    log_rejection(r.log(), ctx);
    Status(lcf.status as isize)
}

/// Evaluates every line's key; an empty key leaves its line inactive.
fn eval_keys(r: *mut ngx_http_request_t, ctx: &mut Ctx) -> Result<(), ()> {
    let lines = ctx.lines();
    for (line, res) in lines.iter().zip(ctx.results()) {
        // SAFETY: configuration lines live as long as the cycle.
        let line = unsafe { &**line };
        // SAFETY: the key was compiled at configuration time; the value is allocated in r->pool.
        if unsafe { ngx_http_complex_value(r, line.key, &mut res.key) } != 0 {
            return Err(());
        }
        res.active = res.key.len > 0;
    }
    Ok(())
}

/// Decides the shared-memory lines (sorted by zone, locks taken in that
/// order): checks all, then — with `commit` and only if every one admits —
/// charges all. Returns whether they admit.
fn shm_decide(mcf: &MainConf, ctx: &mut Ctx, log: *mut ngx_log_t, commit: bool) -> Result<bool, ()> {
    // SAFETY: ngx_current_msec is the worker's cached monotonic clock.
    let now_us = unsafe { ngx_current_msec } as u64 * 1000;
    let now_s = (now_us / 1_000_000) as u32;
    let lines = ctx.lines();
    let results = ctx.results();

    let mut locks = Locks::new();
    let shm = |l: &*const Line| match unsafe { (**l).backend } {
        // SAFETY: configuration lines live as long as the cycle.
        Backend::Shm(z) => Some(z),
        Backend::Redis(_) => None,
    };

    // Locks and entries.
    for (line, res) in lines.iter().zip(results.iter_mut()).filter(|(_, res)| res.active) {
        let Some(z) = shm(line) else { continue };
        // SAFETY: as above.
        let line = unsafe { &**line };
        if locks.last_zone() != Some(z) {
            let Some(zone) = mcf.zones.get(z) else {
                res.active = false;
                continue;
            };
            let Some(mut locked) = zone.lock() else {
                ngx_log_error!(NGX_LOG_ERR, log, "rl_zone \"{}\" is not initialised", zone.name);
                res.active = false;
                continue;
            };
            locked.expire(now_s);
            locks.push(z, locked).map_err(|_| ())?;
        }
        let Some((lock, locked)) = locks.last_mut() else {
            continue;
        };
        res.hash = locked.table.hash_key(line.id, res.key.as_bytes());
        res.lock = lock;
        res.active = locked.ensure(res.hash, &line.limit, now_s, log);
    }

    // Check every line, charging nothing.
    let mut admitted = true;
    let single = results.iter().filter(|r| r.active).count() == 1;
    for (line, res) in lines.iter().zip(results.iter_mut()).filter(|(l, res)| res.active && shm(l).is_some()) {
        // SAFETY: as above.
        let line = unsafe { &**line };
        let Some(state) = locks.get_mut(res.lock).and_then(|l| l.state(res.hash, &line.limit)) else {
            res.active = false;
            continue;
        };
        // One line alone: check and charge in one step.
        let o = if single && commit {
            line.limit.acquire(state, now_us, line.cost)
        } else {
            line.limit.check(state, now_us, line.cost)
        };
        if single && commit && o.admitted {
            res.charged = true;
            if let Some(l) = locks.get_mut(res.lock) {
                l.charged(res.hash, now_us, o.reset_us);
            }
        }
        res.admitted = o.admitted;
        res.remaining = o.remaining;
        res.reset_us = o.reset_us;
        res.retry_after_us = o.retry_after_us.unwrap_or(u64::MAX);
        admitted &= o.admitted;
    }
    if !admitted || !commit || single {
        return Ok(admitted);
    }

    // Every line admits: charge them all.
    for (line, res) in lines.iter().zip(results.iter_mut()).filter(|(l, res)| res.active && shm(l).is_some()) {
        // SAFETY: as above.
        let line = unsafe { &**line };
        let Some(locked) = locks.get_mut(res.lock) else {
            continue;
        };
        let Some(state) = locked.state(res.hash, &line.limit) else {
            continue;
        };
        let o = line.limit.acquire(state, now_us, line.cost);
        res.remaining = o.remaining;
        res.reset_us = o.reset_us;
        res.charged = true;
        locked.charged(res.hash, now_us, o.reset_us);
    }
    Ok(true)
}

/// The zones locked by one request, in locking order; unlocked when dropped.
/// A small array on the stack: initialising 16 `Option<Locked>` per request
/// would cost more than the decision itself.
struct Locks<'a> {
    zones: [usize; MAX_ZONES_PER_LOCATION],
    locks: [mem::MaybeUninit<Locked<'a>>; MAX_ZONES_PER_LOCATION],
    len: usize,
}

impl<'a> Locks<'a> {
    fn new() -> Self {
        Locks {
            zones: [0; MAX_ZONES_PER_LOCATION],
            locks: [const { mem::MaybeUninit::uninit() }; MAX_ZONES_PER_LOCATION],
            len: 0,
        }
    }

    fn last_zone(&self) -> Option<usize> {
        self.len.checked_sub(1).map(|i| self.zones[i])
    }

    fn push(&mut self, zone: usize, locked: Locked<'a>) -> Result<(), Locked<'a>> {
        if self.len == MAX_ZONES_PER_LOCATION {
            return Err(locked);
        }
        self.zones[self.len] = zone;
        self.locks[self.len].write(locked);
        self.len += 1;
        Ok(())
    }

    fn get_mut(&mut self, i: usize) -> Option<&mut Locked<'a>> {
        // SAFETY: the first len elements are initialised.
        (i < self.len).then(|| unsafe { self.locks[i].assume_init_mut() })
    }

    fn last_mut(&mut self) -> Option<(usize, &mut Locked<'a>)> {
        let i = self.len.checked_sub(1)?;
        self.get_mut(i).map(|l| (i, l))
    }
}

impl Drop for Locks<'_> {
    fn drop(&mut self) {
        for l in &mut self.locks[..self.len] {
            // SAFETY: the first len elements are initialised and dropped once.
            unsafe { l.assume_init_drop() };
        }
    }
}

/// Sends one job per Redis zone of the location. Returns how many replies
/// to wait for, or `None` if nothing was sent (zones that could not take the
/// job are then treated as failed, per their `on_error`).
fn submit_redis(r: *mut ngx_http_request_t, mcf: &MainConf, ctx: &mut Ctx) -> Option<u32> {
    let mut sent = 0;
    let lines = ctx.lines();
    // SAFETY: the request is valid.
    let log = unsafe { (*(*r).connection).log };
    for (z, zone) in mcf.redis.iter().enumerate() {
        let mut job = Job { id: 0, zone: z, lines: Default::default() };
        for (line, res) in lines.iter().zip(ctx.results().iter()) {
            // SAFETY: configuration lines live as long as the cycle.
            let line = unsafe { &**line };
            if !res.active || line.backend != Backend::Redis(z) {
                continue;
            }
            let tag = rl_core::redis::tag_of(res.key.as_bytes());
            job.lines.push(JobLine { tag, line_id: line.id, limit: line.limit, cost: line.cost });
        }
        if job.lines.is_empty() {
            continue;
        }
        if crate::redis_zone::submit(r, job).is_ok() {
            sent += 1;
            ctx.awaited |= 1 << z;
        } else {
            zone.failed(log, "the I/O thread is not running");
            redis_failed(ctx, z, zone.on_error_allow);
        }
    }
    (sent > 0).then_some(sent)
}

/// A zone's lines could not be decided by Redis: `on_error=allow` leaves
/// them out, `on_error=deny` rejects the request.
fn redis_failed(ctx: &mut Ctx, zone: usize, allow: bool) {
    if !allow {
        ctx.denied_by_error = true;
    }
    let lines = ctx.lines();
    for (line, res) in lines.iter().zip(ctx.results()) {
        // SAFETY: configuration lines live as long as the cycle.
        if unsafe { (**line).backend } == Backend::Redis(zone) {
            res.active = false;
        }
    }
}

/// A Redis reply for a suspended request: record it, and resume the request
/// once every zone has answered.
pub fn on_reply(r: *mut ngx_http_request_t, reply: Reply) {
    // SAFETY: r is a live suspended request (pending requests are forgotten when freed).
    let req = unsafe { Request::from_ngx_http_request(r) };
    let Some(ctx) = get_ctx(req) else { return };
    let Some(mcf) = Module::main_conf(req) else { return };
    let Some(zone) = mcf.redis.get(reply.zone) else { return };
    ctx.awaited &= !(1 << reply.zone);
    match reply.result {
        Ok((all, outcomes)) => {
            let lines = ctx.lines();
            let mine = lines.iter().zip(ctx.results().iter_mut()).filter(|(l, res)| {
                // SAFETY: configuration lines live as long as the cycle.
                res.active && unsafe { (***l).backend } == Backend::Redis(reply.zone)
            });
            for ((_, res), o) in mine.zip(outcomes) {
                res.admitted = o.admitted;
                res.remaining = o.remaining;
                res.reset_us = o.reset_us;
                res.retry_after_us = o.retry_after_us.unwrap_or(u64::MAX);
                res.charged = all;
            }
        }
        Err(f) => {
            zone.failed(req.log(), &crate::redis_zone::failure_text(&f, zone.spec.timeout));
            redis_failed(ctx, reply.zone, zone.on_error_allow);
        }
    }
    ctx.phase = match ctx.phase {
        Phase::Waiting(n) if n > 1 => Phase::Waiting(n - 1),
        _ => Phase::Replied,
    };
    if ctx.phase == Phase::Replied {
        crate::redis_zone::resume(r);
    }
}

/// A check reports what would remain after the charge; for the lines of a
/// rejected request that were not charged, report what remains.
fn uncharge(ctx: &mut Ctx) {
    let lines = ctx.lines();
    for (line, res) in lines.iter().zip(ctx.results()) {
        if res.active && res.admitted && !res.charged {
            // SAFETY: configuration lines live as long as the cycle.
            res.remaining = res.remaining.saturating_add(unsafe { (**line).cost });
        }
    }
}

/// The backstop timer of a suspended request fired before every Redis
/// reply came: the zones still owed are failed (per their `on_error`), and
/// the request goes on.
pub fn on_lost(r: *mut ngx_http_request_t) {
    // SAFETY: r is a live suspended request.
    let req = unsafe { Request::from_ngx_http_request(r) };
    let (Some(ctx), Some(mcf)) = (get_ctx(req), Module::main_conf(req)) else { return };
    for (z, zone) in mcf.redis.iter().enumerate() {
        if ctx.awaited & (1 << z) != 0 {
            zone.failed(req.log(), "no reply from the I/O thread");
            redis_failed(ctx, z, zone.on_error_allow);
        }
    }
    ctx.awaited = 0;
    ctx.phase = Phase::Replied;
    crate::redis_zone::resume(r);
}

/// One line per rejection, naming the zone, as limit_req does.
fn log_rejection(log: *mut ngx_log_t, ctx: &Ctx) {
    if ctx.denied_by_error {
        return;
    }
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
