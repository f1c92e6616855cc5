//! The waiting line of `rl_conn ... queue=` against a model: first come,
//! first served across every waiter, at most `q` places, a place given up
//! when its waiter leaves or its deadline passes, and never more units in
//! flight than the max.

use std::collections::BTreeMap;

use proptest::prelude::*;
use rl_core::limit::wait::{words, Arrival, Turn, Wait};

#[derive(Clone, Debug)]
enum Op {
    Arrive {
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
        (1u64..3, 0u32..4).prop_map(|(cost, wait_s)| Op::Arrive { cost, wait_s }),
        (0usize..16).prop_map(Op::Poll),
        (0usize..16).prop_map(Op::Leave),
        (0usize..16).prop_map(Op::End),
        (0u32..3).prop_map(Op::Tick),
    ]
}

/// A waiter as the model knows it.
#[derive(Clone, Copy, Debug)]
struct Waiter {
    cost: u64,
    deadline: u32,
    present: bool,
}

struct State {
    units: u64,
    line: Vec<u64>,
}

fn view(s: &mut State, max: u64, q: u64) -> Wait<'_> {
    Wait { units: &mut s.units, max, q, line: &mut s.line }
}

proptest! {
    #[test]
    fn first_come_first_served(max in 1u64..4, q in 1u64..5, ops in prop::collection::vec(op(), 0..80)) {
        let mut s = State { units: 0, line: vec![0; words(q)] };
        let mut now = 1u32;
        // ticket -> waiter; admitted requests (their costs)
        let mut waiters: BTreeMap<u64, Waiter> = BTreeMap::new();
        let mut admitted: Vec<u64> = Vec::new();
        // Tickets issued so far (given-up places behind a live waiter count until the head passes them).
        let mut tail = 0u64;
        let live = |w: &Waiter, now: u32| w.present && w.deadline >= now;
        for op in ops {
            let in_flight: u64 = admitted.iter().sum();
            prop_assert_eq!(s.units, in_flight);
            prop_assert!(s.units <= max);
            // The head: the first live waiter (or none); places: from there to the last ticket.
            let first_live = waiters.iter().find(|(_, w)| live(w, now)).map(|(t, _)| *t);
            match op {
                Op::Arrive { cost, wait_s } => {
                    let deadline = now + wait_s;
                    let got = view(&mut s, max, q).arrive(now, cost, deadline);
                    let places = first_live.map_or(0, |h| tail - h);
                    match got {
                        Arrival::Admitted => {
                            prop_assert!(first_live.is_none(), "passed a live waiter");
                            prop_assert!(in_flight + cost <= max);
                            admitted.push(cost);
                        }
                        Arrival::Waiting { ticket } => {
                            prop_assert!(first_live.is_some() || in_flight + cost > max);
                            prop_assert!(places < q, "more than q places");
                            prop_assert_eq!(ticket, tail);
                            tail += 1;
                            waiters.insert(ticket, Waiter { cost, deadline, present: true });
                        }
                        Arrival::Refused => prop_assert!(places >= q || cost > max, "refused with room"),
                    }
                }
                Op::Poll(i) => {
                    let Some((&t, &w)) = waiters.iter().nth(i % waiters.len().max(1)) else { continue };
                    let got = view(&mut s, max, q).poll(now, w.cost, t);
                    match got {
                        Turn::Admitted => {
                            prop_assert!(live(&w, now));
                            prop_assert_eq!(first_live, Some(t), "admitted out of turn");
                            prop_assert!(in_flight + w.cost <= max);
                            admitted.push(w.cost);
                            waiters.remove(&t);
                        }
                        Turn::Waiting { ahead } => {
                            prop_assert!(live(&w, now));
                            prop_assert!(first_live != Some(t) || in_flight + w.cost > max);
                            prop_assert!(ahead < q);
                        }
                        Turn::Gone => {
                            prop_assert!(!live(&w, now), "a live waiter lost its place");
                            waiters.remove(&t);
                        }
                    }
                }
                Op::Leave(i) => {
                    let Some((&t, _)) = waiters.iter().nth(i % waiters.len().max(1)) else { continue };
                    view(&mut s, max, q).leave(now, t);
                    if let Some(w) = waiters.get_mut(&t) {
                        w.present = false;
                    }
                }
                Op::End(i) if !admitted.is_empty() => {
                    let cost = admitted.remove(i % admitted.len());
                    s.units -= cost;
                }
                Op::End(_) => {}
                Op::Tick(dt) => now += dt,
            }
        }
    }
}

#[test]
fn a_line_of_two() {
    let mut s = State { units: 0, line: vec![0; words(2)] };
    let mut w = view(&mut s, 1, 2);
    assert_eq!(w.arrive(10, 1, 20), Arrival::Admitted);
    assert_eq!(w.arrive(10, 1, 20), Arrival::Waiting { ticket: 0 });
    assert_eq!(w.arrive(10, 1, 20), Arrival::Waiting { ticket: 1 });
    assert_eq!(w.arrive(10, 1, 20), Arrival::Refused, "two places");
    assert_eq!(w.poll(11, 1, 1), Turn::Waiting { ahead: 1 });
    assert_eq!(w.poll(11, 1, 0), Turn::Waiting { ahead: 0 }, "nothing free yet");
    *w.units -= 1;
    assert_eq!(w.poll(11, 1, 1), Turn::Waiting { ahead: 1 }, "not its turn");
    assert_eq!(w.poll(11, 1, 0), Turn::Admitted);
    // The second waiter leaves; the next arrival waits behind nobody but the units.
    w.leave(11, 1);
    assert_eq!(w.waiting(), 0);
    assert_eq!(w.arrive(11, 1, 12), Arrival::Waiting { ticket: 2 });
    // Its deadline passes: its place is given up, and the next one is first.
    assert_eq!(w.poll(13, 1, 2), Turn::Gone);
    *w.units -= 1;
    assert_eq!(w.arrive(13, 1, 20), Arrival::Admitted);
}
