//! What a line's outcome in the script's reply can be: every value the
//! algorithm can produce for that limit and cost, and nothing else, so that
//! a reply the script cannot have sent (a broken server, a proxy, another
//! program on the keys' server) is a script error, not a verdict with
//! `Retry-After: 9223372036855`.
//!
//! The time values are relative to the script's `now`. With a clock that
//! never steps back, the algorithms' maxima are (`W` = [`Limit::window_us`],
//! `T` = ⌈period / count⌉, `B` the burst, `c` the cost, `p`/`n` the period
//! and count):
//!
//! | algorithm                       | reset          | retry-after         | delay       |
//! |---------------------------------|----------------|---------------------|-------------|
//! | `fixed`, `sliding_log`          | `W`            | `W`                 | 0           |
//! | `sliding`                       | `2W`           | `W + ⌈c·W/B⌉`       | 0           |
//! | `token_bucket`, `leaky_bucket`  | `⌈(B+D)·p/n⌉`  | `⌈(D−Q+c)·p/n⌉`     | `⌈Q·p/n⌉`   |
//! | `gcra`                          | `(B+D)·T`      | `(D−Q+c)·T`         | `Q·T`       |
//!
//! where `Q` is the line's queue and `D` the largest queue of the lines
//! that share its state (queued units stay in the state for all of them).
//! Each is reached. A state written before the Redis clock stepped back
//! (a failover to a server whose clock is behind) lies in the future of
//! `now`, and every value grows by that step: the bounds allow a step of
//! [`CLOCK_STEP_US`], as much as a key's TTL margin allows for
//! ([`super::TTL_MARGIN_MS`]). A retry-after is at least 1 µs, and there is
//! none for a request that can never pass (cost above the burst). What
//! remains is at most the burst (an admitted line that is not charged
//! reports what its state has left, up to the burst), and the wait for one
//! more unit ([`Outcome::next_us`]) is at most the reset.
//!
//! A state that may hold an overdraft (`charge=after`, see
//! [`crate::limit::Limit::overdraw`]) has no such bound for the buckets and
//! `gcra` but the script's exact range, and `sliding`'s retry-after then
//! reaches `2W`: its lines are checked with `deepest` = [`OVERDRAWN`].
//!
//! A varying line's ([`Limit::varying`]) bucket or `gcra` state holds what
//! requests under any rate and burst charged, carried over to its own: its
//! reset and retry-after are bounded only by the script's exact range,
//! [`super::MAX_EXACT`] (the script rejects a conversion beyond it); a
//! varying `sliding` line's count may exceed its burst (written under a
//! larger one), and its retry-after then reaches `2W`, as an overdraft's.

use core::fmt;

use super::{MAX_EXACT, TTL_MARGIN_MS};
use crate::limit::{Algorithm, Limit, Outcome};

/// As the `deepest` queue of [`check_line`] and the maxima: the line's state
/// may hold an overdraft (a `charge=after` line charges it): the buckets
/// and `gcra` then have no bound below the script's exact range, and
/// `sliding`'s retry-after reaches `2W` for any cost.
pub const OVERDRAWN: u64 = u64::MAX;

/// How far the Redis clock may have stepped back since a state was written
/// for a reply to be in range: the TTL margin.
pub const CLOCK_STEP_US: u64 = TTL_MARGIN_MS * 1000;

/// A line's outcome outside what its limit can produce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutOfRange {
    /// More remaining than the line allows (the burst).
    Remaining { got: u64, max: u64 },
    /// A wait for one more unit later than the line is full again.
    Next { got: u64, reset: u64 },
    /// A reset later than the algorithm can reach.
    Reset { got: u64, max: u64 },
    /// A retry-after of 0, beyond the algorithm's reach, or for a request
    /// that is never rejected with one (`max` = `None`).
    RetryAfter { got: u64, max: Option<u64> },
    /// A request admitted with a cost above the burst.
    Admitted { cost: u64, burst: u64 },
    /// A delay beyond the line's queue.
    Delay { got: u64, max: u64 },
}

