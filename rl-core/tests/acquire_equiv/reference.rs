//! The reference model: `Limit::check`, `commit`, `acquire`,
//! `acquire_charged`, `overdraw` and `refund` of a static line as they were
//! before the fused `acquire` (rl-core/src/limit.rs as of 9548b9f, and its
//! algorithms' files, copied verbatim into `reference/`), over a copy of
//! the limit's parameters read through the public API.

mod bucket;
mod fixed;
mod gcra;
mod log;
mod sliding;

use rl_core::limit::{Algorithm, MAX_NOW};
use rl_core::parse::Rate;

/// The limit's parameters, as `rl_core::limit::Limit` derives them.
#[derive(Clone, Copy, Debug)]
pub struct Limit {
    algorithm: Algorithm,
    rate: Rate,
    burst: u64,
    queue: u64,
    window: u64,
    interval: u64,
    capacity: u64,
}

/// The charge, with the field names of `rl_core::limit::Charge`, whose
/// fields are private: the two compare by their `Debug` text.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Charge {
    pub cost: u64,
    pub at: u64,
    pub below: u64,
    pub tag: u64,
}

impl Charge {
    pub const NONE: Charge = Charge { cost: 0, at: 0, below: 0, tag: 0 };
}

/// `rl_core::limit::Outcome`, whose `admit` and `reject` are the crate's
/// own.
#[derive(Clone, Copy, Debug, Default)]
struct Outcome {
    admitted: bool,
    remaining: u64,
    reset_us: u64,
    retry_after_us: Option<u64>,
    delay_us: u64,
}

impl Outcome {
    fn admit(remaining: u64, reset_us: u64, delay_us: u64) -> Self {
        Outcome { admitted: true, remaining, reset_us, retry_after_us: None, delay_us }
    }

    fn reject(remaining: u64, reset_us: u64, retry: Option<u64>) -> Self {
        Outcome { admitted: false, remaining, reset_us, retry_after_us: retry, delay_us: 0 }
    }

    fn public(self) -> rl_core::limit::Outcome {
        let Outcome { admitted, remaining, reset_us, retry_after_us, delay_us } = self;
        rl_core::limit::Outcome { admitted, remaining, reset_us, retry_after_us, delay_us, next_us: 0 }
    }
}

impl Limit {
    /// The parameters of a static `l`.
    pub fn of(l: &rl_core::limit::Limit) -> Limit {
        let rate = l.rate();
        Limit {
            algorithm: l.algorithm(),
            rate,
            burst: l.burst(),
            queue: l.queue(),
            window: l.window_us(),
            interval: rate.period_us.div_ceil(rate.count),
            capacity: l.burst() * rate.period_us,
        }
    }

    pub fn state_words(&self) -> usize {
        match self.algorithm {
            Algorithm::Fixed | Algorithm::TokenBucket | Algorithm::LeakyBucket => 2,
            Algorithm::Sliding => 3,
            Algorithm::Gcra => 1,
            Algorithm::SlidingLog => usize::try_from(self.burst).map_or(usize::MAX, |b| b + 2),
            Algorithm::Concurrent => unreachable!("the reference has the rate algorithms only"),
        }
    }

    pub fn check(&self, state: &[u64], now: u64, cost: u64) -> rl_core::limit::Outcome {
        self.check_inline(state, now, cost).public()
    }

    fn check_inline(&self, state: &[u64], now: u64, cost: u64) -> Outcome {
        if state.len() < self.state_words() {
            return Outcome::default();
        }
        let now = now.min(MAX_NOW);
        let outcome = match self.algorithm {
            Algorithm::Fixed => fixed::check(self, state, now, cost),
            Algorithm::Sliding => sliding::check(self, state, now, cost),
            Algorithm::SlidingLog => log::check(self, state, now, cost),
            Algorithm::TokenBucket | Algorithm::LeakyBucket => bucket::check(self, state, now, cost),
            Algorithm::Gcra => gcra::check(self, state, now, cost),
            Algorithm::Concurrent => unreachable!("the reference has the rate algorithms only"),
        };
        match cost {
            0 => Outcome::admit(outcome.remaining, outcome.reset_us, 0),
            _ => outcome,
        }
    }

    pub fn commit(&self, state: &mut [u64], now: u64, cost: u64) -> Charge {
        if state.len() < self.state_words() || cost == 0 {
            return Charge::default();
        }
        let now = now.min(MAX_NOW);
        match self.algorithm {
            Algorithm::Fixed => fixed::commit(self, state, now, cost),
            Algorithm::Sliding => sliding::commit(self, state, now, cost),
            Algorithm::SlidingLog => log::commit(self, state, now, cost),
            Algorithm::TokenBucket | Algorithm::LeakyBucket => bucket::commit(self, state, now, cost),
            Algorithm::Gcra => gcra::commit(self, state, now, cost),
            Algorithm::Concurrent => unreachable!("the reference has the rate algorithms only"),
        }
    }

    pub fn overdraw(&self, state: &mut [u64], now: u64, cost: u64) -> Charge {
        if state.len() < self.state_words() || cost == 0 {
            return Charge::default();
        }
        let now = now.min(MAX_NOW);
        match self.algorithm {
            Algorithm::Fixed => fixed::overdraw(self, state, now, cost),
            Algorithm::Sliding => sliding::overdraw(self, state, now, cost),
            Algorithm::SlidingLog => log::overdraw(self, state, now, cost),
            Algorithm::TokenBucket | Algorithm::LeakyBucket => bucket::overdraw(self, state, now, cost),
            Algorithm::Gcra => gcra::overdraw(self, state, now, cost),
            Algorithm::Concurrent => unreachable!("the reference has the rate algorithms only"),
        }
    }

    pub fn refund(&self, state: &mut [u64], charge: &Charge, now: u64) {
        if state.len() < self.state_words() || charge.cost == 0 {
            return;
        }
        let now = now.min(MAX_NOW);
        match self.algorithm {
            Algorithm::Fixed => fixed::refund(state, charge),
            Algorithm::Sliding => sliding::refund(state, charge),
            Algorithm::SlidingLog => log::refund(self, state, charge),
            Algorithm::TokenBucket | Algorithm::LeakyBucket => bucket::refund(self, state, charge),
            Algorithm::Gcra => gcra::refund(self, state, charge, now),
            Algorithm::Concurrent => unreachable!("the reference has the rate algorithms only"),
        }
    }

    pub fn acquire(&self, state: &mut [u64], now: u64, cost: u64) -> rl_core::limit::Outcome {
        self.acquire_charged(state, now, cost).0
    }

    pub fn acquire_charged(&self, state: &mut [u64], now: u64, cost: u64) -> (rl_core::limit::Outcome, Charge) {
        let outcome = self.check_inline(state, now, cost);
        let charge = if outcome.admitted { self.commit(state, now, cost) } else { Charge::default() };
        (outcome.public(), charge)
    }

    fn retry(&self, cost: u64, retry: impl FnOnce() -> u64) -> Option<u64> {
        (cost <= self.burst).then(retry)
    }
}

fn mul(a: u64, b: u64) -> u128 {
    u128::from(a) * u128::from(b)
}

fn overdrawn(x: u128, charge: Charge) -> (u64, Charge) {
    match u64::try_from(x) {
        Ok(x) => (x, charge),
        Err(_) => (u64::MAX, Charge::NONE),
    }
}

fn sat(x: u128) -> u64 {
    u64::try_from(x).unwrap_or(u64::MAX)
}

fn div_ceil(a: u128, b: u64) -> u128 {
    a.div_ceil(u128::from(b.max(1)))
}
