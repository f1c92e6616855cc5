//! Calls applied at most once: mode "2" of `limit` and the charge call
//! with a memo key, their repeats, and the undo call (`NAME_undo`) held to
//! the model's `Limit::refund`. Hand-picked cases here; the properties are
//! in props.rs. [`Batches`] runs calls of several requests (sharing keys)
//! on both sides.

use std::collections::HashMap;

use rl_core::limit::{Algorithm, Charge, Limit};
use rl_core::redis::{undo_function_name, undo_script, write_memo_key, LineArg, MAX_EXACT, TTL_MARGIN_MS};

use crate::fixtures::{case_limit, keys, limit, T0};
use crate::harness::{memo_key, parse_script_reply, Before, Memo, Mode, Redis, Replies, Undone};
use crate::model::{late, model_charged, stored};
use crate::pair::{count, Called, Pair, MEMO_MS, UNDONE_MS};

/// A request of a [`Batches`] call: per line, the key it counts on (an
/// index into the driver's keys, whose limit it is) and its line.
pub(crate) type Req = Vec<(usize, LineArg)>;

/// What [`Batches`] knows of a call named by a memo: its keyed lines, and
/// its charges with their limit.
type BatchCall = Called<(usize, LineArg), (usize, Limit, Charge)>;

/// Calls of several requests each on a few keys, each key with its own
/// limit (as `prop_batch`; a line may carry another of a varying key's
/// limits), on the script and on the model request by request: mode "1"
/// or "2", repeats, undos. Compares replies and states, and checks that
/// every static state key's TTL covers its state's reset.
pub(crate) struct Batches {
    pub(crate) redis: Redis,
    pub(crate) keys: Vec<String>,
    limits: Vec<Limit>,
    states: Vec<Vec<u64>>,
    called: HashMap<(u64, u64), BatchCall>,
}

impl Batches {
    pub(crate) fn new(mode: Mode, limits: &[Limit]) -> Batches {
        Batches {
            redis: Redis::with(mode),
            keys: keys(limits.len()),
            limits: limits.to_vec(),
            states: limits.iter().map(|l| vec![0; l.state_words()]).collect(),
            called: HashMap::new(),
        }
    }

    /// The requests' lines in KEYS order, and their keys.
    fn flat(&self, requests: &[Req]) -> (Vec<(usize, LineArg)>, Vec<String>) {
        let lines: Vec<(usize, LineArg)> = requests.iter().flatten().copied().collect();
        let bkeys = lines.iter().map(|(i, _)| self.keys[*i].clone()).collect();
        (lines, bkeys)
    }

    fn forget_memo(&mut self, id: (u64, u64), now: u64) {
        if self.called.get(&id).is_some_and(|c| now >= c.expiry()) {
            self.called.remove(&id);
        }
    }

    /// One call of `requests` at `now`: mode "1" without `memo`, else mode
    /// "2" named by it. `None`: late (or undone).
    pub(crate) fn call(
        &mut self,
        requests: &[Req],
        now: u64,
        deadline: Option<u64>,
        memo: Option<(u64, u64)>,
    ) -> Option<Replies> {
        self.redis.set_now(now);
        let (_, bkeys) = self.flat(requests);
        let shaped: Vec<Vec<LineArg>> = requests.iter().map(|r| r.iter().map(|(_, l)| *l).collect()).collect();
        let slices: Vec<&[LineArg]> = shaped.iter().map(Vec::as_slice).collect();
        let key = memo.map(|id| memo_key(&self.keys, id));
        if let Some(id) = memo {
            self.forget_memo(id, now);
            if let Some(called) = self.called.get(&id).cloned() {
                let k = key.as_deref().unwrap();
                let (snap, writes) = (self.redis.snapshot(), self.redis.writes());
                let raw = self.redis.call_memo(&bkeys, &slices, now, false, deadline, k);
                assert_eq!((self.redis.snapshot(), self.redis.writes()), (snap, writes), "a repeat wrote");
                return match called {
                    Called::Ran { reply, .. } => {
                        count(|s| s.repeats += 1);
                        assert_eq!(raw, reply, "a repeat answers the first call's reply");
                        parse_script_reply(&raw, &slices).1
                    }
                    Called::Undone { .. } => {
                        count(|s| s.late_undone += 1);
                        assert_eq!(raw, [-1, now as i64], "an undone call answers late");
                        None
                    }
                };
            }
        }
        let before = self.redis.before(key.as_deref().unwrap_or(""));
        let (got, raw) = match &key {
            Some(k) => {
                let raw = self.redis.call_memo(&bkeys, &slices, now, false, deadline, k);
                let (t, out) = parse_script_reply(&raw, &slices);
                assert_eq!(t, now);
                (out, raw)
            }
            None => (self.redis.run_until(&bkeys, &slices, now, true, false, deadline), vec![]),
        };
        self.compare(requests, got, (now, deadline), memo.map(|id| (id, raw)), &before)
    }

