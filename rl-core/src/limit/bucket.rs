//! Token bucket and leaky bucket (as a meter) — the same exact arithmetic.
//!
//! Amounts are scaled by `period_us` so that one request is `period_us` units,
//! the capacity is `B·period_us` and `elapsed_us` refills (or drains)
//! exactly `elapsed_us·count` units. The stored amount is what is *used*
//! (tokens taken, or the leaky bucket's level), so zero is a full/empty bucket.
//!
//! State: `[used, last]`, `last` being the latest time seen. A `now` before
//! `last` (clock stepped back) is treated as `last`: no refill, and waits are
//! measured from `now`.

use super::{div_ceil, mul, sat, Algorithm, Charge, Limit, Outcome};

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
fn load(l: &Limit, s: &[u64], now: u64) -> View {
    let refill = mul(now.saturating_sub(s[1]), l.rate.count);
    View {
        used: sat(u128::from(s[0].min(l.capacity)).saturating_sub(refill)),
        at: now.max(s[1]),
        lag: s[1].saturating_sub(now),
    }
}

/// Whether `cost` more requests fit in the capacity.
fn fits(l: &Limit, v: &View, cost: u64) -> bool {
    u128::from(v.used) + mul(cost, l.rate.period_us) <= u128::from(l.capacity)
}

/// Microseconds from `now` until `amount` (scaled) has refilled/drained;
/// refilling starts at `at`, so a lagging clock waits `lag` more.
fn drain(l: &Limit, v: &View, amount: u128) -> u64 {
    match amount {
        0 => 0,
        _ => sat(u128::from(v.lag) + div_ceil(amount, l.rate.count)),
    }
}

/// Cost-1 requests that fit: ⌊free capacity⌋.
fn remaining(l: &Limit, used: u64) -> u64 {
    (l.capacity - used) / l.rate.period_us
}

/// The shaping delay (leaky bucket only): the level before this request
/// drained at the rate.
fn delay(l: &Limit, v: &View) -> u64 {
    match l.algorithm {
        Algorithm::LeakyBucket => drain(l, v, v.used.into()),
        _ => 0,
    }
}

/// See [`Limit::check`].
pub(super) fn check(l: &Limit, s: &[u64], now: u64, cost: u64) -> Outcome {
    let v = load(l, s, now);
    if fits(l, &v, cost) {
        let used = v.used + cost * l.rate.period_us;
        return Outcome::admit(remaining(l, used), drain(l, &v, used.into()), delay(l, &v));
    }
    let retry = l.retry(cost, || {
        let deficit = u128::from(v.used) + mul(cost, l.rate.period_us) - u128::from(l.capacity);
        drain(l, &v, deficit)
    });
    let reset = drain(l, &v, v.used.into());
    Outcome::reject(remaining(l, v.used), reset, retry, delay(l, &v))
}

/// See [`Limit::commit`].
pub(super) fn commit(l: &Limit, s: &mut [u64], now: u64, cost: u64) -> Charge {
    let v = load(l, s, now);
    if !fits(l, &v, cost) {
        return Charge::default();
    }
    s[0] = v.used + cost * l.rate.period_us;
    s[1] = v.at;
    Charge { cost, at: v.at, below: v.used }
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
    s[0] = sat(u128::from(s[0].min(l.capacity)).saturating_sub(back));
}
