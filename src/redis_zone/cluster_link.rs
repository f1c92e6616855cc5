//! A zone's link to a Redis Cluster, on the worker's event loop: the slot
//! map (`CLUSTER SLOTS`, asked of the first seed node that answers), one
//! connection per master (opened as the zone's other connections are:
//! `open.rs`), each command sent to the master of its first key's slot,
//! `MOVED` followed (the map updated) and `ASK` followed once (`ASKING`
//! first), `FUNCTION LOAD` sent to every master.
//!
//! The `redis` crate has a cluster client, but it runs its own tasks and
//! timers on a tokio runtime, which nginx-rl does not have: this link
//! keeps the crate for the protocol (commands, replies, redirections) and
//! leaves it only the routing. A failover, or a master gone, breaks
//! (or silences) a connection: the zone then gives the whole link up and
//! opens a new one, with a new slot map (see `zone_conn.rs`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ngx::async_::Task;
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster_routing::Slot;
use redis::{Cmd, ConnectionAddr, ConnectionInfo, IntoConnectionInfo, Pipeline, RedisFuture, Value};
use rustls::ClientConfig;

use super::open::{data_config, host_port, open};
use super::timers::{sleep, timeout};
use super::RedisError;

/// Redirections one command follows at most.
const MAX_REDIRECTS: usize = 5;

/// How long a command is sent again while its slot is being migrated
/// (`TRYAGAIN`), in pauses that double from the first to the longest: a
/// migration of a slot's few rate-limiting keys takes milliseconds. The
/// zone's `timeout` answers the requests first when it is shorter.
const TRY_AGAIN_FOR: Duration = Duration::from_secs(1);
const TRY_AGAIN_PAUSE: Duration = Duration::from_millis(5);
const TRY_AGAIN_PAUSE_MAX: Duration = Duration::from_millis(100);
const TRY_AGAIN: redis::ErrorKind = redis::ErrorKind::Server(redis::ServerErrorKind::TryAgain);

/// Slots in a cluster.
const SLOTS: u16 = 16384;

#[derive(Clone)]
pub struct ClusterLink(Arc<Inner>);

struct Inner {
    /// The first seed's settings (credentials, db, TLS), for every node.
    template: ConnectionInfo,
    tls: Option<Arc<ClientConfig>>,
    stall: Duration,
    /// Each slot's master (`host:port`).
    slots: Mutex<HashMap<Slot, Arc<str>>>,
    /// The masters' connections.
    nodes: tokio::sync::Mutex<HashMap<Arc<str>, Node>>,
}

struct Node {
    conn: MultiplexedConnection,
    /// Reads and writes the connection; dropped with the link.
    _driver: Task<()>,
}

/// Where a command goes.
enum Route {
    Slot(Slot),
    AllMasters,
    Any,
}

