//! A request's Redis lines: one job per zone sent to its zone's calls, the
//! request suspended until every zone has answered (or the backstop timer
//! fires), each reply written into the lines' results, and the request
//! resumed in the handler that sent them. For a stage of the access phase,
//! a waiting `rl_conn` line's look at its waiting line ([`wait`]) and an
//! `rl_quota` read alike ([`Ask`]); what a zone that fails does is the one
//! difference.

pub mod wait;

use ngx::ffi::{ngx_http_request_t, ngx_log_t};
use ngx::http::{HttpModuleLocationConf, HttpModuleMainConf, Request};
use rl_core::limit::wait::Lane;
use rl_core::redis::{ClassArg, Grants};

use crate::conf::{LocConf, MainConf};
use crate::lease;
use crate::line::Line;
use crate::metrics;
use crate::metrics::store::redis_slot;
use crate::redis_zone::{self, holds, Job, JobLine, RedisError, RedisZone, Reply};
use crate::request::{get_ctx, Ctx, LineResult, Phase};
use crate::Module;

/// What a request asks its Redis zones.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Ask {
    /// To decide and charge the lines of its current stage (the access
    /// phase): a zone that fails is left out, or rejects the request, per
    /// its `on_error`.
    Decide,
    /// To let the request in by the waiting lines of its waiting `rl_conn`
    /// lines ([`LineResult::asking`]), or give it a place there: each is
    /// decided alone, before the stage's other lines ([`wait`]).
    Wait,
    /// To read every line at cost 0, writing nothing (`rl_quota`, the
    /// script's check-only mode): a zone that fails makes the answer 503.
    Read,
}

impl Ask {
    /// What a request waiting for Redis asked: a read in an `rl_quota`
    /// location, else a look at its waiting lines or a decision.
    fn of(r: &Request, ctx: &Ctx) -> Ask {
        match Module::location_conf(r).is_some_and(|lcf: &LocConf| lcf.quota) {
            true => Ask::Read,
            false if ctx.polling => Ask::Wait,
            false => Ask::Decide,
        }
    }
}

/// What a job asks Redis about `line` for the request: the state of its
/// key, under the request's limit, for `cost`. A line in lease mode is
/// decided there as leases are granted ([`rl_core::lease::Leasing::line`]:
/// the buckets' burst less what the rate refills in a lease's life), so
/// that units a lease spends late never bunch with these beyond the line.
pub fn job_line(line: &Line, res: &LineResult, cost: u64) -> JobLine {
    JobLine {
        tag: rl_core::redis::tag_of(res.key.as_bytes()),
        line_id: line.id,
        limit: line.lease.map_or(*res.limit(line), |(_, leasing)| lease::decided_by(&leasing, res.limit(line))),
        cost,
        dry_run: res.dry_run,
        check_only: false,
        next: false,
        deepest_queue: line.deepest_queue,
        lease_life: 0,
        kept: res.kept,
        holder: None,
        wait: None,
        classes: classes(line, res),
    }
}

/// The request's active lines on Redis zone `zone` that `ask` is about
/// (those of the current stage but the waiting `rl_conn` lines, which
/// their waiting lines decide; those asking their waiting lines; or every
/// line for a read), with their results.
fn on_zone<'a>(
    ctx: &'a mut Ctx,
    lines: &'a [Line],
    zone: usize,
    ask: Ask,
) -> impl Iterator<Item = (&'a Line, &'a mut LineResult)> {
    let stage = ctx.stage;
    // (a line in lease mode that this nginx's leases decided is not Redis')
    ctx.iter_mut(lines).filter(move |(l, r)| {
        r.active
            && !r.leased
            && l.backend.redis() == Some(zone)
            && match ask {
                Ask::Decide => l.stage == stage && !r.waited,
                Ask::Wait => r.asking,
                Ask::Read => true,
            }
    })
}

