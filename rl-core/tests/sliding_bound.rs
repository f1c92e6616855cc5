//! How far `sliding` (the sliding window counter) can exceed the burst in a
//! rolling window, and how long its Retry-After can be — proved here, reached
//! by constructed worst cases, and checked over adversarial schedules replayed
//! through [`Limit::acquire`] with an explicit integer clock (µs).
//!
//! # The rolling-window bound
//!
//! Windows are aligned to multiples of `W` (= [`Limit::window_us`]); a request
//! of cost `c` at offset `e` (`0 ≤ e < W`) into window `k` is admitted iff
//! `P·(W−e) + (C+c)·W ≤ B·W`, where `P` counts the units charged in window
//! `k−1`, `C` those charged before it in window `k`, and `B` is the burst.
//!
//! *Per aligned window:* `P·(W−e) ≥ 0`, so `C + c ≤ B`: at most `B` units are
//! charged in any aligned window.
//!
//! *Per rolling window:* an interval `[t, t+W)` lies in one aligned window
//! (then it holds ≤ `B`) or straddles two: `t = (k−1)·W + s`, `1 ≤ s ≤ W−1`,
//! covering offsets `s..W` of window `k−1` and `0..s` of window `k`. The part
//! in window `k−1` holds `A ≤ P ≤ B` units. In window `k`, let the last request
//! charged inside the interval be at offset `e ≤ s−1`, so `W−e ≥ W−s+1 ≥ 2`;
//! every unit of window `k` in the interval was charged by then, so with
//! integers they total `C' ≤ B − ⌈P·(W−s+1)/W⌉ ≤ B − ⌈2P/W⌉`. Hence
//! `A + C' ≤ P − ⌈2P/W⌉ + B`, which does not decrease with `P` (one more unit
//! of `P` adds at most 1 to `⌈2P/W⌉` when `W ≥ 2`), so at `P = B`:
//!
//! > **units in any rolling `W` ≤ 2B − ⌈2B/W⌉** (for `W ≥ 2`; `B` when `W = 1`)
//!
//! which is `2B − 1` whenever `W ≥ 2B` — so for every limit of at most 500,000
//! requests a second: `100r/m burst=100` (`W` = 60 s) admits at most **199**
//! requests in a rolling minute; the tracker's replay saw 190. It is reached:
//! `B` requests at offset `W−1` of window `k−1`, then at offset `W−2` of window
//! `k` the estimate is `B·2/W + C`, which admits `B − ⌈2B/W⌉` more — all within
//! `[kW−1, (k+1)W−1)`. With every request of cost `c` and `m = ⌊B/c⌋`, the same
//! argument over multiples of `c` gives at most `m + ⌊(B·W − 2mc)/(c·W)⌋`
//! requests (`W ≥ 2`), reached the same way. A clock stepped back only judges
//! a request at an earlier `e` (or at `e = 0` of the stored window), which is
//! stricter, so both bounds hold with each request counted at the latest time
//! seen by then.
//!
//! # The Retry-After bound
//!
//! A rejected request of cost `c ≤ B` at offset `e` waits either until a later
//! offset of its own window (less than `W − e`), or until offset
//! `e' = W − ⌊(B−c)·W/C⌋` of the next window, where the current count `C ≤ B`
//! becomes the previous one (`e' = 0` if `C = 0`), or until the window after
//! that when no `e' < W` fits. `e'` is largest at `C = B`, where it is
//! `⌈c·W/B⌉`; and no `e' < W` fitting needs `(B−c)·W < C ≤ B`, which makes
//! `⌈c·W/B⌉ = W`. So the wait is at most `W + ⌈c·W/B⌉ − e`, and `e ≥ 0`:
//!
//! > **Retry-After ≤ W + ⌈c·W/B⌉ ≤ 2W** (`W + ⌈W/B⌉` for cost 1)
//!
//! reached by `B` units at the very start of a window after an empty one, then
//! one more request at the same instant. So it is 2W for `burst=1`, 1.5W for
//! `burst=2`, and just over W for large bursts (1.01W at `burst=100`). This
//! holds for a monotonic clock; a `now` stepped back before the stored
//! window's start waits that much longer (it is still exact).

use proptest::prelude::*;
use rl_core::limit::{Algorithm, Limit, Outcome};
use rl_core::parse::Rate;

/// Most units `sliding` can admit in a rolling window of `w` with burst `b`.
fn rolling_bound(b: u64, w: u64) -> u64 {
    match w {
        1 => b,
        _ => 2 * b - (2 * b).div_ceil(w),
    }
}

