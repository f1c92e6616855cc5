//! Lease mode keeps what a line's parameters mean (issue #38): `cost=`,
//! `charge=after`, `dry_run`, several lines all or nothing, and the
//! algorithms `sliding`, `token_bucket` and `leaky_bucket` (`fixed` and
//! `gcra` are in `tests/lease.rs`). Real nginx (2 workers each) on one real
//! `redis-server`, real requests; what a user sees: statuses, the
//! `X-RateLimit-Remaining` header, `rl_quota`, `rl_metrics` and the access
//! log's `$rl_status`. Each time, what the fleet admits is never more than
//! the exact line would have admitted.

mod common;

use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::lease::*;
use common::redis::*;
use common::*;

fn admitted_of(got: &[(u16, Option<u64>)]) -> usize {
    got.iter().filter(|(s, _)| *s == 200).count()
}

/// `nginx_rl_requests_total` of zone `zone` and verdict `result` on nginx
/// on `port` (summed over the zone's lines).
fn verdicts(port: u16, zone: &str, result: &str) -> u64 {
    requests_total(&get(port, "/metrics", &[]).body, zone, None, result)
}

/// The `remaining` of the first line of an `rl_quota` answer.
fn quota_remaining(port: u16, path: &str, key: &str) -> Option<u64> {
    let r = get(port, path, &[("X-K", key)]);
    r.body
        .split("\"remaining\":")
        .nth(1)
        .and_then(|t| t.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
}

/// Waits (5 s at most) until the `rl_quota` location `path` reads at most
/// `left` for `key`: `charge=after` charges go to Redis after the response.
fn settle(port: u16, path: &str, key: &str, left: u64) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let now = quota_remaining(port, path, key);
        if now.is_some_and(|n| n <= left) {
            return;
        }
        assert!(Instant::now() < deadline, "{path}: {now:?} remaining, waiting for {left}");
        thread::sleep(Duration::from_millis(10));
    }
}

/// No crashed worker, no failed Redis call of zone `zone`.
fn clean(nginx: &[&Nginx], zone: &str) {
    for n in nginx {
        let log = n.error_log();
        assert!(crash_lines(&log).is_empty(), "{:?}", crash_lines(&log));
        assert!(failed_lines(&log, zone).is_empty(), "{:?}", failed_lines(&log, zone));
    }
}

/// A zone `name` in lease mode on Redis `url` (`sync=50ms`: a lease lives
/// 50 ms and `timeout`), whose failed calls refuse their requests
/// (`on_error=deny`): every request admitted was admitted by a lease or by
/// Redis, never let through by a Redis that did not answer in time (the
/// default `on_error=allow` would, on a loaded machine: that is no lease's
/// doing).
fn lease_zone(name: &str, url: &str, timeout: &str) -> String {
    format!("rl_zone {name} redis={url} prefix={name}: timeout={timeout} on_error=deny lease=1m sync=50ms;")
}

/// `n` nginx whose zone `l` is [`lease_zone`] with `timeout=1s`, with
/// `more_zones` and `body` in their server.
fn leased(url: &str, n: usize, more_zones: &str, body: &str) -> Vec<Nginx> {
    let conf = server(
        &format!("{}\n{more_zones}", lease_zone("l", url, "1s")),
        &format!("{body}\nlocation = /metrics {{ rl_metrics; }}"),
    );
    (0..n).map(|_| Nginx::start(&conf)).collect()
}

fn ports_of(nginx: &[Nginx]) -> Vec<u16> {
    nginx.iter().map(|n| n.port).collect()
}

