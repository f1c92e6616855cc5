//! Limits before and after authentication: lines are decided before
//! nginx's access-control handlers (`allow`/`deny`, `auth_basic`,
//! `auth_request`), where `limit_req` decides, unless `after_auth` defers
//! them until access control has allowed the request.
//!
//! The authentication backend is a second server of the same nginx, on a
//! unix socket: `/ok` answers 200 with the plan the client's `X-Token`
//! names in `X-Plan`, `/deny` answers 401.

mod common;

use common::*;

/// Whether this nginx has `auth_request` (the ngx crate's vendored nginx
/// is built without it).
fn has_auth_request() -> bool {
    let out = std::process::Command::new(nginx_bin()).arg("-V").output().expect("cannot run nginx -V");
    String::from_utf8_lossy(&out.stderr).contains("--with-http_auth_request_module")
}

/// Skips the test (with a word on stderr) where nginx lacks `auth_request`.
macro_rules! need_auth_request {
    () => {
        if !has_auth_request() {
            eprintln!("skipped: {} has no auth_request module", nginx_bin().display());
            return;
        }
    };
}

/// An `http {}` body: `zones`, the authentication backend, and the server
/// on {PORT} with its `auth_request` targets and `body`.
fn with_auth(zones: &str, body: &str) -> String {
    let auth = "server {\n listen unix:{ROOT}/auth.sock;\n \
                location = /ok { add_header X-Plan $http_x_token always; return 200; }\n \
                location = /deny { return 401; }\n}\n";
    let targets = "location = /auth_ok { internal; proxy_pass http://unix:{ROOT}/auth.sock:/ok; \
                   proxy_pass_request_body off; proxy_set_header Content-Length \"\"; }\n\
                   location = /auth_deny { internal; proxy_pass http://unix:{ROOT}/auth.sock:/deny; \
                   proxy_pass_request_body off; proxy_set_header Content-Length \"\"; }\n";
    format!("{auth}{}", server(zones, &format!("{targets}{body}")))
}

fn status_of(ngx: &Nginx, path: &str, headers: &[(&str, &str)]) -> u16 {
    ngx.get(path, headers).status
}

fn token(t: &str) -> [(&str, &str); 1] {
    [("X-Token", t)]
}

/// The lines before authentication see the client's address `realip`
/// finds in the location (in the pre-access phase, as `limit_req` does).
#[test]
fn before_auth_sees_the_address_realip_sets() {
    let ngx = Nginx::start(&server(
        "rl_zone z size=1m;",
        "location = /a.html { set_real_ip_from 127.0.0.1; real_ip_header X-Real-IP; rl_limit zone=z rate=1r/m; }",
    ));
    let ip = |a: &'static str| [("X-Real-IP", a)];
    assert_eq!(status_of(&ngx, "/a.html", &ip("192.0.2.1")), 200);
    assert_eq!(status_of(&ngx, "/a.html", &ip("192.0.2.2")), 200, "another address");
    assert_eq!(status_of(&ngx, "/a.html", &ip("192.0.2.1")), 429);
}

/// Lines without `after_auth` are decided before authentication, as
/// `limit_req` is: a request authentication rejects has been charged.
#[test]
fn before_auth_charges_requests_authentication_rejects() {
    need_auth_request!();
    let ngx = Nginx::start(&with_auth(
        "rl_zone z size=1m;",
        "location = /a.html { auth_request /auth_deny; rl_limit zone=z rate=1r/m; }",
    ));
    let got: Vec<u16> = (0..3).map(|_| status_of(&ngx, "/a.html", &[])).collect();
    assert_eq!(got, [401, 429, 429]);
}

