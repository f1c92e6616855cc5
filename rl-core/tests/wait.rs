//! The waiting line of `rl_conn ... queue=` against a model: first come,
//! first served within a class, a higher class first, at most `q` places
//! in all and a class's own places, a full line giving the newest place of
//! the lowest class to a higher arrival, a place given up when its waiter
//! leaves or its deadline passes, never more units in flight than `max`,
//! and none let in that would take the unused reserve of a class above.
//!
//! The model keeps each class's places in an ordered map (no ring, no
//! packed deadlines, no counters): what the state's words must agree with.

use std::collections::BTreeMap;

use proptest::prelude::*;
use rl_core::limit::wait::{words, Arrival, Gate, Lane, Turn, Wait};
use rl_core::limit::{Algorithm, Decision, Limit};
use rl_core::parse::Rate;

#[derive(Clone, Debug)]
enum Op {
    Arrive {
        lane: usize,
        cost: u64,
        wait_s: u32,
    },
    Poll(usize),
    Leave(usize),
    /// An admitted request ends.
    End(usize),
    Tick(u32),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0usize..3, 1u64..3, 0u32..4).prop_map(|(lane, cost, wait_s)| Op::Arrive { lane, cost, wait_s }),
        (0usize..16).prop_map(Op::Poll),
        (0usize..16).prop_map(Op::Leave),
        (0usize..16).prop_map(Op::End),
        (0u32..3).prop_map(Op::Tick),
    ]
}

/// A waiter as the model knows it.
#[derive(Clone, Copy, Debug)]
struct Waiter {
    deadline: u32,
}

struct State {
    units: u64,
    line: Vec<u64>,
}

fn view<'a>(s: &'a mut State, max: u64, q: u64, lanes: &'a [Lane]) -> Wait<'a> {
    Wait { gate: Gate::Units { units: &mut s.units, max }, q, lanes, line: &mut s.line }
}

/// The model: per class, its places by ticket, and the next ticket.
struct Model {
    places: Vec<BTreeMap<u64, Waiter>>,
    tails: Vec<u64>,
}

impl Model {
    fn advance(&mut self, now: u32) {
        for lane in &mut self.places {
            while lane.first_key_value().is_some_and(|(_, w)| w.deadline < now) {
                lane.pop_first();
            }
        }
    }

    fn head(&self, k: usize) -> u64 {
        self.places[k].keys().next().copied().unwrap_or(self.tails[k])
    }

    fn taken(&self, k: usize) -> u64 {
        self.tails[k] - self.head(k)
    }

    fn live(&self) -> u64 {
        self.places.iter().map(|l| l.len() as u64).sum()
    }
}

fn lanes_of(places: [u64; 3], reserve: [u64; 2], lend: [bool; 2]) -> Vec<Lane> {
    vec![
        Lane { places: places[0], reserve: reserve[0], lend: lend[0] && reserve[0] > 0 },
        Lane { places: places[1], reserve: reserve[1], lend: lend[1] && reserve[1] > 0 },
        Lane { places: places[2], reserve: 0, lend: false },
    ]
}

/// Whether a request of class `k` and `cost` may be let in beside what
/// each class holds (`held`): within `max` with the reserves of the
/// classes above it left, each less what that class holds; a lent reserve
/// of a class unused (holding nothing, nobody of it waiting: `waits`)
/// leaves nothing.
fn may_enter(max: u64, lanes: &[Lane], held: &[u64; 3], waits: &[bool; 3], k: usize, cost: u64) -> bool {
    let total: u64 = held.iter().sum();
    let kept: u64 = (0..k)
        .map(|j| match lanes[j].lend && held[j] == 0 && !waits[j] {
            true => 0,
            false => lanes[j].reserve.saturating_sub(held[j]),
        })
        .sum();
    total + cost + kept <= max
}

impl Model {
    fn waits(&self) -> [bool; 3] {
        [!self.places[0].is_empty(), !self.places[1].is_empty(), !self.places[2].is_empty()]
    }

