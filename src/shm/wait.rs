//! Requests waiting for a slot of an `rl_conn` line with `queue=`, or for
//! their turn on an `rl_limit` line of classes with `queue=`: at the start
//! of a stage, the request arrives in the waiting line of each such line
//! ([`arrive`]); while it waits it sleeps on a timer, as a delayed request
//! does, and looks again when it wakes ([`poll`]), sooner the nearer it is
//! to the head of the line (at the head of a rate line's, when the
//! algorithm lets its cost through). Once every line has let it in, the
//! stage's other lines are decided with it, all or nothing; a line that
//! refuses it (the line full, its wait over, its place gone) refuses the
//! request, and the places it holds in other lines are given up
//! ([`leave_all`], also when its client goes away).

use ngx::ffi::ngx_log_t;
use rl_core::limit::wait::{Arrival, Turn, Wait};
use rl_core::limit::{Charge, Decision, Outcome};

use super::{now_us, Zone};
use crate::line::Line;
use crate::request::{Ctx, LineResult};

/// How long a waiter sleeps before it looks again (ms): [`POLL_HEAD_MS`]
/// at the head of its line (a slot freed by another worker waits for this
/// look; one freed by its own worker wakes it at once, [`super::wake`]),
/// else [`POLL_STEP_MS`] per place ahead of it, at most [`POLL_MAX_MS`].
const POLL_HEAD_MS: u64 = 1;
const POLL_STEP_MS: u64 = 5;
const POLL_MAX_MS: u64 = 50;

/// [`POLL_HEAD_MS`] or [`POLL_STEP_MS`] by the places `ahead`.
fn poll_after(ahead: u64) -> u64 {
    match ahead {
        0 => POLL_HEAD_MS,
        n => POLL_STEP_MS.saturating_mul(n).min(POLL_MAX_MS),
    }
}

/// What a line's verdict says when it lets the request in: `free` units
/// left after it, the units held (by its class, on a line of several), or
/// what a rate line charged (`taken`), and how long it waited.
fn admit(line: &Line, res: &mut LineResult, free: u64, taken: Option<Decision>, waited_us: u64) {
    res.decision = match taken {
        Some(d) => Decision { outcome: Outcome { admitted: true, delay_us: waited_us, ..d.outcome }, ..d },
        None => Decision {
            outcome: Outcome {
                admitted: true,
                remaining: free,
                reset_us: 0,
                retry_after_us: None,
                delay_us: waited_us,
                next_us: 0,
            },
            charge: Charge::held(res.cost, (line.lanes.len() > 1).then_some(usize::from(res.class))),
        },
    };
    res.charged = true;
}

/// What a rate line's waiting line says beside its verdict: what it
/// charged a request let in, and the wait until its cost would pass (both
/// `None` on an `rl_conn` line, which does not ask).
#[inline(always)]
fn rate_turn(line: &Line, wait: &Wait<'_>, class: usize, cost: u64) -> (Option<Decision>, Option<u64>) {
    match line.limit.is_concurrent() {
        true => (None, None),
        false => (wait.taken(), wait.retry_us(class, cost)),
    }
}

/// A refusal with `free` units left, and on a rate line the wait until a
/// request of its cost would pass (`Retry-After`).
fn refuse(res: &mut LineResult, free: u64, retry_us: Option<u64>) {
    res.decision.outcome =
        Outcome { admitted: false, remaining: free, reset_us: 0, retry_after_us: retry_us, delay_us: 0, next_us: 0 };
    res.ticket = 0;
}

/// The zone of a shared-memory `line`, locked.
pub(super) fn lock_of<'a>(zones: &'a [Box<Zone>], line: &Line) -> Option<super::Locked<'a>> {
    line.backend.shm().and_then(|z| zones.get(z)).and_then(|zone| zone.lock())
}

