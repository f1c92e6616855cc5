//! nginx's own `limit_conn` tests (nginx-tests: `limit_conn.t`,
//! `limit_conn_complex.t`, `limit_conn_dry_run.t`), translated line for line
//! to `rl_conn`:
//!
//! - `limit_conn_zone $key zone=NAME:1m;` is `rl_zone NAME size=1m;`, the key
//!   going on the line: `limit_conn NAME N;` is
//!   `rl_conn zone=NAME max=N key=$key;`;
//! - `limit_conn_dry_run`, `limit_conn_status`, `limit_conn_log_level` and
//!   `$limit_conn_status` are `rl_dry_run`, `rl_status`, `rl_log_level` and
//!   `$rl_status`;
//! - `limit_req zone=Z burst=B` (delaying beyond the first request) is
//!   `rl_limit zone=Z rate=R algorithm=leaky_bucket burst=1 queue=B
//!   key=$key` (README, *Delaying*: `burst=B` is `burst=1 queue=B`);
//! - nginx's rejection is 503 and ours 429: where an original expects 503,
//!   the server says `rl_status 503;`;
//! - the second server the originals listen on (127.0.0.1:8081) listens on
//!   a unix socket in the prefix (the harness has one port per nginx).
//!
//! The originals hold a connection's slot with a request that a backend
//! `limit_req` delays, and start the next request right after sending it
//! (or after 0.2 s): here the next request waits for the backend's
//! "delaying request" line, which it logs once the request has passed the
//! front's pre-access phase, that is once the slot is held. The original
//! `limit_conn.t` checks that closing the client releases the slot right
//! after the close: here, once the front has logged the aborted request
//! (499) in an access log added for that purpose.

mod common;

use std::fs;
use std::io::{ErrorKind, Read};
use std::net::TcpStream;
use std::thread;
use std::time::{Duration, Instant};

use common::*;

/// The error log's length: what is logged from now on starts there.
fn log_len(ngx: &Nginx) -> usize {
    fs::metadata(ngx.prefix.join("error.log")).map_or(0, |m| m.len() as usize)
}

/// Waits (10 s at most) until `read()` has a line that contains every one
/// of `needles`; returns that line.
fn wait_for_line(what: &str, read: impl Fn() -> String, needles: &[&str]) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = read();
        if let Some(line) = text.lines().find(|l| needles.iter().all(|n| l.contains(n))) {
            return line.to_string();
        }
        assert!(Instant::now() < deadline, "no line with {needles:?} in {what}:\n{text}");
        thread::sleep(Duration::from_millis(5));
    }
}

/// `http_get($path, start => 1)` of a request that the backend's
/// `rl_limit` of zone `zone` delays: sent, not read; returned once the
/// backend has logged that it delays it (the front's slot is then held).
fn hold(ngx: &Nginx, path: &str, zone: &str) -> TcpStream {
    let from = log_len(ngx);
    let s = send_only(ngx.port, path);
    let by_zone = format!("by zone \"{zone}\"");
    wait_for_line("the error log", || ngx.error_log_since(from), &["delaying request, excess: ", &by_zone]);
    s
}

/// `limit_conn.t`'s configuration. The backend (`127.0.0.1:8081` there)
/// is a unix socket; `limit_req zone=req burst=10` at `rate=30r/m` delays
/// the second request of a key by 2 s, the third by 4 s, ...
/// `access_log` is not in the original: the test waits on it for the slot
/// of a closed client to be released.
fn limit_conn_conf() -> String {
    "rl_zone req size=1m;\n\
     \n\
     rl_zone zone size=1m;\n\
     rl_zone zone2 size=1m;\n\
     rl_zone custom size=1m;\n\
     \n\
     log_format conn '$request_uri $status $rl_status';\n\
     \n\
     server {\n\
         listen unix:{ROOT}/backend.sock;\n\
         server_name localhost;\n\
         root {ROOT};\n\
     \n\
         location /w {\n\
             rl_limit zone=req rate=30r/m algorithm=leaky_bucket burst=1 queue=10 key=$binary_remote_addr;\n\
         }\n\
     }\n\
     \n\
     server {\n\
         listen 127.0.0.1:{PORT};\n\
         server_name localhost;\n\
         root {ROOT};\n\
         # limit_conn rejects with 503 by default, rl_conn with 429.\n\
         rl_status 503;\n\
         access_log {ROOT}/../conn.log conn;\n\
     \n\
         location / {\n\
             proxy_pass http://unix:{ROOT}/backend.sock;\n\
             rl_conn zone=zone max=1 key=$binary_remote_addr;\n\
         }\n\
     \n\
         location /1 {\n\
             rl_conn zone=zone max=1 key=$binary_remote_addr;\n\
         }\n\
     \n\
         location /zone {\n\
             rl_conn zone=zone2 max=1 key=$binary_remote_addr;\n\
         }\n\
     \n\
         location /unlim {\n\
             rl_conn zone=zone max=5 key=$binary_remote_addr;\n\
         }\n\
     \n\
         location /custom {\n\
             proxy_pass http://unix:{ROOT}/backend.sock:/;\n\
             rl_log_level info;\n\
             rl_status 501;\n\
             rl_conn zone=custom max=1 key=$binary_remote_addr;\n\
         }\n\
     }\n"
    .to_string()
}

