//! The recipes of `nginx-conf/` for what the README describes beside the
//! directives: a fleet of nginx on one Redis (`redis-fleet.conf`), or on
//! two memcached servers (`memcached-fleet.conf`), the
//! counters for Prometheus and Grafana (`metrics.conf`), and the endpoint
//! that tells a client its budget (`quota-endpoint.conf`), each run as it is
//! on a throw-away prefix (the others are started by `variables.rs` and
//! `plans.rs`; the dashboard's queries are checked by `dashboard.rs`).

mod common;

use common::conf_nginx::ConfNginx;
use common::memcached::Memcached;
use common::redis::Redis;
use common::*;

const API_INDEX: (&str, &str) = ("api/index.json", "{\"ok\":true}\n");

/// nginx-conf/redis-fleet.conf started twice on one Redis: an API key's 10
/// requests a minute are spent across both nginx, then both refuse it (and
/// not another key); the login's 5 attempts are shared too. With Redis
/// gone, as the recipe says, the API fails open (the spent key passes on
/// both) and the login fails closed (refused on both, with attempts left).
#[test]
fn redis_fleet_shares_one_budget() {
    let mut redis = Redis::start();
    let url = redis.url();
    let replace = [("redis://127.0.0.1:6379", url.as_str())];
    let a = ConfNginx::start_with("redis-fleet.conf", &[API_INDEX], &replace);
    let b = ConfNginx::start_with("redis-fleet.conf", &[API_INDEX], &replace);
    let fleet = [&a, &b];
    let key = [("X-Api-Key", "fleet-key")];
    for i in 0..10 {
        let r = fleet[i % 2].get("/api/", &key);
        assert_eq!(r.status, 200, "request {i} of 10, to nginx {}: {r:?}", i % 2);
    }
    for (n, ngx) in fleet.iter().enumerate() {
        let r = ngx.get("/api/", &key);
        assert_eq!(r.status, 429, "nginx {n}, the fleet's 10 spent: {r:?}");
        assert!(r.num("Retry-After") >= 1, "{r:?}");
        assert_eq!(ngx.get("/api/", &[("X-Api-Key", "other-key")]).status, 200, "nginx {n}, another key");
    }
    for (n, ngx) in fleet.iter().enumerate() {
        assert_eq!(ngx.get("/login", &[]).status, 200, "login {n}: 2 of the 5 spent");
    }
    assert!(!redis.keys("rl:*").is_empty(), "the fleet's state is in Redis");

    redis.stop();
    for (n, ngx) in fleet.iter().enumerate() {
        let r = ngx.get("/api/", &key);
        assert_eq!(r.status, 200, "nginx {n}, Redis down, /api/ (on_error=allow): {r:?}");
        let r = ngx.get("/login", &[]);
        assert_eq!(r.status, 429, "nginx {n}, Redis down, /login (on_error=deny), 3 attempts left: {r:?}");
    }
    for ngx in fleet {
        let log = ngx.error_log();
        assert!(!failed_lines(&log, "fleet").is_empty(), "no failure logged for zone fleet:\n{log}");
        assert!(!failed_lines(&log, "fleet_login").is_empty(), "no failure logged for zone fleet_login:\n{log}");
        assert!(crash_lines(&log).is_empty(), "{log}");
    }
}

/// nginx-conf/memcached-fleet.conf started twice on two memcached servers:
/// an API key's 10 requests a minute are spent across both nginx, then both
/// refuse it (and not another key); the login's 5 attempts are shared too.
/// With both servers gone, the API fails open and the login fails closed.
#[test]
fn memcached_fleet_shares_one_budget() {
    let (mut m1, mut m2) = (Memcached::start(), Memcached::start());
    let servers = format!("{},{}", m1.addr(), m2.addr());
    let replace = [("127.0.0.1:11211,127.0.0.1:11212", servers.as_str())];
    let a = ConfNginx::start_with("memcached-fleet.conf", &[API_INDEX], &replace);
    let b = ConfNginx::start_with("memcached-fleet.conf", &[API_INDEX], &replace);
    let fleet = [&a, &b];
    let key = [("X-Api-Key", "fleet-key")];
    // (the API's fixed window of a minute: its 11 requests in one)
    clear_of_window_end(60, 5);
    for i in 0..10 {
        let r = fleet[i % 2].get("/api/", &key);
        assert_eq!(r.status, 200, "request {i} of 10, to nginx {}: {r:?}", i % 2);
    }
    for (n, ngx) in fleet.iter().enumerate() {
        let r = ngx.get("/api/", &key);
        assert_eq!(r.status, 429, "nginx {n}, the fleet's 10 spent: {r:?}");
        assert!(r.num("Retry-After") >= 1, "{r:?}");
        assert_eq!(ngx.get("/api/", &[("X-Api-Key", "other-key")]).status, 200, "nginx {n}, another key");
    }
    for (n, ngx) in fleet.iter().enumerate() {
        assert_eq!(ngx.get("/login", &[]).status, 200, "login {n}: 2 of the 5 spent");
    }
    assert!(!(m1.keys().is_empty() && m2.keys().is_empty()), "the fleet's counters are in memcached");

    m1.stop();
    m2.stop();
    for (n, ngx) in fleet.iter().enumerate() {
        let r = ngx.get("/api/", &key);
        assert_eq!(r.status, 200, "nginx {n}, memcached down, /api/ (on_error=allow): {r:?}");
        let r = ngx.get("/login", &[]);
        assert_eq!(r.status, 429, "nginx {n}, memcached down, /login (on_error=deny), 3 attempts left: {r:?}");
    }
    for ngx in fleet {
        let log = ngx.error_log();
        assert!(log.contains("rl_zone \"fleet\" memcached"), "no failure logged for zone fleet:\n{log}");
        assert!(log.contains("rl_zone \"fleet_login\" memcached"), "no failure logged for zone fleet_login:\n{log}");
        assert!(crash_lines(&log).is_empty(), "{log}");
    }
}

