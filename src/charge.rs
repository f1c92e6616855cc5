//! `charge=after`: the cost of a line known only once the response is done
//! (`$upstream_http_x_tokens_used`, `$status`), charged when the request is
//! logged. The access phase admitted the request while the line had a unit
//! left and charged nothing; here the cost is charged in full, beyond the
//! burst if need be (the state then records an overdraft that the key
//! waits out). This handler runs in the log phase before `access_log`
//! writes its line (handlers of a phase run in reverse order of
//! registration, and this module registers after nginx's own).
//!
//! Shared-memory lines are charged on the spot. Redis lines are queued and
//! go to Redis with the calls of the event-loop iteration, without holding
//! the request (see [`crate::redis_zone::charge`]).

use ngx::core::Status;
use ngx::ffi::{ngx_cycle, ngx_http_request_t, ngx_log_t, NGX_LOG_ERR};
use ngx::http::{HttpModuleMainConf, Request};
use ngx::ngx_log_error;

use crate::conf::MainConf;
use crate::eval::params;
use crate::eval::redis::job_line;
use crate::line::Line;
use crate::metrics;
use crate::redis_zone::{self, RedisError};
use crate::request::{get_ctx, Ctx, LineResult, Phase};
use crate::Module;

ngx::http_request_handler!(log_handler, log_phase);

/// The log-phase handler, for registration in postconfiguration.
pub fn log_handler_pt() -> ngx::ffi::ngx_http_handler_pt {
    Some(log_handler)
}

fn log_phase(r: &mut Request) -> Status {
    let raw: *mut ngx_http_request_t = (&mut *r).into();
    // SAFETY: the request is valid during the phase handler.
    if unsafe { (*raw).main } != raw {
        return Status::NGX_DECLINED;
    }
    let Some(mcf) = Module::main_conf(r) else {
        return Status::NGX_DECLINED;
    };
    let Some(ctx) = get_ctx(r) else {
        return Status::NGX_DECLINED;
    };
    // Only a request the lines admitted is charged, and only once.
    if !ctx.charge_after || ctx.rejected || matches!(ctx.phase, Phase::Waiting(_) | Phase::Replied) {
        return Status::NGX_DECLINED;
    }
    ctx.charge_after = false;
    charge(raw, mcf, ctx, r.log());
    Status::NGX_DECLINED
}

/// Charges each admitted `charge=after` line its cost, evaluated on the
/// final request (after any internal redirect).
fn charge(r: *mut ngx_http_request_t, mcf: &MainConf, ctx: &Ctx, log: *mut ngx_log_t) {
    let now_us = crate::shm::now_us();
    for (line, res) in ctx.iter(&mcf.lines) {
        if !(line.charge_after && res.active && res.admitted()) {
            continue;
        }
        let Some(cost) = params::after_cost(line, r, log) else {
            continue;
        };
        let cost = params::capped_cost(line, cost, res.limit(line), log);
        if let Some(z) = line.backend.shm() {
            charge_shm(mcf, z, line, res, cost, now_us, log);
        } else if let Some(z) = line.backend.redis() {
            // What Redis keeps exact.
            let job = job_line(line, res, cost.min(rl_core::redis::MAX_EXACT - 1));
            redis_zone::charge(log, z, job);
        }
    }
}

/// A Redis line's charge failed: logged (a few lines a second per zone,
/// apart from the requests' failures) and counted, as not charged where
/// that is known, else as of unknown outcome; not retried.
pub fn on_failed(zone: usize, e: &RedisError) {
    // SAFETY: in a worker, ngx_cycle is the running cycle, whose log is valid.
    let Some(cycle) = (unsafe { ngx_cycle.as_ref() }) else { return };
    let Some(mcf) = Module::main_conf(cycle) else { return };
    if let Some(z) = mcf.redis.get(zone) {
        z.charge_failed(cycle.log, e, 1);
    }
    metrics::charge_failed(mcf, zone, 1, e.not_applied());
}

/// The undo of a call whose requests were answered per `on_error` failed:
/// logged (one request's worth), within the charges' budget.
pub fn on_undo_failed(zone: usize, e: &RedisError) {
    // SAFETY: in a worker, ngx_cycle is the running cycle, whose log is valid.
    let Some(cycle) = (unsafe { ngx_cycle.as_ref() }) else { return };
    let Some(mcf) = Module::main_conf(cycle) else { return };
    if let Some(z) = mcf.redis.get(zone) {
        z.undo_failed(cycle.log, e);
    }
}

/// Charges a shared-memory line, under its zone's lock. A state dropped
/// since the decision (the zone was full) is created again with the charge.
fn charge_shm(mcf: &MainConf, z: usize, line: &Line, res: &LineResult, cost: u64, now_us: u64, log: *mut ngx_log_t) {
    let Some(zone) = mcf.zones.get(z) else { return };
    let Some(mut locked) = zone.lock() else {
        ngx_log_error!(NGX_LOG_ERR, log, "rl_zone \"{}\" is not initialised", zone.name);
        return;
    };
    let now_s = (now_us / 1_000_000) as u32;
    let Some(slot) = locked.ensure(res.hash, &line.limit, now_s, log) else {
        return;
    };
    let Some(state) = locked.state(slot, res.hash, &line.limit) else {
        return;
    };
    let limit = res.limit(line);
    limit.overdraw(state, now_us, cost);
    let reset_us = limit.check(state, now_us, 0).reset_us;
    locked.charged(slot, now_us, reset_us);
}
