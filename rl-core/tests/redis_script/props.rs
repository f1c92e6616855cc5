//! Property tests: random limits, costs and clocks replayed on the script
//! and the model step by step, batches, the function library against
//! `EVALSHA`, the exact range; and a check that the replay reaches every
//! kind of outcome. Failures persist in `props.proptest-regressions`.

use std::collections::BTreeMap;

use proptest::prelude::*;
use proptest::sample::select;
use proptest::test_runner::FileFailurePersistence;
use rl_core::limit::{Algorithm, Limit};
use rl_core::parse::Rate;
use rl_core::redis::{exact, LineArg, MAX_EXACT, TTL_MARGIN_MS};
use rl_core::verdict::Outcome;

use crate::fixtures::{case_limit, keys, limit, T0};
use crate::harness::{Mode, Redis};
use crate::memo::{Batches, Req};
use crate::model::{late, model, stored};
use crate::pair::{stats, MemoStats, Pair, MEMO_MS};

/// A raw step: (selector, fraction, cost selector).
type Raw = (u8, u16, u8);

/// `w · permille / 1000`.
fn frac(w: u64, permille: u16) -> u64 {
    (u128::from(w) * u128::from(permille) / 1000) as u64
}

/// Replays `ops` on `lines` (costs chosen per line from each raw cost
/// selector; the lines `dry` says dry-run) from `start`, comparing the script to the model at every step.
/// Stops before the clock would pass [`MAX_EXACT`]. With `jitter`, a quarter
/// of the requests see the clock stepped back by less than the TTL margin
/// (so expiry still never changes a decision). Three calls in four carry a
/// deadline: just past, right at, or just after their time.
fn replay(limits: &[Limit], dry: &[bool], ops: &[(Raw, Vec<u8>)], start: u64, jitter: bool) {
    let w = limits.iter().map(Limit::window_us).max().unwrap();
    let mut lines: Vec<LineArg> = limits
        .iter()
        .enumerate()
        .map(|(i, l)| LineArg {
            limit: *l,
            cost: 1,
            dry_run: dry.get(i).copied().unwrap_or(false),
            check_only: false,
            // (every other line reports the wait for one more unit)
            next: i % 2 == 0,
            lease_life: 0,
            kept: 0,
            holder: None,
            wait: None,
            classes: None,
        })
        .collect();
    let mut p = Pair::new(&lines);
    let (mut t, mut prev) = (start, Outcome::default());
    for ((sel, f, flags), costs) in ops {
        let (sel, f) = (*sel, *f);
        t = t.saturating_add(match sel % 10 {
            0 | 1 => 0,
            2 => 1 + u64::from(f % 3),
            3 => prev.retry_after_us.unwrap_or(0),
            4 => prev.retry_after_us.unwrap_or(1) - 1,
            5 => prev.reset_us,
            // Around the key's expiry: reset + margin + up to 1 ms rounding.
            6 => prev.reset_us + TTL_MARGIN_MS * 1000 + u64::from(f % 1002) - 1,
            7 | 8 => frac(w, f % 1500),
            _ => frac(w, f % 4000),
        });
        if t > MAX_EXACT {
            break;
        }
        for (line, c) in lines.iter_mut().zip(costs) {
            let b = line.limit.burst();
            line.cost = match c % 10 {
                0 => 0,
                7 => 1 + u64::from(f) % b,
                8 => b,
                9 => b + 1,
                _ => 1,
            };
            // (a request of a class below others: the units it must leave them)
            line.kept = match (c / 10) % 5 {
                0 | 1 => 0,
                2 => 1,
                3 => u64::from(f) % b,
                _ => b,
            };
        }
        let now = match jitter && flags & 6 == 0 {
            true => t.saturating_sub(frac(w, f % 2000).min(TTL_MARGIN_MS * 1000 - 1)),
            false => t,
        };
        let commit = sel >> 5 != 7;
        let deadline = match (flags >> 3) & 3 {
            0 => None,
            1 => now.checked_sub(1 + u64::from(f % 3)),
            2 => Some(now),
            _ => Some(now + u64::from(f % 3)),
        };
        let Some((_, out)) = p.step_until(&lines, now, commit, flags & 1 == 1, deadline) else {
            continue;
        };
        // Drive the clock by the first line that rejected, else the first.
        prev = out.iter().copied().find(|o| !o.admitted).unwrap_or(out[0]);
    }
}

/// A charge's cost by selector: nothing, one unit, up to four bursts,
/// around the largest the script takes (`MAX_EXACT`), or about what takes
/// the state to it.
fn charge_cost(l: &Limit, f: u16, c: u8) -> u64 {
    let b = l.burst();
    let rate = l.rate();
    let unit = match l.algorithm() {
        Algorithm::TokenBucket | Algorithm::LeakyBucket => rate.period_us,
        Algorithm::Gcra => rate.period_us.div_ceil(rate.count),
        _ => 1,
    };
    match c % 12 {
        0 => 0,
        1 | 2 => 1,
        3 => MAX_EXACT,
        4 => MAX_EXACT - 1,
        5 => (MAX_EXACT / unit).saturating_sub(u64::from(f % 3)),
        _ => u64::from(f) % (4 * b + 1),
    }
}

