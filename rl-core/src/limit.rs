//! The rate-limiting algorithms as pure state transitions over integer time.
//!
//! A [`Limit`] is the immutable configuration (algorithm, rate, burst); the
//! per-key state is a caller-owned slice of [`Limit::state_words`] `u64`s in
//! which all zeroes means "fresh key, full capacity". Time `now` is passed in
//! as monotonic microseconds. Clocks may step backwards a little (e.g. two
//! nginx workers): every algorithm then stays at least as strict as at the
//! latest time it has seen, and nothing ever panics — arithmetic is
//! saturating, products are taken in `u128`, there is no floating point.
//! Times above [`MAX_NOW`] are clamped to it.
//!
//! With rate = `count` per `period_us` and burst `B`:
//!
//! | algorithm      | guarantee                                                                    | state words |
//! |----------------|------------------------------------------------------------------------------|-------------|
//! | `fixed`        | ≤ B per aligned window of `W` (2B across a boundary)                         | 2           |
//! | `sliding`      | ≤ B per aligned window, ≤ 2B − 1 in any interval `W`; retry ≤ W + ⌈cost·W/B⌉ | 3           |
//! | `sliding_log`  | exactly ≤ B in any interval of length `W`                                    | 2 + B       |
//! | `token_bucket` | ≤ B + Q + rate·t over any time span t                                        | 2           |
//! | `leaky_bucket` | same as token bucket, viewed as a draining meter                             | 2           |
//! | `gcra`         | same, emission interval rounded up to whole µs                               | 1           |
//!
//! where `W` = [`Limit::window_us`] = ⌈B · period_us / count⌉ and `Q` the
//! queue ([`Limit::with_queue`], 0 by default).
//!
//! # Delaying (`queue=Q`)
//!
//! `token_bucket`, `leaky_bucket` and `gcra` can delay requests instead of
//! rejecting them. Up to B units pass at once, as without a queue; beyond
//! that a request is admitted *delayed* if it conforms to the rate within at
//! most Q emission intervals (Q / rate), and rejected otherwise. Its
//! [`Outcome::delay_us`] is the exact wait until it conforms: the least `d`
//! such that the same line without a queue would admit it at `now + d` had
//! nothing else been charged. A delayed request is charged at arrival, so
//! the requests after it queue behind it (first come, first served): the
//! state then holds more than B units, up to B + Q.
//!
//! A queued state is read as it is by every line that shares it, whatever
//! its own queue: a line with a smaller queue (or none) sees the units
//! queued beyond its own B + Q and rejects (or delays) accordingly. For a
//! queued line, [`Outcome::remaining`] is 0 while anything is queued,
//! [`Outcome::reset_us`] counts the queued units too, and
//! [`Outcome::retry_after_us`] is the wait until a lone request of the same
//! cost would be admitted, possibly delayed. A cost above the burst is never
//! admitted, queue or not: it never conforms.
//!
//! # Overdrafts (`charge=after`)
//!
//! [`Limit::overdraw`] charges a cost known only after the response, in
//! full, beyond the burst if need be. Every line reads the overdraft as it
//! is: nothing remains, every request of cost 1 or more is rejected until
//! it is repaid, and the retry-after and reset count it. The buckets and
//! `gcra` repay it at the rate; `fixed` and `sliding` forget it when its
//! window stops counting (the window charged for `fixed`, the one after it
//! for `sliding`).

mod bucket;
mod fixed;
mod gcra;
mod log;
mod sliding;
mod vary;

use std::fmt;
use std::str::FromStr;

use crate::parse::{ParseError, ParseErrorKind, Rate};
pub use crate::verdict::Outcome;

/// Largest burst `sliding_log` accepts: it stores one timestamp per unit.
pub const MAX_LOG_BURST: u64 = 65_536;

/// Times beyond this (~292,000 years) are treated as this instant, which
/// keeps every `time + window` computation far from `u64` overflow.
pub const MAX_NOW: u64 = u64::MAX / 2;

