//! `rl_conn ... priority= classes=`: waiting requests let in highest class
//! first, first come first served within a class; each class's places; a
//! full line giving the newest place of the lowest class to a higher
//! arrival; reserves kept from the classes below; the units of a class
//! given back when the worker holding them dies.
//!
//! Requests hold their slot with a file sent slowly ([`common::held`]); the
//! class is the `p` argument (`priority=$arg_p`): `premium` or anything
//! else, the lowest class.

mod common;

use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use common::held::*;
use common::*;

fn conf(params: &str) -> String {
    format!(
        "rl_zone c size=1m;\n\
         log_format q '$request_uri $status $rl_status';\n\
         server {{ listen 127.0.0.1:{{PORT}}; root {{ROOT}};\n\
           access_log {{ROOT}}/../q.log q;\n\
           location /q/ {{ rl_conn zone=c key=all priority=$arg_p {params}; rl_headers off; {SLOW} }}\n\
           location = /quota {{ rl_quota; rl_conn zone=c key=all priority=$arg_p {params}; }}\n\
           location = /metrics {{ rl_metrics; }}\n\
         }}"
    )
}

fn start(params: &str) -> Nginx {
    Nginx::setup(&conf(params)).file("html/q/slow.html", &slow_file()).file("html/q/fast.html", "fast\n").start()
}

/// The access log's lines for `fast.html`, in the order they ended.
fn fast_lines(ngx: &Nginx) -> Vec<String> {
    let log = std::fs::read_to_string(ngx.prefix.join("q.log")).unwrap_or_default();
    log.lines().filter(|l| l.contains("fast.html")).map(str::to_string).collect()
}

/// Waits until the access log has `n` lines for `fast.html` (10 s at most).
fn until_logged(ngx: &Nginx, n: usize) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let lines = fast_lines(ngx);
        if lines.len() >= n {
            return lines;
        }
        assert!(Instant::now() < deadline, "never {n} logged: {lines:?}\n{}", ngx.error_log());
        thread::sleep(Duration::from_millis(10));
    }
}

/// Premium waiters pass before standard ones that came earlier; each
/// class in the order it came.
#[test]
fn premium_waiters_go_first() {
    let ngx = start("max=1 queue=4 timeout=20s classes=premium,standard");
    let (status, held) = hold(&ngx, "/q/slow.html?p=standard");
    assert_eq!(status, 200);
    let mut waiters = Vec::new();
    for (i, (n, p)) in [("s1", "standard"), ("p1", "premium"), ("s2", "standard"), ("p2", "premium")].iter().enumerate()
    {
        waiters.push(send_only(ngx.port, &format!("/q/fast.html?n={n}&p={p}")));
        until_waiting(&ngx, i as u64 + 1);
    }
    drop(held);
    for w in waiters {
        let (status, text) = response(w);
        assert_eq!(status, 200, "{text}");
    }
    let order: Vec<String> =
        until_logged(&ngx, 4).iter().map(|l| l.split(' ').take(3).collect::<Vec<_>>().join(" ")).collect();
    assert_eq!(
        order,
        [
            "/q/fast.html?n=p1&p=premium 200 DELAYED",
            "/q/fast.html?n=p2&p=premium 200 DELAYED",
            "/q/fast.html?n=s1&p=standard 200 DELAYED",
            "/q/fast.html?n=s2&p=standard 200 DELAYED",
        ]
    );
}

