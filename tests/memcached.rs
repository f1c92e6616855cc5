//! End-to-end tests of Memcached zones (`rl_zone NAME memcached=ADDR,...`):
//! real nginx instances with the module, real `memcached`s (one or several,
//! each on its own free port), real HTTP requests; what memcached stored is
//! read back with its own text protocol (`lru_crawler metadump`, `mg`).
//!
//! Exact-count tests give their zone `timeout=1s`: a loaded test machine
//! must not turn a slow reply into an `on_error` admission. Tests whose
//! counts must stay in one fixed window (aligned to the Unix epoch) first
//! wait, if need be, until that window has enough time left.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::memcached::*;
use common::redis::TestCerts;
use common::*;

/// Seconds since the Unix epoch, with their fraction.
fn now_f() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64()
}

/// `rl_zone NAME memcached=A,B,... PARAMS;`
fn zone(name: &str, servers: &[&Memcached], params: &str) -> String {
    let addrs: Vec<String> = servers.iter().map(|m| m.addr()).collect();
    format!("rl_zone {name} memcached={} {params};", addrs.join(","))
}

/// The statuses of `n` GETs of `path`, one after another.
fn serial(ngx: &Nginx, n: usize, path: &str, headers: &[(&str, &str)]) -> Vec<u16> {
    (0..n).map(|_| ngx.get(path, headers).status).collect()
}

/// The sum of the samples of `name` whose labels include `labels`, in the
/// text format; `None` if there is none.
fn sample_sum(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let mut found = None;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else { continue };
        let (n, l) = series.split_once('{').unwrap_or((series, ""));
        if n != name || !labels.iter().all(|(k, v)| l.contains(&format!("{k}=\"{v}\""))) {
            continue;
        }
        *found.get_or_insert(0.0) += value.parse::<f64>().unwrap_or_else(|_| panic!("bad sample: {line}"));
    }
    found
}

/// `/metrics` of `ngx`, checked by promtool.
fn scrape(ngx: &Nginx) -> String {
    let r = ngx.get("/metrics", &[]);
    assert_eq!(r.status, 200, "{r:?}");
    promtool_check_metrics(&r.body);
    r.body
}

/// A metric of zone `zone` (all its series summed); panics if absent.
fn metric(text: &str, name: &str, zone: &str, more: &[(&str, &str)]) -> f64 {
    let mut labels = vec![("zone", zone)];
    labels.extend_from_slice(more);
    sample_sum(text, name, &labels).unwrap_or_else(|| panic!("no {name}{labels:?} in:\n{text}"))
}

/// Every memcached failure line and crash of `log`, for a message.
fn trouble(log: &str, zone: &str) -> Vec<String> {
    let mut v = mc_failed_lines(log, zone);
    v.extend(crash_lines(log).into_iter().map(String::from));
    v
}

// ---------------------------------------------------------------------------
// 1. Exact admission: two nginx (2 workers each) on one memcached.
// ---------------------------------------------------------------------------

/// 300 simultaneous requests, half to each nginx, same key, burst=50 at
/// 50r/h (one window of an hour): exactly 50 pass in all, with the page,
/// and 250 are rejected and logged; both nginx kept one counter.
fn two_nginx_exact(alg: &str) {
    assert_eq!(WORKERS, 2, "the harness' nginx have 2 workers each");
    let mc = Memcached::start();
    let conf = server(
        &zone("m", &[&mc], "timeout=1s"),
        &format!("location / {{ rl_limit zone=m rate=50r/h burst=50 algorithm={alg}; }}"),
    );
    let (a, b) = (Nginx::start(&conf), Nginx::start(&conf));
    clear_of_window_end(3600, 30);
    let (pa, pb) = (a.port, b.port);
    let ta = thread::spawn(move || concurrent(pa, 150, "/index.html", &[]));
    let tb = thread::spawn(move || concurrent(pb, 150, "/index.html", &[]));
    let (ra, rb) = (ta.join().unwrap(), tb.join().unwrap());
    let all: Vec<Response> = ra.iter().chain(rb.iter()).cloned().collect();
    let (la, lb) = (a.error_log(), b.error_log());
    assert_eq!(
        statuses(&all),
        counts(&[(200, 50), (429, 250)]),
        "algorithm={alg}: nginx A {:?}, nginx B {:?}; trouble: {:?}",
        statuses(&ra),
        statuses(&rb),
        trouble(&(la.clone() + &lb), "m").iter().take(5).collect::<Vec<_>>()
    );
    for r in all.iter().filter(|r| r.status == 200) {
        assert_eq!(r.body, "index\n");
    }
    let logged = la.matches(" by zone \"m\", client: ").count() + lb.matches(" by zone \"m\", client: ").count();
    assert_eq!(logged, 250, "algorithm={alg}: rejections logged by both nginx together");
    assert!(trouble(&la, "m").is_empty() && trouble(&lb, "m").is_empty(), "{:?}", trouble(&(la + &lb), "m"));
    let keys = mc.keys();
    assert_eq!(keys.len(), 1, "algorithm={alg}: one shared counter expected, got {keys:?}");
    settle_sum(&[&mc], 50, &format!("algorithm={alg}: the admitted units only"));
}

#[test]
fn two_nginx_exact_fixed() {
    two_nginx_exact("fixed");
}

#[test]
fn two_nginx_exact_sliding() {
    two_nginx_exact("sliding");
}

// ---------------------------------------------------------------------------
// 2. The response fields, as a shared-memory zone gives them.
// ---------------------------------------------------------------------------