/// Most requests of cost `c` (`1 ≤ c ≤ b`) admitted in a rolling window of `w`.
fn rolling_count_bound(b: u64, w: u64, c: u64) -> u64 {
    let m = b / c;
    match w {
        1 => m,
        _ => m + sat((u128::from(b) * u128::from(w) - 2 * u128::from(m * c)) / (u128::from(c) * u128::from(w))),
    }
}

/// Longest Retry-After for a request of cost `c` (`1 ≤ c ≤ b`).
fn retry_bound(b: u64, w: u64, c: u64) -> u64 {
    w + sat((u128::from(c) * u128::from(w)).div_ceil(u128::from(b)))
}

/// A `u128` that fits in `u64` (all values here do).
fn sat(x: u128) -> u64 {
    u64::try_from(x).unwrap()
}

/// A `sliding` limit of `count` per `period_us` with burst `b`.
fn sliding(count: u64, period_us: u64, b: u64) -> Limit {
    Limit::new(Algorithm::Sliding, Rate { count, period_us }, b).unwrap()
}

/// Sends requests of `cost` at `now` until one is rejected; returns how many
/// were admitted.
fn fill(l: &Limit, s: &mut [u64], now: u64, cost: u64) -> u64 {
    let mut n = 0;
    while l.acquire(s, now, cost).admitted {
        n += 1;
    }
    n
}

/// Most units charged in any interval `[t, t + len)`; `ch` holds (time, cost)
/// with nondecreasing times.
fn max_in_rolling(ch: &[(u64, u64)], len: u64) -> u64 {
    let (mut end, mut units, mut best) = (0, 0, 0);
    for (i, &(t, _)) in ch.iter().enumerate() {
        while end < ch.len() && ch[end].0 - t < len {
            units += ch[end].1;
            end += 1;
        }
        best = best.max(units);
        units -= ch[i].1;
    }
    best
}

/// Most units charged in one aligned window of `w`.
fn max_in_aligned(ch: &[(u64, u64)], w: u64) -> u64 {
    let mut per = std::collections::BTreeMap::new();
    for &(t, c) in ch {
        *per.entry(t / w).or_insert(0) += c;
    }
    per.into_values().max().unwrap_or(0)
}

/// The constructed worst case: window `k−1` filled at its last µs, then
/// window `k` filled at offset `W−2`. Returns the requests admitted in
/// `[kW−1, (k+1)W−1)`, a rolling window.
fn worst_case(l: &Limit, k: u64, cost: u64) -> u64 {
    let w = l.window_us();
    let mut s = vec![0; l.state_words()];
    let first = fill(l, &mut s, k * w - 1, cost);
    first + fill(l, &mut s, (k + 1) * w - 2, cost)
}

#[test]
fn worst_case_reaches_the_rolling_bound() {
    // 100r/m burst=100: W = 60 s, the tracker's replay.
    let l = sliding(100, 60_000_000, 100);
    assert_eq!(l.window_us(), 60_000_000);
    let n = worst_case(&l, 7, 1);
    assert_eq!(n, 199);
    assert_eq!(n, rolling_bound(100, l.window_us()));
    assert!(n >= 190, "the 190 the tracker observed is within reach");
    // Cost 7: 14 requests (98 units) at the end of window k−1, then 14 more.
    assert_eq!(worst_case(&l, 7, 7), 28);
    assert_eq!(worst_case(&l, 7, 7), rolling_count_bound(100, l.window_us(), 7));
    // burst=1: 2B − 1 = B, so `sliding` is exact.
    let l = sliding(100, 60_000_000, 1);
    assert_eq!((worst_case(&l, 3, 1), rolling_bound(1, l.window_us())), (1, 1));
    // W < 2B (a very high rate): 10 per 3 µs, burst 10: W = 3, ⌈20/3⌉ = 7.
    let l = sliding(10, 3, 10);
    assert_eq!(l.window_us(), 3);
    assert_eq!((worst_case(&l, 5, 1), rolling_bound(10, 3)), (13, 13));
    // W = 2: the straddling interval only gets window k's offset 0, where the
    // full previous window still weighs B: no more than B.
    let l = sliding(5, 2, 5);
    assert_eq!((worst_case(&l, 5, 1), rolling_bound(5, 2)), (5, 5));
}

