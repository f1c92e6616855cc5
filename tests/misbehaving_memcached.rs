//! Memcached servers that misbehave: a fake server
//! (`common/fake_memcached.rs`) that is silent, answers garbage, half a
//! reply, a server error, too late, or closes every connection at once; and
//! a real `memcached` frozen by SIGSTOP. Each time, on a zone with
//! `timeout=100ms`, with `on_error=allow` and with `on_error=deny`, every
//! request is answered within the timeout (plus a margin for a loaded
//! machine) as `on_error` says, the error log names the zone, the server and
//! the decision (at most 3 lines a second per worker), the error is counted, and
//! nothing crashes. A frozen memcached, once thawed, limits exactly again.

mod common;
#[path = "common/fake_memcached.rs"]
mod fake_memcached;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::memcached::*;
use common::redis::timed_get;
use common::*;
use fake_memcached::{Behaviour, FakeMemcached};

/// The zones' timeout, in ms.
const TIMEOUT_MS: u64 = 100;
/// Added to the timeout for the slowest answer a loaded test machine may give.
const MARGIN: Duration = Duration::from_secs(1);

fn on_error(allow: bool) -> &'static str {
    if allow {
        "allow"
    } else {
        "deny"
    }
}

/// The status `on_error` gives: allow lets the request through, deny
/// answers the zone's rejection status (429 by default).
fn on_error_status(allow: bool) -> u16 {
    if allow {
        200
    } else {
        429
    }
}

/// A server whose `/a.html` is limited on memcached zone `z` (on `addr`),
/// per `X-K` key, 100 an hour in fixed windows; `/metrics` its metrics.
fn conf(addr: &str, allow: bool) -> String {
    server(
        &format!("rl_zone z memcached={addr} timeout={TIMEOUT_MS}ms on_error={};", on_error(allow)),
        "location = /a.html { rl_limit zone=z key=$http_x_k rate=100r/h burst=100 algorithm=fixed; }\n\
         location = /metrics { rl_metrics; }\n\
         location / { }",
    )
}

/// One answered request.
#[derive(Clone, Debug)]
struct Hit {
    status: u16,
    took: Duration,
}

