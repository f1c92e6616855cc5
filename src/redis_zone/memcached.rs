//! Memcached zones' calls, on the worker's event loop: the jobs of one
//! loop iteration on a zone become one round trip per server they touch
//! (every command for a server in one write, its replies read in order),
//! the round trips run side by side, and each request is decided from the
//! counts they read ([`rl_core::memcached::outcome`]). What a rejected
//! request added is taken back in a second round trip, after its answer.
//!
//! Each server has one connection per worker, used by one round trip at a
//! time (a lock): a round trip that fails, or gets no reply within the
//! zone's stall limit, closes it, and the next opens a new one (after a
//! back-off, should opening fail). A round trip that comes after the
//! requests were answered per `on_error` has its increments taken back:
//! a request answered per `on_error` is not charged, as on Redis zones.

use core::cell::{Cell, RefCell};
use core::future::poll_fn;
use core::pin::Pin;
use core::task::Poll;
use std::collections::HashMap;
use std::io;
use std::rc::Rc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures_util::future::join_all;
use ngx::ffi::NGX_LOG_WARN;
use ngx::ngx_log_error;
use rl_core::memcached::{self as mc, Counts, McLine, McReply, Ring};
use rl_core::redis::{Grants, RequestReply};
use smallvec::SmallVec;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Mutex;

use super::conn::McAddr;
use super::open::{addrs, connect};
use super::peer::PeerStream;
use super::timers::{timeout, Hold};
use super::{budget, inbox, Job, JobLine, RedisError, Reply, ZoneSpec, UNDO_ID};
use crate::metrics::store::RedisSlot;

/// How long a round trip may wait for its replies at least, whatever the
/// zone's timeout: a reply late for its requests is still read, so that
/// what it added can be taken back, and the connection kept.
const MIN_STALL: Duration = Duration::from_secs(1);

/// Back-off after a failed connection attempt: the first, and the longest.
const BACKOFF_FIRST: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(2);

/// Windows this worker remembers charging in, at most (see
/// [`McZone::charged`]): beyond, it forgets them all and starts again.
const MAX_REMEMBERED: usize = 65_536;

/// A Memcached zone, in one worker.
pub struct McZone {
    name: String,
    spec: ZoneSpec,
    ring: Ring,
    servers: Vec<Server>,
    metrics: Option<&'static RedisSlot>,
    /// Requests of this zone whose round trips have not ended.
    pub waiting: Cell<usize>,
    /// For each (client key tag, line) this worker's requests were charged
    /// for lately, the window (index + 1): a count that starts again from
    /// zero in that window had lost its counter (evicted, or the server
    /// restarted), which memcached does not tell.
    charged: RefCell<HashMap<(u64, u64), u64>>,
    /// Log throttling of lost counters (see `super::budget`).
    lost_second: Cell<i64>,
    lost_count: Cell<u32>,
}

/// A server and this worker's connection to it.
struct Server {
    addr: McAddr,
    conn: Mutex<Option<PeerStream>>,
    /// No new connection before this (after a failed attempt), and why.
    retry_at: Cell<Option<Instant>>,
    backoff: Cell<Duration>,
    last_error: RefCell<String>,
}

/// What a command of a round trip is for.
#[derive(Clone, Copy)]
enum Purpose {
    /// The current window's counter of line `line` of job `job`: added to.
    Incr { job: usize, line: usize },
    /// Read: the current window's (`prev` false) or the previous one's.
    Get { job: usize, line: usize, prev: bool },
}

/// One server's part of a batch: its commands, and what each is for.
#[derive(Default)]
struct Part {
    out: Vec<u8>,
    purposes: Vec<Purpose>,
    /// The counters added to, with what, for taking back.
    added: Vec<(String, u64)>,
}

impl McZone {
    pub fn new(name: &str, spec: ZoneSpec, metrics: Option<&'static RedisSlot>) -> McZone {
        let addrs = match &spec.target {
            super::Target::Memcached(a) => a.clone(),
            _ => Vec::new(),
        };
        let names: Vec<String> = addrs.iter().map(McAddr::to_string).collect();
        McZone {
            name: name.to_string(),
            ring: Ring::new(&names),
            servers: addrs
                .into_iter()
                .map(|addr| Server {
                    addr,
                    conn: Mutex::new(None),
                    retry_at: Cell::new(None),
                    backoff: Cell::new(BACKOFF_FIRST),
                    last_error: RefCell::new(String::new()),
                })
                .collect(),
            spec,
            metrics,
            waiting: Cell::new(0),
            charged: RefCell::new(HashMap::new()),
            lost_second: Cell::new(0),
            lost_count: Cell::new(0),
        }
    }

