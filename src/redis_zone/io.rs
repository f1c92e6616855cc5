//! The per-worker Redis I/O thread: a tokio current-thread runtime that owns
//! one connection per Redis zone (multiplexed, so calls in flight are
//! pipelined), runs the limit script for the jobs the nginx thread sends, and
//! hands replies back to it through a queue and an eventfd.
//!
//! The nginx thread sends the jobs of one event-loop iteration together; the
//! jobs of a batch on one zone go to Redis in one script call (each job still
//! all-or-nothing), so `FCALL`, `TIME` and the round trip are paid once
//! per batch. The script runs as a Redis function where the server has
//! them (Redis 7+, see [`Code`]), else with `EVALSHA`. In a Cluster, where
//! a call's keys must share a slot, the jobs whose lines have one client
//! key go in one call per slot, the others one by one (see
//! [`ZoneConn::run`]).

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::io::tcp::TcpSettings;
use redis::{
    Client, Cmd, ConnectionInfo, IntoConnectionInfo, RedisConnectionInfo, RedisError, Script, TlsCertificates,
};
use rl_core::limit::Limit;
use rl_core::redis::{
    function_library, function_name, parse_reply, write_args, write_state_key, Arg, Lines, RequestReply, ScriptLine,
    LIMIT_SCRIPT,
};
use smallvec::SmallVec;
use tokio::sync::mpsc::UnboundedReceiver;

/// Where a zone's Redis is.
#[derive(Clone)]
pub enum Target {
    /// `redis://` or `rediss://`.
    Single(String),
    /// `redis+sentinel://h:p,h:p/MASTER[/db]`: sentinel URLs, master name, node settings.
    Sentinel { sentinels: Vec<String>, master: String, node: RedisConnectionInfo, tls: bool },
    /// `redis+cluster://h:p,h:p`: node URLs.
    Cluster(Vec<String>),
}

/// What the I/O thread needs to know of a zone.
#[derive(Clone)]
pub struct ZoneSpec {
    pub target: Target,
    pub timeout: Duration,
    /// Prepended to every state key.
    pub prefix: String,
    /// For `rediss` URLs: the trusted CA certificates (else the public
    /// roots) and the client certificate, from the zone's `ssl_*` parameters.
    pub tls: Option<TlsCertificates>,
}

/// One request's lines on one Redis zone.
pub struct Job {
    pub id: u64,
    pub zone: usize,
    /// Inline up to two lines: no allocation for the usual request.
    pub lines: SmallVec<[JobLine; 2]>,
}

/// A line of a job: whose state (the client key's tag, see
/// [`rl_core::redis::tag_of`], and the line's id), and what to check.
#[derive(Clone, Copy)]
pub struct JobLine {
    pub tag: u64,
    pub line_id: u64,
    pub limit: Limit,
    pub cost: u64,
}

pub enum Failure {
    Timeout,
    Error(String),
}

pub struct Reply {
    pub id: u64,
    pub zone: usize,
    pub result: Result<RequestReply, Failure>,
}

/// The queue the nginx thread drains when the eventfd fires.
pub struct Shared {
    pub replies: Mutex<Vec<Reply>>,
    pub efd: RawFd,
}

impl Shared {
    /// Queues replies; wakes the nginx thread only when the queue was empty
    /// (it drains the whole queue after reading the eventfd, so one wake-up
    /// serves every reply queued meanwhile).
    fn push(&self, replies: impl IntoIterator<Item = Reply>) {
        let was_empty = match self.replies.lock() {
            Ok(mut q) => {
                let was_empty = q.is_empty();
                q.extend(replies);
                was_empty && !q.is_empty()
            }
            Err(_) => return,
        };
        if was_empty {
            let one: u64 = 1;
            // SAFETY: efd is an eventfd owned by the worker, closed only after this thread is
            // joined; writing 8 bytes is the eventfd protocol.
            unsafe { libc::write(self.efd, (&one as *const u64).cast(), 8) };
        }
    }
}

/// Jobs per script call at most; a larger batch is split into several calls
/// (pipelined on the connection), so that no call runs long in Redis.
const MAX_BATCH: usize = 64;