    /// An arrival of class `k` at `now` (places past their deadline given
    /// up first), whose cost fits its class's `room` (`fits`); `may` says
    /// whether the gate lets it in, asked only when nobody of its class or
    /// above waits.
    #[allow(clippy::too_many_arguments)]
    fn arrive(
        &mut self,
        now: u32,
        lanes: &[Lane],
        q: u64,
        k: usize,
        fits: bool,
        deadline: u32,
        may: impl FnOnce(&Model) -> bool,
    ) -> Arrival {
        self.advance(now);
        let ahead = (0..=k).any(|j| !self.places[j].is_empty());
        if !fits {
            return Arrival::Refused;
        }
        if !ahead && may(self) {
            return Arrival::Admitted;
        }
        if self.taken(k) >= lanes[k].places {
            return Arrival::Refused;
        }
        while self.live() >= q {
            // The newest place of the lowest class below k.
            let Some(j) = (k + 1..3).rev().find(|&j| !self.places[j].is_empty()) else {
                return Arrival::Refused;
            };
            self.places[j].pop_last();
        }
        let t = self.tails[k];
        self.tails[k] += 1;
        self.places[k].insert(t, Waiter { deadline });
        Arrival::Waiting { ticket: t }
    }

    /// The waiter of class `k` and ticket `t` looks at `now`; `may` as in
    /// [`Model::arrive`], asked only at the head of the highest waiting class.
    fn poll(&mut self, now: u32, k: usize, t: u64, may: impl FnOnce(&Model) -> bool) -> Turn {
        self.advance(now);
        match self.places[k].get(&t).copied() {
            None => Turn::Gone,
            Some(w) if w.deadline < now => {
                self.places[k].remove(&t);
                Turn::Gone
            }
            Some(_) => {
                let above: u64 = (0..k).map(|j| self.taken(j)).sum();
                let head = self.head(k);
                if t > head || above > 0 || !may(self) {
                    Turn::Waiting { ahead: above + t - head }
                } else {
                    self.places[k].remove(&t);
                    self.advance(now);
                    Turn::Admitted
                }
            }
        }
    }
}

proptest! {
    #[test]
    fn classes_in_order(
        max in 1u64..5,
        q in 1u64..6,
        places in [1u64..4, 1u64..4, 1u64..4],
        reserve in [0u64..3, 0u64..2],
        lend in [any::<bool>(), any::<bool>()],
        ops in prop::collection::vec(op(), 0..100),
    ) {
        let lanes = lanes_of(places, reserve, lend);
        let mut s = State { units: 0, line: vec![0; words(&lanes)] };
        let mut m = Model { places: vec![BTreeMap::new(); 3], tails: vec![0; 3] };
        let mut now = 1u32;
        // Admitted requests: (class, cost).
        let mut admitted: Vec<(usize, u64)> = Vec::new();
        // Every waiter ever given a place, to poll or leave with: (lane, ticket, cost).
        let mut known: Vec<(usize, u64, u64)> = Vec::new();
        for op in ops {
            let mut held = [0u64; 3];
            for &(k, cost) in &admitted {
                held[k] += cost;
            }
            let in_flight: u64 = held.iter().sum();
            prop_assert_eq!(s.units, in_flight);
            prop_assert!(s.units <= max);
            prop_assert!(m.live() <= q, "more than q places");
            prop_assert_eq!(view(&mut s, max, q, &lanes).waiting(), m.live());
            match op {
                Op::Arrive { lane: k, cost, wait_s } => {
                    let deadline = now + wait_s;
                    let got = view(&mut s, max, q, &lanes).arrive(now, k, cost, deadline);
                    let room = max.saturating_sub(lanes[..k].iter().filter(|l| !l.lend).map(|l| l.reserve).sum());
                    let may = |m: &Model| may_enter(max, &lanes, &held, &m.waits(), k, cost);
                    let want = m.arrive(now, &lanes, q, k, cost <= room, deadline, may);
                    prop_assert_eq!(got, want);
                    match got {
                        Arrival::Admitted => admitted.push((k, cost)),
                        Arrival::Waiting { ticket } => known.push((k, ticket, cost)),
                        Arrival::Refused => {}
                    }
                }
                Op::Poll(i) => {
                    let Some(&(k, t, cost)) = known.get(i % known.len().max(1)) else { continue };
                    let got = view(&mut s, max, q, &lanes).poll(now, k, cost, t);
                    let want = m.poll(now, k, t, |m| may_enter(max, &lanes, &held, &m.waits(), k, cost));
                    prop_assert_eq!(got, want);
                    if got == Turn::Admitted {
                        // (spelled out: nobody live of a higher class, nobody before it in its own)
                        prop_assert!((0..k).all(|j| m.places[j].is_empty()));
                        prop_assert!(m.places[k].range(..t).next().is_none());
                        admitted.push((k, cost));
                    }
                }
                Op::Leave(i) => {
                    let Some(&(k, t, _)) = known.get(i % known.len().max(1)) else { continue };
                    view(&mut s, max, q, &lanes).leave(now, k, t);
                    m.places[k].remove(&t);
                    m.advance(now);
                }
                Op::End(i) if !admitted.is_empty() => {
                    let (k, cost) = admitted.remove(i % admitted.len());
                    view(&mut s, max, q, &lanes).give_back(k, cost);
                }
                Op::End(_) => {}
                Op::Tick(dt) => now += dt,
            }
        }
    }
}

