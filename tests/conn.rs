//! `rl_conn`: requests in flight per key, held from the pre-access phase
//! until the request ends, all-or-nothing with `rl_limit` lines, counted
//! once per request, and given back when a worker dies or drains.
//!
//! A request holds its slot for as long as its client reads a file sent at
//! 1 byte a second after its first kilobyte (`limit_rate_after 1k;
//! limit_rate 1;`): the status line arrives at once, the rest never does
//! within a test. A held request is known held once its status line is
//! read (the slot is taken before any response).

mod common;

use std::io::Read;
use std::net::TcpStream;
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use common::held::*;
use common::*;

/// [`hold`]s `path` once a slot is free (10 s at most): `what` was given
/// back when nginx next wrote to the closed client.
fn hold_when_free(ngx: &Nginx, path: &str, what: &str) -> TcpStream {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, s) = hold(ngx, path);
        if status == 200 {
            return s;
        }
        assert!(Instant::now() < deadline, "{what} was never given back (last {status})");
        thread::sleep(Duration::from_millis(20));
    }
}

/// Sends `path` until it is answered `want` (10 s at most): a closed
/// client's request ends when nginx next writes to it.
fn until_status(ngx: &Nginx, path: &str, want: u16) -> Response {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = ngx.get(path, &[]);
        if r.status == want {
            return r;
        }
        assert!(Instant::now() < deadline, "{path} never answered {want} (last {}):\n{}", r.status, ngx.error_log());
        thread::sleep(Duration::from_millis(20));
    }
}

fn start(block: &str) -> Nginx {
    Nginx::setup(block).file("html/slow/big.html", &slow_file()).file("html/fast.html", "fast\n").start()
}

/// One slot for all (`max=1 key=all`) on `/slow/`, the server listening
/// with `listen` after its address (` http2`), and `/metrics`.
fn one_slot(listen: &str) -> Nginx {
    start(&format!(
        "rl_zone c size=1m;\n\
         server {{ listen 127.0.0.1:{{PORT}}{listen}; root {{ROOT}};\n\
           location /slow/ {{ rl_conn zone=c max=1 key=all; {SLOW} }}\n\
           location = /metrics {{ rl_metrics; }}\n\
         }}"
    ))
}

/// Two requests of a key hold the two slots of `max=2`: a third is
/// refused with the location's status, `limit_conn`'s log line and the
/// policy's quota unit; once one of them ends (its client closes), a new
/// one passes. Another key has slots of its own.
#[test]
fn holds_until_the_request_ends() {
    let ngx = start(&format!(
        "rl_zone c size=1m;\n\
         server {{ listen 127.0.0.1:{{PORT}}; root {{ROOT}};\n\
           rl_headers draft;\n\
           location /slow/ {{ rl_conn zone=c max=2 key=$arg_k; {SLOW} }}\n\
         }}"
    ));
    let (a, held_a) = hold(&ngx, "/slow/big.html?k=a");
    let (b, _held_b) = hold(&ngx, "/slow/big.html?k=a");
    assert_eq!((a, b), (200, 200));
    let from = ngx.error_log().len();
    let r = ngx.get("/slow/big.html?k=a", &[]);
    assert_eq!(r.status, 429, "a third request in flight");
    assert_eq!(r.header("RateLimit-Policy"), Some("\"c\";q=2;qu=\"concurrent-requests\""));
    assert_eq!(r.header("RateLimit"), Some("\"c\";r=0"));
    assert_eq!(r.header("Retry-After"), None, "no one knows when a request in flight ends");
    let log = ngx.error_log_since(from);
    assert!(
        log.lines().any(|l| l.contains("[error]") && l.contains("limiting connections by zone \"c\", client: ")),
        "{log}"
    );
    let (other, _held_other) = hold(&ngx, "/slow/big.html?k=b");
    assert_eq!(other, 200, "another key");
    drop(held_a);
    let _held_again = hold_when_free(&ngx, "/slow/big.html?k=a", "the closed client's slot");
    assert_eq!(ngx.get("/slow/big.html?k=a", &[]).status, 429, "two held again");
}