#[test]
fn worst_case_retry_after_is_w_plus_w_over_b() {
    for (count, period_us, b, cost, expected) in [
        (100, 60_000_000, 100, 1, 60_600_000), // 1.01 W
        (100, 60_000_000, 100, 100, 120_000_000),
        (100, 60_000_000, 100, 30, 78_000_000),
        (100, 60_000_000, 2, 1, 1_800_000), // W = 1.2 s: 1.5 W
        (100, 60_000_000, 1, 1, 1_200_000), // W = 600 ms: 2 W
        (10, 3, 10, 1, 4),                  // W = 3: 3 + ⌈3/10⌉
    ] {
        let l = sliding(count, period_us, b);
        let w = l.window_us();
        let mut s = vec![0; l.state_words()];
        let now = 11 * w;
        assert_eq!(fill(&l, &mut s, now, 1), b);
        let o = l.acquire(&mut s, now, cost);
        assert_eq!(o.retry_after_us, Some(expected), "{l:?} cost {cost}");
        assert_eq!(expected, retry_bound(b, w, cost));
        assert!(l.check(&s, now + expected, cost).admitted);
        assert!(!l.check(&s, now + expected - 1, cost).admitted);
    }
}

/// Every arrangement of at most `B` requests over window `k−1` (after an
/// empty `k−2`), followed by window `k` filled as early as it admits, for
/// `W` up to 9 and `B` up to 7: the most in a rolling `W` is exactly the
/// bound, and so is the longest Retry-After of a cost-1 request. (Admitting
/// as early as possible is optimal in window `k`: the rule only depends on
/// the count so far and grows more lenient with `e`.)
#[test]
fn small_limits_reach_both_bounds_exactly() {
    for w in 1..=9u64 {
        for b in 1..=7u64 {
            // count = b per w µs with burst b: W = w.
            let l = sliding(b, w, b);
            assert_eq!(l.window_us(), w);
            let (mut most, mut longest, mut arrangements) = (0, 0, 0);
            let mut counts = vec![0u64; w as usize];
            loop {
                arrangements += 1;
                let (rolling, retry) = replay_arrangement(&l, &counts);
                most = most.max(rolling);
                longest = longest.max(retry);
                if !next_arrangement(&mut counts, b) {
                    break;
                }
            }
            assert_eq!(most, rolling_bound(b, w), "W={w} B={b}, {arrangements} arrangements");
            assert_eq!(longest, retry_bound(b, w, 1), "W={w} B={b}");
        }
    }
}

/// Next vector of per-offset counts with sum ≤ `b` (odometer order); false
/// after the last.
fn next_arrangement(counts: &mut [u64], b: u64) -> bool {
    for i in 0..counts.len() {
        if counts.iter().sum::<u64>() < b {
            counts[i] += 1;
            return true;
        }
        counts[i] = 0;
    }
    false
}

/// Replays `counts[e]` requests at offset `e` of window 1, then fills window
/// 2 at every offset; returns the most in a rolling `W` and the longest
/// Retry-After seen by a cost-1 request.
fn replay_arrangement(l: &Limit, counts: &[u64]) -> (u64, u64) {
    let w = l.window_us();
    let mut s = vec![0; l.state_words()];
    let mut ch = Vec::new();
    let mut longest = 0;
    for (e, &n) in counts.iter().enumerate() {
        for _ in 0..n {
            let o = l.acquire(&mut s, w + e as u64, 1);
            assert!(o.admitted, "window k−1 holds at most B");
            ch.push((w + e as u64, 1));
        }
    }
    for now in 2 * w..3 * w {
        loop {
            let o = l.acquire(&mut s, now, 1);
            if !o.admitted {
                longest = longest.max(o.retry_after_us.unwrap());
                break;
            }
            ch.push((now, 1));
        }
    }
    (max_in_rolling(&ch, w), longest)
}

/// One adversarial step: (clock move, fraction, how many requests, cost).
type Step = (u8, u16, u8, u8);

/// `w · permille / 1000`.
fn frac(w: u64, permille: u16) -> u64 {
    sat(u128::from(w) * u128::from(permille) / 1000)
}

/// Where an adversary moves the clock from `t`: nowhere, a µs, the last µs
/// of this window, the first µs or two of the next, its last µs or two, a
/// random point of it, the previous Retry-After, or a random fraction of W.
fn advance(t: u64, w: u64, sel: u8, f: u16, last: &Outcome) -> u64 {
    let (start, next) = (t / w * w, (t / w + 1) * w);
    match sel % 8 {
        0 => t,
        1 => t + 1,
        2 => t.max(start + w - 1),
        3 => next + u64::from(f % 3).min(w - 1),
        4 => next + w - 1 - u64::from(f % 3).min(w - 1),
        5 => next + frac(w, f % 1000),
        6 => t + last.retry_after_us.unwrap_or(0),
        _ => t + frac(w, f % 1500),
    }
}

/// How many requests a step sends: one, a burst, two bursts, or some.
fn how_many(n: u8, f: u16, b: u64) -> u64 {
    match n % 4 {
        0 => 1,
        1 => b,
        2 => 2 * b,
        _ => 1 + u64::from(f) % b,
    }
}