/// A rate-limiting algorithm.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// Fixed window counter, windows aligned to multiples of `W`.
    Fixed,
    /// Sliding window counter (previous window weighted by overlap).
    #[default]
    Sliding,
    /// Exact sliding log of admission timestamps.
    SlidingLog,
    /// Token bucket of capacity B refilled at the rate.
    TokenBucket,
    /// Leaky bucket as a meter: a level draining at the rate, capacity B.
    LeakyBucket,
    /// Generic cell rate algorithm (theoretical arrival time).
    Gcra,
}

impl Algorithm {
    /// Every algorithm, in declaration order.
    pub const ALL: [Algorithm; 6] = [
        Algorithm::Fixed,
        Algorithm::Sliding,
        Algorithm::SlidingLog,
        Algorithm::TokenBucket,
        Algorithm::LeakyBucket,
        Algorithm::Gcra,
    ];

    /// The configuration name: `fixed`, `sliding`, `sliding_log`, ...
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Fixed => "fixed",
            Algorithm::Sliding => "sliding",
            Algorithm::SlidingLog => "sliding_log",
            Algorithm::TokenBucket => "token_bucket",
            Algorithm::LeakyBucket => "leaky_bucket",
            Algorithm::Gcra => "gcra",
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Algorithm {
    type Err = ParseError;

    /// Parses a name as printed by `Display`; errors read `invalid algorithm "x"`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Algorithm::ALL
            .into_iter()
            .find(|a| a.name() == s)
            .ok_or_else(|| ParseError::new(ParseErrorKind::Invalid, "algorithm", s))
    }
}

/// Why [`Limit::new`] refused a configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LimitError {
    /// The rate's count or period is zero.
    ZeroRate(Rate),
    /// The burst is zero.
    ZeroBurst,
    /// `burst * period_us` does not fit in 64 bits.
    Overflow {
        /// The rate.
        rate: Rate,
        /// The burst.
        burst: u64,
    },
    /// `sliding_log` with a burst above [`MAX_LOG_BURST`].
    LogTooLarge {
        /// The burst.
        burst: u64,
    },
    /// A queue for an algorithm that cannot delay (the window algorithms).
    QueueNotSupported(Algorithm),
    /// `(burst + queue) * period_us` does not fit in 64 bits.
    QueueOverflow {
        /// The rate.
        rate: Rate,
        /// The burst.
        burst: u64,
        /// The queue.
        queue: u64,
    },
}

impl fmt::Display for LimitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LimitError::ZeroRate(r) => write!(f, "rate \"{r}\" must be positive"),
            LimitError::ZeroBurst => f.write_str("burst must be at least 1"),
            LimitError::Overflow { rate, burst } => {
                write!(f, "burst={burst} with rate \"{rate}\" is too large: burst * period overflows 64 bits")
            }
            LimitError::LogTooLarge { burst } => write!(
                f,
                "burst={burst} is too large for \"sliding_log\", which keeps one timestamp \
                 per request (at most {MAX_LOG_BURST}); use \"sliding\" or \"gcra\""
            ),
            LimitError::QueueNotSupported(a) => write!(
                f,
                "\"queue\" is not supported by algorithm \"{a}\": only \"token_bucket\", \"leaky_bucket\" \
                 and \"gcra\" can delay requests"
            ),
            LimitError::QueueOverflow { rate, burst, queue } => write!(
                f,
                "burst={burst} and queue={queue} with rate \"{rate}\" are too large: \
                 (burst + queue) * period overflows 64 bits"
            ),
        }
    }
}

impl std::error::Error for LimitError {}

