//! What the tests share: limits, state keys, and the parameters and start
//! time of the table cases.

use rl_core::limit::{Algorithm, Limit};
use rl_core::parse::Rate;
use rl_core::redis::{state_key, tag_of};

pub(crate) fn limit(alg: Algorithm, count: u64, period_us: u64, burst: u64) -> Limit {
    Limit::new(alg, Rate { count, period_us }, burst).unwrap()
}

pub(crate) fn keys(n: usize) -> Vec<String> {
    let tag = tag_of(b"client");
    (0..n).map(|i| state_key("rl:", tag, i as u64)).collect()
}

/// Parameters of the table cases: 2 r/s, burst 3 (W = 1.5 s, T = 0.5 s).
pub(crate) fn case_limit(alg: Algorithm) -> Limit {
    limit(alg, 2, 1_000_000, 3)
}

/// A multiple of W = 1.5 s near 2023.
pub(crate) const T0: u64 = 1_700_000_001_000_000;
