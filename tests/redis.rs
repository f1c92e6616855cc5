//! End-to-end tests of Redis zones (`rl_zone NAME redis=URL ...`): real
//! nginx instances with the module, a real `redis-server` (single, with a
//! password, or a 3-master cluster), real HTTP requests.
//!
//! Exact-count tests give their zone `timeout=1s`: they are about
//! exactness, and a loaded test machine must not turn a slow reply into an
//! `on_error` admission. The default timeout (50 ms) is exercised by the
//! failure tests (Redis killed, Redis paused).

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::redis::*;
use common::*;

fn statuses_of(got: &[u16]) -> BTreeMap<u16, usize> {
    let mut m = BTreeMap::new();
    for s in got {
        *m.entry(*s).or_insert(0) += 1;
    }
    m
}

const ALGORITHMS: [&str; 6] = ["fixed", "sliding", "sliding_log", "token_bucket", "leaky_bucket", "gcra"];

// ---------------------------------------------------------------------------
// 1. Exact admission: two nginx instances (2 workers each) on one Redis.
// ---------------------------------------------------------------------------

/// 300 simultaneous requests, half to each nginx, same key, burst=50 at
/// 50r/h (nothing refills, no fixed window ends): exactly 50 pass, in all.
fn two_nginx_exact(alg: &str) {
    let redis = Redis::start();
    let conf = server(
        &format!("rl_zone r redis={} timeout=1s;", redis.url()),
        &format!("location / {{ rl_limit zone=r rate=50r/h burst=50 algorithm={alg}; }}"),
    );
    let (a, b) = (Nginx::start(&conf), Nginx::start(&conf));
    let (pa, pb) = (a.port, b.port);
    let ta = thread::spawn(move || concurrent(pa, 150, "/index.html", &[]));
    let tb = thread::spawn(move || concurrent(pb, 150, "/index.html", &[]));
    let (ra, rb) = (ta.join().unwrap(), tb.join().unwrap());
    let all: Vec<Response> = ra.iter().chain(rb.iter()).cloned().collect();
    let (la, lb) = (a.error_log(), b.error_log());
    assert_eq!(
        statuses(&all),
        counts(&[(200, 50), (429, 250)]),
        "algorithm={alg}: nginx A {:?}, nginx B {:?}; Redis failures logged: {:?}",
        statuses(&ra),
        statuses(&rb),
        failed_lines(&(la.clone() + &lb), "r").iter().take(5).collect::<Vec<_>>()
    );
    for r in all.iter().filter(|r| r.status == 200) {
        assert_eq!(r.body, "index\n");
    }
    let logged = la.matches(" by zone \"r\", client: ").count() + lb.matches(" by zone \"r\", client: ").count();
    assert_eq!(logged, 250, "algorithm={alg}: rejections logged by both nginx together");
    assert!(failed_lines(&la, "r").is_empty() && failed_lines(&lb, "r").is_empty(), "algorithm={alg}: Redis failures");
    assert!(
        crash_lines(&la).is_empty() && crash_lines(&lb).is_empty(),
        "algorithm={alg}: {:?}",
        crash_lines(&(la + &lb))
    );
    // Both nginx kept one state for the one client key.
    let keys = redis.keys("rl:*");
    assert_eq!(keys.len(), 1, "algorithm={alg}: one shared state key expected, got {keys:?}");
}

macro_rules! two_nginx_tests {
    ($($name:ident => $alg:literal),* $(,)?) => {$(
        #[test]
        fn $name() {
            two_nginx_exact($alg);
        }
    )*};
}

two_nginx_tests! {
    two_nginx_exact_fixed => "fixed",
    two_nginx_exact_sliding => "sliding",
    two_nginx_exact_sliding_log => "sliding_log",
    two_nginx_exact_token_bucket => "token_bucket",
    two_nginx_exact_leaky_bucket => "leaky_bucket",
    two_nginx_exact_gcra => "gcra",
}

// ---------------------------------------------------------------------------
// 2. Headers and Retry-After, as with shared memory.
// ---------------------------------------------------------------------------

/// The same burst against a Redis zone and a shared-memory zone with the
/// same line: same statuses, same header values (times within a second).
#[test]
fn headers_and_retry_after_match_shared_memory() {
    let redis = Redis::start();
    let line = "key=$http_x_k rate=10r/s burst=5 algorithm=gcra";
    let ngx = Nginx::setup(&server(
        &format!("rl_zone r redis={} timeout=1s;\nrl_zone m size=1m;", redis.url()),
        &format!(
            "location = /r.html {{ rl_limit zone=r {line}; rl_headers both; }}\n\
             location = /m.html {{ rl_limit zone=m {line}; rl_headers both; }}"
        ),
    ))
    .file("html/r.html", "r\n")
    .file("html/m.html", "m\n")
    .start();

    for attempt in 0..3 {
        let key = format!("key{attempt}");
        let h = [("X-K", key.as_str())];
        let red = ngx.concurrent(6, "/r.html", &h);
        let shm = ngx.concurrent(6, "/m.html", &h);
        // Six passing is legitimate only if a token refilled during the burst: retry with a new key.
        if (statuses(&red) == counts(&[(200, 6)]) || statuses(&shm) == counts(&[(200, 6)])) && attempt < 2 {
            eprintln!("burst straddled a refill, retrying with a new key");
            continue;
        }
        for (what, rs) in [("redis", &red), ("shm", &shm)] {
            assert_eq!(statuses(rs), counts(&[(200, 5), (429, 1)]), "{what}");
        }
        // Admitted: the same remaining values, limits and policies.
        let remaining = |rs: &[Response]| {
            let mut v: Vec<u64> =
                rs.iter().filter(|r| r.status == 200).map(|r| r.num("X-RateLimit-Remaining")).collect();
            v.sort();
            v
        };
        assert_eq!(remaining(&red), vec![0, 1, 2, 3, 4], "redis X-RateLimit-Remaining of the admitted: {red:?}");
        assert_eq!(remaining(&red), remaining(&shm));
        let policy = |r: &Response, zone: &str| {
            (sf_param(r, "RateLimit-Policy", zone, "q"), sf_param(r, "RateLimit-Policy", zone, "w"))
        };
        for r in &red {
            assert_eq!(r.header("X-RateLimit-Limit"), Some("5"), "{r:?}");
            assert_eq!(policy(r, "r"), policy(&shm[0], "m"), "RateLimit-Policy: redis {r:?} vs shm {:?}", shm[0]);
            assert_eq!(sf_param(r, "RateLimit", "r", "r"), r.num("X-RateLimit-Remaining"), "{r:?}");
        }
        // Rejected: the same fields.
        let rr = red.iter().find(|r| r.status == 429).unwrap();
        let rm = shm.iter().find(|r| r.status == 429).unwrap();
        assert_eq!(rr.num("Retry-After"), 1, "redis Retry-After (10r/s burst=5): {rr:?}");
        assert_eq!(rr.num("Retry-After"), rm.num("Retry-After"), "redis {rr:?} vs shm {rm:?}");
        assert_eq!((rr.num("X-RateLimit-Limit"), rr.num("X-RateLimit-Remaining")), (5, 0), "{rr:?}");
        assert_eq!(sf_param(rr, "RateLimit", "r", "r"), 0, "{rr:?}");
        let (reset_r, reset_m) = (rr.num("X-RateLimit-Reset"), rm.num("X-RateLimit-Reset"));
        assert!(reset_r.abs_diff(reset_m) <= 1, "X-RateLimit-Reset: redis {reset_r}, shm {reset_m}");
        let (t_r, t_m) = (sf_param(rr, "RateLimit", "r", "t"), sf_param(rm, "RateLimit", "m", "t"));
        assert!(t_r.abs_diff(t_m) <= 1, "RateLimit t: redis {t_r}, shm {t_m}");
        let now = unix_now();
        assert!((now.saturating_sub(1)..=now + 2).contains(&reset_r), "redis X-RateLimit-Reset {reset_r}, now {now}");

        let again = ngx.get("/r.html", &h);
        assert_eq!(again.status, 429, "redis: passed right after the burst: {again:?}");
        assert!(again.num("Retry-After") >= 1, "{again:?}");

        thread::sleep(Duration::from_secs(rr.num("Retry-After")) + Duration::from_millis(30));
        let after = ngx.get("/r.html", &h);
        assert_eq!(after.status, 200, "redis: still limited after waiting Retry-After: {after:?}");
        assert!(after.header("Retry-After").is_none(), "{after:?}");
        assert!(failed_lines(&ngx.error_log(), "r").is_empty(), "Redis failures:\n{}", ngx.error_log());
        return;
    }
}