/// `cost=3` on a line of 30 a minute: a lease is spent three units a
/// request. On one nginx, one request after another, `X-RateLimit-Remaining`
/// counts down by 3 and exactly 10 are admitted at once: a request the
/// leases hold part of is paid by them and by Redis together (the units
/// split between a lease and Redis, it was refused while the line had its
/// 3 left, with `X-RateLimit-Remaining: 3`); every refusal shows fewer than
/// 3 left, and `rl_quota` reads 0. Two nginx, 80 requests on another key
/// within the window: at most the 10 the exact line admits (30 / 3), and
/// most of them.
#[test]
fn lease_cost_is_charged() {
    let redis = Redis::start();
    let line = "rl_limit zone=l key=$http_x_k rate=30r/m burst=30 algorithm=fixed";
    let body = format!("location / {{ {line} cost=3; }}\nlocation = /q {{ rl_quota; {line}; }}");
    let nginx = leased(&redis.url(), 2, "", &body);
    let ports = ports_of(&nginx);
    clear_of_window_end(60, 10);
    // One nginx, one request after another: the line's view, 3 units a request.
    let one = sequential(ports[0], 14, "/index.html", "solo");
    eprintln!("cost=3, one nginx: {one:?}");
    let first = admitted_of(&one);
    assert_eq!(first, 10, "30 units at 3 a request, all admitted at once: {one:?}");
    assert!(one[..first].iter().all(|(s, _)| *s == 200) && one[first..].iter().all(|(s, _)| *s == 429), "{one:?}");
    let left: Vec<u64> = one[..first].iter().filter_map(|(_, r)| *r).collect();
    let want: Vec<u64> = (0..first as u64).map(|i| 27 - 3 * i).collect();
    assert_eq!(left, want, "each request spends 3 units of the line: {one:?}");
    assert!(one[first..].iter().all(|(_, r)| r.is_some_and(|r| r < 3)), "refused with 3 units left: {one:?}");
    assert_eq!(quota_remaining(ports[0], "/q", "solo"), Some(0), "all 30 units spent");
    // Two nginx, 80 requests open loop (20 rounds of 2 on each, every 20 ms).
    let got = load(&ports, "/index.html", 20, 2, Duration::from_millis(20), "fleet");
    let admitted = got.iter().filter(|&&s| s == 200).count();
    let granted: u64 = ports.iter().map(|&p| metric(p, "nginx_rl_lease_units_granted_total", "l")).sum();
    eprintln!("cost=3, 2 nginx: {:?}, {granted} units granted in all", statuses_of(&got));
    assert_eq!(admitted + got.iter().filter(|&&s| s == 429).count(), got.len(), "{:?}", statuses_of(&got));
    assert!(admitted <= 10, "{admitted} admitted at cost 3 of a line of 30: above the exact line's 10");
    // (units a lease holds too few of for a request of 3 are lost to the window until the
    // lease ends: a request or two; a cost charged twice would admit 5)
    assert!(admitted >= 6, "{admitted} admitted at cost 3 of a line of 30: the lease spends more than 3 a request");
    clean(&nginx.iter().collect::<Vec<_>>(), "l");
}

/// `charge=after` in lease mode: Redis charges each response's cost after
/// it (`cost=$http_x_cost`, 10 units a request), as in exact mode; the line
/// admits while the key has a unit left. A line of 100 a day: the 10th
/// request takes it to 0, the 11th is refused, whichever nginx the requests
/// reach; a request of cost 0 charges nothing.
#[test]
fn lease_charge_after_charges_the_response_cost() {
    let redis = Redis::start();
    let line = "rl_limit zone=l key=$http_x_k rate=100r/d burst=100 algorithm=fixed";
    let body = format!(
        "location / {{ {line} cost=$http_x_cost charge=after; }}\n\
         location = /q {{ rl_quota; {line}; }}"
    );
    let nginx = leased(&redis.url(), 2, "", &body);
    // (the lines are of a day: their requests all in one window)
    clear_of_window_end(86_400, 10);
    let ports = ports_of(&nginx);
    let send = |port: u16, cost: &str| get(port, "/index.html", &[("X-K", "k"), ("X-Cost", cost)]);
    // Costs of 0 first: admitted, nothing charged.
    for i in 0..6 {
        let r = send(ports[i % 2], "0");
        assert_eq!(r.status, 200, "{r:?}");
    }
    thread::sleep(Duration::from_millis(200));
    assert_eq!(quota_remaining(ports[0], "/q", "k"), Some(100), "costs of 0 charge nothing");
    // Then 10 units a request, in turn on the two nginx, each waited for.
    let mut statuses = Vec::new();
    for i in 0..14 {
        let port = ports[i % 2];
        let r = send(port, "10");
        statuses.push(r.status);
        if r.status == 200 {
            settle(port, "/q", "k", 100u64.saturating_sub(10 * (i as u64 + 1)));
        }
    }
    let want: Vec<u16> = [[200; 10].as_slice(), &[429; 4]].concat();
    assert_eq!(statuses, want, "10 responses of 10 units spend the line of 100");
    for &p in &ports {
        assert_eq!(quota_remaining(p, "/q", "k"), Some(0), "charged: nothing left");
        assert_eq!(metric(p, "nginx_rl_charge_failures_total", "l"), 0);
    }
    // Once charged, the spent key is refused on every nginx.
    let more: Vec<u16> = ports.iter().map(|&p| send(p, "10").status).collect();
    assert_eq!(more, [429, 429], "the spent key is refused");
    clean(&nginx.iter().collect::<Vec<_>>(), "l");
}

