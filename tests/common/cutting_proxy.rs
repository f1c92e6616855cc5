//! A TCP proxy between nginx and a real Redis that loses Redis' replies to
//! script calls: the call has run in Redis, nginx never learns its outcome.
//!
//! It listens on 127.0.0.1 (a port of its own) and forwards each accepted
//! connection to Redis (std threads, two a connection). It follows both
//! directions as RESP: the commands nginx sends (noting which are script
//! calls, `FCALL`, `EVALSHA` or `EVAL`, whatever their case) and Redis'
//! replies, matched to them in order. Told to (shared atomic state, changed
//! at any time), it cuts a script call's reply: drops its bytes and closes
//! both sockets — every Nth call, or each with a probability drawn from a
//! seeded RNG; optionally only calls a filter picks, only a call alone on
//! its connection (then no other call on it is lost with it), only on a
//! connection open for some time. After a cut, or when told, it refuses
//! (accepts and closes at once) or blackholes (accepts, reads and forwards
//! nothing, closes when the time is up) new connections for a while.
//!
//! It counts what it did ([`Stats`]), so that a test can assert that it
//! cut at all, and the calls forwarded but not answered yet, so that a test
//! can wait until nothing is in flight.

use std::collections::{HashMap, VecDeque};
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// Which script calls may be cut: given the command (its name, then its
/// arguments, e.g. `FCALL rl_... numkeys key... arg...`).
pub type Filter = Arc<dyn Fn(&[Vec<u8>]) -> bool + Send + Sync>;

/// What becomes of new connections while they are blocked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Block {
    /// Accepted and closed at once.
    Refuse,
    /// Accepted, read and never answered nor forwarded; closed when the
    /// block ends.
    Blackhole,
}

/// What the proxy has done so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Connections accepted (forwarded, refused and blackholed).
    pub connections: u64,
    /// Connections refused ([`Block::Refuse`]).
    pub refused: u64,
    /// Connections blackholed ([`Block::Blackhole`]).
    pub blackholed: u64,
    /// Script calls forwarded to Redis.
    pub calls: u64,
    /// Replies to script calls forwarded to nginx.
    pub replies: u64,
    /// Replies to script calls dropped, their connection closed.
    pub cuts: u64,
    /// Bytes either side sent that were not RESP (or a reply nothing asked
    /// for): the proxy closed that connection. Should stay 0.
    pub protocol_errors: u64,
}

#[derive(Default)]
struct Counters {
    connections: AtomicU64,
    refused: AtomicU64,
    blackholed: AtomicU64,
    calls: AtomicU64,
    replies: AtomicU64,
    cuts: AtomicU64,
    protocol_errors: AtomicU64,
    /// Script replies that met the cutting policy's conditions (the filter,
    /// alone on the connection, no block in effect): what `every` counts.
    eligible: AtomicU64,
}

struct Shared {
    upstream: SocketAddr,
    stop: AtomicBool,
    /// Cut every Nth eligible reply (0: not by count).
    every: AtomicU64,
    /// Cut each eligible reply with this probability, in millionths (0: not by chance).
    chance_ppm: AtomicU64,
    rng: Mutex<u64>,
    /// Cut only a reply whose call is alone on its connection.
    lone_only: AtomicBool,
    /// Cut only on a connection open at least this long (ms).
    min_age_ms: AtomicU64,
    /// Hold a reply to cut this long (ms) before dropping it.
    hold_ms: AtomicU64,
    filter: RwLock<Option<Filter>>,
    /// After each cut, block new connections this long, so.
    block_after_cut: Mutex<Option<(Duration, Block)>>,
    /// New connections blocked until then, so.
    blocked: Mutex<Option<(Instant, Block)>>,
    counters: Counters,
    /// Commands forwarded to Redis and not answered, on open connections.
    outstanding: AtomicUsize,
    /// The open connections' sockets (both sides), closed on drop.
    live: Mutex<HashMap<u64, (TcpStream, TcpStream)>>,
    next_id: AtomicU64,
}