    /// The script's answer `got` to `requests` at `now` (with `deadline`)
    /// held to the model, and the store: with `memo` (the call's name and
    /// raw reply), the memo it left.
    fn compare(
        &mut self,
        requests: &[Req],
        got: Option<Replies>,
        (now, deadline): (u64, Option<u64>),
        memo: Option<((u64, u64), Vec<i64>)>,
        before: &Before,
    ) -> Option<Replies> {
        let except = before.except.as_str();
        if late(now, deadline) {
            assert_eq!(got, None, "late");
            self.redis.unchanged_since(before, 0, "a late call");
            if !except.is_empty() {
                assert_eq!(self.redis.memo(except), None, "a late call left a memo");
            }
            return None;
        }
        let got = got.expect("in time");
        assert_eq!(got.len(), requests.len());
        // What the model charged (key index, charge), in order, and where
        // each line charged is in KEYS (1-based).
        let (mut charges, mut at, mut pos) = (Vec::new(), Vec::new(), 0);
        for (j, req) in requests.iter().enumerate() {
            let idx: Vec<usize> = req.iter().map(|(i, _)| *i).collect();
            let lines: Vec<LineArg> = req.iter().map(|(_, l)| *l).collect();
            let mut sub: Vec<Vec<u64>> = idx.iter().map(|&i| self.states[i].clone()).collect();
            let (want, cs) = model_charged(&lines, &mut sub, now, true);
            for (&i, st) in idx.iter().zip(sub) {
                self.states[i] = st;
            }
            assert_eq!(got[j], want, "request {j} at {now}");
            for (n, (&i, c)) in idx.iter().zip(cs).enumerate() {
                if c.cost() > 0 {
                    charges.push((i, lines[n].limit, c));
                    at.push(pos + n + 1);
                }
            }
            pos += req.len();
        }
        self.check_states(now, "after a call");
        if memo.is_some() && at.is_empty() {
            // (a call that charged nothing leaves no memo: run again, it is
            // still applied once)
            assert_eq!(self.redis.memo(except), None, "a call that charged nothing left a memo");
        } else if let Some((id, raw)) = memo {
            let Some(Memo::Ran { reply, done }) = self.redis.memo(except) else {
                panic!("no memo: {:?}", self.redis.memo(except));
            };
            assert_eq!(reply, raw, "the memo's reply");
            assert_eq!(done.iter().map(|d| d.0).collect::<Vec<_>>(), at, "lines charged in the memo");
            let (lines, _) = self.flat(requests);
            let expiry = now + (MEMO_MS + (deadline.unwrap_or(now) - now) / 1000) * 1000;
            assert_eq!(self.redis.expiry(except), Some(expiry), "the memo's TTL");
            count(|s| s.runs += 1);
            self.called.insert(id, Called::Ran { reply: raw, lines, charges, expiry });
        }
        Some(got)
    }