/// The same 12 requests (10r/m, burst=10) on a memcached zone and on a
/// shared-memory zone, one after the other: the same statuses, limit,
/// remaining and Retry-After, and resets within a second.
fn headers_match_shared_memory(alg: &str) {
    let mc = Memcached::start();
    let line = format!("key=$http_x_k rate=10r/m burst=10 algorithm={alg}");
    let ngx = Nginx::setup(&server(
        &format!("{}\nrl_zone s size=1m;", zone("m", &[&mc], "timeout=1s")),
        &format!(
            "location = /m.html {{ rl_limit zone=m {line}; }}\n\
             location = /s.html {{ rl_limit zone=s {line}; }}"
        ),
    ))
    .file("html/m.html", "m\n")
    .file("html/s.html", "s\n")
    .start();
    clear_of_window_end(60, 15);
    let h = [("X-K", "client")];
    for i in 0..12 {
        let (m, s) = (ngx.get("/m.html", &h), ngx.get("/s.html", &h));
        let what = format!("algorithm={alg}, request {i}:\nmemcached {m:?}\nshm {s:?}");
        assert_eq!((m.status, s.status), if i < 10 { (200, 200) } else { (429, 429) }, "{what}");
        assert_eq!(m.header("X-RateLimit-Limit"), Some("10"), "{what}");
        assert_eq!(m.num("X-RateLimit-Remaining"), 9u64.saturating_sub(i), "{what}");
        for f in ["X-RateLimit-Limit", "X-RateLimit-Remaining"] {
            assert_eq!(m.header(f), s.header(f), "{f}: {what}");
        }
        assert_eq!(m.header("Retry-After").is_some(), s.header("Retry-After").is_some(), "{what}");
        assert_eq!(m.header("Retry-After").is_some(), i >= 10, "{what}");
        if i >= 10 {
            assert!(m.num("Retry-After").abs_diff(s.num("Retry-After")) <= 1, "Retry-After: {what}");
        }
        assert!(m.num("X-RateLimit-Reset").abs_diff(s.num("X-RateLimit-Reset")) <= 1, "X-RateLimit-Reset: {what}");
    }
    let log = ngx.error_log();
    assert!(trouble(&log, "m").is_empty(), "{:?}", trouble(&log, "m"));
}

#[test]
fn headers_match_shared_memory_fixed() {
    headers_match_shared_memory("fixed");
}

#[test]
fn headers_match_shared_memory_sliding() {
    headers_match_shared_memory("sliding");
}

// ---------------------------------------------------------------------------
// 3. A fixed window ends.
// ---------------------------------------------------------------------------

/// 2r/s burst=2 in fixed windows of a second: 2 pass and the 3rd is
/// rejected (Retry-After 1); nothing passes before the window ends, and
/// within 2 s the key passes again, twice, then is rejected.
#[test]
fn fixed_window_resets_when_it_ends() {
    let mc = Memcached::start();
    let ngx = Nginx::start(&server(
        &zone("m", &[&mc], "timeout=1s"),
        "location / { rl_limit zone=m key=$http_x_k rate=2r/s burst=2 algorithm=fixed; }",
    ));
    // Both workers connected before timing anything.
    let warm = ngx.concurrent(10, "/index.html", &[("X-K", "warm")]);
    assert!(warm.iter().all(|r| [200, 429].contains(&r.status)), "{warm:?}");
    for attempt in 0.. {
        let key = format!("k{attempt}");
        let h = [("X-K", key.as_str())];
        clear_of_window_end(1, 1);
        let start = now_f();
        let window_end = start.floor() + 1.0;
        let first: Vec<Response> = (0..3).map(|_| ngx.get("/index.html", &h)).collect();
        if now_f() >= window_end {
            // Three requests took the rest of the window (a loaded machine): again.
            assert!(attempt < 5, "three requests never fit in one window of a second");
            continue;
        }
        let st: Vec<u16> = first.iter().map(|r| r.status).collect();
        assert_eq!(st, [200, 200, 429], "{first:?}");
        assert_eq!(first[2].num("Retry-After"), 1, "{:?}", first[2]);

        let (mut passed_at, deadline) = (None, Instant::now() + Duration::from_secs(2));
        while passed_at.is_none() && Instant::now() < deadline {
            let r = ngx.get("/index.html", &h);
            let answered = now_f();
            if r.status == 200 {
                // (nginx's cached clock lags ours, never leads it)
                assert!(answered >= window_end, "passed {:.3} s before its window ended: {r:?}", window_end - answered);
                passed_at = Some(answered);
            } else {
                assert_eq!(r.status, 429, "{r:?}");
                thread::sleep(Duration::from_millis(20));
            }
        }
        let passed_at = passed_at.expect("not admitted within 2 s of the 429");
        let more = serial(&ngx, 2, "/index.html", &h);
        if now_f() < window_end + 1.0 {
            assert_eq!(more, [200, 429], "the new window's burst (first at +{:.3} s)", passed_at - window_end);
        }
        let log = ngx.error_log();
        assert!(trouble(&log, "m").is_empty(), "{:?}", trouble(&log, "m"));
        return;
    }
}

// ---------------------------------------------------------------------------
// 4. What is stored: key names, values, expiry.
// ---------------------------------------------------------------------------

