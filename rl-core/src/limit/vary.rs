//! Lines whose rate or burst changes from request to request
//! ([`Limit::varying`]).
//!
//! The static states are not monotone in the parameters: `gcra`'s backlog
//! `TAT − now` read with a smaller `T` is more requests, so raising the rate
//! would admit fewer. A varying line's state therefore ends with a tag, the
//! scale its used amount is counted in as of the last write: `W` (`fixed`,
//! `sliding`), `T` (`gcra`), and for the buckets the whole rate, packed
//! ([`rate_tag`]): their `[used, last]` drains at the rate that wrote it.
//! A tag of 0 (fresh) or equal to the line's own runs the static algorithm
//! on the state as it is. Otherwise the state is first converted to the
//! line's scale, the used amount rounded up:
//!
//! - `fixed`: the stored window, if `now` is before its end, carries its
//!   count into the new window containing `now`; else the state is fresh.
//! - `sliding`: the estimate at `now`, `prev·(W−e)/W + curr`, becomes the
//!   count of the new window containing `now` (rounded up), with no previous
//!   window.
//! - buckets: `used`, drained from `last` to `now` at the writer's rate (as
//!   its own load would), becomes `left · period' / period`, rounded up,
//!   with `last` = `max(now, last)`; the new rate drains it from then on.
//!   (A tag that kept only the writer's period, see [`rate_tag`], rescales
//!   `used` alone: the refill since `last` runs at the new rate.)
//! - `gcra`: the backlog `TAT − now`, if any, becomes `backlog · T' / T`,
//!   rounded up.
//!
//! So every state reads as fresh under any values from the time its last
//! write resets on (the time that write reports: by then the table may drop
//! the entry, Redis the key): the buckets' drained at the writer's rate,
//! `gcra`'s `TAT` and the windows' ends are the writer's times. Not
//! `sliding_log`'s, whose timestamps a longer window still counts.
//!
//! The admission tests compare the converted amount with whole multiples of
//! the new unit, where `⌈x⌉ ≤ n ⇔ x ≤ n`: every decision, remaining and
//! wait is the one the unrounded amount gives; only the stored amount is up
//! to one scaled unit stricter. At one instant the used amount in requests
//! (`used / period`, `backlog / T`, the count or estimate) is the same
//! whatever the new parameters, so a larger burst or rate admits at least
//! as much, a smaller one at most as much, and never more than the burst.
//! The counts of `fixed` and `sliding` carry over as they are, above the
//! burst too (an overdraft, [`Limit::overdraw`]), as the static code reads
//! them. An overdraft converts the state likewise before charging, and
//! leaves the line's tag, as a commit does.

use super::{div_ceil, mul, sat, Algorithm, Charge, Limit, Outcome};
use crate::parse::{Rate, PERIODS};

/// A bucket tag's low two bits: which form it takes (see [`rate_tag`]).
const FORM: u64 = 3;
/// A rate of a unit of [`PERIODS`]: its index, then the count.
const UNIT: u64 = 1;
/// A rate of another period below 2^32 µs: the period, then the count.
const PAIR: u64 = 2;
/// The most counts [`UNIT`] tags hold: `count − 1` in the top 60 bits.
const UNIT_COUNTS: u64 = 1 << 60;
/// The periods and counts [`PAIR`] tags hold: the period in 32 bits,
/// `count − 1` in the top 30.
const PAIR_PERIODS: u64 = 1 << 32;
const PAIR_COUNTS: u64 = 1 << 30;

/// A bucket line's tag: its rate packed in one word, never 0. The low two
/// bits say how: [`UNIT`] for a period of [`PERIODS`] (every rate
/// `parse_rate` gives), its index in bits 2–3 and `count − 1` above, up to
/// 2^60 counts; [`PAIR`] for another period below 2^32 µs, the period in
/// bits 2–33 and `count − 1` above, up to 2^30 counts. Any other rate keeps
/// its period alone, `4·period` (form 0; one tag from 2^62 µs on): a state
/// it wrote converts by scale only, the refill since `last` running at the
/// reader's rate, and the rates of its period with other counts beyond
/// those share it, each reading the state as its own. Redis' script keeps
/// the tag as a double: a line whose tag is above 2^52 fails closed there
/// ([`crate::redis::exact`]).
pub(super) fn rate_tag(rate: Rate) -> u64 {
    let (count, period) = (rate.count.saturating_sub(1), rate.period_us);
    let unit = (0u64..).zip(PERIODS).find(|(_, (_, p))| *p == period).map(|(i, _)| i);
    match unit {
        Some(i) if count < UNIT_COUNTS => count << 4 | i << 2 | UNIT,
        None if period < PAIR_PERIODS && count < PAIR_COUNTS => (count << 32 | period) << 2 | PAIR,
        _ => period.min(u64::MAX >> 2) << 2,
    }
}

/// The writer's period a bucket tag packs, and its count unless the tag
/// kept the period alone (`None`). (A tag no line writes reads as a period
/// alone, possibly 0: the conversion divides by at least 1.)
fn tagged_rate(tag: u64) -> (u64, Option<u64>) {
    let count = |bits: u64| Some(bits + 1);
    match tag & FORM {
        UNIT => {
            let unit = usize::try_from(tag >> 2 & 3).ok().and_then(|i| PERIODS.get(i));
            (unit.map_or(1, |(_, p)| *p), count(tag >> 4))
        }
        PAIR => (tag >> 2 & (PAIR_PERIODS - 1), count(tag >> 34)),
        _ => (tag >> 2, None),
    }
}

/// Splits a varying line's state into its static words and its tag.
fn split(l: &Limit, s: &[u64]) -> Option<(usize, u64)> {
    let n = l.static_words();
    s.get(n).map(|&tag| (n, tag))
}

