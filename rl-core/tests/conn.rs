//! `concurrent`, the limit of `rl_conn`: units held from admission until
//! given back, against a model (a count of what is in flight); and
//! `rl_conn`'s arguments with the messages `nginx -t` prints for those it
//! refuses.

use proptest::prelude::*;
use rl_core::limit::wait::Lane;
use rl_core::limit::{Algorithm, Limit};
use rl_core::spec::ConnSpec;

#[test]
fn holds_until_given_back() {
    let l = Limit::concurrent(2).unwrap();
    assert_eq!(l.algorithm(), Algorithm::Concurrent);
    assert_eq!(l.state_words(), 1);
    let mut s = [0u64];
    let (a, ca) = l.acquire_charged(&mut s, 0, 1);
    assert!(a.admitted);
    assert_eq!((a.remaining, a.reset_us), (1, 0));
    let (b, cb) = l.acquire_charged(&mut s, 5_000_000, 1);
    assert!(b.admitted);
    assert_eq!(b.remaining, 0);
    assert!(l.held(&s));
    // However long it waits, a third waits for a give-back: time refills nothing.
    let c = l.acquire(&mut s, u64::MAX / 4, 1);
    assert!(!c.admitted);
    assert_eq!((c.remaining, c.retry_after_us, c.reset_us), (0, None, 0));
    l.refund(&mut s, &ca, 0);
    assert_eq!(l.check(&s, 0, 1).remaining, 0);
    assert!(l.check(&s, 0, 1).admitted);
    l.refund(&mut s, &cb, 0);
    assert_eq!(s, [0]);
    assert!(!l.held(&s));
}

#[test]
fn a_cost_holds_that_many_units() {
    let l = Limit::concurrent(10).unwrap();
    let mut s = [0u64];
    let (o, c) = l.acquire_charged(&mut s, 0, 7);
    assert!(o.admitted);
    assert_eq!((o.remaining, c.cost()), (3, 7));
    assert!(!l.acquire(&mut s, 0, 4).admitted);
    assert!(l.acquire(&mut s, 0, 3).admitted);
    // A cost of 0 passes and holds nothing, as on every line.
    assert!(l.acquire(&mut s, 0, 0).admitted);
    assert_eq!(s, [10]);
    // Nothing is held beyond the burst, and a refund never goes below 0.
    l.refund(&mut s, &c, 0);
    l.refund(&mut s, &c, 0);
    assert_eq!(s, [0]);
}

#[test]
fn no_other_algorithm_holds() {
    let l = Limit::new(Algorithm::Fixed, rl_core::parse::Rate { count: 1, period_us: 1_000_000 }, 1).unwrap();
    assert!(!l.held(&[5, 5]));
    assert!(!Algorithm::ALL.contains(&Algorithm::Concurrent));
    assert!(Limit::concurrent(0).is_err());
}

