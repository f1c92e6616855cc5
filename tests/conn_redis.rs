//! `rl_conn` on a Redis zone: requests in flight per key across every
//! nginx that shares the zone's Redis, each worker's units a field of the
//! key's hash, renewed by its heartbeat (every second), and given back
//! (reclaimed) once a killed nginx's fields lapse.
//!
//! Requests hold their slots as in conn.rs: a file sent at 1 byte a second
//! after its first kilobyte, its status line read at once.

mod common;

use std::collections::BTreeMap;
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use common::held::*;
use common::redis::Redis;
use common::*;

fn conf(redis: &Redis, max: u64) -> String {
    format!(
        "rl_zone r redis={} timeout=500ms;\n\
         server {{ listen 127.0.0.1:{{PORT}}; root {{ROOT}};\n\
           rl_headers draft;\n\
           location /slow/ {{ rl_conn zone=r max={max} key=$arg_k; {SLOW} }}\n\
           location = /fast.html {{ rl_conn zone=r max={max} key=$arg_k; }}\n\
           location = /metrics {{ rl_metrics; }}\n\
         }}",
        redis.url()
    )
}

fn start(conf: &str) -> Nginx {
    Nginx::setup(conf).file("html/slow/big.html", &slow_file()).file("html/fast.html", "fast\n").start()
}

/// [`hold`]s `path` on `ngx` once a slot is free, within `within`: how long
/// it took.
fn hold_within(ngx: &Nginx, path: &str, within: Duration, what: &str) -> (TcpStream, Duration) {
    let start = Instant::now();
    loop {
        let (status, s) = hold(ngx, path);
        if status == 200 {
            return (s, start.elapsed());
        }
        assert!(start.elapsed() < within, "{what}: no slot within {within:?} (last {status}):\n{}", ngx.error_log());
        thread::sleep(Duration::from_millis(50));
    }
}

/// The key's fields in Redis (worker → "count gen deadline set").
fn fields(redis: &Redis) -> BTreeMap<String, String> {
    let keys = redis.keys("*");
    assert!(keys.len() <= 1, "one key at most: {keys:?}");
    let Some(key) = keys.first() else { return BTreeMap::new() };
    let out = redis.cli(&["HGETALL", key]);
    let words: Vec<&str> = out.lines().collect();
    words.chunks(2).filter_map(|p| Some((p.first()?.to_string(), p.get(1)?.to_string()))).collect()
}

/// The units the key's fields hold.
fn held_in_redis(redis: &Redis) -> u64 {
    fields(redis).values().filter_map(|v| v.split(' ').next()?.parse::<u64>().ok()).sum()
}

/// A metric's value for zone `r`.
fn metric(ngx: &Nginx, name: &str) -> u64 {
    let m = ngx.get("/metrics", &[]).body;
    m.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}{{zone=\"r\"}} ")))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name}:\n{m}"))
}

/// Two nginx of two workers each share `max=3`: of 8 requests held at
/// once, 3 pass whichever nginx they reach, the others are refused with
/// the location's status and `limit_conn`'s log line; Redis holds the 3
/// units in one field per worker that holds some. Once they end, their
/// units are given back and the key's fields go.
#[test]
fn exact_across_nginx() {
    let redis = Redis::start();
    let c = conf(&redis, 3);
    let nginx = [start(&c), start(&c)];
    let held: Vec<(u16, TcpStream)> = (0..8).map(|i| hold(&nginx[i % 2], "/slow/big.html?k=a")).collect();
    let passed = held.iter().filter(|(s, _)| *s == 200).count();
    let refused = held.iter().filter(|(s, _)| *s == 429).count();
    assert_eq!((passed, refused), (3, 5), "{:?}", held.iter().map(|(s, _)| s).collect::<Vec<_>>());
    assert_eq!(held_in_redis(&redis), 3, "{:?}", fields(&redis));
    for (i, n) in nginx.iter().enumerate() {
        let log = n.error_log();
        assert!(
            log.lines().any(|l| l.contains("[error]") && l.contains("limiting connections by zone \"r\", client: ")),
            "nginx {i}: {log}"
        );
        assert!(crash_lines(&log).is_empty(), "{:?}", crash_lines(&log));
    }
    let r = nginx[0].get("/fast.html?k=a", &[]);
    assert_eq!(r.status, 429);
    assert_eq!(r.header("RateLimit"), Some("\"r\";r=0"));
    assert_eq!(nginx[1].get("/fast.html?k=b", &[]).status, 200, "another key");
    let in_flight: u64 = nginx.iter().map(|n| metric(n, "nginx_rl_conn_in_flight")).sum();
    assert_eq!(in_flight, 3, "the units the nginx hold, each its own");
    drop(held);
    // (a closed client's request ends when nginx next writes to it: within a second)
    let deadline = Instant::now() + Duration::from_secs(10);
    while !fields(&redis).is_empty() {
        assert!(Instant::now() < deadline, "not given back: {:?}", fields(&redis));
        thread::sleep(Duration::from_millis(50));
    }
    assert!(redis.keys("*").is_empty(), "{:?}", redis.keys("*"));
    let _again: Vec<TcpStream> =
        (0..3).map(|i| hold_within(&nginx[i % 2], "/slow/big.html?k=a", Duration::from_secs(2), "again").0).collect();
    assert_eq!(nginx[1].get("/fast.html?k=a", &[]).status, 429);
}