/// The thread's body: serve jobs until the sender is dropped.
pub fn run(zones: Vec<ZoneSpec>, mut rx: UnboundedReceiver<Vec<Job>>, shared: Arc<Shared>) {
    let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
        return;
    };
    // rustls, for `rediss://`, needs a crypto provider chosen once per
    // process (an error if another thread of this worker chose one first).
    let _ = rustls::crypto::ring::default_provider().install_default();
    rt.block_on(async move {
        let code = Arc::new(Code::new());
        let conns: Vec<Arc<ZoneConn>> = zones.into_iter().map(|z| Arc::new(ZoneConn::new(z))).collect();
        for zc in &conns {
            if matches!(zc.spec.target, Target::Sentinel { .. }) {
                tokio::spawn(watch_master(zc.clone()));
            }
        }
        while let Some(jobs) = rx.recv().await {
            // The batch by zone, in order.
            let mut by_zone: Vec<Vec<Job>> = Vec::new();
            for job in jobs {
                if job.zone >= conns.len() {
                    let failure = Failure::Error("no such zone".into());
                    shared.push([Reply { id: job.id, zone: job.zone, result: Err(failure) }]);
                    continue;
                }
                if by_zone.len() <= job.zone {
                    by_zone.resize_with(job.zone + 1, Vec::new);
                }
                by_zone[job.zone].push(job);
            }
            for (z, mut jobs) in by_zone.into_iter().enumerate() {
                while !jobs.is_empty() {
                    let rest = jobs.split_off(jobs.len().min(MAX_BATCH));
                    let (zc, shared, code) = (conns[z].clone(), shared.clone(), code.clone());
                    tokio::spawn(async move {
                        let results = match tokio::time::timeout(zc.spec.timeout, zc.run(&code, &jobs)).await {
                            Ok(results) => results,
                            Err(_) => jobs.iter().map(|_| Err(Failure::Timeout)).collect(),
                        };
                        shared.push(jobs.iter().zip(results).map(|(job, result)| Reply {
                            id: job.id,
                            zone: job.zone,
                            result,
                        }));
                    });
                    jobs = rest;
                }
            }
        }
    });
}

#[derive(Clone)]
enum Conn {
    Plain(MultiplexedConnection),
    Cluster(ClusterConnection),
}

/// A zone's connection, reconnected with backoff after failures.
struct ZoneConn {
    spec: ZoneSpec,
    state: tokio::sync::Mutex<ConnState>,
    /// The script runs as a Redis function (until the server shows it cannot).
    fcall: AtomicBool,
}

struct ConnState {
    conn: Option<Conn>,
    failures: u32,
    next_try: Option<Instant>,
    /// Why the last connection attempt failed, reported until one succeeds.
    last_error: String,
    /// For a sentinel zone: the master the connection goes to.
    master: Option<(String, u16)>,
}

/// Longest wait between two connection attempts: Redis coming back is noticed within this.
const MAX_BACKOFF: Duration = Duration::from_millis(400);