/// Replays `ops` on `limits` (each line enforced, dry-run, or a
/// `charge=after` line's check, by `kinds`: bit 1 dry-run, bit 2 check, bit 4
/// reports `next_us`),
/// one step in three a charge call on every line, comparing the script to
/// the model (`Limit::overdraw` for the charges) at every step: the same
/// outcomes, lines charged, states and TTLs.
fn replay_charges(limits: &[Limit], kinds: &[u8], ops: &[(Raw, Vec<u8>)], start: u64) {
    let w = limits.iter().map(Limit::window_us).max().unwrap();
    let mut lines: Vec<LineArg> = limits
        .iter()
        .zip(kinds)
        .map(|(l, k)| LineArg {
            limit: *l,
            cost: 1,
            dry_run: k & 1 == 1,
            check_only: k & 2 == 2,
            next: k & 4 == 4,
            lease_life: 0,
            kept: 0,
            holder: None,
            wait: None,
            classes: None,
        })
        .collect();
    let mut p = Pair::new(&lines);
    let (mut t, mut prev) = (start, Outcome::default());
    for ((sel, f, flags), costs) in ops {
        let f = *f;
        t = t.saturating_add(match sel % 8 {
            0 | 1 => 0,
            2 => 1 + u64::from(f % 3),
            3 => prev.retry_after_us.unwrap_or(0),
            4 => prev.retry_after_us.unwrap_or(1) - 1,
            5 => prev.reset_us,
            _ => frac(w, f % 3000),
        });
        if t > MAX_EXACT {
            break;
        }
        let use_time = flags & 4 == 4;
        if flags % 3 == 0 {
            let charges: Vec<(Limit, u64)> =
                limits.iter().zip(costs).map(|(l, c)| (*l, charge_cost(l, f, *c))).collect();
            p.charge(&charges, t, use_time);
            continue;
        }
        for (line, c) in lines.iter_mut().zip(costs) {
            let b = line.limit.burst();
            line.cost = match c % 6 {
                0 => 0,
                4 => b,
                5 => b + 1,
                _ => 1,
            };
        }
        let (_, out) = p.step(&lines, t, true, use_time);
        prev = out.iter().copied().find(|o| !o.admitted).unwrap_or(out[0]);
    }
}

/// A call's deadline by selector: none (half the time with `sel` in
/// `0..8`), just past, right at, or just after `now`.
fn deadline(now: u64, sel: u8) -> Option<u64> {
    match sel {
        1 => now.checked_sub(1),
        2 => Some(now),
        3 => Some(now + 1),
        _ => None,
    }
}

fn algorithm() -> impl Strategy<Value = Algorithm> {
    select(Algorithm::ALL.to_vec())
}

/// Small, realistic limits (every one in the exact range), the buckets
/// and `gcra` often with a queue.
fn small_limit() -> impl Strategy<Value = Limit> {
    (
        algorithm(),
        1u64..=20,
        prop_oneof![select(vec![1, 1_000, 1_000_000, 60_000_000, 3_600_000_000, 86_400_000_000]), 1u64..=10_000_000],
        1u64..=12,
        prop_oneof![Just(0u64), 1u64..=12],
    )
        .prop_map(|(a, c, p, b, q)| {
            let l = limit(a, c, p, b);
            l.with_queue(q).unwrap_or(l)
        })
}

/// Log-uniform in `[1, 2^bits)`.
fn magnitude(bits: u32) -> impl Strategy<Value = u64> {
    (0..bits, any::<u64>()).prop_map(|(k, x)| (x >> (63 - k)).max(1))
}

/// Large limits near the edges of the exact range.
fn big_limit() -> impl Strategy<Value = Limit> {
    (algorithm(), magnitude(30), magnitude(53), magnitude(40), prop_oneof![Just(0u64), magnitude(40)]).prop_filter_map(
        "outside the exact range",
        |(a, c, p, b, q)| {
            let b = if a == Algorithm::SlidingLog { b % 64 + 1 } else { b };
            let l = Limit::new(a, Rate { count: c, period_us: p }, b).ok()?;
            let l = l.with_queue(q).unwrap_or(l);
            exact(&l).then_some(l)
        },
    )
}

/// Varying limits of one algorithm, small (`sliding_log`'s of one burst,
/// its state being laid out by it).
fn varying_limits() -> impl Strategy<Value = Vec<Limit>> {
    let params = (
        1u64..=20,
        prop_oneof![select(vec![1, 1_000, 1_000_000, 60_000_000, 3_600_000_000]), 1u64..=10_000_000],
        1u64..=12,
        prop_oneof![Just(0u64), 1u64..=12],
    );
    (algorithm(), 1u64..=12, prop::collection::vec(params, 1..=4)).prop_map(|(a, log, ps)| {
        ps.into_iter()
            .map(|(c, p, b, q)| {
                let b = if a == Algorithm::SlidingLog { log } else { b };
                let l = limit(a, c, p, b);
                l.with_queue(q).unwrap_or(l).varying()
            })
            .collect()
    })
}

