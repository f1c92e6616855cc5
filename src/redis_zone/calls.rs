//! A worker's script calls: the jobs of one event-loop iteration, by zone,
//! go to Redis as tasks of the worker's event loop (`ngx::async_`), on the
//! zone's connection (multiplexed, so calls in flight are pipelined). The
//! jobs of a batch on one zone go in one script call (each job still
//! all-or-nothing), so `FCALL`, `TIME` and the round trip are paid once
//! per batch (see [`super::script`]); on a Cluster, where a call's keys
//! must share a slot, see [`super::cluster`]. Replies are left in the
//! [`super::inbox`].
//!
//! A batch is answered by the zone's timeout at the latest; the requests of
//! a zone waiting for Redis are bounded ([`MAX_WAITING`]).

use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ngx::async_::spawn;
use rl_core::redis::Lives;

use super::clock::script_deadline;
use super::conn::Target;
use super::inbox;
use super::memcached::{self, McZone};
use super::script::Code;
use super::timers::{timeout, Hold};
use super::zone_conn::{watch_master, Fate, Undo, ZoneConn};
use super::{HoldBatch, Job, LeaseKey, RedisError, Reply, ZoneSpec, UNDO_ID};
use crate::metrics::store::redis_slot;

/// Jobs per script call at most; a larger batch is split into several calls
/// (pipelined on the connection), so that no call runs long in Redis.
const MAX_BATCH: usize = 64;

/// Requests of one zone whose script call has not come back, per worker, at
/// most: beyond, `on_error` applies at once. A request answered by the
/// timeout still counts until its call is answered or its connection given
/// up, so that a server that answers, but too slowly, cannot make the calls
/// queued for it (and the client's memory for them) grow without bound. A
/// healthy Redis leaves a few dozen waiting at tens of thousands of requests
/// a second.
pub const MAX_WAITING: usize = 1024;

/// How long a worker that exits waits for its last charges beyond twice the
/// longest zone timeout (a reconnection and a call).
const CHARGE_GRACE: Duration = Duration::from_millis(500);

/// A worker's zones, as its calls use them.
pub struct Calls {
    conns: Vec<Arc<ZoneConn>>,
    /// The Memcached zones (by zone index, `None` for a Redis zone), whose
    /// calls are [`memcached`]'s.
    mc: Vec<Option<Rc<McZone>>>,
    code: Arc<Code>,
}

/// Counts `n` requests as waiting on a zone while it lives.
struct Waiting<'a>(&'a AtomicUsize, usize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(self.1, Ordering::Relaxed);
    }
}

impl Calls {
    /// The zones' connections (opened at the first call); Sentinel zones
    /// start following their master.
    pub fn new(zones: Vec<ZoneSpec>, names: &[&str]) -> Calls {
        let mc = zones
            .iter()
            .zip(names)
            .enumerate()
            .map(|(i, (z, name))| match z.target {
                Target::Memcached(_) => Some(Rc::new(McZone::new(name, z.clone(), redis_slot(i)))),
                _ => None,
            })
            .collect();
        let conns: Vec<Arc<ZoneConn>> = zones
            .into_iter()
            .enumerate()
            .map(|(i, z)| Arc::new(ZoneConn { metrics: redis_slot(i), ..ZoneConn::new(z) }))
            .collect();
        for zc in &conns {
            if matches!(zc.spec.target, Target::Sentinel { .. }) {
                spawn(watch_master(zc.clone())).detach();
            }
        }
        Calls { conns, mc, code: Arc::new(Code::new()) }
    }

    /// A node's sync of its leases on zone `zone` (see
    /// [`ZoneConn::run_lease`]), answered by the zone's timeout at the
    /// latest: a call given up on then is dropped (its grant, if Redis ran
    /// it, is never spent: the units are lost, never granted twice).
    pub async fn lease(
        &self,
        zone: usize,
        keys: &[LeaseKey],
        lives: Lives,
    ) -> Vec<Result<rl_core::redis::LeaseGrant, RedisError>> {
        let Some(zc) = self.conns.get(zone) else {
            return keys.iter().map(|_| Err(RedisError::NoZone)).collect();
        };
        match timeout(zc.spec.timeout, zc.run_lease(&self.code, keys, lives)).await {
            Ok(grants) => grants,
            Err(_) => keys.iter().map(|_| Err(RedisError::Timeout)).collect(),
        }
    }

