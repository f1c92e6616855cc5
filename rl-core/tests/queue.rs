//! Delaying (`queue=Q`) on `token_bucket`, `leaky_bucket` and `gcra`: the
//! issue's example, the lines that share a state with different queues,
//! and property tests on a fake clock (integer µs):
//!
//! - never more than B + Q units admitted at one instant (and B + Q +
//!   rate·t over any span t: `limit_props`);
//! - a delayed request's delay is exactly when the same line without a
//!   queue would admit it, had nothing else been charged;
//! - first come, first served: at one instant, the delays of requests of
//!   one cost never decrease, and once one is rejected so are the rest;
//! - `queue=0` answers and writes exactly what the algorithms did before
//!   queues existed (a copy of that code is the reference here).

use proptest::prelude::*;
use proptest::sample::select;
use rl_core::limit::{Algorithm, Limit, LimitError, Outcome};
use rl_core::parse::Rate;

const QUEUED: [Algorithm; 3] = [Algorithm::TokenBucket, Algorithm::LeakyBucket, Algorithm::Gcra];

fn queued(alg: Algorithm, count: u64, period_us: u64, burst: u64, queue: u64) -> Limit {
    Limit::new(alg, Rate { count, period_us }, burst).unwrap().with_queue(queue).unwrap()
}

#[test]
fn twenty_requests_at_one_instant() {
    // rate=10r/s burst=5 queue=10: 5 at once, 10 delayed by 100 ms steps,
    // 5 rejected.
    for alg in QUEUED {
        let l = queued(alg, 10, 1_000_000, 5, 10);
        let mut s = vec![0; l.state_words()];
        let now = 1_000_000_000;
        let outs: Vec<Outcome> = (0..20).map(|_| l.acquire(&mut s, now, 1)).collect();
        let delays: Vec<Option<u64>> = outs.iter().map(|o| o.admitted.then_some(o.delay_us / 1000)).collect();
        let want: Vec<Option<u64>> =
            [0; 5].into_iter().chain((1..=10).map(|k| k * 100)).map(Some).chain([None; 5]).collect();
        assert_eq!(delays, want, "{alg}");
        // Remaining is 0 from the fifth on; the reset counts the queue.
        assert_eq!(outs.iter().map(|o| o.remaining).collect::<Vec<_>>()[..7], [4, 3, 2, 1, 0, 0, 0], "{alg}");
        assert_eq!(outs[14].reset_us, 1_500_000, "{alg}");
        // A rejected request could come back, delayed by the whole queue,
        // once one unit has drained.
        assert_eq!(outs[15].retry_after_us, Some(100_000), "{alg}");
        assert_eq!(outs[15].reset_us, 1_500_000, "{alg}");
        assert_eq!(outs[15].remaining, 0, "{alg}");
        let o = l.check(&s, now + 100_000, 1);
        assert!(o.admitted && o.delay_us == 1_000_000, "{alg} {o:?}");
    }
}

#[test]
fn with_queue_is_for_the_buckets_and_gcra() {
    let rate = Rate { count: 10, period_us: 1_000_000 };
    for alg in Algorithm::ALL {
        let l = Limit::new(alg, rate, 5).unwrap();
        assert_eq!(l.with_queue(0), Ok(l), "{alg}");
        assert_eq!(l.queue(), 0);
        match l.with_queue(3) {
            Ok(q) => assert!(QUEUED.contains(&alg) && q.queue() == 3 && q.burst() == 5),
            Err(e) => {
                assert!(!QUEUED.contains(&alg));
                assert_eq!(e, LimitError::QueueNotSupported(alg));
                assert_eq!(
                    e.to_string(),
                    format!(
                        "\"queue\" is not supported by algorithm \"{alg}\": only \"token_bucket\", \
                         \"leaky_bucket\" and \"gcra\" can delay requests"
                    )
                );
            }
        }
    }
    let l = Limit::new(Algorithm::Gcra, Rate { count: 1, period_us: 1 << 40 }, 1 << 20).unwrap();
    // (burst + queue) * period reaches 2^64.
    assert!(matches!(l.with_queue((1 << 24) - (1 << 20)), Err(LimitError::QueueOverflow { .. })));
    assert!(l.with_queue((1 << 24) - (1 << 20) - 1).is_ok());
}

