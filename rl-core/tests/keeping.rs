//! A rate line's class reserves (`classes=...:reserve=`): a request that
//! must leave `kept` units passes only where `cost + kept` would, is charged
//! `cost` alone, and once it passes the `kept` units are still there.

use proptest::prelude::*;
use proptest::sample::select;
use rl_core::limit::{Algorithm, Decision, Limit};
use rl_core::parse::Rate;

fn limit() -> impl Strategy<Value = Limit> {
    (select(Algorithm::ALL.to_vec()), 1u64..20, prop_oneof![Just(1_000_000u64), Just(60_000_000u64)], 1u64..20)
        .prop_map(|(a, count, period_us, burst)| Limit::new(a, Rate { count, period_us }, burst).unwrap())
}

proptest! {
    #[test]
    fn keeping_is_acquiring_with_a_margin(
        l in limit(),
        ops in prop::collection::vec((0u64..400_000, 0u64..4, 0u64..8), 1..60),
    ) {
        let mut with = vec![0u64; l.state_words()];
        let mut now = 1_000_000u64;
        for (dt, cost, kept) in ops {
            now += dt;
            let before = with.clone();
            // (a cost of 0 spends nothing: it passes as on any line)
            let wide = l.check(&with, now, if cost == 0 { 0 } else { cost + kept });
            let mut d = Decision::REJECTED;
            l.acquire_keeping(&mut with, now, cost, kept, &mut d);
            prop_assert_eq!(d.outcome.admitted, wide.admitted);
            // The check says what the acquire does.
            let checked = l.check_keeping(&before, now, cost, kept);
            prop_assert_eq!(checked.admitted, d.outcome.admitted);
            prop_assert_eq!(checked.remaining, d.outcome.remaining);
            prop_assert_eq!(checked.reset_us, d.outcome.reset_us);
            if d.outcome.admitted {
                // Charged cost alone: the state is what a plain acquire of cost makes.
                let mut plain = before.clone();
                let mut p = Decision::REJECTED;
                l.acquire_into(&mut plain, now, cost, &mut p);
                prop_assert!(p.outcome.admitted);
                prop_assert_eq!(&plain, &with);
                prop_assert_eq!(d.outcome.remaining, p.outcome.remaining.saturating_sub(kept));
                // The kept units are left for the classes above.
                prop_assert!(cost == 0 || l.check(&with, now, kept).admitted, "the reserve was taken");
            } else {
                prop_assert_eq!(&before, &with, "a refusal charges nothing");
                prop_assert_eq!(d.outcome.retry_after_us, wide.retry_after_us);
            }
        }
    }
}
