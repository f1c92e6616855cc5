//! Memcached for the integration tests: a throw-away `memcached` (Debian's
//! package, `/usr/bin/memcached`) on a loopback port, spawned as a child and
//! killed on drop, and a raw text-protocol client to look at what a
//! memcached zone stored (`lru_crawler metadump`, `mg`, `stats`).

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use super::free_port;

const BIN: &str = "/usr/bin/memcached";

/// Spawns memcached on `port` (TCP only, 64 MB); waits until it answers
/// `version`. `None` if it exited (e.g. the port was taken meanwhile).
fn spawn(port: u16) -> Option<Child> {
    let mut child = Command::new(BIN)
        // `-u`: memcached refuses to run as root without it (ignored otherwise).
        .args(["-u", "nobody", "-l", "127.0.0.1", "-p", &port.to_string(), "-U", "0", "-m", "64"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("cannot run /usr/bin/memcached (is the memcached package installed?)");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(Some(_)) = child.try_wait() {
            return None;
        }
        if command(port, "version", |r| r.ends_with("\r\n")).is_ok_and(|r| r.starts_with("VERSION ")) {
            return Some(child);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// Sends `cmd` (a line, `\r\n` added) to memcached on `port`, on a
/// connection of its own, and reads until `done` says the reply is whole.
fn command(port: u16, cmd: &str, done: impl Fn(&str) -> bool) -> std::io::Result<String> {
    let mut s = TcpStream::connect((Ipv4Addr::LOCALHOST, port))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.write_all(format!("{cmd}\r\n").as_bytes())?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 64 * 1024];
    while !done(&String::from_utf8_lossy(&buf)) {
        let n = s.read(&mut chunk)?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// A reply that ends with `END\r\n` (metadump, stats) or is an error line.
fn ended(r: &str) -> bool {
    r.ends_with("END\r\n") || (r.ends_with("\r\n") && (r.starts_with("BUSY") || r.contains("ERROR")))
}

/// Every thread of process `pid` is stopped (state `T` in its stat).
fn all_stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return false };
    tasks.flatten().all(|t| {
        let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
        // "tid (comm) S ...": the state after the last ')'.
        stat.rsplit_once(')').and_then(|(_, r)| r.split_whitespace().next()) == Some("T")
    })
}

/// `%XX` sequences decoded (memcached's metadump URL-encodes keys).
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = b.get(i + 1..i + 3).and_then(|h| u8::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok());
        match (b[i], hex) {
            (b'%', Some(v)) => {
                out.push(v);
                i += 3;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// One `memcached` on 127.0.0.1.
pub struct Memcached {
    pub port: u16,
    child: Option<Child>,
    /// Every key a dump listed since the server (re)started (see
    /// [`Memcached::keys`]).
    seen: std::cell::RefCell<Vec<(String, i64)>>,
}

impl Memcached {
    pub fn start() -> Memcached {
        for _ in 0..5 {
            let port = free_port();
            if let Some(child) = spawn(port) {
                return Memcached { port, child: Some(child), seen: Default::default() };
            }
        }
        panic!("memcached did not start");
    }

    /// `127.0.0.1:PORT`, as `memcached=` takes it.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Kills the server (SIGKILL: no goodbye to its clients).
    pub fn stop(&mut self) {
        self.seen.borrow_mut().clear();
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Stops it (if running) and starts a new, empty server on the same port.
    pub fn restart(&mut self) {
        self.stop();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(c) = spawn(self.port) {
                self.child = Some(c);
                return;
            }
            assert!(Instant::now() < deadline, "memcached did not restart on port {}", self.port);
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends the server a signal: `"STOP"`, `"CONT"` (or `kill`'s `-STOP`).
    pub fn signal(&self, sig: &str) {
        let pid = self.child.as_ref().map(Child::id).expect("memcached is not running");
        let sig = format!("-{}", sig.trim_start_matches('-'));
        let ok = Command::new("kill").args([&sig, &pid.to_string()]).status().is_ok_and(|s| s.success());
        assert!(ok, "kill {sig} {pid}");
        if sig == "-STOP" {
            // A stop reaches each of memcached's threads on its way back to user space: one
            // in the middle of a command still answers it. Frozen is every thread stopped.
            let deadline = Instant::now() + Duration::from_secs(5);
            while !all_stopped(pid) {
                assert!(Instant::now() < deadline, "memcached {pid} not stopped 5 s after SIGSTOP");
                thread::sleep(Duration::from_millis(2));
            }
        }
    }

    /// Every key and its expiry (Unix seconds, -1 for none) that
    /// `lru_crawler metadump all` listed since the server (re)started, keys
    /// decoded, sorted by key. A dump is no snapshot: it misses items that
    /// move between LRU lists while it runs (one just written), at times
    /// for seconds, so every key any dump listed is kept (the tests delete
    /// none; a key gone reads as a miss in [`Memcached::get`]).
    pub fn keys(&self) -> Vec<(String, i64)> {
        let mut all: Vec<(String, i64)> = self.seen.borrow().clone();
        let mut last: Option<Vec<(String, i64)>> = None;
        for _ in 0..10 {
            let now = self.dump();
            for k in &now {
                if !all.iter().any(|(a, _)| *a == k.0) {
                    all.push(k.clone());
                }
            }
            if last.as_ref() == Some(&now) {
                break;
            }
            last = Some(now);
        }
        all.sort();
        *self.seen.borrow_mut() = all.clone();
        all
    }

    /// One `lru_crawler metadump all`.
    fn dump(&self) -> Vec<(String, i64)> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let out = loop {
            let out = command(self.port, "lru_crawler metadump all", ended).expect("metadump");
            // The crawler runs one job at a time: a dump asked for too soon after another waits.
            if !out.starts_with("BUSY") || Instant::now() > deadline {
                break out;
            }
            thread::sleep(Duration::from_millis(20));
        };
        assert!(out.ends_with("END\r\n"), "lru_crawler metadump all: {out:?}");
        let mut keys: Vec<(String, i64)> = out
            .lines()
            .filter_map(|l| {
                let field = |name: &str| l.split(' ').find_map(|f| f.strip_prefix(name));
                Some((percent_decode(field("key=")?), field("exp=")?.parse().ok()?))
            })
            .collect();
        keys.sort();
        keys
    }

    /// The value of `key` as a number (`mg <key> v`); `None` on a miss.
    pub fn get(&self, key: &str) -> Option<u64> {
        // `EN\r\n`, or `VA <len> [flags]\r\n<data>\r\n`.
        let whole = |r: &str| r.starts_with("EN\r\n") || r.matches("\r\n").count() >= 2 || r.contains("ERROR");
        let out = command(self.port, &format!("mg {key} v"), whole).expect("mg");
        if out.starts_with("EN\r\n") {
            return None;
        }
        let data = out.strip_prefix("VA ").and_then(|r| r.split("\r\n").nth(1));
        // (memcached pads a counter that shrank in place with spaces)
        let n = data.and_then(|d| d.trim_end().parse().ok());
        Some(n.unwrap_or_else(|| panic!("mg {key} v: not a number: {out:?}")))
    }

    /// A counter of `stats` (e.g. `total_connections`).
    pub fn stat(&self, name: &str) -> u64 {
        let out = command(self.port, "stats", ended).expect("stats");
        let prefix = format!("STAT {name} ");
        out.lines()
            .find_map(|l| l.strip_prefix(&prefix).and_then(|v| v.trim().parse().ok()))
            .unwrap_or_else(|| panic!("no {name} in stats:\n{out}"))
    }
}

impl Drop for Memcached {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Error-log lines of memcached failures of zone `zone`
/// (`rl_zone "z" memcached 127.0.0.1:PORT failed: ...`).
pub fn mc_failed_lines(log: &str, zone: &str) -> Vec<String> {
    let tag = format!("rl_zone \"{zone}\" memcached ");
    log.lines().filter(|l| l.contains(&tag) && l.contains(" failed: ")).map(String::from).collect()
}

/// A memcached zone's state key, `{prefix}{tag}:{line}:{window µs}:{index}`
/// (tag and line 16 hex digits each), split; `None` if it has another shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StateKey {
    pub prefix: String,
    pub tag: String,
    pub line: String,
    pub window_us: u64,
    pub index: u64,
}

impl StateKey {
    pub fn parse(key: &str) -> Option<StateKey> {
        let hex16 = |s: &str| s.len() == 16 && s.bytes().all(|b| b.is_ascii_hexdigit());
        let mut parts = key.rsplitn(4, ':');
        let index = parts.next()?.parse().ok()?;
        let window_us = parts.next()?.parse().ok()?;
        let line = parts.next()?;
        let head = parts.next()?;
        let (prefix, tag) = head.split_at(head.len().checked_sub(16)?);
        (hex16(tag) && hex16(line)).then(|| StateKey {
            prefix: prefix.to_string(),
            tag: tag.to_string(),
            line: line.to_string(),
            window_us,
            index,
        })
    }

    /// When the key's window ends, in Unix seconds.
    pub fn window_end_s(&self) -> u64 {
        (self.index + 1) * self.window_us / 1_000_000
    }
}
