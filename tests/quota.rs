//! `rl_quota`: a location that reads its lines' budgets without charging
//! them. A budget spent in one location is read, exactly, from the quota
//! location, twice (nothing charged by the first read), on shared memory
//! and on Redis; the response fields are the lines'; inactive lines are
//! left out and dry-run lines marked; a Redis zone that is down answers
//! 503; other methods 405; `rl_metrics` does not count the reads.

mod common;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::time::Duration;

use common::redis::{Cluster, Redis};
use common::*;

/// The lines of the location, the same in `/api/` and `/quota`: a daily
/// budget of 10 per API key, a per-user line (inactive without `X-User`),
/// and a dry-run line. Day windows: a test does not cross one.
fn lines(zone: &str) -> String {
    format!(
        "rl_limit zone={zone} key=$http_x_api_key rate=10r/d burst=10 algorithm=fixed name=api;\n\
         rl_limit zone={zone} key=$http_x_user rate=5r/d burst=5 algorithm=fixed name=user;\n\
         rl_limit zone={zone} key=$http_x_api_key rate=100r/d burst=100 algorithm=fixed name=shadow dry_run;"
    )
}

fn conf(zones: &str, zone: &str) -> String {
    let l = lines(zone);
    server(
        zones,
        &format!(
            "rl_headers both;\n\
             location /api/ {{ {l} }}\n\
             location = /quota {{ rl_quota; {l} }}\n\
             location = /metrics {{ rl_metrics; }}"
        ),
    )
}

fn start(zones: &str, zone: &str) -> Nginx {
    Nginx::setup(&conf(zones, zone)).file("html/api/index.html", "ok\n").start()
}

