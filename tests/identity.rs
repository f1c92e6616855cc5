//! One budget per key wherever a line appears: lines with one identity
//! (zone and `name=`, or zone, key, algorithm, rate and burst) share one
//! state per key across locations and levels, as `limit_req` shares a zone;
//! `nginx -t` refuses a name used with two meanings and a line repeated in
//! one block. Shared-memory and Redis zones.

mod common;

use common::redis::Redis;
use common::*;

/// `n` requests to `path`, one after another: their statuses.
fn serial(ngx: &Nginx, n: usize, path: &str) -> Vec<u16> {
    (0..n).map(|_| ngx.get(path, &[]).status).collect()
}

fn ok(got: &[u16]) -> usize {
    got.iter().filter(|s| **s == 200).count()
}

/// Files under every location the tests use.
fn with_files(setup: Setup) -> Setup {
    ["a", "b", "c", "d"].iter().fold(setup, |s, d| s.file(&format!("html/{d}/index.html"), "x\n"))
}

/// The issue's example: the same line in /a and /b, and a second line on /b.
/// Five requests to /a then five to /b: five pass in all, not ten.
fn same_line_two_locations(zone: &str) {
    let body = "location /a/ { rl_limit zone=z rate=5r/m; }\n\
                location /b/ { rl_limit zone=z rate=5r/m; rl_limit zone=z rate=100r/h; }";
    let ngx = with_files(Nginx::setup(&server(zone, body))).start();
    let a = serial(&ngx, 5, "/a/");
    let b = serial(&ngx, 5, "/b/");
    assert_eq!((ok(&a), ok(&b)), (5, 0), "/a then /b: {a:?} {b:?}");
}

#[test]
fn shm_same_line_in_two_locations_shares_one_budget() {
    same_line_two_locations("rl_zone z size=1m;");
}

#[test]
fn redis_same_line_in_two_locations_shares_one_budget() {
    let redis = Redis::start();
    same_line_two_locations(&format!("rl_zone z redis={} timeout=1s;", redis.url()));
}

/// A line at server level (inherited by /a) and the same line in /b, and
/// a location that inherits from http level: one budget.
#[test]
fn server_and_location_levels_share_one_budget() {
    let conf = "rl_zone z size=1m;\n\
                server {\n listen 127.0.0.1:{PORT};\n root {ROOT};\n\
                rl_limit zone=z rate=4r/m;\n\
                location /a/ { }\n\
                location /b/ { rl_limit zone=z rate=4r/m; rl_headers off; }\n}\n";
    let ngx = with_files(Nginx::setup(conf)).start();
    let a = serial(&ngx, 2, "/a/");
    let b = serial(&ngx, 2, "/b/");
    let c = serial(&ngx, 2, "/c/");
    assert_eq!((ok(&a), ok(&b), ok(&c)), (2, 2, 0), "{a:?} {b:?} {c:?}");
}

/// Named lines share by name, whatever their cost: an upload location
/// charging 3 units takes them from the budget /a charges 1 a request.
/// The name is the item name in the `RateLimit` fields.
#[test]
fn named_lines_share_by_name_across_costs() {
    let body = "rl_headers both;\n\
                location /a/ { rl_limit zone=z rate=6r/m name=api; }\n\
                location /b/ { rl_limit zone=z rate=6r/m name=api cost=3; }";
    let ngx = with_files(Nginx::setup(&server("rl_zone z size=1m;", body))).start();
    let r = ngx.get("/b/", &[]);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("RateLimit-Policy"), Some("\"api\";q=6;w=60"), "{:?}", r.headers);
    assert_eq!(sf_param(&r, "RateLimit", "api", "r"), 3);
    let a = serial(&ngx, 4, "/a/");
    assert_eq!(a, [200, 200, 200, 429], "3 of 6 units left after /b");
}