/// A validated limit: algorithm, rate, burst and queue, plus derived
/// constants.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Limit {
    algorithm: Algorithm,
    rate: Rate,
    burst: u64,
    /// Requests delayed beyond the burst (0: none; buckets and `gcra` only).
    queue: u64,
    /// `W` = ⌈burst · period / count⌉ ≥ 1.
    window: u64,
    /// GCRA emission interval `T` = ⌈period / count⌉ ≥ 1.
    interval: u64,
    /// Bucket capacity in scaled units: burst · period (one request = period).
    capacity: u64,
    /// Rate and burst change from request to request: the state carries the
    /// scale it was written with (see [`Limit::varying`]).
    varying: bool,
}

/// What one [`Limit::commit`] charged, for [`Limit::refund`] to take back:
/// the cost and where the algorithm put it. The default charged nothing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Charge {
    /// Units charged; 0 when nothing was.
    cost: u64,
    /// Where: the window's index (`fixed`, `sliding`), the timestamp the
    /// units were stamped with (`sliding_log`), the time the level was
    /// charged at (the buckets), the TAT the charge was added to (`gcra`).
    at: u64,
    /// The buckets only: the level (scaled) under the charge.
    below: u64,
    /// A varying line: the scale the state was charged under (its tag);
    /// 0 for a static line.
    tag: u64,
}

impl Charge {
    /// Nothing charged (the default, usable in constants).
    pub const NONE: Charge = Charge { cost: 0, at: 0, below: 0, tag: 0 };

    /// Units charged; 0 when nothing was.
    pub fn cost(&self) -> u64 {
        self.cost
    }
}

impl Limit {
    /// Validates and builds a limit. Rejects a zero rate or burst, params
    /// whose `burst * period_us` overflows `u64`, and a `sliding_log` burst
    /// above [`MAX_LOG_BURST`].
    pub fn new(algorithm: Algorithm, rate: Rate, burst: u64) -> Result<Limit, LimitError> {
        if rate.count == 0 || rate.period_us == 0 {
            return Err(LimitError::ZeroRate(rate));
        }
        if burst == 0 {
            return Err(LimitError::ZeroBurst);
        }
        if algorithm == Algorithm::SlidingLog && burst > MAX_LOG_BURST {
            return Err(LimitError::LogTooLarge { burst });
        }
        let capacity = burst.checked_mul(rate.period_us).ok_or(LimitError::Overflow { rate, burst })?;
        Ok(Limit {
            algorithm,
            rate,
            burst,
            queue: 0,
            window: capacity.div_ceil(rate.count),
            interval: rate.period_us.div_ceil(rate.count),
            capacity,
            varying: false,
        })
    }

    /// This limit with a queue of `queue` requests (see the module docs):
    /// `token_bucket`, `leaky_bucket` and `gcra` only, unless `queue` is 0.
    /// Refuses a queue whose `(burst + queue) * period_us` overflows `u64`.
    pub fn with_queue(self, queue: u64) -> Result<Limit, LimitError> {
        if queue == 0 {
            return Ok(Limit { queue, ..self });
        }
        if !matches!(self.algorithm, Algorithm::TokenBucket | Algorithm::LeakyBucket | Algorithm::Gcra) {
            return Err(LimitError::QueueNotSupported(self.algorithm));
        }
        let (rate, burst) = (self.rate, self.burst);
        burst.checked_add(queue).and_then(|n| n.checked_mul(rate.period_us)).ok_or(LimitError::QueueOverflow {
            rate,
            burst,
            queue,
        })?;
        Ok(Limit { queue, ..self })
    }

    /// This limit for a line whose rate or burst may differ from one
    /// request to the next (`sliding_log`: the rate only, its burst lays its
    /// state out). Its state carries one more word, the scale its used
    /// amount is counted in as of the last write (`W` for `fixed` and
    /// `sliding`, the rate for the buckets, `T` for `gcra`; none for
    /// `sliding_log`, whose timestamps are absolute), so that a request
    /// with other values first converts the state to its own scale,
    /// rounding what is used up (the buckets' drained at the rate that
    /// wrote it). Then at one instant no more than the new burst passes,
    /// and on the same state at the same instant raising the rate or burst
    /// never admits fewer requests than keeping the old values would,
    /// lowering them never more; and from the reset its last write reported
    /// (when the table may drop the key), a state reads as fresh under any
    /// values, but `sliding_log`'s under a longer window. Values that do
    /// not change behave exactly as the static line. [`Limit::state_words`]
    /// does not depend on the rate or burst (but for `sliding_log`'s
    /// burst): build a `Limit` per request from its values, all with
    /// `.varying()`.
    pub fn varying(self) -> Limit {
        Limit { varying: true, ..self }
    }

