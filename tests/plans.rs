//! Plans and metered costs (`rate=`, `burst=`, `cost=` from variables;
//! `charge=after`), on shared-memory zones; the Redis half is in the second
//! part of this file. What a client sees: statuses, the limit and what is
//! left in the headers, Retry-After, and the error log's lines.

mod common;

use std::thread;
use std::time::Duration;

use common::conf_nginx::ConfNginx;
use common::redis::Redis;
use common::*;

/// A backend in the same server: `/backend/` answers with the cost of the
/// request in `X-Tokens-Used` (30 unless the client asks for another), and
/// `/login-backend/` with 401 unless the client sends `X-Pass`.
const BACKEND: &str = "location /backend/ { add_header X-Tokens-Used $tokens always; return 200 \"ok\\n\"; }\n\
     location /login-backend/ { if ($http_x_pass) { return 200 \"welcome\\n\"; } return 401; }";

const MAPS: &str = "map $http_x_tokens $tokens { \"\" 30; default $http_x_tokens; }\n\
     map $status $failed_login { 401 1; 403 1; default 0; }\n\
     map $http_x_api_key $plan_rate { default 2r/h; ~^pro- 5r/h; ~^ent- \"\"; }";

fn plans(zones: &str, body: &str) -> Nginx {
    let zones = format!("{zones}\n{MAPS}");
    Nginx::start(&server(&zones, &format!("{body}\n{BACKEND}")))
}

/// Waits until the line read at `path` (an `rl_quota` location) has at most
/// `left` remaining: a Redis zone's charges go after the response, in a
/// call of their own (shared memory has charged before the response ends).
fn settle(ngx: &Nginx, path: &str, headers: &[(&str, &str)], left: u64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let r = ngx.get(path, headers);
        let now = r
            .body
            .split("\"remaining\":")
            .nth(1)
            .and_then(|t| t.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|n| n.parse::<u64>().ok());
        if now.is_some_and(|n| n <= left) {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "{path}: {now:?} remaining, waiting for {left}: {r:?}");
        thread::sleep(Duration::from_millis(10));
    }
}

/// A backend on a port of its own that answers its requests one at a time,
/// in the order they connect, each once the test sends it the cost to put
/// in `X-Tokens-Used`: a request decided, then held as long as the test
/// wants.
struct HeldBackend {
    port: u16,
    go: std::sync::mpsc::Sender<u64>,
    served: thread::JoinHandle<()>,
}

impl HeldBackend {
    /// Serves `n` requests.
    fn start(n: usize) -> HeldBackend {
        use std::io::{Read, Write};
        let backend = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = backend.local_addr().unwrap().port();
        let (go, wait) = std::sync::mpsc::channel::<u64>();
        let served = thread::spawn(move || {
            for _ in 0..n {
                let (mut c, _) = backend.accept().unwrap();
                let mut buf = [0u8; 4096];
                let _ = c.read(&mut buf);
                let cost = wait.recv().unwrap();
                let head = format!(
                    "HTTP/1.1 200 OK\r\nX-Tokens-Used: {cost}\r\nContent-Length: 3\r\nConnection: close\r\n\r\nok\n"
                );
                let _ = c.write_all(head.as_bytes());
            }
        });
        HeldBackend { port, go, served }
    }

    /// Answers the next request, with `cost`.
    fn answer(&self, cost: u64) {
        self.go.send(cost).unwrap();
    }

    /// Waits until every request is answered.
    fn done(self) {
        self.served.join().unwrap();
    }
}