/// Sends one job per Redis zone of the request's lines and, if any was
/// sent, suspends the request until the replies are in: whether it waits
/// (a zone that could not take its job has failed).
pub fn send(r: *mut ngx_http_request_t, mcf: &MainConf, ctx: &mut Ctx, ask: Ask) -> bool {
    let mut sent = 0;
    // SAFETY: the request is valid.
    let log = unsafe { (*(*r).connection).log };
    // (the wait for one more unit is asked for where the `RateLimit` field sends it)
    let next = ctx.headers.draft();
    let (queued_at, now) = (ctx.queued_at_us, crate::shm::now_us());
    for (z, zone) in mcf.redis.iter().enumerate() {
        let mut job = Job { id: 0, zone: z, commit: ask != Ask::Read, charge: false, lines: Default::default() };
        for (line, res) in on_zone(ctx, &mcf.lines, z, ask) {
            // (but what a lease paid of it: see lease::spend)
            let l = job_line(line, res, res.redis_cost());
            // (an rl_conn line's take is counted this worker's from now: see holds)
            let holder = if !line.limit.is_concurrent() {
                None
            } else if ask != Ask::Read && res.cost > 0 {
                let h = holds::take(z, (l.tag, l.line_id, hold_class(line, res)), res.cost);
                res.take_gen = h.map_or(0, |h| h.gen);
                h
            } else {
                holds::peek(z, (l.tag, l.line_id, hold_class(line, res)))
            };
            job.lines.push(match ask {
                Ask::Decide => JobLine { check_only: line.charge_after, next, holder, ..l },
                Ask::Wait => JobLine { next, holder, wait: Some(wait::place(line, res, queued_at, now)), ..l },
                Ask::Read => JobLine { dry_run: false, next, holder, ..job_line(line, res, 0) },
            });
            // (a lease asked with the request, right after its line: see lease::spend)
            if let (Ask::Decide, Some((_, leasing))) = (ask, line.lease.filter(|_| res.lease_want > 0)) {
                // (the same for every key of a line: a lease's life is the line's)
                let lease_life = leasing.life();
                job.lines.push(JobLine { cost: res.lease_want, dry_run: false, lease_life, ..l });
            }
        }
        if job.lines.is_empty() {
            continue;
        }
        if redis_zone::submit(r, job).is_ok() {
            sent += 1;
            ctx.awaited |= 1 << z;
        } else {
            failed(log, mcf, ctx, z, zone, &RedisError::NotSent, ask);
        }
    }
    if sent == 0 {
        return false;
    }
    ctx.phase = Phase::Waiting(sent);
    redis_zone::suspend(r);
    true
}

/// Zone `z` failed (`e`): logged, and for a decision counted, and its
/// lines left out of the request (see [`leave_out`]); a read is answered
/// 503.
fn failed(log: *mut ngx_log_t, mcf: &MainConf, ctx: &mut Ctx, z: usize, zone: &RedisZone, e: &RedisError, ask: Ask) {
    match ask {
        Ask::Wait => {
            zone.failed(log, e);
            metrics::redis_failed(mcf, ctx, z, zone.on_error_allow, e);
            wait::failed(mcf, ctx, z, zone.on_error_allow);
        }
        Ask::Decide => {
            // (`on_error=local`: this nginx decides the zone's lines in lease mode alone)
            if lease::alone(&mcf.leases, &mcf.lines, ctx, z, log) {
                zone.failed_doing(log, e, "limiting on this nginx alone");
            } else {
                zone.failed(log, e);
            }
            metrics::redis_failed(mcf, ctx, z, zone.on_error_allow, e);
            leave_out(mcf, ctx, z, zone.on_error_allow, log);
        }
        Ask::Read => {
            zone.failed_doing(log, e, "answering 503 to the quota read");
            ctx.denied_by_error = true;
            for (_, res) in on_zone(ctx, &mcf.lines, z, ask) {
                res.active = false;
            }
        }
    }
}

/// A zone's lines of the current stage are not decided by Redis:
/// `on_error=allow` (`allow`) leaves them out, `on_error=deny` rejects the
/// request (unless they are all dry-run: a dry-run line never rejects).
pub fn leave_out(mcf: &MainConf, ctx: &mut Ctx, zone: usize, allow: bool, log: *mut ngx_log_t) {
    if !mcf.leases.is_empty() {
        lease::parts_back(&mcf.leases, &mcf.lines, ctx, zone, log);
    }
    if !allow && on_zone(ctx, &mcf.lines, zone, Ask::Decide).any(|(_, res)| !res.dry_run) {
        ctx.denied_by_error = true;
    }
    for (line, res) in on_zone(ctx, &mcf.lines, zone, Ask::Decide) {
        res.active = false;
        settle(line, res, zone, false);
    }
}

/// The take of `line` (an `rl_conn` line on Redis zone `zone`), if one is
/// in flight, is settled: it holds its units until the request ends
/// (`held`), or holds none.
fn settle(line: &Line, res: &mut LineResult, zone: usize, held: bool) {
    if res.take_gen == 0 {
        return;
    }
    if !held && holds::settle_unheld(zone, hold_key(line, res), res.cost, res.take_gen) {
        redis_zone::post_flush();
    }
    res.take_gen = 0;
}

/// The state key of `line` for the request, as [`job_line`] names it (the
/// client key's tag and the line's id), and on a line of classes the
/// request's class plus one (its worker's field of that class).
fn hold_key(line: &Line, res: &LineResult) -> holds::Key {
    (rl_core::redis::tag_of(res.key.as_bytes()), line.id, hold_class(line, res))
}

/// A [`holds::Key`]'s class of `line` for the request.
fn hold_class(line: &Line, res: &LineResult) -> u8 {
    match line.lanes.len() > 1 {
        true => res.class.saturating_add(1),
        false => 0,
    }
}

/// The classes of `line` for the request's job: the request's and the
/// line's, on a line of classes.
fn classes(line: &Line, res: &LineResult) -> Option<ClassArg> {
    if line.lanes.len() < 2 {
        return None;
    }
    // SAFETY: the lines live in the main configuration, which lives as long as the worker's
    // cycle: until the worker exits (a reload's old workers keep theirs while they drain). A
    // job lives no longer: it is the worker's, answered or dropped by its zone's calls, which
    // end with the worker's process.
    let lanes: &'static [Lane] = unsafe { &*core::ptr::from_ref(line.lanes.as_slice()) };
    Some(ClassArg { class: res.class, lanes })
}

