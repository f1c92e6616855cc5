//! A zone's connection: opened on first use, shared by the calls in flight
//! (multiplexed), dropped when it fails and reopened with back-off.

use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::cluster_async::ClusterConnection;
use redis::io::tcp::TcpSettings;
use redis::{Client, ConnectionInfo, IntoConnectionInfo, TlsCertificates};
use rl_core::redis::RequestReply;
use rl_core::url::RedisUrl;

use super::clock::Clock;
use super::script::{call, Code, Via};
use super::sentinel::sentinel_master;
use super::{Job, JobLine, RedisError, ZoneSpec};

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

#[derive(Clone)]
pub enum Conn {
    Plain(MultiplexedConnection),
    Cluster(ClusterConnection),
}

/// A zone's connection, reconnected with backoff after failures.
pub struct ZoneConn {
    pub spec: ZoneSpec,
    pub state: tokio::sync::Mutex<ConnState>,
    /// The script runs as a Redis function (until the server shows it cannot).
    pub fcall: AtomicBool,
    /// Redis' clock, for the calls' deadlines.
    pub clock: Clock,
}

pub struct ConnState {
    pub conn: Option<Conn>,
    failures: u32,
    next_try: Option<Instant>,
    /// Why the last connection attempt failed, reported until one succeeds.
    last_error: String,
    /// For a sentinel zone: the master the connection goes to.
    pub master: Option<(String, u16)>,
}

/// Longest wait between two connection attempts: Redis coming back is noticed within this.
const MAX_BACKOFF: Duration = Duration::from_millis(400);

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
        }
    }

    async fn conn(&self) -> Result<Conn, RedisError> {
        let mut st = self.state.lock().await;
        if let Some(c) = &st.conn {
            return Ok(c.clone());
        }
        if st.next_try.is_some_and(|t| Instant::now() < t) {
            return Err(RedisError::NotConnected { last: st.last_error.clone() });
        }
        match connect(&self.spec.target, &self.spec.tls).await {
            Ok((c, master)) => {
                self.clock.forget();
                st.conn = Some(c.clone());
                st.master = master;
                st.failures = 0;
                st.next_try = None;
                Ok(c)
            }
            Err(e) => {
                st.failures = st.failures.saturating_add(1);
                let backoff = Duration::from_millis(25u64 << st.failures.min(5)).min(MAX_BACKOFF);
                st.next_try = Some(Instant::now() + backoff);
                st.last_error = e.to_string();
                Err(e)
            }
        }
    }

    async fn drop_conn(&self) {
        self.state.lock().await.conn = None;
    }

    /// Runs a batch of jobs: one script call for all of them (on a cluster,
    /// see [`ZoneConn::run_cluster`]), which Redis must not run after `until`.
    pub async fn run(&self, code: &Code, jobs: &[Job], until: Instant) -> Vec<Result<RequestReply, RedisError>> {
        match self.spec.target {
            Target::Cluster(_) => self.run_cluster(code, jobs, until).await,
            _ => self.run_batch(code, jobs.iter(), until).await,
        }
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
        until: Instant,
    ) -> Vec<Result<RequestReply, RedisError>> {
        let requests: Vec<&[JobLine]> = jobs.map(|j| j.lines.as_slice()).collect();
        let via = self.via(code, until);
        match self.retrying(|conn| call(conn, via, &self.spec.prefix, &requests, true)).await {
            Ok(replies) => replies.into_iter().map(Ok).collect(),
            Err(e) => requests.iter().map(|_| Err(e.clone())).collect(),
        }
    }

    /// Runs `f` on the zone's connection. A connection that died while idle
    /// (Redis restarted) fails its first command: then drop it and run `f`
    /// once more on a new one, within the same timeout.
    pub async fn retrying<T, F, Fut>(&self, f: F) -> Result<T, RedisError>
    where
        F: Fn(Conn) -> Fut,
        Fut: std::future::Future<Output = Result<T, RedisError>>,
    {
        let result = f(self.conn().await?).await;
        match result {
            Err(e) if e.is_io() => {
                self.drop_conn().await;
                let again = match self.conn().await {
                    Ok(conn) => f(conn).await,
                    Err(again) => Err(again),
                };
                match again {
                    Err(again) if again.is_io() => {
                        self.drop_conn().await;
                        Err(again)
                    }
                    // Still in backoff after a failed connect: report the original cause.
                    Err(RedisError::NotConnected { .. }) => Err(e),
                    r => r,
                }
            }
            r => r,
        }
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

/// Opens a connection; for a sentinel zone, also says which master it went to.
async fn connect(target: &Target, tls: &Option<TlsCertificates>) -> Result<(Conn, Option<(String, u16)>), RedisError> {
    // A URL or a TLS setting the client refuses was checked by `nginx -t`:
    // should one fail here all the same, retry it as a failed connection.
    let io = |e: redis::RedisError| RedisError::Io(e.to_string());
    match target {
        Target::Single(url) => {
            let info = url.as_str().into_connection_info().map_err(io)?.set_tcp_settings(tcp());
            let client = client(info, tls).map_err(io)?;
            Ok((Conn::Plain(client.get_multiplexed_async_connection().await.map_err(io)?), None))
        }
        Target::Sentinel { sentinels, master, url } => {
            let (host, port) = sentinel_master(sentinels, master, tls).await?;
            let info = url.url_for(&host, port).as_str().into_connection_info().map_err(io)?.set_tcp_settings(tcp());
            let client = client(info, tls).map_err(io)?;
            Ok((Conn::Plain(client.get_multiplexed_async_connection().await.map_err(io)?), Some((host, port))))
        }
        Target::Cluster(nodes) => {
            let mut builder = redis::cluster::ClusterClientBuilder::new(nodes.clone()).tcp_settings(tcp());
            if let Some(certs) = tls {
                builder = builder.certs(certs.clone());
            }
            let client = builder.build().map_err(io)?;
            Ok((Conn::Cluster(client.get_async_connection().await.map_err(io)?), None))
        }
    }
}
