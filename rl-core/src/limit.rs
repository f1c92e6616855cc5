//! The rate-limiting algorithms as pure state transitions over integer time.
//!
//! A [`Limit`] is the immutable configuration (algorithm, rate, burst); the
//! per-key state is a caller-owned slice of [`Limit::state_words`] `u64`s in
//! which all zeroes means "fresh key, full capacity". Time `now` is passed in
//! as monotonic microseconds. Clocks may step backwards a little (e.g. two
//! nginx workers): every algorithm then stays at least as strict as at the
//! latest time it has seen, and nothing ever panics — arithmetic is
//! saturating or within bounds the parameters were checked against,
//! products that may not fit in `u64` are taken in `u128`, there is no
//! floating point.
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
mod conn;
mod fixed;
mod gcra;
pub mod holders;
mod log;
mod sliding;
mod vary;
pub mod wait;

use std::fmt;
use std::str::FromStr;

use crate::parse::{ParseError, ParseErrorKind, Rate};
pub use crate::verdict::Outcome;

/// Largest burst `sliding_log` accepts: it stores one timestamp per unit.
pub const MAX_LOG_BURST: u64 = 65_536;

/// The longest one charge of a cost known after the response
/// ([`Limit::overdraw`], `charge=after`) may hold a key: a cost beyond what
/// the rate refills in this time (and beyond the burst) is no real figure,
/// and is charged as [`Limit::max_cost`].
pub const MAX_CHARGE_US: u64 = 7 * 86_400 * 1_000_000;

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
    /// Requests in flight (`rl_conn`), at most the burst: held from
    /// admission until given back ([`Limit::concurrent`]). Not one of
    /// [`Algorithm::ALL`], the algorithms of a rate.
    Concurrent,
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
            Algorithm::Concurrent => "concurrent",
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
    /// The code a request runs, so that it is chosen in one step.
    path: Path,
    /// [`Limit::state_words`], which callers ask for on every request.
    words: u32,
    /// Words of a rate line's waiting line after the algorithm's
    /// ([`Limit::with_rate_lanes`]; 0: none).
    lane_words: u32,
}

