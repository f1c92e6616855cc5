// rl-core/src/limit/sliding.rs as of 9548b9f, verbatim.
//! Sliding window counter: windows aligned to multiples of `W`; a request of
//! `cost` is admitted iff `prev·(W−e)/W + curr + cost ≤ B`, `e` being the time
//! elapsed in the current window — evaluated exactly as
//! `prev·(W−e) + (curr+cost)·W ≤ B·W` in `u128`.
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

use super::{mul, overdrawn, sat, Charge, Limit, Outcome};

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

/// The estimate scaled by `W`: `prev·(W−e) + curr·W`.
fn weight(l: &Limit, v: &View) -> u128 {
    mul(v.prev, l.window.saturating_sub(v.elapsed)).saturating_add(mul(v.curr, l.window))
}

/// Whether `cost` more units keep the estimate within the burst.
fn fits(l: &Limit, v: &View, cost: u64) -> bool {
    weight(l, v).saturating_add(mul(cost, l.window)) <= mul(l.burst, l.window)
}

/// Cost-1 requests that fit: ⌊B − estimate⌋.
fn remaining(l: &Limit, v: &View) -> u64 {
    sat(mul(l.burst, l.window).saturating_sub(weight(l, v)) / u128::from(l.window))
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
    let slack = if prev == 0 { w } else { (room / u128::from(prev)).min(w) };
    Some(w - slack).filter(|e| *e < w)
}

/// Exact wait for a rejected `cost ≤ B`: later in this window, else in the
/// next (where `curr` becomes `prev`), else two windows on (all zero).
fn retry(l: &Limit, v: &View, now: u64, cost: u64) -> u64 {
    let (w, bw) = (u128::from(l.window), mul(l.burst, l.window));
    let here = bw.checked_sub(mul(v.curr.saturating_add(cost), l.window)).and_then(|room| first_fit(l, v.prev, room));
    let next = first_fit(l, v.curr, bw - mul(cost, l.window)).map(|e| w + e);
    let offset = here.or(next).unwrap_or(2 * w);
    until(v, offset, now).max(1)
}

/// See [`Limit::check`].
pub(super) fn check(l: &Limit, s: &[u64], now: u64, cost: u64) -> Outcome {
    let v = load(l, s, now);
    if fits(l, &v, cost) {
        let after = View { curr: v.curr + cost, ..v };
        return Outcome::admit(remaining(l, &after), reset(l, &after, now), 0);
    }
    let retry = l.retry(cost, || retry(l, &v, now, cost));
    Outcome::reject(remaining(l, &v), reset(l, &v, now), retry)
}

/// See [`Limit::commit`].
pub(super) fn commit(l: &Limit, s: &mut [u64], now: u64, cost: u64) -> Charge {
    let v = load(l, s, now);
    if !fits(l, &v, cost) {
        return Charge::default();
    }
    s[0] = v.window.saturating_add(1);
    s[1] = v.curr + cost;
    s[2] = v.prev;
    Charge { cost, at: v.window, below: 0, tag: 0 }
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