    /// The server of a line's key.
    fn server_of(&self, l: &JobLine) -> usize {
        self.ring.server(l.tag, l.line_id)
    }

    /// `e`, of server `s`.
    fn at(&self, s: usize, e: RedisError) -> RedisError {
        match self.servers.get(s) {
            Some(server) => RedisError::At(server.addr.to_string(), Box::new(e)),
            None => e,
        }
    }

    /// How long a round trip waits for its replies.
    fn stall(&self) -> Duration {
        self.spec.timeout.max(MIN_STALL)
    }
}

/// Microseconds of the Unix epoch, this host's clock: memcached has none
/// to give, so the fleet's windows are its hosts' (kept in step by NTP).
fn unix_now_us() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros().min(u128::from(u64::MAX)) as u64)
}

fn mc_line(l: &JobLine) -> McLine {
    McLine { limit: l.limit, cost: l.cost, dry_run: l.dry_run, check_only: l.check_only, next: l.next }
}

/// Decides `jobs` (one request each; `commit`: charges, else `rl_quota`
/// reads) and answers them, by the zone's timeout at the latest; then
/// takes back what the requests not admitted added (all they added, if
/// they were answered per `on_error`).
pub async fn serve(z: Rc<McZone>, jobs: Vec<Job>, commit: bool) {
    z.waiting.set(z.waiting.get() + jobs.len());
    let started = Instant::now();
    let now_us = unix_now_us();
    let mut parts: Vec<Part> = (0..z.servers.len()).map(|_| Part::default()).collect();
    for (j, job) in jobs.iter().enumerate() {
        for (i, l) in job.lines.iter().enumerate() {
            let Some(part) = parts.get_mut(z.server_of(l)) else { continue };
            let keys = mc::line_keys(&z.spec.prefix, l.tag, l.line_id, &l.limit.unvarying(), now_us);
            match mc_line(l).charges(commit) {
                true => {
                    mc::write_incr(&mut part.out, &keys.curr, l.cost, keys.ttl);
                    part.purposes.push(Purpose::Incr { job: j, line: i });
                    part.added.push((keys.curr, l.cost));
                }
                false => {
                    mc::write_get(&mut part.out, &keys.curr);
                    part.purposes.push(Purpose::Get { job: j, line: i, prev: false });
                }
            }
            if let Some(prev) = keys.prev {
                mc::write_get(&mut part.out, &prev);
                part.purposes.push(Purpose::Get { job: j, line: i, prev: true });
            }
        }
    }
    let deadline = started + z.spec.timeout;
    // Which servers' round trips have ended, to name the others in a timeout.
    let done: Vec<Cell<bool>> = parts.iter().map(|_| Cell::new(false)).collect();
    let undo = {
        let (zr, done): (&McZone, &[Cell<bool>]) = (&z, &done);
        let trips = join_all(parts.iter().enumerate().map(|(s, p)| async move {
            let r = match p.purposes.is_empty() {
                true => Ok(Vec::new()),
                false => zr.round_trip(s, &p.out, p.purposes.len(), deadline).await,
            };
            if let Some(d) = done.get(s) {
                d.set(true);
            }
            r
        }));
        let mut trips = core::pin::pin!(trips);
        let answered = match timeout(z.spec.timeout, &mut trips).await {
            Ok(results) => {
                let (replies, undo) = z.decide(&jobs, &parts, &results, now_us, commit);
                inbox::put(replies);
                z.count_call(commit, jobs.len(), started);
                Some(undo)
            }
            Err(_) => {
                inbox::put(jobs.iter().map(|job| {
                    let late =
                        job.lines.iter().map(|l| z.server_of(l)).find(|s| done.get(*s).is_some_and(|d| !d.get()));
                    let e = z.at(late.unwrap_or(0), RedisError::Timeout);
                    Reply { id: job.id, zone: job.zone, result: Err(e) }
                }));
                None
            }
        };
        match answered {
            Some(undo) => undo,
            None => {
                // Answered per on_error: whatever the late replies say was added is taken back.
                let results = trips.await;
                z.count_call(commit, jobs.len(), started);
                parts
                    .iter()
                    .zip(&results)
                    .map(|(p, r)| match r {
                        Ok(replies) => p
                            .added
                            .iter()
                            .zip(p.purposes.iter().zip(replies).filter(|(p, _)| matches!(p, Purpose::Incr { .. })))
                            .filter(|(_, (_, r))| matches!(r, McReply::Value(_)))
                            .map(|(a, _)| a.clone())
                            .collect(),
                        Err(_) => Vec::new(),
                    })
                    .collect()
            }
        }
    };
    z.waiting.set(z.waiting.get().saturating_sub(jobs.len()));
    let zone = jobs.first().map_or(0, |j| j.zone);
    take_back(z.clone(), undo, zone).await;
}