#[derive(Clone, Debug)]
enum Op {
    Take(u64),
    /// Give back the n-th request held (modulo how many are).
    Give(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![(0u64..4).prop_map(Op::Take), (0usize..8).prop_map(Op::Give)]
}

proptest! {
    /// Against a model: admitted iff what is held plus the cost fits the
    /// max; held never above it; every give-back frees exactly its cost;
    /// remaining is what is free after the request.
    #[test]
    fn in_flight_matches_the_model(max in 1u64..6, ops in prop::collection::vec(op(), 0..60)) {
        let l = Limit::concurrent(max).unwrap();
        let mut s = [0u64];
        let mut held: Vec<(u64, rl_core::limit::Charge)> = Vec::new();
        for (t, op) in ops.into_iter().enumerate() {
            let in_flight: u64 = held.iter().map(|(c, _)| c).sum();
            match op {
                Op::Take(cost) => {
                    let (o, charge) = l.acquire_charged(&mut s, t as u64 * 1_000_000, cost);
                    prop_assert_eq!(o.admitted, in_flight + cost <= max);
                    if o.admitted {
                        prop_assert_eq!(o.remaining, max - in_flight - cost);
                        prop_assert_eq!(charge.cost(), cost);
                        held.push((cost, charge));
                    } else {
                        prop_assert_eq!(o.remaining, max - in_flight);
                        prop_assert_eq!(o.retry_after_us, None);
                    }
                }
                Op::Give(i) if !held.is_empty() => {
                    let (_, charge) = held.remove(i % held.len());
                    l.refund(&mut s, &charge, 0);
                }
                Op::Give(_) => {}
            }
            let in_flight: u64 = held.iter().map(|(c, _)| c).sum();
            prop_assert_eq!(s[0], in_flight);
            prop_assert!(s[0] <= max);
            prop_assert_eq!(l.held(&s), in_flight > 0);
        }
    }
}

fn args(line: &'static str) -> Vec<&'static [u8]> {
    line.split(' ').filter(|a| !a.is_empty()).map(str::as_bytes).collect()
}

fn refused(line: &'static str) -> String {
    match ConnSpec::parse(&args(line)) {
        Ok(s) => panic!("{line}: accepted as {s:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_plain_conn_line() {
    let s = ConnSpec::parse(&args("zone=addr max=10")).unwrap();
    assert_eq!((s.zone, s.cost, s.limit.burst(), s.name), ("addr", 1, 10, None));
    assert_eq!(s.key().unwrap(), "$binary_remote_addr");
    assert!(!s.dry_run && !s.after_auth);
    let s = ConnSpec::parse(&args("dry_run zone=a key=$server_name max=3 cost=2 name=srv after_auth")).unwrap();
    assert_eq!((s.key().unwrap(), s.cost, s.name), ("$server_name", 2, Some("srv")));
    assert!(s.dry_run && s.after_auth);
    assert_eq!((s.queue, s.timeout_ms), (0, 60_000));
    let s = ConnSpec::parse(&args("zone=a max=3 queue=100 timeout=1500ms")).unwrap();
    assert_eq!((s.queue, s.timeout_ms, s.limit.queue()), (100, 1500, 100));
    // The units, then the waiting line: its live places, head, tail and a deadline a place, two
    // to a word.
    assert_eq!(s.limit.state_words(), 1 + 1 + 2 + 50);
    assert_eq!(s.lanes, vec![Lane { places: 100, reserve: 0, lend: false }]);
}

/// `priority=` and `classes=`: the seed's premium queue of 500 and
/// standard queue of 100, and a reserve for a critical class.
#[test]
fn classes_and_their_lanes() {
    let s = ConnSpec::parse(&args(
        "zone=a max=200 priority=$plan classes=critical:reserve=20%,premium:queue=500,standard:queue=100 timeout=5s",
    ))
    .unwrap();
    assert_eq!(s.priority, Some("$plan"));
    assert_eq!(s.queue, 600, "without queue=, the classes' places together");
    assert_eq!(
        s.lanes,
        vec![
            Lane { places: 600, reserve: 40, lend: false },
            Lane { places: 500, reserve: 0, lend: false },
            Lane { places: 100, reserve: 0, lend: false },
        ]
    );
    // The units, live places, the units of each class, head and tail of each, the places.
    assert_eq!(s.limit.state_words(), 1 + 1 + 3 + 2 * 3 + 300 + 250 + 50);
    let names: Vec<&str> = s.classes.iter().map(|c| c.name).collect();
    assert_eq!(rl_core::spec::classes::class_of(&names, b"premium"), 1);
    assert_eq!(rl_core::spec::classes::class_of(&names, b"critical"), 0);
    assert_eq!(rl_core::spec::classes::class_of(&names, b"unknown"), 2, "anything else is the lowest");
    assert_eq!(rl_core::spec::classes::class_of(&names, b""), 2);
    // Reserves without a queue: refused at once, never waiting.
    let s =
        ConnSpec::parse(&args("zone=a max=10 priority=$c classes=gold:reserve=3,silver:reserve=25%,bronze")).unwrap();
    assert_eq!(s.queue, 0);
    assert_eq!(s.limit.queue(), 0);
    let reserves: Vec<u64> = s.lanes.iter().map(|l| l.reserve).collect();
    assert_eq!(reserves, vec![3, 3, 0], "25% of 10 rounds up to 3");
    // (no places, but the units of each class: a reserve needs them)
    assert_eq!(s.limit.state_words(), 1 + 1 + 3 + 2 * 3);
    // A line's queue= bounds the places in all: premium may take standard's.
    let s = ConnSpec::parse(&args("zone=a max=1 queue=500 priority=$p classes=premium,standard:queue=100")).unwrap();
    let places: Vec<u64> = s.lanes.iter().map(|l| l.places).collect();
    assert_eq!((s.queue, places), (500, vec![500, 100]));
    // A class that never waits: premium waits, standard is refused at once.
    let s = ConnSpec::parse(&args("zone=a max=10 queue=50 priority=$p classes=premium:reserve=2,standard:queue=0"))
        .unwrap();
    let places: Vec<u64> = s.lanes.iter().map(|l| l.places).collect();
    assert_eq!(places, vec![50, 0]);
}

#[test]
fn class_refusals() {
    assert_eq!(refused("zone=a max=1 priority=$p"), "\"priority\" needs \"classes\" in \"rl_conn\" directive");
    assert_eq!(refused("zone=a max=1 classes=a,b"), "\"classes\" needs \"priority\" in \"rl_conn\" directive");
    assert_eq!(
        refused("zone=a max=1 priority=$p classes=a,a"),
        "invalid class \"a\" in \"rl_conn\" directive, the class is named twice"
    );
    assert_eq!(
        refused("zone=a max=1 priority=$p classes=a,b.c"),
        "invalid class \"b.c\" in \"rl_conn\" directive, a class name must be letters, digits, \"_\" and \"-\""
    );
    assert_eq!(
        refused("zone=a max=1 priority=$p classes=a:size=2,b"),
        "invalid class \"a:size=2\" in \"rl_conn\" directive, a class takes \"queue=\", \"reserve=\" and \"lend\""
    );
    assert_eq!(
        refused("zone=a max=4 priority=$p classes=a:reserve=4,b"),
        "invalid class \"a:reserve=4\" in \"rl_conn\" directive, reserve must be a number of units below max, or a percentage"
    );
    assert_eq!(
        refused("zone=a max=4 priority=$p classes=a,b:reserve=1"),
        "invalid class \"b\" in \"rl_conn\" directive, the lowest class has no class below it to keep a reserve from"
    );
    assert_eq!(
        refused("zone=a max=4 cost=2 priority=$p classes=a:reserve=2,b:reserve=1,c"),
        "the reserves of the classes above class \"c\" leave it 1 of max, less than cost=2 in \"rl_conn\" directive"
    );
    assert_eq!(
        refused("zone=a max=4 queue=10 priority=$p classes=a:queue=20,b"),
        "invalid class \"a\" in \"rl_conn\" directive, its queue=20 exceeds the line's queue=10"
    );
    assert_eq!(
        refused("zone=a max=4 priority=$p classes=a:queue=x,b"),
        "invalid class \"a:queue=x\" in \"rl_conn\" directive, queue must be a number of 0 to 65536"
    );
}

#[test]
fn refusals_say_what_and_where() {
    assert_eq!(refused("max=1"), "\"rl_conn\" directive must have \"zone\" parameter");
    assert_eq!(refused("zone=a"), "\"rl_conn\" directive must have \"max\" parameter");
    assert_eq!(refused("zone= max=1"), "invalid parameter \"zone=\" in \"rl_conn\" directive");
    // (as `rl_limit`'s, the key is asked for once the location's zones are counted)
    let empty_key = ConnSpec::parse(&args("zone=a max=1 key=")).unwrap().key().unwrap_err();
    assert_eq!(empty_key.to_string(), "invalid parameter \"key=\" in \"rl_conn\" directive");
    assert_eq!(refused("zone=a max=0"), "invalid max \"0\" in \"rl_conn\" directive, it must be a positive number");
    assert_eq!(refused("zone=a max=x"), "invalid max \"x\" in \"rl_conn\" directive, it must be a positive number");
    assert_eq!(refused("zone=a max=1048577"), "invalid max \"1048577\" in \"rl_conn\" directive, it is too large");
    assert_eq!(
        refused("zone=a max=2 cost=3"),
        "cost=3 exceeds max=2 in \"rl_conn\" directive: no request could ever pass"
    );
    assert_eq!(refused("zone=a max=2 rate=1r/s"), "invalid parameter \"rate=1r/s\" in \"rl_conn\" directive");
    assert_eq!(refused("zone=a max=2 dry_run dry_run"), "duplicate \"dry_run\" parameter in \"rl_conn\" directive");
    assert_eq!(refused("zone=a max=2 max=3"), "duplicate \"max\" parameter in \"rl_conn\" directive");
    assert_eq!(refused("zone=a max=1 queue=x"), "invalid queue \"x\" in \"rl_conn\" directive, it must be a number");
    assert_eq!(
        refused("zone=a max=1 queue=65537"),
        "invalid queue \"65537\" in \"rl_conn\" directive, it is too large (at most 65536)"
    );
    assert_eq!(refused("zone=a max=1 queue=2 timeout=soon"), "invalid timeout \"soon\" in \"rl_conn\" directive");
    assert_eq!(refused("zone=a max=1 queue=2 timeout=0"), "invalid timeout \"0\" in \"rl_conn\" directive");
    assert_eq!(
        refused("zone=a max=1 timeout=1s"),
        "\"timeout\" needs \"queue\" in \"rl_conn\" directive: a request that cannot wait never times out"
    );
    // limit_conn's habits.
    assert_eq!(refused("addr 10"), "invalid parameter \"addr\" in \"rl_conn\" directive, use \"zone=addr\"");
    assert_eq!(refused("zone=addr 10"), "invalid parameter \"10\" in \"rl_conn\" directive, use \"max=10\"");
}
