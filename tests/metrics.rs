//! `rl_metrics`: the counters read back, exactly, after a known sequence of
//! requests across the workers, through a parser of the text format (ours,
//! cross-checked with Python's `prometheus_client` where installed), as JSON
//! and after a reload; `promtool check metrics` on the text; the eviction
//! counters and the "is full" warning of a zone filled with keys still
//! limiting; a lease zone's syncs, grants and keys.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::thread;
use std::time::Duration;

use common::redis::Redis;
use common::*;

/// Samples by `name{label="value",...}` (labels sorted by name).
type Samples = BTreeMap<String, f64>;

fn key(name: &str, labels: &[(&str, &str)]) -> String {
    let mut l: Vec<_> = labels.to_vec();
    l.sort();
    let l: Vec<String> = l.iter().map(|(k, v)| format!("{k}={v:?}")).collect();
    format!("{name}{{{}}}", l.join(","))
}

/// Our parser of the text format: one sample a line, label values unescaped.
fn parse(text: &str) -> Samples {
    let mut out = Samples::new();
    for line in text.lines().filter(|l| !l.is_empty() && !l.starts_with('#')) {
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("bad sample: {line}"));
        let (name, labels) = match series.split_once('{') {
            None => (series, Vec::new()),
            Some((name, rest)) => {
                let mut labels = Vec::new();
                let mut chars = rest.strip_suffix('}').unwrap_or_else(|| panic!("bad labels: {line}")).chars();
                loop {
                    let k: String = chars.by_ref().take_while(|&c| c != '=').collect();
                    if k.is_empty() {
                        break;
                    }
                    assert_eq!(chars.next(), Some('"'), "{line}");
                    let mut v = String::new();
                    while let Some(c) = chars.next() {
                        match c {
                            '"' => break,
                            '\\' => match chars.next() {
                                Some('n') => v.push('\n'),
                                Some(c) => v.push(c),
                                None => panic!("{line}"),
                            },
                            c => v.push(c),
                        }
                    }
                    labels.push((k.trim_start_matches(',').to_string(), v));
                }
                (name, labels)
            }
        };
        let labels: Vec<(&str, &str)> = labels.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let value = if value == "+Inf" { f64::INFINITY } else { value.parse().unwrap() };
        assert!(out.insert(key(name, &labels), value).is_none(), "duplicate series: {line}");
    }
    out
}

/// The same text through Python's prometheus_client, if it is installed,
/// keyed as [`key`] does (label values in JSON quotes: as Rust's `{:?}` for
/// the plain values of these tests).
fn parse_python(text: &str) -> Option<Samples> {
    let script = "import sys, json\n\
                  from prometheus_client.parser import text_string_to_metric_families\n\
                  for f in text_string_to_metric_families(sys.stdin.read()):\n\
                  \x20   for s in f.samples:\n\
                  \x20       l = ','.join('%s=%s' % (k, json.dumps(v)) for k, v in sorted(s.labels.items()))\n\
                  \x20       print('%s{%s}\\t%r' % (s.name, l, float(s.value)))\n";
    let out = match python(script, text) {
        Ok(out) => out,
        Err(err) => {
            assert!(err.contains("No module named"), "prometheus_client failed to parse:\n{err}\n{text}");
            eprintln!("python3-prometheus-client is not installed: the text is checked by our parser only");
            return None;
        }
    };
    let mut samples = Samples::new();
    for line in out.lines() {
        let (k, v) = line.rsplit_once('\t')?;
        samples.insert(k.to_string(), v.parse().unwrap_or_else(|_| panic!("{line}")));
    }
    Some(samples)
}

/// Scrapes `/metrics` (text), checks it and returns its samples.
fn scrape(ngx: &Nginx) -> Samples {
    let r = ngx.get("/metrics", &[]);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.header("Content-Type"), Some("text/plain; version=0.0.4"), "{r:?}");
    promtool_check_metrics(&r.body);
    let ours = parse(&r.body);
    if let Some(python) = parse_python(&r.body) {
        assert_eq!(ours, python, "our parser and prometheus_client differ on:\n{}", r.body);
    }
    ours
}

