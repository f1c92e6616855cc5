//! Where the lines are decided, in two stages ([`Stage`]): the lines before
//! authentication in the pre-access phase, where `limit_req` decides (no
//! access handler, allowing under `satisfy any`, can skip them), and the
//! `after_auth` lines at the start of the pre-content phase, the first
//! point every request the access phase allowed goes through. Each stage
//! is decided all-or-nothing over its own lines, and remembered for the
//! response headers; a request rejected in the first stage never reaches
//! the second, one rejected in the second keeps the first's charges.
//!
//! Within a stage, shared-memory lines are decided on the spot, under their
//! zones' locks. When the stage also has Redis lines, the shared-memory
//! lines are decided and charged first (if they reject, Redis is not
//! asked), the Redis lines go to the I/O thread in one script call per
//! zone, the request is suspended, and when the replies are in it is
//! resumed in the same phase handler: if Redis rejected (or failed with
//! `on_error=deny`), the stage's shared-memory charges are refunded. A
//! request is so never admitted beyond a shared-memory limit, nor rejected
//! yet charged in Redis for it; while Redis decides, its shared-memory
//! units are taken.

use core::ffi::CStr;
use core::{mem, ptr};

use ngx::core::Status;
use ngx::ffi::{
    ngx_http_handler_pt, ngx_http_request_t, ngx_log_error_core, ngx_log_t, ngx_palloc, ngx_str_t, ngx_uint_t,
};
use ngx::http::{HttpModuleLocationConf, HttpModuleMainConf, Request};
use ngx::log::DebugMask;
use ngx::ngx_log_debug;
use rl_core::limit::Limit;

use crate::conf::{LocConf, MainConf};
use crate::delay;
use crate::line::{Line, Params, Stage, VarLimit};
use crate::metrics;
use crate::redis_zone::{self, Job, JobLine, RedisError, Reply};
use crate::request::{get_ctx, new_ctx, Ctx, LineResult, Phase, Verdict};
use crate::shm::decide::{decide, refund};
use crate::Module;

ngx::http_request_handler!(preaccess_handler, preaccess);
ngx::http_request_handler!(precontent_handler, precontent);

/// The handler of the lines before authentication, for registration in
/// the pre-access phase.
pub fn preaccess_handler_pt() -> ngx_http_handler_pt {
    Some(preaccess_handler)
}

/// The handler of the `after_auth` lines, for registration in the
/// pre-content phase.
pub fn precontent_handler_pt() -> ngx_http_handler_pt {
    Some(precontent_handler)
}

/// What both stages' handlers read first: the request, its location's and
/// the main configuration; `None` when the handler has nothing to do. Every
/// request runs both, whatever its location: one to a location the stage
/// does not `need` leaves after one read of its configuration, unless it was
/// redirected internally (its context may hold the lines of the location it
/// left). A subrequest is never limited.
#[inline(always)]
fn stage_confs(
    r: &mut Request,
    needs: impl FnOnce(&LocConf) -> bool,
) -> Option<(*mut ngx_http_request_t, &'static LocConf, &'static MainConf)> {
    let raw: *mut ngx_http_request_t = (&mut *r).into();
    let lcf = Module::location_conf(r)?;
    // SAFETY: the request is valid during the phase handler.
    if !needs(lcf) && unsafe { (*raw).internal() } == 0 {
        return None;
    }
    // SAFETY: as above.
    if unsafe { (*raw).main } != raw {
        return None;
    }
    Some((raw, lcf, Module::main_conf(r)?))
}