/// Replays `ops` on one key, each request under the limit its selector
/// picks of `limits` (dry-run when `dry`), comparing the script to the
/// model at every step.
fn replay_varying(limits: &[Limit], dry: bool, ops: &[(Raw, Vec<u8>)], start: u64, jitter: bool) {
    replay_varying_with(limits, dry, ops, start, jitter, false);
}

/// [`replay_varying`], with `charges` one step in three a charge call
/// under the limit picked (`Limit::overdraw` in the model) and some
/// requests `charge=after` lines' checks.
fn replay_varying_with(limits: &[Limit], dry: bool, ops: &[(Raw, Vec<u8>)], start: u64, jitter: bool, charges: bool) {
    let w = limits.iter().map(Limit::window_us).max().unwrap();
    let mut p = Pair::new(&[LineArg {
        limit: limits[0],
        cost: 1,
        dry_run: dry,
        check_only: false,
        next: dry,
        lease_life: 0,
        kept: 0,
        holder: None,
        wait: None,
        classes: None,
    }]);
    let (mut t, mut prev) = (start, Outcome::default());
    for ((sel, f, flags), picks) in ops {
        let (sel, f) = (*sel, *f);
        let pick = picks.first().copied().unwrap_or(0);
        let l = limits[usize::from(pick) % limits.len()];
        t = t.saturating_add(match sel % 8 {
            0 | 1 => 0,
            2 => 1 + u64::from(f % 3),
            3 => prev.retry_after_us.unwrap_or(0),
            4 => prev.reset_us,
            5 => frac(l.window_us(), f % 1500),
            _ => frac(w, f % 2500),
        });
        if t > MAX_EXACT {
            break;
        }
        let b = l.burst();
        let cost = match (pick >> 3) % 10 {
            0 => 0,
            7 => 1 + u64::from(f) % b,
            8 => b,
            9 => b + 1,
            _ => 1,
        };
        let now = match jitter && flags & 6 == 0 {
            true => t.saturating_sub(frac(w, f % 2000).min(TTL_MARGIN_MS * 1000 - 1)),
            false => t,
        };
        if charges && flags % 3 == 0 {
            p.charge(&[(l, charge_cost(&l, f, pick))], t, flags & 4 == 4);
            continue;
        }
        let commit = sel >> 5 != 7;
        let check_only = charges && sel & 8 == 8;
        let line = [LineArg {
            limit: l,
            cost,
            dry_run: dry,
            check_only,
            next: sel & 16 == 16,
            lease_life: 0,
            kept: 0,
            holder: None,
            wait: None,
            classes: None,
        }];
        prev = p.step(&line, now, commit, flags & 1 == 1).1[0];
    }
}

/// What was sent under a name (a memo's id).
type Named<T> = ((u64, u64), T);

/// A memo call's deadline by selector: none, just past (late: it does
/// nothing, leaves no memo), right at, or a little after `now`.
fn memo_deadline(now: u64, sel: u8, f: u16) -> Option<u64> {
    match sel % 4 {
        0 => None,
        1 => now.checked_sub(1),
        2 => Some(now),
        _ => Some(now + u64::from(f % 5000)),
    }
}