    /// Whether this is a [`Limit::varying`] line.
    pub fn is_varying(&self) -> bool {
        self.varying
    }

    /// The algorithm.
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// The rate.
    pub fn rate(&self) -> Rate {
        self.rate
    }

    /// The burst: the most cost units admitted at one instant.
    pub fn burst(&self) -> u64 {
        self.burst
    }

    /// The queue: requests delayed beyond the burst (0: none).
    pub fn queue(&self) -> u64 {
        self.queue
    }

    /// `W` = burst / rate = ⌈burst · period_us / count⌉ µs, at least 1.
    pub fn window_us(&self) -> u64 {
        self.window
    }

    /// `u64` words of state one key needs: 1–3, or 2 + burst for
    /// `sliding_log`; one more for a [`Limit::varying`] line but
    /// `sliding_log`.
    pub fn state_words(&self) -> usize {
        self.static_words() + usize::from(self.tagged())
    }

    /// The tag a [`Limit::varying`] line's writes leave after its static
    /// words (0 for a line without one), which Redis' script keeps as a
    /// double.
    pub(crate) fn tag(&self) -> u64 {
        match self.tagged() {
            true => vary::scale(self),
            false => 0,
        }
    }

    /// Whether the state carries a scale tag (after its static words).
    fn tagged(&self) -> bool {
        self.varying && self.algorithm != Algorithm::SlidingLog
    }

    /// The state words the algorithm itself reads and writes.
    fn static_words(&self) -> usize {
        match self.algorithm {
            Algorithm::Fixed | Algorithm::TokenBucket | Algorithm::LeakyBucket => 2,
            Algorithm::Sliding => 3,
            Algorithm::Gcra => 1,
            // burst <= MAX_LOG_BURST, so this always fits.
            Algorithm::SlidingLog => usize::try_from(self.burst).map_or(usize::MAX, |b| b + 2),
        }
    }

    /// Would a request of `cost` be admitted at `now`, at once or delayed?
    /// Does not modify `state`; the outcome is the one [`Limit::acquire`]
    /// would return. Cost 0 is always admitted at once; cost > burst never
    /// is (retry `None`). A `state` shorter than [`Limit::state_words`]
    /// rejects (retry `None`).
    pub fn check(&self, state: &[u64], now: u64, cost: u64) -> Outcome {
        self.check_inline(state, now, cost)
    }

    /// [`Limit::check`], inlined into [`Limit::acquire`]: one function, in
    /// which the second dispatch on the algorithm and what the commit
    /// recomputes fold into the check's.
    #[inline(always)]
    fn check_inline(&self, state: &[u64], now: u64, cost: u64) -> Outcome {
        if state.len() < self.state_words() {
            return Outcome::default();
        }
        let now = now.min(MAX_NOW);
        let outcome = match self.tagged() {
            true => vary::check(self, state, now, cost),
            false => self.check_static(state, now, cost),
        };
        // Cost 0 charges nothing, so it passes even when a lagging clock
        // sees the key over its limit.
        match cost {
            0 => Outcome::admit(outcome.remaining, outcome.reset_us, 0),
            _ => outcome,
        }
    }

    /// The algorithm's check on its static words.
    #[inline(always)]
    fn check_static(&self, state: &[u64], now: u64, cost: u64) -> Outcome {
        match self.algorithm {
            Algorithm::Fixed => fixed::check(self, state, now, cost),
            Algorithm::Sliding => sliding::check(self, state, now, cost),
            Algorithm::SlidingLog => log::check(self, state, now, cost),
            Algorithm::TokenBucket | Algorithm::LeakyBucket => bucket::check(self, state, now, cost),
            Algorithm::Gcra => gcra::check(self, state, now, cost),
        }
    }