fn one_lane(q: u64) -> Vec<Lane> {
    vec![Lane { places: q, reserve: 0, lend: false }]
}

#[test]
fn a_line_of_two() {
    let lanes = one_lane(2);
    let mut s = State { units: 0, line: vec![0; words(&lanes)] };
    let mut w = view(&mut s, 1, 2, &lanes);
    assert_eq!(w.arrive(10, 0, 1, 20), Arrival::Admitted);
    assert_eq!(w.arrive(10, 0, 1, 20), Arrival::Waiting { ticket: 0 });
    assert_eq!(w.arrive(10, 0, 1, 20), Arrival::Waiting { ticket: 1 });
    assert_eq!(w.arrive(10, 0, 1, 20), Arrival::Refused, "two places");
    assert_eq!(w.poll(11, 0, 1, 1), Turn::Waiting { ahead: 1 });
    assert_eq!(w.poll(11, 0, 1, 0), Turn::Waiting { ahead: 0 }, "nothing free yet");
    w.give_back(0, 1);
    assert_eq!(w.poll(11, 0, 1, 1), Turn::Waiting { ahead: 1 }, "not its turn");
    assert_eq!(w.poll(11, 0, 1, 0), Turn::Admitted);
    // The second waiter leaves; the next arrival waits behind nobody but the units.
    w.leave(11, 0, 1);
    assert_eq!(w.waiting(), 0);
    assert_eq!(w.arrive(11, 0, 1, 12), Arrival::Waiting { ticket: 2 });
    // Its deadline passes: its place is given up, and the next one is first.
    assert_eq!(w.poll(13, 0, 1, 2), Turn::Gone);
    w.give_back(0, 1);
    assert_eq!(w.arrive(13, 0, 1, 20), Arrival::Admitted);
}