    /// The undo of call `id` at `now` (`requests`: its requests, for a call
    /// not seen run), on both sides.
    pub(crate) fn undo(&mut self, requests: &[Req], now: u64, id: (u64, u64)) -> Undone {
        self.redis.set_now(now);
        self.forget_memo(id, now);
        let key = memo_key(&self.keys, id);
        let called = self.called.get(&id).cloned();
        let lines = match &called {
            Some(Called::Ran { lines, .. }) => lines.clone(),
            _ => self.flat(requests).0,
        };
        let want = match &called {
            None => Undone::NotRun,
            Some(Called::Undone { .. }) => Undone::Already,
            Some(Called::Ran { charges, .. }) => {
                let states = self.states.clone();
                for (i, l, c) in charges {
                    l.refund(&mut self.states[*i], c, now);
                }
                match (charges.is_empty(), states == self.states) {
                    (true, _) => {}
                    (false, false) => count(|s| s.undo_refunded += 1),
                    (false, true) => count(|s| s.undo_kept += 1),
                }
                Undone::TakenBack
            }
        };
        match want {
            Undone::NotRun => count(|s| s.undo_not_run += 1),
            Undone::Already => count(|s| s.undo_already += 1),
            Undone::TakenBack => {}
        }
        let bkeys: Vec<String> = lines.iter().map(|(i, _)| self.keys[*i].clone()).collect();
        let undo_lines: Vec<(Limit, u64)> = lines.iter().map(|(_, a)| (a.limit, a.cost)).collect();
        let (full, writes, memo_exp) = (self.redis.snapshot(), self.redis.writes(), self.redis.expiry(&key));
        let (t, got) = self.redis.undo(&bkeys, &undo_lines, now, false, &key);
        assert_eq!((t, got), (now, want), "undo at {now}");
        match want {
            Undone::NotRun => {
                assert_eq!(self.redis.writes(), writes + 1);
                assert_eq!(self.redis.memo(&key), Some(Memo::Undone));
                let expiry = now + UNDONE_MS * 1000;
                assert_eq!(self.redis.expiry(&key), Some(expiry));
                self.called.insert(id, Called::Undone { expiry });
            }
            Undone::Already => {
                assert_eq!((self.redis.snapshot(), self.redis.writes()), (full, writes), "a second undo wrote");
            }
            Undone::TakenBack => {
                assert_eq!(self.redis.memo(&key), Some(Memo::Undone));
                // The mark lives 70 s, as a call's undone before it runs
                // (longer than the memo would have).
                let mark = now + UNDONE_MS * 1000;
                assert_eq!(self.redis.expiry(&key), Some(mark), "the mark's TTL");
                assert!(memo_exp.is_some_and(|m| m <= mark), "the memo's TTL {memo_exp:?}");
                self.check_states(now, "after an undo");
                self.called.insert(id, Called::Undone { expiry: mark });
            }
        }
        got
    }

    /// Every key the store holds: the model's state, a TTL that covers its
    /// reset + the margin (string states carry it).
    fn check_states(&self, now: u64, what: &str) {
        for (i, (l, s)) in self.limits.iter().zip(&self.states).enumerate() {
            let k = &self.keys[i];
            let Some(v) = self.redis.value(k) else {
                continue;
            };
            assert_eq!(v, stored(l, s), "state of key {i} {what}");
            let exp = self.redis.expiry(k).expect("a key without TTL");
            // (a state that reads as fresh needs the key no longer; a
            // varying key's lives by its last writer's reset: the pair
            // checks those)
            if l.is_varying() {
                continue;
            }
            let reset = l.check(s, now, 0).reset_us;
            assert!(reset == 0 || exp >= now + reset + TTL_MARGIN_MS * 1000, "key {i}: TTL short of the reset {what}");
            if l.algorithm() != Algorithm::SlidingLog {
                assert_eq!(self.redis.stored_expiry(k), Some(exp / 1000), "key {i} {what}");
            }
        }
    }
}

/// The kinds of line each case runs: enforced, dry-run, a `charge=after`
/// line's check, and (buckets, gcra) one with a queue; each static and
/// varying.
fn lines_of(alg: Algorithm) -> Vec<LineArg> {
    let mut out = Vec::new();
    let vary = |l: Limit, varying: bool| if varying { l.varying() } else { l };
    for varying in [false, true] {
        let l = vary(case_limit(alg), varying);
        let base = LineArg::from((l, 1));
        out.push(base);
        out.push(LineArg { dry_run: true, next: true, ..base });
        out.push(LineArg { check_only: true, ..base });
        if matches!(alg, Algorithm::TokenBucket | Algorithm::LeakyBucket | Algorithm::Gcra) {
            let q = vary(case_limit(alg).with_queue(2).unwrap(), varying);
            out.push(LineArg { limit: q, ..base });
        }
    }
    out
}