/// A `dry_run` line in lease mode is spent and charged as an enforced one
/// is, and never refuses: two nginx, 40 requests on a line of 10 a day,
/// all 200; the access log's `$rl_status` says `PASSED` for at most the
/// 10 the line admits (nearly all of them), `REJECTED_DRY_RUN` for the
/// rest, and `rl_metrics` counts the same (`passed`, `dry_run_rejected`).
#[test]
fn lease_dry_run_never_refuses_and_reports() {
    let redis = Redis::start();
    let body = "location / { rl_limit zone=l key=$http_x_k rate=10r/d burst=10 algorithm=fixed dry_run; \
                access_log {ROOT}/../rl.log rl; }";
    let nginx = leased(&redis.url(), 2, "log_format rl '$status $rl_status';", body);
    // (the lines are of a day: their requests all in one window)
    clear_of_window_end(86_400, 10);
    let ports = ports_of(&nginx);
    let got = load(&ports, "/index.html", 10, 2, Duration::from_millis(30), "k");
    assert_eq!(statuses_of(&got), [(200, 40)].into_iter().collect(), "a dry-run line never refuses");
    let logged: Vec<String> = nginx
        .iter()
        .flat_map(|n| {
            std::fs::read_to_string(n.prefix.join("rl.log"))
                .unwrap_or_default()
                .lines()
                .map(String::from)
                .collect::<Vec<_>>()
        })
        .collect();
    let count = |s: &str| logged.iter().filter(|l| *l == s).count();
    let (passed, dry) = (count("200 PASSED"), count("200 REJECTED_DRY_RUN"));
    eprintln!("dry run: {passed} PASSED, {dry} REJECTED_DRY_RUN");
    assert_eq!(passed + dry, 40, "every request logged PASSED or REJECTED_DRY_RUN: {logged:?}");
    assert!(passed <= 10, "{passed} PASSED by a line of 10");
    assert!(passed >= 8, "{passed} PASSED by a line of 10: the dry-run line spent more than its requests");
    let metric_passed: u64 = ports.iter().map(|&p| verdicts(p, "l", "passed")).sum();
    let metric_dry: u64 = ports.iter().map(|&p| verdicts(p, "l", "dry_run_rejected")).sum();
    assert_eq!((metric_passed, metric_dry), (passed as u64, dry as u64), "the metrics count what the log says");
    let said: usize = nginx.iter().map(|n| n.error_log().matches("limiting requests, dry run, excess:").count()).sum();
    assert_eq!(said, dry, "each dry-run rejection logged as limit_req logs one");
    // It was charged as an enforced line is: the key is spent in Redis too,
    // once the leases ended (a lease lives the sync and the timeout).
    thread::sleep(Duration::from_millis(1500));
    let after = get(ports[0], "/index.html", &[("X-K", "k")]);
    assert_eq!(after.status, 200);
    let last = std::fs::read_to_string(nginx[0].prefix.join("rl.log")).unwrap_or_default();
    assert_eq!(last.lines().last(), Some("200 REJECTED_DRY_RUN"), "the spent key, once leases are given back");
    clean(&nginx.iter().collect::<Vec<_>>(), "l");
}

/// A request of an open-loop load: when it was sent and its answer came (µs of the wall clock, which Redis'
/// windows follow: Redis runs on this host), whether it was admitted.
#[derive(Clone, Copy)]
struct Sent {
    sent_us: u64,
    got_us: u64,
    admitted: bool,
}