// ---------------------------------------------------------------------------
// 3. Redis killed under load, then restarted.
// ---------------------------------------------------------------------------

/// Default timeout (50 ms) plus a margin for a loaded test machine.
const ANSWER_WITHIN: Duration = Duration::from_millis(50 + 250);

#[test]
fn redis_killed_during_load_then_restarted() {
    let mut redis = Redis::start();
    let url = redis.url();
    let ngx = Nginx::start(&server(
        &format!("rl_zone ra redis={url} on_error=allow;\nrl_zone rd redis={url} on_error=deny;"),
        "location = /a.html { rl_limit zone=ra key=$http_x_k rate=5r/h burst=5; }\n\
         location = /b.html { rl_limit zone=rd key=$http_x_k rate=5r/h burst=5; }",
    ));
    let h = [("X-K", "k1")];
    // Limiting works while Redis is up (exactly 5 pass unless a reply was late under load).
    for path in ["/a.html", "/b.html"] {
        let got: Vec<Response> = (0..7).map(|_| ngx.get(path, &h)).collect();
        let st: Vec<u16> = got.iter().map(|r| r.status).collect();
        if failed_lines(&ngx.error_log(), if path == "/a.html" { "ra" } else { "rd" }).is_empty() {
            assert_eq!(st, [200, 200, 200, 200, 200, 429, 429], "{path} with Redis up");
        }
        assert!(
            got.last().unwrap().header("X-RateLimit-Limit") == Some("5"),
            "{path} with Redis up: not limited: {st:?}"
        );
    }

    redis.stop();
    let before = ngx.error_log().len();
    // About two seconds of load on both locations, with the key already exhausted (1.9 s: the
    // load spans at most 3 clock seconds, the log throttle's unit).
    let port = ngx.port;
    let results = Arc::new(Mutex::new(Vec::new()));
    let deadline = Instant::now() + Duration::from_millis(1900);
    let handles: Vec<_> = (0..4)
        .map(|i| {
            let results = results.clone();
            thread::spawn(move || {
                let path = if i % 2 == 0 { "/a.html" } else { "/b.html" };
                let mut mine = Vec::new();
                while Instant::now() < deadline {
                    let (r, took) = timed_get(port, path, &[("X-K", "k1")]);
                    mine.push((path, r.status, took));
                }
                results.lock().unwrap().extend(mine);
            })
        })
        .collect();
    for t in handles {
        t.join().unwrap();
    }
    let results = results.lock().unwrap().clone();
    let log = ngx.error_log();
    let new = &log[before..];
    assert!(results.len() >= 200, "only {} requests in 2 s", results.len());
    let wrong: Vec<_> = results
        .iter()
        .filter(|(p, s, _)| (*p == "/a.html" && *s != 200) || (*p == "/b.html" && *s != 429))
        .take(10)
        .collect();
    assert!(wrong.is_empty(), "Redis down: on_error=allow must answer 200, on_error=deny 429; got {wrong:?}");
    let slow: Vec<_> = results.iter().filter(|(_, _, t)| *t >= ANSWER_WITHIN).take(10).collect();
    assert!(slow.is_empty(), "requests slower than {ANSWER_WITHIN:?} while Redis is down: {slow:?}");
    for zone in ["ra", "rd"] {
        let lines = failed_lines(new, zone);
        assert!(!lines.is_empty(), "no failure logged for zone {zone}");
        assert!(
            lines.len() < 20,
            "zone {zone}: {} \"failed\" lines for {} requests in 2 s:\n{}",
            lines.len(),
            results.len(),
            lines.join("\n")
        );
    }
    assert!(crash_lines(&log).is_empty(), "{:?}", crash_lines(&log));

    // Redis back (empty, same port): limiting resumes within a second, no reload.
    redis.restart();
    let t0 = Instant::now();
    let (mut a_limited, mut b_admitted, mut b_limited) = (None, None, None);
    while (a_limited.is_none() || b_limited.is_none()) && t0.elapsed() < Duration::from_secs(3) {
        let ra = ngx.get("/a.html", &h);
        // A limiter's 429 carries the line's headers (an on_error 429 has none).
        if a_limited.is_none() && ra.status == 429 && ra.header("X-RateLimit-Limit") == Some("5") {
            a_limited = Some(t0.elapsed());
        }
        let rb = ngx.get("/b.html", &h);
        if rb.status == 200 && b_admitted.is_none() {
            b_admitted = Some(t0.elapsed());
        }
        if b_admitted.is_some()
            && rb.status == 429
            && rb.header("X-RateLimit-Limit") == Some("5")
            && b_limited.is_none()
        {
            b_limited = Some(t0.elapsed());
        }
        thread::sleep(Duration::from_millis(5));
    }
    eprintln!(
        "Redis down: {} requests, max {:?}; after restart: allow zone limiting after {a_limited:?}, \
         deny zone admitting after {b_admitted:?}, limiting after {b_limited:?}",
        results.len(),
        results.iter().map(|(_, _, t)| *t).max().unwrap_or_default()
    );
    let within = |t: Option<Duration>| t.is_some_and(|t| t < Duration::from_secs(1));
    assert!(
        within(a_limited) && within(b_admitted) && within(b_limited),
        "after the restart: on_error=allow zone limiting again after {a_limited:?}, \
         on_error=deny zone admitting after {b_admitted:?} and limiting after {b_limited:?} (all expected < 1 s)"
    );
    let log = ngx.error_log();
    assert!(crash_lines(&log).is_empty(), "{:?}", crash_lines(&log));
}

/// A Redis restart between requests costs no request: the broken
/// connection is replaced at once (README), on every worker.
#[test]
fn redis_restart_while_idle_costs_no_request() {
    let mut redis = Redis::start();
    let ngx = Nginx::start(&server(
        &format!("rl_zone r redis={} timeout=1s;", redis.url()),
        "location / { rl_limit zone=r key=$http_x_k rate=5r/h burst=5; }",
    ));
    // Connections on both workers.
    let rs = ngx.concurrent(20, "/index.html", &[("X-K", "before")]);
    assert_eq!(statuses(&rs), counts(&[(200, 5), (429, 15)]));
    redis.restart();
    // Concurrent, so that both workers meet their dead connection.
    let rs = ngx.concurrent(20, "/index.html", &[("X-K", "after")]);
    let log = ngx.error_log();
    assert_eq!(
        statuses(&rs),
        counts(&[(200, 5), (429, 15)]),
        "first requests after a Redis restart: {:?}",
        failed_lines(&log, "r")
    );
    assert!(failed_lines(&log, "r").is_empty(), "{:?}", failed_lines(&log, "r"));
    // The restarted Redis is empty: the exhausted key starts afresh.
    assert_eq!(ngx.get("/index.html", &[("X-K", "before")]).status, 200);
}

// ---------------------------------------------------------------------------
// 4. A paused Redis delays only its own requests, by the timeout.
// ---------------------------------------------------------------------------

