//! A Redis zone's host name: with the `http` block's `resolver`, resolved
//! at each connection attempt, so that a Redis behind a name that moves is
//! followed; without one, resolved when the worker starts.
//!
//! The name server is the test's own (UDP on loopback, A records only,
//! a TTL of 1 s); the Redis a name moves to listens on 127.0.0.2, the same
//! port as the first on 127.0.0.1.

mod common;

use std::net::{Ipv4Addr, UdpSocket};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::redis::*;
use common::*;

const NAME: &str = "redis.rl.test";

/// A name server that answers `A` queries for [`NAME`] with the address it
/// holds (others: no answer), and counts the queries for the name.
struct Dns {
    port: u16,
    addr: Arc<AtomicU32>,
    asked: Arc<AtomicUsize>,
}

impl Dns {
    fn start(first: Ipv4Addr) -> Dns {
        let sock = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let port = sock.local_addr().unwrap().port();
        let addr = Arc::new(AtomicU32::new(u32::from(first)));
        let asked = Arc::new(AtomicUsize::new(0));
        let (a, n) = (addr.clone(), asked.clone());
        thread::spawn(move || {
            let mut buf = [0u8; 512];
            loop {
                let Ok((len, from)) = sock.recv_from(&mut buf) else { return };
                if let Some(reply) = answer(&buf[..len], Ipv4Addr::from(a.load(Ordering::SeqCst)), &n) {
                    let _ = sock.send_to(&reply, from);
                }
            }
        });
        Dns { port, addr, asked }
    }

    fn point_to(&self, ip: Ipv4Addr) {
        self.addr.store(u32::from(ip), Ordering::SeqCst);
    }
}

/// The reply to one query: the question echoed, and an `A` record of `ip`
/// (TTL 1 s) when it asks `A` of [`NAME`].
fn answer(q: &[u8], ip: Ipv4Addr, asked: &AtomicUsize) -> Option<Vec<u8>> {
    if q.len() < 12 {
        return None;
    }
    // The question's name, as labels.
    let mut i = 12;
    let mut labels = Vec::new();
    while i < q.len() && q[i] != 0 {
        let l = q[i] as usize;
        labels.push(String::from_utf8_lossy(q.get(i + 1..i + 1 + l)?).to_ascii_lowercase());
        i += 1 + l;
    }
    let end = i + 5; // the zero label, type, class
    let qtype = u16::from_be_bytes([*q.get(i + 1)?, *q.get(i + 2)?]);
    let ours = labels.join(".") == NAME && qtype == 1;
    if ours {
        asked.fetch_add(1, Ordering::SeqCst);
    }
    let mut r = Vec::with_capacity(end + 16);
    r.extend_from_slice(&q[..2]); // id
    r.extend_from_slice(&[0x81, 0x80]); // a response, recursion desired and available, no error
    r.extend_from_slice(&[0, 1, 0, u8::from(ours), 0, 0, 0, 0]);
    r.extend_from_slice(q.get(12..end)?);
    if ours {
        r.extend_from_slice(&[0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 1, 0, 4]);
        r.extend_from_slice(&ip.octets());
    }
    Some(r)
}

/// A second redis-server, on 127.0.0.2:`port`.
fn redis_on_127_0_0_2(port: u16) -> Child {
    let dir = std::env::temp_dir().join(format!("nginx-rl-resolver-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.2", "--save", "", "--appendonly", "no"])
        .arg("--dir")
        .arg(&dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server");
    let deadline = Instant::now() + Duration::from_secs(10);
    while cli2(port, &["PING"]) != "PONG" {
        assert!(Instant::now() < deadline, "redis-server on 127.0.0.2:{port} did not start");
        thread::sleep(Duration::from_millis(10));
    }
    child
}

fn cli2(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.2", "-p", &port.to_string()])
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .expect("redis-cli");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn conf(resolver: &str, url: &str) -> String {
    server(
        &format!("{resolver}\nrl_zone r redis={url} timeout=1s on_error=deny;"),
        "location = /a.html { rl_limit zone=r key=$http_x_k rate=100r/h; }",
    )
}

#[test]
fn a_name_that_moves_is_followed_with_a_resolver() {
    let mut a = Redis::start();
    let dns = Dns::start(Ipv4Addr::LOCALHOST);
    let ngx = Nginx::start(&conf(
        &format!("resolver 127.0.0.1:{} valid=1s ipv6=off; resolver_timeout 2s;", dns.port),
        &format!("redis://{NAME}:{}", a.port),
    ));
    assert_eq!(ngx.get("/a.html", &[("X-K", "one")]).status, 200);
    assert_eq!(a.keys("rl:*").len(), 1, "the first Redis holds the key's state");
    assert!(dns.asked.load(Ordering::SeqCst) >= 1, "the name was not asked of nginx's resolver");

    // The name moves; the first Redis goes away (its connections with it).
    let mut b = redis_on_127_0_0_2(a.port);
    dns.point_to(Ipv4Addr::new(127, 0, 0, 2));
    a.stop();
    // nginx's resolver keeps an answer for its `valid=` time (1 s).
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut statuses = Vec::new();
    loop {
        let s = ngx.get("/a.html", &[("X-K", "two")]).status;
        statuses.push(s);
        if s == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "never decided by the Redis the name moved to: {statuses:?}");
        thread::sleep(Duration::from_millis(100));
    }
    let keys = cli2(a.port, &["--scan", "--pattern", "rl:*"]);
    let _ = b.kill();
    let _ = b.wait();
    // (the state key; beside it, the memo of the call that wrote it)
    let states = keys.lines().filter(|k| !is_memo(k)).count();
    assert_eq!(states, 1, "the second Redis holds the state of the request it decided: {keys:?}");
    let log = ngx.error_log();
    assert!(crash_lines(&log).is_empty(), "{:?}", crash_lines(&log));
}

#[test]
fn a_name_is_resolved_at_start_without_a_resolver() {
    let redis = Redis::start();
    let ngx = Nginx::start(&conf("", &format!("redis://localhost:{}", redis.port)));
    for _ in 0..3 {
        assert_eq!(ngx.get("/a.html", &[("X-K", "k")]).status, 200);
    }
    assert_eq!(redis.keys("rl:*").len(), 1, "Redis at localhost holds the key's state");
    let log = ngx.error_log();
    assert!(failed_lines(&log, "r").is_empty(), "{:?}", failed_lines(&log, "r"));
}