/// After requests of two clients on a fixed and a sliding line (minute
/// windows), and of one client on a zone with `prefix=myapp:`, memcached
/// holds one counter per line and client: `{prefix}{16 hex}:{16 hex}:
/// 60000000:{minute index}`, no client text in it, the tag the client's and
/// the line id the line's, the value the requests made, and an expiry at the
/// window's end plus at most 3 s (fixed) or the next window's (sliding).
#[test]
fn stored_keys_values_and_expiry() {
    let mc = Memcached::start();
    let line = "key=$http_x_k rate=10r/m burst=10";
    let ngx = Nginx::setup(&server(
        &format!("{}\n{}", zone("m", &[&mc], "timeout=1s"), zone("p", &[&mc], "timeout=1s prefix=myapp:")),
        &format!(
            "location = /fixed.html {{ rl_limit zone=m {line} algorithm=fixed; }}\n\
             location = /sliding.html {{ rl_limit zone=m {line} algorithm=sliding; }}\n\
             location = /p.html {{ rl_limit zone=p {line} algorithm=fixed; }}"
        ),
    ))
    .file("html/fixed.html", "f\n")
    .file("html/sliding.html", "s\n")
    .file("html/p.html", "p\n")
    .start();
    clear_of_window_end(60, 10);
    let minute = unix_now() / 60;
    let clients = ["SECRET-client-one", "SECRET-client-two"];
    for c in clients {
        for path in ["/fixed.html", "/sliding.html"] {
            assert_eq!(serial(&ngx, 2, path, &[("X-K", c)]), [200, 200], "{path} {c}");
        }
    }
    assert_eq!(serial(&ngx, 3, "/p.html", &[("X-K", clients[0])]), [200, 200, 200]);

    let keys = mc.keys();
    assert_eq!(keys.len(), 5, "one counter per line and client: {keys:?}");
    let mut parsed = Vec::new();
    for (k, exp) in &keys {
        let sk = StateKey::parse(k).unwrap_or_else(|| panic!("key {k:?} is not prefix + hex16:hex16:µs:index"));
        assert!(k.len() < 250, "{k}");
        assert!(!k.contains("SECRET") && !k.contains("client"), "client text in key {k:?}");
        assert_eq!((sk.window_us, sk.index), (60_000_000, minute), "key {k}: a minute window, this minute");
        assert!(["rl:", "myapp:"].contains(&sk.prefix.as_str()), "prefix of {k}");
        parsed.push((sk, *exp, mc.get(k)));
    }
    // The prefixed zone's one counter: fixed, 3 requests.
    let (p, p_exp, p_val) = parsed.iter().find(|(k, _, _)| k.prefix == "myapp:").expect("no myapp: key");
    assert_eq!(*p_val, Some(3));
    let end = p.window_end_s() as i64;
    assert!((end - 1..=end + 3).contains(p_exp), "exp of the fixed counter {p:?}: {p_exp}, window end {end}");

    // Zone m: two tags (clients) by two line ids (lines), each once, each 2 requests.
    let m: Vec<&(StateKey, i64, Option<u64>)> = parsed.iter().filter(|(k, _, _)| k.prefix == "rl:").collect();
    let tags: BTreeSet<&str> = m.iter().map(|(k, _, _)| k.tag.as_str()).collect();
    let lines: BTreeSet<&str> = m.iter().map(|(k, _, _)| k.line.as_str()).collect();
    assert_eq!((tags.len(), lines.len()), (2, 2), "two clients, two lines: {keys:?}");
    let mut kinds: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (k, exp, val) in &m {
        assert_eq!(*val, Some(2), "{k:?}");
        let end = k.window_end_s() as i64;
        let kind = if (end - 1..=end + 3).contains(exp) {
            "fixed"
        } else if (end + 59..=end + 63).contains(exp) {
            "sliding"
        } else {
            panic!("exp of {k:?}: {exp}, window end {end}: neither this window's end nor the next one's (+3 s)")
        };
        kinds.entry(k.line.as_str()).or_default().insert(kind);
    }
    let kinds: BTreeSet<&str> = kinds
        .values()
        .map(|v| {
            assert_eq!(v.len(), 1, "one line's counters expire alike: {keys:?}");
            *v.iter().next().unwrap()
        })
        .collect();
    assert_eq!(kinds, BTreeSet::from(["fixed", "sliding"]), "{keys:?}");
    // The prefixed zone's client is client one: its tag is one of zone m's.
    assert!(tags.contains(p.tag.as_str()), "the tag is the client key's hash: {keys:?}");
}

// ---------------------------------------------------------------------------
// 5. All or nothing across lines.
// ---------------------------------------------------------------------------

/// The counters of both servers, summed.
fn sum_of_counters(servers: &[&Memcached]) -> u64 {
    servers.iter().flat_map(|m| m.keys().into_iter().map(move |(k, _)| m.get(&k).unwrap_or(0))).sum()
}

/// Waits (5 s at most) until the servers' counters sum to `want`: a
/// rejected request's give-backs may land after its response. Panics with
/// what they hold otherwise.
fn settle_sum(servers: &[&Memcached], want: u64, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while sum_of_counters(servers) != want && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(20));
    }
    let held: Vec<(String, Option<u64>)> =
        servers.iter().flat_map(|m| m.keys().into_iter().map(|(k, _)| (k.clone(), m.get(&k)))).collect();
    assert_eq!(sum_of_counters(servers), want, "{what}: units held {held:?}");
}

/// Two lines on a zone of two servers, `narrow` (burst 2, per `X-N`) and
/// `wide` (burst 5, per `X-W`): a request that either rejects is charged on
/// neither. narrow rejects 3 of 5: wide still has 3, which exactly 3 more
/// requests (fresh narrow keys) take; the 2 that wide then rejects left
/// their narrow keys whole. What memcached holds is 2 units per admitted
/// request, nothing more.
#[test]
fn a_rejected_request_is_charged_on_no_line() {
    let (m1, m2) = (Memcached::start(), Memcached::start());
    let ngx = Nginx::start(&server(
        &zone("m", &[&m1, &m2], "timeout=1s"),
        "location / { rl_limit zone=m key=$http_x_n rate=2r/h burst=2 algorithm=fixed name=narrow;\n\
                      rl_limit zone=m key=$http_x_w rate=5r/h burst=5 algorithm=fixed name=wide; }",
    ));
    clear_of_window_end(3600, 30);
    let get = |n: &str, w: &str| ngx.get("/index.html", &[("X-N", n), ("X-W", w)]).status;
    let both = [&m1, &m2];
    let st: Vec<u16> = (0..5).map(|_| get("n1", "w")).collect();
    assert_eq!(st, [200, 200, 429, 429, 429], "narrow's burst");
    settle_sum(&both, 4, "2 admitted requests, 2 lines each");
    let st: Vec<u16> = (2..=6).map(|i| get(&format!("n{i}"), "w")).collect();
    assert_eq!(st, [200, 200, 200, 429, 429], "wide charged for the 2 admitted requests only");
    settle_sum(&both, 10, "5 admitted requests, 2 lines each");
    for n in ["n5", "n6"] {
        let st: Vec<u16> = (0..3).map(|i| get(n, &format!("w-{n}-{i}"))).collect();
        assert_eq!(st, [200, 200, 429], "narrow key {n}, rejected by wide, was charged");
    }
    settle_sum(&both, 18, "9 admitted requests, 2 lines each");
    let (c1, c2) = (m1.keys().len(), m2.keys().len());
    assert!(c1 > 0 && c2 > 0, "13 counters, all on one server: {c1} and {c2}");
    let log = ngx.error_log();
    assert!(trouble(&log, "m").is_empty(), "{:?}", trouble(&log, "m"));
}