/// However a request ends, its slot is given back, once: an upstream that
/// refuses the connection (502), one that never answers (504 at the proxy's
/// timeout), a `return` (answered before any limit), a request sent on by
/// `error_page` to another location with the same line (counted once: with
/// `max=1` it is not refused there), and a subrequest (an SSI include of
/// a location with the line: not counted). Each time the one slot is free
/// afterwards, and nothing is left in flight.
#[test]
fn released_however_the_request_ends() {
    let mute = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mute_port = mute.local_addr().unwrap().port();
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed_port = closed.local_addr().unwrap().port();
    drop(closed);
    let line = "rl_conn zone=c max=1 key=all;";
    let ngx = Nginx::setup(&format!(
        "rl_zone c size=1m;\n\
         server {{ listen 127.0.0.1:{{PORT}}; root {{ROOT}};\n\
           location /refused/ {{ {line} proxy_pass http://127.0.0.1:{closed_port}; }}\n\
           location /mute/ {{ {line} proxy_pass http://127.0.0.1:{mute_port}; proxy_read_timeout 200ms; }}\n\
           location /ret/ {{ {line} return 200 \"returned\\n\"; }}\n\
           location /fails/ {{ {line} proxy_pass http://127.0.0.1:{closed_port}; \
             proxy_intercept_errors on; error_page 502 = /fallback/fast.html; }}\n\
           location /fallback/ {{ {line} alias {{ROOT}}/; }}\n\
           location /page/ {{ {line} ssi on; alias {{ROOT}}/; }}\n\
           location /included/ {{ {line} alias {{ROOT}}/; }}\n\
           location /slow/ {{ {line} {SLOW} }}\n\
           location = /metrics {{ rl_metrics; }}\n\
         }}"
    ))
    .file("html/slow/big.html", &slow_file())
    .file("html/fast.html", "fast\n")
    .file("html/page.html", "<!--# include virtual=\"/included/fast.html\" -->")
    .start();
    let free = |after: &str| {
        let (status, held) = hold(&ngx, "/slow/big.html");
        assert_eq!(status, 200, "the slot is free after {after}:\n{}", ngx.error_log());
        assert_eq!(ngx.get("/slow/big.html", &[]).status, 429, "one slot");
        drop(held);
        // (the held request ends when nginx next writes to its closed client)
        until_counts(&ngx, (0, 0));
    };
    assert_eq!(ngx.get("/refused/", &[]).status, 502);
    free("an upstream refused the connection");
    assert_eq!(ngx.get("/mute/", &[]).status, 504);
    free("an upstream timed out");
    drop(mute);
    assert_eq!(ngx.get("/ret/", &[]).status, 200);
    free("a return");
    let r = ngx.get("/fails/", &[]);
    assert_eq!((r.status, r.body.as_str()), (200, "fast\n"), "error_page to a location of the same line");
    free("an error_page");
    let r = ngx.get("/page/page.html", &[]);
    assert_eq!((r.status, r.body.as_str()), (200, "fast\n"), "a subrequest is not counted");
    free("a subrequest");
}

/// Two `rl_conn` lines in one location, all or nothing: a request the
/// first refuses takes no slot of the second, and each line's verdicts are
/// counted under its name.
#[test]
fn two_lines_in_one_location_all_or_nothing() {
    let ngx = start(&format!(
        "rl_zone c size=1m;\n\
         server {{ listen 127.0.0.1:{{PORT}}; root {{ROOT}};\n\
           location /slow/ {{ rl_conn zone=c max=2 key=$arg_a name=per_a; \
             rl_conn zone=c max=1 key=$arg_b name=per_b; {SLOW} }}\n\
           location = /metrics {{ rl_metrics; }}\n\
         }}"
    ));
    let (s1, _h1) = hold(&ngx, "/slow/big.html?a=x&b=1");
    let (s2, _h2) = hold(&ngx, "/slow/big.html?a=x&b=2");
    assert_eq!((s1, s2), (200, 200));
    assert_eq!(ngx.get("/slow/big.html?a=x&b=3", &[]).status, 429, "per_a is full");
    assert_eq!(ngx.get("/slow/big.html?a=y&b=1", &[]).status, 429, "per_b is full for b=1");
    // The refused a=x,b=3 took nothing of per_b: b=3 has its one slot.
    let (s3, _h3) = hold(&ngx, "/slow/big.html?a=y&b=3");
    assert_eq!(s3, 200, "{}", ngx.error_log());
    let m = ngx.get("/metrics", &[]).body;
    let count = |line: &str, result: &str| requests_total(&m, "c", Some(line), result);
    assert_eq!((count("per_a", "passed"), count("per_a", "rejected")), (4, 1), "{m}");
    assert_eq!((count("per_b", "passed"), count("per_b", "rejected")), (4, 1), "{m}");
}

