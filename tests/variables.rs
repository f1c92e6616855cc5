//! The `$rl_*` variables and the log lines: in access logs, `add_header
//! ... always`, `map`, the location `error_page` sends a rejection to; the
//! example configurations of `nginx-conf/` that build on them (a JSON 429,
//! a burst limit told from a daily quota); `rl_log_level` and the
//! `limit_req`-form error-log line that fail2ban's stock filter reads.

mod common;

use std::fs;

use std::thread;
use std::time::{Duration, Instant};

use common::conf_nginx::ConfNginx;
use common::redis::Redis;
use common::*;

/// Every variable, `|`-separated, after the URI and the status.
const LOG_FORMAT: &str = "log_format rl '$request_uri|$status|$rl_status|$rl_line|$rl_limit|$rl_remaining|$rl_reset|\
                          $rl_retry_after|$rl_delay';";

/// One access-log line split into its fields.
#[derive(Debug)]
struct Logged {
    uri: String,
    status: u16,
    rl_status: String,
    line: String,
    limit: String,
    remaining: String,
    reset: String,
    retry_after: String,
    delay: String,
}

/// The access log `access.log` of `ngx`, one entry per request, in order.
/// nginx writes the entry before it closes the connection, and every
/// request of the harness reads its response to the close.
fn access_log(ngx: &Nginx) -> Vec<Logged> {
    let text = fs::read_to_string(ngx.prefix.join("access.log")).unwrap_or_default();
    text.lines()
        .map(|l| {
            let f: Vec<&str> = l.split('|').collect();
            assert_eq!(f.len(), 9, "access log line {l:?}");
            Logged {
                uri: f[0].into(),
                status: f[1].parse().unwrap(),
                rl_status: f[2].into(),
                line: f[3].into(),
                limit: f[4].into(),
                remaining: f[5].into(),
                reset: f[6].into(),
                retry_after: f[7].into(),
                delay: f[8].into(),
            }
        })
        .collect()
}

fn num(field: &str) -> u64 {
    field.parse().unwrap_or_else(|_| panic!("not a number: {field:?}"))
}

/// The limited location, a location no line applies to, and every variable
/// in the access log.
fn logged_conf(zone: &str, limit: &str) -> String {
    server(
        &format!("{zone}\n{LOG_FORMAT}"),
        &format!(
            "access_log {{PREFIX}}/access.log rl;\n\
             location /a {{ {limit} }}\n\
             location /free {{ }}"
        ),
    )
}

/// After passed and rejected requests, every variable is in the access log
/// line; a request whose key is empty and one to a location without lines
/// log them all as `-`.
fn access_log_every_variable(ngx: &Nginx) {
    let k = [("X-K", "k1")];
    for i in 0..3 {
        assert_eq!(ngx.get("/a", &k).status, 200, "request {i}");
    }
    let rejected = ngx.get("/a", &k);
    assert_eq!(rejected.status, 429);
    assert_eq!(ngx.get("/a", &[]).status, 200, "no key: the line does not apply");
    assert_eq!(ngx.get("/free", &[]).status, 200);

    let log = access_log(ngx);
    assert_eq!(log.len(), 6, "{log:#?}");
    // token_bucket at 3r/h: a unit comes back every 1200 s.
    for (i, e) in log.iter().take(3).enumerate() {
        let remaining = 2 - i as u64;
        assert_eq!((e.uri.as_str(), e.status), ("/a", 200), "{e:?}");
        assert_eq!((e.rl_status.as_str(), e.line.as_str(), e.limit.as_str()), ("PASSED", "z", "3"), "{e:?}");
        assert_eq!(num(&e.remaining), remaining, "{e:?}");
        let full = 1200 * (3 - remaining);
        assert!((full - 2..=full).contains(&num(&e.reset)), "reset {e:?}, {full} s expected");
        assert_eq!((e.retry_after.as_str(), e.delay.as_str()), ("-", "-"), "{e:?}");
    }
    let e = &log[3];
    assert_eq!((e.uri.as_str(), e.status, e.rl_status.as_str()), ("/a", 429, "REJECTED"), "{e:?}");
    assert_eq!((e.line.as_str(), e.limit.as_str(), e.remaining.as_str()), ("z", "3", "0"), "{e:?}");
    assert!((3598..=3600).contains(&num(&e.reset)), "reset {e:?}");
    assert!((1198..=1200).contains(&num(&e.retry_after)), "retry_after {e:?}");
    assert_eq!(e.delay, "-", "{e:?}");
    // The same line as the response fields.
    assert_eq!(rejected.header("X-RateLimit-Limit"), Some("3"));
    assert_eq!(rejected.header("X-RateLimit-Remaining"), Some("0"));
    assert_eq!(rejected.header("Retry-After"), Some(e.retry_after.as_str()));
    for e in &log[4..] {
        assert_eq!(e.status, 200, "{e:?}");
        let vars = [&e.rl_status, &e.line, &e.limit, &e.remaining, &e.reset, &e.retry_after, &e.delay];
        assert!(vars.iter().all(|v| *v == "-"), "no line applied to {}: every variable empty, got {e:?}", e.uri);
    }
}

