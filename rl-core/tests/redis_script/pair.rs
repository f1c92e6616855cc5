//! The differential step: one call run on the script and on the model,
//! outcomes, writes, stored state and TTLs compared.

use std::collections::HashMap;

use rl_core::limit::{Algorithm, Charge, Limit};
use rl_core::redis::{
    check_line, expiry_after_write, parse_charge_reply, ChargeReply, LineArg, CLOCK_STEP_US, OVERDRAWN, TTL_MARGIN_MS,
};
use rl_core::verdict::Outcome;

use crate::fixtures::keys;
use crate::harness::{memo_key, parse_script_reply, Before, Memo, Mode, Redis, Undone};
use crate::model::{checked_cost, late, model_charge, model_charged, stored};

/// How long a memo outlives its call's deadline (ms), and the mark of a
/// call undone before it ran lives (ms), as the script keeps them.
pub(crate) const MEMO_MS: u64 = 10_000;
pub(crate) const UNDONE_MS: u64 = 70_000;

/// How often the memo paths ran on this thread ([`Pair`] and
/// [`crate::memo::Batches`] count them, for a test that the replays reach
/// each often enough).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct MemoStats {
    /// Calls named by a memo that ran (not late).
    pub(crate) runs: u64,
    /// Repeats answered from a memo.
    pub(crate) repeats: u64,
    /// Calls answered late because they were undone.
    pub(crate) late_undone: u64,
    pub(crate) undo_not_run: u64,
    pub(crate) undo_already: u64,
    /// Undos of calls that charged something: some state changed, or none.
    pub(crate) undo_refunded: u64,
    pub(crate) undo_kept: u64,
}

thread_local! {
    static STATS: std::cell::Cell<MemoStats> = std::cell::Cell::new(MemoStats::default());
}

/// Counts in this thread's [`MemoStats`].
pub(crate) fn count(f: impl FnOnce(&mut MemoStats)) {
    STATS.with(|s| {
        let mut x = s.get();
        f(&mut x);
        s.set(x);
    });
}

/// This thread's [`MemoStats`].
pub(crate) fn stats() -> MemoStats {
    STATS.with(|s| s.get())
}

/// What a driver knows of a call named by a memo, by its id: lines `L`
/// (the pair's, or a batch's keyed ones), charges `C` (what a refund takes
/// back, with the line's index, and for a batch its limit).
#[derive(Clone, Debug)]
pub(crate) enum Called<L, C> {
    /// It ran (a mode "2" call, or a charge): its raw reply, its lines in
    /// KEYS order, what the model charged in the order of commit, and when
    /// its memo expires (µs).
    Ran { reply: Vec<i64>, lines: Vec<L>, charges: Vec<C>, expiry: u64 },
    /// Undone, before or after it ran; the mark expires at `expiry`.
    Undone { expiry: u64 },
}

impl<L, C> Called<L, C> {
    pub(crate) fn expiry(&self) -> u64 {
        match self {
            Called::Ran { expiry, .. } | Called::Undone { expiry } => *expiry,
        }
    }
}

/// Runs both sides for one call and checks outcomes, writes and stored state.
pub(crate) struct Pair {
    pub(crate) redis: Redis,
    pub(crate) keys: Vec<String>,
    states: Vec<Vec<u64>>,
    /// Each string state key's expiry (ms) as the TTL policy predicts it.
    expiries: Vec<u64>,
    /// The latest `now` of any step so far.
    latest: u64,
    /// Whether a charge call has run: the states may hold overdrafts.
    overdrawn: bool,
    /// The calls named by a memo so far, by id.
    called: HashMap<(u64, u64), Called<LineArg, (usize, Charge)>>,
}

impl Pair {
    pub(crate) fn new<T: Copy + Into<LineArg>>(lines: &[T]) -> Pair {
        Pair::with(Mode::Function, lines)
    }

    pub(crate) fn with<T: Copy + Into<LineArg>>(mode: Mode, lines: &[T]) -> Pair {
        Pair {
            redis: Redis::with(mode),
            keys: keys(lines.len()),
            states: lines.iter().map(|&l| vec![0; Into::<LineArg>::into(l).limit.state_words()]).collect(),
            expiries: vec![0; lines.len()],
            latest: 0,
            overdrawn: false,
            called: HashMap::new(),
        }
    }

