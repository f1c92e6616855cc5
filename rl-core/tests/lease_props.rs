//! Property tests of leases (`rl_core::lease`) on a fake clock (integer
//! µs): several nodes take leases from one shared state (Redis', in the
//! fleet), spend them alone, give back what is left; some die holding a
//! lease, some give-backs or grants are lost on the way, some requests are
//! decided on the shared state at once (a key with no lease yet). Whatever
//! the interleaving:
//! - the bound: the units the nodes admitted, replayed in time order on a
//!   fresh state of the configured line, are all admitted there: the fleet
//!   never admits what the exact line would not;
//! - a grant is never more than asked for, nor than the line admits at
//!   once; a lease spends nothing after it ends, nor more than it holds;
//! - with one node that syncs before each request and gives back at once,
//!   leases admit what the lease line admits exactly (nothing is lost to
//!   leasing but the held-back refill).
//! - lines that cannot be leased are refused, with the reason.

use proptest::prelude::*;
use proptest::sample::select;
use rl_core::lease::{share, Demand, Horizon, Kept, Lease, LeaseError, Leasing, Local, Slot, SyncArg, MAX_UNITS};
use rl_core::limit::{Algorithm, Limit};
use rl_core::parse::Rate;
use rl_core::redis::LeaseGrant;

/// The algorithms a lease can take.
const LEASED: [Algorithm; 5] =
    [Algorithm::Fixed, Algorithm::Sliding, Algorithm::TokenBucket, Algorithm::LeakyBucket, Algorithm::Gcra];

/// What happens next, on node `node % nodes`, `gap` µs after the last step.
#[derive(Clone, Copy, Debug)]
enum Step {
    /// A request of `cost` on the node: spent from its lease if it has one
    /// that covers it, else decided on the shared state (`exact`: as a key
    /// with no lease is), else rejected.
    Request { cost: u64, exact: bool },
    /// The node's sync: gives back what its lease has left, takes a new one
    /// of up to `want`. `lost`: 1 = the give-back never arrived (the
    /// node's lease is gone, nothing refunded), 2 = the reply never came
    /// (given back and granted on the shared state, the node never learns
    /// of the new lease), 0 = neither.
    Sync { want: u64, lost: u8 },
    /// The node dies with its lease: nothing given back.
    Die,
}

fn steps(max: usize) -> impl Strategy<Value = Vec<(u8, u64, Step)>> {
    let step = prop_oneof![
        6 => (1u64..=3, any::<bool>()).prop_map(|(cost, exact)| Step::Request { cost, exact }),
        3 => (0u64..=12, prop_oneof![6 => Just(0u8), 1 => Just(1u8), 1 => Just(2u8)])
            .prop_map(|(want, lost)| Step::Sync { want, lost }),
        1 => Just(Step::Die),
    ];
    prop::collection::vec((any::<u8>(), any::<u64>(), step), 1..max)
}

/// Lines that can be leased, a quarter of them [`Limit::varying`] (a
/// plan's values, leased per key).
fn limits() -> impl Strategy<Value = Limit> {
    let period = prop_oneof![1u64..=40, 1_000u64..=2_000_000, Just(1_000_000u64)];
    (select(LEASED.to_vec()), 1u64..=12, period, 1u64..=40, prop::bool::weighted(0.25)).prop_map(
        |(a, count, p, b, varying)| {
            let l = Limit::new(a, Rate { count, period_us: p }, b).unwrap();
            match varying {
                true => l.varying(),
                false => l,
            }
        },
    )
}

/// How `limit` is leased for `life`: a varying line under its own values,
/// as nginx leases a key of a plan.
fn leasing_of(limit: Limit, life: u64) -> Result<Leasing, LeaseError> {
    Leasing::new(limit, life)?.with_values(&limit)
}

/// A lease life of `permille` of the line's window (at least 1 µs).
fn life_of(l: &Limit, permille: u64) -> u64 {
    (u128::from(l.window_us()) * u128::from(permille) / 1000).max(1) as u64
}

/// A gap between steps: often none, else up to a lease life or a window.
fn gap(raw: u64, life: u64, w: u64) -> u64 {
    match raw % 5 {
        0 | 1 => 0,
        2 => raw / 5 % 3,
        3 => (raw / 5) % life.max(1),
        _ => (raw / 5) % w.max(1).saturating_mul(2),
    }
}

/// Runs `steps` on `nodes` nodes; returns the admitted (time, cost), in
/// time order, after checking the grant and spend rules as it goes.
fn run(leasing: &Leasing, life: u64, nodes: usize, start: u64, steps: &[(u8, u64, Step)]) -> Vec<(u64, u64)> {
    let line = leasing.line();
    let mut shared = vec![0u64; line.state_words()];
    let mut leases: Vec<Option<Lease>> = vec![None; nodes];
    let mut admitted = Vec::new();
    let mut t = start;
    for &(node, raw, step) in steps {
        t += gap(raw, life, line.window_us());
        let n = usize::from(node) % nodes;
        match step {
            Step::Request { cost, exact } => {
                let spent = leases[n].as_mut().is_some_and(|l| {
                    let (left, until) = (l.left(), l.until());
                    let ok = l.spend(t, cost);
                    assert_eq!(ok, t < until && cost <= left, "spend at {t} of {cost}, {left} left until {until}");
                    ok
                });
                if spent || (exact && line.acquire(&mut shared, t, cost).admitted) {
                    admitted.push((t, cost));
                }
            }
            Step::Sync { want, lost } => {
                if let Some(old) = leases[n].take() {
                    if lost != 1 {
                        leasing.give_back(&mut shared, &old, t);
                    }
                }
                if lost == 1 {
                    continue;
                }
                let before = line.check(&shared, t, 0);
                let lease = leasing.grant(&mut shared, t, want);
                let g = lease.granted();
                assert!(g <= want, "granted {g} of {want}");
                assert!(g <= before.remaining, "granted {g} with {} remaining at once", before.remaining);
                assert!(lease.until() > t, "a lease that ends before it starts");
                if lost == 0 {
                    leases[n] = Some(lease);
                }
            }
            Step::Die => leases[n] = None,
        }
    }
    admitted
}