impl fmt::Display for OutOfRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            OutOfRange::Remaining { got, max } => write!(f, "remaining {got} above {max}"),
            OutOfRange::Next { got, reset } => write!(f, "next unit in {got} us after the reset in {reset} us"),
            OutOfRange::Reset { got, max } => write!(f, "reset {got} us above {max} us"),
            OutOfRange::RetryAfter { got, max: Some(max) } => {
                write!(f, "retry-after {got} us outside 1..={max} us")
            }
            OutOfRange::RetryAfter { got, max: None } => {
                write!(f, "retry-after {got} us for a request that is never told one")
            }
            OutOfRange::Admitted { cost, burst } => write!(f, "admitted a cost of {cost} above the burst {burst}"),
            OutOfRange::Delay { got, max } => write!(f, "delay {got} us above {max} us"),
        }
    }
}

impl std::error::Error for OutOfRange {}

/// `T` = ⌈period / count⌉, GCRA's emission interval.
fn interval(limit: &Limit) -> u64 {
    let rate = limit.rate();
    rate.period_us.div_ceil(rate.count.max(1))
}

fn sat(x: u128) -> u64 {
    u64::try_from(x).unwrap_or(u64::MAX)
}

/// `units` requests' worth of time at the rate: `⌈units·p/n⌉` for the
/// buckets, `units·T` for `gcra`.
fn at_rate(limit: &Limit, units: u64) -> u64 {
    let rate = limit.rate();
    match limit.algorithm() {
        Algorithm::Gcra => sat(u128::from(units) * u128::from(interval(limit))),
        _ => sat((u128::from(units) * u128::from(rate.period_us)).div_ceil(u128::from(rate.count.max(1)))),
    }
}

/// The bound on a varying bucket or `gcra` line's times, if `limit` is one:
/// its state may hold any other rate's and burst's charges.
fn carried(limit: &Limit) -> Option<u64> {
    let held = matches!(limit.algorithm(), Algorithm::TokenBucket | Algorithm::LeakyBucket | Algorithm::Gcra);
    (limit.is_varying() && held).then_some(MAX_EXACT.saturating_add(CLOCK_STEP_US))
}

/// The latest reset (µs from the script's `now`) a line on `limit` can
/// report, its state shared with lines whose largest queue is `deepest`:
/// see the module docs.
pub fn max_reset_us(limit: &Limit, deepest: u64) -> u64 {
    if let Some(max) = carried(limit) {
        return max;
    }
    let w = limit.window_us();
    let held = limit.burst().saturating_add(deepest.max(limit.queue()));
    let reach = match limit.algorithm() {
        Algorithm::Fixed | Algorithm::SlidingLog => w,
        Algorithm::Sliding => w.saturating_mul(2),
        Algorithm::TokenBucket | Algorithm::LeakyBucket | Algorithm::Gcra => at_rate(limit, held),
        // (never on Redis: no time bounds what it holds)
        Algorithm::Concurrent => 0,
    };
    reach.saturating_add(CLOCK_STEP_US)
}

/// The latest retry-after (µs) a rejected request of `cost` on `limit` can
/// be told, its state shared with lines whose largest queue is `deepest`;
/// `None` when it is never rejected with one (a cost of 0 always passes, a
/// cost above the burst never does).
pub fn max_retry_after_us(limit: &Limit, cost: u64, deepest: u64) -> Option<u64> {
    let b = limit.burst();
    if cost == 0 || cost > b {
        return None;
    }
    if let Some(max) = carried(limit) {
        return Some(max);
    }
    let w = limit.window_us();
    let reach = match limit.algorithm() {
        Algorithm::Fixed | Algorithm::SlidingLog => w,
        Algorithm::Sliding if deepest == OVERDRAWN || limit.is_varying() => w.saturating_mul(2),
        Algorithm::Sliding => w.saturating_add(sat((u128::from(cost) * u128::from(w)).div_ceil(u128::from(b)))),
        Algorithm::TokenBucket | Algorithm::LeakyBucket | Algorithm::Gcra => {
            let q = limit.queue();
            at_rate(limit, (deepest.max(q) - q).saturating_add(cost))
        }
        // (never on Redis: no wait is known)
        Algorithm::Concurrent => return None,
    };
    Some(reach.saturating_add(CLOCK_STEP_US))
}