/// The proxy; stopped (and every connection through it closed) on drop.
pub struct CuttingProxy {
    pub port: u16,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

impl CuttingProxy {
    /// A proxy to the Redis on 127.0.0.1:`redis_port`, cutting nothing yet.
    pub fn start(redis_port: u16) -> CuttingProxy {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("cannot bind the cutting proxy");
        let port = listener.local_addr().unwrap().port();
        let shared = Arc::new(Shared {
            upstream: SocketAddr::from((Ipv4Addr::LOCALHOST, redis_port)),
            stop: AtomicBool::new(false),
            every: AtomicU64::new(0),
            chance_ppm: AtomicU64::new(0),
            rng: Mutex::new(0),
            lone_only: AtomicBool::new(false),
            min_age_ms: AtomicU64::new(0),
            hold_ms: AtomicU64::new(0),
            filter: RwLock::new(None),
            block_after_cut: Mutex::new(None),
            blocked: Mutex::new(None),
            counters: Counters::default(),
            outstanding: AtomicUsize::new(0),
            live: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
        });
        let acceptor = {
            let shared = shared.clone();
            thread::spawn(move || accept_loop(listener, shared))
        };
        CuttingProxy { port, shared, acceptor: Some(acceptor) }
    }

    /// `redis://127.0.0.1:PORT`: the proxy's address as a zone's URL.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Cut every `n`th eligible reply from now on (0: stop cutting by count).
    pub fn cut_every(&self, n: u64) {
        self.shared.counters.eligible.store(0, Ordering::SeqCst);
        self.shared.every.store(n, Ordering::SeqCst);
    }

    /// Cut each eligible reply with probability `p` (0 to 1), drawn from an
    /// RNG seeded with `seed` (0: stop cutting by chance).
    pub fn cut_randomly(&self, p: f64, seed: u64) {
        *self.shared.rng.lock().unwrap() = seed;
        self.shared.chance_ppm.store((p.clamp(0.0, 1.0) * 1e6) as u64, Ordering::SeqCst);
    }

    /// Stop cutting (blocks in effect run their course).
    pub fn stop_cutting(&self) {
        self.shared.every.store(0, Ordering::SeqCst);
        self.shared.chance_ppm.store(0, Ordering::SeqCst);
        *self.shared.block_after_cut.lock().unwrap() = None;
    }

    /// Cut only the replies of script calls `f` picks (`None`: any).
    pub fn only_calls(&self, f: Option<Filter>) {
        *self.shared.filter.write().unwrap() = f;
    }

    /// Cut only a reply whose call is the only command in flight on its
    /// connection (as far as the proxy has read nginx's side), so that the
    /// cut loses no other call.
    pub fn only_lone_calls(&self, yes: bool) {
        self.shared.lone_only.store(yes, Ordering::SeqCst);
    }

    /// Cut only on a connection that has been open at least `d` (nginx-rl
    /// counts a connection lost younger than a second as a failed attempt,
    /// and backs off: cutting only older ones makes each cut a connection
    /// lost after it served, replaced at once).
    pub fn only_connections_older_than(&self, d: Duration) {
        self.shared.min_age_ms.store(d.as_millis() as u64, Ordering::SeqCst);
    }

    /// Hold each reply to cut for `d` (the connection open, nothing more
    /// forwarded to nginx on it) before dropping it: a reply lost late.
    pub fn hold_before_cut(&self, d: Duration) {
        self.shared.hold_ms.store(d.as_millis() as u64, Ordering::SeqCst);
    }

    /// After each cut, block new connections for `d` as `how` says
    /// (`None`: do not). While a block is in effect, no reply is cut.
    pub fn block_after_cut(&self, b: Option<(Duration, Block)>) {
        *self.shared.block_after_cut.lock().unwrap() = b;
    }

    /// Block new connections for `d` from now, as `how` says.
    pub fn block_for(&self, d: Duration, how: Block) {
        *self.shared.blocked.lock().unwrap() = Some((Instant::now() + d, how));
    }

    /// Whether new connections are blocked now.
    pub fn blocked(&self) -> bool {
        self.shared.block_now().is_some()
    }

    /// Commands forwarded to Redis that have not been answered (on
    /// connections still open).
    pub fn outstanding(&self) -> usize {
        self.shared.outstanding.load(Ordering::SeqCst)
    }

