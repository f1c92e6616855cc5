//! The link to a zone's Redis: where it is ([`Target`]), a client for one
//! server ([`client`]), and an open connection ([`Conn`]), which the script
//! calls and the clock's `TIME` run on. The zone's use of it (one
//! connection shared, reopened with back-off) is `zone_conn.rs`.
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

use ngx::async_::{spawn, Task};
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{Cmd, IntoConnectionInfo, Pipeline, RedisFuture, Value};
use rl_core::url::RedisUrl;
use rustls::ClientConfig;
use tokio::sync::Notify;

use super::cluster_link::ClusterLink;
use super::open::{data_config, open};
use super::timers::{sleep, timeout};
use super::RedisError;

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
    /// `memcached=h:p,h:p`: the servers, keys spread over them by
    /// consistent hashing (see [`super::memcached`]).
    Memcached(Vec<McAddr>),
}

/// A memcached server's address as `memcached=` gives it.
#[derive(Clone, Debug)]
pub struct McAddr {
    pub host: String,
    pub port: u16,
    /// Written in brackets.
    pub v6: bool,
}

impl core::fmt::Display for McAddr {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self.v6 {
            true => write!(f, "[{}]:{}", self.host, self.port),
            false => write!(f, "{}:{}", self.host, self.port),
        }
    }
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
    Cluster(ClusterLink),
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
    /// The task that reads and writes the connection: dropped (and the
    /// connection closed) when the connection is given up.
    driver: Mutex<Option<Task<()>>>,
}

/// A command in flight on a connection (counted while it lives).
struct Busy<'a>(&'a Health);

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.0.pending.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Health {
    fn new(driver: Option<Task<()>>) -> Health {
        Health {
            driver: Mutex::new(driver),
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
            // Closes the socket now, not when the last call on it ends.
            let driver = self.driver.lock().map(|mut d| d.take()).unwrap_or_default();
            drop(driver);
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
pub const MIN_STALL: Duration = Duration::from_secs(1);

/// How often a connection's watchdog looks at it.
const STALL_CHECK: Duration = Duration::from_millis(100);

/// A connection that answered well and lived this long counts as having
/// worked: its failure (Redis restarted) is followed by a new connection at
/// once. One that fails sooner, or before it answered a call well (a server
/// that closes or garbles every call), counts for the back-off as a failed
/// connection attempt does.
const SERVED: Duration = Duration::from_secs(1);

impl Conn {
    /// Opens a connection to the server at `url` (a node, or the master
    /// the sentinels named), within `stall`.
    pub async fn open(url: &str, tls: Option<&Arc<ClientConfig>>, stall: Duration) -> Result<Conn, RedisError> {
        let info = url.into_connection_info().map_err(io)?;
        let opened = timeout(stall, open(&info, tls, data_config()))
            .await
            .map_err(|_| RedisError::Io(format!("connecting timed out ({} ms)", stall.as_millis())))??;
        Ok(Conn::new(Link::Plain(opened.conn), opened.driver, stall))
    }

    /// Opens a connection to the cluster of `nodes`.
    pub async fn open_cluster(
        nodes: &[String],
        tls: Option<&Arc<ClientConfig>>,
        stall: Duration,
    ) -> Result<Conn, RedisError> {
        let cluster = ClusterLink::open(nodes, tls, stall).await?;
        Ok(Conn::new(Link::Cluster(cluster), None, stall))
    }

    /// A connection just opened, watched until it is dropped or given up.
    fn new(link: Link, driver: impl Into<Option<Task<()>>>, stall: Duration) -> Conn {
        let health = Arc::new(Health::new(driver.into()));
        let watched = Arc::downgrade(&health);
        spawn(async move {
            loop {
                sleep(STALL_CHECK).await;
                let Some(h) = watched.upgrade() else { return };
                if h.abandoned() {
                    return;
                }
                if h.stalled(stall) {
                    h.abandon(format!("no reply for {} ms, connection given up", stall.as_millis()));
                    return;
                }
            }
        })
        .detach();
        Conn { link, health }
    }

    /// The same connection (clones of one open connection).
    pub fn same(&self, other: &Conn) -> bool {
        Arc::ptr_eq(&self.health, &other.health)
    }

    /// Given up (by its watchdog, or by [`Conn::abandon`]).
    pub fn abandoned(&self) -> bool {
        self.health.abandoned()
    }

    /// Gives the connection up: the commands on it end with `why`.
    pub fn abandon(&self, why: String) {
        self.health.abandon(why);
    }

    /// Why it was given up.
    pub fn why(&self) -> String {
        self.health.why()
    }

    /// It answered a script call well.
    pub fn prove(&self) {
        self.health.proven.store(true, Ordering::Relaxed);
    }

    /// It has answered a script call well.
    pub fn proven(&self) -> bool {
        self.health.proven.load(Ordering::Relaxed)
    }

    /// Healthy long enough that its failure says nothing of the next one.
    pub fn served(&self) -> bool {
        self.health.served()
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

/// A client error while opening a connection: a URL or a TLS setting the
/// client refuses was checked by `nginx -t`; should one fail here all the
/// same, it is retried as a failed connection.
fn io(e: redis::RedisError) -> RedisError {
    RedisError::Io(e.to_string())
}

/// The connection is broken, or gave no reply: it failed, closed, sent
/// bytes that are not RESP (the stream cannot be read past them), or was
/// given up.
pub fn broken(e: &redis::RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.kind() == redis::ErrorKind::Parse
        || e.is_unrecoverable_error()
}