#[test]
fn paused_redis_delays_only_its_requests() {
    let redis = Redis::start();
    let ngx = Nginx::start(&server(
        &format!("rl_zone r redis={};", redis.url()),
        "location = /a.html { rl_limit zone=r key=$http_x_k rate=100r/h burst=100; }\n\
         location / { }",
    ));
    // Both workers connected.
    for i in 0..20 {
        let r = ngx.get("/a.html", &[("X-K", &format!("warm{i}"))]);
        assert_eq!(r.status, 200, "{r:?}");
    }

    let out = redis.cli(&["CLIENT", "PAUSE", "3000"]);
    assert_eq!(out, "OK");
    let paused_at = Instant::now();
    let port = ngx.port;
    let stat = thread::spawn(move || (0..200).map(|_| timed_get(port, "/index.html", &[])).collect::<Vec<_>>());
    let limited: Vec<_> = (0..4)
        .map(|i| {
            thread::spawn(move || {
                (0..5).map(|j| timed_get(port, "/a.html", &[("X-K", &format!("p{i}-{j}"))])).collect::<Vec<_>>()
            })
        })
        .collect();
    let stat = stat.join().unwrap();
    let limited: Vec<_> = limited.into_iter().flat_map(|t| t.join().unwrap()).collect();
    let took = paused_at.elapsed();
    assert!(took < Duration::from_millis(2800), "the requests took {took:?}: not all sent during the 3 s pause");

    let times: Vec<Duration> = stat.iter().map(|(_, t)| *t).collect();
    assert!(stat.iter().all(|(r, _)| r.status == 200 && r.body == "index\n"));
    let p99 = quantile(&times, 0.99);
    let lt: Vec<Duration> = limited.iter().map(|(_, t)| *t).collect();
    eprintln!(
        "Redis paused: static p50 {:?} p99 {p99:?}; Redis location min {:?} max {:?}",
        quantile(&times, 0.5),
        quantile(&lt, 0.0),
        quantile(&lt, 1.0)
    );
    assert!(
        p99 < Duration::from_millis(20),
        "static file p99 {p99:?} while Redis is paused (max {:?})",
        quantile(&times, 1.0)
    );

    for (r, t) in &limited {
        assert_eq!(r.status, 200, "paused Redis, on_error=allow: {r:?}");
        assert!(
            *t >= Duration::from_millis(45) && *t < ANSWER_WITHIN,
            "paused Redis: answered in {t:?}, expected about the 50 ms timeout"
        );
    }
    let log = ngx.error_log();
    let timeouts = failed_lines(&log, "r");
    assert!(timeouts.iter().any(|l| l.contains("timed out")), "no timeout logged:\n{log}");
    assert!(crash_lines(&log).is_empty(), "{:?}", crash_lines(&log));

    // After the pause, the connections still work (late replies discarded): exact limiting again.
    thread::sleep(Duration::from_millis(3200).saturating_sub(paused_at.elapsed()));
    let before = ngx.error_log().len();
    let got: Vec<Response> = (0..101).map(|_| ngx.get("/a.html", &[("X-K", "after")])).collect();
    let st: Vec<u16> = got.iter().map(|r| r.status).collect();
    let late = failed_lines(&ngx.error_log()[before..], "r");
    if late.is_empty() {
        assert_eq!(statuses_of(&st), counts(&[(200, 100), (429, 1)]), "burst=100 after the pause");
        assert_eq!(st[100], 429, "101st request after the pause");
    } else {
        eprintln!("{} late replies after the pause (loaded machine?): exactness not checked", late.len());
    }
    let r = ngx.get("/a.html", &[("X-K", "after")]);
    assert_eq!((r.status, r.header("X-RateLimit-Limit")), (429, Some("100")), "not limiting after the pause: {r:?}");
}

// ---------------------------------------------------------------------------
// 5. FUNCTION FLUSH and SCRIPT FLUSH under load.
// ---------------------------------------------------------------------------

/// 300 requests from 10 threads on a burst of 50, on a zone at `url`, while
/// `flush` (a Redis command) runs twice: before the burst is used up, and
/// after. Exactly 50 admitted, and no failure logged.
fn flush_during_load(redis: &Redis, url: &str, flush: &'static [&'static str]) {
    let ngx = Nginx::start(&server(
        &format!("rl_zone r redis={url} timeout=1s;"),
        "location / { rl_limit zone=r rate=50r/h burst=50; }",
    ));
    let port = ngx.port;
    let done = Arc::new(AtomicUsize::new(0));
    let redis_port = redis.port;
    let handles: Vec<_> = (0..10)
        .map(|_| {
            let done = done.clone();
            thread::spawn(move || {
                let mut st = Vec::new();
                for _ in 0..30 {
                    st.push(get(port, "/index.html", &[]).status);
                    let n = done.fetch_add(1, Ordering::SeqCst) + 1;
                    if n == 25 || n == 150 {
                        let out = std::process::Command::new("redis-cli")
                            .arg("-p")
                            .arg(redis_port.to_string())
                            .args(flush)
                            .output()
                            .unwrap();
                        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "OK");
                    }
                }
                st
            })
        })
        .collect();
    let got: Vec<u16> = handles.into_iter().flat_map(|h| h.join().unwrap()).collect();
    let st = statuses_of(&got);
    let log = ngx.error_log();
    assert_eq!(st, counts(&[(200, 50), (429, 250)]), "Redis failures: {:?}", failed_lines(&log, "r"));
    assert!(failed_lines(&log, "r").is_empty(), "{:?}", failed_lines(&log, "r"));
    assert!(crash_lines(&log).is_empty(), "{:?}", crash_lines(&log));
}

/// On Redis 7 the script is a function library: loaded by the first call,
/// and again after `FUNCTION FLUSH`, with no failed request.
#[test]
fn function_flush_during_load() {
    let redis = Redis::start();
    flush_during_load(&redis, &redis.url(), &["FUNCTION", "FLUSH"]);
    // The flushes were seen: "Function not found" for the first call, and at
    // least once after each flush, each time followed by a FUNCTION LOAD.
    let (missing, loads) = (redis.errors("ERR"), redis.calls("function|load"));
    assert!(
        missing >= 3 && loads >= 3,
        "Function not found: {missing}, FUNCTION LOAD: {loads} (the flushes did not hit the load?)"
    );
    assert!(redis.calls("fcall") > 0);
    assert_eq!(redis.calls("evalsha") + redis.calls("eval"), 0);
}

/// Calls in flight when the library goes missing (a worker's first calls,
/// calls after a Redis restart or `FUNCTION FLUSH`) each find no function;
/// the worker loads the library once, not once per call (a load costs
/// Redis milliseconds, and a herd of them, on a Cluster on every master,
/// ran calls past their deadline). Two nginx of 2 workers, the library
/// flushed and Redis paused while 160 requests on 160 keys arrive: when
/// Redis goes on, all are admitted, with at most one `FUNCTION LOAD` per
/// worker.
#[test]
fn calls_that_find_no_library_load_it_once_per_worker() {
    let redis = Redis::start();
    let conf = server(
        &format!("rl_zone r redis={} timeout=2s;", redis.url()),
        "location / { rl_limit zone=r key=$http_x_k rate=10r/m; }",
    );
    let nginx: Vec<Nginx> = (0..2).map(|_| Nginx::start(&conf)).collect();
    let ports: Vec<u16> = nginx.iter().map(|n| n.port).collect();
    let burst = |from: usize| -> Vec<thread::JoinHandle<u16>> {
        (0..160)
            .map(|i| {
                let port = ports[i % 2];
                thread::spawn(move || get(port, "/index.html", &[("X-K", &format!("k{}", from + i))]).status)
            })
            .collect()
    };
    let statuses =
        |hs: Vec<thread::JoinHandle<u16>>| -> Vec<u16> { hs.into_iter().map(|h| h.join().unwrap()).collect() };
    // (the workers' connections open, the library loaded)
    assert_eq!(statuses_of(&statuses(burst(0))), counts(&[(200, 160)]));
    let before = redis.calls("function|load");
    assert_eq!(redis.cli(&["FUNCTION", "FLUSH"]), "OK");
    redis.signal("-STOP");
    let flight = burst(1000);
    thread::sleep(Duration::from_millis(300));
    redis.signal("-CONT");
    assert_eq!(statuses_of(&statuses(flight)), counts(&[(200, 160)]));
    let loads = redis.calls("function|load") - before;
    eprintln!("160 requests in flight on a flushed library: {loads} FUNCTION LOAD, {} FCALL", redis.calls("fcall"));
    assert!((1..=4).contains(&loads), "{loads} FUNCTION LOAD for the calls in flight of 4 workers");
    for n in &nginx {
        let log = n.error_log();
        assert!(failed_lines(&log, "r").is_empty() && crash_lines(&log).is_empty(), "{log}");
    }
}