/// The seed's premium queue of 500 and standard queue of 100, scaled
/// down: premium 3 places, standard 2, 4 in all. Premium goes first; a
/// full line gives the newest standard place to a premium arrival.
#[test]
fn premium_first_and_taking_a_standard_place() {
    let lanes = [Lane { places: 3, reserve: 0, lend: false }, Lane { places: 2, reserve: 0, lend: false }];
    let mut s = State { units: 0, line: vec![0; words(&lanes)] };
    let mut w = view(&mut s, 1, 4, &lanes);
    assert_eq!(w.arrive(10, 1, 1, 60), Arrival::Admitted);
    assert_eq!(w.arrive(10, 1, 1, 60), Arrival::Waiting { ticket: 0 });
    assert_eq!(w.arrive(10, 1, 1, 60), Arrival::Waiting { ticket: 1 });
    assert_eq!(w.arrive(10, 1, 1, 60), Arrival::Refused, "standard has two places");
    assert_eq!(w.arrive(10, 0, 1, 60), Arrival::Waiting { ticket: 0 });
    assert_eq!(w.arrive(10, 0, 1, 60), Arrival::Waiting { ticket: 1 });
    assert_eq!(w.waiting(), 4);
    // The line is full: a premium arrival takes the newest standard place.
    assert_eq!(w.arrive(10, 0, 1, 60), Arrival::Waiting { ticket: 2 });
    assert_eq!(w.waiting(), 4);
    assert_eq!(w.poll(10, 1, 1, 1), Turn::Gone, "the newest standard place was taken");
    assert_eq!(w.poll(10, 1, 1, 0), Turn::Waiting { ahead: 3 }, "three premium before it");
    assert_eq!(w.arrive(10, 0, 1, 60), Arrival::Refused, "premium has three places");
    // A slot is freed each time: premium in order, standard last.
    w.give_back(1, 1);
    for t in 0..3 {
        assert_eq!(w.poll(11, 1, 1, 0), Turn::Waiting { ahead: 3 - t });
        assert_eq!(w.poll(11, 0, 1, t), Turn::Admitted);
        w.give_back(0, 1);
    }
    assert_eq!(w.poll(11, 1, 1, 0), Turn::Admitted);
    assert_eq!(w.waiting(), 0);
}

/// `max=4` with a reserve of 2 for premium: standard holds at most two;
/// premium finds its two whatever standard does, and what premium holds
/// itself uses its reserve up: standard may then take the rest.
#[test]
fn a_reserve_keeps_units_for_the_class_above() {
    let lanes = [Lane { places: 2, reserve: 2, lend: false }, Lane { places: 2, reserve: 0, lend: false }];
    let mut s = State { units: 0, line: vec![0; words(&lanes)] };
    let mut w = view(&mut s, 4, 4, &lanes);
    assert_eq!(w.arrive(10, 1, 1, 60), Arrival::Admitted);
    assert_eq!(w.arrive(10, 1, 1, 60), Arrival::Admitted);
    assert_eq!(w.arrive(10, 1, 1, 60), Arrival::Waiting { ticket: 0 }, "two units kept for premium");
    assert_eq!((w.free(1), w.free(0)), (0, 2));
    assert_eq!(w.arrive(10, 0, 1, 60), Arrival::Admitted, "premium passes the standard waiter");
    assert_eq!(w.arrive(10, 0, 1, 60), Arrival::Admitted);
    assert_eq!(w.arrive(10, 0, 1, 60), Arrival::Waiting { ticket: 0 });
    // A standard request ends: the premium waiter first.
    w.give_back(1, 1);
    assert_eq!(w.poll(10, 1, 1, 0), Turn::Waiting { ahead: 1 });
    assert_eq!(w.poll(10, 0, 1, 0), Turn::Admitted);
    // Premium holds two, its whole reserve: standard may take the last unit.
    w.give_back(0, 1);
    assert_eq!((w.free(1), w.free(0)), (1, 1));
    assert_eq!(w.poll(10, 1, 1, 0), Turn::Admitted);
    // Premium's requests end: standard holds two, and no more.
    w.give_back(0, 2);
    assert_eq!((w.free(1), w.free(0)), (0, 2));
    assert_eq!(w.arrive(10, 1, 1, 60), Arrival::Waiting { ticket: 1 });
}

