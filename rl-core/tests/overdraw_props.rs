//! Property tests of `Limit::overdraw`, the charge of a cost known only
//! after the response (`charge=after`), for every algorithm that supports
//! it (`sliding_log` charges only what fits: see its own test), on a fake
//! clock (integer µs). After any reachable state (requests admitted and
//! charges overdrawn in any order) and an overdraw of `x` at `t`:
//!
//! - (a) a request of cost 1 is rejected until exactly `t + retry_after`
//!   and admitted then, when nothing else happens;
//! - (b) the buckets and `gcra` repay the overdraft at the rate: the wait
//!   is `x·period/count` µs longer than with no overdraft (rounded up to
//!   whole µs by the buckets, `x·T` for `gcra`);
//! - (c) `fixed` forgets the overdraft when the window charged ends,
//!   `sliding` when the window after it ends: from then on the state
//!   answers as if it had never been;
//! - (d) a refund of the overdraw's charge is never more permissive than
//!   the state without it (and exactly that state when refunded at once).
//!
//! - (e) a cost no caller should charge in full (an upstream's figure up to
//!   `u64::MAX`), capped at [`Limit::max_cost`], holds the key for at most
//!   [`MAX_CHARGE_US`] (or one window, when the burst takes longer to
//!   refill) beyond the wait it had, and never saturates the state.
//!
//! And the issue's sequence as an example.

use proptest::prelude::*;
use proptest::sample::select;
use rl_core::limit::{Algorithm, Limit, MAX_CHARGE_US};
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

/// A request's cost: mostly 1, sometimes 0, more, the whole burst or beyond.
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

/// An overdraw's cost: from nothing to several bursts.
fn over(l: &Limit, (_, f, c): Raw) -> u64 {
    let b = l.burst();
    match c % 4 {
        0 => u64::from(f) % 3,
        1 => u64::from(f) % (b + 1),
        _ => u64::from(f) % (4 * b + 1),
    }
}

/// A state reached from a fresh key by `ops` from `start`: requests checked
/// and charged as the access phase does, and (one step in four) a
/// `charge=after` line's admission check then its overdraw. Returns it and
/// the last time it saw.
fn history(l: &Limit, ops: &[Raw], start: u64) -> (Vec<u64>, u64) {
    let (mut s, mut t) = (vec![0; l.state_words()], start);
    for &op in ops {
        t += gap(l, op);
        if op.0 >> 6 == 3 {
            if l.check(&s, t, 1).admitted {
                l.overdraw(&mut s, t, over(l, op));
            }
        } else {
            l.acquire(&mut s, t, cost(l, op));
        }
    }
    (s, t)
}

/// The wait from `t` until a request of cost 1 is admitted on `s`: 0 if it
/// is now.
fn wait(l: &Limit, s: &[u64], t: u64) -> u64 {
    let o = l.check(s, t, 1);
    match o.admitted {
        true => 0,
        false => o.retry_after_us.expect("a cost of 1 can always pass"),
    }
}

/// Asserts that `a` and `b` answer every request of `later` (from `now`)
/// alike.
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

/// The algorithms that overdraw in full.
const OVERDRAWN: [Algorithm; 5] =
    [Algorithm::Fixed, Algorithm::Sliding, Algorithm::TokenBucket, Algorithm::LeakyBucket, Algorithm::Gcra];