/// A mode "2" call, then the same call again (same memo key, later, past
/// its deadline too): the repeat answers the first reply exactly, reads and
/// writes nothing; the states go on as the model's. For every algorithm and
/// kind of line, both modes, costs that admit, reject and charge nothing.
#[test]
fn memo_repeat_answers_the_first_reply() {
    for mode in [Mode::Function, Mode::Eval] {
        for alg in Algorithm::ALL {
            for line in lines_of(alg) {
                let what = format!("{mode:?} {line:?}");
                let mut p = Pair::with(mode, &[line]);
                let mut t = T0;
                let mut ids = Vec::new();
                for (n, cost) in [1, 2, 0, 3, 4, 1, 1].into_iter().enumerate() {
                    let id = (7, n as u64);
                    let l = [LineArg { cost, ..line }];
                    let first = p.step_memo(&l, t, n % 2 == 0, Some(t + 1_000), id);
                    assert!(first.is_some(), "{what}");
                    // A call that charged nothing leaves no memo: sent again,
                    // it runs again (step_memo holds it to the model).
                    if p.remembers(id) {
                        // Again, at once, then past the deadline: the same.
                        assert_eq!(p.step_memo(&l, t, false, Some(t + 1_000), id), first, "{what}");
                        assert_eq!(p.step_memo(&l, t + 1_001, false, Some(t + 1_000), id), first, "{what}");
                        // Without a deadline too, and with another.
                        assert_eq!(p.step_memo(&l, t + 2_000, true, None, id), first, "{what}");
                        assert_eq!(p.step_memo(&l, t + 3_000, false, Some(t - 1), id), first, "{what}");
                    } else {
                        p.step_memo(&l, t + 2_000, true, None, id);
                    }
                    ids.push((id, l));
                    // (the next call soon after, or after this one's reset)
                    t += if n == 4 { 4_000_000 } else { 300_000 };
                }
                // Mode "1" and "0" calls go on as the model says.
                p.step(&[line], t, true, false);
                p.step(&[line], t, false, true);
                // Undo each call: each charge taken back, as the model's
                // refund; twice is once; a repeat after the undo is late.
                for (id, l) in &ids {
                    let want = p.undo_of(*id);
                    assert_eq!(p.undo(l, t, false, *id), want, "{what}");
                    assert_eq!(p.undo(l, t + 1, true, *id), Undone::Already, "{what}");
                    assert_eq!(p.step_memo(l, t + 2, false, None, *id), None, "{what}");
                    t += 50_000;
                }
                p.step(&[line], t, true, false);
            }
        }
    }
}

/// An undo before the call: the call then answers late and writes nothing,
/// whenever it comes while the mark lives (70 s); undo twice is once. Once
/// the mark has expired, a call of that name runs.
#[test]
fn undo_before_the_call_makes_it_late() {
    for mode in [Mode::Function, Mode::Eval] {
        for alg in Algorithm::ALL {
            for line in lines_of(alg) {
                let what = format!("{mode:?} {line:?}");
                let mut p = Pair::with(mode, &[line]);
                p.step(&[line], T0, true, false);
                let id = (1, 2);
                assert_eq!(p.undo(&[line], T0 + 10, false, id), Undone::NotRun, "{what}");
                assert_eq!(p.undo(&[line], T0 + 20, true, id), Undone::Already, "{what}");
                p.step(&[line], T0 + 25, true, false);
                // The raw reply is a late call's.
                let k = memo_key(&p.keys, id);
                let raw = p.redis.call_memo(&p.keys, &[&[line][..]], T0 + 28, false, None, &k);
                assert_eq!(raw, [-1, (T0 + 28) as i64]);
                let (_, out) = parse_script_reply(&raw, &[&[line][..]]);
                assert_eq!(out, None);
                for dt in [30, 1_000_000, UNDONE_MS * 1000 - 11] {
                    assert_eq!(p.step_memo(&[line], T0 + dt, false, Some(T0 + dt + 5), id), None, "{what}");
                    assert_eq!(p.step_memo(&[line], T0 + dt, true, None, id), None, "{what}");
                }
                // After the mark: the name is free again.
                let t = T0 + UNDONE_MS * 1000 + 10;
                assert!(p.step_memo(&[line], t, false, None, id).is_some(), "{what}");
                let want = p.undo_of(id);
                assert_eq!(p.undo(&[line], t + 1, false, id), want, "{what}");
            }
        }
    }
}

/// A call undone soon after leaves every state as it was before the
/// call, whatever the algorithm (the model aside: a direct check).
#[test]
fn undo_at_once_restores_the_states() {
    let lines: Vec<LineArg> = Algorithm::ALL.iter().map(|&a| LineArg::from((case_limit(a), 2))).collect();
    for mode in [Mode::Function, Mode::Eval] {
        let mut p = Pair::with(mode, &lines);
        let one: Vec<LineArg> = lines.iter().map(|l| LineArg { cost: 1, ..*l }).collect();
        p.step(&one, T0, true, false);
        let values = |p: &Pair| p.keys.iter().map(|k| p.redis.value(k)).collect::<Vec<_>>();
        let before = values(&p);
        // (at the same instant: later, the buckets would keep what drained
        // since, in another word, `last`)
        let (admitted, _) = p.step_memo(&lines, T0, false, None, (0, 1)).unwrap();
        assert!(admitted);
        assert_ne!(values(&p), before);
        assert_eq!(p.undo(&lines, T0 + 1_000, false, (0, 1)), Undone::TakenBack);
        assert_eq!(values(&p), before, "{mode:?}");
        // Rejected calls charge nothing and leave no memo: their undo
        // takes nothing back, and marks the name.
        let big: Vec<LineArg> = lines.iter().map(|l| LineArg { cost: 3, ..*l }).collect();
        let (admitted, _) = p.step_memo(&big, T0 + 2_000, false, None, (0, 2)).unwrap();
        assert!(!admitted);
        assert_eq!(p.undo(&big, T0 + 3_000, false, (0, 2)), Undone::NotRun);
        assert_eq!(values(&p), before, "{mode:?}");
    }
}

