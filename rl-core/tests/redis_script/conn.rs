//! `rl_conn` on a Redis zone (requests in flight, a concurrency limit): a
//! `concurrent` line's takes (in `limit`) and `conn_put`'s give-backs "d",
//! corrections "c" and heartbeats "s" (the library's `NAME_conn`, or
//! `conn_script()`) held to rl-core's model,
//! `rl_core::redis::holders::Holders`: the same outcomes, the same units
//! reclaimed from lapsed fields, and every field of the key's HASH (count,
//! generation, deadline, set flag) the model's. Stories by hand, then a
//! proptest (failures persist in `conn.proptest-regressions`, next to
//! this file) and a check that its replay reaches every path.

use std::cell::Cell;
use std::collections::BTreeMap;

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{FileFailurePersistence, TestRunner};
use rl_core::limit::{Algorithm, Limit};
use rl_core::redis::holders::{Field, Holders};
use rl_core::redis::{conn_args, write_spec, HoldOp, Holder, LineArg};
use rl_core::verdict::Outcome;

use crate::fixtures::{keys, limit, T0};
use crate::harness::{memo_key, parse_script_reply, put_hash, put_raw, Memo, Mode, Redis, Replies, Undone};

/// Workers (their fields' names: host and pid).
const W0: &str = "web1:100";
const W1: &str = "web1:101";
const W2: &str = "web2:100";
const WORKERS: [&str; 3] = [W0, W1, W2];

/// The stories' life of a field (ms).
const LIFE: u64 = 1_000;

const MODES: [Mode; 2] = [Mode::Function, Mode::Eval];

/// A `concurrent` line of `max` units in flight, a request of `cost` units
/// taken by `worker` in generation `gen`, its field living `life_ms`.
fn conn_line(max: u64, cost: u64, worker: &'static str, gen: u64, life_ms: u64) -> LineArg {
    let holder = Some(Holder { worker, gen, life_ms });
    LineArg { holder, ..LineArg::from((Limit::concurrent(max).unwrap(), cost)) }
}

/// A field's value as the script writes it: "count gen deadline_ms set".
fn parse_field(v: &str) -> Field {
    let w: Vec<&str> = v.split(' ').collect();
    let n = |s: &str| s.parse::<u64>().unwrap_or_else(|_| panic!("a field's value {v:?}"));
    assert!(w.len() == 4 && (w[3] == "0" || w[3] == "1"), "a field's value {v:?}");
    Field { count: n(w[0]), gen: n(w[1]), deadline_ms: n(w[2]), set: w[3] == "1" }
}

/// How often the replay reached each path on this thread (for
/// [`conn_coverage`]).
#[derive(Clone, Copy, Debug, Default)]
struct Stats {
    /// Takes refused.
    refused: u64,
    /// Takes of a cost > 0 that the worker's later heartbeat counted
    /// (decided as charged already).
    counted: u64,
    /// Calls that reclaimed units from lapsed fields: takes, `conn_put`.
    reclaimed_take: u64,
    reclaimed_put: u64,
    /// Corrections that gave units back; give-backs dropped (an older
    /// generation); heartbeats that set a field.
    corrected: u64,
    dropped: u64,
    set: u64,
}

thread_local! {
    static STATS: Cell<Stats> = Cell::new(Stats::default());
}

fn count(f: impl FnOnce(&mut Stats)) {
    STATS.with(|s| {
        let mut x = s.get();
        f(&mut x);
        s.set(x);
    });
}

/// Both sides: the script on the fake Redis, and the model's fields per
/// key.
struct Conn {
    redis: Redis,
    keys: Vec<String>,
    model: Vec<Holders>,
    /// The longest life of a field written so far (ms): no key lives
    /// longer than that and the script's margin.
    max_life: u64,
}

impl Conn {
    fn new(mode: Mode, nkeys: usize) -> Conn {
        Conn { redis: Redis::with(mode), keys: keys(nkeys), model: vec![Holders::default(); nkeys], max_life: 0 }
    }

    /// One call of `reqs` at `now` (each request one `concurrent` line, on
    /// key `k`), committed or checked only (by Redis `TIME` with
    /// `use_time`), on both sides: the replies (the fifth value of a line,
    /// in `next_us`: the units it reclaimed), the model's. Checks that a
    /// check-only call wrote nothing, then the store.
    fn takes(&mut self, reqs: &[(usize, LineArg)], now: u64, commit: bool, use_time: bool) -> Replies {
        self.redis.set_now(now);
        self.same(now);
        let keys: Vec<String> = reqs.iter().map(|(k, _)| self.keys[*k].clone()).collect();
        let lines: Vec<[LineArg; 1]> = reqs.iter().map(|(_, l)| [*l]).collect();
        let slices: Vec<&[LineArg]> = lines.iter().map(|l| &l[..]).collect();
        let (snap, writes) = (self.redis.snapshot(), self.redis.writes());
        let got = self.redis.run_batch(&keys, &slices, now, commit, use_time);
        for (i, ((k, l), (admitted, outs))) in reqs.iter().zip(&got).enumerate() {
            let h = l.holder.expect("a concurrent line");
            self.max_life = self.max_life.max(h.life_ms);
            let m = &mut self.model[*k];
            let live = |f: &Field| f.deadline_ms >= now / 1000;
            if l.cost > 0 && m.fields.get(h.worker).is_some_and(|f| live(f) && f.gen > h.gen) {
                count(|s| s.counted += 1);
            }
            let (o, reclaimed) = m.take(&l.limit, l.cost, &h, now / 1000, commit);
            let want = Outcome { next_us: reclaimed, ..o };
            assert_eq!(
                (*admitted, outs.as_slice()),
                (o.admitted || l.dry_run, &[want][..]),
                "request {i} of {reqs:?} at {now} (commit {commit}): the script's, the model's"
            );
            count(|s| {
                s.refused += u64::from(!o.admitted);
                s.reclaimed_take += u64::from(reclaimed > 0);
            });
        }
        if !commit {
            assert_eq!(self.redis.writes(), writes, "a check-only call wrote");
            assert_eq!(self.redis.snapshot(), snap, "a check-only call changed the store");
        }
        self.same(now);
        got
    }