/// The first stage. The request's context is made here, for every
/// location with lines (`after_auth` ones only, too): the first location
/// with lines a request reaches is the one that limits it, once, whatever
/// internal redirects follow.
fn preaccess(r: &mut Request) -> Status {
    let Some((raw, lcf, mcf)) = stage_confs(r, |lcf| !lcf.lines.is_empty()) else {
        return Status::NGX_DECLINED;
    };
    // An `rl_quota` location reads its lines in its content handler.
    if lcf.quota {
        return Status::NGX_DECLINED;
    }
    let ctx = match get_ctx(r) {
        Some(ctx) if ctx.stage == Stage::BeforeAuth => match ctx.phase {
            Phase::Decided => return Status::NGX_DECLINED,
            Phase::Waiting(_) | Phase::Delayed => return Status::NGX_AGAIN,
            Phase::Replied => ctx,
        },
        // Both stages were decided, in an earlier pass.
        Some(_) => return Status::NGX_DECLINED,
        None if lcf.lines.is_empty() => return Status::NGX_DECLINED,
        None => {
            let Some(ctx) = new_ctx(r, &mcf.lines, &lcf.lines, lcf.headers(), mcf.ctx_var) else {
                return Status(500);
            };
            if let Some(status) = start(raw, lcf, mcf, ctx) {
                return status;
            }
            ctx
        }
    };
    finish(r, lcf, mcf, ctx)
}

/// The second stage, once access control has allowed the request.
fn precontent(r: &mut Request) -> Status {
    let Some((raw, lcf, mcf)) = stage_confs(r, |lcf| lcf.after_auth) else {
        return Status::NGX_DECLINED;
    };
    // No context: the location had no lines when the request reached its pre-access phase.
    let Some(ctx) = get_ctx(r) else {
        return Status::NGX_DECLINED;
    };
    let ctx = match (ctx.stage, ctx.phase) {
        (Stage::BeforeAuth, Phase::Decided) => {
            ctx.stage = Stage::AfterAuth;
            // After an internal redirect, the context's lines are those of the location the
            // request left: limited there already, or turned away there by access control (and
            // sent here by `error_page`), which the lines after authentication never charge.
            if !lcf.after_auth || ctx.rejected || ctx.redirected {
                return Status::NGX_DECLINED;
            }
            if let Some(status) = start(raw, lcf, mcf, ctx) {
                return status;
            }
            ctx
        }
        (Stage::AfterAuth, Phase::Decided) => return Status::NGX_DECLINED,
        (Stage::AfterAuth, Phase::Replied) => ctx,
        (_, Phase::Waiting(_) | Phase::Delayed | Phase::Replied) => return Status::NGX_AGAIN,
    };
    finish(r, lcf, mcf, ctx)
}

/// Starts deciding the lines of the request's current stage: evaluates
/// their keys and, when some are on Redis, decides the shared-memory ones
/// and sends the Redis ones. Returns the handler's status when the request
/// is to wait for Redis (or failed), `None` to [`finish`] now.
#[inline(always)]
fn start(raw: *mut ngx_http_request_t, lcf: &LocConf, mcf: &MainConf, ctx: &mut Ctx) -> Option<Status> {
    if eval_keys(raw, mcf, ctx, lcf.dry_run()).is_err() {
        return Some(Status(500));
    }
    ctx.reserved = None;
    if lcf.has_redis && ctx.staged(&mcf.lines).any(|(l, res)| res.active && l.backend.redis().is_some()) {
        // SAFETY: the request and its connection are valid.
        let log = unsafe { (*(*raw).connection).log };
        // Nothing goes to Redis if shared memory rejects.
        let charged = decide(&mcf.zones, &mcf.lines, ctx, log);
        ctx.reserved = Some(charged);
        if charged {
            if let Some(n) = submit_redis(raw, mcf, ctx) {
                ctx.phase = Phase::Waiting(n);
                redis_zone::suspend(raw);
                return Some(Status::NGX_AGAIN);
            }
        } else {
            for z in 0..mcf.redis.len() {
                redis_failed(mcf, ctx, z, true);
            }
        }
    }
    None
}