/// All or nothing with `rl_limit`: a request another line refuses holds no
/// slot, and a request `rl_conn` refuses is charged by no other line.
#[test]
fn refused_requests_hold_and_charge_nothing() {
    let ngx = start(
        "rl_zone c size=1m;\n\
         rl_zone r size=1m;\n\
         server { listen 127.0.0.1:{PORT}; root {ROOT};\n\
           location = /fast.html { rl_conn zone=c max=1 key=all; rl_limit zone=r rate=1r/m burst=1 key=$arg_k; }\n\
           location /slow/ { rl_conn zone=c max=1 key=all; limit_rate_after 1k; limit_rate 1; }\n\
         }",
    );
    assert_eq!(ngx.get("/fast.html?k=a", &[]).status, 200);
    // Refused by rl_limit: were its slot held, the one slot of `all` would be gone.
    for _ in 0..3 {
        assert_eq!(ngx.get("/fast.html?k=a", &[]).status, 429);
    }
    let (status, held) = hold(&ngx, "/slow/big.html");
    assert_eq!(status, 200, "the slot was left free by the refused requests");
    // Refused by rl_conn: were k=b charged, its one request a minute would be spent.
    assert_eq!(ngx.get("/fast.html?k=b", &[]).status, 429);
    drop(held);
    let r = until_status(&ngx, "/fast.html?k=b", 200);
    assert_eq!(r.body, "fast\n");
}

/// Counted once per request: `index` redirects `/slow/` to
/// `/slow/index.html` in a location with the same line, and `max=1` lets it
/// through; a second request is refused.
#[test]
fn an_internal_redirect_counts_once() {
    let ngx = Nginx::setup(&format!(
        "rl_zone c size=1m;\n\
         server {{ listen 127.0.0.1:{{PORT}}; root {{ROOT}};\n\
           location /slow/ {{ rl_conn zone=c max=1 key=all; {SLOW} }}\n\
         }}"
    ))
    .file("html/slow/index.html", &slow_file())
    .start();
    let (status, _held) = hold(&ngx, "/slow/");
    assert_eq!(status, 200, "counted twice:\n{}", ngx.error_log());
    assert_eq!(ngx.get("/slow/", &[]).status, 429);
}

/// `rl_conn` and `rl_limit` are inherited each on its own, as `limit_conn`
/// and `limit_req` are: a location with `rl_limit` lines keeps the server's
/// `rl_conn`.
#[test]
fn inherited_apart_from_rl_limit() {
    let ngx = start(&format!(
        "rl_zone c size=1m;\n\
         rl_zone r size=1m;\n\
         server {{ listen 127.0.0.1:{{PORT}}; root {{ROOT}};\n\
           rl_conn zone=c max=1 key=all;\n\
           location /slow/ {{ rl_limit zone=r rate=100r/s; {SLOW} }}\n\
         }}"
    ));
    let (status, _held) = hold(&ngx, "/slow/big.html");
    assert_eq!(status, 200);
    assert_eq!(ngx.get("/slow/big.html", &[]).status, 429, "the server's rl_conn applies");
}

/// Kills the workers `before` with `-9`, closes the clients of `held`, and
/// waits (10 s at most) until nginx has started `WORKERS` new ones.
fn kill_every_worker<T>(ngx: &Nginx, before: &[u32], held: T) {
    for pid in before {
        Command::new("kill").args(["-KILL", &pid.to_string()]).status().unwrap();
    }
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = ngx.worker_pids();
        if now.len() == WORKERS && now.iter().all(|p| !before.contains(p)) {
            break;
        }
        assert!(Instant::now() < deadline, "nginx did not start new workers: {before:?} -> {now:?}");
        thread::sleep(Duration::from_millis(20));
    }
}

