//! A zone's connection: opened on first use, shared by the calls in flight
//! (multiplexed), given up when it fails or stops answering, and reopened
//! with back-off.
//!
//! A connection can stop answering without failing: a server frozen
//! (SIGSTOP, a paused VM) or a path that silently drops packets leaves the
//! socket open for as long as the kernel keeps retransmitting (about 15
//! minutes), and every call on it would wait, and stay queued in the client,
//! until then. So each connection has a watchdog: one that has given no
//! reply at all for the zone's stall limit (its timeout, at least
//! [`MIN_STALL`]) while calls wait on it is given up, the calls on it end,
//! and the next call opens a new one.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::io::tcp::TcpSettings;
use redis::{
    AsyncConnectionConfig, Client, Cmd, ConnectionInfo, IntoConnectionInfo, Pipeline, RedisFuture, TlsCertificates,
    Value,
};
use rl_core::redis::{write_state_key, RequestReply};
use rl_core::url::RedisUrl;
use tokio::sync::Notify;

use super::clock::Clock;
use super::script::{broken, call, charge, Code, Via};
use super::sentinel::sentinel_master;
use super::{Job, JobLine, RedisError, ZoneSpec};
use crate::metrics::store::RedisSlot;

/// Where a zone's Redis is.
#[derive(Clone)]
pub enum Target {
    /// `redis://` or `rediss://`.
    Single(String),
    /// `redis+sentinel://h:p,h:p/MASTER[/db]`: sentinel URLs, master name,
    /// and the URL, whose TLS, credentials and db the master is reached with.
    Sentinel { sentinels: Vec<String>, master: String, url: RedisUrl },
    /// `redis+cluster://h:p,h:p`: node URLs.
    Cluster(Vec<String>),
}

/// An open connection as calls use it: the client's handle, and what the
/// zone knows of the connection's health. Commands sent through it (it is
/// the `ConnectionLike` the script's commands run on) are counted, their
/// replies noted, and they end when the connection is given up.
#[derive(Clone)]
pub struct Conn {
    link: Link,
    health: Arc<Health>,
}

#[derive(Clone)]
enum Link {
    Plain(MultiplexedConnection),
    Cluster(ClusterConnection),
}

/// What the zone knows of one connection.
struct Health {
    opened: Instant,
    /// Commands sent on it whose reply has not come.
    pending: AtomicUsize,
    /// When it last replied, or last had a command sent while none was
    /// pending: ms since `opened`.
    progress_ms: AtomicU64,
    /// It has answered a script call well.
    proven: AtomicBool,
    /// Given up on (set once; `gone` then wakes the commands waiting on it).
    abandoned: AtomicBool,
    gone: Notify,
    /// Why it was given up on.
    why: Mutex<String>,
}

