//! The offset between Redis' clock and the local one
//! (`rl_core::redis::clock::Offset`): sound (a local time on Redis' clock
//! is never later than the truth while Redis' clock does not step back),
//! tight (as good as the best call seen), and quick to recover from a step
//! of Redis' clock either way.

use proptest::prelude::*;
use rl_core::redis::clock::Offset;

/// About now as Redis' `TIME` in µs.
const REDIS_NOW: u64 = 1_700_000_000_000_000;

/// One call as the caller sees it: sent at local `sent`, run by Redis at
/// local `run` (`redis` on its clock), its reply received at local `received`.
#[derive(Clone, Copy, Debug)]
struct Seen {
    sent: u64,
    run: u64,
    received: u64,
    redis: u64,
}

/// Calls one after another from local time `start`, each `(gap, to_redis,
/// back)`: sent `gap` after the previous one was, run `to_redis` later,
/// received `back` after that; Redis' clock is local time + `theta(i)`.
fn calls(start: u64, steps: &[(u32, u32, u32)], theta: impl Fn(usize) -> i64) -> Vec<Seen> {
    let mut sent = start;
    steps
        .iter()
        .enumerate()
        .map(|(i, &(gap, to_redis, back))| {
            sent += u64::from(gap);
            let run = sent + u64::from(to_redis);
            let received = run + u64::from(back);
            let redis = (run as i64 + theta(i)) as u64;
            Seen { sent, run, received, redis }
        })
        .collect()
}

fn learn(o: &mut Offset, c: &Seen) {
    o.learn(c.sent, c.received, c.redis);
}

/// Delays as a busy network and a paused Redis make them: mostly tens of
/// µs, sometimes up to a second.
fn delay() -> impl Strategy<Value = u32> {
    prop_oneof![4 => 0u32..200, 1 => 0u32..1_000_000]
}

fn steps(n: usize) -> impl Strategy<Value = Vec<(u32, u32, u32)>> {
    prop::collection::vec((0u32..2_000_000, delay(), delay()), 1..n)
}

#[test]
fn unknown_until_the_first_reply() {
    let mut o = Offset::default();
    assert_eq!(o.redis_time(5), None);
    // Sent at 1,000, received at 1,300, run at Redis' 1,700,000,000,000,000.
    o.learn(1_000, 1_300, REDIS_NOW);
    assert_eq!(o.lower_bound(), Some(REDIS_NOW as i64 - 1_300));
    assert_eq!(o.redis_time(1_300), Some(REDIS_NOW));
    assert_eq!(o.redis_time(2_300), Some(REDIS_NOW + 1_000));
    // A reply before its call (no monotonic clock does that) is ignored.
    o.learn(2_000, 1_999, REDIS_NOW + 10_000);
    assert_eq!(o.redis_time(1_300), Some(REDIS_NOW));
}

#[test]
fn keeps_the_tightest_bound() {
    let mut o = Offset::default();
    // True offset: REDIS_NOW. A slow call, then a quick one, then slow again.
    o.learn(0, 50_000, REDIS_NOW + 10);
    assert_eq!(o.redis_time(0), Some(REDIS_NOW + 10 - 50_000));
    o.learn(100_000, 100_040, REDIS_NOW + 100_030);
    assert_eq!(o.redis_time(0), Some(REDIS_NOW - 10));
    o.learn(200_000, 230_000, REDIS_NOW + 200_001);
    assert_eq!(o.redis_time(0), Some(REDIS_NOW - 10));
}