impl ZoneConn {
    fn new(spec: ZoneSpec) -> ZoneConn {
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
        }
    }

    async fn conn(&self) -> Result<Conn, String> {
        let mut st = self.state.lock().await;
        if let Some(c) = &st.conn {
            return Ok(c.clone());
        }
        if st.next_try.is_some_and(|t| Instant::now() < t) {
            return Err(format!("not connected, reconnecting after: {}", st.last_error));
        }
        match connect(&self.spec.target, &self.spec.tls).await {
            Ok((c, master)) => {
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
                st.last_error = e.trim_start_matches("io: ").to_string();
                Err(e)
            }
        }
    }

    async fn drop_conn(&self) {
        self.state.lock().await.conn = None;
    }

    /// Runs a batch of jobs: one script call for all of them, or in a
    /// cluster one call per slot for the jobs whose lines have one client
    /// key, and [`ZoneConn::run_job`] for each of the others.
    async fn run(&self, code: &Code, jobs: &[Job]) -> Vec<Result<RequestReply, Failure>> {
        if !matches!(self.spec.target, Target::Cluster(_)) {
            return self.run_batch(code, jobs.iter()).await;
        }
        // A call's keys must share a slot: the jobs whose lines all have one
        // client tag go in one call per slot; the others one by one.
        let (groups, singles) = by_slot(jobs, &self.spec.prefix);
        let batches = groups.iter().map(|g| self.run_batch(code, g.iter().map(|&i| &jobs[i])));
        let each = singles.iter().map(|&i| {
            let job = &jobs[i];
            self.retrying(move |conn| self.run_job(conn, code, job))
        });
        let (batches, each) =
            futures_util::future::join(futures_util::future::join_all(batches), futures_util::future::join_all(each))
                .await;
        let mut out: Vec<Option<Result<RequestReply, Failure>>> = jobs.iter().map(|_| None).collect();
        for (g, results) in groups.iter().zip(batches) {
            for (&i, r) in g.iter().zip(results) {
                out[i] = Some(r);
            }
        }
        for (&i, r) in singles.iter().zip(each) {
            out[i] = Some(r.map_err(Failure::Error));
        }
        out.into_iter().map(|r| r.unwrap_or_else(|| Err(Failure::Error("no reply".into())))).collect()
    }

    /// Jobs in one script call (their keys must share a slot on a cluster).
    async fn run_batch<'a>(
        &self,
        code: &Code,
        jobs: impl Iterator<Item = &'a Job>,
    ) -> Vec<Result<RequestReply, Failure>> {
        let requests: Vec<&[JobLine]> = jobs.map(|j| j.lines.as_slice()).collect();
        let via = Via { code, fcall: &self.fcall };
        match self.retrying(|conn| call(conn, via, &self.spec.prefix, &requests, true)).await {
            Ok((_, replies)) => replies.into_iter().map(Ok).collect(),
            Err(e) => requests.iter().map(|_| Err(Failure::Error(e.clone()))).collect(),
        }
    }

    /// Runs `f` on the zone's connection. A connection that died while idle
    /// (Redis restarted) fails its first command: then drop it and run `f`
    /// once more on a new one, within the same timeout.
    async fn retrying<T, F, Fut>(&self, f: F) -> Result<T, String>
    where
        F: Fn(Conn) -> Fut,
        Fut: std::future::Future<Output = Result<T, String>>,
    {
        let result = f(self.conn().await?).await;
        match result {
            Err(e) if e.starts_with("io:") => {
                self.drop_conn().await;
                let again = match self.conn().await {
                    Ok(conn) => f(conn).await,
                    Err(again) => Err(again),
                };
                match again {
                    Err(again) if again.starts_with("io:") => {
                        self.drop_conn().await;
                        Err(again)
                    }
                    // Still in backoff after a failed connect: report the original cause.
                    Err(again) if again.starts_with("not connected") => Err(e),
                    r => r,
                }
            }
            r => r,
        }
    }

    /// One job on a cluster: one script call when its lines share a slot;
    /// else the lines are checked first, then committed, group by group.
    async fn run_job(&self, conn: Conn, code: &Code, job: &Job) -> Result<RequestReply, String> {
        let prefix = &self.spec.prefix;
        let via = Via { code, fcall: &self.fcall };
        let tags: Vec<u64> = job.lines.iter().map(|l| l.tag).collect();
        let Some(groups) = groups(&tags) else {
            return call_one(conn, via, prefix, &job.lines, true).await;
        };
        let mut lines: Lines = smallvec::smallvec![ScriptLine::default(); job.lines.len()];
        let mut all = true;
        for commit in [false, true] {
            let calls = groups.iter().map(|g| {
                let sub: Vec<JobLine> = g.iter().map(|&i| job.lines[i]).collect();
                let conn = conn.clone();
                async move { call_one(conn, via, prefix, &sub, commit).await }
            });
            for (g, r) in groups.iter().zip(futures_util::future::join_all(calls).await) {
                let (ok, res) = r?;
                all &= ok;
                for (i, l) in g.iter().zip(res) {
                    lines[*i] = l;
                }
            }
            if !all {
                break;
            }
        }
        Ok((all, lines))
    }
}

/// One script call for `requests` (each a request's lines) on keys under
/// `prefix` (see [`invoke`] for how).
async fn call(
    conn: Conn,
    via: Via<'_>,
    prefix: &str,
    requests: &[&[JobLine]],
    commit: bool,
) -> Result<(u64, Vec<RequestReply>), String> {
    let command = |how: How| {
        let mut cmd = match how {
            How::Fcall => redis::cmd("FCALL").arg(&via.code.function).to_owned(),
            How::Evalsha => redis::cmd("EVALSHA").arg(via.code.script.get_hash()).to_owned(),
            How::Eval => redis::cmd("EVAL").arg(LIMIT_SCRIPT).to_owned(),
        };
        cmd.arg(requests.iter().map(|r| r.len()).sum::<usize>());
        let mut key = String::new();
        for line in requests.iter().flat_map(|r| r.iter()) {
            key.clear();
            write_state_key(&mut key, prefix, line.tag, line.line_id);
            cmd.arg(key.as_str());
        }
        let lines = requests.iter().map(|r| r.iter().map(|l| (l.limit, l.cost)));
        write_args(lines, commit, None, |a| {
            match a {
                Arg::Str(s) => cmd.arg(s),
                Arg::Int(i) => cmd.arg(i),
                // A run's length: at most a batch.
                Arg::Neg(n) => cmd.arg(-(n as i64)),
            };
        });
        cmd
    };
    let reply: Vec<i64> = match conn {
        Conn::Plain(mut c) => invoke(&mut c, via, command).await?,
        Conn::Cluster(mut c) => invoke(&mut c, via, command).await?,
    };
    let nlines: Vec<usize> = requests.iter().map(|r| r.len()).collect();
    parse_reply(&reply, &nlines).ok_or_else(|| "malformed script reply".to_string())
}

