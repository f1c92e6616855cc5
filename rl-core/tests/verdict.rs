//! Deciding a request from its lines ([`combine`]), dry-run lines
//! included, and the excess `limit_req` logs ([`Limit::excess_milli`]).

use rl_core::limit::{Algorithm, Limit};
use rl_core::parse::Rate;
use rl_core::verdict::{combine, Decision, Outcome};

fn pass(delay_us: u64) -> Outcome {
    Outcome { admitted: true, delay_us, ..Outcome::default() }
}

fn reject() -> Outcome {
    Outcome { admitted: false, retry_after_us: Some(7), ..Outcome::default() }
}

/// The decision and, per line, whether it is charged.
fn decide(lines: &[(Outcome, bool)]) -> (Decision, Vec<bool>) {
    let d = combine(lines.iter().map(|(o, dry)| (o, *dry)));
    (d, lines.iter().map(|(o, _)| d.charges(o)).collect())
}

#[test]
fn no_line_admits() {
    assert_eq!(decide(&[]), (Decision { admitted: true, delay_us: 0 }, vec![]));
}

#[test]
fn enforced_lines_all_or_nothing() {
    let (d, ch) = decide(&[(pass(0), false), (pass(0), false)]);
    assert_eq!((d, ch), (Decision { admitted: true, delay_us: 0 }, vec![true, true]));
    let (d, ch) = decide(&[(pass(0), false), (reject(), false), (pass(5), false)]);
    assert_eq!((d, ch), (Decision { admitted: false, delay_us: 0 }, vec![false, false, false]));
}

#[test]
fn the_longest_enforced_delay() {
    let (d, ch) = decide(&[(pass(300), false), (pass(0), false), (pass(1200), false)]);
    assert_eq!((d, ch), (Decision { admitted: true, delay_us: 1200 }, vec![true, true, true]));
    // A rejection anywhere: no wait, nothing charged.
    let (d, ch) = decide(&[(pass(300), false), (reject(), false)]);
    assert_eq!((d, ch), (Decision { admitted: false, delay_us: 0 }, vec![false, false]));
}

#[test]
fn dry_run_lines_never_reject_nor_delay() {
    // A dry-run line that would reject: the request passes, the dry line
    // is not charged, the enforced one is.
    let (d, ch) = decide(&[(pass(0), false), (reject(), true)]);
    assert_eq!((d, ch), (Decision { admitted: true, delay_us: 0 }, vec![true, false]));
    // A dry-run line that would delay: no wait, and it is charged (it
    // would have admitted the request).
    let (d, ch) = decide(&[(pass(0), false), (pass(900), true)]);
    assert_eq!((d, ch), (Decision { admitted: true, delay_us: 0 }, vec![true, true]));
    // Only dry-run lines.
    let (d, ch) = decide(&[(reject(), true), (pass(5), true)]);
    assert_eq!((d, ch), (Decision { admitted: true, delay_us: 0 }, vec![false, true]));
}

#[test]
fn dry_run_lines_are_charged_only_with_the_request() {
    // The enforced line rejects: the dry-run line that would admit is not
    // charged either (as it would not be, enforced).
    let (d, ch) = decide(&[(reject(), false), (pass(0), true)]);
    assert_eq!((d, ch), (Decision { admitted: false, delay_us: 0 }, vec![false, false]));
    // Its delay is not the request's.
    let (d, _) = decide(&[(pass(100), false), (pass(5000), true)]);
    assert_eq!(d.delay_us, 100);
}

fn limit(alg: Algorithm, burst: u64, queue: u64) -> Limit {
    Limit::new(alg, Rate { count: 10, period_us: 1_000_000 }, burst).unwrap().with_queue(queue).unwrap()
}

#[test]
fn excess_as_limit_req_counts_it() {
    // limit_req rate=10r/s burst=4 nodelay (ours: burst=5): requests at one
    // instant log 0, 1, 2, 3, 4 for the admitted and 5.000 for the rejected.
    for alg in Algorithm::ALL {
        let l = limit(alg, 5, 0);
        let mut s = vec![0; l.state_words()];
        let now = 7_000_000_000;
        let got: Vec<(bool, u64)> = (0..7)
            .map(|_| {
                let o = l.acquire(&mut s, now, 1);
                (o.admitted, l.excess_milli(&o, 1))
            })
            .collect();
        let want = [(true, 0), (true, 1000), (true, 2000), (true, 3000), (true, 4000), (false, 5000), (false, 5000)];
        assert_eq!(got, want, "{alg}");
    }
}

