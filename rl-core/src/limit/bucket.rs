//! Token bucket and leaky bucket (as a meter) — the same exact arithmetic.
//!
//! Amounts are scaled by `period_us` so that one request is `period_us` units,
//! the capacity is `B·period_us` and `elapsed_us` refills (or drains)
//! exactly `elapsed_us·count` units. The stored amount is what is *used*
//! (tokens taken, or the leaky bucket's level), so zero is a full/empty bucket.
//! With a queue, delayed requests are charged too: the amount then exceeds
//! the capacity, by at most the queue, `Q·period_us`; an overdraft
//! ([`Limit::overdraw`]) exceeds it by any amount, read as it is.
//!
//! State: `[used, last]`, `last` being the latest time seen. A `now` before
//! `last` (clock stepped back) is treated as `last`: no refill, and waits are
//! measured from `now`.

use super::{div_ceil, mul, overdrawn, sat, Charge, Limit, Outcome};

/// The state as seen at `now`.
struct View {
    /// Used amount (scaled) at `at`.
    used: u64,
    /// The latest time seen: `max(now, last)`.
    at: u64,
    /// `at − now`: how far the clock is behind.
    lag: u64,
}

/// Reads the state at `now`, refilling for the time elapsed since `last`.
/// The amount is read as it is, above the capacity too: units another line
/// sharing the state queued are there for this one as well.
fn load(l: &Limit, s: &[u64], now: u64) -> View {
    let refill = mul(now.saturating_sub(s[1]), l.rate.count);
    View { used: sat(u128::from(s[0]).saturating_sub(refill)), at: now.max(s[1]), lag: s[1].saturating_sub(now) }
}

/// The amount after charging `cost`, and by how much that exceeds the
/// capacity (0 if it fits: admitted at once).
fn after(l: &Limit, v: &View, cost: u64) -> (u128, u128) {
    let after = u128::from(v.used) + mul(cost, l.rate.period_us);
    (after, after.saturating_sub(l.capacity.into()))
}

/// Whether an excess `over` the capacity fits in the queue (for a cost
/// that can ever pass).
fn queues(l: &Limit, over: u128, cost: u64) -> bool {
    cost <= l.burst && over <= mul(l.queue, l.rate.period_us)
}

/// Microseconds from `now` until `amount` (scaled) has refilled/drained;
/// refilling starts at `at`, so a lagging clock waits `lag` more.
fn drain(l: &Limit, v: &View, amount: u128) -> u64 {
    match amount {
        0 => 0,
        _ => sat(u128::from(v.lag) + div_ceil(amount, l.rate.count)),
    }
}

/// Cost-1 requests that fit at once: ⌊free capacity⌋ (0 while anything
/// is queued).
fn remaining(l: &Limit, used: u128) -> u64 {
    sat(u128::from(l.capacity).saturating_sub(used) / u128::from(l.rate.period_us))
}

/// See [`Limit::check`].
#[inline(always)]
pub(super) fn check(l: &Limit, s: &[u64], now: u64, cost: u64) -> Outcome {
    let v = load(l, s, now);
    let (used, over) = after(l, &v, cost);
    if over == 0 {
        return Outcome::admit(remaining(l, used), drain(l, &v, used), 0);
    }
    if queues(l, over, cost) {
        // Delayed until the excess has drained.
        return Outcome::admit(0, drain(l, &v, used), drain(l, &v, over));
    }
    let retry = l.retry(cost, || drain(l, &v, over - mul(l.queue, l.rate.period_us)));
    Outcome::reject(remaining(l, v.used.into()), drain(l, &v, v.used.into()), retry)
}

/// See [`Limit::commit`].
#[inline(always)]
pub(super) fn commit(l: &Limit, s: &mut [u64], now: u64, cost: u64) -> Charge {
    let v = load(l, s, now);
    let (used, over) = after(l, &v, cost);
    if over != 0 && !queues(l, over, cost) {
        return Charge::default();
    }
    s[0] = sat(used);
    s[1] = v.at;
    Charge { cost, at: v.at, below: v.used, tag: 0 }
}

/// See [`Limit::overdraw`]: the amount grows by the cost, beyond the
/// capacity if need be.
pub(super) fn overdraw(l: &Limit, s: &mut [u64], now: u64, cost: u64) -> Charge {
    let v = load(l, s, now);
    let charge = Charge { cost, at: v.at, below: v.used, tag: 0 };
    let (used, charge) = overdrawn(u128::from(v.used) + mul(cost, l.rate.period_us), charge);
    s[0] = used;
    s[1] = v.at;
    charge
}

/// See [`Limit::refund`]. The stored level (at `last`) holds all of the
/// charge unless, between the charge and `last`, the level without it would
/// have drained to empty; that takes at least `below` of draining, after
/// which the charge drains at most at the rate. So at least
/// `cost·period − max(0, drained − below)` of it is still there.
pub(super) fn refund(l: &Limit, s: &mut [u64], charge: &Charge) {
    let Some(since) = s[1].checked_sub(charge.at) else {
        // Older than the charge: a state created afresh since.
        return;
    };
    let lost = mul(since, l.rate.count).saturating_sub(charge.below.into());
    let back = mul(charge.cost, l.rate.period_us).saturating_sub(lost);
    s[0] = sat(u128::from(s[0]).saturating_sub(back));
}
