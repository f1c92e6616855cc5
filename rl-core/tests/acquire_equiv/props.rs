//! The proptests: random limits, states and calls, on both sides.

use proptest::prelude::*;
use proptest::sample::select;
use rl_core::limit::{Algorithm, Charge, Limit, MAX_LOG_BURST, MAX_NOW};
use rl_core::parse::Rate;

use crate::reference;

/// How to draw a limit: algorithm, rate count and period selectors, burst
/// selector, queue selector.
type RawLimit = (Algorithm, (u8, u64), (u8, u64), (u8, u64), (u8, u64));

/// A state word: how to read `x` (see [`word`]).
type RawWord = (u8, u64);

/// One call: which, the time step (selector, amount), the cost (selector,
/// amount), and whether it gets a state one word short.
type Op = (u8, (u8, u64), (u8, u64), bool);

/// A `u64` drawn towards the edges of its range and of the clock's.
fn edgy() -> impl Strategy<Value = u64> {
    prop_oneof![Just(0u64), 1u64..=16, any::<u64>(), (u64::MAX - 16)..=u64::MAX, (MAX_NOW - 16)..=(MAX_NOW + 16),]
}

/// The limit `r` describes, if valid: bursts up to the largest whose
/// products fit in 64 bits, queues likewise (buckets and `gcra`).
fn limit(r: RawLimit) -> Option<Limit> {
    let (algorithm, (cs, c), (ps, p), (bs, b), (qs, q)) = r;
    let period_us = match ps % 4 {
        0 => [1_000_000, 60_000_000, 3_600_000_000, 86_400_000_000][(p % 4) as usize],
        1 => 1 + p % 3_000,
        2 => 1 + p % 100_000_000_000,
        _ => p.max(1),
    };
    let count = match cs % 4 {
        0 => 1 + c % 8,
        1 => 100_000_000,
        2 => 1 + c % period_us.saturating_mul(4),
        _ => c.max(1),
    };
    let most = u64::MAX / period_us;
    let burst = match algorithm {
        Algorithm::SlidingLog => 1 + b % if bs % 8 == 0 { MAX_LOG_BURST.min(4096) } else { 40 },
        _ => match bs % 4 {
            0 => 1 + b % 8,
            1 => 1 + b % 70_000,
            2 => most.saturating_sub(b % 4).max(1),
            _ => 1 + b % most,
        },
    };
    let queue = match qs % 4 {
        0 | 1 => 0,
        2 => 1 + q % 8,
        _ => most.saturating_sub(burst).saturating_sub(q % 4),
    };
    let l = Limit::new(algorithm, Rate { count, period_us }, burst).ok()?;
    let queues = matches!(algorithm, Algorithm::TokenBucket | Algorithm::LeakyBucket | Algorithm::Gcra);
    l.with_queue(if queues { queue } else { 0 }).ok()
}

/// A valid limit of one of `algorithms`.
fn valid_limit(algorithms: &[Algorithm]) -> impl Strategy<Value = Limit> {
    raw_limit(algorithms).prop_filter_map("invalid limit", limit)
}

fn raw_limit(algorithms: &[Algorithm]) -> impl Strategy<Value = RawLimit> {
    (
        select(algorithms.to_vec()),
        (any::<u8>(), any::<u64>()),
        (any::<u8>(), any::<u64>()),
        (any::<u8>(), any::<u64>()),
        (any::<u8>(), any::<u64>()),
    )
}

/// A state word read at `now` on `l`: anything, near `now` (a TAT, a
/// bucket's `last`, a timestamp), near the window index of `now` (stored
/// plus one), or a count near the burst.
fn word(l: &Limit, now: u64, (sel, x): RawWord) -> u64 {
    let small = x % 8;
    let w = l.window_us();
    match sel % 8 {
        0 | 1 => x,
        2 => now.saturating_add((w / 4).saturating_mul(x % 4)).saturating_sub(small),
        3 => now.saturating_sub((w / 4).saturating_mul(x % 4)).saturating_add(small),
        4 => (now.min(MAX_NOW) / w + 1).saturating_add(small).saturating_sub(4),
        5 => l.burst().saturating_add(small).saturating_sub(4),
        6 => small,
        _ => 0,
    }
}