/// `limit_conn.t`, lines 89–101: while `/w` holds the key's one slot of
/// zone `zone`, `/` (same zone and location) and `/1` (same zone, another
/// location) are rejected, `/zone` (another zone) passes; once the client
/// of `/w` has closed its connection, `/1` passes.
#[test]
fn limit_conn_t_same_and_other_zones() {
    let ngx = Nginx::start(&limit_conn_conf());

    // charge limit_req (line 91)
    ngx.get("/w", &[]);

    // same and other zones in different locations (lines 93-98)
    let s = hold(&ngx, "/w", "req");
    assert_eq!(ngx.get("/", &[]).status, 503, "rejected");
    assert_eq!(ngx.get("/1", &[]).status, 503, "rejected different location");
    assert_ne!(ngx.get("/zone", &[]).status, 503, "passed different zone");

    // close $s (line 100): the front finalizes the request (499) and frees it.
    drop(s);
    let access = || fs::read_to_string(ngx.prefix.join("conn.log")).unwrap_or_default();
    wait_for_line("the access log", access, &["/w 499 "]);
    assert_ne!(ngx.get("/1", &[]).status, 503, "passed");
}

/// `limit_conn.t`, lines 103–110: `rl_status 501` and `rl_log_level info`
/// in the location (`limit_conn_status`, `limit_conn_log_level`). The
/// backend is charged first as line 91 does (this test starts its own
/// nginx).
#[test]
fn limit_conn_t_custom_status_and_log_level() {
    let ngx = Nginx::start(&limit_conn_conf());
    ngx.get("/w", &[]);

    // custom error code and log level
    let _s = hold(&ngx, "/custom/w", "req");
    assert_eq!(ngx.get("/custom", &[]).status, 501, "limit_conn_status");

    let log = ngx.error_log();
    assert!(
        log.lines().any(|l| l.contains("[info]") && l.contains("limiting connections by zone \"custom\"")),
        "limit_conn_log_level:\n{log}"
    );
}

/// `limit_conn.t`, lines 112–116: a request to a location where the key
/// has room (`max=5`) passes while `/w` holds a slot, and leaves the count
/// as it was: `/`, `max=1` on the same zone, is still rejected. The
/// backend is charged first as line 91 does (this test starts its own
/// nginx).
#[test]
fn limit_conn_t_limited_after_unlimited() {
    let ngx = Nginx::start(&limit_conn_conf());
    ngx.get("/w", &[]);

    // limited after unlimited
    let _s = hold(&ngx, "/w", "req");
    let r = ngx.get("/unlim", &[]);
    assert!(r.status == 404 && r.body.contains("404 Not Found"), "unlimited passed: {r:?}");
    let r = ngx.get("/", &[]);
    assert!(r.status == 503 && r.body.contains("503 Service"), "limited rejected: {r:?}");
}

/// `limit_conn_complex.t`'s configuration: one server, which proxies `/w`
/// to its own `/req2` (`127.0.0.1:8080` there). The keys of the original's
/// zones are on the lines: `$binary_remote_addr$arg_r` (zone `req`),
/// `$binary_remote_addr` (`re2`), `$binary_remote_addr$arg_c` (`conn`);
/// `limit_req ... burst=2` at `rate=1r/m` delays the second request of a
/// key by a minute.
fn limit_conn_complex_conf() -> String {
    "rl_zone req size=1m;\n\
     rl_zone re2 size=1m;\n\
     rl_zone conn size=1m;\n\
     \n\
     server {\n\
         listen 127.0.0.1:{PORT};\n\
         server_name localhost;\n\
         root {ROOT};\n\
         # limit_conn rejects with 503 by default, rl_conn with 429.\n\
         rl_status 503;\n\
     \n\
         location / {\n\
             rl_conn zone=conn max=1 key=$binary_remote_addr$arg_c;\n\
         }\n\
     \n\
         location /w {\n\
             rl_conn zone=conn max=1 key=$binary_remote_addr$arg_c;\n\
             proxy_pass http://127.0.0.1:{PORT}/req2;\n\
         }\n\
     \n\
         location /req {\n\
             rl_limit zone=req rate=1r/m algorithm=leaky_bucket burst=1 queue=2 key=$binary_remote_addr$arg_r;\n\
         }\n\
     \n\
         location /req2 {\n\
             rl_limit zone=re2 rate=1r/m algorithm=leaky_bucket burst=1 queue=2 key=$binary_remote_addr;\n\
         }\n\
     }\n"
    .to_string()
}

