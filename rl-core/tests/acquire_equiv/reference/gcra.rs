// rl-core/src/limit/gcra.rs as of 9548b9f, verbatim.
//! GCRA: emission interval `T` = ⌈period_us / count⌉ (rounded up, so the
//! enforced rate is never above the configured one), tolerance
//! `τ = (B−1)·T`. State: `[TAT]` (theoretical arrival time; 0 = fresh).
//! A request of cost `c` is admitted at once iff
//! `max(TAT, now) + c·T − now ≤ τ + T`; with a queue of `Q`, delayed by the
//! excess iff that excess is at most `Q·T`, its charge moving `TAT` on all
//! the same. A `now` that stepped back only makes `TAT − now` larger:
//! stricter.

use super::{mul, overdrawn, sat, Charge, Limit, Outcome};

/// `TAT − now` after charging `cost` on top of `backlog`, and by how much
/// that exceeds `τ + T = B·T` (0 if it fits: admitted at once).
fn after(l: &Limit, backlog: u64, cost: u64) -> (u128, u128) {
    let t = l.interval;
    let charged = u128::from(backlog) + mul(cost, t);
    (charged, charged.saturating_sub(mul(l.burst, t)))
}

/// Whether an excess `over` fits in the queue (for a cost that can ever
/// pass).
fn queues(l: &Limit, over: u128, cost: u64) -> bool {
    cost <= l.burst && over <= mul(l.queue, l.interval)
}

/// Cost-1 requests that fit at once: ⌊(B·T − backlog) / T⌋.
fn remaining(l: &Limit, backlog: u128) -> u64 {
    sat(mul(l.burst, l.interval).saturating_sub(backlog) / u128::from(l.interval))
}

/// See [`Limit::check`].
#[inline(always)]
pub(super) fn check(l: &Limit, s: &[u64], now: u64, cost: u64) -> Outcome {
    let backlog = s[0].saturating_sub(now);
    let (charged, over) = after(l, backlog, cost);
    if over == 0 {
        return Outcome::admit(remaining(l, charged), sat(charged), 0);
    }
    if queues(l, over, cost) {
        return Outcome::admit(0, sat(charged), sat(over));
    }
    let retry = l.retry(cost, || sat(over - mul(l.queue, l.interval)));
    Outcome::reject(remaining(l, backlog.into()), backlog, retry)
}

/// See [`Limit::commit`]: `TAT = max(TAT, now) + cost·T`.
#[inline(always)]
pub(super) fn commit(l: &Limit, s: &mut [u64], now: u64, cost: u64) -> Charge {
    let (charged, over) = after(l, s[0].saturating_sub(now), cost);
    if over != 0 && !queues(l, over, cost) {
        return Charge::default();
    }
    let at = s[0].max(now);
    s[0] = sat(u128::from(now) + charged);
    Charge { cost, at, below: 0, tag: 0 }
}

/// See [`Limit::overdraw`]: `TAT = max(TAT, now) + cost·T`, however far
/// ahead.
pub(super) fn overdraw(l: &Limit, s: &mut [u64], now: u64, cost: u64) -> Charge {
    let at = s[0].max(now);
    let charge;
    (s[0], charge) = overdrawn(u128::from(at) + mul(cost, l.interval), Charge { cost, at, below: 0, tag: 0 });
    charge
}

/// See [`Limit::refund`]. The charge moved `TAT` from `at` to
/// `at + cost·T`, and is all there unless a request came after `at`, when
/// the `TAT` without the charge could have been behind it: the charge then
/// shrank to what lies past that request, which came no later than `now`.
pub(super) fn refund(l: &Limit, s: &mut [u64], charge: &Charge, now: u64) {
    let lost = now.saturating_sub(charge.at);
    let back = mul(charge.cost, l.interval).saturating_sub(lost.into());
    s[0] = sat(u128::from(s[0]).saturating_sub(back));
}
