//! A zone's connection: opened on first use, shared by the calls in flight
//! (multiplexed), given up when it fails or stops answering (its watchdog:
//! see `conn.rs`), and reopened with back-off; on a Sentinel zone, also
//! given up when the master moves ([`watch_master`]). The zone's script
//! calls go through it.

use std::cell::Cell;
use std::collections::VecDeque;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rl_core::redis::{write_state_key, HoldOp, LeaseGrant, Lives, RequestReply};
use rustls::ClientConfig;

use super::clock::Clock;
use super::conn::{Conn, Target, MIN_STALL};
use super::script::{beat, call, charge, conn_put, lease, undo, CallId, Code, Loads, Undone, Via};
use super::sentinel::{sentinel_master, subscribe_switches, Sentinels, MASTER_CHECK};
use super::timers::sleep;
use super::{HoldBatch, Job, JobLine, LeaseKey, RedisError, ZoneSpec};
use crate::metrics::store::RedisSlot;

/// What became of a batch's requests, as its calls need to know it:
/// whether nginx answered them without their reply (the zone's timeout),
/// and the calls to take back (see [`ZoneConn::take_back`]).
#[derive(Default)]
pub struct Fate {
    pub answered: Cell<bool>,
    undos: Cell<Vec<Undo>>,
}

/// A call to undo: its name, its requests' lines in its order, and its
/// number of requests.
pub struct Undo {
    pub id: CallId,
    pub lines: Vec<JobLine>,
    pub requests: usize,
}

impl Fate {
    pub fn undo(&self, u: Undo) {
        let mut undos = self.undos.take();
        undos.push(u);
        self.undos.set(undos);
    }

    /// The calls to undo.
    pub fn take(&self) -> Vec<Undo> {
        self.undos.take()
    }
}