/// The sequence: burst=100, each response costs 30: requests 1-4
/// pass (the 4th takes the state to 120 used), the 5th is rejected with a
/// Retry-After that, waited, admits.
fn tokens(zone: &str) {
    let line = "rl_limit zone=z key=$http_x_api_key rate=50r/s burst=100 algorithm=token_bucket";
    let ngx = plans(
        zone,
        &format!(
            "location /llm/ {{ {line} cost=$upstream_http_x_tokens_used charge=after; \
                 proxy_pass http://127.0.0.1:{{PORT}}/backend/; }}\n\
             location /q/ {{ rl_quota; {line}; }}"
        ),
    );
    let key = [("X-Api-Key", "k1")];
    let first = ngx.get("/llm/", &key);
    assert_eq!(first.status, 200, "{first:?}");
    // Nothing is charged before the response: the whole burst is left.
    assert_eq!(first.header("X-RateLimit-Remaining"), Some("100"), "{first:?}");
    settle(&ngx, "/q/", &key, 72);
    let second = ngx.get("/llm/", &key);
    let left = second.num("X-RateLimit-Remaining");
    assert!((70..=72).contains(&left), "after one response of 30: {left} left, {second:?}");
    settle(&ngx, "/q/", &key, 42);
    for i in 3..=4 {
        let r = ngx.get("/llm/", &key);
        assert_eq!(r.status, 200, "request {i}: {r:?}");
        settle(&ngx, "/q/", &key, if i == 3 { 12 } else { 0 });
    }
    let fifth = ngx.get("/llm/", &key);
    assert_eq!(fifth.status, 429, "120 of 100 used: {fifth:?}");
    assert_eq!(fifth.header("X-RateLimit-Remaining"), Some("0"), "{fifth:?}");
    // 21 units to repay at 50 a second: under a second.
    assert_eq!(fifth.header("Retry-After"), Some("1"), "{fifth:?}");
    // Another key has its own budget.
    assert_eq!(ngx.get("/llm/", &[("X-Api-Key", "k2")]).status, 200);
    thread::sleep(Duration::from_secs(1));
    let later = ngx.get("/llm/", &key);
    assert_eq!(later.status, 200, "after Retry-After: {later:?}");
}

/// An upstream's cost that cannot be true (2^64 - 1 tokens, which parses)
/// is charged as a week's refill, logged at most once a second per line:
/// the key waits a week less its burst's second, and no figure a client
/// sees is a saturated one.
fn impossible_cost(zone: &str) {
    let line = "rl_limit zone=z key=$http_x_api_key rate=1000r/s burst=1000 algorithm=token_bucket";
    let ngx = plans(
        zone,
        &format!(
            "location /llm/ {{ {line} cost=$upstream_http_x_tokens_used charge=after; rl_headers both; \
                 proxy_pass http://127.0.0.1:{{PORT}}/backend/; }}\n\
             location /q/ {{ rl_quota; {line}; }}"
        ),
    );
    let huge = "18446744073709551615";
    for k in ["k1", "k2", "k3"] {
        let r = ngx.get("/llm/", &[("X-Api-Key", k), ("X-Tokens", huge)]);
        assert_eq!(r.status, 200, "{k}: {r:?}");
    }
    let key = [("X-Api-Key", "k1")];
    settle(&ngx, "/q/", &key, 0);
    let r = ngx.get("/llm/", &key);
    assert_eq!(r.status, 429, "{r:?}");
    // 604,800,000 charged: 604,799,001 tokens to repay at 1,000 a second.
    let want = 604_799_001u64.div_ceil(1_000);
    let retry = r.num("Retry-After");
    assert!((want - 2..=want).contains(&retry), "Retry-After {retry}, about {want}: {r:?}");
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let reset = r.num("X-RateLimit-Reset").saturating_sub(now);
    assert!((7 * 86_400 - 2..=7 * 86_400 + 1).contains(&reset), "reset in a week, not in {reset} s: {r:?}");
    let q = ngx.get("/q/", &key);
    let read = |f: &str| q.body.split(&format!("\"{f}\":")).nth(1).and_then(|t| t.split([',', '}']).next());
    assert_eq!(read("remaining"), Some("0"), "{q:?}");
    let reset: u64 = read("reset").and_then(|t| t.parse().ok()).unwrap_or(0);
    assert!((7 * 86_400 - 2..=7 * 86_400).contains(&reset), "{q:?}");
    let log = ngx.error_log();
    let said =
        "cost 18446744073709551615 from \"$upstream_http_x_tokens_used\" is more than the rate refills in 7 days \
                in rl_limit \"z\" of zone \"z\"";
    let n = log.matches(said).count();
    assert!((1..3).contains(&n), "logged once a second per line, {n} times for 3 charges:\n{log}");
    assert!(log.contains("charged as 604800000"), "{log}");
}