/// Replays `ops` with calls named by memos: each step a mode "2" call of a
/// new name, a repeat of a name sent before (with its lines), an undo of a
/// call sent before (or of one not sent yet, which a later repeat then
/// sends), a mode "1" or "0" call, or a charge (with a memo key or not, or
/// a charge sent before again). The lines: every limit of `limits` on its
/// key, or with `varying` one key under the limit each step picks. The
/// pair holds every answer, state and TTL to the model, every undo to
/// `Limit::refund` of what the call charged, in order, and a repeat to
/// the first reply (nothing read or written).
fn replay_memo(limits: &[Limit], kinds: &[u8], varying: bool, ops: &[(Raw, Vec<u8>)], start: u64, mode: Mode) {
    let w = limits.iter().map(Limit::window_us).max().unwrap();
    let kind = |l: Limit, k: u8| LineArg {
        limit: l,
        cost: 1,
        dry_run: k & 1 == 1,
        check_only: k & 2 == 2,
        next: k & 4 == 4,
        lease_life: 0,
        kept: 0,
        holder: None,
        wait: None,
        classes: None,
    };
    let base: Vec<LineArg> = match varying {
        true => vec![kind(limits[0], kinds[0])],
        false => limits.iter().zip(kinds).map(|(l, k)| kind(*l, *k)).collect(),
    };
    let mut p = Pair::with(mode, &base);
    // The names sent (or undone before), with their lines; the charges'.
    let mut sent: Vec<Named<Vec<LineArg>>> = Vec::new();
    let mut charged: Vec<Named<Vec<(Limit, u64)>>> = Vec::new();
    let mut names = 0u64;
    let mut name = || {
        names += 1;
        (0x5eed, names)
    };
    let (mut t, mut prev) = (start, Outcome::default());
    for ((sel, f, flags), picks) in ops {
        let (sel, f, flags) = (*sel, *f, *flags);
        // (mostly within a memo's life, 10 s, so that repeats and undos
        // find it)
        t = t.saturating_add(match sel % 8 {
            0 | 1 => 0,
            2 => 1 + u64::from(f % 3),
            3 => prev.retry_after_us.unwrap_or(0),
            4 => prev.reset_us.min(u64::from(f) * 100),
            5 => frac(w.min(MEMO_MS * 1000), f % 1000),
            6 => u64::from(f) * 50,
            _ => frac(w, f % 3000),
        });
        if t > MAX_EXACT {
            break;
        }
        let pick = usize::from(picks.first().copied().unwrap_or(0));
        // A name sent before: one of the last three, mostly.
        let earlier = |n: usize| match pick >> 6 {
            0 => pick % n,
            _ => n - 1 - (pick >> 2) % n.min(3),
        };
        let cost_of = |b: u64, c: u8| match c % 10 {
            0 => 0,
            7 => 1 + u64::from(f) % b,
            8 => b,
            9 => b + 1,
            _ => 1,
        };
        let lines: Vec<LineArg> = match varying {
            true => {
                let l = limits[pick % limits.len()];
                vec![LineArg { limit: l, cost: cost_of(l.burst(), picks[0] >> 3), ..base[0] }]
            }
            false => {
                base.iter().zip(picks).map(|(a, c)| LineArg { cost: cost_of(a.limit.burst(), *c), ..*a }).collect()
            }
        };
        let use_time = flags & 1 == 1;
        let deadline = memo_deadline(t, flags >> 3, f);
        let out = match (flags >> 1) % 8 {
            0..=2 => {
                let id = name();
                sent.push((id, lines.clone()));
                p.step_memo(&lines, t, use_time, deadline, id)
            }
            3 if !sent.is_empty() => {
                let (id, l) = sent[earlier(sent.len())].clone();
                p.step_memo(&l, t, use_time, deadline, id)
            }
            4 | 5 => {
                if sent.is_empty() || pick % 4 == 0 {
                    let id = name();
                    p.undo(&lines, t, use_time, id);
                    sent.push((id, lines));
                } else {
                    let (id, l) = sent[earlier(sent.len())].clone();
                    p.undo(&l, t, use_time, id);
                }
                None
            }
            7 => {
                let ls: Vec<(Limit, u64)> =
                    lines.iter().zip(picks).map(|(a, c)| (a.limit, charge_cost(&a.limit, f, *c))).collect();
                match pick % 3 {
                    0 => {
                        p.charge(&ls, t, use_time);
                    }
                    1 => {
                        let id = name();
                        p.charge_memo(&ls, t, use_time, id);
                        charged.push((id, ls));
                    }
                    _ => {
                        if let Some((id, ls)) = charged.last().cloned() {
                            p.charge_memo(&ls, t, use_time, id);
                        }
                    }
                }
                None
            }
            _ => p.step_until(&lines, t, sel >> 5 != 7, use_time, deadline),
        };
        if let Some((_, out)) = out {
            // Drive the clock by the first line that rejected, else the first.
            prev = out.iter().copied().find(|o| !o.admitted).unwrap_or(out[0]);
        }
    }
}

/// Replays `batches` on three keys, each with its limits of `ls` (one,
/// or a varying key's several, one picked per line), with
/// [`Batches`]: each batch some requests on some of the keys (several
/// requests on one key, runs of one-line requests, dry-run lines), sent in
/// mode "2" under a new name, or in mode "1", or again under a name sent
/// before; or an undo of a name sent before (or not yet). Every answer and
/// state as the model's, request by request, every undo as its refunds.
/// A raw batch: (time step, requests as (key mask, cost selectors), what
/// to do).
type RawBatch = (u16, Vec<(u8, Vec<u8>)>, u8);

fn replay_memo_batches(ls: &[Vec<Limit>], batches: &[RawBatch], start: u64, mode: Mode) {
    let w = ls.iter().flatten().map(Limit::window_us).max().unwrap();
    let firsts: Vec<Limit> = ls.iter().map(|l| l[0]).collect();
    let mut b = Batches::new(mode, &firsts);
    let mut sent: Vec<Named<Vec<Req>>> = Vec::new();
    let mut now = start;
    for (n, (f, reqs, sel)) in batches.iter().enumerate() {
        // (mostly within a memo's life, 10 s)
        now += match f % 4 {
            0 => 0,
            1 => u64::from(*f) * 10,
            2 => frac(w.min(MEMO_MS * 1000), f % 1000),
            _ => frac(w, f % 1500),
        };
        if now > MAX_EXACT {
            break;
        }
        let requests: Vec<Req> = reqs
            .iter()
            .map(|(mask, costs)| {
                (0..3)
                    .filter(|i| mask & (1 << i) != 0)
                    .map(|i| {
                        let l = ls[i][usize::from(costs[i] >> 3) % ls[i].len()];
                        let bu = l.burst();
                        let cost = match costs[i] % 8 {
                            0 => 0,
                            6 => bu,
                            7 => bu + 1,
                            _ => 1,
                        };
                        let a = LineArg {
                            limit: l,
                            cost,
                            dry_run: costs[i] >= 224,
                            check_only: false,
                            next: i == 1,
                            lease_life: 0,
                            kept: 0,
                            holder: None,
                            wait: None,
                            classes: None,
                        };
                        (i, a)
                    })
                    .collect()
            })
            .collect();
        let id = (0xba7c, n as u64);
        // A name sent before: one of the last three, mostly.
        let pick = match sel >> 6 {
            0 => usize::from(*f) % sent.len().max(1),
            _ => sent.len().saturating_sub(1 + usize::from(*f >> 4) % 3.min(sent.len().max(1))),
        };
        let deadline = memo_deadline(now, *sel, *f);
        match sel % 16 {
            0..=5 => {
                b.call(&requests, now, deadline, Some(id));
                sent.push((id, requests));
            }
            6 => {
                b.call(&requests, now, deadline, None);
            }
            7..=9 if !sent.is_empty() => {
                let (id, r) = sent[pick].clone();
                b.call(&r, now, deadline, Some(id));
            }
            10..=14 if !sent.is_empty() => {
                let (id, r) = sent[pick].clone();
                b.undo(&r, now, id);
            }
            _ => {
                b.undo(&requests, now, id);
                sent.push((id, requests));
            }
        }
    }
}