/// A user who may not load functions gets the script with EVALSHA, which
/// survives `SCRIPT FLUSH` (NOSCRIPT, then EVAL) with no failed request.
#[test]
fn script_flush_during_load() {
    let redis = Redis::start();
    assert_eq!(redis.cli(&["ACL", "SETUSER", "rl", "on", ">rl-secret", "~*", "&*", "+@all", "-function"]), "OK");
    flush_during_load(&redis, &format!("redis://rl:rl-secret@127.0.0.1:{}", redis.port), &["SCRIPT", "FLUSH"]);
    // FUNCTION LOAD refused (for the first calls of each worker), then EVALSHA; the flushes were
    // seen: a NOSCRIPT for the first call, and at least one after each flush.
    assert!(redis.errors("NOPERM") >= 1, "{}", redis.cli(&["INFO", "errorstats"]));
    let noscript = redis.errors("NOSCRIPT");
    assert!(noscript >= 3, "NOSCRIPT errors seen by Redis: {noscript} (the flushes did not hit the load?)");
    assert!(redis.calls("evalsha") > 0);
}

// ---------------------------------------------------------------------------
// 6. Redis Cluster.
// ---------------------------------------------------------------------------

/// The master that holds a limited key is killed: its replica takes its
/// place (a second or two), nginx finds the new master, and the key's count
/// goes on from what the replica had: 50 admitted by Redis in all, the
/// requests of the failover answered per `on_error` meanwhile, and then
/// 429.
#[test]
fn cluster_master_failover_while_limiting() {
    let mut cluster = Cluster::start_replicated(3);
    let ngx = Nginx::start(&server(
        &format!("rl_zone c redis={} timeout=500ms on_error=allow;", cluster.url()),
        "location = /index.html { rl_limit zone=c key=$http_x_k rate=50r/h burst=50 algorithm=fixed; }\n\
         location = /metrics { rl_metrics; }",
    ));
    clear_of_window_end(3600, 60);
    let req = || ngx.get("/index.html", &[("X-K", "failing")]).status;
    for _ in 0..20 {
        assert_eq!(req(), 200);
    }
    let keys = cluster.keys("rl:*");
    let holds = |p: u16| cluster.cli(p, &["--scan", "--pattern", "rl:*"]).lines().any(|l| !l.trim().is_empty());
    let master =
        cluster.ports.iter().copied().find(|p| holds(*p)).unwrap_or_else(|| panic!("no master holds {keys:?}"));
    // (its replica has every write so far)
    assert_eq!(cluster.cli(master, &["WAIT", "1", "2000"]).trim(), "1");
    cluster.kill(master);
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut statuses = Vec::new();
    loop {
        let s = req();
        statuses.push(s);
        if s == 429 {
            break;
        }
        assert!(Instant::now() < deadline, "never limited again after the failover: {statuses:?}\n{}", ngx.error_log());
        thread::sleep(Duration::from_millis(20));
    }
    let m = ngx.get("/metrics", &[]).body;
    let count = |result: &str| requests_total(&m, "c", None, result);
    assert_eq!(count("passed"), 50, "admitted by Redis, before and after the failover:\n{m}");
    assert_eq!(count("rejected"), 1, "{m}");
    for _ in 0..5 {
        assert_eq!(req(), 429, "limited from then on");
    }
}

/// A key's slot moved to another master while nginx limits it: during the
/// migration (the slot migrating, its keys already moved) the old master
/// answers `ASK`, after it `MOVED`; nginx follows both, and the key's count
/// goes on where it was, exactly: 50 admitted in all, no error logged.
#[test]
fn cluster_slot_moved_while_limiting() {
    let cluster = Cluster::start(3);
    let ngx = Nginx::start(&server(
        &format!("rl_zone c redis={} timeout=1s;", cluster.url()),
        "location = /index.html { rl_limit zone=c key=$http_x_k rate=50r/h burst=50 algorithm=fixed; }",
    ));
    clear_of_window_end(3600, 30);
    let req = |n: usize| {
        let rs: Vec<Response> = (0..n).map(|_| ngx.get("/index.html", &[("X-K", "moving")])).collect();
        statuses(&rs)
    };
    assert_eq!(req(10), counts(&[(200, 10)]));
    let keys = cluster.keys("rl:*");
    assert_eq!(keys.len(), 1, "{keys:?}");
    let holds = |p: u16| cluster.cli(p, &["--scan", "--pattern", "rl:*"]).lines().any(|l| !l.trim().is_empty());
    let from = cluster.ports.iter().copied().find(|p| holds(*p)).expect("no master holds the key");
    let to = cluster.ports.iter().copied().find(|p| *p != from).unwrap();
    let id = |p: u16| cluster.cli(p, &["CLUSTER", "MYID"]).trim().to_string();
    let slot = cluster.cli(from, &["CLUSTER", "KEYSLOT", &keys[0]]).trim().to_string();
    assert_eq!(cluster.cli(to, &["CLUSTER", "SETSLOT", &slot, "IMPORTING", &id(from)]).trim(), "OK");
    assert_eq!(cluster.cli(from, &["CLUSTER", "SETSLOT", &slot, "MIGRATING", &id(to)]).trim(), "OK");
    let in_slot: Vec<String> = cluster
        .cli(from, &["CLUSTER", "GETKEYSINSLOT", &slot, "1000"])
        .lines()
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty())
        .collect();
    let mut migrate: Vec<String> =
        ["MIGRATE", "127.0.0.1", &to.to_string(), "", "0", "5000", "KEYS"].iter().map(|s| s.to_string()).collect();
    migrate.extend(in_slot);
    let args: Vec<&str> = migrate.iter().map(String::as_str).collect();
    assert_eq!(cluster.cli(from, &args).trim(), "OK");
    // Migrating: the old master answers ASK for the key it no longer holds,
    // and the new one TRYAGAIN (a call's keys are not all there: its record of
    // the call is new) until the migration ends, a moment later.
    let port = ngx.port;
    let during = thread::spawn(move || concurrent(port, 20, "/index.html", &[("X-K", "moving")]));
    thread::sleep(Duration::from_millis(300));
    for &p in &cluster.ports {
        assert_eq!(cluster.cli(p, &["CLUSTER", "SETSLOT", &slot, "NODE", &id(to)]).trim(), "OK");
    }
    assert_eq!(statuses(&during.join().unwrap()), counts(&[(200, 20)]), "{}", ngx.error_log());
    // Moved: MOVED, once, then the new master.
    assert_eq!(req(30), counts(&[(200, 20), (429, 10)]), "{}", ngx.error_log());
    assert!(holds(to) && !holds(from), "the key is on the new master");
    let log = ngx.error_log();
    assert!(failed_lines(&log, "c").is_empty() && !log.contains("[warn]"), "{log}");
}

