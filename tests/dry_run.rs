//! Dry run (`rl_limit ... dry_run`, `rl_dry_run on`): a dry-run line is
//! evaluated as if enforced and keeps the state it would keep if enforced
//! (charged if and only if it admits and every enforced line admits), but
//! never rejects or delays, adds nothing to the response fields, and is not
//! subject to `on_error=deny`. Its state is seen by the same line enforced
//! elsewhere (one identity, one budget), which is how these tests read it.

mod common;

use common::redis::Redis;
use common::*;

fn serial(ngx: &Nginx, n: usize, path: &str) -> Vec<u16> {
    (0..n).map(|_| ngx.get(path, &[]).status).collect()
}

fn files(setup: Setup) -> Setup {
    ["a", "b", "c"].iter().fold(setup, |s, d| s.file(&format!("html/{d}/index.html"), "x\n"))
}

/// `rl_dry_run on`: nothing is rejected and no rate-limit field is sent;
/// the line's state is what enforcing it would have left (2 of 5 admitted,
/// so the same line enforced in /b has nothing left).
#[test]
fn rl_dry_run_never_rejects_and_keeps_the_enforced_state() {
    let body = "location /a/ { rl_limit zone=z rate=2r/h algorithm=fixed; rl_dry_run on; }\n\
                location /b/ { rl_limit zone=z rate=2r/h algorithm=fixed; }";
    let ngx = files(Nginx::setup(&server("rl_zone z size=1m;", body))).start();
    for i in 0..5 {
        let r = ngx.get("/a/", &[]);
        assert_eq!(r.status, 200, "dry run, request {i}");
        assert!(!r.has_header_prefix("x-ratelimit") && r.header("Retry-After").is_none(), "{r:?}");
    }
    assert_eq!(serial(&ngx, 2, "/b/"), [429, 429]);
}

/// A shadow line beside an enforced one: the enforced line alone decides;
/// the shadow line is charged for the requests it admits and the enforced
/// line admits, and not for one the enforced line rejects (its state, read
/// through the same line enforced in /b, has 10 − 5 = 5 left, not 4).
#[test]
fn shadow_line_beside_an_enforced_one() {
    let body = "rl_headers legacy;\n\
                location /a/ { rl_limit zone=z rate=5r/h burst=5 algorithm=fixed; \
                               rl_limit zone=z rate=10r/h algorithm=fixed name=shadow dry_run; }\n\
                location /b/ { rl_limit zone=z rate=10r/h algorithm=fixed name=shadow; }";
    let ngx = files(Nginx::setup(&server("rl_zone z size=1m;", body))).start();
    let a: Vec<Response> = (0..6).map(|_| ngx.get("/a/", &[])).collect();
    assert_eq!(a.iter().map(|r| r.status).collect::<Vec<_>>(), [200, 200, 200, 200, 200, 429]);
    // The fields describe the enforced line only.
    assert_eq!(a[0].header("X-RateLimit-Limit"), Some("5"), "{:?}", a[0]);
    assert_eq!(a[4].num("X-RateLimit-Remaining"), 0);
    let b = serial(&ngx, 6, "/b/");
    assert_eq!(b, [200, 200, 200, 200, 200, 429], "the shadow line's state");
}

/// A stricter shadow line rejects nothing: every request the enforced line
/// admits passes.
#[test]
fn stricter_shadow_line_rejects_nothing() {
    let body = "location /a/ { rl_limit zone=z rate=10r/h algorithm=fixed; \
                               rl_limit zone=z rate=2r/h algorithm=fixed dry_run; }";
    let ngx = files(Nginx::setup(&server("rl_zone z size=1m;", body))).start();
    assert_eq!(serial(&ngx, 11, "/a/"), [[200; 10].as_slice(), &[429]].concat());
}

/// `rl_dry_run` is inherited, and `off` in an inner level enforces again.
#[test]
fn rl_dry_run_is_inherited() {
    let conf = "rl_zone z size=1m;\n\
                server {\n listen 127.0.0.1:{PORT};\n root {ROOT};\n rl_dry_run on;\n\
                rl_limit zone=z rate=1r/m;\n\
                location /a/ { }\n\
                location /b/ { rl_dry_run off; }\n}\n";
    let ngx = files(Nginx::setup(conf)).start();
    assert_eq!(serial(&ngx, 3, "/a/"), [200, 200, 200]);
    assert_eq!(serial(&ngx, 1, "/b/"), [429]);
}