// ---------------------------------------------------------------------------
// 6. Dry run.
// ---------------------------------------------------------------------------

/// A shadow line beside an enforced one: the enforced line alone decides
/// (6th request rejected); the shadow line is charged for the 5 admitted,
/// not for the rejected one (the same line enforced in /b has 10 − 5 left).
/// A stricter shadow line rejects nothing, and is charged only while it
/// admits (the same line enforced in /d has nothing left, not less).
#[test]
fn dry_run_lines_never_reject_and_are_charged_when_admitted() {
    let mc = Memcached::start();
    let body = "location /a/ { rl_limit zone=m rate=5r/h burst=5 algorithm=fixed; \
                               rl_limit zone=m rate=10r/h algorithm=fixed name=shadow dry_run; }\n\
                location /b/ { rl_limit zone=m rate=10r/h algorithm=fixed name=shadow; }\n\
                location /c/ { rl_limit zone=m rate=100r/h algorithm=fixed name=gate; \
                               rl_limit zone=m rate=2r/h algorithm=fixed name=strict dry_run; }\n\
                location /d/ { rl_limit zone=m rate=2r/h algorithm=fixed name=strict; }";
    let ngx = ["a", "b", "c", "d"]
        .iter()
        .fold(Nginx::setup(&server(&zone("m", &[&mc], "timeout=1s"), body)), |s, d| {
            s.file(&format!("html/{d}/index.html"), "x\n")
        })
        .start();
    clear_of_window_end(3600, 30);
    let a: Vec<Response> = (0..6).map(|_| ngx.get("/a/", &[])).collect();
    assert_eq!(a.iter().map(|r| r.status).collect::<Vec<_>>(), [200, 200, 200, 200, 200, 429]);
    assert_eq!(a[0].header("X-RateLimit-Limit"), Some("5"), "the fields are the enforced line's: {:?}", a[0]);
    settle_sum(&[&mc], 10, "5 admitted requests on the enforced line and on the shadow line");
    assert_eq!(serial(&ngx, 6, "/b/", &[]), [200, 200, 200, 200, 200, 429], "the shadow line's state");

    let c: Vec<Response> = (0..5).map(|_| ngx.get("/c/", &[])).collect();
    assert!(c.iter().all(|r| r.status == 200), "a dry-run line rejected: {c:?}");
    assert!(c.iter().all(|r| r.header("X-RateLimit-Limit") == Some("100")), "{c:?}");
    // /a/'s line 5, shadow 10, gate 5, strict 2.
    settle_sum(&[&mc], 22, "the strict dry-run line charged while it admits only");
    assert_eq!(serial(&ngx, 1, "/d/", &[]), [429], "the strict line's state: 2 charged");
    let log = ngx.error_log();
    assert!(trouble(&log, "m").is_empty(), "{:?}", trouble(&log, "m"));
}

// ---------------------------------------------------------------------------
// 7. Long client keys.
// ---------------------------------------------------------------------------

/// Client keys of 10,000 bytes (a header), two that differ in their last
/// byte only: each limited on its own, exactly; memcached's keys stay
/// short and hold none of it; nothing fails.
#[test]
fn long_client_keys_are_limited() {
    let mc = Memcached::start();
    let ngx = Nginx::start(&server(
        &zone("m", &[&mc], "timeout=1s"),
        "large_client_header_buffers 4 32k;\n\
         location / { rl_limit zone=m key=$http_x_k rate=3r/h burst=3 algorithm=fixed; }",
    ));
    clear_of_window_end(3600, 30);
    let base = "k".repeat(9_999);
    for last in ['1', '2'] {
        let key = format!("{base}{last}");
        assert_eq!(serial(&ngx, 4, "/index.html", &[("X-K", &key)]), [200, 200, 200, 429], "key ending in {last}");
    }
    let keys = mc.keys();
    assert_eq!(keys.len(), 2, "two client keys: {keys:?}");
    for (k, _) in &keys {
        assert!(StateKey::parse(k).is_some() && k.len() < 250 && !k.contains("kkkk"), "{k:?}");
        assert_eq!(mc.get(k), Some(3), "{k}");
    }
    let log = ngx.error_log();
    assert!(trouble(&log, "m").is_empty(), "{:?}", trouble(&log, "m"));
}

// ---------------------------------------------------------------------------
// 8. Several servers, one of them down.
// ---------------------------------------------------------------------------