#[test]
fn cluster_exact_and_all_or_nothing() {
    let cluster = Cluster::start(3);
    let mut body = String::new();
    for alg in ["fixed", "sliding_log", "gcra"] {
        body.push_str(&format!(
            "location = /{alg}.html {{ rl_limit zone=c key=$http_x_k rate=50r/h burst=50 algorithm={alg}; }}\n"
        ));
    }
    body.push_str(
        "location = /team.html {\n\
           rl_limit zone=c key=$http_x_user rate=5r/h burst=5;\n\
           rl_limit zone=c key=$http_x_team rate=3r/h burst=3;\n\
           rl_headers draft;\n\
         }",
    );
    let mut setup = Nginx::setup(&server(&format!("rl_zone c redis={} timeout=1s;", cluster.url()), &body));
    for f in ["fixed", "sliding_log", "gcra", "team"] {
        setup = setup.file(&format!("html/{f}.html"), &format!("{f}\n"));
    }
    let ngx = setup.start();

    // Exact counts, on keys spread over the masters.
    for (i, alg) in ["fixed", "sliding_log", "gcra"].iter().enumerate() {
        for k in 0..2 {
            let key = format!("client-{i}-{k}");
            let rs = ngx.concurrent(150, &format!("/{alg}.html"), &[("X-K", &key)]);
            assert_eq!(statuses(&rs), counts(&[(200, 50), (429, 100)]), "cluster, algorithm={alg}, key {key}");
        }
    }
    let keys = cluster.keys("rl:*");
    assert_eq!(keys.len(), 6, "state keys in the cluster: {keys:?}");
    let holding =
        cluster.ports.iter().filter(|p| !cluster.cli(**p, &["--scan", "--pattern", "rl:*"]).is_empty()).count();
    eprintln!("state keys spread over {holding} of 3 masters");
    // The library was loaded on every master (FUNCTION LOAD goes to all of
    // them), and the script ran as a function wherever keys live.
    for &p in &cluster.ports {
        assert!(cluster.cli(p, &["FUNCTION", "LIST"]).contains("rl_"), "no library on master {p}");
        let fcalls = cluster.cli(p, &["INFO", "commandstats"]).contains("cmdstat_fcall:");
        let has_keys = !cluster.cli(p, &["--scan", "--pattern", "rl:*"]).is_empty();
        assert!(fcalls || !has_keys, "master {p} holds keys but ran no FCALL");
    }

    // Two lines, two keys (two hash tags: two slots, most likely two masters).
    let req = |user: &str, team: &str| ngx.get("/team.html", &[("X-User", user), ("X-Team", team)]);
    let lines = |r: &Response| (sf_param(r, "RateLimit", "c", "r"), sf_param(r, "RateLimit", "c-2", "r"));
    for (user_r, team_r) in [(4, 2), (3, 1), (2, 0)] {
        let r = req("u1", "t1");
        assert_eq!(r.status, 200, "{r:?}");
        assert_eq!(lines(&r), (user_r, team_r), "(user, team) remaining: {r:?}");
    }
    // The team line rejects: the user line is not charged.
    let r = req("u1", "t1");
    assert_eq!(r.status, 429, "{r:?}");
    assert_eq!(sf_param(&r, "RateLimit", "c-2", "r"), 0, "{r:?}");
    for _ in 0..3 {
        let r = req("u2", "t1");
        assert_eq!(r.status, 429, "new user on the exhausted team: {r:?}");
        assert_eq!(sf_param(&r, "RateLimit", "c-2", "r"), 0, "{r:?}");
    }
    // Moved to a fresh team: u2 has its whole user budget, u1 what its admitted requests left.
    let r = req("u2", "t2");
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(lines(&r), (4, 2), "u2 charged on its user line by requests the team line rejected: {r:?}");
    let r = req("u1", "t2");
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(lines(&r), (1, 1), "u1 charged by its rejected request: {r:?}");

    let log = ngx.error_log();
    assert!(failed_lines(&log, "c").is_empty(), "{:?}", failed_lines(&log, "c"));
    assert!(crash_lines(&log).is_empty(), "{:?}", crash_lines(&log));
}

// ---------------------------------------------------------------------------
// 7. Password-protected Redis.
// ---------------------------------------------------------------------------

const PASSWORD: &str = "Pw-7f3kq9-Zx";
const WRONG_PASSWORD: &str = "Wr0ng-4vd8m2-Qy";

#[test]
fn password_protected_redis() {
    let redis = Redis::with_password(PASSWORD);
    let p = redis.port;
    let conf = server(
        &format!(
            "rl_zone ok redis=redis://:{PASSWORD}@127.0.0.1:{p}/0 timeout=1s;\n\
             rl_zone wa redis=redis://:{WRONG_PASSWORD}@127.0.0.1:{p}/0 on_error=allow;\n\
             rl_zone wd redis=redis://default:{WRONG_PASSWORD}@127.0.0.1:{p}/0 on_error=deny;"
        ),
        "location = /index.html { rl_limit zone=ok key=$http_x_k rate=5r/h burst=5; }\n\
         location = /a.html { rl_limit zone=wa rate=2r/h burst=2; }\n\
         location = /b.html { rl_limit zone=wd rate=2r/h burst=2; }",
    );
    let (ok, out) = nginx_t(&conf);
    assert!(ok, "nginx -t refused:\n{out}");
    assert!(!out.contains(PASSWORD) && !out.contains(WRONG_PASSWORD), "nginx -t shows a password:\n{out}");

    let ngx = Nginx::start(&conf);
    let rs = ngx.concurrent(20, "/index.html", &[("X-K", "pw")]);
    assert_eq!(statuses(&rs), counts(&[(200, 5), (429, 15)]), "right password");
    assert_eq!(redis.keys("rl:*").len(), 1);

    let a: Vec<u16> = (0..6).map(|_| ngx.get("/a.html", &[]).status).collect();
    assert_eq!(a, [200; 6], "wrong password, on_error=allow");
    let b: Vec<u16> = (0..6).map(|_| ngx.get("/b.html", &[]).status).collect();
    assert_eq!(b, [429; 6], "wrong password, on_error=deny");

    let log = ngx.error_log();
    for zone in ["wa", "wd"] {
        let lines = failed_lines(&log, zone);
        assert!(!lines.is_empty(), "no failure logged for zone {zone}:\n{log}");
        eprintln!("wrong password, zone {zone}: {}", lines[0]);
        assert!(lines.iter().all(|l| l.contains(":***@127.0.0.1")), "the URL is not shown redacted: {lines:?}");
    }
    assert!(failed_lines(&log, "ok").is_empty(), "{:?}", failed_lines(&log, "ok"));
    for pw in [PASSWORD, WRONG_PASSWORD] {
        let leaks: Vec<&str> = log.lines().filter(|l| l.contains(pw)).collect();
        assert!(leaks.is_empty(), "password in the error log: {leaks:?}");
    }
}

/// A password holding `@` (the credentials end at the last `@`): it
/// authenticates whole, and it is never shown, neither by `nginx -t` nor in
/// the failure lines of a zone whose Redis is down.
#[test]
fn password_with_at_sign() {
    const PW: &str = "pre@S3cr3tPw";
    let leaks = |text: &str| -> Vec<String> {
        text.lines().filter(|l| l.contains("S3cr3tPw") || l.contains("pre@")).map(String::from).collect()
    };
    let redis = Redis::with_password(PW);
    let p = redis.port;
    // A loopback port nothing listens on.
    let down = std::net::TcpListener::bind(("127.0.0.1", 0)).unwrap().local_addr().unwrap().port();
    let conf = server(
        &format!(
            "rl_zone ok redis=redis://:{PW}@127.0.0.1:{p}/0 timeout=1s;\n\
             rl_zone down redis=redis://u:{PW}@127.0.0.1:{down} on_error=allow;"
        ),
        "location = /index.html { rl_limit zone=ok key=$http_x_k rate=5r/h burst=5; }\n\
         location = /a.html { rl_limit zone=down rate=2r/h burst=2; }",
    );
    let (ok, out) = nginx_t(&conf);
    assert!(ok, "nginx -t refused:\n{out}");
    assert!(leaks(&out).is_empty(), "nginx -t shows the password: {:?}", leaks(&out));
    let bad = conf.replace(&format!(":{down} on_error"), &format!(":{down}/x on_error"));
    let (ok, out) = nginx_t(&bad);
    assert!(!ok && out.contains(&format!("\"redis://u:***@127.0.0.1:{down}/x\"")), "{out}");
    assert!(leaks(&out).is_empty(), "nginx -t shows the password: {:?}", leaks(&out));

    let ngx = Nginx::start(&conf);
    let rs = ngx.concurrent(20, "/index.html", &[("X-K", "at")]);
    assert_eq!(statuses(&rs), counts(&[(200, 5), (429, 15)]), "the password with its @ authenticates");
    assert_eq!(redis.keys("rl:*").len(), 1);
    let a: Vec<u16> = (0..4).map(|_| ngx.get("/a.html", &[]).status).collect();
    assert_eq!(a, [200; 4], "Redis down, on_error=allow");
    let log = ngx.error_log();
    let lines = failed_lines(&log, "down");
    assert!(!lines.is_empty(), "no failure logged for zone down:\n{log}");
    eprintln!("Redis down: {}", lines[0]);
    let shown = format!("redis://u:***@127.0.0.1:{down} failed");
    assert!(lines.iter().all(|l| l.contains(&shown)), "the URL is not shown redacted as {shown:?}: {lines:?}");
    assert!(leaks(&log).is_empty(), "password in the error log: {:?}", leaks(&log));
    assert!(failed_lines(&log, "ok").is_empty(), "{:?}", failed_lines(&log, "ok"));
}

// ---------------------------------------------------------------------------
// 7b. TLS (`rediss://`), with a private CA and client certificates.
// ---------------------------------------------------------------------------

