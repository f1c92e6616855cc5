//! Property tests of `Limit::refund`, for every algorithm, on a fake clock
//! (integer µs): a request charged (`commit`) and later refunded leaves the
//! state as if it had never come — or stricter, never more permissive.
//!
//! - Refunded at once, or later with nothing else charged in between, the
//!   state answers every later request exactly as the state before it did.
//! - With other requests charged, kept and refunded in between, in any
//!   order: every request kept would also have been admitted had the
//!   refunded ones never come, and the final state is at least as strict
//!   as that one (exactly as strict for `fixed`, `sliding`, `sliding_log`).
//! - Arbitrary states, charges and times never panic.

use proptest::prelude::*;
use proptest::sample::select;
use rl_core::limit::{Algorithm, Charge, Limit};
use rl_core::parse::Rate;

/// A raw step: (time selector, fraction, cost selector).
type Raw = (u8, u16, u8);

/// `w · permille / 1000`.
fn frac(w: u64, permille: u16) -> u64 {
    (u128::from(w) * u128::from(permille) / 1000) as u64
}

/// The time a step advances the clock by: often nothing or a little, else
/// up to three windows.
fn gap(l: &Limit, (sel, f, _): Raw) -> u64 {
    match sel % 6 {
        0 | 1 => 0,
        2 => 1 + u64::from(f % 3),
        3 => frac(l.window_us(), f % 1500),
        _ => frac(l.window_us(), f % 3000),
    }
}

/// A step's cost: mostly 1, sometimes 0, more, the whole burst or beyond.
fn cost(l: &Limit, (_, f, c): Raw) -> u64 {
    let b = l.burst();
    match c % 8 {
        0 => 0,
        5 => 1 + u64::from(f) % b,
        6 => b,
        7 => b + 1 + l.queue() % 3,
        _ => 1,
    }
}

/// A state built by `ops` from `start` on a fresh key; returns it and the
/// last time it saw.
fn history(l: &Limit, ops: &[Raw], start: u64) -> (Vec<u64>, u64) {
    let (mut s, mut t) = (vec![0; l.state_words()], start);
    for &op in ops {
        t += gap(l, op);
        l.acquire(&mut s, t, cost(l, op));
    }
    (s, t)
}

/// Asserts that `a` and `b` answer every request of `later` (from `now`)
/// alike: the same outcome, and the same view at no cost.
fn assert_same(l: &Limit, a: &[u64], b: &[u64], now: u64, later: &[Raw]) {
    let (mut a, mut b, mut t) = (a.to_vec(), b.to_vec(), now);
    for (i, &op) in later.iter().enumerate() {
        t += gap(l, op);
        let c = cost(l, op);
        assert_eq!(l.check(&a, t, 0), l.check(&b, t, 0), "step {i} at {t}: the view");
        let (oa, ob) = (l.acquire(&mut a, t, c), l.acquire(&mut b, t, c));
        assert_eq!(oa, ob, "step {i} at {t}, cost {c}");
    }
}

/// Asserts that `a` is at least as strict as `b` over `later` (from `now`):
/// never more remaining, and while they agree, the first request on which
/// they differ is one `a` rejects and `b` admits.
fn assert_stricter(l: &Limit, a: &[u64], b: &[u64], now: u64, later: &[Raw]) {
    let (mut a, mut b, mut t) = (a.to_vec(), b.to_vec(), now);
    for (i, &op) in later.iter().enumerate() {
        t += gap(l, op);
        let c = cost(l, op);
        let (va, vb) = (l.check(&a, t, 0), l.check(&b, t, 0));
        assert!(va.remaining <= vb.remaining, "step {i} at {t}: remaining {va:?} vs {vb:?}");
        let (oa, ob) = (l.check(&a, t, c), l.check(&b, t, c));
        assert!(!oa.admitted || ob.admitted, "step {i} at {t}, cost {c}: admitted only after the refund");
        if oa.admitted != ob.admitted {
            return;
        }
        l.acquire(&mut a, t, c);
        l.acquire(&mut b, t, c);
    }
}