/// 3 servers, two zones on them (`on_error=deny`, prefix `d:`; `allow`,
/// `a:`), 60 keys: one request each spreads them over all three servers.
/// With one server killed, of 2 more requests per key, the keys of the two
/// live servers still get exactly 200 then 429 (burst 2); the dead server's
/// keys, and only they (as many as it held), get 429 twice (deny) or 200
/// twice (allow); the error log names the dead server only.
#[test]
fn one_server_down_affects_only_its_keys() {
    let mut servers = [Memcached::start(), Memcached::start(), Memcached::start()];
    let all: Vec<&Memcached> = servers.iter().collect();
    let zones = format!(
        "{}\n{}",
        zone("d", &all, "timeout=1s on_error=deny prefix=d:"),
        zone("a", &all, "timeout=1s on_error=allow prefix=a:")
    );
    let ngx = Nginx::setup(&server(
        &zones,
        "location = /d.html { rl_limit zone=d key=$http_x_k rate=2r/h burst=2 algorithm=fixed; }\n\
         location = /a.html { rl_limit zone=a key=$http_x_k rate=2r/h burst=2 algorithm=fixed; }",
    ))
    .file("html/d.html", "d\n")
    .file("html/a.html", "a\n")
    .start();
    clear_of_window_end(3600, 60);
    let keys: Vec<String> = (0..60).map(|i| format!("key-{i}")).collect();
    for k in &keys {
        for path in ["/d.html", "/a.html"] {
            assert_eq!(ngx.get(path, &[("X-K", k)]).status, 200, "{path} {k}");
        }
    }
    // Keys per server and zone.
    let held = |m: &Memcached, prefix: &str| m.keys().iter().filter(|(k, _)| k.starts_with(prefix)).count();
    let spread: Vec<(usize, usize)> = servers.iter().map(|m| (held(m, "d:"), held(m, "a:"))).collect();
    assert_eq!(spread.iter().map(|s| s.0).sum::<usize>(), 60, "{spread:?}");
    assert_eq!(spread.iter().map(|s| s.1).sum::<usize>(), 60, "{spread:?}");
    assert!(spread.iter().all(|&(d, a)| d >= 5 && a >= 5), "60 keys badly spread over 3 servers: {spread:?}");

    let dead = 1;
    let dead_port = servers[dead].port;
    let live_ports: Vec<u16> = servers.iter().map(|m| m.port).filter(|p| *p != dead_port).collect();
    servers[dead].stop();
    for (path, zone_name, on_dead, on_dead_count) in
        [("/d.html", "d", [429, 429], spread[dead].0), ("/a.html", "a", [200, 200], spread[dead].1)]
    {
        let mut dead_keys = 0;
        for k in &keys {
            let st = serial(&ngx, 2, path, &[("X-K", k)]);
            if st == on_dead {
                dead_keys += 1;
            } else {
                assert_eq!(st, [200, 429], "{path}, key {k} (its server alive, or dead: {on_dead:?})");
            }
        }
        assert_eq!(
            dead_keys, on_dead_count,
            "{path}: keys answered per on_error, the dead server held {on_dead_count}"
        );
        let log = ngx.error_log();
        let lines = mc_failed_lines(&log, zone_name);
        let verb = if zone_name == "d" { "denying request" } else { "allowing request" };
        assert!(!lines.is_empty(), "zone {zone_name}: no failure logged");
        for l in &lines {
            assert!(l.contains(&format!(" memcached 127.0.0.1:{dead_port} failed: ")) && l.contains(verb), "{l}");
            assert!(live_ports.iter().all(|p| !l.contains(&format!(":{p} "))), "a live server named: {l}");
        }
        assert!(crash_lines(&log).is_empty(), "{:?}", crash_lines(&log));
    }
}

// ---------------------------------------------------------------------------
// 9. A server restarted: counters lost.
// ---------------------------------------------------------------------------

/// A memcached restarted (empty) within a minute window: a key that had
/// admitted units is found at zero by a worker that saw them admitted,
/// which `nginx_rl_memcached_counters_lost_total` counts; limiting resumes
/// (that key gets its burst again from its new count, a fresh key exactly
/// its burst).
#[test]
fn restart_counts_lost_counters_and_limiting_resumes() {
    let mut mc = Memcached::start();
    let ngx = Nginx::start(&server(
        &zone("m", &[&mc], "timeout=1s"),
        "add_header X-Pid $pid always;\n\
         location / { rl_limit zone=m key=$http_x_k rate=5r/m burst=5 algorithm=fixed; }\n\
         location = /metrics { rl_metrics; }",
    ));
    let lost = |ngx: &Nginx| metric(&scrape(ngx), "nginx_rl_memcached_counters_lost_total", "m", &[]);
    clear_of_window_end(60, 25);
    // 20 keys, 2 units each; which workers admitted them.
    let mut saw: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for i in 0..20 {
        let k = format!("k{i}");
        for _ in 0..2 {
            let r = ngx.get("/index.html", &[("X-K", &k)]);
            assert_eq!(r.status, 200, "{r:?}");
            saw.entry(k.clone()).or_default().insert(r.header("X-Pid").unwrap_or_default().to_string());
        }
    }
    assert_eq!(lost(&ngx), 0.0);

    mc.restart();
    // Until both workers limit again (a connection broken by the restart may cost a request).
    let mut limiting = BTreeSet::new();
    for i in 0.. {
        assert!(i < 100, "workers limiting after the restart: {limiting:?}");
        for r in ngx.concurrent(8, "/index.html", &[("X-K", &format!("warm{i}"))]) {
            if r.header("X-RateLimit-Limit") == Some("5") {
                limiting.insert(r.header("X-Pid").unwrap_or_default().to_string());
            }
        }
        if limiting.len() == WORKERS {
            break;
        }
        thread::sleep(Duration::from_millis(20));
    }
    // The keys again, until one lands on a worker that saw it admit units.
    let mut again = None;
    for (k, pids) in &saw {
        let r = ngx.get("/index.html", &[("X-K", k)]);
        assert_eq!(r.status, 200, "{r:?}");
        assert_eq!(r.num("X-RateLimit-Remaining"), 4, "{k} after the restart: a new count: {r:?}");
        if pids.contains(r.header("X-Pid").unwrap_or_default()) {
            again = Some(k.clone());
            break;
        }
    }
    let again = again.expect("no key came back to a worker that had admitted it");
    let deadline = Instant::now() + Duration::from_secs(5);
    while lost(&ngx) < 1.0 {
        assert!(Instant::now() < deadline, "counters_lost_total still 0:\n{}", scrape(&ngx));
        thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(serial(&ngx, 5, "/index.html", &[("X-K", &again)]), [200, 200, 200, 200, 429], "key {again}");
    assert_eq!(serial(&ngx, 6, "/index.html", &[("X-K", "fresh")]), [200, 200, 200, 200, 200, 429]);
    let log = ngx.error_log();
    assert!(crash_lines(&log).is_empty(), "{:?}", crash_lines(&log));
}

// ---------------------------------------------------------------------------
// 10. rl_quota.
// ---------------------------------------------------------------------------

/// A quota body as `name -> field -> value` (checked by Python's json).
fn parse_quota(body: &str) -> BTreeMap<String, BTreeMap<String, String>> {
    let script = "import json, sys\n\
                  d = json.load(sys.stdin)\n\
                  assert list(d) == ['lines'], d\n\
                  for l in d['lines']:\n\
                  \x20   assert all(type(l[k]) is int for k in ('limit', 'remaining', 'reset')), l\n\
                  \x20   for k, v in l.items(): print('%s\\t%s\\t%s' % (l['name'], k, v))\n";
    let out = python(script, body).unwrap_or_else(|e| panic!("not the JSON expected: {body:?}\n{e}"));
    let mut m: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for l in out.lines() {
        let f: Vec<&str> = l.split('\t').collect();
        m.entry(f[0].to_string()).or_default().insert(f[1].to_string(), f[2].to_string());
    }
    m
}

fn field<'a>(q: &'a BTreeMap<String, BTreeMap<String, String>>, line: &str, f: &str) -> &'a str {
    q.get(line).and_then(|l| l.get(f)).unwrap_or_else(|| panic!("no {f} for line {line} in {q:?}"))
}

