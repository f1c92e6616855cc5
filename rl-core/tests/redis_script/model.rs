//! The Rust model the script is held to: `rl_core`'s `Limit::check` and
//! `Limit::commit` over a whole call, its answers in the script's terms, its
//! state as the script stores it.

use rl_core::limit::{Algorithm, Charge, Limit, Outcome};
use rl_core::redis::{exact, LineArg, MAX_EXACT};
use rl_core::verdict::combine;

/// The cost a line is checked with: 1 for a `charge=after` line's check.
pub(crate) fn checked_cost(a: &LineArg) -> u64 {
    if a.check_only {
        1
    } else {
        a.cost
    }
}

/// The model of one call: check every line; the request is admitted iff
/// every enforced line admits it, and then the lines that admit it are
/// committed (`combine`), but for `charge=after` lines' checks. A line that
/// reports `next` reports `Limit::next_us` of its state after its own
/// charge; in a call that commits, a line that admits the request but is
/// not charged reports what its state has left (`Limit::left`).
pub(crate) fn model<T: Copy + Into<LineArg>>(
    lines: &[T],
    states: &mut [Vec<u64>],
    now: u64,
    commit: bool,
) -> (bool, Vec<Outcome>) {
    model_charged(lines, states, now, commit).0
}

/// [`model`], and what it charged: per line, `Limit::commit`'s `Charge`
/// (`Charge::NONE` for a line not charged), for a refund.
pub(crate) fn model_charged<T: Copy + Into<LineArg>>(
    lines: &[T],
    states: &mut [Vec<u64>],
    now: u64,
    commit: bool,
) -> ((bool, Vec<Outcome>), Vec<Charge>) {
    let lines: Vec<LineArg> = lines.iter().map(|&l| l.into()).collect();
    let mut charges = vec![Charge::NONE; lines.len()];
    let mut outs: Vec<Outcome> = lines
        .iter()
        .zip(states.iter())
        .map(|(a, s)| match converts_beyond_exact(&a.limit, s, now) {
            true => Outcome::default(),
            false => {
                let o = a.limit.check_keeping(s, now, checked_cost(a), a.kept);
                Outcome { next_us: next_after_charge(a, s, now, &o), ..o }
            }
        })
        .collect();
    let d = combine(outs.iter().zip(&lines).map(|(o, a)| (o, a.dry_run)));
    if commit {
        for (((a, s), o), c) in lines.iter().zip(states.iter_mut()).zip(outs.iter_mut()).zip(charges.iter_mut()) {
            if d.charges(o) && !a.check_only {
                *c = a.limit.commit(s, now, a.cost);
            } else if o.admitted {
                let left = a.limit.left(s, now);
                *o = o.uncharged(&Outcome { next_us: if a.next { left.next_us } else { 0 }, ..left });
                // (a line of classes: what the request's class may spend)
                o.remaining = o.remaining.saturating_sub(a.kept);
            }
        }
    }
    ((d.admitted, outs), charges)
}

/// The `next_us` a line reports with its check's outcome `o`: none unless
/// it reports it; else `Limit::next_us` of its state after its charge (the
/// state as it is if `o` charges nothing).
fn next_after_charge(a: &LineArg, s: &[u64], now: u64, o: &Outcome) -> u64 {
    if !a.next {
        return 0;
    }
    let mut after = s.to_vec();
    if o.admitted {
        a.limit.commit(&mut after, now, checked_cost(a));
    }
    a.limit.next_us(&after, now)
}

/// Whether the script fails closed on a varying line's state (rejects,
/// never, writes nothing): its bucket amount or `gcra` backlog, converted
/// to the line's scale, would leave the exact range, as an overdraft
/// charged under a slower scale can take it.
fn converts_beyond_exact(l: &Limit, s: &[u64], now: u64) -> bool {
    let rate = l.rate();
    let tag = s.last().copied().unwrap_or(0);
    let (amount, scale, from) = match l.algorithm() {
        _ if !l.is_varying() || tag == 0 => return false,
        Algorithm::TokenBucket | Algorithm::LeakyBucket => {
            if tag == bucket_tag(rate.count, rate.period_us) {
                return false;
            }
            let (period, count) = tagged_rate(tag);
            let drained = match count {
                Some(c) => u128::from(now.saturating_sub(s[1])) * u128::from(c),
                None => 0,
            };
            (u128::from(s[0]).saturating_sub(drained), rate.period_us, period.max(1))
        }
        Algorithm::Gcra => {
            let t = rate.period_us.div_ceil(rate.count);
            if tag == t {
                return false;
            }
            (u128::from(s[0].saturating_sub(now)), t, tag)
        }
        _ => return false,
    };
    (amount * u128::from(scale)).div_ceil(u128::from(from)) > u128::from(MAX_EXACT)
}

/// The periods of a unit (`r/s`, `r/m`, `r/h`, `r/d`).
const UNITS: [u64; 4] = [1_000_000, 60_000_000, 3_600_000_000, 86_400_000_000];

/// A varying bucket line's tag, its rate packed as the script and rl-core
/// pack it: a unit's index and the count (low bits 1), another period
/// below 2^32 and the count (2), else the period alone (0).
pub(crate) fn bucket_tag(count: u64, period: u64) -> u64 {
    match UNITS.iter().position(|&p| p == period) {
        Some(i) if count - 1 < 1 << 60 => (count - 1) << 4 | (i as u64) << 2 | 1,
        None if period < 1 << 32 && count - 1 < 1 << 30 => (count - 1) << 34 | period << 2 | 2,
        _ => period.min(u64::MAX >> 2) << 2,
    }
}

/// The period and (unless the tag kept the period alone) the count of the
/// rate a bucket tag packs.
fn tagged_rate(tag: u64) -> (u64, Option<u64>) {
    match tag & 3 {
        1 => (UNITS[(tag >> 2 & 3) as usize], Some((tag >> 4) + 1)),
        2 => (tag >> 2 & 0xffff_ffff, Some((tag >> 34) + 1)),
        _ => (tag >> 2, None),
    }
}

/// The model of a charge call: `Limit::overdraw` on each line in turn, but
/// for the lines the script refuses (and leaves alone): `sliding_log`, a
/// limit out of the exact range, a cost of `MAX_EXACT` or more, a `now`
/// beyond it, or a charge that would take the state beyond it (the
/// windows' count, the buckets' amount, `gcra`'s `TAT − now`, or a
/// varying line's state converted to its scale first). Returns
/// which lines it charged (a cost of 0 charges nothing, and counts).
pub(crate) fn model_charge(lines: &[(Limit, u64)], states: &mut [Vec<u64>], now: u64) -> Vec<bool> {
    lines
        .iter()
        .zip(states.iter_mut())
        .map(|(&(l, cost), s)| {
            if l.algorithm() == Algorithm::SlidingLog || !exact(&l) || cost >= MAX_EXACT || now > MAX_EXACT {
                return false;
            }
            if cost > 0 && converts_beyond_exact(&l, s, now) {
                return false;
            }
            if cost == 0 {
                return true;
            }
            let mut after = s.clone();
            l.overdraw(&mut after, now, cost);
            let held = match l.algorithm() {
                Algorithm::Fixed | Algorithm::Sliding | Algorithm::SlidingLog => after[1],
                Algorithm::TokenBucket | Algorithm::LeakyBucket => after[0],
                Algorithm::Gcra => after[0].saturating_sub(now),
                Algorithm::Concurrent => unreachable!("never on Redis"),
            };
            if held > MAX_EXACT {
                return false;
            }
            *s = after;
            true
        })
        .collect()
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
