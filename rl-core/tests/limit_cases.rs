//! Table cases for every algorithm, with an explicit integer clock (µs).
//!
//! Unless noted the limit is 10r/s with burst 5: W = 500 ms, T = 100 ms.

use rl_core::limit::{Algorithm, Charge, Limit, LimitError, Outcome, MAX_LOG_BURST};
use rl_core::parse::Rate;

use Algorithm::*;

const SEC: u64 = 1_000_000;
const W: u64 = 500_000;
const T: u64 = 100_000;
const B: u64 = 5;
/// A window-aligned start time far from 0.
const T0: u64 = 1_000 * W;

/// `count` per `period_us`.
fn rate(count: u64, period_us: u64) -> Rate {
    Rate { count, period_us }
}

/// The standard limit for `alg`.
fn std_limit(alg: Algorithm) -> Limit {
    Limit::new(alg, rate(10, SEC), B).unwrap()
}

/// Fresh (all-zero) state for `l`.
fn fresh(l: &Limit) -> Vec<u64> {
    vec![0; l.state_words()]
}

/// Acquires `n` cost-1 requests at `now`, asserting each is admitted.
fn take(l: &Limit, s: &mut [u64], now: u64, n: u64) {
    for i in 0..n {
        let o = l.acquire(s, now, 1);
        assert!(o.admitted, "{}: request {i} at {now}", l.algorithm());
    }
}

/// The exact wait after exhausting the burst at a window start.
fn refill_wait(alg: Algorithm) -> u64 {
    match alg {
        Fixed | SlidingLog => W,
        // next window: prev = 5, admits when 5·(W−e)/W + 1 ≤ 5 → e = W/5.
        Sliding => W + W / 5,
        TokenBucket | LeakyBucket | Gcra => T,
        Concurrent => unreachable!("the rate algorithms only"),
    }
}

#[test]
fn names_roundtrip_and_default() {
    let names = ["fixed", "sliding", "sliding_log", "token_bucket", "leaky_bucket", "gcra"];
    for (alg, name) in Algorithm::ALL.into_iter().zip(names) {
        assert_eq!(alg.to_string(), name);
        assert_eq!(name.parse::<Algorithm>(), Ok(alg));
    }
    assert_eq!(Algorithm::default(), Sliding);
    let err = "Fixed".parse::<Algorithm>().unwrap_err();
    assert_eq!(err.to_string(), "invalid algorithm \"Fixed\"");
    assert!("".parse::<Algorithm>().is_err());
}

#[test]
fn new_validates() {
    let r = rate(10, SEC);
    assert_eq!(Limit::new(Fixed, r, 0), Err(LimitError::ZeroBurst));
    assert_eq!(Limit::new(Gcra, rate(0, SEC), 1), Err(LimitError::ZeroRate(rate(0, SEC))));
    assert!(Limit::new(Gcra, rate(1, 0), 1).is_err());
    let big = rate(1, 86_400_000_000);
    let err = Limit::new(TokenBucket, big, u64::MAX / 1000).unwrap_err();
    assert!(matches!(err, LimitError::Overflow { .. }));
    assert!(err.to_string().contains("overflows"), "{err}");
    assert!(Limit::new(SlidingLog, r, MAX_LOG_BURST).is_ok());
    let err = Limit::new(SlidingLog, r, MAX_LOG_BURST + 1).unwrap_err();
    assert!(err.to_string().contains("sliding_log"), "{err}");
    assert!(Limit::new(Sliding, r, MAX_LOG_BURST + 1).is_ok());
    assert_eq!(LimitError::ZeroBurst.to_string(), "burst must be at least 1");
}

#[test]
fn accessors_window_and_words() {
    let l = std_limit(Sliding);
    assert_eq!((l.algorithm(), l.rate(), l.burst()), (Sliding, rate(10, SEC), B));
    assert_eq!(l.window_us(), W);
    // ceil(2 * 1e6 / 3) and at least 1.
    assert_eq!(Limit::new(Fixed, rate(3, SEC), 2).unwrap().window_us(), 666_667);
    assert_eq!(Limit::new(Fixed, rate(1000, 1), 1).unwrap().window_us(), 1);
    let words: Vec<usize> = Algorithm::ALL.into_iter().map(|a| std_limit(a).state_words()).collect();
    assert_eq!(words, [2, 3, 2 + B as usize, 2, 2, 1]);
}

