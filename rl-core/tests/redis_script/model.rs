//! The Rust model the script is held to: `rl_core`'s `Limit::check` and
//! `Limit::commit` over a whole call, its answers in the script's terms, its
//! state as the script stores it.

use rl_core::limit::{Algorithm, Limit, Outcome};

/// The model of one call: check every line; commit all iff all admit.
pub(crate) fn model(lines: &[(Limit, u64)], states: &mut [Vec<u64>], now: u64, commit: bool) -> (bool, Vec<Outcome>) {
    let outs: Vec<Outcome> = lines.iter().zip(states.iter()).map(|((l, c), s)| l.check(s, now, *c)).collect();
    let all = outs.iter().all(|o| o.admitted);
    if all && commit {
        for ((l, c), s) in lines.iter().zip(states.iter_mut()) {
            l.commit(s, now, *c);
        }
    }
    (all, outs)
}

/// The model of a call's deadline: a call that runs after it does nothing
/// (`None`), else it is [`model`].
pub(crate) fn model_until(
    lines: &[(Limit, u64)],
    states: &mut [Vec<u64>],
    now: u64,
    commit: bool,
    deadline: Option<u64>,
) -> Option<(bool, Vec<Outcome>)> {
    if late(now, deadline) {
        return None;
    }
    Some(model(lines, states, now, commit))
}

/// Whether a call that runs at `now` is past its deadline.
pub(crate) fn late(now: u64, deadline: Option<u64>) -> bool {
    deadline.is_some_and(|d| now > d)
}

/// The model's state as the script stores it: words, or log entries newest
/// first.
pub(crate) fn stored(l: &Limit, s: &[u64]) -> String {
    let words = match l.algorithm() {
        Algorithm::SlidingLog => {
            let n = s.len() - 2;
            let (head, len) = (s[0] as usize % n, (s[1] as usize).min(n));
            (0..len).rev().map(|i| s[2 + (head + i) % n]).collect()
        }
        _ => s.to_vec(),
    };
    let words: Vec<String> = words.iter().map(u64::to_string).collect();
    words.join(" ")
}