    /// A node's heartbeat on zone `zone` (see [`ZoneConn::run_beat`]), by
    /// the zone's timeout at the latest.
    pub async fn beat(&self, zone: usize, key: &str, node: &str, ttl_ms: u64) -> Result<u64, RedisError> {
        let zc = self.conns.get(zone).ok_or(RedisError::NoZone)?;
        timeout(zc.spec.timeout, zc.run_beat(&self.code, key, node, ttl_ms)).await.unwrap_or(Err(RedisError::Timeout))
    }

    /// A worker's `rl_conn` changes on zone `zone` (see
    /// [`ZoneConn::run_put`]), by the zone's timeout at the latest: the
    /// units Redis reclaimed from workers gone, and the first error.
    pub async fn put(&self, zone: usize, batch: &HoldBatch, again: bool) -> (u64, Option<RedisError>) {
        let Some(zc) = self.conns.get(zone) else {
            return (0, Some(RedisError::NoZone));
        };
        timeout(zc.spec.timeout, zc.run_put(&self.code, batch, again)).await.unwrap_or((0, Some(RedisError::Timeout)))
    }

    /// Connections zone `zone` has opened so far (see
    /// [`ZoneConn::opened`]).
    pub fn opened(&self, zone: usize) -> u64 {
        self.conns.get(zone).map_or(0, |zc| zc.opened.load(Ordering::Relaxed))
    }

    /// Sends the jobs of one event-loop iteration.
    pub fn send(&self, jobs: Vec<Job>) {
        let mut by_zone: Vec<Vec<Job>> = Vec::new();
        for job in jobs {
            let Some(zc) = self.conns.get(job.zone) else {
                if job.charge {
                    inbox::charge_failed(job.zone, job.lines.len(), RedisError::NoZone);
                } else {
                    inbox::put([Reply { id: job.id, zone: job.zone, result: Err(RedisError::NoZone) }]);
                }
                continue;
            };
            let mc = self.mc.get(job.zone).and_then(Option::as_ref);
            match (job.charge, mc) {
                (true, Some(mc)) => {
                    spawn(memcached::charge(mc.clone(), job)).detach();
                    continue;
                }
                (true, None) => {
                    spawn(charge(zc.clone(), self.code.clone(), job)).detach();
                    continue;
                }
                _ => {}
            }
            if by_zone.len() <= job.zone {
                by_zone.resize_with(job.zone + 1, Vec::new);
            }
            by_zone[job.zone].push(job);
        }
        for (zone, (jobs, zc)) in by_zone.into_iter().zip(&self.conns).enumerate() {
            // Decisions and reads (`rl_quota`) go in calls of their own.
            let (charges, reads): (Vec<Job>, Vec<Job>) = jobs.into_iter().partition(|j| j.commit);
            for (mut jobs, commit) in [(charges, true), (reads, false)] {
                while !jobs.is_empty() {
                    let rest = jobs.split_off(jobs.len().min(MAX_BATCH));
                    let zc = zc.clone();
                    let mc = self.mc.get(zone).and_then(Option::as_ref);
                    let waiting = mc.map_or_else(|| zc.waiting.load(Ordering::Relaxed), |mc| mc.waiting.get());
                    if waiting + jobs.len() > MAX_WAITING {
                        inbox::put(jobs.iter().map(|job| Reply {
                            id: job.id,
                            zone: job.zone,
                            result: Err(RedisError::Overloaded),
                        }));
                    } else if let Some(mc) = mc {
                        spawn(memcached::serve(mc.clone(), jobs, commit)).detach();
                    } else {
                        zc.waiting.fetch_add(jobs.len(), Ordering::Relaxed);
                        spawn(serve(zc, self.code.clone(), jobs, commit)).detach();
                    }
                    jobs = rest;
                }
            }
        }
    }
}

/// Charges the `charge=after` costs of one event-loop iteration on a zone
/// (one call per slot on a cluster); the lines not charged are reported to
/// be logged and counted. A worker that exits gracefully waits for it.
async fn charge(zc: Arc<ZoneConn>, code: Arc<Code>, job: Job) {
    let _hold = Hold::new(2 * zc.spec.timeout + CHARGE_GRACE);
    for (n, e) in zc.run_charge(&code, &job.lines).await {
        inbox::charge_failed(job.zone, n, e);
    }
}