/// A varying line's charge is taken back only in its own scale, and for
/// the buckets only while no other request has charged the state since
/// (rl-core's vary::refund): another commit of the same line, or one of
/// another rate, after the call, keeps the charge.
#[test]
fn undo_of_a_varying_line_after_other_charges() {
    for alg in Algorithm::ALL {
        let a = limit(alg, 2, 1_000_000, 6).varying();
        let b = limit(alg, 4, 1_000_000, 6).varying();
        for mode in [Mode::Function, Mode::Eval] {
            for other in [a, b] {
                let what = format!("{mode:?} {alg} other {other:?}");
                let mut p = Pair::with(mode, &[(a, 1)]);
                p.step(&[(a, 1)], T0, true, false);
                assert!(p.step_memo(&[(a, 2)], T0 + 100_000, false, None, (3, 1)).unwrap().0, "{what}");
                p.step(&[(other, 1)], T0 + 200_000, true, false);
                p.undo(&[(a, 2)], T0 + 300_000, false, (3, 1));
                p.step(&[(a, 1)], T0 + 300_000, true, false);
                // And with the undo before the other commit.
                let mut p = Pair::with(mode, &[(a, 1)]);
                assert!(p.step_memo(&[(a, 2)], T0 + 100_000, false, None, (3, 1)).unwrap().0, "{what}");
                p.undo(&[(a, 2)], T0 + 150_000, false, (3, 1));
                p.step(&[(other, 1)], T0 + 200_000, true, false);
            }
        }
    }
}

/// The buckets and `gcra`: an undo long after the call gives back only
/// what has not drained since; the windows, nothing once the window
/// charged has passed; `sliding_log`, nothing once its stamps expired.
#[test]
fn undo_late_takes_back_what_is_left() {
    for alg in Algorithm::ALL {
        for varying in [false, true] {
            let l = case_limit(alg);
            let l = if varying { l.varying() } else { l };
            for dt in [0, 1, 250_000, 500_000, 1_499_999, 1_500_000, 2_999_999, 3_000_000, 9_000_000] {
                let what = format!("{alg} varying={varying} dt={dt}");
                let mut p = Pair::new(&[(l, 1)]);
                p.step(&[(l, 1)], T0 + 700_000, true, false);
                assert!(p.step_memo(&[(l, 2)], T0 + 700_000, false, None, (9, dt)).unwrap().0, "{what}");
                p.step(&[(l, 1)], T0 + 700_000 + dt / 2, true, false);
                p.undo(&[(l, 2)], T0 + 700_000 + dt, false, (9, dt));
                for step in 0..4 {
                    p.step(&[(l, 1)], T0 + 700_000 + dt + step * 400_000, true, false);
                }
            }
        }
    }
}