/// A `sliding_log` state: head and length drawn as words, the ring's
/// timestamps non-decreasing from its head, as the log writes them, or
/// any words when `sorted` is false.
fn log_state(l: &Limit, now: u64, words: &[RawWord], sorted: bool) -> Vec<u64> {
    let n = l.state_words() - 2;
    let mut s: Vec<u64> =
        (0..n + 2).map(|i| words.get(i % words.len().max(1)).map_or(0, |&r| word(l, now, r))).collect();
    if sorted {
        let head = (s[0] % n as u64) as usize;
        let mut ring: Vec<u64> = s[2..].to_vec();
        ring.sort_unstable();
        for (i, t) in ring.into_iter().enumerate() {
            s[2 + (head + i) % n] = t;
        }
    }
    s
}

/// The next clock reading after `t`: the same, a little or a window later,
/// stepped back a little or a window, or anywhere.
fn tick(l: &Limit, t: u64, (sel, x): (u8, u64)) -> u64 {
    let w = l.window_us();
    match sel % 8 {
        0 | 1 => t,
        2 => t.saturating_add(1 + x % 3),
        3 => t.saturating_add(x % (2 * w.min(u64::MAX / 2)).max(1)),
        4 => t.saturating_sub(1 + x % 3),
        5 => t.saturating_sub(x % (2 * w.min(u64::MAX / 2)).max(1)),
        6 => [0, MAX_NOW - 1, MAX_NOW, MAX_NOW + 1, u64::MAX][(x % 5) as usize],
        _ => x,
    }
}

/// A cost: `0..=burst + 2`, the burst, or anything.
fn cost(l: &Limit, (sel, x): (u8, u64)) -> u64 {
    match sel % 4 {
        0 | 1 => x % (l.burst().saturating_add(3)),
        2 => l.burst(),
        _ => x,
    }
}

/// The tag a varying line's writes leave: read from a fresh state it
/// charged (vary.rs says what it is).
fn own_tag(l: &Limit) -> u64 {
    let mut s = vec![0; l.state_words()];
    l.commit(&mut s, 1_000_000, 1);
    s.last().copied().unwrap_or(0)
}

/// Runs `ops` from `start` on `state` with `l` and with the reference,
/// comparing every return and the state after every call. A varying `l`
/// (its state one tag word longer) is compared with the static reference
/// on its static words, its charges tagged with `tag`, the tag its writes
/// leave.
fn run(l: &Limit, mut state: Vec<u64>, start: u64, ops: &[Op], tag: u64) -> Result<(), TestCaseError> {
    let r = reference::Limit::of(l);
    let tagged = l.is_varying() && l.algorithm() != Algorithm::SlidingLog;
    let n = r.state_words();
    let mut expected = state[..n].to_vec();
    let (mut t, mut last, mut last_ref) = (start, Charge::NONE, reference::Charge::NONE);
    for (i, &(which, step, c, short)) in ops.iter().enumerate() {
        t = tick(l, t, step);
        let cost = cost(l, c);
        let before = state.get(n).copied();
        // One word short: both refuse, whatever the call.
        let (mine, theirs) = match short {
            true => (&mut state[..l.state_words() - 1], &mut expected[..n - 1]),
            false => (&mut state[..], &mut expected[..]),
        };
        let (mut got, mut want) = ((None, None), (None, None));
        match which % 8 {
            0 => (got.0, want.0) = (Some(l.check(mine, t, cost)), Some(r.check(theirs, t, cost))),
            1 => (got.1, want.1) = (Some(l.commit(mine, t, cost)), Some(r.commit(theirs, t, cost))),
            2 => (got.0, want.0) = (Some(l.acquire(mine, t, cost)), Some(r.acquire(theirs, t, cost))),
            3 | 4 => {
                let ((o, c), (or, cr)) = (l.acquire_charged(mine, t, cost), r.acquire_charged(theirs, t, cost));
                // A rejection charges nothing (the module keeps the charge whatever the verdict).
                prop_assert!(o.admitted || c == Charge::NONE, "{c:?} charged by a rejection");
                (got, want) = ((Some(o), Some(c)), (Some(or), Some(cr)));
            }
            // vary.rs converts and tags on its own: an overdraft or a
            // refund of a varying line is not the static one's.
            5 if !tagged => (got.1, want.1) = (Some(l.overdraw(mine, t, cost)), Some(r.overdraw(theirs, t, cost))),
            6 if !tagged => {
                l.refund(mine, &last, t);
                r.refund(theirs, &last_ref, t);
            }
            _ => (got.0, want.0) = (Some(l.check(mine, t, 0)), Some(r.check(theirs, t, 0))),
        }
        let want_charge = want.1.map(|c| match c.cost {
            0 => c,
            _ => reference::Charge { tag, ..c },
        });
        if let (Some(c), Some(cr)) = (got.1, want_charge) {
            (last, last_ref) = (c, cr);
        }
        let call =
            format!("call {i} ({}) at {t} of cost {cost}{} on {l:?}", which % 8, if short { ", short" } else { "" });
        prop_assert_eq!(got.0, want.0, "outcome of {}", call);
        prop_assert_eq!(format!("{:?}", got.1), format!("{want_charge:?}"), "charge of {}", call);
        prop_assert_eq!(&state[..n], &expected[..], "state after {}", call);
        if tagged {
            // The tag is written with a charge (an acquire's, too), and only then.
            let charged = got.1.is_some_and(|c| c.cost() != 0)
                || (which % 8 == 2 && !short && cost != 0 && got.0.is_some_and(|o| o.admitted));
            let tag_after = if charged { Some(tag) } else { before };
            prop_assert_eq!(state.get(n).copied(), tag_after, "tag after {}", call);
        }
    }
    Ok(())
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(
        (any::<u8>(), (any::<u8>(), any::<u64>()), (any::<u8>(), any::<u64>()), prop::bool::weighted(0.05)),
        1..24,
    )
}

