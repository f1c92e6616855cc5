//! End-to-end tests of Redis zones behind Redis Sentinel
//! (`rl_zone NAME redis=redis+sentinel://HOST:PORT/MASTER ...`): a real
//! `redis-server` master (and replica), a real sentinel (`redis-server
//! --sentinel`), real nginx instances with the module, real HTTP requests.
//!
//! Every zone has `timeout=1s` (a loaded machine must not turn a slow reply
//! into an `on_error` decision). The failover tests use `on_error=deny`, so a
//! Redis failure can never admit a request and the number admitted stays
//! exact whatever happens during the switch.

mod common;

use std::thread;
use std::time::{Duration, Instant};

use common::redis::*;
use common::*;

// ---------------------------------------------------------------------------
// 1. Exact admission through a sentinel.
// ---------------------------------------------------------------------------

/// 300 simultaneous requests per location, burst=50 at 50r/h (nothing
/// refills during the test): exactly 50 pass, 250 are limited, for two
/// algorithms, each zone keeping one state key on the master.
#[test]
fn sentinel_exact_counts() {
    let master = Redis::start();
    let sentinel = Sentinel::start(master.port);
    let url = sentinel.url();
    let algs = ["gcra", "sliding_log"];
    let zones: String = algs.iter().map(|a| format!("rl_zone s_{a} redis={url} timeout=1s prefix={a}:;\n")).collect();
    let locations: String = algs
        .iter()
        .map(|a| {
            format!("location /{a}/ {{ alias {{ROOT}}/; rl_limit zone=s_{a} rate=50r/h burst=50 algorithm={a}; }}\n")
        })
        .collect();
    let ngx = Nginx::start(&server(&zones, &(locations + "location = /metrics { rl_metrics; }\n")));
    for alg in algs {
        let rs = ngx.concurrent(300, &format!("/{alg}/index.html"), &[]);
        let log = ngx.error_log();
        let zone = format!("s_{alg}");
        assert_eq!(
            statuses(&rs),
            counts(&[(200, 50), (429, 250)]),
            "algorithm={alg}; Redis failures logged: {:?}",
            failed_lines(&log, &zone).iter().take(5).collect::<Vec<_>>()
        );
        for r in rs.iter().filter(|r| r.status == 200) {
            assert_eq!(r.body, "index\n", "algorithm={alg}");
        }
        assert!(failed_lines(&log, &zone).is_empty(), "algorithm={alg}: {:?}", failed_lines(&log, &zone));
        let keys = master.keys(&format!("{alg}:*"));
        assert_eq!(keys.len(), 1, "algorithm={alg}: one state key on the master expected, got {keys:?}");
    }
    let log = ngx.error_log();
    assert!(crash_lines(&log).is_empty(), "{:?}", crash_lines(&log));
    // The master the sentinel named, as rl_metrics shows it.
    let text = ngx.get("/metrics", &[]).body;
    for alg in algs {
        let series = format!("nginx_rl_redis_master{{zone=\"s_{alg}\",addr=\"127.0.0.1:{}\"}} ", master.port);
        assert!(text.lines().any(|l| l.starts_with(&series) && l != format!("{series}0")), "no {series}in:\n{text}");
    }

    // Each zone of each worker checks the master every 500 ms, on the
    // sentinel connection it keeps (opened at its first check, within 1 s of
    // the zone's first request): 2 s of checks (16 here) open no new
    // connection (the only one counted is the second INFO's own).
    let accepted = || {
        let stats = sentinel.cli(&["INFO", "stats"]);
        let line = stats.lines().find_map(|l| l.strip_prefix("total_connections_received:"));
        line.and_then(|n| n.trim().parse::<u64>().ok()).expect("total_connections_received")
    };
    thread::sleep(Duration::from_secs(1));
    let before = accepted();
    thread::sleep(Duration::from_secs(2));
    assert_eq!(accepted() - before, 1, "connections the sentinel accepted in 2 s");
}

