//! The decision on a request's shared-memory lines: under their zones' locks
//! (taken in zone order, the order the location's lines are sorted in),
//! every line is checked, then — only if every one admits — every one is
//! charged; and the refund of those charges, for a request that Redis then
//! rejected. A line not charged reports what its state has left; where the
//! `RateLimit` field is sent ([`Ctx::headers`]), every line reports the wait
//! for one more unit, its `t`.

use core::mem;

use ngx::ffi::{ngx_log_t, NGX_LOG_ERR};
use ngx::ngx_log_error;

use rl_core::limit::Limit;

use super::{holds, idle_time, Locked, Zone, MAX_ZONES_PER_LOCATION};
use crate::line::Line;
use crate::request::{Ctx, LineResult};

/// Decides the active shared-memory lines of the request's current stage
/// ([`Ctx::staged`]) and, if every enforced one admits, charges them and
/// the dry-run lines that admit; returns whether every enforced line
/// admits. A line whose zone cannot be used is
/// left inactive, and said so in the log.
#[inline(always)]
pub fn decide(zones: &[Box<Zone>], lines: &[Line], ctx: &mut Ctx, log: *mut ngx_log_t) -> bool {
    let now_us = crate::shm::now_us();
    let next = ctx.headers.draft();
    match ctx.single() {
        Some((line, res)) => match line.backend.shm() {
            // (an rl_conn line that made the request wait for a slot: decided already)
            Some(_) if res.waited => res.admitted() || !res.active || res.dry_run,
            Some(z) if res.active => decide_one(zones.get(z).map(|z| &**z), line, res, now_us, next, log),
            _ => true,
        },
        None => decide_lines(zones, lines, ctx, now_us, next, log),
    }
}

/// What a line the decision did not charge reports: what its state has
/// left when it admits the request (rl-core's `Outcome::uncharged`), and,
/// when `next`, the wait for one more unit (which costs a second check).
fn not_charged(limit: &Limit, res: &mut LineResult, state: &[u64], now_us: u64, next: bool) {
    if res.admitted() {
        let left = match next {
            true => limit.left(state, now_us),
            false => limit.check(state, now_us, 0),
        };
        res.decision.outcome = res.decision.outcome.uncharged(&left);
        // (what the request's class may still spend: the classes above keep their reserves)
        res.decision.outcome.remaining = res.decision.outcome.remaining.saturating_sub(res.kept);
    } else if next {
        res.decision.outcome.next_us = limit.next_us(state, now_us);
    }
}