#[test]
fn follows_steps_of_redis_clock() {
    let mut o = Offset::default();
    o.learn(0, 100, REDIS_NOW + 50);
    assert_eq!(o.redis_time(0), Some(REDIS_NOW - 50));
    // Redis' clock steps 1 s forward: the next reply raises the bound.
    o.learn(1_000, 1_100, REDIS_NOW + 1_000_000 + 1_050);
    assert_eq!(o.redis_time(0), Some(REDIS_NOW + 1_000_000 - 50));
    // Then 2 s back: the next reply shows it (Redis ran the call before
    // the old bound says it was even sent), and the bound starts again
    // from it.
    o.learn(2_000, 2_100, REDIS_NOW - 1_000_000 + 2_050);
    assert_eq!(o.redis_time(0), Some(REDIS_NOW - 1_000_000 - 50));
    // A step back smaller than the call's way there is not seen: the bound
    // is then late by at most that way (here 10 µs of a 30 µs way there).
    o.learn(3_000, 3_100, REDIS_NOW - 1_000_000 - 10 + 3_030);
    assert_eq!(o.redis_time(0), Some(REDIS_NOW - 1_000_000 - 50));
}

#[test]
fn extreme_values_do_not_panic() {
    let mut o = Offset::default();
    o.learn(u64::MAX, u64::MAX, 0);
    assert_eq!(o.redis_time(0), None);
    // (the offset saturates at -2^63 µs)
    assert_eq!(o.redis_time(u64::MAX), Some(i64::MAX as u64));
    let mut o = Offset::default();
    o.learn(0, 0, u64::MAX);
    assert_eq!(o.redis_time(1), Some(1 << 63));
    o.learn(0, 0, 0);
    assert_eq!(o.redis_time(7), Some(7));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    /// While Redis' clock only steps forward (or not at all), a local time
    /// on Redis' clock is never later than the truth, at any moment: a
    /// deadline computed with it is never late.
    #[test]
    fn prop_sound_while_the_offset_does_not_shrink(
        start in 0u64..1 << 40,
        steps in steps(40),
        jumps in prop::collection::vec((any::<bool>(), 0i64..5_000_000), 40),
        base in 0i64..1 << 52,
    ) {
        let theta = |i: usize| base + jumps[..=i].iter().filter(|j| j.0).map(|j| j.1).sum::<i64>();
        let seen = calls(start, &steps, theta);
        let mut o = Offset::default();
        for (i, c) in seen.iter().enumerate() {
            learn(&mut o, c);
            for t in [c.sent, c.received, c.received + 1_000_000] {
                let r = o.redis_time(t).unwrap();
                prop_assert!(r as i128 <= t as i128 + theta(i) as i128, "call {}: {:?}", i, c);
            }
        }
    }

    /// With a fixed offset, the bound is the best call's: the largest
    /// `redis − received` seen.
    #[test]
    fn prop_tight(start in 0u64..1 << 40, steps in steps(40), theta in 0i64..1 << 52) {
        let seen = calls(start, &steps, |_| theta);
        let mut o = Offset::default();
        let mut best = i64::MIN;
        for c in &seen {
            learn(&mut o, c);
            best = best.max(c.redis as i64 - c.received as i64);
            prop_assert_eq!(o.lower_bound(), Some(best));
            prop_assert!(best <= theta);
        }
    }

    /// Whatever Redis' clock does, right after a reply the bound is late
    /// by no more than that call's way there (from sent to run), and never
    /// looser than the call itself tells.
    #[test]
    fn prop_recovers_from_any_step(
        start in 0u64..1 << 40,
        steps in steps(40),
        jumps in prop::collection::vec(-5_000_000i64..5_000_000, 40),
        base in 1i64 << 40..1 << 52,
    ) {
        let theta = |i: usize| base + jumps[..=i].iter().sum::<i64>();
        let seen = calls(start, &steps, theta);
        let mut o = Offset::default();
        for (i, c) in seen.iter().enumerate() {
            learn(&mut o, c);
            let l = o.lower_bound().unwrap();
            prop_assert!(l <= theta(i) + (c.run - c.sent) as i64, "call {}: {:?}, bound {}", i, c, l);
            prop_assert!(l >= c.redis as i64 - c.received as i64);
        }
    }
}
