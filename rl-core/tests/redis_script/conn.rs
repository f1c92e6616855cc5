//! `rl_conn` on a Redis zone (requests in flight, a concurrency limit): a
//! `concurrent` line's takes (in `limit`), those that may wait in the key's
//! waiting line (a line with a queue: arrivals, polls of a ticket), and
//! `conn_put`'s give-backs "d", corrections "c", heartbeats "s" and leaves
//! "q" (the library's `NAME_conn`, or `conn_script()`) held to rl-core's
//! model, `rl_core::redis::holders::Holders`: the same outcomes, the same
//! units reclaimed from lapsed fields, and the whole of the key's HASH the
//! model's: every worker's field (count, generation, deadline, set flag),
//! every place "#ticket" (cost, deadline) and the next ticket "#". Stories
//! by hand, then a proptest (failures persist in
//! `conn.proptest-regressions`, next to this file) and a check that its
//! replay reaches every path.

use std::cell::Cell;
use std::collections::BTreeMap;

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{FileFailurePersistence, TestRunner};
use rl_core::limit::wait::Lane;
use rl_core::limit::{Algorithm, Limit};
use rl_core::redis::holders::{field_class, place_deadline, Field, Holders, Place, Turn};
use rl_core::redis::{conn_args, write_spec, ClassArg, HoldOp, Holder, LineArg, Wait};
use rl_core::verdict::Outcome;

use crate::fixtures::{keys, limit, T0};
use crate::harness::{memo_key, parse_script_reply, put_hash, put_raw, Memo, Mode, Redis, Replies, Undone};

/// Workers (their fields' names: host and pid).
const W0: &str = "web1:100";
const W1: &str = "web1:101";
const W2: &str = "web2:100";
const WORKERS: [&str; 3] = [W0, W1, W2];

/// The workers' fields on a line of classes (the worker's name and "/k":
/// its field of class k), then a field that names no class (as a line
/// written before `classes=` leaves it) and one of a class beyond the
/// line's (as one of more classes does): both of the lowest class.
const NAMES: [[&str; 5]; 3] = [
    ["web1:100/0", "web1:100/1", "web1:100/2", W0, "web1:100/9"],
    ["web1:101/0", "web1:101/1", "web1:101/2", W1, "web1:101/9"],
    ["web2:100/0", "web2:100/1", "web2:100/2", W2, "web2:100/9"],
];

/// The stories' life of a field (ms).
const LIFE: u64 = 1_000;

const MODES: [Mode; 2] = [Mode::Function, Mode::Eval];

/// A `concurrent` line of `max` units in flight, a request of `cost` units
/// taken by `worker` in generation `gen`, its field living `life_ms`.
fn conn_line(max: u64, cost: u64, worker: &'static str, gen: u64, life_ms: u64) -> LineArg {
    let holder = Some(Holder { worker, gen, life_ms });
    LineArg { holder, ..LineArg::from((Limit::concurrent(max).unwrap(), cost)) }
}

/// `line` (a `concurrent` line's) on a limit with a waiting line of
/// `queue` places, its request waiting with `ticket` (0: it arrives) and
/// `left_ms` of its wait left.
fn waits(line: LineArg, queue: u64, ticket: u64, left_ms: u64) -> LineArg {
    let limit = line.limit.with_queue(queue).unwrap();
    LineArg { limit, wait: Some(Wait { ticket, left_ms }), ..line }
}

/// A place's value as the script writes it: "cost deadline_ms", and on a
/// line of classes its class, "cost deadline_ms k".
fn parse_place(v: &str) -> Place {
    let w: Vec<&str> = v.split(' ').collect();
    let n = |s: &str| s.parse::<u64>().unwrap_or_else(|_| panic!("a place's value {v:?}"));
    assert!(w.len() == 2 || w.len() == 3, "a place's value {v:?}");
    Place { cost: n(w[0]), deadline_ms: n(w[1]), class: w.get(2).map(|k| n(k)) }
}

