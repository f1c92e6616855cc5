//! Delaying (`queue=N`): up to `burst` requests pass at once; beyond that a
//! request waits for its turn at the rate if the wait is at most N emission
//! intervals, else it is rejected at once. Waiting requests sleep on a
//! timer: they hold no worker, and a client that goes away costs nothing.
//! Times are measured from the moment every request was sent, with 50 ms
//! of tolerance.

mod common;

use std::time::{Duration, Instant};

use common::redis::Redis;
use common::*;

const TOLERANCE: Duration = Duration::from_millis(50);

fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

/// The pattern: rate=10r/s burst=5 queue=10 and 20 simultaneous
/// requests of one key: 5 answered at once, 10 answered 100, 200, ...,
/// 1000 ms later (first come, first served), 5 rejected at once.
fn twenty_requests(zone: &str, alg: &str) {
    let body = format!(
        "location / {{ rl_limit zone=z rate=10r/s burst=5 queue=10 algorithm={alg}; access_log {{ROOT}}/../rl.log rl; }}"
    );
    let zones = format!("{zone}\nlog_format rl '$status $rl_status $rl_delay $rl_line';");
    let ngx = Nginx::start(&server(&zones, &body));
    let rs = ngx.concurrent_timed(20, "/index.html", &[]);
    let mut passed: Vec<u64> = rs.iter().filter(|(r, _)| r.status == 200).map(|(_, t)| ms(*t)).collect();
    let rejected: Vec<u64> = rs.iter().filter(|(r, _)| r.status == 429).map(|(_, t)| ms(*t)).collect();
    passed.sort_unstable();
    assert_eq!((passed.len(), rejected.len()), (15, 5), "{alg}: passed {passed:?} rejected {rejected:?}");
    let at_once = ms(TOLERANCE);
    assert!(rejected.iter().all(|t| *t <= at_once), "{alg}: rejections waited: {rejected:?}");
    assert!(passed[..5].iter().all(|t| *t <= at_once), "{alg}: the burst waited: {passed:?}");
    for (k, t) in passed[5..].iter().enumerate() {
        let want = 100 * (k as u64 + 1);
        assert!(
            t.abs_diff(want) <= at_once,
            "{alg}: delayed request {k} answered after {t} ms, not {want}: {passed:?}"
        );
    }
    // $rl_status and $rl_delay (ms) in the access log. A request of the burst may be DELAYED
    // by a millisecond or so rather than PASSED: each worker reads the time it cached when
    // its event loop last woke, and the two workers' may be a millisecond apart.
    let log = std::fs::read_to_string(ngx.prefix.join("rl.log")).unwrap_or_default();
    let mut by_status = std::collections::BTreeMap::new();
    let mut delays = Vec::new();
    for line in log.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        let delay = f[2].parse::<u64>().unwrap_or(0);
        let status = match f[1] {
            "DELAYED" if delay <= at_once => "PASSED",
            other => other,
        };
        *by_status.entry((f[0].to_string(), status.to_string())).or_insert(0) += 1;
        if f[1] == "DELAYED" {
            if delay > at_once {
                delays.push(delay);
            }
        } else {
            assert_eq!(f[2], "-", "{alg}: $rl_delay of a request not delayed: {line}");
        }
        assert_eq!(f[3], "z", "{alg}: $rl_line: {line}");
    }
    let want: std::collections::BTreeMap<_, _> = [
        (("200".to_string(), "PASSED".to_string()), 5),
        (("200".to_string(), "DELAYED".to_string()), 10),
        (("429".to_string(), "REJECTED".to_string()), 5),
    ]
    .into_iter()
    .collect();
    assert_eq!(by_status, want, "{alg}: {log}");
    delays.sort_unstable();
    assert!(delays.iter().enumerate().all(|(k, d)| d.abs_diff(100 * (k as u64 + 1)) <= at_once), "{alg}: {delays:?}");
    // One log line per delay (at warn, one level below the rejections) and per rejection, in
    // limit_req's form.
    let err = ngx.error_log();
    assert_eq!(
        err.lines().filter(|l| l.contains("[warn]") && l.contains("delaying request, excess: ")).count(),
        log.lines().filter(|l| l.contains(" DELAYED ")).count(),
        "{alg}: {err}"
    );
    assert_eq!(
        err.lines().filter(|l| l.contains("[error]") && l.contains("limiting requests, excess: ")).count(),
        5,
        "{alg}: {err}"
    );
}

#[test]
fn twenty_requests_gcra() {
    twenty_requests("rl_zone z size=1m;", "gcra");
}

#[test]
fn twenty_requests_token_bucket() {
    twenty_requests("rl_zone z size=1m;", "token_bucket");
}

#[test]
fn twenty_requests_leaky_bucket() {
    twenty_requests("rl_zone z size=1m;", "leaky_bucket");
}