/// `rediss+sentinel://`: the sentinel and the master both over TLS, with a
/// private CA and a client certificate (the sentinel gives the master's TLS
/// port: it monitors it over TLS). The zone asks the sentinel on its TLS
/// port only, so the exact counts show both connections worked.
#[test]
fn sentinel_over_tls() {
    let certs = TestCerts::make();
    let (master, master_tls) = Redis::with_tls(&certs);
    let sentinel = Sentinel::start_tls(master_tls, &certs);
    let tls = certs.zone_params();
    let conf = server(
        &format!("rl_zone s redis={} timeout=1s on_error=deny {tls};", sentinel.tls_url()),
        "location = /index.html { rl_limit zone=s rate=20r/h burst=20; }",
    );
    let ngx = Nginx::start(&conf);
    let rs = ngx.concurrent(60, "/index.html", &[]);
    let log = ngx.error_log();
    assert_eq!(statuses(&rs), counts(&[(200, 20), (429, 40)]), "failures: {:?}", failed_lines(&log, "s"));
    assert_eq!(master.keys("rl:*").len(), 1, "the state is on the master");
    assert!(crash_lines(&log).is_empty(), "{:?}", crash_lines(&log));
    assert!(failed_lines(&log, "s").is_empty(), "{:?}", failed_lines(&log, "s"));
}

// ---------------------------------------------------------------------------
// 2. Failover: the state follows the master.
// ---------------------------------------------------------------------------

/// Total `FCALL` + `EVALSHA` + `EVAL` calls on a server (the module's script calls;
/// replicated script effects do not count as such on a replica).
fn script_calls(r: &Redis) -> u64 {
    r.calls("fcall") + r.calls("evalsha") + r.calls("eval")
}

/// One request after the switch: when (since the switch), its status, and
/// which server ran its script ("old", "new", "none", "both").
struct Sample {
    at: Duration,
    status: u16,
    by: &'static str,
}

/// Master + replica + one sentinel (quorum 1), nginx on the sentinel with a
/// burst=50 slow-rate line. Returns (master, replica, sentinel, nginx) once
/// 20 requests were admitted and the replica acknowledged them (`WAIT`).
fn failover_setup() -> (Redis, Redis, Sentinel, Nginx) {
    let master = Redis::start();
    let replica = Redis::replica_of(&master);
    let sentinel = Sentinel::start(master.port);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !sentinel.knows_replica(replica.port) {
        assert!(Instant::now() < deadline, "the sentinel never listed replica {}:\n{}", replica.port, sentinel.log());
        thread::sleep(Duration::from_millis(50));
    }
    let ngx = Nginx::start(&server(
        &format!("rl_zone s redis={} timeout=1s on_error=deny;", sentinel.url()),
        "location / { rl_limit zone=s rate=50r/h burst=50 algorithm=gcra; }",
    ));
    for i in 0..20 {
        let r = ngx.get("/index.html", &[]);
        assert_eq!(r.status, 200, "request {i} before the failover; error log:\n{}", ngx.error_log());
    }
    // Why "exactly 50" is safe across the failover: WAIT returns only when
    // the replica has acknowledged the replication offset that includes all
    // 20 committed states, so the promoted replica starts from 20 admitted
    // (no write can be lost in the switch). Failures deny (on_error=deny),
    // and 50r/h refills one request every 72 s, longer than the test.
    assert_eq!(master.cli(&["WAIT", "1", "2000"]), "1", "the replica did not acknowledge the writes");
    assert_eq!(replica.keys("rl:*").len(), 1, "the state key did not reach the replica");
    (master, replica, sentinel, ngx)
}

/// Sends one request every 100 ms for `span`, attributing each to the
/// server whose script-call counter moved (`old` is `None` once it is dead).
fn sample(ngx: &Nginx, old: Option<&Redis>, new: &Redis, t0: Instant, span: Duration, out: &mut Vec<Sample>) {
    let old_calls = || old.map_or(0, script_calls);
    let end = Instant::now() + span;
    while Instant::now() < end {
        let (o, n) = (old_calls(), script_calls(new));
        let at = t0.elapsed();
        let status = ngx.get("/index.html", &[]).status;
        let by = match (old_calls() > o, script_calls(new) > n) {
            (true, false) => "old",
            (false, true) => "new",
            (false, false) => "none",
            (true, true) => "both",
        };
        out.push(Sample { at, status, by });
        thread::sleep(Duration::from_millis(100));
    }
}