/// The charge call with a memo key (one key more than lines): a repeat
/// answers the first reply and charges nothing again; its undo finds no
/// line to take back (its memo records none) and marks it; a repeat after
/// that answers {-1, now}.
#[test]
fn charge_with_memo_charges_once() {
    for mode in [Mode::Function, Mode::Eval] {
        for alg in Algorithm::ALL {
            for varying in [false, true] {
                let l = case_limit(alg);
                let l = if varying { l.varying() } else { l };
                let what = format!("{mode:?} {l:?}");
                let mut p = Pair::with(mode, &[(l, 1), (l, 1)]);
                p.step(&[(l, 1), (l, 1)], T0, true, false);
                let lines = [(l, 5), (l, 0)];
                let first = p.charge_memo(&lines, T0 + 10, false, (4, 4));
                // (sliding_log refuses every charge, of 0 too)
                let want = alg != Algorithm::SlidingLog;
                assert_eq!(first, Some(vec![want, want]), "{what}");
                assert_eq!(p.charge_memo(&lines, T0 + 20, true, (4, 4)), first, "{what}");
                // (a charge that wrote nothing, sliding_log's, leaves no memo:
                // sent again later, it runs again, on states of then)
                if want {
                    assert_eq!(p.charge_memo(&lines, T0 + 9_000_000, false, (4, 4)), first, "{what}");
                }
                p.step(&[(l, 1), (l, 1)], T0 + 30, true, false);
                // (sliding_log's charge wrote nothing, and left no memo)
                let undone = if want { Undone::TakenBack } else { Undone::NotRun };
                assert_eq!(p.undo(&lines, T0 + 40, false, (4, 4)), undone, "{what}");
                assert_eq!(p.charge_memo(&lines, T0 + 50, false, (4, 4)), None, "{what}");
                p.step(&[(l, 1), (l, 1)], T0 + 60, true, false);
                // Undone before it runs: it never does.
                assert_eq!(p.undo(&lines, T0 + 70, false, (4, 5)), Undone::NotRun, "{what}");
                assert_eq!(p.charge_memo(&lines, T0 + 80, false, (4, 5)), None, "{what}");
                // Without a memo key: charged every time.
                p.charge(&lines, T0 + 90, false);
                p.charge(&lines, T0 + 90, false);
            }
        }
    }
}

/// Batches in mode "2": several requests in one call, runs ("-n"), several
/// lines per request, requests sharing a key; a repeat answers the first
/// reply and writes nothing; the undo refunds each request's charges in
/// order, as the model does.
#[test]
fn memo_batches() {
    let ls = [
        limit(Algorithm::Gcra, 10, 1_000_000, 3).with_queue(2).unwrap(),
        limit(Algorithm::SlidingLog, 1, 1_000_000, 3),
        limit(Algorithm::Fixed, 100, 60_000_000, 5),
        limit(Algorithm::TokenBucket, 5, 1_000_000, 4),
        limit(Algorithm::Sliding, 3, 1_000_000, 4),
        limit(Algorithm::LeakyBucket, 2, 1_000_000, 3).with_queue(3).unwrap(),
    ];
    let line = |i: usize, cost: u64| {
        (
            i,
            LineArg {
                limit: ls[i],
                cost,
                dry_run: false,
                check_only: false,
                next: i == 3,
                lease_life: 0,
                kept: 0,
                holder: None,
                wait: None,
                classes: None,
            },
        )
    };
    let dry = |i: usize, cost: u64| (i, LineArg { dry_run: true, ..line(i, cost).1 });
    let batch: Vec<Req> = vec![
        vec![line(0, 1)],
        vec![line(0, 1)],
        vec![line(0, 1)],
        vec![line(1, 1), line(2, 1)],
        vec![line(3, 2), dry(4, 1), line(5, 1)],
        vec![line(0, 1)],
        vec![line(1, 2), line(2, 2)],
        vec![line(3, 1)],
        vec![line(3, 1)],
        vec![line(4, 3), line(0, 0)],
        vec![line(5, 1), line(0, 1)],
        vec![line(2, 1), (1, LineArg { check_only: true, ..line(1, 1).1 })],
    ];
    for mode in [Mode::Function, Mode::Eval] {
        let mut b = Batches::new(mode, &ls);
        let first = b.call(&batch, T0, Some(T0 + 2_000), Some((1, 1))).unwrap();
        let admitted: Vec<bool> = first.iter().map(|r| r.0).collect();
        assert!(admitted.iter().filter(|a| **a).count() >= 6, "{admitted:?}");
        assert!(admitted.iter().any(|a| !a), "{admitted:?}");
        assert_eq!(b.call(&batch, T0 + 1, Some(T0 + 2_000), Some((1, 1))), Some(first.clone()));
        assert_eq!(b.call(&batch, T0 + 3_000, Some(T0 + 2_000), Some((1, 1))), Some(first.clone()));
        // Another call in between, mode 1 and mode 2.
        b.call(&batch[..4], T0 + 100_000, None, None);
        b.call(&batch[3..], T0 + 200_000, None, Some((1, 2)));
        assert_eq!(b.undo(&batch, T0 + 300_000, (1, 1)), Undone::TakenBack);
        assert_eq!(b.undo(&batch, T0 + 300_000, (1, 1)), Undone::Already);
        assert_eq!(b.call(&batch, T0 + 300_000, None, Some((1, 1))), None);
        b.call(&batch, T0 + 400_000, None, None);
        assert_eq!(b.undo(&batch[3..], T0 + 500_000, (1, 2)), Undone::TakenBack);
        b.call(&batch, T0 + 600_000, None, Some((1, 3)));
        assert_eq!(b.undo(&batch, T0 + 600_000, (1, 4)), Undone::NotRun);
        assert_eq!(b.call(&batch, T0 + 600_000, None, Some((1, 4))), None);
        b.call(&batch, T0 + 700_000, None, None);
    }
}