/// Where the clock starts: small, anywhere, near or past [`MAX_NOW`], or
/// at a worker's usual reading.
fn start() -> impl Strategy<Value = u64> {
    prop_oneof![edgy(), Just(1_700_000_000_000_000u64)]
}

/// The algorithms whose varying state carries a tag.
const TAGGED: [Algorithm; 5] =
    [Algorithm::Fixed, Algorithm::Sliding, Algorithm::TokenBucket, Algorithm::LeakyBucket, Algorithm::Gcra];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(20_000))]

    /// Static lines from any state, and `sliding_log` varying (untagged).
    #[test]
    fn same_as_reference(
        l in valid_limit(&Algorithm::ALL),
        start in start(),
        fresh in prop::bool::weighted(0.3),
        sorted in prop::bool::weighted(0.8),
        varying_log in any::<bool>(),
        words in prop::collection::vec((any::<u8>(), edgy()), 1..8),
        ops in ops(),
    ) {
        let l = if varying_log && l.algorithm() == Algorithm::SlidingLog { l.varying() } else { l };
        let state = match (fresh, l.algorithm()) {
            (true, _) => vec![0; l.state_words()],
            (false, Algorithm::SlidingLog) => log_state(&l, start, &words, sorted),
            (false, _) => (0..l.state_words()).map(|i| word(&l, start, words[i % words.len()])).collect(),
        };
        run(&l, state, start, &ops, 0)?;
    }

    /// A varying line whose state is fresh (tag 0) or in its own scale
    /// (tag equal to its scale), as the static line.
    #[test]
    fn varying_in_own_scale_same_as_reference(
        l in valid_limit(&TAGGED),
        start in start(),
        own in any::<bool>(),
        words in prop::collection::vec((any::<u8>(), edgy()), 1..8),
        ops in ops(),
    ) {
        let l = l.varying();
        let n = l.state_words() - 1;
        let tag = own_tag(&l);
        prop_assert_ne!(tag, 0);
        let mut state: Vec<u64> = (0..n).map(|i| word(&l, start, words[i % words.len()])).collect();
        // A tag of 0 (no write yet) reads the words as they are, as the
        // static line does.
        state.push(if own { tag } else { 0 });
        run(&l, state, start, &ops, tag)?;
    }
}
