//! GCRA: emission interval `T` = ⌈period_us / count⌉ (rounded up, so the
//! enforced rate is never above the configured one), tolerance
//! `τ = (B−1)·T`. State: `[TAT]` (theoretical arrival time; 0 = fresh).
//! A request of cost `c` is admitted at once iff
//! `max(TAT, now) + c·T − now ≤ τ + T`; with a queue of `Q`, delayed by the
//! excess iff that excess is at most `Q·T`, its charge moving `TAT` on all
//! the same. A `now` that stepped back only makes `TAT − now` larger:
//! stricter.

use super::{mul, overdrawn, sat, write, Charge, Decision, Limit, Outcome, Step};

// The check and the commit, from the same values, all in `u64` and exact:
// `B·T` and `(B + Q)·T` fit, being at most `(B + Q)·period`, which
// `Limit::new` and `Limit::with_queue` checked, and the backlog is compared
// with the room a cost of at most `B` leaves below them, so that
// `backlog + cost·T` is only computed where it fits.

/// A request admitted at once, or `None` ([`over`]).
#[inline(always)]
fn at_once(l: &Limit, tat: u64, now: u64, cost: u64) -> Option<Step<1>> {
    // (never 0; saying so spares the divisions their check)
    let t = l.interval.max(1);
    // `max(TAT, now)`, where a charge goes; the backlog is its distance.
    let at = tat.max(now);
    let backlog = at - now;
    if cost > l.burst {
        return None;
    }
    // The most backlog admitted at once: `backlog + cost·T ≤ B·T`.
    let room = (l.burst - cost) * t;
    if backlog > room {
        return None;
    }
    let outcome = Outcome::admit((room - backlog) / t, backlog + cost * t, 0);
    let charge = Charge { cost, at, below: 0, tag: 0 };
    Some((outcome, (cost != 0).then_some(([at.saturating_add(cost * t)], charge))))
}

/// A request not admitted at once: delayed, or rejected (cost 0 passes,
/// charging nothing).
#[inline(always)]
fn over(l: &Limit, tat: u64, now: u64, cost: u64) -> Step<1> {
    let t = l.interval.max(1);
    let at = tat.max(now);
    let backlog = at - now;
    let bt = l.burst * t;
    if cost == 0 {
        // Charges nothing, so it passes even over the limit.
        return (Outcome::admit(0, backlog, 0), None);
    }
    if cost > l.burst {
        // Never conforms.
        return (Outcome::reject(bt.saturating_sub(backlog) / t, backlog, None), None);
    }
    // The most backlog admitted delayed: `backlog + cost·T ≤ (B + Q)·T`.
    let room = (l.burst - cost) * t;
    let delayed = room + l.queue * t;
    if backlog > delayed {
        return (Outcome::reject(bt.saturating_sub(backlog) / t, backlog, Some(backlog - delayed)), None);
    }
    let outcome = Outcome::admit(0, backlog + cost * t, backlog - room);
    (outcome, Some(([at.saturating_add(cost * t)], Charge { cost, at, below: 0, tag: 0 })))
}

/// See [`Limit::check`].
#[inline(always)]
pub(super) fn check(l: &Limit, s: &[u64; 1], now: u64, cost: u64) -> Outcome {
    at_once(l, s[0], now, cost).unwrap_or_else(|| over(l, s[0], now, cost)).0
}

/// See [`Limit::acquire`]: `TAT = max(TAT, now) + cost·T` if admitted. What
/// is not admitted at once is out of line: the usual request does not
/// need its registers.
#[inline(always)]
pub(super) fn acquire(l: &Limit, s: &mut [u64; 1], now: u64, cost: u64, out: &mut Decision) {
    match at_once(l, s[0], now, cost) {
        Some(step) => write(s, step, out),
        None => acquire_over(l, s, now, cost, out),
    }
}

/// [`acquire`] of a request not admitted at once.
#[inline(never)]
fn acquire_over(l: &Limit, s: &mut [u64; 1], now: u64, cost: u64, out: &mut Decision) {
    write(s, over(l, s[0], now, cost), out)
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
