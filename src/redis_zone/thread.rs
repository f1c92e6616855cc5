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

use std::os::fd::RawFd;
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc::UnboundedReceiver;

use super::clock::script_deadline;
use super::conn::{Target, ZoneConn};
use super::script::Code;
use super::sentinel::watch_master;
use super::{Job, RedisError, Reply, ZoneSpec};

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
                    shared.push([Reply { id: job.id, zone: job.zone, result: Err(RedisError::NoZone) }]);
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
                        // Redis must not run the call after this; nginx
                        // waits a little longer, for the reply.
                        let until = script_deadline(zc.spec.timeout);
                        let results = match tokio::time::timeout(zc.spec.timeout, zc.run(&code, &jobs, until)).await {
                            Ok(results) => results,
                            Err(_) => jobs.iter().map(|_| Err(RedisError::Timeout)).collect(),
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