/// Three classes, `max=10`, critical keeping 4 and premium 2: standard
/// holds 4 at most; premium, below its reserve, always finds a unit
/// whatever standard holds, and critical its 4 whatever the others hold.
#[test]
fn nested_reserves_hold_against_the_classes_below() {
    let lanes = [
        Lane { places: 0, reserve: 4, lend: false },
        Lane { places: 0, reserve: 2, lend: false },
        Lane { places: 0, reserve: 0, lend: false },
    ];
    let mut s = State { units: 0, line: vec![0; words(&lanes)] };
    let mut w = view(&mut s, 10, 0, &lanes);
    for _ in 0..4 {
        assert_eq!(w.arrive(10, 2, 1, 0), Arrival::Admitted);
    }
    assert_eq!(w.arrive(10, 2, 1, 0), Arrival::Refused, "standard's fifth: the reserves above it");
    assert_eq!(w.arrive(10, 1, 1, 0), Arrival::Admitted);
    assert_eq!(w.arrive(10, 1, 1, 0), Arrival::Admitted, "premium's reserve, whatever standard held");
    assert_eq!(w.arrive(10, 1, 1, 0), Arrival::Refused, "beyond it: critical's is unused");
    for _ in 0..4 {
        assert_eq!(w.arrive(10, 0, 1, 0), Arrival::Admitted);
    }
    assert_eq!(w.arrive(10, 0, 1, 0), Arrival::Refused, "max=10");
    // Critical above its reserve outranks premium: it takes what premium does not hold.
    w.give_back(1, 2);
    assert_eq!(w.arrive(10, 0, 1, 0), Arrival::Admitted);
    assert_eq!(w.arrive(10, 1, 1, 0), Arrival::Admitted);
    assert_eq!(w.arrive(10, 2, 1, 0), Arrival::Refused);
}

// A rate line's waiting line (`rl_limit ... queue= classes=`): the same
// order as a concurrency line's, a waiter let in only where the algorithm
// admits a request of its cost plus the reserves of the classes above it
// (as a request of its class is decided without a queue), charged its
// cost alone. The model decides with the algorithm on a copy of its words.
proptest! {
    #[test]
    fn a_rate_line_in_class_order(
        algorithm in prop_oneof![Just(Algorithm::Gcra), Just(Algorithm::TokenBucket), Just(Algorithm::LeakyBucket)],
        count in 1u64..5,
        burst in 3u64..6,
        q in 1u64..6,
        places in [1u64..4, 1u64..4, 1u64..4],
        reserve in [0u64..2, 0u64..2],
        ops in prop::collection::vec(op(), 0..100),
    ) {
        let lanes = lanes_of(places, reserve, [false, false]);
        let kept = vec![0, reserve[0], reserve[0] + reserve[1]];
        let limit = Limit::new(algorithm, Rate { count, period_us: 1_000_000 }, burst)
            .unwrap()
            .with_rate_lanes(q, &lanes)
            .unwrap();
        let algo = limit.state_words() - words(&lanes);
        let mut state = vec![0u64; limit.state_words()];
        // The model: the algorithm's words alone, and the places.
        let mut ms = vec![0u64; algo];
        let mut m = Model { places: vec![BTreeMap::new(); 3], tails: vec![0; 3] };
        let mut now_us = 1_000_000u64;
        let mut known: Vec<(usize, u64, u64)> = Vec::new();
        let mut admitted = [0u64; 3];
        for op in ops {
            let now = (now_us / 1_000_000) as u32;
            prop_assert!(m.live() <= q, "more than q places");
            prop_assert_eq!(&state[..algo], &ms[..], "the algorithm's words");
            prop_assert_eq!(limit.held(&state), m.live() > 0, "a state with waiters is kept");
            let may = |ms: &[u64], k: usize, cost: u64| limit.check_keeping(ms, now_us, cost, kept[k]).admitted;
            match op {
                Op::Arrive { lane: k, cost, wait_s } => {
                    let deadline = now + wait_s;
                    let mut w = limit.rate_wait(&mut state, &lanes, q, &kept, now_us).unwrap();
                    let got = w.arrive(now, k, cost, deadline);
                    let taken = w.taken().unwrap();
                    let want = m.arrive(now, &lanes, q, k, cost <= burst - kept[k], deadline, |_| may(&ms, k, cost));
                    prop_assert_eq!(got, want);
                    match got {
                        Arrival::Admitted => {
                            let mut d = Decision::default();
                            limit.acquire_keeping(&mut ms, now_us, cost, kept[k], &mut d);
                            prop_assert_eq!(taken.charge.cost(), cost, "charged its cost alone");
                            admitted[k] += cost;
                        }
                        Arrival::Waiting { ticket } => known.push((k, ticket, cost)),
                        Arrival::Refused => {}
                    }
                }
                Op::Poll(i) => {
                    let Some(&(k, t, cost)) = known.get(i % known.len().max(1)) else { continue };
                    let got = limit.rate_wait(&mut state, &lanes, q, &kept, now_us).unwrap().poll(now, k, cost, t);
                    let want = m.poll(now, k, t, |_| may(&ms, k, cost));
                    prop_assert_eq!(got, want);
                    if got == Turn::Admitted {
                        let mut d = Decision::default();
                        limit.acquire_keeping(&mut ms, now_us, cost, kept[k], &mut d);
                        prop_assert!((0..k).all(|j| m.places[j].is_empty()));
                        prop_assert!(m.places[k].range(..t).next().is_none());
                        admitted[k] += cost;
                    }
                }
                Op::Leave(i) => {
                    let Some(&(k, t, _)) = known.get(i % known.len().max(1)) else { continue };
                    limit.rate_wait(&mut state, &lanes, q, &kept, now_us).unwrap().leave(now, k, t);
                    m.places[k].remove(&t);
                    m.advance(now);
                }
                // (a rate line gives nothing back: its units come back with time)
                Op::End(_) => {}
                Op::Tick(dt) => now_us += u64::from(dt) * 400_000,
            }
        }
        // The bound: never more than the algorithm lets through from a fresh state.
        let elapsed_s = (now_us - 1_000_000).div_ceil(1_000_000);
        prop_assert!(admitted.iter().sum::<u64>() <= burst + count * elapsed_s + count);
    }
}