    /// [`Conn::takes`] of one request, committed: admitted, and its line's
    /// outcome.
    fn take(&mut self, k: usize, line: LineArg, now: u64) -> (bool, Outcome) {
        let got = self.takes(&[(k, line)], now, true, false);
        (got[0].0, got[0].1[0])
    }

    /// [`Conn::takes`] of one request, checked only.
    fn check(&mut self, k: usize, line: LineArg, now: u64) -> (bool, Outcome) {
        let got = self.takes(&[(k, line)], now, false, false);
        (got[0].0, got[0].1[0])
    }

    /// `worker`'s `conn_put` call at `now` (`ops`: per key of the call, its
    /// index and the op), its fields living `life_ms`, on both sides: the
    /// units it reclaimed (the model's too). Then the store.
    fn put(&mut self, worker: &'static str, life_ms: u64, ops: &[(usize, HoldOp)], now: u64, use_time: bool) -> u64 {
        self.redis.set_now(now);
        self.same(now);
        self.max_life = self.max_life.max(life_ms);
        let keys: Vec<String> = ops.iter().map(|(k, _)| self.keys[*k].clone()).collect();
        let hold: Vec<HoldOp> = ops.iter().map(|(_, op)| *op).collect();
        let got = self.redis.conn_put(&keys, &hold, worker, life_ms, now, use_time);
        let mut want = 0;
        for (k, op) in ops {
            let m = &mut self.model[*k];
            let before = m.fields.get(worker).copied().filter(|f| f.deadline_ms >= now / 1000);
            let r = m.put(worker, life_ms, *op, now / 1000);
            want += r;
            let after = m.fields.get(worker).copied();
            count(|s| {
                s.reclaimed_put += u64::from(r > 0);
                match (op, before) {
                    (HoldOp::Correct { .. }, Some(b)) if after.map_or(0, |a| a.count) < b.count => s.corrected += 1,
                    (HoldOp::GiveBack { gen, units }, Some(b)) if b.gen > *gen && *units > 0 => s.dropped += 1,
                    (HoldOp::Set { .. }, _) if after.is_some_and(|a| a.set && Some(a) != before) => s.set += 1,
                    _ => {}
                }
            });
        }
        assert_eq!(got, want, "{worker}'s conn_put {ops:?} at {now}: reclaimed, the script's and the model's");
        self.same(now);
        got
    }

    /// Key `k`'s fields as the fake holds them (none if the key is
    /// missing).
    fn fields(&self, k: usize) -> BTreeMap<String, Field> {
        let hash = self.redis.hash(&self.keys[k]).unwrap_or_default();
        hash.iter().map(|(f, v)| (f.clone(), parse_field(v))).collect()
    }

    /// Worker `w`'s field of key `k` in the fake.
    fn field(&self, k: usize, w: &str) -> Option<Field> {
        self.fields(k).get(w).copied()
    }

    /// The store at `now` (the fake's clock) held to the model: every field
    /// of every key the model's. A key the fake let expire held only lapsed
    /// fields (the model forgets them: nothing reclaims them then); a key
    /// of fields lives at least as long as each of its live fields, and no
    /// longer than the longest life written and the script's margin.
    fn same(&mut self, now: u64) {
        self.redis.set_now(now);
        let now_ms = now / 1000;
        for k in 0..self.keys.len() {
            let key = &self.keys[k];
            if self.redis.kind(key).is_none() {
                let live: Vec<_> = self.model[k].fields.iter().filter(|(_, f)| f.deadline_ms >= now_ms).collect();
                assert!(live.is_empty(), "key {k} expired at {now} with live fields {live:?}");
                self.model[k].fields.clear();
            }
            assert_eq!(self.fields(k), self.model[k].fields, "key {k} at {now}: the fake's fields, the model's");
            if self.model[k].fields.is_empty() {
                continue;
            }
            let exp = self.redis.expiry(key).unwrap_or_else(|| panic!("key {k} at {now}: no expiry"));
            for (w, f) in &self.model[k].fields {
                if f.deadline_ms >= now_ms {
                    assert!(exp >= (f.deadline_ms + 1) * 1000, "key {k} expires at {exp}, before {w}'s field {f:?}");
                }
            }
            let most = now + (self.max_life + 2000) * 1000;
            assert!(exp <= most, "key {k} at {now} expires at {exp}, after {most}");
        }
    }
}

/// Two workers take up to the max, then both are refused; the fields
/// count what each holds, from its generation, until now + life.
#[test]
fn takes_by_two_workers_up_to_max() {
    for mode in MODES {
        let mut c = Conn::new(mode, 1);
        let t = T0 + 250;
        let ms = t / 1000;
        let (ok, o) = c.take(0, conn_line(3, 2, W0, 1, LIFE), t);
        assert!(ok && o.admitted, "{o:?}");
        assert_eq!((o.remaining, o.reset_us, o.retry_after_us, o.delay_us, o.next_us), (1, 0, None, 0, 0));
        let (ok, o) = c.take(0, conn_line(3, 1, W1, 7, 500), t + 1000);
        assert!(ok && o.admitted && o.remaining == 0, "{o:?}");
        for w in [W1, W0] {
            let (ok, o) = c.take(0, conn_line(3, 1, w, 7, LIFE), t + 2000);
            assert!(!ok && !o.admitted, "{w}: {o:?}");
            assert_eq!((o.remaining, o.retry_after_us, o.next_us), (0, None, 0), "never retried: a give-back frees");
        }
        // (a request beyond the max, refused whatever is held)
        let (ok, _) = c.take(0, conn_line(3, 4, W2, 1, LIFE), t + 3000);
        assert!(!ok);
        assert_eq!(c.field(0, W0), Some(Field { count: 2, gen: 1, deadline_ms: ms + LIFE, set: false }));
        assert_eq!(c.field(0, W1), Some(Field { count: 1, gen: 7, deadline_ms: ms + 1 + 500, set: false }));
        assert_eq!(c.fields(0).len(), 2, "refused takes write nothing");
    }
}