/// A zone's connection, reconnected with backoff after failures.
pub struct ZoneConn {
    pub spec: ZoneSpec,
    pub state: tokio::sync::Mutex<ConnState>,
    /// The script runs as a Redis function (until the server shows it
    /// cannot), loaded by one call at a time.
    pub fcall: AtomicBool,
    pub loads: Loads,
    /// Redis' clock, for the calls' deadlines.
    pub clock: Clock,
    /// Requests whose script call has not come back, answered or not.
    pub waiting: AtomicUsize,
    /// This worker's counters of the zone (`rl_metrics`).
    pub metrics: Option<&'static RedisSlot>,
    /// Calls to undo, in order, each with when it is given up; and whether
    /// a task is undoing them (one per zone, so that an outage cannot pile
    /// up tasks that each wait for the connection).
    pub undos: std::sync::Mutex<VecDeque<(Undo, Instant)>>,
    pub undoing: AtomicBool,
    /// Connections opened so far: a new one may go to a Redis that lost
    /// what the old one wrote (a restart, a failover), which the worker's
    /// `rl_conn` heartbeat then sets right at once.
    pub opened: AtomicU64,
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

/// A charge whose connection broke is sent again only this soon after
/// the first copy: the script keeps what a charge did for 10 s from when
/// it ran (a charge has no deadline), and a copy that runs after that
/// would charge again.
const CHARGE_AGAIN_WITHIN: Duration = Duration::from_secs(5);

/// The first wait before an undo is tried again.
const UNDO_RETRY: Duration = Duration::from_millis(25);

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
            loads: Loads::default(),
            clock: Clock::new(),
            waiting: AtomicUsize::new(0),
            metrics: None,
            undos: std::sync::Mutex::new(VecDeque::new()),
            undoing: AtomicBool::new(false),
            opened: AtomicU64::new(0),
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
            if !c.abandoned() {
                return Ok(c.clone());
            }
            // Given up by its watchdog.
            let why = c.why();
            let served = c.served();
            st.conn = None;
            st.failed(served, why);
        }
        if st.next_try.is_some_and(|t| Instant::now() < t) {
            return Err(RedisError::NotConnected { last: st.last_error.clone() });
        }
        let tls = self.spec.tls.as_ref();
        // Boxed: the state of a connection attempt (TLS, setup) is large and rarely
        // needed; every call's future would carry it inline.
        match Box::pin(connect(&self.spec.target, tls, self.stall_limit())).await {
            Ok((c, master)) => {
                if let Some(m) = self.metrics {
                    m.connected(master.as_ref().map(|(h, p)| format!("{h}:{p}")).as_deref());
                }
                self.clock.forget();
                self.opened.fetch_add(1, Ordering::Relaxed);
                st.conn = Some(c.clone());
                st.master = master;
                st.next_try = None;
                Ok(c)
            }
            Err(e) => {
                st.failures = st.failures.saturating_add(1);
                st.next_try = Some(Instant::now() + backoff(st.failures));
                st.last_error = e.to_string();
                Err(RedisError::Unreachable(e.to_string()))
            }
        }
    }

    /// A call on `conn` failed with `e`, a broken connection: give it up
    /// (the other calls on it end too) unless it already was.
    async fn drop_conn(&self, conn: &Conn, e: &RedisError) {
        conn.abandon(e.to_string());
        let mut st = self.state.lock().await;
        if st.conn.as_ref().is_some_and(|c| c.same(conn)) {
            st.conn = None;
            st.failed(conn.served(), e.to_string());
        }
    }

    /// Runs a batch of jobs: one script call for all of them (on a cluster,
    /// see [`ZoneConn::run_cluster`]). `deadline` is when their requests are
    /// answered by the timeout: no new attempt starts after it; Redis must
    /// not run the calls after `until`.
    /// `commit`: the jobs' [`Job::commit`], the same for all of them.
    /// `fate` learns which calls to undo.
    pub async fn run(
        &self,
        code: &Code,
        jobs: &[Job],
        commit: bool,
        deadline: Instant,
        until: Instant,
        fate: &Fate,
    ) -> Vec<Result<RequestReply, RedisError>> {
        match self.spec.target {
            Target::Cluster(_) => self.run_cluster(code, jobs, commit, deadline, until, fate).await,
            _ => self.run_batch(code, jobs.iter(), commit, deadline, until, fate).await,
        }
    }

    /// The charges of one event-loop iteration: one call, or on a cluster
    /// one per slot. Returns the lines not charged, each group with why.
    pub async fn run_charge(&self, code: &Code, lines: &[JobLine]) -> Vec<(usize, RedisError)> {
        // No deadline for Redis; this one only bounds the wait for a reply.
        let now = Instant::now();
        let until = now + self.spec.timeout;
        // A copy is sent only while the first's memo surely outlives it.
        let again_until = now + self.spec.timeout.min(CHARGE_AGAIN_WITHIN);
        let groups = match self.spec.target {
            Target::Cluster(_) => by_key_slot(lines, &self.spec.prefix),
            _ => vec![lines.to_vec()],
        };
        let ids = CallId::reserve(groups.len());
        let calls = groups.iter().enumerate().map(|(i, g)| {
            let via = self.via(code, until);
            // (one name whatever the attempt: a charge sent again is applied once)
            let id = ids.nth(i);
            self.retrying(again_until, move |conn| charge(conn, via, &self.spec.prefix, g, id))
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

    /// A node's sync of its leases on this zone: one lease call for `keys`
    /// (on a cluster, one per slot), each named once for all its attempts.
    /// Each key's grant, in order, or why it has none.
    pub async fn run_lease(&self, code: &Code, keys: &[LeaseKey], lives: Lives) -> Vec<Result<LeaseGrant, RedisError>> {
        // (no deadline for Redis, as for a charge: a grant's life counts from
        // when the node sent the call, and what arrives late is only shorter)
        let until = Instant::now() + self.spec.timeout;
        let groups = match self.spec.target {
            Target::Cluster(_) => slot_groups(keys.iter().map(|k| (k.tag, k.line_id)), &self.spec.prefix),
            _ => vec![(0..keys.len()).collect()],
        };
        let ids = CallId::reserve(groups.len());
        let calls = groups.iter().enumerate().map(|(i, g)| {
            let group: Vec<LeaseKey> = g.iter().filter_map(|&j| keys.get(j).copied()).collect();
            let via = self.via(code, until);
            let id = ids.nth(i);
            async move {
                let group = &group;
                self.retrying(until, move |conn| lease(conn, via, &self.spec.prefix, group, lives, id)).await
            }
        });
        let mut out: Vec<Result<LeaseGrant, RedisError>> = keys.iter().map(|_| Err(RedisError::Unanswered)).collect();
        for (g, r) in groups.iter().zip(futures_util::future::join_all(calls).await) {
            // (a group's indices are the keys': within `out`)
            match r {
                Ok(grants) => {
                    for (&j, grant) in g.iter().zip(grants) {
                        if let Some(o) = out.get_mut(j) {
                            *o = Ok(grant);
                        }
                    }
                }
                Err(e) => {
                    for &j in g {
                        if let Some(o) = out.get_mut(j) {
                            *o = Err(e.clone());
                        }
                    }
                }
            }
        }
        out
    }

    /// A node's heartbeat on this zone (see [`beat`]): how many nodes are
    /// live.
    pub async fn run_beat(&self, code: &Code, key: &str, node: &str, ttl_ms: u64) -> Result<u64, RedisError> {
        let until = Instant::now() + self.spec.timeout;
        self.retrying(until, |conn| beat(conn, self.via(code, until), key, node, ttl_ms)).await
    }

    /// A worker's `rl_conn` changes on this zone (see [`conn_put`]): one
    /// call, or on a cluster one per slot, all at once. Sent again on a new
    /// connection after a broken one only when `again` (a heartbeat, which a
    /// copy cannot apply twice); else once. The units reclaimed, and the
    /// first error.
    pub async fn run_put(&self, code: &Code, batch: &HoldBatch, again: bool) -> (u64, Option<RedisError>) {
        let (ops, worker, life_ms) = (&batch.ops, batch.worker, batch.life_ms);
        let now = Instant::now();
        let until = now + self.spec.timeout;
        let deadline = if again { until } else { now };
        let groups = match self.spec.target {
            Target::Cluster(_) => slot_groups(ops.iter().map(|(k, _)| *k), &self.spec.prefix),
            _ => vec![(0..ops.len()).collect()],
        };
        let calls = groups.iter().map(|g| {
            let group: Vec<((u64, u64), HoldOp)> = g.iter().filter_map(|&j| ops.get(j).copied()).collect();
            let via = self.via(code, until);
            async move {
                let group = &group;
                self.retrying(deadline, move |conn| conn_put(conn, via, &self.spec.prefix, group, worker, life_ms))
                    .await
            }
        });
        let mut reclaimed = 0;
        let mut error = None;
        for r in futures_util::future::join_all(calls).await {
            match r {
                Ok(n) => reclaimed += n,
                Err(e) => error = error.or(Some(e)),
            }
        }
        (reclaimed, error)
    }

    /// How this zone calls the script, until `until`.
    pub fn via<'a>(&'a self, code: &'a Code, until: Instant) -> Via<'a> {
        Via { code, fcall: &self.fcall, loads: &self.loads, clock: &self.clock, until }
    }

    /// Jobs in one script call (their keys must share a slot on a cluster).
    /// A commit is named once for all its attempts, so that Redis applies
    /// it at most once; one whose requests are answered without its reply
    /// (its outcome unknown, or known after the timeout answered them) is
    /// to be undone (`fate`).
    pub async fn run_batch<'a>(
        &self,
        code: &Code,
        jobs: impl Iterator<Item = &'a Job>,
        commit: bool,
        deadline: Instant,
        until: Instant,
        fate: &Fate,
    ) -> Vec<Result<RequestReply, RedisError>> {
        let requests: Vec<&[JobLine]> = jobs.map(|j| j.lines.as_slice()).collect();
        let via = self.via(code, until);
        let id = commit.then(|| CallId::reserve(1));
        let result = self.retrying(deadline, |conn| call(conn, via, &self.spec.prefix, &requests, commit, id)).await;
        if let Some(id) = id {
            let taken_back = match &result {
                Ok(replies) => fate.answered.get() && replies.iter().any(|(admitted, ..)| *admitted),
                Err(e) => !e.not_applied(),
            };
            if taken_back {
                let lines = requests.iter().flat_map(|r| r.iter().copied()).collect();
                fate.undo(Undo { id, lines, requests: requests.len() });
            }
        }
        match result {
            Ok(replies) => replies.into_iter().map(Ok).collect(),
            Err(e) => requests.iter().map(|_| Err(e.clone())).collect(),
        }
    }

    /// Undoes the call `u`, until `give_up`: retried (it is idempotent)
    /// while Redis cannot be reached or does not answer.
    pub async fn take_back(&self, code: &Code, u: &Undo, give_up: Instant) -> Result<Undone, RedisError> {
        let mut wait = UNDO_RETRY;
        loop {
            // Sent once Redis answers again: on a connection that has answered
            // a call (the requests' calls open them; an undo opening its own
            // to a Redis that still does not answer would only keep more
            // connections and calls in flight).
            let waiting = !self.state.lock().await.conn.as_ref().is_some_and(|c| c.proven() && !c.abandoned());
            if waiting {
                if Instant::now() + wait >= give_up {
                    return Err(RedisError::NotConnected { last: "no connection answers".into() });
                }
                sleep(wait).await;
                wait = (wait * 2).min(MAX_BACKOFF);
                continue;
            }
            let via = self.via(code, give_up);
            let r = self.retrying(give_up, |conn| undo(conn, via, &self.spec.prefix, &u.lines, u.id)).await;
            match r {
                Err(e)
                    if !matches!(e, RedisError::Server(_) | RedisError::Malformed(_))
                        && Instant::now() + wait < give_up =>
                {
                    sleep(wait).await;
                    wait = (wait * 2).min(MAX_BACKOFF);
                }
                r => return r,
            }
        }
    }

    /// Runs `f` on the zone's connection. A connection that died while idle
    /// (Redis restarted) fails its first command: then give it up and run
    /// `f` once more on a new one, if `deadline` has not passed. (A call
    /// that changes state is named, so that Redis applies it once: see
    /// [`CallId`].) The error is the first attempt's unless the second
    /// reached Redis.
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
            // Not sent again (still in backoff after a failed connect, or the
            // new connection failed), or refused: the first attempt's error
            // says that the call may have been applied. (A copy Redis ran
            // late says it was not: it would have found the first's memo.)
            Err(again) if again.not_applied() && !matches!(again, RedisError::Late) => Err(e),
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
            Ok(_) => conn.prove(),
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

/// Opens a connection; for a sentinel zone, also says which master it went to.
async fn connect(
    target: &Target,
    tls: Option<&Arc<ClientConfig>>,
    stall: Duration,
) -> Result<(Conn, Option<(String, u16)>), RedisError> {
    match target {
        Target::Single(url) => Ok((Conn::open(url, tls, stall).await?, None)),
        Target::Sentinel { sentinels, master, url } => {
            let (host, port) = sentinel_master(sentinels, master, tls).await?;
            Ok((Conn::open(&url.url_for(&host, port), tls, stall).await?, Some((host, port))))
        }
        Target::Cluster(nodes) => Ok((Conn::open_cluster(nodes, tls, stall).await?, None)),
        // (a Memcached zone's calls are `memcached`'s: none comes here)
        Target::Memcached(_) => Err(RedisError::NotSent),
    }
}

/// Lines grouped by the slot of their state keys (under `prefix`), for the
/// calls of a cluster.
fn by_key_slot(lines: &[JobLine], prefix: &str) -> Vec<Vec<JobLine>> {
    slot_groups(lines.iter().map(|l| (l.tag, l.line_id)), prefix)
        .into_iter()
        .map(|g| g.into_iter().filter_map(|i| lines.get(i).copied()).collect())
        .collect()
}

/// The state keys of `keys` (tags and line ids) by cluster slot: the
/// indices of each slot's keys, slots in the order their first key comes.
fn slot_groups(keys: impl Iterator<Item = (u64, u64)>, prefix: &str) -> Vec<Vec<usize>> {
    let mut groups: Vec<(redis::cluster_routing::Slot, Vec<usize>)> = Vec::new();
    let mut key = String::new();
    for (i, (tag, line_id)) in keys.enumerate() {
        key.clear();
        write_state_key(&mut key, prefix, tag, line_id);
        let slot = redis::cluster_routing::Slot::for_key(&key);
        match groups.iter_mut().find(|(s, _)| *s == slot) {
            Some((_, v)) => v.push(i),
            None => groups.push((slot, vec![i])),
        }
    }
    groups.into_iter().map(|(_, v)| v).collect()
}

/// A failover that leaves the old master running (SENTINEL FAILOVER, a
/// network split) breaks no connection: follow the sentinels'
/// `+switch-master` announcements (milliseconds after a switch), and check
/// the master's address twice a second besides, and drop a connection to a
/// former master.
pub async fn watch_master(zc: Arc<ZoneConn>) {
    let Target::Sentinel { sentinels, master, .. } = &zc.spec.target else {
        return;
    };
    let tls = zc.spec.tls.as_ref();
    let mut announcements = None;
    let mut asker = Sentinels::default();
    loop {
        if announcements.is_none() {
            announcements = subscribe_switches(sentinels, tls).await;
        }
        let heard = match announcements.as_mut() {
            Some(sw) => {
                let wait = core::pin::pin!(sleep(MASTER_CHECK));
                let next = core::pin::pin!(sw.pushes.recv());
                match futures_util::future::select(next, wait).await {
                    futures_util::future::Either::Left((Some(push), _)) => Some(is_switch_of(&push, master)),
                    // The sentinel's connection ended: subscribe again.
                    futures_util::future::Either::Left((None, _)) => None,
                    futures_util::future::Either::Right(_) => Some(false),
                }
            }
            None => {
                sleep(MASTER_CHECK).await;
                Some(false)
            }
        };
        if heard.is_none() {
            announcements = None;
        }
        let switched = heard.unwrap_or(false);
        let current = zc.state.lock().await.master.clone();
        let Some(current) = current else { continue };
        let moved = switched || asker.master(sentinels, master, tls).await.is_ok_and(|now| now != current);
        if moved {
            let mut st = zc.state.lock().await;
            st.conn = None;
            st.master = None;
        }
    }
}

/// A `+switch-master` message about `master`.
fn is_switch_of(push: &redis::PushInfo, master: &str) -> bool {
    push.kind == redis::PushKind::Message
        && push.data.get(1).is_some_and(|v| match v {
            redis::Value::BulkString(b) => b.starts_with(format!("{master} ").as_bytes()),
            _ => false,
        })
}