/// An access handler that allows the request under `satisfy any` does not
/// skip the lines before authentication: they are decided in the pre-access
/// phase, where `limit_req` is. (Decided in the access phase, a rejection
/// with 403 was taken for access control's and `allow` overrode it.)
#[test]
fn satisfy_any_does_not_skip_lines_before_auth() {
    let ngx = Nginx::start(&server(
        "rl_zone z size=1m;",
        "location = /a.html { satisfy any; allow 127.0.0.1; deny all; rl_status 403; rl_limit zone=z rate=1r/m; }\n\
         location = /b.html { satisfy any; allow 127.0.0.1; deny all; rl_limit zone=z rate=1r/m key=b; }",
    ));
    let got: Vec<u16> = (0..3).map(|_| status_of(&ngx, "/a.html", &[])).collect();
    assert_eq!(got, [200, 403, 403]);
    let got: Vec<u16> = (0..3).map(|_| status_of(&ngx, "/b.html", &[])).collect();
    assert_eq!(got, [200, 429, 429]);
    let log = ngx.error_log();
    assert_eq!(log.matches("limiting requests, excess: 1.000 by zone \"z\"").count(), 4, "{log}");
}

/// An `after_auth` line does not charge a request authentication rejects,
/// and limits those it allows.
#[test]
fn after_auth_charges_only_authenticated_requests() {
    need_auth_request!();
    let ngx = Nginx::start(&with_auth(
        "rl_zone z size=1m;",
        "location = /a.html { auth_request /auth_deny; rl_limit zone=z rate=1r/m name=n after_auth; }\n\
         location = /b.html { auth_request /auth_ok; rl_limit zone=z rate=1r/m name=n after_auth; }",
    ));
    for _ in 0..3 {
        let r = ngx.get("/a.html", &[]);
        assert_eq!(r.status, 401, "{r:?}");
        assert_eq!(r.header("X-RateLimit-Remaining"), None, "no line was decided: {r:?}");
    }
    // One state for both locations (name=n): the rejected requests left it whole.
    let r = ngx.get("/b.html", &token("t"));
    assert_eq!((r.status, r.num("X-RateLimit-Remaining")), (200, 0), "{r:?}");
    let r = ngx.get("/b.html", &token("t"));
    assert_eq!((r.status, r.num("X-RateLimit-Remaining")), (429, 0), "{r:?}");
    assert!(r.num("Retry-After") >= 1, "{r:?}");
    assert_eq!(status_of(&ngx, "/a.html", &[]), 401);
}

/// The plan comes from authentication (`auth_request_set`): an `after_auth`
/// line keyed on it limits each plan on its own; a line before
/// authentication sees the variable empty, and is inactive.
#[test]
fn after_auth_keys_on_variables_authentication_sets() {
    need_auth_request!();
    let ngx = Nginx::start(&with_auth(
        "rl_zone z size=1m;",
        "location = /a.html { auth_request /auth_ok; auth_request_set $plan $upstream_http_x_plan; \
         rl_limit zone=z key=$plan rate=2r/m after_auth; rl_headers both; }\n\
         location = /b.html { auth_request /auth_ok; auth_request_set $plan $upstream_http_x_plan; \
         rl_limit zone=z key=$plan rate=2r/m; }",
    ));
    let got: Vec<u16> = (0..3).map(|_| status_of(&ngx, "/a.html", &token("pro"))).collect();
    assert_eq!(got, [200, 200, 429], "plan pro");
    let r = ngx.get("/a.html", &token("free"));
    assert_eq!(r.status, 200, "plan free has its own budget: {r:?}");
    assert_eq!(sf_param(&r, "RateLimit", "z", "r"), 1, "{r:?}");
    let got: Vec<u16> = (0..3).map(|_| status_of(&ngx, "/b.html", &token("pro"))).collect();
    assert_eq!(got, [200, 200, 200], "before authentication, $plan is empty: the line is inactive");
}