/// [`sample`] for `span`, then on until the new master rejects a request
/// (its budget is spent), 30 s at most: a sample takes a few redis-cli runs,
/// which a loaded machine makes slow, and a count of admissions must not
/// depend on how many samples fit in a fixed time. A 429 that no server
/// decided (a request denied while nginx still reconnected) does not end it.
fn sample_until_limited(
    ngx: &Nginx,
    old: Option<&Redis>,
    new: &Redis,
    t0: Instant,
    span: Duration,
    out: &mut Vec<Sample>,
) {
    sample(ngx, old, new, t0, span, out);
    let cap = Instant::now() + Duration::from_secs(30);
    while !out.iter().any(|s| s.status == 429 && s.by == "new") && Instant::now() < cap {
        sample(ngx, old, new, t0, Duration::from_millis(500), out);
    }
}

fn timeline(samples: &[Sample]) -> String {
    samples.iter().map(|s| format!("{:>6} ms {} {}", s.at.as_millis(), s.status, s.by)).collect::<Vec<_>>().join("\n")
}

/// Checks the samples after a switch at `t0`: from 2 s on, every request is
/// decided by the new master, with no Redis failure logged; the new master
/// admits exactly 30 more (50 with the 20 replicated); only requests right
/// after the switch may have gone to the old master (and are lost with it).
fn check_after_switch(
    what: &str,
    samples: &[Sample],
    ngx: &Nginx,
    log_at_2s: usize,
    sentinel: &Sentinel,
    started: Instant,
) {
    let log = ngx.error_log();
    let late_failures = failed_lines(log.get(log_at_2s..).unwrap_or(""), "s");
    let admitted_after = samples.iter().filter(|s| s.status == 200).count();
    let context = format!(
        "{what}: admitted in all {} (20 before the switch + {admitted_after} after), expected 50\ntimeline after the switch (ms since switch, status, server that ran the script):\n{}\n\
         Redis failures logged (first 10): {:#?}\nsentinel log:\n{}",
        20 + admitted_after,
        timeline(samples),
        failed_lines(&log, "s").iter().take(10).collect::<Vec<_>>(),
        sentinel.log()
    );
    assert!(started.elapsed() < Duration::from_secs(70), "the test outlived one refill (72 s): counts are not exact");
    let late: Vec<&Sample> = samples.iter().filter(|s| s.at >= Duration::from_secs(2)).collect();
    assert!(!late.is_empty(), "no request sent 2 s after the switch\n{context}");
    let misrouted: Vec<String> =
        late.iter().filter(|s| s.by != "new").map(|s| format!("{} ms: {}", s.at.as_millis(), s.by)).collect();
    assert!(
        misrouted.is_empty(),
        "requests 2 s or more after the switch not decided by the new master: {misrouted:?}\n{context}"
    );
    assert!(late_failures.is_empty(), "Redis failures 2 s or more after the switch: {late_failures:?}\n{context}");
    // A write the old master accepted after the sentinel switched is lost
    // when it is demoted (Redis replication is asynchronous: no client can
    // prevent that). Those must be confined to the moments right after the
    // switch (we follow +switch-master), and the new master, which has the
    // 20 replicated states, must admit exactly 30 more.
    let lost: Vec<&Sample> = samples.iter().filter(|s| s.by == "old" && s.status == 200).collect();
    assert!(
        lost.iter().all(|s| s.at < Duration::from_millis(300)),
        "the old master still decided requests 300 ms after the switch\n{context}"
    );
    let by_new = samples.iter().filter(|s| s.by == "new" && s.status == 200).count();
    assert_eq!(20 + by_new, 50, "admitted by the new master after the switch, plus the 20 replicated\n{context}");
    assert_eq!(admitted_after, by_new + lost.len(), "admissions not decided by either server\n{context}");
    assert!(samples.iter().all(|s| s.status == 200 || s.status == 429), "unexpected status\n{context}");
    assert!(crash_lines(&log).is_empty(), "{:?}", crash_lines(&log));
}

