//! Sliding window counter: windows aligned to multiples of `W`; a request of
//! `cost` is admitted iff `prev·(W−e)/W + curr + cost ≤ B`, `e` being the time
//! elapsed in the current window — that is iff
//! `prev·(W−e) + (curr+cost)·W ≤ B·W`, evaluated exactly as
//! `curr + cost + ⌈prev·(W−e)/W⌉ ≤ B`.
//!
//! It is not an exact rolling limit. At most `B` units are charged per aligned
//! window, but the estimate assumes the previous window's units were spread
//! evenly: when they came at its end, an interval of length `W` can hold up to
//! `2B − ⌈2B/W⌉` units (`B` if `W = 1`), i.e. `2B − 1` whenever `W ≥ 2B`. A
//! rejected `cost ≤ B` is told to wait at most `W + ⌈cost·W/B⌉ ≤ 2W` (from a
//! `now` no earlier than the stored window's start). Both bounds are proved,
//! reached and checked in `tests/sliding_bound.rs`.
//!
//! State: `[k + 1, curr, prev]` (0 = no window yet), `prev` being the count of
//! window `k − 1`. Counts may exceed the burst ([`Limit::overdraw`]): an
//! overdraft weighs in as `curr`, then as `prev` in the next window,
//! weighted as usual, and is forgotten when that one ends. A `now` in an earlier window than the stored one (clock
//! stepped back) counts in the stored window with `e = 0` (the strictest).

use super::{div_ceil, mul, overdrawn, sat, write, Charge, Decision, Limit, Outcome, Step};

/// The state as seen at `now`.
#[derive(Clone, Copy)]
struct View {
    /// Start of the window counted in.
    start: u64,
    /// Time elapsed in it, `0..W`.
    elapsed: u64,
    /// Units charged in the previous window.
    prev: u64,
    /// Units charged in this window.
    curr: u64,
    /// The window index, for storing.
    window: u64,
}

/// Reads the state at `now`, rolling `curr` into `prev` across windows.
fn load(l: &Limit, s: &[u64], now: u64) -> View {
    let current = now / l.window;
    let (window, curr, prev) = match s[0].checked_sub(1) {
        Some(w) if w >= current => (w, s[1], s[2]),
        Some(w) if w.saturating_add(1) == current => (current, 0, s[1]),
        _ => (current, 0, 0),
    };
    let start = window.saturating_mul(l.window);
    View { start, elapsed: now.saturating_sub(start), prev, curr, window }
}

/// Cost-1 requests that fit: ⌊B − estimate⌋, or 0. A cost `n` fits iff
/// `prev·(W−e) + (curr + n)·W ≤ B·W`, that is iff
/// `curr + n + ⌈prev·(W−e) / W⌉ ≤ B`: the most is
/// `B − curr − ⌈prev·(W−e) / W⌉`, in `u64` (the ceiling is at most `prev`).
fn remaining(l: &Limit, v: &View) -> u64 {
    let weighted = sat(div_ceil(mul(v.prev, l.window.saturating_sub(v.elapsed)), l.window));
    l.burst.saturating_sub(v.curr).saturating_sub(weighted)
}

/// Microseconds from `now` until `start + offset`.
fn until(v: &View, offset: u128, now: u64) -> u64 {
    sat((u128::from(v.start) + offset).saturating_sub(u128::from(now)))
}

/// Time until the estimate is 0: `curr` weighs in until the end of the next
/// window, `prev` until the end of this one.
fn reset(l: &Limit, v: &View, now: u64) -> u64 {
    let w = u128::from(l.window);
    match (v.curr, v.prev) {
        (0, 0) => 0,
        (0, _) => until(v, w, now),
        _ => until(v, 2 * w, now),
    }
}

/// Smallest offset `e` into a window whose previous-window count is `prev`
/// such that `prev·(W−e) ≤ room`; `None` if no `e < W` works.
fn first_fit(l: &Limit, prev: u64, room: u128) -> Option<u128> {
    let w = u128::from(l.window);
    let slack = if prev == 0 { w } else { div(room, prev).min(w) };
    Some(w - slack).filter(|e| *e < w)
}

/// ⌊a / b⌋ for `b ≥ 1`, in `u64` when `a` fits, which spares the `u128`
/// division's call.
fn div(a: u128, b: u64) -> u128 {
    match u64::try_from(a) {
        Ok(a) => (a / b.max(1)).into(),
        Err(_) => a / u128::from(b.max(1)),
    }
}