/// A give-back frees what it gives back, renews the field, and a field
/// given back to 0 is deleted (the key with its last one).
#[test]
fn give_back_frees_units() {
    for mode in MODES {
        let mut c = Conn::new(mode, 1);
        assert!(c.take(0, conn_line(2, 2, W0, 1, LIFE), T0).0);
        assert!(!c.take(0, conn_line(2, 1, W1, 1, LIFE), T0 + 1000).0, "full");
        let t = T0 + 400_000;
        assert_eq!(c.put(W0, LIFE, &[(0, HoldOp::GiveBack { units: 1, gen: 1 })], t, false), 0);
        let renewed = Field { count: 1, gen: 1, deadline_ms: t / 1000 + LIFE, set: false };
        assert_eq!(c.field(0, W0), Some(renewed));
        let (ok, o) = c.take(0, conn_line(2, 1, W1, 1, LIFE), t + 1000);
        assert!(ok && o.remaining == 0, "{o:?}");
        c.put(W0, LIFE, &[(0, HoldOp::GiveBack { units: 1, gen: 1 })], t + 2000, true);
        assert_eq!(c.field(0, W0), None, "given back to 0: deleted");
        c.put(W1, LIFE, &[(0, HoldOp::GiveBack { units: 5, gen: 1 })], t + 3000, false);
        assert_eq!(c.redis.kind(&c.keys[0]), None, "its last field gone, the key is");
        // (a give-back on no field changes nothing)
        c.put(W1, LIFE, &[(0, HoldOp::GiveBack { units: 1, gen: 2 })], t + 4000, false);
        assert_eq!(c.redis.kind(&c.keys[0]), None);
    }
}

/// A heartbeat of a newer generation sets the count (and the set flag); of
/// the field's generation or an older one it only renews the field; a
/// count of 0 deletes it.
#[test]
fn heartbeat_sets_the_count() {
    for mode in MODES {
        let mut c = Conn::new(mode, 1);
        assert!(c.take(0, conn_line(8, 2, W0, 1, LIFE), T0).0);
        c.put(W0, LIFE, &[(0, HoldOp::Set { units: 5, gen: 2 })], T0 + 10_000, false);
        let set = Field { count: 5, gen: 2, deadline_ms: T0 / 1000 + 10 + LIFE, set: true };
        assert_eq!(c.field(0, W0), Some(set));
        let (ok, o) = c.take(0, conn_line(8, 3, W1, 1, LIFE), T0 + 11_000);
        assert!(ok && o.remaining == 0, "5 + 3 of 8: {o:?}");
        for gen in [2, 1] {
            c.put(W0, LIFE, &[(0, HoldOp::Set { units: 1, gen })], T0 + 20_000, false);
            assert_eq!(c.field(0, W0), Some(Field { deadline_ms: T0 / 1000 + 20 + LIFE, ..set }), "gen {gen}");
        }
        c.put(W0, LIFE, &[(0, HoldOp::Set { units: 0, gen: 3 })], T0 + 30_000, false);
        assert_eq!(c.field(0, W0), None, "a heartbeat of 0: deleted");
        // (a worker with no field: the heartbeat makes one)
        c.put(W2, 300, &[(0, HoldOp::Set { units: 2, gen: 9 })], T0 + 40_000, false);
        assert_eq!(c.field(0, W2), Some(Field { count: 2, gen: 9, deadline_ms: T0 / 1000 + 40 + 300, set: true }));
    }
}

/// A take sent before a heartbeat (its generation below the field's)
/// comes after it: the heartbeat counted it, so it is admitted as charged
/// already, even on a full key, and writes nothing.
#[test]
fn take_sent_before_a_heartbeat_is_charged_already() {
    for mode in MODES {
        let mut c = Conn::new(mode, 1);
        c.put(W0, LIFE, &[(0, HoldOp::Set { units: 3, gen: 2 })], T0, false);
        let writes = c.redis.writes();
        let (ok, o) = c.take(0, conn_line(3, 1, W0, 1, LIFE), T0 + 1000);
        assert!(ok && o.admitted && o.remaining == 0, "{o:?}");
        assert_eq!(c.redis.writes(), writes, "charged already: nothing written");
        assert_eq!(c.field(0, W0).map(|f| (f.count, f.gen)), Some((3, 2)));
        // (one of the heartbeat's generation, or of another worker, is not)
        assert!(!c.take(0, conn_line(3, 1, W0, 2, LIFE), T0 + 2000).0);
        assert!(!c.take(0, conn_line(3, 1, W1, 1, LIFE), T0 + 3000).0);
        // (one of a newer generation takes it on, the set flag cleared)
        c.put(W0, LIFE, &[(0, HoldOp::GiveBack { units: 1, gen: 2 })], T0 + 4000, false);
        assert!(c.take(0, conn_line(3, 1, W0, 3, LIFE), T0 + 5000).0);
        let f = c.field(0, W0).unwrap();
        assert_eq!((f.count, f.gen, f.set), (3, 3, false));
    }
}

