// rl-core/src/limit/fixed.rs as of 9548b9f, verbatim.
//! Fixed window: at most `burst` cost units per window `[k·W, (k+1)·W)`.
//!
//! State: `[k + 1, used]` (0 = no window yet). A `now` in an earlier window
//! than the stored one (clock stepped back) keeps counting in the stored one.
//! `used` may exceed the burst ([`Limit::overdraw`]): the overdraft counts
//! until the window ends, and is forgotten with it.

use super::{overdrawn, Charge, Limit, Outcome};

/// The state as seen at `now`.
struct View {
    /// Window index counted in.
    window: u64,
    /// Units charged in it.
    used: u64,
}

/// Reads the state at `now`, starting a new window when `now` is past it.
fn load(l: &Limit, s: &[u64], now: u64) -> View {
    let current = now / l.window;
    match s[0].checked_sub(1) {
        Some(window) if window >= current => View { window, used: s[1] },
        _ => View { window: current, used: 0 },
    }
}

/// Microseconds from `now` to the end of the view's window.
fn to_end(l: &Limit, v: &View, now: u64) -> u64 {
    v.window.saturating_add(1).saturating_mul(l.window).saturating_sub(now)
}

/// Reset time: the end of the window if anything is charged in it.
fn reset(l: &Limit, v: &View, now: u64) -> u64 {
    if v.used == 0 {
        0
    } else {
        to_end(l, v, now)
    }
}

/// See [`Limit::check`].
pub(super) fn check(l: &Limit, s: &[u64], now: u64, cost: u64) -> Outcome {
    let v = load(l, s, now);
    let free = l.burst.saturating_sub(v.used);
    if cost <= free {
        let after = View { used: v.used + cost, ..v };
        return Outcome::admit(free - cost, reset(l, &after, now), 0);
    }
    let retry = l.retry(cost, || to_end(l, &v, now));
    Outcome::reject(free, reset(l, &v, now), retry)
}

/// See [`Limit::commit`].
pub(super) fn commit(l: &Limit, s: &mut [u64], now: u64, cost: u64) -> Charge {
    let v = load(l, s, now);
    if cost > l.burst.saturating_sub(v.used) {
        return Charge::default();
    }
    s[0] = v.window.saturating_add(1);
    s[1] = v.used + cost;
    Charge { cost, at: v.window, below: 0, tag: 0 }
}

/// See [`Limit::overdraw`]: into the window counted in, beyond the burst
/// if need be.
pub(super) fn overdraw(l: &Limit, s: &mut [u64], now: u64, cost: u64) -> Charge {
    let v = load(l, s, now);
    let (used, charge) =
        overdrawn(u128::from(v.used) + u128::from(cost), Charge { cost, at: v.window, below: 0, tag: 0 });
    s[0] = v.window.saturating_add(1);
    s[1] = used;
    charge
}

/// See [`Limit::refund`]: out of the window charged, while it is the one
/// stored (once a later window is, the charge counts no more).
pub(super) fn refund(s: &mut [u64], charge: &Charge) {
    if s[0] == charge.at.saturating_add(1) {
        s[1] = s[1].saturating_sub(charge.cost);
    }
}