/// [`decide`] for a location of several lines.
#[inline(never)]
fn decide_lines(
    zones: &[Box<Zone>],
    lines: &[Line],
    ctx: &mut Ctx,
    now_us: u64,
    next: bool,
    log: *mut ngx_log_t,
) -> bool {
    let now_s = (now_us / 1_000_000) as u32;
    // The rl_conn lines that made the request wait for a slot are decided already (shm::wait):
    // the others are decided here, with their verdicts.
    let waited_ok =
        ctx.staged(lines).filter(|(_, res)| res.active && res.waited && !res.dry_run).all(|(_, res)| res.admitted());
    // (one line to decide, and nothing refused already: decided and charged in one step)
    if waited_ok {
        let mut active = ctx.staged_mut(lines).filter(|(_, res)| res.active && !res.waited);
        if let (Some((line, res)), None) = (active.next(), active.next()) {
            if let Some(z) = line.backend.shm() {
                return decide_one(zones.get(z).map(|z| &**z), line, res, now_us, next, log);
            }
        }
    }

    // Locks and entries.
    let mut locks = Locks::new();
    for (line, res) in ctx.staged_mut(lines).filter(|(_, res)| res.active && !res.waited) {
        let Some(z) = line.backend.shm() else { continue };
        if locks.last_zone() != Some(z) {
            let Some(zone) = zones.get(z) else {
                res.active = false;
                continue;
            };
            let Some(mut locked) = zone.lock() else {
                ngx_log_error!(NGX_LOG_ERR, log, "rl_zone \"{}\" is not initialised", zone.name);
                res.active = false;
                continue;
            };
            locked.expire(now_s);
            if locks.push(z, locked).is_err() {
                // finish() refuses a location with more zones than a request can lock.
                ngx_log_error!(NGX_LOG_ERR, log, "rl_zone \"{}\": too many zones in one location", zone.name);
                return false;
            }
        }
        let Some((lock, locked)) = locks.last_mut() else {
            continue;
        };
        res.hash = locked.table.hash_key(line.id, res.key.as_bytes());
        res.lock = lock;
        // (the line's template: a state's size does not depend on the values of variables)
        match locked.ensure(res.hash, &line.limit, now_s, log) {
            Some(slot) => res.slot = slot,
            None => res.active = false,
        }
    }

    // Check every line, charging nothing.
    let mut admitted = waited_ok;
    for (line, res) in ctx.staged_mut(lines).filter(|(l, res)| res.active && !res.waited && l.backend.shm().is_some()) {
        let Some(locked) = locks.get_mut(res.lock) else {
            res.active = false;
            continue;
        };
        let Some(state) = locked.state(res.slot, res.hash, &line.limit) else {
            res.active = false;
            continue;
        };
        let o = match res.kept {
            0 => res.limit(line).check(state, now_us, res.cost),
            kept => res.limit(line).check_keeping(state, now_us, res.cost, kept),
        };
        res.set(&o, false);
        admitted &= o.admitted || res.dry_run;
    }

    // Every enforced line admits: charge them all, and each dry-run line
    // that admits, as if it were enforced.
    if admitted {
        for (line, res) in ctx.staged_mut(lines).filter(|(l, res)| {
            res.active && !res.waited && res.admitted() && !l.charge_after && l.backend.shm().is_some()
        }) {
            let Some(locked) = locks.get_mut(res.lock) else {
                continue;
            };
            let Some(state) = locked.state(res.slot, res.hash, &line.limit) else {
                continue;
            };
            // (`res.limit(line)`, without holding `res`, whose verdict is written below)
            let limit = res.var_limit.unwrap_or(&line.limit);
            let o = limit.check(state, now_us, res.cost);
            res.decision.charge = limit.commit(state, now_us, res.cost);
            res.decision.outcome.remaining = o.remaining.saturating_sub(res.kept);
            res.decision.outcome.reset_us = o.reset_us;
            if next {
                res.decision.outcome.next_us = limit.next_us(state, now_us);
            }
            res.charged = true;
            let held = limit.held(state);
            locked.charged_held(res.slot, held, now_us, o.reset_us);
            if limit.is_concurrent() && res.decision.charge.cost() > 0 {
                locked.hold(
                    res.hash,
                    holds::inline(limit).then_some(res.slot),
                    res.decision.charge.cost(),
                    0,
                    now_s,
                    log,
                );
            }
        }
    }

    // The lines not charged.
    for (line, res) in
        ctx.staged_mut(lines).filter(|(l, res)| res.active && !res.waited && !res.charged && l.backend.shm().is_some())
    {
        let Some(locked) = locks.get_mut(res.lock) else {
            continue;
        };
        let Some(state) = locked.state(res.slot, res.hash, &line.limit) else {
            continue;
        };
        let limit = res.var_limit.unwrap_or(&line.limit);
        not_charged(limit, res, state, now_us, next);
    }
    admitted
}

