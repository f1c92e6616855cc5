//! A line's rate, burst and cost for a request, where they hold variables:
//! evaluated, parsed and checked; a rate and burst pair made into the
//! request's limit (kept by the line for the values a plan repeats, see
//! [`crate::line::Varying::limit_for`]). A value that is empty leaves the
//! line out of the request; one that is bad does too, and is logged, at
//! most once a second per line.

use core::sync::atomic::Ordering;

use ngx::ffi::{ngx_http_request_t, ngx_log_t, ngx_str_t, ngx_time, NGX_LOG_ERR};
use ngx::ngx_log_error;
use rl_core::limit::Limit;
use rl_core::parse::{parse_number, parse_rate, parse_u64, ParseError};

use super::value::{param, param_text, text, NoMemory};
use crate::line::{Line, VarLimit, VarParam, Varying};

/// A line's limit and cost for one request.
pub enum Params {
    /// As configured.
    Static,
    /// From the request's variables: the cost (and the limit, written
    /// where [`params`] was told).
    Per(u64),
    /// An empty or bad value: the line does not apply to the request.
    Off,
}

/// Why a variable parameter's value was not applied.
enum BadValue {
    Parse(&'static str, ParseError),
    Limit(String),
    /// A `charge=after` cost beyond [`Limit::max_cost`], and that cap.
    Cost(u64, u64),
}

/// The line's limit and cost for the request: evaluated when they hold
/// variables, the limit written to `limit` when the rate or burst does
/// (straight into the request's result: a limit is a few words). `cost=` is
/// not evaluated for `charge=after`, whose cost is known when the request is
/// logged. `redis`: the line is on a Redis zone, which computes some limits
/// inexactly.
pub fn params<'a>(
    line: &'a Line,
    r: *mut ngx_http_request_t,
    log: *mut ngx_log_t,
    redis: bool,
    limit: &mut Option<VarLimit<'a>>,
) -> Result<Params, NoMemory> {
    let Some(vars) = line.vars.as_deref() else {
        return Ok(Params::Static);
    };
    let mut cost = line.cost;
    let mut bad = None;
    if vars.limit_varies() {
        match var_limit(line, vars, r, redis)? {
            Some(Ok(l)) => *limit = Some(l),
            Some(Err(e)) => bad = Some(e),
            None => return Ok(Params::Off),
        }
    }
    if let (None, Some(p), false) = (&bad, &vars.cost, line.charge_after) {
        match param_text(p, r)? {
            None => return Ok(Params::Off),
            Some(t) => match parse_number(t) {
                Ok(c) => cost = c,
                Err(e) => bad = Some(BadValue::Parse("cost", e)),
            },
        }
    }
    match bad {
        None => Ok(Params::Per(cost)),
        Some(bad) => {
            log_bad(line, vars, log, bad);
            Ok(Params::Off)
        }
    }
}

/// The request's limit from its variable rate or burst: `None` when a
/// value is empty.
fn var_limit<'a>(
    line: &Line,
    vars: &'a Varying,
    r: *mut ngx_http_request_t,
    redis: bool,
) -> Result<Option<Result<VarLimit<'a>, BadValue>>, NoMemory> {
    let (mut rate_v, mut burst_v) = (None, None);
    for (p, v) in [(&vars.rate, &mut rate_v), (&vars.burst, &mut burst_v)] {
        if let Some(p) = p {
            match param(p, r)? {
                e if e.len == 0 => return Ok(None),
                e => *v = Some(e),
            }
        }
    }
    Ok(Some(vars.limit_for(rate_v, burst_v, || parse_limit(line, rate_v, burst_v, redis))))
}

/// The limit of a request's rate and burst texts (`None`: the line's own).
fn parse_limit(
    line: &Line,
    rate_v: Option<ngx_str_t>,
    burst_v: Option<ngx_str_t>,
    redis: bool,
) -> Result<Limit, BadValue> {
    let rate = match rate_v {
        Some(v) => parse_rate(text(v)).map_err(|e| BadValue::Parse("rate", e))?,
        None => line.limit.rate(),
    };
    let burst = match burst_v {
        Some(v) => parse_u64(text(v)).map_err(|e| BadValue::Parse("burst", e))?,
        // Left out: the rate's count, as for a static line.
        None if line.burst_src.is_empty() => rate.count,
        None => line.limit.burst(),
    };
    match Limit::new(line.limit.algorithm(), rate, burst).and_then(|l| l.with_queue(line.queue)) {
        Ok(l) if redis && !rl_core::redis::exact(&l) => Err(BadValue::Limit(format!(
            "rate {rate} with burst {burst} is out of the range a Redis zone computes exactly"
        ))),
        Ok(l) => Ok(l.varying()),
        Err(e) => Err(BadValue::Limit(e.to_string())),
    }
}

/// The cost of a `charge=after` line, evaluated when the request is
/// logged: `None` to charge nothing (empty, zero, or a bad value, logged).
pub fn after_cost(line: &Line, r: *mut ngx_http_request_t, log: *mut ngx_log_t) -> Option<u64> {
    let Some((vars, p)) = line.vars.as_deref().and_then(|v| Some((v, v.cost.as_ref()?))) else {
        return Some(line.cost).filter(|c| *c > 0);
    };
    let text = param_text(p, r).ok()??;
    match parse_number(text) {
        Ok(cost) => Some(cost).filter(|c| *c > 0),
        Err(e) => {
            log_bad(line, vars, log, BadValue::Parse("cost", e));
            None
        }
    }
}

/// What a `charge=after` line charges for `cost` under the request's
/// `limit`: the cost, or, for a figure no real cost reaches (beyond what
/// the rate refills in [`rl_core::limit::MAX_CHARGE_US`]), the cap, logged.
/// A static cost never exceeds the burst, so only a cost from variables can
/// be capped.
pub fn capped_cost(line: &Line, cost: u64, limit: &Limit, log: *mut ngx_log_t) -> u64 {
    let cap = limit.max_cost();
    if cost <= cap {
        return cost;
    }
    if let Some(vars) = line.vars.as_deref() {
        log_bad(line, vars, log, BadValue::Cost(cost, cap));
    }
    cap
}

/// Says why a value was not applied (or, for a cost, what was charged
/// instead), at most once a second per line.
fn log_bad(line: &Line, vars: &Varying, log: *mut ngx_log_t, bad: BadValue) {
    let now = ngx_time() as u64;
    if vars.logged().swap(now, Ordering::Relaxed) == now {
        return;
    }
    let src = |p: Option<&VarParam>| p.map_or("", |p| p.src.as_str()).to_string();
    let (why, then) = match bad {
        BadValue::Parse(what, e) => {
            let from = match what {
                "rate" => src(vars.rate.as_ref()),
                "burst" => src(vars.burst.as_ref()),
                _ => src(vars.cost.as_ref()),
            };
            let value: String = e.value.chars().take(64).collect();
            (format!("invalid {what} \"{value}\" from \"{from}\""), "the line is not applied".to_string())
        }
        BadValue::Limit(m) => (m, "the line is not applied".to_string()),
        BadValue::Cost(cost, cap) => (
            format!(
                "cost {cost} from \"{}\" is more than the rate refills in {} days",
                src(vars.cost.as_ref()),
                rl_core::limit::MAX_CHARGE_US / 86_400_000_000
            ),
            format!("charged as {cap}"),
        ),
    };
    ngx_log_error!(
        NGX_LOG_ERR,
        log,
        "{} in rl_limit \"{}\" of zone \"{}\" ({}), {}",
        why,
        line.item,
        line.zone_name,
        line.origin,
        then
    );
}