fn ops(lines: usize, n: usize) -> impl Strategy<Value = Vec<(Raw, Vec<u8>)>> {
    prop::collection::vec((any::<Raw>(), prop::collection::vec(any::<u8>(), lines)), 1..n)
}

/// A start time: near zero, realistic, or anywhere below 2^52.
fn start() -> impl Strategy<Value = u64> {
    prop_oneof![0u64..10_000_000, Just(T0), 0..MAX_EXACT]
}

// Failures persist next to this file, in `props.proptest-regressions`: by
// default proptest would find `main.rs` beside it and use
// `tests/proptest-regressions/props.txt`.
proptest! {
    #![proptest_config(ProptestConfig {
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("proptest-regressions"))),
        ..ProptestConfig::with_cases(160)
    })]

    /// One line of any algorithm: the script equals `Limit::acquire` (and
    /// `check` in mode 0) step by step, over an expiring store, also when
    /// the clock steps back a little.
    #[test]
    fn prop_single_line(
        l in small_limit(),
        ops in ops(1, 48),
        t in start(),
        jitter in any::<bool>(),
    ) {
        replay(&[l], &[], &ops, t, jitter);
    }

    /// One dry-run line: the request is always admitted, the line charged
    /// iff it admits.
    #[test]
    fn prop_single_dry_line(l in small_limit(), ops in ops(1, 32), t in start()) {
        replay(&[l], &[true], &ops, t, false);
    }

    /// Large parameters and times: exact to the microsecond.
    #[test]
    fn prop_single_line_big(l in big_limit(), ops in ops(1, 24), t in start()) {
        replay(&[l], &[], &ops, t, false);
    }

    /// Two or three lines, some dry-run: all checked; the request admitted
    /// iff the enforced lines admit; then committed, the dry-run lines iff
    /// they admit.
    #[test]
    fn prop_multi_line(
        ls in prop::collection::vec(small_limit(), 2..=3),
        dry in prop::collection::vec(any::<bool>(), 3),
        ops in ops(3, 40),
        t in start(),
        jitter in any::<bool>(),
    ) {
        replay(&ls, &dry, &ops, t, jitter);
    }

    /// The function library (`FCALL`) and the script (`EVALSHA`) answer
    /// alike and leave the same keys, call after call, with deadlines met or
    /// missed.
    #[test]
    fn prop_function_equals_eval(
        ls in prop::collection::vec(small_limit(), 3),
        calls in prop::collection::vec(
            (0u16..1500, prop::collection::vec((1u8..8, 0u8..4), 1..10), 0u8..4),
            1..10,
        ),
        t in start(),
    ) {
        let w = ls.iter().map(Limit::window_us).max().unwrap();
        let ks = keys(3);
        let (f, e) = (Redis::with(Mode::Function), Redis::with(Mode::Eval));
        let mut now = t;
        for (step, reqs, dl) in &calls {
            now += frac(w, *step);
            prop_assume!(now <= MAX_EXACT);
            let requests: Vec<Vec<(Limit, u64)>> = reqs
                .iter()
                .map(|(mask, cost)| (0..3).filter(|i| mask & (1 << i) != 0).map(|i| (ls[i], u64::from(*cost))).collect())
                .collect();
            let bkeys: Vec<String> = reqs
                .iter()
                .flat_map(|(mask, _)| (0..3).filter(move |i| mask & (1 << i) != 0))
                .map(|i| ks[i].clone())
                .collect();
            let slices: Vec<&[(Limit, u64)]> = requests.iter().map(Vec::as_slice).collect();
            let use_time = step % 2 == 0;
            let deadline = deadline(now, *dl);
            prop_assert_eq!(
                f.run_until(&bkeys, &slices, now, true, use_time, deadline),
                e.run_until(&bkeys, &slices, now, true, use_time, deadline)
            );
            prop_assert_eq!(f.snapshot(), e.snapshot());
        }
    }

    /// Batches of requests, each on some of three shared lines: every batch
    /// equals the model run request by request at the batch's time, or,
    /// past its deadline, does nothing.
    #[test]
    fn prop_batch(
        ls in prop::collection::vec(small_limit(), 3),
        batches in prop::collection::vec(
            (any::<u16>(), prop::collection::vec((1u8..8, prop::collection::vec(any::<u8>(), 3)), 1..12), 0u8..8),
            1..8,
        ),
        t in start(),
    ) {
        let w = ls.iter().map(Limit::window_us).max().unwrap();
        let ks = keys(3);
        let r = Redis::new();
        let mut states: Vec<Vec<u64>> = ls.iter().map(|l| vec![0; l.state_words()]).collect();
        let mut now = t;
        for (f, reqs, dl) in &batches {
            now += frac(w, f % 1500);
            prop_assume!(now <= MAX_EXACT);
            let mut requests: Vec<Vec<(Limit, u64)>> = Vec::new();
            let mut which: Vec<Vec<usize>> = Vec::new();
            for (mask, costs) in reqs {
                let idx: Vec<usize> = (0..3).filter(|i| mask & (1 << i) != 0).collect();
                let lines = idx
                    .iter()
                    .map(|&i| {
                        let b = ls[i].burst();
                        let cost = match costs[i] % 8 { 0 => 0, 6 => b, 7 => b + 1, _ => 1 };
                        (ls[i], cost)
                    })
                    .collect();
                requests.push(lines);
                which.push(idx);
            }
            let bkeys: Vec<String> = which.iter().flatten().map(|&i| ks[i].clone()).collect();
            let slices: Vec<&[(Limit, u64)]> = requests.iter().map(Vec::as_slice).collect();
            let deadline = deadline(now, *dl);
            let got = r.run_until(&bkeys, &slices, now, true, false, deadline);
            prop_assert_eq!(got.is_none(), late(now, deadline));
            let got = got.unwrap_or_default();
            for (j, (lines, idx)) in requests.iter().zip(&which).enumerate().take(got.len()) {
                let mut sub: Vec<Vec<u64>> = idx.iter().map(|&i| states[i].clone()).collect();
                let want = model(lines, &mut sub, now, true);
                for (&i, st) in idx.iter().zip(sub) {
                    states[i] = st;
                }
                prop_assert_eq!(&got[j], &want, "batch request {}", j);
            }
            for i in 0..3 {
                if let Some(v) = r.value(&ks[i]) {
                    prop_assert_eq!(v, stored(&ls[i], &states[i]), "state of line {}", i);
                }
            }
        }
    }

    /// Runs of one-line requests (one limit, several clients): the usual
    /// batch in production, where each client has its own key and some
    /// come twice. A run answers and writes as its requests would one call
    /// each, batch after batch, TTLs included (`prop_batch` gives each limit
    /// one key, so its runs never span several keys).
    #[test]
    fn prop_runs_over_many_keys(
        l in small_limit(),
        cost_sel in 0u8..8,
        batches in prop::collection::vec((any::<u16>(), prop::collection::vec(0usize..6, 1..16)), 1..6),
        t in start(),
    ) {
        let b = l.burst();
        let cost = match cost_sel { 0 => 0, 6 => b, 7 => b + 1, _ => 1 };
        let one: &[(Limit, u64)] = &[(l, cost)];
        let ks = keys(6);
        let (r, s) = (Redis::new(), Redis::new());
        let mut now = t;
        for (f, picks) in &batches {
            now += frac(l.window_us(), f % 1500);
            prop_assume!(now <= MAX_EXACT);
            let batch = vec![one; picks.len()];
            let bkeys: Vec<String> = picks.iter().map(|&i| ks[i].clone()).collect();
            let got = r.run_batch(&bkeys, &batch, now, true, false);
            for (j, &i) in picks.iter().enumerate() {
                prop_assert_eq!(&s.run(&ks[i..=i], one, now, true, false), &got[j], "request {}", j);
            }
            prop_assert_eq!(r.snapshot(), s.snapshot());
        }
    }

    /// One line of any algorithm, enforced, dry-run or a `charge=after`
    /// line's check, its decisions mixed with charges (`sliding_log` and
    /// costs out of range refused): the script equals the model.
    #[test]
    fn prop_charges_single_line(l in small_limit(), kind in 0u8..4, ops in ops(1, 48), t in start()) {
        replay_charges(&[l], &[kind], &ops, t);
    }

    /// Large parameters and times, with charges.
    #[test]
    fn prop_charges_single_line_big(l in big_limit(), kind in 0u8..4, ops in ops(1, 24), t in start()) {
        replay_charges(&[l], &[kind], &ops, t);
    }

    /// Two or three lines of any kind, decisions and charges mixed.
    #[test]
    fn prop_charges_multi_line(
        ls in prop::collection::vec(small_limit(), 2..=3),
        kinds in prop::collection::vec(0u8..8, 3),
        ops in ops(3, 40),
        t in start(),
    ) {
        replay_charges(&ls, &kinds, &ops, t);
    }

    /// The charge as a library function and as a script: the same replies
    /// and keys, a key charged twice in one call included.
    #[test]
    fn prop_charge_function_equals_eval(
        ls in prop::collection::vec(small_limit(), 3),
        calls in prop::collection::vec((0u16..1500, prop::collection::vec((0usize..3, any::<u16>(), any::<u8>()), 1..6)), 1..8),
        t in start(),
    ) {
        let w = ls.iter().map(Limit::window_us).max().unwrap();
        let ks = keys(3);
        let (f, e) = (Redis::with(Mode::Function), Redis::with(Mode::Eval));
        let mut now = t;
        for (step, picks) in &calls {
            now += frac(w, *step);
            prop_assume!(now <= MAX_EXACT);
            let lines: Vec<(Limit, u64)> = picks.iter().map(|&(i, x, c)| (ls[i], charge_cost(&ls[i], x, c))).collect();
            let bkeys: Vec<String> = picks.iter().map(|&(i, _, _)| ks[i].clone()).collect();
            prop_assert_eq!(f.charge(&bkeys, &lines, now, false), e.charge(&bkeys, &lines, now, false));
            prop_assert_eq!(f.snapshot(), e.snapshot());
            let one: Vec<(Limit, u64)> = ls.iter().map(|&l| (l, 1)).collect();
            prop_assert_eq!(f.run(&ks, &one, now, true, false), e.run(&ks, &one, now, true, false));
        }
    }

    /// One key whose rate and burst change from request to request: the
    /// script converts its state exactly as the model, step by step.
    #[test]
    fn prop_varying_line(
        ls in varying_limits(),
        dry in any::<bool>(),
        ops in ops(1, 48),
        t in start(),
        jitter in any::<bool>(),
    ) {
        replay_varying(&ls, dry, &ops, t, jitter);
    }

    /// One key whose rate and burst change from request to request, its
    /// decisions (some `charge=after` lines' checks) mixed with charges
    /// under any of its values: the script converts and overdraws its
    /// state exactly as the model.
    #[test]
    fn prop_varying_charges(
        ls in varying_limits(),
        dry in any::<bool>(),
        ops in ops(1, 48),
        t in start(),
        jitter in any::<bool>(),
    ) {
        replay_varying_with(&ls, dry, &ops, t, jitter, true);
    }

    /// Any parameters, of a static line or a varying one (whose tag, for
    /// the buckets, packs its rate): the script is exact iff `exact` says
    /// so, else it rejects (fail closed).
    #[test]
    fn prop_exact_iff_in_range(
        a in algorithm(),
        c in magnitude(60),
        p in prop_oneof![magnitude(60), select(vec![1_000_000, 60_000_000, 3_600_000_000, 86_400_000_000])],
        b in magnitude(60),
        q in prop_oneof![Just(0u64), magnitude(60)],
        varying in any::<bool>(),
    ) {
        let b = if a == Algorithm::SlidingLog { b % 65_536 + 1 } else { b };
        let Ok(l) = Limit::new(a, Rate { count: c, period_us: p }, b) else {
            return Ok(());
        };
        let l = l.with_queue(q).unwrap_or(l);
        let l = if varying { l.varying() } else { l };
        let r = Redis::new();
        let lines = [(l, 1)];
        let (_, out) = r.run(&keys(1), &lines, T0, true, false);
        if exact(&l) {
            let mut s = vec![vec![0; l.state_words()]];
            prop_assert_eq!(out, model(&lines, &mut s, T0, true).1);
        } else {
            prop_assert_eq!(out[0], Outcome::default());
            prop_assert_eq!(r.writes(), 0);
        }
    }
}