#[test]
fn first_request_and_all_zero_state_is_fresh() {
    for alg in Algorithm::ALL {
        let l = std_limit(alg);
        for now in [0, 1, T0 + 123, 1 << 50] {
            let s = fresh(&l);
            let o = l.check(&s, now, 0);
            assert_eq!((o.admitted, o.remaining, o.reset_us), (true, B, 0), "{alg}");
            let mut s = fresh(&l);
            let o = l.acquire(&mut s, now, 1);
            assert!(o.admitted, "{alg}");
            assert_eq!(o.remaining, B - 1, "{alg}");
            assert_eq!((o.retry_after_us, o.delay_us), (None, 0), "{alg}");
            assert!(o.reset_us > 0, "{alg}");
        }
    }
}

#[test]
fn exhaust_then_reject_then_honest_refill() {
    for alg in Algorithm::ALL {
        let l = std_limit(alg);
        let mut s = fresh(&l);
        for i in 0..B {
            let o = l.acquire(&mut s, T0, 1);
            assert_eq!((o.admitted, o.remaining), (true, B - 1 - i), "{alg}");
        }
        let before = s.clone();
        let o = l.acquire(&mut s, T0, 1);
        assert!(!o.admitted, "{alg}");
        assert_eq!(s, before, "{alg}: a rejection changes nothing");
        assert_eq!(o.remaining, 0, "{alg}");
        let d = refill_wait(alg);
        assert_eq!(o.retry_after_us, Some(d), "{alg}");
        assert!(!l.check(&s, T0 + d - 1, 1).admitted, "{alg}");
        assert!(l.check(&s, T0 + d, 1).admitted, "{alg}");
        let o = l.acquire(&mut s, T0 + d, 1);
        assert!(o.admitted, "{alg}");
    }
}

#[test]
fn reset_is_time_to_full_capacity() {
    for alg in Algorithm::ALL {
        let l = std_limit(alg);
        let mut s = fresh(&l);
        take(&l, &mut s, T0 + 10, 2);
        let o = l.check(&s, T0 + 10, 0);
        let expected = match alg {
            Fixed => W - 10,
            Sliding => 2 * W - 10,
            SlidingLog => W,
            TokenBucket | LeakyBucket | Gcra => 2 * T,
            Concurrent => unreachable!("the rate algorithms only"),
        };
        assert_eq!(o.reset_us, expected, "{alg}");
        assert_eq!(o.remaining, B - 2, "{alg}");
        let at = T0 + 10 + expected;
        assert!(l.check(&s, at - 1, 0).remaining < B, "{alg}");
        assert_eq!(l.check(&s, at, 0).remaining, B, "{alg}");
        assert_eq!(l.check(&s, at, 0).reset_us, 0, "{alg}");
    }
}

#[test]
fn fixed_window_boundary_allows_two_bursts() {
    let l = std_limit(Fixed);
    let mut s = fresh(&l);
    take(&l, &mut s, T0 + W - 1, B);
    assert!(!l.acquire(&mut s, T0 + W - 1, 1).admitted);
    take(&l, &mut s, T0 + W, B);
    assert!(!l.acquire(&mut s, T0 + W, 1).admitted);
}

#[test]
fn sliding_weighs_the_previous_window() {
    let l = std_limit(Sliding);
    let mut s = fresh(&l);
    take(&l, &mut s, T0 + W - 1, B);
    // At the next window's start the previous 5 still weigh 5·(W−0)/W = 5.
    let o = l.acquire(&mut s, T0 + W, 1);
    assert!(!o.admitted);
    // 5·(W−e)/W + 1 ≤ 5  ⇔  e ≥ W/5.
    assert_eq!(o.retry_after_us, Some(W / 5));
    // Halfway: 5·½ = 2.5 → 2 requests fit.
    let o = l.check(&s, T0 + W + W / 2, 0);
    assert_eq!(o.remaining, 2);
    take(&l, &mut s, T0 + W + W / 2, 2);
    assert!(!l.acquire(&mut s, T0 + W + W / 2, 1).admitted);
}