/// A correction gives back units only where the heartbeat of its
/// generation set the field: not on a field a take wrote, nor one of
/// another generation.
#[test]
fn correction_applies_only_after_its_heartbeat_set_the_field() {
    for mode in MODES {
        let mut c = Conn::new(mode, 1);
        assert!(c.take(0, conn_line(5, 2, W0, 1, LIFE), T0).0);
        let correct = |gen| [(0, HoldOp::Correct { units: 1, gen })];
        c.put(W0, LIFE, &correct(1), T0 + 1000, false);
        assert_eq!(c.field(0, W0).map(|f| (f.count, f.gen, f.set)), Some((2, 1, false)), "not set: kept");
        // The heartbeat of gen 2 counts 2 held and a take in flight that is
        // then refused: corrected.
        c.put(W0, LIFE, &[(0, HoldOp::Set { units: 3, gen: 2 })], T0 + 2000, false);
        c.put(W0, LIFE, &correct(1), T0 + 3000, false);
        assert_eq!(c.field(0, W0).map(|f| (f.count, f.gen, f.set)), Some((3, 2, true)), "another generation's");
        c.put(W0, LIFE, &correct(2), T0 + 4000, false);
        assert_eq!(c.field(0, W0), Some(Field { count: 2, gen: 2, deadline_ms: T0 / 1000 + 4 + LIFE, set: true }));
        // (a take of that generation keeps the flag; a give-back of a newer
        // one clears it, and then a correction is not applied)
        assert!(c.take(0, conn_line(5, 1, W0, 2, LIFE), T0 + 5000).0);
        c.put(W0, LIFE, &correct(2), T0 + 6000, false);
        assert_eq!(c.field(0, W0).map(|f| (f.count, f.set)), Some((2, true)));
        c.put(W0, LIFE, &[(0, HoldOp::GiveBack { units: 1, gen: 3 })], T0 + 7000, false);
        c.put(W0, LIFE, &correct(3), T0 + 8000, false);
        assert_eq!(c.field(0, W0).map(|f| (f.count, f.gen, f.set)), Some((1, 3, false)));
        // (a correction on no field changes nothing)
        c.put(W1, LIFE, &[(0, HoldOp::Correct { units: 1, gen: 1 })], T0 + 9000, false);
        assert_eq!(c.field(0, W1), None);
    }
}

/// A give-back sent before a heartbeat (an older generation than the
/// field's) is counted in it: dropped, the field only renewed.
#[test]
fn give_back_of_an_older_generation_is_dropped() {
    for mode in MODES {
        let mut c = Conn::new(mode, 1);
        c.put(W0, LIFE, &[(0, HoldOp::Set { units: 2, gen: 3 })], T0, false);
        c.put(W0, LIFE, &[(0, HoldOp::GiveBack { units: 1, gen: 2 })], T0 + 50_000, false);
        assert_eq!(c.field(0, W0), Some(Field { count: 2, gen: 3, deadline_ms: T0 / 1000 + 50 + LIFE, set: true }));
        c.put(W0, LIFE, &[(0, HoldOp::GiveBack { units: 1, gen: 3 })], T0 + 60_000, false);
        assert_eq!(c.field(0, W0).map(|f| (f.count, f.gen, f.set)), Some((1, 3, true)));
        c.put(W0, LIFE, &[(0, HoldOp::GiveBack { units: 1, gen: 4 })], T0 + 70_000, false);
        assert_eq!(c.field(0, W0), None);
    }
}

/// A field lapses when time passes its deadline (it still counts at its
/// deadline's ms): the next call that commits on the key drops it and
/// reports its units reclaimed, a take (its line's fifth value) or
/// `conn_put` (its reply); both sum over the lapsed fields.
#[test]
fn lapsed_fields_are_reclaimed() {
    for mode in MODES {
        let mut c = Conn::new(mode, 2);
        let t = T0 + 600;
        assert!(c.take(0, conn_line(3, 2, W1, 1, 100), t).0);
        assert!(c.take(0, conn_line(3, 1, W2, 1, 100), t).0);
        // At its deadline's last µs, still held.
        let (_, o) = c.check(0, conn_line(3, 1, W0, 1, LIFE), T0 + 100_999);
        assert!(!o.admitted, "{o:?}");
        let (ok, o) = c.take(0, conn_line(3, 2, W0, 1, LIFE), T0 + 101_000);
        assert!(ok && o.remaining == 1, "{o:?}");
        assert_eq!(o.next_us, 3, "reclaimed: W1's 2 and W2's 1");
        assert_eq!(c.fields(0).keys().collect::<Vec<_>>(), [W0]);
        // (and a take the line refuses reclaims all the same)
        assert!(c.take(1, conn_line(1, 1, W1, 1, 100), T0 + 110_000).0);
        let (ok, o) = c.take(1, conn_line(1, 2, W0, 1, LIFE), T0 + 211_000);
        assert!(!ok && o.next_us == 1 && o.remaining == 1, "{o:?}");
        assert_eq!(c.fields(1).len(), 0);

        // By conn_put, on any of its keys, whatever its op.
        let t = T0 + 300_000;
        assert!(c.take(0, conn_line(3, 1, W1, 1, 50), t).0);
        assert!(c.take(1, conn_line(3, 2, W2, 1, 50), t).0);
        let ops = [(0, HoldOp::GiveBack { units: 1, gen: 1 }), (1, HoldOp::Correct { units: 1, gen: 1 })];
        assert_eq!(c.put(W0, LIFE, &ops, t + 60_000, false), 3);
        assert_eq!(c.fields(0).keys().collect::<Vec<_>>(), [W0], "W1's gone");
        assert_eq!(c.redis.kind(&c.keys[1]), None, "W2's gone, and the key");
        // (a worker's own field lapsed is a new start)
        let (ok, o) = c.take(0, conn_line(3, 1, W0, 5, LIFE), T0 + 1_500_000);
        assert!(ok && o.next_us == 1, "{o:?}");
        assert_eq!(c.field(0, W0), Some(Field { count: 1, gen: 5, deadline_ms: T0 / 1000 + 1500 + LIFE, set: false }));
    }
}