/// [`decide`] for the common case, the stage's one active line on shared
/// memory: checked and charged in one step, under its zone's lock alone (a
/// dry-run line alone, too: it is charged if and only if it admits, and
/// never rejects).
#[inline(always)]
fn decide_one(
    zone: Option<&Zone>,
    line: &Line,
    res: &mut LineResult,
    now_us: u64,
    next: bool,
    log: *mut ngx_log_t,
) -> bool {
    let Some(zone) = zone else {
        res.active = false;
        return true;
    };
    let Some(locked) = zone.lock() else {
        ngx_log_error!(NGX_LOG_ERR, log, "rl_zone \"{}\" is not initialised", zone.name);
        res.active = false;
        return true;
    };
    decide_locked(locked, line, res, now_us, next, log)
}

/// [`decide_one`] under the zone's lock, which it releases.
#[inline(always)]
fn decide_locked(
    mut locked: Locked,
    line: &Line,
    res: &mut LineResult,
    now_us: u64,
    next: bool,
    log: *mut ngx_log_t,
) -> bool {
    let now_s = (now_us / 1_000_000) as u32;
    let hash = locked.table.hash_key(line.id, res.key.as_bytes());
    res.hash = hash;
    res.lock = 0;
    let slot = locked.ensure_one(hash, &line.limit, now_s, log);
    let found = slot.and_then(|slot| {
        res.slot = slot;
        locked.ensured_state_and_idle(slot, &line.limit)
    });
    let admitted = match found {
        Some((state, idle)) => decide_state(line, res, state, idle, now_us, next),
        None => {
            res.active = false;
            true
        }
    };
    if res.charged && line.limit.is_concurrent() {
        locked.hold(hash, holds::inline(&line.limit).then_some(res.slot), res.charge().cost(), 0, now_s, log);
    }
    locked.unlock();
    admitted
}

/// [`decide_locked`] on the line's state: whether the request may go on.
#[inline(always)]
fn decide_state(line: &Line, res: &mut LineResult, state: &mut [u64], idle: &mut u32, now_us: u64, next: bool) -> bool {
    // (`res.limit(line)`, without holding `res`, whose verdict is written below)
    let limit = res.var_limit.unwrap_or(&line.limit);
    // A charge=after line asks for one unit and is charged when the request is logged.
    if line.charge_after {
        res.set(&limit.check_keeping(state, now_us, res.cost, res.kept), false);
        not_charged(limit, res, state, now_us, next);
        return res.admitted() || res.dry_run;
    }
    // (written in place; nothing charged when rejected)
    match res.kept {
        0 => limit.acquire_into(state, now_us, res.cost, &mut res.decision),
        kept => limit.acquire_keeping(state, now_us, res.cost, kept, &mut res.decision),
    }
    let admitted = res.admitted();
    if admitted {
        *idle = idle_time(limit.held(state), now_us, res.reset_us());
    }
    res.charged = admitted;
    if next {
        res.decision.outcome.next_us = limit.next_us(state, now_us);
    }
    admitted || res.dry_run
}

/// Gives back what [`decide`] charged the shared-memory lines of the
/// request's current stage (a stage before it keeps its charges), under
/// their zones' locks, and records what each line has left after it: the
/// stage rejected the request, and charged nothing. A state dropped meanwhile
/// (the zone was full) has nothing to give back.
pub fn refund(zones: &[Box<Zone>], lines: &[Line], ctx: &mut Ctx) {
    let now_us = crate::shm::now_us();
    let next = ctx.headers.draft();
    let mut locks = Locks::new();
    for (line, res) in ctx.staged_mut(lines).filter(|(_, res)| res.active && res.charged) {
        let Some(z) = line.backend.shm() else { continue };
        res.charged = false;
        if locks.last_zone() != Some(z) {
            let Some(locked) = zones.get(z).and_then(|zone| zone.lock()) else {
                continue;
            };
            if locks.push(z, locked).is_err() {
                // decide() locked these zones together, so they fit.
                return;
            }
        }
        let Some((_, locked)) = locks.last_mut() else {
            continue;
        };
        let Some(state) = locked.state(res.slot, res.hash, &line.limit) else {
            continue;
        };
        let limit = res.var_limit.unwrap_or(&line.limit);
        limit.refund(state, res.charge(), now_us);
        not_charged(limit, res, state, now_us, next);
        let held = limit.held(state);
        locked.charged_held(res.slot, held, now_us, res.reset_us());
        if limit.is_concurrent() {
            let (cost, class, inline) = (res.charge().cost(), res.charge().held_class(), holds::inline(limit));
            locked.unhold(res.hash, inline.then_some(res.slot), cost, class, (now_us / 1_000_000) as u32);
            // (the zones stay locked: woken, a waiter runs on a later turn of the event loop)
            super::wake::wake(z, res.hash);
        }
    }
}