/// Decides the request's current stage, its shared-memory lines decided
/// (unless [`start`] did) and its Redis replies in: admits (at once, or
/// after a delay) or rejects it.
#[inline(always)]
fn finish(r: &mut Request, lcf: &LocConf, mcf: &MainConf, ctx: &mut Ctx) -> Status {
    let raw: *mut ngx_http_request_t = (&mut *r).into();
    ctx.phase = Phase::Decided;
    let redis_ok = !ctx.denied_by_error
        && (!lcf.has_redis
            || ctx
                .staged(&mcf.lines)
                .all(|(l, res)| !res.active || res.admitted() || res.dry_run || l.backend.redis().is_none()));
    let admitted = match ctx.reserved {
        Some(charged) => charged && redis_ok,
        None => redis_ok && decide(&mcf.zones, &mcf.lines, ctx, r.log()),
    };
    metrics::count(mcf, ctx);
    if admitted && ctx.charge_after {
        // Nothing is charged yet (the decision reported what the line has left).
        for (line, res) in ctx.staged_mut(&mcf.lines) {
            if line.charge_after && res.active {
                res.charged = false;
            }
        }
    }
    if admitted {
        debug_verdicts(r.log(), mcf, ctx);
        // A delay, or a dry-run line that would have limited.
        if lcf.may_delay || lcf.may_dry_run {
            log_limited(r.log(), lcf, mcf, ctx);
        }
        // The longest wait of the stage's enforced lines (dry-run lines never delay).
        let delay_us = match lcf.may_delay {
            true => ctx
                .staged(&mcf.lines)
                .filter(|(_, res)| res.active && !res.dry_run)
                .map(|(_, res)| res.delay_us())
                .max(),
            false => None,
        };
        let delay_us = delay_us.unwrap_or(0);
        if delay_us > 0 {
            ctx.phase = Phase::Delayed;
            delay::sleep(raw, delay_us.div_ceil(1000));
            return Status::NGX_AGAIN;
        }
        return Status::NGX_DECLINED;
    }
    ctx.rejected = true;
    if ctx.reserved == Some(true) {
        refund(&mcf.zones, &mcf.lines, ctx);
    }
    debug_verdicts(r.log(), mcf, ctx);
    log_limited(r.log(), lcf, mcf, ctx);
    Status(lcf.status as isize)
}

/// Evaluates the key of every line of the current stage, and its rate, burst and cost where they hold
/// variables; an empty key or value leaves its line inactive, as does a
/// value that does not parse (logged). `dry_run`: the location's
/// `rl_dry_run`.
#[inline(always)]
pub fn eval_keys(r: *mut ngx_http_request_t, mcf: &MainConf, ctx: &mut Ctx, dry_run: bool) -> Result<(), ()> {
    let mut ctx_after = false;
    // A location of one line (the common case) without walking its lines.
    if let Some((line, res)) = ctx.single() {
        ctx_after = eval_line(r, line, res, dry_run)?;
    } else {
        for (line, res) in ctx.staged_mut(&mcf.lines) {
            ctx_after |= eval_line(r, line, res, dry_run)?;
        }
    }
    ctx.charge_after |= ctx_after;
    Ok(())
}

/// [`eval_keys`] for one line: whether it is charged after the response.
#[inline(always)]
fn eval_line(r: *mut ngx_http_request_t, line: &Line, res: &mut LineResult, dry_run: bool) -> Result<bool, ()> {
    res.key = line.eval_key(r)?;
    res.active = res.key.len > 0;
    res.dry_run = dry_run || line.dry_run;
    res.cost = line.cost;
    if res.active && (line.vars.is_some() || line.charge_after) {
        return eval_varying(r, line, res);
    }
    Ok(false)
}

/// The part of [`eval_keys`] for a line whose rate, burst or cost holds
/// variables, or that is `charge=after`: whether the line is then charged
/// after the response.
#[inline(never)]
fn eval_varying(r: *mut ngx_http_request_t, line: &Line, res: &mut LineResult) -> Result<bool, ()> {
    if line.vars.is_some() {
        // SAFETY: the request is valid during the phase handler.
        let log = unsafe { (*(*r).connection).log };
        let mut limit = None;
        match line.eval_params(r, log, line.backend.redis().is_some(), &mut limit)? {
            Params::Static => {}
            Params::Per(cost) => res.cost = cost,
            Params::Off => res.active = false,
        }
        res.var_limit = match limit {
            // SAFETY: the line is the configuration's, which outlives the request.
            Some(VarLimit::Kept(limit)) => Some(unsafe { &*ptr::from_ref(limit) }),
            Some(VarLimit::Made(limit)) => Some(in_pool(r, limit)?),
            None => None,
        };
    }
    if line.charge_after && res.active {
        // Admitted while one unit is left; the cost is charged when the request is logged.
        res.cost = 1;
        return Ok(true);
    }
    Ok(false)
}