/// `SENTINEL FAILOVER` (old master still alive): within ~2 s of the
/// sentinel reporting the replica as master, requests are decided by it,
/// with the 20 admissions replicated before the failover: 30 more pass,
/// then 429s — also once the sentinel has turned the old master into a
/// replica of the new one (its own writes, if any, are then discarded).
#[test]
fn sentinel_failover() {
    let started = Instant::now();
    let (master, replica, sentinel, ngx) = failover_setup();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = sentinel.cli(&["SENTINEL", "FAILOVER", "mymaster"]);
        if out == "OK" {
            break;
        }
        // NOGOODSLAVE while the sentinel's view of the replica is not fresh yet.
        assert!(Instant::now() < deadline, "SENTINEL FAILOVER keeps answering {out:?}\n{}", sentinel.log());
        thread::sleep(Duration::from_millis(100));
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while sentinel.master_port() != Some(replica.port) {
        assert!(Instant::now() < deadline, "the sentinel never switched to the replica:\n{}", sentinel.log());
        thread::sleep(Duration::from_millis(10));
    }
    let t0 = Instant::now();
    let mut samples = Vec::new();
    sample(&ngx, Some(&master), &replica, t0, Duration::from_secs(2), &mut samples);
    let log_at_2s = ngx.error_log().len();
    sample(&ngx, Some(&master), &replica, t0, Duration::from_secs(2), &mut samples);
    // The sentinel demotes the old master (REPLICAOF + CLIENT KILL) some
    // 10 s after the switch; keep sending after that, so that admissions
    // made on the old master (lost in its resync) would show in the count.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !(master.role() == "slave" && master.cli(&["INFO", "replication"]).contains("master_link_status:up")) {
        assert!(Instant::now() < deadline, "the old master was never demoted:\n{}", sentinel.log());
        thread::sleep(Duration::from_millis(50));
    }
    sample_until_limited(&ngx, Some(&master), &replica, t0, Duration::from_secs(3), &mut samples);
    check_after_switch("SENTINEL FAILOVER", &samples, &ngx, log_at_2s, &sentinel, started);
}

/// The master is killed (SIGKILL) after its writes reached the replica: the
/// sentinel fails over on its own (down-after 500 ms, quorum 1). Requests
/// during the outage are denied (on_error=deny); within ~2 s of the switch
/// the new master decides again, and exactly 50 pass in all.
#[test]
fn sentinel_master_killed_failover() {
    let started = Instant::now();
    let (mut master, replica, sentinel, ngx) = failover_setup();
    master.stop();
    let mut outage = Vec::new();
    // A request answered once the sentinel had switched may have been decided
    // by the new master (nginx asks the sentinel when its connection fails):
    // it counts among the new master's admissions, as a sample at the switch.
    let mut samples = Vec::new();
    let t_kill = Instant::now();
    let deadline = Instant::now() + Duration::from_secs(30);
    while sentinel.master_port() != Some(replica.port) {
        assert!(Instant::now() < deadline, "the sentinel never failed over to the replica:\n{}", sentinel.log());
        // Requests during the outage: never admitted (on_error=deny).
        let before = script_calls(&replica);
        let status = ngx.get("/index.html", &[]).status;
        if sentinel.master_port() != Some(replica.port) {
            outage.push(status);
        } else {
            let by = if script_calls(&replica) > before { "new" } else { "none" };
            samples.push(Sample { at: Duration::ZERO, status, by });
        }
        thread::sleep(Duration::from_millis(50));
    }
    let at_switch: Vec<(u16, &str)> = samples.iter().map(|s| (s.status, s.by)).collect();
    eprintln!(
        "switch {:?} after the kill; statuses during the outage: {outage:?}; at the switch: {at_switch:?}",
        t_kill.elapsed()
    );
    assert!(outage.iter().all(|s| *s == 429), "a request passed while the master was down: {outage:?}");
    let t0 = Instant::now();
    sample(&ngx, None, &replica, t0, Duration::from_secs(2), &mut samples);
    let log_at_2s = ngx.error_log().len();
    sample_until_limited(&ngx, None, &replica, t0, Duration::from_secs(4), &mut samples);
    check_after_switch("master killed", &samples, &ngx, log_at_2s, &sentinel, started);
}