/// The value of the series `name` (its whole text before the value) in a
/// Prometheus text, 0 where it is not there.
fn sample(text: &str, series: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.strip_prefix(' ')))
        .map(|v| v.trim().parse().unwrap_or_else(|_| panic!("{series} {v}")))
        .unwrap_or(0)
}

/// nginx-conf/metrics.conf: /metrics in the Prometheus text format, which
/// promtool accepts; after 25 requests of one address and key, the named
/// lines' counters moved by exactly what they decided (the first line
/// admits its burst of 20 and a refill or two, the daily line all 25), and
/// the zone holds the two keys.
#[test]
fn metrics_conf_counts_each_line() {
    let ngx = ConfNginx::start("metrics.conf", &[API_INDEX]);
    let scrape = || {
        let r = ngx.get("/metrics", &[]);
        assert_eq!(r.status, 200, "{r:?}");
        assert_eq!(r.header("Content-Type"), Some("text/plain; version=0.0.4"), "{r:?}");
        promtool_check_metrics(&r.body);
        r.body
    };
    let series = |line: &str, result: &str| {
        format!("nginx_rl_requests_total{{zone=\"api\",line=\"{line}\",result=\"{result}\"}}")
    };
    let before = scrape();
    let key = [("X-Api-Key", "k1")];
    let statuses: Vec<u16> = (0..25).map(|_| ngx.get("/api/", &key).status).collect();
    let passed = statuses.iter().filter(|s| **s == 200).count() as u64;
    assert!((20..=22).contains(&passed) && statuses.iter().all(|s| matches!(s, 200 | 429)), "{statuses:?}");
    let after = scrape();
    let moved =
        |line: &str, result: &str| sample(&after, &series(line, result)) - sample(&before, &series(line, result));
    assert_eq!(moved("per_address", "passed"), passed, "{after}");
    assert_eq!(moved("per_address", "rejected"), 25 - passed, "{after}");
    assert_eq!(moved("daily", "passed"), 25, "{after}");
    assert_eq!(moved("daily", "rejected"), 0, "{after}");
    assert_eq!(sample(&after, "nginx_rl_zone_keys{zone=\"api\"}"), 2, "{after}");
    assert_eq!(sample(&after, "nginx_rl_limit{zone=\"api\",line=\"daily\",param=\"burst\"}"), 10_000, "{after}");
    let json = ngx.get("/metrics?format=json", &[]);
    assert_eq!(json.status, 200, "{json:?}");
    assert!(json.body.contains("\"line\":\"per_address\""), "{json:?}");
}

/// An `rl_quota` body read by Python's `json`: one "name limit remaining
/// reset policy" line per line of the body.
fn quota_lines(body: &str) -> Vec<String> {
    let script = "import json, sys\n\
                  d = json.load(sys.stdin)\n\
                  assert set(d) == {'lines'}, d\n\
                  for l in d['lines']:\n\
                  \x20   assert l['zone'] == 'api', l\n\
                  \x20   print(l['name'], l['limit'], l['remaining'], l['reset'], l['policy'])\n";
    let out = python(script, body).unwrap_or_else(|e| panic!("not the JSON expected: {body:?}\n{e}"));
    out.lines().map(String::from).collect()
}

/// nginx-conf/quota-endpoint.conf: /quota tells a key its budgets, both
/// lines full at first; after 3 requests to /api/, the daily line has 997
/// left until midnight UTC (a calendar day), and reading it again charged
/// nothing; without a key only the per-address line is told.
#[test]
fn quota_endpoint_reads_what_the_api_spent() {
    let ngx = ConfNginx::start("quota-endpoint.conf", &[API_INDEX]);
    let key = [("X-Api-Key", "k1")];
    let read = |headers: &[(&str, &str)]| {
        let r = ngx.get("/quota", headers);
        assert_eq!((r.status, r.header("Content-Type")), (200, Some("application/json")), "{r:?}");
        quota_lines(&r.body)
    };
    assert_eq!(read(&key), ["per_second 20 20 0 q=20;w=2", "daily 1000 1000 0 q=1000;w=86400"]);
    for i in 0..3 {
        let r = ngx.get("/api/", &key);
        assert_eq!(r.status, 200, "request {i}: {r:?}");
    }
    let lines = read(&key);
    assert_eq!(lines.len(), 2, "{lines:?}");
    let f: Vec<&str> = lines[1].split(' ').collect();
    assert_eq!((f[0], f[1], f[2], f[4]), ("daily", "1000", "997", "q=1000;w=86400"), "{lines:?}");
    let midnight = 86_400 - unix_now() % 86_400;
    let reset: u64 = f[3].parse().unwrap();
    assert!(reset.abs_diff(midnight) <= 2, "daily reset {reset}, midnight UTC in {midnight} s: {lines:?}");
    // The per-address line spent 3 (and the reads nothing); 10 a second
    // refill it meanwhile.
    let p: Vec<&str> = lines[0].split(' ').collect();
    let left: u64 = p[2].parse().unwrap();
    assert!(p[0] == "per_second" && (17..=20).contains(&left), "{lines:?}");
    assert!(read(&key)[1].starts_with("daily 1000 997 "), "a quota read charges nothing");
    let anonymous = read(&[]);
    assert_eq!(anonymous.len(), 1, "a line with an empty key is left out: {anonymous:?}");
    assert!(anonymous[0].starts_with("per_second 20 "), "{anonymous:?}");
}