/// `{PREFIX}` in a test configuration: the harness fills `{PORT}` and
/// `{ROOT}` only; the root's parent is the prefix.
/// Every location of these tests has a file to serve.
fn start(conf: &str) -> Nginx {
    let mut setup = Nginx::setup(&conf.replace("{PREFIX}", "{ROOT}/.."));
    for name in ["a", "free", "named", "uri", "w", "e", "n", "i"] {
        setup = setup.file(&format!("html/{name}"), "ok\n");
    }
    setup.start()
}

#[test]
fn access_log_every_variable_shm() {
    let ngx = start(&logged_conf(
        "rl_zone z size=1m;",
        "rl_limit zone=z key=$http_x_k rate=3r/h burst=3 algorithm=token_bucket;",
    ));
    access_log_every_variable(&ngx);
}

#[test]
fn access_log_every_variable_redis() {
    let redis = Redis::start();
    let ngx = start(&logged_conf(
        &format!("rl_zone z redis={} timeout=1s;", redis.url()),
        "rl_limit zone=z key=$http_x_k rate=3r/h burst=3 algorithm=token_bucket;",
    ));
    access_log_every_variable(&ngx);
    assert!(failed_lines(&ngx.error_log(), "z").is_empty(), "{}", ngx.error_log());
}

/// The variables survive the internal redirect to the location `error_page`
/// sends a rejection to: a named location that answers with them, and a
/// URI location that adds them as fields; the access log says REJECTED.
#[test]
fn variables_after_error_page() {
    let ngx = start(&server(
        &format!("rl_zone z size=1m;\n{LOG_FORMAT}"),
        "access_log {PREFIX}/access.log rl;\n\
         location /named { rl_limit zone=z key=named rate=1r/h burst=1; error_page 429 = @limited; }\n\
         location @limited { return 429 'status=$rl_status line=$rl_line limit=$rl_limit retry=$rl_retry_after\\n'; }\n\
         location /uri { rl_limit zone=z key=uri rate=1r/h burst=1; rl_limit zone=z key=uri2 rate=2r/h burst=2;\n\
                         error_page 429 /limited.html; }\n\
         location = /limited.html { add_header X-RL \"$rl_status $rl_line $rl_limit $rl_remaining\" always; }",
    ));
    assert_eq!(ngx.get("/named", &[]).status, 200);
    let r = ngx.get("/named", &[]);
    assert_eq!(r.status, 429);
    let retry = r.header("Retry-After").unwrap_or_else(|| panic!("no Retry-After in {r:?}"));
    assert_eq!(r.body, format!("status=REJECTED line=z limit=1 retry={retry}\n"));

    assert_eq!(ngx.get("/uri", &[]).status, 200);
    let r = ngx.get("/uri", &[]);
    assert_eq!((r.status, r.body.as_str()), (429, "custom limited page\n"));
    // The first line rejects (the second has a unit left): it is behind the status.
    assert_eq!(r.header("X-RL"), Some("REJECTED z 1 0"), "{r:?}");

    let log = access_log(&ngx);
    let rejected: Vec<_> = log.iter().filter(|e| e.status == 429).collect();
    assert_eq!(rejected.len(), 2, "{log:#?}");
    assert!(rejected.iter().all(|e| e.rl_status == "REJECTED" && e.line == "z"), "{log:#?}");
}