/// The code a [`Limit`]'s requests run: its algorithm's (the buckets share
/// theirs), or vary.rs's for a varying line that carries a tag.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Path {
    Fixed,
    Sliding,
    Log,
    Bucket,
    Gcra,
    Conn,
    Varying,
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
    /// Nothing charged (the default, usable in constants): all-zero bytes,
    /// which the module's zeroed request results rely on.
    pub const NONE: Charge = Charge { cost: 0, at: 0, below: 0, tag: 0 };

    /// Units charged; 0 when nothing was.
    pub fn cost(&self) -> u64 {
        self.cost
    }

    /// What a [`Limit::concurrent`] request admitted by its waiting line
    /// ([`wait::Wait`]) holds: `cost` units, given back as a commit's, of
    /// class `class` on a line of several classes (`None`: one).
    pub fn held(cost: u64, class: Option<usize>) -> Charge {
        Charge { cost, at: class.map_or(0, |k| k as u64 + 1), ..Charge::NONE }
    }

    /// A [`Charge::held`]'s class plus one (0: the line has one class):
    /// what a give-back of its units takes from besides the line's units.
    pub fn held_class(&self) -> u64 {
        self.at
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
        let words = match algorithm {
            Algorithm::Fixed | Algorithm::TokenBucket | Algorithm::LeakyBucket => 2,
            Algorithm::Sliding => 3,
            Algorithm::Gcra | Algorithm::Concurrent => 1,
            // burst <= MAX_LOG_BURST, so this fits.
            Algorithm::SlidingLog => u32::try_from(burst).map_or(u32::MAX, |b| b + 2),
        };
        Ok(Limit {
            algorithm,
            rate,
            burst,
            queue: 0,
            window: capacity.div_ceil(rate.count),
            interval: rate.period_us.div_ceil(rate.count),
            capacity,
            varying: false,
            path: Limit::static_path(algorithm),
            words,
            lane_words: 0,
        })
    }

    /// A limit of `max` requests (cost units) in flight at once
    /// ([`Algorithm::Concurrent`]); `max` of 0 is refused. Its rate is
    /// nominal (`max` a second), for the code that reads every limit's.
    pub fn concurrent(max: u64) -> Result<Limit, LimitError> {
        Limit::new(Algorithm::Concurrent, Rate { count: max.max(1), period_us: 1_000_000 }, max)
    }

    /// Whether this is a [`Limit::concurrent`] limit: its units are held
    /// until given back, not refilled in time.
    #[inline(always)]
    pub fn is_concurrent(&self) -> bool {
        self.path == Path::Conn
    }

    /// Whether `state` holds units that only a give-back frees (a
    /// [`Limit::concurrent`] state with requests in flight): such a state
    /// must be kept whatever time passes.
    #[inline(always)]
    pub fn held(&self, state: &[u64]) -> bool {
        match self.path {
            Path::Conn => state.first().is_some_and(|&n| n > 0) || self.has_waiters(state),
            _ => self.lane_words != 0 && self.has_rate_waiters(state),
        }
    }

    /// Whether a rate line's waiting line ([`Limit::with_rate_lanes`]) has
    /// places taken: its state is kept, as a key's with units held.
    #[cold]
    fn has_rate_waiters(&self, state: &[u64]) -> bool {
        state.get(self.lanes_at()).is_some_and(|&live| live > 0)
    }

    /// Where a rate line's waiting line ([`Limit::with_rate_lanes`]) starts
    /// in its state: after the algorithm's words.
    fn lanes_at(&self) -> usize {
        self.state_words() - self.lane_words as usize
    }

    /// Whether a [`Limit::concurrent`] state with a queue has places taken
    /// in its waiting line.
    fn has_waiters(&self, state: &[u64]) -> bool {
        self.queue > 0 && state.get(1).is_some_and(|&live| live > 0)
    }

    /// The waiting line of a [`Limit::concurrent`] state with a queue
    /// ([`wait`]) whose classes are `lanes` (those the limit was made
    /// with, [`Limit::with_lanes`]); `None` for any other limit, or a state
    /// too short.
    pub fn wait<'a>(&self, state: &'a mut [u64], lanes: &'a [wait::Lane]) -> Option<wait::Wait<'a>> {
        let plain = self.queue == 0 && lanes.len() <= 1;
        if !self.is_concurrent() || plain || state.len() < self.state_words() {
            return None;
        }
        let (units, line) = state.split_first_mut()?;
        Some(wait::Wait { gate: wait::Gate::Units { units, max: self.burst }, q: self.queue, lanes, line })
    }

    /// This [`Limit::concurrent`] limit with a waiting line of `queue`
    /// places in all, in classes of `lanes` ([`wait`]): its state is laid
    /// out for them (a line of several classes also without a queue: the
    /// units each holds). At most [`MAX_LOG_BURST`] places in all and per
    /// class, and [`wait::MAX_LANES`] classes.
    pub fn with_lanes(self, queue: u64, lanes: &[wait::Lane]) -> Result<Limit, LimitError> {
        let too_many = lanes.len() > wait::MAX_LANES || lanes.iter().any(|l| l.places > MAX_LOG_BURST);
        if self.algorithm != Algorithm::Concurrent || queue > MAX_LOG_BURST || too_many {
            return Err(LimitError::QueueOverflow { rate: self.rate, burst: self.burst, queue });
        }
        if queue == 0 && lanes.len() <= 1 {
            return Ok(Limit { queue, ..self });
        }
        let words = u32::try_from(1 + wait::words(lanes)).map_err(|_| LimitError::QueueOverflow {
            rate: self.rate,
            burst: self.burst,
            queue,
        })?;
        Ok(Limit { queue, words, ..self })
    }

    /// This rate limit (`token_bucket`, `leaky_bucket` or `gcra`, its rate
    /// and burst static) with a waiting line of `queue` places in all, in
    /// classes of `lanes` ([`wait`], [`Limit::rate_wait`]): its state is laid
    /// out for them after the algorithm's words. Its own queue stays 0: a
    /// waiter is let in only where the algorithm admits it at once.
    pub fn with_rate_lanes(self, queue: u64, lanes: &[wait::Lane]) -> Result<Limit, LimitError> {
        let too_many = lanes.len() > wait::MAX_LANES || lanes.iter().any(|l| l.places > MAX_LOG_BURST);
        if !matches!(self.algorithm, Algorithm::TokenBucket | Algorithm::LeakyBucket | Algorithm::Gcra) {
            return Err(LimitError::QueueNotSupported(self.algorithm));
        }
        let overflow = LimitError::QueueOverflow { rate: self.rate, burst: self.burst, queue };
        if self.varying || self.queue != 0 || queue == 0 || queue > MAX_LOG_BURST || too_many || lanes.is_empty() {
            return Err(overflow);
        }
        let lane_words = u32::try_from(wait::words(lanes)).map_err(|_| overflow)?;
        let words = self.words.checked_add(lane_words).ok_or(overflow)?;
        Ok(Limit { words, lane_words, ..self })
    }

    /// The waiting line of a [`Limit::with_rate_lanes`] state at `now`,
    /// whose classes are `lanes`, `q` places in all, each class keeping
    /// `kept` of the budget from the classes below ([`wait::RateGate`]);
    /// `None` for any other limit, or a state too short.
    pub fn rate_wait<'a>(
        &'a self,
        state: &'a mut [u64],
        lanes: &'a [wait::Lane],
        q: u64,
        kept: &'a [u64],
        now: u64,
    ) -> Option<wait::Wait<'a>> {
        if self.lane_words == 0 || state.len() < self.state_words() {
            return None;
        }
        let (state, line) = state.split_at_mut(self.lanes_at());
        let gate = wait::RateGate { limit: self, state, now_us: now, kept, taken: Decision::default() };
        Some(wait::Wait { gate: wait::Gate::Rate(gate), q, lanes, line })
    }

    /// Whether this is a rate limit with a waiting line
    /// ([`Limit::with_rate_lanes`]).
    pub fn rate_waits(&self) -> bool {
        self.lane_words != 0
    }

    /// This limit with a queue of `queue` requests (see the module docs):
    /// `token_bucket`, `leaky_bucket` and `gcra` only, unless `queue` is 0;
    /// a [`Limit::concurrent`] limit's is a waiting line ([`wait`]) of at
    /// most [`MAX_LOG_BURST`] places, in words after its own.
    /// Refuses a queue whose `(burst + queue) * period_us` overflows `u64`.
    pub fn with_queue(self, queue: u64) -> Result<Limit, LimitError> {
        if queue == 0 {
            return Ok(Limit { queue, ..self });
        }
        if self.algorithm == Algorithm::Concurrent {
            return self.with_lanes(queue, &[wait::Lane { places: queue, reserve: 0, lend: false }]);
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
        // (a waiting line's words follow the algorithm's: no tag between; its spec refuses variables)
        if self.varying || self.lane_words != 0 {
            return self;
        }
        match self.algorithm {
            // Its timestamps are absolute: no tag, the static code.
            Algorithm::SlidingLog => Limit { varying: true, ..self },
            // (its burst is fixed by the configuration: no plans vary it)
            Algorithm::Concurrent => self,
            _ => Limit { varying: true, path: Path::Varying, words: self.words + 1, ..self },
        }
    }

    /// The static line of a [`Limit::varying`] line's values (its state has
    /// no scale tag): for a store that keeps a counter per window length
    /// and knows no scale (memcached zones), a line as any one request sees
    /// it. A static line is itself.
    pub fn unvarying(self) -> Limit {
        match self.path {
            Path::Varying => {
                Limit { varying: false, path: Limit::static_path(self.algorithm), words: self.words - 1, ..self }
            }
            _ => Limit { varying: false, ..self },
        }
    }

    /// The code a static line of `algorithm` runs.
    fn static_path(algorithm: Algorithm) -> Path {
        match algorithm {
            Algorithm::Fixed => Path::Fixed,
            Algorithm::Sliding => Path::Sliding,
            Algorithm::SlidingLog => Path::Log,
            Algorithm::TokenBucket | Algorithm::LeakyBucket => Path::Bucket,
            Algorithm::Gcra => Path::Gcra,
            Algorithm::Concurrent => Path::Conn,
        }
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

    /// The largest cost one [`Limit::overdraw`] should be asked to charge:
    /// what the rate refills in [`MAX_CHARGE_US`], and at least the burst. A
    /// larger figure (an upstream's `X-Tokens-Used` gone wrong, up to
    /// `u64::MAX`) would hold the key for longer than any real cost could,
    /// or saturate its state: the caller charges this instead.
    pub fn max_cost(&self) -> u64 {
        let refilled = u128::from(self.rate.count) * u128::from(MAX_CHARGE_US) / u128::from(self.rate.period_us.max(1));
        u64::try_from(refilled).unwrap_or(u64::MAX).max(self.burst)
    }

    /// The excess `limit_req` logs (`limiting requests, excess: 1.234 by
    /// zone ...`), in thousandths of a request: the units the key holds
    /// with the request of `cost` whose verdict is `o`, less the one request the
    /// rate lets through at any instant; 0 at most. What the key holds comes
    /// from the outcome alone, so that a Redis reply gives it too:
    ///
    /// - `fixed`, `sliding`, `sliding_log`: the count in the window,
    ///   `burst − remaining` (the previous window weighted, for `sliding`);
    /// - `token_bucket`, `leaky_bucket`: the level, `reset_us · rate`;
    /// - `gcra`: the backlog in emission intervals, `reset_us / T`
    ///   (both to the nearest thousandth);
    ///
    /// with the request's own cost added when it is rejected (an admitted
    /// request's outcome counts it already). Delayed requests count as
    /// held: they are charged at arrival.
    pub fn excess_milli(&self, o: &Outcome, cost: u64) -> u64 {
        let rate = self.rate;
        let held = match self.algorithm {
            Algorithm::Fixed | Algorithm::Sliding | Algorithm::SlidingLog | Algorithm::Concurrent => {
                u128::from(self.burst.saturating_sub(o.remaining)) * 1000
            }
            // Rounded to the nearest thousandth: the level drains between two requests, and a
            // key that held 2 requests a few µs ago shows 2.000, not 1.999.
            Algorithm::TokenBucket | Algorithm::LeakyBucket => {
                let period = u128::from(rate.period_us.max(1));
                (u128::from(o.reset_us) * u128::from(rate.count) * 1000 + period / 2) / period
            }
            Algorithm::Gcra => {
                let t = u128::from(rate.period_us.div_ceil(rate.count.max(1)).max(1));
                (u128::from(o.reset_us) * 1000 + t / 2) / t
            }
        };
        let own = if o.admitted { 0 } else { u128::from(cost) * 1000 };
        u64::try_from((held + own).saturating_sub(1000)).unwrap_or(u64::MAX)
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
        self.words as usize
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

    /// The state words the algorithm itself reads and writes.
    fn static_words(&self) -> usize {
        self.state_words() - usize::from(self.tagged()) - self.lane_words as usize
    }

    /// Whether the state carries a scale tag after its static words (a
    /// varying line but `sliding_log`).
    fn tagged(&self) -> bool {
        self.path == Path::Varying
    }

    /// Would a request of `cost` be admitted at `now`, at once or delayed?
    /// Does not modify `state`; the outcome is the one [`Limit::acquire`]
    /// would return. Cost 0 is always admitted at once; cost > burst never
    /// is (retry `None`). A `state` shorter than [`Limit::state_words`]
    /// rejects (retry `None`).
    pub fn check(&self, state: &[u64], now: u64, cost: u64) -> Outcome {
        if self.tagged() {
            return self.check_varying(state, now, cost);
        }
        self.check_static(state, now.min(MAX_NOW), cost)
    }

    /// [`Limit::check`] of a varying line, which first converts the state
    /// to its scale (vary.rs).
    #[inline(never)]
    fn check_varying(&self, state: &[u64], now: u64, cost: u64) -> Outcome {
        if state.len() < self.state_words() {
            return Outcome::default();
        }
        let outcome = vary::check(self, state, now.min(MAX_NOW), cost);
        zero_cost(outcome, cost)
    }

    /// The algorithm's check on its static words, at a `now` no later than
    /// [`MAX_NOW`]; too few words reject.
    #[inline(always)]
    fn check_static(&self, s: &[u64], now: u64, cost: u64) -> Outcome {
        match self.algorithm {
            Algorithm::Fixed => s.first_chunk().map_or(Outcome::default(), |s| fixed::check(self, s, now, cost)),
            Algorithm::Sliding => s.first_chunk().map_or(Outcome::default(), |s| sliding::check(self, s, now, cost)),
            Algorithm::SlidingLog => log::check(self, s, now, cost),
            Algorithm::TokenBucket | Algorithm::LeakyBucket => match s.len() >= 2 {
                true => zero_cost(bucket::check(self, s, now, cost), cost),
                false => Outcome::default(),
            },
            Algorithm::Gcra => s.first_chunk().map_or(Outcome::default(), |s| gcra::check(self, s, now, cost)),
            Algorithm::Concurrent => {
                s.first_chunk().map_or(Outcome::default(), |s| zero_cost(conn::check(self, s, cost), cost))
            }
        }
    }

    /// Charges a request that [`Limit::check`] admitted (delayed or not),
    /// and returns what it charged. If it would not be admitted (misuse), or `cost` is 0, or
    /// `state` is too short, this does nothing — so it can never over-admit
    /// — and charges nothing.
    pub fn commit(&self, state: &mut [u64], now: u64, cost: u64) -> Charge {
        if self.tagged() {
            return self.commit_varying(state, now, cost);
        }
        self.commit_static(state, now.min(MAX_NOW), cost)
    }

    /// [`Limit::commit`] of a varying line (vary.rs).
    #[inline(never)]
    fn commit_varying(&self, state: &mut [u64], now: u64, cost: u64) -> Charge {
        if state.len() < self.state_words() || cost == 0 {
            return Charge::default();
        }
        vary::commit(self, state, now.min(MAX_NOW), cost)
    }

    /// The algorithm's commit on its static words, at a `now` no later than
    /// [`MAX_NOW`]; too few words, or cost 0, charge nothing.
    #[inline(always)]
    fn commit_static(&self, s: &mut [u64], now: u64, cost: u64) -> Charge {
        match self.algorithm {
            Algorithm::Fixed => {
                s.first_chunk_mut().map_or(Charge::NONE, |s| charge_of(|d| fixed::acquire(self, s, now, cost, d)))
            }
            Algorithm::Sliding => {
                s.first_chunk_mut().map_or(Charge::NONE, |s| charge_of(|d| sliding::acquire(self, s, now, cost, d)))
            }
            Algorithm::SlidingLog => log::acquire(self, s, now, cost).1,
            Algorithm::TokenBucket | Algorithm::LeakyBucket => match s.len() >= 2 && cost != 0 {
                true => bucket::commit(self, s, now, cost),
                false => Charge::NONE,
            },
            Algorithm::Gcra => {
                s.first_chunk_mut().map_or(Charge::NONE, |s| charge_of(|d| gcra::acquire(self, s, now, cost, d)))
            }
            Algorithm::Concurrent => {
                s.first_chunk_mut().map_or(Charge::NONE, |s| charge_of(|d| conn::acquire(self, s, cost, d)))
            }
        }
    }

    // The algorithms' check and, if it admits, commit, for
    // `acquire_charged`, in one step from the same values, at a `now` no
    // later than `MAX_NOW`. Each is out of line: a request runs one, and
    // does not save the registers the others would need.

    /// `fixed`'s check and commit; too few words reject.
    #[inline(never)]
    fn acquire_fixed(&self, s: &mut [u64], now: u64, cost: u64, out: &mut Decision) {
        match s.first_chunk_mut() {
            Some(s) => fixed::acquire(self, s, now, cost, out),
            None => *out = Decision::REJECTED,
        }
    }

    /// `sliding`'s check and commit; too few words reject.
    #[inline(never)]
    fn acquire_sliding(&self, s: &mut [u64], now: u64, cost: u64, out: &mut Decision) {
        match s.first_chunk_mut() {
            Some(s) => sliding::acquire(self, s, now, cost, out),
            None => *out = Decision::REJECTED,
        }
    }

    /// `sliding_log`'s check and commit; too few words reject.
    #[inline(never)]
    fn acquire_log(&self, s: &mut [u64], now: u64, cost: u64, out: &mut Decision) {
        out.set(log::acquire(self, s, now, cost));
    }

    /// The buckets' check, then their commit (bucket.rs has no step that
    /// does both); too few words reject.
    #[inline(never)]
    fn acquire_bucket(&self, s: &mut [u64], now: u64, cost: u64, out: &mut Decision) {
        if s.len() < 2 {
            *out = Decision::REJECTED;
            return;
        }
        let outcome = zero_cost(bucket::check(self, s, now, cost), cost);
        let charge = match outcome.admitted && cost != 0 {
            true => bucket::commit(self, s, now, cost),
            false => Charge::NONE,
        };
        *out = Decision { outcome, charge };
    }

    /// `gcra`'s check and commit; too few words reject.
    #[inline(never)]
    fn acquire_gcra(&self, s: &mut [u64], now: u64, cost: u64, out: &mut Decision) {
        match s.first_chunk_mut() {
            Some(s) => gcra::acquire(self, s, now, cost, out),
            None => *out = Decision::REJECTED,
        }
    }

    /// `concurrent`'s check and commit; too few words reject.
    #[inline(never)]
    fn acquire_conn(&self, s: &mut [u64], cost: u64, out: &mut Decision) {
        match s.first_chunk_mut() {
            Some(s) => {
                conn::acquire(self, s, cost, out);
                out.outcome = zero_cost(out.outcome, cost);
            }
            None => *out = Decision::REJECTED,
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
            Algorithm::Concurrent => conn::overdraw(state, cost),
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
    /// One exception to "never more permissive", for the buckets and `gcra`:
    /// once a charge made before this one has been refunded, the level under
    /// this charge may be lower than the charge recorded, and the refund may
    /// give back up to what the rate refills between the charge and `now`
    /// more than the request took (bounded so by the time a refund waits,
    /// a Redis call's).
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
            Algorithm::Concurrent => conn::refund(state, charge),
        }
    }

    /// Takes back the last `unspent` units of `charge` (a charge of a
    /// static line), as [`Limit::refund`] takes back a whole one: the units
    /// spent are taken to be the first ones charged (the buckets' lower
    /// part of the charge, `gcra`'s earlier part of its TAT), the ones given
    /// back the last. `unspent` of the charge's cost or more refunds it all.
    pub fn refund_part(&self, state: &mut [u64], charge: &Charge, unspent: u64, now: u64) {
        let unspent = unspent.min(charge.cost);
        let spent = charge.cost - unspent;
        let part = match self.algorithm {
            Algorithm::TokenBucket | Algorithm::LeakyBucket => Charge {
                cost: unspent,
                below: charge.below.saturating_add(spent.saturating_mul(self.rate.period_us)),
                ..*charge
            },
            Algorithm::Gcra => {
                Charge { cost: unspent, at: charge.at.saturating_add(spent.saturating_mul(self.interval)), ..*charge }
            }
            _ => Charge { cost: unspent, ..*charge },
        };
        self.refund(state, &part, now);
    }

    /// [`Limit::check`], then [`Limit::commit`] if admitted.
    pub fn acquire(&self, state: &mut [u64], now: u64, cost: u64) -> Outcome {
        self.acquire_charged(state, now, cost).0
    }

    /// [`Limit::acquire`], returning also what it charged (for a refund):
    /// [`Charge::NONE`] when it rejects, so a caller can keep the charge
    /// whatever the verdict. A static line checks and charges in one step,
    /// from the same values.
    pub fn acquire_charged(&self, state: &mut [u64], now: u64, cost: u64) -> (Outcome, Charge) {
        let mut decision = Decision::REJECTED;
        self.acquire_into(state, now, cost, &mut decision);
        (decision.outcome, decision.charge)
    }

    /// [`Limit::check`] for a request that must leave `kept` units of the
    /// budget (the reserves of the classes above its own, `classes=`): it
    /// passes only where `cost + kept` would, and what it is told is left
    /// is what its class may still spend. A request of cost 0 spends
    /// nothing, and passes as it does on any line.
    pub fn check_keeping(&self, state: &[u64], now: u64, cost: u64, kept: u64) -> Outcome {
        if kept == 0 {
            return self.check(state, now, cost);
        }
        let wide = if cost == 0 { 0 } else { cost.saturating_add(kept) };
        let checked = self.check(state, now, wide);
        // Admitted, it is charged cost alone: what a check of cost says (its reset, its next
        // unit), less what the classes above keep.
        let mut o = match checked.admitted && wide != cost {
            true => self.check(state, now, cost),
            false => checked,
        };
        o.remaining = o.remaining.saturating_sub(kept);
        o
    }

    /// [`Limit::acquire_into`] for a request that must leave `kept` units
    /// ([`Limit::check_keeping`]): admitted where `cost + kept` would be,
    /// charged `cost` only.
    #[inline(never)]
    pub fn acquire_keeping(&self, state: &mut [u64], now: u64, cost: u64, kept: u64, out: &mut Decision) {
        let o = self.check_keeping(state, now, cost, kept);
        if !o.admitted {
            out.outcome = o;
            out.charge = Charge::NONE;
            return;
        }
        // (a check that admits cost + kept admits cost: what is left only grows as cost shrinks)
        self.acquire_into(state, now, cost, out);
        out.outcome.remaining = out.outcome.remaining.saturating_sub(kept);
    }

    /// [`Limit::acquire_charged`], written in `out`: the algorithm's step
    /// writes the caller's record once, where a returned pair would be
    /// copied into it.
    #[inline]
    pub fn acquire_into(&self, state: &mut [u64], now: u64, cost: u64, out: &mut Decision) {
        if now > MAX_NOW {
            return self.acquire_late(state, cost, out);
        }
        match self.path {
            Path::Fixed => self.acquire_fixed(state, now, cost, out),
            Path::Sliding => self.acquire_sliding(state, now, cost, out),
            Path::Log => self.acquire_log(state, now, cost, out),
            Path::Bucket => self.acquire_bucket(state, now, cost, out),
            Path::Gcra => self.acquire_gcra(state, now, cost, out),
            Path::Conn => self.acquire_conn(state, cost, out),
            Path::Varying => self.acquire_varying(state, now, cost, out),
        }
    }

    /// [`Limit::acquire_into`] at a time past [`MAX_NOW`], which is
    /// treated as [`MAX_NOW`] (out of the way: it does not happen).
    #[cold]
    #[inline(never)]
    fn acquire_late(&self, state: &mut [u64], cost: u64, out: &mut Decision) {
        self.acquire_into(state, MAX_NOW, cost, out)
    }

    /// [`Limit::acquire_charged`] of a varying line: a state fresh or in the
    /// line's own scale (its values have not changed: the usual request) is
    /// the static line's, decided in one step and then tagged, as a commit
    /// tags it; else its check, then its commit, each converting the state
    /// (vary.rs).
    #[inline(never)]
    fn acquire_varying(&self, state: &mut [u64], now: u64, cost: u64, out: &mut Decision) {
        let n = self.static_words();
        let own = vary::scale(self);
        if state.len() >= self.state_words() && state.get(n).is_some_and(|&tag| tag == 0 || tag == own) {
            match self.algorithm {
                Algorithm::Fixed => self.acquire_fixed(state, now, cost, out),
                Algorithm::Sliding => self.acquire_sliding(state, now, cost, out),
                Algorithm::TokenBucket | Algorithm::LeakyBucket => self.acquire_bucket(state, now, cost, out),
                Algorithm::Gcra => self.acquire_gcra(state, now, cost, out),
                // (never tagged)
                Algorithm::SlidingLog => self.acquire_log(state, now, cost, out),
                Algorithm::Concurrent => self.acquire_conn(state, cost, out),
            }
            if out.charge.cost == 0 {
                return;
            }
            if let Some(tag) = state.get_mut(n) {
                *tag = own;
            }
            out.charge.tag = own;
            return;
        }
        let outcome = self.check_varying(state, now, cost);
        let charge = if outcome.admitted { self.commit_varying(state, now, cost) } else { Charge::default() };
        *out = Decision { outcome, charge };
    }

    /// Microseconds from `now` until the state lets one more unit pass at
    /// once than it does now, if nothing else arrives ([`Outcome::next_us`]):
    /// the wait of a lone request of cost `remaining + 1`, checked as if the
    /// line had no queue; 0 when the state is full. It is the `t` of the
    /// `RateLimit` field, "the time until additional quota is made
    /// available": the end of the window for `fixed`, the next unit's
    /// refill for the buckets and `gcra`, the oldest timestamp's expiry for
    /// `sliding_log`, the previous window's weight dropping by a unit (or
    /// this one's, in the next window) for `sliding`. Asked for only by
    /// lines that send it: it costs a second check.
    pub fn next_us(&self, state: &[u64], now: u64) -> u64 {
        self.next_after(state, now, self.check(state, now, 0).remaining)
    }

    /// [`Limit::next_us`] of a state that lets `remaining` pass now.
    fn next_after(&self, state: &[u64], now: u64, remaining: u64) -> u64 {
        if remaining >= self.burst {
            return 0;
        }
        let unqueued = Limit { queue: 0, ..*self };
        unqueued.check(state, now, remaining + 1).retry_after_us.unwrap_or(0)
    }

    /// What the state has left at `now`: a check of cost 0 (remaining,
    /// reset), with [`Outcome::next_us`]. What a line that was not charged
    /// reports ([`Outcome::uncharged`]), and what `rl_quota` shows.
    pub fn left(&self, state: &[u64], now: u64) -> Outcome {
        let o = self.check(state, now, 0);
        Outcome { next_us: self.next_after(state, now, o.remaining), ..o }
    }

    /// `retry` when a request of `cost` can ever pass, else `None`.
    fn retry(&self, cost: u64, retry: impl FnOnce() -> u64) -> Option<u64> {
        (cost <= self.burst).then(retry)
    }
}

/// What [`Limit::acquire_into`] decided about a request, and what that
/// charged ([`Charge::NONE`] when it rejects).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Decision {
    pub outcome: Outcome,
    pub charge: Charge,
}

impl Decision {
    /// Rejected, nothing charged (what a state too short for its line
    /// gets): all-zero bytes, which the module's zeroed request results
    /// rely on.
    pub const REJECTED: Decision = Decision {
        outcome: Outcome { admitted: false, remaining: 0, reset_us: 0, retry_after_us: None, delay_us: 0, next_us: 0 },
        charge: Charge::NONE,
    };

    /// Writes an algorithm's step, field by field (a copy of the pair would
    /// go through the stack).
    #[inline(always)]
    fn set(&mut self, (outcome, charge): (Outcome, Charge)) {
        self.outcome.admitted = outcome.admitted;
        self.outcome.remaining = outcome.remaining;
        self.outcome.reset_us = outcome.reset_us;
        self.outcome.retry_after_us = outcome.retry_after_us;
        self.outcome.delay_us = outcome.delay_us;
        self.outcome.next_us = outcome.next_us;
        self.charge = charge;
    }
}

/// What a request does to a state of `N` words: its outcome and, when it
/// charges (admitted, cost 1 or more), the words it leaves and the charge.
type Step<const N: usize> = (Outcome, Option<([u64; N], Charge)>);

/// What an algorithm's acquire charges, its outcome unused (a commit).
#[inline(always)]
fn charge_of(acquire: impl FnOnce(&mut Decision)) -> Charge {
    let mut d = Decision::REJECTED;
    acquire(&mut d);
    d.charge
}

/// Stores what `step` charges, and writes its outcome and charge in `out`.
#[inline(always)]
fn write<const N: usize>(s: &mut [u64; N], (outcome, charged): Step<N>, out: &mut Decision) {
    out.outcome = outcome;
    match charged {
        Some((words, charge)) => {
            *s = words;
            out.charge = charge;
        }
        None => out.charge = Charge::NONE,
    }
}

/// The outcome of a check of cost 0, which charges nothing and so passes
/// even when a lagging clock sees the key over its limit.
fn zero_cost(outcome: Outcome, cost: u64) -> Outcome {
    match cost {
        0 => Outcome::admit(outcome.remaining, outcome.reset_us, 0),
        _ => outcome,
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
/// In `u64` when `a` fits, which spares the `u128` division's call.
#[inline(always)]
fn div_ceil(a: u128, b: u64) -> u128 {
    let b = b.max(1);
    match u64::try_from(a) {
        Ok(a) => a.div_ceil(b).into(),
        Err(_) => div_ceil_wide(a, b),
    }
}

/// [`div_ceil`] of an `a` beyond `u64`, out of line: the usual request
/// does not need its registers.
#[cold]
#[inline(never)]
fn div_ceil_wide(a: u128, b: u64) -> u128 {
    a.div_ceil(u128::from(b))
}