/// [`call`] for one request.
async fn call_one(
    conn: Conn,
    via: Via<'_>,
    prefix: &str,
    lines: &[JobLine],
    commit: bool,
) -> Result<RequestReply, String> {
    let (_, mut replies) = call(conn, via, prefix, &[lines], commit).await?;
    replies.pop().ok_or_else(|| "malformed script reply".to_string())
}

/// The limit script: as a Redis function library, and as a script.
pub struct Code {
    script: Script,
    /// The library's function (and library) name.
    function: String,
    /// The library's text, for `FUNCTION LOAD`.
    library: String,
}

impl Code {
    fn new() -> Code {
        Code { script: Script::new(LIMIT_SCRIPT), function: function_name(), library: function_library() }
    }
}

/// How a zone runs the script: `fcall` until its server shows it cannot.
#[derive(Clone, Copy)]
struct Via<'a> {
    code: &'a Code,
    fcall: &'a AtomicBool,
}

#[derive(Clone, Copy)]
enum How {
    Fcall,
    Evalsha,
    Eval,
}

/// Sends the call as `command(How::Fcall)` while the zone uses functions:
/// after `Function not found` (first call, Redis restarted, `FUNCTION
/// FLUSH`) it loads the library (on every master of a cluster) and calls
/// again, up to [`MAX_LOADS`] times. A server without functions (Redis
/// before 7.0), that does not let this user load them, or that refuses the
/// library (`ERR`) turns the zone to `EVALSHA` for good; another failure to
/// load, for this call. `EVALSHA` is followed after `NOSCRIPT` (Redis
/// restarted, `SCRIPT FLUSH`) by `EVAL` with the script's text, which runs
/// it and caches it again in one command (a `SCRIPT LOAD` then `EVALSHA`
/// could meet a second flush between the two).
async fn invoke<C: ConnectionLike + Send>(
    c: &mut C,
    via: Via<'_>,
    command: impl Fn(How) -> Cmd,
) -> Result<Vec<i64>, String> {
    if via.fcall.load(Ordering::Relaxed) {
        let mut result = command(How::Fcall).query_async(c).await;
        if result.as_ref().is_err_and(unsupported) {
            via.fcall.store(false, Ordering::Relaxed);
        }
        // No function (yet, or no more): load the library and call again. A
        // flush can land between the load and the call (there is no atomic
        // load-and-call, as EVAL is for a script): then load again, a few times.
        let mut loads = 0;
        while loads < MAX_LOADS && result.as_ref().is_err_and(|e| detail_starts(e, "Function not found")) {
            loads += 1;
            let load = redis::cmd("FUNCTION")
                .arg("LOAD")
                .arg("REPLACE")
                .arg(&via.code.library)
                .query_async::<redis::Value>(c)
                .await;
            match load {
                Ok(_) => result = command(How::Fcall).query_async(c).await,
                Err(e) if is_io(&e) => return Err(describe(e)),
                // ERR: a server that cannot take this library (it would refuse it again).
                Err(e) if unsupported(&e) || e.code() == Some("ERR") => {
                    via.fcall.store(false, Ordering::Relaxed);
                    break;
                }
                // OOM, NOREPLICAS, BUSY, LOADING...: this call without functions, the next may load.
                Err(_) => return evalsha(c, command).await,
            }
        }
        if via.fcall.load(Ordering::Relaxed) {
            return result.map_err(describe);
        }
    }
    evalsha(c, command).await
}

/// `FUNCTION LOAD`s one call makes at most (see [`invoke`]).
const MAX_LOADS: u32 = 3;

/// `EVALSHA`, and `EVAL` after `NOSCRIPT` (see [`invoke`]).
async fn evalsha<C: ConnectionLike + Send>(c: &mut C, command: impl Fn(How) -> Cmd) -> Result<Vec<i64>, String> {
    let mut result = command(How::Evalsha).query_async(c).await;
    if let Err(e) = &result {
        if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) {
            result = command(How::Eval).query_async(c).await;
        }
    }
    result.map_err(describe)
}