/// A check-only call (mode "0") decides as the commit would, at the same
/// time, but writes nothing and reclaims nothing: lapsed fields stay (not
/// counted), and a worker's own lapsed field is no heartbeat that counted
/// its take.
#[test]
fn check_only_writes_and_reclaims_nothing() {
    for mode in MODES {
        let mut c = Conn::new(mode, 1);
        assert!(c.take(0, conn_line(2, 1, W1, 1, 100), T0).0);
        c.put(W0, 100, &[(0, HoldOp::Set { units: 1, gen: 5 })], T0, false);
        let t = T0 + 200_000;
        let writes = c.redis.writes();
        let (ok, o) = c.check(0, conn_line(2, 1, W0, 4, LIFE), t);
        assert!(ok && o.admitted, "{o:?}");
        assert_eq!((o.remaining, o.next_us), (1, 0), "its take counted, nothing reclaimed");
        assert_eq!(c.redis.writes(), writes);
        assert_eq!(c.fields(0).len(), 2, "the lapsed fields stay");
        // (the commit at the same time decides the same)
        let (ok, o) = c.take(0, conn_line(2, 1, W0, 4, LIFE), t);
        assert!(ok && o.admitted, "{o:?}");
        assert_eq!((o.remaining, o.next_us), (1, 2));
        assert_eq!(c.fields(0).keys().collect::<Vec<_>>(), [W0]);
    }
}

/// A cost of 0 passes, even on a full key, and writes nothing but the
/// reclaim of lapsed fields.
#[test]
fn cost_zero_passes() {
    for mode in MODES {
        let mut c = Conn::new(mode, 1);
        assert!(c.take(0, conn_line(2, 2, W0, 1, 100), T0).0);
        let writes = c.redis.writes();
        let (ok, o) = c.take(0, conn_line(2, 0, W1, 1, LIFE), T0 + 1000);
        assert!(ok && o.admitted && o.remaining == 0, "{o:?}");
        assert_eq!(c.redis.writes(), writes);
        assert_eq!(c.field(0, W1), None);
        let (ok, o) = c.take(0, conn_line(2, 0, W1, 1, LIFE), T0 + 500_000);
        assert!(ok && o.remaining == 2 && o.next_us == 2, "{o:?}");
        assert_eq!(c.redis.kind(&c.keys[0]), None, "W0's lapsed field reclaimed, no field of W1's");
    }
}

/// A dry-run `concurrent` line never rejects its request, and is
/// committed iff it admits it.
#[test]
fn dry_run_line() {
    for mode in MODES {
        let mut c = Conn::new(mode, 1);
        assert!(c.take(0, conn_line(1, 1, W0, 1, LIFE), T0).0);
        let dry = LineArg { dry_run: true, ..conn_line(1, 1, W1, 1, LIFE) };
        let writes = c.redis.writes();
        let (ok, o) = c.take(0, dry, T0 + 1000);
        assert!(ok && !o.admitted, "the request passes, the line refuses: {o:?}");
        assert_eq!(c.redis.writes(), writes);
        c.put(W0, LIFE, &[(0, HoldOp::GiveBack { units: 1, gen: 1 })], T0 + 2000, false);
        let (ok, o) = c.take(0, dry, T0 + 3000);
        assert!(ok && o.admitted && o.remaining == 0, "{o:?}");
        assert_eq!(c.field(0, W1).map(|f| f.count), Some(1), "committed");
        // (the flag word: 64 + 1)
        let mut s = String::new();
        write_spec(&mut s, &dry);
        assert_eq!(s, format!("concurrent 1 1000000 1 1 0 65 {W1} 1 {LIFE}"));
    }
}

/// A request of a `concurrent` line and a `fixed` line is all or nothing:
/// rejected by the `fixed` line, its units are not taken (the line says
/// what is left), but the lapsed fields it found are dropped all the same.
#[test]
fn two_lines_all_or_nothing() {
    for mode in MODES {
        let mut c = Conn::new(mode, 2);
        c.max_life = LIFE;
        let fixed = limit(Algorithm::Fixed, 1, 1_000_000, 1);
        let keys = c.keys.clone();
        let request = |w: &'static str, gen: u64| [conn_line(3, 1, w, gen, LIFE), LineArg::from((fixed, 1))];
        assert!(c.take(0, conn_line(3, 1, W1, 1, 100), T0).0);

        let (ok, out) = c.redis.run(&keys, &request(W0, 1), T0 + 1000, true, false);
        assert!(ok && out.iter().all(|o| o.admitted), "{out:?}");
        let (o, reclaimed) = c.model[0].take(&Limit::concurrent(3).unwrap(), 1, &holder(W0, 1), T0 / 1000 + 1, true);
        assert_eq!((out[0], reclaimed), (o, 0));
        c.same(T0 + 1000);

        // The window's unit spent: rejected by the fixed line, W1's field
        // lapsed.
        let t = T0 + 300_000;
        let before = c.field(0, W0);
        let (ok, out) = c.redis.run(&keys, &request(W0, 1), t, true, false);
        assert!(!ok && !out[1].admitted, "{out:?}");
        assert!(out[0].admitted, "the concurrent line admits it: {out:?}");
        assert_eq!((out[0].remaining, out[0].next_us), (2, 1), "2 left (not taken), W1's 1 reclaimed");
        assert_eq!(c.field(0, W0), before, "not taken, not renewed");
        assert_eq!(c.field(0, W1), None, "dropped");
        // (the model: a take of 0 reclaims the same, and says what is left)
        let (o, reclaimed) = c.model[0].take(&Limit::concurrent(3).unwrap(), 0, &holder(W0, 1), t / 1000, true);
        assert_eq!(out[0], Outcome { next_us: reclaimed, ..o });
        c.same(t);

        // Rejected by the concurrent line: the fixed line is not charged.
        let t = T0 + 1_000_000;
        assert!(c.take(0, conn_line(3, 2, W2, 1, LIFE), t).0);
        let (ok, out) = c.redis.run(&keys, &request(W1, 1), t + 1000, true, false);
        assert!(!ok && !out[0].admitted && out[1].admitted, "{out:?}");
        let (ok, out) = c.redis.run(&keys[1..], &[(fixed, 1)], t + 2000, true, false);
        assert!(ok, "the fixed line's unit is still there: {out:?}");
        c.same(t + 2000);
    }
}