    pub(crate) fn step<T: Copy + Into<LineArg> + std::fmt::Debug>(
        &mut self,
        lines: &[T],
        now: u64,
        commit: bool,
        use_time: bool,
    ) -> (bool, Vec<Outcome>) {
        self.step_until(lines, now, commit, use_time, None).expect("no deadline, yet late")
    }

    /// [`Pair::step`] for a call with a deadline: `None` if it ran past it
    /// (then the model and the script must agree, and nothing be read or
    /// written).
    pub(crate) fn step_until<T: Copy + Into<LineArg> + std::fmt::Debug>(
        &mut self,
        lines: &[T],
        now: u64,
        commit: bool,
        use_time: bool,
        deadline: Option<u64>,
    ) -> Option<(bool, Vec<Outcome>)> {
        self.call(lines, now, commit, use_time, deadline, None)
    }

    /// A mode "2" call (a commit named by the memo key of `id`): the first
    /// of its name is [`Pair::step_until`], its memo checked (the reply,
    /// which lines it charged, its TTL); a repeat (while its memo lives)
    /// answers the first's reply and reads and writes nothing; a call
    /// undone answers late and writes nothing. `None`: late or undone.
    pub(crate) fn step_memo<T: Copy + Into<LineArg> + std::fmt::Debug>(
        &mut self,
        lines: &[T],
        now: u64,
        use_time: bool,
        deadline: Option<u64>,
        id: (u64, u64),
    ) -> Option<(bool, Vec<Outcome>)> {
        self.redis.set_now(now);
        self.forget_memo(id, now);
        let Some(called) = self.called.get(&id).cloned() else {
            return self.call(lines, now, true, use_time, deadline, Some(id));
        };
        let key = memo_key(&self.keys, id);
        let (snap, writes, reads) = (self.redis.snapshot(), self.redis.writes(), self.redis.count("MGET"));
        let raw = self.redis.call_memo(&self.keys, &[lines], now, use_time, deadline, &key);
        assert_eq!(self.redis.count("MGET"), reads, "a repeat read keys");
        assert_eq!(self.redis.writes(), writes, "a repeat wrote");
        assert_eq!(self.redis.snapshot(), snap, "a repeat changed the store");
        self.latest = self.latest.max(now);
        match called {
            Called::Ran { reply, .. } => {
                count(|s| s.repeats += 1);
                assert_eq!(raw, reply, "a repeat answers the first call's reply");
                let (_, out) = parse_script_reply(&raw, &[lines]);
                let mut out = out.expect("a call that ran is not late");
                assert_eq!(out.len(), 1);
                Some(out.remove(0))
            }
            Called::Undone { .. } => {
                count(|s| s.late_undone += 1);
                assert_eq!(raw, [-1, now as i64], "an undone call answers late");
                None
            }
        }
    }

    /// Whether the script keeps a memo of call `id` (it ran and charged).
    pub(crate) fn remembers(&self, id: (u64, u64)) -> bool {
        matches!(self.called.get(&id), Some(Called::Ran { .. }))
    }

    /// What an undo of call `id` answers now: taken back if the script
    /// keeps its memo; else (it has not run, or charged nothing, which
    /// leaves none) marked never to run.
    pub(crate) fn undo_of(&self, id: (u64, u64)) -> Undone {
        match self.called.get(&id) {
            Some(Called::Ran { .. }) => Undone::TakenBack,
            Some(Called::Undone { .. }) => Undone::Already,
            None => Undone::NotRun,
        }
    }

    /// Forgets what the pair knew of call `id` once its memo has expired at
    /// `now`.
    fn forget_memo(&mut self, id: (u64, u64), now: u64) {
        if self.called.get(&id).is_some_and(|c| now >= c.expiry()) {
            self.called.remove(&id);
            assert_eq!(self.redis.memo(&memo_key(&self.keys, id)), None, "memo expired");
        }
    }

