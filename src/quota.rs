//! `rl_quota`: a location whose content is what its `rl_limit` lines have
//! left for the request's keys, in JSON, with the rate-limit fields those
//! lines would send; nothing is charged. A line is one budget wherever it
//! appears, so the lines of `/api/` repeated here read the budget `/api/`
//! spends.
//!
//! The access phase passes such a location by (its lines are read, not
//! enforced). Shared-memory lines are checked under their zone's lock,
//! without creating a state for a key that has none; Redis lines go to the
//! I/O thread as jobs that do not commit (the script's check-only mode,
//! which writes nothing), the request waiting for them as the access phase
//! waits, and a zone that fails answers 503 whatever its `on_error`. Both
//! read at cost 0: what a key could spend now. Nothing here is counted by
//! `rl_metrics`.

use core::ffi::{c_char, c_void};
use core::fmt::Write as _;

use ngx::core::{Status, NGX_CONF_ERROR, NGX_CONF_OK};
use ngx::ffi::{
    ngx_command_t, ngx_conf_t, ngx_http_discard_request_body, ngx_http_request_t, ngx_log_t, NGX_HTTP_GET,
    NGX_HTTP_HEAD, NGX_HTTP_NOT_ALLOWED, NGX_LOG_EMERG, NGX_LOG_ERR,
};
use ngx::http::{HttpModuleLocationConf, HttpModuleMainConf, NgxHttpCoreModule, Request};
use ngx::{ngx_conf_log_error, ngx_log_error};

use crate::access::eval_keys;
use crate::conf::{LocConf, MainConf};
use crate::line::{HeadersMode, Stage};
use crate::metrics::send;
use crate::redis_zone::{self, Job, JobLine, RedisError, RedisZone, Reply};
use crate::request::{get_ctx, new_ctx, Ctx, Phase};
use crate::Module;

const JSON_TYPE: &str = "application/json";

/// `rl_quota;`: the location answers with its lines' budgets.
pub extern "C" fn cmd_rl_quota(cf: *mut ngx_conf_t, _cmd: *mut ngx_command_t, conf: *mut c_void) -> *mut c_char {
    // SAFETY: called by nginx while parsing a location: cf is valid, and conf is this module's
    // location configuration (NGX_HTTP_LOC_CONF_OFFSET).
    let (clcf, lcf) = unsafe { (NgxHttpCoreModule::location_conf_mut(&*cf), conf.cast::<LocConf>().as_mut()) };
    let (Some(clcf), Some(lcf)) = (clcf, lcf) else {
        ngx_conf_log_error!(NGX_LOG_EMERG, cf, "\"rl_quota\" directive: no configuration to attach to");
        return NGX_CONF_ERROR;
    };
    lcf.quota = true;
    clcf.handler = Some(quota_handler);
    NGX_CONF_OK
}

/// Whether the request is in an `rl_quota` location (for the Redis
/// replies, which both this and the access phase wait for).
pub fn is_quota(r: *mut ngx_http_request_t) -> bool {
    // SAFETY: r is a live request waiting for Redis.
    let req = unsafe { Request::from_ngx_http_request(r) };
    Module::location_conf(req).is_some_and(|lcf: &LocConf| lcf.quota)
}

ngx::http_request_handler!(quota_handler, serve);

fn serve(r: &mut Request) -> Status {
    let raw: *mut ngx_http_request_t = (&mut *r).into();
    let (Some(lcf), Some(mcf)) = (Module::location_conf(r), Module::main_conf(r)) else {
        return Status(500);
    };
    // Back from Redis (see `on_reply`).
    if let Some(ctx) = get_ctx(r).filter(|ctx| ctx.phase == Phase::Replied) {
        ctx.phase = Phase::Decided;
        return answer(raw, mcf, ctx);
    }
    // SAFETY: the request is valid in its content handler.
    let method = unsafe { (*raw).method } as u32;
    if method & (NGX_HTTP_GET | NGX_HTTP_HEAD) == 0 {
        return Status(NGX_HTTP_NOT_ALLOWED as isize);
    }
    // SAFETY: as above.
    let rc = unsafe { ngx_http_discard_request_body(raw) };
    if rc != 0 {
        return Status(rc);
    }
    let Some(ctx) = new_ctx(r, &mcf.lines, &lcf.lines, lcf.headers(), mcf.ctx_var) else {
        return Status(500);
    };
    // Every line, before and after authentication.
    for stage in [Stage::BeforeAuth, Stage::AfterAuth] {
        ctx.stage = stage;
        if eval_keys(raw, mcf, ctx, lcf.dry_run()).is_err() {
            return Status(500);
        }
    }
    // A read charges nothing, now or when the request is logged.
    ctx.charge_after = false;
    read_shm(mcf, ctx, r.log());
    if let Some(n) = submit(raw, mcf, ctx) {
        ctx.phase = Phase::Waiting(n);
        redis_zone::suspend(raw);
        // The request lives on past this handler (finalized with NGX_DONE, which gives this
        // reference back): when the replies are in, the content phase runs it again.
        // SAFETY: as above; count is the main request's reference count.
        unsafe {
            let main = (*raw).main;
            (*main).set_count((*main).count() + 1);
        }
        return Status::NGX_DONE;
    }
    ctx.phase = Phase::Decided;
    answer(raw, mcf, ctx)
}