/// A command in flight on a connection (counted while it lives).
struct Busy<'a>(&'a Health);

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.0.pending.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Health {
    fn new() -> Health {
        Health {
            opened: Instant::now(),
            pending: AtomicUsize::new(0),
            progress_ms: AtomicU64::new(0),
            proven: AtomicBool::new(false),
            abandoned: AtomicBool::new(false),
            gone: Notify::new(),
            why: Mutex::new(String::new()),
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.opened.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// A command is sent: silence is measured from now if none was pending.
    fn begin(&self) -> Busy<'_> {
        if self.pending.fetch_add(1, Ordering::Relaxed) == 0 {
            self.progress_ms.store(self.now_ms(), Ordering::Relaxed);
        }
        Busy(self)
    }

    fn replied(&self) {
        self.progress_ms.store(self.now_ms(), Ordering::Relaxed);
    }

    /// Commands wait and nothing has come for `limit`.
    fn stalled(&self, limit: Duration) -> bool {
        let silent = self.now_ms().saturating_sub(self.progress_ms.load(Ordering::Relaxed));
        self.pending.load(Ordering::Relaxed) > 0 && u128::from(silent) >= limit.as_millis()
    }

    fn abandoned(&self) -> bool {
        self.abandoned.load(Ordering::Acquire)
    }

    /// Gives the connection up: the commands on it end with `why`.
    fn abandon(&self, why: String) {
        if let Ok(mut w) = self.why.lock() {
            if w.is_empty() {
                *w = why;
            }
        }
        if !self.abandoned.swap(true, Ordering::AcqRel) {
            self.gone.notify_waiters();
        }
    }

    fn why(&self) -> String {
        self.why.lock().map(|w| w.clone()).unwrap_or_default()
    }

    /// Resolves once the connection is given up.
    async fn gone(&self) {
        let notified = self.gone.notified();
        tokio::pin!(notified);
        // Registered before the flag is read: an `abandon` in between still wakes it.
        notified.as_mut().enable();
        if self.abandoned() {
            return;
        }
        notified.await;
    }

    /// Healthy long enough that its failure says nothing of the next one.
    fn served(&self) -> bool {
        self.proven.load(Ordering::Relaxed) && self.opened.elapsed() >= SERVED
    }
}

/// Below this, a stall limit would give up connections that merely meet a
/// busy moment of Redis (a slow command, a fork for a snapshot).
const MIN_STALL: Duration = Duration::from_secs(1);

/// How often a connection's watchdog looks at it.
const STALL_CHECK: Duration = Duration::from_millis(100);

/// A connection that answered well and lived this long counts as having
/// worked: its failure (Redis restarted) is followed by a new connection at
/// once. One that fails sooner, or before it answered a call well (a server
/// that closes or garbles every call), counts for the back-off as a failed
/// connection attempt does.
const SERVED: Duration = Duration::from_secs(1);

impl Conn {
    /// A connection just opened, watched until it is dropped or given up.
    fn new(link: Link, stall: Duration) -> Conn {
        let health = Arc::new(Health::new());
        let watched = Arc::downgrade(&health);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(STALL_CHECK).await;
                let Some(h) = watched.upgrade() else { return };
                if h.abandoned() {
                    return;
                }
                if h.stalled(stall) {
                    h.abandon(format!("no reply for {} ms, connection given up", stall.as_millis()));
                    return;
                }
            }
        });
        Conn { link, health }
    }

    fn same(&self, other: &Conn) -> bool {
        Arc::ptr_eq(&self.health, &other.health)
    }

    /// Runs one command (or pipeline) on the connection: counted, its reply
    /// noted, ended early if the connection is given up.
    async fn watched<T>(health: &Health, sent: impl Future<Output = redis::RedisResult<T>>) -> redis::RedisResult<T> {
        let _busy = health.begin();
        let reply = tokio::select! {
            r = sent => r,
            () = health.gone() => Err(std::io::Error::new(std::io::ErrorKind::TimedOut, health.why()).into()),
        };
        if reply.as_ref().map_or_else(|e| !broken(e), |_| true) {
            health.replied();
        }
        reply
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let Conn { link, health } = self;
            let sent = async move {
                match link {
                    Link::Plain(c) => c.req_packed_command(cmd).await,
                    Link::Cluster(c) => c.req_packed_command(cmd).await,
                }
            };
            Conn::watched(health, sent).await
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let Conn { link, health } = self;
            let sent = async move {
                match link {
                    Link::Plain(c) => c.req_packed_commands(cmd, offset, count).await,
                    Link::Cluster(c) => c.req_packed_commands(cmd, offset, count).await,
                }
            };
            Conn::watched(health, sent).await
        })
    }

    fn get_db(&self) -> i64 {
        match &self.link {
            Link::Plain(c) => c.get_db(),
            Link::Cluster(c) => c.get_db(),
        }
    }
}

/// A zone's connection, reconnected with backoff after failures.
pub struct ZoneConn {
    pub spec: ZoneSpec,
    pub state: tokio::sync::Mutex<ConnState>,
    /// The script runs as a Redis function (until the server shows it cannot).
    pub fcall: AtomicBool,
    /// Redis' clock, for the calls' deadlines.
    pub clock: Clock,
    /// Requests whose script call has not come back, answered or not (see
    /// `thread::MAX_WAITING`).
    pub waiting: AtomicUsize,
    /// This worker's counters of the zone (`rl_metrics`).
    pub metrics: Option<&'static RedisSlot>,
}