    /// Charges a request that [`Limit::check`] admitted (delayed or not),
    /// and returns what it charged. If it would not be admitted (misuse), or `cost` is 0, or
    /// `state` is too short, this does nothing — so it can never over-admit
    /// — and charges nothing.
    pub fn commit(&self, state: &mut [u64], now: u64, cost: u64) -> Charge {
        self.commit_inline(state, now, cost)
    }

    /// [`Limit::commit`], inlined into [`Limit::acquire`].
    #[inline(always)]
    fn commit_inline(&self, state: &mut [u64], now: u64, cost: u64) -> Charge {
        if state.len() < self.state_words() || cost == 0 {
            return Charge::default();
        }
        let now = now.min(MAX_NOW);
        match self.tagged() {
            true => vary::commit(self, state, now, cost),
            false => self.commit_static(state, now, cost),
        }
    }

    /// The algorithm's commit on its static words.
    #[inline(always)]
    fn commit_static(&self, state: &mut [u64], now: u64, cost: u64) -> Charge {
        match self.algorithm {
            Algorithm::Fixed => fixed::commit(self, state, now, cost),
            Algorithm::Sliding => sliding::commit(self, state, now, cost),
            Algorithm::SlidingLog => log::commit(self, state, now, cost),
            Algorithm::TokenBucket | Algorithm::LeakyBucket => bucket::commit(self, state, now, cost),
            Algorithm::Gcra => gcra::commit(self, state, now, cost),
        }
    }

    /// Charges `cost` in full at `now`, whatever the state: beyond the burst
    /// (and the queue) if need be, for a cost known only once the request
    /// has been served. The state records the overdraft, and [`Limit::check`]
    /// sees it until it is repaid: nothing remains, every cost of 1 or more
    /// is rejected, [`Outcome::retry_after_us`] is the exact wait until a
    /// request of cost 1 is admitted again, [`Outcome::reset_us`] counts
    /// the overdraft. The buckets and `gcra` repay it at the rate; `fixed`
    /// forgets it when the window charged ends, `sliding` when the window
    /// after it ends (where it weighs in as the previous window's count).
    /// `sliding_log`, which keeps one timestamp per unit, cannot hold more
    /// than the burst: it charges what fits, as [`Limit::commit`] would.
    /// A [`Limit::varying`] line first converts the state to its own scale,
    /// as [`Limit::commit`] does, and leaves its tag.
    ///
    /// Returns what it charged, which [`Limit::refund`] can take back like a
    /// commit's charge. Arithmetic saturates: a charge that would take the
    /// state beyond `u64` leaves it at `u64::MAX` and returns
    /// [`Charge::NONE`] (a refund then takes nothing back). Cost 0, or a
    /// `state` shorter than [`Limit::state_words`], charges nothing.
    pub fn overdraw(&self, state: &mut [u64], now: u64, cost: u64) -> Charge {
        if state.len() < self.state_words() || cost == 0 {
            return Charge::default();
        }
        let now = now.min(MAX_NOW);
        match self.tagged() {
            true => vary::overdraw(self, state, now, cost),
            false => self.overdraw_static(state, now, cost),
        }
    }

    /// The algorithm's overdraft on its static words.
    #[inline(always)]
    fn overdraw_static(&self, state: &mut [u64], now: u64, cost: u64) -> Charge {
        match self.algorithm {
            Algorithm::Fixed => fixed::overdraw(self, state, now, cost),
            Algorithm::Sliding => sliding::overdraw(self, state, now, cost),
            Algorithm::SlidingLog => log::overdraw(self, state, now, cost),
            Algorithm::TokenBucket | Algorithm::LeakyBucket => bucket::overdraw(self, state, now, cost),
            Algorithm::Gcra => gcra::overdraw(self, state, now, cost),
        }
    }