/// A server without functions, or a user not allowed to load them.
fn unsupported(e: &RedisError) -> bool {
    e.code() == Some("NOPERM") || detail_starts(e, "unknown command") || detail_starts(e, "unknown subcommand")
}

fn detail_starts(e: &RedisError, text: &str) -> bool {
    e.detail().is_some_and(|d| d.get(..text.len()).is_some_and(|d| d.eq_ignore_ascii_case(text)))
}

/// READONLY: the server was demoted to a replica (failover); reconnect to the master.
fn is_io(e: &RedisError) -> bool {
    e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() || e.code() == Some("READONLY")
}

/// An error as [`ZoneConn::retrying`] reads it: `io: ...` when a new connection may help.
fn describe(e: RedisError) -> String {
    if is_io(&e) {
        format!("io: {e}")
    } else {
        e.to_string()
    }
}

/// For a cluster: the indices of the jobs whose lines all have one client
/// tag, grouped by the slot of their keys (under `prefix`), in order; and
/// the other jobs.
fn by_slot(jobs: &[Job], prefix: &str) -> (Vec<Vec<usize>>, Vec<usize>) {
    let mut groups: Vec<(redis::cluster_routing::Slot, Vec<usize>)> = Vec::new();
    let mut others = Vec::new();
    let mut key = String::new();
    for (i, job) in jobs.iter().enumerate() {
        let Some(first) = job.lines.first() else {
            others.push(i);
            continue;
        };
        if job.lines.iter().any(|l| l.tag != first.tag) {
            others.push(i);
            continue;
        }
        key.clear();
        write_state_key(&mut key, prefix, first.tag, first.line_id);
        let slot = redis::cluster_routing::Slot::for_key(&key);
        match groups.iter_mut().find(|(s, _)| *s == slot) {
            Some((_, v)) => v.push(i),
            None => groups.push((slot, vec![i])),
        }
    }
    (groups.into_iter().map(|(_, v)| v).collect(), others)
}