pub struct ConnState {
    pub conn: Option<Conn>,
    /// Failed connection attempts and failed connections in a row.
    failures: u32,
    next_try: Option<Instant>,
    /// Why the last connection (attempt) failed, reported until one succeeds.
    last_error: String,
    /// For a sentinel zone: the master the connection goes to.
    pub master: Option<(String, u16)>,
}

/// Longest wait between two connection attempts: Redis coming back is noticed within this.
const MAX_BACKOFF: Duration = Duration::from_millis(400);

/// The wait before the next attempt after `failures` in a row.
fn backoff(failures: u32) -> Duration {
    Duration::from_millis(25u64 << failures.min(5)).min(MAX_BACKOFF)
}

impl ZoneConn {
    pub fn new(spec: ZoneSpec) -> ZoneConn {
        ZoneConn {
            spec,
            state: tokio::sync::Mutex::new(ConnState {
                conn: None,
                failures: 0,
                next_try: None,
                last_error: String::new(),
                master: None,
            }),
            fcall: AtomicBool::new(true),
            clock: Clock::new(),
            waiting: AtomicUsize::new(0),
            metrics: None,
        }
    }

    /// How long a connection may leave calls unanswered before it is given
    /// up, and a connection attempt may take: the timeout, at least
    /// [`MIN_STALL`].
    pub fn stall_limit(&self) -> Duration {
        self.spec.timeout.max(MIN_STALL)
    }

    async fn conn(&self) -> Result<Conn, RedisError> {
        let mut st = self.state.lock().await;
        if let Some(c) = &st.conn {
            if !c.health.abandoned() {
                return Ok(c.clone());
            }
            // Given up by its watchdog.
            let why = c.health.why();
            let served = c.health.served();
            st.conn = None;
            st.failed(served, why);
        }
        if st.next_try.is_some_and(|t| Instant::now() < t) {
            return Err(RedisError::NotConnected { last: st.last_error.clone() });
        }
        match connect(&self.spec.target, &self.spec.tls, self.stall_limit()).await {
            Ok((c, master)) => {
                if let Some(m) = self.metrics {
                    m.connected(master.as_ref().map(|(h, p)| format!("{h}:{p}")).as_deref());
                }
                self.clock.forget();
                st.conn = Some(c.clone());
                st.master = master;
                st.next_try = None;
                Ok(c)
            }
            Err(e) => {
                st.failures = st.failures.saturating_add(1);
                st.next_try = Some(Instant::now() + backoff(st.failures));
                st.last_error = e.to_string();
                Err(e)
            }
        }
    }

    /// A call on `conn` failed with `e`, a broken connection: give it up
    /// (the other calls on it end too) unless it already was.
    async fn drop_conn(&self, conn: &Conn, e: &RedisError) {
        conn.health.abandon(e.to_string());
        let mut st = self.state.lock().await;
        if st.conn.as_ref().is_some_and(|c| c.same(conn)) {
            st.conn = None;
            st.failed(conn.health.served(), e.to_string());
        }
    }

    /// Runs a batch of jobs: one script call for all of them (on a cluster,
    /// see [`ZoneConn::run_cluster`]). `deadline` is when their requests are
    /// answered by the timeout: no new attempt starts after it; Redis must
    /// not run the calls after `until`.
    /// `commit`: the jobs' [`Job::commit`], the same for all of them.
    pub async fn run(
        &self,
        code: &Code,
        jobs: &[Job],
        commit: bool,
        deadline: Instant,
        until: Instant,
    ) -> Vec<Result<RequestReply, RedisError>> {
        match self.spec.target {
            Target::Cluster(_) => self.run_cluster(code, jobs, commit, deadline, until).await,
            _ => self.run_batch(code, jobs.iter(), commit, deadline, until).await,
        }
    }

