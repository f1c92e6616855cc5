//! Lines whose rate and burst change from request to request
//! ([`Limit::varying`]), for every algorithm: states are reached by random
//! sequences of requests, each under its own parameters; then, at any
//! instant, no more than the new burst passes, raising the rate or burst
//! never admits fewer requests than the old values would and lowering them
//! never more, values that do not change behave exactly as the static
//! line, and from the reset its last write reported on, a state reads as
//! fresh (but `sliding_log`'s). Then hand-computed conversions.

use proptest::prelude::*;
use proptest::sample::select;
use rl_core::limit::{Algorithm, Limit, Outcome};
use rl_core::parse::Rate;

/// Rate count, period (µs), burst, queue.
type Params = (u64, u64, u64, u64);

/// A request of the sequence that reaches a state: which parameters (index),
/// the time step selector and fraction, the cost selector.
type Op = (u8, u8, u16, u8);

/// The limit for `p` (the burst of `sliding_log` is its own, static: `log`).
fn limit(a: Algorithm, p: Params, log: u64) -> Limit {
    let (c, period, b, q) = p;
    let b = if a == Algorithm::SlidingLog { log } else { b };
    let l = Limit::new(a, Rate { count: c, period_us: period }, b).unwrap();
    let q = if matches!(a, Algorithm::TokenBucket | Algorithm::LeakyBucket | Algorithm::Gcra) { q } else { 0 };
    l.with_queue(q).unwrap().varying()
}

fn algorithm() -> impl Strategy<Value = Algorithm> {
    select(Algorithm::ALL.to_vec())
}

/// The algorithms whose state carries a tag (all but `sliding_log`).
fn tagged() -> impl Strategy<Value = Algorithm> {
    select(Algorithm::ALL.into_iter().filter(|&a| a != Algorithm::SlidingLog).collect::<Vec<_>>())
}

fn params() -> impl Strategy<Value = Params> {
    (
        1u64..=20,
        prop_oneof![select(vec![1, 1_000, 1_000_000, 60_000_000, 3_600_000_000]), 1u64..=10_000_000],
        1u64..=12,
        prop_oneof![Just(0u64), 1u64..=6],
    )
}

/// Parameters at least `p`'s: rate (count up, period down), burst and queue.
fn raised(p: Params) -> impl Strategy<Value = Params> {
    (1u64..=4, 1u64..=4, 0u64..=12, 0u64..=3).prop_map(move |(m, k, db, dq)| {
        let (c, period, b, q) = p;
        (c * m, (period / k).max(1), b + db, q + dq)
    })
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec((any::<u8>(), any::<u8>(), any::<u16>(), any::<u8>()), 0..40)
}

/// `w · permille / 1000`.
fn frac(w: u64, permille: u16) -> u64 {
    (u128::from(w) * u128::from(permille) / 1000) as u64
}

/// The state `ops` reach from `start` on a fresh key, each request under
/// the limit its op picks; and the time of the last one.
fn reach(limits: &[Limit], ops: &[Op], start: u64) -> (Vec<u64>, u64) {
    reach_with(limits, ops, start, false)
}

/// [`reach`], one request in eight (with `overdraw`) an overdraft of up to
/// three bursts instead ([`Limit::overdraw`], `charge=after`).
fn reach_with(limits: &[Limit], ops: &[Op], start: u64, overdraw: bool) -> (Vec<u64>, u64) {
    let (s, t, _) = reach_quiet(limits, ops, start, overdraw);
    (s, t)
}

/// [`reach_with`], and the time the last write's state resets (as its
/// writer reports it, from the write's `now`: when the table may drop the
/// entry and Redis the key): 0 if nothing was written.
fn reach_quiet(limits: &[Limit], ops: &[Op], start: u64, overdraw: bool) -> (Vec<u64>, u64, u64) {
    let mut s = vec![0; limits[0].state_words()];
    let mut t = start;
    let mut quiet = 0;
    for &(pick, sel, f, c) in ops {
        let l = &limits[usize::from(pick) % limits.len()];
        let w = l.window_us();
        t += match sel % 6 {
            0 | 1 => 0,
            2 => 1 + u64::from(f % 3),
            3 => frac(w, f % 1500),
            4 => frac(w, f % 4000),
            _ => frac(l.rate().period_us, f % 3000),
        };
        // A quarter of the requests see a clock a little behind.
        let now = match sel >> 6 {
            0 => t.saturating_sub(frac(w, f % 700)),
            _ => t,
        };
        let b = l.burst();
        let cost = match c % 8 {
            0 => 0,
            6 => 1 + u64::from(f) % b,
            7 => b + u64::from(c % 2),
            _ => 1,
        };
        // (an overdraft writes the state, even one that saturates)
        let wrote = match overdraw && c % 8 == 5 {
            true => {
                l.overdraw(&mut s, now, 1 + u64::from(f) % (3 * b));
                true
            }
            false => l.acquire_charged(&mut s, now, cost).1.cost() > 0,
        };
        if wrote {
            quiet = now.saturating_add(l.check(&s, now, 0).reset_us);
        }
    }
    (s, t, quiet)
}