fn holder(worker: &'static str, gen: u64) -> Holder {
    Holder { worker, gen, life_ms: LIFE }
}

/// A call named by a memo (mode "2") sent twice takes once: the copy
/// answers the first reply and writes nothing. Its undo (`NAME_undo`)
/// leaves the take in place (the worker's heartbeat sets what it holds),
/// and the call, sent again, is late.
#[test]
fn memo_takes_once_and_undo_leaves_it() {
    for mode in MODES {
        let mut c = Conn::new(mode, 1);
        c.max_life = LIFE;
        let line = conn_line(3, 2, W0, 1, LIFE);
        let memo = memo_key(&c.keys, (3, 1));
        let keys = c.keys.clone();
        let raw = c.redis.call_memo(&keys, &[&[line][..]], T0, false, None, &memo);
        let (now, got) = parse_script_reply(&raw, &[&[line][..]]);
        let (o, _) = c.model[0].take(&line.limit, 2, &line.holder.unwrap(), T0 / 1000, true);
        assert_eq!((now, got), (T0, Some(vec![(true, vec![o])])));
        c.same(T0);
        assert_eq!(c.redis.memo(&memo), Some(Memo::Ran { reply: raw.clone(), done: vec![(1, 0, 0)] }));

        let before = c.redis.before(&memo);
        assert_eq!(c.redis.call_memo(&keys, &[&[line][..]], T0 + 5000, false, None, &memo), raw, "the copy");
        c.redis.unchanged_since(&before, 0, "a copy of a take");
        assert_eq!(c.field(0, W0).map(|f| f.count), Some(2), "taken once");

        let before = c.redis.before(&memo);
        let (at, undone) = c.redis.undo(&keys, &[(line.limit, 2)], T0 + 6000, false, &memo);
        assert_eq!((at, undone), (T0 + 6000, Undone::TakenBack));
        c.redis.unchanged_since(&before, 1, "an undo of a take");
        assert_eq!(c.redis.memo(&memo), Some(Memo::Undone));
        c.same(T0 + 6000);
        let late = c.redis.call_memo(&keys, &[&[line][..]], T0 + 7000, false, None, &memo);
        assert_eq!(late, [-1, (T0 + 7000) as i64], "undone: late");
        c.same(T0 + 7000);

        // (a take counted by a heartbeat charges nothing: no memo)
        c.put(W0, LIFE, &[(0, HoldOp::Set { units: 2, gen: 2 })], T0 + 8000, false);
        let memo2 = memo_key(&c.keys, (3, 2));
        c.redis.call_memo(&keys, &[&[line][..]], T0 + 9000, false, None, &memo2);
        assert_eq!(c.redis.memo(&memo2), None);
        c.same(T0 + 9000);
    }
}