#[test]
fn twenty_requests_redis() {
    let redis = Redis::start();
    twenty_requests(&format!("rl_zone z redis={} timeout=1s;", redis.url()), "gcra");
}

/// Several lines: the request waits for the longest delay.
#[test]
fn several_lines_wait_for_the_longest() {
    let body = "location / { rl_limit zone=z rate=10r/s burst=1 queue=5 algorithm=gcra; \
                rl_limit zone=z rate=5r/s burst=1 queue=5 algorithm=gcra key=$binary_remote_addr$host; }";
    let ngx = Nginx::start(&server("rl_zone z size=1m;", body));
    let rs = ngx.concurrent_timed(3, "/index.html", &[]);
    let mut t: Vec<u64> = rs
        .iter()
        .map(|(r, t)| {
            assert_eq!(r.status, 200);
            ms(*t)
        })
        .collect();
    t.sort_unstable();
    // The slower line: 0, 200, 400 ms.
    for (k, got) in t.iter().enumerate() {
        let want = 200 * k as u64;
        assert!(got.abs_diff(want) <= ms(TOLERANCE), "request {k}: {got} ms, not {want}: {t:?}");
    }
}

/// A waiting request holds no worker: an unlimited location answers at
/// once while 100 requests wait.
#[test]
fn unlimited_location_answers_while_requests_wait() {
    let body = "location /slow/ { rl_limit zone=z rate=10r/s burst=1 queue=200 algorithm=gcra; }\n\
                location /fast/ { }";
    let ngx = Nginx::setup(&server("rl_zone z size=1m;", body))
        .file("html/slow/index.html", "slow\n")
        .file("html/fast/index.html", "fast\n")
        .start();
    let waiting: Vec<_> = (0..100).map(|_| send_only(ngx.port, "/slow/")).collect();
    std::thread::sleep(Duration::from_millis(200));
    for _ in 0..5 {
        let t0 = Instant::now();
        let r = ngx.get("/fast/", &[]);
        assert_eq!(r.status, 200);
        assert!(t0.elapsed() < TOLERANCE, "/fast/ took {:?} while 100 requests wait", t0.elapsed());
    }
    drop(waiting);
    let log = ngx.error_log();
    assert!(crash_lines(&log).is_empty(), "{:?}", crash_lines(&log));
}

/// A client that goes away while delayed costs nothing: no crash, no
/// alert, and its place stays taken (as in limit_req). Its request is
/// `DELAYED` in the access log and `delayed` in the metrics: each request's
/// `$rl_status` is counted under the same verdict.
#[test]
fn client_gone_while_delayed() {
    let body = "location / { rl_limit zone=z rate=1r/s burst=1 queue=1 algorithm=gcra; \
                access_log {ROOT}/../rl.log rl; }\n\
                location = /metrics { rl_metrics; }";
    let ngx = Nginx::start(&server("rl_zone z size=1m;\nlog_format rl '$status $rl_status';", body));
    assert_eq!(ngx.get("/index.html", &[]).status, 200);
    let gone = send_only(ngx.port, "/index.html");
    std::thread::sleep(Duration::from_millis(100));
    drop(gone);
    // The place the gone client took is still taken: no room in the queue.
    assert_eq!(ngx.get("/index.html", &[]).status, 429);
    // After its turn, and the next one, there is room again.
    std::thread::sleep(Duration::from_millis(2100));
    let t0 = Instant::now();
    assert_eq!(ngx.get("/index.html", &[]).status, 200);
    assert!(t0.elapsed() < TOLERANCE * 4);
    let log = ngx.error_log();
    assert!(crash_lines(&log).is_empty(), "{:?}", crash_lines(&log));
    // One truth for the gone client: delayed, in the access log (as
    // $limit_req_status says) as in the metrics.
    let access = std::fs::read_to_string(ngx.prefix.join("rl.log")).unwrap_or_default();
    let lines: Vec<&str> = access.lines().collect();
    assert_eq!(lines.len(), 4, "{access}");
    assert!(lines[1].ends_with(" DELAYED"), "the gone client's line: {access}");
    let metrics = ngx.get("/metrics", &[]).body;
    for (status, result) in [("PASSED", "passed"), ("DELAYED", "delayed"), ("REJECTED", "rejected")] {
        let logged = lines.iter().filter(|l| l.ends_with(&format!(" {status}"))).count() as u64;
        let counted = requests_total(&metrics, "z", None, result);
        assert_eq!(counted, logged, "{status}: access log {access}\nmetrics {metrics}");
    }
}

#[test]
fn queue_is_refused_for_window_algorithms() {
    for alg in ["fixed", "sliding", "sliding_log"] {
        let block = server(
            "rl_zone z size=1m;",
            &format!("location / {{ rl_limit zone=z rate=1r/s queue=5 algorithm={alg}; }}"),
        );
        let (ok, out) = nginx_t(&block);
        assert!(!ok, "{alg}: {out}");
        assert!(out.contains("token_bucket") && out.contains("leaky_bucket") && out.contains("gcra"), "{alg}: {out}");
    }
    let block = server("rl_zone z size=1m;", "location / { rl_limit zone=z rate=1r/s queue=0 algorithm=fixed; }");
    assert!(nginx_t(&block).0);
}