#[test]
fn sliding_retry_two_windows_later() {
    // burst 1: curr = 1 weighs fully during the whole next window.
    let l = Limit::new(Sliding, rate(10, SEC), 1).unwrap();
    let w = l.window_us();
    let mut s = fresh(&l);
    take(&l, &mut s, T0, 1);
    let o = l.acquire(&mut s, T0, 1);
    assert_eq!(o.retry_after_us, Some(2 * w));
    assert!(!l.check(&s, T0 + 2 * w - 1, 1).admitted);
    assert!(l.check(&s, T0 + 2 * w, 1).admitted);
}

#[test]
fn sliding_log_is_exact() {
    let l = std_limit(SlidingLog);
    let mut s = fresh(&l);
    for k in 0..B {
        take(&l, &mut s, T0 + k * 1000, 1);
    }
    let o = l.acquire(&mut s, T0 + 10_000, 2);
    assert!(!o.admitted);
    // The two oldest (T0, T0 + 1000) must expire.
    assert_eq!(o.retry_after_us, Some(T0 + 1000 + W - (T0 + 10_000)));
    assert!(!l.check(&s, T0 + W, 2).admitted);
    assert!(l.check(&s, T0 + W, 1).admitted);
    assert!(l.check(&s, T0 + 1000 + W, 2).admitted);
    // Ring wrap-around over many windows.
    for k in 1..20 {
        take(&l, &mut s, T0 + k * W + 5000, B);
        assert!(!l.acquire(&mut s, T0 + k * W + 5000, 1).admitted);
    }
}

#[test]
fn no_delay_without_a_queue() {
    // (leaky_bucket no longer reports a shaping delay for the second
    // request of a burst: delays are for queue=N only.)
    for alg in Algorithm::ALL {
        let l = std_limit(alg);
        let mut s = fresh(&l);
        for _ in 0..B + 1 {
            assert_eq!(l.acquire(&mut s, T0, 1).delay_us, 0, "{alg}");
        }
    }
}

#[test]
fn gcra_rounds_the_interval_up() {
    // 3r/s: T = ceil(1e6 / 3) = 333_334, never faster than configured.
    let l = Limit::new(Gcra, rate(3, SEC), 1).unwrap();
    let mut s = fresh(&l);
    take(&l, &mut s, T0, 1);
    let o = l.acquire(&mut s, T0, 1);
    assert_eq!(o.retry_after_us, Some(333_334));
    assert!(!l.check(&s, T0 + 333_333, 1).admitted);
    assert!(l.check(&s, T0 + 333_334, 1).admitted);
}

#[test]
fn clock_going_backwards_never_panics_nor_over_admits() {
    for alg in Algorithm::ALL {
        let l = std_limit(alg);
        let mut s = fresh(&l);
        take(&l, &mut s, T0, B);
        for back in [T0 - 1, T0 - W / 2, T0 - W, T0 - 3 * W, 1, 0] {
            let o = l.acquire(&mut s, back, 1);
            assert!(!o.admitted, "{alg} at {back}");
            let d = o.retry_after_us.unwrap();
            assert!(back + d >= T0 + refill_wait(alg), "{alg} at {back}");
            assert!(l.check(&s, back + d, 1).admitted, "{alg} at {back}");
            assert!(!l.check(&s, back + d - 1, 1).admitted, "{alg} at {back}");
        }
        // Forward again: exactly the normal refill.
        let d = refill_wait(alg);
        assert!(!l.check(&s, T0 + d - 1, 1).admitted, "{alg}");
        assert!(l.check(&s, T0 + d, 1).admitted, "{alg}");
    }
}

#[test]
fn clock_backwards_after_partial_use_keeps_the_count() {
    for alg in Algorithm::ALL {
        let l = std_limit(alg);
        let mut s = fresh(&l);
        take(&l, &mut s, T0 + 2 * W, 3);
        // An earlier worker clock may still use what is left, not more.
        let back = T0 + W + 1;
        let left = l.check(&s, back, 0).remaining;
        assert!(left <= B - 3, "{alg}");
        take(&l, &mut s, back, left);
        assert!(!l.acquire(&mut s, back, 1).admitted, "{alg}");
        let now = l.check(&s, T0 + 2 * W, 0).remaining;
        assert_eq!(now, B - 3 - left, "{alg}");
    }
}