/// The instant the properties look at, from the last request's time.
fn instant(t: u64, l: &Limit, sel: u16) -> u64 {
    match sel % 4 {
        0 => t,
        1 => t.saturating_sub(u64::from(sel) % 1000),
        2 => t + frac(l.window_us(), sel % 2500),
        _ => t + u64::from(sel),
    }
}

/// Cost-1 requests in a row `l` admits on `s` at `now`, delayed or not, and
/// how many of them at once.
fn admitted(l: &Limit, s: &[u64], now: u64) -> (u64, u64) {
    let mut s = s.to_vec();
    let (mut all, mut at_once) = (0, 0);
    for _ in 0..l.burst() + l.queue() + 2 {
        let o = l.acquire(&mut s, now, 1);
        if !o.admitted {
            break;
        }
        all += 1;
        at_once += u64::from(o.delay_us == 0);
    }
    (all, at_once)
}

/// Costs `l` admits on `s` at `now`, in order, at once and in all.
fn admitted_costs(l: &Limit, s: &[u64], now: u64, costs: &[u64]) -> (u64, u64) {
    let mut s = s.to_vec();
    let (mut all, mut at_once) = (0, 0);
    for &c in costs {
        let o: Outcome = l.acquire(&mut s, now, c);
        if o.admitted {
            all += c;
            if o.delay_us == 0 {
                at_once += c;
            }
        }
    }
    (all, at_once)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    /// At one instant, after any state and any change, at most the new
    /// burst passes at once (the burst and queue in all), unit requests or
    /// any costs.
    #[test]
    fn at_most_the_new_burst(
        a in algorithm(), log in 1u64..=12, ps in prop::collection::vec(params(), 1..4), ops in ops(),
        new in params(), sel in any::<u16>(), costs in prop::collection::vec(0u64..=6, 0..30),
    ) {
        let limits: Vec<Limit> = ps.iter().map(|&p| limit(a, p, log)).collect();
        let (s, t) = reach(&limits, &ops, 1 << 40);
        let l = limit(a, new, log);
        let now = instant(t, &l, sel);
        let (all, at_once) = admitted(&l, &s, now);
        prop_assert!(at_once <= l.burst(), "{at_once} at once > burst {}", l.burst());
        prop_assert!(all <= l.burst() + l.queue());
        let (all, at_once) = admitted_costs(&l, &s, now, &costs);
        prop_assert!(at_once <= l.burst(), "{at_once} at once > burst {}", l.burst());
        prop_assert!(all <= l.burst() + l.queue());
    }

    /// Raising the rate, burst (and queue) never admits fewer requests at
    /// one instant than keeping the old values, nor refuses a request the
    /// old values admit.
    #[test]
    fn raising_never_admits_fewer(
        a in algorithm(), log in 1u64..=12, ps in prop::collection::vec(params(), 1..4), ops in ops(),
        (old, new) in params().prop_flat_map(|p| (Just(p), raised(p))), sel in any::<u16>(), cost in 0u64..=14,
    ) {
        let limits: Vec<Limit> = ps.iter().map(|&p| limit(a, p, log)).collect();
        let (s, t) = reach(&limits, &ops, 1 << 40);
        let (lo, hi) = (limit(a, old, log), limit(a, new, log));
        let now = instant(t, &lo, sel);
        let (n_lo, n_hi) = (admitted(&lo, &s, now).0, admitted(&hi, &s, now).0);
        prop_assert!(n_hi >= n_lo, "raised admits {n_hi} < {n_lo}");
        if lo.check(&s, now, cost).admitted {
            prop_assert!(hi.check(&s, now, cost).admitted, "cost {cost} admitted before raising, not after");
        }
    }

    /// Lowering the rate, burst (and queue) never admits more requests at
    /// one instant than keeping the old values, nor a request the old values
    /// refuse.
    #[test]
    fn lowering_never_admits_more(
        a in algorithm(), log in 1u64..=12, ps in prop::collection::vec(params(), 1..4), ops in ops(),
        (new, old) in params().prop_flat_map(|p| (Just(p), raised(p))), sel in any::<u16>(), cost in 0u64..=14,
    ) {
        let limits: Vec<Limit> = ps.iter().map(|&p| limit(a, p, log)).collect();
        let (s, t) = reach(&limits, &ops, 1 << 40);
        let (hi, lo) = (limit(a, old, log), limit(a, new, log));
        let now = instant(t, &hi, sel);
        let (n_hi, n_lo) = (admitted(&hi, &s, now).0, admitted(&lo, &s, now).0);
        prop_assert!(n_lo <= n_hi, "lowered admits {n_lo} > {n_hi}");
        if !hi.check(&s, now, cost).admitted {
            prop_assert!(!lo.check(&s, now, cost).admitted, "cost {cost} refused before lowering, admitted after");
        }
    }

    /// A varying line whose values never change is the static line:
    /// outcomes, charges refunded and states (but the tag) alike.
    #[test]
    fn unchanged_values_are_the_static_line(
        a in algorithm(), p in params(), log in 1u64..=12, ops in ops(), refund in any::<u64>(),
    ) {
        let v = limit(a, p, log);
        let l = Limit::new(a, v.rate(), v.burst()).unwrap().with_queue(v.queue()).unwrap();
        let (mut sv, mut sl) = (vec![0; v.state_words()], vec![0; l.state_words()]);
        let mut t = 1u64 << 40;
        for (i, &(_, sel, f, c)) in ops.iter().enumerate() {
            t += match sel % 4 {
                0 => 0,
                1 => 1 + u64::from(f % 3),
                2 => frac(v.window_us(), f % 1500),
                _ => frac(v.rate().period_us, f % 3000),
            };
            let now = match sel >> 6 {
                0 => t.saturating_sub(frac(v.window_us(), f % 700)),
                _ => t,
            };
            let cost = match c % 6 { 0 => 0, 5 => u64::from(f) % (v.burst() + 2), _ => 1 };
            let (ov, cv) = v.acquire_charged(&mut sv, now, cost);
            let (ol, cl) = l.acquire_charged(&mut sl, now, cost);
            prop_assert_eq!(ov, ol, "request {}", i);
            prop_assert_eq!(cv.cost(), cl.cost());
            // Taken back at once, as after a rejection by another line.
            if refund >> (i % 64) & 1 == 1 {
                v.refund(&mut sv, &cv, now);
                l.refund(&mut sl, &cl, now);
            }
            prop_assert_eq!(&sv[..sl.len()], &sl[..], "state after request {}", i);
        }
    }

    /// After overdrafts under any values, at one instant at most the new
    /// burst passes at once (the burst and queue in all).
    #[test]
    fn overdrawn_at_most_the_new_burst(
        a in algorithm(), log in 1u64..=12, ps in prop::collection::vec(params(), 1..4), ops in ops(),
        new in params(), sel in any::<u16>(), costs in prop::collection::vec(0u64..=6, 0..30),
    ) {
        let limits: Vec<Limit> = ps.iter().map(|&p| limit(a, p, log)).collect();
        let (s, t) = reach_with(&limits, &ops, 1 << 40, true);
        let l = limit(a, new, log);
        let now = instant(t, &l, sel);
        let (all, at_once) = admitted(&l, &s, now);
        prop_assert!(at_once <= l.burst(), "{at_once} at once > burst {}", l.burst());
        prop_assert!(all <= l.burst() + l.queue());
        let (all, at_once) = admitted_costs(&l, &s, now, &costs);
        prop_assert!(at_once <= l.burst(), "{at_once} at once > burst {}", l.burst());
        prop_assert!(all <= l.burst() + l.queue());
    }

    /// After overdrafts under any values, raising the rate, burst (and
    /// queue) never admits fewer requests at one instant, lowering them
    /// never more.
    #[test]
    fn overdrawn_monotone(
        a in algorithm(), log in 1u64..=12, ps in prop::collection::vec(params(), 1..4), ops in ops(),
        (old, new) in params().prop_flat_map(|p| (Just(p), raised(p))), sel in any::<u16>(), cost in 0u64..=14,
    ) {
        let limits: Vec<Limit> = ps.iter().map(|&p| limit(a, p, log)).collect();
        let (s, t) = reach_with(&limits, &ops, 1 << 40, true);
        let (lo, hi) = (limit(a, old, log), limit(a, new, log));
        let now = instant(t, &lo, sel);
        let (n_lo, n_hi) = (admitted(&lo, &s, now).0, admitted(&hi, &s, now).0);
        prop_assert!(n_hi >= n_lo, "raised admits {n_hi} < {n_lo}");
        if lo.check(&s, now, cost).admitted {
            prop_assert!(hi.check(&s, now, cost).admitted, "cost {cost} admitted before raising, not after");
        }
    }

    /// An overdraft under one scale, then checks under another: the
    /// overdraft leaves the overdrawing line's tag and is seen converted
    /// (in requests, at least as much as was charged), never more than the
    /// new burst passes, and a larger overdraft admits no more.
    #[test]
    fn overdraft_is_seen_under_other_values(
        a in algorithm(), log in 1u64..=12, p in params(), q in params(), over in 1u64..=40, sel in any::<u16>(),
    ) {
        prop_assume!(a != Algorithm::SlidingLog);
        let (l, m) = (limit(a, p, log), limit(a, q, log));
        let mut s = vec![0; l.state_words()];
        let t = 1u64 << 40;
        let charge = l.overdraw(&mut s, t, over * l.burst());
        prop_assert_eq!(charge.cost(), over * l.burst());
        prop_assert_eq!(s.last().copied(), Some(charge_tag(&l)));
        // An overdraft of the new burst or more: nothing passes at once.
        if charge.cost() >= m.burst() {
            let o = m.check(&s, t, 1);
            prop_assert!(!o.admitted || o.delay_us > 0, "{o:?}");
        }
        let now = instant(t, &m, sel);
        // Never more than the new burst, monotone in the overdraft: a state
        // overdrawn by more admits no more.
        let (all, at_once) = admitted(&m, &s, now);
        prop_assert!(at_once <= m.burst() && all <= m.burst() + m.queue());
        let mut more = s.clone();
        l.overdraw(&mut more, t, l.burst());
        prop_assert!(admitted(&m, &more, now).0 <= all);
    }

    /// A varying line whose values never change is the static line under
    /// overdrafts too: outcomes and states (but the tag) alike.
    #[test]
    fn unchanged_values_overdrawn_are_the_static_line(
        a in algorithm(), p in params(), log in 1u64..=12, ops in ops(),
    ) {
        let v = limit(a, p, log);
        let l = Limit::new(a, v.rate(), v.burst()).unwrap().with_queue(v.queue()).unwrap();
        let (mut sv, mut sl) = (vec![0; v.state_words()], vec![0; l.state_words()]);
        let mut t = 1u64 << 40;
        for (i, &(_, sel, f, c)) in ops.iter().enumerate() {
            t += match sel % 4 {
                0 => 0,
                1 => 1 + u64::from(f % 3),
                2 => frac(v.window_us(), f % 1500),
                _ => frac(v.rate().period_us, f % 3000),
            };
            let cost = match c % 6 { 0 => 0, 5 => u64::from(f) % (3 * v.burst() + 2), _ => 1 };
            match c % 2 {
                0 => prop_assert_eq!(v.overdraw(&mut sv, t, cost).cost(), l.overdraw(&mut sl, t, cost).cost()),
                _ => prop_assert_eq!(v.acquire(&mut sv, t, cost), l.acquire(&mut sl, t, cost), "request {}", i),
            }
            prop_assert_eq!(&sv[..sl.len()], &sl[..], "state after request {}", i);
        }
    }

    /// A refund after another line's charge converted the state to
    /// another scale takes nothing back.
    #[test]
    fn refund_across_a_conversion_takes_nothing(
        a in algorithm(), log in 1u64..=12, ps in prop::collection::vec(params(), 1..4), ops in ops(),
        p in params(), q in params(), sel in any::<u16>(),
    ) {
        prop_assume!(a != Algorithm::SlidingLog);
        let limits: Vec<Limit> = ps.iter().map(|&p| limit(a, p, log)).collect();
        let (mut s, t) = reach(&limits, &ops, 1 << 40);
        let (l, m) = (limit(a, p, log), limit(a, q, log));
        prop_assume!(charge_tag(&l) != charge_tag(&m));
        let now = instant(t, &l, sel);
        let (_, charge) = l.acquire_charged(&mut s, now, 1);
        if m.commit(&mut s, now, 1).cost() == 1 {
            let converted = s.clone();
            l.refund(&mut s, &charge, now);
            prop_assert_eq!(s, converted);
        }
    }

    /// A charge refunded at once by the line that made it, nothing written
    /// in between, leaves the state admitting at that instant what it
    /// admitted before the request, under any values. (Its conversion stays:
    /// from then on the state drains as the line's, as after a request of
    /// the line charged nothing.)
    #[test]
    fn refund_at_once_admits_as_before(
        a in tagged(), ps in prop::collection::vec(params(), 1..4), ops in ops(),
        p in params(), q in params(), cost in 1u64..=4, sel in any::<u16>(),
    ) {
        let limits: Vec<Limit> = ps.iter().map(|&p| limit(a, p, 1)).collect();
        let (s, t) = reach(&limits, &ops, 1 << 40);
        let (l, m) = (limit(a, p, 1), limit(a, q, 1));
        let now = instant(t, &l, sel);
        let mut r = s.clone();
        let charge = l.commit(&mut r, now, cost);
        l.refund(&mut r, &charge, now);
        for k in 0..=m.burst() + 1 {
            prop_assert_eq!(m.check(&r, now, k).admitted, m.check(&s, now, k).admitted, "cost {}", k);
        }
        prop_assert_eq!(admitted(&m, &r, now), admitted(&m, &s, now));
    }

    /// A state read at or after the time its last write resets (as its
    /// writer reported it: when the table may drop the entry, Redis the
    /// key) reads as a fresh one under any values, overdrafts or not: a
    /// request is decided alike whether its key is still there or not.
    /// Not `sliding_log`, whose longer window still counts the timestamps a
    /// shorter one has let go.
    #[test]
    fn past_the_writers_reset_reads_fresh(
        a in tagged(), ps in prop::collection::vec(params(), 1..4), ops in ops(), overdraw in any::<bool>(),
        new in params(), later in prop_oneof![Just(0u64), 1u64..=3, 0u64..=10_000_000_000],
    ) {
        let limits: Vec<Limit> = ps.iter().map(|&p| limit(a, p, 1)).collect();
        let (s, _, quiet) = reach_quiet(&limits, &ops, 1 << 40, overdraw);
        prop_assume!(quiet < 1 << 60);
        let m = limit(a, new, 1);
        let now = quiet + later;
        let fresh = vec![0; m.state_words()];
        for cost in 0..=m.burst() + 1 {
            prop_assert_eq!(m.check(&s, now, cost), m.check(&fresh, now, cost), "cost {}", cost);
        }
        prop_assert_eq!(admitted(&m, &s, now), admitted(&m, &fresh, now));
    }
}