/// A request's limit that its line does not keep, copied into its pool: it
/// lives as long as the request's results do. `Err`: no memory.
fn in_pool(r: *mut ngx_http_request_t, limit: Limit) -> Result<&'static Limit, ()> {
    // SAFETY: the request pool is valid for the request's lifetime; ngx_palloc aligns to
    // NGX_ALIGNMENT, the pointer size, which is enough for a Limit (asserted below).
    let p = unsafe { ngx_palloc((*r).pool, mem::size_of::<Limit>()) }.cast::<Limit>();
    if p.is_null() {
        return Err(());
    }
    // SAFETY: p is a fresh allocation of a Limit's size and alignment; a Limit needs no drop.
    unsafe {
        p.write(limit);
        Ok(&*p)
    }
}

const _: () = assert!(mem::align_of::<Limit>() <= mem::size_of::<usize>());

/// Sends one job per Redis zone of the location. Returns how many replies
/// to wait for, or `None` if nothing was sent (zones that could not take the
/// job are then treated as failed, per their `on_error`).
fn submit_redis(r: *mut ngx_http_request_t, mcf: &MainConf, ctx: &mut Ctx) -> Option<u32> {
    let mut sent = 0;
    // SAFETY: the request is valid.
    let log = unsafe { (*(*r).connection).log };
    // (the wait for one more unit is asked for where the `RateLimit` field sends it)
    let next = ctx.headers.draft();
    for (z, zone) in mcf.redis.iter().enumerate() {
        let mut job = Job { id: 0, zone: z, commit: true, charge: false, lines: Default::default() };
        for (line, res) in ctx.on_redis(&mcf.lines, z) {
            let tag = rl_core::redis::tag_of(res.key.as_bytes());
            job.lines.push(JobLine {
                tag,
                line_id: line.id,
                limit: *res.limit(line),
                cost: res.cost,
                check_only: line.charge_after,
                dry_run: res.dry_run,
                next,
                deepest_queue: line.deepest_queue,
            });
        }
        if job.lines.is_empty() {
            continue;
        }
        if redis_zone::submit(r, job).is_ok() {
            sent += 1;
            ctx.awaited |= 1 << z;
        } else {
            zone.failed(log, &RedisError::NoThread);
            metrics::redis_failed(mcf, ctx, z, zone.on_error_allow, &RedisError::NoThread);
            redis_failed(mcf, ctx, z, zone.on_error_allow);
        }
    }
    (sent > 0).then_some(sent)
}

/// A zone's lines could not be decided by Redis: `on_error=allow` leaves
/// them out, `on_error=deny` rejects the request (unless they are all
/// dry-run: a dry-run line never rejects).
fn redis_failed(mcf: &MainConf, ctx: &mut Ctx, zone: usize, allow: bool) {
    if !allow && ctx.on_redis(&mcf.lines, zone).any(|(_, res)| !res.dry_run) {
        ctx.denied_by_error = true;
    }
    for (_, res) in ctx.on_redis(&mcf.lines, zone) {
        res.active = false;
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
            // A line is charged iff the request's enforced lines admit it and so does the line
            // (rl-core's Decision::charges).
            for ((_, res), o) in ctx.on_redis(&mcf.lines, reply.zone).zip(outcomes) {
                res.set(&o, all && o.admitted);
            }
        }
        Err(e) => {
            zone.failed(req.log(), &e);
            metrics::redis_failed(mcf, ctx, reply.zone, zone.on_error_allow, &e);
            redis_failed(mcf, ctx, reply.zone, zone.on_error_allow);
        }
    }
    if ctx.reply_in() {
        redis_zone::resume(r);
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
            zone.failed(req.log(), &RedisError::NoThread);
            metrics::redis_failed(mcf, ctx, z, zone.on_error_allow, &RedisError::NoThread);
            redis_failed(mcf, ctx, z, zone.on_error_allow);
        }
    }
    ctx.awaited = 0;
    ctx.phase = Phase::Replied;
    redis_zone::resume(r);
}