#[test]
fn excess_fractions_and_queue() {
    // Half an interval later, half a request has drained.
    for alg in [Algorithm::TokenBucket, Algorithm::LeakyBucket, Algorithm::Gcra] {
        let l = limit(alg, 1, 3);
        let mut s = vec![0; l.state_words()];
        let now = 7_000_000_000;
        assert_eq!(l.excess_milli(&l.acquire(&mut s, now, 1), 1), 0, "{alg}");
        let o = l.acquire(&mut s, now + 50_000, 1);
        assert_eq!((o.delay_us, l.excess_milli(&o, 1)), (50_000, 500), "{alg}");
        let o = l.acquire(&mut s, now + 50_000, 1);
        assert_eq!((o.delay_us, l.excess_milli(&o, 1)), (150_000, 1500), "{alg}");
        let o = l.acquire(&mut s, now + 50_000, 1);
        assert_eq!((o.delay_us, l.excess_milli(&o, 1)), (250_000, 2500), "{alg}");
        // Rejected: a cost of 2 would hold 5.5.
        let o = l.acquire(&mut s, now + 50_000, 2);
        assert_eq!((o.admitted, l.excess_milli(&o, 2)), (false, 4500), "{alg}");
    }
    // A window half used, then a rejected cost of 3 on burst 5.
    let l = limit(Algorithm::SlidingLog, 5, 0);
    let mut s = vec![0; l.state_words()];
    l.acquire(&mut s, 1000, 3);
    let o = l.acquire(&mut s, 1000, 3);
    assert_eq!((o.admitted, l.excess_milli(&o, 3)), (false, 5000));
}

#[test]
fn excess_rounds_to_the_nearest_thousandth() {
    // 2r/h burst=2, both taken, a rejection 50 ms later: the level has drained by
    // 0.00003 of a request; limit_req would log 2.000, and so do we (not 1.999).
    for alg in [Algorithm::TokenBucket, Algorithm::LeakyBucket, Algorithm::Gcra] {
        let l = Limit::new(alg, rl_core::parse::parse_rate("2r/h").unwrap(), 2).unwrap();
        let mut s = vec![0; l.state_words()];
        let now = 7_000_000_000;
        l.acquire(&mut s, now, 1);
        l.acquire(&mut s, now, 1);
        let o = l.acquire(&mut s, now + 50_000, 1);
        assert_eq!((o.admitted, l.excess_milli(&o, 1)), (false, 2000), "{alg}");
    }
}

#[test]
fn uncharged_reads_what_is_left() {
    // A fresh key's check at cost 1 counts the charge (remaining B - 1, back to full in some
    // time); not charged, the state is full: what a check at cost 0 (rl_quota) says.
    let t = 5_000_000;
    for alg in Algorithm::ALL {
        let l = Limit::new(alg, rl_core::parse::parse_rate("10r/m").unwrap(), 10).unwrap();
        let s = vec![0; l.state_words()];
        let o = l.check(&s, t, 1);
        assert!(o.admitted && o.remaining == 9 && o.reset_us > 0, "{alg}: {o:?}");
        let u = o.uncharged(&l.left(&s, t));
        assert_eq!((u.admitted, u.remaining, u.reset_us, u.next_us), (true, 10, 0, 0), "{alg}");
    }
    // Below the burst: what is left, exactly. A token bucket of 10 a minute holding 7 of 10
    // is full in 18 s and has one more in 6 s; a request of 2 would leave 5, full in 30 s.
    let l = Limit::new(Algorithm::TokenBucket, rl_core::parse::parse_rate("10r/m").unwrap(), 10).unwrap();
    let mut s = vec![0; l.state_words()];
    for _ in 0..3 {
        l.acquire(&mut s, t, 1);
    }
    let o = l.check(&s, t, 2);
    assert_eq!((o.remaining, o.reset_us), (5, 30_000_000));
    let u = o.uncharged(&l.left(&s, t));
    assert_eq!(u, Outcome { remaining: 7, reset_us: 18_000_000, next_us: 6_000_000, ..o });
}
