//! Redis Cluster: a script call's keys must share a slot. The jobs whose
//! lines all have one client key go in one call per slot; a job whose lines
//! span slots is checked on every slot first, then committed.
//!
//! Every call carries the batch's deadline (see [`super::clock`]), the
//! commits of a job across slots too; but those commits are separate calls,
//! so one can be in time and another late (or rejected, when another client
//! took the last of a limit between the check and the commit): the job is
//! then answered as failed, or rejected, and the commits that went through
//! (or may have) are undone, as a call answered per `on_error` is. The zone
//! keeps one offset for all the masters, so a deadline can also be late by
//! the skew between their clocks.

use std::cell::Cell;
use std::time::Instant;

use rl_core::limit::Outcome;
use rl_core::redis::{write_state_key, Grants, Lines, RequestReply};

use super::conn::Conn;
use super::script::{call_one, CallId, Code};
use super::zone_conn::{Fate, Undo, ZoneConn};
use super::{Job, JobLine, RedisError};

impl ZoneConn {
    /// A batch on a cluster: the jobs whose lines all have one client tag go
    /// in one call per slot; the others one by one ([`ZoneConn::run_job`]).
    pub async fn run_cluster(
        &self,
        code: &Code,
        jobs: &[Job],
        commit: bool,
        deadline: Instant,
        until: Instant,
        fate: &Fate,
    ) -> Vec<Result<RequestReply, RedisError>> {
        let (groups, singles) = by_slot(jobs, &self.spec.prefix);
        let batches =
            groups.iter().map(|g| self.run_batch(code, g.iter().map(|&i| &jobs[i]), commit, deadline, until, fate));
        let each = singles.iter().map(|&i| {
            let job = &jobs[i];
            // (the names of its commits, one per slot at most, the same in every attempt)
            let ids = CallId::reserve(job.lines.len());
            async move {
                let committed = Cell::new(0);
                let r = self.retrying(deadline, |conn| self.run_job(conn, code, job, until, ids, &committed)).await;
                if !matches!(r, Ok((true, ..))) || fate.answered.get() {
                    undo_groups(job, ids, committed.get(), fate);
                }
                r
            }
        });
        let (batches, each) =
            futures_util::future::join(futures_util::future::join_all(batches), futures_util::future::join_all(each))
                .await;
        let mut out: Vec<Option<Result<RequestReply, RedisError>>> = jobs.iter().map(|_| None).collect();
        for (g, results) in groups.iter().zip(batches) {
            for (&i, r) in g.iter().zip(results) {
                out[i] = Some(r);
            }
        }
        for (&i, r) in singles.iter().zip(each) {
            out[i] = Some(r);
        }
        out.into_iter()
            .map(|r| r.unwrap_or_else(|| Err(RedisError::Malformed("no reply for a request".into()))))
            .collect()
    }

    /// One job on a cluster: one script call when its lines share a slot;
    /// else the lines are checked first, then committed, group by group
    /// (only checked, for a job that does not commit). `committed` gains
    /// the bit of each group (the first 63; bit 63 for the others) whose
    /// commit Redis applied or may have.
    async fn run_job(
        &self,
        conn: Conn,
        code: &Code,
        job: &Job,
        until: Instant,
        ids: CallId,
        committed: &Cell<u64>,
    ) -> Result<RequestReply, RedisError> {
        let prefix = &self.spec.prefix;
        let via = self.via(code, until);
        // (in calls to several slots, no lease is asked with the request: the key is leased
        // at the next sync)
        let job_lines: Vec<JobLine> = job.lines.iter().copied().filter(|l| l.lease_life == 0).collect();
        let tags: Vec<u64> = job_lines.iter().map(|l| l.tag).collect();
        let Some(groups) = groups(&tags) else {
            return call_one(conn, via, prefix, &job.lines, job.commit, Some(ids)).await;
        };
        let mut lines: Lines = smallvec::smallvec![Outcome::default(); job_lines.len()];
        let mut all = true;
        for commit in [false, true] {
            let calls = groups.iter().enumerate().map(|(n, g)| {
                let sub: Vec<JobLine> = g.iter().map(|&i| job_lines[i]).collect();
                let conn = conn.clone();
                async move { call_one(conn, via, prefix, &sub, commit, Some(ids.nth(n))).await }
            });
            let results = futures_util::future::join_all(calls).await;
            if commit {
                let applied = results.iter().enumerate().filter(|(_, r)| match r {
                    Ok((ok, ..)) => *ok,
                    Err(e) => !e.not_applied(),
                });
                committed.set(applied.fold(committed.get(), |m, (n, _)| m | group_bit(n)));
            }
            for (g, r) in groups.iter().zip(results) {
                let (ok, res, ..) = r?;
                all &= ok;
                for (i, l) in g.iter().zip(res) {
                    lines[*i] = l;
                }
            }
            if !all || !job.commit {
                break;
            }
        }
        // (Redis ran its lines in several calls: when is not one time)
        Ok((all, lines, 0, Grants::new()))
    }
}

/// The bit of group `n` in a job's mask of committed groups.
fn group_bit(n: usize) -> u64 {
    1 << n.min(63)
}

/// Queues the undo of the commits of `job`'s groups in `committed` (named
/// from `ids`), whose job was answered without them all: refused by one
/// slot, failed, or answered by the timeout.
fn undo_groups(job: &Job, ids: CallId, committed: u64, fate: &Fate) {
    if committed == 0 {
        return;
    }
    let tags: Vec<u64> = job.lines.iter().map(|l| l.tag).collect();
    for (n, g) in groups(&tags).unwrap_or_default().iter().enumerate() {
        if committed & group_bit(n) != 0 {
            let lines = g.iter().map(|&i| job.lines[i]).collect();
            fate.undo(Undo { id: ids.nth(n), lines, requests: 1 });
        }
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