/// The tag a line's writes leave (the last state word after a charge).
fn charge_tag(l: &Limit) -> u64 {
    let mut s = vec![0; l.state_words()];
    l.acquire(&mut s, 1 << 40, 1);
    s.last().copied().unwrap_or(0)
}

/// Helpers for the hand-computed cases.
fn rated(a: Algorithm, count: u64, period_us: u64, burst: u64) -> Limit {
    Limit::new(a, Rate { count, period_us }, burst).unwrap().varying()
}

const S: u64 = 1_000_000;
const MIN: u64 = 60 * S;
const HOUR: u64 = 3600 * S;

/// `n` cost-1 requests at `now`, all admitted.
fn take(l: &Limit, s: &mut [u64], now: u64, n: u64) {
    for i in 0..n {
        assert!(l.acquire(s, now, 1).admitted, "request {i} of {n}");
    }
}

#[test]
fn gcra_faster_rate_keeps_the_used_requests() {
    // 1r/s burst 5, 3 requests: a backlog of 3 s, 3 requests. At 10r/s
    // the same 3 requests are a backlog of 0.3 s: 2 left at once.
    let (slow, fast) = (rated(Algorithm::Gcra, 1, S, 5), rated(Algorithm::Gcra, 10, S, 5));
    let t0 = 1000 * S;
    let mut s = vec![0; slow.state_words()];
    take(&slow, &mut s, t0, 3);
    assert_eq!(s, [t0 + 3 * S, S]);
    assert_eq!(admitted(&fast, &s, t0), (2, 2));
    assert_eq!(fast.check(&s, t0, 1).remaining, 1);
    assert_eq!(fast.commit(&mut s, t0, 1).cost(), 1);
    assert_eq!(s, [t0 + 400_000, 100_000]);
    // Back at 1r/s: 4 requests used, 1 left.
    assert_eq!(admitted(&slow, &s, t0), (1, 1));
}

