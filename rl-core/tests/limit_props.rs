//! Property tests for every algorithm over random request sequences, driven
//! by an explicit integer clock (µs). Optionally the observed clock jitters
//! backwards (several nginx workers); bounds are then measured in
//! "effective" time: the latest time of any earlier charged request.

use proptest::prelude::*;
use proptest::sample::select;
use rl_core::limit::{Algorithm, Limit, Outcome};
use rl_core::parse::Rate;

/// A raw step: (selector, fraction, cost selector), interpreted by [`replay`].
type Raw = (u8, u16, u8);

/// One replayed request.
#[derive(Clone, Copy, Debug)]
struct Ev {
    now: u64,
    cost: u64,
    admitted: bool,
}

/// `w · permille / 1000`.
fn frac(w: u64, permille: u16) -> u64 {
    (u128::from(w) * u128::from(permille) / 1000) as u64
}

/// Replays `ops` from `start` on a fresh state; `step` performs each request
/// (normally an `acquire`) and returns its outcome.
fn replay(
    l: &Limit,
    ops: &[Raw],
    start: u64,
    jitter: bool,
    mut step: impl FnMut(&mut Vec<u64>, u64, u64) -> Outcome,
) -> Vec<Ev> {
    let (w, b) = (l.window_us(), l.burst());
    let (mut t, mut s, mut prev) = (start, vec![0; l.state_words()], Outcome::default());
    let mut evs = Vec::with_capacity(ops.len());
    for &(sel, f, c) in ops {
        t += match sel % 8 {
            0..=2 => 0,
            3 => 1 + u64::from(f % 3),
            4 => prev.retry_after_us.unwrap_or(0),
            5 => prev.reset_us,
            _ => frac(w, f % 1500),
        };
        let now = match jitter && sel >> 6 == 0 {
            true => t.saturating_sub(frac(w, f % 2000)),
            false => t,
        };
        let cost = match c % 10 {
            0 => 0,
            7 => 1 + u64::from(f) % b,
            8 => b,
            9 => b + 1,
            _ => 1,
        };
        prev = step(&mut s, now, cost);
        evs.push(Ev { now, cost, admitted: prev.admitted });
    }
    evs
}

/// Charged requests as (effective time, cost): each at the latest time of
/// itself and every earlier charged request.
fn charged(evs: &[Ev]) -> Vec<(u64, u64)> {
    let mut eff = 0;
    evs.iter()
        .filter(|e| e.admitted && e.cost > 0)
        .map(|e| {
            eff = eff.max(e.now);
            (eff, e.cost)
        })
        .collect()
}

/// Most units charged in any half-open interval `[t, t + len)`.
fn max_in_interval(ch: &[(u64, u64)], len: u64) -> u64 {
    ch.iter()
        .map(|&(t, _)| ch.iter().filter(|&&(u, _)| u >= t && u - t < len).map(|&(_, c)| c).sum())
        .max()
        .unwrap_or(0)
}

/// Most units charged in one aligned window of `w`.
fn max_in_aligned(ch: &[(u64, u64)], w: u64) -> u64 {
    let mut per = std::collections::BTreeMap::new();
    for &(t, c) in ch {
        *per.entry(t / w).or_insert(0) += c;
    }
    per.into_values().max().unwrap_or(0)
}

/// Asserts the algorithm's admission bound over charged requests (delayed
/// ones included, charged at arrival: B + Q at one instant).
fn assert_bound(l: &Limit, ch: &[(u64, u64)]) {
    let (b, w, q) = (l.burst(), l.window_us(), l.queue());
    let Rate { count, period_us } = l.rate();
    match l.algorithm() {
        Algorithm::Fixed => assert!(max_in_aligned(ch, w) <= b),
        Algorithm::Sliding => {
            assert!(max_in_aligned(ch, w) <= b);
            assert!(max_in_interval(ch, w) <= 2 * b);
        }
        Algorithm::SlidingLog => assert!(max_in_interval(ch, w) <= b),
        // (tests/conn.rs holds it to its own model)
        Algorithm::Concurrent => unreachable!("the rate algorithms only"),
        Algorithm::TokenBucket | Algorithm::LeakyBucket | Algorithm::Gcra => {
            for i in 0..ch.len() {
                let mut units = 0u128;
                for j in i..ch.len() {
                    units += u128::from(ch[j].1);
                    let span = u128::from(ch[j].0 - ch[i].0);
                    let allowed = u128::from(b + q) * u128::from(period_us) + u128::from(count) * span;
                    assert!(units * u128::from(period_us) <= allowed, "{i}..={j}");
                }
            }
        }
    }
}