/// Reads the request's shared-memory lines at cost 0, each under its
/// zone's lock, writing nothing: a key without a state has its full budget.
fn read_shm(mcf: &MainConf, ctx: &mut Ctx, log: *mut ngx_log_t) {
    let now_us = crate::shm::now_us();
    for (line, res) in ctx.iter_mut(&mcf.lines).filter(|(_, res)| res.active) {
        let Some(zone) = line.backend.shm().and_then(|z| mcf.zones.get(z)) else { continue };
        let Some(mut locked) = zone.lock() else {
            ngx_log_error!(NGX_LOG_ERR, log, "rl_zone \"{}\" is not initialised", zone.name);
            res.active = false;
            continue;
        };
        let hash = locked.table.hash_key(line.id, res.key.as_bytes());
        let read = locked.table.peek(hash).and_then(|slot| locked.state(slot, hash, &line.limit));
        let limit = res.limit(line);
        let o = match read {
            Some(state) => limit.left(state, now_us),
            None => {
                drop(locked);
                limit.left(&vec![0; limit.state_words()], now_us)
            }
        };
        res.set(&o, false);
    }
}

/// Sends one read-only job per Redis zone of the location. Returns how many
/// replies to wait for, or `None` if nothing was sent (a zone that could
/// not take its job has failed).
fn submit(r: *mut ngx_http_request_t, mcf: &MainConf, ctx: &mut Ctx) -> Option<u32> {
    let mut sent = 0;
    // SAFETY: the request is valid.
    let log = unsafe { (*(*r).connection).log };
    let next = ctx.headers.draft();
    for (z, zone) in mcf.redis.iter().enumerate() {
        let mut job = Job { id: 0, zone: z, commit: false, charge: false, lines: Default::default() };
        for (line, res) in ctx.on_redis_all(&mcf.lines, z) {
            job.lines.push(JobLine {
                tag: rl_core::redis::tag_of(res.key.as_bytes()),
                line_id: line.id,
                limit: *res.limit(line),
                cost: 0,
                dry_run: false,
                check_only: false,
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
            failed(log, mcf, ctx, z, zone, &RedisError::NoThread);
        }
    }
    (sent > 0).then_some(sent)
}

/// Zone `z` could not be read: the answer is 503.
fn failed(log: *mut ngx_log_t, mcf: &MainConf, ctx: &mut Ctx, z: usize, zone: &RedisZone, e: &RedisError) {
    zone.failed_doing(log, e, "answering 503 to the quota read");
    ctx.denied_by_error = true;
    for (_, res) in ctx.on_redis_all(&mcf.lines, z) {
        res.active = false;
    }
}

/// A Redis reply for a waiting read: record it, and answer once every zone
/// has.
pub fn on_reply(r: *mut ngx_http_request_t, reply: Reply) {
    // SAFETY: r is a live suspended request (pending requests are forgotten when freed).
    let req = unsafe { Request::from_ngx_http_request(r) };
    let (Some(ctx), Some(mcf)) = (get_ctx(req), Module::main_conf(req)) else { return };
    let Some(zone) = mcf.redis.get(reply.zone) else { return };
    ctx.awaited &= !(1 << reply.zone);
    match reply.result {
        Ok((_, outcomes)) => {
            for ((_, res), o) in ctx.on_redis_all(&mcf.lines, reply.zone).zip(outcomes) {
                res.set(&o, false);
            }
        }
        Err(e) => failed(req.log(), mcf, ctx, reply.zone, zone, &e),
    }
    if ctx.reply_in() {
        redis_zone::resume(r);
    }
}

/// The backstop timer fired before every reply came: the zones still owed
/// have failed.
pub fn on_lost(r: *mut ngx_http_request_t) {
    // SAFETY: r is a live suspended request.
    let req = unsafe { Request::from_ngx_http_request(r) };
    let (Some(ctx), Some(mcf)) = (get_ctx(req), Module::main_conf(req)) else { return };
    for (z, zone) in mcf.redis.iter().enumerate() {
        if ctx.awaited & (1 << z) != 0 {
            failed(req.log(), mcf, ctx, z, zone, &RedisError::NoThread);
        }
    }
    ctx.awaited = 0;
    ctx.phase = Phase::Replied;
    redis_zone::resume(r);
}

/// The response: the lines read, or 503 if a Redis zone failed. The
/// rate-limit fields are the header filter's, from the context.
fn answer(r: *mut ngx_http_request_t, mcf: &MainConf, ctx: &mut Ctx) -> Status {
    if ctx.denied_by_error {
        // What was read is partial: no field describes it.
        ctx.headers = HeadersMode::OFF;
        return send(r, 503, JSON_TYPE, b"{\"error\":\"a Redis zone of this location could not be read\"}\n");
    }
    let mut body = String::with_capacity(256);
    body.push_str("{\"lines\":[");
    for (i, (line, res)) in ctx.active(&mcf.lines).enumerate() {
        if i > 0 {
            body.push(',');
        }
        body.push_str("{\"name\":");
        json_str(&mut body, &line.item);
        body.push_str(",\"zone\":");
        json_str(&mut body, &line.zone_name);
        let _ = write!(
            body,
            ",\"limit\":{},\"remaining\":{},\"reset\":{},\"policy\":\"q={};w={}\"",
            line.limit.burst(),
            res.remaining(),
            res.reset_s(),
            line.limit.burst(),
            line.limit.window_us().div_ceil(1_000_000).max(1)
        );
        if res.dry_run {
            body.push_str(",\"dry_run\":true");
        }
        body.push('}');
    }
    body.push_str("]}\n");
    send(r, 200, JSON_TYPE, body.as_bytes())
}

/// `s` as a JSON string.
fn json_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}