/// A worker killed with `-9` ends none of its requests: the worker nginx
/// starts in its place gives back what it held, and says so.
#[test]
fn a_killed_workers_slots_come_back() {
    let ngx = one_slot("");
    let (status, held) = hold(&ngx, "/slow/big.html");
    assert_eq!(status, 200);
    assert_eq!(ngx.get("/slow/big.html", &[]).status, 429);
    let m = ngx.get("/metrics", &[]).body;
    promtool_check_metrics(&m);
    assert!(m.contains("\nnginx_rl_conn_in_flight{zone=\"c\"} 1\n"), "{m}");
    assert!(m.contains("\nnginx_rl_conn_reclaimed_total{zone=\"c\"} 0\n"), "{m}");
    assert!(m.contains("param=\"max\"} 1\n") && !m.contains("param=\"rate\""), "{m}");
    let before = ngx.worker_pids();
    assert_eq!(before.len(), WORKERS);
    // (the kernel closes the dead worker's connection)
    kill_every_worker(&ngx, &before, held);
    // (a new worker gives the units back when it starts, after nginx has forked it)
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ngx.error_log().contains("which exited, given back") {
        assert!(Instant::now() < deadline, "nothing given back:\n{}", ngx.error_log());
        thread::sleep(Duration::from_millis(10));
    }
    let (status, _held) = hold(&ngx, "/slow/big.html");
    assert_eq!(status, 200, "the dead worker's slot was not given back:\n{}", ngx.error_log());
    let log = ngx.error_log();
    let given_back: Vec<&str> = log.lines().filter(|l| l.contains("held by worker process")).collect();
    assert_eq!(given_back.len(), 1, "{log}");
    assert!(given_back[0].contains("[notice]") && given_back[0].contains("rl_zone \"c\": 1 unit held"), "{log}");
    assert!(before.iter().any(|p| given_back[0].contains(&format!("worker process {p}, which exited"))), "{log}");
    let m = ngx.get("/metrics", &[]).body;
    assert!(m.contains("\nnginx_rl_conn_in_flight{zone=\"c\"} 1\n"), "the new request's: {m}");
    assert!(m.contains("\nnginx_rl_conn_reclaimed_total{zone=\"c\"} 1\n"), "{m}");
}

/// A worker killed with `-9` while a request waits in it for a slot: the
/// worker nginx starts in its place takes that request off the waiting
/// gauge (it waits no more), long before the place's timeout.
#[test]
fn a_killed_workers_waiters_leave_the_gauge() {
    let ngx = start_queue("queue=1 timeout=60s");
    let (status, held) = hold(&ngx, "/q/slow.html");
    assert_eq!(status, 200);
    let waiter = send_only(ngx.port, "/q/fast.html");
    until_waiting(&ngx, 1);
    let before = ngx.worker_pids();
    for pid in &before {
        Command::new("kill").args(["-KILL", &pid.to_string()]).status().unwrap();
    }
    drop((held, waiter));
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ngx.error_log().contains("which exited, given back") {
        assert!(Instant::now() < deadline, "nothing given back:\n{}", ngx.error_log());
        thread::sleep(Duration::from_millis(10));
    }
    until_waiting(&ngx, 0);
}

/// A reload keeps the zone and what is held in it: the new workers count
/// the old worker's request in flight until it ends, and the old worker,
/// draining, gives its slot back when it does.
#[test]
fn a_reload_keeps_requests_in_flight() {
    let ngx = one_slot("");
    let (status, mut held) = hold(&ngx, "/slow/big.html");
    assert_eq!(status, 200);
    let old = ngx.worker_pids();
    ngx.reload_started();
    // The old workers stop accepting at once: this request is a new worker's.
    let r = until_status(&ngx, "/slow/big.html", 429);
    assert_eq!(r.status, 429, "the old worker's request in flight is counted");
    assert!(old.iter().any(|p| ngx.worker_pids().contains(p)), "the old worker drains");
    // The held request's client reads a little, then leaves: the old worker ends it and exits.
    let mut buf = [0u8; 64];
    let _ = held.read(&mut buf);
    drop(held);
    let _held = hold_when_free(&ngx, "/slow/big.html", "the old worker's slot");
    assert!(!ngx.error_log().contains("held by worker process"), "nothing to reclaim after a drain");
}

/// What `nginx -t` says of `rl_conn` lines it refuses.
#[test]
fn nginx_t_messages() {
    let refused = |block: &str, want: &str| {
        let (ok, out) = nginx_t(block);
        assert!(!ok && out.contains(want), "{block}\nwanted: {want}\ngot: {out}");
    };
    refused(
        "rl_zone c size=1m; server { location / { rl_conn zone=c; } }",
        "\"rl_conn\" directive must have \"max\" parameter",
    );
    refused(
        "rl_zone addr size=1m; server { location / { rl_conn addr 10; } }",
        "invalid parameter \"addr\" in \"rl_conn\" directive, use \"zone=addr\"",
    );
    refused("server { location / { rl_conn zone=nope max=1; } }", "unknown zone \"nope\" in \"rl_conn\" directive");
    refused(
        "rl_zone r redis=redis://127.0.0.1:1; server { location / { rl_conn zone=r max=1 queue=1; \
         rl_conn zone=r max=2 key=$arg_k queue=1; } }",
        "Redis zone \"r\" can keep one waiting line (\"queue=\") per location, a second in \"rl_conn\" directive",
    );
    refused(
        "rl_zone c size=1m; server { location / { rl_conn zone=c max=1; rl_conn zone=c max=1; } }",
        "\"rl_conn\" directive is duplicate",
    );
    let (ok, out) =
        nginx_t("rl_zone c size=1m; server { location / { rl_conn zone=c max=1 cost=1 name=ip dry_run after_auth; } }");
    assert!(ok, "{out}");
}