/// 3 of key k1's daily 10 spent in `/api/`: `/quota` reads 7, twice, with
/// the fields `/api/` sent (its dry-run line 97, marked); an unused key
/// reads its full budget; the reads store nothing in memcached.
#[test]
fn quota_reads_what_the_requests_left() {
    let mc = Memcached::start();
    let l = "rl_limit zone=m key=$http_x_api_key rate=10r/d burst=10 algorithm=fixed name=api;\n\
             rl_limit zone=m key=$http_x_api_key rate=100r/d burst=100 algorithm=fixed name=shadow dry_run;";
    let ngx = Nginx::setup(&server(
        &zone("m", &[&mc], "timeout=1s"),
        &format!("rl_headers both;\nlocation /api/ {{ {l} }}\nlocation = /quota {{ rl_quota; {l} }}"),
    ))
    .file("html/api/index.html", "ok\n")
    .start();
    clear_of_window_end(86_400, 30);
    let k1 = [("X-Api-Key", "k1")];
    let mut last = ngx.get("/api/", &k1);
    for _ in 0..2 {
        last = ngx.get("/api/", &k1);
    }
    assert_eq!((last.status, last.num("X-RateLimit-Remaining")), (200, 7), "{last:?}");
    let stored = mc.keys().into_iter().map(|(k, _)| k).collect::<Vec<_>>();
    assert_eq!(stored.len(), 2, "{stored:?}");
    for read in 0..2 {
        let r = ngx.get("/quota", &k1);
        assert_eq!(r.status, 200, "read {read}: {r:?}");
        let q = parse_quota(&r.body);
        assert_eq!(q.keys().collect::<Vec<_>>(), ["api", "shadow"], "{}", r.body);
        assert_eq!((field(&q, "api", "zone"), field(&q, "api", "limit")), ("m", "10"), "{}", r.body);
        assert_eq!(field(&q, "api", "remaining"), "7", "read {read}: {}", r.body);
        assert_eq!(field(&q, "shadow", "remaining"), "97", "read {read}: {}", r.body);
        assert_eq!(field(&q, "shadow", "dry_run"), "True", "{}", r.body);
        let reset: u64 = field(&q, "api", "reset").parse().unwrap();
        assert!((1..=86_400).contains(&reset), "{}", r.body);
        for h in ["X-RateLimit-Limit", "X-RateLimit-Remaining", "RateLimit-Policy"] {
            assert_eq!(r.header(h), last.header(h), "{h}: {r:?}");
        }
    }
    let q = parse_quota(&ngx.get("/quota", &[("X-Api-Key", "k2")]).body);
    assert_eq!((field(&q, "api", "remaining"), field(&q, "api", "reset")), ("10", "0"), "{q:?}");
    let after: Vec<String> = mc.keys().into_iter().map(|(k, _)| k).collect();
    assert_eq!(after, stored, "a quota read stored something");
    assert_eq!(ngx.get("/api/", &k1).num("X-RateLimit-Remaining"), 6, "the reads charged nothing");
}

// ---------------------------------------------------------------------------
// 11. Metrics.
// ---------------------------------------------------------------------------