/// `satisfy any` ends the access phase at the first handler that allows:
/// `allow` here, so `auth_basic` never runs. The `after_auth` line applies
/// all the same; a variable `auth_request_set` would have set is empty.
#[test]
fn satisfy_any_does_not_skip_after_auth_lines() {
    let ngx = Nginx::setup(&server(
        "rl_zone z size=1m;",
        "location = /a.html { satisfy any; allow 127.0.0.1; deny all; auth_basic \"rl\"; \
         auth_basic_user_file {ROOT}/../htpasswd; rl_limit zone=z rate=1r/m after_auth; }",
    ))
    .file("htpasswd", "user:{PLAIN}secret\n")
    .start();
    let got: Vec<u16> = (0..3).map(|_| status_of(&ngx, "/a.html", &[])).collect();
    assert_eq!(got, [200, 429, 429]);

    if !has_auth_request() {
        eprintln!("skipped the auth_request part: {} has no auth_request module", nginx_bin().display());
        return;
    }
    let ngx = Nginx::start(&with_auth(
        "rl_zone z size=1m;",
        "location = /a.html { satisfy any; allow 127.0.0.1; deny all; auth_request /auth_ok; \
         auth_request_set $plan $upstream_http_x_plan; rl_limit zone=z key=$plan rate=1r/m after_auth; }\n\
         location = /b.html { satisfy any; allow 127.0.0.2; deny all; auth_request /auth_ok; \
         auth_request_set $plan $upstream_http_x_plan; rl_limit zone=z key=$plan rate=1r/m after_auth; }",
    ));
    for _ in 0..3 {
        let r = ngx.get("/a.html", &token("pro"));
        assert_eq!(r.status, 200, "allow satisfied, auth_request never ran: $plan is empty: {r:?}");
        assert_eq!(r.header("X-RateLimit-Remaining"), None, "{r:?}");
    }
    let got: Vec<u16> = (0..2).map(|_| status_of(&ngx, "/b.html", &token("pro"))).collect();
    assert_eq!(got, [200, 429], "auth_request allowed and set $plan");
}

/// A request authentication rejects and `error_page` sends to another
/// location is not charged by the first location's `after_auth` lines, nor
/// counted again by the lines where it lands.
#[test]
fn after_auth_rejected_and_redirected() {
    need_auth_request!();
    let ngx = Nginx::start(&with_auth(
        "rl_zone z size=1m;",
        "location = /a.html { auth_request /auth_deny; error_page 401 = /b.html; \
         rl_limit zone=z rate=1r/m name=n after_auth; }\n\
         location = /b.html { rl_limit zone=z rate=1r/m key=b; }\n\
         location = /index.html { rl_limit zone=z rate=1r/m name=n after_auth; }",
    ));
    for _ in 0..3 {
        let r = ngx.get("/a.html", &[]);
        assert_eq!((r.status, r.body.as_str()), (200, "page b\n"), "{r:?}");
    }
    let got: Vec<u16> = (0..2).map(|_| status_of(&ngx, "/index.html", &[])).collect();
    assert_eq!(got, [200, 429], "name=n was not charged");
    let got: Vec<u16> = (0..2).map(|_| status_of(&ngx, "/b.html", &[])).collect();
    assert_eq!(got, [200, 429], "key=b was not charged");
}