/// Each HTTP/2 stream is a request of its own: two streams of one
/// connection (`nghttp`, which sends every URI on one) take two slots, and
/// with `max=1` the second is refused.
#[test]
fn each_http2_stream_counts() {
    let ngx = one_slot(" http2");
    let url = |q: &str| format!("http://127.0.0.1:{}/slow/big.html?{q}", ngx.port);
    let out = Command::new("nghttp")
        .args(["-n", "-v", "--timeout=2", &url("a"), &url("b")])
        .output()
        .expect("nghttp (Debian's nghttp2-client)");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut statuses: Vec<&str> = text.lines().filter_map(|l| l.split(":status: ").nth(1)).collect();
    statuses.sort();
    assert_eq!(statuses, ["200", "429"], "{text}");
}

/// An old worker killed while it drains after a reload is not replaced:
/// the live workers notice it gone (they look every second) and give back
/// what it held, no worker starting meanwhile.
#[test]
fn a_draining_workers_slots_come_back() {
    let ngx = one_slot("");
    let (status, held) = hold(&ngx, "/slow/big.html");
    assert_eq!(status, 200);
    let old = ngx.worker_pids();
    let from = ngx.reload_now();
    let deadline = Instant::now() + Duration::from_secs(10);
    let new: Vec<u32> = loop {
        let now = ngx.worker_pids();
        let new: Vec<u32> = now.iter().copied().filter(|p| !old.contains(p)).collect();
        // (the old worker without requests exits at once; the one holding the request drains)
        if new.len() == WORKERS && now.len() == WORKERS + 1 {
            break new;
        }
        assert!(Instant::now() < deadline, "reload: {old:?} -> {now:?}\n{}", ngx.error_log_since(from));
        thread::sleep(Duration::from_millis(20));
    };
    let draining: Vec<u32> = ngx.worker_pids().into_iter().filter(|p| old.contains(p)).collect();
    assert_eq!(draining.len(), 1);
    assert_eq!(ngx.get("/slow/big.html", &[]).status, 429, "the draining worker holds the slot");
    Command::new("kill").args(["-KILL", &draining[0].to_string()]).status().unwrap();
    drop(held);
    let _held = hold_when_free(&ngx, "/slow/big.html", "the draining worker's unit");
    let log = ngx.error_log_since(from);
    assert!(
        log.contains(&format!(
            "rl_zone \"c\": 1 unit held by worker process {}, which exited, given back",
            draining[0]
        )),
        "{log}"
    );
    let mut now = ngx.worker_pids();
    now.sort_unstable();
    let mut new = new;
    new.sort_unstable();
    assert_eq!(now, new, "no worker started meanwhile");
}

/// `worker_shutdown_timeout 1s;`: after a reload, nginx closes the
/// connections an old worker still has once the timeout ends, and the
/// request held in flight there ends with them: its slot is free again in
/// the new workers within a few seconds (a new request passes, nothing is
/// left in flight), given back by the request's end (nothing reclaimed).
#[test]
fn worker_shutdown_timeout_gives_the_slot_back() {
    let ngx = one_slot("");
    ngx.reload_edited(|conf| format!("worker_shutdown_timeout 1s;\n{conf}"));
    let (status, mut held) = hold(&ngx, "/slow/big.html");
    assert_eq!(status, 200);
    assert_eq!(ngx.get("/slow/big.html", &[]).status, 429, "one slot");
    let old = ngx.worker_pids();
    let from = ngx.reload_now();
    let reloaded = Instant::now();
    // The old worker holding the request closes its connection at the timeout: the client reads
    // what was sent, then the end (the file would take over an hour at 1 byte a second).
    held.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
    let mut buf = [0u8; 4096];
    let closed = loop {
        match held.read(&mut buf) {
            Ok(0) => break reloaded.elapsed(),
            Ok(_) => {}
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            // (closed with a reset: closed too)
            Err(_) => break reloaded.elapsed(),
        }
        assert!(
            reloaded.elapsed() < Duration::from_secs(5),
            "the held connection is still open 5 s after the reload:\n{}",
            ngx.error_log_since(from)
        );
    };
    assert!(closed >= Duration::from_millis(900), "closed {closed:?} after the reload, before the timeout");
    let deadline = Instant::now() + Duration::from_secs(5);
    while ngx.worker_pids().iter().any(|p| old.contains(p)) {
        assert!(Instant::now() < deadline, "the old workers did not exit:\n{}", ngx.error_log_since(from));
        thread::sleep(Duration::from_millis(20));
    }
    until_counts(&ngx, (0, 0));
    let (status, _again) = hold(&ngx, "/slow/big.html");
    assert_eq!(status, 200, "the slot of the request the timeout ended:\n{}", ngx.error_log_since(from));
    until_counts(&ngx, (1, 0));
    let log = ngx.error_log_since(from);
    assert!(!log.contains("held by worker process"), "given back by the request's end, not reclaimed:\n{log}");
    assert!(crash_lines(&log).is_empty(), "{log}");
}

