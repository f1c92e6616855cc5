//! A call that Redis runs after nginx gave up on it charges nothing: with
//! `on_error=deny`, a request answered 429 because Redis did not answer in
//! time must not use up the client's quota when Redis runs the call later.
//!
//! Redis is paused (`CLIENT PAUSE ... ALL`, under which the script calls
//! queue) for longer than the zone's timeout. The timeouts are generous
//! (200 ms and more): a call keeps a quarter of its timeout for its reply's
//! way back, which on a loaded test machine, right after a pause, takes
//! tens of milliseconds.

mod common;

use std::collections::BTreeMap;
use std::thread;
use std::time::{Duration, Instant};

use common::redis::*;
use common::*;

/// The key's quota: far more than the tests send, so that it never runs
/// out and what it was charged can be read back exactly.
const QUOTA: u64 = 100_000;

/// A server with one Redis zone of `timeout` and `on_error=deny`, limiting
/// `/a.html` by the `X-K` header to [`QUOTA`] (nothing refills during a
/// test), its first calls (which load the script) done.
fn start(redis: &Redis, timeout: &str) -> Nginx {
    let ngx = Nginx::start(&server(
        &format!("rl_zone r redis={} timeout={timeout} on_error=deny;", redis.url()),
        &format!("location = /a.html {{ rl_limit zone=r key=$http_x_k rate=1r/h burst={QUOTA} algorithm=gcra; }}"),
    ));
    // Both workers (on another key: the tests' keys start full).
    for _ in 0..50 {
        if ngx.concurrent(20, "/a.html", &[("X-K", "warm")]).iter().all(|r| r.status == 200) {
            break;
        }
    }
    ngx
}

/// Pauses of 300 ms (the timeout is 200 ms) every 450 ms, for about 4 s,
/// while rounds of 50 simultaneous requests on one key run: every unit the
/// key was charged belongs to a request that was admitted.
#[test]
fn calls_run_after_the_timeout_charge_nothing() {
    let redis = Redis::start();
    let ngx = start(&redis, "200ms");
    let h = [("X-K", "k")];
    let begin = Instant::now();
    let (statuses, pauses) = thread::scope(|s| {
        let pauser = s.spawn(|| {
            let mut n = 0;
            while begin.elapsed() < Duration::from_secs(4) {
                assert_eq!(redis.cli(&["CLIENT", "PAUSE", "300", "ALL"]), "OK");
                n += 1;
                thread::sleep(Duration::from_millis(450));
            }
            n
        });
        let mut got: BTreeMap<u16, u64> = BTreeMap::new();
        for _ in 0..400 {
            if pauser.is_finished() {
                break;
            }
            for r in ngx.concurrent(50, "/a.html", &h) {
                *got.entry(r.status).or_insert(0) += 1;
            }
        }
        (got, pauser.join().unwrap())
    });
    // Let Redis run whatever is still queued, then read what is left.
    thread::sleep(Duration::from_millis(500));
    let last = ngx.get("/a.html", &h);
    assert_eq!(last.status, 200, "{last:?}");
    let admitted = statuses.get(&200).copied().unwrap_or(0) + 1;
    let denied = statuses.get(&429).copied().unwrap_or(0);
    let charged = QUOTA - last.num("X-RateLimit-Remaining");
    let log = ngx.error_log();
    let failures = failed_lines(&log, "r");
    eprintln!("{pauses} pauses: {statuses:?}; admitted {admitted}, charged {charged}");
    assert!(crash_lines(&log).is_empty(), "{:?}", crash_lines(&log));
    assert_eq!(statuses.keys().filter(|s| ![200, 429].contains(*s)).count(), 0, "{statuses:?}");
    // The pauses did make requests fail (else this test proves nothing).
    assert!(denied >= 50 && !failures.is_empty(), "{pauses} pauses, only {denied} requests denied");
    assert_eq!(charged, admitted, "charged {charged} units for {admitted} admitted requests ({denied} denied)");
}

/// A call that Redis runs after its deadline, while nginx still waits for
/// the reply (the last quarter of the timeout): the request is answered per
/// `on_error`, the log says why, and nothing is charged.
#[test]
fn late_call_is_logged_and_charges_nothing() {
    let redis = Redis::start();
    let ngx = start(&redis, "800ms");
    let h = [("X-K", "late")];
    let mut admitted = 0;
    for attempt in 0..5 {
        // Sent within 100 ms of the pause's start, the call's deadline
        // (600 ms after it is sent) comes before the pause ends (700 ms),
        // and its reply has at least 100 ms after that before nginx gives
        // up (800 ms after sending): room for a loaded machine.
        assert_eq!(redis.cli(&["CLIENT", "PAUSE", "700", "ALL"]), "OK");
        let before = ngx.error_log().len();
        let r = ngx.get("/a.html", &h);
        let log = ngx.error_log();
        let failures = failed_lines(&log[before..], "r");
        let late = failures.iter().any(|l| {
            l.contains(
                "failed: timed out (800 ms; Redis ran the call past its deadline and wrote nothing), denying request",
            )
        });
        if r.status == 200 {
            admitted += 1;
        }
        if r.status == 429 && late && failures.len() == 1 {
            // Redis has run the call by now: nothing was charged.
            thread::sleep(Duration::from_millis(800));
            let after = ngx.get("/a.html", &h);
            assert_eq!(after.status, 200, "{after:?}");
            assert_eq!(after.num("X-RateLimit-Remaining"), QUOTA - admitted - 1, "{after:?}");
            return;
        }
        eprintln!("attempt {attempt}: {} with {failures:?}: the request did not meet the pause as planned", r.status);
        thread::sleep(Duration::from_millis(800));
    }
    panic!("no late call in 5 attempts:\n{}", ngx.error_log());
}