    /// One call on both sides: mode "0" or "1", or with `memo` a mode "2"
    /// call of that id that has not run.
    fn call<T: Copy + Into<LineArg> + std::fmt::Debug>(
        &mut self,
        lines: &[T],
        now: u64,
        commit: bool,
        use_time: bool,
        deadline: Option<u64>,
        memo: Option<(u64, u64)>,
    ) -> Option<(bool, Vec<Outcome>)> {
        self.redis.set_now(now);
        let args: Vec<LineArg> = lines.iter().map(|&l| l.into()).collect();
        self.forget_expired(&args);
        let key = memo.map(|id| memo_key(&self.keys, id));
        let before = self.redis.before(key.as_deref().unwrap_or(""));
        let reads = self.redis.count("MGET");
        let (got, raw) = match &key {
            None => (self.redis.run_until(&self.keys, &[lines], now, commit, use_time, deadline), vec![]),
            Some(k) => {
                assert!(commit);
                let raw = self.redis.call_memo(&self.keys, &[lines], now, use_time, deadline, k);
                let (t, out) = parse_script_reply(&raw, &[lines]);
                assert_eq!(t, now);
                (out, raw)
            }
        };
        let got = got.map(|mut out| {
            assert_eq!(out.len(), 1);
            out.remove(0)
        });
        let want = (!late(now, deadline)).then(|| model_charged(lines, &mut self.states, now, commit));
        assert_eq!(
            got,
            want.as_ref().map(|w| w.0.clone()),
            "now={now} deadline={deadline:?} commit={commit} memo={memo:?} lines={lines:?}"
        );
        let Some((want, charges)) = want else {
            assert_eq!(self.redis.count("MGET"), reads, "a late call read keys");
            self.redis.unchanged_since(&before, 0, "a late call");
            if let Some(k) = &key {
                assert_eq!(self.redis.memo(k), None, "a late call left a memo");
            }
            return None;
        };
        // Every reply the script gives passes the range check nginx applies
        // to it, while the clock has not stepped back by more than that
        // check allows (some cases step it back by far more on purpose).
        self.latest = self.latest.max(now);
        if self.latest - now <= CLOCK_STEP_US {
            let deepest = match self.overdrawn {
                true => OVERDRAWN,
                false => args.iter().map(|a| a.limit.queue()).max().unwrap_or(0),
            };
            for (a, o) in args.iter().zip(&want.1) {
                // (as nginx checks it: a line of classes for cost + kept, the wider request's wait)
                let cost = checked_cost(a) + a.kept;
                assert_eq!(check_line(&a.limit, cost, o, deepest), Ok(()), "now={now} line {a:?}: {o:?}");
            }
        }
        // Which lines wrote: those the request charged (a charge=after
        // line's check never is).
        let charged: Vec<bool> = want
            .1
            .iter()
            .zip(&args)
            .map(|(o, a)| commit && want.0 && o.admitted && a.cost > 0 && !a.check_only)
            .collect();
        let refundable: Vec<(usize, Charge)> =
            charges.iter().copied().enumerate().filter(|(_, c)| c.cost() > 0).collect();
        assert_eq!(
            refundable.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
            (0..args.len()).filter(|&i| charged[i]).collect::<Vec<_>>()
        );
        // (a call that charged nothing leaves no memo: run again, it is
        // still applied once)
        let remembered = memo.is_some() && !refundable.is_empty();
        self.check_store(&args, &charged, &want.1, now, &before, u64::from(remembered));
        if let (Some(k), false) = (&key, remembered) {
            assert_eq!(self.redis.memo(k), None, "a call that charged nothing left a memo");
        }
        if let (Some(id), Some(k), true) = (memo, &key, remembered) {
            // The memo: the reply, and per line charged its index in KEYS
            // (1-based); it lives 10 s past the deadline.
            let Some(Memo::Ran { reply, done }) = self.redis.memo(k) else {
                panic!("no memo after a call that ran: {:?}", self.redis.memo(k));
            };
            assert_eq!(reply, raw, "the memo's reply");
            let ks: Vec<usize> = done.iter().map(|d| d.0).collect();
            assert_eq!(ks, refundable.iter().map(|(i, _)| i + 1).collect::<Vec<_>>(), "lines charged in the memo");
            let expiry = now + (MEMO_MS + (deadline.unwrap_or(now) - now) / 1000) * 1000;
            assert_eq!(self.redis.expiry(k), Some(expiry), "the memo's TTL");
            count(|s| s.runs += 1);
            self.called.insert(id, Called::Ran { reply: raw, lines: args, charges: refundable, expiry });
        }
        Some(want)
    }