/// Malformed `concurrent` line strings fail closed (rejected, no
/// retry-after) and write nothing; malformed `conn_put` arguments are an
/// error reply, nothing written.
#[test]
fn malformed_lines_fail_closed() {
    let mut good = String::new();
    write_spec(&mut good, &conn_line(3, 1, W0, 2, 500));
    assert_eq!(good, format!("concurrent 3 1000000 3 1 0 64 {W0} 2 500"));
    let bad = [
        "concurrent 3 1000000 3 1 0 66 web1:100 2 500",
        "concurrent 3 1000000 3 1 0 80 web1:100 2 500",
        "concurrent 3 1000000 3 1 0 0 web1:100 2 500",
        "concurrent 3 1000000 3 1 0 0",
        "concurrent 3 1000000 3 1 0 64 2 500",
        "concurrent 3 1000000 3 1 1 64 web1:100 2 500",
        "concurrent 3 1000000 0 1 0 64 web1:100 2 500",
        "concurrent 0 1000000 3 1 0 64 web1:100 2 500",
        "concurrent 3 0 3 1 0 64 web1:100 2 500",
        "concurrent 3 1000000 3 1 0 64 web1:100 2 0",
        "concurrent 3 1000000 3 1 0 64 web1:100 -1 500",
        "concurrent 3 1000000 3 1 0 64 web1:100 1.5 500",
        "concurrent 3 1000000 3 -1 0 64 web1:100 2 500",
        "concurrent 3 1000000 3 1 0 64 web1:100 2 500 7",
        "concurrent 3 1000000 3 1 0 64 web1:100 2 500 ",
        "concurrent 3 1000000 4503599627370496 1 0 64 web1:100 2 500",
        "concurrent 3 1000000 3 4503599627370496 0 64 web1:100 2 500",
        "concurrent 3 1000000 3 1 0 64 web1:100 4503599627370496 500",
        "concurrent 3 1000000 3 1 0 64 web1:100 2 4503599627370496",
        "concurrent  3 1000000 3 1 0 64 web1:100 2 500",
    ];
    for mode in MODES {
        let r = Redis::with(mode);
        let key = keys(1);
        r.set_now(T0);
        let args = |line: &str| vec!["1".to_owned(), T0.to_string(), String::new(), line.to_owned()];
        for line in bad {
            assert_eq!(r.eval(&key, &args(line)), [T0 as i64, 0, 0, -1, 0, 0], "{line:?}");
            assert_eq!((r.writes(), r.snapshot()), (0, String::new()), "{line:?}");
        }
        // (in a request of two lines, it rejects the request)
        let two = vec!["1".to_owned(), T0.to_string(), String::new(), "2".to_owned(), good.clone(), bad[0].to_owned()];
        let reply = r.eval(&[key[0].clone(), key[0].clone()], &two);
        assert_eq!(reply[6..], [0, 0, -1, 0, 0]);
        assert_eq!(r.writes(), 0);
        assert_eq!(r.eval(&key, &args(&good)), [T0 as i64, 2, 0, -2, 0, 0], "the good line");

        let put = conn_args(&[HoldOp::GiveBack { units: 1, gen: 2 }], W0, 500, Some(T0));
        assert_eq!(put, [T0.to_string(), W0.to_owned(), "500".to_owned(), "d 1 2".to_owned()]);
        let writes = r.writes();
        let with = |i: usize, v: &str| {
            let mut a = put.clone();
            a[i] = v.to_owned();
            a
        };
        let mut bad_puts =
            vec![with(1, ""), with(2, "0"), with(2, "x"), with(3, "x 1 2"), with(3, "d 1"), with(3, "d -1 2")];
        bad_puts.push(with(3, "d 1 2 3"));
        bad_puts.push(with(3, "s 1 4503599627370496"));
        bad_puts.push(put[..3].to_vec());
        let mut more = put.clone();
        more.push("d 1 2".to_owned());
        bad_puts.push(more);
        for args in bad_puts {
            let t = r.call_conn_table(&key, &args);
            let err: Option<String> = t.get("err").unwrap();
            assert_eq!(err.as_deref(), Some("rl: malformed arguments"), "{args:?}");
            assert_eq!(r.writes(), writes, "{args:?}");
        }
    }
}

/// The key's TTL always covers its live fields' deadlines, whatever the
/// lives of the workers that write it: set on the first write, never
/// shortened by a shorter life.
#[test]
fn ttl_covers_live_fields() {
    for mode in MODES {
        let mut c = Conn::new(mode, 1);
        let key = c.keys[0].clone();
        assert!(c.take(0, conn_line(5, 1, W0, 1, 10_000), T0).0);
        let ttl = c.redis.pttl(&key);
        assert!(ttl >= 10_000, "{ttl}");
        let t = T0 + 5_000_000;
        assert!(c.take(0, conn_line(5, 1, W1, 1, 100), t).0);
        let ttl = c.redis.pttl(&key);
        let d = c.field(0, W0).unwrap().deadline_ms;
        assert!(t / 1000 + ttl as u64 >= d, "W0's field lives until {d}, the key {ttl} ms more");
        // A heartbeat and a give-back renew it too.
        let t = T0 + 9_500_000;
        c.put(W1, 100, &[(0, HoldOp::Set { units: 1, gen: 2 })], t, false);
        c.put(W0, 30_000, &[(0, HoldOp::GiveBack { units: 0, gen: 1 })], t, false);
        let ttl = c.redis.pttl(&key);
        assert!(ttl >= 30_000, "{ttl}");
        // (c.same checks it at every step; and the key outlives its fields
        // until they all lapse)
        c.same(T0 + 39_000_000);
        assert!(c.redis.pttl(&key) > 0);
        c.same(T0 + 60_000_000);
        assert_eq!(c.redis.pttl(&key), -2, "expired");
    }
}

/// A key of another type reads as no fields and is replaced by a take's
/// write; `conn_put` leaves it; a field that does not parse is a worker
/// gone, dropped by the next call that commits (nothing reclaimed).
#[test]
fn wrong_type_and_malformed_fields() {
    for mode in MODES {
        let c = Conn::new(mode, 1);
        let key = c.keys[0].clone();
        let r = &c.redis;
        r.set_now(T0);
        put_raw(r, &key, "17", false);
        let line = conn_line(2, 1, W0, 1, LIFE);
        assert_eq!(r.conn_put(&c.keys, &[HoldOp::Set { units: 3, gen: 1 }], W0, LIFE, T0, false), 0);
        assert_eq!(r.value(&key).as_deref(), Some("17"), "conn_put leaves it");
        let (ok, out) = r.run(&c.keys, &[line], T0, false, false);
        assert!(ok && out[0].remaining == 1);
        assert_eq!(r.kind(&key).as_deref(), Some("string"), "a check leaves it");
        let (ok, out) = r.run(&c.keys, &[line], T0, true, false);
        assert!(ok && out[0].remaining == 1);
        assert_eq!(r.hash(&key).map(|h| h.len()), Some(1), "replaced");
        assert!(r.pttl(&key) >= LIFE as i64);

        put_hash(r, &key, &[("web9:1", "junk"), ("web9:2", "2 1 x 0"), (W1, "1 1 99999999999999 1")]);
        let (ok, out) = r.run(&c.keys, &[conn_line(2, 1, W0, 1, LIFE)], T0, true, false);
        assert!(ok && out[0].remaining == 0 && out[0].next_us == 0, "{out:?}");
        let h = r.hash(&key).unwrap();
        assert_eq!(h.keys().map(String::as_str).collect::<Vec<_>>(), [W0, W1], "{h:?}");
    }
}

