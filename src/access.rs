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
//! asked), the Redis lines go to Redis in one script call per zone, the request is suspended, and when the replies are in it is
//! resumed in the same phase handler: if Redis rejected (or failed with
//! `on_error=deny`), the stage's shared-memory charges are refunded. Lines
//! in lease mode are decided like shared-memory ones, on this nginx's
//! leases, where those hold the request ([`lease::spend`]); else by Redis. A
//! request is so never admitted beyond a shared-memory limit, nor rejected
//! yet charged in Redis for it; while Redis decides, its shared-memory
//! units are taken.

use core::ffi::{c_void, CStr};
use core::{mem, ptr};

use ngx::core::Status;
use ngx::ffi::{
    ngx_http_handler_pt, ngx_http_request_t, ngx_log_error_core, ngx_log_t, ngx_pool_cleanup_add, ngx_str_t,
    ngx_uint_t, NGX_HTTP_INTERNAL_SERVER_ERROR,
};
use ngx::http::{HttpModuleLocationConf, HttpModuleMainConf, Request};
use ngx::log::DebugMask;
use ngx::ngx_log_debug;

use crate::conf::{LocConf, MainConf};
use crate::delay;
use crate::eval::redis::{wait as redis_wait, Ask};
use crate::eval::{self, redis};
use crate::lease;
use crate::line::{Backend, Stage};
use crate::metrics;
use crate::request::{get_ctx, new_ctx, Ctx, Phase, Verdict};
use crate::shm::decide::{decide, refund, release as shm_release};
use crate::shm::{wait, wake};
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
            Phase::Queued => {
                if let Some(status) = queued(raw, lcf, mcf, ctx) {
                    return status;
                }
                ctx
            }
            Phase::Replied if ctx.polling => {
                if let Some(status) = replied_wait(raw, lcf, mcf, ctx) {
                    return status;
                }
                ctx
            }
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
        (Stage::AfterAuth, Phase::Replied) if ctx.polling => {
            if let Some(status) = replied_wait(raw, lcf, mcf, ctx) {
                return status;
            }
            ctx
        }
        (Stage::AfterAuth, Phase::Replied) => ctx,
        (Stage::AfterAuth, Phase::Queued) => {
            if let Some(status) = queued(raw, lcf, mcf, ctx) {
                return status;
            }
            ctx
        }
        (_, Phase::Waiting(_) | Phase::Delayed | Phase::Replied | Phase::Queued) => return Status::NGX_AGAIN,
    };
    finish(r, lcf, mcf, ctx)
}

/// Starts deciding the lines of the request's current stage: evaluates
/// their keys and, when some are on Redis, decides the shared-memory ones
/// and sends the Redis ones. Returns the handler's status when the request
/// is to wait for Redis (or failed), `None` to [`finish`] now.
#[inline(always)]
fn start(raw: *mut ngx_http_request_t, lcf: &LocConf, mcf: &MainConf, ctx: &mut Ctx) -> Option<Status> {
    if let Err(e) = eval::stage(raw, mcf, ctx, lcf.dry_run()) {
        return Some(e.into());
    }
    ctx.reserved = None;
    if lcf.conn_queue {
        // SAFETY: the request and its connection are valid.
        let log = unsafe { (*(*raw).connection).log };
        if let Some(ms) = wait::arrive(&mcf.zones, &mcf.lines, ctx, log) {
            return Some(sleep_queued(raw, mcf, ctx, ms));
        }
        if lcf.redis_queue && redis_wait::arrive(raw, mcf, ctx) {
            return Some(asked(raw, mcf, ctx));
        }
    }
    send(raw, lcf, mcf, ctx)
}

/// The status of a request whose Redis waiting lines were asked about it
/// (it waits for their reply), its takes and places settled should it end
/// meanwhile.
fn asked(raw: *mut ngx_http_request_t, mcf: &MainConf, ctx: &mut Ctx) -> Status {
    if !release_at_end(raw, mcf, ctx) {
        return Status(NGX_HTTP_INTERNAL_SERVER_ERROR as isize);
    }
    Status::NGX_AGAIN
}

/// The replies of a look at the request's Redis waiting lines are in: the
/// handler's status while it waits on, `None` once it waits no more, the
/// stage then decided as [`start`] does after its arrival.
fn replied_wait(raw: *mut ngx_http_request_t, lcf: &LocConf, mcf: &MainConf, ctx: &mut Ctx) -> Option<Status> {
    ctx.polling = false;
    if let Some(ms) = redis_wait::next(mcf, ctx) {
        return Some(sleep_queued(raw, mcf, ctx, ms));
    }
    ctx.phase = Phase::Decided;
    send(raw, lcf, mcf, ctx)
}