/// The zone's `nginx_rl_conn_in_flight` and `nginx_rl_conn_reclaimed_total`.
fn in_flight_and_reclaimed(ngx: &Nginx) -> (u64, u64) {
    let m = ngx.get("/metrics", &[]).body;
    let value = |name: &str| {
        m.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}{{zone=\"c\"}} ")))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name}:\n{m}"))
    };
    (value("nginx_rl_conn_in_flight"), value("nginx_rl_conn_reclaimed_total"))
}

/// Polls the zone's gauges until they read `want` (10 s at most): a
/// closed client's request ends when nginx next writes to it.
fn until_counts(ngx: &Nginx, want: (u64, u64)) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let got = in_flight_and_reclaimed(ngx);
        if got == want {
            return;
        }
        assert!(Instant::now() < deadline, "in flight, reclaimed: {got:?}, not {want:?}\n{}", ngx.error_log());
        thread::sleep(Duration::from_millis(20));
    }
}

/// One key held by requests of three generations of workers (two reloads,
/// the old workers draining): more workers than a state keeps holders of
/// in its own words, so that some hold their units apart. Requests that
/// end give back exactly theirs, and when every worker is killed with
/// `-9`, the workers that start give back every unit still held, however
/// each was kept: the line admits `max` again, and no more.
#[test]
fn a_key_held_by_many_workers_gives_every_unit_back() {
    let ngx = start(&format!(
        "rl_zone c size=1m;\n\
         server {{ listen 127.0.0.1:{{PORT}}; root {{ROOT}};\n\
           location /slow/ {{ rl_conn zone=c max=8 key=all; {SLOW} }}\n\
           location = /metrics {{ rl_metrics; }}\n\
         }}"
    ));
    let mut held = Vec::new();
    for generation in 0..3 {
        if generation > 0 {
            ngx.reload_started();
        }
        for _ in 0..2 {
            let (status, s) = hold(&ngx, "/slow/big.html");
            assert_eq!(status, 200, "{}", ngx.error_log());
            held.push(s);
        }
    }
    until_counts(&ngx, (6, 0));
    // One request of each generation ends.
    for i in [4, 2, 0] {
        drop(held.remove(i));
    }
    until_counts(&ngx, (3, 0));
    let before = ngx.worker_pids();
    assert!(before.len() > WORKERS, "the old workers drain their requests: {before:?}");
    kill_every_worker(&ngx, &before, held);
    until_counts(&ngx, (0, 3));
    let log = ngx.error_log();
    let units: u64 = log
        .lines()
        .filter_map(|l| l.split("rl_zone \"c\": ").nth(1))
        .filter_map(|l| l.split(" unit").next()?.parse::<u64>().ok())
        .sum();
    assert_eq!(units, 3, "{log}");
    let mut again = Vec::new();
    for _ in 0..8 {
        let (status, s) = hold(&ngx, "/slow/big.html");
        assert_eq!(status, 200, "{}", ngx.error_log());
        again.push(s);
    }
    assert_eq!(ngx.get("/slow/big.html", &[]).status, 429);
    until_counts(&ngx, (8, 3));
}

fn queue_conf(params: &str) -> String {
    format!(
        "rl_zone c size=1m;\n\
         log_format q '$request_uri $status $rl_status $rl_delay';\n\
         server {{ listen 127.0.0.1:{{PORT}}; root {{ROOT}};\n\
           access_log {{ROOT}}/../q.log q;\n\
           location /q/ {{ rl_conn zone=c max=1 key=all {params}; rl_headers off; {SLOW} }}\n\
           location = /metrics {{ rl_metrics; }}\n\
         }}"
    )
}

fn start_queue(params: &str) -> Nginx {
    Nginx::setup(&queue_conf(params)).file("html/q/slow.html", &slow_file()).file("html/q/fast.html", "fast\n").start()
}