/// Gives back the units a request's concurrency line (`rl_conn`) holds on
/// shared memory, and gives up its place in the line's waiting line: the
/// request has ended (its pool is being destroyed). Once: a line given back
/// holds nothing more.
pub fn release(zones: &[Box<Zone>], line: &Line, res: &mut LineResult, now_us: u64) {
    // (a request that ends while it waits gives its places up)
    if res.ticket != 0 {
        super::wait::leave(zones, line, res, now_us);
    }
    // (what a rate line charged is spent, however the request ends)
    if !(res.active && res.charged && line.limit.is_concurrent()) {
        return;
    }
    res.charged = false;
    let Some(mut locked) = super::wait::lock_of(zones, line) else {
        return;
    };
    let (cost, class) = (res.charge().cost(), res.charge().held_class());
    if holds::inline(&line.limit) {
        // (nobody waits for a slot of a line without a waiting line: nobody to wake)
        locked.give_back_plain(res.hash, res.slot, cost, &line.limit, now_us);
        return;
    }
    if let Some(state) = locked.state(res.slot, res.hash, &line.limit) {
        line.limit.refund(state, res.charge(), now_us);
        let held = line.limit.held(state);
        locked.charged_held(res.slot, held, now_us, 0);
    }
    locked.unhold(res.hash, None, cost, class, (now_us / 1_000_000) as u32);
    drop(locked);
    if let Some(z) = line.backend.shm() {
        super::wake::wake(z, res.hash);
    }
}

/// The zones locked by one request, in locking order; unlocked when dropped.
/// A small array on the stack: initialising 16 `Option<Locked>` per request
/// would cost more than the decision itself.
struct Locks<'a> {
    zones: [usize; MAX_ZONES_PER_LOCATION],
    locks: [mem::MaybeUninit<Locked<'a>>; MAX_ZONES_PER_LOCATION],
    len: usize,
}

impl<'a> Locks<'a> {
    fn new() -> Self {
        Locks {
            zones: [0; MAX_ZONES_PER_LOCATION],
            locks: [const { mem::MaybeUninit::uninit() }; MAX_ZONES_PER_LOCATION],
            len: 0,
        }
    }

    fn last_zone(&self) -> Option<usize> {
        self.len.checked_sub(1).map(|i| self.zones[i])
    }

    fn push(&mut self, zone: usize, locked: Locked<'a>) -> Result<(), Locked<'a>> {
        if self.len == MAX_ZONES_PER_LOCATION {
            return Err(locked);
        }
        self.zones[self.len] = zone;
        self.locks[self.len].write(locked);
        self.len += 1;
        Ok(())
    }

    fn get_mut(&mut self, i: usize) -> Option<&mut Locked<'a>> {
        // SAFETY: the first len elements are initialised.
        (i < self.len).then(|| unsafe { self.locks[i].assume_init_mut() })
    }

    fn last_mut(&mut self) -> Option<(usize, &mut Locked<'a>)> {
        let i = self.len.checked_sub(1)?;
        self.get_mut(i).map(|l| (i, l))
    }
}

impl Drop for Locks<'_> {
    fn drop(&mut self) {
        for l in &mut self.locks[..self.len] {
            // SAFETY: the first len elements are initialised and dropped once.
            unsafe { l.assume_init_drop() };
        }
    }
}