/// A call of more requests than the script packs at once (256 doubles): a
/// run of 120 requests of one key, then of 120 keys; its reply and memo
/// round-trip, and its undo takes back every request.
#[test]
fn memo_of_a_big_batch() {
    for mode in [Mode::Function, Mode::Eval] {
        for alg in [Algorithm::Gcra, Algorithm::Fixed, Algorithm::SlidingLog, Algorithm::TokenBucket] {
            let l = limit(alg, 1000, 1_000_000, 100);
            let one = |i: usize| vec![(i, LineArg::from((l, 1)))];
            // One key: 100 admitted, 20 rejected.
            let mut b = Batches::new(mode, &[l]);
            let batch: Vec<Req> = (0..120).map(|_| one(0)).collect();
            let first = b.call(&batch, T0, None, Some((5, 0))).unwrap();
            assert_eq!(first.iter().filter(|r| r.0).count(), 100);
            assert_eq!(b.call(&batch, T0 + 7, None, Some((5, 0))), Some(first));
            let Some(Memo::Ran { reply, done }) = b.redis.memo(&memo_key(&b.keys, (5, 0))) else { panic!() };
            assert_eq!((reply.len(), done.len()), (1 + 5 * 120, 100));
            assert_eq!(b.undo(&batch, T0 + 8, (5, 0)), Undone::TakenBack);
            b.call(&batch, T0 + 9, None, None);
            // 120 keys, one request each: all admitted.
            let ls = vec![l; 120];
            let mut b = Batches::new(mode, &ls);
            let batch: Vec<Req> = (0..120).map(one).collect();
            let first = b.call(&batch, T0, None, Some((5, 1))).unwrap();
            assert!(first.iter().all(|r| r.0));
            assert_eq!(b.call(&batch, T0 + 7, None, Some((5, 1))), Some(first));
            assert_eq!(b.undo(&batch, T0 + 8, (5, 1)), Undone::TakenBack);
            b.call(&batch, T0 + 9, None, None);
        }
    }
}

/// The memo as stored, by hand: the reply, then per line charged its index
/// in KEYS and the words v1, v2 the algorithm left (from which the undo
/// finds the charge); the TTL 10 s past the deadline; the mark "u".
#[test]
fn memo_format() {
    let g = limit(Algorithm::Gcra, 2, 1_000_000, 3); // T = 0.5 s
    let f = limit(Algorithm::Fixed, 2, 1_000_000, 3); // W = 1.5 s
    let t = limit(Algorithm::TokenBucket, 2, 1_000_000, 3);
    let s = limit(Algorithm::SlidingLog, 2, 1_000_000, 3);
    let ks = keys(4);
    let r = Redis::new();
    let m = memo_key(&ks, (0xab, 0xcd));
    let tag_end = ks[0].find('}').map_or(ks[0].len(), |i| i + 1);
    assert_eq!(m, format!("{}:c:00000000000000abcd", &ks[0][..tag_end]));
    let mut m2 = String::from("x");
    write_memo_key(&mut m2, "k", (1, 0x10));
    assert_eq!(m2, "xk:c:000000000000000110");
    let lines = [(g, 2), (f, 1), (t, 3), (s, 1)];
    let raw = r.call_memo(&ks, &[&lines[..]], T0, false, Some(T0 + 2_500_000), &m);
    let Some(Memo::Ran { reply, done }) = r.memo(&m) else { panic!("{:?}", r.memo(&m)) };
    assert_eq!(reply, raw);
    let k = T0 / 1_500_000;
    assert_eq!(
        done,
        [(1, T0 + 1_000_000, 0), (2, k + 1, 1), (3, 3_000_000, T0), (4, T0, 0)],
        "gcra: TAT; fixed: window + 1, count; bucket: used, at; log: stamp"
    );
    assert_eq!(r.expiry(&m), Some(T0 + 12_500_000));
    // A charge's memo: its reply alone.
    let mc = memo_key(&ks, (1, 1));
    let raw = r.call_charge_memo(&ks[..1], &[(g, 1)], T0, false, &mc);
    assert_eq!(raw, [T0 as i64, 1]);
    assert_eq!(r.memo(&mc), Some(Memo::Ran { reply: raw, done: vec![] }));
    assert_eq!(r.expiry(&mc), Some(T0 + MEMO_MS * 1000));
    // The undo: the mark, for 70 s.
    assert_eq!(r.undo(&ks, &lines, T0 + 5, false, &m), (T0 + 5, Undone::TakenBack));
    assert_eq!(r.memo(&m), Some(Memo::Undone));
    assert_eq!(r.expiry(&m), Some(T0 + 5 + UNDONE_MS * 1000));
    // The undo's names.
    assert!(undo_script().ends_with("return undo(KEYS, ARGV)\n"));
    assert!(rl_core::redis::function_library()
        .contains(&format!("redis.register_function('{}', undo)", undo_function_name())));
}