/// Whether `line` is decided here: an enforced `rl_conn` line with a
/// queue, or one with classes (a dry-run one never waits: it is let in or
/// not at once, its verdict reported, never enforced), on a shared-memory
/// zone (a Redis zone's are [`crate::eval::redis::wait`]'s).
fn queued(line: &Line, res: &LineResult) -> bool {
    res.active && line.waits() && (!res.dry_run || line.lanes.len() > 1) && line.backend.shm().is_some()
}

/// The deadline a place keeps in the line (whole seconds, rounded up, and
/// one more: a look that a timer's tick makes late still finds it).
fn deadline_s(now_us: u64, wait_ms: u64) -> u32 {
    let end = now_us.saturating_add(wait_ms.saturating_mul(1000));
    (end.div_ceil(1_000_000) + 1).min(u64::from(u32::MAX - 1)) as u32
}

/// The request arrives in the waiting line of each queued line of the
/// stage. Returns the milliseconds to sleep before it looks again, or
/// `None` when nothing waits (every line let it in or one refused it: the
/// stage is then decided, these lines' verdicts as they are).
pub fn arrive(zones: &[Box<Zone>], lines: &[Line], ctx: &mut Ctx, log: *mut ngx_log_t) -> Option<u64> {
    let now = now_us();
    let now_s = (now / 1_000_000) as u32;
    ctx.queued_at_us = now;
    let (mut waiting, mut refused) = (false, false);
    for (line, res) in ctx.staged_mut(lines).filter(|(l, res)| queued(l, res)) {
        res.waited = true;
        let Some(mut locked) = lock_of(zones, line) else {
            res.active = false;
            continue;
        };
        res.hash = locked.table.hash_key(line.id, res.key.as_bytes());
        let Some(slot) = locked.ensure(res.hash, &line.limit, now_s, log) else {
            res.active = false;
            continue;
        };
        res.slot = slot;
        let Some(mut wait) = locked.state(slot, res.hash, &line.limit).and_then(|s| line.wait_in(s, now)) else {
            res.active = false;
            continue;
        };
        let class = usize::from(res.class);
        let arrival = match res.dry_run {
            true if wait.enter(now_s, class, res.cost) => Arrival::Admitted,
            // (refused in a dry run: the request goes on, as the verdict says)
            true => Arrival::Refused,
            false => wait.arrive(now_s, class, res.cost, deadline_s(now, line.wait_ms)),
        };
        let (free, (taken, retry)) = (wait.free(class), rate_turn(line, &wait, class, res.cost));
        match arrival {
            Arrival::Admitted => admit(line, res, free, taken, 0),
            Arrival::Waiting { ticket } => {
                res.ticket = ticket + 1;
                waiting = true;
            }
            Arrival::Refused => {
                refuse(res, free, retry);
                refused |= !res.dry_run;
            }
        }
        pin(&mut locked, slot, res, line, now);
        if res.charged && line.limit.is_concurrent() {
            locked.hold(res.hash, None, res.cost, res.decision.charge.held_class(), now_s, log);
        }
        if res.ticket != 0 {
            locked.wait_starts(now_s, log);
        }
    }
    if refused {
        leave_all(zones, lines, ctx);
        return None;
    }
    waiting.then_some(POLL_HEAD_MS)
}

/// Keeps the state whatever time passes while it holds units or places,
/// else lets it expire as an idle one (a rate line's once what it was
/// charged is spent: its reset).
fn pin(locked: &mut super::Locked<'_>, slot: rl_core::table::Slot, res: &LineResult, line: &Line, now: u64) {
    // (a rate line's waiting line keeps its state out of line: never read as a plain one's holders)
    let (held, reset_us) = locked.state(slot, res.hash, &line.limit).map_or((false, 0), |s| {
        (line.limit.held(s), if line.limit.is_concurrent() { 0 } else { line.limit.check(s, now, 0).reset_us })
    });
    locked.charged_held(slot, held, now, reset_us);
}