#[test]
fn impossible_cost_is_capped_shm() {
    impossible_cost("rl_zone z size=1m;");
}

#[test]
fn impossible_cost_is_capped_redis() {
    let redis = Redis::start();
    impossible_cost(&format!("rl_zone z redis={} timeout=1s;", redis.url()));
}

#[test]
fn charge_after_overdraws_and_waits_shm() {
    tokens("rl_zone z size=1m;");
}

#[test]
fn charge_after_overdraws_and_waits_redis() {
    let redis = Redis::start();
    tokens(&format!("rl_zone z redis={} timeout=1s;", redis.url()));
}

/// A charge a Redis zone cannot take (a cost beyond what its script keeps
/// exact: even capped at a week's refill, 10,000 tokens a second make one)
/// is logged and counted in `nginx_rl_charge_failures_total`, not retried;
/// the request was answered all the same.
#[test]
fn charge_failure_is_logged_and_counted() {
    let redis = Redis::start();
    let ngx = plans(
        &format!("rl_zone z redis={} timeout=1s;", redis.url()),
        "location /llm/ { rl_limit zone=z rate=10000r/s burst=100 algorithm=token_bucket \
             cost=$http_x_cost charge=after; }\n\
         location = /metrics { rl_metrics; }",
    );
    assert_eq!(ngx.get("/llm/index.html", &[("X-Cost", "5")]).status, 404);
    let huge = [("X-Cost", "1000000000000")];
    let r = ngx.get("/llm/index.html", &huge);
    assert_eq!(r.status, 404, "answered whatever its charge: {r:?}");
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let series = "nginx_rl_charge_failures_total{zone=\"z\"} ";
    loop {
        let text = ngx.get("/metrics", &[]).body;
        let n = text.lines().find_map(|l| l.strip_prefix(series)).unwrap_or("?").to_string();
        if n == "1" {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{series}{n}:\n{text}");
        thread::sleep(Duration::from_millis(20));
    }
    let log = ngx.error_log();
    assert!(log.contains("the cost of a request is not charged"), "{log}");
}

/// A charge whose call gets no reply (Redis paused past the connection's
/// stall limit, which gives the connection up) may or may not have been
/// run by Redis: it is counted apart, in `nginx_rl_charge_unknown_total`,
/// and logged as such, not as a charge lost.
#[test]
fn charge_without_reply_is_of_unknown_outcome() {
    let redis = Redis::start();
    // The request is decided (Redis answers), then waits for its response while Redis is paused.
    let backend = HeldBackend::start(1);
    let backend_port = backend.port;
    let ngx = plans(
        &format!("rl_zone z redis={} timeout=200ms;", redis.url()),
        &format!(
            "location /llm/ {{ rl_limit zone=z rate=100r/s burst=100 algorithm=token_bucket \
                 cost=$upstream_http_x_tokens_used charge=after; proxy_pass http://127.0.0.1:{backend_port}/; }}\n\
             location = /metrics {{ rl_metrics; }}"
        ),
    );
    let port = ngx.port;
    let client = thread::spawn(move || get(port, "/llm/", &[]));
    // The request is in the backend's hands once the backend has read it.
    thread::sleep(Duration::from_millis(300));
    assert_eq!(redis.cli(&["CLIENT", "PAUSE", "3000", "ALL"]), "OK");
    backend.answer(5);
    assert_eq!(client.join().unwrap().status, 200);
    backend.done();
    let metric = |text: &str, name: &str| {
        text.lines().find_map(|l| l.strip_prefix(&format!("{name}{{zone=\"z\"}} "))).unwrap_or("?").to_string()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let text = ngx.get("/metrics", &[]).body;
        if metric(&text, "nginx_rl_charge_unknown_total") == "1" {
            assert_eq!(metric(&text, "nginx_rl_charge_failures_total"), "0", "{text}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no charge of unknown outcome counted:\n{text}");
        thread::sleep(Duration::from_millis(50));
    }
    let log = ngx.error_log();
    assert!(log.contains("the cost of a request may or may not be charged"), "{log}");
    assert!(!log.contains("is not charged"), "{log}");
}

/// A request that `on_error=allow` let through (Redis paused when the
/// request was to be decided) is never charged its `charge=after` cost,
/// even when Redis is back before the request ends (the README's rule:
/// what Redis did not decide is not charged); a request Redis decided is.
#[test]
fn let_through_by_on_error_is_never_charged_after() {
    let redis = Redis::start();
    let backend = HeldBackend::start(2);
    let backend_port = backend.port;
    let line = "rl_limit zone=z rate=100r/m burst=100 algorithm=fixed";
    let ngx = plans(
        &format!("rl_zone z redis={} timeout=200ms on_error=allow;", redis.url()),
        &format!(
            "location /llm/ {{ {line} cost=$upstream_http_x_tokens_used charge=after; \
                 proxy_pass http://127.0.0.1:{backend_port}/; }}\n\
             location /q/ {{ rl_quota; {line}; }}\n\
             location = /metrics {{ rl_metrics; }}"
        ),
    );
    clear_of_window_end(60, 10);
    settle(&ngx, "/q/", &[], 100);
    // Paused for a second: the request's check gets no answer in 200 ms, and it is let through.
    assert_eq!(redis.cli(&["CLIENT", "PAUSE", "1000", "ALL"]), "OK");
    let port = ngx.port;
    let client = thread::spawn(move || get(port, "/llm/", &[]));
    // Its response comes once Redis answers again.
    thread::sleep(Duration::from_millis(1300));
    backend.answer(5);
    assert_eq!(client.join().unwrap().status, 200);
    // A request Redis decides, then charged its 7.
    let client = thread::spawn(move || get(port, "/llm/", &[]));
    thread::sleep(Duration::from_millis(300));
    backend.answer(7);
    assert_eq!(client.join().unwrap().status, 200);
    backend.done();
    settle(&ngx, "/q/", &[], 93);
    // (time for a charge of the first request, were there one, to land)
    thread::sleep(Duration::from_millis(500));
    let q = ngx.get("/q/", &[]).body;
    assert!(q.contains("\"remaining\":93"), "only the decided request's 7 is charged: {q}");
    let m = ngx.get("/metrics", &[]).body;
    assert!(
        m.lines()
            .any(|l| l.starts_with("nginx_rl_requests_total{zone=\"z\",") && l.contains("result=\"error_allowed\"} 1")),
        "{m}"
    );
}

/// A charge that fails is logged whatever else fails meanwhile: with Redis
/// paused, requests that keep arriving fail too, more than the zone logs
/// (a few lines a second per worker), yet the charges of three requests
/// decided before the pause, made while the others flood, are logged in a
/// budget of their own.
#[test]
fn charge_failures_are_logged_however_many_requests_fail() {
    let redis = Redis::start();
    let backend = HeldBackend::start(3);
    let backend_port = backend.port;
    let ngx = plans(
        &format!("rl_zone z redis={} timeout=200ms on_error=allow;", redis.url()),
        &format!(
            "location /llm/ {{ rl_limit zone=z key=$http_x_k rate=1000r/s burst=1000 algorithm=token_bucket \
                 cost=$upstream_http_x_tokens_used charge=after; proxy_pass http://127.0.0.1:{backend_port}/; }}\n\
             location /plain/ {{ rl_limit zone=z key=$http_x_k rate=1000r/s burst=1000; }}"
        ),
    );
    let port = ngx.port;
    let decided: Vec<_> =
        (0..3).map(|i| thread::spawn(move || get(port, "/llm/", &[("X-K", &format!("llm-{i}"))]))).collect();
    // (decided, and in the backend's hands)
    thread::sleep(Duration::from_millis(400));
    assert_eq!(redis.cli(&["CLIENT", "PAUSE", "4000", "ALL"]), "OK");
    let until = std::time::Instant::now() + Duration::from_millis(2500);
    let flood: Vec<_> = (0..4)
        .map(|t| {
            thread::spawn(move || {
                let mut i = 0;
                while std::time::Instant::now() < until {
                    get(port, "/plain/index.html", &[("X-K", &format!("flood-{t}-{i}"))]);
                    i += 1;
                }
            })
        })
        .collect();
    thread::sleep(Duration::from_millis(1000));
    for _ in 0..3 {
        backend.answer(5);
    }
    for c in decided {
        assert_eq!(c.join().unwrap().status, 200);
    }
    backend.done();
    for f in flood {
        f.join().unwrap();
    }
    let log = ngx.error_log();
    let request_errors = failed_lines(&log, "z").iter().filter(|l| l.contains("allowing request")).count();
    assert!(request_errors >= 6, "the requests' failures were logged: {request_errors}\n{log}");
    assert!(
        log.contains("may or may not be charged") || log.contains("not charged"),
        "no charge failure logged:\n{log}"
    );
}

/// Only the 401s count: 10 good logins pass, then 5 failed ones pass as
/// 401s, and the 6th failed one, and any login after it, is limited.
fn failed_logins(zone: &str) {
    let line = "rl_limit zone=z rate=5r/h algorithm=fixed";
    let ngx = plans(
        zone,
        &format!(
            "location /login/ {{ {line} cost=$failed_login charge=after; \
                 proxy_pass http://127.0.0.1:{{PORT}}/login-backend/; }}\n\
             location /q/ {{ rl_quota; {line}; }}"
        ),
    );
    for i in 0..10 {
        let r = ngx.get("/login/", &[("X-Pass", "1")]);
        assert_eq!(r.status, 200, "good login {i}: {r:?}");
    }
    settle(&ngx, "/q/", &[], 5);
    for i in 0..5 {
        let r = ngx.get("/login/", &[]);
        assert_eq!(r.status, 401, "failed login {i}: {r:?}");
        settle(&ngx, "/q/", &[], 4 - i);
    }
    assert_eq!(ngx.get("/login/", &[]).status, 429);
    assert_eq!(ngx.get("/login/", &[("X-Pass", "1")]).status, 429);
}

#[test]
fn charge_after_failed_logins_only_shm() {
    failed_logins("rl_zone z size=1m;");
}

#[test]
fn charge_after_failed_logins_only_redis() {
    let redis = Redis::start();
    failed_logins(&format!("rl_zone z redis={} timeout=1s;", redis.url()));
}

/// A rate from a `map` on the API key: the free plan gets 2, the pro plan
/// 5, the enterprise plan (an empty rate) no limit; the limit header says
/// which.
fn plan_rates(zone: &str) {
    let ngx = plans(zone, "location / { rl_limit zone=z key=$http_x_api_key rate=$plan_rate algorithm=fixed; }");
    clear_of_window_end(3600, 5);
    for (key, n) in [("free-1", 2), ("pro-1", 5)] {
        let h = [("X-Api-Key", key)];
        for i in 0..n {
            let r = ngx.get("/index.html", &h);
            assert_eq!(r.status, 200, "{key} request {i}: {r:?}");
            assert_eq!(r.num("X-RateLimit-Limit"), n, "{r:?}");
        }
        assert_eq!(ngx.get("/index.html", &h).status, 429, "{key} beyond {n}");
    }
    for i in 0..10 {
        let r = ngx.get("/index.html", &[("X-Api-Key", "ent-1")]);
        assert_eq!(r.status, 200, "enterprise request {i}: {r:?}");
        assert!(r.header("X-RateLimit-Limit").is_none(), "no limit applies: {r:?}");
    }
}

#[test]
fn plan_rate_from_map_shm() {
    plan_rates("rl_zone z size=1m;");
}

#[test]
fn plan_rate_from_map_redis() {
    let redis = Redis::start();
    plan_rates(&format!("rl_zone z redis={} timeout=1s;", redis.url()));
}

/// More plans than a line keeps parsed (eight): twelve rates, the requests
/// of their keys interleaved, so that the values past the kept ones are
/// parsed on every request; each key gets its own rate, and its response
/// fields say so.
fn many_plans(zone: &str) {
    let ngx = plans(zone, "location / { rl_limit zone=z key=$http_x_user rate=$http_x_rate algorithm=fixed; }");
    clear_of_window_end(3600, 5);
    for round in 0..13 {
        for n in 1..=12u64 {
            let (user, rate) = (format!("u{n}"), format!("{n}r/h"));
            let r = ngx.get("/index.html", &[("X-User", &user), ("X-Rate", &rate)]);
            let want = if round < n { 200 } else { 429 };
            assert_eq!(r.status, want, "{rate}, request {round}: {r:?}");
            assert_eq!(r.num("X-RateLimit-Limit"), n, "{rate}, request {round}: {r:?}");
        }
    }
}

#[test]
fn more_plans_than_kept_shm() {
    many_plans("rl_zone z size=1m;");
}

#[test]
fn more_plans_than_kept_redis() {
    let redis = Redis::start();
    many_plans(&format!("rl_zone z redis={} timeout=1s;", redis.url()));
}

/// A key whose plan changes keeps what it used: 2 of a burst of 2 at
/// 2r/h, then upgraded to 5r/h (the same key), 3 more pass, for each
/// algorithm that a plan can take.
fn upgrade(zone: &str, alg: &str) {
    let ngx =
        plans(zone, &format!("location / {{ rl_limit zone=z key=$http_x_user rate=$http_x_rate algorithm={alg}; }}"));
    let free = [("X-User", "u"), ("X-Rate", "2r/h")];
    let pro = [("X-User", "u"), ("X-Rate", "5r/h")];
    assert_eq!(ngx.get("/index.html", &free).status, 200);
    assert_eq!(ngx.get("/index.html", &free).status, 200);
    assert_eq!(ngx.get("/index.html", &free).status, 429, "{alg}: free plan used up");
    for i in 0..3 {
        let r = ngx.get("/index.html", &pro);
        assert_eq!(r.status, 200, "{alg}: upgraded, request {i}: {r:?}");
    }
    let r = ngx.get("/index.html", &pro);
    assert_eq!(r.status, 429, "{alg}: 5 used of the pro plan's 5: {r:?}");
    // Back to the free plan: nothing left either.
    assert_eq!(ngx.get("/index.html", &free).status, 429, "{alg}: downgraded");
}

#[test]
fn plan_upgrade_keeps_what_was_used_shm() {
    for alg in ["fixed", "sliding", "token_bucket", "leaky_bucket", "gcra"] {
        upgrade("rl_zone z size=1m;", alg);
    }
}

#[test]
fn plan_upgrade_keeps_what_was_used_redis() {
    let redis = Redis::start();
    for alg in ["fixed", "sliding", "token_bucket", "leaky_bucket", "gcra"] {
        upgrade(&format!("rl_zone z redis={} timeout=1s;", redis.url()), alg);
    }
}

/// A value that does not parse leaves the line out for the request, and
/// says so at `error`, once a second per line at most, whichever worker
/// meets it.
#[test]
fn bad_value_is_logged_and_not_applied() {
    let ngx = plans(
        "rl_zone z size=1m;",
        "add_header X-Pid $pid always;\nlocation / { rl_limit zone=z rate=$http_x_rate burst=1 name=plan; }",
    );
    let bad = [("X-Rate", "lots")];
    let mut pids = std::collections::BTreeSet::new();
    // (until both workers have met it: which worker accepts a connection is the kernel's
    // choice, and one can take 40 in a row)
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while pids.len() < WORKERS {
        assert!(std::time::Instant::now() < deadline, "both workers never met the value: {pids:?}");
        for r in ngx.concurrent(8, "/index.html", &bad) {
            assert_eq!(r.status, 200, "{r:?}");
            pids.insert(r.header("X-Pid").unwrap_or_default().to_string());
        }
    }
    let log = ngx.error_log();
    let lines: Vec<&str> = log.lines().filter(|l| l.contains("[error]") && l.contains("invalid rate")).collect();
    assert!(!lines.is_empty(), "{log}");
    // "2026/12/01 20:14:44 [error] ...": one line a second at most.
    let mut seconds: Vec<&str> = lines.iter().map(|l| &l[..19]).collect();
    seconds.dedup();
    assert_eq!(seconds.len(), lines.len(), "more than one line in a second: {lines:#?}");
    assert!(
        lines[0].contains("invalid rate \"lots\" from \"$http_x_rate\" in rl_limit \"plan\" of zone \"z\""),
        "{}",
        lines[0]
    );
    assert!(lines[0].contains("), the line is not applied"), "{}", lines[0]);
    // A good value applies: burst 1.
    let good = [("X-Rate", "1r/h")];
    assert_eq!(ngx.get("/index.html", &good).status, 200);
    assert_eq!(ngx.get("/index.html", &good).status, 429);
}

/// What `nginx -t` can already tell is wrong.
#[test]
fn nginx_t_refusals() {
    let cases = [
        (
            "rl_limit zone=z rate=1r/s burst=$b algorithm=sliding_log;",
            "a burst from variables is not supported by algorithm \"sliding_log\"",
        ),
        ("rl_limit zone=z rate=$r algorithm=sliding_log;", "a burst from variables is not supported"),
        (
            "rl_limit zone=z rate=1r/s cost=$c charge=after algorithm=sliding_log;",
            "\"charge=after\" is not supported by algorithm \"sliding_log\"",
        ),
        (
            "rl_limit zone=z rate=1r/s cost=$c charge=after queue=5 algorithm=gcra;",
            "\"charge=after\" cannot be used with \"queue\"",
        ),
        ("rl_limit zone=z rate=1r/s charge=later;", "invalid charge \"later\""),
        ("rl_limit zone=z rate=1r/x$r;", "invalid rate"),
    ];
    for (line, want) in cases {
        let block = format!(
            "map $http_x $b {{ default 1; }}\nmap $http_x $r {{ default 1r/s; }}\nmap $http_x $c {{ default 1; }}\n{}",
            server("rl_zone z size=1m;", &format!("location / {{ {line} }}"))
        );
        let (ok, out) = nginx_t(&block);
        if want == "invalid rate" {
            // Text and variables mixed: only a request can tell.
            assert!(ok, "{line}: {out}");
            continue;
        }
        assert!(!ok, "{line} accepted");
        assert!(out.contains(want), "{line}: {out}");
    }
}

// ---------------------------------------------------------------------------
// The configurations of nginx-conf/ the README's "Plans" section shows, run
// as they are.
// ---------------------------------------------------------------------------

/// nginx-conf/usage-plan.conf: the free tier's burst of 50, the pro plan's
/// 500, no limit for enterprise keys, 401 without a key; the quota line
/// shows in the draft fields.
#[test]
fn usage_plan_conf() {
    let ngx = ConfNginx::start("usage-plan.conf", &[("api/index.json", "{\"ok\":true}\n")]);
    assert_eq!(ngx.get("/api/", &[]).status, 401);
    let free = [("X-Api-Key", "k-free")];
    let first = ngx.get("/api/", &free);
    assert_eq!(first.status, 200, "{first:?}");
    assert_eq!(first.header("RateLimit-Policy"), Some("\"rate\";q=50;w=5, \"quota\";q=10000;w=86400"), "{first:?}");
    assert_eq!(first.header("X-RateLimit-Limit"), Some("50"), "the line closest to limiting: {first:?}");
    let rs = ngx.concurrent(60, "/api/", &free);
    let limited: Vec<&Response> = rs.iter().filter(|r| r.status == 429).collect();
    // 49 left of the burst; the refill (10 a second) may add a few while they run.
    assert!((5..=11).contains(&limited.len()), "{:?}", statuses(&rs));
    assert!(limited[0].body.contains("\"error\":\"Too Many Requests\""), "{:?}", limited[0]);
    let pro = [("X-Api-Key", "pro-1")];
    let r = ngx.get("/api/", &pro);
    assert_eq!((r.status, r.header("X-RateLimit-Limit")), (200, Some("500")), "{r:?}");
    let r = ngx.get("/api/", &[("X-Api-Key", "ent-1")]);
    assert_eq!(r.status, 200, "{r:?}");
    assert!(r.header("RateLimit").is_none(), "no line applies to an enterprise key: {r:?}");
}

/// nginx-conf/llm-tokens.conf: 100,000 tokens a day, 30,000 a response:
/// four responses, then a 429 whose Retry-After is the time to repay the
/// overdraft down to one token.
#[test]
fn llm_tokens_conf() {
    let ngx = ConfNginx::start("llm-tokens.conf", &[]);
    let key = [("X-Api-Key", "team-a")];
    for i in 0..4 {
        let r = ngx.get("/v1/chat", &key);
        assert_eq!(r.status, 200, "response {i}: {r:?}");
    }
    let r = ngx.get("/v1/chat", &key);
    assert_eq!(r.status, 429, "{r:?}");
    // 120,000 used: 20,001 tokens to repay at 100,000 a day.
    let wait = r.num("Retry-After");
    let want = (20_001u64 * 86_400).div_ceil(100_000);
    assert!((want - 2..=want).contains(&wait), "Retry-After {wait}, about {want}: {r:?}");
    assert_eq!(ngx.get("/v1/chat", &[("X-Api-Key", "team-b")]).status, 200);
}

/// nginx-conf/failed-login.conf: good logins cost nothing, five failed ones
/// use up the hour, then every login of the address is refused.
#[test]
fn failed_login_conf() {
    let ngx = ConfNginx::start("failed-login.conf", &[]);
    for _ in 0..8 {
        assert_eq!(ngx.get("/login", &[("X-Password", "secret")]).status, 200);
    }
    for i in 0..5 {
        assert_eq!(ngx.get("/login", &[("X-Password", "guess")]).status, 401, "failed login {i}");
    }
    assert_eq!(ngx.get("/login", &[("X-Password", "guess")]).status, 429);
    assert_eq!(ngx.get("/login", &[("X-Password", "secret")]).status, 429);
}

/// nginx-conf/auth-plan.conf: the plan from `auth_request_set`, limited
/// after authentication: the free token's burst of 5, the pro token's 50,
/// and refused requests (401) are never charged by the plan's line.
#[test]
fn auth_plan_conf() {
    let out = std::process::Command::new(nginx_bin()).arg("-V").output().expect("cannot run nginx -V");
    if !String::from_utf8_lossy(&out.stderr).contains("--with-http_auth_request_module") {
        eprintln!("skipped: {} has no auth_request module", nginx_bin().display());
        return;
    }
    let ngx = ConfNginx::start("auth-plan.conf", &[("api/index.json", "{\"ok\":true}\n")]);
    for _ in 0..10 {
        assert_eq!(ngx.get("/api/", &[("Authorization", "Bearer wrong")]).status, 401);
    }
    let free = [("Authorization", "Bearer free-token")];
    for i in 0..5 {
        let r = ngx.get("/api/", &free);
        assert_eq!(r.status, 200, "free request {i}: {r:?}");
        assert_eq!(r.header("RateLimit-Policy"), Some("\"ip\";q=100;w=2, \"plan\";q=5;w=30"), "{r:?}");
    }
    assert_eq!(ngx.get("/api/", &free).status, 429);
    let pro = [("Authorization", "Bearer pro-token")];
    let r = ngx.get("/api/", &pro);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.header("RateLimit-Policy"), Some("\"ip\";q=100;w=2, \"plan\";q=50;w=30"), "{r:?}");
}