/// Runs one script call for `jobs` and answers them, by the zone's timeout
/// at the latest. The call itself goes on after the timeout (the requests
/// still count as waiting) until Redis answers it or its connection is
/// given up. `commit`: the jobs' [`Job::commit`]; reads (`rl_quota`) are
/// left out of the metrics.
async fn serve(zc: Arc<ZoneConn>, code: Arc<Code>, jobs: Vec<Job>, commit: bool) {
    let _waiting = Waiting(&zc.waiting, jobs.len());
    let started = Instant::now();
    let deadline = started + zc.spec.timeout;
    let counted = |zc: &ZoneConn| {
        if let Some(m) = zc.metrics.filter(|_| commit) {
            m.call(jobs.len(), started.elapsed().as_micros().min(u128::from(u64::MAX)) as u64);
        }
    };
    // Redis must not run the call after `until`; nginx waits a little
    // longer (until `deadline`), for the reply.
    let until = script_deadline(zc.spec.timeout);
    let fate = Fate::default();
    {
        let mut work = core::pin::pin!(zc.run(&code, &jobs, commit, deadline, until, &fate));
        match timeout(zc.spec.timeout, &mut work).await {
            Ok(results) => {
                counted(&zc);
                inbox::put(jobs.iter().zip(results).map(|(job, result)| Reply { id: job.id, zone: job.zone, result }));
            }
            Err(_) => {
                inbox::put(jobs.iter().map(|job| Reply {
                    id: job.id,
                    zone: job.zone,
                    result: Err(RedisError::Timeout),
                }));
                fate.answered.set(true);
                let _ = work.await;
                counted(&zc);
            }
        }
    }
    let undos = fate.take();
    if !undos.is_empty() {
        let zone = jobs.first().map_or(0, |j| j.zone);
        take_back(&zc, &code, undos, zone);
    }
}

/// How long the undo of a call is tried: within the time Redis keeps what
/// the call did (10 s beyond its deadline; see the script).
const UNDO_FOR: Duration = Duration::from_secs(8);

/// Requests of calls to undo that a zone keeps at most, per worker: beyond,
/// an undo is given up at once (and logged), so that a Redis that stops
/// answering, whose calls all end without a reply, cannot make them grow
/// (the calls in flight when a Redis fails are usually far fewer).
const MAX_UNDOS: usize = 128;

/// Queues the undo of calls whose requests were answered per `on_error`
/// without their reply, which Redis may have applied (a request answered
/// per `on_error` is never charged), and starts the zone's undoing task if
/// it is not running.
fn take_back(zc: &Arc<ZoneConn>, code: &Arc<Code>, undos: Vec<Undo>, zone: usize) {
    // (one thread: the lock is never contended, nor poisoned, there being no
    // panic while it is held)
    let Ok(mut queue) = zc.undos.lock() else {
        undos.iter().for_each(|u| undo_failed(zone, u, RedisError::NotSent));
        return;
    };
    let mut queued: usize = queue.iter().map(|(u, _)| u.requests).sum();
    let give_up = Instant::now() + UNDO_FOR;
    for u in undos {
        if queued + u.requests <= MAX_UNDOS {
            queued += u.requests;
            queue.push_back((u, give_up));
        } else {
            undo_failed(zone, &u, RedisError::Overloaded);
        }
    }
    drop(queue);
    if !zc.undoing.swap(true, Ordering::Relaxed) {
        spawn(undo_all(zc.clone(), code.clone(), zone)).detach();
    }
}

/// The zone's undoing task: undoes the queued calls one after another,
/// until none is left. A worker that exits gracefully waits for it as for
/// a charge.
async fn undo_all(zc: Arc<ZoneConn>, code: Arc<Code>, zone: usize) {
    let _hold = Hold::new(2 * zc.spec.timeout + CHARGE_GRACE);
    loop {
        let next = zc.undos.lock().ok().and_then(|mut q| q.pop_front());
        let Some((u, give_up)) = next else {
            zc.undoing.store(false, Ordering::Relaxed);
            return;
        };
        if let Err(e) = zc.take_back(&code, &u, give_up).await {
            undo_failed(zone, &u, e);
        }
    }
}

/// Reports the undo of `u` as failed, one report per request.
fn undo_failed(zone: usize, u: &Undo, e: RedisError) {
    inbox::put((0..u.requests).map(|_| Reply { id: UNDO_ID, zone, result: Err(e.clone()) }));
}
