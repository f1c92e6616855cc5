//! The `$rl_*` variables: what the limit did to the request, for
//! `access_log` formats, `add_header`, `map` and the location `error_page`
//! sends a rejected request to. They describe the line behind the verdict
//! ([`Ctx::behind`]), and are not found when no line was active.

use core::ptr;

use ngx::ffi::{
    ngx_conf_t, ngx_http_add_variable, ngx_http_get_variable_index, ngx_http_request_t, ngx_http_variable_value_t,
    ngx_int_t, ngx_pnalloc, ngx_str_t, ngx_uint_t, NGX_HTTP_VAR_NOCACHEABLE, NGX_HTTP_VAR_NOHASH,
};
use ngx::http::{HttpModuleMainConf, Request};
use ngx::ngx_string;

use crate::conf::ConfError;
use crate::request::{get_ctx, Ctx, Phase, Verdict};
use crate::Module;

/// Which variable a handler call is for (the variable's `data`).
#[derive(Clone, Copy)]
enum Var {
    Status,
    Line,
    Limit,
    Remaining,
    Reset,
    RetryAfter,
    Delay,
}

const VARS: [(ngx_str_t, Var); 7] = [
    (ngx_string!("rl_status"), Var::Status),
    (ngx_string!("rl_line"), Var::Line),
    (ngx_string!("rl_limit"), Var::Limit),
    (ngx_string!("rl_remaining"), Var::Remaining),
    (ngx_string!("rl_reset"), Var::Reset),
    (ngx_string!("rl_retry_after"), Var::RetryAfter),
    (ngx_string!("rl_delay"), Var::Delay),
];

/// The variable whose value slot carries a request's context across
/// internal redirects (see [`crate::request::get_ctx`]): nginx clears a
/// request's module contexts when it redirects it, not its variables.
/// Hidden from lookups by name; read as a variable, it is not found.
const CTX_VAR: ngx_str_t = ngx_string!("rl_internal_ctx");

/// Declares the variables (in preconfiguration, as `limit_req` declares
/// `$limit_req_status`, so that the configuration can name them).
/// Non-cacheable: a value read before the lines were decided (in a
/// rewrite, say) must not stick.
/// nginx logs why a variable cannot be added (its name taken, no memory).
pub fn add(cf: *mut ngx_conf_t) -> Result<(), ConfError> {
    for (mut name, var) in VARS {
        // SAFETY: cf is the http{} configuration being read; nginx copies the name.
        let v = unsafe { ngx_http_add_variable(cf, &mut name, NGX_HTTP_VAR_NOCACHEABLE as ngx_uint_t) };
        // SAFETY: a non-null result is the variable nginx keeps for the cycle.
        let Some(v) = (unsafe { v.as_mut() }) else {
            return Err(ConfError::Logged);
        };
        v.get_handler = Some(get);
        v.data = var as usize;
    }
    let mut name = CTX_VAR;
    // SAFETY: as above.
    let v = unsafe { ngx_http_add_variable(cf, &mut name, NGX_HTTP_VAR_NOHASH as ngx_uint_t) };
    // SAFETY: as above.
    let Some(v) = (unsafe { v.as_mut() }) else {
        return Err(ConfError::Logged);
    };
    v.get_handler = Some(not_found);
    Ok(())
}

/// The index of the variable that carries a request's context, in
/// postconfiguration (`None`: no memory).
pub fn ctx_index(cf: *mut ngx_conf_t) -> Option<ngx_uint_t> {
    let mut name = CTX_VAR;
    // SAFETY: cf is the http{} configuration being finished; the variable was added in
    // preconfiguration.
    ngx_uint_t::try_from(unsafe { ngx_http_get_variable_index(cf, &mut name) }).ok()
}

/// The context's variable read as a variable: not found (its slot's `data`,
/// the context, is left as it is).
unsafe extern "C" fn not_found(
    _r: *mut ngx_http_request_t,
    v: *mut ngx_http_variable_value_t,
    _data: usize,
) -> ngx_int_t {
    // SAFETY: nginx passes the value to fill.
    if let Some(v) = unsafe { v.as_mut() } {
        v.set_not_found(1);
    }
    0
}