/// The waiting request looks again at each line it waits in: as
/// [`arrive`], the milliseconds until it looks again, or `None` when it
/// waits no more.
pub fn poll(zones: &[Box<Zone>], lines: &[Line], ctx: &mut Ctx, log: *mut ngx_log_t) -> Option<u64> {
    let now = now_us();
    let now_s = (now / 1_000_000) as u32;
    let since = ctx.queued_at_us;
    let (mut next_ms, mut refused) = (None::<u64>, false);
    for (line, res) in ctx.staged_mut(lines).filter(|(_, res)| res.active && res.ticket != 0) {
        let Some(mut locked) = lock_of(zones, line) else {
            continue;
        };
        let Some(mut wait) = locked.state(res.slot, res.hash, &line.limit).and_then(|s| line.wait_in(s, now)) else {
            // (the state was dropped from a full zone: the place with it)
            refuse(res, 0, None);
            refused = true;
            locked.wait_ends();
            continue;
        };
        let ticket = res.ticket - 1;
        let end = since.saturating_add(line.wait_ms.saturating_mul(1000));
        let class = usize::from(res.class);
        let turn = wait.poll(now_s, class, res.cost, ticket);
        let (free, (taken, retry)) = (wait.free(class), rate_turn(line, &wait, class, res.cost));
        let mut admitted = false;
        match turn {
            Turn::Admitted => {
                res.ticket = 0;
                admit(line, res, free, taken, now.saturating_sub(since).max(1));
                admitted = true;
            }
            Turn::Waiting { ahead } if now < end => {
                // (at the head of a rate line: when the algorithm lets its cost through)
                let step = match (ahead, retry) {
                    (0, Some(us)) => us.div_ceil(1000).clamp(POLL_HEAD_MS, POLL_MAX_MS),
                    _ => poll_after(ahead),
                };
                let left_ms = (end - now).div_ceil(1000);
                next_ms = Some(next_ms.unwrap_or(u64::MAX).min(step).min(left_ms));
            }
            Turn::Waiting { .. } => {
                wait.leave(now_s, class, ticket);
                refuse(res, free, retry);
                refused = true;
            }
            Turn::Gone => {
                refuse(res, free, retry);
                refused = true;
            }
        }
        pin(&mut locked, res.slot, res, line, now);
        if admitted && line.limit.is_concurrent() {
            locked.hold(res.hash, None, res.cost, res.decision.charge.held_class(), now_s, log);
        }
        if res.ticket == 0 {
            locked.wait_ends();
        }
        drop(locked);
        if admitted {
            // (units may be left for the next waiter of this worker: it looks at once)
            if let Some(z) = line.backend.shm() {
                super::wake::wake(z, res.hash);
            }
        }
    }
    if refused {
        leave_all(zones, lines, ctx);
        return None;
    }
    next_ms
}

/// Gives up every place the request still holds in a waiting line (it was
/// refused, or it is ending).
pub fn leave_all(zones: &[Box<Zone>], lines: &[Line], ctx: &mut Ctx) {
    let now = now_us();
    for (line, res) in ctx.iter_mut(lines).filter(|(_, res)| res.ticket != 0) {
        leave(zones, line, res, now);
    }
}

/// Gives up the place the request holds in `line`'s waiting line, if any.
pub fn leave(zones: &[Box<Zone>], line: &Line, res: &mut LineResult, now: u64) {
    let Some(ticket) = res.ticket.checked_sub(1) else {
        return;
    };
    res.ticket = 0;
    let Some(mut locked) = lock_of(zones, line) else {
        return;
    };
    let now_s = (now / 1_000_000) as u32;
    if let Some(mut wait) = locked.state(res.slot, res.hash, &line.limit).and_then(|s| line.wait_in(s, now)) {
        wait.leave(now_s, usize::from(res.class), ticket);
    }
    pin(&mut locked, res.slot, res, line, now);
    locked.wait_ends();
    drop(locked);
    // (the place given up may have held those behind it back)
    if let Some(z) = line.backend.shm() {
        super::wake::wake(z, res.hash);
    }
}