/// A limit with a small rate and burst, and periods that may not divide;
/// for the algorithms that can delay, sometimes a queue (delayed requests
/// are charged and refunded as the others).
fn limits() -> impl Strategy<Value = Limit> {
    let period = prop_oneof![1u64..=40, 1_000u64..=2_000_000, Just(1_000_000u64), Just(60_000_000u64)];
    let queue = prop_oneof![Just(0u64), 1u64..=12];
    (select(Algorithm::ALL.to_vec()), 1u64..=12, period, 1u64..=10, queue).prop_map(|(a, count, p, b, q)| {
        let l = Limit::new(a, Rate { count, period_us: p }, b).unwrap();
        l.with_queue(q).unwrap_or(l)
    })
}

fn ops(max: usize) -> impl Strategy<Value = Vec<Raw>> {
    prop::collection::vec(any::<Raw>(), 0..max)
}

/// Start times, some window-aligned and some far from 0.
fn starts() -> impl Strategy<Value = u64> {
    prop_oneof![Just(0u64), 0u64..5_000_000, 1u64 << 40..(1u64 << 40) + 100_000_000]
}

/// What a step of [`refunds_take_back_nothing_else`] does.
#[derive(Clone, Copy, Debug)]
enum Kind {
    /// A request charged for good.
    Keep,
    /// A request charged, to be refunded later (or kept, if never).
    Reserve,
    /// Refunds one of the reserved requests.
    Refund,
}

fn kinds(max: usize) -> impl Strategy<Value = Vec<(Kind, Raw)>> {
    let kind = prop_oneof![Just(Kind::Keep), Just(Kind::Reserve), Just(Kind::Refund)];
    prop::collection::vec((kind, any::<Raw>()), 1..max)
}

/// One request charged in [`refunds_take_back_nothing_else`].
struct Charged {
    now: u64,
    charge: Charge,
    /// Reserved: may be refunded.
    reserved: bool,
    refunded: bool,
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Refunded at the instant it was charged, a request leaves the state
    /// answering every later request as before; a request that was not
    /// admitted charged nothing, and its refund changes nothing.
    #[test]
    fn refund_at_once_restores(l in limits(), before in ops(40), start in starts(), x: Raw, later in ops(40)) {
        let (s, t) = history(&l, &before, start);
        let mut a = s.clone();
        let c = cost(&l, x);
        let admitted = l.check(&a, t, c).admitted;
        let charge = l.commit(&mut a, t, c);
        prop_assert_eq!(charge.cost(), if admitted { c } else { 0 });
        l.refund(&mut a, &charge, t);
        if charge.cost() == 0 {
            prop_assert_eq!(&a, &s);
        }
        assert_same(&l, &a, &s, t, &later);
    }

    /// A line that admits a request it is not charged for (another line
    /// rejects it, or it charges after the response) reports what its state
    /// has left, as `rl_quota` reads it: a check at cost 0, and the wait for
    /// one more unit; its verdict stays.
    #[test]
    fn uncharged_reads_as_cost_zero(l in limits(), before in ops(40), start in starts(), x: Raw) {
        let (s, t) = history(&l, &before, start);
        let c = cost(&l, x);
        let o = l.check(&s, t, c);
        prop_assume!(o.admitted);
        let u = o.uncharged(&l.left(&s, t));
        let zero = l.check(&s, t, 0);
        prop_assert_eq!((u.remaining, u.reset_us, u.next_us), (zero.remaining, zero.reset_us, l.next_us(&s, t)));
        prop_assert_eq!((u.admitted, u.delay_us, u.retry_after_us), (o.admitted, o.delay_us, o.retry_after_us));
    }

    /// Refunded any time later, with nothing else charged in between, the
    /// same: what the request took has been given back, all of it.
    #[test]
    fn refund_later_restores(
        l in limits(), before in ops(40), start in starts(), x: Raw, wait: Raw, later in ops(40),
    ) {
        let (s, t) = history(&l, &before, start);
        let mut a = s.clone();
        let charge = l.commit(&mut a, t, cost(&l, x));
        let u = t + gap(&l, wait);
        l.refund(&mut a, &charge, u);
        assert_same(&l, &a, &s, u, &later);
    }