    /// The charges of one event-loop iteration: one call, or on a cluster
    /// one per slot. Returns the lines not charged, each group with why.
    pub async fn run_charge(&self, code: &Code, lines: &[JobLine]) -> Vec<(usize, RedisError)> {
        // No deadline for Redis; this one only bounds a reconnection's retry.
        let until = Instant::now() + self.spec.timeout;
        let groups = match self.spec.target {
            Target::Cluster(_) => by_key_slot(lines, &self.spec.prefix),
            _ => vec![lines.to_vec()],
        };
        let calls = groups.iter().map(|g| {
            let via = self.via(code, until);
            self.retrying(until, move |conn| charge(conn, via, &self.spec.prefix, g))
        });
        let mut failed = Vec::new();
        for (g, r) in groups.iter().zip(futures_util::future::join_all(calls).await) {
            match r {
                Ok(0) => {}
                Ok(refused) => failed.push((
                    refused,
                    RedisError::Server("the charge is out of the range the script computes exactly".into()),
                )),
                Err(e) => failed.push((g.len(), e)),
            }
        }
        failed
    }

    /// How this zone calls the script, until `until`.
    pub fn via<'a>(&'a self, code: &'a Code, until: Instant) -> Via<'a> {
        Via { code, fcall: &self.fcall, clock: &self.clock, until }
    }

    /// Jobs in one script call (their keys must share a slot on a cluster).
    pub async fn run_batch<'a>(
        &self,
        code: &Code,
        jobs: impl Iterator<Item = &'a Job>,
        commit: bool,
        deadline: Instant,
        until: Instant,
    ) -> Vec<Result<RequestReply, RedisError>> {
        let requests: Vec<&[JobLine]> = jobs.map(|j| j.lines.as_slice()).collect();
        let via = self.via(code, until);
        match self.retrying(deadline, |conn| call(conn, via, &self.spec.prefix, &requests, commit)).await {
            Ok(replies) => replies.into_iter().map(Ok).collect(),
            Err(e) => requests.iter().map(|_| Err(e.clone())).collect(),
        }
    }

    /// Runs `f` on the zone's connection. A connection that died while idle
    /// (Redis restarted) fails its first command: then give it up and run
    /// `f` once more on a new one, if `deadline` has not passed.
    pub async fn retrying<T, F, Fut>(&self, deadline: Instant, f: F) -> Result<T, RedisError>
    where
        F: Fn(Conn) -> Fut,
        Fut: Future<Output = Result<T, RedisError>>,
    {
        let conn = self.conn().await?;
        let e = match self.attempt(&conn, &f).await {
            Err(e) if e.is_io() && Instant::now() < deadline => e,
            r => return r,
        };
        let again = match self.conn().await {
            Ok(conn) => self.attempt(&conn, &f).await,
            Err(again) => Err(again),
        };
        match again {
            // Still in backoff after a failed connect: report the original cause.
            Err(RedisError::NotConnected { .. }) => Err(e),
            r => r,
        }
    }

    /// `f` on `conn`: a good answer proves the connection, a broken one
    /// gives it up.
    async fn attempt<T, F, Fut>(&self, conn: &Conn, f: &F) -> Result<T, RedisError>
    where
        F: Fn(Conn) -> Fut,
        Fut: Future<Output = Result<T, RedisError>>,
    {
        let r = f(conn.clone()).await;
        match &r {
            Ok(_) => conn.health.proven.store(true, Ordering::Relaxed),
            Err(e) if e.is_io() => self.drop_conn(conn, e).await,
            Err(_) => {}
        }
        r
    }
}

impl ConnState {
    /// The connection failed or was given up: one that had served is
    /// replaced at once; else it counts for the back-off like a failed
    /// connection attempt (a server that closes or garbles every call, or
    /// never answers, is not reconnected to once per call).
    fn failed(&mut self, served: bool, why: String) {
        if served {
            self.failures = 0;
        }
        self.failures = self.failures.saturating_add(1);
        self.next_try = (self.failures > 1).then(|| Instant::now() + backoff(self.failures));
        self.last_error = why;
    }
}

