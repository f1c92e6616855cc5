//! What a memcached zone's counters mean: the keys a line counts in at a
//! given time, and a request's outcome from the counts a round trip read.
//!
//! A line keeps one counter per window, named by the window's length and
//! index (so a varying rate whose window changes starts a count of its
//! own). A request's round trip adds its cost to the current window's
//! counter and reads the new count (and, for `sliding`, the previous
//! window's): the count less the cost is the state the request met, others'
//! requests in flight included, so the model's own check
//! ([`Limit::check`]) decides, and no two requests of a fleet meet the same
//! count. A request is admitted iff every enforced line admits it; the
//! counters of a request that is not admitted are taken back (as are a
//! dry-run line's that would not admit it), so a rejected request is
//! charged nowhere. Until they are, its units count for the requests that
//! meet them: a request may be refused for units that are then given
//! back, never admitted beyond the burst.

use core::fmt::Write;

use smallvec::SmallVec;

use crate::limit::{Algorithm, Limit, Outcome};
use crate::verdict;

/// Whether a memcached zone can serve `limit`: the window counters of
/// `fixed` and `sliding`. The buckets and `gcra` would need a
/// compare-and-swap loop, which fails over and over on a contended key;
/// `sliding_log` a list per key.
pub fn supports(limit: &Limit) -> bool {
    matches!(limit.algorithm(), Algorithm::Fixed | Algorithm::Sliding)
}

/// The TTL beyond a counter's last use: its round trip may come late
/// (the zone's timeout is at most a minute, but a second covers every
/// request that is answered), and memcached's clock ticks in seconds.
const TTL_MARGIN_S: u64 = 1;

/// memcached reads an exptime above 30 days as a Unix time.
const RELATIVE_TTL_MAX_S: u64 = 30 * 24 * 3600;

/// The keys of a line at a time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LineKeys {
    /// The counter of the window `now` is in.
    pub curr: String,
    /// `sliding`: the counter of the window before (none before the first).
    pub prev: Option<String>,
    /// The exptime a new current counter gets (memcached's token: seconds,
    /// or a Unix time beyond 30 days): it lives until the last window it
    /// is read in ends, and [`TTL_MARGIN_S`] more.
    pub ttl: u32,
}

/// The window `now` is in, for `limit`, and its length (µs).
fn window_of(limit: &Limit, now_us: u64) -> (u64, u64) {
    let w = limit.window_us().max(1);
    (now_us / w, w)
}

/// Appends a counter's key: `{prefix}{tag}:{line}:{window length}:{index}`
/// (hex, hex, µs, decimal): at most 16 + 16 + 20 + 20 + 3 characters after
/// the prefix, whatever the client key.
fn write_key(out: &mut String, prefix: &str, tag: u64, line_id: u64, w: u64, k: u64) {
    out.push_str(prefix);
    // Writing to a String cannot fail.
    let _ = write!(out, "{tag:016x}:{line_id:016x}:{w}:{k}");
}

/// The keys of line `line_id` of client key tag `tag` at `now_us` (µs of
/// the Unix epoch: windows are aligned to it, as on other zones).
pub fn line_keys(prefix: &str, tag: u64, line_id: u64, limit: &Limit, now_us: u64) -> LineKeys {
    let (k, w) = window_of(limit, now_us);
    let key = |k: u64| {
        let mut s = String::with_capacity(prefix.len() + 80);
        write_key(&mut s, prefix, tag, line_id, w, k);
        s
    };
    let sliding = limit.algorithm() == Algorithm::Sliding;
    // (a sliding counter is read as the previous window's until the next one ends)
    let last_read = k.saturating_add(if sliding { 2 } else { 1 }).saturating_mul(w);
    let secs = last_read.saturating_sub(now_us).div_ceil(1_000_000) + TTL_MARGIN_S;
    let ttl = match secs {
        s if s <= RELATIVE_TTL_MAX_S => s,
        s => now_us / 1_000_000 + s,
    };
    LineKeys { curr: key(k), prev: (sliding && k > 0).then(|| key(k - 1)), ttl: u32::try_from(ttl).unwrap_or(u32::MAX) }
}