fn requests(s: &Samples, zone: &str, line: &str, result: &str) -> f64 {
    let k = key("nginx_rl_requests_total", &[("zone", zone), ("line", line), ("result", result)]);
    *s.get(&k).unwrap_or_else(|| panic!("no {k} in {s:#?}"))
}

fn get(s: &Samples, name: &str, labels: &[(&str, &str)]) -> f64 {
    let k = key(name, labels);
    *s.get(&k).unwrap_or_else(|| panic!("no {k} in {s:#?}"))
}

/// Sends `n` requests to `path`, 4 at a time: returns the statuses.
fn spread(ngx: &Nginx, n: usize, path: &str) -> BTreeMap<u16, usize> {
    let mut rs = Vec::new();
    while rs.len() < n {
        rs.extend(ngx.concurrent((n - rs.len()).min(4), path, &[]));
    }
    statuses(&rs)
}

/// Sends requests to `path`, 8 at a time, until every worker has answered
/// some (bounded): returns how many were sent, all answered 200.
fn on_every_worker(ngx: &Nginx, path: &str) -> usize {
    let (mut sent, mut pids) = (0, BTreeSet::new());
    for _ in 0..100 {
        let rs = ngx.concurrent(8, path, &[]);
        sent += rs.len();
        assert_eq!(statuses(&rs), counts(&[(200, rs.len())]));
        pids.extend(rs.iter().filter_map(|r| r.header("X-Pid").map(str::to_string)));
        if pids.len() == WORKERS {
            return sent;
        }
    }
    panic!("only workers {pids:?} answered {sent} requests");
}

fn files(setup: Setup) -> Setup {
    ["a", "b", "d", "u", "p"].iter().fold(setup, |s, d| s.file(&format!("html/{d}/index.html"), "x\n"))
}

const SHM: &str = "add_header X-Pid $pid always;\n\
     location /a/ { rl_limit zone=z rate=5r/h burst=5 algorithm=fixed name=api; }\n\
     location /b/ { rl_limit zone=z rate=5r/h burst=5 algorithm=fixed name=api; }\n\
     location /d/ { rl_limit zone=z rate=2r/h algorithm=fixed name=shadow dry_run; }\n\
     location /u/ { rl_limit zone=z key=$http_x_user rate=1r/m algorithm=gcra; }\n\
     location /p/ { rl_limit zone=z rate=6000r/m burst=6000 algorithm=gcra name=many; }\n\
     location = /metrics { rl_metrics; }";

