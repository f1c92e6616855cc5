//! Locations with both a shared-memory line and a Redis line, under
//! concurrency: a request is admitted only if both admit, and whichever way
//! it ends, each backend is charged for exactly the requests admitted — no
//! request rejected yet charged in Redis, none admitted beyond the
//! shared-memory limit, and the shared-memory units a request took while
//! Redis decided are given back when Redis rejects it.

mod common;

use common::redis::*;
use common::*;

/// Rounds of simultaneous requests on one key; every round ends before the
/// next starts.
const ROUNDS: usize = 3;
const PER_ROUND: usize = 100;

/// `location = /NAME.html` with a shared-memory line of burst `shm` and a
/// Redis line of burst `red` on one key, every other parameter shared.
/// `X-Only: m` (or `r`) empties the other line's key, so that a request
/// reads one line's state alone.
fn location(name: &str, alg: &str, shm: u64, red: u64) -> String {
    let line = |zone: &str, key: &str, burst: u64| {
        format!("rl_limit zone={zone} key={key} rate=100r/d burst={burst} algorithm={alg}; ")
    };
    format!("location = /{name}.html {{ {}{}rl_headers both; }}\n", line("m", "$mkey", shm), line("r", "$rkey", red))
}

/// What line `item` has left, read with one request that only it limits:
/// what that request's charge left, plus its own unit if it was admitted.
fn left(ngx: &Nginx, name: &str, item: &str, key: &str) -> u64 {
    let r = ngx.get(&format!("/{name}.html"), &[("X-K", key), ("X-Only", item)]);
    let remaining = sf_param(&r, "RateLimit", item, "r");
    assert_eq!(remaining, r.num("X-RateLimit-Remaining"), "{r:?}");
    match r.status {
        200 => remaining + 1,
        429 => remaining,
        _ => panic!("probe of {item} on /{name}.html: {r:?}"),
    }
}

/// One location `name` with a shared-memory line of burst `shm` and a Redis
/// line of burst `red`: rounds of simultaneous requests on one key, then
/// each line's state read back.
fn run(ngx: &Nginx, name: &str, alg: &str, shm: u64, red: u64) {
    let key = format!("{name}-{alg}");
    let h = [("X-K", key.as_str())];
    let mut all = Vec::new();
    for _ in 0..ROUNDS {
        all.extend(ngx.concurrent(PER_ROUND, &format!("/{name}.html"), &h));
    }
    let ok = all.iter().filter(|r| r.status == 200).count() as u64;
    let rejected = all.iter().filter(|r| r.status == 429).count() as u64;
    assert_eq!(ok + rejected, (ROUNDS * PER_ROUND) as u64, "{alg} {name}: {:?}", statuses(&all));

    let (shm_left, red_left) = (left(ngx, name, "m", &key), left(ngx, name, "r", &key));
    let (shm_charged, red_charged) = (shm - shm_left, red - red_left);
    assert_eq!(
        (ok, shm_charged, red_charged),
        (shm.min(red), ok, ok),
        "{alg} {name} (shm burst {shm}, Redis burst {red}): admitted {ok}, shared memory charged {shm_charged}, \
         Redis charged {red_charged}: {} rejected yet charged in Redis, {} in shared memory",
        red_charged.saturating_sub(ok),
        shm_charged.saturating_sub(ok)
    );

    // A request Redis rejects gets back the shared-memory unit it held, and
    // its fields say so: the shared-memory line reports what is left without
    // it (what the probe above left).
    if red < shm {
        let r = ngx.get(&format!("/{name}.html"), &h);
        assert_eq!(r.status, 429, "{alg} {name}: Redis is exhausted: {r:?}");
        assert_eq!(sf_param(&r, "RateLimit", "r", "r"), 0, "{alg} {name}: {r:?}");
        assert_eq!(sf_param(&r, "RateLimit", "m", "r"), shm_left - 1, "{alg} {name}: {r:?}");
        assert_eq!(r.num("X-RateLimit-Remaining"), 0, "{alg} {name}: the rejecting line: {r:?}");
        assert!(r.num("Retry-After") >= 1, "{r:?}");
        assert_eq!(left(ngx, name, "m", &key), shm_left - 1, "{alg} {name}: after a request Redis rejected");
    }
}