#[test]
fn a_smaller_queue_reads_the_queued_state() {
    // One state, two lines: queue=10 queues 10; the queue=2 line (and the
    // line without a queue) then reject until the backlog has drained to
    // where their own queue takes them.
    for alg in QUEUED {
        let big = queued(alg, 10, 1_000_000, 5, 10);
        let small = big.with_queue(2).unwrap();
        let none = big.with_queue(0).unwrap();
        let mut s = vec![0; big.state_words()];
        let now = 5_000_000;
        for _ in 0..15 {
            assert!(big.acquire(&mut s, now, 1).admitted);
        }
        let o = small.acquire(&mut s, now, 1);
        // 15 held: a 16th fits its 5 + 2 once 9 have drained.
        assert_eq!((o.admitted, o.retry_after_us, o.reset_us), (false, Some(900_000), 1_500_000), "{alg}");
        let o = none.check(&s, now, 1);
        assert_eq!((o.admitted, o.retry_after_us), (false, Some(1_100_000)), "{alg}");
        let o = small.check(&s, now + 900_000, 1);
        assert_eq!((o.admitted, o.delay_us), (true, 200_000), "{alg}");
        assert!(!small.check(&s, now + 899_999, 1).admitted, "{alg}");
        // The bigger queue still takes a request 100 ms later.
        assert_eq!(big.check(&s, now + 100_000, 1).delay_us, 1_000_000, "{alg}");
    }
}

#[test]
fn refund_of_a_delayed_request() {
    for alg in QUEUED {
        let l = queued(alg, 10, 1_000_000, 5, 10);
        let mut s = vec![0; l.state_words()];
        let now = 5_000_000;
        for _ in 0..7 {
            l.acquire(&mut s, now, 1);
        }
        let before = s.clone();
        let (o, charge) = l.acquire_charged(&mut s, now, 2);
        assert_eq!((o.admitted, o.delay_us), (true, 400_000), "{alg}");
        l.refund(&mut s, &charge, now + 10);
        // As if it had never come (the clock moved on 10 µs).
        assert_eq!(l.check(&s, now + 10, 1), l.check(&before, now + 10, 1), "{alg}");
    }
}

/// The buckets and `gcra` as they were before queues (without the leaky
/// bucket's shaping delay): the reference for `queue=0`.
mod before {
    use rl_core::limit::{Algorithm, Limit, Outcome};

    fn mul(a: u64, b: u64) -> u128 {
        u128::from(a) * u128::from(b)
    }
    fn sat(x: u128) -> u64 {
        u64::try_from(x).unwrap_or(u64::MAX)
    }
    fn outcome(admitted: bool, remaining: u64, reset_us: u64, retry_after_us: Option<u64>) -> Outcome {
        Outcome { admitted, remaining, reset_us, retry_after_us, delay_us: 0, next_us: 0 }
    }

    /// `check`, then the state `commit` leaves.
    pub fn acquire(l: &Limit, s: &mut [u64], now: u64, cost: u64) -> Outcome {
        let (b, rate) = (l.burst(), l.rate());
        let (n, p) = (rate.count, rate.period_us);
        let now = now.min(rl_core::limit::MAX_NOW);
        let o = match l.algorithm() {
            Algorithm::Gcra => {
                let t = p.div_ceil(n);
                let backlog = s[0].saturating_sub(now);
                let charged = u128::from(backlog) + mul(cost, t);
                let limit = mul(b, t);
                let remaining = |x: u128| sat(limit.saturating_sub(x) / u128::from(t));
                if charged <= limit {
                    if cost > 0 {
                        s[0] = sat(u128::from(now) + charged);
                    }
                    outcome(true, remaining(charged), sat(charged), None)
                } else {
                    let retry = (cost <= b).then(|| sat(charged - limit));
                    outcome(false, remaining(backlog.into()), backlog, retry)
                }
            }
            _ => {
                let cap = b * p;
                let used = sat(u128::from(s[0].min(cap)).saturating_sub(mul(now.saturating_sub(s[1]), n)));
                let (at, lag) = (now.max(s[1]), s[1].saturating_sub(now));
                let drain = |x: u128| if x == 0 { 0 } else { sat(u128::from(lag) + x.div_ceil(n.into())) };
                if u128::from(used) + mul(cost, p) <= u128::from(cap) {
                    let after = used + cost * p;
                    if cost > 0 {
                        s[0] = after;
                        s[1] = at;
                    }
                    outcome(true, (cap - after) / p, drain(after.into()), None)
                } else {
                    let retry = (cost <= b).then(|| drain(u128::from(used) + mul(cost, p) - u128::from(cap)));
                    outcome(false, (cap - used) / p, drain(used.into()), retry)
                }
            }
        };
        match cost {
            0 => Outcome { admitted: true, retry_after_us: None, ..o },
            _ => o,
        }
    }
}