/// A named line and an unnamed line with the same parameters keep apart.
#[test]
fn named_and_unnamed_lines_never_share() {
    let body = "location /a/ { rl_limit zone=z rate=2r/m name=one; }\n\
                location /b/ { rl_limit zone=z rate=2r/m; }";
    let ngx = with_files(Nginx::setup(&server("rl_zone z size=1m;", body))).start();
    let a = serial(&ngx, 3, "/a/");
    let b = serial(&ngx, 3, "/b/");
    assert_eq!((a, b), (vec![200, 200, 429], vec![200, 200, 429]));
}

/// Unnamed lines that differ in key, algorithm, rate or burst keep apart.
#[test]
fn different_lines_keep_apart() {
    let body = "location /a/ { rl_limit zone=z rate=2r/m; }\n\
                location /b/ { rl_limit zone=z rate=2r/m burst=2 algorithm=gcra; }\n\
                location /c/ { rl_limit zone=z rate=2r/h; }\n\
                location /d/ { rl_limit zone=z rate=2r/m key=$binary_remote_addr$uri; }";
    let ngx = with_files(Nginx::setup(&server("rl_zone z size=1m;", body))).start();
    for path in ["/a/", "/b/", "/c/", "/d/"] {
        assert_eq!(serial(&ngx, 3, path), [200, 200, 429], "{path}");
    }
}

#[test]
fn a_name_with_two_meanings_is_refused() {
    for (second, what) in [
        ("rate=6r/s", "rate=6r/s while previously"),
        ("rate=5r/s burst=7", "burst=7 while"),
        ("rate=5r/s algorithm=gcra", "algorithm=gcra while"),
        ("rate=5r/s key=$uri", "key=$uri while"),
    ] {
        let block = server(
            "rl_zone z size=1m;",
            &format!(
                "location /a/ {{ rl_limit zone=z rate=5r/s name=api; }}\n\
                 location /b/ {{ rl_limit zone=z name=api {second}; }}"
            ),
        );
        let (passed, out) = nginx_t(&block);
        assert!(!passed, "{second}: {out}");
        assert!(out.contains("[emerg]") && out.contains("rl_limit \"api\" of zone \"z\" uses "), "{out}");
        assert!(out.contains(what), "{second}: {out}");
    }
    // The same name on another zone is another line.
    let block = server(
        "rl_zone z size=1m; rl_zone y size=1m;",
        "location /a/ { rl_limit zone=z rate=5r/s name=api; }\nlocation /b/ { rl_limit zone=y rate=6r/s name=api; }",
    );
    let (passed, out) = nginx_t(&block);
    assert!(passed, "{out}");
}

#[test]
fn a_line_twice_in_one_block_is_duplicate() {
    for lines in [
        "rl_limit zone=z rate=5r/s; rl_limit zone=z rate=5r/s cost=2;",
        "rl_limit zone=z rate=5r/s name=n; rl_limit zone=z rate=5r/s name=n;",
        "rl_limit zone=z rate=5r/s key=$binary_remote_addr; rl_limit zone=z rate=5r/s;",
    ] {
        let block = server("rl_zone z size=1m;", &format!("location / {{ {lines} }}"));
        let (passed, out) = nginx_t(&block);
        assert!(!passed, "{lines}: {out}");
        assert!(out.contains("\"rl_limit\" directive is duplicate"), "{lines}: {out}");
    }
    // Two lines that differ only in rate are two lines.
    let block = server("rl_zone z size=1m;", "location / { rl_limit zone=z rate=5r/s; rl_limit zone=z rate=50r/m; }");
    assert!(nginx_t(&block).0);
}

#[test]
fn names_are_tokens() {
    for bad in ["a.b", "a\\\"b", "é", "a,b", "\"\""] {
        let block = server("rl_zone z size=1m;", &format!("location / {{ rl_limit zone=z rate=5r/s name={bad}; }}"));
        let (passed, out) = nginx_t(&block);
        assert!(!passed, "name={bad}: {out}");
        assert!(out.contains("invalid name"), "name={bad}: {out}");
    }
    let block = server("rl_zone z size=1m;", "location / { rl_limit zone=z rate=5r/s name=Free-tier_2; }");
    assert!(nginx_t(&block).0);
}
