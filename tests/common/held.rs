//! Requests that hold an `rl_conn` slot: a file sent slowly keeps its
//! request (and its slot) in flight for as long as the test keeps the
//! connection; the zone's waiting gauge tells who waits.

use std::io::{BufRead, BufReader, Read};
use std::net::TcpStream;
use std::thread;
use std::time::{Duration, Instant};

use super::{send_only, Nginx};

/// A file slow to send: its first kilobyte at once, then 1 byte a second.
pub fn slow_file() -> String {
    "x".repeat(4096)
}

/// nginx directives that send a file so: a request for it stays in flight.
pub const SLOW: &str = "limit_rate_after 1k; limit_rate 1;";

/// A request to `path` whose response starts and does not end: returns
/// its status and the connection holding it (dropping it closes it).
pub fn hold(ngx: &Nginx, path: &str) -> (u16, TcpStream) {
    let s = send_only(ngx.port, path);
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut reader = BufReader::new(s.try_clone().unwrap());
    let mut status_line = String::new();
    reader.read_line(&mut status_line).unwrap_or_else(|e| panic!("no status line for {path}: {e}"));
    let status = status_line.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, s)
}

/// The zone's `nginx_rl_conn_waiting` gauge.
pub fn waiting(ngx: &Nginx) -> u64 {
    let m = ngx.get("/metrics", &[]).body;
    m.lines()
        .find_map(|l| l.strip_prefix("nginx_rl_conn_waiting{zone=\"c\"} "))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no waiting gauge:\n{m}"))
}

/// Polls the gauge until it reads `n` (10 s at most).
pub fn until_waiting(ngx: &Nginx, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while waiting(ngx) != n {
        assert!(Instant::now() < deadline, "never {n} waiting:\n{}", ngx.error_log());
        thread::sleep(Duration::from_millis(5));
    }
}

/// Reads a whole response from a request sent with [`send_only`].
pub fn response(s: TcpStream) -> (u16, String) {
    let mut text = String::new();
    let mut r = BufReader::new(s);
    let _ = r.read_to_string(&mut text);
    let status = text.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, text)
}