/// TCP settings of the data connections: `TCP_NODELAY`, as Redis clients and
/// nginx's own upstream connections use, so that a call sent while another
/// is in flight is not held back by Nagle's algorithm until the first reply.
fn tcp() -> TcpSettings {
    TcpSettings::default().set_nodelay(true)
}

/// A client for one server (a node or a sentinel), with the zone's
/// certificates if it has any (then its URLs are all `rediss`).
pub fn client(info: ConnectionInfo, tls: &Option<TlsCertificates>) -> redis::RedisResult<Client> {
    match tls {
        Some(certs) => Client::build_with_tls(info, certs.clone()),
        None => Client::open(info),
    }
}

/// The data connections' settings: an attempt (connect, TLS, setup) may take
/// the stall limit; a reply has no timeout of its own (the zone's timeout
/// answers the requests, the watchdog gives a silent connection up).
fn data_config(stall: Duration) -> AsyncConnectionConfig {
    AsyncConnectionConfig::new().set_connection_timeout(Some(stall)).set_response_timeout(None)
}

/// Opens a connection; for a sentinel zone, also says which master it went to.
async fn connect(
    target: &Target,
    tls: &Option<TlsCertificates>,
    stall: Duration,
) -> Result<(Conn, Option<(String, u16)>), RedisError> {
    // A URL or a TLS setting the client refuses was checked by `nginx -t`:
    // should one fail here all the same, retry it as a failed connection.
    let io = |e: redis::RedisError| RedisError::Io(e.to_string());
    match target {
        Target::Single(url) => {
            let info = url.as_str().into_connection_info().map_err(io)?.set_tcp_settings(tcp());
            let client = client(info, tls).map_err(io)?;
            let c = client.get_multiplexed_async_connection_with_config(&data_config(stall)).await.map_err(io)?;
            Ok((Conn::new(Link::Plain(c), stall), None))
        }
        Target::Sentinel { sentinels, master, url } => {
            let (host, port) = sentinel_master(sentinels, master, tls).await?;
            let info = url.url_for(&host, port).as_str().into_connection_info().map_err(io)?.set_tcp_settings(tcp());
            let client = client(info, tls).map_err(io)?;
            let c = client.get_multiplexed_async_connection_with_config(&data_config(stall)).await.map_err(io)?;
            Ok((Conn::new(Link::Plain(c), stall), Some((host, port))))
        }
        Target::Cluster(nodes) => {
            // The client's own timeouts per node and request: a node that
            // stops answering fails its calls (while the other nodes' replies
            // keep the connection as a whole from looking silent).
            let mut builder = redis::cluster::ClusterClientBuilder::new(nodes.clone())
                .tcp_settings(tcp())
                .connection_timeout(stall)
                .response_timeout(stall);
            if let Some(certs) = tls {
                builder = builder.certs(certs.clone());
            }
            let client = builder.build().map_err(io)?;
            Ok((Conn::new(Link::Cluster(client.get_async_connection().await.map_err(io)?), stall), None))
        }
    }
}

/// Lines grouped by the slot of their state keys (under `prefix`), for the
/// calls of a cluster.
fn by_key_slot(lines: &[JobLine], prefix: &str) -> Vec<Vec<JobLine>> {
    let mut groups: Vec<(redis::cluster_routing::Slot, Vec<JobLine>)> = Vec::new();
    let mut key = String::new();
    for line in lines {
        key.clear();
        write_state_key(&mut key, prefix, line.tag, line.line_id);
        let slot = redis::cluster_routing::Slot::for_key(&key);
        match groups.iter_mut().find(|(s, _)| *s == slot) {
            Some((_, v)) => v.push(*line),
            None => groups.push((slot, vec![*line])),
        }
    }
    groups.into_iter().map(|(_, v)| v).collect()
}