/// `queue=2`: over the limit, two requests wait for the slot, a third is
/// refused at once; when the slot is free they pass one after the other, in
/// the order they came, `DELAYED` with the time they waited.
#[test]
fn a_queue_lets_requests_wait_their_turn() {
    let ngx = start_queue("queue=2 timeout=20s");
    let (status, held) = hold(&ngx, "/q/slow.html?n=a");
    assert_eq!(status, 200);
    let mut b = send_only(ngx.port, "/q/fast.html?n=b");
    b.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    until_waiting(&ngx, 1);
    let c = send_only(ngx.port, "/q/fast.html?n=c");
    until_waiting(&ngx, 2);
    let d = ngx.get("/q/fast.html?n=d", &[]);
    assert_eq!(d.status, 429, "the line is full");
    // Nothing for b while the slot is held.
    b.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
    let mut byte = [0u8; 1];
    assert!(b.read(&mut byte).is_err(), "b answered while the slot is held");
    b.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    drop(held);
    let (sb, tb) = response(b);
    let (sc, tc) = response(c);
    assert_eq!((sb, sc), (200, 200), "{tb}\n{tc}");
    until_waiting(&ngx, 0);
    let log = std::fs::read_to_string(ngx.prefix.join("q.log")).unwrap();
    let order: Vec<&str> = log.lines().filter(|l| l.contains("fast.html")).collect();
    assert_eq!(order.len(), 3, "{log}");
    assert!(order[0].starts_with("/q/fast.html?n=d 429 REJECTED"), "{log}");
    assert!(order[1].starts_with("/q/fast.html?n=b 200 DELAYED "), "first come, first served:\n{log}");
    assert!(order[2].starts_with("/q/fast.html?n=c 200 DELAYED "), "{log}");
    let waited_ms: u64 = order[1].rsplit(' ').next().unwrap().parse().unwrap();
    assert!(waited_ms >= 300, "b waited {waited_ms} ms: {log}");
}

/// A request that waits longer than `timeout=` is refused (the location's
/// status, `limit_conn`'s log line) and gives its place up.
#[test]
fn a_wait_ends_at_its_timeout() {
    let ngx = start_queue("queue=1 timeout=400ms");
    let (status, _held) = hold(&ngx, "/q/slow.html");
    assert_eq!(status, 200);
    let from = ngx.error_log().len();
    let t = Instant::now();
    let r = ngx.get("/q/fast.html", &[]);
    let took = t.elapsed();
    assert_eq!(r.status, 429);
    // (nginx's clock is the one cached at its event loop's last wake: a few ms behind ours)
    assert!(took >= Duration::from_millis(380) && took < Duration::from_secs(3), "answered after {took:?}");
    assert!(ngx.error_log_since(from).contains("limiting connections by zone \"c\""), "{}", ngx.error_log_since(from));
    assert_eq!(waiting(&ngx), 0);
    // Its place was given up: the line has room again.
    let t = Instant::now();
    assert_eq!(ngx.get("/q/fast.html", &[]).status, 429);
    assert!(
        t.elapsed() >= Duration::from_millis(380),
        "refused without waiting ({:?}): the line was full\n{}\n{}",
        t.elapsed(),
        std::fs::read_to_string(ngx.prefix.join("q.log")).unwrap_or_default(),
        ngx.error_log()
    );
}

/// A client that goes away while it waits gives its place up at once: the
/// next request takes it (a line of one place).
#[test]
fn a_waiter_that_leaves_gives_its_place_up() {
    let ngx = start_queue("queue=1 timeout=20s");
    let (status, held) = hold(&ngx, "/q/slow.html");
    assert_eq!(status, 200);
    let b = send_only(ngx.port, "/q/fast.html?n=b");
    until_waiting(&ngx, 1);
    drop(b);
    until_waiting(&ngx, 0);
    let c = send_only(ngx.port, "/q/fast.html?n=c");
    until_waiting(&ngx, 1);
    drop(held);
    let (sc, text) = response(c);
    assert_eq!(sc, 200, "{text}");
}

/// `nginx -t` on `queue=` and `timeout=`, and a zone too small for one
/// key's waiting line.
#[test]
fn nginx_t_queue_messages() {
    let (ok, out) = nginx_t("rl_zone c size=1m; server { location / { rl_conn zone=c max=1 timeout=1s; } }");
    assert!(!ok && out.contains("\"timeout\" needs \"queue\" in \"rl_conn\" directive"), "{out}");
    let (ok, out) = nginx_t("rl_zone c size=64k; server { location / { rl_conn zone=c max=1 queue=65536; } }");
    assert!(!ok && out.contains("is too small for its sliding_log limits or rl_conn queues"), "{out}");
    let (ok, out) = nginx_t("rl_zone c size=1m; server { location / { rl_conn zone=c max=1 queue=500 timeout=30s; } }");
    assert!(ok, "{out}");
}