/// The longest delay (µs) a line on `limit` can report: its queue's worth.
pub fn max_delay_us(limit: &Limit) -> u64 {
    match limit.queue() {
        0 => 0,
        q => at_rate(limit, q).saturating_add(CLOCK_STEP_US),
    }
}

/// Whether `line`, the script's outcome for a request of `cost` on `limit`,
/// is one the algorithm can produce (see the module docs), the line's state
/// being shared with lines whose largest queue is `deepest` (the line's own
/// queue, or 0, when none has a larger one).
pub fn check_line(limit: &Limit, cost: u64, line: &Outcome, deepest: u64) -> Result<(), OutOfRange> {
    let b = limit.burst();
    if line.admitted && cost > b {
        return Err(OutOfRange::Admitted { cost, burst: b });
    }
    if line.remaining > b {
        return Err(OutOfRange::Remaining { got: line.remaining, max: b });
    }
    // (a concurrent line's request waiting in the key's line: its ticket as
    // the reset, the places ahead of it as the delay; nginx that share the
    // key may give the line other queues, so no queue bounds them)
    if limit.algorithm() == Algorithm::Concurrent && !line.admitted && line.reset_us > 0 {
        if line.reset_us > MAX_EXACT {
            return Err(OutOfRange::Reset { got: line.reset_us, max: MAX_EXACT });
        }
        if line.delay_us > MAX_EXACT {
            return Err(OutOfRange::Delay { got: line.delay_us, max: MAX_EXACT });
        }
        return Ok(());
    }
    // (a concurrent line's fifth value is not a wait but the units it
    // reclaimed from holders gone: see the script's `concurrent`)
    if line.next_us > line.reset_us && limit.algorithm() != Algorithm::Concurrent {
        return Err(OutOfRange::Next { got: line.next_us, reset: line.reset_us });
    }
    let max = max_reset_us(limit, deepest);
    if line.reset_us > max {
        return Err(OutOfRange::Reset { got: line.reset_us, max });
    }
    let max = max_delay_us(limit);
    if line.delay_us > max || (line.delay_us > 0 && !line.admitted) {
        return Err(OutOfRange::Delay { got: line.delay_us, max });
    }
    if let Some(got) = line.retry_after_us {
        let max = max_retry_after_us(limit, cost, deepest);
        if got == 0 || max.is_none_or(|m| got > m) {
            return Err(OutOfRange::RetryAfter { got, max });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::Rate;

    /// 3 per 10 s, burst 5: W = 16,666,667 µs, T = 3,333,334 µs.
    fn limit(alg: Algorithm) -> Limit {
        Limit::new(alg, Rate { count: 3, period_us: 10_000_000 }, 5).unwrap()
    }

    const D: u64 = CLOCK_STEP_US;

    /// A full state written at `now + D` (the clock has since stepped back
    /// by `D`), at the start of a window: every value at its maximum.
    fn extreme(l: &Limit, now: u64) -> Vec<u64> {
        let (w, b, t) = (l.window_us(), l.burst(), now + D);
        let cap = b * l.rate().period_us;
        match l.algorithm() {
            Algorithm::Fixed => vec![t / w + 1, b],
            Algorithm::Sliding => vec![t / w + 1, b, 0],
            Algorithm::SlidingLog => [vec![0, b], vec![t; b as usize]].concat(),
            Algorithm::TokenBucket | Algorithm::LeakyBucket => vec![cap, t],
            Algorithm::Gcra => vec![t + b * interval(l)],
            Algorithm::Concurrent => vec![b],
        }
    }

    #[test]
    fn maxima_are_reached_and_no_more_passes() {
        for alg in Algorithm::ALL {
            let l = limit(alg);
            // `now + D` is the start of a window.
            let now = 1000 * l.window_us() - D;
            let s = extreme(&l, now);
            for cost in 1..=l.burst() {
                let o = l.check(&s, now, cost);
                assert!(!o.admitted, "{alg}");
                assert_eq!(o.reset_us, max_reset_us(&l, 0), "{alg} reset");
                assert_eq!(o.retry_after_us, max_retry_after_us(&l, cost, 0), "{alg} cost {cost}");
                let line = o;
                assert_eq!(check_line(&l, cost, &line, 0), Ok(()), "{alg}");
                let late = Outcome { reset_us: line.reset_us + 1, ..line };
                assert!(matches!(check_line(&l, cost, &late, 0), Err(OutOfRange::Reset { .. })), "{alg}");
                let retry = line.retry_after_us.map(|r| r + 1);
                let later = Outcome { retry_after_us: retry, ..line };
                assert!(matches!(check_line(&l, cost, &later, 0), Err(OutOfRange::RetryAfter { .. })), "{alg}");
            }
        }
    }

    #[test]
    fn the_maxima_without_a_clock_step() {
        let l = |alg| limit(alg);
        let (w, t) = (16_666_667, 3_333_334);
        assert_eq!(max_reset_us(&l(Algorithm::Fixed), 0), w + D);
        assert_eq!(max_reset_us(&l(Algorithm::SlidingLog), 0), w + D);
        assert_eq!(max_reset_us(&l(Algorithm::TokenBucket), 0), w + D);
        assert_eq!(max_reset_us(&l(Algorithm::Sliding), 0), 2 * w + D);
        assert_eq!(max_reset_us(&l(Algorithm::Gcra), 0), 5 * t + D);
        // Retry-after for a cost of 2: W; W + ⌈2W/5⌉; ⌈2·10 s/3⌉; 2T.
        assert_eq!(max_retry_after_us(&l(Algorithm::Fixed), 2, 0), Some(w + D));
        assert_eq!(max_retry_after_us(&l(Algorithm::Sliding), 2, 0), Some(w + 6_666_667 + D));
        assert_eq!(max_retry_after_us(&l(Algorithm::LeakyBucket), 2, 0), Some(6_666_667 + D));
        assert_eq!(max_retry_after_us(&l(Algorithm::Gcra), 2, 0), Some(2 * t + D));
        // None for a cost that always passes or never does.
        assert_eq!(max_retry_after_us(&l(Algorithm::Gcra), 0, 0), None);
        assert_eq!(max_retry_after_us(&l(Algorithm::Gcra), 6, 0), None);
    }

    #[test]
    fn remaining_and_retry_after_bounds() {
        let l = limit(Algorithm::Fixed);
        let line = |admitted, remaining, retry_after_us| Outcome {
            admitted,
            remaining,
            reset_us: 0,
            retry_after_us,
            delay_us: 0,
            next_us: 0,
        };
        // Admitted: at most the burst remains (all of it for a line that was not charged).
        assert_eq!(check_line(&l, 2, &line(true, 5, None), 0), Ok(()));
        assert_eq!(check_line(&l, 2, &line(true, 6, None), 0), Err(OutOfRange::Remaining { got: 6, max: 5 }));
        // The next unit comes no later than the reset.
        let next = |next_us| Outcome { reset_us: 10, next_us, ..line(true, 3, None) };
        assert_eq!(check_line(&l, 1, &next(10), 0), Ok(()));
        assert_eq!(check_line(&l, 1, &next(11), 0), Err(OutOfRange::Next { got: 11, reset: 10 }));
        assert_eq!(check_line(&l, 0, &line(true, 5, None), 0), Ok(()));
        assert_eq!(check_line(&l, 6, &line(true, 0, None), 0), Err(OutOfRange::Admitted { cost: 6, burst: 5 }));
        // Rejected: at most the burst; a retry-after of at least 1 µs, none
        // for a cost that can never pass.
        assert_eq!(check_line(&l, 2, &line(false, 5, Some(1)), 0), Ok(()));
        assert_eq!(check_line(&l, 2, &line(false, 6, Some(1)), 0), Err(OutOfRange::Remaining { got: 6, max: 5 }));
        assert!(matches!(check_line(&l, 2, &line(false, 0, Some(0)), 0), Err(OutOfRange::RetryAfter { got: 0, .. })));
        assert_eq!(check_line(&l, 6, &line(false, 0, None), 0), Ok(()));
        assert_eq!(check_line(&l, 6, &line(false, 0, Some(9)), 0), Err(OutOfRange::RetryAfter { got: 9, max: None }));
        // The reply.
        let huge = Outcome { remaining: i64::MAX as u64, ..Outcome::default() };
        assert_eq!(
            check_line(&l, 1, &huge, 0).map_err(|e| e.to_string()),
            Err("remaining 9223372036854775807 above 5".to_string())
        );
    }
}