/// The request's `rl_conn` waiting lines, looked at again when it wakes:
/// the handler's status while it waits (or failed), `None` once it waits
/// no more, the stage then decided as [`start`] does after its arrival.
fn queued(raw: *mut ngx_http_request_t, lcf: &LocConf, mcf: &MainConf, ctx: &mut Ctx) -> Option<Status> {
    // SAFETY: the request and its connection are valid.
    let log = unsafe { (*(*raw).connection).log };
    wake::awake(ptr::from_mut(ctx) as usize);
    if let Some(ms) = wait::poll(&mcf.zones, &mcf.lines, ctx, log) {
        return Some(sleep_queued(raw, mcf, ctx, ms));
    }
    // (Redis waiting lines after the shared-memory ones: a place to look at again, or the
    // arrival the shared-memory lines held back)
    if lcf.redis_queue {
        let sent = match redis_wait::waiting(mcf, ctx) {
            true => redis_wait::poll(raw, mcf, ctx),
            false => redis_wait::arrive(raw, mcf, ctx),
        };
        if sent {
            return Some(asked(raw, mcf, ctx));
        }
    }
    ctx.phase = Phase::Decided;
    send(raw, lcf, mcf, ctx)
}

/// Puts a request that waits for an `rl_conn` slot to sleep for `ms`, its
/// places given up should it end meanwhile.
fn sleep_queued(raw: *mut ngx_http_request_t, mcf: &MainConf, ctx: &mut Ctx, ms: u64) -> Status {
    if !release_at_end(raw, mcf, ctx) {
        return Status(NGX_HTTP_INTERNAL_SERVER_ERROR as isize);
    }
    ctx.phase = Phase::Queued;
    delay::sleep(raw, ms);
    // SAFETY: the request and its connection are valid; the timer is on its write event.
    let wev = unsafe { (*(*raw).connection).write };
    let owner = ptr::from_mut(ctx) as usize;
    for (line, res) in ctx.iter(&mcf.lines).filter(|(_, res)| res.ticket != 0) {
        if let Some(z) = line.backend.shm() {
            wake::sleeping(owner, z, res.hash, res.class, res.ticket, wev);
        }
    }
    redis_wait::sleeping(mcf, ctx, owner, wev);
    Status::NGX_AGAIN
}

