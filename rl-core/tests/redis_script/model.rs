//! The Rust model the script is held to: `rl_core`'s `Limit::check` and
//! `Limit::commit` over a whole call, its answers in the script's terms, its
//! state as the script stores it.

use rl_core::limit::{Algorithm, Limit, Outcome};
use rl_core::redis::LineArg;
use rl_core::verdict::combine;

/// The model of one call: check every line; the request is admitted iff
/// every enforced line admits it, and then the lines that admit it are
/// committed (`combine`).
pub(crate) fn model<T: Copy + Into<LineArg>>(
    lines: &[T],
    states: &mut [Vec<u64>],
    now: u64,
    commit: bool,
) -> (bool, Vec<Outcome>) {
    let lines: Vec<LineArg> = lines.iter().map(|&l| l.into()).collect();
    let outs: Vec<Outcome> = lines.iter().zip(states.iter()).map(|(a, s)| a.limit.check(s, now, a.cost)).collect();
    let d = combine(outs.iter().zip(&lines).map(|(o, a)| (o, a.dry_run)));
    if commit {
        for ((a, s), o) in lines.iter().zip(states.iter_mut()).zip(&outs) {
            if d.charges(o) {
                a.limit.commit(s, now, a.cost);
            }
        }
    }
    (d.admitted, outs)
}

/// The model of a call's deadline: a call that runs after it does nothing
/// (`None`), else it is [`model`].
pub(crate) fn model_until<T: Copy + Into<LineArg>>(
    lines: &[T],
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