/// Premium waits ahead of standard on a rate line, whatever came first;
/// the line's own queue stays 0 (nothing is let in over the burst).
#[test]
fn a_rate_line_lets_premium_in_first() {
    let lanes = [Lane { places: 5, reserve: 0, lend: false }, Lane { places: 5, reserve: 0, lend: false }];
    let kept = [0, 0];
    let limit = Limit::new(Algorithm::Gcra, Rate { count: 10, period_us: 1_000_000 }, 1)
        .unwrap()
        .with_rate_lanes(10, &lanes)
        .unwrap();
    let mut state = vec![0u64; limit.state_words()];
    let t0 = 1_000_000u64;
    let mut at = |now_us: u64| limit.rate_wait(&mut state, &lanes, 10, &kept, now_us).unwrap().arrive(1, 1, 1, 9);
    assert_eq!(at(t0), Arrival::Admitted);
    assert_eq!(at(t0), Arrival::Waiting { ticket: 0 });
    assert_eq!(at(t0), Arrival::Waiting { ticket: 1 });
    let mut w = limit.rate_wait(&mut state, &lanes, 10, &kept, t0 + 1000).unwrap();
    assert_eq!(w.arrive(1, 0, 1, 9), Arrival::Waiting { ticket: 0 }, "the burst is spent: premium waits too");
    assert_eq!(w.retry_us(0, 1), Some(99_000));
    // 100 ms on, one more passes: premium's, though standard came first.
    let mut w = limit.rate_wait(&mut state, &lanes, 10, &kept, t0 + 100_000).unwrap();
    assert_eq!(w.poll(1, 1, 1, 0), Turn::Waiting { ahead: 1 });
    assert_eq!(w.poll(1, 0, 1, 0), Turn::Admitted);
    assert_eq!(w.poll(1, 1, 1, 0), Turn::Waiting { ahead: 0 }, "the next unit is 100 ms away");
    let mut w = limit.rate_wait(&mut state, &lanes, 10, &kept, t0 + 200_000).unwrap();
    assert_eq!(w.poll(1, 1, 1, 1), Turn::Waiting { ahead: 1 });
    assert_eq!(w.poll(1, 1, 1, 0), Turn::Admitted);
}