#[test]
fn gcra_rounds_the_backlog_up() {
    // 3r/s (T = 333334 µs) after one request at t0, read at t0 + 1 µs under
    // 1r/s: 333333·10^6/333334 = 999997.0000... rounds up to 999998.
    let (l, m) = (rated(Algorithm::Gcra, 3, S, 1), rated(Algorithm::Gcra, 1, S, 1));
    let mut s = vec![0; l.state_words()];
    take(&l, &mut s, S, 1);
    assert_eq!(s, [S + 333_334, 333_334]);
    let o = m.acquire(&mut s, S + 1, 0);
    assert!(o.admitted);
    // A cost-0 request writes nothing; a check sees the rounded backlog.
    assert_eq!(m.check(&s, S + 1, 1).retry_after_us, Some(999_998));
}

#[test]
fn token_bucket_per_minute_to_per_second() {
    // 5r/m burst 5, 3 requests: 3 of 5 used. A second later the bucket has
    // refilled a twelfth of a request at 5r/m, the rate that charged it:
    // 2 11/12 used, 2 left at 1r/s as at 5r/m; from then on it refills at
    // 1r/s.
    let (m, s1) = (rated(Algorithm::TokenBucket, 5, MIN, 5), rated(Algorithm::TokenBucket, 1, S, 5));
    let t0 = 1000 * S;
    let mut s = vec![0; m.state_words()];
    take(&m, &mut s, t0, 3);
    assert_eq!(s[..2], [3 * MIN, t0]);
    assert_eq!(admitted(&m, &s, t0 + S), (2, 2));
    assert_eq!(admitted(&s1, &s, t0 + S), (2, 2));
    assert_eq!(s1.commit(&mut s, t0 + S, 1).cost(), 1);
    // 2 11/12 requests at 1r/s, rounded up, and 1.
    assert_eq!(s, [2_916_667 + S, t0 + S, charge_tag(&s1)]);
    assert_eq!(admitted(&s1, &s, t0 + 2 * S), (2, 2));
}