/// `add_header ... always` on passed and rejected responses, and a `map`
/// from `$rl_status` and from `$rl_line`: of two lines, the one behind the
/// verdict is named.
#[test]
fn variables_in_add_header_and_map() {
    let ngx = start(&server(
        "rl_zone z size=1m;\n\
         map $rl_status $rl_limited { REJECTED yes; default no; }\n\
         map $rl_line $rl_which { z short; z-2 long; default none; }",
        "location /a { rl_limit zone=z key=$http_x_k rate=2r/h burst=2 algorithm=token_bucket;\n\
                       rl_limit zone=z key=$http_x_q rate=5r/d burst=5 algorithm=token_bucket;\n\
                       add_header X-RL \"$rl_status $rl_line $rl_limit $rl_remaining\" always;\n\
                       add_header X-Limited $rl_limited always; add_header X-Which $rl_which always; }\n\
         location /free { add_header X-Limited $rl_limited always; add_header X-Which $rl_which always; }",
    ));
    let got = |r: &Response| {
        (
            r.status,
            r.header("X-RL").map(String::from),
            r.header("X-Limited").map(String::from),
            r.header("X-Which").map(String::from),
        )
    };
    let want = |status, rl: &str, limited: &str, which: &str| {
        (status, Some(rl.to_string()), Some(limited.to_string()), Some(which.to_string()))
    };
    // Both lines pass: the one with fewest remaining is behind the status.
    let r = ngx.get("/a", &[("X-K", "k"), ("X-Q", "q")]);
    assert_eq!(got(&r), want(200, "PASSED z 2 1", "no", "short"), "{r:?}");
    let r = ngx.get("/a", &[("X-K", "k"), ("X-Q", "q")]);
    assert_eq!(got(&r), want(200, "PASSED z 2 0", "no", "short"), "{r:?}");
    // The first line rejects, the second has units left.
    let r = ngx.get("/a", &[("X-K", "k"), ("X-Q", "q")]);
    assert_eq!(got(&r), want(429, "REJECTED z 2 0", "yes", "short"), "{r:?}");
    // The second line's key spent with fresh keys of the first: the second is behind.
    for k in ["k2", "k3", "k4"] {
        assert_eq!(ngx.get("/a", &[("X-K", k), ("X-Q", "q")]).status, 200);
    }
    let r = ngx.get("/a", &[("X-K", "k5"), ("X-Q", "q")]);
    assert_eq!(got(&r), want(429, "REJECTED z-2 5 0", "yes", "long"), "{r:?}");
    assert_eq!(r.header("X-RateLimit-Limit"), Some("5"), "the response fields describe the same line: {r:?}");
    // The second line does not apply without its key.
    let r = ngx.get("/a", &[("X-K", "k6")]);
    assert_eq!(got(&r), want(200, "PASSED z 2 1", "no", "short"), "{r:?}");
    // No line: the maps' defaults, and an empty add_header is not sent.
    let r = ngx.get("/free", &[]);
    assert_eq!(got(&r), (200, None, Some("no".into()), Some("none".into())), "{r:?}");
}

// ---------------------------------------------------------------------------
// The configurations of nginx-conf/, run as they are on a throw-away prefix.
// ---------------------------------------------------------------------------