    pub fn stats(&self) -> Stats {
        let c = &self.shared.counters;
        let l = |a: &AtomicU64| a.load(Ordering::SeqCst);
        Stats {
            connections: l(&c.connections),
            refused: l(&c.refused),
            blackholed: l(&c.blackholed),
            calls: l(&c.calls),
            replies: l(&c.replies),
            cuts: l(&c.cuts),
            protocol_errors: l(&c.protocol_errors),
        }
    }
}

impl Drop for CuttingProxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // Wake the acceptor up.
        let _ = TcpStream::connect((Ipv4Addr::LOCALHOST, self.port));
        if let Some(t) = self.acceptor.take() {
            let _ = t.join();
        }
        for (_, (a, b)) in self.shared.live.lock().unwrap().drain() {
            let _ = a.shutdown(Shutdown::Both);
            let _ = b.shutdown(Shutdown::Both);
        }
    }
}

impl Shared {
    /// The block in effect, if any.
    fn block_now(&self) -> Option<Block> {
        let mut b = self.blocked.lock().unwrap();
        match *b {
            Some((until, how)) if Instant::now() < until => Some(how),
            Some(_) => {
                *b = None;
                None
            }
            None => None,
        }
    }

    /// Whether to cut an eligible reply (counted as such).
    fn decide(&self) -> bool {
        let n = self.counters.eligible.fetch_add(1, Ordering::SeqCst) + 1;
        let every = self.every.load(Ordering::SeqCst);
        if every > 0 && n.is_multiple_of(every) {
            return true;
        }
        let ppm = self.chance_ppm.load(Ordering::SeqCst);
        ppm > 0 && splitmix64(&mut self.rng.lock().unwrap()) % 1_000_000 < ppm
    }

    fn cutting(&self) -> bool {
        self.every.load(Ordering::SeqCst) > 0 || self.chance_ppm.load(Ordering::SeqCst) > 0
    }
}

/// The next number of a SplitMix64 sequence.
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    for stream in listener.incoming() {
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(client) = stream else { continue };
        shared.counters.connections.fetch_add(1, Ordering::SeqCst);
        match shared.block_now() {
            Some(Block::Refuse) => {
                shared.counters.refused.fetch_add(1, Ordering::SeqCst);
                let _ = client.shutdown(Shutdown::Both);
            }
            Some(Block::Blackhole) => {
                shared.counters.blackholed.fetch_add(1, Ordering::SeqCst);
                let shared = shared.clone();
                let _ = thread::Builder::new().stack_size(128 * 1024).spawn(move || blackhole(client, &shared));
            }
            None => {
                let Ok(server) = TcpStream::connect_timeout(&shared.upstream, Duration::from_secs(5)) else {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                start_link(client, server, &shared);
            }
        }
    }
}

/// Holds a blackholed connection, reading and dropping what it sends,
/// until the block ends (or the proxy stops); then closes it.
fn blackhole(mut client: TcpStream, shared: &Shared) {
    let _ = client.set_read_timeout(Some(Duration::from_millis(20)));
    let mut sink = [0u8; 4096];
    while shared.block_now() == Some(Block::Blackhole) && !shared.stop.load(Ordering::SeqCst) {
        match client.read(&mut sink) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {}
            Err(_) => break,
        }
    }
    let _ = client.shutdown(Shutdown::Both);
}

/// A command forwarded to Redis, waiting for its reply.
struct Pending {
    script: bool,
    /// A script call the filter lets be cut.
    cuttable: bool,
}

/// One proxied connection.
struct Link {
    id: u64,
    opened: Instant,
    client: TcpStream,
    server: TcpStream,
    pending: Mutex<VecDeque<Pending>>,
    closed: AtomicBool,
}

impl Link {
    /// Closes both sides (once); its unanswered commands are no longer outstanding.
    fn close(&self, shared: &Shared) {
        if self.closed.swap(true, Ordering::SeqCst) {
            return;
        }
        let _ = self.client.shutdown(Shutdown::Both);
        let _ = self.server.shutdown(Shutdown::Both);
        // (after `closed` is set: `upstream` adds nothing after this)
        let left = std::mem::take(&mut *self.pending.lock().unwrap()).len();
        shared.outstanding.fetch_sub(left, Ordering::SeqCst);
        shared.live.lock().unwrap().remove(&self.id);
    }
}