#[test]
fn leaky_bucket_per_second_to_per_hour() {
    // 2r/s burst 4, 4 requests: full. 0.5 s later the level has drained
    // 1 request at 2r/s, the rate that filled it: at 1r/h burst 4, 1
    // passes; burst 5, 2.
    let (f, h) = (rated(Algorithm::LeakyBucket, 2, S, 4), rated(Algorithm::LeakyBucket, 1, HOUR, 4));
    let mut s = vec![0; f.state_words()];
    take(&f, &mut s, S, 4);
    assert_eq!(admitted(&h, &s, S + S / 2), (1, 1));
    let h5 = rated(Algorithm::LeakyBucket, 1, HOUR, 5);
    assert_eq!(admitted(&h5, &s, S + S / 2), (2, 2));
}

#[test]
fn bucket_slow_reader_after_a_fast_writer() {
    // 1r/s burst 5, 5 requests at t0: full until t0 + 5 s (the writer's
    // reset, which the table's entry and the Redis key live by). 3 s
    // later, at 1r/m burst 5, the bucket holds what it holds at 1r/s,
    // 2 requests: 3 pass, as they do at 1r/s.
    for a in [Algorithm::TokenBucket, Algorithm::LeakyBucket] {
        let (fast, slow) = (rated(a, 1, S, 5), rated(a, 1, MIN, 5));
        let t0 = 1000 * S;
        let mut s = vec![0; fast.state_words()];
        take(&fast, &mut s, t0, 5);
        let reset = fast.check(&s, t0, 0).reset_us;
        assert_eq!(reset, 5 * S, "{a}");
        let o = slow.check(&s, t0 + 3 * S, 1);
        assert!(o.admitted, "{a}: {o:?}");
        assert_eq!((o.remaining, o.reset_us), (2, 3 * MIN), "{a}");
        assert_eq!(admitted(&slow, &s, t0 + 3 * S), (3, 3), "{a}");
        assert_eq!(admitted(&fast, &s, t0 + 3 * S), (3, 3), "{a}");
        // From the writer's reset on, as a fresh key (the key the table or
        // Redis may have dropped by then).
        let fresh = vec![0; slow.state_words()];
        for now in [t0 + reset, t0 + reset + 1, t0 + reset + MIN, t0 + HOUR] {
            for cost in 0..=6 {
                assert_eq!(slow.check(&s, now, cost), slow.check(&fresh, now, cost), "{a} at {now} cost {cost}");
            }
            assert_eq!(admitted(&slow, &s, now), (5, 5), "{a} at {now}");
        }
        // Charged at t0 + 3 s: 2 requests at 1r/m and 1, refilling at 1r/m
        // from then on.
        assert_eq!(slow.commit(&mut s, t0 + 3 * S, 1).cost(), 1);
        assert_eq!(s, [3 * MIN, t0 + 3 * S, charge_tag(&slow)], "{a}");
        assert_eq!(admitted(&slow, &s, t0 + 3 * S + MIN), (3, 3), "{a}");
    }
}

