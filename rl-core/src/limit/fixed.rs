//! Fixed window: at most `burst` cost units per window `[k·W, (k+1)·W)`.
//!
//! State: `[k + 1, used]` (0 = no window yet). A `now` in an earlier window
//! than the stored one (clock stepped back) keeps counting in the stored one.
//! `used` may exceed the burst ([`Limit::overdraw`]): the overdraft counts
//! until the window ends, and is forgotten with it.

use super::{overdrawn, write, Charge, Decision, Limit, Outcome, Step};

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

/// The outcome of a request of `cost` at `now` in the window `now` is in,
/// and what it charges; `None` when the clock is behind the stored window
/// ([`decide`] does it). The window is the stored one or a new one, whose
/// end is `W` less the remainder of the division that finds it.
#[inline(always)]
fn in_window(l: &Limit, s: &[u64; 2], now: u64, cost: u64) -> Option<Step<2>> {
    // (never 0; saying so spares the division its check)
    let w = l.window.max(1);
    let (current, elapsed) = (now / w, now % w);
    let used = match s[0] {
        k if k == current + 1 => s[1],
        k if k <= current => 0,
        _ => return None,
    };
    let free = l.burst.saturating_sub(used);
    // `(current + 1)·W − now`, which `to_end` never saturates: it is `W`
    // in the first window, and after it `W ≤ now ≤ MAX_NOW`, so that
    // `(current + 1)·W ≤ now + W` fits.
    let to_end = w - elapsed;
    if cost <= free {
        let reset = if used + cost == 0 { 0 } else { to_end };
        let charge = Charge { cost, at: current, below: 0, tag: 0 };
        return Some((
            Outcome::admit(free - cost, reset, 0),
            (cost != 0).then_some(([current + 1, used + cost], charge)),
        ));
    }
    let reset = if used == 0 { 0 } else { to_end };
    Some((Outcome::reject(free, reset, l.retry(cost, || to_end)), None))
}

/// The outcome of a request of `cost` at `now`, and what it charges.
#[inline(always)]
fn decide(l: &Limit, s: &[u64; 2], now: u64, cost: u64) -> Step<2> {
    let v = load(l, s, now);
    let free = l.burst.saturating_sub(v.used);
    if cost <= free {
        let after = View { used: v.used + cost, ..v };
        let outcome = Outcome::admit(free - cost, reset(l, &after, now), 0);
        let charge = Charge { cost, at: v.window, below: 0, tag: 0 };
        return (outcome, (cost != 0).then_some(([v.window.saturating_add(1), after.used], charge)));
    }
    let retry = l.retry(cost, || to_end(l, &v, now));
    (Outcome::reject(free, reset(l, &v, now), retry), None)
}

/// See [`Limit::check`].
#[inline(always)]
pub(super) fn check(l: &Limit, s: &[u64; 2], now: u64, cost: u64) -> Outcome {
    in_window(l, s, now, cost).unwrap_or_else(|| decide(l, s, now, cost)).0
}

/// See [`Limit::acquire`]. A clock behind the stored window is out of
/// line: the usual request does not need its registers.
#[inline(always)]
pub(super) fn acquire(l: &Limit, s: &mut [u64; 2], now: u64, cost: u64, out: &mut Decision) {
    match in_window(l, s, now, cost) {
        Some(step) => write(s, step, out),
        None => acquire_decided(l, s, now, cost, out),
    }
}

/// [`acquire`] with the clock behind the stored window.
#[inline(never)]
fn acquire_decided(l: &Limit, s: &mut [u64; 2], now: u64, cost: u64, out: &mut Decision) {
    write(s, decide(l, s, now, cost), out)
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
