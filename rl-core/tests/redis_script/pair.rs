//! The differential step: one call run on the script and on the model,
//! outcomes, writes, stored state and TTLs compared.

use rl_core::limit::{Algorithm, Limit};
use rl_core::redis::{check_line, expiry_after_write, LineArg, CLOCK_STEP_US, OVERDRAWN, TTL_MARGIN_MS};
use rl_core::verdict::Outcome;

use crate::fixtures::keys;
use crate::harness::{Mode, Redis};
use crate::model::{checked_cost, model_charge, model_until, stored};

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
        self.redis.set_now(now);
        let args: Vec<LineArg> = lines.iter().map(|&l| l.into()).collect();
        self.forget_expired(&args);
        let (snap, writes, reads) = (self.redis.snapshot(), self.redis.writes(), self.redis.count("MGET"));
        let got = self.redis.run_until(&self.keys, &[lines], now, commit, use_time, deadline).map(|mut out| {
            assert_eq!(out.len(), 1);
            out.remove(0)
        });
        let want = model_until(lines, &mut self.states, now, commit, deadline);
        assert_eq!(got, want, "now={now} deadline={deadline:?} commit={commit} lines={lines:?}");
        let Some(want) = want else {
            assert_eq!(self.redis.count("MGET"), reads, "a late call read keys");
            assert_eq!(self.redis.writes(), writes, "a late call wrote");
            assert_eq!(self.redis.snapshot(), snap, "a late call changed the state");
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
                let cost = checked_cost(a);
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
        self.check_store(&args, &charged, &want.1, now, &snap, writes);
        Some(want)
    }

    /// One charge call for `lines` (a limit and a cost per key of the
    /// pair) at `now` on both sides: the same lines charged, the same
    /// states, TTLs that cover the overdraft.
    pub(crate) fn charge(&mut self, lines: &[(Limit, u64)], now: u64, use_time: bool) -> Vec<bool> {
        self.redis.set_now(now);
        let args: Vec<LineArg> = lines.iter().map(|&l| l.into()).collect();
        self.forget_expired(&args);
        let (snap, writes) = (self.redis.snapshot(), self.redis.writes());
        let got = self.redis.charge(&self.keys, lines, now, use_time);
        let want = model_charge(lines, &mut self.states, now);
        assert_eq!(got, want, "charge now={now} lines={lines:?}");
        self.overdrawn = true;
        self.latest = self.latest.max(now);
        // The key must live until the state after the charge resets.
        let after: Vec<Outcome> = args.iter().zip(&self.states).map(|(a, s)| a.limit.check(s, now, 0)).collect();
        let charged: Vec<bool> = want.iter().zip(&args).map(|(&c, a)| c && a.cost > 0).collect();
        self.check_store(&args, &charged, &after, now, &snap, writes);
        want
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
    /// written if none did; else every state as the model's, and every TTL
    /// as the policy predicts.
    fn check_store(
        &mut self,
        args: &[LineArg],
        charged: &[bool],
        after: &[Outcome],
        now: u64,
        snap: &str,
        writes: u64,
    ) {
        let wrote = charged.iter().any(|&c| c);
        if !wrote {
            assert_eq!(self.redis.writes(), writes, "no write expected");
            assert_eq!(self.redis.snapshot(), snap, "state changed without a write");
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