#[test]
fn bucket_tags_pack_the_rate() {
    // Every rate of a unit: the unit in bits 2-3, the count - 1 above; other
    // periods below 2^32: the period in bits 2-33, the count - 1 above;
    // else the period alone (bits 0-1 say which).
    let tag = |c, p| charge_tag(&rated(Algorithm::TokenBucket, c, p, 1));
    assert_eq!([tag(1, S), tag(1, MIN), tag(1, HOUR), tag(1, 24 * HOUR)], [1, 5, 9, 13]);
    assert_eq!(tag(2, S), 17);
    assert_eq!(tag(5, MIN), 4 * 16 + 5);
    assert_eq!(tag(1 << 60, 24 * HOUR), (((1 << 60) - 1) << 4) + 13);
    assert_eq!(tag(3, 1000), (2 << 34) + (1000 << 2) + 2);
    assert_eq!(tag(1 << 30, (1 << 32) - 1), (((1 << 30) - 1) << 34) + (((1 << 32) - 1) << 2) + 2);
    // Beyond those: the period alone.
    assert_eq!(tag((1 << 60) + 1, S), 4 * S);
    assert_eq!(tag((1 << 30) + 1, 1000), 4000);
    assert_eq!(tag(1, 1 << 32), 1 << 34);
    // The same period, other counts: other tags, unlike the rates' scale.
    let leaky = |c, p| charge_tag(&rated(Algorithm::LeakyBucket, c, p, 1));
    assert_eq!(leaky(7, HOUR), tag(7, HOUR));
    let mut seen = std::collections::BTreeSet::new();
    for p in [1, 7, 1000, S, MIN, HOUR, 24 * HOUR, (1 << 32) - 1] {
        for c in [1, 2, 3, 60, 1000, 1 << 20, (1 << 30) + 1, u64::MAX] {
            let t = tag(c, p);
            assert_ne!(t, 0);
            assert!(seen.insert(t) || c > 1 << 30, "{c}r/{p}us: {t} again");
        }
    }
}

