//! Requests waiting for a slot of an `rl_conn` line with `queue=` on a
//! Redis zone, the waiting line kept in the key's hash beside the workers'
//! fields (the script's `concurrent`; rl-core's `redis::holders` is its
//! model). Once the stage's shared-memory waiting lines have let the
//! request in ([`crate::shm::wait`]), it arrives in its Redis ones, in a
//! call of their own ([`arrive`]): let in, given a place, or refused. While
//! it has a place it sleeps on a timer and looks again ([`poll`]), sooner
//! the fewer places are ahead of it, at once when a request of this worker
//! gives units of the key back ([`wake`]); each look is a take, let in when
//! its units and those of every live place ahead fit in what is free. Once
//! every line has let it in, the stage's other lines are decided with it,
//! all or nothing; a line that refuses it (its wait over, the line full,
//! its place gone) refuses the request, and its places are given up
//! ([`leave`], also when its client goes away). What a place outlives a
//! request that no longer looks (a worker gone, a leave lost) is its wait
//! and a second, at most the fields' life.

use ngx::ffi::{ngx_event_t, ngx_http_request_t};
use rl_core::limit::Outcome;
use rl_core::redis::Wait;

use super::{hold_key, on_zone, settle, Ask};
use crate::conf::MainConf;
use crate::line::Line;
use crate::metrics::store::redis_slot;
use crate::redis_zone::{self, holds};
use crate::request::{Ctx, LineResult};
use crate::shm::{now_us, wake as shm_wake};

/// How long a waiter sleeps before it looks again (ms): [`POLL_STEP_MS`]
/// for itself and each place ahead of it, at most [`POLL_MAX_MS`]. Each
/// look costs Redis a read of the key's fields and places.
const POLL_STEP_MS: u64 = 5;
const POLL_MAX_MS: u64 = 50;

/// Where a Redis zone's waiters are in the worker's list of sleepers
/// ([`crate::shm::wake`]), apart from shared-memory zones'.
const WAKE_ZONE: usize = 1 << 16;

/// Whether `line` is a Redis `rl_conn` line the request waits for: one with
/// a queue, enforced (a dry-run line never waits: it is let in or not at
/// once, its verdict reported, never enforced).
fn waiting_line(line: &Line, res: &LineResult) -> bool {
    res.active && !res.dry_run && line.waits() && line.backend.redis().is_some()
}

/// Whether the request has a place in `line`'s waiting line on a Redis
/// zone.
fn has_place(line: &Line, res: &LineResult) -> bool {
    res.ticket != 0 && line.backend.redis().is_some()
}

/// The place a look of `line` asks about, and the time left of the wait
/// that started at `queued_at` (µs), at `now`.
pub fn place(line: &Line, res: &LineResult, queued_at: u64, now: u64) -> Wait {
    let end = queued_at.saturating_add(line.wait_ms.saturating_mul(1000));
    Wait { ticket: res.ticket, left_ms: end.saturating_sub(now).div_ceil(1000) }
}

/// Whether a waiting line of the stage (on shared memory or Redis) refused
/// the request: nothing more of the stage is decided.
pub fn refused(mcf: &MainConf, ctx: &Ctx) -> bool {
    ctx.staged(&mcf.lines)
        .any(|(_, res)| res.waited && res.active && !res.dry_run && !res.admitted() && res.ticket == 0)
}

/// The request arrives in the waiting lines of the stage's Redis `rl_conn`
/// lines with a queue, unless a line refused it already: whether a call
/// was sent (the request then waits for its reply).
pub fn arrive(r: *mut ngx_http_request_t, mcf: &MainConf, ctx: &mut Ctx) -> bool {
    if refused(mcf, ctx) {
        return false;
    }
    let mut any = false;
    for (_, res) in ctx.staged_mut(&mcf.lines).filter(|(l, res)| waiting_line(l, res) && !res.waited) {
        res.waited = true;
        res.asking = true;
        any = true;
    }
    if ctx.queued_at_us == 0 {
        ctx.queued_at_us = now_us();
    }
    any && ask(r, mcf, ctx)
}

/// Sends the looks of the lines asking: whether a call was sent.
fn ask(r: *mut ngx_http_request_t, mcf: &MainConf, ctx: &mut Ctx) -> bool {
    ctx.polling = true;
    let sent = super::send(r, mcf, ctx, Ask::Wait);
    ctx.polling = sent;
    sent
}

/// Whether the request has a place in a Redis waiting line.
pub fn waiting(mcf: &MainConf, ctx: &Ctx) -> bool {
    ctx.staged(&mcf.lines).any(|(l, res)| has_place(l, res))
}