/// A location with a line of each stage: a flood limit per address before
/// authentication, a limit per plan after it. A request the plan's line
/// rejects has been charged by the address's (each stage is all-or-nothing
/// on its own); one the address's line rejects never reaches the plan's.
#[test]
fn mixed_stages() {
    need_auth_request!();
    let ngx = Nginx::start(&with_auth(
        "rl_zone z size=1m;",
        "location = /a.html { auth_request /auth_ok; auth_request_set $plan $upstream_http_x_plan; \
         rl_limit zone=z rate=3r/m name=ip; rl_limit zone=z key=$plan rate=1r/m name=plan after_auth; \
         rl_headers both; }\n\
         location = /b.html { auth_request /auth_ok; auth_request_set $plan $upstream_http_x_plan; \
         rl_limit zone=z key=$plan rate=1r/m name=plan after_auth; }",
    ));
    let r = ngx.get("/a.html", &token("pro"));
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!((sf_param(&r, "RateLimit", "ip", "r"), sf_param(&r, "RateLimit", "plan", "r")), (2, 0), "{r:?}");

    // Rejected after authentication, by the plan: the address's line keeps its charge.
    let r = ngx.get("/a.html", &token("pro"));
    assert_eq!(r.status, 429, "{r:?}");
    assert_eq!((sf_param(&r, "RateLimit", "ip", "r"), sf_param(&r, "RateLimit", "plan", "r")), (1, 0), "{r:?}");
    assert_eq!(r.num("X-RateLimit-Remaining"), 0, "the rejecting line's: {r:?}");
    assert!(r.num("Retry-After") >= 1, "{r:?}");
    // In limit_req's form, which fail2ban's filter reads: the client right after the zone.
    let log = ngx.error_log();
    assert_eq!(log.matches("limiting requests, excess: 1.000 by zone \"z\", client: 127.0.0.1,").count(), 1, "{log}");

    let r = ngx.get("/a.html", &token("basic"));
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(sf_param(&r, "RateLimit", "ip", "r"), 0, "{r:?}");

    // Rejected before authentication, by the address: the plan's line is not decided, nor charged.
    let r = ngx.get("/a.html", &token("team"));
    assert_eq!(r.status, 429, "{r:?}");
    let items: Vec<String> = sf_items(r.header("RateLimit").unwrap_or_default()).into_iter().map(|(n, _)| n).collect();
    assert_eq!(items, ["ip"], "{r:?}");
    let r = ngx.get("/b.html", &token("team"));
    assert_eq!((r.status, r.num("X-RateLimit-Remaining")), (200, 0), "plan team was not charged: {r:?}");
}

/// A stage with a Redis line is suspended while Redis decides and resumed
/// in its phase, all-or-nothing on its own: when the Redis line after
/// authentication rejects, the shared-memory line of that stage gets its
/// unit back, the line before authentication keeps its charge.
#[test]
fn redis_after_auth() {
    let redis = common::redis::Redis::start();
    let ngx = Nginx::start(&server(
        &format!("rl_zone r redis={} timeout=1s;\nrl_zone m size=1m;", redis.url()),
        "location = /a.html { rl_limit zone=m rate=3r/m name=ip; rl_limit zone=r rate=1r/m name=red after_auth; \
         rl_limit zone=m rate=5r/m name=shm after_auth; rl_headers both; }",
    ));
    let r = ngx.get("/a.html", &[]);
    assert_eq!(r.status, 200, "{r:?}");
    let left = |r: &Response| ["ip", "red", "shm"].map(|item| sf_param(r, "RateLimit", item, "r"));
    assert_eq!(left(&r), [2, 0, 4], "{r:?}");
    let r = ngx.get("/a.html", &[]);
    assert_eq!(r.status, 429, "{r:?}");
    assert_eq!(left(&r), [1, 0, 4], "{r:?}");
    assert_eq!(r.num("X-RateLimit-Remaining"), 0, "{r:?}");
    let log = ngx.error_log();
    assert_eq!(log.matches("limiting requests, excess: 1.000 by zone \"r\"").count(), 1, "{log}");
}