/// A quota body as `name -> field -> value` (checked by Python's json:
/// the fields, their types, nothing else).
fn parse(body: &str) -> BTreeMap<String, BTreeMap<String, String>> {
    let script = "import json, sys\n\
                  d = json.load(sys.stdin)\n\
                  assert list(d) == ['lines'], d\n\
                  for l in d['lines']:\n\
                  \x20   assert set(l) - {'dry_run'} == {'name', 'zone', 'limit', 'remaining', 'reset', 'policy'}, l\n\
                  \x20   assert all(type(l[k]) is int for k in ('limit', 'remaining', 'reset')), l\n\
                  \x20   assert l.get('dry_run', True) is True, l\n\
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

/// Metrics text without the connection counters (a read may be the first
/// Redis call of a worker: it opens the worker's connection).
fn metrics(ngx: &Nginx) -> String {
    let r = ngx.get("/metrics", &[]);
    assert_eq!(r.status, 200, "{r:?}");
    r.body.lines().filter(|l| !l.starts_with("nginx_rl_redis_connects_total")).collect::<Vec<_>>().join("\n")
}

/// Spends 3 of key k1's 10 in `/api/`, reads `/quota` twice: 7 both times,
/// the same fields `/api/`'s last response sent; the `user` line (no
/// `X-User`) left out, `shadow` marked dry-run; an unused key reads its
/// full budget and is not charged by the read; no metric moves.
fn spend_then_read(ngx: &Nginx, zone: &str) {
    let k1 = [("X-Api-Key", "k1")];
    let mut last = None;
    for i in 0..3 {
        let r = ngx.get("/api/", &k1);
        assert_eq!(r.status, 200, "request {i}: {r:?}");
        last = Some(r);
    }
    let last = last.unwrap();
    assert_eq!(last.num("X-RateLimit-Remaining"), 7, "{last:?}");
    let before = metrics(ngx);
    for read in 0..2 {
        let r = ngx.get("/quota", &k1);
        assert_eq!(r.status, 200, "read {read}: {r:?}");
        assert_eq!(r.header("Content-Type"), Some("application/json"), "{r:?}");
        let q = parse(&r.body);
        assert_eq!(q.keys().collect::<Vec<_>>(), ["api", "shadow"], "read {read}: {}", r.body);
        assert_eq!(field(&q, "api", "zone"), zone);
        assert_eq!(field(&q, "api", "limit"), "10");
        assert_eq!(field(&q, "api", "remaining"), "7", "read {read}: {}", r.body);
        assert_eq!(field(&q, "api", "policy"), "q=10;w=86400");
        let reset: u64 = field(&q, "api", "reset").parse().unwrap();
        assert!((1..=86400).contains(&reset), "{}", r.body);
        assert_eq!(field(&q, "shadow", "remaining"), "97", "read {read}: {}", r.body);
        assert_eq!(field(&q, "shadow", "dry_run"), "True");
        assert!(!q["api"].contains_key("dry_run"), "{}", r.body);
        // The fields /api/ sent, but for the reset, which counts down.
        for h in ["X-RateLimit-Limit", "X-RateLimit-Remaining", "RateLimit-Policy"] {
            assert_eq!(r.header(h), last.header(h), "{h}: {r:?}");
        }
        assert_eq!(r.header("RateLimit"), Some(format!("\"api\";r=7;t={reset}").as_str()), "{r:?}");
        // (nginx's clock and ours may be a second apart)
        assert!(r.num("X-RateLimit-Reset").abs_diff(unix_now() + reset) <= 2, "{r:?}");
    }
    // An unused key: its full budget, and the read charged nothing.
    let k2 = [("X-Api-Key", "k2")];
    let q = parse(&ngx.get("/quota", &k2).body);
    assert_eq!((field(&q, "api", "remaining"), field(&q, "api", "reset")), ("10", "0"));
    assert_eq!(metrics(ngx), before, "quota reads are not counted");
    assert_eq!(ngx.get("/api/", &k2).num("X-RateLimit-Remaining"), 9);
    // Without a key every line is inactive.
    let r = ngx.get("/quota", &[]);
    assert_eq!((r.status, r.body.as_str()), (200, "{\"lines\":[]}\n"), "{r:?}");
    assert!(!r.has_header_prefix("X-RateLimit") && !r.has_header_prefix("RateLimit"), "{r:?}");
}

#[test]
fn shared_memory_budget_read_twice() {
    let ngx = start("rl_zone z size=1m;", "z");
    spend_then_read(&ngx, "z");
}

#[test]
fn redis_budget_read_twice() {
    let redis = Redis::start();
    let ngx = start(&format!("rl_zone r redis={} on_error=allow;", redis.url()), "r");
    spend_then_read(&ngx, "r");
    // The reads wrote nothing: k1's and k2's states, of the api and shadow lines.
    assert_eq!(redis.keys("*").len(), 4, "{:?}", redis.keys("*"));
}

/// nginx on `cluster`: `/api/` and `/quota` with a line per user (a budget
/// of `user` a day) and one per team (`team`), named so.
fn on_cluster(cluster: &Cluster, user: u32, team: u32) -> Nginx {
    let l = format!(
        "rl_limit zone=c key=$http_x_user rate={user}r/d burst={user} algorithm=fixed name=user;\n\
         rl_limit zone=c key=$http_x_team rate={team}r/d burst={team} algorithm=fixed name=team;"
    );
    let body = format!("location /api/ {{ {l} }}\nlocation = /quota {{ rl_quota; {l} }}");
    Nginx::setup(&server(&format!("rl_zone c redis={} timeout=1s;", cluster.url()), &body))
        .file("html/api/index.html", "ok\n")
        .start()
}

/// A Redis Cluster, a request of two lines on two keys (most likely two
/// slots: read slot by slot, checked only): what the requests left, twice,
/// and nothing written.
#[test]
fn cluster_two_slots_read_twice() {
    let cluster = Cluster::start(3);
    let ngx = on_cluster(&cluster, 5, 3);
    let who = [("X-User", "u1"), ("X-Team", "t1")];
    for _ in 0..2 {
        assert_eq!(ngx.get("/api/", &who).status, 200);
    }
    let keys = cluster.keys("rl:*");
    for read in 0..2 {
        let r = ngx.get("/quota", &who);
        assert_eq!(r.status, 200, "read {read}: {r:?}");
        let q = parse(&r.body);
        assert_eq!((field(&q, "user", "remaining"), field(&q, "team", "remaining")), ("3", "1"), "{}", r.body);
    }
    let r = ngx.get("/quota", &[("X-User", "u2"), ("X-Team", "t2")]);
    let q = parse(&r.body);
    assert_eq!((field(&q, "user", "remaining"), field(&q, "team", "remaining")), ("5", "3"), "{}", r.body);
    assert_eq!(cluster.keys("rl:*"), keys, "a read wrote nothing");
}

/// A Redis Cluster, concurrent requests of one user and one team (two
/// slots): each request is checked on both slots, then committed slot by
/// slot, so the team's commit can refuse a request whose user commit went
/// through (another request took the team's last unit in between). That
/// commit is taken back: the user's line is left charged with the admitted
/// requests only, as `rl_quota` reads it.
#[test]
fn cluster_two_slots_commit_refused_taken_back() {
    let cluster = Cluster::start(3);
    let ngx = on_cluster(&cluster, 100, 5);
    let who = [("X-User", "u1"), ("X-Team", "t1")];
    // Reads first, which write nothing: a worker's first calls on a fresh cluster find no
    // function and load the library on every master before calling again, inside the call's
    // deadline; a burst of first calls from both workers on a loaded machine has run past it
    // ("Redis ran the call past its deadline", the request let through per on_error).
    for _ in 0..8 {
        assert_eq!(ngx.get("/quota", &who).status, 200);
    }
    let rs = ngx.concurrent(60, "/api/", &who);
    assert_eq!(statuses(&rs), counts(&[(200, 5), (429, 55)]), "{rs:?}");
    // The undos run after the requests are answered: read until they landed.
    let until = std::time::Instant::now() + Duration::from_secs(10);
    let user = loop {
        let q = parse(&ngx.get("/quota", &who).body);
        let user = field(&q, "user", "remaining").to_string();
        assert_eq!(field(&q, "team", "remaining"), "0", "{q:?}");
        if user == "95" || std::time::Instant::now() > until {
            break user;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(user, "95", "the user's line charged by requests the team's commit refused");
    let log = ngx.error_log();
    assert!(crash_lines(&log).is_empty(), "{:?}", crash_lines(&log));
}

/// A Redis zone that is down: 503 with a JSON body, whatever `on_error`
/// says, logged with the zone's name; no rate-limit fields.
#[test]
fn redis_down_is_503() {
    let mut redis = Redis::start();
    let ngx = start(&format!("rl_zone r redis={} on_error=allow timeout=200ms;", redis.url()), "r");
    assert_eq!(ngx.get("/quota", &[("X-Api-Key", "k1")]).status, 200);
    redis.stop();
    let r = ngx.get("/quota", &[("X-Api-Key", "k1")]);
    assert_eq!(r.status, 503, "{r:?}");
    assert_eq!(r.header("Content-Type"), Some("application/json"), "{r:?}");
    assert!(r.body.starts_with("{\"error\":"), "{r:?}");
    assert!(!r.has_header_prefix("X-RateLimit") && !r.has_header_prefix("RateLimit"), "{r:?}");
    let log = ngx.error_log();
    assert!(
        log.lines().any(|l| l.contains("rl_zone \"r\" redis ") && l.contains("answering 503 to the quota read")),
        "{log}"
    );
    // /api/ still follows on_error=allow.
    assert_eq!(ngx.get("/api/", &[("X-Api-Key", "k1")]).status, 200);
}

/// POST is 405; HEAD has the fields and no body.
#[test]
fn other_methods_get_405() {
    let ngx = start("rl_zone z size=1m;", "z");
    let exchange = |req: &[u8]| {
        let mut s = TcpStream::connect((Ipv4Addr::LOCALHOST, ngx.port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(req).unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    };
    let out = exchange(
        b"POST /quota HTTP/1.1\r\nHost: x\r\nX-Api-Key: k1\r\nContent-Length: 2\r\nConnection: close\r\n\r\nab",
    );
    assert!(out.starts_with("HTTP/1.1 405"), "{out}");
    let out = exchange(b"HEAD /quota HTTP/1.1\r\nHost: x\r\nX-Api-Key: k1\r\nConnection: close\r\n\r\n");
    assert!(out.starts_with("HTTP/1.1 200") && out.contains("Content-Type: application/json"), "{out}");
    assert!(out.contains("X-RateLimit-Remaining: 10\r\n") && out.ends_with("\r\n\r\n"), "{out}");
    assert_eq!(ngx.get("/api/", &[("X-Api-Key", "k1")]).num("X-RateLimit-Remaining"), 9);
}

/// A line that admits a request it is not charged for (another line
/// rejects it; `charge=after` before its charge) is full: the response says
/// it resets in 0, as `rl_quota` says of the same state, in `RateLimit`'s
/// `t`, `X-RateLimit-Reset` (now) and `$rl_reset`. Before, the fields said
/// the time to full the charge would have left (`t=98` here, the default
/// `sliding` counting the unit until the end of the next window).
#[test]
fn uncharged_full_line_resets_in_zero_as_quota_says() {
    let two = "rl_limit zone=z key=$http_x_k rate=10r/m burst=10 name=wide;\n\
               rl_limit zone=z key=$http_x_n rate=1r/m burst=1 name=narrow;";
    let late = "rl_limit zone=z key=$http_x_k rate=10r/m burst=10 name=late cost=$http_x_cost charge=after;";
    let body = format!(
        "rl_headers both;\n\
         location = /two.html {{ {two} }}\n\
         location = /two-quota {{ rl_quota; {two} }}\n\
         location = /late.html {{ {late} add_header X-Reset $rl_reset always; }}\n\
         location = /late-quota {{ rl_quota; {late} }}"
    );
    let ngx = Nginx::setup(&server("rl_zone z size=1m;", &body))
        .file("html/two.html", "two\n")
        .file("html/late.html", "late\n")
        .start();
    // `narrow` spent by a first key of `wide`; then a fresh key of `wide` is rejected by it.
    assert_eq!(ngx.get("/two.html", &[("X-K", "w1"), ("X-N", "n")]).status, 200);
    let who = [("X-K", "w2"), ("X-N", "n")];
    let r = ngx.get("/two.html", &who);
    assert_eq!(r.status, 429, "{r:?}");
    assert_eq!((sf_param(&r, "RateLimit", "wide", "r"), sf_param(&r, "RateLimit", "wide", "t")), (10, 0), "{r:?}");
    let q = parse(&ngx.get("/two-quota", &who).body);
    assert_eq!((field(&q, "wide", "remaining"), field(&q, "wide", "reset")), ("10", "0"), "{q:?}");

    // charge=after, no cost sent: admitted, nothing charged, now or later.
    let k = [("X-K", "fresh")];
    let now = unix_now();
    let r = ngx.get("/late.html", &k);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!((sf_param(&r, "RateLimit", "late", "r"), sf_param(&r, "RateLimit", "late", "t")), (10, 0), "{r:?}");
    assert_eq!(r.num("X-RateLimit-Remaining"), 10, "{r:?}");
    assert!((now..=now + 1).contains(&r.num("X-RateLimit-Reset")), "{r:?}");
    assert_eq!(r.header("X-Reset"), Some("0"), "{r:?}");
    let q = parse(&ngx.get("/late-quota", &k).body);
    assert_eq!((field(&q, "late", "remaining"), field(&q, "late", "reset")), ("10", "0"), "{q:?}");
}

/// `t` of `RateLimit` is the wait for one more unit ("the time until
/// additional quota is made available"), `X-RateLimit-Reset` and
/// `rl_quota`'s `reset` the time until the line is full: three units taken
/// of 10 a minute come back one every 6 s, all of them in 18 s (the
/// buckets, `gcra`); a minute after they were taken, all at once
/// (`sliding_log`, whose window is a minute). On a line
/// that admits a request it is not charged for (another line rejects it),
/// the same numbers: what its state has left. Before, `t` was the time to
/// full (18), and the uncharged line's that of the state the charge would
/// have left (24).
fn t_is_the_next_unit(zones: &str) {
    let algs = ["token_bucket", "leaky_bucket", "gcra", "sliding_log"];
    // (t, reset) after three units
    let waits = |alg: &str| if alg == "sliding_log" { (60, 60) } else { (6, 18) };
    let mut body = String::from("rl_headers both;\n");
    for alg in algs {
        let one = format!("rl_limit zone=z key=$http_x_k rate=10r/m burst=10 algorithm={alg} name={alg};");
        let two = format!("{one}\nrl_limit zone=z key=$http_x_n rate=1r/m burst=1 algorithm=fixed name=narrow;");
        body += &format!(
            "location = /{alg}.html {{ {one} }}\n\
             location = /{alg}-quota {{ rl_quota; {one} }}\n\
             location = /{alg}-two.html {{ {two} }}\n"
        );
    }
    let mut ngx = Nginx::setup(&server(zones, &body));
    for alg in algs {
        ngx = ngx.file(&format!("html/{alg}.html"), "one\n").file(&format!("html/{alg}-two.html"), "two\n");
    }
    let ngx = ngx.start();
    for alg in algs {
        let k = [("X-K", "k")];
        // narrow's spent key and its 429 in one minute
        clear_of_window_end(60, 3);
        let now = unix_now();
        for _ in 0..2 {
            assert_eq!(ngx.get(&format!("/{alg}.html"), &k).status, 200, "{alg}");
        }
        let (t, reset) = waits(alg);
        let r = ngx.get(&format!("/{alg}.html"), &k);
        assert_eq!(r.status, 200, "{alg}: {r:?}");
        assert_eq!((sf_param(&r, "RateLimit", alg, "r"), sf_param(&r, "RateLimit", alg, "t")), (7, t), "{alg}: {r:?}");
        assert!((now + reset - 1..=now + reset + 1).contains(&r.num("X-RateLimit-Reset")), "{alg}: {r:?}");
        let q = parse(&ngx.get(&format!("/{alg}-quota"), &k).body);
        let reset = reset.to_string();
        assert_eq!((field(&q, alg, "remaining"), field(&q, alg, "reset")), ("7", reset.as_str()), "{alg}: {q:?}");

        // The same budget with a second line that a spent key rejects: not charged, what is left.
        // (narrow's state is one for every location: its keys are the algorithm's own)
        let spent = format!("{alg}-spent");
        let w = [("X-K", "w"), ("X-N", spent.as_str())];
        for n in [format!("{alg}-a"), format!("{alg}-b"), spent.clone()] {
            let r = ngx.get(&format!("/{alg}-two.html"), &[("X-K", "w"), ("X-N", n.as_str())]);
            assert_eq!(r.status, 200, "{alg}: {r:?}");
        }
        let r = ngx.get(&format!("/{alg}-two.html"), &w);
        assert_eq!(r.status, 429, "{alg}: {r:?}");
        assert_eq!((sf_param(&r, "RateLimit", alg, "r"), sf_param(&r, "RateLimit", alg, "t")), (7, t), "{alg}: {r:?}");
        let q = parse(&ngx.get(&format!("/{alg}-quota"), &w).body);
        assert_eq!((field(&q, alg, "remaining"), field(&q, alg, "reset")), ("7", reset.as_str()), "{alg}: {q:?}");
    }
}

#[test]
fn t_is_the_next_unit_shm() {
    t_is_the_next_unit("rl_zone z size=1m;");
}

#[test]
fn t_is_the_next_unit_redis() {
    let redis = Redis::start();
    t_is_the_next_unit(&format!("rl_zone z redis={} timeout=1s;", redis.url()));
}