/// An nginx killed (SIGKILL) holding both slots of `max=2`: its fields are
/// no longer renewed, and the other nginx gets the slots back once they
/// lapse (3 heartbeats and the zone's timeout: 3.5 s), counted in its
/// `nginx_rl_conn_reclaimed_total`; not before they lapse.
#[test]
fn a_killed_nginx_slots_come_back() {
    let redis = Redis::start();
    let c = conf(&redis, 2);
    let (a, b) = (start(&c), start(&c));
    let held: Vec<(u16, TcpStream)> = (0..2).map(|_| hold(&a, "/slow/big.html?k=a")).collect();
    assert!(held.iter().all(|(s, _)| *s == 200));
    assert_eq!(b.get("/fast.html?k=a", &[]).status, 429);
    kill_nginx(&a);
    drop(held);
    let killed = Instant::now();
    assert_eq!(b.get("/fast.html?k=a", &[]).status, 429, "the killed nginx's fields live until they lapse");
    let (_s, _) = hold_within(&b, "/slow/big.html?k=a", Duration::from_secs(8), "the killed nginx's slots");
    let took = killed.elapsed();
    assert!(took >= Duration::from_millis(2500), "reclaimed after {took:?}, before the fields lapsed");
    assert!(took <= Duration::from_millis(5000), "reclaimed after {took:?}");
    // (the two fields lapse a millisecond or so apart: the second may be reclaimed by the next call)
    let (_t, _) = hold_within(&b, "/slow/big.html?k=a", Duration::from_secs(1), "the second slot");
    assert_eq!(b.get("/fast.html?k=a", &[]).status, 429);
    assert_eq!(held_in_redis(&redis), 2, "{:?}", fields(&redis));
    assert_eq!(metric(&b, "nginx_rl_conn_reclaimed_total"), 2);
}

/// A request in flight longer than a field's life keeps its slot: its
/// worker's heartbeat renews the field while the request lasts.
#[test]
fn a_long_request_keeps_its_slot() {
    let redis = Redis::start();
    let c = conf(&redis, 1);
    let (a, b) = (start(&c), start(&c));
    let (status, _held) = hold(&a, "/slow/big.html?k=a");
    assert_eq!(status, 200);
    let until = Instant::now() + Duration::from_secs(6);
    while Instant::now() < until {
        assert_eq!(b.get("/fast.html?k=a", &[]).status, 429, "the slot was taken from a request in flight");
        thread::sleep(Duration::from_millis(250));
    }
    assert_eq!(held_in_redis(&redis), 1);
    assert_eq!(metric(&b, "nginx_rl_conn_reclaimed_total"), 0);
}

/// What Redis holds for a worker is set right by its next heartbeat (as a
/// give-back lost on the way would be): a field raised by hand refuses a
/// request it should not, until the worker's heartbeat sets it back to the
/// one unit the worker holds, within 2 s.
#[test]
fn a_heartbeat_sets_the_count_right() {
    let redis = Redis::start();
    let ngx = start(&conf(&redis, 2));
    let (status, _held) = hold(&ngx, "/slow/big.html?k=a");
    assert_eq!(status, 200);
    // (a heartbeat between the write and the request sets the count right before the request
    // sees it: raised again, up to 5 times)
    let raised = (0..5).any(|_| {
        let f = fields(&redis);
        let (worker, value) = f.iter().next().expect("a field");
        let words: Vec<&str> = value.split(' ').collect();
        assert_eq!(words.len(), 4, "{value}");
        assert_eq!(words[0], "1");
        let raised = format!("2 {} {} {}", words[1], words[2], words[3]);
        let key = redis.keys("*").remove(0);
        redis.cli(&["HSET", &key, worker, &raised]);
        ngx.get("/fast.html?k=a", &[]).status == 429
    });
    assert!(raised, "Redis never counted 2 held: {:?}", fields(&redis));
    let start = Instant::now();
    loop {
        if ngx.get("/fast.html?k=a", &[]).status == 200 {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(3), "never set right: {:?}", fields(&redis));
        thread::sleep(Duration::from_millis(50));
    }
    // (the passing request's own unit, given back once it ended)
    let deadline = Instant::now() + Duration::from_secs(2);
    while held_in_redis(&redis) != 1 {
        assert!(Instant::now() < deadline, "{:?}", fields(&redis));
        thread::sleep(Duration::from_millis(20));
    }
}

/// A reload keeps the old workers' requests in flight counted (their
/// fields renewed while they drain, beyond a field's life), and gives them
/// back when they end; nothing is reclaimed.
#[test]
fn a_reload_keeps_requests_in_flight() {
    let redis = Redis::start();
    let ngx = start(&conf(&redis, 1));
    let (status, mut held) = hold(&ngx, "/slow/big.html?k=a");
    assert_eq!(status, 200);
    let old = ngx.worker_pids();
    ngx.reload_started();
    let until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < until {
        assert_eq!(ngx.get("/fast.html?k=a", &[]).status, 429, "the old worker's request holds its slot");
        thread::sleep(Duration::from_millis(250));
    }
    assert!(old.iter().any(|p| ngx.worker_pids().contains(p)), "the old worker drains");
    // The held request's client reads a little, then leaves: the old worker ends it and exits.
    let mut buf = [0u8; 64];
    let _ = std::io::Read::read(&mut held, &mut buf);
    drop(held);
    let (_s, _) = hold_within(&ngx, "/slow/big.html?k=a", Duration::from_secs(5), "the old worker's slot");
    assert_eq!(metric(&ngx, "nginx_rl_conn_reclaimed_total"), 0);
    assert!(crash_lines(&ngx.error_log()).is_empty(), "{}", ngx.error_log());
}

