//! Redis Cluster: a script call's keys must share a slot. The jobs whose
//! lines all have one client key go in one call per slot; a job whose lines
//! span slots is checked on every slot first, then committed.
//!
//! Every call carries the batch's deadline (see [`super::clock`]), the
//! commits of a job across slots too; but those commits are separate calls,
//! so one can be in time and another late (or rejected, when another client
//! took the last of a limit between the check and the commit): the job is
//! then answered as failed, or rejected, with its lines on the slots that
//! committed charged. The zone keeps one offset for all the masters, so a
//! deadline can also be late by the skew between their clocks.

use std::time::Instant;

use rl_core::limit::Outcome;
use rl_core::redis::{write_state_key, Lines, RequestReply};

use super::conn::Conn;
use super::script::{call_one, CallId, Code};
use super::zone_conn::{Fate, ZoneConn};
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
            self.retrying(deadline, move |conn| self.run_job(conn, code, job, until, ids))
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
    /// (only checked, for a job that does not commit).
    async fn run_job(
        &self,
        conn: Conn,
        code: &Code,
        job: &Job,
        until: Instant,
        ids: CallId,
    ) -> Result<RequestReply, RedisError> {
        let prefix = &self.spec.prefix;
        let via = self.via(code, until);
        let tags: Vec<u64> = job.lines.iter().map(|l| l.tag).collect();
        let Some(groups) = groups(&tags) else {
            return call_one(conn, via, prefix, &job.lines, job.commit, Some(ids)).await;
        };
        let mut lines: Lines = smallvec::smallvec![Outcome::default(); job.lines.len()];
        let mut all = true;
        for commit in [false, true] {
            let calls = groups.iter().enumerate().map(|(n, g)| {
                let sub: Vec<JobLine> = g.iter().map(|&i| job.lines[i]).collect();
                let conn = conn.clone();
                async move { call_one(conn, via, prefix, &sub, commit, Some(ids.nth(n))).await }
            });
            for (g, r) in groups.iter().zip(futures_util::future::join_all(calls).await) {
                let (ok, res) = r?;
                all &= ok;
                for (i, l) in g.iter().zip(res) {
                    lines[*i] = l;
                }
            }
            if !all || !job.commit {
                break;
            }
        }
        Ok((all, lines))
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