/// Sends `total` requests for `path` of key `key` over `secs` seconds,
/// evenly spaced, to the nginx of `ports` in turn (open loop, a pool of
/// client threads); each answered 200 or 429. Sorted by sending.
fn open_loop(ports: &[u16], path: &'static str, total: usize, secs: f64, key: &str) -> Vec<Sent> {
    let plan: Vec<(Duration, u16)> =
        (0..total).map(|n| (Duration::from_secs_f64(secs * n as f64 / total as f64), ports[n % ports.len()])).collect();
    let plan = Arc::new(Mutex::new(plan.into_iter().rev().collect::<Vec<_>>()));
    let sent = Arc::new(Mutex::new(Vec::with_capacity(total)));
    let start = Instant::now();
    let threads: Vec<_> = (0..16)
        .map(|_| {
            let (plan, sent, key) = (plan.clone(), sent.clone(), key.to_string());
            thread::spawn(move || loop {
                let Some((at, port)) = plan.lock().unwrap().pop() else { return };
                if let Some(wait) = (start + at).checked_duration_since(Instant::now()) {
                    thread::sleep(wait);
                }
                let sent_us = wall_us();
                let r = get(port, path, &[("X-K", &key)]);
                let got_us = wall_us();
                assert!(r.status == 200 || r.status == 429, "status {}", r.status);
                sent.lock().unwrap().push(Sent { sent_us, got_us, admitted: r.status == 200 });
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let mut sent = sent.lock().unwrap().clone();
    sent.sort_by_key(|s| s.sent_us);
    sent
}

fn limit_of(alg: &str, count: u64, period_us: u64, burst: u64) -> rl_core::limit::Limit {
    let algorithm: rl_core::limit::Algorithm = alg.parse().expect("an algorithm");
    let rate = rl_core::parse::Rate { count, period_us };
    rl_core::limit::Limit::new(algorithm, rate, burst).expect("a line")
}

/// Two nginx in lease mode on one key, for `alg`:
/// - a line that does not refill during the test (600 a day, as
///   `tests/lease.rs` `fleet_one_key`): 1,200 requests over 1.5 s; the
///   fleet admits at most what the exact line admits of them, and at least
///   95% of it;
/// - a line that does (20 a second, a burst of 40; zone `f`, whose leases
///   live 300 ms: the buckets' leases hold back the 6 units the rate
///   refills in that time): 240 requests over 3 s,
///   four times its rate; no span of time admits more than the line's
///   burst and what its rate refills over it, and in all no more than the
///   exact line admits of the same requests (give or take a unit per nginx
///   for when, between sending and answer, each was decided), and at least
///   80% of it.
fn algorithm_bound(alg: &str) {
    let redis = Redis::start();
    let body = format!(
        "location = /index.html {{ rl_limit zone=l key=$http_x_k rate=600r/d burst=600 algorithm={alg}; }}\n\
         location = /a.html {{ rl_limit zone=f key=$http_x_k rate=20r/s burst=40 algorithm={alg}; }}"
    );
    let nginx = leased(&redis.url(), 2, &lease_zone("f", &redis.url(), "250ms"), &body);
    let ports = ports_of(&nginx);
    clear_of_window_end(86_400, 10);
    // A line of a day.
    let got = load(&ports, "/index.html", 30, 20, Duration::from_millis(50), "day");
    let admitted = got.iter().filter(|&&s| s == 200).count();
    assert_eq!(admitted + got.iter().filter(|&&s| s == 429).count(), got.len(), "{:?}", statuses_of(&got));
    // (1,200 requests within seconds: the exact line admits its 600, the rate refilling none)
    let day = limit_of(alg, 600, 86_400_000_000, 600);
    let now = wall_us();
    let exact = exact_admits(&day, &vec![now; got.len()]);
    eprintln!("algorithm={alg}, 600r/d: {admitted} admitted of {} sent; the exact line admits {exact}", got.len());
    assert!(admitted <= exact, "algorithm={alg}: {admitted} admitted, above the exact line's {exact}");
    clean(&nginx.iter().collect::<Vec<_>>(), "l");
    assert!(admitted * 100 >= exact * 95, "algorithm={alg}: {admitted} admitted, less than 95% of {exact}");
    // A line that refills.
    let (per_s, burst) = (20u64, 40u64);
    let sent = open_loop(&ports, "/a.html", 240, 3.0, "second");
    let times: Vec<u64> = sent.iter().map(|s| s.sent_us).collect();
    let line = limit_of(alg, per_s, 1_000_000, burst);
    let exact = exact_admits(&line, &times);
    let yes: Vec<(u64, u64)> = sent.iter().filter(|s| s.admitted).map(|s| (s.sent_us, s.got_us)).collect();
    eprintln!("algorithm={alg}, 20r/s burst=40: {} admitted of 240; the exact line admits {exact}", yes.len());
    if let Some((n, span, most)) = beyond_envelope(&yes, burst, per_s) {
        panic!("algorithm={alg}: {n} admitted in {span} us, where the line admits {most}");
    }
    assert!(
        yes.len() <= exact + ports.len(),
        "algorithm={alg}: {} admitted, above the {exact} the exact line admits of the same requests",
        yes.len()
    );
    clean(&nginx.iter().collect::<Vec<_>>(), "f");
    assert!(yes.len() * 100 >= exact * 80, "algorithm={alg}: {} admitted, less than 80% of {exact}", yes.len());
    for &p in &ports {
        for zone in ["l", "f"] {
            assert!(metric(p, "nginx_rl_leases_granted_total", zone) >= 1, "nginx on {p} leased nothing of {zone}");
        }
    }
}

#[test]
fn lease_algorithms_bound_sliding() {
    algorithm_bound("sliding");
}

#[test]
fn lease_algorithms_bound_token_bucket() {
    algorithm_bound("token_bucket");
}

#[test]
fn lease_algorithms_bound_leaky_bucket() {
    algorithm_bound("leaky_bucket");
}

/// Several lines decide a request all or nothing, whichever of them is in
/// lease mode: a request a shared-memory line refuses is not spent from
/// the lease line's leases, and one the lease line refuses is not charged
/// to the shared-memory line. (`tests/lease.rs`
/// `refused_by_another_line_keeps_the_lease` has the lease line with an
/// exact Redis line that refuses.) Both orders of the lines.
#[test]
fn lease_all_or_nothing_with_a_shm_line() {
    let redis = Redis::start();
    let lease_line = "rl_limit zone=l key=$http_x_k rate=100r/d burst=100 algorithm=fixed name=u;";
    let shm_small = "rl_limit zone=s key=$http_x_k rate=5r/d burst=5 algorithm=fixed name=small;";
    let lease_small = "rl_limit zone=l key=$http_x_k rate=5r/d burst=5 algorithm=fixed name=lsmall;";
    let shm_big = "rl_limit zone=s key=$http_x_k rate=100r/d burst=100 algorithm=fixed name=big;";
    let body = format!(
        "location = /lease.html {{ {lease_line} alias html/index.html; }}\n\
         location = /lease-first.html {{ {lease_line} {shm_small} alias html/index.html; }}\n\
         location = /shm-first.html {{ {shm_small} {lease_line} alias html/index.html; }}\n\
         location = /shm.html {{ {shm_big} alias html/index.html; }}\n\
         location = /refused-by-lease.html {{ {shm_big} {lease_small} alias html/index.html; }}"
    );
    let nginx = leased(&redis.url(), 1, "rl_zone s size=1m;", &body);
    // (the lines are of a day: their requests all in one window)
    clear_of_window_end(86_400, 10);
    let port = nginx[0].port;
    // The lease line's key in steady demand (40 at 10 an interval): it holds a lease.
    let a = load(&[port], "/lease.html", 4, 10, Duration::from_millis(50), "k");
    assert_eq!(statuses_of(&a), [(200, 40)].into_iter().collect());
    // 20 with the shared-memory line of 5 after the lease line, 20 with it before
    // (another key of the small line, the same key of the lease line).
    let b = load(&[port], "/lease-first.html", 4, 5, Duration::from_millis(50), "k");
    assert_eq!(statuses_of(&b), [(200, 5), (429, 15)].into_iter().collect(), "lease line first");
    // (the small line's key "k" is spent: the next 20 are all refused by it)
    let c = load(&[port], "/shm-first.html", 4, 5, Duration::from_millis(50), "k");
    assert_eq!(statuses_of(&c), [(429, 20)].into_iter().collect(), "shared-memory line first");
    // Every lease ended and given back (a lease lives the sync and the timeout).
    thread::sleep(Duration::from_millis(1500));
    let rest = sequential(port, 60, "/lease.html", "k");
    assert_eq!(admitted_of(&rest), 55, "100 less 40 less 5: the 35 refused spent no lease; {rest:?}");
    // The lease line refuses: the shared-memory line is not charged.
    let d = load(&[port], "/refused-by-lease.html", 4, 5, Duration::from_millis(50), "j");
    assert_eq!(statuses_of(&d), [(200, 5), (429, 15)].into_iter().collect(), "the lease line of 5 refuses");
    let shm = sequential(port, 100, "/shm.html", "j");
    assert_eq!(admitted_of(&shm), 95, "100 less the 5 admitted: the 15 the lease line refused charged nothing");
    clean(&nginx.iter().collect::<Vec<_>>(), "l");
}

/// Plans from variables in lease mode: each key is leased under its own
/// plan's rate and burst (`map` on the key). Two nginx, `fixed` plans of
/// 60 and 12 a minute: `X-RateLimit-Limit` is each key's own; under load
/// from both nginx a key admits no more than its plan, and, once the
/// leases it held have ended and gone back, exactly its plan over the
/// window; leases were granted. A `gcra` plan whose burst (2) is below
/// what the rate refills in a lease's life (3 at 2r/s) cannot be leased:
/// Redis decides its key exactly (2 admitted at once, then refused), no
/// lease is granted for it, and it keeps no lease record.
#[test]
fn lease_plans_from_variables() {
    let redis = Redis::start();
    let conf = server(
        &format!(
            "{}\nmap $http_x_k $plan_rate {{ ~^gold 60r/m; default 12r/m; }}\n\
             map $http_x_k $plan_burst {{ ~^tiny 2; default 20; }}",
            lease_zone("l", &redis.url(), "1s")
        ),
        "location / { rl_limit zone=l key=$http_x_k rate=$plan_rate algorithm=fixed; }\n\
         location /g/ { rl_limit zone=l key=$http_x_k rate=2r/s burst=$plan_burst algorithm=gcra; }\n\
         location = /metrics { rl_metrics; }",
    );
    let nginx: Vec<Nginx> = (0..2).map(|_| Nginx::setup(&conf).file("html/g/index.html", "g\n").start()).collect();
    let ports = ports_of(&nginx);
    let granted = || -> u64 { ports.iter().map(|&p| metric(p, "nginx_rl_lease_units_granted_total", "l")).sum() };
    // The plan that cannot be leased: exact, on either nginx.
    let tiny: Vec<u16> = (0..6).map(|i| get(ports[i % 2], "/g/index.html", &[("X-K", "tiny")]).status).collect();
    assert_eq!(tiny, [200, 200, 429, 429, 429, 429], "gcra 2r/s burst=2, decided by Redis");
    thread::sleep(Duration::from_millis(200));
    assert_eq!(granted(), 0, "a key whose plan cannot be leased is granted no lease");
    let keys: Vec<u64> = ports.iter().map(|&p| metric(p, "nginx_rl_lease_keys", "l")).collect();
    assert_eq!(keys, [0, 0], "nor keeps a lease record");
    // The fixed plans, within one window.
    clear_of_window_end(60, 20);
    for (key, plan) in [("gold-1", 60u64), ("free-1", 12)] {
        let r = get(ports[0], "/index.html", &[("X-K", key)]);
        assert_eq!((r.status, r.header("X-RateLimit-Limit")), (200, Some(plan.to_string().as_str())), "{key}");
        let got = load(&ports, "/index.html", 40, 2, Duration::from_millis(15), key);
        let admitted = 1 + got.iter().filter(|&&s| s == 200).count() as u64;
        eprintln!("{key}: {:?} under load", statuses_of(&got));
        assert!(admitted <= plan, "{key}: {admitted} admitted, above its plan of {plan}");
        // (leases held unspent end within about a second, and go back at the next sync)
        thread::sleep(Duration::from_millis(1500));
        let later = sequential(ports[1], plan as usize + 2, "/index.html", key);
        let total = admitted + admitted_of(&later) as u64;
        assert_eq!(total, plan, "{key}: {admitted} under load, then {later:?}: the window's whole plan");
    }
    assert!(granted() > 0, "the plans' keys were leased");
    clean(&nginx.iter().collect::<Vec<_>>(), "l");
}