/// After 7 requests (5 admitted): calls counted, with their requests and
/// durations, a connection, no error, no on_error, no counter lost; the
/// page passes promtool. Then with memcached killed, 4 requests on
/// `on_error=allow`: counted as errors and as `allowed`.
#[test]
fn metrics_after_traffic_and_failures() {
    let mut mc = Memcached::start();
    let ngx = Nginx::start(&server(
        &zone("m", &[&mc], "timeout=1s on_error=allow"),
        "location / { rl_limit zone=m key=$http_x_k rate=5r/h burst=5 algorithm=fixed; }\n\
         location = /metrics { rl_metrics; }",
    ));
    clear_of_window_end(3600, 30);
    assert_eq!(serial(&ngx, 7, "/index.html", &[("X-K", "k")]), [200, 200, 200, 200, 200, 429, 429]);
    let text = scrape(&ngx);
    let m = |name: &str, more: &[(&str, &str)]| metric(&text, name, "m", more);
    let calls = m("nginx_rl_memcached_calls_total", &[]);
    assert!(calls > 0.0, "{text}");
    assert!(m("nginx_rl_memcached_call_requests_total", &[]) >= 7.0, "{text}");
    assert!(m("nginx_rl_memcached_connects_total", &[]) >= 1.0, "{text}");
    let durations = sample_sum(&text, "nginx_rl_memcached_call_duration_seconds_count", &[("zone", "m")])
        .or_else(|| sample_sum(&text, "nginx_rl_memcached_call_duration_seconds_count", &[]))
        .unwrap_or_else(|| panic!("no call duration histogram:\n{text}"));
    assert_eq!(durations, calls, "one duration per call:\n{text}");
    for kind in ["timeout", "connection", "reply", "refused"] {
        assert_eq!(m("nginx_rl_memcached_errors_total", &[("kind", kind)]), 0.0, "{kind}:\n{text}");
    }
    assert_eq!(sample_sum(&text, "nginx_rl_memcached_on_error_total", &[("zone", "m")]).unwrap_or(0.0), 0.0);
    assert_eq!(m("nginx_rl_memcached_counters_lost_total", &[]), 0.0, "{text}");

    mc.stop();
    assert_eq!(serial(&ngx, 4, "/index.html", &[("X-K", "k")]), [200; 4], "on_error=allow with memcached down");
    let text = scrape(&ngx);
    let m = |name: &str, more: &[(&str, &str)]| metric(&text, name, "m", more);
    assert_eq!(m("nginx_rl_memcached_on_error_total", &[("action", "allowed")]), 4.0, "{text}");
    assert!(m("nginx_rl_memcached_errors_total", &[]) >= 1.0, "{text}");
    assert_eq!(m("nginx_rl_memcached_errors_total", &[("kind", "timeout")]), 0.0, "a refused connection is no timeout");
    assert!(m("nginx_rl_memcached_call_requests_total", &[]) >= 7.0, "{text}");
}

// ---------------------------------------------------------------------------
// 12. nginx -t.
// ---------------------------------------------------------------------------

/// Marks the refused directive's line (a comment: nginx ignores it).
const MARK: &str = "#bad";

/// A configuration refused with `message` at the marked line.
struct Case {
    name: String,
    block: String,
    message: String,
}

/// `rl_zone m PARAMS;` (marked), used by a line.
fn zone_case(params: &str, message: &str) -> Case {
    Case {
        name: format!("rl_zone m {params}"),
        block: server(&format!("rl_zone m {params}; {MARK}"), "location / { rl_limit zone=m rate=1r/s; }"),
        message: message.to_string(),
    }
}

/// `directive` (marked) in a location, on a memcached zone `m`.
fn line_case(directive: &str, message: &str) -> Case {
    Case {
        name: directive.to_string(),
        block: server("rl_zone m memcached=127.0.0.1:11211;", &format!("location / {{\n{directive} {MARK}\n}}")),
        message: message.to_string(),
    }
}

/// What is wrong with nginx -t's answer to `case`, if anything: it must
/// refuse it with exactly one `[emerg]` line, `message in /path/nginx.conf:LINE`.
fn check(case: &Case) -> Option<String> {
    let line = conf_line_of(&case.block, MARK).expect("no marked line");
    let run = nginx_t_run(&case.block, Duration::from_secs(30));
    let emerg: Vec<&str> = run.output.lines().filter(|l| l.contains("[emerg]")).collect();
    let at = format!("/nginx.conf:{line}");
    let right = |e: &str| {
        e.split_once("[emerg] ")
            .and_then(|(_, m)| m.strip_prefix(&format!("{} in ", case.message)))
            .is_some_and(|path| path.ends_with(&at) && !path.contains(' '))
    };
    let ok = !run.ok && run.signal.is_none() && !run.timed_out && emerg.len() == 1 && right(emerg[0]);
    (!ok).then(|| format!("{}: want \"{} in ...{at}\", got:\n{}", case.name, case.message, run.output.trim_end()))
}

/// Each refused form of a memcached zone or of a line on one gets its own
/// message, at its directive's line.
#[test]
fn config_test_messages() {
    let certs = TestCerts::make();
    let mc = "memcached=127.0.0.1:11211";
    let both =
        |a: &str, b: &str| format!("\"{a}\" and \"{b}\" parameters cannot be used together in \"rl_zone\" directive");
    let long = "p".repeat(129);
    let prefix_msg = |shown: &str| {
        format!("invalid prefix \"{shown}\", it must be 1 to 128 printable characters without spaces in \"rl_zone\" directive")
    };
    let mut cases = Vec::new();
    for alg in ["gcra", "token_bucket", "leaky_bucket", "sliding_log"] {
        cases.push(line_case(
            &format!("rl_limit zone=m rate=10r/s algorithm={alg};"),
            &format!(
                "algorithm \"{alg}\" is not supported on memcached zone \"m\", which supports \"fixed\" and \
                 \"sliding\", in \"rl_limit\" directive"
            ),
        ));
    }
    cases.push(line_case(
        "rl_conn zone=m max=3;",
        "memcached zone \"m\" cannot hold requests in flight in \"rl_conn\" directive",
    ));
    for (params, message) in [
        (format!("{mc} size=1m"), both("memcached", "size")),
        (format!("size=1m {mc}"), both("memcached", "size")),
        (format!("{mc} redis=redis://127.0.0.1:6379"), both("memcached", "redis")),
        (format!("redis=redis://127.0.0.1:6379 {mc}"), both("memcached", "redis")),
        (format!("{mc} lease=1m"), both("memcached", "lease")),
        (
            format!(
                "{mc} ssl_certificate={} ssl_certificate_key={}",
                certs.path("client.pem"),
                certs.path("client.key")
            ),
            both("memcached", "ssl_certificate"),
        ),
        (format!("{mc} sync=100ms"), both("memcached", "sync")),
        (format!("{mc} life=60s"), both("memcached", "life")),
        ("memcached=a:b:c".into(), "invalid memcached server \"a:b:c\" in \"rl_zone\" directive".into()),
        (
            "memcached=127.0.0.1:11211,a:b:c".into(),
            "invalid memcached server \"a:b:c\" in \"rl_zone\" directive".into(),
        ),
        (
            "memcached=127.0.0.1:11211,127.0.0.1:11211".into(),
            "duplicate memcached server \"127.0.0.1:11211\" in \"rl_zone\" directive".into(),
        ),
        (
            format!("{mc} on_error=x"),
            "invalid on_error \"x\", it must be \"allow\" or \"deny\" in \"rl_zone\" directive".into(),
        ),
        (
            format!("{mc} timeout=0"),
            "invalid timeout \"0\", it must be from 1ms to 60s in \"rl_zone\" directive".into(),
        ),
        (
            format!("{mc} timeout=61s"),
            "invalid timeout \"61s\", it must be from 1ms to 60s in \"rl_zone\" directive".into(),
        ),
        (format!("{mc} prefix={long}"), prefix_msg(&long)),
        (format!("{mc} \"prefix=a b\""), prefix_msg("a b")),
        (format!("{mc} \"prefix=a\\tb\""), prefix_msg("a\\tb")),
        (format!("{mc} prefix="), prefix_msg("")),
    ] {
        cases.push(zone_case(&params, &message));
    }
    let failures: Vec<String> = cases.iter().filter_map(check).collect();
    assert!(failures.is_empty(), "{} of {} wrong:\n{}", failures.len(), cases.len(), failures.join("\n----\n"));
}