/// A request held as [`hold`] holds it, and its response's head: its
/// status and fields (no body).
fn hold_head(ngx: &Nginx, path: &str) -> (Response, TcpStream) {
    use std::io::BufRead;
    let s = send_only(ngx.port, path);
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut reader = std::io::BufReader::new(s.try_clone().unwrap());
    let mut head = Vec::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap_or_else(|e| panic!("no head for {path}: {e}"));
        if line.trim().is_empty() {
            break;
        }
        head.push(line.trim_end().to_string());
    }
    let status = head.first().and_then(|l| l.split(' ').nth(1)?.parse().ok()).unwrap_or(0);
    let headers = head
        .iter()
        .skip(1)
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    (Response { status, headers, body: String::new() }, s)
}

/// `nghttp` (Debian's nghttp2-client) on `urls`, all on one HTTP/2
/// connection, each request given up after `timeout`: started, not waited
/// for (what it says on its standard error, a timeout, is not shown).
fn nghttp(urls: &[String], timeout: &str) -> Child {
    Command::new("nghttp")
        .args(["-n", "-v", &format!("--timeout={timeout}")])
        .args(urls)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("nghttp (Debian's nghttp2-client)")
}

/// The `:status` of each response `nghttp -v` printed, sorted, once it
/// has exited (killed after 15 s: its timeout is a read's, which a slow
/// stream's bytes could keep putting off).
fn h2_statuses(mut child: Child) -> (Vec<String>, String) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while child.try_wait().unwrap().is_none() && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut statuses: Vec<String> =
        text.lines().filter_map(|l| Some(l.split(":status: ").nth(1)?.to_string())).collect();
    statuses.sort();
    (statuses, text)
}

/// Each HTTP/2 stream is a request of its own on a Redis zone too: two
/// streams of one connection (`nghttp`, which sends every URI on one) take
/// two slots, and with `max=1` one is refused with the location's status
/// (`rl_status 503`) while Redis holds the other's unit. When the
/// connection ends (nghttp gives up), the held stream ends and its unit is
/// given back: the key's fields go, and a next stream passes.
#[test]
fn each_http2_stream_counts_on_redis() {
    let redis = Redis::start();
    let ngx = start(&format!(
        "rl_zone r redis={} timeout=500ms;\n\
         server {{ listen 127.0.0.1:{{PORT}} http2; root {{ROOT}};\n\
           rl_status 503;\n\
           location /slow/ {{ rl_conn zone=r max=1 key=$arg_k; {SLOW} }}\n\
         }}",
        redis.url()
    ));
    let url = |q: &str| format!("http://127.0.0.1:{}/slow/big.html?k=a&n={q}", ngx.port);
    let client = nghttp(&[url("1"), url("2")], "3");
    // (while nghttp waits for the held stream's body)
    let deadline = Instant::now() + Duration::from_secs(2);
    while held_in_redis(&redis) != 1 {
        assert!(Instant::now() < deadline, "not the one unit of the stream let in: {:?}", fields(&redis));
        thread::sleep(Duration::from_millis(20));
    }
    let (statuses, text) = h2_statuses(client);
    assert_eq!(statuses, ["200", "503"], "{text}\n{}", ngx.error_log());
    let log = ngx.error_log();
    assert!(
        log.lines().any(|l| l.contains("[error]") && l.contains("limiting connections by zone \"r\", client: ")),
        "{log}"
    );
    // (nghttp gave up and closed the connection: its streams end with it)
    let deadline = Instant::now() + Duration::from_secs(5);
    while !fields(&redis).is_empty() {
        assert!(Instant::now() < deadline, "not given back: {:?}\n{}", fields(&redis), ngx.error_log());
        thread::sleep(Duration::from_millis(50));
    }
    let (statuses, text) = h2_statuses(nghttp(&[url("3")], "1"));
    assert_eq!(statuses, ["200"], "the slot is free again: {text}");
    assert!(crash_lines(&ngx.error_log()).is_empty(), "{}", ngx.error_log());
}