#[test]
fn cost_larger_than_burst_never_passes() {
    for alg in Algorithm::ALL {
        let l = std_limit(alg);
        for cost in [B + 1, 1000, u64::MAX] {
            let mut s = fresh(&l);
            let o = l.acquire(&mut s, T0, cost);
            assert!(!o.admitted, "{alg}");
            assert_eq!(o.retry_after_us, None, "{alg}");
            assert_eq!((o.remaining, o.reset_us), (B, 0), "{alg}");
            assert_eq!(s, fresh(&l), "{alg}");
        }
    }
}

#[test]
fn cost_above_one_consumes_that_many() {
    for alg in Algorithm::ALL {
        let l = std_limit(alg);
        let mut s = fresh(&l);
        let o = l.acquire(&mut s, T0, 3);
        assert_eq!((o.admitted, o.remaining), (true, B - 3), "{alg}");
        let o = l.acquire(&mut s, T0, 3);
        assert!(!o.admitted, "{alg}");
        assert!(o.retry_after_us.is_some(), "{alg}");
        let o = l.acquire(&mut s, T0, 2);
        assert_eq!((o.admitted, o.remaining), (true, 0), "{alg}");
        let o = l.acquire(&mut s, T0, B);
        assert!(!o.admitted, "{alg}");
    }
}

#[test]
fn cost_zero_is_free_even_when_exhausted() {
    for alg in Algorithm::ALL {
        let l = std_limit(alg);
        let mut s = fresh(&l);
        take(&l, &mut s, T0, B);
        let before = s.clone();
        let o = l.acquire(&mut s, T0, 0);
        assert_eq!((o.admitted, o.remaining, o.retry_after_us), (true, 0, None), "{alg}");
        assert_eq!(s, before, "{alg}");
    }
}

#[test]
fn commit_after_rejection_is_a_no_op() {
    for alg in Algorithm::ALL {
        let l = std_limit(alg);
        let mut s = fresh(&l);
        take(&l, &mut s, T0, B);
        let before = s.clone();
        l.commit(&mut s, T0, 1);
        l.commit(&mut s, T0, u64::MAX);
        assert_eq!(s, before, "{alg}");
    }
}

#[test]
fn short_state_is_rejected_without_panic() {
    for alg in Algorithm::ALL {
        let l = std_limit(alg);
        let mut s = vec![0; l.state_words() - 1];
        assert_eq!(l.acquire(&mut s, T0, 1), Outcome::default(), "{alg}");
        l.commit(&mut s, T0, 1);
        assert!(s.iter().all(|w| *w == 0), "{alg}");
    }
}

#[test]
fn extreme_values_do_not_panic() {
    let rates = [rate(1, 1), rate(u64::MAX, 1), rate(1, u64::MAX), rate(7, SEC)];
    for alg in Algorithm::ALL {
        for r in rates {
            for burst in [1, 2, 64, u64::MAX] {
                let Ok(l) = Limit::new(alg, r, burst) else {
                    continue;
                };
                for fill in [0, 1, u64::MAX / 2, u64::MAX] {
                    let mut s = vec![fill; l.state_words()];
                    for now in [0, 1, u64::MAX / 2, u64::MAX - 1, u64::MAX] {
                        for cost in [0, 1, burst, u64::MAX] {
                            let o = l.acquire(&mut s, now, cost);
                            assert!(o.remaining <= burst);
                        }
                    }
                }
            }
        }
    }
}

/// The module initialises a request's results by zeroing their memory: a
/// result not evaluated holds `Charge::NONE`, nothing to refund.
#[test]
fn charge_none_is_zeroed_memory() {
    // SAFETY: a Charge is integers, for which all-zero bytes are a value.
    let zeroed: Charge = unsafe { core::mem::zeroed() };
    assert_eq!(zeroed, Charge::NONE);
}