/// A limit with a small rate and burst, and periods that may not divide;
/// for the algorithms that can delay, sometimes a queue.
fn limits() -> impl Strategy<Value = Limit> {
    let period = prop_oneof![1u64..=40, 1_000u64..=2_000_000, Just(1_000_000u64), Just(60_000_000u64),];
    let queue = prop_oneof![Just(0u64), 1u64..=12];
    (select(Algorithm::ALL.to_vec()), 1u64..=12, period, 1u64..=10, queue).prop_map(|(a, count, p, b, q)| {
        let l = Limit::new(a, Rate { count, period_us: p }, b).unwrap();
        l.with_queue(q).unwrap_or(l)
    })
}

/// Request sequences.
fn ops() -> impl Strategy<Value = Vec<Raw>> {
    prop::collection::vec(any::<Raw>(), 1..80)
}

/// Start times, some window-aligned and some far from 0.
fn starts() -> impl Strategy<Value = u64> {
    prop_oneof![Just(0u64), 0u64..5_000_000, 1u64 << 40..(1u64 << 40) + 100_000_000]
}

/// Asserts `o` is honest about when `cost` passes and when `s` is full again.
fn assert_honest(l: &Limit, s: &[u64], now: u64, cost: u64, o: &Outcome) {
    let b = l.burst();
    assert!(o.remaining <= b);
    assert_eq!(o.reset_us == 0, o.remaining == b, "{o:?}");
    assert!(o.admitted || cost > 0, "cost 0 is always admitted");
    if o.admitted {
        assert_eq!(o.retry_after_us, None);
        return;
    }
    match o.retry_after_us {
        None => assert!(cost > b),
        Some(d) => {
            assert!(cost <= b && d >= 1, "{o:?}");
            assert!(l.check(s, now + d, cost).admitted, "not admitted after {d}");
            assert!(!l.check(s, now + d - 1, cost).admitted, "{d} is not the least");
        }
    }
}

/// Asserts that the state reaches full capacity exactly after `reset_us`.
fn assert_reset(l: &Limit, s: &[u64], now: u64, o: &Outcome) {
    let b = l.burst();
    assert_eq!(l.check(s, now + o.reset_us, 0).remaining, b, "{o:?}");
    if o.reset_us > 0 {
        assert!(l.check(s, now + o.reset_us - 1, 0).remaining < b, "{o:?}");
    }
    if o.admitted {
        assert_eq!(l.check(s, now, 0).remaining, o.remaining, "{o:?}");
    }
}