/// Malformed memo calls: mode "2" without a memo key besides its keys, an
/// undo whose arguments do not match its keys: error replies, nothing
/// written. A memo key holding something else than a memo or the mark
/// reads as the mark (the call answers late, the undo leaves it).
#[test]
fn memo_malformed() {
    let r = Redis::new();
    r.set_now(T0);
    let ks = keys(2);
    let args = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let line = "gcra 1 1000000 1 1 0 0";
    let err = |t: mlua::Table| t.raw_get::<Option<String>>("err").unwrap();
    assert_eq!(err(r.eval_table(&ks[..1], &args(&["2", "", "", line]))).as_deref(), Some("rl: malformed arguments"));
    assert_eq!(err(r.eval_table(&[], &args(&["2", "", ""]))).as_deref(), Some("rl: malformed arguments"));
    let e = err(r.call_undo_table(&ks[..1], &args(&[""])));
    assert_eq!(e.as_deref(), Some("rl: malformed arguments"));
    let e = err(r.call_undo_table(&ks, &args(&["", line, line])));
    assert_eq!(e.as_deref(), Some("rl: malformed arguments"));
    assert_eq!(r.writes(), 0);
    crate::harness::put_raw(&r, &ks[1], "junk", false);
    assert_eq!(r.eval(&ks, &args(&["2", "", "", line])), [-1, T0 as i64]);
    assert_eq!(r.eval_undo(&ks, &args(&["", line])), [T0 as i64, 2]);
    assert_eq!(r.writes(), 0);
    // A time beyond 2^52: the undo takes nothing back (but marks the call).
    let l = limit(Algorithm::Gcra, 1, 1_000_000, 3);
    let m = memo_key(&ks, (2, 2));
    let raw = r.call_memo(&ks[..1], &[&[(l, 1)][..]], T0, false, None, &m);
    assert_eq!(raw[3], -2);
    let before = r.value(&ks[0]);
    let spec = rl_core::redis::charge_args([(l, 1)], Some(MAX_EXACT + 1));
    assert_eq!(r.eval_undo(&[ks[0].clone(), m.clone()], &spec), [(MAX_EXACT + 1) as i64, 1]);
    assert_eq!(r.value(&ks[0]), before);
    assert_eq!(r.memo(&m), Some(Memo::Undone));
}

/// On Redis before 6.0 (which the script serves, by `EVALSHA`), `SET`
/// knows no `KEEPTTL` (the fake answers as Redis 5 does): the undo must
/// still mark the call undone, or it would fail after its refunds, leave
/// the memo, and each retry refund the call again.
#[test]
fn undo_on_redis_before_6() {
    for alg in Algorithm::ALL {
        let l = case_limit(alg);
        let mut p = Pair::with(Mode::Eval, &[(l, 1)]);
        p.redis.fake.set("version", 5).unwrap();
        p.step(&[(l, 1)], T0, true, false);
        assert!(p.step_memo(&[(l, 2)], T0 + 10, false, Some(T0 + 3_000), (6, 1)).unwrap().0, "{alg}");
        assert_eq!(p.undo(&[(l, 2)], T0 + 20, false, (6, 1)), Undone::TakenBack, "{alg}");
        assert_eq!(p.undo(&[(l, 2)], T0 + 30, false, (6, 1)), Undone::Already, "{alg}");
        assert_eq!(p.step_memo(&[(l, 2)], T0 + 40, false, Some(T0 + 3_000), (6, 1)), None, "{alg}");
        p.step(&[(l, 1)], T0 + 50, true, false);
    }
}
