//! The lease call (`NAME_lease`) held to rl-core's lease model
//! (`rl_core::lease::Leasing`): nodes sync (give back what their lease on
//! each key left, take a new one), spend their leases, requests decided on
//! the shared state at once, calls sent again under the same name; the
//! script and the model grant the same units for the same life, leave
//! states that decide every request alike, and a copy of a call that ran
//! answers what it did and changes nothing.

use proptest::prelude::*;
use proptest::sample::select;
use proptest::test_runner::FileFailurePersistence;
use rl_core::lease::{Lease, Leasing};
use rl_core::limit::{Algorithm, Limit};
use rl_core::parse::Rate;
use rl_core::redis::{
    lease_args, parse_lease_reply, parse_reply, script_args, Call, LeaseArg, LeaseGrant, LineArg, Lives, ScriptReply,
    Shape,
};

use crate::fixtures::{keys, T0};
use crate::harness::{memo_key, Mode, Redis};

/// A node's lease on a key: the model's, and the words the script's grant
/// returned (to give it back with).
#[derive(Clone, Copy, Debug)]
struct Held {
    lease: Lease,
    words: (u64, u64),
}

/// Both sides: the script on the fake Redis, and the model's states.
struct Both {
    redis: Redis,
    keys: Vec<String>,
    leasing: Vec<Leasing>,
    states: Vec<Vec<u64>>,
    calls: u64,
}

impl Both {
    fn new(leasing: Vec<Leasing>) -> Both {
        Both::with(Mode::Function, leasing)
    }

    fn with(mode: Mode, leasing: Vec<Leasing>) -> Both {
        let states = leasing.iter().map(|l| vec![0u64; l.line().state_words()]).collect();
        Both { redis: Redis::with(mode), keys: keys(leasing.len()), leasing, states, calls: 0 }
    }

    /// One lease call at `now` for every key (`want` units each, giving
    /// back `held`); the raw reply, named `id`.
    fn call(&self, now: u64, life: Lives, wants: &[u64], held: &[Option<Held>], id: (u64, u64)) -> Vec<i64> {
        let args: Vec<LeaseArg> = (0..self.keys.len())
            .map(|i| {
                let (back, words) = held[i].map_or((0, (0, 0)), |h| (h.lease.left(), h.words));
                LeaseArg { line: *self.leasing[i].line(), want: wants[i], back, words }
            })
            .collect();
        let argv = lease_args(&args, Some(now), life);
        let mut keys = self.keys.clone();
        keys.push(memo_key(&self.keys, id));
        self.redis.set_now(now);
        self.redis.eval_lease(&keys, &argv)
    }

    /// A node's sync at `now`: the same call on both sides, compared; the
    /// node's new leases.
    fn sync(&mut self, now: u64, life: Lives, wants: &[u64], held: &[Option<Held>]) -> Vec<Held> {
        self.calls += 1;
        let id = (7, self.calls);
        let raw = self.call(now, life, wants, held, id);
        let (at, grants) = parse_lease_reply(&raw, self.keys.len()).expect("a well-formed lease reply");
        assert_eq!(at, now);
        let mut out = Vec::new();
        for (i, g) in grants.iter().enumerate() {
            let (leasing, state) = (&self.leasing[i], &mut self.states[i]);
            if let Some(h) = held[i] {
                leasing.give_back(state, &h.lease, now);
            }
            let lease = leasing.grant(state, now, wants[i]);
            let left = leasing.line().check(state, now, 0);
            let want = LeaseGrant {
                units: lease.granted(),
                words: g.words,
                life_us: if lease.granted() > 0 { lease.until() - now } else { 0 },
                remaining: left.remaining,
                reset_us: left.reset_us,
                taken_back: g.taken_back,
                at_us: now,
            };
            assert_eq!(*g, want, "key {i} at {now}: the script's grant, the model's");
            out.push(Held { lease, words: g.words });
        }
        // A copy of the call, sent again: what it answered, nothing changed.
        let before = self.redis.snapshot();
        assert_eq!(self.call(now + 1, life, wants, held, id), raw, "a copy of a lease call at {now}");
        assert_eq!(self.redis.snapshot(), before, "a copy of a lease call changed the store");
        out
    }

    /// Every key's view at `now` (a check of 1 unit), on both sides.
    fn same_views(&self, now: u64) {
        for (i, l) in self.leasing.iter().enumerate() {
            let (_, got) = self.redis.run(&self.keys[i..=i], &[(*l.line(), 1)], now, false, false);
            assert_eq!(got[0], l.line().check(&self.states[i], now, 1), "key {i} at {now}");
        }
    }