/// Sliding limits with bursts 1..=200 and rates from a request per minute
/// (W of hours) to several per µs (W of a few µs, where ⌈2B/W⌉ > 1).
fn limits() -> impl Strategy<Value = Limit> {
    let period = prop_oneof![1u64..=50, 1_000u64..=2_000_000, Just(1_000_000u64), Just(60_000_000u64)];
    (1u64..=1000, period, 1u64..=200).prop_map(|(count, p, b)| sliding(count, p, b))
}

/// Adversarial schedules.
fn steps() -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(any::<Step>(), 1..60)
}

/// Request costs: 0 = all cost 1, 1 = all one random cost, 2 = mixed.
fn cost_of(mode: u8, fixed: u64, sel: u8, f: u16, b: u64) -> u64 {
    match mode % 3 {
        0 => 1,
        1 => fixed,
        _ => match sel % 4 {
            0 => b,
            1 => 1 + u64::from(f) % b,
            _ => 1,
        },
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// No rolling `W` holds more than `2B − ⌈2B/W⌉` units (fewer requests
    /// when every request costs `c`), no aligned window more than `B`. With
    /// `jitter` some requests see the clock stepped back by up to 2W; they are
    /// counted at the latest time any earlier charged request saw.
    #[test]
    fn rolling_window_stays_within_bound(
        l in limits(), steps in steps(), start in 0u64..1 << 40, jitter: bool,
        mode: u8, fixed in 1u64..=200,
    ) {
        let (b, w) = (l.burst(), l.window_us());
        let fixed = 1 + (fixed - 1) % b;
        let (mut t, mut s, mut last) = (start, vec![0; l.state_words()], Outcome::default());
        let (mut eff, mut ch) = (0, Vec::new());
        for &(sel, f, n, c) in &steps {
            t = advance(t, w, sel, f, &last);
            let now = match jitter && sel >> 5 == 0 {
                true => t.saturating_sub(frac(w, f % 2000)),
                false => t,
            };
            let cost = cost_of(mode, fixed, c, f, b);
            for _ in 0..how_many(n, f, b) {
                last = l.acquire(&mut s, now, cost);
                if last.admitted {
                    eff = now.max(eff);
                    ch.push((eff, cost));
                }
            }
        }
        prop_assert!(max_in_aligned(&ch, w) <= b);
        let most = max_in_rolling(&ch, w);
        prop_assert!(most <= rolling_bound(b, w), "{most} units in a rolling W={w}, B={b}");
        if mode % 3 != 2 {
            let cost = if mode % 3 == 0 { 1 } else { fixed };
            let count = ch.len() as u64;
            let most = max_in_rolling(&ch.iter().map(|&(t, _)| (t, 1)).collect::<Vec<_>>(), w);
            prop_assert!(most <= rolling_count_bound(b, w, cost), "{most} of {count} requests of cost {cost}");
        }
    }

    /// With a monotonic clock, every Retry-After of `sliding` is at most
    /// `W + ⌈c·W/B⌉` and exact: admitted at `now + d`, not at `now + d − 1`.
    /// (`limit_props.rs` checks exactness for bursts up to 10; this adds the
    /// upper bound, and bursts up to 200.)
    #[test]
    fn retry_after_is_exact_and_within_bound(
        l in limits(), steps in steps(), start in 0u64..1 << 40, mode: u8, fixed in 1u64..=201,
    ) {
        let (b, w) = (l.burst(), l.window_us());
        let fixed = 1 + (fixed - 1) % (b + 1);
        let (mut t, mut s, mut last) = (start, vec![0; l.state_words()], Outcome::default());
        for &(sel, f, n, c) in &steps {
            t = advance(t, w, sel, f, &last);
            let cost = cost_of(mode, fixed, c, f, b);
            for _ in 0..how_many(n, f, b) {
                let o = l.check(&s, t, cost);
                match o.retry_after_us {
                    _ if o.admitted => prop_assert_eq!(o.retry_after_us, None),
                    None => prop_assert!(cost > b),
                    Some(d) => {
                        prop_assert!(cost <= b);
                        prop_assert!(1 <= d && d <= retry_bound(b, w, cost), "{d} > bound, W={w} B={b} cost {cost}");
                        prop_assert!(l.check(&s, t + d, cost).admitted, "not admitted after {d}");
                        prop_assert!(!l.check(&s, t + d - 1, cost).admitted, "{d} is not the least");
                    }
                }
                last = l.acquire(&mut s, t, cost);
                prop_assert_eq!(last, o);
            }
        }
    }
}
