//! Redis servers that misbehave: a frozen `redis-server` (SIGSTOP), and a
//! fake server (`common/fake_redis.rs`) that is silent, answers garbage,
//! the wrong shape, values out of range, half a reply, closes the
//! connection, or answers too late. Each time every request is answered
//! within the zone's timeout (plus a margin for a loaded machine) as its
//! `on_error` says, the error log names the zone and what went wrong,
//! nothing crashes, and the zone does not open connections without bound.

mod common;
#[path = "common/fake_redis.rs"]
mod fake_redis;

use std::fs;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::redis::*;
use common::*;
use fake_redis::{Behaviour, FakeRedis};

/// Added to a zone's timeout for the slowest answer a loaded test machine may give.
const MARGIN: Duration = Duration::from_secs(1);

/// The statuses `on_error` gives: allow lets the request through, deny
/// answers `rl_status` (429 by default).
fn on_error_status(allow: bool) -> u16 {
    if allow {
        200
    } else {
        429
    }
}

/// A server whose `/a.html` is limited on Redis zone `z` (`params` after its
/// URL), per `X-K` key, 100 a second with a burst of 100 in fixed windows
/// of 1 s (so a reset or retry-after beyond 2 s, the window and the 1 s a
/// Redis clock may step back, is out of range).
fn conf(url: &str, params: &str) -> String {
    server(
        &format!("rl_zone z redis={url} {params};"),
        "location = /a.html { rl_limit zone=z key=$http_x_k rate=100r/s burst=100 algorithm=fixed; }\nlocation / { }",
    )
}

/// One answered request.
#[derive(Clone, Debug)]
struct Hit {
    status: u16,
    took: Duration,
    /// The connect before the request (not in `took`: the kernel's, not nginx's).
    connect: Duration,
    resp: Response,
}