    /// A request of `cost` on key `i` at `now` that asks, in its call, for a
    /// lease of `want` units living `life` (as a node sends a request its
    /// leases do not hold): the request decided, then the grant made, on
    /// both sides alike. The node's new lease.
    fn cold(&mut self, i: usize, now: u64, cost: u64, want: u64, life: u64) -> Held {
        let line = *self.leasing[i].line();
        let request = LineArg::from((line, cost));
        let grant = LineArg { cost: want, lease_life: life, ..request };
        self.calls += 1;
        let keys = [self.keys[i].clone(), self.keys[i].clone(), memo_key(&self.keys[i..=i], (8, self.calls))];
        let call = |now| Call { commit: true, now_us: Some(now), deadline_us: None, memo: true };
        let args = script_args([&[request, grant][..]], call(now));
        self.redis.set_now(now);
        let raw = self.redis.eval(&keys, &args);
        let Some(ScriptReply::Done { requests, .. }) = parse_reply(&raw, &[AskedWith]) else {
            panic!("a malformed reply {raw:?}");
        };
        let (admitted, lines, at, grants) = &requests[0];
        let o = line.acquire(&mut self.states[i], now, cost);
        assert_eq!((*admitted, lines[0]), (o.admitted, o), "key {i} at {now}, cost {cost}: the request");
        let lease = self.leasing[i].grant(&mut self.states[i], now, want);
        let left = line.check(&self.states[i], now, 0);
        let g = grants[0].1;
        let expect = LeaseGrant {
            units: lease.granted(),
            words: g.words,
            life_us: if lease.granted() > 0 { lease.until() - now } else { 0 },
            remaining: left.remaining,
            reset_us: if lease.granted() > 0 { left.reset_us } else { 0 },
            taken_back: false,
            at_us: *at,
        };
        assert_eq!((grants.len(), grants[0].0, g), (1, 1, expect), "key {i} at {now}: the lease asked with it");
        if *admitted || g.units > 0 {
            // A copy of a call that charged something, sent again: what it answered, nothing
            // changed. (One that charged nothing left no memo: run again, it is still applied
            // once.)
            let before = self.redis.snapshot();
            let again = script_args([&[request, grant][..]], call(now + 1));
            self.redis.set_now(now + 1);
            assert_eq!(self.redis.eval(&keys, &again), raw, "a copy of a request and its lease at {now}");
            assert_eq!(self.redis.snapshot(), before, "a copy of a request and its lease changed the store");
        }
        Held { lease, words: g.words }
    }

    /// A request on key `i` decided on the shared state at `now`.
    fn exact(&mut self, i: usize, now: u64, cost: u64) {
        let line = *self.leasing[i].line();
        let (_, got) = self.redis.run(&self.keys[i..=i], &[(line, cost)], now, true, false);
        assert_eq!(got[0], line.acquire(&mut self.states[i], now, cost), "key {i} at {now}, cost {cost}");
    }
}

/// A request of one line, then a lease asked with it.
struct AskedWith;

impl Shape for AskedWith {
    fn lines(&self) -> usize {
        2
    }
    fn dry_run(&self, _: usize) -> bool {
        false
    }
    fn lease(&self, i: usize) -> bool {
        i == 1
    }
}

#[derive(Clone, Copy, Debug)]
enum Step {
    Sync { node: usize, wants: [u64; 3] },
    Cold { node: usize, key: usize, cost: u64, want: u64 },
    Spend { node: usize, key: usize, cost: u64 },
    Exact { key: usize, cost: u64 },
    Die { node: usize },
}

fn steps() -> impl Strategy<Value = Vec<(u64, Step)>> {
    let step = prop_oneof![
        3 => (0usize..3, [0u64..=8, 0u64..=8, 0u64..=8]).prop_map(|(node, wants)| Step::Sync { node, wants }),
        4 => (0usize..3, 0usize..3, 1u64..=3).prop_map(|(node, key, cost)| Step::Spend { node, key, cost }),
        2 => (0usize..3, 1u64..=3).prop_map(|(key, cost)| Step::Exact { key, cost }),
        2 => (0usize..3, 0usize..3, 1u64..=3, 1u64..=8).prop_map(|(node, key, cost, want)| Step::Cold { node, key, cost, want }),
        1 => (0usize..3).prop_map(|node| Step::Die { node }),
    ];
    prop::collection::vec((0u64..1_500_000, step), 1..40)
}

/// A line of values that can be leased, a quarter of them [`Limit::varying`]
/// (a plan's: each key leased under its own values, its state tagged with
/// their scale).
fn leased() -> impl Strategy<Value = Limit> {
    let algs = [Algorithm::Fixed, Algorithm::Sliding, Algorithm::TokenBucket, Algorithm::LeakyBucket, Algorithm::Gcra];
    let period = prop_oneof![Just(1_000_000u64), 1_000u64..=3_000_000];
    (select(algs.to_vec()), 1u64..=10, period, 1u64..=20, prop::bool::weighted(0.25)).prop_map(
        |(a, count, period_us, burst, varying)| {
            let l = Limit::new(a, Rate { count, period_us }, burst).unwrap();
            match varying {
                true => l.varying(),
                false => l,
            }
        },
    )
}