/// Each line is counted once in `rl_metrics`, by the stage that decided
/// it; a line of a stage never reached is not counted. `$rl_*` describe
/// the line behind the verdict, whichever stage decided it.
#[test]
fn metrics_count_each_stage_once() {
    let ngx = Nginx::start(&server(
        "rl_zone z size=1m;",
        "location = /a.html { rl_limit zone=z rate=3r/m name=ip; \
         rl_limit zone=z key=$http_x_plan rate=1r/m name=plan after_auth; \
         add_header X-Line \"$rl_status $rl_line\" always; }\n\
         location = /metrics { rl_metrics; }",
    ));
    let plan = |p: &'static str| [("X-Plan", p)];
    let rs: Vec<Response> = ["p", "p", "q", "r"].iter().map(|p| ngx.get("/a.html", &plan(p))).collect();
    let got: Vec<(u16, &str)> = rs.iter().map(|r| (r.status, r.header("X-Line").unwrap_or_default())).collect();
    // $rl_* describe the line behind the verdict, of either stage (the third request leaves
    // both lines at 0: either may be behind it).
    let third = if got[2].1 == "PASSED ip" { "PASSED ip" } else { "PASSED plan" };
    assert_eq!(got, [(200, "PASSED plan"), (429, "REJECTED plan"), (200, third), (429, "REJECTED ip")], "{rs:?}");
    let text = ngx.get("/metrics", &[]).body;
    let count = |line: &str, result: &str| -> u64 {
        text.lines()
            .filter(|l| l.starts_with("nginx_rl_requests_total{"))
            .filter(|l| l.contains(&format!("line=\"{line}\"")) && l.contains(&format!("result=\"{result}\"")))
            .filter_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse::<u64>().ok()))
            .sum()
    };
    let got = [count("ip", "passed"), count("ip", "rejected"), count("plan", "passed"), count("plan", "rejected")];
    assert_eq!(got, [3, 1, 2, 1], "ip passed, rejected; plan passed, rejected:\n{text}");
}

/// Delays (`queue=`) in either stage: a request delayed before
/// authentication goes on to the lines after it when it wakes; one the
/// lines after authentication delay waits there.
#[test]
fn queue_in_either_stage() {
    let ngx = Nginx::start(&server(
        "rl_zone z size=1m;",
        "location = /a.html { rl_limit zone=z rate=2r/s burst=1 queue=1 algorithm=gcra key=a after_auth; }\n\
         location = /b.html { rl_limit zone=z rate=2r/s burst=1 queue=1 algorithm=gcra key=b; \
         rl_limit zone=z rate=1r/m burst=2 key=b2 after_auth; }\n\
         location = /index.html { rl_limit zone=z rate=1r/m burst=2 key=c; \
         rl_limit zone=z rate=2r/s burst=1 queue=1 algorithm=gcra key=c2 after_auth; }",
    ));
    for path in ["/a.html", "/b.html", "/index.html"] {
        let rs = ngx.concurrent_timed(2, path, &[]);
        assert!(rs.iter().all(|(r, _)| r.status == 200), "{path}: {rs:?}");
        let mut times: Vec<u128> = rs.iter().map(|(_, t)| t.as_millis()).collect();
        times.sort_unstable();
        // The second request waits one emission interval, 500 ms.
        assert!(times[0] < 250, "{path}: the first request waited: {times:?}");
        assert!((400..900).contains(&times[1]), "{path}: {times:?}, want about 500 ms");
        // The line that did not delay charged both requests.
        if path != "/a.html" {
            assert_eq!(status_of(&ngx, path, &[]), 429, "{path}");
        }
    }
}

/// `after_auth` is a flag, given once.
#[test]
fn after_auth_parameter() {
    let (ok, out) =
        nginx_t(&server("rl_zone z size=1m;", "location / { rl_limit zone=z rate=1r/m after_auth after_auth; }"));
    assert!(!ok && out.contains("duplicate \"after_auth\" parameter in \"rl_limit\" directive"), "{out}");
    let (ok, out) = nginx_t(&server("rl_zone z size=1m;", "location / { rl_limit zone=z rate=1r/m after_auth=on; }"));
    assert!(!ok && out.contains("invalid parameter \"after_auth=on\" in \"rl_limit\" directive"), "{out}");
    // The same line in both stages, in two locations: one identity, one state.
    let (ok, out) = nginx_t(&server(
        "rl_zone z size=1m;",
        "location /a { rl_limit zone=z rate=1r/m after_auth; }\nlocation /b { rl_limit zone=z rate=1r/m dry_run after_auth; }",
    ));
    assert!(ok, "{out}");
    let (ok, out) = nginx_t(&server(
        "rl_zone z size=1m;",
        "location / { rl_limit zone=z rate=1r/m; rl_limit zone=z rate=1r/m after_auth; }",
    ));
    assert!(!ok && out.contains("\"rl_limit\" directive is duplicate"), "{out}");
}