/// Asserts that `s` lets one more unit pass at once exactly after
/// `next_us` (the `t` of the `RateLimit` field): `remaining` grows at
/// `now + next`, not at `now + next − 1`; 0 exactly when full. `left` is
/// what the state has left, that same reading.
fn assert_next(l: &Limit, s: &[u64], now: u64) {
    let (b, next) = (l.burst(), l.next_us(s, now));
    let left = l.left(s, now);
    let r = l.check(s, now, 0).remaining;
    assert_eq!(left, Outcome { next_us: next, ..l.check(s, now, 0) });
    assert_eq!(next == 0, r == b, "next {next}, remaining {r}");
    if next > 0 {
        assert!(next <= left.reset_us, "next {next} after the reset: {left:?}");
        assert!(l.check(s, now + next, 0).remaining > r, "no more after {next}: {left:?}");
        assert_eq!(l.check(s, now + next - 1, 0).remaining, r, "{next} is not the least: {left:?}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// (1) Never more admitted than the algorithm's bound, in any interval.
    #[test]
    fn admissions_stay_within_bound(l in limits(), ops in ops(), start in starts(), jitter: bool) {
        let evs = replay(&l, &ops, start, jitter, |s, now, cost| l.acquire(s, now, cost));
        assert_bound(&l, &charged(&evs));
    }

    /// (2) Retry-After and reset are exact: admitted at `now + d`, not at
    /// `now + d − 1`; full at `now + reset`, not before.
    #[test]
    fn retry_after_and_reset_are_honest(l in limits(), ops in ops(), start in starts(), jitter: bool) {
        replay(&l, &ops, start, jitter, |s, now, cost| {
            let o = l.check(s, now, cost);
            assert_honest(&l, s, now, cost, &o);
            let o = l.acquire(s, now, cost);
            assert_reset(&l, s, now, &o);
            assert_next(&l, s, now);
            o
        });
    }

    /// (3) `acquire` is `check` then `commit`; `check` reports the outcome
    /// `acquire` returns; a `commit` that `check` refused changes nothing.
    #[test]
    fn acquire_is_check_then_commit(l in limits(), ops in ops(), start in starts(), jitter: bool) {
        replay(&l, &ops, start, jitter, |s, now, cost| {
            let checked = l.check(s, now, cost);
            let mut committed = s.clone();
            l.commit(&mut committed, now, cost);
            let acquired = l.acquire(s, now, cost);
            assert_eq!(checked, acquired);
            assert_eq!(committed, *s);
            acquired
        });
    }

    /// (4) Token bucket, leaky bucket and GCRA are the same limiter when the
    /// emission interval is exact (period divisible by count).
    #[test]
    fn buckets_and_gcra_agree(
        t in 1u64..5_000, count in 1u64..=12, burst in 1u64..=10,
        ops in ops(), start in starts(),
    ) {
        let rate = Rate { count, period_us: count * t };
        let ls = [Algorithm::TokenBucket, Algorithm::LeakyBucket, Algorithm::Gcra]
            .map(|a| Limit::new(a, rate, burst).unwrap());
        let mut states = ls.map(|l| vec![0; l.state_words()]);
        replay(&ls[0], &ops, start, false, |_, now, cost| {
            let outs: Vec<Outcome> = ls.iter().zip(&mut states).map(|(l, s)| l.acquire(s, now, cost)).collect();
            assert_eq!(outs[0], outs[1]);
            assert_eq!(outs[0], outs[2]);
            outs[0]
        });
    }

    /// The window algorithms match brute-force models over the history.
    #[test]
    fn window_algorithms_match_models(l in limits(), ops in ops(), start in starts()) {
        let (b, w) = (u128::from(l.burst()), u128::from(l.window_us()));
        let mut hist: Vec<(u64, u64)> = Vec::new();
        replay(&l, &ops, start, false, |s, now, cost| {
            let sum = |keep: &dyn Fn(u64) -> bool| -> u128 {
                hist.iter().filter(|(t, _)| keep(*t)).map(|(_, c)| u128::from(*c)).sum()
            };
            let (k, c) = (u128::from(now) / w, u128::from(cost));
            let model = match l.algorithm() {
                Algorithm::Fixed => sum(&|t| u128::from(t) / w == k) + c <= b,
                Algorithm::Sliding => {
                    let curr = sum(&|t| u128::from(t) / w == k);
                    let prev = sum(&|t| u128::from(t) / w + 1 == k);
                    let e = u128::from(now) - k * w;
                    prev * (w - e) + (curr + c) * w <= b * w
                }
                Algorithm::SlidingLog => sum(&|t| u128::from(t) + w > u128::from(now)) + c <= b,
                _ => return l.acquire(s, now, cost),
            };
            let o = l.acquire(s, now, cost);
            assert_eq!(o.admitted, model, "{now} {cost} {hist:?}");
            if o.admitted && cost > 0 {
                hist.push((now, cost));
            }
            o
        });
    }

    /// Arbitrary parameters, state words, times and costs never panic.
    #[test]
    fn never_panics(
        alg in select(Algorithm::ALL.to_vec()),
        count in prop_oneof![1u64..100, any::<u64>()],
        period_us in prop_oneof![1u64..100, any::<u64>()],
        burst in prop_oneof![1u64..70, any::<u64>()],
        words in prop::collection::vec(any::<u64>(), 0..80),
        steps in prop::collection::vec((any::<u64>(), any::<u64>()), 1..12),
    ) {
        let Ok(l) = Limit::new(alg, Rate { count, period_us }, burst) else {
            return Ok(());
        };
        let mut s = words;
        for (now, cost) in steps {
            let o = l.check(&s, now, cost);
            prop_assert!(o.remaining <= burst);
            prop_assert!(!o.admitted || o.retry_after_us.is_none());
            let usable = s.len() >= l.state_words();
            prop_assert_eq!(
                o.admitted || o.retry_after_us.is_some(),
                usable && cost <= burst
            );
            l.commit(&mut s, now, cost);
            l.acquire(&mut s, now.wrapping_add(cost), cost);
        }
    }
}