/// A request a queued `rl_conn` line refuses (its line full) is charged by
/// no other line of its location.
#[test]
fn a_request_refused_by_a_full_line_is_charged_nowhere() {
    let ngx = Nginx::setup(&format!(
        "rl_zone c size=1m;\n\
         rl_zone r size=1m;\n\
         server {{ listen 127.0.0.1:{{PORT}}; root {{ROOT}};\n\
           location /q/ {{ rl_conn zone=c max=1 key=all queue=1 timeout=20s; rl_limit zone=r rate=1r/m burst=2 key=$arg_k; {SLOW} }}\n\
           location = /metrics {{ rl_metrics; }}\n\
         }}"
    ))
    .file("html/q/slow.html", &slow_file())
    .file("html/q/fast.html", "fast\n")
    .start();
    let (status, held) = hold(&ngx, "/q/slow.html?k=a");
    assert_eq!(status, 200);
    let b = send_only(ngx.port, "/q/fast.html?k=b");
    until_waiting(&ngx, 1);
    // The line is full: refused, three times; were k=c charged, its two a minute would be spent.
    for _ in 0..3 {
        assert_eq!(ngx.get("/q/fast.html?k=c", &[]).status, 429);
    }
    drop(held);
    let (sb, text) = response(b);
    assert_eq!(sb, 200, "{text}");
    until_waiting(&ngx, 0);
    assert_eq!(ngx.get("/q/fast.html?k=c", &[]).status, 200, "k=c was charged while refused");
    assert_eq!(ngx.get("/q/fast.html?k=c", &[]).status, 200);
}

/// A request let in by a queued `rl_conn` line that another line then
/// refuses gives its slot back at once, not when it ends: while its error
/// page (a slow one) is sent, `nginx_rl_conn_in_flight` is 0.
#[test]
fn a_slot_taken_for_a_refused_request_is_given_back() {
    let ngx = Nginx::setup(&format!(
        "rl_zone c size=1m;\n\
         rl_zone r size=1m;\n\
         server {{ listen 127.0.0.1:{{PORT}}; root {{ROOT}};\n\
           location /q/ {{ rl_conn zone=c max=1 key=all queue=1; rl_limit zone=r rate=1r/m burst=1 key=all;\n\
             error_page 429 /err/slow.html; }}\n\
           location /err/ {{ {SLOW} }}\n\
           location = /metrics {{ rl_metrics; }}\n\
         }}"
    ))
    .file("html/q/fast.html", "fast\n")
    .file("html/err/slow.html", &slow_file())
    .start();
    assert_eq!(ngx.get("/q/fast.html", &[]).status, 200);
    let (status, _refused) = hold(&ngx, "/q/fast.html");
    assert_eq!(status, 429, "refused by rl_limit, its error page still being sent");
    let m = ngx.get("/metrics", &[]).body;
    assert!(m.contains("\nnginx_rl_conn_in_flight{zone=\"c\"} 0\n"), "{m}");
}

/// A queued `after_auth` line: the request waits in the pre-content phase,
/// once access control has let it in, and a request access control refuses
/// never takes a place.
#[test]
fn an_after_auth_line_waits_after_access_control() {
    let ngx = Nginx::setup(&format!(
        "rl_zone c size=1m;\n\
         server {{ listen 127.0.0.1:{{PORT}}; root {{ROOT}};\n\
           location /q/ {{ rl_conn zone=c max=1 key=all queue=1 timeout=20s after_auth; {SLOW} }}\n\
           location /d/ {{ deny all; rl_conn zone=c max=1 key=all queue=1 after_auth; }}\n\
           location = /metrics {{ rl_metrics; }}\n\
         }}"
    ))
    .file("html/q/slow.html", &slow_file())
    .file("html/q/fast.html", "fast\n")
    .file("html/d/fast.html", "fast\n")
    .start();
    let (status, held) = hold(&ngx, "/q/slow.html");
    assert_eq!(status, 200);
    assert_eq!(ngx.get("/d/fast.html", &[]).status, 403, "access control first");
    assert_eq!(waiting(&ngx), 0, "a refused request took a place");
    let b = send_only(ngx.port, "/q/fast.html");
    until_waiting(&ngx, 1);
    drop(held);
    let (sb, text) = response(b);
    assert_eq!(sb, 200, "{text}");
}
