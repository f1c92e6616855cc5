//! A request's lines evaluated: what the decisions take from the request,
//! for a stage of the access phase ([`crate::access`]) and for an
//! `rl_quota` read ([`crate::quota`]) alike. Each line's key ([`value`]),
//! its rate, burst and cost where they hold variables ([`params`]), the
//! limit they make (kept by the line, or copied into the request's pool),
//! written into the request's [`LineResult`]s, which the shared-memory
//! decision ([`crate::shm::decide`]) works on; the jobs that ask Redis, and
//! the wait for its replies ([`redis`]).

pub mod params;
pub mod redis;
mod value;

use core::{mem, ptr};

use ngx::ffi::{ngx_http_request_t, ngx_palloc};
use rl_core::limit::Limit;

use self::params::Params;
use crate::conf::MainConf;
use crate::line::{Line, VarLimit};
pub use crate::request::NoMemory;
use crate::request::{Ctx, LineResult};

/// Evaluates the key of every line of the request's current stage, and its
/// rate, burst and cost where they hold variables; an empty key or value
/// leaves its line inactive, as does a value that does not parse (logged).
/// `dry_run`: the location's `rl_dry_run`.
#[inline(always)]
pub fn stage(r: *mut ngx_http_request_t, mcf: &MainConf, ctx: &mut Ctx, dry_run: bool) -> Result<(), NoMemory> {
    let mut ctx_after = false;
    // A location of one line (the common case) without walking its lines.
    if let Some((line, res)) = ctx.single() {
        ctx_after = line_for(r, line, res, dry_run)?;
    } else {
        for (line, res) in ctx.staged_mut(&mcf.lines) {
            ctx_after |= line_for(r, line, res, dry_run)?;
        }
    }
    ctx.charge_after |= ctx_after;
    Ok(())
}

/// [`stage`] for one line: whether it is charged after the response.
#[inline(always)]
fn line_for(r: *mut ngx_http_request_t, line: &Line, res: &mut LineResult, dry_run: bool) -> Result<bool, NoMemory> {
    res.key = value::key(line, r)?;
    res.active = res.key.len > 0;
    res.dry_run = dry_run || line.dry_run;
    res.cost = line.cost;
    if res.active && (line.vars.is_some() || line.charge_after || line.classes.is_some()) {
        return varying(r, line, res);
    }
    Ok(false)
}

/// The part of [`stage`] for a line whose rate, burst or cost holds
/// variables, or that is `charge=after`: whether the line is then charged
/// after the response.
#[inline(never)]
fn varying(r: *mut ngx_http_request_t, line: &Line, res: &mut LineResult) -> Result<bool, NoMemory> {
    if line.vars.is_some() {
        // SAFETY: the request is valid during the phase handler.
        let log = unsafe { (*(*r).connection).log };
        let mut limit = None;
        match params::params(line, r, log, line.backend.redis().is_some(), &mut limit)? {
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
    if let Some(classes) = &line.classes {
        let v = value::param(&classes.priority, r)?;
        let c = match v.len {
            0 => classes.of(b""),
            // SAFETY: nginx's value of v.len bytes, valid during the request.
            n => classes.of(unsafe { core::slice::from_raw_parts(v.data, n) }),
        };
        res.class = c as u8;
        res.kept = classes.kept.get(c).copied().unwrap_or(0);
    }
    if line.charge_after && res.active {
        // Admitted while one unit is left; the cost is charged when the request is logged.
        res.cost = 1;
        return Ok(true);
    }
    Ok(false)
}

/// A request's limit that its line does not keep, copied into its pool: it
/// lives as long as the request's results do.
fn in_pool(r: *mut ngx_http_request_t, limit: Limit) -> Result<&'static Limit, NoMemory> {
    // SAFETY: the request pool is valid for the request's lifetime; ngx_palloc aligns to
    // NGX_ALIGNMENT, the pointer size, which is enough for a Limit (asserted below).
    let p = unsafe { ngx_palloc((*r).pool, mem::size_of::<Limit>()) }.cast::<Limit>();
    if p.is_null() {
        return Err(NoMemory);
    }
    // SAFETY: p is a fresh allocation of a Limit's size and alignment; a Limit needs no drop.
    unsafe {
        p.write(limit);
        Ok(&*p)
    }
}

const _: () = assert!(mem::align_of::<Limit>() <= mem::size_of::<usize>());