impl ClusterLink {
    /// Reads the slot map from the first of `seeds` that answers, and
    /// connects to its masters.
    pub async fn open(
        seeds: &[String],
        tls: Option<&Arc<ClientConfig>>,
        stall: Duration,
    ) -> Result<ClusterLink, RedisError> {
        let mut last = RedisError::Io("no cluster node".into());
        for seed in seeds {
            let info = match seed.as_str().into_connection_info() {
                Ok(i) => i,
                Err(e) => {
                    last = RedisError::Io(e.to_string());
                    continue;
                }
            };
            let link = ClusterLink(Arc::new(Inner {
                template: info,
                tls: tls.cloned(),
                stall,
                slots: Mutex::new(HashMap::new()),
                nodes: tokio::sync::Mutex::new(HashMap::new()),
            }));
            match link.load_slots(seed_addr(&link.0.template)).await {
                Ok(()) => {
                    link.connect_masters().await;
                    return Ok(link);
                }
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// Asks `node` for the slot map and takes it.
    async fn load_slots(&self, node: Arc<str>) -> Result<(), RedisError> {
        let mut conn = self.node(&node).await?;
        let map: Value = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query_async(&mut conn)
            .await
            .map_err(|e| RedisError::Io(format!("CLUSTER SLOTS on {node}: {e}")))?;
        let ranges = slot_ranges(&map).ok_or_else(|| RedisError::Io(format!("CLUSTER SLOTS on {node}: unreadable")))?;
        let mut slots = HashMap::with_capacity(usize::from(SLOTS));
        for (start, end, master) in ranges {
            let master: Arc<str> = master.into();
            for n in start..=end.min(SLOTS - 1) {
                if let Some(s) = Slot::new(n) {
                    slots.insert(s, master.clone());
                }
            }
        }
        if let Ok(mut s) = self.0.slots.lock() {
            *s = slots;
        }
        Ok(())
    }

    /// Opens the connections to every master now, together, rather than
    /// inside the first call to each: a call's round trip then carries no
    /// connect, and neither does what the zone learns of Redis' clock from
    /// it (a bound taken from a slow reply would make the next calls'
    /// deadlines early). A master that does not answer is connected to when
    /// a call needs it, as before.
    async fn connect_masters(&self) {
        let masters = self.masters();
        futures_util::future::join_all(masters.iter().map(|m| self.node(m))).await;
    }

    /// The connection to `node` (`host:port`), opened if need be.
    async fn node(&self, node: &Arc<str>) -> Result<MultiplexedConnection, RedisError> {
        let mut nodes = self.0.nodes.lock().await;
        if let Some(n) = nodes.get(node) {
            return Ok(n.conn.clone());
        }
        let (host, port) = node
            .rsplit_once(':')
            .and_then(|(h, p)| Some((h.to_string(), p.parse::<u16>().ok()?)))
            .ok_or_else(|| RedisError::Io(format!("bad node address {node}")))?;
        let tls = matches!(self.0.template.addr(), ConnectionAddr::TcpTls { .. });
        let at = if tls {
            ConnectionAddr::TcpTls { host, port, insecure: false, tls_params: None }
        } else {
            ConnectionAddr::Tcp(host, port)
        };
        let info = self.0.template.clone().set_addr(at);
        let opened = timeout(self.0.stall, open(&info, self.0.tls.as_ref(), data_config()))
            .await
            .map_err(|_| RedisError::Io(format!("connecting to {node} timed out")))??;
        let conn = opened.conn.clone();
        nodes.insert(node.clone(), Node { conn: opened.conn, _driver: opened.driver });
        Ok(conn)
    }

    fn master_of(&self, slot: Slot) -> Option<Arc<str>> {
        self.0.slots.lock().ok()?.get(&slot).cloned()
    }

    fn masters(&self) -> Vec<Arc<str>> {
        let mut all: Vec<Arc<str>> = self.0.slots.lock().map(|s| s.values().cloned().collect()).unwrap_or_default();
        all.sort();
        all.dedup();
        all
    }

    /// Runs `cmd` where its route says, following redirections, and
    /// again after a pause while its slot is being migrated (`TRYAGAIN`:
    /// a call of several keys, some of them not moved yet, which Redis did
    /// not run), for [`TRY_AGAIN_FOR`] at most.
    async fn run(&self, cmd: &Cmd) -> redis::RedisResult<Value> {
        let unknown = || redis::RedisError::from((redis::ErrorKind::Io, "no master for the slot"));
        let slot = match route(cmd) {
            Route::AllMasters => return self.run_everywhere(cmd).await,
            Route::Slot(slot) => Some(slot),
            Route::Any => None,
        };
        // Where the command goes first: its slot's master, as the map has it now.
        let first = || match slot {
            Some(slot) => self.master_of(slot).ok_or_else(unknown),
            None => self.masters().into_iter().next().ok_or_else(unknown),
        };
        let (mut target, mut asking, mut redirects) = (first()?, false, 0);
        let (mut paused, mut pause) = (Duration::ZERO, TRY_AGAIN_PAUSE);
        loop {
            let mut conn = self.node(&target).await.map_err(to_redis)?;
            let reply = if asking {
                // (two replies: ASKING's, skipped, then the command's)
                let mut pipe = redis::pipe();
                pipe.cmd("ASKING").add_command(cmd.clone());
                conn.req_packed_commands(&pipe, 1, 1).await.map(|mut v| v.pop().unwrap_or(Value::Nil))
            } else {
                conn.req_packed_command(cmd).await
            };
            // The connection hands a server's error reply over as a value: a redirection is one.
            let e = match reply {
                Ok(Value::ServerError(e)) => redis::RedisError::from(e),
                Err(e) if e.redirect_node().is_some() || e.kind() == TRY_AGAIN => e,
                other => return other,
            };
            if e.kind() == TRY_AGAIN && paused < TRY_AGAIN_FOR {
                sleep(pause).await;
                paused += pause;
                pause = (pause * 2).min(TRY_AGAIN_PAUSE_MAX);
                (target, asking, redirects) = (first()?, false, 0);
                continue;
            }
            let Some((node, slot)) = e.redirect_node() else { return Err(e) };
            redirects += 1;
            if redirects > MAX_REDIRECTS {
                return Err(redis::RedisError::from((redis::ErrorKind::Io, "too many cluster redirections")));
            }
            let node: Arc<str> = node.into();
            asking = e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::Ask);
            if !asking {
                if let (Some(s), Ok(mut slots)) = (Slot::new(slot), self.0.slots.lock()) {
                    slots.insert(s, node.clone());
                }
            }
            target = node;
        }
    }

    /// Runs `cmd` on every master: the first error, else the first reply.
    async fn run_everywhere(&self, cmd: &Cmd) -> redis::RedisResult<Value> {
        let mut first = None;
        for node in self.masters() {
            let mut conn = self.node(&node).await.map_err(to_redis)?;
            let v = conn.req_packed_command(cmd).await?;
            first.get_or_insert(v);
        }
        first.ok_or_else(|| redis::RedisError::from((redis::ErrorKind::Io, "no master")))
    }
}

impl ConnectionLike for ClusterLink {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move { self.run(cmd).await })
    }