#[test]
fn fixed_per_minute_to_per_hour_mid_window() {
    // 10r/m burst 10 (W = 1 min), full 30 s into a minute; 10 s later at
    // 100r/h burst 100 (W = 1 h), the 10 count in the hour: 90 left.
    let (m, h) = (rated(Algorithm::Fixed, 10, MIN, 10), rated(Algorithm::Fixed, 100, HOUR, 100));
    let t0 = 5 * HOUR + 30 * S;
    let mut s = vec![0; m.state_words()];
    take(&m, &mut s, t0, 10);
    assert_eq!(s, [t0 / MIN + 1, 10, MIN]);
    assert_eq!(admitted(&h, &s, t0 + 10 * S), (90, 90));
    take(&h, &mut s, t0 + 10 * S, 1);
    assert_eq!(s, [6, 11, HOUR]);
    // Past the minute the hour's window holds: 89 left.
    assert_eq!(admitted(&h, &s, t0 + 40 * S), (89, 89));
    // A change after the stored window ended starts afresh.
    let mut s = vec![0; m.state_words()];
    take(&m, &mut s, t0, 10);
    assert_eq!(admitted(&h, &s, t0 + 40 * S), (100, 100));
}

#[test]
fn sliding_estimate_carries_rounded_up() {
    // 10r/s burst 10 (W = 1 s): 10 in window 1; at 2.25 s, the estimate is
    // 10·0.75 = 7.5: 2 left. At 20r/s burst 10 (W = 0.5 s) the 7.5 carry as
    // 8: 2 left; at 40r/s burst 20 (W = 0.5 s), 12.
    let l = rated(Algorithm::Sliding, 10, S, 10);
    let mut s = vec![0; l.state_words()];
    take(&l, &mut s, S + S / 2, 10);
    let now = 2 * S + S / 4;
    assert_eq!(admitted(&l, &s, now), (2, 2));
    let (a, b) = (rated(Algorithm::Sliding, 20, S, 10), rated(Algorithm::Sliding, 40, S, 20));
    assert_eq!(admitted(&a, &s, now), (2, 2));
    assert_eq!(admitted(&b, &s, now), (12, 12));
    // Same W (20r/s burst 20, W = 1 s): no conversion, the static estimate.
    assert_eq!(admitted(&rated(Algorithm::Sliding, 20, S, 20), &s, now), (12, 12));
    assert_eq!(a.commit(&mut s, now, 1).cost(), 1);
    assert_eq!(s, [now / (S / 2) + 1, 9, 0, S / 2]);
}

