//! `rl_quota`: a location whose content is what its `rl_limit` lines have
//! left for the request's keys, in JSON, with the rate-limit fields those
//! lines would send; nothing is charged. A line is one budget wherever it
//! appears, so the lines of `/api/` repeated here read the budget `/api/`
//! spends.
//!
//! The access phase passes such a location by (its lines are read, not
//! enforced). Shared-memory lines are checked under their zone's lock,
//! without creating a state for a key that has none; Redis lines go to
//! their zone as jobs that do not commit (the script's check-only mode,
//! which writes nothing), the request waiting for them as the access phase
//! waits, and a zone that fails answers 503 whatever its `on_error`. Both
//! read at cost 0: what a key could spend now. Nothing here is counted by
//! `rl_metrics`.

use core::ffi::{c_char, c_void};
use core::fmt::Write as _;

use ngx::core::{Status, NGX_CONF_ERROR, NGX_CONF_OK};
use ngx::ffi::{ngx_command_t, ngx_conf_t, ngx_http_request_t, ngx_log_t, NGX_LOG_EMERG, NGX_LOG_ERR};
use ngx::http::{HttpModuleLocationConf, HttpModuleMainConf, NgxHttpCoreModule, Request};
use ngx::{ngx_conf_log_error, ngx_log_error};
use rl_core::metrics::escape_json;

use crate::conf::{LocConf, MainConf};
use crate::eval::{self, redis, redis::Ask};
use crate::line::{HeadersMode, Stage};
use crate::metrics::{get_or_head, send};
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

ngx::http_request_handler!(quota_handler, serve);

fn serve(r: &mut Request) -> Status {
    let raw: *mut ngx_http_request_t = (&mut *r).into();
    let (Some(lcf), Some(mcf)) = (Module::location_conf(r), Module::main_conf(r)) else {
        return Status(500);
    };
    // Back from Redis (see [`redis::on_reply`]).
    if let Some(ctx) = get_ctx(r).filter(|ctx| ctx.phase == Phase::Replied) {
        ctx.phase = Phase::Decided;
        return answer(raw, mcf, ctx);
    }
    if let Err(status) = get_or_head(raw) {
        return status;
    }
    let Some(ctx) = new_ctx(r, &mcf.lines, &lcf.lines, lcf.headers(), mcf.ctx_var) else {
        return Status(500);
    };
    // Every line, before and after authentication.
    for stage in [Stage::BeforeAuth, Stage::AfterAuth] {
        ctx.stage = stage;
        if let Err(e) = eval::stage(raw, mcf, ctx, lcf.dry_run()) {
            return e.into();
        }
    }
    // A read charges nothing, now or when the request is logged.
    ctx.charge_after = false;
    read_shm(mcf, ctx, r.log());
    if redis::send(raw, mcf, ctx, Ask::Read) {
        // The request lives on past this handler (finalized with NGX_DONE, which gives this
        // reference back): when the replies are in, the content phase runs it again.
        // SAFETY: the request is valid in its content handler; count is the main request's
        // reference count.
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
        let mut fresh = Vec::new();
        let state = match read {
            Some(state) => state,
            None => {
                drop(locked);
                fresh.resize(limit.state_words(), 0);
                &mut fresh[..]
            }
        };
        let mut o = limit.left(state, now_us);
        if line.lanes.len() > 1 {
            // (a line of classes: what the request's class may take, the reserves above it kept)
            o.remaining = limit.wait(state, &line.lanes).map_or(o.remaining, |w| w.free(usize::from(res.class)));
        }
        // (a rate line of classes: what the request's class may spend)
        o.remaining = o.remaining.saturating_sub(res.kept);
        res.set(&o, false);
    }
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
        escape_json(&line.item, &mut body);
        body.push_str(",\"zone\":");
        escape_json(&line.zone_name, &mut body);
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