/// `queue=2`: with the line full of standard waiters, a premium arrival
/// takes the newest standard place, whose request is refused (the
/// location's status and `limit_conn`'s log line); a standard arrival,
/// with no class below it, is refused at once, and so is a premium one
/// once premium waiters fill the line.
#[test]
fn a_full_line_gives_the_newest_standard_place_to_premium() {
    let ngx = start("max=1 queue=2 timeout=20s classes=premium,standard");
    let (status, held) = hold(&ngx, "/q/slow.html?p=standard");
    assert_eq!(status, 200);
    let s1 = send_only(ngx.port, "/q/fast.html?n=s1");
    until_waiting(&ngx, 1);
    let s2 = send_only(ngx.port, "/q/fast.html?n=s2");
    until_waiting(&ngx, 2);
    let t = Instant::now();
    assert_eq!(ngx.get("/q/fast.html?n=s3", &[]).status, 429, "the line is full");
    assert!(t.elapsed() < Duration::from_secs(2), "refused after {:?}", t.elapsed());
    let from = ngx.error_log().len();
    let p1 = send_only(ngx.port, "/q/fast.html?n=p1&p=premium");
    let (status, text) = response(s2);
    assert_eq!(status, 429, "the newest standard waiter gives its place up: {text}");
    assert!(ngx.error_log_since(from).contains("limiting connections by zone \"c\""), "{}", ngx.error_log_since(from));
    let p2 = send_only(ngx.port, "/q/fast.html?n=p2&p=premium");
    let (status, text) = response(s1);
    assert_eq!(status, 429, "then the other: {text}");
    until_waiting(&ngx, 2);
    assert_eq!(ngx.get("/q/fast.html?n=p3&p=premium", &[]).status, 429, "premium fills the line");
    drop(held);
    for w in [p1, p2] {
        let (status, text) = response(w);
        assert_eq!(status, 200, "{text}");
    }
    let lines = until_logged(&ngx, 6);
    let got: Vec<String> = lines.iter().map(|l| l.split(' ').take(3).collect::<Vec<_>>().join(" ")).collect();
    assert_eq!(
        got,
        [
            "/q/fast.html?n=s3 429 REJECTED",
            "/q/fast.html?n=s2 429 REJECTED",
            "/q/fast.html?n=s1 429 REJECTED",
            "/q/fast.html?n=p3&p=premium 429 REJECTED",
            "/q/fast.html?n=p1&p=premium 200 DELAYED",
            "/q/fast.html?n=p2&p=premium 200 DELAYED",
        ]
    );
}

/// A class's own places: `standard:queue=1` lets one standard request
/// wait; a second is refused at once though the line has room, which
/// premium then takes.
#[test]
fn each_class_has_its_places() {
    let ngx = start("max=1 queue=3 timeout=20s classes=premium,standard:queue=1");
    let (status, held) = hold(&ngx, "/q/slow.html?p=premium");
    assert_eq!(status, 200);
    let s1 = send_only(ngx.port, "/q/fast.html?n=s1");
    until_waiting(&ngx, 1);
    assert_eq!(ngx.get("/q/fast.html?n=s2", &[]).status, 429, "standard has one place");
    let p1 = send_only(ngx.port, "/q/fast.html?n=p1&p=premium");
    let p2 = send_only(ngx.port, "/q/fast.html?n=p2&p=premium");
    until_waiting(&ngx, 3);
    drop(held);
    for w in [p1, p2, s1] {
        let (status, text) = response(w);
        assert_eq!(status, 200, "{text}");
    }
}

/// `premium:reserve=1` of `max=3`: standard holds two at most, and one
/// stays for premium whatever standard does; while premium holds it,
/// standard still holds no more than two (the reserve is not lent), and
/// once standard holds less, premium may take more than its reserve.
#[test]
fn a_reserve_is_kept_for_premium() {
    let ngx = start("max=3 classes=premium:reserve=1,standard");
    let quota = |q: &str| quota_remaining(&ngx, q);
    assert_eq!((quota(""), quota("?p=premium")), (2, 3), "rl_quota: what each class may take");
    let (status, std_a) = hold(&ngx, "/q/slow.html?n=a");
    assert_eq!(status, 200);
    let (status, _std_b) = hold(&ngx, "/q/slow.html?n=b");
    assert_eq!(status, 200);
    assert_eq!(ngx.get("/q/fast.html?n=c", &[]).status, 429, "the third unit is premium's");
    let (status, prem) = hold(&ngx, "/q/slow.html?p=premium");
    assert_eq!(status, 200, "premium finds its reserve");
    assert_eq!(ngx.get("/q/fast.html?p=premium", &[]).status, 429, "max=3 in all");
    drop(prem);
    until_in_flight(&ngx, 2);
    assert_eq!(ngx.get("/q/fast.html?n=d", &[]).status, 429, "an unused reserve is not lent");
    drop(std_a);
    until_in_flight(&ngx, 1);
    let (status, _p1) = hold(&ngx, "/q/slow.html?p=premium");
    assert_eq!(status, 200);
    let (status, _p2) = hold(&ngx, "/q/slow.html?p=premium");
    assert_eq!(status, 200, "premium beyond its reserve, standard holding one");
    assert_eq!(ngx.get("/q/fast.html?n=e", &[]).status, 429, "max=3 in all");
    assert_eq!(in_flight(&ngx), 3);
}