/// Sanity: the replay reaches every kind of outcome often enough to mean
/// something (rejections with and without retry, expiries).
#[test]
fn replay_coverage() {
    let mut seen = BTreeMap::new();
    let mut expired = 0;
    for alg in Algorithm::ALL {
        let l = case_limit(alg);
        let mut p = Pair::new(&[(l, 1)]);
        let mut t = T0;
        for i in 0..60u64 {
            let cost = [1, 1, 2, 0, 4][(i % 5) as usize];
            let o = p.step(&[(l, cost)], t, true, i % 2 == 0).1[0];
            let kind = match (o.admitted, o.retry_after_us) {
                (true, _) => "admit",
                (false, Some(_)) => "retry",
                (false, None) => "never",
            };
            *seen.entry(kind).or_insert(0) += 1;
            t += match i % 7 {
                0 => o.retry_after_us.unwrap_or(0),
                3 => o.reset_us + 1_001_000,
                _ => 100_000,
            };
        }
        expired += p.redis.fake.get::<u64>("expired").unwrap();
    }
    assert!(seen.values().all(|n| *n > 10) && seen.len() == 3, "{seen:?}");
    assert!(expired >= 6, "{expired}");
}

// Calls named by memos (mode "2", charges with a memo key), their repeats
// and undos.
proptest! {
    #![proptest_config(ProptestConfig {
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("proptest-regressions"))),
        ..ProptestConfig::with_cases(160)
    })]

    /// One line of any kind: mode "2" calls, repeats, undos, mode "1"
    /// calls and charges mixed: the script equals the model, each undo its
    /// refund of the call's charges.
    #[test]
    fn prop_memo_single_line(
        l in small_limit(),
        kind in 0u8..8,
        ops in ops(1, 48),
        t in start(),
        eval in any::<bool>(),
    ) {
        let mode = if eval { Mode::Eval } else { Mode::Function };
        replay_memo(&[l], &[kind], false, &ops, t, mode);
    }

    /// Large parameters and times.
    #[test]
    fn prop_memo_single_line_big(l in big_limit(), kind in 0u8..8, ops in ops(1, 24), t in start()) {
        replay_memo(&[l], &[kind], false, &ops, t, Mode::Function);
    }

    /// Two or three lines of any kind (each on its key): an undo refunds
    /// each line the call charged.
    #[test]
    fn prop_memo_multi_line(
        ls in prop::collection::vec(small_limit(), 2..=3),
        kinds in prop::collection::vec(0u8..8, 3),
        ops in ops(3, 40),
        t in start(),
        eval in any::<bool>(),
    ) {
        let mode = if eval { Mode::Eval } else { Mode::Function };
        replay_memo(&ls, &kinds, false, &ops, t, mode);
    }

    /// One key whose rate and burst change from request to request: an
    /// undo refunds only in the line's own scale (the buckets' only while
    /// no request has charged since), as the model.
    #[test]
    fn prop_memo_varying(
        ls in varying_limits(),
        kind in 0u8..8,
        ops in ops(1, 48),
        t in start(),
        eval in any::<bool>(),
    ) {
        let mode = if eval { Mode::Eval } else { Mode::Function };
        replay_memo(&ls, &[kind], true, &ops, t, mode);
    }

    /// Batches in mode "2" (requests sharing keys, runs, several lines a
    /// request), mode "1", repeats and undos: every request as the model's,
    /// an undo refunding each request's charges in order.
    #[test]
    fn prop_memo_batches(
        ls in prop::collection::vec(small_limit(), 3),
        batches in prop::collection::vec(
            (any::<u16>(), prop::collection::vec((1u8..8, prop::collection::vec(any::<u8>(), 3)), 1..12), any::<u8>()),
            1..16,
        ),
        t in start(),
        eval in any::<bool>(),
    ) {
        let mode = if eval { Mode::Eval } else { Mode::Function };
        let ls: Vec<Vec<Limit>> = ls.into_iter().map(|l| vec![l]).collect();
        replay_memo_batches(&ls, &batches, t, mode);
    }

    /// Batches on three varying keys (each request's line under one of its
    /// key's limits; not `sliding_log`, whose key lives by its last
    /// writer's window): an undo refunds each request's charges in order,
    /// only in their own scale.
    #[test]
    fn prop_memo_batches_varying(
        ls in prop::collection::vec(
            varying_limits().prop_filter("sliding_log", |ls| ls[0].algorithm() != Algorithm::SlidingLog),
            3,
        ),
        batches in prop::collection::vec(
            (any::<u16>(), prop::collection::vec((1u8..8, prop::collection::vec(any::<u8>(), 3)), 1..12), any::<u8>()),
            1..16,
        ),
        t in start(),
        eval in any::<bool>(),
    ) {
        let mode = if eval { Mode::Eval } else { Mode::Function };
        replay_memo_batches(&ls, &batches, t, mode);
    }
}

