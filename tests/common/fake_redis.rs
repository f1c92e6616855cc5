//! A misbehaving Redis for the tests: a small TCP server on 127.0.0.1 (std
//! threads, one per connection) that speaks just enough RESP to be taken for
//! Redis, and answers the limit script's call (`FCALL`, `EVALSHA`, `EVAL`)
//! the way it is told to: not at all, with bytes that are not RESP, with a
//! reply of the wrong shape or out of range, with half a reply, by closing
//! the connection, or late.
//!
//! It counts the connections it accepted (a zone that reconnects without
//! back-off shows there), and answers a connection's setup (`CLIENT
//! SETINFO`, `HELLO`, `PING`, ...) with `+OK` unless it is [`Behaviour::Mute`],
//! so that a misbehaving call meets an established connection.

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How the fake answers the limit script's call.
#[derive(Clone, Debug)]
pub enum Behaviour {
    /// Answers as Redis would for lines that admit everything: remaining
    /// 0, reset 1 ms (in range for any line with a window of at least 1 ms).
    Healthy,
    /// Answers the setup, then reads every command and never answers; a
    /// connection that met this stays silent when the behaviour changes
    /// (as a path that stopped delivering), new connections do not.
    Silent,
    /// Answers nothing at all, not even the setup.
    Mute,
    /// Answers the call with bytes that are not RESP.
    Garbage,
    /// Answers the call with these bytes (well-formed RESP of the wrong
    /// shape: a bulk string, an error, an array of strings...).
    Raw(&'static str),
    /// Answers the call with a well-formed array of integers: the time in
    /// ms, then for each of its lines (one per key) these three values
    /// (remaining, reset_us, retry-after in µs or -2 if admitted).
    Lines(i64, i64, i64),
    /// Sends the first half of an array, then nothing more on that
    /// connection.
    Unfinished,
    /// Closes the connection when the call arrives.
    CloseOnCall,
    /// Answers the calls as [`Behaviour::Healthy`] does, but each after
    /// this delay, one at a time (a server too slow for the zone).
    Slow(Duration),
}

/// The fake server; stopped on drop.
pub struct FakeRedis {
    pub port: u16,
    behaviour: Arc<Mutex<Behaviour>>,
    accepted: Arc<AtomicUsize>,
    calls: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    acceptor: Option<JoinHandle<()>>,
}

impl FakeRedis {
    pub fn start(behaviour: Behaviour) -> FakeRedis {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("cannot bind the fake Redis");
        let port = listener.local_addr().unwrap().port();
        let behaviour = Arc::new(Mutex::new(behaviour));
        let accepted = Arc::new(AtomicUsize::new(0));
        let calls = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let acceptor = {
            let (behaviour, accepted, calls, stop) = (behaviour.clone(), accepted.clone(), calls.clone(), stop.clone());
            thread::spawn(move || {
                for stream in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        return;
                    }
                    let Ok(stream) = stream else { continue };
                    accepted.fetch_add(1, Ordering::SeqCst);
                    let (behaviour, calls, stop) = (behaviour.clone(), calls.clone(), stop.clone());
                    let _ = thread::Builder::new()
                        .stack_size(128 * 1024)
                        .spawn(move || serve(stream, &behaviour, &calls, &stop));
                }
            })
        };
        FakeRedis { port, behaviour, accepted, calls, stop, acceptor: Some(acceptor) }
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    /// Script calls received so far.
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    /// Changes how calls are answered from now on (on every connection).
    pub fn set(&self, b: Behaviour) {
        *self.behaviour.lock().unwrap() = b;
    }
}

impl Drop for FakeRedis {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the acceptor up.
        let _ = TcpStream::connect((Ipv4Addr::LOCALHOST, self.port));
        if let Some(t) = self.acceptor.take() {
            let _ = t.join();
        }
    }
}

/// Serves one connection until the peer closes it or the server stops.
fn serve(mut s: TcpStream, behaviour: &Mutex<Behaviour>, calls: &AtomicUsize, stop: &AtomicBool) {
    let _ = s.set_read_timeout(Some(Duration::from_millis(100)));
    let _ = s.set_nodelay(true);
    let mut buf: Vec<u8> = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    // Silent once, silent for good: a path that stopped delivering.
    let mut latched = false;
    while !stop.load(Ordering::SeqCst) {
        match s.read(&mut chunk) {
            Ok(0) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => continue,
            Err(_) => return,
        }
        while let Some((cmd, used)) = parse_command(&buf) {
            buf.drain(..used);
            let b = behaviour.lock().unwrap().clone();
            if latched {
                continue;
            }
            if matches!(b, Behaviour::Silent | Behaviour::Unfinished) && is_script(&cmd) {
                latched = true;
            }
            if answer(&mut s, &cmd, &b, calls, stop).is_err() {
                let _ = s.shutdown(Shutdown::Both);
                return;
            }
        }
    }
}