/// Response fields of a Redis `rl_conn` line (`name=c max=2`), as for
/// shared memory: `RateLimit-Policy` gives the quota and draft 11's quota
/// unit, and `RateLimit`'s remaining counts the units held across the
/// fleet: each request in flight of either nginx, its own included (no
/// `t`, no `Retry-After`: when a request ends is not known).
#[test]
fn rate_limit_policy_on_redis() {
    let redis = Redis::start();
    let c = format!(
        "rl_zone r redis={} timeout=500ms;\n\
         server {{ listen 127.0.0.1:{{PORT}}; root {{ROOT}};\n\
           rl_headers draft;\n\
           location /slow/ {{ rl_conn zone=r max=2 key=$arg_k name=c; {SLOW} }}\n\
           location = /fast.html {{ rl_conn zone=r max=2 key=$arg_k name=c; }}\n\
         }}",
        redis.url()
    );
    let (a, b) = (start(&c), start(&c));
    let policy = Some("\"c\";q=2;qu=\"concurrent-requests\"");
    let (first, held_a) = hold_head(&a, "/slow/big.html?k=a");
    assert_eq!(first.status, 200);
    assert_eq!(first.header("RateLimit-Policy"), policy, "{first:?}");
    assert_eq!(first.header("RateLimit"), Some("\"c\";r=1"), "its own unit held: {first:?}");
    let (second, held_b) = hold_head(&b, "/slow/big.html?k=a");
    assert_eq!(second.status, 200);
    assert_eq!(second.header("RateLimit-Policy"), policy, "{second:?}");
    assert_eq!(second.header("RateLimit"), Some("\"c\";r=0"), "the other nginx's request counted: {second:?}");
    let from = a.error_log().len();
    let r = a.get("/fast.html?k=a", &[]);
    assert_eq!(r.status, 429, "a third request in flight");
    assert_eq!(r.header("RateLimit-Policy"), policy);
    assert_eq!(r.header("RateLimit"), Some("\"c\";r=0"));
    assert_eq!(r.header("Retry-After"), None, "no one knows when a request in flight ends");
    let log = a.error_log_since(from);
    assert!(
        log.lines().any(|l| l.contains("[error]") && l.contains("limiting connections by zone \"r\", client: ")),
        "{log}"
    );
    // One ends (on the other nginx): a request passes beside the one still held, and leaves none.
    drop(held_b);
    let deadline = Instant::now() + Duration::from_secs(10);
    let r = loop {
        let r = a.get("/fast.html?k=a", &[]);
        if r.status == 200 {
            break r;
        }
        assert!(Instant::now() < deadline, "b's unit never given back: {:?}", fields(&redis));
        thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(r.header("RateLimit"), Some("\"c\";r=0"), "held by a's request and its own: {r:?}");
    // Both end: a lone request leaves one.
    drop(held_a);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !fields(&redis).is_empty() {
        assert!(Instant::now() < deadline, "not given back: {:?}", fields(&redis));
        thread::sleep(Duration::from_millis(50));
    }
    let r = b.get("/fast.html?k=a", &[]);
    assert_eq!((r.status, r.header("RateLimit")), (200, Some("\"c\";r=1")), "{r:?}");
    assert_eq!(r.header("RateLimit-Policy"), policy);
}

/// What a Redis zone cannot do for `rl_conn` yet is refused by `nginx -t`,
/// saying what to use.
#[test]
fn nginx_t_refuses_what_redis_zones_cannot_keep() {
    let zone = "rl_zone r redis=redis://127.0.0.1:1;";
    let (ok, out) =
        nginx_t(&server(zone, "location / { rl_conn zone=r max=2 priority=$arg_p classes=a:reserve=1,b; }"));
    assert!(ok, "classes on a Redis zone: {out}");
    // One waiting line per Redis zone and location (a look is one call of the zone's, all or
    // nothing); another zone's may wait beside it.
    let (ok, out) = nginx_t(&server(
        zone,
        "location / { rl_conn zone=r max=2 queue=5; rl_conn zone=r max=1 key=$arg_k queue=1 timeout=5s; }",
    ));
    assert!(!ok, "{out}");
    assert!(
        out.contains(
            "Redis zone \"r\" can keep one waiting line (\"queue=\") per location, a second in \"rl_conn\" directive in"
        ),
        "{out}"
    );
    let (ok, out) = nginx_t(&server(
        &format!("{zone} rl_zone s redis=redis://127.0.0.1:1; rl_zone c size=1m;"),
        "location / { rl_conn zone=r max=2 queue=5; rl_conn zone=s max=1 queue=1 timeout=5s; \
         rl_conn zone=c max=1 queue=1; }",
    ));
    assert!(ok, "{out}");
    let (ok, out) =
        nginx_t(&server("rl_zone r redis=redis://127.0.0.1:1 lease=1m;", "location / { rl_conn zone=r max=2; }"));
    assert!(!ok, "{out}");
    assert!(
        out.contains(
            "zone \"r\" has \"lease\", whose leases cannot hold requests in flight, in \"rl_conn\" directive in"
        ),
        "{out}"
    );
    let (ok, out) = nginx_t(&server(zone, "location / { rl_conn zone=r max=2 key=$remote_addr; }"));
    assert!(ok, "{out}");
}

/// On a Redis Cluster: keys in different slots each count their own
/// requests across two nginx (each key's take in its slot's call), and are
/// given back.
#[test]
fn on_a_cluster() {
    let cluster = common::redis::Cluster::start(3);
    let c = format!(
        "rl_zone r redis={} timeout=1s;\n\
         server {{ listen 127.0.0.1:{{PORT}}; root {{ROOT}};\n\
           location /slow/ {{ rl_conn zone=r max=2 key=$arg_k; {SLOW} }}\n\
         }}",
        cluster.url()
    );
    let nginx = [start(&c), start(&c)];
    let keys = ["a", "b", "c", "d", "e", "f"];
    let mut held = Vec::new();
    for k in keys {
        let got: Vec<(u16, TcpStream)> =
            (0..4).map(|i| hold(&nginx[i % 2], &format!("/slow/big.html?k={k}"))).collect();
        let statuses: Vec<u16> = got.iter().map(|(s, _)| *s).collect();
        assert_eq!(statuses.iter().filter(|&&s| s == 200).count(), 2, "key {k}: {statuses:?}");
        assert_eq!(statuses.iter().filter(|&&s| s == 429).count(), 2, "key {k}: {statuses:?}");
        held.extend(got);
    }
    let stored = cluster.keys("*");
    assert_eq!(stored.len(), keys.len(), "{stored:?}");
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cluster.keys("*").is_empty() {
        assert!(Instant::now() < deadline, "not given back: {:?}", cluster.keys("*"));
        thread::sleep(Duration::from_millis(50));
    }
    for n in &nginx {
        assert!(crash_lines(&n.error_log()).is_empty(), "{}", n.error_log());
    }
}

/// Redis down: `on_error=allow` lets the requests through, holding
/// nothing, and `on_error=deny` refuses them; neither leaves anything
/// counted, so once Redis is back the key's slots are all free.
#[test]
fn redis_down_per_on_error() {
    let mut redis = Redis::start();
    let block = |on_error: &str| {
        format!(
            "rl_zone r redis={} timeout=200ms on_error={on_error};\n\
             server {{ listen 127.0.0.1:{{PORT}}; root {{ROOT}};\n\
               location /slow/ {{ rl_conn zone=r max=1 key=$arg_k; {SLOW} }}\n\
               location = /fast.html {{ rl_conn zone=r max=1 key=$arg_k; }}\n\
               location = /metrics {{ rl_metrics; }}\n\
             }}",
            redis.url()
        )
    };
    let (allow, deny) = (start(&block("allow")), start(&block("deny")));
    assert_eq!(allow.get("/fast.html?k=a", &[]).status, 200, "Redis up");
    redis.stop();
    let (a1, _h1) = hold(&allow, "/slow/big.html?k=a");
    let (a2, _h2) = hold(&allow, "/slow/big.html?k=a");
    assert_eq!((a1, a2), (200, 200), "on_error=allow lets them through");
    assert_eq!(deny.get("/fast.html?k=a", &[]).status, 429, "on_error=deny refuses");
    assert_eq!(metric(&allow, "nginx_rl_conn_in_flight"), 0, "requests let through hold nothing");
    assert_eq!(metric(&deny, "nginx_rl_conn_in_flight"), 0);
    redis.restart();
    for n in [&allow, &deny] {
        // (held once Redis decides again: the zone reconnects after a back-off, letting
        // requests through meanwhile with on_error=allow)
        let deadline = Instant::now() + Duration::from_secs(5);
        let _held = loop {
            let (status, s) = hold(n, "/slow/big.html?k=a");
            if status == 200 && held_in_redis(&redis) == 1 {
                break s;
            }
            drop(s);
            assert!(Instant::now() < deadline, "Redis never decided again:\n{}", n.error_log());
            thread::sleep(Duration::from_millis(100));
        };
        assert_eq!(n.get("/fast.html?k=a", &[]).status, 429, "one held, once Redis is back");
        let log = n.error_log();
        assert!(!failed_lines(&log, "r").is_empty(), "{log}");
        assert!(crash_lines(&log).is_empty(), "{:?}", crash_lines(&log));
    }
}

/// A Redis user with the README's least-privilege ACL and what `rl_conn`
/// adds to it (each key's holders, a hash): slots are taken, given back by
/// the requests' end and kept by the heartbeat; no call fails.
#[test]
fn least_privilege_acl_user() {
    let redis = Redis::start();
    let acl = "on >acl-pw ~rl:* +fcall +function|load +evalsha +eval +time +mget +get +set +setrange +del +llen \
               +lindex +lpush +ltrim +lrem +pexpire +select +hgetall +hset +hdel +pttl";
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let flat = readme.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        flat.contains("and a zone with `rl_conn` lines `+hgetall +hset +hdel +pttl`"),
        "the README's ACL for rl_conn"
    );
    let mut args = vec!["ACL", "SETUSER", "nginx"];
    args.extend(acl.split_whitespace());
    assert_eq!(redis.cli(&args), "OK");
    let ngx = start(&format!(
        "rl_zone r redis=redis://nginx:acl-pw@127.0.0.1:{}/1 timeout=1s;\n\
         server {{ listen 127.0.0.1:{{PORT}}; root {{ROOT}};\n\
           location /slow/ {{ rl_conn zone=r max=1 key=$arg_k; {SLOW} }}\n\
           location = /fast.html {{ rl_conn zone=r max=1 key=$arg_k; }}\n\
         }}",
        redis.port
    ));
    assert_eq!(ngx.get("/fast.html?k=a", &[]).status, 200);
    // (that request's give-back goes in a call of its own, which the next request's take may
    // overtake: the slot is free within a round trip)
    let (_held, _) = hold_within(&ngx, "/slow/big.html?k=a", Duration::from_secs(2), "the slot given back");
    assert_eq!(ngx.get("/fast.html?k=a", &[]).status, 429);
    // (two heartbeats)
    thread::sleep(Duration::from_millis(2200));
    assert_eq!(ngx.get("/fast.html?k=a", &[]).status, 429);
    let log = ngx.error_log();
    assert!(failed_lines(&log, "r").is_empty(), "{:?}", failed_lines(&log, "r"));
}