/// A raw step: (time selector, fraction, cost selector).
type Raw = (u8, u16, u8);

fn ops() -> impl Strategy<Value = Vec<Raw>> {
    prop::collection::vec(any::<Raw>(), 1..80)
}

/// Limits that can delay: small rates, bursts and queues, periods that may
/// not divide.
fn limits() -> impl Strategy<Value = Limit> {
    let period = prop_oneof![1u64..=40, 1_000u64..=2_000_000, Just(1_000_000u64), Just(60_000_000u64)];
    (select(QUEUED.to_vec()), 1u64..=12, period, 1u64..=10, 0u64..=12).prop_map(|(a, n, p, b, q)| queued(a, n, p, b, q))
}

/// Start times, some far from 0.
fn starts() -> impl Strategy<Value = u64> {
    prop_oneof![Just(0u64), 0u64..5_000_000, 1u64 << 40..(1u64 << 40) + 100_000_000]
}

/// Runs `ops` on `l` from a fresh state at `start`, the clock moving on
/// (and, with `jitter`, sometimes behind), calling `each(state before, now,
/// cost)` before each request is acquired; returns the outcomes with their
/// time and cost.
fn replay(
    l: &Limit,
    ops: &[Raw],
    start: u64,
    jitter: bool,
    mut each: impl FnMut(&[u64], u64, u64),
) -> Vec<(u64, u64, Outcome)> {
    let (w, b, q) = (l.window_us(), l.burst(), l.queue());
    let (mut t, mut s) = (start, vec![0; l.state_words()]);
    let mut out = Vec::new();
    let mut prev = Outcome::default();
    for &(sel, f, c) in ops {
        let frac = |m: u16| (u128::from(w) * u128::from(f % m) / 1000) as u64;
        t += match sel % 8 {
            0..=2 => 0,
            3 => 1 + u64::from(f % 3),
            4 => prev.retry_after_us.unwrap_or(0),
            5 => prev.delay_us,
            _ => frac(1500),
        };
        let now = if jitter && sel >> 6 == 0 { t.saturating_sub(frac(2000)) } else { t };
        let cost = match c % 10 {
            0 => 0,
            7 => 1 + u64::from(f) % (b + q),
            8 => b,
            9 => b + 1,
            _ => 1,
        };
        each(&s, now, cost);
        prev = l.acquire(&mut s, now, cost);
        out.push((now, cost, prev));
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// A fresh key takes at most B + Q units at one instant, and exactly
    /// that many requests of cost 1.
    #[test]
    fn at_most_burst_plus_queue_at_one_instant(
        l in limits(), start in starts(), costs in prop::collection::vec(1u64..=3, 1..40),
    ) {
        let mut s = vec![0; l.state_words()];
        let mut units = 0;
        for c in &costs {
            if l.acquire(&mut s, start, *c).admitted {
                units += c;
            }
        }
        prop_assert!(units <= l.burst() + l.queue());
        if costs.iter().all(|&c| c == 1) {
            prop_assert_eq!(units, (costs.len() as u64).min(l.burst() + l.queue()));
        }
    }

    /// A delayed request's delay is exactly when the line without a queue
    /// would admit it had nothing else been charged; without a lagging
    /// clock it is at most Q emission intervals. Retry-after is exact too.
    #[test]
    fn delays_are_exact(l in limits(), ops in ops(), start in starts(), jitter: bool) {
        let none = l.with_queue(0).unwrap();
        let n = l.rate().count;
        let p = l.rate().period_us;
        let t = p.div_ceil(n);
        let most = match l.algorithm() {
            Algorithm::Gcra => l.queue() * t,
            _ => (u128::from(l.queue()) * u128::from(p)).div_ceil(u128::from(n)) as u64,
        };
        replay(&l, &ops, start, jitter, |s, now, cost| {
            let o = l.check(s, now, cost);
            if o.admitted {
                let d = o.delay_us;
                assert!(none.check(s, now + d, cost).admitted, "{o:?}");
                if d > 0 {
                    assert!(!none.check(s, now + d - 1, cost).admitted, "{o:?}");
                    assert_eq!(o.remaining, 0);
                    assert!(jitter || d <= most, "{d} > {most}");
                }
            } else if let Some(r) = o.retry_after_us {
                assert!(l.check(s, now + r, cost).admitted, "{o:?}");
                assert!(!l.check(s, now + r - 1, cost).admitted, "{o:?}");
            } else {
                assert!(cost > l.burst());
            }
        });
    }

    /// First come, first served: after any history, requests of one cost at
    /// one instant get non-decreasing delays, then rejections only.
    #[test]
    fn first_come_first_served(l in limits(), ops in ops(), start in starts(), cost in 1u64..=3, n in 1usize..30) {
        let mut s = vec![0; l.state_words()];
        let mut last = start;
        for (now, c, _) in replay(&l, &ops, start, false, |_, _, _| {}) {
            l.acquire(&mut s, now, c);
            last = now;
        }
        let mut prev: Option<u64> = Some(0);
        for _ in 0..n {
            let o = l.acquire(&mut s, last, cost);
            let d = o.admitted.then_some(o.delay_us);
            match (prev, d) {
                (Some(a), Some(b)) => prop_assert!(a <= b),
                (None, Some(_)) => prop_assert!(false, "admitted after a rejection"),
                _ => {}
            }
            prev = d;
        }
    }

    /// `queue=0` answers and writes what the algorithms did before queues,
    /// from fresh states and from any state a line without a queue can
    /// write (a bucket's level within its capacity: a level above it, which
    /// only a queue writes, was clipped to the capacity before, and is now
    /// read as it is).
    #[test]
    fn queue_zero_is_unchanged(
        l in limits(), ops in ops(), start in starts(), jitter: bool,
        words in prop::collection::vec(any::<u64>(), 2),
    ) {
        let l = l.with_queue(0).unwrap();
        let mut old = vec![0; l.state_words()];
        replay(&l, &ops, start, jitter, |s, now, cost| {
            let o = before::acquire(&l, &mut old, now, cost);
            assert_eq!(l.check(s, now, cost), o);
            let mut mine = s.to_vec();
            l.acquire(&mut mine, now, cost);
            assert_eq!(mine, old);
        });
        let mut a = words[..l.state_words()].to_vec();
        if l.algorithm() != Algorithm::Gcra {
            a[0] %= l.burst() * l.rate().period_us + 1;
        }
        let mut b = a.clone();
        for (k, &(sel, f, c)) in ops.iter().enumerate() {
            let now = (words[0] >> (sel % 64)).wrapping_add(u64::from(f) * k as u64);
            let cost = u64::from(c % 12);
            prop_assert_eq!(l.acquire(&mut a, now, cost), before::acquire(&l, &mut b, now, cost));
            prop_assert_eq!(&a, &b);
        }
    }

    /// Two lines that differ only by their queue, on one state: where both
    /// admit they say the same (delay, remaining, reset); the smaller queue
    /// never admits what the larger rejects, and is told to wait as long or
    /// longer.
    #[test]
    fn lines_with_different_queues_share_exactly(
        l in limits(), q in 0u64..=12, ops in ops(), start in starts(), pick in prop::collection::vec(any::<bool>(), 80),
    ) {
        let other = l.with_queue(q).unwrap();
        let (small, big) = if q <= l.queue() { (other, l) } else { (l, other) };
        let mut s = vec![0; l.state_words()];
        let mut k = 0;
        replay(&l, &ops, start, false, |_, _, _| {}).into_iter().for_each(|(now, cost, _)| {
            let (a, b) = (small.check(&s, now, cost), big.check(&s, now, cost));
            assert!(!a.admitted || b.admitted);
            if a.admitted {
                assert_eq!(a, b);
            } else if let (Some(x), Some(y)) = (a.retry_after_us, b.retry_after_us) {
                assert!(x >= y);
            }
            let line = if pick[k % pick.len()] { small } else { big };
            k += 1;
            line.acquire(&mut s, now, cost);
        });
    }
}