/// Polls the in-flight gauge until it reads `n` (10 s at most): a closed
/// client's request ends when nginx next writes to it.
fn until_in_flight(ngx: &Nginx, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while in_flight(ngx) != n {
        assert!(Instant::now() < deadline, "never {n} in flight:\n{}", ngx.error_log());
        thread::sleep(Duration::from_millis(10));
    }
}

/// What `/quota` (with the query `q`) says is `remaining` of its first line.
fn quota_remaining(ngx: &Nginx, q: &str) -> u64 {
    let body = ngx.get(&format!("/quota{q}"), &[]).body;
    body.split("\"remaining\":")
        .nth(1)
        .and_then(|v| v.split(',').next()?.parse().ok())
        .unwrap_or_else(|| panic!("{body}"))
}

/// The zone's `nginx_rl_conn_in_flight` gauge.
fn in_flight(ngx: &Nginx) -> u64 {
    let m = ngx.get("/metrics", &[]).body;
    m.lines()
        .find_map(|l| l.strip_prefix("nginx_rl_conn_in_flight{zone=\"c\"} "))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no in-flight gauge:\n{m}"))
}

/// [`hold`] until answered `want` (10 s at most): a closed client's
/// request ends when nginx next writes to it.
fn hold_until(ngx: &Nginx, path: &str, want: u16) -> (u16, std::net::TcpStream) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, s) = hold(ngx, path);
        if status == want || Instant::now() > deadline {
            return (status, s);
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// A dry-run line of classes says what it would do, and lets the request
/// in: a standard request over its share is `REJECTED_DRY_RUN`, logged as
/// `limit_conn`'s dry run is, and holds nothing.
#[test]
fn a_dry_run_line_reports_its_classes() {
    let ngx = start("max=2 classes=premium:reserve=1,standard dry_run");
    let (status, _a) = hold(&ngx, "/q/slow.html?n=a");
    assert_eq!(status, 200);
    let from = ngx.error_log().len();
    let r = ngx.get("/q/fast.html?n=b", &[]);
    assert_eq!(r.status, 200);
    assert!(
        ngx.error_log_since(from).contains("limiting connections, dry run, by zone \"c\""),
        "{}",
        ngx.error_log_since(from)
    );
    let (status, _p) = hold(&ngx, "/q/slow.html?p=premium");
    assert_eq!(status, 200);
    assert_eq!(ngx.get("/q/fast.html?n=c&p=premium", &[]).status, 200);
    let lines = until_logged(&ngx, 2);
    assert!(lines[0].starts_with("/q/fast.html?n=b 200 REJECTED_DRY_RUN"), "{lines:?}");
    assert!(lines[1].starts_with("/q/fast.html?n=c&p=premium 200 REJECTED_DRY_RUN"), "max=2 in all: {lines:?}");
    assert_eq!(in_flight(&ngx), 2, "refused in a dry run, held nothing");
}

/// A worker killed with `-9` while it holds a standard unit: the worker
/// nginx starts in its place gives it back to the line and to standard's
/// share, which then takes a unit again.
#[test]
fn a_killed_workers_class_units_come_back() {
    let ngx = start("max=2 classes=premium:reserve=1,standard");
    let (status, held) = hold(&ngx, "/q/slow.html?n=a");
    assert_eq!(status, 200);
    assert_eq!(ngx.get("/q/fast.html?n=b", &[]).status, 429, "standard's share is one");
    let before = ngx.worker_pids();
    for pid in &before {
        Command::new("kill").args(["-KILL", &pid.to_string()]).status().unwrap();
    }
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ngx.error_log().contains("which exited, given back") {
        assert!(Instant::now() < deadline, "nothing given back:\n{}", ngx.error_log());
        thread::sleep(Duration::from_millis(10));
    }
    let (status, _a) = hold_until(&ngx, "/q/slow.html?n=c", 200);
    assert_eq!(status, 200, "standard's unit was not given back:\n{}", ngx.error_log());
    assert_eq!(ngx.get("/q/fast.html?n=d", &[]).status, 429, "and only one");
    let (status, _p) = hold(&ngx, "/q/slow.html?p=premium");
    assert_eq!(status, 200, "premium's reserve");
}

/// `nginx -t` on classes: what it needs, and lines that count the same
/// requests but would wait in different lines (which, before, left the
/// queued one unenforced).
#[test]
fn nginx_t_class_messages() {
    let (ok, out) = nginx_t("rl_zone c size=1m; server { location / { rl_conn zone=c max=1 priority=$arg_p; } }");
    assert!(!ok && out.contains("\"priority\" needs \"classes\" in \"rl_conn\" directive"), "{out}");
    let (ok, out) = nginx_t(
        "rl_zone c size=1m; server { location / { rl_conn zone=c max=4 priority=$arg_p classes=a,b:reserve=1; } }",
    );
    assert!(
        !ok && out.contains(
            "invalid class \"b\" in \"rl_conn\" directive, the lowest class has no class below it to keep a reserve from"
        ),
        "{out}"
    );
    let (ok, out) = nginx_t(
        "rl_zone c size=1m; server { location /a/ { rl_conn zone=c max=1 key=all queue=2; }\n\
         location /b/ { rl_conn zone=c max=3 key=all; } }",
    );
    assert!(
        !ok && out.contains("counts the requests of the one in")
            && out.contains("(zone \"c\", key \"all\") and must have the same \"queue\" and class queues"),
        "{out}"
    );
    let (ok, out) = nginx_t(
        "rl_zone c size=1m; server { location /a/ { rl_conn zone=c max=1 key=all queue=2 priority=$arg_p classes=a,b; }\n\
         location /b/ { rl_conn zone=c max=3 key=all queue=2; } }",
    );
    assert!(!ok && out.contains("must have the same \"queue\" and class queues"), "{out}");
    // The same waiting line, each with its own max: accepted.
    let (ok, out) = nginx_t(
        "rl_zone c size=1m; server { location /a/ { rl_conn zone=c max=1 key=all queue=2; }\n\
         location /b/ { rl_conn zone=c max=3 key=all queue=2; } }",
    );
    assert!(ok, "{out}");
    // A lent reserve: its class must be able to wait; not on Redis, nor on a rate line.
    let (ok, out) = nginx_t(
        "rl_zone c size=1m; server { location / { rl_conn zone=c max=4 priority=$arg_p classes=a:reserve=1:lend,b; } }",
    );
    assert!(
        !ok && out.contains(
            "invalid class \"a\" in \"rl_conn\" directive, a lent reserve comes back to its class through the waiting \
             line: the class needs places (\"queue=\")"
        ),
        "{out}"
    );
    let (ok, out) = nginx_t(
        "rl_zone c size=1m; server { location / { rl_conn zone=c max=4 priority=$arg_p classes=a:queue=2:lend,b; } }",
    );
    assert!(
        !ok && out.contains(
            "invalid class \"a:queue=2:lend\" in \"rl_conn\" directive, \"lend\" needs a \"reserve=\" to lend"
        ),
        "{out}"
    );
    let (ok, out) = nginx_t(
        "rl_zone c redis=redis://127.0.0.1:1; server { location / { rl_conn zone=c max=4 queue=2 priority=$arg_p classes=a:reserve=1:lend,b; } }",
    );
    assert!(
        !ok && out.contains("\"lend\" needs a shared-memory zone, \"c\" is on Redis, in \"rl_conn\" directive"),
        "{out}"
    );
    let (ok, out) = nginx_t(
        "rl_zone r size=1m; server { location / { rl_limit zone=r rate=1r/s burst=4 priority=$arg_p classes=a:reserve=1:lend,b; } }",
    );
    assert!(!ok && out.contains("a rate line's reserve cannot be lent"), "{out}");
    let (ok, out) = nginx_t(
        "rl_zone c size=1m; server { location / { rl_conn zone=c max=4 queue=2 priority=$arg_p classes=a:reserve=1:lend,b; } }",
    );
    assert!(ok, "{out}");
}

/// `premium:reserve=2:lend` of `max=3`: while premium is unused, standard
/// borrows its reserve (three standard requests in flight); a premium
/// arrival then waits, and gets the first slot given back. From then on,
/// premium in use, the slots given back refill its reserve: a standard
/// waiter is not let in though a slot is free (a reserve of 0, or none,
/// would let it in), until premium is unused again.
#[test]
fn a_lent_reserve_is_borrowed_while_unused() {
    let ngx = start("max=3 queue=4 timeout=20s classes=premium:reserve=2:lend,standard");
    let mut standard = Vec::new();
    for n in ["s1", "s2", "s3"] {
        let (status, s) = hold(&ngx, &format!("/q/slow.html?n={n}"));
        assert_eq!(status, 200, "{n} borrows premium's unused reserve");
        standard.push(s);
    }
    let p1 = send_only(ngx.port, "/q/slow.html?n=p1&p=premium");
    until_waiting(&ngx, 1);
    let s4 = send_only(ngx.port, "/q/fast.html?n=s4");
    until_waiting(&ngx, 2);
    drop(standard.remove(0));
    until_waiting(&ngx, 1);
    until_in_flight(&ngx, 3);
    assert_eq!(fast_lines(&ngx).len(), 0, "premium got the slot, not s4");
    drop(standard.remove(0));
    until_in_flight(&ngx, 2);
    // (s4 looks again within 50 ms: five looks)
    thread::sleep(Duration::from_millis(250));
    assert_eq!((waiting(&ngx), fast_lines(&ngx).len()), (1, 0), "the free slot is premium's reserve");
    drop(p1);
    let (status, text) = response(s4);
    assert_eq!(status, 200, "premium unused again: {text}");
    assert_eq!(
        until_logged(&ngx, 1)[0].split(' ').take(3).collect::<Vec<_>>().join(" "),
        "/q/fast.html?n=s4 200 DELAYED"
    );
}

/// A rate line of classes: `premium:reserve=2` of a burst of 5 keeps the
/// last two units for premium. Standard passes three times and is then
/// refused with the wait until three units are back (its own and the
/// reserve); its remaining count (and `rl_quota`'s) is what standard may
/// still spend. Premium spends the reserve. On shared memory and on Redis
/// alike.
#[test]
fn a_rate_line_keeps_a_reserve_for_premium() {
    rate_reserve("rl_zone r size=1m;");
}

#[test]
fn a_redis_rate_line_keeps_a_reserve_for_premium() {
    let redis = common::redis::Redis::start();
    rate_reserve(&format!("rl_zone r redis={} timeout=1s;", redis.url()));
}

fn rate_reserve(zone: &str) {
    let line =
        "rl_limit zone=r rate=10r/m burst=5 algorithm=gcra key=all priority=$arg_p classes=premium:reserve=2,standard;";
    let ngx = Nginx::setup(&format!(
        "{zone}\n\
         server {{ listen 127.0.0.1:{{PORT}}; root {{ROOT}};\n\
           location /r/ {{ {line} }}\n\
           location = /quota {{ rl_quota; {line} }}\n\
         }}"
    ))
    .file("html/r/a.html", "a\n")
    .start();
    let quota = |q: &str| quota_remaining(&ngx, q);
    assert_eq!((quota(""), quota("?p=premium")), (3, 5), "standard may spend 3 of 5");
    let remaining = |r: &Response| r.header("x-ratelimit-remaining").unwrap_or_default().to_string();
    let r = ngx.get("/r/a.html", &[]);
    assert_eq!((r.status, remaining(&r)), (200, "2".to_string()), "5 less 1, less premium's 2");
    assert_eq!(ngx.get("/r/a.html", &[]).status, 200);
    let r = ngx.get("/r/a.html", &[]);
    assert_eq!((r.status, remaining(&r)), (200, "0".to_string()));
    let r = ngx.get("/r/a.html", &[]);
    assert_eq!(r.status, 429, "the last two units are premium's");
    let retry: u64 = r.header("retry-after").and_then(|v| v.parse().ok()).unwrap_or(0);
    assert!((5..=6).contains(&retry), "three units back at 10r/m: {retry}");
    let r = ngx.get("/r/a.html?p=premium", &[]);
    assert_eq!((r.status, remaining(&r)), (200, "1".to_string()), "premium sees the whole budget");
    assert_eq!(ngx.get("/r/a.html?p=premium", &[]).status, 200);
    assert_eq!(ngx.get("/r/a.html?p=premium", &[]).status, 429, "burst=5 in all");
    assert_eq!((quota(""), quota("?p=premium")), (0, 0));
}

/// `nginx -t` on a rate line's classes.
#[test]
fn nginx_t_rate_class_messages() {
    let (ok, out) =
        nginx_t("rl_zone r redis=redis://127.0.0.1:1 lease=1m; server { location / { rl_limit zone=r rate=1r/s burst=5 priority=$arg_p classes=a:reserve=1,b; } }");
    assert!(
        !ok && out
            .contains("zone \"r\" has \"lease\", whose leases cannot keep class reserves, in \"rl_limit\" directive"),
        "{out}"
    );
    let (ok, out) =
        nginx_t("rl_zone r redis=redis://127.0.0.1:1; server { location / { rl_limit zone=r rate=1r/s burst=5 queue=3 algorithm=gcra priority=$arg_p classes=a:reserve=1,b; } }");
    assert!(
        !ok && out.contains(
            "\"classes\" with \"queue\" need a shared-memory zone, \"r\" is on Redis, in \"rl_limit\" directive"
        ),
        "{out}"
    );
    let (ok, out) = nginx_t(
        "rl_zone r size=1m; server { location / { rl_limit zone=r rate=1r/s queue=3 priority=$arg_p classes=a,b; } }",
    );
    assert!(!ok && out.contains("\"queue\" is not supported by algorithm \"sliding\""), "{out}");
    let (ok, out) =
        nginx_t("rl_zone r size=1m; server { location / { rl_limit zone=r rate=1r/s algorithm=gcra queue=3 priority=$arg_p classes=a:queue=4,b; } }");
    assert!(
        !ok && out.contains("invalid class \"a\" in \"rl_limit\" directive, its queue=4 exceeds the line's queue=3"),
        "{out}"
    );
    let (ok, out) =
        nginx_t("rl_zone r size=1m; server { location / { rl_limit zone=r rate=1r/s algorithm=gcra priority=$arg_p classes=a:queue=4,b:queue=2; } }");
    assert!(ok, "a rate line's classes with places: {out}");
}

/// A rate line of classes with `queue=` (zone "c", so that the waiting
/// gauge [`until_waiting`] reads counts its waiters).
fn start_rate(params: &str) -> Nginx {
    let conf = format!(
        "rl_zone c size=1m;\n\
         log_format q '$request_uri $status $rl_status';\n\
         server {{ listen 127.0.0.1:{{PORT}}; root {{ROOT}};\n\
           access_log {{ROOT}}/../q.log q;\n\
           location /q/ {{ rl_limit zone=c key=all name=q algorithm=gcra priority=$arg_p {params}; }}\n\
           location = /metrics {{ rl_metrics; }}\n\
         }}"
    );
    Nginx::setup(&conf).file("html/q/fast.html", "fast\n").start()
}

/// A rate line's waiters are let in one per emission interval, premium
/// before standard ones that came earlier, each class in the order it
/// came; none passes before the rate lets it (`limit_req`'s delay keeps
/// the arrival order instead).
#[test]
fn a_rate_lines_premium_waiters_go_first() {
    let ngx = start_rate("rate=2r/s burst=1 queue=6 classes=premium,standard");
    let t0 = Instant::now();
    assert_eq!(ngx.get("/q/fast.html?n=s0", &[]).status, 200, "the burst");
    let mut waiters = Vec::new();
    for (i, (n, p)) in [("s1", "standard"), ("p1", "premium"), ("s2", "standard"), ("p2", "premium")].iter().enumerate()
    {
        waiters.push(send_only(ngx.port, &format!("/q/fast.html?n={n}&p={p}")));
        until_waiting(&ngx, i as u64 + 1);
    }
    assert!(t0.elapsed() < Duration::from_millis(450), "sent within the first interval: {:?}", t0.elapsed());
    for w in waiters {
        let (status, text) = response(w);
        assert_eq!(status, 200, "{text}");
    }
    let took = t0.elapsed();
    assert!(took >= Duration::from_millis(1950), "four more at 2r/s take 2 s: {took:?}");
    let order: Vec<String> =
        until_logged(&ngx, 5).iter().map(|l| l.split(' ').take(3).collect::<Vec<_>>().join(" ")).collect();
    assert_eq!(
        order,
        [
            "/q/fast.html?n=s0 200 PASSED",
            "/q/fast.html?n=p1&p=premium 200 DELAYED",
            "/q/fast.html?n=p2&p=premium 200 DELAYED",
            "/q/fast.html?n=s1&p=standard 200 DELAYED",
            "/q/fast.html?n=s2&p=standard 200 DELAYED",
        ]
    );
    let m = ngx.get("/metrics", &[]).body;
    for (class, n) in [("premium", 2), ("standard", 2)] {
        let want =
            format!("nginx_rl_class_requests_total{{zone=\"c\",line=\"q\",class=\"{class}\",result=\"delayed\"}} {n}");
        assert!(m.contains(&want), "{want}:\n{m}");
    }
}

/// `queue=2` on a rate line: with the line full of standard waiters, a
/// standard arrival is refused at once, with `Retry-After`; a premium
/// arrival takes the newest standard place, whose request is refused
/// (`limit_req`'s log line); a waiter whose wait (queue / rate) runs out
/// behind premium ones is refused.
#[test]
fn a_full_rate_line_gives_the_newest_standard_place_to_premium() {
    let ngx = start_rate("rate=1r/s burst=1 queue=2 classes=premium,standard");
    assert_eq!(ngx.get("/q/fast.html?n=s0", &[]).status, 200);
    let s1 = send_only(ngx.port, "/q/fast.html?n=s1");
    until_waiting(&ngx, 1);
    let s2 = send_only(ngx.port, "/q/fast.html?n=s2");
    until_waiting(&ngx, 2);
    let t = Instant::now();
    let r = ngx.get("/q/fast.html?n=s3", &[]);
    assert_eq!(r.status, 429, "the line is full");
    assert!(t.elapsed() < Duration::from_millis(500), "refused after {:?}", t.elapsed());
    assert_eq!(r.header("retry-after"), Some("1"), "{:?}", r.headers);
    let from = ngx.error_log().len();
    let p1 = send_only(ngx.port, "/q/fast.html?n=p1&p=premium");
    let (status, text) = response(s2);
    assert_eq!(status, 429, "the newest standard waiter gives its place up: {text}");
    assert!(ngx.error_log_since(from).contains("limiting requests, excess:"), "{}", ngx.error_log_since(from));
    assert!(ngx.error_log_since(from).contains("by zone \"c\""), "{}", ngx.error_log_since(from));
    for w in [p1, s1] {
        let (status, text) = response(w);
        assert_eq!(status, 200, "{text}");
    }
    let got: Vec<String> =
        until_logged(&ngx, 5).iter().map(|l| l.split(' ').take(3).collect::<Vec<_>>().join(" ")).collect();
    assert_eq!(
        got,
        [
            "/q/fast.html?n=s0 200 PASSED",
            "/q/fast.html?n=s3 429 REJECTED",
            "/q/fast.html?n=s2 429 REJECTED",
            "/q/fast.html?n=p1&p=premium 200 DELAYED",
            "/q/fast.html?n=s1 200 DELAYED",
        ]
    );
}

/// A standard waiter whose wait ((queue + 1) / rate: 3 s at 1r/s with
/// `queue=2`) runs out while premium requests keep coming is refused then,
/// and its place given up.
#[test]
fn a_rate_line_waiter_is_refused_when_its_wait_runs_out() {
    let ngx = start_rate("rate=1r/s burst=1 queue=2 classes=premium,standard:queue=1");
    assert_eq!(ngx.get("/q/fast.html?n=s0", &[]).status, 200);
    let t = Instant::now();
    let s1 = send_only(ngx.port, "/q/fast.html?n=s1");
    until_waiting(&ngx, 1);
    // One premium request waiting at all times: each lets the next in at 1 s, 2 s, 3 s.
    for n in ["p1", "p2", "p3"] {
        let p = send_only(ngx.port, &format!("/q/fast.html?n={n}&p=premium"));
        until_waiting(&ngx, 2);
        assert_eq!(response(p).0, 200, "{n}: premium first");
    }
    let (status, text) = response(s1);
    let waited = t.elapsed();
    assert_eq!(status, 429, "{text}");
    assert!(waited >= Duration::from_millis(2900) && waited < Duration::from_millis(4500), "{waited:?}");
    until_waiting(&ngx, 0);
}

/// nginx's debug log names the class of each verdict of a line of classes.
#[test]
fn debug_log_names_the_class() {
    let version = Command::new(nginx_bin()).arg("-V").output().expect("nginx -V");
    if !String::from_utf8_lossy(&version.stderr).contains("--with-debug") {
        eprintln!("skipped: {} is not built --with-debug", nginx_bin().display());
        return;
    }
    let ngx = Nginx::setup(
        "rl_zone r size=1m;\n\
         server { listen 127.0.0.1:{PORT}; root {ROOT};\n\
           location /r/ { error_log debug.log debug;\n\
             rl_limit zone=r rate=1r/h burst=2 key=all priority=$arg_p classes=premium:reserve=1,standard; }\n\
         }",
    )
    .file("html/r/a.html", "a\n")
    .start();
    assert_eq!(ngx.get("/r/a.html?p=premium", &[]).status, 200);
    assert_eq!(ngx.get("/r/a.html", &[]).status, 429);
    let log = std::fs::read_to_string(ngx.prefix.join("debug.log")).expect("debug.log");
    let verdicts: Vec<&str> = log.lines().filter(|l| l.contains("rl: zone \"r\" line \"r\" class ")).collect();
    assert_eq!(verdicts.len(), 2, "{verdicts:#?}");
    assert!(
        verdicts[0].contains("class \"premium\" key ") && verdicts[0].contains(": admitted, remaining 1,"),
        "{}",
        verdicts[0]
    );
    assert!(
        verdicts[1].contains("class \"standard\" key ") && verdicts[1].contains(": rejected, remaining 0,"),
        "{}",
        verdicts[1]
    );
}

/// A reload that changes a line's waiting line (its `queue=`, its classes)
/// starts the line's counts afresh: the states the old line laid out are
/// never read with the new layout (which, before, read the old waiting
/// line's words as the units of each class, and past the old state's end).
#[test]
fn a_reload_that_changes_the_line_starts_afresh() {
    let mut ngx = start("max=1 queue=5 timeout=20s classes=all");
    let (status, held) = hold(&ngx, "/q/slow.html");
    assert_eq!(status, 200);
    let waiters: Vec<_> = (0..3).map(|i| send_only(ngx.port, &format!("/q/fast.html?n={i}"))).collect();
    until_waiting(&ngx, 3);
    drop(held);
    for w in waiters {
        assert_eq!(response(w).0, 200);
    }
    ngx.reload_with(&conf("max=4 classes=premium:reserve=1,standard"));
    let mut holding = Vec::new();
    for i in 0..3 {
        let (status, s) = hold(&ngx, &format!("/q/slow.html?n=s{i}"));
        assert_eq!(status, 200, "standard {i}");
        holding.push(s);
    }
    assert_eq!(ngx.get("/q/fast.html?n=s3", &[]).status, 429, "the fourth unit is premium's");
    let (status, _p) = hold(&ngx, "/q/slow.html?p=premium");
    assert_eq!(status, 200);
    assert!(crash_lines(&ngx.error_log()).is_empty(), "{}", ngx.error_log());
}