unsafe extern "C" fn get(r: *mut ngx_http_request_t, v: *mut ngx_http_variable_value_t, data: usize) -> ngx_int_t {
    let var = match data {
        d if d == Var::Status as usize => Var::Status,
        d if d == Var::Line as usize => Var::Line,
        d if d == Var::Limit as usize => Var::Limit,
        d if d == Var::Remaining as usize => Var::Remaining,
        d if d == Var::Reset as usize => Var::Reset,
        d if d == Var::RetryAfter as usize => Var::RetryAfter,
        _ => Var::Delay,
    };
    // The limit is on the main request (subrequests are not limited).
    // SAFETY: nginx calls variable handlers with a valid request, whose main request outlives it.
    let main = unsafe { (*r).main };
    // SAFETY: as above.
    let req = unsafe { Request::from_ngx_http_request(main) };
    let value = match (get_ctx(req), Module::main_conf(req)) {
        // A delayed request was decided before its sleep: a client that leaves meanwhile is
        // logged DELAYED, as limit_req logs it and as the metrics counted it.
        (Some(ctx), Some(mcf)) if matches!(ctx.phase, Phase::Decided | Phase::Delayed) => {
            value(r, ctx, &mcf.lines, var)
        }
        _ => None,
    };
    // SAFETY: nginx passes the value to fill.
    let Some(v) = (unsafe { v.as_mut() }) else {
        return 0;
    };
    match value {
        Some(s) => {
            v.set_len(s.len as u32);
            v.set_valid(1);
            v.set_no_cacheable(0);
            v.set_not_found(0);
            v.data = s.data;
        }
        None => v.set_not_found(1),
    }
    0
}

/// The variable's value for a decided request, `None` for not found.
fn value(r: *mut ngx_http_request_t, ctx: &Ctx, lines: &[crate::line::Line], var: Var) -> Option<ngx_str_t> {
    let behind = ctx.behind(lines);
    let verdict = behind.map(|(_, res)| res.verdict());
    if let Var::Status = var {
        // A request rejected by a failing Redis zone (`on_error=deny`) with no line of its own
        // to blame is rejected all the same.
        let verdict =
            if ctx.rejected { Some(verdict.map_or(Verdict::Rejected, |v| v.max(Verdict::Rejected))) } else { verdict };
        return verdict.map(|v| text(v.as_str()));
    }
    let (line, res) = behind?;
    // When the request was rejected for want of Redis, no line is behind its status.
    if ctx.rejected && verdict != Some(Verdict::Rejected) {
        return None;
    }
    match var {
        Var::Status => None,
        Var::Line => Some(text(&line.item)),
        Var::Limit if line.burst_varies() => num(r, res.limit(line).burst()),
        Var::Limit => Some(line.burst_text()),
        Var::Remaining => num(r, res.remaining()),
        Var::Reset => num(r, res.reset_s()),
        Var::RetryAfter => match verdict {
            Some(Verdict::Rejected | Verdict::RejectedDryRun) => {
                res.retry_after_us().and_then(|us| num(r, us.div_ceil(1_000_000).max(1)))
            }
            _ => None,
        },
        Var::Delay => match verdict {
            Some(Verdict::Delayed | Verdict::DelayedDryRun) => num(r, res.delay_us().div_ceil(1000)),
            _ => None,
        },
    }
}

/// Text that lives as long as the configuration.
fn text(s: &str) -> ngx_str_t {
    ngx_str_t { len: s.len(), data: s.as_ptr().cast_mut() }
}

/// `n` in decimal, in the request pool.
fn num(r: *mut ngx_http_request_t, mut n: u64) -> Option<ngx_str_t> {
    const MAX: usize = 20;
    // SAFETY: the request pool is valid for the request's lifetime.
    let buf = unsafe { ngx_pnalloc((*r).pool, MAX) }.cast::<u8>();
    if buf.is_null() {
        return None;
    }
    let mut digits = [0u8; MAX];
    let mut at = MAX;
    loop {
        at -= 1;
        if let Some(d) = digits.get_mut(at) {
            *d = b'0' + (n % 10) as u8;
        }
        n /= 10;
        if n == 0 || at == 0 {
            break;
        }
    }
    let len = MAX - at;
    // SAFETY: buf has MAX bytes; at + len == MAX.
    unsafe { ptr::copy_nonoverlapping(digits.as_ptr().add(at), buf, len) };
    Some(ngx_str_t { len, data: buf })
}