#[test]
fn tls_redis_with_private_ca() {
    let certs = TestCerts::make();
    let (redis, tls_port) = Redis::with_tls(&certs);
    let url = format!("rediss://127.0.0.1:{tls_port}/0");
    let (ca, cert, key, other) =
        (certs.path("ca.pem"), certs.path("client.pem"), certs.path("client.key"), certs.path("other.pem"));
    let conf = server(
        &format!(
            "rl_zone ok redis={url} timeout=1s ssl_trusted_certificate={ca} ssl_certificate={cert} ssl_certificate_key={key};\n\
             rl_zone untrusted redis={url} timeout=1s on_error=deny ssl_trusted_certificate={other} ssl_certificate={cert} ssl_certificate_key={key};\n\
             rl_zone nocert redis={url} timeout=1s on_error=deny ssl_trusted_certificate={ca};"
        ),
        "location = /index.html { rl_limit zone=ok key=$http_x_k rate=5r/h burst=5; }\n\
         location = /a.html { rl_limit zone=untrusted rate=2r/h burst=2; }\n\
         location = /b.html { rl_limit zone=nocert rate=2r/h burst=2; }",
    );
    let (ok, out) = nginx_t(&conf);
    assert!(ok, "nginx -t refused:\n{out}");

    let ngx = Nginx::start(&conf);
    let rs = ngx.concurrent(20, "/index.html", &[("X-K", "tls")]);
    assert_eq!(statuses(&rs), counts(&[(200, 5), (429, 15)]), "over TLS, trusted CA and client certificate");
    assert_eq!(redis.keys("rl:*").len(), 1, "the state went to the TLS server");

    // A server certificate of a CA the zone does not trust, and a server
    // that wants a client certificate the zone does not have: on_error=deny.
    let a: Vec<u16> = (0..3).map(|_| ngx.get("/a.html", &[]).status).collect();
    assert_eq!(a, [429; 3], "untrusted server certificate");
    let b: Vec<u16> = (0..3).map(|_| ngx.get("/b.html", &[]).status).collect();
    assert_eq!(b, [429; 3], "no client certificate");
    let log = ngx.error_log();
    assert!(crash_lines(&log).is_empty(), "{:?}", crash_lines(&log));
    let untrusted = failed_lines(&log, "untrusted");
    assert!(!untrusted.is_empty(), "no failure logged for zone untrusted:\n{log}");
    eprintln!("untrusted: {}", untrusted[0]);
    assert!(untrusted[0].contains("certificate"), "{untrusted:?}");
    let nocert = failed_lines(&log, "nocert");
    assert!(!nocert.is_empty(), "no failure logged for zone nocert:\n{log}");
    eprintln!("nocert: {}", nocert[0]);
    assert!(failed_lines(&log, "ok").is_empty(), "{:?}", failed_lines(&log, "ok"));

    // nginx -t: the ssl_* parameters' mistakes.
    let zone = |params: &str| server(&format!("rl_zone z {params};"), "location / { rl_limit zone=z rate=1r/s; }");
    let missing = certs.path("missing.pem");
    let cases: Vec<(&str, String, Vec<String>)> = vec![
        (
            "plain URL",
            zone(&format!("redis=redis://127.0.0.1:6379 ssl_trusted_certificate={ca}")),
            vec!["\"rediss\" URL".into()],
        ),
        ("insecure", zone("redis=rediss://127.0.0.1:6379/#insecure"), vec!["always verified".into()]),
        (
            "missing file",
            zone(&format!("redis={url} ssl_trusted_certificate={missing}")),
            vec![format!("cannot load trusted certificates \"{missing}\"")],
        ),
        (
            "not PEM",
            zone(&format!("redis={url} ssl_trusted_certificate={}", certs.path("server.ext"))),
            vec!["no certificate in".into()],
        ),
        (
            "certificate without key",
            zone(&format!("redis={url} ssl_certificate={cert}")),
            vec!["no \"ssl_certificate_key\"".into()],
        ),
        (
            "key is not a key",
            zone(&format!("redis={url} ssl_certificate={cert} ssl_certificate_key={ca}")),
            vec!["private key".into()],
        ),
    ];
    let mut failures = Vec::new();
    for (what, conf, needles) in &cases {
        let (ok, out) = nginx_t(conf);
        let missing: Vec<&String> = needles.iter().filter(|n| !out.contains(n.as_str())).collect();
        if ok || !out.contains("[emerg]") || !out.contains("in \"rl_zone\" directive") || !missing.is_empty() {
            failures.push(format!("{what}: accepted={ok}, missing {missing:?} in:\n{out}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n----\n"));
}

/// A Cluster over TLS: the zone follows the masters' redirections to their
/// TLS ports, with the same CA and client certificate.
#[test]
fn tls_cluster() {
    let certs = TestCerts::make();
    let cluster = Cluster::start_tls(3, &certs);
    let tls = certs.zone_params();
    let conf = server(
        &format!("rl_zone c redis={} timeout=1s {tls};", cluster.tls_url()),
        "location = /index.html { rl_limit zone=c key=$http_x_k rate=10r/h burst=10 algorithm=gcra; }",
    );
    let ngx = Nginx::start(&conf);
    // (the clients of cluster_exact_and_all_or_nothing: their keys are on every master)
    for key in (0..3).flat_map(|i| (0..2).map(move |k| format!("client-{i}-{k}"))) {
        let rs = ngx.concurrent(30, "/index.html", &[("X-K", &key)]);
        assert_eq!(statuses(&rs), counts(&[(200, 10), (429, 20)]), "TLS cluster, key {key}");
    }
    let keys = cluster.keys("rl:*");
    assert_eq!(keys.len(), 6, "state keys in the cluster: {keys:?}");
    let slots: Vec<String> = keys.iter().map(|k| cluster.cli(cluster.ports[0], &["CLUSTER", "KEYSLOT", k])).collect();
    let holding =
        cluster.ports.iter().filter(|p| !cluster.cli(**p, &["--scan", "--pattern", "rl:*"]).is_empty()).count();
    assert!(holding >= 2, "6 clients' keys on {holding} master(s) only: slots {slots:?}");
    let log = ngx.error_log();
    assert!(crash_lines(&log).is_empty(), "{:?}", crash_lines(&log));
    assert!(failed_lines(&log, "c").is_empty(), "{:?}", failed_lines(&log, "c"));
}

/// A Redis user with the ACL the README gives (the script's calls and
/// commands, on `rl:*` keys only) limits exactly, every algorithm.
#[test]
fn least_privilege_acl_user() {
    let redis = Redis::start();
    let acl = "on >acl-pw ~rl:* +fcall +function|load +evalsha +eval +time +mget +get +set +setrange +del +llen \
               +lindex +lpush +ltrim +lrem +pexpire +select";
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let flat = readme.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        flat.contains(&format!("ACL SETUSER nginx {}", acl.replace("acl-pw", "PASSWORD"))),
        "the README gives another ACL"
    );
    let mut args = vec!["ACL", "SETUSER", "nginx"];
    args.extend(acl.split_whitespace());
    assert_eq!(redis.cli(&args), "OK");
    let algs = ["fixed", "sliding", "sliding_log", "token_bucket", "leaky_bucket", "gcra"];
    let locations: String = algs
        .iter()
        .map(|a| format!("location = /{a}.html {{ rl_limit zone=r key=$http_x_k rate=5r/h burst=5 algorithm={a}; }}\n"))
        .collect();
    let mut setup = Nginx::setup(&server(
        &format!("rl_zone r redis=redis://nginx:acl-pw@127.0.0.1:{}/1 timeout=1s;", redis.port),
        &locations,
    ));
    for a in algs {
        setup = setup.file(&format!("html/{a}.html"), &format!("{a}\n"));
    }
    let ngx = setup.start();
    for a in algs {
        let rs = ngx.concurrent(20, &format!("/{a}.html"), &[("X-K", a)]);
        assert_eq!(statuses(&rs), counts(&[(200, 5), (429, 15)]), "algorithm={a}");
    }
    let log = ngx.error_log();
    assert!(failed_lines(&log, "r").is_empty(), "{:?}", failed_lines(&log, "r"));
    assert!(redis.calls("fcall") > 0);
}

// ---------------------------------------------------------------------------
// 8. State keys: naming, TTL, expiry.
// ---------------------------------------------------------------------------

fn is_hex16(s: &str) -> bool {
    s.len() == 16 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// `<prefix>{<16 hex>}:<16 hex>`
fn key_shape_ok(key: &str, prefix: &str) -> bool {
    let Some(rest) = key.strip_prefix(prefix).and_then(|r| r.strip_prefix('{')) else { return false };
    let Some((tag, line)) = rest.split_once("}:") else { return false };
    is_hex16(tag) && is_hex16(line)
}

#[test]
fn state_keys_have_ttl_and_expire() {
    let redis = Redis::start();
    let mut body = String::new();
    for alg in ALGORITHMS {
        body.push_str(&format!(
            "location = /{alg}.html {{ rl_limit zone=r key=$http_x_k rate=10r/s burst=5 algorithm={alg}; }}\n"
        ));
    }
    body.push_str("location = /p.html { rl_limit zone=p key=$http_x_k rate=10r/s burst=5; }\n");
    let mut setup = Nginx::setup(&server(
        &format!(
            "rl_zone r redis={url} timeout=1s;\nrl_zone p redis={url} timeout=1s prefix=myapp:;",
            url = redis.url()
        ),
        &body,
    ));
    for f in ALGORITHMS.iter().chain(["p"].iter()) {
        setup = setup.file(&format!("html/{f}.html"), &format!("{f}\n"));
    }
    let ngx = setup.start();
    let h = [("X-K", "expiring")];
    for f in ALGORITHMS.iter().chain(["p"].iter()) {
        let got: Vec<u16> = (0..3).map(|_| ngx.get(&format!("/{f}.html"), &h).status).collect();
        assert_eq!(got, [200; 3], "/{f}.html");
    }

    let keys = redis.keys("rl:*");
    assert_eq!(keys.len(), ALGORITHMS.len(), "one key per line: {keys:?}");
    let mut max_ttl = 0;
    for k in &keys {
        assert!(key_shape_ok(k, "rl:"), "key {k:?} is not rl:{{<16 hex>}}:<16 hex>");
        let pttl: i64 = redis.cli(&["PTTL", k]).parse().unwrap();
        // TTL = reset (at most 2 windows of 0.5 s, for `sliding`) + 1 s,
        // + up to 1 s of slack for string states (set once, kept by the
        // next writes).
        assert!(pttl > 0 && pttl <= 3000, "PTTL of {k}: {pttl}");
        max_ttl = max_ttl.max(pttl);
    }
    // Every line has its own key, all with the same client tag.
    let tags: Vec<&str> = keys.iter().map(|k| &k[3..21]).collect();
    assert!(tags.iter().all(|t| *t == tags[0]), "one client key, one tag: {keys:?}");
    let pkeys = redis.keys("myapp:*");
    assert_eq!(pkeys.len(), 1, "prefix=myapp: {pkeys:?}");
    assert!(key_shape_ok(&pkeys[0], "myapp:"), "{pkeys:?}");
    let pttl: i64 = redis.cli(&["PTTL", &pkeys[0]]).parse().unwrap();
    assert!(pttl > 0 && pttl <= 3000, "PTTL of {}: {pttl}", pkeys[0]);

    // Each call that charged left a memo beside the state it wrote (in its
    // hash slot), for 10 s beyond the call's deadline (3/4 of the timeout).
    let memos = redis.memo_keys("rl:*");
    assert_eq!(memos.len(), 3 * ALGORITHMS.len(), "one memo per call: {memos:?}");
    for m in &memos {
        assert!(m.starts_with(&format!("{}:c:", &keys[0][..21])), "memo {m:?} not in the state keys' slot");
        let pttl: i64 = redis.cli(&["PTTL", m]).parse().unwrap();
        assert!(pttl > 9000 && pttl <= 10750, "PTTL of {m}: {pttl}");
    }

    thread::sleep(Duration::from_millis(max_ttl.max(pttl) as u64 + 300));
    assert_eq!(redis.keys("rl:*"), Vec::<String>::new(), "keys left after their TTL");
    assert_eq!(redis.keys("myapp:*"), Vec::<String>::new(), "keys left after their TTL");
    // An expired state is a fresh one.
    let r = ngx.get("/fixed.html", &h);
    assert_eq!((r.status, r.num("X-RateLimit-Remaining")), (200, 4), "{r:?}");
}

// ---------------------------------------------------------------------------
// 9. nginx -t.
// ---------------------------------------------------------------------------

#[test]
fn config_test_messages() {
    let zone = |params: &str| server(&format!("rl_zone z {params};"), "location / { rl_limit zone=z rate=1r/s; }");
    let pw = "Cfg-Secr3t-9w";
    let cases: Vec<(&str, String, Vec<&str>)> = vec![
        ("bad scheme", zone("redis=http://127.0.0.1:6379"), vec!["\"rl_zone\"", "http://127.0.0.1:6379"]),
        (
            "bad scheme with password",
            zone(&format!("redis=ftp://u:{pw}@127.0.0.1:6379")),
            vec!["\"rl_zone\"", "ftp://u:***@127.0.0.1:6379"],
        ),
        (
            "sentinel without master",
            zone("redis=redis+sentinel://127.0.0.1:26379"),
            vec!["\"rl_zone\"", "redis+sentinel://127.0.0.1:26379", "master"],
        ),
        (
            "sentinel with empty master",
            zone("redis=redis+sentinel://127.0.0.1:26379/"),
            vec!["\"rl_zone\"", "redis+sentinel://127.0.0.1:26379/", "master"],
        ),
        (
            "sentinel without master, with password",
            zone(&format!("redis=redis+sentinel://:{pw}@127.0.0.1:26379")),
            vec!["\"rl_zone\"", "redis+sentinel://:***@127.0.0.1:26379", "master"],
        ),
        ("bad on_error", zone("redis=redis://127.0.0.1:6379 on_error=maybe"), vec!["\"rl_zone\"", "\"maybe\""]),
        (
            "bad on_error with password",
            zone(&format!("redis=redis://:{pw}@127.0.0.1:6379/0 on_error=sometimes")),
            vec!["\"rl_zone\"", "\"sometimes\""],
        ),
        ("bad timeout", zone("redis=redis://127.0.0.1:6379 timeout=soon"), vec!["\"rl_zone\"", "\"soon\""]),
        ("zero timeout", zone("redis=redis://127.0.0.1:6379 timeout=0ms"), vec!["\"rl_zone\"", "\"0ms\""]),
        (
            "bad port with password",
            zone(&format!("redis=redis://:{pw}@127.0.0.1:99999/0")),
            vec!["\"rl_zone\"", "redis://:***@127.0.0.1:99999/0"],
        ),
        (
            "bad cluster hosts",
            zone("redis=redis+cluster://127.0.0.1"),
            vec!["\"rl_zone\"", "redis+cluster://127.0.0.1"],
        ),
        ("unknown parameter", zone("redis=redis://127.0.0.1:6379 pool=3"), vec!["\"rl_zone\"", "\"pool=3\""]),
        (
            "line out of the script's exact range",
            server(
                "rl_zone z redis=redis://127.0.0.1:6379;",
                "location / { rl_limit zone=z rate=1r/d burst=100000 algorithm=fixed; }",
            ),
            vec!["\"rl_limit\"", "1r/d", "100000"],
        ),
    ];
    let mut failures = Vec::new();
    for (what, conf, needles) in &cases {
        let (ok, out) = nginx_t(conf);
        let missing: Vec<&&str> = needles.iter().filter(|n| !out.contains(**n)).collect();
        if ok || !out.contains("[emerg]") || !out.contains("nginx.conf:") || !missing.is_empty() || out.contains(pw) {
            failures.push(format!(
                "{what}: accepted={ok}, missing {missing:?}, password shown={} in:\n{out}",
                out.contains(pw)
            ));
        }
    }
    // Good ones (nothing is connected at configuration time).
    let good = server(
        &format!(
            "rl_zone a redis=redis://127.0.0.1:6379;\n\
             rl_zone b redis=rediss://user:{pw}@127.0.0.1:6380/2 timeout=200ms on_error=deny prefix=app:;\n\
             rl_zone c redis=redis+sentinel://127.0.0.1:26379,127.0.0.1:26380/mymaster;\n\
             rl_zone d redis=redis+cluster://127.0.0.1:7000,127.0.0.1:7001 timeout=1s;"
        ),
        "location / { rl_limit zone=a rate=1r/s; rl_limit zone=b rate=1r/m; rl_limit zone=c rate=1r/h; rl_limit zone=d rate=1r/d; }",
    );
    let (ok, out) = nginx_t(&good);
    if !ok || !out.contains("test is successful") || out.contains(pw) {
        failures.push(format!("good configuration refused (or password shown):\n{out}"));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n----\n"));
}

// ---------------------------------------------------------------------------
// The default key.
// ---------------------------------------------------------------------------

/// One GET over `stream` (a TCP or UNIX-domain connection): the status.
fn status_over(mut stream: impl std::io::Read + std::io::Write, path: &str) -> u16 {
    let req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    stream.write_all(req.as_bytes()).unwrap();
    let mut buf = Vec::new();
    stream.read_to_end(&mut buf).unwrap();
    let head = String::from_utf8_lossy(&buf);
    head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("no status in {head:?}"))
}

/// The default key, `$binary_remote_addr`, is read from the connection
/// without nginx's variable: it must be the bytes the variable gives, for
/// IPv4, IPv6 and UNIX-domain clients alike. A Redis state key carries a
/// hash of the client key (its `{tag}`): a line keyed by default and a line
/// keyed by `${binary_remote_addr}${arg_none}` (a complex value, which
/// nginx's handler evaluates; `$arg_none` is empty) must give one tag per
/// client, and different tags to different clients.
#[test]
fn default_key_is_binary_remote_addr_for_every_address_family() {
    use std::net::{Ipv6Addr, TcpStream};
    use std::os::unix::net::UnixStream;

    let redis = Redis::start();
    let conf = format!(
        "rl_zone r redis={} timeout=1s;\n\
         server {{\n listen 127.0.0.1:{{PORT}};\n listen [::1]:{{PORT}};\n listen unix:{{ROOT}}/client.sock;\n root {{ROOT}};\n\
         location = /a.html {{ rl_limit zone=r rate=10r/m; }}\n\
         location = /b.html {{ rl_limit zone=r rate=10r/m key=${{binary_remote_addr}}${{arg_none}}; }}\n}}\n",
        redis.url()
    );
    let ngx = Nginx::start(&conf);
    let sock = ngx.prefix.join("html/client.sock");
    for path in ["/a.html", "/b.html"] {
        assert_eq!(status_over(TcpStream::connect(("127.0.0.1", ngx.port)).unwrap(), path), 200);
        assert_eq!(status_over(TcpStream::connect((Ipv6Addr::LOCALHOST, ngx.port)).unwrap(), path), 200);
        assert_eq!(status_over(UnixStream::connect(&sock).unwrap(), path), 200);
    }
    let tag = |client: &[u8]| format!("{{{}}}", rl_core::redis::key_tag(client));
    let mut v6 = [0u8; 16];
    v6[15] = 1;
    let keys = redis.keys("rl:*");
    for (client, bytes) in [("IPv4", &[127u8, 0, 0, 1][..]), ("IPv6", &v6[..]), ("UNIX", b"unix:")] {
        let with_tag = keys.iter().filter(|k| k.contains(&tag(bytes))).count();
        assert_eq!(with_tag, 2, "{client} client: both lines' states under its key's tag; keys: {keys:?}");
    }
    assert_eq!(keys.len(), 6, "three clients, two lines: {keys:?}");
}

// ---------------------------------------------------------------------------
// Connections as nginx connections: closed by workers that exit.
// ---------------------------------------------------------------------------

/// The connections Redis has from nginx (every client but `redis-cli`'s own).
fn nginx_clients(redis: &Redis) -> usize {
    redis.cli(&["CLIENT", "LIST"]).lines().filter(|l| !l.contains("cmd=client")).count()
}

/// A zone's connections belong to its worker: a reload's old workers close
/// theirs as they exit (nginx would log an `[alert]` for a socket left
/// open), the new ones open their own at their first call, and a stopped
/// nginx leaves none.
#[test]
fn workers_that_exit_close_their_connections() {
    let redis = Redis::start();
    let mut ngx = Nginx::start(&server(
        &format!("rl_zone r redis={} timeout=1s;", redis.url()),
        "location = /a.html { rl_limit zone=r key=$http_x_k rate=100r/s; }",
    ));
    let used = |ngx: &Nginx| {
        for _ in 0..50 {
            let rs = ngx.concurrent(20, "/a.html", &[("X-K", "k")]);
            assert!(rs.iter().all(|r| r.status == 200), "{:?}", statuses(&rs));
            if nginx_clients(&redis) == WORKERS {
                return;
            }
        }
        panic!("{} connections from {WORKERS} workers", nginx_clients(&redis));
    };
    used(&ngx);
    ngx.reload();
    let deadline = Instant::now() + Duration::from_secs(5);
    while nginx_clients(&redis) > 0 {
        assert!(Instant::now() < deadline, "old workers left {} connections open", nginx_clients(&redis));
        thread::sleep(Duration::from_millis(20));
    }
    used(&ngx);
    let log = ngx.error_log();
    assert!(crash_lines(&log).is_empty(), "{:?}", crash_lines(&log));
    assert!(!log.contains("open socket"), "{log}");
    drop(ngx);
    let deadline = Instant::now() + Duration::from_secs(5);
    while nginx_clients(&redis) > 0 {
        assert!(Instant::now() < deadline, "a stopped nginx left {} connections open", nginx_clients(&redis));
        thread::sleep(Duration::from_millis(20));
    }
}

/// Reloads `ngx` with `worker_connections n` in its `events {}`; returns
/// the error log's length before.
fn with_worker_connections(ngx: &Nginx, n: usize) -> usize {
    ngx.reload_edited(|conf| {
        let (head, rest) = conf.split_once("worker_connections ").unwrap_or_else(|| panic!("{conf}"));
        let tail = rest.split_once(';').map_or("", |(_, t)| t);
        format!("{head}worker_connections {n};{tail}")
    })
}

/// A Redis zone's connections are nginx connections: they count in
/// `worker_connections`. With 3 (a worker's channel to its master, its
/// listening socket, one client connection), a request that needs Redis
/// finds no connection left for it: nginx says so ("worker_connections are
/// not enough") and the request is answered per `on_error`. With 4 it is
/// decided by Redis, and the same nginx with a shared-memory line at 3
/// serves it: the one connection more is Redis's.
#[test]
fn redis_connections_count_in_worker_connections() {
    let redis = Redis::start();
    let conf = |zone: &str| {
        server(
            &format!("rl_zone r redis={} timeout=300ms on_error=allow;\nrl_zone s size=1m;", redis.url()),
            &format!("location / {{ rl_limit zone={zone} rate=1r/m burst=1 key=all; }}"),
        )
    };
    let ngx = Nginx::start(&conf("r"));
    let from = with_worker_connections(&ngx, 3);
    let r = ngx.get("/index.html", &[]);
    let log = ngx.error_log_since(from);
    assert_eq!(r.status, 200, "let through per on_error: {r:?}\n{log}");
    assert!(log.contains("3 worker_connections are not enough"), "{log}");
    assert!(log.contains("allowing request"), "{log}");
    let from = with_worker_connections(&ngx, 4);
    let got: Vec<u16> = (0..3).map(|_| ngx.get("/index.html", &[]).status).collect();
    let log = ngx.error_log_since(from);
    assert!(got.contains(&429), "decided by Redis: {got:?}\n{log}");
    assert!(!log.contains("worker_connections are not enough"), "{log}");
    drop(ngx);
    let shm = Nginx::start(&conf("s"));
    let from = with_worker_connections(&shm, 3);
    let got: Vec<u16> = (0..2).map(|_| shm.get("/index.html", &[]).status).collect();
    let log = shm.error_log_since(from);
    assert_eq!(got, [200, 429], "{log}");
    assert!(!log.contains("worker_connections are not enough"), "{log}");
}
