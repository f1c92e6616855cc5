//! The per-worker Redis I/O thread: a tokio current-thread runtime that owns
//! one connection per Redis zone (multiplexed, so calls in flight are
//! pipelined), runs the limit script for the jobs the nginx thread sends, and
//! hands replies back to it through a queue and an eventfd.
//!
//! The nginx thread sends the jobs of one event-loop iteration together; the
//! jobs of a batch on one zone go to Redis in one script call (each job still
//! all-or-nothing), so `FCALL`, `TIME` and the round trip are paid once
//! per batch (see [`super::script`]). In a Cluster, where a call's keys must
//! share a slot, see [`super::cluster`].
//!
//! A batch is answered by the zone's timeout at the latest; the requests of
//! a zone waiting for Redis are bounded ([`MAX_WAITING`]).

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::mpsc::UnboundedReceiver;

use super::clock::script_deadline;
use super::conn::Target;
use super::script::Code;
use super::zone_conn::{watch_master, ZoneConn};
use super::{Job, RedisError, Reply, ZoneSpec, CHARGE_ID};
use crate::metrics::store::redis_slot;

/// The queue the nginx thread drains when the eventfd fires.
pub struct Shared {
    pub replies: Mutex<Vec<Reply>>,
    pub efd: RawFd,
}

impl Shared {
    /// Queues replies; wakes the nginx thread only when the queue was empty
    /// (it drains the whole queue after reading the eventfd, so one wake-up
    /// serves every reply queued meanwhile).
    pub fn push(&self, replies: impl IntoIterator<Item = Reply>) {
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

/// Requests of one zone whose script call has not come back, per worker, at
/// most: beyond, `on_error` applies at once. A request answered by the
/// timeout still counts until its call is answered or its connection given
/// up, so that a server that answers, but too slowly, cannot make the calls
/// queued for it (and the client's memory for them) grow without bound. A
/// healthy Redis leaves a few dozen waiting at tens of thousands of requests
/// a second.
pub const MAX_WAITING: usize = 1024;

/// Counts `n` requests as waiting on a zone while it lives.
struct Waiting<'a>(&'a AtomicUsize, usize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(self.1, Ordering::Relaxed);
    }
}

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
        let conns: Vec<Arc<ZoneConn>> = zones
            .into_iter()
            .enumerate()
            .map(|(i, z)| Arc::new(ZoneConn { metrics: redis_slot(i), ..ZoneConn::new(z) }))
            .collect();
        for zc in &conns {
            if matches!(zc.spec.target, Target::Sentinel { .. }) {
                tokio::spawn(watch_master(zc.clone()));
            }
        }
        // `charge=after` charges in flight: finished before the thread returns.
        let mut owed = tokio::task::JoinSet::new();
        while let Some(jobs) = rx.recv().await {
            // The batch by zone, in order.
            let mut by_zone: Vec<Vec<Job>> = Vec::new();
            for job in jobs {
                if job.charge {
                    match conns.get(job.zone) {
                        Some(zc) => {
                            owed.spawn(charge(zc.clone(), code.clone(), shared.clone(), job));
                        }
                        None => charge_failed(&shared, job.zone, job.lines.len(), RedisError::NoZone),
                    }
                    continue;
                }
                if job.zone >= conns.len() {
                    shared.push([Reply { id: job.id, zone: job.zone, result: Err(RedisError::NoZone) }]);
                    continue;
                }
                if by_zone.len() <= job.zone {
                    by_zone.resize_with(job.zone + 1, Vec::new);
                }
                by_zone[job.zone].push(job);
            }
            for (z, jobs) in by_zone.into_iter().enumerate() {
                // Decisions and reads (`rl_quota`) go in calls of their own.
                let (charges, reads): (Vec<Job>, Vec<Job>) = jobs.into_iter().partition(|j| j.commit);
                for (mut jobs, commit) in [(charges, true), (reads, false)] {
                    while !jobs.is_empty() {
                        let rest = jobs.split_off(jobs.len().min(MAX_BATCH));
                        let zc = conns[z].clone();
                        if zc.waiting.load(Ordering::Relaxed) + jobs.len() > MAX_WAITING {
                            shared.push(jobs.iter().map(|job| Reply {
                                id: job.id,
                                zone: job.zone,
                                result: Err(RedisError::Overloaded),
                            }));
                        } else {
                            zc.waiting.fetch_add(jobs.len(), Ordering::Relaxed);
                            tokio::spawn(serve(zc, code.clone(), shared.clone(), jobs, commit));
                        }
                        jobs = rest;
                    }
                }
            }
            while owed.try_join_next().is_some() {}
        }
        // The worker exits (reload, shutdown): its last charges are owed.
        let longest = conns.iter().map(|zc| zc.spec.timeout).max().unwrap_or_default();
        let _ =
            tokio::time::timeout(2 * longest + CHARGE_GRACE, async { while owed.join_next().await.is_some() {} }).await;
    });
}

/// How long an exiting worker waits for its last charges beyond twice the
/// longest zone timeout (a reconnection and a call).
const CHARGE_GRACE: std::time::Duration = std::time::Duration::from_millis(500);

/// Charges the `charge=after` costs of one event-loop iteration on a zone
/// (one call per slot on a cluster); the lines not charged are reported to
/// the nginx thread, to be logged and counted.
async fn charge(zc: Arc<ZoneConn>, code: Arc<Code>, shared: Arc<Shared>, job: Job) {
    for (n, e) in zc.run_charge(&code, &job.lines).await {
        charge_failed(&shared, job.zone, n, e);
    }
}

/// Reports `n` lines of a charge on zone `zone` as failed.
fn charge_failed(shared: &Shared, zone: usize, n: usize, e: RedisError) {
    shared.push((0..n).map(|_| Reply { id: CHARGE_ID, zone, result: Err(e.clone()) }));
}

/// Runs one script call for `jobs` and answers them, by the zone's timeout
/// at the latest. The call itself goes on after the timeout (the requests
/// still count as waiting) until Redis answers it or its connection is
/// given up; it only ends sooner if the worker exits. `commit`: the jobs'
/// [`Job::commit`]; reads (`rl_quota`) are left out of the metrics.
async fn serve(zc: Arc<ZoneConn>, code: Arc<Code>, shared: Arc<Shared>, jobs: Vec<Job>, commit: bool) {
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
    let work = zc.run(&code, &jobs, commit, deadline, until);
    tokio::pin!(work);
    let results = match tokio::time::timeout(zc.spec.timeout, &mut work).await {
        Ok(results) => results,
        Err(_) => {
            shared.push(jobs.iter().map(|job| Reply { id: job.id, zone: job.zone, result: Err(RedisError::Timeout) }));
            let _ = work.await;
            counted(&zc);
            return;
        }
    };
    counted(&zc);
    shared.push(jobs.iter().zip(results).map(|(job, result)| Reply { id: job.id, zone: job.zone, result }));
}