    /// Takes back what a [`Limit::commit`] on this state charged, as far as
    /// the state still holds it, at `now` (no earlier than the commit): the
    /// state is then as if the request had never come, or stricter — never
    /// more permissive, whatever was charged or refunded in between.
    ///
    /// The window algorithms and `sliding_log` take the units back exactly
    /// (nothing once their window or timestamps have expired). The buckets
    /// and `gcra` give them back unless, in between, the level would have
    /// drained to empty without them: then what drained from under them
    /// since is kept, since a state cannot tell which charge it took from.
    /// Should the state have been dropped and created afresh in between,
    /// the refund may take back up to `cost` of what was charged since.
    ///
    /// A [`Limit::varying`] line takes nothing back once the state has been
    /// converted to another scale since the charge (or if `self` is not the
    /// limit that charged), nor, for the buckets, once another request has
    /// charged the state since (it may have drained it at another rate).
    /// It takes back the charge, not the conversion the charge made: the
    /// state goes on in the line's scale (the buckets' draining at its
    /// rate), as after a request of the line that charged nothing.
    pub fn refund(&self, state: &mut [u64], charge: &Charge, now: u64) {
        if state.len() < self.state_words() || charge.cost == 0 {
            return;
        }
        let now = now.min(MAX_NOW);
        if self.tagged() {
            vary::refund(self, state, charge, now);
            return;
        }
        self.refund_static(state, charge, now);
    }

    /// The algorithm's refund on its static words.
    fn refund_static(&self, state: &mut [u64], charge: &Charge, now: u64) {
        match self.algorithm {
            Algorithm::Fixed => fixed::refund(state, charge),
            Algorithm::Sliding => sliding::refund(state, charge),
            Algorithm::SlidingLog => log::refund(self, state, charge),
            Algorithm::TokenBucket | Algorithm::LeakyBucket => bucket::refund(self, state, charge),
            Algorithm::Gcra => gcra::refund(self, state, charge, now),
        }
    }

    /// [`Limit::check`], then [`Limit::commit`] if admitted.
    pub fn acquire(&self, state: &mut [u64], now: u64, cost: u64) -> Outcome {
        let outcome = self.check_inline(state, now, cost);
        if outcome.admitted {
            self.commit_inline(state, now, cost);
        }
        outcome
    }

    /// [`Limit::acquire`], returning also what it charged (for a refund).
    pub fn acquire_charged(&self, state: &mut [u64], now: u64, cost: u64) -> (Outcome, Charge) {
        let outcome = self.check_inline(state, now, cost);
        let charge = if outcome.admitted { self.commit_inline(state, now, cost) } else { Charge::default() };
        (outcome, charge)
    }

    /// `retry` when a request of `cost` can ever pass, else `None`.
    fn retry(&self, cost: u64, retry: impl FnOnce() -> u64) -> Option<u64> {
        (cost <= self.burst).then(retry)
    }
}

/// `a * b` without overflow.
fn mul(a: u64, b: u64) -> u128 {
    u128::from(a) * u128::from(b)
}

/// An overdrawn state word and what the overdraft charged: `x` and
/// `charge`, or `u64::MAX` and nothing refundable when `x` overflows.
fn overdrawn(x: u128, charge: Charge) -> (u64, Charge) {
    match u64::try_from(x) {
        Ok(x) => (x, charge),
        Err(_) => (u64::MAX, Charge::NONE),
    }
}

/// A `u128` clamped into `u64`.
fn sat(x: u128) -> u64 {
    u64::try_from(x).unwrap_or(u64::MAX)
}

/// ⌈a / b⌉, with a zero divisor treated as 1 (never happens for a [`Limit`]).
fn div_ceil(a: u128, b: u64) -> u128 {
    a.div_ceil(u128::from(b.max(1)))
}