/// The forms the refused ones are variations of are accepted (nothing is
/// connected at `nginx -t`).
#[test]
fn config_test_accepts_good_forms() {
    let good = [
        "rl_zone m memcached=127.0.0.1:11211;",
        "rl_zone m memcached=localhost;",
        "rl_zone m memcached=127.0.0.1:11211,127.0.0.1:11212,[::1]:11211 timeout=200ms on_error=deny prefix=app:;",
        "rl_zone m memcached=[::1]:11211 timeout=60s on_error=allow;",
    ];
    let lines = "location / { rl_limit zone=m rate=10r/s algorithm=fixed; \
                               rl_limit zone=m key=$http_x_k rate=10r/m burst=20 algorithm=sliding dry_run; }\n\
                 location /d/ { rl_limit zone=m rate=10r/s; }\n\
                 location /c/ { rl_limit zone=m rate=100r/h algorithm=fixed cost=$http_x_cost charge=after; }\n\
                 location = /q { rl_quota; rl_limit zone=m rate=10r/s algorithm=fixed; }\n\
                 location = /metrics { rl_metrics; }";
    let failures: Vec<String> = good
        .iter()
        .filter_map(|z| {
            let (ok, out) = nginx_t(&server(z, lines));
            (!ok || !out.contains("test is successful")).then(|| format!("{z}:\n{out}"))
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n----\n"));
}

// ---------------------------------------------------------------------------
// 13. charge=after.
// ---------------------------------------------------------------------------

/// Waits until the line read at `path` (an `rl_quota` location) has at most
/// `left` remaining: a `charge=after` charge lands after the response.
fn settle(ngx: &Nginx, path: &str, headers: &[(&str, &str)], left: u64) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let r = ngx.get(path, headers);
        let now = r
            .body
            .split("\"remaining\":")
            .nth(1)
            .and_then(|t| t.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|n| n.parse::<u64>().ok());
        if now.is_some_and(|n| n <= left) {
            return;
        }
        assert!(Instant::now() < deadline, "{path}: {now:?} remaining, waiting for {left}: {r:?}");
        thread::sleep(Duration::from_millis(10));
    }
}

/// `charge=after` with the upstream's cost (30 a response) on 100 an hour:
/// nothing is charged before the response; each response's 30 lands in
/// memcached, and the next request sees it (100, 70, 40, 10 left); the 4th
/// overdraws (120), the 5th is rejected with a Retry-After and charges
/// nothing; another key has its own budget.
#[test]
fn charge_after_is_charged_with_the_response_cost() {
    let mc = Memcached::start();
    let line = "rl_limit zone=m key=$http_x_api_key rate=100r/h burst=100 algorithm=fixed";
    let ngx = Nginx::start(&server(
        &zone("m", &[&mc], "timeout=1s"),
        &format!(
            "location /backend/ {{ add_header X-Tokens-Used 30 always; return 200 \"ok\\n\"; }}\n\
             location /llm/ {{ {line} cost=$upstream_http_x_tokens_used charge=after; \
                 proxy_pass http://127.0.0.1:{{PORT}}/backend/; }}\n\
             location /q/ {{ rl_quota; {line}; }}"
        ),
    ));
    clear_of_window_end(3600, 30);
    let key = [("X-Api-Key", "k1")];
    for (i, before) in [100, 70, 40, 10].into_iter().enumerate() {
        let r = ngx.get("/llm/", &key);
        assert_eq!((r.status, r.num("X-RateLimit-Remaining")), (200, before), "request {}: {r:?}", i + 1);
        settle(&ngx, "/q/", &key, before.saturating_sub(30));
        let keys = mc.keys();
        assert_eq!(keys.len(), 1, "{keys:?}");
        assert_eq!(mc.get(&keys[0].0), Some(30 * (i as u64 + 1)), "after response {}", i + 1);
    }
    let fifth = ngx.get("/llm/", &key);
    assert_eq!(fifth.status, 429, "120 of 100 used: {fifth:?}");
    assert!(fifth.header("Retry-After").is_some(), "{fifth:?}");
    assert_eq!(mc.get(&mc.keys()[0].0), Some(120), "the rejected request charged");
    assert_eq!(ngx.get("/llm/", &[("X-Api-Key", "k2")]).status, 200);
    let log = ngx.error_log();
    assert!(trouble(&log, "m").is_empty(), "{:?}", trouble(&log, "m"));
}