/// Every verdict of shared-memory lines, exactly, summed over both workers;
/// one line in two locations is one series; an unnamed line is labelled by
/// its identity; JSON has the same numbers; a reload keeps them.
#[test]
fn counts_are_exact_across_workers_json_and_reload() {
    let mut ngx = files(Nginx::setup(&server("rl_zone z size=1m;", SHM))).start();
    // Counted by both workers.
    let many = on_every_worker(&ngx, "/p/");
    // api: 5 admitted, then rejected (in two locations: one line).
    let a = spread(&ngx, 6, "/a/");
    let b = spread(&ngx, 3, "/b/");
    assert_eq!(a.get(&200).copied().unwrap_or(0) + b.get(&200).copied().unwrap_or(0), 5, "{a:?} {b:?}");
    // shadow: 2 admitted, 3 would have been rejected; nothing is rejected.
    let d = spread(&ngx, 5, "/d/");
    assert_eq!(d, counts(&[(200, 5)]));
    // An unnamed line, and an empty key: not evaluated, not counted.
    assert_eq!(ngx.get("/u/", &[("X-User", "x")]).status, 200);
    assert_eq!(ngx.get("/u/", &[("X-User", "x")]).status, 429);
    assert_eq!(ngx.get("/u/", &[]).status, 200);

    let s = scrape(&ngx);
    let expect = |s: &Samples| {
        assert_eq!(requests(s, "z", "api", "passed"), 5.0);
        assert_eq!(requests(s, "z", "api", "rejected"), 4.0);
        assert_eq!(requests(s, "z", "api", "error_denied"), 0.0);
        assert_eq!(requests(s, "z", "shadow", "passed"), 2.0);
        assert_eq!(requests(s, "z", "shadow", "dry_run_rejected"), 3.0);
        assert_eq!(requests(s, "z", "shadow", "rejected"), 0.0);
        let unnamed: Vec<&String> =
            s.keys().filter(|k| k.contains("nginx_rl_requests_total") && k.contains("result=\"passed\"")).collect();
        assert_eq!(unnamed.len(), 4, "one series per line: {unnamed:?}");
        assert_eq!(requests(s, "z", "many", "passed"), many as f64);
        let id = unnamed
            .iter()
            .find_map(|k| {
                k.split("line=\"").nth(1).map(|r| &r[..16]).filter(|l| l.bytes().all(|b| b.is_ascii_hexdigit()))
            })
            .unwrap_or_else(|| panic!("an unnamed line is labelled by its 16-hex identity: {unnamed:?}"));
        assert_eq!(requests(s, "z", id, "passed"), 1.0);
        assert_eq!(requests(s, "z", id, "rejected"), 1.0);
        assert_eq!(get(s, "nginx_rl_limit", &[("zone", "z"), ("line", "api"), ("param", "burst")]), 5.0);
        assert_eq!(get(s, "nginx_rl_limit", &[("zone", "z"), ("line", "shadow"), ("param", "rate")]), 2.0 / 3600.0);
        assert_eq!(get(s, "nginx_rl_zone_keys", &[("zone", "z")]), 4.0);
        assert_eq!(get(s, "nginx_rl_zone_evictions_total", &[("zone", "z"), ("state", "limited")]), 0.0);
    };
    expect(&s);

    // JSON: the same numbers.
    let j = ngx.get("/metrics?format=json", &[]);
    assert_eq!(j.status, 200);
    assert_eq!(j.header("Content-Type"), Some("application/json"));
    assert!(
        j.body.contains(r#"{"zone":"z","line":"api","requests":{"passed":5,"delayed":0,"rejected":4,"#),
        "{}",
        j.body
    );
    assert!(j.body.contains(r#""line":"shadow","requests":{"passed":2,"delayed":0,"rejected":0,"dry_run_delayed":0,"dry_run_rejected":3,"#), "{}", j.body);
    assert!(j.body.contains(r#"{"zone":"z","keys":4,"#), "{}", j.body);

    // A reload keeps every counter; counting goes on.
    ngx.reload();
    expect(&scrape(&ngx));
    assert_eq!(ngx.get("/a/", &[]).status, 429);
    assert_eq!(requests(&scrape(&ngx), "z", "api", "rejected"), 5.0);
}

/// Only GET and HEAD are answered; a scrape is not counted by any line.
#[test]
fn other_methods_get_405() {
    let ngx = files(Nginx::setup(&server("rl_zone z size=1m;", SHM))).start();
    let mut s = TcpStream::connect((Ipv4Addr::LOCALHOST, ngx.port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\nab").unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    assert!(out.starts_with("HTTP/1.1 405"), "{out}");
    let mut s = TcpStream::connect((Ipv4Addr::LOCALHOST, ngx.port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"HEAD /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    assert!(out.starts_with("HTTP/1.1 200") && out.contains("text/plain; version=0.0.4"), "{out}");
    let s = scrape(&ngx);
    assert_eq!(requests(&s, "z", "api", "passed"), 0.0);
}

/// Redis lines: admitted while Redis is up; after it stops, `on_error`
/// decides: `error_allowed` / `error_denied` per line, the errors by kind,
/// `on_error` per zone, and the calls (each request's call counted, failed
/// or not).
#[test]
fn redis_verdicts_and_on_error() {
    let mut redis = Redis::start();
    let url = redis.url();
    let body = "location /ra/ { rl_limit zone=ra rate=100r/m name=ra; }\n\
                location /rd/ { rl_limit zone=rd rate=100r/m name=rd; }\n\
                location = /metrics { rl_metrics; }";
    let zones = format!("rl_zone ra redis={url} on_error=allow;\nrl_zone rd redis={url} on_error=deny;");
    let ngx =
        Nginx::setup(&server(&zones, body)).file("html/ra/index.html", "x\n").file("html/rd/index.html", "x\n").start();
    for path in ["/ra/", "/rd/"] {
        for _ in 0..3 {
            assert_eq!(ngx.get(path, &[]).status, 200);
        }
    }
    redis.stop();
    for _ in 0..4 {
        assert_eq!(ngx.get("/ra/", &[]).status, 200);
        assert_eq!(ngx.get("/rd/", &[]).status, 429);
    }
    let s = scrape(&ngx);
    for (z, v) in [("ra", "error_allowed"), ("rd", "error_denied")] {
        assert_eq!(requests(&s, z, z, "passed"), 3.0, "{z}");
        assert_eq!(requests(&s, z, z, v), 4.0, "{z}");
        assert_eq!(requests(&s, z, z, "rejected"), 0.0, "{z}");
        let errors: f64 = ["timeout", "connection", "script", "refused"]
            .iter()
            .map(|k| get(&s, "nginx_rl_redis_errors_total", &[("zone", z), ("kind", k)]))
            .sum();
        assert_eq!(errors, 4.0, "{z}");
        assert_eq!(get(&s, "nginx_rl_redis_errors_total", &[("zone", z), ("kind", "script")]), 0.0);
        assert!(get(&s, "nginx_rl_redis_calls_total", &[("zone", z)]) >= 3.0);
        assert_eq!(get(&s, "nginx_rl_redis_call_requests_total", &[("zone", z)]), 7.0, "{z}");
        assert_eq!(
            get(&s, "nginx_rl_redis_call_duration_seconds_count", &[("zone", z)]),
            get(&s, "nginx_rl_redis_calls_total", &[("zone", z)])
        );
        assert!(get(&s, "nginx_rl_redis_connects_total", &[("zone", z)]) >= 1.0);
    }
    assert_eq!(get(&s, "nginx_rl_redis_on_error_total", &[("zone", "ra"), ("action", "allowed")]), 4.0);
    assert_eq!(get(&s, "nginx_rl_redis_on_error_total", &[("zone", "rd"), ("action", "denied")]), 4.0);
    assert_eq!(get(&s, "nginx_rl_redis_on_error_total", &[("zone", "rd"), ("action", "allowed")]), 0.0);
    // No lease zone: no lease family.
    assert!(!s.keys().any(|k| k.starts_with("nginx_rl_lease")), "{s:#?}");
}

/// A Redis zone in lease mode: after requests on one key in a few rounds,
/// its syncs are counted (lease calls, their keys and time, none failed),
/// the lease Redis granted and its units, and the one key the zone keeps a
/// lease record for; JSON has the same zone.
#[test]
fn lease_syncs_and_grants() {
    let redis = Redis::start();
    let ngx = Nginx::start(&server(
        &format!("rl_zone l redis={} timeout=1s lease=1m sync=50ms;", redis.url()),
        "location / { rl_limit zone=l key=$http_x_k rate=1000r/d burst=1000 algorithm=fixed; }\n\
         location = /metrics { rl_metrics; }",
    ));
    // 40 requests, 10 at a time every 50 ms (a sync interval): the key gets a lease.
    for _ in 0..4 {
        let rs = ngx.concurrent(10, "/index.html", &[("X-K", "k1")]);
        assert_eq!(statuses(&rs), counts(&[(200, 10)]));
        thread::sleep(Duration::from_millis(50));
    }
    // A few more syncs.
    thread::sleep(Duration::from_millis(300));
    let s = scrape(&ngx);
    let z = [("zone", "l")];
    let syncs = get(&s, "nginx_rl_lease_syncs_total", &z);
    assert!(syncs > 0.0, "{s:#?}");
    assert_eq!(get(&s, "nginx_rl_lease_sync_failures_total", &z), 0.0);
    assert_eq!(get(&s, "nginx_rl_lease_sync_duration_seconds_count", &z), syncs);
    assert!(get(&s, "nginx_rl_lease_sync_duration_seconds_sum", &z) > 0.0);
    assert!(get(&s, "nginx_rl_lease_keys_synced_total", &z) >= syncs);
    assert!(get(&s, "nginx_rl_leases_granted_total", &z) >= 1.0);
    assert!(get(&s, "nginx_rl_lease_units_granted_total", &z) >= 1.0);
    // (there: what ended leases gave back, none maybe in so short a time)
    get(&s, "nginx_rl_lease_units_returned_total", &z);
    assert_eq!(get(&s, "nginx_rl_lease_keys", &z), 1.0);
    assert_eq!(get(&s, "nginx_rl_lease_nodes", &z), 1.0, "its own heartbeat, alone on this Redis");
    assert!(get(&s, "nginx_rl_lease_capacity_keys", &z) >= 1.0);
    // The Redis zone's own series are there too (the requests no lease held).
    assert!(get(&s, "nginx_rl_redis_calls_total", &z) >= 1.0);

    let j = ngx.get("/metrics?format=json", &[]);
    assert_eq!(j.status, 200);
    assert!(j.body.contains(r#"],"leases":[{"zone":"l","syncs":"#), "{}", j.body);
    assert!(j.body.contains(r#","keys":1,"capacity_keys":"#), "{}", j.body);
    let log = ngx.error_log();
    assert!(crash_lines(&log).is_empty() && failed_lines(&log, "l").is_empty(), "{log}");
}

/// A zone filled past its capacity with keys that are all still limiting:
/// every key beyond capacity evicts one (counted as `limited`, none as
/// `idle`), and the zone says so once (at most every 10 s), at `warn`, with
/// both counts.
#[test]
fn evictions_of_limiting_states_are_counted_and_logged() {
    let body = "location /u/ { rl_limit zone=tiny key=$http_x_user rate=1r/m algorithm=gcra name=u; }\n\
                location = /metrics { rl_metrics; }";
    let ngx = files(Nginx::setup(&server("rl_zone tiny size=32k;", body))).start();
    let cap = get(&scrape(&ngx), "nginx_rl_zone_capacity_keys", &[("zone", "tiny")]) as usize;
    assert!((100..2000).contains(&cap), "capacity {cap}");
    let extra = 30;
    for i in 0..cap + extra {
        let user = format!("user-{i}");
        assert_eq!(ngx.get("/u/", &[("X-User", &user)]).status, 200, "key {i}");
    }
    let s = scrape(&ngx);
    assert_eq!(get(&s, "nginx_rl_zone_keys", &[("zone", "tiny")]), cap as f64);
    assert_eq!(get(&s, "nginx_rl_zone_evictions_total", &[("zone", "tiny"), ("state", "limited")]), extra as f64);
    assert_eq!(get(&s, "nginx_rl_zone_evictions_total", &[("zone", "tiny"), ("state", "idle")]), 0.0);
    assert_eq!(requests(&s, "tiny", "u", "passed"), (cap + extra) as f64);
    let used = get(&s, "nginx_rl_zone_bytes_used", &[("zone", "tiny")]);
    assert!(used > 0.0 && used <= 32768.0, "{used}");
    let log = ngx.error_log();
    let full: Vec<&str> = log.lines().filter(|l| l.contains("rl_zone \"tiny\" is full")).collect();
    assert_eq!(full.len(), 1, "one message in 10 s: {full:?}");
    assert!(full[0].contains("[warn]") && full[0].contains("(1 evicted so far, 1 still limiting)"), "{full:?}");
}