/// `limit_conn_complex.t`, lines 78–87 (the `limit_req` half, here
/// `rl_limit`'s): the second request of the key `$binary_remote_addr$arg_r`
/// is delayed (nothing to read within 1 s, as `can_read(1)`), a request of
/// another key (`?r=2`) is answered at once.
#[test]
fn limit_conn_complex_t_limit_req() {
    let ngx = Nginx::setup(&limit_conn_complex_conf()).file("html/req", "").start();

    // charge limit_req
    ngx.get("/req", &[]);

    // limit_req tests: the delay is logged first, then nothing comes within 1 s.
    let mut s = hold(&ngx, "/req", "req");
    s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    let mut buf = [0u8; 1];
    match s.read(&mut buf) {
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
        other => panic!("limit_req same key: something to read within 1 s: {other:?}"),
    }

    let r = ngx.get("/req?r=2", &[]);
    assert_eq!(r.status, 200, "limit_req different key: {r:?}");
}

/// `limit_conn_complex.t`, lines 89–97: while `/w` (proxied to `/req2`,
/// which delays it) holds the slot of the key `$binary_remote_addr$arg_c`
/// with no `c`, `/` (same key) is rejected and `/?c=2` (another key)
/// passes. The original sleeps 0.2 s after sending `/w`; here the test
/// waits for `/req2`'s "delaying request" line.
#[test]
fn limit_conn_complex_t_limit_conn() {
    let ngx = Nginx::setup(&limit_conn_complex_conf()).file("html/req", "").start();

    // limit_conn tests
    ngx.get("/req2", &[]);

    let _s = hold(&ngx, "/w", "re2");

    assert_eq!(ngx.get("/", &[]).status, 503, "limit_conn same key");
    assert_ne!(ngx.get("/?c=2", &[]).status, 503, "limit_conn different key");
}

/// `limit_conn_dry_run.t`'s configuration. The backend (`127.0.0.1:8081`
/// there) is a unix socket. The access log logs `$request_uri` where the
/// original logs `$uri`: `/` is internally redirected to `/index.html`
/// here (the harness's root has one), which `$uri` would show.
fn limit_conn_dry_run_conf() -> String {
    "rl_zone req size=1m;\n\
     rl_zone zone size=1m;\n\
     \n\
     log_format test $request_uri:$rl_status;\n\
     \n\
     server {\n\
         listen unix:{ROOT}/backend.sock;\n\
         server_name localhost;\n\
         root {ROOT};\n\
     \n\
         location /w {\n\
             rl_limit zone=req rate=30r/m algorithm=leaky_bucket burst=1 queue=10 key=$binary_remote_addr;\n\
         }\n\
     }\n\
     \n\
     server {\n\
         listen 127.0.0.1:{PORT};\n\
         server_name localhost;\n\
         root {ROOT};\n\
         # limit_conn rejects with 503 by default, rl_conn with 429.\n\
         rl_status 503;\n\
     \n\
         add_header X-Status $rl_status always;\n\
         access_log {ROOT}/../test.log test;\n\
     \n\
         location /reject {\n\
             proxy_pass http://unix:{ROOT}/backend.sock:/w;\n\
             rl_conn zone=zone max=1 key=$binary_remote_addr;\n\
         }\n\
     \n\
         location /dry {\n\
             rl_conn zone=zone max=1 key=$binary_remote_addr;\n\
             rl_dry_run on;\n\
         }\n\
     \n\
         location / { }\n\
     }\n"
    .to_string()
}

/// `limit_conn_dry_run.t`, lines 81–93: `$rl_status` is `PASSED`,
/// `REJECTED` (not `REJECTED_DRY_RUN`) and, under `rl_dry_run on`,
/// `REJECTED_DRY_RUN` with the request passing on to its 404; no line, no
/// `X-Status` (`add_header` of an empty value) and `-` in the access log;
/// the dry-run rejection is logged. The original stops nginx (line 90)
/// before reading its logs: both are written unbuffered here, before the
/// response is closed, and are read while nginx runs.
#[test]
fn limit_conn_dry_run_t() {
    let ngx = Nginx::setup(&limit_conn_dry_run_conf()).file("html/w", "").start();

    let r = ngx.get("/reject", &[]);
    assert!(r.status == 200 && r.header("X-Status") == Some("PASSED"), "passed: {r:?}");

    let s = hold(&ngx, "/reject", "req");
    let r = ngx.get("/reject", &[]);
    assert!(r.status == 503 && r.header("X-Status") == Some("REJECTED"), "rejected: {r:?}");
    let r = ngx.get("/dry", &[]);
    assert!(r.status == 404 && r.header("X-Status") == Some("REJECTED_DRY_RUN"), "rejected dry run: {r:?}");
    let r = ngx.get("/", &[]);
    assert!(r.header("X-Status").is_none(), "no limit: {r:?}");

    drop(s);

    let log = ngx.error_log();
    assert!(log.contains("limiting connections, dry run, by zone \"zone\""), "log dry run:\n{log}");
    let test_log = fs::read_to_string(ngx.prefix.join("test.log")).unwrap_or_default();
    assert!(test_log.lines().any(|l| l == "/:-"), "log not found:\n{test_log}");
}