/// Replays `admitted` on a fresh state of `limit`: the first request it
/// rejects, if any.
fn first_rejected(limit: &Limit, admitted: &[(u64, u64)]) -> Option<(usize, u64, u64)> {
    let mut s = vec![0u64; limit.state_words()];
    admitted.iter().enumerate().find_map(|(i, &(t, c))| (!limit.acquire(&mut s, t, c).admitted).then_some((i, t, c)))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

    /// The bound, for any interleaving of grants, spends, give-backs,
    /// losses and deaths on 1 to 4 nodes, with leases that live up to half
    /// the line's window (what the burst takes to refill).
    #[test]
    fn fleet_never_admits_more_than_the_line(
        limit in limits(),
        life in 1u64..=500,
        nodes in 1usize..=4,
        start in prop_oneof![Just(0u64), 0u64..=10_000_000, Just(1_700_000_000_000_000u64)],
        steps in steps(120),
    ) {
        let life = life_of(&limit, life);
        let leasing = match leasing_of(limit, life) {
            Ok(l) => l,
            Err(LeaseError::Burst { .. }) => return Ok(()),
            Err(e) => panic!("{limit:?} for {life} µs: {e}"),
        };
        let admitted = run(&leasing, life, nodes, start, &steps);
        prop_assert_eq!(first_rejected(&limit, &admitted), None, "admitted {:?}", admitted);
    }

    /// One node, syncing before each request for exactly its cost, the
    /// lease spent at once: it admits what the lease line admits.
    #[test]
    fn one_node_in_lockstep_is_the_lease_line(
        limit in limits(),
        life in 1u64..=500,
        start in 0u64..=10_000_000,
        reqs in prop::collection::vec((any::<u64>(), 1u64..=3), 1..60),
    ) {
        let life = life_of(&limit, life);
        let Ok(leasing) = leasing_of(limit, life) else { return Ok(()) };
        let line = *leasing.line();
        let (mut shared, mut exact) = (vec![0u64; line.state_words()], vec![0u64; line.state_words()]);
        let mut t = start;
        for (raw, cost) in reqs {
            t += gap(raw, life, line.window_us());
            let mut lease = leasing.grant(&mut shared, t, cost);
            let leased = lease.granted() == cost && lease.spend(t, cost);
            if !leased {
                leasing.give_back(&mut shared, &lease, t);
            }
            prop_assert_eq!(leased, line.acquire(&mut exact, t, cost).admitted, "at {}, cost {}", t, cost);
            prop_assert_eq!(line.check(&shared, t, 0), line.check(&exact, t, 0), "states apart at {}", t);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

    /// A lease granted at t0 on a state a history left, `spent` of it spent,
    /// the rest given back at t1 with nothing else in between: the state
    /// reads, then and later, as if only the spent units had been charged
    /// at t0.
    #[test]
    fn giving_back_leaves_what_was_spent(
        limit in limits(),
        history in prop::collection::vec((any::<u64>(), 1u64..=3), 0..20),
        want in 1u64..=40,
        spent_permille in 0u64..=1000,
        life in 1u64..=500,
        wait in any::<u64>(),
        later in prop::collection::vec(any::<u64>(), 1..6),
    ) {
        let life = life_of(&limit, life);
        let Ok(leasing) = leasing_of(limit, life) else { return Ok(()) };
        let line = *leasing.line();
        let (mut s, mut t) = (vec![0u64; line.state_words()], 1_000_000u64);
        for (raw, cost) in history {
            t += gap(raw, life, line.window_us());
            line.acquire(&mut s, t, cost);
        }
        let mut only_spent = s.clone();
        let mut lease = leasing.grant(&mut s, t, want);
        let spent = lease.granted() * spent_permille / 1000;
        prop_assert!(lease.spend(t, spent));
        if spent > 0 {
            prop_assert!(line.acquire(&mut only_spent, t, spent).admitted);
        }
        let t1 = t + gap(wait, life, line.window_us()).min(lease.until() - t);
        leasing.give_back(&mut s, &lease, t1);
        for (i, raw) in later.into_iter().enumerate() {
            let at = t1 + if i == 0 { 0 } else { gap(raw, life, line.window_us()) };
            prop_assert_eq!(line.check(&s, at, 0), line.check(&only_spent, at, 0), "at {} (t0 {}, t1 {})", at, t, t1);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

    /// `on_error=local`: each of `nodes` nodes decides its requests alone on
    /// its share of the line; what they admit together, replayed in time
    /// order on the line, is all admitted there.
    #[test]
    fn shares_add_up_to_no_more_than_the_line(
        algorithm in select(Algorithm::ALL.to_vec()),
        count in 1u64..=12,
        period in prop_oneof![1u64..=40, 1_000u64..=2_000_000],
        burst in 1u64..=40,
        queue in prop_oneof![Just(0u64), 1u64..=12],
        nodes in 1u64..=5,
        reqs in prop::collection::vec((any::<u8>(), any::<u64>(), 1u64..=3), 1..150),
    ) {
        let limit = Limit::new(algorithm, Rate { count, period_us: period }, burst).unwrap();
        let limit = limit.with_queue(queue).unwrap_or(limit);
        let Some(part) = share(&limit, nodes) else {
            prop_assert!(burst < nodes);
            return Ok(());
        };
        prop_assert_eq!(part.algorithm(), limit.algorithm());
        let mut states = vec![vec![0u64; part.state_words()]; nodes as usize];
        let (mut t, mut admitted) = (0u64, Vec::new());
        for (node, raw, cost) in reqs {
            t += gap(raw, limit.window_us() / 4 + 1, limit.window_us());
            if part.acquire(&mut states[usize::from(node) % nodes as usize], t, cost).admitted {
                admitted.push((t, cost));
            }
        }
        prop_assert_eq!(first_rejected(&limit, &admitted), None, "share {:?}, admitted {:?}", part, admitted);
    }
}

#[test]
fn lines_that_cannot_be_leased() {
    let rate = Rate { count: 10, period_us: 1_000_000 };
    let log = Limit::new(Algorithm::SlidingLog, rate, 10).unwrap();
    assert_eq!(Leasing::new(log, 100_000), Err(LeaseError::SlidingLog));
    let queued = Limit::new(Algorithm::Gcra, rate, 10).unwrap().with_queue(5).unwrap();
    assert_eq!(Leasing::new(queued, 100_000), Err(LeaseError::Queue));
    // A plan's line is leased per key, under each key's values: a key whose
    // burst is too small is not, and its line is.
    let varying = Limit::new(Algorithm::Gcra, rate, 1).unwrap().varying();
    let per_key = Leasing::new(varying, 100_000).unwrap();
    assert!(per_key.per_key());
    assert_eq!(per_key.with_values(&varying), Err(LeaseError::Burst { burst: 1, held_back: 1 }));
    let plan = Limit::new(Algorithm::Gcra, rate, 10).unwrap().varying();
    let line = *per_key.with_values(&plan).unwrap().line();
    assert_eq!((line.burst(), line.is_varying()), (9, true), "the key's line, 1 refilled in 100 ms held back");
    let varying_log = Limit::new(Algorithm::SlidingLog, rate, 10).unwrap().varying();
    assert_eq!(Leasing::new(varying_log, 100_000), Err(LeaseError::SlidingLog));
    let fixed = Limit::new(Algorithm::Fixed, rate, 10).unwrap();
    assert_eq!(Leasing::new(fixed, 0), Err(LeaseError::Life));
    // 10r/s refills 1 unit in 100 ms: a burst of 1 leaves nothing to lease.
    let bucket = Limit::new(Algorithm::TokenBucket, rate, 1).unwrap();
    assert_eq!(Leasing::new(bucket, 100_000), Err(LeaseError::Burst { burst: 1, held_back: 1 }));
    assert_eq!(
        Leasing::new(bucket, 100_000).unwrap_err().to_string(),
        "burst=1 is too small to be leased: leases hold back the 1 units the rate refills in a lease's life"
    );
    // The window algorithms hold nothing back: their leases end with the window.
    assert_eq!(Leasing::new(fixed, 100_000).unwrap().line(), &fixed);
    let gcra = Limit::new(Algorithm::Gcra, rate, 10).unwrap();
    assert_eq!(Leasing::new(gcra, 100_000).unwrap().line().burst(), 9, "1 refilled in 100 ms held back");
}

/// A lease ends with its window (`fixed`): granted 1 µs before the window
/// ends, it spends nothing in the next one, which the line counts afresh.
#[test]
fn a_window_lease_ends_with_its_window() {
    let fixed = Limit::new(Algorithm::Fixed, Rate { count: 10, period_us: 1_000_000 }, 10).unwrap();
    let leasing = Leasing::new(fixed, 500_000).unwrap();
    let mut s = vec![0u64; fixed.state_words()];
    let mut lease = leasing.grant(&mut s, 999_999, 10);
    assert_eq!((lease.granted(), lease.until()), (10, 1_000_000));
    assert!(lease.spend(999_999, 4));
    assert!(!lease.spend(1_000_000, 1), "spent in the next window");
    // The next window's whole budget is there for the next lease.
    assert_eq!(leasing.grant(&mut s, 1_000_000, 20).granted(), 10);
}

/// Shares, by hand: 3 nodes of `fixed` 10r/s burst 10 get 3 each over the
/// same second; `gcra` 10r/s: one unit per 300 ms each; 11 nodes of a burst
/// of 10 get nothing.
#[test]
fn shares_by_hand() {
    let rate = Rate { count: 10, period_us: 1_000_000 };
    let fixed = Limit::new(Algorithm::Fixed, rate, 10).unwrap();
    let part = share(&fixed, 3).unwrap();
    assert_eq!((part.burst(), part.window_us()), (3, 1_000_000));
    let gcra = Limit::new(Algorithm::Gcra, rate, 10).unwrap();
    let part = share(&gcra, 3).unwrap();
    assert_eq!((part.burst(), part.rate()), (3, Rate { count: 1, period_us: 300_000 }));
    assert_eq!(share(&fixed, 11), None);
    assert_eq!(share(&fixed, 1), Some(fixed), "one node: the line itself");
}

proptest! {
    /// Lease sizes: a steady demand of n units an interval is asked for as
    /// 1.5 n (n + ⌈n/2⌉) once the estimate has settled; never 0; never more
    /// than the node's share of what the line has left, but 1.
    #[test]
    fn sizes_follow_demand_within_the_share(
        n in 0u64..=100_000,
        history in prop::collection::vec(0u64..=1_000_000, 0..20),
        remaining in 0u64..=1_000_000,
        nodes in 0u64..=10,
    ) {
        let mut d = Demand::default();
        for h in history {
            d.observe(h);
        }
        for _ in 0..64 {
            d.observe(n);
        }
        prop_assert_eq!(d.per_interval(), n, "{:?}", d);
        let want = d.want(u64::MAX, 1);
        prop_assert_eq!(want, (n + n.div_ceil(2)).max(1));
        let capped = d.want(remaining, nodes);
        prop_assert!(capped >= 1);
        prop_assert!(capped <= want);
        prop_assert!(capped <= (remaining / nodes.max(1)).max(1));
    }
}

/// A lease is low once three quarters of it are spent.
#[test]
fn a_lease_runs_low() {
    let fixed = Limit::new(Algorithm::Fixed, Rate { count: 10, period_us: 1_000_000 }, 10).unwrap();
    let leasing = Leasing::new(fixed, 500_000).unwrap();
    let mut s = vec![0u64; fixed.state_words()];
    let mut lease = leasing.grant(&mut s, 0, 8);
    assert!(lease.spend(1, 5) && !lease.low(), "3 of 8 left");
    assert!(lease.spend(2, 1) && lease.low(), "2 of 8 left");
    let empty = leasing.grant(&mut s, 3, 0);
    assert!(empty.low(), "a lease of nothing is low");
}

/// A call in flight: runs at, node, sent at, what it sends, the delay of
/// its reply (`None`: lost).
type Flight = (u64, usize, u64, rl_core::lease::SyncArg, Option<u64>);

/// A reply on its way: arrives at, node, sent at, units, words, life;
/// `None`: the call is given up on (no reply by then).
type Reply = (u64, usize, u64, Option<(u64, (u64, u64), u64)>);

/// What becomes of a sync call.
#[derive(Clone, Copy, Debug)]
enum Fate {
    /// Redis runs it `run` µs after it is sent, its reply comes `back` µs
    /// after that.
    Answered { run: u64, back: u64 },
    /// Redis runs it; its reply is lost.
    ReplyLost { run: u64 },
    /// It never reaches Redis.
    Lost,
}

#[derive(Clone, Copy, Debug)]
enum Event {
    /// A request on a node; `rest`: one its leases do not hold is decided
    /// on the shared state, what a lease holds of it spent first.
    Request {
        node: usize,
        cost: u64,
        rest: bool,
    },
    Sync {
        node: usize,
        fate: Fate,
    },
}

fn events() -> impl Strategy<Value = Vec<(u64, Event)>> {
    let fate = prop_oneof![
        6 => (any::<u64>(), any::<u64>()).prop_map(|(run, back)| Fate::Answered { run, back }),
        1 => any::<u64>().prop_map(|run| Fate::ReplyLost { run }),
        1 => Just(Fate::Lost),
    ];
    let event = prop_oneof![
        5 => (0usize..4, 1u64..=3, any::<bool>()).prop_map(|(node, cost, rest)| Event::Request { node, cost, rest }),
        2 => (0usize..4, fate).prop_map(|(node, fate)| Event::Sync { node, fate }),
    ];
    prop::collection::vec((any::<u64>(), event), 1..200)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    /// Nodes keep their leases in `Slot`s, on their own clocks, and sync
    /// while their requests go on spending: calls run at Redis some time
    /// after they are sent, their replies come later still or never, some
    /// never arrive. What the nodes admit, replayed on the configured
    /// line, is all admitted there.
    #[test]
    fn slots_with_syncs_in_flight_stay_within_the_line(
        limit in limits(),
        life in 1u64..=500,
        nodes in 1usize..=4,
        events in events(),
    ) {
        let life = life_of(&limit, life);
        let Ok(leasing) = leasing_of(limit, life) else { return Ok(()) };
        let mut shared = vec![0u64; leasing.line().state_words()];
        let mut slots = vec![Slot::default(); nodes];
        // The model's leases, by the words the nodes give them back with.
        let mut leases: Vec<Lease> = Vec::new();
        let mut flight: Vec<Flight> = Vec::new();
        let mut replies: Vec<Reply> = Vec::new();
        let (mut t, mut admitted, mut remaining) = (1_000_000u64, Vec::new(), vec![u64::MAX; nodes]);
        // (times in parts of a lease's life: steps up to half of one, calls
        // run and answered within a quarter)
        let (step, delay) = (|r: u64| r % (life / 2 + 1), |r: u64| r % (life / 4 + 1));
        for (dt, event) in events {
            t += step(dt);
            // What Redis runs, and what comes back, up to now, in time order.
            loop {
                let run = flight.iter().enumerate().min_by_key(|(_, f)| f.0).filter(|(_, f)| f.0 <= t).map(|(i, _)| i);
                let reply = replies.iter().enumerate().min_by_key(|(_, r)| r.0).filter(|(_, r)| r.0 <= t).map(|(i, _)| i);
                match (run, reply) {
                    (Some(i), r) if r.is_none_or(|r| flight[i].0 <= replies[r].0) => {
                        let (at, node, sent, arg, back) = flight.remove(i);
                        if arg.back > 0 {
                            let l = leases[arg.words.0 as usize];
                            prop_assert_eq!(l.left(), arg.back, "given back what the node left");
                            leasing.give_back(&mut shared, &l, at);
                        }
                        let l = leasing.grant(&mut shared, at, arg.want);
                        leases.push(l);
                        let words = (leases.len() as u64 - 1, 0);
                        let life_left = if l.granted() > 0 { l.until() - at } else { 0 };
                        match back {
                            Some(back) => replies.push((at + back, node, sent, Some((l.granted(), words, life_left)))),
                            None => replies.push((at + life, node, sent, None)),
                        }
                        remaining[node] = leasing.line().check(&shared, at, 0).remaining;
                    }
                    (_, Some(r)) => {
                        match replies.remove(r) {
                            (_, node, sent, Some((units, words, life_left))) => {
                                slots[node].granted(sent, units, words, life_left)
                            }
                            (_, node, sent, None) => slots[node].unanswered(sent),
                        }
                    }
                    _ => break,
                }
            }
            // (the slots as shared memory keeps them: in words, read and
            // written around every step)
            for s in slots.iter_mut() {
                *s = through_words(*s);
            }
            match event {
                Event::Request { node, cost, rest } => {
                    let n = node % nodes;
                    // A request another line refused: taken, put back, nothing spent.
                    let before = slots[n];
                    if let Some(spent) = slots[n].take(t, cost) {
                        slots[n].put_back(spent, cost);
                        prop_assert_eq!(slots[n], before, "put back where it was");
                    }
                    let before = slots[n];
                    if slots[n].spend(t, cost) {
                        admitted.push((t, cost));
                        // The model's lease spent alike (the slot's held
                        // leases mirror the model's, by their words).
                        let spent = (0..2).find(|&i| held_left(&before, i, t) >= cost && held_left(&slots[n], i, t) + cost == held_left(&before, i, t));
                        prop_assert!(spent.is_some());
                        let w = held_words(&before, spent.unwrap());
                        prop_assert!(leases[w.0 as usize].spend(t, cost), "the model's lease refuses what the node spent at {}", t);
                    } else if let Some(part) = rest.then(|| slots[n].take_part(t, cost)).flatten() {
                        // What the leases held of it, up to its cost, the rest (if any) on the
                        // shared state: admitted if the state admits the rest, else the part
                        // goes back.
                        let taken: Vec<(usize, u64)> = (0..2)
                            .map(|i| (i, held_left(&before, i, t) - held_left(&slots[n], i, t)))
                            .filter(|&(_, u)| u > 0)
                            .collect();
                        prop_assert_eq!(taken.iter().map(|&(_, u)| u).sum::<u64>(), part.units());
                        prop_assert!(part.units() <= cost);
                        let rest = cost - part.units();
                        if rest == 0 || leasing.line().acquire(&mut shared, t, rest).admitted {
                            admitted.push((t, cost));
                            for (i, u) in taken {
                                let w = held_words(&before, i);
                                prop_assert!(leases[w.0 as usize].spend(t, u), "the model's lease refuses the part at {}", t);
                            }
                        } else {
                            slots[n].put_back_part(&part);
                            let lefts = |s: &Slot| [held_left(s, 0, t), held_left(s, 1, t)];
                            prop_assert_eq!(lefts(&slots[n]), lefts(&before), "the part back in its leases");
                        }
                    }
                }
                Event::Sync { node, fate } => {
                    let n = node % nodes;
                    if let Some(arg) = slots[n].sync(t, t + life / 2, remaining[n], nodes as u64) {
                        match fate {
                            Fate::Answered { run, back } => {
                                flight.push((t + delay(run), n, t, arg, Some(delay(back))))
                            }
                            Fate::ReplyLost { run } => flight.push((t + delay(run), n, t, arg, None)),
                            Fate::Lost => replies.push((t + life, n, t, None)),
                        }
                    }
                }
            }
        }
        prop_assert_eq!(first_rejected(&limit, &admitted), None, "admitted {:?}", admitted);
    }
}

/// Units left in a slot's i-th held lease at `now` (0 once it ended).
fn held_left(s: &Slot, i: usize, now: u64) -> u64 {
    s.held(i).filter(|h| now < h.ends).map_or(0, |h| h.left)
}

fn held_words(s: &Slot, i: usize) -> (u64, u64) {
    s.held(i).map_or((0, 0), |h| h.words)
}

/// A slot by hand: nothing asked, nothing sent; 8 units asked, the sync
/// wants 12 (an estimate of 8 an interval: a demand above the estimate is
/// taken at once; and half again), and no more
/// until it is answered; the lease ends 150 after the call was sent; what
/// it left goes back at the next sync, and only then.
#[test]
fn a_slot_by_hand() {
    let mut s = Slot::default();
    assert_eq!(s.sync(0, 100, 1000, 1), None, "nothing asked for, nothing held");
    assert!(!s.spend(10, 8), "no lease yet");
    let arg = s.sync(100, 200, 1000, 1).expect("asked for");
    assert_eq!((arg.want, arg.back), (12, 0));
    assert!(!s.spend(105, 1));
    assert_eq!(s.sync(110, 210, 1000, 1), None, "asked already, not answered yet");
    s.granted(100, 3, (11, 22), 150);
    assert_eq!(s.held(0).map(|h| h.ends), Some(250), "sent at 100, lives 150");
    assert!(s.spend(120, 2));
    assert!(!s.spend(130, 2), "1 left");
    assert_eq!(s.left(240), 1);
    assert!(!s.spend(250, 1), "ended");
    let arg = s.sync(300, 400, 1000, 1).expect("a unit to give back");
    // (estimates: 8; then 6.25 with the 1 asked at 105; then 5.94 with the 5 since)
    assert_eq!((arg.want, arg.back, arg.words), (9, 1, (11, 22)), "an estimate of 6, and half again");
    s.unanswered(200);
    assert_eq!(s.asking_since(), 300, "another call's failure: still asking");
    s.unanswered(300);
    let arg = s.sync(400, 500, 1000, 1).expect("still wanted, the last call unanswered");
    assert_eq!((arg.want, arg.back), (7, 0), "given back once; an estimate of 4.45, over the lease's life 6.7");
    s.granted(400, 0, (0, 0), 0);
    assert_eq!(s.sync(500, 600, 4, 2).map(|a| a.want), Some(2), "at most a node's share of what is left");
}

/// A slot written into words and read back, as a node keeps it.
fn through_words(slot: Slot) -> Slot {
    let k = Kept {
        slot,
        tag: 7,
        line_id: 9,
        remaining: 3,
        full_at: 5,
        heard_at: 31,
        refused_until: 11,
        local: [13, 17, 19, 37],
        local_since: 23,
        owed: 29,
        values: [41, 43, 47],
    };
    let mut w = vec![0; Kept::WORDS];
    k.write(&mut w);
    let back = Kept::read(&w).expect("enough words");
    assert_eq!(back, k, "the words hold every field");
    back.slot
}

/// A key of a plan (a line whose values vary): it keeps the values its
/// requests bring, which make its line for the syncs; alone, it is
/// decided on its share of that line, in a state of the line's words (a
/// varying `sliding` line's four).
#[test]
fn a_plans_key_keeps_its_values() {
    let rate = Rate { count: 6, period_us: 1_000_000 };
    let configured = Limit::new(Algorithm::Sliding, rate, 6).unwrap().varying();
    let mut k = Kept::default();
    assert_eq!(k.limit_of(&configured), None, "no request has brought values yet");
    let plan = Limit::new(Algorithm::Sliding, Rate { count: 12, period_us: 1_000_000 }, 12).unwrap().varying();
    k.set_values(&plan);
    assert_eq!(k.limit_of(&configured), Some(plan));
    assert_eq!(plan.state_words(), 4);
    let mut w = vec![0; Kept::WORDS];
    k.write(&mut w);
    assert_eq!(Kept::read(&w).unwrap().limit_of(&configured), Some(plan), "kept in the words");
    // Alone, as one of 2 nodes: 6 of the plan's 12 a second, not the
    // configured line's 3.
    let share = share(&plan, 2).unwrap();
    let admitted = (0..10).filter(|i| k.decide_local(1_000_000 + i, 1, &plan, Some(&share), 2, 1).admitted).count();
    assert_eq!((admitted, k.owed), (6, 6));
    // A line whose values do not vary is its own, whatever is kept.
    let fixed = Limit::new(Algorithm::Fixed, rate, 6).unwrap();
    assert_eq!(k.limit_of(&fixed), Some(fixed));
}

/// A key on a node by hand: a lease spent, its view of the line; a
/// request the lease does not hold asks Redis; Redis refused a lone one
/// until 900: refused on the node until then, without asking, unless a
/// lease holds it; a costlier refusal teaches nothing.
#[test]
fn a_kept_key_by_hand() {
    let mut k = Kept::read(&[0; Kept::WORDS]).expect("zeroes: nothing kept");
    assert_eq!(k, Kept::default());
    assert!(Kept::read(&[0; Kept::WORDS - 1]).is_none(), "too few words");
    assert_eq!(k.decide(10, 1), Local::Ask, "no lease");
    assert_eq!(k.slot.sync(100, 200, 0, 1), None, "one unit asked: too little to lease");
    for t in 110..115 {
        k.decide(t, 1);
    }
    assert!(k.slot.sync(200, 300, 1000, 1).is_some());
    let g = LeaseGrant {
        units: 2,
        words: (1, 2),
        life_us: 500,
        remaining: 40,
        reset_us: 1000,
        taken_back: false,
        at_us: 0,
    };
    k.granted(200, &g);
    let spent = match k.decide(250, 1) {
        Local::Spent { spent, remaining, reset_us } => {
            assert_eq!((remaining, reset_us), (41, 950), "40 in Redis, 1 left in the lease; full at 1200");
            let (o, by) = Local::Spent { spent, remaining, reset_us }.outcome().expect("decided on the node");
            assert_eq!(
                (o.admitted, o.remaining, o.reset_us, o.retry_after_us, o.delay_us, by),
                (true, 41, 950, None, 0, Some(spent))
            );
            spent
        }
        other => panic!("{other:?}"),
    };
    k.slot.put_back_part(&spent);
    assert_eq!(k.slot.left(260), 2, "the refused request's unit is back");
    // More than the lease holds: what it holds is spent, Redis decides the
    // rest; put back (Redis refused the rest), the lease holds it again.
    let Local::Part(part) = k.decide(260, 3) else { panic!("a part spent") };
    assert_eq!((part.units(), k.slot.left(260), Local::Part(part).outcome()), (2, 0, None));
    k.slot.put_back_part(&part);
    assert_eq!(k.slot.left(260), 2, "the part is back");
    k.refused(260, 0, 3, Some(100), 800);
    assert_eq!(k.refused_until, 0, "a costlier refusal says nothing of a lone request");
    k.refused(260, 0, 1, Some(640), 800);
    assert!(matches!(k.decide(270, 1), Local::Spent { .. }), "the lease first");
    k.decide(280, 1);
    assert_eq!(k.decide(300, 1), Local::Refused { retry_after_us: 600, reset_us: 760 });
    let (o, spent) = Local::Refused { retry_after_us: 600, reset_us: 760 }.outcome().expect("decided on the node");
    assert_eq!(
        (o.admitted, o.remaining, o.reset_us, o.retry_after_us, o.delay_us, o.next_us, spent),
        (false, 0, 760, Some(600), 0, 600, None),
        "refused as Redis refused a lone request, one more unit passing with it"
    );
    assert_eq!(Local::Ask.outcome(), None, "Redis decides");
    assert_eq!(k.decide(900, 1), Local::Ask, "Redis said a lone request passes at 900");
    let mut w = vec![0; Kept::WORDS + 2];
    k.write(&mut w);
    assert_eq!(Kept::read(&w), Some(k));
}

/// A request of 3 its lease holds 2 of: the 2 are spent, Redis is asked
/// for 1 and refuses it; the 2 go back to the lease at once (a dry-run
/// line's request goes on, and must not leave them spent), the view
/// counts them, and a request of 1 is spent from the lease, while a lone
/// request Redis decides is refused until its retry.
#[test]
fn a_part_redis_refuses_the_rest_of_goes_back() {
    let mut k = Kept::default();
    let g =
        LeaseGrant { units: 2, words: (1, 2), life_us: 1000, remaining: 0, reset_us: 500, taken_back: false, at_us: 0 };
    k.granted(100, &g);
    let Local::Part(part) = k.decide(150, 3) else { panic!("a part spent") };
    assert_eq!((part.units(), k.slot.left(150)), (2, 0));
    let refused = rl_core::verdict::Outcome {
        admitted: false,
        remaining: 0,
        reset_us: 400,
        retry_after_us: Some(25),
        delay_us: 0,
        next_us: 0,
    };
    assert_eq!(k.decided(160, 0, &refused, 1, &part), 2, "Redis' 0 and the lease's 2");
    assert_eq!(k.slot.left(160), 2, "the part is back in its lease");
    assert!(matches!(k.decide(170, 1), Local::Spent { .. }), "a unit of the lease");
    assert_eq!(
        k.decide(175, 3),
        Local::Refused { retry_after_us: 10, reset_us: 385 },
        "Redis refused a unit until 185"
    );
}

/// Replies of calls that crossed come back in either order; what the
/// node reports follows the call Redis ran last. A grant of 12 (Redis
/// left with 35) and a request Redis decided (left with 34), run in that
/// order: the node's view is 34 and the lease's 12 whichever reply comes
/// first; run the other way round (the request leaves 47, the grant 35),
/// 35 and 12. Until the grant's reply comes, the node does not know its
/// units: the request's view then is Redis' alone.
#[test]
fn crossed_replies_keep_the_later_view() {
    let grant = |remaining, at_us| LeaseGrant {
        units: 12,
        words: (1, 1),
        life_us: 1_000,
        remaining,
        reset_us: 900,
        taken_back: false,
        at_us,
    };
    let view = |k: &Kept| k.remaining + k.slot.left(150);
    let fresh = || {
        let mut k = Kept::default();
        for t in 0..8 {
            k.decide(t, 1);
        }
        assert!(k.sync(100, Horizon::of(100, 200), 1).is_some());
        k
    };
    // The grant ran first (at 9,005,000), then the request (9,005,010).
    let mut k = fresh();
    k.seen(110, 9_005_010, 34, 900);
    assert_eq!(view(&k), 34, "the grant not back yet: Redis' view alone");
    k.granted(100, &grant(35, 9_005_000));
    assert_eq!(view(&k), 46, "the request's reply is the later: 34 and the lease's 12");
    let mut k = fresh();
    k.granted(100, &grant(35, 9_005_000));
    k.seen(110, 9_005_010, 34, 900);
    assert_eq!(view(&k), 46);
    // The request ran first (9,005,000), then the grant (9,005,010).
    let mut k = fresh();
    k.granted(100, &grant(35, 9_005_010));
    k.seen(110, 9_005_000, 47, 900);
    assert_eq!(view(&k), 47, "the request's reply is the older: the grant's 35 and 12, not 47 and 12");
    let mut k = fresh();
    k.seen(110, 9_005_000, 47, 900);
    k.granted(100, &grant(35, 9_005_010));
    assert_eq!(view(&k), 47);
    // Redis' clock stepped back by more than calls can cross: news.
    k.seen(120, 1_000, 20, 900);
    assert_eq!(view(&k), 32, "a reply a whole second older than the last is not one that crossed it");
    // A refusal, older than the grant: lone requests are still refused, the view is the grant's.
    let mut k = fresh();
    k.granted(100, &grant(0, 9_005_010));
    k.refused(110, 9_005_000, 1, Some(300), 900);
    assert_eq!((k.remaining, k.refused_until), (0, 410));
}

/// A slot asks for what its leases lack to last the next interval and
/// half again: nothing while they hold it, the shortfall once they do
/// not; a lease spent out is let go at once, so that the next may come
/// while another still runs.
#[test]
fn a_slot_asks_for_its_shortfall() {
    let mut s = Slot::default();
    for _ in 0..8 {
        s.spend(0, 1);
    }
    let arg = s.sync(100, 200, 1000, 1).expect("asked for");
    assert_eq!(arg.want, 12, "an estimate of 8 an interval, and half again");
    s.granted(100, 20, (1, 1), 10_000);
    for t in 0..6 {
        assert!(s.spend(110 + t, 1));
    }
    // An estimate of 7.5 (6 asked, below it: averaged in): 12 wanted, 14 held.
    assert_eq!(s.sync(200, 300, 1000, 1), None, "the lease lasts");
    for t in 0..12 {
        assert!(s.spend(210 + t, 1));
    }
    // 12 asked, above the estimate: taken at once, 18 wanted, 2 held.
    let arg = s.sync(300, 400, 1000, 1).expect("runs short");
    assert_eq!((arg.want, arg.back), (16, 0), "the shortfall");
    s.granted(300, 6, (2, 2), 10_000);
    assert!(s.spend(310, 2) && s.spend(311, 6), "the older lease first, then the newer");
    assert_eq!(s.held(0).map(|h| h.left), Some(0));
    assert!(s.sync(400, 500, 1000, 1).is_some(), "both spent out: let go, and a new one asked for");
    assert_eq!(s.held(0), None);
}

/// A key Redis refused asks for no lease while the refusal holds past
/// the next sync, and gives back what ended all the same; once it no
/// longer does, it asks again.
#[test]
fn a_refused_key_asks_for_nothing() {
    let mut k = Kept::default();
    for t in 0..8 {
        k.decide(t, 1);
    }
    assert!(k.sync(100, Horizon::of(100, 200), 1).is_some_and(|a| a.want > 0));
    k.granted(
        100,
        &LeaseGrant { units: 2, words: (4, 4), life_us: 150, remaining: 0, reset_us: 900, taken_back: false, at_us: 0 },
    );
    assert!(matches!(k.decide(110, 1), Local::Spent { .. }));
    k.refused(120, 0, 1, Some(500), 900);
    for t in 0..8 {
        // (more than the lease's last unit: refused, the unit left to go back)
        assert!(matches!(k.decide(130 + t, 2), Local::Refused { .. }));
    }
    let arg = k.sync(300, Horizon::of(300, 400), 1).expect("a unit to give back");
    assert_eq!((arg.want, arg.back), (0, 1), "refused until 620: nothing asked, the ended lease given back");
    for t in 0..8 {
        k.decide(310 + t, 1);
    }
    assert_eq!(k.sync(400, Horizon::of(400, 500), 1), None, "still refused past the next sync");
    for t in 0..8 {
        k.decide(510 + t, 1);
    }
    assert!(k.sync(600, Horizon::of(600, 700), 1).is_some_and(|a| a.want > 0), "the refusal ends before the next sync");
}

/// Three nodes lose Redis when the line (30 a window) had 12 left: each
/// enforces a third of the line (10), charged first with its third of
/// what was used (6), so that together they admit the 12 left, not 30
/// more; what each admits is owed to Redis. A new window gives each its
/// whole share; a later outage starts its shares afresh.
#[test]
fn a_key_alone_while_redis_is_gone() {
    let line = Limit::new(Algorithm::Fixed, Rate { count: 30, period_us: 1_000_000 }, 30).unwrap();
    let third = share(&line, 3);
    let grant = LeaseGrant {
        units: 0,
        words: (0, 0),
        life_us: 0,
        remaining: 12,
        reset_us: 500_000,
        taken_back: false,
        at_us: 0,
    };
    let mut admitted = 0;
    for _ in 0..3 {
        let mut k = Kept::default();
        k.granted(2_100_000, &grant);
        for t in 0..10 {
            admitted += usize::from(k.decide_local(2_200_000 + t, 1, &line, third.as_ref(), 3, 2_100_000).admitted);
        }
        assert_eq!(k.owed, 4, "a node's share: 10, less its third of the 18 used");
        // The next window: the whole share.
        let more = (0..12).filter(|t| k.decide_local(3_000_000 + t, 1, &line, third.as_ref(), 3, 2_100_000).admitted);
        assert_eq!(more.count(), 10);
        // Another outage: afresh, charged with what was used when Redis last answered.
        let o = k.decide_local(3_100_000, 1, &line, third.as_ref(), 3, 3_050_000);
        assert!(o.admitted && o.remaining == 3, "10, less 6, less this one: {o:?}");
    }
    assert_eq!(admitted, 12, "the nodes together admit what the line had left");
    let nothing = share(&line, 31);
    let mut k = Kept::default();
    assert!(!k.decide_local(0, 1, &line, nothing.as_ref(), 31, 0).admitted, "a share of nothing admits nothing");
    assert_eq!(k.owed, 0);
}

/// A lease that ends with its window, between two syncs: the slot says
/// when, and a sync then gives back what it left and asks for the next,
/// sized by the demand the estimate had (the interval's own is folded in
/// at the next sync of the cadence, whole).
#[test]
fn a_lease_ends_with_its_window_between_syncs() {
    let mut k = Kept::default();
    for t in 0..8 {
        k.decide(t, 1);
    }
    let arg = k.sync(100, Horizon::of(100, 200), 1).expect("asked for");
    assert_eq!(arg.want, 12);
    // The window ends at 150.
    k.granted(
        100,
        &LeaseGrant { units: 12, words: (5, 5), life_us: 50, remaining: 90, reset_us: 50, taken_back: false, at_us: 0 },
    );
    assert_eq!(k.slot.ends_first(), Some(150));
    assert!(matches!(k.decide(120, 1), Local::Spent { .. }));
    assert_eq!(k.decide(150, 1), Local::Ask, "ended with its window");
    let h = Horizon { next: 200, interval: 100, ends: 300, wait: 150 };
    let arg = k.sync_between(151, h, 1).expect("ended: given back, and the next asked for");
    assert_eq!((arg.want, arg.back, arg.words), (12, 11, (5, 5)), "the estimate as it was: 8 an interval");
    assert_eq!(k.slot.ends_first(), None);
    k.granted(
        151,
        &LeaseGrant {
            units: 12,
            words: (6, 6),
            life_us: 150,
            remaining: 90,
            reset_us: 150,
            taken_back: true,
            at_us: 0,
        },
    );
    // At the next sync of the cadence the interval's demand (2) is folded in.
    assert_eq!(k.sync(200, Horizon::of(200, 300), 1), None, "12 held, to last past 300: enough for an estimate of 6.5");
}

/// A key of a window line seen about once an interval: a lease of an
/// interval and a half would serve one request, and is not asked for; one
/// that lives to its window's end (900 more) is, of two units, the least
/// that pays for its call, and no more than the demand to its end.
#[test]
fn a_slow_key_is_leased_for_its_window() {
    let mut s = Slot::default();
    assert!(!s.spend(10, 1), "nothing held");
    assert_eq!(s.sync(100, 200, 1000, 1), None, "one request a bucket lease's life: left to Redis");
    let mut s = Slot::default();
    assert!(!s.spend(10, 1));
    s.end_interval();
    let window = Horizon { next: 200, interval: 100, ends: 1000, wait: 150 };
    let arg = s.sync_asking(100, window, 1000, 1, true).expect("asked for");
    assert_eq!((arg.want, arg.back), (2, 0));
    s.granted(100, 2, (1, 1), 900);
    assert!(s.spend(150, 1) && s.spend(250, 1), "two requests, no round trip");
    assert!(!s.spend(260, 1));
    let short = Horizon { next: 300, interval: 100, ends: 260 + 150, wait: 150 };
    assert_eq!(s.sync_asking(260, short, 1000, 1, true), None, "a short life: not worth a lease");
}

/// A lease that holds more than twice what its key is expected to spend
/// before it ends, and two units, is ended at a sync and given back at
/// once, when the line cannot spare it (the nodes holding as much would
/// hold half of what it has left, or more): the demand (one an interval)
/// falls by a quarter each idle interval; 10 units to 1000 are kept while
/// the key would spend 4 of them, and go back when it would spend 3, with
/// 20 left on the line; with 21, or 41 between two nodes, they are kept.
#[test]
fn a_lease_its_key_no_longer_spends_goes_back_early() {
    let run = |remaining: u64, nodes: u64| {
        let mut s = Slot::default();
        assert!(!s.spend(10, 1));
        s.end_interval();
        let first = Horizon { next: 200, interval: 100, ends: 1000, wait: 150 };
        s.sync_asking(100, first, remaining, nodes, true).expect("asked for");
        s.granted(100, 10, (3, 3), 900);
        let at = |t: u64| Horizon { next: t + 100, interval: 100, ends: 1000, wait: 150 };
        for t in [200, 300] {
            s.end_interval();
            assert_eq!(s.sync_asking(t, at(t), remaining, nodes, true), None, "kept at {t}");
            assert_eq!(s.left(t), 10);
        }
        s.end_interval();
        (s.sync_asking(400, at(400), remaining, nodes, true), s)
    };
    let (arg, mut s) = run(20, 1);
    let arg = arg.expect("given back");
    assert_eq!((arg.want, arg.back, arg.words), (0, 10, (3, 3)), "nothing asked: seen too seldom now");
    assert_eq!(s.left(400), 0, "ended: nothing spent from it any more");
    assert!(!s.spend(410, 1));
    for (remaining, nodes) in [(21, 1), (41, 2)] {
        let (arg, s) = run(remaining, nodes);
        assert_eq!(arg, None, "{remaining} left for {nodes} nodes: kept");
        assert_eq!(s.left(400), 10);
    }
}

/// A request Redis decides asks, in its call, for the key's lease when the
/// demand seen so far, this interval's requests folded in, would spend two
/// units in a lease's life, as a sync would: with leases of an interval
/// and a half, on a fresh key's sixth request in an interval (9 units, as
/// a sync would size them); with a window's life, on its first (2). One
/// ask at a time, until it is answered or a call could be no longer; the
/// lease lives from when it was asked for.
#[test]
fn a_request_redis_decides_brings_the_first_lease() {
    let short = |now: u64| Horizon::of(now, now + 100);
    let mut k = Kept::default();
    for t in 15..20 {
        assert_eq!(k.decide(t, 1), Local::Ask);
        assert_eq!(k.ask_with(t, short(t), 1), 0, "{} requests: too few to lease", t - 14);
    }
    assert_eq!(k.decide(20, 1), Local::Ask);
    assert_eq!(k.ask_with(20, short(20), 1), 9, "a sixth in the interval");
    assert_eq!(k.decide(30, 1), Local::Ask);
    assert_eq!(k.ask_with(30, short(30), 1), 0, "asked already");
    k.answered(Some(&LeaseGrant {
        units: 3,
        words: (7, 7),
        life_us: 150,
        remaining: 10,
        reset_us: 500,
        taken_back: false,
        at_us: 0,
    }));
    assert_eq!(k.slot.ends_first(), Some(170), "its life from when it was asked for (20)");
    assert!((0..3).all(|t| matches!(k.decide(40 + t, 1), Local::Spent { .. })));
    assert_eq!(k.decide(50, 1), Local::Ask);

    let window = |now: u64| Horizon { next: now + 100, interval: 100, ends: 1000, wait: 150 };
    let mut k = Kept::default();
    assert_eq!(k.decide(10, 1), Local::Ask);
    assert_eq!(k.ask_with(10, window(10), 1), 2, "a window's life: on the first request");
    k.answered(None);
    assert_eq!(k.ask_with(20, window(20), 1), 2, "unanswered: asked again");
    assert_eq!(k.ask_with(30, window(30), 1), 0);
    assert_eq!(k.ask_with(170, window(170), 1), 2, "unanswered for as long as a call may be: asked again");
}

/// Two leases that end before one sync, both with units left: a sync gives
/// back one, and the other stays, ended (nothing spends from it), until
/// the next, which gives it back too: neither is wasted.
#[test]
fn two_ended_leases_both_go_back() {
    let mut s = Slot::default();
    s.granted(0, 4, (1, 1), 100);
    s.granted(0, 3, (2, 2), 120);
    assert!(s.spend(10, 1));
    let first = s.sync_asking(200, Horizon::of(200, 300), 1000, 1, false).expect("one given back");
    assert_eq!((first.back, first.words), (3, (1, 1)));
    assert!(!s.spend(210, 1), "the other ended");
    assert_eq!(s.ends_first(), Some(120), "and waits to go back");
    let second = s.sync_asking(211, Horizon::of(211, 300), 1000, 1, false).expect("the other given back");
    assert_eq!((second.back, second.words), (3, (2, 2)));
    assert_eq!(s.ends_first(), None);
}

/// A key seen once an interval, leased for a long life (100 intervals):
/// a lease of two would be spent in two intervals and renewed on the
/// requests, a call every other one; it is sized to half its life's plain
/// average (50), no more than the estimate over its life.
#[test]
fn a_long_lease_of_a_slow_key_covers_half_its_life() {
    let mut s = Slot::default();
    for i in 0..20u64 {
        s.spend(i * 100 + 10, 1);
        s.end_interval();
    }
    let h = Horizon { next: 2_100, interval: 100, ends: 12_000, wait: 150 };
    let arg = s.sync_asking(2_000, h, 1_000_000, 1, true).expect("asked for");
    assert_eq!(arg.want, 50);
    let short = Horizon::of(2_000, 2_100);
    assert_eq!(s.sync_asking(2_000, short, 1_000_000, 1, true), None, "asking already");
}

/// A key seen once in four intervals, on a line whose leases live a
/// hundred: its lease is sized to half its average over that life, and
/// the syncs ask for no other while what it holds lasts to the next sync
/// and half again; they ask as its last unit goes. (Topped up to the size at
/// every sync, it cost Redis a key in a call for every request or two.)
#[test]
fn a_lease_that_lasts_is_not_topped_up() {
    let sends = syncs_of(200, (100, 10_000, 150), 1_000_000, |i| u64::from(i % 4 == 0));
    assert!(sends.len() >= 3, "leased, and leased again: {sends:?}");
    assert!(sends.iter().all(|&(_, held, want)| held <= 1 && want >= 10), "(interval, held, asked): {sends:?}");
}

/// A key's leases, sync by sync, `intervals` syncs of the cadence of
/// `times` (the interval, a lease's life, how long an ask waits for its
/// answer), `spends(i)` requests of a unit in the i-th interval, each
/// sync's lease granted in full at once: each sync that sent something,
/// as (the interval, the units held then, the units asked for); the line
/// having `remaining` left at each.
fn syncs_of(
    intervals: u64,
    times: (u64, u64, u64),
    remaining: u64,
    spends: impl Fn(u64) -> u64,
) -> Vec<(u64, u64, u64)> {
    let (interval, life, wait) = times;
    let mut s = Slot::default();
    let mut sends = Vec::new();
    for i in 1..=intervals {
        let now = i * interval;
        for _ in 0..spends(i) {
            s.spend(now, 1);
        }
        s.end_interval();
        let held = s.left(now);
        let h = Horizon { next: now + interval, interval, ends: now + life, wait };
        if let Some(arg) = s.sync_asking(now, h, remaining, 1, true) {
            sends.push((i, held, arg.want));
            s.granted(now, arg.want, (1, 1), life);
        }
    }
    sends
}

/// A key no longer seen stops asking for leases: its plain average decays
/// to nothing. (It had stopped at 2 thousandths of a unit an interval,
/// rounded, which over a `life` of a thousand intervals and more,
/// `sync=10ms life=10s`, still came to two units: an idle key took a
/// lease of two units each time its last ended, as long as its record
/// lived.)
#[test]
fn a_key_no_longer_seen_stops_asking() {
    // (a second of 5 requests an interval, then nothing for a minute)
    let sends = syncs_of(6_000, (10_000, 10_000_000, 20_000), 1_000_000, |i| if i <= 100 { 5 } else { 0 });
    let asks: Vec<u64> = sends.iter().filter(|&&(_, _, want)| want > 0).map(|&(i, _, _)| i).collect();
    let late: Vec<_> = asks.iter().filter(|&&i| i > 200).collect();
    assert!(asks.first().is_some_and(|&i| i <= 2), "leased while seen: {asks:?}");
    assert!(late.is_empty(), "asked at intervals {late:?} with the key gone since interval 100");
}

/// A lease's size with a long life, where the line is too near its limit
/// for ten intervals' worth: an interval's estimate and half again (150 at 100
/// an interval), but two deviations of a random demand and a unit more at
/// a few units (4 + 5 at 4: half again, 6, ran dry before the next sync's
/// lease came); never more than the estimate over its life (7 for a life
/// of an interval and a half).
#[test]
fn a_lease_has_room_for_a_random_demand() {
    assert_eq!(size_of(100, 1_000, 2_000, 1), 150);
    assert_eq!(size_of(4, 1_000, 80, 1), 9);
    assert_eq!(size_of(2, 1_000, 40, 1), 2 + 3);
    assert_eq!(size_of(4, 150, u64::MAX, 1), 6, "the estimate over its life");
}

/// What a sync asks for a key steadily spending `units` an interval, for
/// a lease living `life` (intervals of 100), the line having `remaining`
/// left, shared by `nodes`.
fn size_of(units: u64, life: u64, remaining: u64, nodes: u64) -> u64 {
    let mut d = Demand::default();
    for _ in 0..40 {
        d.observe(units);
    }
    d.want_for(life, 100, remaining, nodes)
}

/// A busy key takes ten intervals of its demand (no more, however long
/// the lease lives) where its line is far from its limit: the nodes
/// holding as much would hold under an eighth of what it has left; else an
/// interval and a half. A key seen less than twice an interval
/// keeps its own size (half its average over the lease's life).
#[test]
fn a_busy_key_far_from_its_limit_holds_ten_intervals() {
    assert_eq!(size_of(100, 1_000, u64::MAX, 1), 1_000);
    assert_eq!(size_of(100, 100_000, u64::MAX, 1), 1_000, "ten intervals, not its life");
    assert_eq!(size_of(100, 500, u64::MAX, 1), 500, "no more than its life");
    assert_eq!(size_of(100, 1_000, 8_001, 1), 1_000);
    assert_eq!(size_of(100, 1_000, 8_000, 1), 150, "not far: an eighth of 8,000 is 1,000");
    assert_eq!(size_of(100, 1_000, 24_001, 3), 1_000);
    assert_eq!(size_of(100, 1_000, 24_000, 3), 150, "three nodes");
    assert_eq!(
        size_of(1, 100_000, u64::MAX, 1),
        499,
        "half its average over its life (which, rounded down, settles a hair under one)"
    );
}

/// So such a key is carried by a sync about once in eight intervals (its
/// lease topped up when it would not last to the next sync and half
/// again), not at every sync as a key near its limit is.
#[test]
fn a_busy_key_far_from_its_limit_is_synced_seldom() {
    let asks = |remaining| syncs_of(1_000, (100, 100_000, 150), remaining, |_| 100).len();
    assert!((100..=130).contains(&asks(u64::MAX)), "{} syncs in 1,000 intervals", asks(u64::MAX));
    assert!(asks(2_000) >= 900, "{} syncs in 1,000 intervals", asks(2_000));
}

/// A give-back its window no longer counts is not sent: a `fixed` lease's
/// of the window [0, 1 s) until 1 s, a `sliding` one's until the next
/// window ends; a `gcra` lease's always. What a sync asks for is sent.
#[test]
fn a_give_back_is_sent_while_its_window_counts() {
    let rate = Rate { count: 10, period_us: 1_000_000 };
    let arg = SyncArg { want: 0, back: 4, words: (1, 4) };
    let fixed = Leasing::new(Limit::new(Algorithm::Fixed, rate, 10).unwrap(), 500_000).unwrap();
    assert_eq!(fixed.worth_sending(arg, 999_999), Some(arg));
    assert_eq!(fixed.worth_sending(arg, 1_000_000), None);
    let asking = SyncArg { want: 3, ..arg };
    assert_eq!(fixed.worth_sending(asking, 1_000_000), Some(SyncArg { want: 3, back: 0, words: (0, 0) }));
    let sliding = Leasing::new(Limit::new(Algorithm::Sliding, rate, 10).unwrap(), 500_000).unwrap();
    assert_eq!(sliding.worth_sending(arg, 1_999_999), Some(arg));
    assert_eq!(sliding.worth_sending(arg, 2_000_000), None);
    let gcra = Leasing::new(Limit::new(Algorithm::Gcra, rate, 10).unwrap(), 100_000).unwrap();
    assert_eq!(gcra.worth_sending(arg, u64::MAX / 2), Some(arg));
}

/// A node's record of a key fits a slab slot of 256 bytes (nginx's slab
/// allocator rounds up to a power of two: at 264 bytes a record takes 512,
/// and a `lease=` zone holds half the keys). A lease's units left and
/// granted share a word: a lease holds at most `MAX_UNITS`, which a sync
/// asks for at most, and a record keeps it.
#[test]
fn a_record_fits_a_256_byte_slot() {
    const { assert!(Kept::WORDS * 8 <= 256, "a record above 256 bytes") };
    let mut s = Slot::default();
    assert!(!s.spend(10, u64::MAX / 2));
    let arg = s.sync(100, 200, u64::MAX, 1).expect("asked for");
    assert_eq!(arg.want, MAX_UNITS);
    s.granted(100, u64::MAX, (1, 2), 1_000);
    let s = through_words(s);
    assert_eq!(s.left(150), MAX_UNITS, "held to what was asked");
    let mut s = through_words(s);
    assert!(s.spend(150, MAX_UNITS - 1) && s.spend(160, 1) && !s.spend(170, 1));
    assert_eq!(through_words(s).left(170), 0);
}

proptest! {
    /// A sync between two of the cadence passes over the records whose
    /// leases have not ended reading only when the first ends
    /// (`Kept::ends_first_of`): whatever the words, what reading the
    /// whole record would say.
    #[test]
    fn when_a_records_first_lease_ends_is_read_from_its_words(
        mut w in proptest::collection::vec(any::<u64>(), Kept::WORDS),
        unset in proptest::collection::vec(any::<bool>(), 2),
    ) {
        // (leases never granted, as most of a zone's records hold, besides any bits)
        for (i, &u) in unset.iter().enumerate() {
            if u {
                w[i * 4] &= MAX_UNITS;
            }
        }
        let whole = Kept::read(&w).expect("enough words").slot.ends_first();
        prop_assert_eq!(Kept::ends_first_of(&w), whole);
        prop_assert_eq!(Kept::ends_first_of(&w[..Kept::WORDS - 1]), None, "too few words");
    }
}

proptest! {
    /// A sync of the cadence passes over the records `Kept::idle_of` says
    /// it would leave as they are: whatever else they hold and whatever
    /// the times, syncing one sends nothing and changes nothing. Those are
    /// the records with no lease and nothing to give back (their first 12
    /// words naught), asked for nothing this interval, an estimate of 2
    /// thousandths at most and a plain average of nothing.
    #[test]
    fn an_idle_record_is_left_as_it_is(
        mut w in proptest::collection::vec(any::<u64>(), Kept::WORDS),
        (kept_word, milli, mean, asked) in (0usize..=12, 0u64..=3, 0u64..=2, 0u64..=1),
        now in 0u64..u64::MAX / 4,
        (interval, life, wait) in (1u64..10_000_000, 0u64..100_000_000, 0u64..100_000_000),
        nodes in 1u64..10,
    ) {
        // (all naught but one of the leases' words, or none)
        for (i, x) in w[..12].iter_mut().enumerate() {
            if i != kept_word {
                *x = 0;
            }
        }
        w[12..15].copy_from_slice(&[milli, mean, asked]);
        let idle = w[..12].iter().all(|&x| x == 0) && milli <= 2 && mean == 0 && asked == 0;
        prop_assert_eq!(Kept::idle_of(&w), idle);
        prop_assert!(!Kept::idle_of(&w[..Kept::WORDS - 1]), "too few words");
        if idle {
            let kept = Kept::read(&w).expect("enough words");
            let mut synced = kept;
            let h = Horizon { next: now + interval, interval, ends: now + life, wait };
            prop_assert_eq!(synced.sync(now, h, nodes), None);
            prop_assert_eq!(synced, kept);
        }
    }
}