/// A JSON body checked and read by Python's `json` (the parser API
/// clients have): `error`, and the numbers as `retry_after|limit|reset`.
fn parse_json(body: &str) -> String {
    let script = "import json, sys\n\
                  d = json.load(sys.stdin)\n\
                  assert set(d) == {'error', 'message', 'retry_after', 'limit', 'reset'}, d\n\
                  assert isinstance(d['message'], str) and d['message'], d\n\
                  assert all(type(d[k]) is int for k in ('retry_after', 'limit', 'reset')), d\n\
                  print('%s|%d|%d|%d' % (d['error'], d['retry_after'], d['limit'], d['reset']))\n";
    let out = python(script, body).unwrap_or_else(|e| panic!("not the JSON expected: {body:?}\n{e}"));
    out.trim().to_string()
}

/// nginx-conf/json429.conf: 20 requests pass at once, the 21st is a 429
/// with a JSON body whose numbers are the module's (the response fields
/// say the same).
#[test]
fn json_429_body() {
    let ngx = ConfNginx::start("json429.conf", &[("api/index.json", "{\"ok\":true}\n")]);
    for i in 0..20 {
        let r = ngx.get("/api/", &[]);
        assert_eq!((r.status, r.body.as_str()), (200, "{\"ok\":true}\n"), "request {i}");
    }
    let r = ngx.get("/api/", &[]);
    assert_eq!(r.status, 429, "{r:?}");
    assert_eq!(r.header("Content-Type"), Some("application/json"), "{r:?}");
    let parsed = parse_json(&r.body);
    let f: Vec<&str> = parsed.split('|').collect();
    assert_eq!((f[0], f[2]), ("rate_limit_exceeded", "20"), "{parsed}");
    assert_eq!(Some(f[1]), r.header("Retry-After"), "retry_after is the Retry-After field: {r:?}");
    assert!(num(f[1]) >= 1, "{parsed}");
    assert!((1..=60).contains(&num(f[3])), "reset within the minute: {parsed}");
    assert!(!ngx.error_log().contains("[emerg]"), "{}", ngx.error_log());
}

/// nginx-conf/quota.conf: rejections by the short-term line say "Too Many
/// Requests", and once the key's 20 requests of the day are spent, "Limit
/// Exceeded" (with the daily line in the response fields too), renewed at
/// midnight UTC: Retry-After is the time until then.
#[test]
fn burst_told_from_daily_quota() {
    let ngx = ConfNginx::start("quota.conf", &[("api/index.json", "{}\n")]);
    let key = [("X-Api-Key", "free-tier-key")];
    let (mut passed, mut too_many) = (0, 0);
    let deadline = Instant::now() + Duration::from_secs(20);
    let quota = loop {
        assert!(Instant::now() < deadline, "no quota rejection within 20 s: {passed} passed");
        let r = ngx.get("/api/", &key);
        match r.status {
            200 => passed += 1,
            429 if passed < 20 => {
                assert!(r.body.contains("\"error\":\"too_many_requests\""), "{passed} passed: {r:?}");
                let retry = r.header("Retry-After").unwrap_or("none");
                assert!(r.body.contains(&format!("Too Many Requests: retry after {retry} seconds.")), "{r:?}");
                assert_eq!(r.header("X-RateLimit-Limit"), Some("10"), "{r:?}");
                too_many += 1;
                // The short-term line refills at 10 a second.
                thread::sleep(Duration::from_millis(300));
            }
            _ => break r,
        }
    };
    assert_eq!(passed, 20, "the day's quota: {quota:?}");
    assert!(too_many > 0, "the short-term line never rejected");
    assert_eq!(quota.status, 429, "{quota:?}");
    assert!(quota.body.contains("\"error\":\"limit_exceeded\""), "{quota:?}");
    assert!(
        quota
            .body
            .contains("Limit Exceeded: the daily quota of 20 requests is used up; it is renewed at midnight UTC."),
        "{quota:?}"
    );
    assert_eq!(quota.header("X-RateLimit-Limit"), Some("20"), "{quota:?}");
    let midnight = 86_400 - unix_now() % 86_400;
    let retry = quota.num("Retry-After");
    assert!(retry.abs_diff(midnight) <= 2, "Retry-After {retry}, midnight UTC in {midnight} s: {quota:?}");
    assert!(quota.body.contains(&format!("\"retry_after\":{retry}}}")), "{quota:?}");
    // And so it stays once the short-term line is full again.
    thread::sleep(Duration::from_millis(1100));
    let r = ngx.get("/api/", &key);
    assert!(r.status == 429 && r.body.contains("limit_exceeded"), "{r:?}");
}