fn start_link(client: TcpStream, server: TcpStream, shared: &Arc<Shared>) {
    let id = shared.next_id.fetch_add(1, Ordering::SeqCst);
    let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else { return };
    shared.live.lock().unwrap().insert(id, (c2, s2));
    let link = Arc::new(Link {
        id,
        opened: Instant::now(),
        client,
        server,
        pending: Mutex::new(VecDeque::new()),
        closed: AtomicBool::new(false),
    });
    for up in [true, false] {
        let (l, sh) = (link.clone(), shared.clone());
        let spawned = thread::Builder::new().stack_size(256 * 1024).spawn(move || {
            let _ = if up { upstream(&l, &sh) } else { downstream(&l, &sh) };
            l.close(&sh);
        });
        if spawned.is_err() {
            link.close(shared);
        }
    }
}

/// nginx to Redis: notes each command (complete in what was read) before
/// forwarding the bytes that complete it, so that its reply finds it.
fn upstream(link: &Link, shared: &Shared) -> io::Result<()> {
    let (mut from, mut to) = (&link.client, &link.server);
    let mut buf: Vec<u8> = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        let n = from.read(&mut chunk)?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
        let mut used = 0;
        loop {
            match parse_command(&buf[used..]) {
                Ok(Some((cmd, len))) => {
                    used += len;
                    let script = is_script(&cmd);
                    let cuttable = script && shared.filter.read().unwrap().as_ref().is_none_or(|f| f(&cmd));
                    {
                        // Not once the link is closed: `close` took what was pending.
                        let mut pending = link.pending.lock().unwrap();
                        if link.closed.load(Ordering::SeqCst) {
                            return Ok(());
                        }
                        pending.push_back(Pending { script, cuttable });
                        shared.outstanding.fetch_add(1, Ordering::SeqCst);
                    }
                    if script {
                        shared.counters.calls.fetch_add(1, Ordering::SeqCst);
                    }
                }
                Ok(None) => break,
                Err(()) => {
                    shared.counters.protocol_errors.fetch_add(1, Ordering::SeqCst);
                    return Ok(());
                }
            }
        }
        buf.drain(..used);
        to.write_all(&chunk[..n])?;
    }
}

/// Redis to nginx: forwards each complete reply, or cuts it.
fn downstream(link: &Link, shared: &Shared) -> io::Result<()> {
    let (mut from, mut to) = (&link.server, &link.client);
    let mut buf: Vec<u8> = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        let n = from.read(&mut chunk)?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
        let mut used = 0;
        let mut cut = false;
        loop {
            let len = match frame_len(&buf[used..]) {
                Ok(Some(len)) => len,
                Ok(None) => break,
                Err(()) => {
                    shared.counters.protocol_errors.fetch_add(1, Ordering::SeqCst);
                    return Ok(());
                }
            };
            // A RESP3 push answers no command.
            if buf[used] != b'>' {
                let mut pending = link.pending.lock().unwrap();
                let Some(p) = pending.pop_front() else {
                    shared.counters.protocol_errors.fetch_add(1, Ordering::SeqCst);
                    return Ok(());
                };
                shared.outstanding.fetch_sub(1, Ordering::SeqCst);
                if p.script {
                    let eligible = p.cuttable
                        && shared.cutting()
                        && (!shared.lone_only.load(Ordering::SeqCst) || pending.is_empty())
                        && link.opened.elapsed() >= Duration::from_millis(shared.min_age_ms.load(Ordering::SeqCst))
                        && shared.block_now().is_none();
                    if eligible && shared.decide() {
                        cut = true;
                        break;
                    }
                    shared.counters.replies.fetch_add(1, Ordering::SeqCst);
                }
            }
            used += len;
        }
        if used > 0 {
            to.write_all(&buf[..used])?;
        }
        if cut {
            thread::sleep(Duration::from_millis(shared.hold_ms.load(Ordering::SeqCst)));
            shared.counters.cuts.fetch_add(1, Ordering::SeqCst);
            // The block starts before nginx can see the connection end.
            if let Some((d, how)) = *shared.block_after_cut.lock().unwrap() {
                *shared.blocked.lock().unwrap() = Some((Instant::now() + d, how));
            }
            return Ok(());
        }
        buf.drain(..used);
    }
}