/// A key's HASH as the model keeps it: a field per worker, "#ticket" a
/// place, "#" the next ticket (none: 0, the model's before any).
fn parse_hash(hash: &BTreeMap<String, String>) -> Holders {
    let mut h = Holders::default();
    for (f, v) in hash {
        match f.strip_prefix('#') {
            Some("") => h.next_ticket = v.parse().unwrap_or_else(|_| panic!("the next ticket {v:?}")),
            Some(t) => {
                let t = t.parse().unwrap_or_else(|_| panic!("a place's name {f:?}"));
                h.places.insert(t, parse_place(v));
            }
            None => {
                h.fields.insert(f.clone(), parse_field(v));
            }
        }
    }
    h
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
    /// Arrivals that took a place (and of those, ones that fit in what is
    /// free but not beside the live places ahead); arrivals that must wait
    /// refused a place (the line full, or of no queue).
    placed: u64,
    behind: u64,
    full: u64,
    /// Polls of a live place: let in, kept waiting (and of those, renewed).
    poll_admitted: u64,
    poll_waiting: u64,
    renewed: u64,
    /// Polls refused, their place gone (lapsed, left, let in, or never
    /// made); takes that never wait refused for the places' units.
    poll_gone: u64,
    never_refused: u64,
    /// Committing calls that dropped lapsed places; leaves that removed a
    /// place.
    lapsed_places: u64,
    left: u64,
    /// On a line of classes: takes refused only for the unused reserves of
    /// the classes above (they would fit beside what is held and the places
    /// ahead); takes admitted only because a class above holds units of its
    /// reserve (all the reserves above left free, they would not fit).
    reserve_refused: u64,
    reserve_spent: u64,
    /// Arrivals refused a place: their units over what the reserves above
    /// leave of the max (but within it); their class's places all taken;
    /// the line full with no place of a lower class to take.
    over_kept: u64,
    class_full: u64,
    line_full: u64,
    /// Arrivals that took a place by deleting one of a lower class (and
    /// the places so deleted); arrivals placed ahead of a lower class's
    /// live places; polls kept waiting behind a place of a higher class
    /// that came later.
    evicted: u64,
    evictions: u64,
    passed: u64,
    overtaken: u64,
    /// Takes on a line of classes that found a live field or place that
    /// names no class of the line's (read as of the lowest).
    unnamed: u64,
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

/// Counts the paths a take on a line of classes (`l`, its classes
/// `classes`) reached: the model's key `before` it and `after` it, its
/// outcome and how it ended in the line (`decided`), at `now_ms`.
fn class_paths(
    before: &Holders,
    after: &Holders,
    l: &LineArg,
    classes: ClassArg,
    decided: (&Outcome, Turn),
    now_ms: u64,
    commit: bool,
) {
    let (o, turn) = decided;
    let lanes = classes.lanes;
    let (low, k) = (lanes.len() - 1, usize::from(classes.class));
    let (h, max) = (l.holder.expect("a concurrent line"), l.limit.burst());
    let fields: Vec<(&String, &Field)> = before.fields.iter().filter(|(_, f)| f.deadline_ms >= now_ms).collect();
    let mut by_class = vec![0u64; lanes.len()];
    for (name, f) in &fields {
        by_class[field_class(name, low)] += f.count;
    }
    let unused: u64 = lanes[..k].iter().zip(&by_class).map(|(l, h)| l.reserve.saturating_sub(*h)).sum();
    let kept: u64 = lanes[..k].iter().map(|l| l.reserve).sum();
    let class_of = |p: &Place| p.class.and_then(|c| usize::try_from(c).ok()).map_or(low, |c| c.min(low));
    let ticket = l.wait.map_or(0, |w| w.ticket);
    // (ticket, class, cost)
    let live: Vec<(u64, usize, u64)> =
        before.places.iter().filter(|(_, p)| p.deadline_ms >= now_ms).map(|(t, p)| (*t, class_of(p), p.cost)).collect();
    let own = live.iter().any(|(t, ..)| ticket > 0 && *t == ticket);
    let is_ahead = |t: u64, pk: usize| t != ticket && (pk < k || (pk == k && (ticket == 0 || t < ticket)));
    let ahead: u64 = live.iter().filter(|(t, pk, _)| is_ahead(*t, *pk)).map(|(.., c)| c).sum();
    let held = before.held(now_ms);
    let need = match before.fields.get(h.worker) {
        Some(f) if f.deadline_ms >= now_ms && f.gen > h.gen => 0,
        _ => l.cost,
    };
    let named = |name: &str| name.rsplit_once('/').and_then(|(_, d)| d.parse::<usize>().ok()).is_some_and(|c| c <= low);
    let unnamed = fields.iter().any(|(name, _)| !named(name))
        || before.places.values().any(|p| p.deadline_ms >= now_ms && p.class.is_none_or(|c| c > low as u64));
    count(|s| {
        s.unnamed += u64::from(unnamed);
        if l.cost > 0 && (ticket == 0 || own) {
            s.reserve_refused += u64::from(!o.admitted && held + ahead + need <= max);
            s.reserve_spent += u64::from(o.admitted && held + kept + ahead + need > max);
        }
        let arrival = ticket == 0 && l.wait.is_some() && commit && l.cost > 0 && l.limit.queue() > 0;
        match turn {
            Turn::Refused if arrival && held + unused + ahead + need > max => {
                let of_class = live.iter().filter(|(_, pk, _)| *pk == k).count() as u64;
                if l.cost > max.saturating_sub(kept) {
                    s.over_kept += u64::from(l.cost <= max);
                } else if of_class >= lanes[k].places {
                    s.class_full += 1;
                } else {
                    s.line_full += 1;
                }
            }
            Turn::Waiting { .. } if arrival => {
                let deleted = live.iter().filter(|(t, ..)| !after.places.contains_key(t)).count() as u64;
                s.evicted += u64::from(deleted > 0);
                s.evictions += deleted;
                s.passed += u64::from(live.iter().any(|(t, pk, _)| *pk > k && after.places.contains_key(t)));
            }
            Turn::Waiting { .. } if own => {
                s.overtaken += u64::from(live.iter().any(|(t, pk, _)| *t > ticket && *pk < k));
            }
            _ => {}
        }
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
    /// How the requests of the last [`Conn::takes`] ended in the waiting
    /// line, the model's.
    turns: Vec<Turn>,
}

impl Conn {
    fn new(mode: Mode, nkeys: usize) -> Conn {
        let model = vec![Holders::default(); nkeys];
        Conn { redis: Redis::with(mode), keys: keys(nkeys), model, max_life: 0, turns: vec![] }
    }

    /// One call of `reqs` at `now` (each request one `concurrent` line, on
    /// key `k`, that may wait: its `wait`), committed or checked only (by
    /// Redis `TIME` with `use_time`), on both sides: the replies (the fifth
    /// value of a line, in `next_us`: the units it reclaimed), the model's
    /// (`Holders::take_waiting`; how each ended in the line in
    /// `self.turns`). Checks that a check-only call wrote nothing, then the
    /// store.
    fn takes(&mut self, reqs: &[(usize, LineArg)], now: u64, commit: bool, use_time: bool) -> Replies {
        self.redis.set_now(now);
        self.same(now);
        let keys: Vec<String> = reqs.iter().map(|(k, _)| self.keys[*k].clone()).collect();
        let lines: Vec<[LineArg; 1]> = reqs.iter().map(|(_, l)| [*l]).collect();
        let slices: Vec<&[LineArg]> = lines.iter().map(|l| &l[..]).collect();
        let (snap, writes) = (self.redis.snapshot(), self.redis.writes());
        let got = self.redis.run_batch(&keys, &slices, now, commit, use_time);
        let now_ms = now / 1000;
        self.turns.clear();
        for (i, ((k, l), (admitted, outs))) in reqs.iter().zip(&got).enumerate() {
            let h = l.holder.expect("a concurrent line");
            self.max_life = self.max_life.max(h.life_ms);
            let m = &mut self.model[*k];
            let live = |f: &Field| f.deadline_ms >= now_ms;
            if l.cost > 0 && m.fields.get(h.worker).is_some_and(|f| live(f) && f.gen > h.gen) {
                count(|s| s.counted += 1);
            }
            let before = m.clone();
            let (o, reclaimed, turn) = m.take_waiting(&l.limit, l.cost, &h, l.wait, l.classes, now_ms, commit);
            let want = Outcome { next_us: reclaimed, ..o };
            assert_eq!(
                (*admitted, outs.as_slice()),
                (o.admitted || l.dry_run, &[want][..]),
                "request {i} of {reqs:?} at {now} (commit {commit}): the script's, the model's"
            );
            // (the outcome says how it ends in the line, as the reply does)
            match turn {
                Turn::Admitted => assert!(o.admitted, "{o:?}"),
                Turn::Waiting { ticket, ahead } => {
                    assert!(!o.admitted && ticket > 0 && o.retry_after_us.is_none(), "{o:?}");
                    assert_eq!((o.reset_us, o.delay_us), (ticket, ahead), "{o:?}");
                }
                Turn::Refused => assert!(!o.admitted && o.reset_us == 0 && o.delay_us == 0, "{o:?}"),
            }
            assert!(l.wait.is_some() || !matches!(turn, Turn::Waiting { .. }), "a take that never waits waits");
            self.turns.push(turn);
            count(|s| {
                s.refused += u64::from(!o.admitted);
                s.reclaimed_take += u64::from(reclaimed > 0);
                let ticket = l.wait.map_or(0, |w| w.ticket);
                let own = before.places.get(&ticket).filter(|p| ticket > 0 && p.deadline_ms >= now_ms);
                match (l.wait, turn) {
                    (Some(_), Turn::Waiting { ticket: t, .. }) if own.is_none() => {
                        s.placed += 1;
                        let free = l.limit.burst().saturating_sub(before.held(now_ms));
                        s.behind += u64::from(l.cost <= free);
                        assert_eq!(before.places.get(&t), None, "a ticket handed out twice");
                    }
                    (Some(_), Turn::Waiting { ticket: t, .. }) => {
                        s.poll_waiting += 1;
                        s.renewed += u64::from(m.places.get(&t) != own);
                    }
                    (Some(_), Turn::Admitted) if own.is_some() => s.poll_admitted += 1,
                    (Some(_), Turn::Refused) if ticket > 0 => s.poll_gone += 1,
                    (Some(_), Turn::Refused) => s.full += u64::from(commit && l.cost > 0),
                    (None, Turn::Refused) => {
                        let free = l.limit.burst().saturating_sub(before.held(now_ms));
                        s.never_refused += u64::from(l.cost <= free);
                    }
                    _ => {}
                }
                s.lapsed_places += u64::from(commit && before.places.values().any(|p| p.deadline_ms < now_ms));
            });
            if let Some(classes) = l.classes {
                class_paths(&before, &self.model[*k], l, classes, (&o, turn), now_ms, commit);
            }
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

    /// [`Conn::take`] of a request that may wait (`line` with its `wait`):
    /// its line's outcome, and how it ends in the waiting line.
    fn turn(&mut self, k: usize, line: LineArg, now: u64) -> (Outcome, Turn) {
        let got = self.takes(&[(k, line)], now, true, false);
        (got[0].1[0], self.turns[0])
    }

    /// [`Conn::turn`], checked only.
    fn check_turn(&mut self, k: usize, line: LineArg, now: u64) -> (Outcome, Turn) {
        let got = self.takes(&[(k, line)], now, false, false);
        (got[0].1[0], self.turns[0])
    }

    /// `worker`'s `conn_put` of one op, a leave of its request's place
    /// `ticket` on key `k` at `now`: the units reclaimed.
    fn leave(&mut self, worker: &'static str, k: usize, ticket: u64, now: u64) -> u64 {
        self.put(worker, LIFE, &[(k, HoldOp::Leave { ticket })], now, false)
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
            let places = m.places.len();
            let lapsed = m.places.values().any(|p| p.deadline_ms < now / 1000);
            let r = m.put(worker, life_ms, *op, now / 1000);
            want += r;
            let after = m.fields.get(worker).copied();
            let left = m.places.len() < places && !lapsed;
            count(|s| {
                s.reclaimed_put += u64::from(r > 0);
                s.lapsed_places += u64::from(lapsed);
                s.left += u64::from(matches!(op, HoldOp::Leave { .. }) && left);
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

    /// Key `k` as the fake holds it, read as the model keeps it: its
    /// workers' fields, its places, its next ticket (nothing if the key is
    /// missing).
    fn stored(&self, k: usize) -> Holders {
        parse_hash(&self.redis.hash(&self.keys[k]).unwrap_or_default())
    }

    /// Key `k`'s workers' fields as the fake holds them (none if the key
    /// is missing).
    fn fields(&self, k: usize) -> BTreeMap<String, Field> {
        self.stored(k).fields
    }

    /// Key `k`'s places in the fake.
    fn places(&self, k: usize) -> BTreeMap<u64, Place> {
        self.stored(k).places
    }

    /// Key `k`'s place `ticket` in the fake.
    fn place(&self, k: usize, ticket: u64) -> Option<Place> {
        self.places(k).get(&ticket).copied()
    }

    /// Worker `w`'s field of key `k` in the fake.
    fn field(&self, k: usize, w: &str) -> Option<Field> {
        self.fields(k).get(w).copied()
    }

    /// The store at `now` (the fake's clock) held to the model: every key
    /// the model's, whole: its workers' fields, its places and its next
    /// ticket. A key the fake let expire held only lapsed fields and
    /// places (the model forgets them, and its next ticket: nothing
    /// reclaims them then, and tickets start again at 1); a key lives at
    /// least as long as each of its live fields and places, and no longer
    /// than the longest life written and the script's margin.
    fn same(&mut self, now: u64) {
        self.redis.set_now(now);
        let now_ms = now / 1000;
        for k in 0..self.keys.len() {
            let key = &self.keys[k];
            let m = &mut self.model[k];
            if self.redis.kind(key).is_none() {
                let live: Vec<_> = m.fields.iter().filter(|(_, f)| f.deadline_ms >= now_ms).collect();
                assert!(live.is_empty(), "key {k} expired at {now} with live fields {live:?}");
                let live: Vec<_> = m.places.iter().filter(|(_, p)| p.deadline_ms >= now_ms).collect();
                assert!(live.is_empty(), "key {k} expired at {now} with live places {live:?}");
                *m = Holders::default();
            }
            let m = &self.model[k];
            assert_eq!(self.stored(k), *m, "key {k} at {now}: the fake's fields and places, the model's");
            if *m == Holders::default() {
                continue;
            }
            let exp = self.redis.expiry(key).unwrap_or_else(|| panic!("key {k} at {now}: no expiry"));
            for (w, f) in &m.fields {
                if f.deadline_ms >= now_ms {
                    assert!(exp >= (f.deadline_ms + 1) * 1000, "key {k} expires at {exp}, before {w}'s field {f:?}");
                }
            }
            for (t, p) in &m.places {
                if p.deadline_ms >= now_ms {
                    assert!(exp >= (p.deadline_ms + 1) * 1000, "key {k} expires at {exp}, before place {t} {p:?}");
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
        assert_eq!(s, format!("concurrent 1 1000000 1 1 0 65 {W1} 1 {LIFE} 0 0"));
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
    assert_eq!(good, format!("concurrent 3 1000000 3 1 0 64 {W0} 2 500 0 0"));
    // (a line that may wait: its queue, ticket and time left; one that
    // never does on a limit with a queue: none of them)
    let mut s = String::new();
    write_spec(&mut s, &waits(conn_line(3, 1, W0, 2, 500), 4, 7, 300));
    assert_eq!(s, format!("concurrent 3 1000000 3 1 4 64 {W0} 2 500 7 300"));
    s.clear();
    let line = conn_line(3, 1, W0, 2, 500);
    write_spec(&mut s, &LineArg { limit: line.limit.with_queue(4).unwrap(), ..line });
    assert_eq!(s, good);
    let bad = [
        "concurrent 3 1000000 3 1 0 66 web1:100 2 500 0 0",
        "concurrent 3 1000000 3 1 0 80 web1:100 2 500 0 0",
        "concurrent 3 1000000 3 1 0 0 web1:100 2 500 0 0",
        "concurrent 3 1000000 3 1 0 0",
        "concurrent 3 1000000 3 1 0 64 2 500 0 0",
        "concurrent 3 1000000 0 1 0 64 web1:100 2 500 0 0",
        "concurrent 0 1000000 3 1 0 64 web1:100 2 500 0 0",
        "concurrent 3 0 3 1 0 64 web1:100 2 500 0 0",
        "concurrent 3 1000000 3 1 0 64 web1:100 2 0 0 0",
        "concurrent 3 1000000 3 1 0 64 web1:100 -1 500 0 0",
        "concurrent 3 1000000 3 1 0 64 web1:100 1.5 500 0 0",
        "concurrent 3 1000000 3 -1 0 64 web1:100 2 500 0 0",
        "concurrent 3 1000000 3 1 0 64 web1:100 2 500 0 0 7",
        "concurrent 3 1000000 3 1 0 64 web1:100 2 500 0 0 ",
        "concurrent 3 1000000 4503599627370496 1 0 64 web1:100 2 500 0 0",
        "concurrent 3 1000000 3 4503599627370496 0 64 web1:100 2 500 0 0",
        "concurrent 3 1000000 3 1 0 64 web1:100 4503599627370496 500 0 0",
        "concurrent 3 1000000 3 1 0 64 web1:100 2 4503599627370496 0 0",
        "concurrent  3 1000000 3 1 0 64 web1:100 2 500 0 0",
        // (the line before the waiting line's words, or a word short)
        "concurrent 3 1000000 3 1 0 64 web1:100 2 500",
        "concurrent 3 1000000 3 1 0 64 web1:100 2 500 0",
        "concurrent 3 1000000 3 1 2 64 web1:100 2 500 1",
        // (the queue, the ticket or the time left not a number below 2^52)
        "concurrent 3 1000000 3 1 x 64 web1:100 2 500 0 0",
        "concurrent 3 1000000 3 1 -1 64 web1:100 2 500 0 0",
        "concurrent 3 1000000 3 1 2 64 web1:100 2 500 x 0",
        "concurrent 3 1000000 3 1 2 64 web1:100 2 500 -1 0",
        "concurrent 3 1000000 3 1 2 64 web1:100 2 500 1.5 0",
        "concurrent 3 1000000 3 1 2 64 web1:100 2 500 0 x",
        "concurrent 3 1000000 3 1 2 64 web1:100 2 500 0 -5",
        "concurrent 3 1000000 3 1 2 64 web1:100 2 500 0 1e3",
        "concurrent 3 1000000 3 1 4503599627370496 64 web1:100 2 500 0 0",
        "concurrent 3 1000000 3 1 2 64 web1:100 2 500 4503599627370496 0",
        "concurrent 3 1000000 3 1 2 64 web1:100 2 500 0 4503599627370496",
        "concurrent 3 1000000 3 1 2 64 web1:100 2 500 0  0",
    ];
    // (just below 2^52: a poll of a place that is not there, refused with
    // what is free)
    let top = "concurrent 3 1000000 3 1 4503599627370495 64 web1:100 2 500 4503599627370495 4503599627370495";
    for mode in MODES {
        let r = Redis::with(mode);
        let key = keys(1);
        r.set_now(T0);
        let args = |line: &str| vec!["1".to_owned(), T0.to_string(), String::new(), line.to_owned()];
        for line in bad {
            assert_eq!(r.eval(&key, &args(line)), [T0 as i64, 0, 0, -1, 0, 0], "{line:?}");
            assert_eq!((r.writes(), r.snapshot()), (0, String::new()), "{line:?}");
        }
        assert_eq!(r.eval(&key, &args(top)), [T0 as i64, 3, 0, -1, 0, 0], "{top:?}");
        assert_eq!((r.writes(), r.snapshot()), (0, String::new()), "{top:?}");
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
        // (a leave: "q ticket 0")
        assert_eq!(conn_args(&[HoldOp::Leave { ticket: 7 }], W0, 500, Some(T0))[3], "q 7 0");
        bad_puts.extend([with(3, "q 7"), with(3, "q x 0"), with(3, "q 4503599627370496 0"), with(3, "q -7 0")]);
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

/// A poll of cost 0 whose place is gone (lapsed, left, let in, or never
/// made) passes, as any cost of 0 does, and writes nothing.
#[test]
fn poll_of_cost_zero_whose_place_is_gone() {
    for mode in MODES {
        let mut c = Conn::new(mode, 1);
        c.takes(&[(0, waiter(1, 2, 0, W1, 7, 5000))], T0, false, false);
        c.takes(&[(0, waiter(1, 2, 0, W1, 7, 5000))], T0, true, false);
    }
}

/// The waiting line's stories' life of a field (ms): long enough that a
/// place's deadline, its wait and a second, is under it.
const WLIFE: u64 = 10_000;

/// A request of `cost` units by `worker` (generation 1, its field living
/// [`WLIFE`]) on a line of `max` units and a waiting line of `queue`
/// places, waiting with `ticket` (0: it arrives) and `left_ms` left.
fn waiter(max: u64, queue: u64, cost: u64, worker: &'static str, ticket: u64, left_ms: u64) -> LineArg {
    waits(conn_line(max, cost, worker, 1, WLIFE), queue, ticket, left_ms)
}

/// A refusal's or a wait's outcome: nothing left but `remaining`, the
/// ticket as the reset, the places ahead as the delay.
fn not_yet(remaining: u64, ticket: u64, ahead: u64) -> Outcome {
    Outcome { remaining, reset_us: ticket, delay_us: ahead, ..Outcome::default() }
}

/// An admission's outcome: what remains beside the places ahead.
fn let_in(remaining: u64) -> Outcome {
    Outcome { admitted: true, remaining, ..Outcome::default() }
}

/// An arrival over what is free, on a line with a queue, takes a place:
/// tickets in order ("#" the next), its deadline its wait and a second
/// from now, the live places ahead of it as its delay, what is free
/// beyond them as what remains. An arrival never passes a waiter: one
/// that fits in what is free, but not beside the places ahead, waits
/// behind them; and a full line (every place live) refuses one, writing
/// nothing.
#[test]
fn arrivals_take_places_in_order() {
    for mode in MODES {
        let mut c = Conn::new(mode, 1);
        let ms = T0 / 1000;
        assert!(c.take(0, conn_line(3, 2, W0, 1, WLIFE), T0).0);
        // 1 free: an arrival of 2 waits, first.
        let (o, turn) = c.turn(0, waiter(3, 3, 2, W1, 0, 5000), T0 + 1000);
        assert_eq!((o, turn), (not_yet(1, 1, 0), Turn::Waiting { ticket: 1, ahead: 0 }));
        assert_eq!(c.place(0, 1), Some(Place { cost: 2, deadline_ms: ms + 1 + 5000 + 1000, class: None }));
        assert_eq!(c.stored(0).next_ticket, 2);
        assert_eq!(c.field(0, W1), None, "a place holds no units");
        // One of 1 fits in what is free, but not beside place 1's 2.
        let (o, turn) = c.turn(0, waiter(3, 3, 1, W2, 0, 5000), T0 + 2000);
        assert_eq!((o, turn), (not_yet(0, 2, 1), Turn::Waiting { ticket: 2, ahead: 1 }));
        // 2 free: still not beside the places' 3.
        c.put(W0, WLIFE, &[(0, HoldOp::GiveBack { units: 1, gen: 1 })], T0 + 3000, false);
        let (o, turn) = c.turn(0, waiter(3, 3, 1, W0, 0, 5000), T0 + 4000);
        assert_eq!((o, turn), (not_yet(0, 3, 2), Turn::Waiting { ticket: 3, ahead: 2 }));
        assert_eq!(c.field(0, W0).map(|f| f.count), Some(1), "a place takes no units");
        // The line full: refused, nothing written.
        let writes = c.redis.writes();
        let (o, turn) = c.turn(0, waiter(3, 3, 1, W1, 0, 5000), T0 + 5000);
        assert_eq!((o, turn), (not_yet(0, 0, 0), Turn::Refused));
        assert_eq!(c.redis.writes(), writes);
        assert_eq!(c.places(0).keys().copied().collect::<Vec<_>>(), [1, 2, 3]);
        assert_eq!(c.stored(0).next_ticket, 4);
        // (a larger line's arrival takes the fourth)
        let (_, turn) = c.turn(0, waiter(3, 4, 1, W1, 0, 5000), T0 + 6000);
        assert_eq!(turn, Turn::Waiting { ticket: 4, ahead: 3 });
    }
}

/// An arrival that fits together with every live place ahead of it is let
/// in at once (the places keep their units); a poll is let in when its
/// units and those of the live places ahead fit in what is free, and its
/// place is deleted (the next ticket stays).
#[test]
fn arrival_that_fits_beside_the_line_is_admitted() {
    for mode in MODES {
        let mut c = Conn::new(mode, 1);
        assert!(c.take(0, conn_line(4, 3, W0, 1, WLIFE), T0).0);
        let (o, turn) = c.turn(0, waiter(4, 2, 2, W1, 0, 5000), T0 + 1000);
        assert_eq!((o, turn), (not_yet(1, 1, 0), Turn::Waiting { ticket: 1, ahead: 0 }));
        c.put(W0, WLIFE, &[(0, HoldOp::GiveBack { units: 2, gen: 1 })], T0 + 2000, false);
        // 3 free: 1 beside place 1's 2.
        let (o, turn) = c.turn(0, waiter(4, 2, 1, W2, 0, 5000), T0 + 3000);
        assert_eq!((o, turn), (let_in(0), Turn::Admitted));
        assert_eq!(c.field(0, W2).map(|f| f.count), Some(1));
        assert_eq!(c.places(0).len(), 1, "place 1 stays");
        // Its poll: 2 free, none ahead.
        let (o, turn) = c.turn(0, waiter(4, 2, 2, W1, 1, 4000), T0 + 4000);
        assert_eq!((o, turn), (let_in(0), Turn::Admitted));
        assert_eq!(c.field(0, W1).map(|f| f.count), Some(2));
        assert_eq!(c.places(0), BTreeMap::new(), "let in: its place deleted");
        assert_eq!(c.stored(0).next_ticket, 2, "the next ticket stays");
    }
}

/// Waiters are let in together: once what is free covers them, each is
/// let in at its next look, whatever the order of their looks (the
/// second does not need the first to have looked first).
#[test]
fn waiters_are_let_in_together() {
    for mode in MODES {
        let mut c = Conn::new(mode, 1);
        assert!(c.take(0, conn_line(2, 2, W0, 1, WLIFE), T0).0);
        assert_eq!(c.turn(0, waiter(2, 2, 1, W1, 0, 5000), T0 + 1000).1, Turn::Waiting { ticket: 1, ahead: 0 });
        assert_eq!(c.turn(0, waiter(2, 2, 1, W2, 0, 5000), T0 + 1000).1, Turn::Waiting { ticket: 2, ahead: 1 });
        c.put(W0, WLIFE, &[(0, HoldOp::GiveBack { units: 1, gen: 1 })], T0 + 2000, false);
        // 1 free: not beside place 1.
        let (o, turn) = c.turn(0, waiter(2, 2, 1, W2, 2, 5000), T0 + 3000);
        assert_eq!((o, turn), (not_yet(0, 2, 1), Turn::Waiting { ticket: 2, ahead: 1 }));
        c.put(W0, WLIFE, &[(0, HoldOp::GiveBack { units: 1, gen: 1 })], T0 + 4000, false);
        // 2 free: the second is let in first, the first after it.
        let (o, turn) = c.turn(0, waiter(2, 2, 1, W2, 2, 5000), T0 + 5000);
        assert_eq!((o, turn), (let_in(0), Turn::Admitted));
        assert_eq!(c.places(0).keys().copied().collect::<Vec<_>>(), [1]);
        let (o, turn) = c.turn(0, waiter(2, 2, 1, W1, 1, 5000), T0 + 6000);
        assert_eq!((o, turn), (let_in(0), Turn::Admitted));
        let s = c.stored(0);
        assert_eq!((s.places.len(), s.next_ticket), (0, 3));
        assert_eq!((s.fields[W1].count, s.fields[W2].count), (1, 1));
        assert_eq!(c.field(0, W0), None, "given back to 0");
    }
}

/// A place lapses at its deadline (its request's wait and a second, at
/// most a field's life): then it no longer counts ahead, the next call
/// that commits on the key drops it (no units reclaimed: it held none),
/// and a poll of it is refused as one of a ticket never handed out.
#[test]
fn places_lapse() {
    for mode in MODES {
        let mut c = Conn::new(mode, 1);
        let ms = T0 / 1000;
        assert!(c.take(0, conn_line(1, 1, W0, 1, WLIFE), T0).0);
        assert_eq!(c.turn(0, waiter(1, 3, 1, W1, 0, 0), T0).1, Turn::Waiting { ticket: 1, ahead: 0 });
        assert_eq!(c.turn(0, waiter(1, 3, 1, W2, 0, 50_000), T0).1, Turn::Waiting { ticket: 2, ahead: 1 });
        assert_eq!(c.place(0, 1).map(|p| p.deadline_ms), Some(place_deadline(ms, 0, WLIFE)));
        assert_eq!(place_deadline(ms, 0, WLIFE), ms + 1000, "a second past its wait");
        assert_eq!(c.place(0, 2).map(|p| p.deadline_ms), Some(ms + WLIFE), "at most a field's life");
        // At its deadline's last µs, still ahead.
        let (o, _) = c.check_turn(0, waiter(1, 3, 1, W2, 2, 50_000), T0 + 1_000_999);
        assert_eq!(o, not_yet(0, 2, 1));
        // Then not, though still there until a call commits.
        let t = T0 + 1_001_000;
        let (o, _) = c.check_turn(0, waiter(1, 3, 1, W2, 2, 50_000), t);
        assert_eq!(o, not_yet(0, 2, 0));
        assert_eq!(c.places(0).len(), 2);
        let (o, _) = c.turn(0, waiter(1, 3, 1, W2, 2, 50_000), t);
        assert_eq!((o, o.next_us), (not_yet(0, 2, 0), 0));
        assert_eq!(c.places(0).keys().copied().collect::<Vec<_>>(), [2], "dropped");
        // Its poll, or one of a ticket never handed out: refused.
        let writes = c.redis.writes();
        for ticket in [1, 3, 9] {
            let (o, turn) = c.turn(0, waiter(1, 3, 1, W1, ticket, 5000), t + 1000);
            assert_eq!((o, turn), (not_yet(0, 0, 0), Turn::Refused), "ticket {ticket}");
        }
        assert_eq!(c.redis.writes(), writes, "refused: nothing written");
        // (with units free, the same: a request whose place is gone never
        // takes another)
        c.put(W0, WLIFE, &[(0, HoldOp::GiveBack { units: 1, gen: 1 })], t + 2000, false);
        let (o, turn) = c.turn(0, waiter(1, 3, 1, W1, 1, 5000), t + 3000);
        assert_eq!((o, turn), (not_yet(1, 0, 0), Turn::Refused), "its place gone: refused, 1 free");
        // A dropped place is a lapsed field's call too (conn_put's).
        c.put(W0, WLIFE, &[(0, HoldOp::Set { units: 1, gen: 2 })], t + 4000, false);
        let t = T0 + 12_000_000;
        assert_eq!(c.put(W1, WLIFE, &[(0, HoldOp::GiveBack { units: 1, gen: 1 })], t, false), 1);
        assert_eq!(c.stored(0), Holders { next_ticket: 3, ..Holders::default() }, "all lapsed");
        // (the key kept for its next ticket until it expires: then tickets
        // start again at 1)
        c.same(T0 + 40_000_000);
        assert_eq!(c.redis.kind(&c.keys[0]), None);
        assert!(c.take(0, conn_line(1, 1, W0, 1, WLIFE), T0 + 40_000_000).0);
        let (_, turn) = c.turn(0, waiter(1, 3, 1, W1, 0, 0), T0 + 40_000_000);
        assert_eq!(turn, Turn::Waiting { ticket: 1, ahead: 0 });
    }
}

/// A poll of a place with less than half a field's life left renews it
/// (its deadline the poll's wait and a second from now, at most a life);
/// one made earlier writes nothing, and a check-only one never does.
#[test]
fn polls_renew_a_place_past_half_its_life() {
    for mode in MODES {
        let mut c = Conn::new(mode, 1);
        let ms = T0 / 1000;
        // (W0 holds the unit throughout)
        assert!(c.take(0, conn_line(1, 1, W0, 1, 60_000), T0).0);
        assert_eq!(c.turn(0, waiter(1, 2, 1, W1, 0, 60_000), T0).1, Turn::Waiting { ticket: 1, ahead: 0 });
        let placed = Place { cost: 1, deadline_ms: ms + WLIFE, class: None };
        assert_eq!(c.place(0, 1), Some(placed));
        // Half its life left (5 s of 10): not renewed.
        let writes = c.redis.writes();
        for dt in [1_000_000, 4_000_000, 5_000_000] {
            let (o, turn) = c.turn(0, waiter(1, 2, 1, W1, 1, 30_000), T0 + dt);
            assert_eq!((o, turn), (not_yet(0, 1, 0), Turn::Waiting { ticket: 1, ahead: 0 }), "{dt}");
        }
        assert_eq!((c.redis.writes(), c.place(0, 1)), (writes, Some(placed)));
        // Less: renewed, at most a life from now, by a commit only.
        let t = T0 + 5_001_000;
        let (o, _) = c.check_turn(0, waiter(1, 2, 1, W1, 1, 30_000), t);
        assert_eq!(o, not_yet(0, 1, 0));
        assert_eq!((c.redis.writes(), c.place(0, 1)), (writes, Some(placed)));
        let (o, _) = c.turn(0, waiter(1, 2, 1, W1, 1, 30_000), t);
        assert_eq!(o, not_yet(0, 1, 0));
        assert!(c.redis.writes() > writes);
        assert_eq!(c.place(0, 1), Some(Place { cost: 1, deadline_ms: t / 1000 + WLIFE, class: None }));
        // (its wait nearly over: a renewal would gain nothing, so nothing is written)
        let renewed = c.place(0, 1);
        let writes = c.redis.writes();
        let t = T0 + 10_600_000;
        let (o, _) = c.turn(0, waiter(1, 2, 1, W1, 1, 200), t);
        assert_eq!(o, not_yet(0, 1, 0));
        assert_eq!((c.redis.writes(), c.place(0, 1)), (writes, renewed));
        // (a renewal that gains a second: the wait and a second from now)
        let t = T0 + 11_000_000;
        let (o, _) = c.turn(0, waiter(1, 2, 1, W1, 1, 5_000), t);
        assert_eq!(o, not_yet(0, 1, 0));
        assert_eq!(c.place(0, 1), Some(Place { cost: 1, deadline_ms: t / 1000 + 6000, class: None }));
    }
}

/// A leave ("q ticket 0") deletes the place, whoever sends it, neither
/// writing nor renewing the sender's field; a later poll of it is
/// refused, and those behind it move up. It reclaims lapsed fields as
/// every `conn_put` op does; a leave of a place that is not there changes
/// nothing.
#[test]
fn leave_gives_up_a_place() {
    for mode in MODES {
        let mut c = Conn::new(mode, 1);
        assert!(c.take(0, conn_line(1, 1, W0, 1, WLIFE), T0).0);
        assert_eq!(c.turn(0, waiter(1, 2, 1, W1, 0, 5000), T0).1, Turn::Waiting { ticket: 1, ahead: 0 });
        assert_eq!(c.turn(0, waiter(1, 2, 1, W2, 0, 5000), T0).1, Turn::Waiting { ticket: 2, ahead: 1 });
        let w0 = c.field(0, W0);
        assert_eq!(c.leave(W0, 0, 1, T0 + 1000), 0);
        assert_eq!(c.places(0).keys().copied().collect::<Vec<_>>(), [2]);
        assert_eq!((c.field(0, W0), c.field(0, W1)), (w0, None), "no field written or renewed");
        let (o, turn) = c.turn(0, waiter(1, 2, 1, W1, 1, 5000), T0 + 2000);
        assert_eq!((o, turn), (not_yet(0, 0, 0), Turn::Refused));
        let (o, turn) = c.turn(0, waiter(1, 2, 1, W2, 2, 5000), T0 + 2000);
        assert_eq!((o, turn), (not_yet(0, 2, 0), Turn::Waiting { ticket: 2, ahead: 0 }));
        // (a place that is not there: nothing)
        let before = c.stored(0);
        c.leave(W1, 0, 7, T0 + 3000);
        assert_eq!(c.stored(0), before);
        // W0's field lapsed (the key not yet expired): reclaimed by a leave.
        let t = T0 + 11_000_000;
        assert_eq!(c.leave(W2, 0, 2, t), 1);
        assert_eq!(c.stored(0), Holders { next_ticket: 3, ..Holders::default() });
        // (on a key of a worker's field only: its last field gone, the key
        // is, as any give-back's)
        c.same(T0 + 60_000_000);
        assert!(c.take(0, conn_line(1, 1, W0, 1, WLIFE), T0 + 60_000_000).0);
        c.leave(W0, 0, 1, T0 + 61_000_000);
        assert_eq!(c.fields(0).len(), 1);
    }
}

/// A take that never waits (no `wait`: nginx sends none for a line with
/// no queue) leaves what is free to the live places all the same: it is
/// refused while its units and theirs do not fit, and takes none.
#[test]
fn take_that_never_waits_leaves_the_places_their_units() {
    for mode in MODES {
        let mut c = Conn::new(mode, 1);
        assert!(c.take(0, conn_line(3, 2, W0, 1, WLIFE), T0).0);
        let (o, turn) = c.turn(0, waiter(3, 2, 2, W1, 0, 5000), T0 + 1000);
        assert_eq!((o, turn), (not_yet(1, 1, 0), Turn::Waiting { ticket: 1, ahead: 0 }));
        let plain = conn_line(3, 1, W2, 1, WLIFE);
        let queued = LineArg { limit: plain.limit.with_queue(2).unwrap(), ..plain };
        for (i, line) in [plain, queued].into_iter().enumerate() {
            let (o, turn) = c.turn(0, line, T0 + 2000 + i as u64 * 1000);
            assert_eq!((o, turn), (not_yet(0, 0, 0), Turn::Refused), "1 free, 2 ahead");
        }
        c.put(W0, WLIFE, &[(0, HoldOp::GiveBack { units: 1, gen: 1 })], T0 + 4000, false);
        let (o, turn) = c.turn(0, plain, T0 + 5000);
        assert_eq!((o, turn), (not_yet(0, 0, 0), Turn::Refused), "2 free, 2 ahead");
        c.put(W0, WLIFE, &[(0, HoldOp::GiveBack { units: 1, gen: 1 })], T0 + 6000, false);
        let (o, turn) = c.turn(0, queued, T0 + 7000);
        assert_eq!((o, turn), (let_in(0), Turn::Admitted), "3 free, 2 ahead");
        assert_eq!(c.places(0).len(), 1);
        assert_eq!(c.stored(0).next_ticket, 2);
        // (and the place, its turn come, is let in)
        let (o, turn) = c.turn(0, waiter(3, 2, 2, W1, 1, 5000), T0 + 8000);
        assert_eq!((o, turn), (let_in(0), Turn::Admitted));
    }
}

/// A check-only arrival (mode "0") decides as the commit would but takes
/// no place; a check-only poll neither renews its place nor, let in,
/// deletes it.
#[test]
fn check_only_takes_no_place() {
    for mode in MODES {
        let mut c = Conn::new(mode, 1);
        assert!(c.take(0, conn_line(1, 1, W0, 1, WLIFE), T0).0);
        let (o, turn) = c.check_turn(0, waiter(1, 2, 1, W1, 0, 60_000), T0 + 1000);
        assert_eq!((o, turn), (not_yet(0, 0, 0), Turn::Refused));
        assert_eq!(c.redis.kind(&c.keys[0]).as_deref(), Some("hash"));
        assert_eq!((c.places(0).len(), c.stored(0).next_ticket), (0, 0));
        assert_eq!(c.turn(0, waiter(1, 2, 1, W1, 0, 60_000), T0 + 1000).1, Turn::Waiting { ticket: 1, ahead: 0 });
        let placed = c.place(0, 1);
        let (o, turn) = c.check_turn(0, waiter(1, 2, 1, W1, 1, 5000), T0 + 9_000_000);
        assert_eq!((o, turn), (not_yet(0, 1, 0), Turn::Waiting { ticket: 1, ahead: 0 }), "past half its life");
        c.put(W0, WLIFE, &[(0, HoldOp::GiveBack { units: 1, gen: 1 })], T0 + 9_100_000, false);
        let (o, turn) = c.check_turn(0, waiter(1, 2, 1, W1, 1, 5000), T0 + 9_200_000);
        assert_eq!((o, turn), (let_in(0), Turn::Admitted));
        assert_eq!(c.place(0, 1), placed, "neither renewed nor deleted");
        // (an arrival that fits, checked: admitted, beside the place: 1
        // free, 1 ahead)
        let (o, turn) = c.check_turn(0, waiter(1, 2, 1, W2, 0, 5000), T0 + 9_300_000);
        assert_eq!((o, turn), (not_yet(0, 0, 0), Turn::Refused));
    }
}

/// An arrival named by a memo (mode "2") sent twice takes one place: the
/// copy answers the first reply, with its ticket, and writes nothing. A
/// poll let in is in its memo as a take; one that renews its place keeps
/// its memo too; one that only waits needs none.
#[test]
fn memo_arrival_takes_one_place() {
    for mode in MODES {
        let mut c = Conn::new(mode, 1);
        c.max_life = WLIFE;
        assert!(c.take(0, conn_line(1, 1, W0, 1, WLIFE), T0).0);
        let keys = c.keys.clone();
        let t = T0 + 1000;
        let line = waiter(1, 2, 1, W1, 0, 60_000);
        let memo = memo_key(&c.keys, (9, 1));
        let raw = c.redis.call_memo(&keys, &[&[line][..]], t, false, None, &memo);
        let (o, _, turn) =
            c.model[0].take_waiting(&line.limit, 1, &line.holder.unwrap(), line.wait, None, t / 1000, true);
        assert_eq!(turn, Turn::Waiting { ticket: 1, ahead: 0 });
        assert_eq!(parse_script_reply(&raw, &[&[line][..]]), (t, Some(vec![(false, vec![o])])));
        c.same(t);
        assert_eq!(c.redis.memo(&memo), Some(Memo::Ran { reply: raw.clone(), done: vec![] }));
        let before = c.redis.before(&memo);
        assert_eq!(c.redis.call_memo(&keys, &[&[line][..]], t + 1000, false, None, &memo), raw, "the copy");
        c.redis.unchanged_since(&before, 0, "a copy of an arrival");
        c.same(t + 1000);
        assert_eq!(c.places(0).len(), 1, "one place");

        // A poll that only waits: no memo.
        let poll = waiter(1, 2, 1, W1, 1, 60_000);
        let memo2 = memo_key(&c.keys, (9, 2));
        let t = T0 + 2_000_000;
        let raw = c.redis.call_memo(&keys, &[&[poll][..]], t, false, None, &memo2);
        let (o, _, _) = c.model[0].take_waiting(&poll.limit, 1, &poll.holder.unwrap(), poll.wait, None, t / 1000, true);
        assert_eq!(parse_script_reply(&raw, &[&[poll][..]]), (t, Some(vec![(false, vec![o])])));
        assert_eq!(c.redis.memo(&memo2), None);
        c.same(t);
        // One that renews: kept.
        let memo3 = memo_key(&c.keys, (9, 3));
        let t = T0 + 8_000_000;
        let raw = c.redis.call_memo(&keys, &[&[poll][..]], t, false, None, &memo3);
        let (o, _, _) = c.model[0].take_waiting(&poll.limit, 1, &poll.holder.unwrap(), poll.wait, None, t / 1000, true);
        assert_eq!(parse_script_reply(&raw, &[&[poll][..]]), (t, Some(vec![(false, vec![o])])));
        assert_eq!(c.redis.memo(&memo3), Some(Memo::Ran { reply: raw.clone(), done: vec![] }));
        c.same(t);
        // One let in: its take once, its place deleted.
        c.put(W0, WLIFE, &[(0, HoldOp::GiveBack { units: 1, gen: 1 })], t + 1000, false);
        let memo4 = memo_key(&c.keys, (9, 4));
        let t = t + 2000;
        let raw = c.redis.call_memo(&keys, &[&[poll][..]], t, false, None, &memo4);
        let (o, _, turn) =
            c.model[0].take_waiting(&poll.limit, 1, &poll.holder.unwrap(), poll.wait, None, t / 1000, true);
        assert_eq!(turn, Turn::Admitted);
        assert_eq!(parse_script_reply(&raw, &[&[poll][..]]), (t, Some(vec![(true, vec![o])])));
        assert_eq!(c.redis.memo(&memo4), Some(Memo::Ran { reply: raw.clone(), done: vec![(1, 0, 0)] }));
        c.same(t);
        let before = c.redis.before(&memo4);
        assert_eq!(c.redis.call_memo(&keys, &[&[poll][..]], t + 1000, false, None, &memo4), raw, "the copy");
        c.redis.unchanged_since(&before, 0, "a copy of a poll let in");
        assert_eq!(c.field(0, W1).map(|f| f.count), Some(1), "taken once");
        c.same(t + 1000);
    }
}

/// How a random take waits: never (no `wait`), arriving, or polling a
/// ticket: one of a place the key holds (`Poll`, the i-th, modulo how
/// many, live or lapsed; arriving if none), one handed out on the key
/// (`Old`, the i-th last, modulo how many: often a place gone; made up
/// if none was), or one made up (`MadeUp`); each with the ms its wait
/// has left.
#[derive(Clone, Copy, Debug)]
enum Waits {
    Never,
    Arrive(u64),
    Poll(usize, u64),
    Old(usize, u64),
    MadeUp(u64, u64),
}

/// A random take: key, worker, dgen, cost, dry-run, how it waits, and on
/// a line of classes its class (modulo how many; a poll of a place of a
/// class: the place's) and its worker's field (0: a take of the line as
/// before `classes=`, of no class, by the worker's name alone; 1: of its
/// class, by a field of a class beyond the line's; else its class's
/// field).
type TakeReq = (usize, usize, u64, u64, bool, Waits, u8, u8);

/// One random step of a replay (keys and workers taken modulo their
/// numbers; a generation as the worker's current one + `dgen` - 1).
#[derive(Clone, Debug)]
enum Step {
    /// The clock moves on (µs).
    Wait(u64),
    /// One call of one or two takes ([`TakeReq`]), committed or checked,
    /// by Redis `TIME` or not.
    Take { reqs: Vec<TakeReq>, commit: bool, time: bool },
    /// A worker's `conn_put` call (in a replay of classes by its field
    /// `NAMES[worker][field]`): per key (0 d, 1 c, 2 s, units, dgen; 3 a
    /// leave of a ticket handed out on the key, the units-th last (modulo
    /// how many), 4 a leave of ticket units + 1).
    Put { worker: usize, field: usize, ops: Vec<(usize, u8, u64, u64)>, time: bool },
    /// A worker's generation moves on.
    Bump { worker: usize },
}

/// Random steps: calls of takes weighing `takes` against 3 of time
/// passing, 4 of `conn_put` calls and 1 of a generation moving on.
fn steps(takes: u32) -> impl Strategy<Value = Vec<Step>> {
    // (past a life, often; past a key's expiry, sometimes)
    let wait = prop_oneof![
        2 => Just(0u64),
        2 => 1u64..1_000,
        3 => 1_000u64..300_000,
        2 => 300_000u64..2_500_000,
        1 => 2_500_000u64..6_000_000,
    ]
    .prop_map(Step::Wait);
    // (a wait's time left: a place's deadline under a life, or at it)
    let left = prop_oneof![2 => 0u64..100, 2 => 100u64..1_500, 1 => 1_500u64..100_000];
    let waits = prop_oneof![
        3 => Just(Waits::Never),
        3 => left.clone().prop_map(Waits::Arrive),
        4 => (0usize..4, left.clone()).prop_map(|(i, l)| Waits::Poll(i, l)),
        1 => (0usize..4, left.clone()).prop_map(|(i, l)| Waits::Old(i, l)),
        1 => (1u64..12, left).prop_map(|(t, l)| Waits::MadeUp(t, l)),
    ];
    let take = (0usize..2, 0usize..3, 0u64..3, 0u64..=3, prop::bool::weighted(0.1), waits, 0u8..3, 0u8..16);
    let kind = prop_oneof![3 => 0u8..3, 1 => 3u8..5];
    let op = (0usize..2, kind, 0u64..=3, 0u64..3);
    let field = prop_oneof![4 => 0usize..3, 1 => 3usize..5];
    let step = prop_oneof![
        3 => wait,
        takes => (prop::collection::vec(take, 1..=2), prop::bool::weighted(0.8), any::<bool>())
            .prop_map(|(reqs, commit, time)| Step::Take { reqs, commit, time }),
        4 => (0usize..3, field, prop::collection::vec(op, 1..=2), any::<bool>())
            .prop_map(|(worker, field, ops, time)| Step::Put { worker, field, ops, time }),
        1 => (0usize..3).prop_map(|worker| Step::Bump { worker }),
    ];
    prop::collection::vec(step, 1..60)
}

/// A replay's keys' maxes and queues (1 or 2 keys; a queue of 0: a line
/// whose arrivals never take a place, though its polls may find one), its
/// workers' lives (ms; 2 or 3 workers), and its steps.
type ReplayCase = (Vec<(u64, u64)>, Vec<u64>, Vec<Step>);

fn replays() -> impl Strategy<Value = ReplayCase> {
    let key = (1u64..=6, prop_oneof![1 => Just(0u64), 3 => 1u64..=3]);
    (prop::collection::vec(key, 1..=2), prop::collection::vec(50u64..=1_500, 2..=3), steps(6))
}

/// A key of a replay of classes: its max, its queue, and its classes (2
/// or 3, highest first: places and reserve each).
type ClassKey = (u64, u64, Vec<Lane>);

/// A replay of classes: its keys (1 or 2), its workers' lives, its steps.
type ClassReplayCase = (Vec<ClassKey>, Vec<u64>, Vec<Step>);

fn class_replays() -> impl Strategy<Value = ClassReplayCase> {
    let lane = (prop_oneof![1 => Just(0u64), 4 => 1u64..=3], prop_oneof![3 => Just(0u64), 2 => 1u64..=2])
        .prop_map(|(places, reserve)| Lane { places, reserve, lend: false });
    // (the queue: as nginx makes it without `queue=`, its classes' places
    // together; or given, often fewer; or none)
    let queue = prop_oneof![1 => Just(None), 1 => Just(Some(0u64)), 4 => (1u64..=3).prop_map(Some)];
    let key = (1u64..=4, queue, prop::collection::vec(lane, 2..=3)).prop_map(|(max, queue, lanes)| {
        let queue = queue.unwrap_or_else(|| lanes.iter().map(|l| l.places).sum());
        (max, queue, lanes)
    });
    // (more takes: classes need places live together)
    (prop::collection::vec(key, 1..=2), prop::collection::vec(50u64..=1_500, 2..=3), steps(10))
}

/// A replay's key: its max, its queue, and its classes (`None`: one).
type ReplayKey = (u64, u64, Option<&'static [Lane]>);

/// The keys of a replay of classes, their classes for `LineArg` (which
/// holds them as the module does, for as long as it runs: leaked).
fn class_lines(keys: &[ClassKey]) -> Vec<ReplayKey> {
    keys.iter().map(|(max, queue, lanes)| (*max, *queue, Some(&*Box::leak(lanes.clone().into_boxed_slice())))).collect()
}

/// `steps` on keys of `lines` (max, queue, classes) by workers of `lives`,
/// on the script (run as `mode`) and the model, compared at every step:
/// how many keys the fake let expire. On a key of classes a take is of a
/// class (its worker's field of it, see [`TakeReq`]), and a `conn_put`
/// call is its worker's field of a class (or of none, or one beyond);
/// with no key of classes, every worker is its name alone.
fn replay(lines: &[ReplayKey], lives: &[u64], steps: &[Step], mode: Mode) -> u64 {
    let (nk, nw) = (lines.len(), lives.len());
    let classed = lines.iter().any(|l| l.2.is_some());
    let mut c = Conn::new(mode, nk);
    let mut gens = vec![1u64; nw];
    let gen = |g: u64, d: u64| (g + d).saturating_sub(1);
    // The tickets handed out, per key.
    let mut tickets: Vec<Vec<u64>> = vec![vec![]; nk];
    // (the i-th last: the latest are the likeliest still waiting)
    let pick = |tickets: &[u64], i: usize| match tickets {
        [] => i as u64 + 1,
        _ => tickets[tickets.len() - 1 - i % tickets.len()],
    };
    let mut t = T0 + 123;
    for step in steps {
        match step {
            Step::Wait(dt) => {
                t += dt;
                c.redis.set_now(t);
                c.same(t);
            }
            Step::Take { reqs, commit, time } => {
                let reqs: Vec<(usize, LineArg)> = reqs
                    .iter()
                    .map(|&(k, w, dg, cost, dry, how, class, field)| {
                        let (k, w) = (k % nk, w % nw);
                        let (max, queue, lanes) = lines[k];
                        let places: Vec<(u64, Option<u64>)> =
                            c.model[k].places.iter().map(|(t, p)| (*t, p.class)).collect();
                        let (ticket, of) = match how {
                            Waits::Never => (None, None),
                            Waits::Arrive(left) => (Some((0, left)), None),
                            Waits::Poll(_, left) if places.is_empty() => (Some((0, left)), None),
                            Waits::Poll(i, left) => {
                                let (t, of) = places[i % places.len()];
                                (Some((t, left)), of)
                            }
                            Waits::Old(i, left) => (Some((pick(&tickets[k], i), left)), None),
                            Waits::MadeUp(ticket, left) => (Some((ticket, left)), None),
                        };
                        // (on a line of classes, the class and the worker's field of it)
                        let classes = lanes.filter(|_| field > 0).map(|lanes| {
                            let n = lanes.len() as u64;
                            let class = of.filter(|c| *c < n).unwrap_or(u64::from(class) % n);
                            ClassArg { class: class as u8, lanes }
                        });
                        let worker = match (classes, field) {
                            (None, _) => WORKERS[w],
                            (Some(_), 1) => NAMES[w][4],
                            (Some(c), _) => NAMES[w][usize::from(c.class)],
                        };
                        let line = conn_line(max, cost, worker, gen(gens[w], dg), lives[w]);
                        let line = LineArg { dry_run: dry, classes, ..line };
                        let line = match ticket {
                            None => line,
                            Some((ticket, left)) => waits(line, queue, ticket, left),
                        };
                        (k, line)
                    })
                    .collect();
                c.takes(&reqs, t, *commit, *time);
                for ((k, l), turn) in reqs.iter().zip(&c.turns) {
                    if let (Some(Wait { ticket: 0, .. }), Turn::Waiting { ticket, .. }) = (l.wait, turn) {
                        tickets[*k].push(*ticket);
                    }
                }
            }
            Step::Put { worker, field, ops, time } => {
                let w = worker % nw;
                let ops: Vec<(usize, HoldOp)> = ops
                    .iter()
                    .map(|&(k, kind, units, dg)| {
                        let (k, gen) = (k % nk, gen(gens[w], dg));
                        let op = match kind {
                            0 => HoldOp::GiveBack { units, gen },
                            1 => HoldOp::Correct { units, gen },
                            2 => HoldOp::Set { units, gen },
                            3 => HoldOp::Leave { ticket: pick(&tickets[k], units as usize) },
                            _ => HoldOp::Leave { ticket: units + 1 },
                        };
                        (k, op)
                    })
                    .collect();
                let name = match classed {
                    true => NAMES[w][*field % 5],
                    false => WORKERS[w],
                };
                c.put(name, lives[w], &ops, t, *time);
            }
            Step::Bump { worker } => gens[worker % nw] += 1,
        }
    }
    c.redis.fake.get::<u64>("expired").unwrap()
}

/// The keys of a replay with no classes.
fn plain_lines(keys: &[(u64, u64)]) -> Vec<ReplayKey> {
    keys.iter().map(|&(max, queue)| (max, queue, None)).collect()
}

proptest! {
    // (failures persist next to this file, as props.rs's do)
    #![proptest_config(ProptestConfig {
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("proptest-regressions"))),
        ..ProptestConfig::with_cases(256)
    })]

    /// 1 or 2 keys (with a waiting line or not), 2 or 3 workers, any order
    /// of takes (committed or checked, generations around each worker's;
    /// that never wait, arrivals, polls of tickets handed out or made up),
    /// `conn_put` calls (give-backs, corrections, heartbeats, leaves) and
    /// time passing (fields and places lapsing): the script's replies,
    /// fields and places are the model's, as a function library and as
    /// scripts.
    #[test]
    fn prop_conn_is_the_model((lines, lives, steps) in replays()) {
        let lines = plain_lines(&lines);
        for mode in MODES {
            replay(&lines, &lives, &steps, mode);
        }
    }

    /// The same on lines of classes (2 or 3, random places and reserves,
    /// a queue of their places together, fewer, or none): takes of random
    /// classes by the workers' fields of them (and now and then one of the
    /// line as before `classes=`, or by a field of a class beyond the
    /// line's), `conn_put` calls by the fields of any class: reserves,
    /// places ahead by class, places per class, places of a lower class
    /// taken by a higher one, all the model's.
    #[test]
    fn prop_conn_classes_is_the_model((keys, lives, steps) in class_replays()) {
        let lines = class_lines(&keys);
        for mode in MODES {
            replay(&lines, &lives, &steps, mode);
        }
    }
}

/// Sanity: the replay reaches every path often enough to mean something
/// (refusals, takes counted already, reclaims by takes and by `conn_put`,
/// corrections applied, give-backs dropped, heartbeats that set a field,
/// keys expired; in the waiting line: places taken, arrivals that fit in
/// what is free waiting behind the line, arrivals refused a full line,
/// polls let in, kept waiting, renewed, refused their place gone, takes
/// that never wait refused for the places' units, places lapsed and
/// dropped, leaves); and the replay of classes every path of classes
/// (refusals for the reserves above, reserves used up, arrivals refused a
/// place over what the reserves leave, their class's places all taken or
/// the line full, places of a lower class taken, arrivals placed ahead of
/// a lower class, polls overtaken by a higher class, fields and places
/// that name no class).
#[test]
fn conn_coverage() {
    STATS.with(|s| s.set(Stats::default()));
    let mut runner = TestRunner::deterministic();
    let strategy = replays();
    let mut expired = 0;
    for _ in 0..200 {
        let (lines, lives, steps) = strategy.new_tree(&mut runner).unwrap().current();
        expired += replay(&plain_lines(&lines), &lives, &steps, Mode::Function);
    }
    let s = STATS.with(Cell::get);
    let all = [s.refused, s.counted, s.reclaimed_take, s.reclaimed_put, s.corrected, s.dropped, s.set];
    assert!(all.iter().all(|n| *n >= 10), "{s:?}");
    let line = [
        s.placed,
        s.behind,
        s.full,
        s.poll_admitted,
        s.poll_waiting,
        s.poll_gone,
        s.never_refused,
        s.lapsed_places,
        s.left,
    ];
    assert!(line.iter().all(|n| *n >= 10), "{s:?}");
    // (a renewal needs half a life gone and a second gained: rarer in these replays)
    assert!(s.renewed >= 1, "{s:?}");
    assert!(expired >= 10, "{expired} {s:?}");

    STATS.with(|s| s.set(Stats::default()));
    let strategy = class_replays();
    let mut expired = 0;
    for _ in 0..400 {
        let (keys, lives, steps) = strategy.new_tree(&mut runner).unwrap().current();
        expired += replay(&class_lines(&keys), &lives, &steps, Mode::Function);
    }
    let s = STATS.with(Cell::get);
    let classes = [
        s.reserve_refused,
        s.reserve_spent,
        s.over_kept,
        s.class_full,
        s.line_full,
        s.evicted,
        s.passed,
        s.overtaken,
        s.unnamed,
        s.placed,
        s.poll_admitted,
        s.poll_gone,
    ];
    assert!(classes.iter().all(|n| *n >= 10), "{s:?}");
    assert!(expired >= 10, "{expired} {s:?}");
}

/// An arrival asking for more units than the max never fits: it is
/// refused a place (it would hold the line back until it lapsed), and
/// writes nothing.
#[test]
fn arrival_over_the_max_takes_no_place() {
    for mode in MODES {
        let mut c = Conn::new(mode, 1);
        assert!(c.take(0, conn_line(2, 2, W0, 1, WLIFE), T0).0);
        let writes = c.redis.writes();
        let (o, turn) = c.turn(0, waiter(2, 2, 3, W1, 0, 5000), T0 + 1000);
        assert_eq!((o, turn), (not_yet(0, 0, 0), Turn::Refused));
        assert_eq!((c.redis.writes(), c.places(0).len()), (writes, 0));
        // (one that fits the max waits)
        assert_eq!(c.turn(0, waiter(2, 2, 2, W1, 0, 5000), T0 + 2000).1, Turn::Waiting { ticket: 1, ahead: 0 });
    }
}

/// A line of classes as the stories take it: `max` units, a waiting line
/// of `queue` places, its classes `lanes` (highest first).
#[derive(Clone, Copy, Debug)]
struct Classes {
    max: u64,
    queue: u64,
    lanes: &'static [Lane],
}

impl Classes {
    /// A take of `cost` units of class `k` by worker `w` (its field of
    /// class `k`, `NAMES[w][k]`: "host:pid/k"), generation 1, its field
    /// living [`WLIFE`], that never waits.
    fn take(self, k: u8, w: usize, cost: u64) -> LineArg {
        self.of(k, conn_line(self.max, cost, NAMES[w][usize::from(k)], 1, WLIFE))
    }

    /// [`Classes::take`] of a request that may wait: arriving (`ticket`
    /// 0) or polling its place `ticket`, 5 s of its wait left.
    fn wait(self, k: u8, w: usize, cost: u64, ticket: u64) -> LineArg {
        self.of(k, waits(conn_line(self.max, cost, NAMES[w][usize::from(k)], 1, WLIFE), self.queue, ticket, 5000))
    }

    /// `line` on this line of classes, its request of class `k`.
    fn of(self, k: u8, line: LineArg) -> LineArg {
        let limit = line.limit.with_lanes(self.queue, self.lanes).unwrap();
        LineArg { limit, classes: Some(ClassArg { class: k, lanes: self.lanes }), ..line }
    }
}

/// Worker `w`'s field of class `k` (see [`NAMES`]).
fn field_of(w: usize, k: usize) -> &'static str {
    NAMES[w][k]
}

/// A give-back of `units` (generation 1) by worker `w`'s field of class
/// `k`.
fn give_back(c: &mut Conn, w: usize, k: usize, units: u64, now: u64) {
    c.put(field_of(w, k), WLIFE, &[(0, HoldOp::GiveBack { units, gen: 1 })], now, false);
}

/// Key `k`'s live places in the fake: ticket, and class.
fn places_of(c: &Conn, k: usize) -> Vec<(u64, Option<u64>)> {
    c.places(k).iter().map(|(t, p)| (*t, p.class)).collect()
}

/// Max 4, a critical class keeping 2 units from a standard one: standard
/// takes until only critical's unused reserve is left, then is refused
/// (checked or committed), while critical still gets in. What critical's
/// fields hold is its reserve used, not more units kept on top of it:
/// once critical holds 2, standard takes all the rest.
#[test]
fn reserves_keep_units_for_the_classes_above() {
    const LANES: &[Lane] = &[Lane { places: 2, reserve: 2, lend: false }, Lane { places: 2, reserve: 0, lend: false }];
    let line = Classes { max: 4, queue: 0, lanes: LANES };
    for mode in MODES {
        let mut c = Conn::new(mode, 1);
        assert_eq!(c.take(0, line.take(1, 0, 1), T0), (true, let_in(1)), "1 held, 2 kept");
        assert_eq!(c.take(0, line.take(1, 1, 1), T0 + 1000), (true, let_in(0)));
        assert_eq!(c.check(0, line.take(1, 2, 1), T0 + 2000), (false, not_yet(0, 0, 0)), "only the reserve left");
        assert_eq!(c.take(0, line.take(1, 2, 1), T0 + 2000), (false, not_yet(0, 0, 0)));
        assert_eq!(c.field(0, field_of(2, 1)), None, "refused: nothing written");
        // Critical: nothing above it keeps units.
        assert_eq!(c.take(0, line.take(0, 2, 2), T0 + 3000), (true, let_in(0)));
        assert_eq!(
            c.field(0, field_of(2, 0)),
            Some(Field { count: 2, gen: 1, deadline_ms: T0 / 1000 + 3 + WLIFE, set: false })
        );
        // Critical down to 1: 1 of its reserve unused, kept from standard.
        give_back(&mut c, 2, 0, 1, T0 + 4000);
        assert_eq!(c.take(0, line.take(1, 2, 1), T0 + 5000), (false, not_yet(0, 0, 0)));
        assert_eq!(c.take(0, line.take(0, 1, 1), T0 + 6000), (true, let_in(0)), "critical takes its own");
        // Standard gives back its 2: critical holds 2 (its reserve, used
        // up), standard takes the other 2.
        give_back(&mut c, 0, 1, 1, T0 + 7000);
        give_back(&mut c, 1, 1, 1, T0 + 7000);
        assert_eq!(c.take(0, line.take(1, 2, 2), T0 + 8000), (true, let_in(0)));
        let counts: Vec<(String, u64)> = c.fields(0).into_iter().map(|(w, f)| (w, f.count)).collect();
        let want = [(field_of(1, 0), 1), (field_of(2, 0), 1), (field_of(2, 1), 2)];
        assert_eq!(counts, want.map(|(w, n)| (w.to_owned(), n)));
    }
}

/// Three classes, each of the two above keeping a unit: a class's reserve
/// is kept from the classes below it only, never from itself or a class
/// above it; a middle class holding its unit uses its reserve up.
#[test]
fn reserves_count_for_the_classes_below_only() {
    const LANES: &[Lane] = &[
        Lane { places: 0, reserve: 1, lend: false },
        Lane { places: 0, reserve: 1, lend: false },
        Lane { places: 0, reserve: 0, lend: false },
    ];
    let line = Classes { max: 3, queue: 0, lanes: LANES };
    for mode in MODES {
        let mut c = Conn::new(mode, 1);
        assert_eq!(c.take(0, line.take(2, 0, 1), T0), (true, let_in(0)), "1 held, 2 kept");
        assert_eq!(c.take(0, line.take(2, 1, 1), T0 + 1000), (false, not_yet(0, 0, 0)));
        assert_eq!(c.take(0, line.take(1, 1, 1), T0 + 2000), (true, let_in(0)), "1 held, class 0's 1 kept");
        // (class 1 holds its reserve: class 2 still finds class 0's kept)
        assert_eq!(c.take(0, line.take(1, 2, 1), T0 + 3000), (false, not_yet(0, 0, 0)));
        assert_eq!(c.take(0, line.take(2, 2, 1), T0 + 3000), (false, not_yet(0, 0, 0)));
        assert_eq!(c.take(0, line.take(0, 2, 1), T0 + 4000), (true, let_in(0)));
        assert_eq!(c.fields(0).len(), 3);
        // Class 1 gives back: its unit kept again from class 2, not from class 0.
        give_back(&mut c, 1, 1, 1, T0 + 5000);
        assert_eq!(c.take(0, line.take(2, 1, 1), T0 + 6000), (false, not_yet(0, 0, 0)));
        assert_eq!(c.take(0, line.take(0, 1, 1), T0 + 7000), (true, let_in(0)));
    }
}

/// A waiter of a lower class waits behind a higher class's waiter even if
/// it came first; a higher-class arrival waits ahead of the earlier places
/// of the classes below (its `ahead` counts only the places of its class
/// and above), and one of a lower class behind every place of the classes
/// above. Units freed go to the higher class first.
#[test]
fn classes_wait_in_order() {
    const LANES: &[Lane] = &[Lane { places: 3, reserve: 0, lend: false }, Lane { places: 3, reserve: 0, lend: false }];
    let line = Classes { max: 1, queue: 6, lanes: LANES };
    for mode in MODES {
        let mut c = Conn::new(mode, 1);
        let ms = T0 / 1000;
        assert!(c.take(0, line.take(1, 0, 1), T0).0);
        // Standard first: tickets 1, 2.
        assert_eq!(
            c.turn(0, line.wait(1, 1, 1, 0), T0 + 1000),
            (not_yet(0, 1, 0), Turn::Waiting { ticket: 1, ahead: 0 })
        );
        assert_eq!(c.place(0, 1), Some(Place { cost: 1, deadline_ms: ms + 1 + 6000, class: Some(1) }));
        assert_eq!(c.turn(0, line.wait(1, 2, 1, 0), T0 + 2000).1, Turn::Waiting { ticket: 2, ahead: 1 });
        // Critical after them: ahead of them.
        assert_eq!(
            c.turn(0, line.wait(0, 1, 1, 0), T0 + 3000),
            (not_yet(0, 3, 0), Turn::Waiting { ticket: 3, ahead: 0 })
        );
        assert_eq!(c.place(0, 3).map(|p| p.class), Some(Some(0)));
        assert_eq!(c.turn(0, line.wait(0, 2, 1, 0), T0 + 4000).1, Turn::Waiting { ticket: 4, ahead: 1 });
        // A standard arrival: behind all four.
        assert_eq!(c.turn(0, line.wait(1, 0, 1, 0), T0 + 5000).1, Turn::Waiting { ticket: 5, ahead: 4 });
        assert_eq!(c.stored(0).next_ticket, 6);
        // A unit free: standard's first waits behind critical's two.
        give_back(&mut c, 0, 1, 1, T0 + 6000);
        assert_eq!(
            c.turn(0, line.wait(1, 1, 1, 1), T0 + 7000),
            (not_yet(0, 1, 2), Turn::Waiting { ticket: 1, ahead: 2 })
        );
        assert_eq!(
            c.turn(0, line.wait(0, 2, 1, 4), T0 + 7000),
            (not_yet(0, 4, 1), Turn::Waiting { ticket: 4, ahead: 1 })
        );
        assert_eq!(c.turn(0, line.wait(0, 1, 1, 3), T0 + 8000), (let_in(0), Turn::Admitted));
        assert_eq!(c.field(0, field_of(1, 0)).map(|f| f.count), Some(1));
        assert_eq!(places_of(&c, 0), [(1, Some(1)), (2, Some(1)), (4, Some(0)), (5, Some(1))]);
        // Freed again: critical's ticket 4 first, then standard in order.
        give_back(&mut c, 1, 0, 1, T0 + 9000);
        assert_eq!(c.turn(0, line.wait(1, 1, 1, 1), T0 + 10_000).1, Turn::Waiting { ticket: 1, ahead: 1 });
        assert_eq!(c.turn(0, line.wait(0, 2, 1, 4), T0 + 10_000), (let_in(0), Turn::Admitted));
        give_back(&mut c, 2, 0, 1, T0 + 11_000);
        assert_eq!(
            c.turn(0, line.wait(1, 2, 1, 2), T0 + 12_000),
            (not_yet(0, 2, 1), Turn::Waiting { ticket: 2, ahead: 1 })
        );
        assert_eq!(c.turn(0, line.wait(1, 1, 1, 1), T0 + 12_000), (let_in(0), Turn::Admitted));
        assert_eq!(places_of(&c, 0), [(2, Some(1)), (5, Some(1))]);
    }
}

/// Each class has its own places: a class whose places are all taken is
/// refused a place (nothing written) while another class still gets one,
/// and the line its last; a class of 0 places never waits (let in if it
/// fits, else refused), and one whose place is given up gets it back.
#[test]
fn places_per_class() {
    const LANES: &[Lane] = &[
        Lane { places: 1, reserve: 0, lend: false },
        Lane { places: 0, reserve: 0, lend: false },
        Lane { places: 2, reserve: 0, lend: false },
    ];
    let line = Classes { max: 1, queue: 4, lanes: LANES };
    for mode in MODES {
        let mut c = Conn::new(mode, 1);
        assert!(c.take(0, line.take(2, 0, 1), T0).0);
        assert_eq!(c.turn(0, line.wait(0, 1, 1, 0), T0 + 1000).1, Turn::Waiting { ticket: 1, ahead: 0 });
        let writes = c.redis.writes();
        assert_eq!(
            c.turn(0, line.wait(0, 2, 1, 0), T0 + 2000),
            (not_yet(0, 0, 0), Turn::Refused),
            "class 0's place taken"
        );
        assert_eq!(c.turn(0, line.wait(1, 2, 1, 0), T0 + 2000), (not_yet(0, 0, 0), Turn::Refused), "class 1 has none");
        assert_eq!(c.redis.writes(), writes, "refused: nothing written");
        assert_eq!(c.turn(0, line.wait(2, 1, 1, 0), T0 + 3000).1, Turn::Waiting { ticket: 2, ahead: 1 });
        assert_eq!(c.turn(0, line.wait(2, 2, 1, 0), T0 + 4000).1, Turn::Waiting { ticket: 3, ahead: 2 });
        let writes = c.redis.writes();
        assert_eq!(
            c.turn(0, line.wait(2, 0, 1, 0), T0 + 5000),
            (not_yet(0, 0, 0), Turn::Refused),
            "class 2's two taken"
        );
        assert_eq!(c.redis.writes(), writes);
        assert_eq!(places_of(&c, 0), [(1, Some(0)), (2, Some(2)), (3, Some(2))], "one of the line's 4 left");
        // Class 0's waiter leaves, the unit is freed: class 1 (no places)
        // is let in, nothing of its class or above ahead.
        c.leave(field_of(1, 0), 0, 1, T0 + 6000);
        give_back(&mut c, 0, 2, 1, T0 + 6000);
        assert_eq!(c.turn(0, line.wait(1, 2, 1, 0), T0 + 7000), (let_in(0), Turn::Admitted));
        // (full again: class 1 refused, class 0 takes its place back)
        assert_eq!(c.turn(0, line.wait(1, 0, 1, 0), T0 + 8000), (not_yet(0, 0, 0), Turn::Refused));
        assert_eq!(
            c.turn(0, line.wait(0, 2, 1, 0), T0 + 8000),
            (not_yet(0, 4, 0), Turn::Waiting { ticket: 4, ahead: 0 })
        );
    }
}

/// The line's places all taken, an arrival of a higher class takes the
/// place of the newest waiter of the lowest class that has one (as many
/// as it takes: a line whose queue a reload cut), whose next poll is
/// refused, its place gone; an arrival of the lowest class, or of a class
/// with no lower place to take, is refused, nothing written.
#[test]
fn higher_class_takes_the_place_of_the_lowest() {
    const LANES: &[Lane] = &[
        Lane { places: 2, reserve: 0, lend: false },
        Lane { places: 2, reserve: 0, lend: false },
        Lane { places: 2, reserve: 0, lend: false },
    ];
    let line = Classes { max: 1, queue: 3, lanes: LANES };
    for mode in MODES {
        let mut c = Conn::new(mode, 2);
        assert!(c.take(0, line.take(2, 0, 1), T0).0);
        assert_eq!(c.turn(0, line.wait(2, 1, 1, 0), T0 + 1000).1, Turn::Waiting { ticket: 1, ahead: 0 });
        assert_eq!(c.turn(0, line.wait(1, 1, 1, 0), T0 + 2000).1, Turn::Waiting { ticket: 2, ahead: 0 });
        assert_eq!(c.turn(0, line.wait(2, 2, 1, 0), T0 + 3000).1, Turn::Waiting { ticket: 3, ahead: 2 });
        // Full: the lowest class refused.
        let writes = c.redis.writes();
        assert_eq!(c.turn(0, line.wait(2, 0, 1, 0), T0 + 4000), (not_yet(0, 0, 0), Turn::Refused));
        assert_eq!(c.redis.writes(), writes);
        // Class 1 takes class 2's newest, 3.
        assert_eq!(
            c.turn(0, line.wait(1, 2, 1, 0), T0 + 5000),
            (not_yet(0, 4, 1), Turn::Waiting { ticket: 4, ahead: 1 })
        );
        assert_eq!(places_of(&c, 0), [(1, Some(2)), (2, Some(1)), (4, Some(1))]);
        let writes = c.redis.writes();
        assert_eq!(c.turn(0, line.wait(2, 2, 1, 3), T0 + 6000), (not_yet(0, 0, 0), Turn::Refused), "its place gone");
        assert_eq!(c.redis.writes(), writes);
        // Class 0 takes class 2's last, 1, then class 1's newest, 4.
        assert_eq!(c.turn(0, line.wait(0, 0, 1, 0), T0 + 7000).1, Turn::Waiting { ticket: 5, ahead: 0 });
        assert_eq!(c.turn(0, line.wait(0, 1, 1, 0), T0 + 8000).1, Turn::Waiting { ticket: 6, ahead: 1 });
        assert_eq!(places_of(&c, 0), [(2, Some(1)), (5, Some(0)), (6, Some(0))]);
        // (class 0's places all taken; class 1 finds no lower place)
        let writes = c.redis.writes();
        assert_eq!(c.turn(0, line.wait(0, 2, 1, 0), T0 + 9000), (not_yet(0, 0, 0), Turn::Refused));
        assert_eq!(c.turn(0, line.wait(1, 0, 1, 0), T0 + 9000), (not_yet(0, 0, 0), Turn::Refused));
        assert_eq!(c.redis.writes(), writes);
        for (k, ticket) in [(2, 1), (1, 4)] {
            let (o, turn) = c.turn(0, line.wait(k, 1, 1, ticket), T0 + 10_000);
            assert_eq!((o, turn), (not_yet(0, 0, 0), Turn::Refused), "ticket {ticket}");
        }
        // (a check-only arrival takes nothing)
        assert_eq!(c.check_turn(0, line.wait(0, 2, 1, 0), T0 + 10_000).1, Turn::Refused);
        assert_eq!(c.stored(0).next_ticket, 7);

        // Key 1: two of class 2, then one of class 1; the queue cut to 2, a
        // class 0 arrival takes two places: the lowest class's, though
        // class 1's is newer.
        assert!(c.take(1, line.take(2, 0, 1), T0).0);
        for (k, w, ticket, ahead) in [(2, 0, 1, 0), (2, 1, 2, 1), (1, 2, 3, 0)] {
            assert_eq!(c.turn(1, line.wait(k, w, 1, 0), T0 + 1000).1, Turn::Waiting { ticket, ahead });
        }
        let cut = Classes { queue: 2, ..line };
        let writes = c.redis.writes();
        assert_eq!(c.turn(1, cut.wait(2, 0, 1, 0), T0 + 2000), (not_yet(0, 0, 0), Turn::Refused));
        assert_eq!(c.redis.writes(), writes);
        assert_eq!(c.turn(1, cut.wait(0, 0, 1, 0), T0 + 2000).1, Turn::Waiting { ticket: 4, ahead: 0 });
        assert_eq!(places_of(&c, 1), [(3, Some(1)), (4, Some(0))]);
    }
}

/// An arrival whose units are over what the reserves of the classes
/// above leave of the max is refused a place (it could only get in by
/// taking reserved units), whatever those classes hold; within it, it
/// waits. A class with nothing above it may wait for the whole max.
#[test]
fn arrival_over_what_the_reserves_leave_takes_no_place() {
    const LANES: &[Lane] = &[Lane { places: 1, reserve: 2, lend: false }, Lane { places: 2, reserve: 0, lend: false }];
    let line = Classes { max: 3, queue: 3, lanes: LANES };
    for mode in MODES {
        let mut c = Conn::new(mode, 1);
        assert_eq!(c.turn(0, line.wait(1, 0, 2, 0), T0), (not_yet(1, 0, 0), Turn::Refused), "2 over 3 - 2");
        assert_eq!(c.redis.kind(&c.keys[0]), None, "nothing written");
        assert_eq!(c.turn(0, line.wait(1, 0, 1, 0), T0 + 1000), (let_in(0), Turn::Admitted));
        assert_eq!(
            c.turn(0, line.wait(1, 1, 1, 0), T0 + 2000),
            (not_yet(0, 1, 0), Turn::Waiting { ticket: 1, ahead: 0 })
        );
        // Critical, for the whole max: waits.
        assert_eq!(
            c.turn(0, line.wait(0, 2, 3, 0), T0 + 3000),
            (not_yet(2, 2, 0), Turn::Waiting { ticket: 2, ahead: 0 })
        );
        // Critical holding its reserve (a heartbeat): standard's 2 still
        // refused a place.
        c.put(field_of(1, 0), WLIFE, &[(0, HoldOp::Set { units: 2, gen: 1 })], T0 + 4000, false);
        let writes = c.redis.writes();
        assert_eq!(c.turn(0, line.wait(1, 2, 2, 0), T0 + 5000), (not_yet(0, 0, 0), Turn::Refused));
        assert_eq!(c.redis.writes(), writes);
        assert_eq!(places_of(&c, 0), [(1, Some(1)), (2, Some(0))]);
    }
}

/// On a line of classes, a field that names no class (written by the line
/// before `classes=`: the worker's name alone) or one beyond the line's
/// ("/9") is of the lowest class: it uses no reserve above; a place
/// written without a class (a take of the line before `classes=`) is of
/// the lowest class too: never ahead of a higher class, behind it, and
/// the first a higher class takes.
#[test]
fn fields_and_places_that_name_no_class_are_of_the_lowest() {
    const LANES: &[Lane] = &[
        Lane { places: 2, reserve: 2, lend: false },
        Lane { places: 2, reserve: 0, lend: false },
        Lane { places: 2, reserve: 0, lend: false },
    ];
    let line = Classes { max: 4, queue: 3, lanes: LANES };
    for mode in MODES {
        let mut c = Conn::new(mode, 1);
        c.put(W0, WLIFE, &[(0, HoldOp::Set { units: 1, gen: 1 })], T0, false);
        c.put(field_of(1, 4), WLIFE, &[(0, HoldOp::Set { units: 1, gen: 1 })], T0, false);
        // 2 held, class 0's 2 unused: no room below class 0.
        assert_eq!(c.take(0, line.take(2, 2, 1), T0 + 1000), (false, not_yet(0, 0, 0)));
        assert_eq!(c.take(0, line.take(1, 2, 1), T0 + 1000), (false, not_yet(0, 0, 0)));
        assert_eq!(c.take(0, line.take(0, 2, 2), T0 + 2000), (true, let_in(0)));
        // Full: a class 2 waiter, then one of the line before classes (all
        // places ahead of it), then class 0's (only its own class ahead).
        assert_eq!(c.turn(0, line.wait(2, 2, 1, 0), T0 + 3000).1, Turn::Waiting { ticket: 1, ahead: 0 });
        let plain = waiter(4, 3, 1, W1, 0, 5000);
        assert_eq!(c.turn(0, plain, T0 + 4000).1, Turn::Waiting { ticket: 2, ahead: 1 });
        assert_eq!(c.place(0, 2).map(|p| p.class), Some(None), "written without a class");
        assert_eq!(c.turn(0, line.wait(0, 0, 1, 0), T0 + 5000).1, Turn::Waiting { ticket: 3, ahead: 0 });
        // (a class 2 poll of the first: class 0's ahead, not the later
        // place of no class; a class 1 arrival takes the newest of the
        // lowest: the place of no class)
        assert_eq!(c.turn(0, line.wait(2, 2, 1, 1), T0 + 6000).1, Turn::Waiting { ticket: 1, ahead: 1 });
        assert_eq!(c.turn(0, line.wait(1, 1, 1, 0), T0 + 7000).1, Turn::Waiting { ticket: 4, ahead: 1 });
        assert_eq!(places_of(&c, 0), [(1, Some(2)), (3, Some(0)), (4, Some(1))]);
        assert_eq!(c.turn(0, waiter(4, 3, 1, W1, 2, 5000), T0 + 8000).1, Turn::Refused, "its place gone");
    }
}

/// A line of fewer classes reads the places of a class beyond its own
/// (a line of more classes wrote them, before a reload) as of its lowest.
#[test]
fn places_of_a_class_beyond_the_line_are_of_its_lowest() {
    const THREE: &[Lane] = &[
        Lane { places: 2, reserve: 0, lend: false },
        Lane { places: 2, reserve: 0, lend: false },
        Lane { places: 2, reserve: 0, lend: false },
    ];
    const TWO: &[Lane] = &[Lane { places: 2, reserve: 0, lend: false }, Lane { places: 2, reserve: 0, lend: false }];
    let (three, two) = (Classes { max: 1, queue: 3, lanes: THREE }, Classes { max: 1, queue: 3, lanes: TWO });
    for mode in MODES {
        let mut c = Conn::new(mode, 1);
        assert!(c.take(0, three.take(0, 0, 1), T0).0);
        assert_eq!(c.turn(0, three.wait(2, 1, 1, 0), T0 + 1000).1, Turn::Waiting { ticket: 1, ahead: 0 });
        assert_eq!(c.place(0, 1).map(|p| p.class), Some(Some(2)));
        assert_eq!(c.turn(0, two.wait(0, 2, 1, 0), T0 + 2000).1, Turn::Waiting { ticket: 2, ahead: 0 });
        assert_eq!(c.turn(0, two.wait(1, 2, 1, 0), T0 + 3000).1, Turn::Waiting { ticket: 3, ahead: 2 });
        // (full: class 0 takes the newest of class 1, the one beyond among them)
        assert_eq!(c.turn(0, two.wait(0, 0, 1, 0), T0 + 4000).1, Turn::Waiting { ticket: 4, ahead: 1 });
        assert_eq!(places_of(&c, 0), [(1, Some(2)), (2, Some(0)), (4, Some(0))]);
        assert_eq!(c.turn(0, two.wait(0, 1, 1, 0), T0 + 5000).1, Turn::Refused, "class 0's places taken");
    }
}

/// An arrival of a higher class named by a memo (mode "2"), sent twice,
/// takes one place and the place of a lower class once: the copy answers
/// the first reply and writes nothing.
#[test]
fn memo_arrival_takes_a_lower_place_once() {
    const LANES: &[Lane] = &[Lane { places: 1, reserve: 0, lend: false }, Lane { places: 1, reserve: 0, lend: false }];
    let line = Classes { max: 1, queue: 1, lanes: LANES };
    for mode in MODES {
        let mut c = Conn::new(mode, 1);
        c.max_life = WLIFE;
        assert!(c.take(0, line.take(1, 0, 1), T0).0);
        assert_eq!(c.turn(0, line.wait(1, 1, 1, 0), T0).1, Turn::Waiting { ticket: 1, ahead: 0 });
        let keys = c.keys.clone();
        let t = T0 + 1000;
        let arrival = line.wait(0, 2, 1, 0);
        let memo = memo_key(&c.keys, (9, 1));
        let raw = c.redis.call_memo(&keys, &[&[arrival][..]], t, false, None, &memo);
        let h = arrival.holder.unwrap();
        let (o, _, turn) =
            c.model[0].take_waiting(&arrival.limit, 1, &h, arrival.wait, arrival.classes, t / 1000, true);
        assert_eq!(turn, Turn::Waiting { ticket: 2, ahead: 0 });
        assert_eq!(parse_script_reply(&raw, &[&[arrival][..]]), (t, Some(vec![(false, vec![o])])));
        c.same(t);
        assert_eq!(places_of(&c, 0), [(2, Some(0))]);
        let before = c.redis.before(&memo);
        assert_eq!(c.redis.call_memo(&keys, &[&[arrival][..]], t + 1000, false, None, &memo), raw, "the copy");
        c.redis.unchanged_since(&before, 0, "a copy of an arrival that took a place");
        c.same(t + 1000);
        assert_eq!(c.stored(0).next_ticket, 3);
    }
}

/// A line of classes is written " class n" and n × " places reserve"
/// after the waiting line's words; one whose classes do not parse (fewer
/// than 2 or more than 16, a class not among them, a class's words
/// missing, extra or not numbers below 2^52) fails closed, writing
/// nothing.
#[test]
fn malformed_class_lines_fail_closed() {
    const LANES: &[Lane] = &[Lane { places: 2, reserve: 1, lend: false }, Lane { places: 3, reserve: 0, lend: false }];
    let line = Classes { max: 3, queue: 5, lanes: LANES };
    let mut good = String::new();
    write_spec(&mut good, &line.wait(1, 0, 1, 0));
    assert_eq!(good, "concurrent 3 1000000 3 1 5 64 web1:100/1 1 10000 0 5000 1 2 2 1 3 0");
    // (a take that never waits: no queue, its classes all the same)
    let mut never = String::new();
    write_spec(&mut never, &line.take(0, 0, 1));
    assert_eq!(never, "concurrent 3 1000000 3 1 0 64 web1:100/0 1 10000 0 0 0 2 2 1 3 0");
    let head = "concurrent 3 1000000 3 1 5 64 web1:100/1 1 10000 0 5000";
    let sixteen: String = (0..16).map(|_| " 1 0").collect();
    let bad = [
        " 1".to_owned(),
        " 1 2".to_owned(),
        " 1 2 2 1".to_owned(),
        " 1 2 2 1 3".to_owned(),
        " 1 2 2 1 3 0 7".to_owned(),
        " 1 2 2 1 3 0 ".to_owned(),
        " 1 2 2 1  3 0".to_owned(),
        " 1  2 2 1 3 0".to_owned(),
        " 2 2 2 1 3 0".to_owned(),
        " 0 1 2 1".to_owned(),
        " 0 0".to_owned(),
        " 1 2 2 1 3 x".to_owned(),
        " 1 2 2 1 3 -1".to_owned(),
        " 1 2 2 1 3 1.5".to_owned(),
        " 1 2 2 1 4503599627370496 0".to_owned(),
        " 1 2 2 4503599627370496 3 0".to_owned(),
        " -1 2 2 1 3 0".to_owned(),
        format!(" 0 17{sixteen} 1 0"),
    ];
    for mode in MODES {
        let r = Redis::with(mode);
        let key = keys(1);
        r.set_now(T0);
        let args = |line: &str| vec!["1".to_owned(), T0.to_string(), String::new(), line.to_owned()];
        for tail in &bad {
            let line = format!("{head}{tail}");
            assert_eq!(r.eval(&key, &args(&line)), [T0 as i64, 0, 0, -1, 0, 0], "{line:?}");
            assert_eq!((r.writes(), r.snapshot()), (0, String::new()), "{line:?}");
        }
        // (16 classes parse: the lowest's take let in; the worker's field
        // "/1" of class 1 on that line, of the good line's class 1 too)
        let line = format!("{head} 15 16{sixteen}");
        assert_eq!(r.eval(&key, &args(&line)), [T0 as i64, 2, 0, -2, 0, 0], "{line:?}");
        assert_eq!(r.eval(&key, &args(&good)), [T0 as i64, 0, 0, -2, 0, 0], "the good line");
    }
}