/// `rl_quota` reads a Redis `rl_conn` line without taking anything: what
/// is left of `max` across the fleet, and after the reads the same.
#[test]
fn rl_quota_reads_what_is_left() {
    let redis = Redis::start();
    let c = format!(
        "rl_zone r redis={} timeout=1s;\n\
         server {{ listen 127.0.0.1:{{PORT}}; root {{ROOT}};\n\
           location /slow/ {{ rl_conn zone=r max=3 key=$arg_k; {SLOW} }}\n\
           location = /quota {{ rl_quota; rl_conn zone=r max=3 key=$arg_k; }}\n\
         }}",
        redis.url()
    );
    let (a, b) = (start(&c), start(&c));
    let remaining = |n: &Nginx| {
        let body = n.get("/quota?k=a", &[]).body;
        body.split("\"remaining\":")
            .nth(1)
            .and_then(|v| v.split(',').next()?.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("{body}"))
    };
    assert_eq!(remaining(&a), 3);
    let held: Vec<(u16, TcpStream)> = (0..2).map(|_| hold(&a, "/slow/big.html?k=a")).collect();
    assert!(held.iter().all(|(s, _)| *s == 200));
    assert_eq!((remaining(&a), remaining(&b)), (1, 1), "the fleet's count, from either nginx");
    for _ in 0..5 {
        assert_eq!(remaining(&b), 1, "a read takes nothing");
    }
    let (status, _third) = hold(&b, "/slow/big.html?k=a");
    assert_eq!(status, 200);
    assert_eq!(remaining(&a), 0);
}