impl McZone {
    /// Counts a batch's round trips as one call (not `rl_quota` reads).
    fn count_call(&self, commit: bool, requests: usize, started: Instant) {
        if let Some(m) = self.metrics.filter(|_| commit) {
            m.call(requests, started.elapsed().as_micros().min(u128::from(u64::MAX)) as u64);
        }
    }

    /// Each job's reply from its servers' replies, and per server the
    /// counters to take back (with what).
    fn decide(
        &self,
        jobs: &[Job],
        parts: &[Part],
        results: &[Result<Vec<McReply>, RedisError>],
        now_us: u64,
        commit: bool,
    ) -> (Vec<Reply>, Vec<Vec<(String, u64)>>) {
        let mut counts: Vec<SmallVec<[Counts; 2]>> =
            jobs.iter().map(|j| j.lines.iter().map(|_| Counts::default()).collect()).collect();
        let mut failed: Vec<Option<RedisError>> = jobs.iter().map(|_| None).collect();
        // Where each job's increments are, to take them back: (server, index in `added`).
        let mut added_at: Vec<SmallVec<[(usize, usize, usize); 2]>> = jobs.iter().map(|_| SmallVec::new()).collect();
        for (s, (part, result)) in parts.iter().zip(results).enumerate() {
            let mut nth_added = 0;
            for (k, purpose) in part.purposes.iter().enumerate() {
                let (job, line) = match *purpose {
                    Purpose::Incr { job, line } | Purpose::Get { job, line, .. } => (job, line),
                };
                let reply = match result {
                    Ok(replies) => replies.get(k).cloned().ok_or(RedisError::Unanswered),
                    Err(e) => Err(e.clone()),
                };
                let slot = counts.get_mut(job).and_then(|c| c.get_mut(line));
                match (purpose, reply, slot) {
                    (Purpose::Incr { .. }, Ok(McReply::Value(v)), Some(c)) => {
                        c.curr = v;
                        if let Some(a) = added_at.get_mut(job) {
                            a.push((line, s, nth_added));
                        }
                    }
                    (Purpose::Get { prev, .. }, Ok(McReply::Value(v)), Some(c)) => match prev {
                        true => c.prev = v,
                        false => c.curr = v,
                    },
                    (Purpose::Get { .. }, Ok(McReply::Miss), Some(_)) => {}
                    (_, Ok(McReply::Error(text)), _) => {
                        failed[job].get_or_insert(self.at(s, RedisError::Server(text)));
                    }
                    (_, Ok(other), _) => {
                        failed[job]
                            .get_or_insert(self.at(s, RedisError::Protocol(format!("unexpected reply {other:?}"))));
                    }
                    (_, Err(e), _) => {
                        failed[job].get_or_insert(e);
                    }
                }
                if matches!(purpose, Purpose::Incr { .. }) {
                    nth_added += 1;
                }
            }
        }
        let mut undo: Vec<Vec<(String, u64)>> = parts.iter().map(|_| Vec::new()).collect();
        let mut take_back = |at: &[(usize, usize, usize)], which: &dyn Fn(usize) -> bool| {
            for &(line, s, n) in at {
                if let (true, Some(a), Some(u)) =
                    (which(line), parts.get(s).and_then(|p| p.added.get(n)), undo.get_mut(s))
                {
                    u.push(a.clone());
                }
            }
        };
        let mut replies = Vec::with_capacity(jobs.len());
        for (j, job) in jobs.iter().enumerate() {
            if let Some(e) = failed[j].take() {
                // (what the job's other servers added is taken back: it is answered per on_error)
                take_back(&added_at[j], &|_| true);
                replies.push(Reply { id: job.id, zone: job.zone, result: Err(e) });
                continue;
            }
            let lines: SmallVec<[McLine; 2]> = job.lines.iter().map(mc_line).collect();
            let (admitted, outcomes, back) = mc::outcome(&lines, &counts[j], now_us, commit);
            take_back(&added_at[j], &|line| back.get(line).copied().unwrap_or(false));
            if commit {
                self.note_charges(job, &lines, &counts[j], &back, now_us);
            }
            let reply: RequestReply = (admitted, outcomes, now_us, Grants::new());
            replies.push(Reply { id: job.id, zone: job.zone, result: Ok(reply) });
        }
        (replies, undo)
    }