// ---------------------------------------------------------------------------
// Log lines.
// ---------------------------------------------------------------------------

/// fail2ban's stock `nginx-limit-req` filter, as fail2ban applies it: the
/// date (its `datepattern = {^LN-BEG}`) cut from the line first, `<HOST>`
/// an address. Prints the hosts of the matching lines, one a line.
fn fail2ban_hosts(log: &str) -> Vec<String> {
    let script = r#"
import re, sys
failregex = r'^\s*\[[a-z]+\] \d+#\d+: \*\d+ limiting requests, excess: [\d\.]+ by zone "(?:%(ngx_limit_req_zones)s)", client: <HOST>,'
failregex = failregex % {'ngx_limit_req_zones': r'[^"]+'}
failregex = failregex.replace('<HOST>', r'(?P<host>\d{1,3}(?:\.\d{1,3}){3})')
date = re.compile(r'^\d{4}/\d{2}/\d{2} \d{2}:\d{2}:\d{2}')
for line in sys.stdin:
    m = re.search(failregex, date.sub('', line, count=1))
    if m:
        print(m.group('host'))
"#;
    let out = python(script, log).unwrap_or_else(|e| panic!("{e}"));
    out.lines().map(String::from).collect()
}

/// One error-log line per rejected request in `limit_req`'s exact form,
/// which fail2ban's stock filter matches, naming the client.
#[test]
fn rejection_log_line_is_limit_req_form() {
    let ngx = start(&server(
        "rl_zone zone_one size=1m;",
        "location /a { rl_limit zone=zone_one rate=2r/h burst=2 algorithm=token_bucket; }",
    ));
    for _ in 0..2 {
        assert_eq!(ngx.get("/a", &[]).status, 200);
    }
    for _ in 0..3 {
        assert_eq!(ngx.get("/a", &[]).status, 429);
    }
    let log = ngx.error_log();
    let lines: Vec<&str> = log.lines().filter(|l| l.contains("limiting requests")).collect();
    assert_eq!(lines.len(), 3, "one line per rejection:\n{log}");
    for l in &lines {
        // Two units held, this request's one more, the rate's one off: 2.000.
        let tail = l.split_once("] ").map(|(_, t)| t).unwrap_or("");
        let tail = tail.split_once(": ").map(|(_, t)| t).unwrap_or(""); // "pid#tid: "
        let tail = tail.split_once(' ').map(|(_, t)| t).unwrap_or(""); // "*N "
        assert_eq!(
            tail,
            format!(
                "limiting requests, excess: 2.000 by zone \"zone_one\", client: 127.0.0.1, server: , \
                 request: \"GET /a HTTP/1.1\", host: \"localhost\""
            ),
            "{l}"
        );
        assert!(l.contains(" [error] "), "rl_log_level defaults to error: {l}");
    }
    assert_eq!(fail2ban_hosts(&log), vec!["127.0.0.1"; 3], "fail2ban's filter on:\n{log}");
}