/// A line of a request, as a memcached zone decides it.
#[derive(Clone, Copy, Debug)]
pub struct McLine {
    pub limit: Limit,
    pub cost: u64,
    /// Never rejects the request; charged only if it admits it and the
    /// request is admitted.
    pub dry_run: bool,
    /// A `charge=after` line's check: a cost of 1, never charged here.
    pub check_only: bool,
    /// Reports [`Outcome::next_us`] (else 0).
    pub next: bool,
}

impl McLine {
    /// Whether the round trip adds the line's cost to its counter: in a
    /// call that charges (not an `rl_quota` read), with a cost, not a
    /// `charge=after` check.
    pub fn charges(&self, commit: bool) -> bool {
        commit && !self.check_only && self.cost > 0
    }
}

/// What a round trip read of a line: its window's count (after the
/// request's increment, if [`McLine::charges`]) and, for `sliding`, the
/// previous window's (0 where there is none, or the counter is gone).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub curr: u64,
    pub prev: u64,
}

/// A request's outcome: admitted, each line's outcome, and for each line
/// whether its increment is taken back.
pub type Decided = (bool, SmallVec<[Outcome; 2]>, SmallVec<[bool; 2]>);

/// The outcome of a request whose lines read `counts` at `now_us`
/// (`commit`: a call that charges). Each line's outcome is the model's
/// check of the state its round trip met; a line that admits but is not
/// charged (the request is rejected, the line is a check, or the call a
/// read) reports what its state has left ([`Outcome::uncharged`]), as the
/// Redis script does.
pub fn outcome(lines: &[McLine], counts: &[Counts], now_us: u64, commit: bool) -> Decided {
    let mut met: SmallVec<[([u64; 3], Limit); 2]> = SmallVec::new();
    let mut checks: SmallVec<[Outcome; 2]> = SmallVec::new();
    for (line, c) in lines.iter().zip(counts) {
        let limit = line.limit.unvarying();
        let (k, _) = window_of(&limit, now_us);
        let before = if line.charges(commit) { c.curr.saturating_sub(line.cost) } else { c.curr };
        let state = [k + 1, before, c.prev];
        let cost = if line.check_only { 1 } else { line.cost };
        checks.push(limit.check(&state, now_us, cost));
        met.push((state, limit));
    }
    let decision = verdict::combine(checks.iter().zip(lines).map(|(o, l)| (o, l.dry_run)));
    let mut outcomes = SmallVec::new();
    let mut undo = SmallVec::new();
    for ((line, o), (state, limit)) in lines.iter().zip(&checks).zip(&met) {
        let charges = line.charges(commit);
        let kept = charges && decision.admitted && o.admitted;
        let after = match kept {
            true => [state[0], state[1].saturating_add(line.cost), state[2]],
            false => *state,
        };
        let mut out = match (o.admitted, kept) {
            (true, false) => o.uncharged(&limit.left(state, now_us)),
            _ => *o,
        };
        out.next_us = match line.next {
            true => limit.next_us(&after, now_us),
            false => 0,
        };
        outcomes.push(out);
        undo.push(charges && !kept);
    }
    (decision.admitted, outcomes, undo)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::Rate;

    fn limit(alg: Algorithm, count: u64, period_s: u64, burst: u64) -> Limit {
        Limit::new(alg, Rate { count, period_us: period_s * 1_000_000 }, burst).unwrap()
    }

    fn line(limit: Limit, cost: u64) -> McLine {
        McLine { limit, cost, dry_run: false, check_only: false, next: false }
    }

    #[test]
    fn keys_name_the_window_and_live_until_it_is_last_read() {
        let fixed = limit(Algorithm::Fixed, 10, 60, 10);
        let now = 120_500_000; // 0.5 s into window 2
        let k = line_keys("rl:", 0xab, 0xcd, &fixed, now);
        assert_eq!(k.curr, "rl:00000000000000ab:00000000000000cd:60000000:2");
        assert_eq!((k.prev, k.ttl), (None, 60 + 1));
        let sliding = limit(Algorithm::Sliding, 10, 60, 10);
        let k = line_keys("p:", 1, 2, &sliding, now);
        assert_eq!(k.prev.as_deref(), Some("p:0000000000000001:0000000000000002:60000000:1"));
        assert_eq!(k.ttl, 120 + 1);
        assert!(k.curr.len() <= 128 + 80);
    }

    #[test]
    fn a_ttl_beyond_30_days_is_a_unix_time() {
        let yearly = limit(Algorithm::Fixed, 1, 365 * 86_400, 1);
        let now = 1_800_000_000_000_000;
        let k = line_keys("rl:", 1, 2, &yearly, now);
        assert!(u64::from(k.ttl) > now / 1_000_000, "{}", k.ttl);
    }

    /// Counts met one after another are the model's states: the same
    /// verdicts as `Limit::acquire` on one state.
    #[test]
    fn sequential_counts_decide_as_the_model() {
        for alg in [Algorithm::Fixed, Algorithm::Sliding] {
            let l = limit(alg, 5, 10, 5);
            let mut state = [0u64; 3];
            let mut counts = std::collections::HashMap::<u64, u64>::new();
            for i in 0..40u64 {
                let now = 3_000_000 + i * 700_000;
                let model = l.acquire(&mut state, now, 1);
                let k = now / l.window_us();
                let curr = *counts.entry(k).or_insert(0) + 1;
                counts.insert(k, curr);
                let prev = k.checked_sub(1).and_then(|p| counts.get(&p)).copied().unwrap_or(0);
                let (admitted, o, undo) = outcome(&[line(l, 1)], &[Counts { curr, prev }], now, true);
                assert_eq!(admitted, model.admitted, "{alg:?} request {i}");
                assert_eq!((o[0].remaining, o[0].retry_after_us), (model.remaining, model.retry_after_us));
                if undo[0] {
                    counts.insert(k, curr - 1);
                }
            }
        }
    }

    /// A line rejects: the others are taken back and report what they
    /// have left; a dry-run line never rejects.
    #[test]
    fn all_or_nothing() {
        let wide = limit(Algorithm::Fixed, 10, 60, 10);
        let narrow = limit(Algorithm::Fixed, 2, 60, 2);
        let now = 1_000_000;
        let (admitted, o, undo) = outcome(
            &[line(wide, 1), line(narrow, 1)],
            &[Counts { curr: 4, prev: 0 }, Counts { curr: 3, prev: 0 }],
            now,
            true,
        );
        assert!(!admitted);
        assert_eq!(&undo[..], &[true, true]);
        assert_eq!(o[0].remaining, 7, "wide reports what it has left: 10 - 3");
        assert!(!o[1].admitted);
        let dry = McLine { dry_run: true, ..line(narrow, 1) };
        let (admitted, _, undo) =
            outcome(&[line(wide, 1), dry], &[Counts { curr: 4, prev: 0 }, Counts { curr: 3, prev: 0 }], now, true);
        assert!(admitted);
        assert_eq!(&undo[..], &[false, true], "a dry-run line that rejects is not charged");
    }

    /// A `charge=after` check and a read change nothing and decide as a
    /// check of the count.
    #[test]
    fn checks_and_reads_charge_nothing() {
        let l = limit(Algorithm::Fixed, 2, 60, 2);
        let check = McLine { check_only: true, ..line(l, 5) };
        let (admitted, o, undo) = outcome(&[check], &[Counts { curr: 1, prev: 0 }], 1, true);
        assert!(admitted && !undo[0] && o[0].remaining == 1);
        let (admitted, _, undo) = outcome(&[check], &[Counts { curr: 2, prev: 0 }], 1, true);
        assert!(!admitted && !undo[0]);
        let (admitted, o, undo) = outcome(&[line(l, 1)], &[Counts { curr: 1, prev: 0 }], 1, false);
        assert!(admitted && !undo[0] && o[0].remaining == 1);
    }
}