/// Whether a command calls a script.
fn is_script(cmd: &[Vec<u8>]) -> bool {
    cmd.first().is_some_and(|name| {
        [&b"FCALL"[..], b"EVALSHA", b"EVAL", b"FCALL_RO", b"EVALSHA_RO", b"EVAL_RO"]
            .iter()
            .any(|s| name.eq_ignore_ascii_case(s))
    })
}

/// The line at `at` (without its CRLF) and where the next one starts;
/// `None` until it is all there.
fn line(buf: &[u8], at: usize) -> Option<(&[u8], usize)> {
    let rest = buf.get(at..)?;
    let end = rest.windows(2).position(|w| w == b"\r\n")?;
    Some((&rest[..end], at + end + 2))
}

fn number(b: &[u8]) -> Result<i64, ()> {
    std::str::from_utf8(b).ok().and_then(|s| s.parse().ok()).ok_or(())
}

/// A command: its name and arguments.
type Command = Vec<Vec<u8>>;

/// A complete command at the start of `buf` (an array of bulk strings, or
/// an inline command) and its length; `Ok(None)` until it is all there.
fn parse_command(buf: &[u8]) -> Result<Option<(Command, usize)>, ()> {
    let Some((head, mut at)) = line(buf, 0) else { return Ok(None) };
    let Some(count) = head.strip_prefix(b"*") else {
        // Inline: words on one line.
        let words = head.split(|b| b.is_ascii_whitespace()).filter(|w| !w.is_empty()).map(<[u8]>::to_vec);
        return Ok(Some((words.collect(), at)));
    };
    let n = number(count)?;
    let mut parts = Vec::with_capacity(n.clamp(0, 1024) as usize);
    for _ in 0..n {
        let Some((len, next)) = line(buf, at) else { return Ok(None) };
        let len = usize::try_from(number(len.strip_prefix(b"$").ok_or(())?)?).map_err(|_| ())?;
        let Some(data) = buf.get(next..next + len) else { return Ok(None) };
        match buf.get(next + len..next + len + 2) {
            None => return Ok(None),
            Some(b"\r\n") => {}
            Some(_) => return Err(()),
        }
        parts.push(data.to_vec());
        at = next + len + 2;
    }
    Ok(Some((parts, at)))
}

/// The length of the complete RESP2/RESP3 frame at the start of `buf`
/// (an attribute and the reply it precedes count as one); `Ok(None)` until
/// it is all there, `Err` if it is not RESP.
fn frame_len(buf: &[u8]) -> Result<Option<usize>, ()> {
    fn end(buf: &[u8], at: usize) -> Result<Option<usize>, ()> {
        let Some(&kind) = buf.get(at) else { return Ok(None) };
        let Some((body, next)) = line(buf, at + 1) else { return Ok(None) };
        let items = |per: i64| -> Result<Option<usize>, ()> {
            let n = number(body)?;
            let mut at = next;
            for _ in 0..n.max(0) * per {
                match end(buf, at)? {
                    Some(e) => at = e,
                    None => return Ok(None),
                }
            }
            Ok(Some(at))
        };
        match kind {
            b'+' | b'-' | b':' | b'_' | b',' | b'#' | b'(' => Ok(Some(next)),
            b'$' | b'!' | b'=' => {
                let n = number(body)?;
                if n < 0 {
                    return Ok(Some(next));
                }
                let stop = next + n as usize + 2;
                match buf.get(stop - 2..stop) {
                    None => Ok(None),
                    Some(b"\r\n") => Ok(Some(stop)),
                    Some(_) => Err(()),
                }
            }
            b'*' | b'~' | b'>' => items(1),
            b'%' => items(2),
            b'|' => match items(2)? {
                Some(at) => end(buf, at),
                None => Ok(None),
            },
            _ => Err(()),
        }
    }
    end(buf, 0)
}
