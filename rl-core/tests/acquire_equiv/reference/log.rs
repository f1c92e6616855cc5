// rl-core/src/limit/log.rs as of 9548b9f, verbatim.
//! Sliding log: one timestamp per admitted cost unit; a unit admitted at `t`
//! counts during `[t, t+W)`, so at most `B` units are admitted in any
//! interval of length `W` — exactly. Memory grows with the burst:
//! `2 + B` words per key (hence [`super::MAX_LOG_BURST`]).
//!
//! State: `[head, len, ring[B]]`, a ring buffer of timestamps, oldest at
//! `head`. Timestamps are kept non-decreasing: a unit charged while the clock
//! is behind the newest entry is stamped with that newest time instead
//! (it then expires later, never earlier).

use super::{Charge, Limit, Outcome};

/// The state as seen at `now`.
struct View<'a> {
    /// The ring of timestamps.
    ring: &'a [u64],
    /// Index of the oldest entry.
    head: usize,
    /// Entries stored, live or expired.
    len: usize,
    /// Leading entries already expired at `now`.
    expired: usize,
}

impl View<'_> {
    /// The `i`-th oldest stored timestamp.
    fn at(&self, i: usize) -> u64 {
        self.ring[(self.head + i) % self.ring.len()]
    }

    /// Entries still counting.
    fn live(&self) -> u64 {
        (self.len - self.expired) as u64
    }

    /// The newest timestamp, if any entry is stored.
    fn newest(&self) -> Option<u64> {
        self.len.checked_sub(1).map(|i| self.at(i))
    }

    /// How many leading entries `before` holds for, by binary search (the
    /// timestamps are non-decreasing).
    fn count(&self, before: impl Fn(u64) -> bool) -> usize {
        let (mut lo, mut hi) = (0, self.len);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if before(self.at(mid)) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    }
}

/// Reads the state at `now`: finds the expired prefix by binary search.
fn load<'a>(l: &Limit, s: &'a [u64], now: u64) -> View<'a> {
    let n = l.state_words() - 2;
    let ring = &s[2..2 + n];
    let mut v = View { ring, head: (s[0] % n as u64) as usize, len: s[1].min(n as u64) as usize, expired: 0 };
    v.expired = v.count(|t| t.saturating_add(l.window) <= now);
    v
}

/// Time until every live entry (the newest one last) has expired.
fn reset(l: &Limit, newest: Option<u64>, live: u64, now: u64) -> u64 {
    match newest {
        Some(t) if live > 0 => t.saturating_add(l.window).saturating_sub(now),
        _ => 0,
    }
}

/// The timestamp a unit charged at `now` gets.
fn stamp(v: &View, now: u64) -> u64 {
    v.newest().map_or(now, |t| t.max(now))
}

/// Exact wait for a rejected `cost ≤ B`: until the oldest
/// `live + cost − B` live entries have expired.
fn retry(l: &Limit, v: &View, now: u64, cost: u64) -> u64 {
    let need = v.live() + cost - l.burst;
    let last = v.expired + (need - 1) as usize;
    v.at(last).saturating_add(l.window).saturating_sub(now).max(1)
}

/// See [`Limit::check`].
pub(super) fn check(l: &Limit, s: &[u64], now: u64, cost: u64) -> Outcome {
    let v = load(l, s, now);
    let free = l.burst - v.live();
    if cost <= free {
        let newest = if cost > 0 { Some(stamp(&v, now)) } else { v.newest() };
        let reset = reset(l, newest, v.live() + cost, now);
        return Outcome::admit(free - cost, reset, 0);
    }
    let retry = l.retry(cost, || retry(l, &v, now, cost));
    Outcome::reject(free, reset(l, v.newest(), v.live(), now), retry)
}

/// See [`Limit::commit`]: drops expired entries, appends `cost` stamps.
pub(super) fn commit(l: &Limit, s: &mut [u64], now: u64, cost: u64) -> Charge {
    let v = load(l, s, now);
    if cost > l.burst - v.live() {
        return Charge::default();
    }
    let (n, t) = (v.ring.len(), stamp(&v, now));
    let (head, live) = ((v.head + v.expired) % n, v.live() as usize);
    for i in 0..cost as usize {
        s[2 + (head + live + i) % n] = t;
    }
    s[0] = head as u64;
    s[1] = (live + cost as usize) as u64;
    Charge { cost, at: t, below: 0, tag: 0 }
}

/// See [`Limit::overdraw`]: a log holds at most `B` live entries, so it
/// charges what fits, as [`commit`] would.
pub(super) fn overdraw(l: &Limit, s: &mut [u64], now: u64, cost: u64) -> Charge {
    match cost.min(l.burst - load(l, s, now).live()) {
        0 => Charge::default(),
        fits => commit(l, s, now, fits),
    }
}

/// See [`Limit::refund`]: drops `cost` entries stamped with the charge's
/// time (entries with one stamp are interchangeable), the later entries
/// moving down; once they have expired this changes nothing.
pub(super) fn refund(l: &Limit, s: &mut [u64], charge: &Charge) {
    let v = load(l, s, 0);
    let (n, head, len) = (v.ring.len(), v.head, v.len);
    let end = v.count(|t| t <= charge.at);
    let start = v.count(|t| t < charge.at).min(end);
    let k = (end - start).min(charge.cost as usize);
    let ring = &mut s[2..2 + n];
    for i in end..len {
        ring[(head + i - k) % n] = ring[(head + i) % n];
    }
    s[1] = (len - k) as u64;
}