/// `rl_log_level` sets the level of the line (inherited, overridden in a
/// location); a level below the error log's drops it.
#[test]
fn rl_log_level_levels() {
    let ngx = start(&server(
        "rl_zone z size=1m;\nrl_log_level warn;",
        "location /w { rl_limit zone=z key=w rate=1r/h burst=1; }\n\
         location /e { rl_limit zone=z key=e rate=1r/h burst=1; rl_log_level error; }\n\
         location /n { rl_limit zone=z key=n rate=1r/h burst=1; rl_log_level notice; }\n\
         location /i { rl_limit zone=z key=i rate=1r/h burst=1; rl_log_level info; }",
    ));
    for (path, level) in [("/w", "warn"), ("/e", "error"), ("/n", "notice"), ("/i", "info")] {
        let before = ngx.error_log().len();
        assert_eq!(ngx.get(path, &[]).status, 200);
        assert_eq!(ngx.get(path, &[]).status, 429);
        let new = ngx.error_log_since(before);
        let lines: Vec<&str> = new.lines().filter(|l| l.contains("limiting requests, excess: ")).collect();
        assert_eq!(lines.len(), 1, "{path}: {new}");
        assert!(lines[0].contains(&format!(" [{level}] ")), "{path}: {}", lines[0]);
        assert!(lines[0].contains(&format!("request: \"GET {path} HTTP/1.1\"")), "{}", lines[0]);
    }
    // The harness' error log is at info; at notice, an info line is not written.
    let quiet = start(&server(
        "rl_zone z size=1m;\nrl_log_level info;",
        "error_log {PREFIX}/notice.log notice;\nlocation /i { rl_limit zone=z rate=1r/h burst=1; }",
    ));
    assert_eq!(quiet.get("/i", &[]).status, 200);
    assert_eq!(quiet.get("/i", &[]).status, 429);
    let notice = fs::read_to_string(quiet.prefix.join("notice.log")).unwrap_or_default();
    assert!(!notice.contains("limiting requests"), "{notice}");
}

#[test]
fn rl_log_level_refused() {
    let (ok, out) = nginx_t("rl_log_level debug;");
    assert!(!ok);
    assert!(
        out.contains(
            "invalid value \"debug\" in \"rl_log_level\" directive, it must be \"info\", \"notice\", \"warn\" or \"error\""
        ),
        "{out}"
    );
    let (ok, out) = nginx_t("rl_log_level warn; rl_log_level error;");
    assert!(!ok);
    assert!(out.contains("\"rl_log_level\" directive is duplicate"), "{out}");
    let (ok, out) = nginx_t("server { location / { rl_log_level notice; } }");
    assert!(ok, "{out}");
}

/// A request rejected because a Redis zone with `on_error=deny` failed is
/// `REJECTED` with no line behind it (the other variables empty, no
/// "limiting requests" line: the zone logs its failure); beside it,
/// `on_error=allow` leaves the request to the shared-memory line.
#[test]
fn redis_failure_deny_is_rejected_without_line() {
    let mut redis = Redis::start();
    let url = redis.url();
    redis.stop();
    let ngx = start(&logged_conf(
        &format!("rl_zone s size=1m;\nrl_zone rd redis={url} on_error=deny;\nrl_zone ra redis={url} on_error=allow;"),
        "rl_limit zone=s rate=5r/h burst=5; rl_limit zone=rd key=$http_x_d rate=5r/h burst=5;\n\
         rl_limit zone=ra key=$http_x_a rate=5r/h burst=5;",
    ));
    assert_eq!(ngx.get("/a", &[("X-D", "d")]).status, 429);
    assert_eq!(ngx.get("/a", &[("X-A", "a")]).status, 200);
    let log = access_log(&ngx);
    assert_eq!(log.len(), 2, "{log:#?}");
    let e = &log[0];
    assert_eq!((e.status, e.rl_status.as_str()), (429, "REJECTED"), "{e:?}");
    let vars = [&e.line, &e.limit, &e.remaining, &e.reset, &e.retry_after, &e.delay];
    assert!(vars.iter().all(|v| *v == "-"), "no line behind the rejection: {e:?}");
    let e = &log[1];
    assert_eq!(
        (e.status, e.rl_status.as_str(), e.line.as_str(), e.remaining.as_str()),
        (200, "PASSED", "s", "4"),
        "{e:?}"
    );
    let errors = ngx.error_log();
    assert!(!errors.contains("limiting requests"), "{errors}");
    assert!(!failed_lines(&errors, "rd").is_empty(), "{errors}");
}