/// For a cluster, the lines grouped by hash tag when there is more than one
/// tag; `None` when one script call can take every line.
fn groups(tags: &[u64]) -> Option<Vec<Vec<usize>>> {
    let mut groups: Vec<(u64, Vec<usize>)> = Vec::new();
    for (i, t) in tags.iter().enumerate() {
        match groups.iter_mut().find(|(g, _)| g == t) {
            Some((_, v)) => v.push(i),
            None => groups.push((*t, vec![i])),
        }
    }
    (groups.len() > 1).then(|| groups.into_iter().map(|(_, v)| v).collect())
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
async fn connect(target: &Target, tls: &Option<TlsCertificates>) -> Result<(Conn, Option<(String, u16)>), String> {
    let io = |e: redis::RedisError| format!("io: {e}");
    match target {
        Target::Single(url) => {
            let info = url.as_str().into_connection_info().map_err(|e| e.to_string())?.set_tcp_settings(tcp());
            let client = client(info, tls).map_err(|e| e.to_string())?;
            Ok((Conn::Plain(client.get_multiplexed_async_connection().await.map_err(io)?), None))
        }
        Target::Sentinel { sentinels, master, node, tls: secure } => {
            let (host, port) = sentinel_master(sentinels, master, tls).await?;
            let scheme = if *secure { "rediss" } else { "redis" };
            let info = format!("{scheme}://{host}:{port}")
                .as_str()
                .into_connection_info()
                .map_err(|e| e.to_string())?
                .set_redis_settings(node.clone())
                .set_tcp_settings(tcp());
            let client = client(info, tls).map_err(|e| e.to_string())?;
            Ok((Conn::Plain(client.get_multiplexed_async_connection().await.map_err(io)?), Some((host, port))))
        }
        Target::Cluster(nodes) => {
            let mut builder = redis::cluster::ClusterClientBuilder::new(nodes.clone()).tcp_settings(tcp());
            if let Some(certs) = tls {
                builder = builder.certs(certs.clone());
            }
            let client = builder.build().map_err(|e| e.to_string())?;
            Ok((Conn::Cluster(client.get_async_connection().await.map_err(io)?), None))
        }
    }
}

/// How long one sentinel may take to answer.
const SENTINEL_TIMEOUT: Duration = Duration::from_millis(500);
/// How often a sentinel zone checks that its connection still goes to the master.
const MASTER_CHECK: Duration = Duration::from_millis(500);

/// Asks the sentinels, in turn, where the master is.
async fn sentinel_master(
    sentinels: &[String],
    master: &str,
    tls: &Option<TlsCertificates>,
) -> Result<(String, u16), String> {
    Sentinels::default().master(sentinels, master, tls).await
}

/// A connection to the sentinel that answered last, kept for the next
/// question (the watcher asks every [`MASTER_CHECK`]).
#[derive(Default)]
struct Sentinels {
    conn: Option<MultiplexedConnection>,
}

impl Sentinels {
    /// The master's address: asked of the kept sentinel, else of each
    /// sentinel in turn (the first that answers is kept).
    async fn master(
        &mut self,
        sentinels: &[String],
        master: &str,
        tls: &Option<TlsCertificates>,
    ) -> Result<(String, u16), String> {
        let ask = |mut c: MultiplexedConnection| async move {
            let cmd = redis::cmd("SENTINEL").arg("get-master-addr-by-name").arg(master).to_owned();
            let addr = cmd.query_async::<Option<(String, u16)>>(&mut c).await;
            (c, addr)
        };
        if let Some(c) = self.conn.take() {
            if let Ok((c, Ok(Some(addr)))) = tokio::time::timeout(SENTINEL_TIMEOUT, ask(c)).await {
                self.conn = Some(c);
                return Ok(addr);
            }
        }
        let mut last = format!("no sentinel answered for master \"{master}\"");
        for s in sentinels {
            let open = async {
                let c = client(s.as_str().into_connection_info()?, tls)?.get_multiplexed_async_connection().await?;
                Ok::<_, redis::RedisError>(ask(c).await)
            };
            match tokio::time::timeout(SENTINEL_TIMEOUT, open).await {
                Ok(Ok((c, Ok(Some(addr))))) => {
                    self.conn = Some(c);
                    return Ok(addr);
                }
                Ok(Ok((_, Ok(None)))) => last = format!("sentinel {s} does not know master \"{master}\""),
                Ok(Ok((_, Err(e)))) | Ok(Err(e)) => last = format!("io: sentinel {s}: {e}"),
                Err(_) => last = format!("io: sentinel {s} timed out"),
            }
        }
        Err(last)
    }
}

/// A failover that leaves the old master running (SENTINEL FAILOVER, a
/// network split) breaks no connection: follow the sentinels'
/// `+switch-master` announcements (milliseconds after a switch), and check
/// the master's address twice a second besides, and drop a connection to a
/// former master.
async fn watch_master(zc: Arc<ZoneConn>) {
    let Target::Sentinel { sentinels, master, .. } = &zc.spec.target else {
        return;
    };
    let mut announcements = None;
    let mut asker = Sentinels::default();
    loop {
        if announcements.is_none() {
            announcements = subscribe_switches(sentinels, &zc.spec.tls).await;
        }
        let switched = match announcements.as_mut() {
            Some(pubsub) => {
                let mut stream = pubsub.on_message();
                tokio::select! {
                    msg = stream.next() => match msg {
                        Some(m) => m.get_payload_bytes().starts_with(format!("{master} ").as_bytes()),
                        None => {
                            drop(stream);
                            announcements = None;
                            false
                        }
                    },
                    _ = tokio::time::sleep(MASTER_CHECK) => false,
                }
            }
            None => {
                tokio::time::sleep(MASTER_CHECK).await;
                false
            }
        };
        let current = zc.state.lock().await.master.clone();
        let Some(current) = current else { continue };
        let moved = switched || asker.master(sentinels, master, &zc.spec.tls).await.is_ok_and(|now| now != current);
        if moved {
            let mut st = zc.state.lock().await;
            st.conn = None;
            st.master = None;
        }
    }
}

/// Subscribes to `+switch-master` on the first sentinel that answers.
async fn subscribe_switches(sentinels: &[String], tls: &Option<TlsCertificates>) -> Option<redis::aio::PubSub> {
    for s in sentinels {
        let sub = async {
            let mut ps = client(s.as_str().into_connection_info()?, tls)?.get_async_pubsub().await?;
            ps.subscribe("+switch-master").await?;
            Ok::<_, redis::RedisError>(ps)
        };
        if let Ok(Ok(ps)) = tokio::time::timeout(SENTINEL_TIMEOUT, sub).await {
            return Some(ps);
        }
    }
    None
}