/// The scale a line counts its state in: the tag its writes leave.
pub(super) fn scale(l: &Limit) -> u64 {
    match l.algorithm {
        Algorithm::Fixed | Algorithm::Sliding => l.window,
        Algorithm::TokenBucket | Algorithm::LeakyBucket => rate_tag(l.rate),
        Algorithm::Gcra => l.interval,
        // (untagged: never called)
        Algorithm::SlidingLog | Algorithm::Concurrent => 0,
    }
}

/// The static words `s` (written under scale `tag`) converted to `l`'s scale
/// at `now`, or `None` when they are already in it (or fresh).
fn convert(l: &Limit, s: &[u64], tag: u64, now: u64) -> Option<[u64; 3]> {
    if tag == 0 || tag == scale(l) {
        return None;
    }
    let word = |i: usize| s.get(i).copied().unwrap_or(0);
    let here = (now / l.window).saturating_add(1);
    Some(match l.algorithm {
        Algorithm::Fixed => {
            // Window k (stored as k + 1) ends at (k + 1)·tag.
            let live = word(0) != 0 && mul(word(0), tag) > u128::from(now);
            match live {
                true => [here, word(1), 0],
                false => [0, 0, 0],
            }
        }
        Algorithm::Sliding => {
            let current = now / tag;
            let (window, curr, prev) = match word(0).checked_sub(1) {
                Some(k) if k >= current => (k, word(1), word(2)),
                Some(k) if k.saturating_add(1) == current => (current, 0, word(1)),
                _ => (current, 0, 0),
            };
            let elapsed = now.saturating_sub(window.saturating_mul(tag)).min(tag);
            let weighted = div_ceil(mul(prev, tag - elapsed), tag);
            [here, sat(weighted.saturating_add(curr.into())), 0]
        }
        Algorithm::TokenBucket | Algorithm::LeakyBucket => {
            let (used, last) = (word(0), word(1));
            let (period, count) = tagged_rate(tag);
            let (left, last) = match count {
                // What the writer's load would read at `now`.
                Some(count) => (u128::from(used).saturating_sub(mul(now.saturating_sub(last), count)), now.max(last)),
                None => (u128::from(used), last),
            };
            [sat(div_ceil(left * u128::from(l.rate.period_us), period)), last, 0]
        }
        Algorithm::Gcra => {
            let tat = word(0);
            match tat.checked_sub(now) {
                Some(backlog) if backlog > 0 => {
                    let scaled = div_ceil(mul(backlog, l.interval), tag);
                    [sat(u128::from(now).saturating_add(scaled)), 0, 0]
                }
                _ => [tat, 0, 0],
            }
        }
        Algorithm::SlidingLog | Algorithm::Concurrent => return None,
    })
}

/// See [`Limit::check`]: the static check on the state in `l`'s scale.
#[inline(never)]
pub(super) fn check(l: &Limit, s: &[u64], now: u64, cost: u64) -> Outcome {
    let Some((n, tag)) = split(l, s) else {
        return Outcome::default();
    };
    match convert(l, s, tag, now) {
        Some(c) => l.check_static(c.get(..n).unwrap_or(&c), now, cost),
        None => l.check_static(s, now, cost),
    }
}

/// See [`Limit::commit`]: the static commit on the state in `l`'s scale,
/// which then carries `l`'s tag. Nothing changes if nothing is charged.
#[inline(never)]
pub(super) fn commit(l: &Limit, s: &mut [u64], now: u64, cost: u64) -> Charge {
    let Some((n, tag)) = split(l, s) else {
        return Charge::default();
    };
    let charge = match convert(l, s, tag, now) {
        Some(mut c) => {
            let charge = l.commit_static(c.get_mut(..n).unwrap_or(&mut []), now, cost);
            if charge.cost != 0 {
                for (w, c) in s.iter_mut().zip(c.iter().take(n)) {
                    *w = *c;
                }
            }
            charge
        }
        None => l.commit_static(s, now, cost),
    };
    if charge.cost == 0 {
        return charge;
    }
    let tag = scale(l);
    if let Some(w) = s.get_mut(n) {
        *w = tag;
    }
    Charge { tag, ..charge }
}

/// See [`Limit::overdraw`]: the static overdraft on the state in `l`'s
/// scale, which then carries `l`'s tag (the state is written even when the
/// overdraft saturates and charges nothing refundable).
#[inline(never)]
pub(super) fn overdraw(l: &Limit, s: &mut [u64], now: u64, cost: u64) -> Charge {
    let Some((n, tag)) = split(l, s) else {
        return Charge::default();
    };
    if let Some(c) = convert(l, s, tag, now) {
        for (w, c) in s.iter_mut().zip(c.iter().take(n)) {
            *w = *c;
        }
    }
    let charge = l.overdraw_static(s, now, cost);
    let tag = scale(l);
    if let Some(w) = s.get_mut(n) {
        *w = tag;
    }
    match charge.cost {
        0 => charge,
        _ => Charge { tag, ..charge },
    }
}

/// See [`Limit::refund`]: only into the scale the charge was made in, by the
/// limit that made it; for the buckets only while no other charge came
/// since (`last` is still the charge's time): the state may have drained
/// at another rate in between (a charge at another rate, then one at this
/// line's, leaves this line's tag), faster than this line would have.
pub(super) fn refund(l: &Limit, s: &mut [u64], charge: &Charge, now: u64) {
    let Some((_, tag)) = split(l, s) else {
        return;
    };
    if tag != charge.tag || tag != scale(l) {
        return;
    }
    let bucket = matches!(l.algorithm, Algorithm::TokenBucket | Algorithm::LeakyBucket);
    if bucket && s.get(1) != Some(&charge.at) {
        return;
    }
    l.refund_static(s, charge, now);
}