    /// Refunded after other requests were charged, while the level under
    /// the request had not yet drained (`reset_us > 0`; the window
    /// algorithms and the log need no such care): exactly as if it had
    /// never come.
    #[test]
    fn refund_under_load_is_exact(
        l in limits(), before in ops(40), start in starts(), x: Raw, between in ops(20), wait: Raw,
        later in ops(40),
    ) {
        let (s, t) = history(&l, &before, start);
        let (mut a, mut b) = (s.clone(), s.clone());
        let charge = l.commit(&mut a, t, cost(&l, x));
        let mut u = t;
        for &op in &between {
            u += gap(&l, op);
            if l.acquire(&mut a, u, cost(&l, op)).admitted {
                prop_assert!(l.acquire(&mut b, u, cost(&l, op)).admitted);
            }
        }
        u += gap(&l, wait);
        let windows = matches!(l.algorithm(), Algorithm::Fixed | Algorithm::Sliding | Algorithm::SlidingLog);
        prop_assume!(windows || l.check(&s, u, 0).reset_us > 0);
        l.refund(&mut a, &charge, u);
        assert_same(&l, &a, &b, u, &later);
    }

    /// Requests kept, reserved and refunded in any order: every request
    /// still charged at the end is admitted again when those alone are
    /// replayed on a fresh state (the refunds never let one in that the
    /// limit would have refused had the refunded requests never come), and
    /// the state ends at least as strict as that replay's — as strict for
    /// the window algorithms and the log, which take charges back exactly.
    /// Not for the buckets and `gcra` once a charge was refunded, time
    /// later, after a charge made before it was refunded: `Limit::refund`'s
    /// one exception (see [`refund_over_a_refunded_charge`]).
    #[test]
    fn refunds_take_back_nothing_else(l in limits(), steps in kinds(60), start in starts(), later in ops(40)) {
        let (mut a, mut t) = (vec![0; l.state_words()], start);
        let mut all: Vec<Charged> = Vec::new();
        let levels = matches!(l.algorithm(), Algorithm::TokenBucket | Algorithm::LeakyBucket | Algorithm::Gcra);
        let mut excepted = false;
        for &(kind, op) in &steps {
            t += gap(&l, op);
            let pending: Vec<usize> = (0..all.len()).filter(|&i| all[i].reserved && !all[i].refunded).collect();
            match kind {
                Kind::Refund if !pending.is_empty() => {
                    let i = pending[usize::from(op.1) % pending.len()];
                    excepted |= levels && t > all[i].now && all[..i].iter().any(|ch| ch.refunded);
                    l.refund(&mut a, &all[i].charge, t);
                    all[i].refunded = true;
                }
                _ => {
                    let charge = l.commit(&mut a, t, cost(&l, op));
                    if charge.cost() > 0 {
                        all.push(Charged { now: t, charge, reserved: matches!(kind, Kind::Reserve), refunded: false });
                    }
                }
            }
        }
        if excepted {
            return Ok(());
        }
        let mut b = vec![0; l.state_words()];
        for ch in all.iter().filter(|ch| !ch.refunded) {
            let o = l.acquire(&mut b, ch.now, ch.charge.cost());
            prop_assert!(o.admitted, "a request kept at {} is not admitted without the refunded ones", ch.now);
        }
        assert_stricter(&l, &a, &b, t, &later);
        if matches!(l.algorithm(), Algorithm::Fixed | Algorithm::Sliding | Algorithm::SlidingLog) {
            assert_same(&l, &a, &b, t, &later);
        }
    }

    /// Arbitrary parameters, states, charges and times never panic, and the
    /// state stays one `check` reads sensibly.
    #[test]
    fn refund_never_panics(
        alg in select(Algorithm::ALL.to_vec()),
        count in prop_oneof![1u64..100, any::<u64>()],
        period_us in prop_oneof![1u64..100, any::<u64>()],
        burst in prop_oneof![1u64..70, any::<u64>()],
        words in prop::collection::vec(any::<u64>(), 0..80),
        other in prop::collection::vec(any::<u64>(), 0..80),
        steps in prop::collection::vec((any::<u64>(), any::<u64>(), any::<u64>()), 1..12),
    ) {
        let Ok(l) = Limit::new(alg, Rate { count, period_us }, burst) else {
            return Ok(());
        };
        let (mut s, mut o) = (words, other);
        for (now, cost, then) in steps {
            let charge = l.commit(&mut s, now, cost);
            l.refund(&mut o, &charge, then);
            l.refund(&mut s, &charge, then);
            l.refund(&mut s, &charge, now);
            for st in [&s, &o] {
                prop_assert!(l.check(st, then, cost).remaining <= burst);
            }
        }
    }
}