/// One random step of a replay (keys and workers taken modulo their
/// numbers; a generation as the worker's current one + `dgen` - 1).
#[derive(Clone, Debug)]
enum Step {
    /// The clock moves on (µs).
    Wait(u64),
    /// One call of one or two takes (key, worker, dgen, cost, dry-run),
    /// committed or checked, by Redis `TIME` or not.
    Take { reqs: Vec<(usize, usize, u64, u64, bool)>, commit: bool, time: bool },
    /// A worker's `conn_put` call: per key (0 d, 1 c, 2 s, units, dgen).
    Put { worker: usize, ops: Vec<(usize, u8, u64, u64)>, time: bool },
    /// A worker's generation moves on.
    Bump { worker: usize },
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    // (past a life, often; past a key's expiry, sometimes)
    let wait = prop_oneof![
        2 => Just(0u64),
        2 => 1u64..1_000,
        2 => 1_000u64..300_000,
        2 => 300_000u64..2_500_000,
        1 => 2_500_000u64..6_000_000,
    ]
    .prop_map(Step::Wait);
    let take = (0usize..2, 0usize..3, 0u64..3, 0u64..=3, prop::bool::weighted(0.1));
    let op = (0usize..2, 0u8..3, 0u64..=3, 0u64..3);
    let step = prop_oneof![
        3 => wait,
        5 => (prop::collection::vec(take, 1..=2), prop::bool::weighted(0.8), any::<bool>())
            .prop_map(|(reqs, commit, time)| Step::Take { reqs, commit, time }),
        4 => (0usize..3, prop::collection::vec(op, 1..=2), any::<bool>())
            .prop_map(|(worker, ops, time)| Step::Put { worker, ops, time }),
        1 => (0usize..3).prop_map(|worker| Step::Bump { worker }),
    ];
    prop::collection::vec(step, 1..60)
}

/// A replay's keys' maxes (1 or 2 keys), its workers' lives (ms; 2 or 3
/// workers), and its steps.
fn replays() -> impl Strategy<Value = (Vec<u64>, Vec<u64>, Vec<Step>)> {
    (prop::collection::vec(1u64..=6, 1..=2), prop::collection::vec(50u64..=1_500, 2..=3), steps())
}

/// `steps` on keys of `maxes` by workers of `lives`, on the script (run as
/// `mode`) and the model, compared at every step: how many keys the fake
/// let expire.
fn replay(maxes: &[u64], lives: &[u64], steps: &[Step], mode: Mode) -> u64 {
    let (nk, nw) = (maxes.len(), lives.len());
    let mut c = Conn::new(mode, nk);
    let mut gens = vec![1u64; nw];
    let gen = |g: u64, d: u64| (g + d).saturating_sub(1);
    let mut t = T0 + 123;
    for step in steps {
        match step {
            Step::Wait(dt) => {
                t += dt;
                c.redis.set_now(t);
                c.same(t);
            }
            Step::Take { reqs, commit, time } => {
                let lines: Vec<(usize, LineArg)> = reqs
                    .iter()
                    .map(|&(k, w, dg, cost, dry)| {
                        let (k, w) = (k % nk, w % nw);
                        let line = conn_line(maxes[k], cost, WORKERS[w], gen(gens[w], dg), lives[w]);
                        (k, LineArg { dry_run: dry, ..line })
                    })
                    .collect();
                c.takes(&lines, t, *commit, *time);
            }
            Step::Put { worker, ops, time } => {
                let w = worker % nw;
                let ops: Vec<(usize, HoldOp)> = ops
                    .iter()
                    .map(|&(k, kind, units, dg)| {
                        let gen = gen(gens[w], dg);
                        let op = match kind {
                            0 => HoldOp::GiveBack { units, gen },
                            1 => HoldOp::Correct { units, gen },
                            _ => HoldOp::Set { units, gen },
                        };
                        (k % nk, op)
                    })
                    .collect();
                c.put(WORKERS[w], lives[w], &ops, t, *time);
            }
            Step::Bump { worker } => gens[worker % nw] += 1,
        }
    }
    c.redis.fake.get::<u64>("expired").unwrap()
}

proptest! {
    // (failures persist next to this file, as props.rs's do)
    #![proptest_config(ProptestConfig {
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("proptest-regressions"))),
        ..ProptestConfig::with_cases(256)
    })]

    /// 1 or 2 keys, 2 or 3 workers, any order of takes (committed or
    /// checked, generations around each worker's), `conn_put` calls and
    /// time passing (fields lapsing): the script's replies and fields are
    /// the model's, as a function library and as scripts.
    #[test]
    fn prop_conn_is_the_model((maxes, lives, steps) in replays()) {
        for mode in MODES {
            replay(&maxes, &lives, &steps, mode);
        }
    }
}

/// Sanity: the replay reaches every path often enough to mean something
/// (refusals, takes counted already, reclaims by takes and by `conn_put`,
/// corrections applied, give-backs dropped, heartbeats that set a field,
/// keys expired).
#[test]
fn conn_coverage() {
    STATS.with(|s| s.set(Stats::default()));
    let mut runner = TestRunner::deterministic();
    let strategy = replays();
    let mut expired = 0;
    for _ in 0..80 {
        let (maxes, lives, steps) = strategy.new_tree(&mut runner).unwrap().current();
        expired += replay(&maxes, &lives, &steps, Mode::Function);
    }
    let s = STATS.with(Cell::get);
    let all = [s.refused, s.counted, s.reclaimed_take, s.reclaimed_put, s.corrected, s.dropped, s.set];
    assert!(all.iter().all(|n| *n >= 10), "{s:?}");
    assert!(expired >= 10, "{expired} {s:?}");
}