/// The verdict of each active line of the stage, at `debug` level (compiled in where nginx
/// was built `--with-debug`; silent unless the error log's level is debug).
/// Keys are shown as the hash Redis keys use, never as they came.
#[inline(always)]
fn debug_verdicts(log: *mut ngx_log_t, mcf: &MainConf, ctx: &Ctx) {
    // Checked here, once: the lines are not walked, nor the logging function called, unless the
    // log wants them.
    // SAFETY: the request's log is valid.
    if ngx::log::DEBUG && ngx::log::check_mask(DebugMask::Http, unsafe { (*log).log_level }) {
        log_verdicts(log, mcf, ctx);
    }
}

#[cold]
#[inline(never)]
fn log_verdicts(log: *mut ngx_log_t, mcf: &MainConf, ctx: &Ctx) {
    for (line, res) in ctx.staged(&mcf.lines).filter(|(_, res)| res.active) {
        ngx_log_debug!(
            mask: DebugMask::Http,
            log,
            "rl: zone \"{}\" line \"{}\" key {:016x}: {}, remaining {}, reset {} us, charged {}",
            line.zone_name,
            line.item,
            rl_core::redis::tag_of(res.key.as_bytes()),
            if res.admitted() { "admitted" } else { "rejected" },
            res.remaining(),
            res.reset_us(),
            res.charged
        );
    }
}

/// One line per limited request and stage, for the line behind the stage's
/// verdict, in `limit_req`'s words (tools that read nginx's error log,
/// fail2ban's `nginx-limit-req` filter among them, know them); nginx's
/// request log handler appends `, client: ..., server: ..., request: ...`. Formatted by
/// nginx into its own buffer, as `limit_req` does: nothing allocated.
/// Rejections by a failing Redis zone are logged by the zone instead.
fn log_limited(log: *mut ngx_log_t, lcf: &LocConf, mcf: &MainConf, ctx: &Ctx) {
    // Checked first, once: no line is looked at unless the log wants one (the delay level
    // is never more severe than the rejection level).
    // SAFETY: the request's log is valid.
    if ctx.denied_by_error || unsafe { (*log).log_level } < lcf.log_level {
        return;
    }
    let Some((line, res)) = ctx.staged_behind(&mcf.lines) else {
        return;
    };
    let (level, format, dry_run) = match res.verdict() {
        Verdict::Passed => return,
        Verdict::Rejected => (lcf.log_level, LIMITING, c""),
        Verdict::RejectedDryRun => (lcf.log_level, LIMITING, c", dry run"),
        Verdict::Delayed => (lcf.delay_log_level(), DELAYING, c""),
        Verdict::DelayedDryRun => (lcf.delay_log_level(), DELAYING, c", dry run"),
    };
    // SAFETY: the request's log is valid.
    if unsafe { (*log).log_level } < level {
        return;
    }
    let excess = res.limit(line).excess_milli(res.outcome(), res.cost);
    let zone = ngx_str_t { len: line.zone_name.len(), data: line.zone_name.as_ptr().cast_mut() };
    // nginx appends " while <action>" before ", client: ..."; after an `auth_request`
    // subrequest the connection's action is left at "sending to client", which would keep
    // fail2ban's filter from matching a line after authentication: none for this line, as in
    // the pre-access phase.
    // SAFETY: the request's log is valid; the action is a static string or null.
    let action = unsafe { core::mem::replace(&mut (*log).action, core::ptr::null_mut()) };
    // SAFETY: the format's conversions take, in order, a NUL-terminated string (%s), two
    // ngx_uint_t (%ui) and a pointer to an ngx_str_t (%V), all valid for the call.
    unsafe {
        ngx_log_error_core(
            level,
            log,
            0,
            format.as_ptr(),
            dry_run.as_ptr(),
            (excess / 1000) as ngx_uint_t,
            (excess % 1000) as ngx_uint_t,
            &zone as *const ngx_str_t,
        )
    };
    // SAFETY: as above.
    unsafe { (*log).action = action };
}

/// `limit_req`'s formats, word for word (the comma before "by zone" too).
const LIMITING: &CStr = c"limiting requests%s, excess: %ui.%03ui by zone \"%V\"";
const DELAYING: &CStr = c"delaying request%s, excess: %ui.%03ui, by zone \"%V\"";
