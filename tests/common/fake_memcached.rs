//! A misbehaving memcached for the tests: a small TCP server on 127.0.0.1
//! (std threads, one per connection) that reads text-protocol command lines
//! and answers them the way it is told to: as memcached would, not at all,
//! with bytes that are not a reply, with half a reply, with a server error,
//! late, or by closing the connection as soon as it is accepted.
//!
//! It counts the connections it accepted and the commands it read.

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

/// How the fake answers each command.
#[derive(Clone, Copy, Debug)]
pub enum Behaviour {
    /// Reads every command and never answers.
    Silent,
    /// Answers every command with `HELLO\r\n` (no reply memcached sends).
    Garbage,
    /// Answers the first command with half of a `VA` reply, then nothing
    /// more on that connection.
    Half,
    /// Closes each connection as soon as it is accepted.
    CloseAtOnce,
    /// Answers as memcached would (see [`healthy`]), each command after this delay.
    Slow(Duration),
    /// Answers every command with `SERVER_ERROR out of memory\r\n`.
    ServerError,
    /// Answers as memcached would, each reply followed by `JUNK\r\n`.
    Trailing,
}

/// The fake server; stopped on drop.
pub struct FakeMemcached {
    pub port: u16,
    accepted: Arc<AtomicUsize>,
    commands: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    acceptor: Option<JoinHandle<()>>,
}

impl FakeMemcached {
    pub fn start(behaviour: Behaviour) -> FakeMemcached {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("cannot bind the fake memcached");
        let port = listener.local_addr().unwrap().port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let commands = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let acceptor = {
            let (accepted, commands, stop) = (accepted.clone(), commands.clone(), stop.clone());
            thread::spawn(move || {
                for stream in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        return;
                    }
                    let Ok(stream) = stream else { continue };
                    accepted.fetch_add(1, Ordering::SeqCst);
                    if matches!(behaviour, Behaviour::CloseAtOnce) {
                        let _ = stream.shutdown(Shutdown::Both);
                        continue;
                    }
                    let (commands, stop) = (commands.clone(), stop.clone());
                    let _ = thread::Builder::new()
                        .stack_size(128 * 1024)
                        .spawn(move || serve(stream, behaviour, &commands, &stop));
                }
            })
        };
        FakeMemcached { port, accepted, commands, stop, acceptor: Some(acceptor) }
    }

    /// `127.0.0.1:PORT`, as `memcached=` takes it.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    /// Command lines read so far.
    pub fn commands(&self) -> usize {
        self.commands.load(Ordering::SeqCst)
    }
}

impl Drop for FakeMemcached {
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
fn serve(mut s: TcpStream, b: Behaviour, commands: &AtomicUsize, stop: &AtomicBool) {
    let _ = s.set_read_timeout(Some(Duration::from_millis(100)));
    let _ = s.set_nodelay(true);
    let mut buf: Vec<u8> = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    // After half a reply, nothing more on this connection.
    let mut stuck = false;
    while !stop.load(Ordering::SeqCst) {
        match s.read(&mut chunk) {
            Ok(0) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => continue,
            Err(_) => return,
        }
        while let Some(end) = buf.windows(2).position(|w| w == b"\r\n") {
            let line = String::from_utf8_lossy(&buf[..end]).into_owned();
            buf.drain(..end + 2);
            commands.fetch_add(1, Ordering::SeqCst);
            if stuck {
                continue;
            }
            let reply = match b {
                Behaviour::Silent => continue,
                Behaviour::Garbage => "HELLO\r\n".to_string(),
                Behaviour::ServerError => "SERVER_ERROR out of memory\r\n".to_string(),
                Behaviour::Half => {
                    stuck = true;
                    "VA 2\r\n1".to_string()
                }
                Behaviour::Slow(d) => {
                    // One at a time: the next command waits for this one.
                    let mut left = d;
                    while !left.is_zero() && !stop.load(Ordering::SeqCst) {
                        let step = left.min(Duration::from_millis(50));
                        thread::sleep(step);
                        left -= step;
                    }
                    healthy(&line)
                }
                Behaviour::CloseAtOnce => return,
                Behaviour::Trailing => healthy(&line) + "JUNK\r\n",
            };
            if s.write_all(reply.as_bytes()).is_err() {
                return;
            }
        }
    }
}

/// memcached's answer to `line` for counters that admit everything: `ma`
/// gets `VA 1` / `1`, `mg` a miss (`EN`), `mn` `MN`, `version` a version.
fn healthy(line: &str) -> String {
    match line.split(' ').next().unwrap_or("") {
        "ma" => "VA 1\r\n1\r\n".into(),
        "mg" => "EN\r\n".into(),
        "mn" => "MN\r\n".into(),
        "version" => "VERSION 1.6.18\r\n".into(),
        _ => "ERROR\r\n".into(),
    }
}