    /// The undo of the call `id` at `now` (`lines`: the call's lines, each
    /// with its cost, for a call the pair has not seen run): on the model,
    /// each of its charges refunded in order (`Limit::refund`); the script
    /// must answer the same, leave the same states, and TTLs that still
    /// cover them; a call not run is marked for 70 s; one undone already is
    /// left alone.
    pub(crate) fn undo<T: Copy + Into<LineArg>>(
        &mut self,
        lines: &[T],
        now: u64,
        use_time: bool,
        id: (u64, u64),
    ) -> Undone {
        self.redis.set_now(now);
        self.forget_memo(id, now);
        let called = self.called.get(&id).cloned();
        let args: Vec<LineArg> = match &called {
            Some(Called::Ran { lines, .. }) => lines.clone(),
            _ => lines.iter().map(|&l| l.into()).collect(),
        };
        self.forget_expired(&args);
        let key = memo_key(&self.keys, id);
        let (snap, writes) = (self.redis.snapshot_except(&key), self.redis.writes());
        let (full, memo_exp) = (self.redis.snapshot(), self.redis.expiry(&key));
        let before: Vec<Option<u64>> = self.keys.iter().map(|k| self.redis.expiry(k)).collect();
        let values: Vec<Option<String>> = self.keys.iter().map(|k| self.redis.value(k)).collect();
        let want = match &called {
            None => Undone::NotRun,
            Some(Called::Undone { .. }) => Undone::Already,
            Some(Called::Ran { lines, charges, .. }) => {
                let states = self.states.clone();
                for (i, c) in charges {
                    lines[*i].limit.refund(&mut self.states[*i], c, now);
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
        let undo_lines: Vec<(Limit, u64)> = args.iter().map(|a| (a.limit, a.cost)).collect();
        let (t, got) = self.redis.undo(&self.keys, &undo_lines, now, use_time, &key);
        assert_eq!((t, got), (now, want), "undo now={now} lines={args:?}");
        self.latest = self.latest.max(now);
        match want {
            Undone::NotRun => {
                assert_eq!(self.redis.writes(), writes + 1, "an undo before the call: the mark alone");
                assert_eq!(self.redis.snapshot_except(&key), snap, "an undo before the call changed the states");
                assert_eq!(self.redis.memo(&key), Some(Memo::Undone));
                let expiry = now + UNDONE_MS * 1000;
                assert_eq!(self.redis.expiry(&key), Some(expiry), "the mark's TTL");
                self.called.insert(id, Called::Undone { expiry });
            }
            Undone::Already => {
                assert_eq!(self.redis.writes(), writes, "a second undo wrote");
                assert_eq!(self.redis.snapshot(), full, "a second undo changed the store");
            }
            Undone::TakenBack => {
                assert_eq!(self.redis.memo(&key), Some(Memo::Undone));
                // The mark lives 70 s, as a call's undone before it runs
                // (longer than the memo would have).
                let mark = now + UNDONE_MS * 1000;
                assert_eq!(self.redis.expiry(&key), Some(mark), "the mark's TTL");
                assert!(memo_exp.is_some_and(|m| m <= mark), "the memo's TTL {memo_exp:?}");
                for (i, a) in args.iter().enumerate() {
                    let k = &self.keys[i];
                    let Some(value) = self.redis.value(k) else {
                        continue;
                    };
                    assert_eq!(value, stored(&a.limit, &self.states[i]), "state of line {i} after the undo");
                    let exp = self.redis.expiry(k).expect("key without TTL");
                    if a.limit.algorithm() == Algorithm::SlidingLog {
                        // (a log's refund, LREM, keeps its TTL)
                        assert_eq!(Some(exp), before[i], "TTL of line {i} after the undo");
                        continue;
                    }
                    if values[i].as_ref() == Some(&value) && before[i] == Some(exp) {
                        continue;
                    }
                    // Written: the TTL covers the state's reset + the
                    // margin, and never shrinks; the value carries it.
                    let x = self.redis.stored_expiry(k).expect("a state's stored expiry");
                    assert_eq!(exp / 1000, x, "line {i}");
                    let reset = a.limit.check(&self.states[i], now, 0).reset_us;
                    let need = now.div_ceil(1000) + reset.div_ceil(1000) + TTL_MARGIN_MS;
                    assert!(
                        x >= need,
                        "line {i}: expiry {x} < {need} after the undo at {now}: {a:?} {:?}",
                        self.states[i]
                    );
                    assert!(before[i].is_none_or(|b| exp >= b), "line {i}: TTL shrank");
                    self.expiries[i] = x;
                }
                self.called.insert(id, Called::Undone { expiry: mark });
            }
        }
        got
    }

    /// One charge call for `lines` (a limit and a cost per key of the
    /// pair) at `now` on both sides: the same lines charged, the same
    /// states, TTLs that cover the overdraft.
    pub(crate) fn charge(&mut self, lines: &[(Limit, u64)], now: u64, use_time: bool) -> Vec<bool> {
        self.charge_with(lines, now, use_time, None).expect("a charge without a memo runs")
    }

    /// [`Pair::charge`] with the memo key of `id`: the first of its name
    /// charges (its memo checked), a repeat answers the first's reply and
    /// writes nothing, a charge undone answers {-1, now} (`None`).
    pub(crate) fn charge_memo(
        &mut self,
        lines: &[(Limit, u64)],
        now: u64,
        use_time: bool,
        id: (u64, u64),
    ) -> Option<Vec<bool>> {
        self.redis.set_now(now);
        self.forget_memo(id, now);
        let Some(called) = self.called.get(&id).cloned() else {
            return self.charge_with(lines, now, use_time, Some(id));
        };
        let key = memo_key(&self.keys, id);
        let (snap, writes, reads) = (self.redis.snapshot(), self.redis.writes(), self.redis.count("MGET"));
        let raw = self.redis.call_charge_memo(&self.keys, lines, now, use_time, &key);
        assert_eq!(self.redis.count("MGET"), reads, "a repeated charge read keys");
        assert_eq!(self.redis.writes(), writes, "a repeated charge wrote");
        assert_eq!(self.redis.snapshot(), snap, "a repeated charge changed the store");
        match called {
            Called::Ran { reply, .. } => {
                assert_eq!(raw, reply, "a repeated charge answers the first's reply");
                Some(parse_charge_reply(&raw, lines.len()).expect("well-formed reply").charged)
            }
            Called::Undone { .. } => {
                assert_eq!(raw, [-1, now as i64], "an undone charge answers late");
                None
            }
        }
    }

    fn charge_with(
        &mut self,
        lines: &[(Limit, u64)],
        now: u64,
        use_time: bool,
        memo: Option<(u64, u64)>,
    ) -> Option<Vec<bool>> {
        self.redis.set_now(now);
        let args: Vec<LineArg> = lines.iter().map(|&l| l.into()).collect();
        self.forget_expired(&args);
        let key = memo.map(|id| memo_key(&self.keys, id));
        let before = self.redis.before(key.as_deref().unwrap_or(""));
        let mut remembered = false;
        let got = match &key {
            None => self.redis.charge(&self.keys, lines, now, use_time),
            Some(k) => {
                let raw = self.redis.call_charge_memo(&self.keys, lines, now, use_time, k);
                let ChargeReply { now_us, charged } = parse_charge_reply(&raw, lines.len()).expect("well-formed reply");
                assert_eq!(now_us, now);
                // (a charge that wrote nothing leaves no memo: run again,
                // it is still applied once)
                if !charged.iter().zip(lines).any(|(&c, l)| c && l.1 > 0) {
                    assert_eq!(self.redis.memo(k), None, "a charge that wrote nothing left a memo");
                    charged
                } else {
                    remembered = true;
                    let Some(Memo::Ran { reply, done }) = self.redis.memo(k) else {
                        panic!("no memo after a charge: {:?}", self.redis.memo(k));
                    };
                    assert_eq!((reply, done), (raw.clone(), vec![]), "a charge's memo: its reply alone");
                    let expiry = now + MEMO_MS * 1000;
                    assert_eq!(self.redis.expiry(k), Some(expiry), "the memo's TTL");
                    let id = memo.unwrap();
                    self.called.insert(id, Called::Ran { reply: raw, lines: args.clone(), charges: vec![], expiry });
                    charged
                }
            }
        };
        let want = model_charge(lines, &mut self.states, now);
        assert_eq!(got, want, "charge now={now} lines={lines:?}");
        self.overdrawn = true;
        self.latest = self.latest.max(now);
        // The key must live until the state after the charge resets.
        let after: Vec<Outcome> = args.iter().zip(&self.states).map(|(a, s)| a.limit.check(s, now, 0)).collect();
        let charged: Vec<bool> = want.iter().zip(&args).map(|(&c, a)| c && a.cost > 0).collect();
        self.check_store(&args, &charged, &after, now, &before, u64::from(remembered));
        Some(want)
    }

    /// Forgets the expiries of the keys that have expired, and the model's
    /// states of those of the varying `sliding_log` lines among `args` (one
    /// per key).
    fn forget_expired(&mut self, args: &[LineArg]) {
        for (i, (key, x)) in self.keys.iter().zip(self.expiries.iter_mut()).enumerate() {
            if self.redis.value(key).is_none() {
                *x = 0; // expired (or never written)
                        // A varying sliding_log key lives by the window of its last
                        // writer: a line of a longer window would still count its
                        // timestamps, and reads it fresh. (Every other state reads as
                        // fresh from its writer's reset on, before its key expires.)
                let log = |a: &LineArg| a.limit.is_varying() && a.limit.algorithm() == Algorithm::SlidingLog;
                if args.get(i).is_some_and(log) {
                    self.states[i].fill(0);
                }
            }
        }
    }

    /// Checks the store after a call at `now` whose lines `charged` say
    /// which wrote, the states after it resetting as `after` says: nothing
    /// written since `before` (but `memo` writes of its memo key) if none
    /// did; else every state as the model's, and every TTL as the policy
    /// predicts.
    fn check_store(
        &mut self,
        args: &[LineArg],
        charged: &[bool],
        after: &[Outcome],
        now: u64,
        before: &Before,
        memo: u64,
    ) {
        let wrote = charged.iter().any(|&c| c);
        if !wrote {
            self.redis.unchanged_since(before, memo, "no write expected");
        }
        for (i, a) in args.iter().enumerate() {
            let (l, c) = (&a.limit, &a.cost);
            let wrote = charged[i];
            let key = &self.keys[i];
            let Some(value) = self.redis.value(key) else {
                continue;
            };
            // Stored state is rl-core's, word for word.
            assert_eq!(value, stored(l, &self.states[i]), "state of line {i}");
            let kind = match l.algorithm() {
                Algorithm::SlidingLog => "list",
                _ => "string",
            };
            assert_eq!(self.redis.kind(key).as_deref(), Some(kind));
            // Every key has a TTL: for a log, reset + margin, set when
            // written; for a string state, as expiry_after_write() says,
            // and the value carries it.
            let exp = self.redis.expiry(key).expect("key without TTL");
            if l.algorithm() == Algorithm::SlidingLog {
                if wrote && *c > 0 {
                    // (from now rounded up to the ms, as expiry_after_write)
                    let ttl_ms =
                        after[i].reset_us.div_ceil(1000) + TTL_MARGIN_MS + u64::from(!now.is_multiple_of(1000));
                    assert_eq!(exp, now + ttl_ms * 1000, "TTL of line {i}");
                }
                continue;
            }
            if wrote && *c > 0 {
                let x = &mut self.expiries[i];
                *x = expiry_after_write(*x, now, after[i].reset_us);
            }
            assert_eq!(self.redis.stored_expiry(key), Some(self.expiries[i]), "line {i}");
            assert_eq!(exp / 1000, self.expiries[i], "TTL of line {i}");
        }
    }
}