/// The migration table from `limit_req`, checked side by side on the same
/// pattern (12 simultaneous requests of one key): `burst=B` is `burst=1
/// queue=B`; `burst=B nodelay` is `burst=B+1`; `burst=B delay=D` is
/// `burst=D+1 queue=B-D`; no `burst=` is `burst=1`. Same statuses, and the
/// same delays within the tolerance.
#[test]
fn limit_req_migration_side_by_side() {
    let cases = [
        ("burst=5", "burst=1 queue=5"),
        ("burst=5 nodelay", "burst=6"),
        ("burst=5 delay=2", "burst=3 queue=3"),
        ("", "burst=1"),
    ];
    for (lr, rl) in cases {
        let zones = "limit_req_zone $binary_remote_addr zone=lr:1m rate=10r/s;\nrl_zone z size=1m;\n\
                     limit_req_status 429;";
        let body = format!(
            "location /lr/ {{ limit_req zone=lr {lr}; }}\n\
             location /rl/ {{ rl_limit zone=z rate=10r/s {rl} algorithm=gcra; }}"
        );
        let ngx = Nginx::setup(&server(zones, &body))
            .file("html/lr/index.html", "x\n")
            .file("html/rl/index.html", "x\n")
            .start();
        let pattern = |path: &str| {
            let rs = ngx.concurrent_timed(12, path, &[]);
            let mut passed: Vec<u64> = rs.iter().filter(|(r, _)| r.status == 200).map(|(_, t)| ms(*t)).collect();
            passed.sort_unstable();
            (passed, statuses(&rs.into_iter().map(|(r, _)| r).collect::<Vec<_>>()))
        };
        let (lr_times, lr_statuses) = pattern("/lr/");
        let (rl_times, rl_statuses) = pattern("/rl/");
        assert_eq!(lr_statuses, rl_statuses, "limit_req {lr:?} vs rl_limit {rl:?}");
        for (a, b) in lr_times.iter().zip(&rl_times) {
            assert!(a.abs_diff(*b) <= ms(TOLERANCE), "limit_req {lr:?}: {lr_times:?}, rl_limit {rl:?}: {rl_times:?}");
        }
    }
}

/// A reload lets a waiting request finish in its turn: the old worker
/// answers it, then exits.
#[test]
fn reload_lets_waiting_requests_finish() {
    let body = "location / { rl_limit zone=z rate=1r/s burst=1 queue=2 algorithm=gcra; }";
    let mut ngx = Nginx::start(&server("rl_zone z size=1m;", body));
    assert_eq!(ngx.get("/index.html", &[]).status, 200);
    let port = ngx.port;
    let waiting = std::thread::spawn(move || {
        let t0 = Instant::now();
        (try_get(port, "/index.html", &[]).map(|r| r.status).ok(), t0.elapsed())
    });
    std::thread::sleep(Duration::from_millis(200));
    ngx.reload();
    let (status, took) = waiting.join().unwrap_or((None, Duration::ZERO));
    assert_eq!(status, Some(200), "the waiting request after a reload");
    assert!(took >= Duration::from_millis(700), "answered after {took:?}, before its turn");
    let log = ngx.error_log();
    assert!(crash_lines(&log).is_empty(), "{:?}", crash_lines(&log));
}

/// One line with queue=5 in /a and queue=0 in /b shares one state: while
/// /a's requests wait, /b sees the queued backlog and rejects, on Redis as
/// in shared memory (the reply for /b's line, beyond its own burst + queue,
/// is not taken for a malformed one).
#[test]
fn a_shorter_queue_sees_the_backlog() {
    let redis = Redis::start();
    for zone in
        ["rl_zone z size=1m;".to_string(), format!("rl_zone z redis={} timeout=1s on_error=allow;", redis.url())]
    {
        let body = "location /a/ { rl_limit zone=z rate=2r/s burst=1 queue=5 algorithm=gcra; }\n\
                    location /b/ { rl_limit zone=z rate=2r/s burst=1 algorithm=gcra; }";
        let ngx = Nginx::setup(&server(&zone, body))
            .file("html/a/index.html", "a\n")
            .file("html/b/index.html", "b\n")
            .start();
        let port = ngx.port;
        let waiting: Vec<_> = (0..4).map(|_| send_only(port, "/a/")).collect();
        std::thread::sleep(Duration::from_millis(300));
        let r = ngx.get("/b/", &[]);
        assert_eq!(r.status, 429, "{zone}: /b while /a's requests wait");
        drop(waiting);
        let log = ngx.error_log();
        assert!(failed_lines(&log, "z").is_empty(), "{zone}: {:?}", failed_lines(&log, "z"));
    }
}