/// Exact wait for a rejected `cost ≤ B`: later in this window, else in the
/// next (where `curr` becomes `prev`), else two windows on (all zero). Out
/// of line: an admitted request does not need its registers.
#[inline(never)]
fn retry(l: &Limit, v: &View, now: u64, cost: u64) -> u64 {
    let (w, bw) = (u128::from(l.window), mul(l.burst, l.window));
    let here = bw.checked_sub(mul(v.curr.saturating_add(cost), l.window)).and_then(|room| first_fit(l, v.prev, room));
    let next = || first_fit(l, v.curr, bw - mul(cost, l.window)).map(|e| w + e);
    let offset = here.or_else(next).unwrap_or(2 * w);
    until(v, offset, now).max(1)
}

/// A request of `cost` at `now` admitted in the window `now` is in, and what
/// it charges; `None` when it is not admitted, when the clock is behind the
/// stored window, or when the weighted count needs `u128` ([`decide`] does
/// all three). The window is the stored one, the one after it (`curr`
/// becoming `prev`) or a new one; its start is `now` less the remainder of
/// the division that finds it, which is the time elapsed. It calls nothing,
/// so that the admitted request, the usual one, saves no registers.
#[inline(always)]
fn admitted(l: &Limit, s: &[u64; 3], now: u64, cost: u64) -> Option<Step<3>> {
    // (never 0; saying so spares the division its check)
    let w = l.window.max(1);
    let (current, elapsed) = (now / w, now % w);
    let (curr, prev) = match s[0] {
        0 => (0, 0),
        k if k == current + 1 => (s[1], s[2]),
        k if k == current => (0, s[1]),
        k if k < current => (0, 0),
        _ => return None,
    };
    let left = w - elapsed;
    let weighted = u64::try_from(mul(prev, left)).ok()?.div_ceil(w);
    let free = l.burst.saturating_sub(curr).saturating_sub(weighted);
    if cost > free {
        return None;
    }
    // Until the estimate is 0, as `reset` has it: the end of the window
    // for `prev`, of the next one for `curr`.
    let reset = match (curr + cost, prev) {
        (0, 0) => 0,
        (0, _) => left,
        _ => left.saturating_add(w),
    };
    let charge = Charge { cost, at: current, below: 0, tag: 0 };
    let outcome = Outcome::admit(free - cost, reset, 0);
    Some((outcome, (cost != 0).then_some(([current + 1, curr + cost, prev], charge))))
}

/// The outcome of a request of `cost` at `now`, and what it charges.
#[inline(always)]
fn decide(l: &Limit, s: &[u64; 3], now: u64, cost: u64) -> Step<3> {
    let v = load(l, s, now);
    let free = remaining(l, &v);
    if cost <= free {
        let after = View { curr: v.curr + cost, ..v };
        let outcome = Outcome::admit(free - cost, reset(l, &after, now), 0);
        let charge = Charge { cost, at: v.window, below: 0, tag: 0 };
        return (outcome, (cost != 0).then_some(([v.window.saturating_add(1), after.curr, v.prev], charge)));
    }
    let retry = l.retry(cost, || retry(l, &v, now, cost));
    (Outcome::reject(free, reset(l, &v, now), retry), None)
}

/// See [`Limit::check`].
#[inline(always)]
pub(super) fn check(l: &Limit, s: &[u64; 3], now: u64, cost: u64) -> Outcome {
    admitted(l, s, now, cost).unwrap_or_else(|| decide(l, s, now, cost)).0
}

/// See [`Limit::acquire`]. What is not [`admitted`] at once is out of
/// line: the usual request does not need its registers.
#[inline(always)]
pub(super) fn acquire(l: &Limit, s: &mut [u64; 3], now: u64, cost: u64, out: &mut Decision) {
    match admitted(l, s, now, cost) {
        Some(step) => write(s, step, out),
        None => acquire_decided(l, s, now, cost, out),
    }
}

/// [`acquire`] of a request [`admitted`] leaves to [`decide`].
#[inline(never)]
fn acquire_decided(l: &Limit, s: &mut [u64; 3], now: u64, cost: u64, out: &mut Decision) {
    write(s, decide(l, s, now, cost), out)
}

/// See [`Limit::overdraw`]: into `curr`, beyond the burst if need be.
pub(super) fn overdraw(l: &Limit, s: &mut [u64], now: u64, cost: u64) -> Charge {
    let v = load(l, s, now);
    let (curr, charge) =
        overdrawn(u128::from(v.curr) + u128::from(cost), Charge { cost, at: v.window, below: 0, tag: 0 });
    s[0] = v.window.saturating_add(1);
    s[1] = curr;
    s[2] = v.prev;
    charge
}

/// See [`Limit::refund`]: out of `curr` while the window charged is the
/// stored one, out of `prev` once it is the one before; later it weighs
/// nothing.
pub(super) fn refund(s: &mut [u64], charge: &Charge) {
    let stored = charge.at.saturating_add(1);
    let word = match s[0] {
        w if w == stored => 1,
        w if w == stored.saturating_add(1) => 2,
        _ => return,
    };
    s[word] = s[word].saturating_sub(charge.cost);
}