/// One command's answer; `Err` closes the connection.
fn answer(s: &mut TcpStream, cmd: &[Vec<u8>], b: &Behaviour, calls: &AtomicUsize, stop: &AtomicBool) -> io::Result<()> {
    let script = is_script(cmd);
    if script {
        calls.fetch_add(1, Ordering::SeqCst);
    }
    if matches!(b, Behaviour::Mute) || (script && matches!(b, Behaviour::Silent)) {
        return Ok(());
    }
    if !script {
        return s.write_all(b"+OK\r\n");
    }
    if let Behaviour::Slow(d) = b {
        // One at a time: the next command waits for this one.
        let mut left = *d;
        while !left.is_zero() && !stop.load(Ordering::SeqCst) {
            let step = left.min(Duration::from_millis(50));
            thread::sleep(step);
            left -= step;
        }
    }
    // FCALL name numkeys key... arg...: one line per key, but the call's
    // memo key, the last (see rl_core::redis::write_memo_key).
    let keys: usize = cmd.get(2).and_then(|n| String::from_utf8_lossy(n).parse().ok()).unwrap_or(0);
    let memo = keys > 0 && cmd.get(2 + keys).is_some_and(|k| String::from_utf8_lossy(k).contains(":c:"));
    let lines = keys - usize::from(memo);
    // The undo of a call (whose reply went missing): taken back.
    if cmd.get(1).is_some_and(|f| f.ends_with(b"_undo")) && matches!(b, Behaviour::Healthy | Behaviour::Slow(_)) {
        return s.write_all(b"*2\r\n:0\r\n:1\r\n");
    }
    let reply = match b {
        Behaviour::Healthy | Behaviour::Slow(_) => integers(lines, (0, 1000, -2)),
        Behaviour::Lines(rem, reset, retry) => integers(lines, (*rem, *reset, *retry)),
        Behaviour::Garbage => "this is not RESP at all\r\n".to_string(),
        Behaviour::Raw(r) => r.to_string(),
        Behaviour::Unfinished => {
            let full = integers(lines, (0, 1000, -2));
            full[..full.len() / 2].to_string()
        }
        Behaviour::CloseOnCall => return Err(io::Error::other("close")),
        Behaviour::Silent | Behaviour::Mute => unreachable!(),
    };
    s.write_all(reply.as_bytes())
}

/// Whether `cmd` calls the limit script.
fn is_script(cmd: &[Vec<u8>]) -> bool {
    let name = cmd.first().map(|c| String::from_utf8_lossy(c).to_ascii_uppercase()).unwrap_or_default();
    matches!(name.as_str(), "FCALL" | "EVALSHA" | "EVAL")
}

/// The script's reply: `*N :now_ms` then the values of each line (remaining,
/// reset, retry-after or code, delay 0).
fn integers(lines: usize, (rem, reset, retry): (i64, i64, i64)) -> String {
    let now_ms = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis();
    let per_line = rl_core::redis::REPLY_PER_LINE;
    let mut out = format!("*{}\r\n:{now_ms}\r\n", 1 + per_line * lines);
    for _ in 0..lines {
        // (no delay; no wait for one more unit: the lines do not ask for it)
        out.push_str(&format!(":{rem}\r\n:{reset}\r\n:{retry}\r\n:0\r\n:0\r\n"));
    }
    out
}

/// A complete command at the start of `buf` (an array of bulk strings, as
/// clients send them) and the bytes it took; `None` until it is all there.
fn parse_command(buf: &[u8]) -> Option<(Vec<Vec<u8>>, usize)> {
    fn line(buf: &[u8], at: usize) -> Option<(&[u8], usize)> {
        let rest = buf.get(at..)?;
        let end = rest.windows(2).position(|w| w == b"\r\n")?;
        Some((&rest[..end], at + end + 2))
    }
    let (head, mut at) = line(buf, 0)?;
    let n: usize = std::str::from_utf8(head.strip_prefix(b"*")?).ok()?.parse().ok()?;
    let mut parts = Vec::with_capacity(n);
    for _ in 0..n {
        let (len, next) = line(buf, at)?;
        let len: usize = std::str::from_utf8(len.strip_prefix(b"$")?).ok()?.parse().ok()?;
        let data = buf.get(next..next + len)?;
        if buf.get(next + len..next + len + 2)? != b"\r\n" {
            return None;
        }
        parts.push(data.to_vec());
        at = next + len + 2;
    }
    Some((parts, at))
}