/// How `l` is leased for `life`: a varying line under its own values, as
/// nginx leases a key of a plan.
fn leasing_of(l: &Limit, life: u64) -> Option<Leasing> {
    Leasing::new(*l, life).and_then(|t| t.with_values(l)).ok()
}

proptest! {
    // (failures persist next to this file, as props.rs's do)
    #![proptest_config(ProptestConfig {
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("proptest-regressions"))),
        ..ProptestConfig::with_cases(300)
    })]

    /// 1 to 3 keys, 3 nodes, any order of syncs, spends, exact requests and
    /// deaths: the script grants what the model grants, and both states
    /// decide alike.
    #[test]
    fn lease_calls_are_the_model(
        limits in prop::collection::vec(leased(), 1..=3),
        life_permille in 1u64..=400,
        window_permille in 1u64..=3000,
        steps in steps(),
    ) {
        // (the call's lives: parts of the first line's window, a bucket's
        // shorter, a window line's up to three windows)
        let part = |p: u64| (u128::from(limits[0].window_us()) * u128::from(p) / 1000).max(1) as u64;
        let life = Lives { bucket_us: part(life_permille), window_us: part(window_permille) };
        let leasing: Vec<Leasing> = limits.iter().filter_map(|l| leasing_of(l, life_of(l, life))).collect();
        if leasing.is_empty() {
            return Ok(());
        }
        let n = leasing.len();
        let mut both = Both::new(leasing);
        let mut held: Vec<Vec<Option<Held>>> = vec![vec![None; n]; 3];
        let mut t = T0;
        for (dt, step) in steps {
            t += dt;
            match step {
                Step::Sync { node, wants } => {
                    let new = both.sync(t, life, &wants[..n], &held[node]);
                    held[node] = new.into_iter().map(Some).collect();
                }
                Step::Spend { node, key, cost } => {
                    if let Some(h) = held[node].get_mut(key % n).and_then(|h| h.as_mut()) {
                        h.lease.spend(t, cost);
                    }
                }
                Step::Exact { key, cost } => both.exact(key % n, t, cost),
                Step::Cold { node, key, cost, want } => {
                    let k = key % n;
                    let h = both.cold(k, t, cost, want, life_of(both.leasing[k].line(), life));
                    // (a lease the node held on the key before is lost: units wasted)
                    held[node][k] = Some(h);
                }
                Step::Die { node } => held[node] = vec![None; n],
            }
            both.same_views(t);
        }
    }
}

/// The life of `l`'s leases in a call of `lives`.
fn life_of(l: &Limit, lives: Lives) -> u64 {
    match l.algorithm() {
        Algorithm::Fixed | Algorithm::Sliding => lives.window_us,
        _ => lives.bucket_us,
    }
}

/// By hand, as a function and as a script: a `fixed` line of 10 a second;
/// a node takes 6, spends 2, gives back 4 and takes 8 in the same call: 8
/// granted, 2 left at once; its lease ends with the window.
#[test]
fn give_back_then_grant_by_hand() {
    for mode in [Mode::Function, Mode::Eval] {
        by_hand(mode);
    }
}

fn by_hand(mode: Mode) {
    let fixed = Limit::new(Algorithm::Fixed, Rate { count: 10, period_us: 1_000_000 }, 10).unwrap();
    let leasing = Leasing::new(fixed, 300_000).unwrap();
    let mut both = Both::with(mode, vec![leasing]);
    let lives = Lives { bucket_us: 150_000, window_us: 300_000 };
    let t = T0 + 900_000;
    let mut held = both.sync(t, lives, &[6], &[None]);
    assert_eq!((held[0].lease.granted(), held[0].lease.until()), (6, T0 + 1_000_000), "ends with the window");
    assert!(held[0].lease.spend(t + 10, 2));
    let again = both.sync(t + 20, lives, &[8], &[Some(held.remove(0))]);
    assert_eq!(again[0].lease.granted(), 8, "4 given back, 8 of the 10 less the 2 spent");
    assert_eq!(again[0].lease.until(), T0 + 1_000_000, "ends with the window");
    let raw = both.call(t + 30, lives, &[0], &[None], (7, 99));
    let (_, g) = parse_lease_reply(&raw, 1).unwrap();
    assert_eq!((g[0].units, g[0].remaining), (0, 0), "{g:?}");
    let early = both.sync(T0 + 1_100_000, lives, &[2], &[None]);
    assert_eq!(early[0].lease.until(), T0 + 1_400_000, "a window line's life (300 ms), before the window ends");
}
