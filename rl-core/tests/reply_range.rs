//! Every outcome the model produces is in the range `check_line` accepts
//! for its line, also when the clock steps back by up to the allowance
//! (`CLOCK_STEP_US`): a reply range check can never turn a verdict the
//! script gives into a script error. (The script itself is held to the same
//! check at every step of the differential tests, `tests/redis_script`.)

use proptest::prelude::*;
use proptest::sample::select;
use rl_core::limit::{Algorithm, Limit, Outcome};
use rl_core::parse::Rate;
use rl_core::redis::{check_line, CLOCK_STEP_US};

/// A raw step: (time selector, fraction, cost selector).
type Raw = (u8, u16, u8);

/// `w · permille / 1000`.
fn frac(w: u64, permille: u16) -> u64 {
    (u128::from(w) * u128::from(permille) / 1000) as u64
}

/// Limits of every algorithm: small rates and bursts, periods that may not
/// divide, and some large ones.
fn limits() -> impl Strategy<Value = Limit> {
    let period = prop_oneof![1u64..=40, 1_000u64..=2_000_000, Just(60_000_000u64), Just(86_400_000_000u64)];
    let burst = prop_oneof![1u64..=10, 1u64..=5_000];
    (select(Algorithm::ALL.to_vec()), 1u64..=1_000, period, burst).prop_filter_map("invalid", |(a, count, p, b)| {
        let b = if a == Algorithm::SlidingLog { b.min(200) } else { b };
        Limit::new(a, Rate { count, period_us: p }, b).ok().map(|l| l.with_queue(b % 7).unwrap_or(l))
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Random requests (costs 0 to burst + 1), the clock moving on by
    /// steps of up to 4 windows and, for some requests, stepped back by up
    /// to the allowance: every `check` and `acquire` outcome passes.
    #[test]
    fn model_outcomes_are_in_range(
        l in limits(),
        ops in prop::collection::vec(any::<Raw>(), 1..100),
        start in prop_oneof![0u64..5_000_000, (1u64 << 40)..(1u64 << 40) + 100_000_000],
    ) {
        let (w, b) = (l.window_us(), l.burst());
        let (mut t, mut s, mut prev) = (start, vec![0; l.state_words()], Outcome::default());
        for (sel, f, c) in ops {
            t += match sel % 8 {
                0..=2 => 0,
                3 => 1 + u64::from(f % 3),
                4 => prev.retry_after_us.unwrap_or(0),
                5 => prev.reset_us,
                _ => frac(w, f % 4000),
            };
            let now = match sel >> 6 {
                0 => t.saturating_sub(frac(w, f % 2000).min(CLOCK_STEP_US)),
                1 => t.saturating_sub(CLOCK_STEP_US),
                _ => t,
            };
            let cost = match c % 10 {
                0 => 0,
                7 => 1 + u64::from(f) % b,
                8 => b,
                9 => b + 1,
                _ => 1,
            };
            let checked = l.check(&s, now, cost);
            prop_assert_eq!(check_line(&l, cost, &checked, l.queue()), Ok(()), "check {:?} now={} cost={}", l, now, cost);
            prev = l.acquire(&mut s, now, cost);
            prop_assert_eq!(check_line(&l, cost, &prev, l.queue()), Ok(()), "acquire {:?} now={} cost={}", l, now, cost);
        }
    }
}