/// `threads` clients sending GET `path` one after another, each request with
/// its own `X-K` key, until `dur` has passed or each sent `per_thread`.
fn hammer(port: u16, path: &str, threads: usize, dur: Duration, per_thread: usize) -> Vec<Hit> {
    let hits = Arc::new(Mutex::new(Vec::new()));
    let deadline = Instant::now() + dur;
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (hits, path) = (hits.clone(), path.to_string());
            thread::spawn(move || {
                let mut mine = Vec::new();
                for i in 0..per_thread {
                    if Instant::now() >= deadline {
                        break;
                    }
                    let key = format!("t{t}-{i}");
                    let t0 = Instant::now();
                    let (resp, took) = timed_get(port, &path, &[("X-K", &key)]);
                    mine.push(Hit { status: resp.status, took, connect: t0.elapsed() - took, resp });
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

/// The longest a client waited for its connection.
fn slowest_connect(hits: &[Hit]) -> Duration {
    hits.iter().map(|h| h.connect).max().unwrap_or_default()
}

/// Every hit has `status` and came within `within`; none carries a header
/// the zone's reply would have set.
fn assert_answered(hits: &[Hit], status: u16, within: Duration, what: &str) {
    assert!(!hits.is_empty(), "{what}: no request answered");
    let wrong: Vec<&Hit> = hits.iter().filter(|h| h.status != status).take(5).collect();
    assert!(wrong.is_empty(), "{what}: expected every request answered {status}, got {wrong:?}");
    let slow: Vec<Duration> = hits.iter().map(|h| h.took).filter(|t| *t > within).take(10).collect();
    assert!(slow.is_empty(), "{what}: requests slower than {within:?}: {slow:?}");
    let headed: Vec<&Hit> = hits.iter().filter(|h| h.resp.has_header_prefix("x-ratelimit")).take(3).collect();
    assert!(headed.is_empty(), "{what}: on_error responses carry limit headers: {headed:?}");
}

/// Lines that show a crash, a fatal error or a panic.
fn bad_lines(log: &str) -> Vec<&str> {
    let mut bad = crash_lines(log);
    bad.extend(log.lines().filter(|l| l.contains("[crit]") || l.contains("panic")));
    bad
}

/// The error log names zone `z` and `kind` in a failure line; nothing crashed.
fn assert_logged(log: &str, kind: &str, what: &str) {
    let lines = failed_lines(log, "z");
    assert!(
        lines.iter().any(|l| l.contains(kind)),
        "{what}: no failure line of zone \"z\" says {kind:?}; failure lines:\n{}",
        lines.iter().take(10).cloned().collect::<Vec<_>>().join("\n")
    );
    assert!(bad_lines(log).is_empty(), "{what}: {:?}", bad_lines(log));
}

/// Runs about `dur` of load from 4 clients against a fake server behaving
/// as `b`, on a zone with `timeout` and `on_error`; checks every answer and
/// the log. Returns the hits and the connections the fake saw.
fn misbehave(b: Behaviour, timeout_ms: u64, allow: bool, kind: &str, dur: Duration) -> (Vec<Hit>, usize) {
    let what = format!("{b:?}, timeout={timeout_ms}ms on_error={}", if allow { "allow" } else { "deny" });
    let fake = FakeRedis::start(b);
    let on_error = if allow { "allow" } else { "deny" };
    let ngx = Nginx::start(&conf(&fake.url(), &format!("timeout={timeout_ms}ms on_error={on_error}")));
    let hits = hammer(ngx.port, "/a.html", 4, dur, 100_000);
    let conns = fake.connections();
    eprintln!(
        "{what}: {} requests in {dur:?}, max {:?} (slowest connect {:?}), {conns} connections, {} script calls",
        hits.len(),
        hits.iter().map(|h| h.took).max().unwrap_or_default(),
        slowest_connect(&hits),
        fake.calls()
    );
    let within = Duration::from_millis(timeout_ms) + MARGIN;
    assert_answered(&hits, on_error_status(allow), within, &what);
    assert_logged(&ngx.error_log(), kind, &what);
    (hits, conns)
}

/// Connections a zone may open in 5 s of failures, both workers together:
/// the back-off (at most 400 ms) allows about a dozen each.
const MAX_CONNECTIONS_5S: usize = 50;

// ---------------------------------------------------------------------------
// 1. Servers that stop answering.
// ---------------------------------------------------------------------------

/// A server that answers the connection's setup and then never answers a
/// call: requests fail by the timeout, and the connection is abandoned
/// (after a second without a reply) and replaced, again and again, with
/// back-off.
#[test]
fn silent_server_is_answered_by_timeout_and_replaced() {
    let (_, conns) = misbehave(Behaviour::Silent, 100, false, "timed out (100 ms)", Duration::from_secs(5));
    assert!(conns > 2, "the silent connections were never replaced ({conns} connections in 5 s)");
    assert!(conns <= MAX_CONNECTIONS_5S, "{conns} connections in 5 s");
}

/// A server that accepts connections and never answers anything, not even
/// the connection's setup: each connection attempt ends by its own timeout
/// and counts for the back-off, not once per request.
#[test]
fn mute_server_is_not_reconnected_per_request() {
    let (_, conns) = misbehave(Behaviour::Mute, 100, true, "timed out (100 ms)", Duration::from_secs(5));
    assert!(conns <= 20, "{conns} connections in 5 s to a server that never answers");
}

/// The production case: a `redis-server` frozen by SIGSTOP. Requests fail
/// by the timeout, the zone abandons the frozen connection and tries new
/// ones with back-off; after SIGCONT exact limiting is back within seconds.
#[test]
fn frozen_redis_is_replaced_and_limiting_resumes() {
    let redis = Redis::start();
    let received = || -> u64 {
        redis
            .cli(&["INFO", "stats"])
            .lines()
            .find_map(|l| l.trim().strip_prefix("total_connections_received:").and_then(|n| n.parse().ok()))
            .expect("no total_connections_received in INFO stats")
    };
    let ngx = Nginx::start(&server(
        &format!("rl_zone z redis={} timeout=100ms on_error=deny;", redis.url()),
        "location = /a.html { rl_limit zone=z key=$http_x_k rate=5r/h burst=5; }",
    ));
    // Both workers connected (the first calls, which connect and load the
    // script, may take longer than 100 ms on a loaded machine).
    for i in 0.. {
        let warm = ngx.concurrent(20, "/a.html", &[("X-K", &format!("warm{i}"))]);
        if warm.iter().all(|r| r.header("X-RateLimit-Limit") == Some("5")) {
            assert_eq!(statuses(&warm), counts(&[(200, 5), (429, 15)]));
            break;
        }
        assert!(i < 20, "Redis zone not answering before the test: {:?}", failed_lines(&ngx.error_log(), "z"));
        thread::sleep(Duration::from_millis(100));
    }
    let before = received();

    redis.signal("-STOP");
    let hits = hammer(ngx.port, "/a.html", 4, Duration::from_secs(4), 100_000);
    redis.signal("-CONT");
    let within = Duration::from_millis(100) + MARGIN;
    assert_answered(&hits, 429, within, "Redis frozen, on_error=deny");
    // The connections the zone tried while Redis was frozen waited in the
    // listen queue: Redis accepts them now.
    thread::sleep(Duration::from_millis(300));
    let tried = received() - before;
    let log = ngx.error_log();
    eprintln!(
        "Redis frozen 4 s: {} requests, max {:?}; {tried} connections tried",
        hits.len(),
        hits.iter().map(|h| h.took).max().unwrap_or_default()
    );
    assert!(tried >= 2, "the frozen connections were never replaced ({tried} new connections in 4 s)");
    assert!(tried <= 40, "{tried} connections tried in 4 s");
    assert_logged(&log, "timed out (100 ms)", "Redis frozen");

    // Exact limiting again within two seconds: a fresh key admits its
    // burst of 5 and limits the sixth, with the line's headers.
    let t0 = Instant::now();
    let mut back = None;
    for k in 0.. {
        let got: Vec<Response> = (0..6).map(|_| ngx.get("/a.html", &[("X-K", &format!("after{k}"))])).collect();
        let st: Vec<u16> = got.iter().map(|r| r.status).collect();
        if st == [200, 200, 200, 200, 200, 429] && got[5].header("X-RateLimit-Limit") == Some("5") {
            back = Some(t0.elapsed());
            break;
        }
        if t0.elapsed() > Duration::from_secs(5) {
            break;
        }
        thread::sleep(Duration::from_millis(20));
    }
    eprintln!("exact limiting back {back:?} after SIGCONT");
    assert!(back.is_some_and(|t| t < Duration::from_secs(2)), "exact limiting back after {back:?} (want < 2 s)");
    assert!(bad_lines(&ngx.error_log()).is_empty(), "{:?}", bad_lines(&ngx.error_log()));
}

/// A connection whose path silently stops delivering (the fake latches
/// silent for that connection; new connections are healthy): the zone
/// abandons it and works again on a new one within two seconds, instead of
/// failing every request for as long as the kernel keeps the socket.
#[test]
fn silent_connection_is_replaced_by_a_working_one() {
    let fake = FakeRedis::start(Behaviour::Healthy);
    let ngx = Nginx::start(&conf(&fake.url(), "timeout=100ms on_error=deny"));
    let warm = ngx.concurrent(20, "/a.html", &[]);
    assert_eq!(statuses(&warm), counts(&[(200, 20)]), "healthy fake");
    let before = fake.connections();
    fake.set(Behaviour::Silent);
    // Every worker's connection meets the silence...
    let stalled = hammer(ngx.port, "/a.html", 4, Duration::from_millis(300), 100_000);
    assert!(
        stalled.iter().all(|h| h.status == 429),
        "{:?}",
        statuses(&stalled.iter().map(|h| h.resp.clone()).collect::<Vec<_>>())
    );
    // ...and stays silent; new connections would work.
    fake.set(Behaviour::Healthy);
    let t0 = Instant::now();
    let hits = hammer(ngx.port, "/a.html", 4, Duration::from_secs(4), 100_000);
    let first_ok = hits.iter().filter(|h| h.status == 200).count();
    // The last second of the run: all admitted.
    let late: Vec<&Hit> = hits.iter().rev().take(20).collect();
    eprintln!(
        "silent connection: {} requests after the silence, {first_ok} admitted, {} new connections, {:?}",
        hits.len(),
        fake.connections() - before,
        t0.elapsed()
    );
    assert!(late.iter().all(|h| h.status == 200), "still failing 4 s after the connection went silent: {late:?}");
    assert!(first_ok * 2 > hits.len(), "only {first_ok} of {} requests admitted", hits.len());
    assert!(fake.connections() - before <= 10);
    assert!(bad_lines(&ngx.error_log()).is_empty(), "{:?}", bad_lines(&ngx.error_log()));
}

// ---------------------------------------------------------------------------
// 2. Replies that are not what the script returns.
// ---------------------------------------------------------------------------

/// Bytes that are not RESP: the connection is broken, and the zone
/// reconnects with back-off, not once per call.
#[test]
fn garbage_reply_fails_requests_and_reconnects_with_backoff() {
    let (_, conns) = misbehave(Behaviour::Garbage, 100, true, "protocol error", Duration::from_secs(5));
    assert!(conns <= MAX_CONNECTIONS_5S, "{conns} connections in 5 s");
}

/// Well-formed replies of the wrong shape: the requests fail as the zone's
/// on_error says, the log says the reply was malformed (or gives the
/// server's error), and the connection, whose protocol is intact, is kept.
#[test]
fn wrong_type_replies_are_malformed() {
    for (raw, kind) in [
        ("$5\r\nhello\r\n", "malformed script reply"),
        ("*4\r\n:1\r\n$1\r\nx\r\n:2\r\n:-2\r\n", "malformed script reply"),
        ("*2\r\n:1\r\n:2\r\n", "malformed script reply"),
        ("-ERR boom\r\n", "boom"),
    ] {
        let (_, conns) = misbehave(Behaviour::Raw(raw), 100, false, kind, Duration::from_secs(1));
        assert!(conns <= 4, "{raw:?}: {conns} connections for replies that keep the protocol");
    }
}

/// A well-formed array of integers outside what the line can produce is a
/// script error, not a verdict: no `Retry-After: 9223372036855`.
#[test]
fn out_of_range_replies_are_malformed() {
    let max = i64::MAX;
    // (remaining, reset_us, retry) with burst 100 and a 1 s window, what the log names, on_error=allow.
    for (line, kind, allow) in [
        ((max, max, max), "remaining 9223372036854775807", true),
        ((101, 1000, -2), "remaining 101", false),
        // Reset beyond the window plus the 1 s a Redis clock may step back.
        ((0, 2_000_001, -2), "reset 2000001", false),
        ((0, 1000, 2_000_001), "retry-after 2000001", true),
        ((0, 1000, 0), "retry-after 0", true),
    ] {
        let (hits, _) = misbehave(Behaviour::Lines(line.0, line.1, line.2), 100, allow, kind, Duration::from_secs(1));
        assert!(hits.iter().all(|h| h.resp.header("Retry-After").is_none()), "{line:?}");
    }
}

/// Half an array, then nothing: no reply ever completes, so the connection
/// is abandoned and replaced, with back-off.
#[test]
fn unfinished_reply_connection_is_replaced() {
    let (_, conns) = misbehave(Behaviour::Unfinished, 100, true, "timed out (100 ms)", Duration::from_secs(5));
    assert!(conns > 2, "the stuck connections were never replaced ({conns} connections in 5 s)");
    assert!(conns <= MAX_CONNECTIONS_5S, "{conns} connections in 5 s");
}

/// A server that closes the connection on every call: each closed
/// connection counts for the back-off (82,000 connections in 30 s
/// otherwise).
#[test]
fn server_closing_on_every_call_is_reconnected_with_backoff() {
    let (_, conns) = misbehave(Behaviour::CloseOnCall, 100, false, "broken pipe", Duration::from_secs(5));
    assert!(conns <= MAX_CONNECTIONS_5S, "{conns} connections in 5 s");
}

// ---------------------------------------------------------------------------
// 3. A server too slow for the zone, and the bound on waiting requests.
// ---------------------------------------------------------------------------

/// Replies that come after the timeout: requests are answered by the
/// timeout, the connection (which does answer) is kept, and the requests
/// whose calls are still unanswered are bounded per zone and worker: beyond
/// the bound (1024), `on_error` applies at once. The fake answers a call
/// every 700 ms, within the 1 s a connection may stay silent.
#[test]
fn slow_server_requests_fail_by_timeout_and_waiting_is_bounded() {
    let fake = FakeRedis::start(Behaviour::Slow(Duration::from_millis(700)));
    let ngx = Nginx::start(&conf(&fake.url(), "timeout=20ms on_error=allow"));
    // Some 2,000 requests fill both workers' bound, then they are answered at once.
    let hits = hammer(ngx.port, "/a.html", 16, Duration::from_secs(6), 100_000);
    let fast = hits.iter().filter(|h| h.took < Duration::from_millis(15)).count();
    eprintln!(
        "slow server: {} requests, {fast} answered in under 15 ms (slowest connect {:?}), {} connections, {} calls",
        hits.len(),
        slowest_connect(&hits),
        fake.connections(),
        fake.calls()
    );
    let within = Duration::from_millis(20) + MARGIN;
    assert_answered(&hits, 200, within, "slow server");
    // Nothing else answers before the 20 ms timeout.
    assert!(fast >= 100, "only {fast} requests answered at once: waiting is not bounded");
    let log = ngx.error_log();
    assert_logged(&log, "timed out (20 ms)", "slow server");
    assert_logged(&log, "too many requests waiting (1024 per worker)", "slow server");
    assert!(fake.connections() <= 4, "{} connections to a server that answers", fake.connections());
}

// ---------------------------------------------------------------------------
// 4. The timeout is what bounds the wait.
// ---------------------------------------------------------------------------

/// `timeout=3s` makes a request wait 3 s for a silent server (not the
/// client library's own 1 s).
#[test]
fn long_timeout_is_honoured() {
    let fake = FakeRedis::start(Behaviour::Silent);
    let ngx = Nginx::start(&conf(&fake.url(), "timeout=3s on_error=deny"));
    let hits = hammer(ngx.port, "/a.html", 2, Duration::from_millis(100), 1);
    for h in &hits {
        assert_eq!(h.status, 429, "{h:?}");
        assert!(
            h.took >= Duration::from_millis(2950) && h.took < Duration::from_secs(3) + MARGIN,
            "timeout=3s: answered after {:?}",
            h.took
        );
    }
    assert_logged(&ngx.error_log(), "timed out (3000 ms)", "timeout=3s");
}

/// `nginx -t` refuses a timeout nginx-rl does not honour, naming the
/// directive and the bound.
#[test]
fn timeout_out_of_range_is_refused() {
    let zone = |t: &str| conf("redis://127.0.0.1:6379", &format!("timeout={t}"));
    let (ok, out) = nginx_t(&zone("61s"));
    assert!(!ok && out.contains("[emerg]") && out.contains("\"rl_zone\"") && out.contains("\"61s\""), "{out}");
    assert!(out.contains("60s"), "the bound is not named: {out}");
    let (ok, out) = nginx_t(&zone("60s"));
    assert!(ok, "timeout=60s refused: {out}");
}

// ---------------------------------------------------------------------------
// 5. Memory.
// ---------------------------------------------------------------------------

/// The worker processes of `ngx` (children of its master), once all started.
fn worker_pids(ngx: &Nginx) -> Vec<u32> {
    let master = fs::read_to_string(ngx.prefix.join("nginx.pid")).unwrap().trim().to_string();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut pids = Vec::new();
        for e in fs::read_dir("/proc").unwrap().flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
            let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
            // "pid (comm) S ppid ...": the parent follows the state.
            let ppid = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(1));
            if ppid == Some(master.as_str()) {
                pids.push(pid);
            }
        }
        if pids.len() >= WORKERS || Instant::now() > deadline {
            return pids;
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// A process's resident memory in kB.
fn rss_kb(pid: u32) -> u64 {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:").and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok()))
        .unwrap_or(0)
}

/// A sustained run on a silent server: the calls it never answers are not
/// kept for ever (the connection they wait on is abandoned), so the
/// workers' memory stays flat.
#[test]
fn silent_server_memory_stays_flat() {
    let fake = FakeRedis::start(Behaviour::Silent);
    let ngx = Nginx::start(&conf(&fake.url(), "timeout=10ms on_error=allow"));
    let workers = worker_pids(&ngx);
    assert_eq!(workers.len(), WORKERS, "workers of {}", ngx.prefix.display());
    // Warm up (allocator arenas, thread stacks, connection buffers).
    hammer(ngx.port, "/a.html", 32, Duration::from_secs(10), 100);
    let before: u64 = workers.iter().map(|p| rss_kb(*p)).sum();
    let t0 = Instant::now();
    let hits = hammer(ngx.port, "/a.html", 32, Duration::from_secs(30), 800);
    let took = t0.elapsed();
    let after: u64 = workers.iter().map(|p| rss_kb(*p)).sum();
    let grown = after.saturating_sub(before);
    eprintln!(
        "silent server: {} requests in {took:?}, {} calls, {} connections; workers' RSS {before} kB -> {after} kB (+{grown} kB)",
        hits.len(),
        fake.calls(),
        fake.connections()
    );
    assert!(hits.len() >= 20_000, "only {} requests", hits.len());
    assert!(hits.iter().all(|h| h.status == 200));
    assert!(grown < 2048, "workers grew by {grown} kB over {} requests on a silent server", hits.len());
}