/// `threads` clients sending GET `path` one after another, each request with
/// its own `X-K` key, until `dur` has passed.
fn hammer(port: u16, path: &str, threads: usize, dur: Duration) -> Vec<Hit> {
    let hits = Arc::new(Mutex::new(Vec::new()));
    let deadline = Instant::now() + dur;
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (hits, path) = (hits.clone(), path.to_string());
            thread::spawn(move || {
                let mut mine = Vec::new();
                let mut i = 0;
                while Instant::now() < deadline {
                    let key = format!("t{t}-{i}");
                    i += 1;
                    let (resp, took) = timed_get(port, &path, &[("X-K", &key)]);
                    mine.push(Hit { status: resp.status, took });
                }
                hits.lock().unwrap().extend(mine);
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let hits = hits.lock().unwrap().clone();
    hits
}

/// Every hit has `status` and came within the timeout plus [`MARGIN`].
fn assert_answered(hits: &[Hit], status: u16, what: &str) {
    let within = Duration::from_millis(TIMEOUT_MS) + MARGIN;
    assert!(!hits.is_empty(), "{what}: no request answered");
    let wrong: Vec<&Hit> = hits.iter().filter(|h| h.status != status).take(5).collect();
    assert!(wrong.is_empty(), "{what}: expected every request answered {status}, got {wrong:?}");
    let slow: Vec<Duration> = hits.iter().map(|h| h.took).filter(|t| *t > within).take(10).collect();
    assert!(slow.is_empty(), "{what}: requests slower than {within:?}: {slow:?}");
}

/// Lines that show a crash, a fatal error or a panic.
fn bad_lines(log: &str) -> Vec<&str> {
    let mut bad = crash_lines(log);
    bad.extend(log.lines().filter(|l| l.contains("[crit]") || l.contains("panic")));
    bad
}

/// The error log has zone `z`'s failure lines for the server on `port`, each
/// `... memcached 127.0.0.1:PORT failed: <what>, allowing|denying request
/// (N errors so far)`, at most 3 in any second from one worker (the log
/// budget is each worker's); nothing crashed.
fn assert_logged(log: &str, port: u16, allow: bool, what: &str) {
    let lines = mc_failed_lines(log, "z");
    assert!(!lines.is_empty(), "{what}: no failure line of zone \"z\" in:\n{log}");
    let decision = if allow { "allowing request (" } else { "denying request (" };
    let server = format!("rl_zone \"z\" memcached 127.0.0.1:{port} failed: ");
    for l in &lines {
        let count = l.split_once(decision).and_then(|(_, rest)| rest.split_once(" errors so far)"));
        assert!(
            l.contains(&server) && count.is_some_and(|(n, _)| n.parse::<u64>().is_ok_and(|n| n >= 1)),
            "{what}: not \"{server}<what>, {decision}N errors so far)\": {l}"
        );
    }
    // nginx's log lines start with the time to the second and the worker's pid:
    // "2025/01/31 12:34:56 [error] 1234#1234: ...".
    let mut per_second: BTreeMap<(&str, &str), usize> = BTreeMap::new();
    for l in &lines {
        let pid = l.get(28..).and_then(|r| r.split('#').next()).unwrap_or("");
        *per_second.entry((l.get(..19).unwrap_or(""), pid)).or_insert(0) += 1;
    }
    assert!(per_second.values().all(|n| *n <= 3), "{what}: more than 3 failure lines a second: {per_second:?}");
    assert!(bad_lines(log).is_empty(), "{what}: {:?}", bad_lines(log));
}

/// Zone `z`'s `nginx_rl_memcached_errors_total` of `kind` (all kinds if `None`).
fn errors(ngx: &Nginx, kind: Option<&str>) -> f64 {
    let text = ngx.get("/metrics", &[]).body;
    let wanted = |l: &str| {
        l.starts_with("nginx_rl_memcached_errors_total{")
            && l.contains("zone=\"z\"")
            && kind.is_none_or(|k| l.contains(&format!("kind=\"{k}\"")))
    };
    text.lines().filter(|l| wanted(l)).filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok()).sum()
}

/// Two seconds of load from 4 clients on a zone whose server is a fake
/// behaving as `b`, with `on_error` allow then deny: every answer is the
/// `on_error` one in time, the failures are logged and counted (as `kind`,
/// where the kind is not a matter of choice).
fn misbehave(b: Behaviour, kind: Option<&str>) {
    for allow in [true, false] {
        let what = format!("{b:?}, timeout={TIMEOUT_MS}ms on_error={}", on_error(allow));
        let fake = FakeMemcached::start(b);
        let ngx = Nginx::start(&conf(&fake.addr(), allow));
        let hits = hammer(ngx.port, "/a.html", 4, Duration::from_secs(2));
        eprintln!(
            "{what}: {} requests, max {:?}, {} connections, {} commands",
            hits.len(),
            hits.iter().map(|h| h.took).max().unwrap_or_default(),
            fake.connections(),
            fake.commands()
        );
        assert_answered(&hits, on_error_status(allow), &what);
        assert_logged(&ngx.error_log(), fake.port, allow, &what);
        assert!(errors(&ngx, kind) >= 1.0, "{what}: no error of kind {kind:?} counted");
    }
}

/// A server that reads commands and never answers: requests fail by the
/// timeout.
#[test]
fn silent_server() {
    misbehave(Behaviour::Silent, Some("timeout"));
}

/// A server that answers `HELLO`: not a memcached reply.
#[test]
fn garbage_reply() {
    misbehave(Behaviour::Garbage, Some("reply"));
}

/// Half a `VA` reply, then silence: requests fail by the timeout.
#[test]
fn half_a_reply() {
    misbehave(Behaviour::Half, Some("timeout"));
}

/// A server that closes each connection at once.
#[test]
fn connection_closed_at_once() {
    misbehave(Behaviour::CloseAtOnce, Some("connection"));
}

/// Replies that come 300 ms late, after the 100 ms timeout.
#[test]
fn replies_later_than_the_timeout() {
    misbehave(Behaviour::Slow(Duration::from_millis(300)), Some("timeout"));
}

/// `SERVER_ERROR out of memory` to every command. (Whether that counts as a
/// bad reply or as a refusal is the module's call: any kind.)
#[test]
fn server_error_reply() {
    misbehave(Behaviour::ServerError, None);
}

/// A server whose every reply is followed by bytes no command asked for:
/// each request is decided on its reply (the limit's headers, nothing
/// logged), and the connection, no longer in step, is closed after each
/// round trip, so that no round trip reads another's bytes as its reply
/// (before, the second request got `JUNK` as its reply: a failure, and
/// `on_error`).
#[test]
fn bytes_after_a_reply_close_the_connection() {
    let fake = FakeMemcached::start(Behaviour::Trailing);
    let ngx = Nginx::start(&conf(&fake.addr(), false));
    for i in 0..5 {
        let r = ngx.get("/a.html", &[("X-K", "k")]);
        assert_eq!((r.status, r.header("X-RateLimit-Limit")), (200, Some("100")), "request {i}: {r:?}");
    }
    let log = ngx.error_log();
    assert!(mc_failed_lines(&log, "z").is_empty(), "{:?}", mc_failed_lines(&log, "z"));
    assert!(fake.connections() >= 5, "{} connections for 5 round trips", fake.connections());
}

/// A real memcached frozen by SIGSTOP, on `on_error` allow then deny:
/// requests wait at most the timeout and get the `on_error` answer, logged
/// and counted as timeouts; after SIGCONT memcached accepts new connections
/// from the zone (the frozen one was given up), and within 5 s a fresh key
/// is limited exactly again.
#[test]
fn frozen_memcached_then_thawed() {
    for allow in [true, false] {
        let what = format!("memcached frozen, on_error={}", on_error(allow));
        let mc = Memcached::start();
        let ngx = Nginx::start(&conf(&mc.addr(), allow));
        clear_of_window_end(3600, 60);
        // Both workers connected (the first calls may be slow on a loaded machine).
        for i in 0.. {
            let warm = ngx.concurrent(20, "/a.html", &[("X-K", &format!("warm{i}"))]);
            if warm.iter().all(|r| r.header("X-RateLimit-Limit") == Some("100")) {
                break;
            }
            assert!(i < 20, "{what}: zone not answering before the test: {:?}", mc_failed_lines(&ngx.error_log(), "z"));
            thread::sleep(Duration::from_millis(100));
        }
        // (`stats` counts its own connection too)
        let before = mc.stat("total_connections");

        mc.signal("STOP");
        let hits = hammer(ngx.port, "/a.html", 4, Duration::from_secs(3));
        mc.signal("CONT");
        assert_answered(&hits, on_error_status(allow), &what);
        assert_logged(&ngx.error_log(), mc.port, allow, &what);
        assert!(errors(&ngx, Some("timeout")) >= 1.0, "{what}: no timeout counted");

        // Exact limiting again: a fresh key admits its 100 and limits the 101st.
        let t0 = Instant::now();
        let mut back = None;
        for k in 0.. {
            let key = format!("after{k}");
            let rs: Vec<Response> = (0..101).map(|_| ngx.get("/a.html", &[("X-K", &key)])).collect();
            let limited = rs.iter().all(|r| r.header("X-RateLimit-Limit") == Some("100"));
            if limited && statuses(&rs) == counts(&[(200, 100), (429, 1)]) {
                back = Some(t0.elapsed());
                break;
            }
            if t0.elapsed() > Duration::from_secs(5) {
                break;
            }
            thread::sleep(Duration::from_millis(50));
        }
        eprintln!("{what}: {} requests while frozen; exact limiting back {back:?} after SIGCONT", hits.len());
        assert!(back.is_some(), "{what}: not limiting exactly 5 s after SIGCONT");
        let opened = mc.stat("total_connections") - before - 1;
        assert!(opened >= 1, "{what}: the frozen connections were never replaced");
        assert!(bad_lines(&ngx.error_log()).is_empty(), "{what}: {:?}", bad_lines(&ngx.error_log()));
    }
}