/// A limit with a small rate and burst, periods that may not divide; for
/// the algorithms that can delay, sometimes a queue.
fn limits() -> impl Strategy<Value = Limit> {
    let period = prop_oneof![1u64..=40, 1_000u64..=2_000_000, Just(1_000_000u64), Just(60_000_000u64)];
    let queue = prop_oneof![Just(0u64), 1u64..=12];
    (select(OVERDRAWN.to_vec()), 1u64..=12, period, 1u64..=10, queue).prop_map(|(a, count, p, b, q)| {
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

/// Limits as nginx.conf writes them (`Nr/s` to `Nr/d`, counts up to a
/// million, a burst up to a few times the count), where [`Limit::max_cost`]
/// matters: a week's refill is anywhere from below the burst to far above it.
fn conf_limits() -> impl Strategy<Value = Limit> {
    let period = select(vec![1_000_000u64, 60_000_000, 3_600_000_000, 86_400_000_000]);
    (select(OVERDRAWN.to_vec()), 1u64..=1_000_000, period, 1u64..=3_000_000)
        .prop_map(|(a, count, p, b)| Limit::new(a, Rate { count, period_us: p }, b).unwrap())
}

const DAY: u64 = 86_400_000_000;

/// (e) by example: a key of 100,000 tokens a day, charged `u64::MAX`
/// tokens capped at 700,000 (a week's refill), waits a week less its burst's
/// day with the buckets and `gcra`; `fixed` and `sliding` forget it with
/// their window as ever; a day's rate below its burst caps at the burst.
#[test]
fn max_cost_by_example() {
    let l = Limit::new(Algorithm::TokenBucket, Rate { count: 100_000, period_us: DAY }, 100_000).unwrap();
    assert_eq!(l.max_cost(), 700_000);
    let slow = Limit::new(Algorithm::Gcra, Rate { count: 1, period_us: DAY }, 100).unwrap();
    assert_eq!(slow.max_cost(), 100, "a burst that takes 100 days to refill");
    let fast = Limit::new(Algorithm::Gcra, Rate { count: u64::MAX / 2, period_us: 1 }, 1).unwrap();
    assert_eq!(fast.max_cost(), u64::MAX, "no overflow");
    let t = 5 * DAY;
    for a in [Algorithm::TokenBucket, Algorithm::LeakyBucket, Algorithm::Gcra] {
        let l = Limit::new(a, Rate { count: 100_000, period_us: DAY }, 100_000).unwrap();
        let mut s = vec![0; l.state_words()];
        l.overdraw(&mut s, t, l.max_cost());
        let o = l.check(&s, t, 1);
        // 600,001 tokens to repay at 100,000 a day.
        let want = (600_001 * DAY).div_ceil(100_000);
        assert!(!o.admitted && o.retry_after_us.is_some_and(|r| r.abs_diff(want) <= 1), "{a}: {o:?}");
        assert_eq!(o.reset_us, 7 * DAY, "{a}: {o:?}");
    }
    for (a, windows) in [(Algorithm::Fixed, 1), (Algorithm::Sliding, 2)] {
        let l = Limit::new(a, Rate { count: 100_000, period_us: DAY }, 100_000).unwrap();
        let mut s = vec![0; l.state_words()];
        l.overdraw(&mut s, t, l.max_cost());
        let o = l.check(&s, t, 1);
        assert!(!o.admitted && o.reset_us <= windows * DAY, "{a}: {o:?}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// (e) An overdraw of [`Limit::max_cost`] on any reachable state makes
    /// the key wait at most [`MAX_CHARGE_US`] longer (or one window, two for
    /// `sliding`, when the burst refills slower than that; `gcra` counts
    /// whole µs of `T` per unit, the buckets round up once), and the state
    /// reads finite.
    #[test]
    fn max_cost_bounds_the_wait(l in conf_limits(), before in ops(20), start in starts()) {
        let (s, t) = history(&l, &before, start);
        let x = l.max_cost();
        prop_assert!(x >= l.burst());
        let mut a = s.clone();
        prop_assert_eq!(l.overdraw(&mut a, t, x).cost(), x);
        let rate = l.rate();
        let rounding = match l.algorithm() {
            Algorithm::Gcra => x * (rate.period_us.div_ceil(rate.count) * rate.count - rate.period_us) / rate.count + 1,
            _ => 1,
        };
        // `sliding` forgets an overdraft when the window after it ends: up to two windows.
        let windows = if l.algorithm() == Algorithm::Sliding { 2 } else { 1 };
        let longer = MAX_CHARGE_US.max(windows * l.window_us()) + rounding;
        let w = wait(&l, &a, t);
        prop_assert!(w <= wait(&l, &s, t) + longer, "wait {} above {} + {}", w, wait(&l, &s, t), longer);
        let (r0, r) = (l.check(&s, t, 0).reset_us, l.check(&a, t, 0).reset_us);
        prop_assert!(r <= r0 + longer, "reset {} above {} + {}", r, r0, longer);
    }

    /// (a) After an overdraw, a request of cost 1 is rejected until exactly
    /// the retry-after it is told, at a few instants before it too, and
    /// admitted then; the overdraft shows: nothing remains, and the reset
    /// is no earlier than that.
    #[test]
    fn retry_after_is_exact(l in limits(), before in ops(40), start in starts(), x: Raw, probes: [u16; 4]) {
        let (mut s, t) = history(&l, &before, start);
        let x = over(&l, x);
        let base = s.clone();
        let charge = l.overdraw(&mut s, t, x);
        prop_assert_eq!(charge.cost(), x);
        let o = l.check(&s, t, 1);
        if o.admitted {
            prop_assert_eq!(o.retry_after_us, None);
            return Ok(());
        }
        let r = o.retry_after_us.expect("a cost of 1 can always pass");
        prop_assert!(r >= 1);
        prop_assert_eq!(o.remaining, 0);
        prop_assert!(o.reset_us >= r, "reset {} before the retry {}", o.reset_us, r);
        for p in probes {
            let u = t + frac(r - 1, p % 1001);
            prop_assert!(!l.check(&s, u, 1).admitted, "admitted at {} before {}", u, t + r);
        }
        prop_assert!(!l.check(&s, t + r - 1, 1).admitted);
        prop_assert!(l.check(&s, t + r, 1).admitted, "rejected at {}", t + r);
        // Never sooner than without the overdraft.
        prop_assert!(wait(&l, &base, t) <= r);
    }

    /// (b) The buckets and `gcra` repay an overdraft at the rate: `x` units
    /// more make the wait `x·period/count` longer (whole µs: the buckets
    /// round the total up, `gcra` counts `x·T`), or at most that when the
    /// request would have passed without them.
    #[test]
    fn buckets_repay_at_the_rate(l in limits(), before in ops(40), start in starts(), x: Raw) {
        prop_assume!(!matches!(l.algorithm(), Algorithm::Fixed | Algorithm::Sliding));
        let (s, t) = history(&l, &before, start);
        let x = over(&l, x);
        let mut a = s.clone();
        l.overdraw(&mut a, t, x);
        let (w0, wx) = (wait(&l, &s, t), wait(&l, &a, t));
        let rate = l.rate();
        let (lo, hi) = match l.algorithm() {
            Algorithm::Gcra => {
                let xt = x * rate.period_us.div_ceil(rate.count);
                (xt, xt)
            }
            _ => (x * rate.period_us / rate.count, (x * rate.period_us).div_ceil(rate.count)),
        };
        if w0 > 0 {
            prop_assert!((w0 + lo..=w0 + hi).contains(&wx), "{} + [{}, {}] vs {}", w0, lo, hi, wx);
        } else {
            prop_assert!(wx <= hi, "{} above {}", wx, hi);
        }
    }

    /// (c) `fixed` forgets an overdraft when the window charged ends,
    /// `sliding` when the window after it ends: from then on the state
    /// answers every request as the state without it.
    #[test]
    fn windows_forget_the_overdraft(
        l in limits(), before in ops(40), start in starts(), x: Raw, after: Raw, later in ops(20),
    ) {
        let windows = match l.algorithm() {
            Algorithm::Fixed => 1,
            Algorithm::Sliding => 2,
            _ => return Ok(()),
        };
        let (s, t) = history(&l, &before, start);
        let mut a = s.clone();
        l.overdraw(&mut a, t, over(&l, x));
        let w = l.window_us();
        let end = (t / w + windows) * w;
        let u = end + gap(&l, after);
        assert_same(&l, &a, &s, u, &later);
        // Until then it counts: an overdraft beyond the burst still rejects
        // in the last instant of the window charged (`fixed`), or at the
        // start of the next (`sliding`, where it then weighs in full).
        let mut big = s.clone();
        l.overdraw(&mut big, t, l.burst() + 1);
        let last = if windows == 1 { end - 1 } else { end - w };
        prop_assert!(!l.check(&big, last, 1).admitted, "forgotten at {}", last);
    }

    /// (d) Refunded at once, an overdraw leaves the state answering every
    /// later request as before it.
    #[test]
    fn refund_at_once_restores(l in limits(), before in ops(40), start in starts(), x: Raw, later in ops(40)) {
        let (s, t) = history(&l, &before, start);
        let mut a = s.clone();
        let charge = l.overdraw(&mut a, t, over(&l, x));
        l.refund(&mut a, &charge, t);
        assert_same(&l, &a, &s, t, &later);
    }

    /// (d) Refunded later, with requests and other overdraws in between, an
    /// overdraw's charge leaves a state never more permissive than the one
    /// that saw everything else but it.
    #[test]
    fn refund_is_never_more_permissive(
        l in limits(), before in ops(40), start in starts(), x: Raw, between in ops(20), wait: Raw,
        later in ops(40),
    ) {
        let (s, t) = history(&l, &before, start);
        let (mut a, mut b) = (s.clone(), s.clone());
        let charge = l.overdraw(&mut a, t, over(&l, x));
        let mut u = t;
        for &op in &between {
            u += gap(&l, op);
            if op.0 >> 6 == 3 {
                l.overdraw(&mut a, u, over(&l, op));
                l.overdraw(&mut b, u, over(&l, op));
            } else if l.acquire(&mut a, u, cost(&l, op)).admitted {
                prop_assert!(l.acquire(&mut b, u, cost(&l, op)).admitted);
            }
        }
        u += gap(&l, wait);
        l.refund(&mut a, &charge, u);
        assert_stricter(&l, &a, &b, u, &later);
    }

    /// Arbitrary states, costs and times never panic, and an overdraw of 0
    /// changes nothing.
    #[test]
    fn never_panics(
        a in select(Algorithm::ALL.to_vec()), s0: u64, s1: u64, s2: u64, now: u64, x: u64, count in 1u64..=u64::MAX,
        period in 1u64..=u64::MAX, burst in 1u64..=64,
    ) {
        let Ok(l) = Limit::new(a, Rate { count, period_us: period }, burst) else { return Ok(()) };
        let mut s = vec![s0, s1, s2];
        s.resize(l.state_words().max(3), s2);
        let before = s.clone();
        l.overdraw(&mut s, now, 0);
        prop_assert_eq!(&s, &before);
        let charge = l.overdraw(&mut s, now, x);
        l.check(&s, now, 1);
        l.refund(&mut s, &charge, now);
        l.overdraw(&mut s[..0], now, x);
    }
}

fn limit(alg: Algorithm, count: u64, period_us: u64, burst: u64) -> Limit {
    Limit::new(alg, Rate { count, period_us }, burst).unwrap()
}

/// The issue's sequence: `burst=100`, each response costs 30. Requests 1-4
/// pass the admission check (one unit left) and each overdraws 30; the 4th
/// takes the state to 120 used; the 5th is rejected with a retry-after
/// that, waited, admits it. (token_bucket at 100 per second: a unit is
/// repaid every 10 ms.)
#[test]
fn issue_sequence_token_bucket() {
    let l = limit(Algorithm::TokenBucket, 100, 1_000_000, 100);
    let (mut s, t) = (vec![0; 2], 1_000_000_000);
    for i in 1..=4 {
        let o = l.check(&s, t, 1);
        assert!(o.admitted, "request {i}");
        assert_eq!(o.remaining, 99 - 30 * (i - 1), "request {i}");
        assert_eq!(l.overdraw(&mut s, t, 30).cost(), 30);
    }
    // 120 units used (scaled by the period).
    assert_eq!(s, vec![120 * 1_000_000, t]);
    let o = l.check(&s, t, 1);
    assert!(!o.admitted);
    assert_eq!(o.remaining, 0);
    // 21 units to repay before one is free: 210 ms; all 120: 1.2 s.
    assert_eq!(o.retry_after_us, Some(210_000));
    assert_eq!(o.reset_us, 1_200_000);
    assert!(!l.check(&s, t + 209_999, 1).admitted);
    let o = l.check(&s, t + 210_000, 1);
    assert!(o.admitted);
    assert_eq!(o.remaining, 0);
}

/// The same sequence on `gcra`, `leaky_bucket`, `fixed` and `sliding`: the
/// 5th request is rejected, and admitted after the retry-after it is told
/// (for `fixed`, at the end of the window; for `sliding`, in the next
/// window once the overdraft weighs less than a unit's room).
#[test]
fn issue_sequence_every_algorithm() {
    for (alg, retry) in [
        (Algorithm::LeakyBucket, 210_000),
        (Algorithm::Gcra, 210_000),
        (Algorithm::Fixed, 1_000_000),
        // In the next window, prev = 120 weighs 120·(W−e)/W: 99 units of
        // room at e = 21/120·W = 175 ms.
        (Algorithm::Sliding, 1_175_000),
    ] {
        let l = limit(alg, 100, 1_000_000, 100);
        let (mut s, t) = (vec![0; l.state_words()], 1_000_000_000);
        for i in 1..=4 {
            assert!(l.check(&s, t, 1).admitted, "{alg} request {i}");
            l.overdraw(&mut s, t, 30);
        }
        let o = l.check(&s, t, 1);
        assert!(!o.admitted, "{alg}");
        assert_eq!(o.retry_after_us, Some(retry), "{alg}");
        assert!(!l.check(&s, t + retry - 1, 1).admitted, "{alg}");
        assert!(l.check(&s, t + retry, 1).admitted, "{alg}");
    }
}

/// `sliding_log` keeps one timestamp per unit: an overdraw charges what
/// fits, no more (`charge=after` is refused on it at configuration).
#[test]
fn sliding_log_charges_what_fits() {
    let l = limit(Algorithm::SlidingLog, 10, 1_000_000, 10);
    let mut s = vec![0; l.state_words()];
    let t = 5_000_000;
    assert_eq!(l.overdraw(&mut s, t, 4).cost(), 4);
    assert_eq!(l.overdraw(&mut s, t, 30).cost(), 6);
    assert_eq!(l.overdraw(&mut s, t, 30).cost(), 0);
    let o = l.check(&s, t, 1);
    assert_eq!((o.admitted, o.remaining, o.retry_after_us), (false, 0, Some(1_000_000)));
}

/// A `fixed` or `sliding` state written before overdrafts existed never
/// held more than the burst; one that does (an overdraft) is read as it is,
/// not clamped to the burst: the overdraft counts until its window ends.
#[test]
fn windows_do_not_clamp_an_overdraft() {
    let l = limit(Algorithm::Fixed, 10, 1_000_000, 10);
    let mut s = vec![0; 2];
    l.overdraw(&mut s, 0, 25);
    assert_eq!(s, vec![1, 25]);
    // Refunding 10 of it still leaves 15 > 10 used.
    let charge = l.commit(&mut [1, 0], 0, 10);
    l.refund(&mut s, &charge, 0);
    assert_eq!(s, vec![1, 15]);
    assert!(!l.check(&s, 999_999, 1).admitted);
    assert!(l.check(&s, 1_000_000, 10).admitted);
}