    /// Remembers the windows the job's kept charges went to, and counts
    /// (and logs) a counter found lost: one that starts from zero in a
    /// window this worker was charged in.
    fn note_charges(&self, job: &Job, lines: &[McLine], counts: &[Counts], back: &[bool], now_us: u64) {
        let Ok(mut charged) = self.charged.try_borrow_mut() else { return };
        for (i, (l, line)) in job.lines.iter().zip(lines).enumerate() {
            if !line.charges(true) {
                continue;
            }
            let window = now_us / l.limit.window_us().max(1) + 1;
            let (count, taken_back) = (counts.get(i).map_or(0, |c| c.curr), back.get(i).copied().unwrap_or(true));
            let key = (l.tag, l.line_id);
            if count == l.cost && charged.get(&key) == Some(&window) {
                if let Some(m) = self.metrics {
                    m.counter_lost();
                }
                if budget(&self.lost_second, &self.lost_count) {
                    ngx_log_error!(
                        NGX_LOG_WARN,
                        super::cycle_log(),
                        "rl_zone \"{}\" memcached {}: a counter was lost within its window (evicted, \
                         or the server restarted): its key's requests are counted again from zero",
                        self.name,
                        self.servers[self.server_of(l)].addr
                    );
                }
            }
            if !taken_back {
                if charged.len() >= MAX_REMEMBERED {
                    charged.clear();
                }
                charged.insert(key, window);
            }
        }
    }

    /// Sends `out` (`n` commands) to server `s` and reads their replies.
    /// Nothing is sent past `deadline`; the replies are waited for until
    /// the stall limit, after which the connection is closed.
    async fn round_trip(&self, s: usize, out: &[u8], n: usize, deadline: Instant) -> Result<Vec<McReply>, RedisError> {
        self.trip(s, out, n, deadline).await.map_err(|e| self.at(s, e))
    }

    /// [`McZone::round_trip`], its error not yet naming the server.
    async fn trip(&self, s: usize, out: &[u8], n: usize, deadline: Instant) -> Result<Vec<McReply>, RedisError> {
        let server = self.servers.get(s).ok_or(RedisError::NoZone)?;
        let mut conn = server.conn.lock().await;
        if Instant::now() >= deadline {
            return Err(RedisError::Timeout);
        }
        if conn.is_none() {
            *conn = Some(self.open(server, deadline).await?);
            if let Some(m) = self.metrics {
                m.connected(None);
            }
        }
        let Some(stream) = conn.as_mut() else { return Err(RedisError::NotSent) };
        let result = match timeout(self.stall(), exchange(stream, out, n)).await {
            Ok(Ok((replies, true))) => return Ok(replies),
            // (bytes after the last reply: the next round trip would read them as its own)
            Ok(Ok((replies, false))) => {
                *conn = None;
                return Ok(replies);
            }
            Ok(Err(e)) => e,
            Err(_) => RedisError::Timeout,
        };
        // (a connection whose replies are not all read is out of step: closed)
        *conn = None;
        Err(result)
    }

    /// Opens a connection to `server`, unless a failed attempt's back-off
    /// is running; a failure starts (or doubles) it.
    async fn open(&self, server: &Server, deadline: Instant) -> Result<PeerStream, RedisError> {
        if let Some(at) = server.retry_at.get().filter(|at| Instant::now() < *at) {
            let _ = at;
            return Err(RedisError::NotConnected { last: server.last_error.borrow().clone() });
        }
        let attempt = async {
            let a = addrs(&server.addr.host, server.addr.port).await?;
            connect(&a).await
        };
        let wait = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
        let result = match timeout(wait, attempt).await {
            Ok(r) => r,
            Err(_) => Err(RedisError::Unreachable(format!("connect() to {} timed out", server.addr))),
        };
        match result {
            Ok(stream) => {
                server.retry_at.set(None);
                server.backoff.set(BACKOFF_FIRST);
                Ok(stream)
            }
            Err(e) => {
                let backoff = server.backoff.get();
                server.retry_at.set(Some(Instant::now() + backoff));
                server.backoff.set((backoff * 2).min(BACKOFF_MAX));
                let text = e.to_string();
                *server.last_error.borrow_mut() = text.clone();
                Err(RedisError::Unreachable(text))
            }
        }
    }
}