fn mixed(alg: &str) {
    let redis = Redis::start();
    // The Redis burst above the shared-memory one (`a`), then below it (`b`).
    let (a, b) = ((40, 80), (80, 40));
    let mut body = String::new();
    for (name, (shm, red)) in [("a", a), ("b", b)] {
        body.push_str(&location(name, alg, shm, red));
    }
    let zones = format!(
        "rl_zone m size=1m;\nrl_zone r redis={} timeout=2s;\n\
         map $http_x_only $mkey {{ r \"\"; default $http_x_k; }}\n\
         map $http_x_only $rkey {{ m \"\"; default $http_x_k; }}",
        redis.url()
    );
    let ngx = Nginx::setup(&server(&zones, &body)).file("html/a.html", "a\n").file("html/b.html", "b\n").start();
    run(&ngx, "a", alg, a.0, a.1);
    run(&ngx, "b", alg, b.0, b.1);

    let log = ngx.error_log();
    assert!(failed_lines(&log, "r").is_empty(), "{alg}: Redis failures: {:?}", failed_lines(&log, "r"));
    assert!(crash_lines(&log).is_empty(), "{alg}: {:?}", crash_lines(&log));
}

macro_rules! mixed_tests {
    ($($name:ident => $alg:literal),* $(,)?) => {$(
        #[test]
        fn $name() {
            mixed($alg);
        }
    )*};
}

mixed_tests! {
    mixed_fixed => "fixed",
    mixed_sliding => "sliding",
    mixed_sliding_log => "sliding_log",
    mixed_token_bucket => "token_bucket",
    mixed_leaky_bucket => "leaky_bucket",
    mixed_gcra => "gcra",
}

/// Redis unreachable: with `on_error=deny` every request is rejected and the
/// shared-memory units each one took while Redis was tried are given back;
/// with `on_error=allow` the shared-memory line alone limits, and keeps
/// what it admitted.
#[test]
fn redis_down_on_error() {
    let mut redis = Redis::start();
    let url = redis.url();
    redis.stop();
    // (one shared-memory zone per location: one line in both would be one budget)
    let line = |zone: &str, key: &str| format!("rl_limit zone={zone} key={key} rate=100r/d burst=5; ");
    let zones = format!(
        "rl_zone m size=1m;\nrl_zone m2 size=1m;\nrl_zone rd redis={url} on_error=deny;\nrl_zone ra redis={url} on_error=allow;\n\
         map $http_x_only $mkey {{ r \"\"; default $http_x_k; }}\n\
         map $http_x_only $rkey {{ m \"\"; default $http_x_k; }}"
    );
    let body = format!(
        "location = /d.html {{ {}{}rl_headers both; }}\nlocation = /a.html {{ {}{}rl_headers both; }}",
        line("m", "$mkey"),
        line("rd", "$rkey"),
        line("m2", "$mkey"),
        line("ra", "$rkey")
    );
    let ngx = Nginx::setup(&server(&zones, &body)).file("html/d.html", "d\n").file("html/a.html", "a\n").start();
    let h = [("X-K", "down")];

    let rs = ngx.concurrent(20, "/d.html", &h);
    assert_eq!(statuses(&rs), counts(&[(429, 20)]), "on_error=deny");
    assert_eq!(left(&ngx, "d", "m", "down"), 5, "on_error=deny: the shared-memory line was charged");

    let rs = ngx.concurrent(20, "/a.html", &h);
    assert_eq!(statuses(&rs), counts(&[(200, 5), (429, 15)]), "on_error=allow");
    assert_eq!(left(&ngx, "a", "m2", "down"), 0, "on_error=allow: the shared-memory line");

    let log = ngx.error_log();
    assert!(!failed_lines(&log, "rd").is_empty(), "no failure logged for zone rd");
    assert!(crash_lines(&log).is_empty(), "{:?}", crash_lines(&log));
}