#[test]
fn rl_dry_run_values() {
    let (ok, out) = nginx_t(&server("rl_zone z size=1m;", "location / { rl_dry_run maybe; }"));
    assert!(
        !ok && out.contains("invalid value \"maybe\" in \"rl_dry_run\" directive, it must be \"on\" or \"off\""),
        "{out}"
    );
    let (ok, out) = nginx_t(&server("rl_zone z size=1m;", "location / { rl_dry_run on; rl_dry_run off; }"));
    assert!(!ok && out.contains("\"rl_dry_run\" directive is duplicate"), "{out}");
    let (ok, out) = nginx_t(&server("rl_zone z size=1m;", "location / { rl_limit zone=z rate=1r/s dry_run dry_run; }"));
    assert!(!ok && out.contains("duplicate \"dry_run\" parameter in \"rl_limit\" directive"), "{out}");
    let (ok, out) = nginx_t(&server("rl_zone z size=1m;", "location / { rl_limit dry_run zone=z rate=1r/s; }"));
    assert!(ok, "{out}");
}

/// Redis unreachable: `on_error=deny` does not apply to a dry-run line.
#[test]
fn on_error_deny_does_not_apply_to_dry_run() {
    let mut redis = Redis::start();
    let url = redis.url();
    redis.stop();
    let body = "location /a/ { rl_limit zone=r rate=1r/m dry_run; }\n\
                location /b/ { rl_limit zone=r rate=1r/m; }";
    let ngx = files(Nginx::setup(&server(&format!("rl_zone r redis={url} on_error=deny;"), body))).start();
    assert_eq!(serial(&ngx, 2, "/a/"), [200, 200]);
    assert_eq!(serial(&ngx, 1, "/b/"), [429]);
}

/// The same on Redis: the shadow line's state follows the same rule.
#[test]
fn redis_shadow_line_beside_an_enforced_one() {
    let redis = Redis::start();
    let body = "location /a/ { rl_limit zone=r rate=5r/h burst=5 algorithm=fixed; \
                               rl_limit zone=r rate=10r/h algorithm=fixed name=shadow dry_run; }\n\
                location /b/ { rl_limit zone=r rate=10r/h algorithm=fixed name=shadow; }\n\
                location /c/ { rl_limit zone=r rate=1r/h algorithm=fixed; rl_dry_run on; }";
    let zone = format!("rl_zone r redis={} timeout=1s;", redis.url());
    let ngx = files(Nginx::setup(&server(&zone, body))).start();
    assert_eq!(serial(&ngx, 6, "/a/"), [200, 200, 200, 200, 200, 429]);
    assert_eq!(serial(&ngx, 6, "/b/"), [200, 200, 200, 200, 200, 429]);
    assert_eq!(serial(&ngx, 3, "/c/"), [200, 200, 200]);
}

/// On Redis, a stricter shadow line that rejects changes nothing of what
/// the enforced line is charged: exactly 10 pass.
#[test]
fn redis_stricter_shadow_line_rejects_nothing() {
    let redis = Redis::start();
    let body = "location /a/ { rl_limit zone=r rate=10r/h algorithm=fixed; \
                               rl_limit zone=r rate=2r/h algorithm=fixed dry_run; }";
    let zone = format!("rl_zone r redis={} timeout=1s;", redis.url());
    let ngx = files(Nginx::setup(&server(&zone, body))).start();
    assert_eq!(serial(&ngx, 11, "/a/"), [[200; 10].as_slice(), &[429]].concat());
}

/// A dry-run rejection is logged as limit_req logs its dry run, and
/// `$rl_status` says what the line would have done.
#[test]
fn dry_run_is_logged_and_in_rl_status() {
    let body = "location /a/ { rl_limit zone=z rate=1r/h algorithm=fixed dry_run; access_log {ROOT}/../rl.log rl; }";
    let zones = "rl_zone z size=1m;\nlog_format rl '$status $rl_status';";
    let ngx = files(Nginx::setup(&server(zones, body))).start();
    assert_eq!(serial(&ngx, 3, "/a/"), [200, 200, 200]);
    let log = std::fs::read_to_string(ngx.prefix.join("rl.log")).unwrap_or_default();
    assert_eq!(log.lines().collect::<Vec<_>>(), ["200 PASSED", "200 REJECTED_DRY_RUN", "200 REJECTED_DRY_RUN"]);
    let err = ngx.error_log();
    let dry: Vec<&str> =
        err.lines().filter(|l| l.contains("limiting requests, dry run, excess: 1.000 by zone \"z\"")).collect();
    assert_eq!(dry.len(), 2, "{err}");
    assert!(dry.iter().all(|l| l.contains("[error]") && l.contains("client: 127.0.0.1")), "{dry:?}");
}