/// A request that drained away before the next one came: its refund gives
/// back only what is left of it, none of the next request's charge.
#[test]
fn drained_charge_leaves_later_charges() {
    let rate = Rate { count: 1, period_us: 1_000_000 };
    for alg in [Algorithm::TokenBucket, Algorithm::LeakyBucket, Algorithm::Gcra] {
        let l = Limit::new(alg, rate, 2).unwrap();
        for (next, refund_at) in [(500_000, 500_000), (1_000_000, 1_000_000), (3_000_000, 3_500_000)] {
            let (mut a, mut b) = (vec![0; l.state_words()], vec![0; l.state_words()]);
            let x = l.commit(&mut a, 0, 1);
            assert_eq!(x.cost(), 1);
            l.commit(&mut a, next, 1);
            l.commit(&mut b, next, 1);
            l.refund(&mut a, &x, refund_at);
            assert_same(&l, &a, &b, refund_at, &[(0, 0, 1), (0, 0, 1), (3, 500, 1), (0, 0, 1)]);
        }
    }
}

/// The window algorithms and the log take a charge back from wherever it
/// went: the current window, the previous one, or among the timestamps.
#[test]
fn window_charges_come_back_exactly() {
    let rate = Rate { count: 10, period_us: 1_000_000 };
    for alg in [Algorithm::Fixed, Algorithm::Sliding, Algorithm::SlidingLog] {
        let l = Limit::new(alg, rate, 10).unwrap();
        let w = l.window_us();
        for refund_at in [w / 2, w + w / 4, 2 * w + 1] {
            let (mut a, mut b) = (vec![0; l.state_words()], vec![0; l.state_words()]);
            l.commit(&mut a, w / 4, 3);
            l.commit(&mut b, w / 4, 3);
            let x = l.commit(&mut a, w / 3, 4);
            l.commit(&mut a, w / 2, 2);
            l.commit(&mut b, w / 2, 2);
            l.refund(&mut a, &x, refund_at);
            assert_same(&l, &a, &b, refund_at, &[(0, 0, 5), (2, 0, 1), (3, 300, 1), (4, 900, 6)]);
        }
    }
}

/// `Limit::refund`'s one exception, for the buckets and `gcra`: `y` was
/// charged over `x`, `x` was refunded, and time passed before `y`'s refund;
/// the refund cannot tell that the level under `y` went with `x`, and gives
/// back what the rate refilled between `y`'s charge and its refund (4 µs of
/// an 8 µs unit) more than `y` took — no more: the state is then the one a
/// replay of the kept request alone has 4 µs later.
#[test]
fn refund_over_a_refunded_charge() {
    let rate = Rate { count: 1, period_us: 8 };
    for alg in [Algorithm::TokenBucket, Algorithm::LeakyBucket, Algorithm::Gcra] {
        let l = Limit::new(alg, rate, 4).unwrap();
        let (mut a, mut b) = (vec![0; l.state_words()], vec![0; l.state_words()]);
        let x = l.commit(&mut a, 0, 2);
        let y = l.commit(&mut a, 0, 1);
        assert_eq!((x.cost(), y.cost()), (2, 1));
        l.refund(&mut a, &x, 0);
        assert_eq!(l.commit(&mut a, 4, 3).cost(), 3);
        l.refund(&mut a, &y, 4);
        assert!(l.acquire(&mut b, 4, 3).admitted);
        assert!(l.check(&a, 8, 2).admitted && !l.check(&b, 8, 2).admitted, "{alg:?}: more permissive");
        for later in [4, 8, 12, 20, 36] {
            for cost in 0..=4 {
                assert_eq!(l.check(&a, later, cost), l.check(&b, later + 4, cost), "{alg:?} at {later}, cost {cost}");
            }
        }
    }
}