#[test]
fn sliding_log_shorter_window_expires_more() {
    // burst 10 at 10r/s (W = 1 s), full at 1 s; at 1.5 s nothing passes at
    // 10r/s, all 10 at 20r/s (W = 0.5 s).
    let (l, f) = (rated(Algorithm::SlidingLog, 10, S, 10), rated(Algorithm::SlidingLog, 20, S, 10));
    assert_eq!(l.state_words(), 12);
    let mut s = vec![0; l.state_words()];
    take(&l, &mut s, S, 10);
    assert_eq!(admitted(&l, &s, S + S / 2), (0, 0));
    assert_eq!(admitted(&f, &s, S + S / 2), (10, 10));
}

#[test]
fn state_words_do_not_depend_on_rate_or_burst() {
    for a in Algorithm::ALL {
        let words = |c, p, b| rated(a, c, p, b).state_words();
        let stat = Limit::new(a, Rate { count: 1, period_us: S }, 3).unwrap().state_words();
        let extra = usize::from(a != Algorithm::SlidingLog);
        assert_eq!(words(1, S, 3), stat + extra, "{a}");
        if a != Algorithm::SlidingLog {
            assert_eq!(words(7, HOUR, 100), words(1, 1, 1), "{a}");
        }
        assert!(rated(a, 1, S, 3).is_varying());
    }
}

#[test]
fn refund_after_a_conversion_takes_nothing_back() {
    // gcra 1r/s: a charge, then a request at 2r/s converts the state; the
    // first charge's refund then leaves it as it is.
    let (l, m) = (rated(Algorithm::Gcra, 1, S, 5), rated(Algorithm::Gcra, 2, S, 5));
    let mut s = vec![0; l.state_words()];
    let (_, charge) = l.acquire_charged(&mut s, S, 1);
    take(&m, &mut s, S, 1);
    let before = s.clone();
    l.refund(&mut s, &charge, S);
    assert_eq!(s, before);
    // With nothing in between, the refund takes it back.
    let mut s = vec![0; l.state_words()];
    let (_, charge) = l.acquire_charged(&mut s, S, 1);
    l.refund(&mut s, &charge, S);
    assert_eq!(admitted(&l, &s, S), (5, 5));
}

#[test]
fn bucket_refund_after_another_charge_takes_nothing_back() {
    // Two rates of one period: other tags. A charge at 10r/s after ours
    // leaves its tag: our refund keeps the state.
    let (l, m) = (rated(Algorithm::TokenBucket, 1, S, 5), rated(Algorithm::TokenBucket, 10, S, 5));
    let mut s = vec![0; l.state_words()];
    take(&l, &mut s, S, 3);
    let (_, charge) = l.acquire_charged(&mut s, S, 1);
    take(&m, &mut s, S + S / 2, 1);
    let before = s.clone();
    l.refund(&mut s, &charge, S + S / 2);
    assert_eq!(s, before);
    // Then one of ours: our tag again, but the state drained at 10r/s from
    // 1.5 s (where ours would have drained at 1r/s): 1 request used, which
    // the refund keeps.
    take(&l, &mut s, 2 * S, 1);
    assert_eq!(s[..2], [S, 2 * S]);
    let before = s.clone();
    l.refund(&mut s, &charge, 2 * S);
    assert_eq!(s, before);
    // With nothing charged in between, it takes the charge back.
    let (_, charge) = l.acquire_charged(&mut s, 2 * S, 1);
    l.refund(&mut s, &charge, 2 * S);
    assert_eq!(s, before);
}