/// Writes `out` and reads `n` replies; false with them if more bytes came
/// than the replies (which memcached never sends).
async fn exchange(stream: &mut PeerStream, out: &[u8], n: usize) -> Result<(Vec<McReply>, bool), RedisError> {
    let io = |e: io::Error| RedisError::Io(e.to_string());
    let mut rest = out;
    while !rest.is_empty() {
        let sent = poll_fn(|cx| Pin::new(&mut *stream).poll_write(cx, rest)).await.map_err(io)?;
        if sent == 0 {
            return Err(RedisError::Io("connection closed".into()));
        }
        rest = rest.get(sent..).unwrap_or_default();
    }
    let mut replies = Vec::with_capacity(n);
    let mut buf: Vec<u8> = Vec::with_capacity(64 * n);
    let mut at = 0;
    let mut chunk = [0u8; 4096];
    while replies.len() < n {
        match mc::parse_reply(buf.get(at..).unwrap_or_default()) {
            Ok(Some((reply, used))) => {
                replies.push(reply);
                at += used;
                continue;
            }
            Ok(None) => {}
            Err(e) => return Err(RedisError::Protocol(e.to_string())),
        }
        let got = poll_fn(|cx| {
            let mut rb = ReadBuf::new(&mut chunk);
            match Pin::new(&mut *stream).poll_read(cx, &mut rb) {
                Poll::Ready(Ok(())) => Poll::Ready(Ok(rb.filled().len())),
                Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
                Poll::Pending => Poll::Pending,
            }
        })
        .await
        .map_err(io)?;
        if got == 0 {
            return Err(RedisError::Io("connection closed by the server".into()));
        }
        buf.drain(..at);
        at = 0;
        buf.extend_from_slice(chunk.get(..got).unwrap_or_default());
    }
    Ok((replies, at == buf.len()))
}

/// How long taking back is tried, at most.
const UNDO_FOR: Duration = Duration::from_secs(2);

/// Takes back what `undo` lists, per server (one round trip each); a
/// failure is reported for the log (`UNDO_ID`). A worker that exits
/// gracefully waits for it.
async fn take_back(z: Rc<McZone>, undo: Vec<Vec<(String, u64)>>, zone: usize) {
    if undo.iter().all(Vec::is_empty) {
        return;
    }
    let _hold = Hold::new(UNDO_FOR);
    let deadline = Instant::now() + UNDO_FOR;
    let trips = undo.iter().enumerate().filter(|(_, u)| !u.is_empty()).map(|(s, u)| {
        let mut out = Vec::with_capacity(u.len() * 64);
        for (key, cost) in u {
            mc::write_decr(&mut out, key, *cost);
        }
        let z = &z;
        async move { z.round_trip(s, &out, u.len(), deadline).await }
    });
    for r in join_all(trips).await {
        let failed = match r {
            Ok(replies) => replies.into_iter().find_map(|r| match r {
                McReply::Error(text) => Some(RedisError::Server(text)),
                _ => None,
            }),
            Err(e) => Some(e),
        };
        if let Some(e) = failed {
            inbox::put([Reply { id: UNDO_ID, zone, result: Err(e) }]);
        }
    }
}

/// Charges the `charge=after` costs of one loop iteration on a zone: each
/// line's counter gets its cost, beyond the burst if need be; the lines not
/// charged are reported for the log and the metrics.
pub async fn charge(z: Rc<McZone>, job: Job) {
    let _hold = Hold::new(2 * z.stall());
    let now_us = unix_now_us();
    let deadline = Instant::now() + z.spec.timeout;
    let mut parts: Vec<(Vec<u8>, usize)> = (0..z.servers.len()).map(|_| (Vec::new(), 0)).collect();
    for l in job.lines.iter().filter(|l| l.cost > 0) {
        if let Some((out, n)) = parts.get_mut(z.server_of(l)) {
            let keys = mc::line_keys(&z.spec.prefix, l.tag, l.line_id, &l.limit.unvarying(), now_us);
            mc::write_incr(out, &keys.curr, l.cost, keys.ttl);
            *n += 1;
        }
    }
    let trips = parts.iter().enumerate().filter(|(_, (_, n))| *n > 0).map(|(s, (out, n))| {
        let z = &z;
        async move { (*n, z.round_trip(s, out, *n, deadline).await) }
    });
    for (n, r) in join_all(trips).await {
        let e = match r {
            Ok(replies) => match replies.iter().filter(|r| !matches!(r, McReply::Value(_))).count() {
                0 => continue,
                bad => {
                    inbox::charge_failed(job.zone, bad, RedisError::Server("a charge was refused".into()));
                    continue;
                }
            },
            Err(e) => e,
        };
        inbox::charge_failed(job.zone, n, e);
    }
}