/// What an `rl_conn` line on Redis zone `z` holds, or takes still in
/// flight, is given back, and the place it waits in given up: the request
/// has ended (its pool's cleanup). Once: a line given back holds nothing
/// more. This worker's first waiter for the key looks again at once.
/// (Out of line: inlined, the address of its thread-locals was worked out
/// for every request's give-back, on shared memory too.)
#[inline(never)]
pub fn release(line: &Line, res: &mut LineResult, z: usize) {
    settle(line, res, z, false);
    wait::leave(line, res, z);
    if res.charged {
        res.charged = false;
        let key = hold_key(line, res);
        if holds::give_back(z, key, res.cost) {
            redis_zone::post_flush();
            wait::wake(z, key);
        }
    }
}

/// A Redis reply for a suspended request: recorded, and the request
/// resumed once every zone has answered.
pub fn on_reply(r: *mut ngx_http_request_t, reply: Reply) {
    // SAFETY: r is a live suspended request (pending requests are forgotten when freed).
    let req = unsafe { Request::from_ngx_http_request(r) };
    let (Some(ctx), Some(mcf)) = (get_ctx(req), Module::main_conf(req)) else { return };
    let Some(zone) = mcf.redis.get(reply.zone) else { return };
    let ask = Ask::of(req, ctx);
    ctx.awaited &= !(1 << reply.zone);
    let at = reply.result.as_ref().map_or(0, |(_, _, at, _)| *at);
    let since = ctx.queued_at_us;
    let mut grants = Grants::new();
    match reply.result {
        Ok((all, outcomes, _, got)) => {
            grants = got;
            for ((line, res), mut o) in on_zone(ctx, &mcf.lines, reply.zone, ask).zip(outcomes) {
                // A line is charged iff the request's enforced lines admit it and so does the
                // line (rl-core's Decision::charges); a read charges nothing, nor does a
                // `charge=after` line's check (its cost is charged when the request is logged).
                let charged = ask == Ask::Decide && all && o.admitted && !line.charge_after;
                if line.limit.is_concurrent() {
                    // (a concurrent line's fifth value: the units Redis reclaimed)
                    if let Some(m) = redis_slot(reply.zone) {
                        m.reclaimed(o.next_us);
                    }
                    o.next_us = 0;
                }
                if ask == Ask::Wait {
                    wait::answered(line, res, reply.zone, &o, since);
                    continue;
                }
                if line.limit.is_concurrent() {
                    settle(line, res, reply.zone, charged);
                }
                res.set(&o, charged);
            }
        }
        Err(e) => {
            leases_answered(mcf, ctx, reply.zone, &grants, req.log());
            failed(req.log(), mcf, ctx, reply.zone, zone, &e, ask)
        }
    }
    if ask == Ask::Decide && !mcf.leases.is_empty() {
        lease::learn(&mcf.leases, &mcf.lines, ctx, reply.zone, at, req.log());
        leases_answered(mcf, ctx, reply.zone, &grants, req.log());
    }
    if ctx.reply_in() {
        redis_zone::resume(r);
    }
}

/// The leases asked with the request's lines on Redis zone `zone`
/// ([`LineResult::lease_want`]) answered: `grants` (by the index of their
/// line in the job: each right after the line it was asked with), none for
/// a call that failed.
fn leases_answered(mcf: &MainConf, ctx: &mut Ctx, zone: usize, grants: &Grants, log: *mut ngx_log_t) {
    let mut at = 0;
    for (line, res) in on_zone(ctx, &mcf.lines, zone, Ask::Decide) {
        let asked = res.lease_want > 0;
        if asked {
            let g = grants.iter().find(|(i, _)| *i == at + 1).map(|(_, g)| g);
            lease::answered(&mcf.leases, line, res, g, log);
        }
        at += 1 + usize::from(asked);
    }
}

/// The backstop timer of a suspended request fired before every Redis
/// reply came: the zones still owed have failed, and the request goes on.
pub fn on_lost(r: *mut ngx_http_request_t) {
    // SAFETY: r is a live suspended request.
    let req = unsafe { Request::from_ngx_http_request(r) };
    let (Some(ctx), Some(mcf)) = (get_ctx(req), Module::main_conf(req)) else { return };
    let ask = Ask::of(req, ctx);
    for (z, zone) in mcf.redis.iter().enumerate() {
        if ctx.awaited & (1 << z) != 0 {
            leases_answered(mcf, ctx, z, &Grants::new(), req.log());
            failed(req.log(), mcf, ctx, z, zone, &RedisError::Unanswered, ask);
        }
    }
    ctx.awaited = 0;
    ctx.phase = Phase::Replied;
    redis_zone::resume(r);
}