/// Redis restarted empty while a request holds its slot: once the
/// holding worker has opened a connection to the new Redis (at its next
/// call), its heartbeat sets its field again at once, not at its next beat
/// (up to a second later). Three times, so that a beat that happens to
/// come soon does not pass for it.
#[test]
fn a_new_connection_is_told_what_is_held_at_once() {
    let mut redis = Redis::start();
    let ngx = start(&format!(
        "rl_zone r redis={} timeout=500ms;\n\
         server {{ listen 127.0.0.1:{{PORT}}; root {{ROOT}};\n\
           add_header X-Pid $pid always;\n\
           location /slow/ {{ rl_conn zone=r max=1 key=$arg_k; {SLOW} }}\n\
           location = /fast.html {{ rl_conn zone=r max=1 key=$arg_k; }}\n\
         }}",
        redis.url()
    ));
    let held = send_only(ngx.port, "/slow/big.html?k=a");
    held.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut reader = std::io::BufReader::new(held.try_clone().unwrap());
    let mut pid = String::new();
    loop {
        let mut line = String::new();
        std::io::BufRead::read_line(&mut reader, &mut line).unwrap();
        if let Some(p) = line.strip_prefix("X-Pid: ") {
            pid = p.trim().to_string();
        }
        if line.trim().is_empty() {
            break;
        }
    }
    assert!(!pid.is_empty(), "the holding worker");
    for round in 0..3 {
        // (a connection that dies within a second of opening counts as a failing server, and
        // the next waits out a back-off: each round's lives longer)
        thread::sleep(Duration::from_millis(1200));
        redis.restart();
        assert!(fields(&redis).is_empty());
        // (the holding worker's first call after the restart meets the broken connection, and
        // opens a new one)
        let deadline = Instant::now() + Duration::from_secs(5);
        while ngx.get("/fast.html?k=a", &[]).header("X-Pid") != Some(pid.as_str()) {
            assert!(Instant::now() < deadline, "round {round}: the holding worker never answered");
        }
        let start = Instant::now();
        while held_in_redis(&redis) != 1 {
            assert!(
                start.elapsed() < Duration::from_millis(300),
                "round {round}: the held unit (worker {pid}) not set again within 300 ms: {:?}",
                fields(&redis)
            );
            thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(ngx.get("/fast.html?k=a", &[]).status, 429, "round {round}");
    }
    drop(held);
}

/// A location of `rl_conn zone=r max=1 key=all` and `params` (a queue) on a
/// Redis zone, its requests logged with their status and `$rl_delay`.
fn queue_conf(redis: &Redis, params: &str) -> String {
    format!(
        "rl_zone r redis={} timeout=500ms;\n\
         log_format q '$request_uri $status $rl_status $rl_delay';\n\
         server {{ listen 127.0.0.1:{{PORT}}; root {{ROOT}};\n\
           access_log {{ROOT}}/../q.log q;\n\
           location /q/ {{ rl_conn zone=r max=1 key=all {params}; rl_headers off; {SLOW} }}\n\
           location = /metrics {{ rl_metrics; }}\n\
         }}",
        redis.url()
    )
}

fn start_queue(redis: &Redis, params: &str) -> Nginx {
    Nginx::setup(&queue_conf(redis, params))
        .file("html/q/slow.html", &slow_file())
        .file("html/q/fast.html", "fast\n")
        .start()
}

/// The status of the response on `s` if its status line comes within
/// `within` (the connection kept: a slow file's request then holds its
/// slot), else `None`.
fn status_within(s: &TcpStream, within: Duration) -> Option<u16> {
    use std::io::BufRead;
    s.set_read_timeout(Some(within)).unwrap();
    let mut line = String::new();
    let got = std::io::BufReader::new(s.try_clone().unwrap()).read_line(&mut line);
    got.ok().filter(|n| *n > 0)?;
    line.split(' ').nth(1).and_then(|v| v.parse().ok())
}

/// The places of the key's waiting line in Redis ("#ticket" fields).
fn places(redis: &Redis) -> Vec<String> {
    fields(redis).into_keys().filter(|f| f.starts_with('#') && f != "#").collect()
}

/// Polls the key until it has no place left (2 s at most): the places
/// given up have reached Redis.
fn until_no_places(redis: &Redis) {
    let deadline = Instant::now() + Duration::from_secs(2);
    while !places(redis).is_empty() {
        assert!(Instant::now() < deadline, "the place was not given up: {:?}", fields(redis));
        thread::sleep(Duration::from_millis(10));
    }
}

/// Polls `ngx`'s `nginx_rl_conn_waiting` until it reads `n` (10 s at most).
fn until_waiting_on(ngx: &Nginx, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while metric(ngx, "nginx_rl_conn_waiting") != n {
        assert!(Instant::now() < deadline, "never {n} waiting:\n{}", ngx.error_log());
        thread::sleep(Duration::from_millis(5));
    }
}

/// `queue=2` across two nginx: over the limit, a request to each nginx
/// waits (a place each in the key's hash), a third is refused at once; when
/// the slot is free they get it one after the other, in the order they
/// came, whichever nginx they wait on: `DELAYED`, with the time they
/// waited. Once they end, the key is gone.
#[test]
fn a_queue_across_nginx_lets_requests_wait_their_turn() {
    let redis = Redis::start();
    let a = start_queue(&redis, "queue=2 timeout=20s");
    let b = start_queue(&redis, "queue=2 timeout=20s");
    let (status, held) = hold(&a, "/q/slow.html?n=a");
    assert_eq!(status, 200);
    let first = send_only(b.port, "/q/slow.html?n=first");
    until_waiting_on(&b, 1);
    let second = send_only(a.port, "/q/slow.html?n=second");
    until_waiting_on(&a, 1);
    assert_eq!(places(&redis).len(), 2, "{:?}", fields(&redis));
    let t = Instant::now();
    assert_eq!(b.get("/q/fast.html?n=full", &[]).status, 429, "the line is full");
    assert!(t.elapsed() < Duration::from_millis(300), "refused at once: {:?}", t.elapsed());
    assert_eq!(status_within(&first, Duration::from_millis(300)), None, "answered while the slot is held");
    drop(held);
    assert_eq!(status_within(&first, Duration::from_secs(5)), Some(200), "the first to come, on the other nginx");
    assert_eq!(status_within(&second, Duration::from_millis(300)), None, "the second while the first holds the slot");
    assert_eq!(metric(&a, "nginx_rl_conn_waiting"), 1);
    drop(first);
    assert_eq!(status_within(&second, Duration::from_secs(5)), Some(200));
    until_waiting_on(&a, 0);
    until_waiting_on(&b, 0);
    assert!(places(&redis).is_empty(), "{:?}", fields(&redis));
    let log = std::fs::read_to_string(b.prefix.join("q.log")).unwrap();
    let line = log.lines().find(|l| l.starts_with("/q/slow.html?n=first ")).unwrap_or_else(|| panic!("{log}"));
    assert!(line.starts_with("/q/slow.html?n=first 200 DELAYED "), "{log}");
    let waited_ms: u64 = line.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(waited_ms >= 300, "waited {waited_ms} ms: {log}");
    assert!(log.contains("/q/fast.html?n=full 429 REJECTED"), "{log}");
    drop(second);
    let deadline = Instant::now() + Duration::from_secs(10);
    while held_in_redis(&redis) > 0 {
        assert!(Instant::now() < deadline, "not given back: {:?}", fields(&redis));
        thread::sleep(Duration::from_millis(50));
    }
    for n in [&a, &b] {
        assert!(crash_lines(&n.error_log()).is_empty(), "{}", n.error_log());
    }
}

/// A request that waits longer than `timeout=` is refused (the location's
/// status, `limit_conn`'s log line) and gives its place up: the next
/// request finds the line with room and waits its own time.
#[test]
fn a_wait_on_redis_ends_at_its_timeout() {
    let redis = Redis::start();
    let ngx = start_queue(&redis, "queue=1 timeout=400ms");
    let (status, _held) = hold(&ngx, "/q/slow.html");
    assert_eq!(status, 200);
    let from = ngx.error_log().len();
    let t = Instant::now();
    assert_eq!(ngx.get("/q/fast.html", &[]).status, 429);
    let took = t.elapsed();
    // (nginx's clock is the one cached at its event loop's last wake: a few ms behind ours)
    assert!(took >= Duration::from_millis(380) && took < Duration::from_secs(3), "answered after {took:?}");
    assert!(ngx.error_log_since(from).contains("limiting connections by zone \"r\""), "{}", ngx.error_log_since(from));
    until_waiting_on(&ngx, 0);
    until_no_places(&redis);
    let t = Instant::now();
    assert_eq!(ngx.get("/q/fast.html", &[]).status, 429);
    assert!(t.elapsed() >= Duration::from_millis(380), "refused without waiting: {:?}", t.elapsed());
}

/// A client that goes away while it waits gives its place up at once: the
/// next request takes it (a line of one place), and gets the slot when it
/// is free.
#[test]
fn a_waiter_on_redis_that_leaves_gives_its_place_up() {
    let redis = Redis::start();
    let ngx = start_queue(&redis, "queue=1 timeout=20s");
    let (status, held) = hold(&ngx, "/q/slow.html");
    assert_eq!(status, 200);
    let b = send_only(ngx.port, "/q/fast.html?n=b");
    until_waiting_on(&ngx, 1);
    assert_eq!(places(&redis).len(), 1);
    drop(b);
    until_waiting_on(&ngx, 0);
    until_no_places(&redis);
    let c = send_only(ngx.port, "/q/fast.html?n=c");
    until_waiting_on(&ngx, 1);
    drop(held);
    let (sc, text) = response(c);
    assert_eq!(sc, 200, "{text}");
}

/// A waiter of an nginx killed (SIGKILL) keeps its place only until it
/// lapses (a request that no longer looks: 3 heartbeats and the zone's
/// timeout at most): a waiter of the other nginx behind it gets the slot
/// freed then, not before.
#[test]
fn a_killed_nginx_waiters_places_lapse() {
    let redis = Redis::start();
    let a = start_queue(&redis, "queue=2 timeout=30s");
    let b = start_queue(&redis, "queue=2 timeout=30s");
    let (status, held) = hold(&b, "/q/slow.html?n=held");
    assert_eq!(status, 200);
    let _dead = send_only(a.port, "/q/fast.html?n=dead");
    until_waiting_on(&a, 1);
    let behind = send_only(b.port, "/q/slow.html?n=behind");
    until_waiting_on(&b, 1);
    kill_nginx(&a);
    let killed = Instant::now();
    drop(held);
    assert_eq!(status_within(&behind, Duration::from_secs(8)), Some(200), "{:?}", fields(&redis));
    let took = killed.elapsed();
    assert!(took >= Duration::from_millis(2500), "let in after {took:?}, before the dead place lapsed");
    assert!(took <= Duration::from_millis(5000), "let in after {took:?}");
    assert!(places(&redis).is_empty(), "{:?}", fields(&redis));
}

/// Redis stopped while requests wait: with `on_error=allow` a waiter is let
/// through (its line left out, as Redis cannot decide it), with
/// `on_error=deny` it is refused, each within the zone's timeout and a
/// look; neither is counted waiting any more.
#[test]
fn redis_down_while_waiting_per_on_error() {
    let mut redis = Redis::start();
    let conf = |on_error: &str| {
        format!(
            "rl_zone r redis={} timeout=200ms on_error={on_error};\n\
             server {{ listen 127.0.0.1:{{PORT}}; root {{ROOT}};\n\
               location /q/ {{ rl_conn zone=r max=1 key=$arg_k queue=1 timeout=20s; {SLOW} }}\n\
               location = /metrics {{ rl_metrics; }}\n\
             }}",
            redis.url()
        )
    };
    let start = |c: &str| Nginx::setup(c).file("html/q/slow.html", &slow_file()).start();
    let (allow, deny) = (start(&conf("allow")), start(&conf("deny")));
    let mut waiters = Vec::new();
    for (n, k) in [(&allow, "a"), (&deny, "d")] {
        let (status, held) = hold(n, &format!("/q/slow.html?k={k}"));
        assert_eq!(status, 200);
        waiters.push((held, send_only(n.port, &format!("/q/slow.html?k={k}&n=waiter"))));
        until_waiting_on(n, 1);
    }
    redis.stop();
    let t = Instant::now();
    assert_eq!(status_within(&waiters[0].1, Duration::from_secs(3)), Some(200), "on_error=allow lets it through");
    assert_eq!(status_within(&waiters[1].1, Duration::from_secs(3)), Some(429), "on_error=deny refuses it");
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    for n in [&allow, &deny] {
        until_waiting_on(n, 0);
        let log = n.error_log();
        assert!(!failed_lines(&log, "r").is_empty(), "{log}");
        assert!(crash_lines(&log).is_empty(), "{:?}", crash_lines(&log));
    }
}

/// A location of `rl_conn zone=r max={max} key=all priority=$arg_p` and
/// `params` (its classes, a queue) on a Redis zone.
fn class_conf(redis: &Redis, max: u64, params: &str) -> String {
    format!(
        "rl_zone r redis={} timeout=500ms;\n\
         server {{ listen 127.0.0.1:{{PORT}}; root {{ROOT}};\n\
           location /q/ {{ rl_conn zone=r max={max} key=all priority=$arg_p {params}; {SLOW} }}\n\
           location = /metrics {{ rl_metrics; }}\n\
         }}",
        redis.url()
    )
}

fn start_classes(redis: &Redis, max: u64, params: &str) -> Nginx {
    Nginx::setup(&class_conf(redis, max, params)).file("html/q/slow.html", &slow_file()).start()
}

/// Classes across two nginx: a premium request that came after a standard
/// one, on the other nginx, gets the slot first; the standard one then.
#[test]
fn classes_across_nginx_let_the_higher_class_in_first() {
    let redis = Redis::start();
    let params = "queue=4 timeout=20s classes=premium,standard";
    let (a, b) = (start_classes(&redis, 1, params), start_classes(&redis, 1, params));
    let (status, held) = hold(&a, "/q/slow.html?p=standard&n=held");
    assert_eq!(status, 200);
    let standard = send_only(b.port, "/q/slow.html?p=standard&n=first");
    until_waiting_on(&b, 1);
    let premium = send_only(a.port, "/q/slow.html?p=premium&n=second");
    until_waiting_on(&a, 1);
    drop(held);
    assert_eq!(status_within(&premium, Duration::from_secs(5)), Some(200), "the higher class first");
    assert_eq!(status_within(&standard, Duration::from_millis(300)), None, "standard while premium holds the slot");
    drop(premium);
    assert_eq!(status_within(&standard, Duration::from_secs(5)), Some(200));
    until_waiting_on(&a, 0);
    until_waiting_on(&b, 0);
    for n in [&a, &b] {
        assert!(crash_lines(&n.error_log()).is_empty(), "{}", n.error_log());
    }
}

/// A class's reserve across two nginx (`max=3`, critical keeping 1 from
/// the classes below): standard requests get 2 slots, whichever nginx
/// they reach, and the third is refused at once; a critical request still
/// gets the slot kept for it. The fields are one per worker and class.
#[test]
fn a_class_reserve_holds_across_nginx() {
    let redis = Redis::start();
    let params = "classes=critical:reserve=1,standard";
    let (a, b) = (start_classes(&redis, 3, params), start_classes(&redis, 3, params));
    let (s1, _h1) = hold(&a, "/q/slow.html?p=standard");
    let (s2, _h2) = hold(&b, "/q/slow.html?p=standard");
    assert_eq!((s1, s2), (200, 200));
    let (s3, _h3) = hold(&a, "/q/slow.html?p=standard");
    assert_eq!(s3, 429, "the critical reserve is kept: {:?}", fields(&redis));
    let (c1, _c) = hold(&b, "/q/slow.html?p=critical");
    assert_eq!(c1, 200, "the reserve's slot: {:?}", fields(&redis));
    assert_eq!(held_in_redis(&redis), 3);
    let names: Vec<String> = fields(&redis).into_keys().collect();
    assert!(names.iter().any(|n| n.ends_with("/0")) && names.iter().any(|n| n.ends_with("/1")), "{names:?}");
    let (c2, _) = hold(&a, "/q/slow.html?p=critical");
    assert_eq!(c2, 429, "max=3 in all");
}

/// With the line's places all taken, a higher-class arrival takes the
/// place of the newest waiter of the lowest class, which is refused at its
/// next look; the premium request then gets the slot when it is free.
#[test]
fn a_higher_class_takes_a_lower_class_place() {
    let redis = Redis::start();
    let params = "queue=1 timeout=20s classes=premium,standard";
    let (a, b) = (start_classes(&redis, 1, params), start_classes(&redis, 1, params));
    let (status, held) = hold(&a, "/q/slow.html?p=standard&n=held");
    assert_eq!(status, 200);
    let standard = send_only(b.port, "/q/slow.html?p=standard&n=waiter");
    until_waiting_on(&b, 1);
    let premium = send_only(a.port, "/q/slow.html?p=premium&n=later");
    assert_eq!(status_within(&standard, Duration::from_secs(3)), Some(429), "its place taken: refused");
    until_waiting_on(&b, 0);
    until_waiting_on(&a, 1);
    drop(held);
    assert_eq!(status_within(&premium, Duration::from_secs(5)), Some(200));
}