/// The request, asleep in Redis waiting lines, looks again at each: whether
/// a call was sent. A line whose wait is over refuses it; its places are
/// then all given up.
pub fn poll(r: *mut ngx_http_request_t, mcf: &MainConf, ctx: &mut Ctx) -> bool {
    let (since, now) = (ctx.queued_at_us, now_us());
    let mut over = false;
    for (line, res) in ctx.staged_mut(&mcf.lines).filter(|(l, res)| has_place(l, res)) {
        if place(line, res, since, now).left_ms == 0 {
            over = true;
            if let Some(z) = line.backend.redis() {
                leave(line, res, z);
            }
            res.set(&Outcome::default(), false);
        } else {
            res.asking = true;
        }
    }
    if over {
        leave_all(mcf, ctx);
        return false;
    }
    ask(r, mcf, ctx)
}

/// A look's reply (`o`) for `line` on zone `z`: let in (its units held
/// until the request ends, the time it waited as its delay), given a place
/// (its ticket and the places ahead kept for the next look), or refused.
pub fn answered(line: &Line, res: &mut LineResult, z: usize, o: &Outcome, since: u64) {
    res.asking = false;
    settle(line, res, z, o.admitted);
    if !o.admitted && o.reset_us > 0 {
        if res.ticket == 0 {
            counted(z, true);
        }
        res.ticket = o.reset_us;
        res.ahead = o.delay_us;
        return;
    }
    let mut o = *o;
    if res.ticket != 0 {
        counted(z, false);
        res.ticket = 0;
        if o.admitted {
            o.delay_us = now_us().saturating_sub(since).max(1);
        }
    }
    res.set(&o, o.admitted);
}

/// Zone `z` failed while the request's lines asked it: they are left out
/// of the request, which `on_error=deny` (`!allow`) rejects; their places
/// are given up.
pub fn failed(mcf: &MainConf, ctx: &mut Ctx, z: usize, allow: bool) {
    let mut enforced = false;
    for (line, res) in on_zone(ctx, &mcf.lines, z, Ask::Wait) {
        res.asking = false;
        res.active = false;
        settle(line, res, z, false);
        leave(line, res, z);
        enforced = true;
    }
    if enforced && !allow {
        ctx.denied_by_error = true;
    }
}

/// After a look's replies: the milliseconds to sleep before the request
/// looks again, or `None` when it waits no more (every line let it in, or
/// one refused it, whose other places are then given up).
pub fn next(mcf: &MainConf, ctx: &mut Ctx) -> Option<u64> {
    if ctx.denied_by_error || refused(mcf, ctx) {
        leave_all(mcf, ctx);
        return None;
    }
    let ahead = ctx.staged(&mcf.lines).filter(|(l, res)| has_place(l, res)).map(|(_, res)| res.ahead).min()?;
    Some(POLL_STEP_MS.saturating_mul(ahead.saturating_add(1)).min(POLL_MAX_MS))
}

/// Gives up every place the request holds in a Redis waiting line.
fn leave_all(mcf: &MainConf, ctx: &mut Ctx) {
    for (line, res) in ctx.iter_mut(&mcf.lines) {
        if let Some(z) = line.backend.redis() {
            leave(line, res, z);
        }
    }
}

/// Gives up the place the request holds in `line`'s waiting line on zone
/// `z`, if any (sent with the loop iteration's calls); this worker's first
/// waiter behind it looks again at once.
pub fn leave(line: &Line, res: &mut LineResult, z: usize) {
    if res.ticket == 0 {
        return;
    }
    let ticket = core::mem::replace(&mut res.ticket, 0);
    counted(z, false);
    let key = hold_key(line, res);
    if holds::leave(z, (key.0, key.1), ticket) {
        redis_zone::post_flush();
    }
    wake(z, key);
}

/// Counts a request of this worker that waits in a waiting line of zone
/// `z` (`nginx_rl_conn_waiting`), or one that no longer does.
fn counted(z: usize, more: bool) {
    if let Some(m) = redis_slot(z) {
        let c = &m.conn_waiting;
        match more {
            true => c.fetch_add(1, core::sync::atomic::Ordering::Relaxed),
            false => c.fetch_sub(1, core::sync::atomic::Ordering::Relaxed),
        };
    }
}

/// This worker's first request asleep in the waiting line of `key`'s state
/// on zone `z` looks again at once: units of the key were given back here,
/// or a place ahead given up.
pub fn wake(z: usize, key: holds::Key) {
    shm_wake::wake(WAKE_ZONE + z, [key.0, key.1]);
}

/// Records that the request of `owner`, asleep with its timer on `wev`,
/// waits in its Redis waiting lines (see [`wake`]).
pub fn sleeping(mcf: &MainConf, ctx: &Ctx, owner: usize, wev: *mut ngx_event_t) {
    for (line, res) in ctx.iter(&mcf.lines).filter(|(_, res)| res.ticket != 0) {
        if let Some(z) = line.backend.redis() {
            let (tag, id, _) = hold_key(line, res);
            shm_wake::sleeping(owner, WAKE_ZONE + z, [tag, id], res.class, res.ticket, wev);
        }
    }
}