/// [`start`] once the request waits for no `rl_conn` slot: when the stage
/// has Redis lines, decides the shared-memory ones and sends the Redis
/// ones; `None` to [`finish`] now.
#[inline(always)]
fn send(raw: *mut ngx_http_request_t, lcf: &LocConf, mcf: &MainConf, ctx: &mut Ctx) -> Option<Status> {
    if lcf.has_redis && ctx.staged(&mcf.lines).any(|(l, res)| res.active && l.backend.redis().is_some()) {
        // SAFETY: the request and its connection are valid.
        let log = unsafe { (*(*raw).connection).log };
        // Nothing goes to Redis if shared memory rejects, nor if this nginx's leases refuse; nor
        // is anything decided once a waiting line refused the request, or a zone failed it
        // while it waited.
        let stopped = lcf.conn_queue && (ctx.denied_by_error || redis_wait::refused(mcf, ctx));
        let charged = !stopped && decide(&mcf.zones, &mcf.lines, ctx, log);
        ctx.reserved = Some(charged);
        if lcf.has_conn && !release_at_end(raw, mcf, ctx) {
            return Some(Status(NGX_HTTP_INTERNAL_SERVER_ERROR as isize));
        }
        if charged && (mcf.leases.is_empty() || lease::spend(&mcf.leases, &mcf.lines, ctx, log)) {
            if redis::send(raw, mcf, ctx, Ask::Decide) {
                // (takes of Redis rl_conn lines in flight are settled should the request end first)
                if lcf.has_conn && !release_at_end(raw, mcf, ctx) {
                    return Some(Status(NGX_HTTP_INTERNAL_SERVER_ERROR as isize));
                }
                return Some(Status::NGX_AGAIN);
            }
        } else {
            for z in 0..mcf.redis.len() {
                redis::leave_out(mcf, ctx, z, true, log);
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
    if lcf.has_conn && !release_at_end(raw, mcf, ctx) {
        return Status(NGX_HTTP_INTERNAL_SERVER_ERROR as isize);
    }
    if admitted {
        debug_verdicts(r.log(), mcf, ctx);
        // A delay, or a dry-run line that would have limited.
        if lcf.may_delay || lcf.may_dry_run {
            log_limited(r.log(), lcf, mcf, ctx);
        }
        // The longest wait of the stage's enforced lines (dry-run lines never delay).
        let delay_us = match lcf.may_delay {
            // (a line that made the request wait for a slot has its wait behind it)
            true => ctx
                .staged(&mcf.lines)
                .filter(|(_, res)| res.active && !res.dry_run && !res.waited)
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
        if !mcf.leases.is_empty() {
            lease::put_back(&mcf.leases, &mcf.lines, ctx, r.log());
        }
    } else if lcf.conn_queue {
        // The slots the rl_conn lines let the request in with, before the other lines refused it.
        refund(&mcf.zones, &mcf.lines, ctx);
    }
    debug_verdicts(r.log(), mcf, ctx);
    log_limited(r.log(), lcf, mcf, ctx);
    Status(lcf.status as isize)
}

/// Registers, once per request, the give-back of what its `rl_conn` lines
/// hold, in a cleanup of the request's pool, as `limit_conn` does: it runs
/// however the request ends (answered, aborted by the client, timed out,
/// closed by a worker shutting down). False when nginx could not allocate
/// it (and logged why): the units are given back at once, and the request
/// is answered 500.
fn release_at_end(raw: *mut ngx_http_request_t, mcf: &MainConf, ctx: &mut Ctx) -> bool {
    if ctx.release_set || !ctx.iter(&mcf.lines).any(|(l, res)| res.holds(l)) {
        return true;
    }
    // SAFETY: the request (a main request) and its pool are valid.
    let cln = unsafe { ngx_pool_cleanup_add((*raw).pool, mem::size_of::<Release>()) };
    // SAFETY: null or a cleanup nginx allocated with room for a Release in its data.
    let Some(cln) = (unsafe { cln.as_mut() }) else {
        release(mcf, ctx);
        return false;
    };
    // SAFETY: the context lives in the same pool, whose cleanups run before its memory is freed;
    // the main configuration lives as long as the cycle, which outlives its requests.
    unsafe { cln.data.cast::<Release>().write(Release { ctx, mcf }) };
    cln.handler = Some(release_handler);
    ctx.release_set = true;
    true
}

/// What the give-back needs when the request's pool goes.
struct Release {
    ctx: *mut Ctx,
    mcf: *const MainConf,
}

extern "C" fn release_handler(data: *mut c_void) {
    // SAFETY: the Release release_at_end wrote in the cleanup's data; the context and the
    // configuration it points to are alive (see there).
    let (ctx, mcf) = unsafe {
        let rel = &*data.cast::<Release>();
        (&mut *rel.ctx, &*rel.mcf)
    };
    wake::awake(ptr::from_mut(ctx) as usize);
    release(mcf, ctx);
}

/// Gives back what the request's `rl_conn` lines hold, each on its zone:
/// the request has ended.
fn release(mcf: &MainConf, ctx: &mut Ctx) {
    let now_us = crate::shm::now_us();
    for (line, res) in ctx.iter_mut(&mcf.lines).filter(|(l, _)| l.limit.is_concurrent() || l.limit.rate_waits()) {
        match line.backend {
            Backend::Shm(_) => shm_release(&mcf.zones, line, res, now_us),
            Backend::Redis(z) => redis::release(line, res, z),
        }
    }
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
        // (a line of classes names the request's)
        let class = line.classes.as_deref().and_then(|c| c.names.get(usize::from(res.class)));
        ngx_log_debug!(
            mask: DebugMask::Http,
            log,
            "rl: zone \"{}\" line \"{}\"{}{}{} key {:016x}: {}, remaining {}, reset {} us, charged {}",
            line.zone_name,
            line.item,
            if class.is_some() { " class \"" } else { "" },
            class.map_or("", String::as_str),
            if class.is_some() { "\"" } else { "" },
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
    let zone = ngx_str_t { len: line.zone_name.len(), data: line.zone_name.as_ptr().cast_mut() };
    if line.limit.is_concurrent() {
        // (limit_conn has no words for a request that waited: only refusals are logged)
        if matches!(res.verdict(), Verdict::Rejected | Verdict::RejectedDryRun) {
            log_conn_limited(log, level, res.dry_run, &zone);
        }
        return;
    }
    let excess = res.limit(line).excess_milli(res.outcome(), res.cost);
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

/// [`log_limited`] for an `rl_conn` line, in `limit_conn`'s words (which
/// fail2ban's and crowdsec's filters for it know): no excess, the dry run
/// between commas.
#[cold]
fn log_conn_limited(log: *mut ngx_log_t, level: ngx_uint_t, dry_run: bool, zone: &ngx_str_t) {
    let dry_run = if dry_run { c", dry run," } else { c"" };
    // As in log_limited: no action, so that the line ends as fail2ban's filter expects.
    // SAFETY: the request's log is valid; the action is a static string or null.
    let action = unsafe { core::mem::replace(&mut (*log).action, core::ptr::null_mut()) };
    // SAFETY: the format's conversions take a NUL-terminated string (%s) and a pointer to an
    // ngx_str_t (%V), both valid for the call.
    unsafe { ngx_log_error_core(level, log, 0, LIMITING_CONN.as_ptr(), dry_run.as_ptr(), zone as *const ngx_str_t) };
    // SAFETY: as above.
    unsafe { (*log).action = action };
}

/// `limit_conn`'s format, word for word.
const LIMITING_CONN: &CStr = c"limiting connections%s by zone \"%V\"";

/// `limit_req`'s formats, word for word (the comma before "by zone" too).
const LIMITING: &CStr = c"limiting requests%s, excess: %ui.%03ui by zone \"%V\"";
const DELAYING: &CStr = c"delaying request%s, excess: %ui.%03ui, by zone \"%V\"";