/// Sanity: the memo replays reach every path often enough to mean
/// something: calls run and repeated, calls undone before they run (and
/// then answered late), undos that take charges back, undos that find
/// nothing left to take (expired windows, drained buckets, a varying
/// state converted or charged since), second undos.
#[test]
fn memo_replay_coverage() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let mut draw = |s: &dyn Fn(&mut TestRunner)| {
        for _ in 0..60 {
            s(&mut runner);
        }
    };
    let seen = |what: &str, s: MemoStats, least: u64| {
        let all = [s.runs, s.repeats, s.late_undone, s.undo_not_run, s.undo_already, s.undo_refunded, s.undo_kept];
        assert!(all.iter().all(|&n| n >= least), "{what}: {s:?}");
    };
    let before = stats();
    draw(&|r| {
        let (l, k, ops, t) = (small_limit(), 0u8..8, ops(1, 48), start()).new_tree(r).unwrap().current();
        replay_memo(&[l], &[k], false, &ops, t, Mode::Function);
    });
    seen("single line", diff(stats(), before), 3);
    let before = stats();
    draw(&|r| {
        let (ls, k, ops, t) = (varying_limits(), 0u8..8, ops(1, 48), start()).new_tree(r).unwrap().current();
        replay_memo(&ls, &[k], true, &ops, t, Mode::Function);
    });
    seen("varying", diff(stats(), before), 15);
    let before = stats();
    draw(&|r| {
        let batches = prop::collection::vec(
            (any::<u16>(), prop::collection::vec((1u8..8, prop::collection::vec(any::<u8>(), 3)), 1..12), any::<u8>()),
            1..16,
        );
        let (ls, b, t) = (prop::collection::vec(small_limit(), 3), batches, start()).new_tree(r).unwrap().current();
        let ls: Vec<Vec<Limit>> = ls.into_iter().map(|l| vec![l]).collect();
        replay_memo_batches(&ls, &b, t, Mode::Function);
    });
    seen("batches", diff(stats(), before), 1);
}

fn diff(a: MemoStats, b: MemoStats) -> MemoStats {
    MemoStats {
        runs: a.runs - b.runs,
        repeats: a.repeats - b.repeats,
        late_undone: a.late_undone - b.late_undone,
        undo_not_run: a.undo_not_run - b.undo_not_run,
        undo_already: a.undo_already - b.undo_already,
        undo_refunded: a.undo_refunded - b.undo_refunded,
        undo_kept: a.undo_kept - b.undo_kept,
    }
}