    fn req_packed_commands<'a>(&'a mut self, _: &'a Pipeline, _: usize, _: usize) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            Err(redis::RedisError::from((redis::ErrorKind::Client, "pipelines are not routed on a cluster")))
        })
    }

    fn get_db(&self) -> i64 {
        0
    }
}

/// The route of a command: a script call by its first key.
fn route(cmd: &Cmd) -> Route {
    let args: Vec<&[u8]> =
        cmd.args_iter().filter_map(|a| if let redis::Arg::Simple(a) = a { Some(a) } else { None }).collect();
    let name = args.first().map(|a| a.to_ascii_uppercase()).unwrap_or_default();
    match name.as_slice() {
        b"FCALL" | b"FCALL_RO" | b"EVALSHA" | b"EVAL" | b"EVALSHA_RO" | b"EVAL_RO" => {
            let keys = args.get(2).and_then(|n| std::str::from_utf8(n).ok()?.parse::<usize>().ok()).unwrap_or(0);
            match (keys, args.get(3)) {
                (1.., Some(key)) => Route::Slot(Slot::for_key(key)),
                _ => Route::Any,
            }
        }
        b"FUNCTION" | b"SCRIPT" => Route::AllMasters,
        _ => Route::Any,
    }
}

/// `CLUSTER SLOTS`' reply as (first slot, last slot, master `host:port`).
fn slot_ranges(v: &Value) -> Option<Vec<(u16, u16, String)>> {
    let Value::Array(ranges) = v else { return None };
    let mut out = Vec::with_capacity(ranges.len());
    for r in ranges {
        let Value::Array(r) = r else { return None };
        let (Some(Value::Int(start)), Some(Value::Int(end)), Some(Value::Array(master))) =
            (r.first(), r.get(1), r.get(2))
        else {
            return None;
        };
        let host = match master.first()? {
            Value::BulkString(b) => String::from_utf8(b.clone()).ok()?,
            Value::SimpleString(s) => s.clone(),
            _ => return None,
        };
        let Value::Int(port) = master.get(1)? else { return None };
        let host = if host.contains(':') { format!("[{host}]") } else { host };
        out.push((u16::try_from(*start).ok()?, u16::try_from(*end).ok()?, format!("{host}:{port}")));
    }
    Some(out)
}

/// A seed's `host:port`.
fn seed_addr(info: &ConnectionInfo) -> Arc<str> {
    host_port(info.addr()).map(|(h, p)| format!("{h}:{p}")).unwrap_or_default().into()
}

fn to_redis(e: RedisError) -> redis::RedisError {
    redis::RedisError::from(std::io::Error::new(std::io::ErrorKind::ConnectionRefused, e.to_string()))
}
