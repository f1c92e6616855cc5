//! A node's sync in lease mode: every `sync=` interval, one worker of the
//! nginx (the first) walks the zone's records (in parts, each under a hold
//! of the zone's lock of its own: the lock is every worker's requests' too)
//! and, in one lease call per
//! zone (per slot on a cluster; in calls of [`MAX_KEYS`] keys), gives back
//! what ended leases left and takes new leases for the keys that run low,
//! then writes the grants into the records.
//!
//! A record is never synced twice at once (its `asking`), a give-back
//! leaves it with the call that carries it, and a grant's life counts from
//! when the call was sent: whatever becomes of a call, nothing is spent
//! twice or beyond the line (see rl-core's `lease::Slot`).

use core::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use ngx::async_::{sleep, spawn};
use ngx::ffi::{ngx_cycle, ngx_log_t, ngx_worker, NGX_LOG_NOTICE, NGX_LOG_WARN};
use ngx::ngx_log_error;
use rl_core::lease::{Horizon, Kept};
use rl_core::redis::{LeaseArg, LeaseGrant};

use super::LeaseZone;
use crate::metrics::store::{lease_slot, LeaseSlot};
use crate::redis_zone::{self, JobLine, LeaseKey, RedisError, RedisZone};
use crate::shm::now_us;

/// Keys per lease call at most: a larger sync goes in several calls
/// (pipelined on the zone's connection), so that no call runs long in
/// Redis.
const MAX_KEYS: usize = 256;

/// Starts the syncs, in the worker that runs them (the first: one per
/// nginx). The zones live as long as the worker's cycle, which is the
/// worker's whole life.
pub fn init_worker(leases: &'static [LeaseZone], redis: &'static [Box<RedisZone>]) {
    // SAFETY: set by nginx before the worker's init_process runs.
    if leases.is_empty() || unsafe { ngx_worker } != 0 {
        return;
    }
    let node = node_name();
    for (i, lz) in leases.iter().enumerate() {
        if let Some(zone) = redis.get(lz.redis) {
            spawn(run(lz, zone, node.clone(), lease_slot(i))).detach();
        }
    }
}

/// This nginx's name in the zones' membership sets: its host's name and
/// its master's process id.
fn node_name() -> String {
    // SAFETY: getppid cannot fail; a worker's parent is its master.
    format!("{}:{}", redis_zone::host_name(), unsafe { libc::getppid() })
}

/// How many intervals a node's membership outlives its last heartbeat,
/// and how many Redis may not answer before this nginx limits alone.
const MEMBERSHIP_INTERVALS: u64 = 3;
const ALONE_AFTER_INTERVALS: u64 = 2;

/// Syncs `lz` every interval, for as long as the worker runs.
async fn run(lz: &'static LeaseZone, zone: &'static RedisZone, node: String, counters: Option<&'static LeaseSlot>) {
    let mut members = String::new();
    rl_core::redis::write_members_key(&mut members, &zone.spec.prefix, &lz.name);
    let interval = lz.sync.as_micros() as u64;
    let mut cadence = now_us().saturating_add(interval);
    let (mut ends, mut last) = (None, 0u64);
    loop {
        // The next sync of the cadence, or, sooner, the end of a lease
        // (with its window), just past it; a quarter of an interval after
        // the last sync at the soonest (leases asked with requests end at
        // any time: each sync walks every record).
        let soonest = last.saturating_add(interval / 4);
        let at =
            ends.filter(|&e| e < cadence).map_or(cadence, |e: u64| e.saturating_add(1000).max(soonest).min(cadence));
        // (a millisecond at least: never a busy loop, whatever the clock says)
        sleep(Duration::from_micros(at.saturating_sub(now_us()).max(1000))).await;
        let regular = now_us() >= cadence;
        if regular {
            cadence = now_us().saturating_add(interval);
        }
        last = now_us();
        ends = once(lz, zone, &members, &node, counters, regular, cadence).await;
    }
}

/// One sync of the zone, the next of the cadence at `next`: on the
/// cadence (`regular`), the heartbeat and every record's, the interval's
/// demand folded in; between, the records' whose leases ended (counted in
/// `counters`, with `rl_metrics`). When the first lease still held ends.
async fn once(
    lz: &LeaseZone,
    zone: &RedisZone,
    members: &str,
    node: &str,
    counters: Option<&LeaseSlot>,
    regular: bool,
    next: u64,
) -> Option<u64> {
    let sent = now_us();
    let interval = lz.sync.as_micros() as u64;
    let shared = lz.shared();
    if regular {
        let ttl_ms = (interval * MEMBERSHIP_INTERVALS).div_ceil(1000).max(1);
        match redis_zone::beat(lz.redis, members, node, ttl_ms).await {
            Ok(nodes) => {
                shared.nodes.store(nodes, Ordering::Relaxed);
                shared.answered.store(sent, Ordering::Relaxed);
            }
            Err(e) => zone.failed_doing(log(), &e, "leases not renewed until the next sync"),
        }
    }
    let (asks, ends) = collect(lz, sent, next, regular);
    if !asks.is_empty() {
        let keys: Vec<LeaseKey> = asks.iter().map(|(_, k)| *k).collect();
        let calls = keys.chunks(MAX_KEYS).map(|chunk| async move {
            // (timed on the clock itself: nginx's cached one moves in whole milliseconds)
            let start = Instant::now();
            let got = redis_zone::lease(lz.redis, chunk, lz.lives).await;
            if let Some(c) = counters {
                let us = start.elapsed().as_micros().min(u128::from(u64::MAX)) as u64;
                c.synced(chunk.len(), us, got.iter().any(Result::is_err));
            }
            got
        });
        let grants: Vec<Result<LeaseGrant, RedisError>> = join_all(calls).await.into_iter().flatten().collect();
        if let Some(c) = counters {
            for ((_, k), g) in asks.iter().zip(&grants) {
                if let Ok(g) = g {
                    c.granted(g.units);
                    if g.taken_back {
                        c.returned(k.arg.back);
                    }
                }
            }
        }
        match grants.iter().find_map(|g| g.as_ref().err()) {
            Some(e) => zone.failed_doing(log(), e, "leases not renewed until the next sync"),
            None => shared.answered.store(sent, Ordering::Relaxed),
        }
        apply(lz, &asks, &grants, sent);
    }
    if lz.local && regular {
        alone_or_not(lz, zone, now_us(), counters);
    }
    ends
}

/// `on_error=local`: this nginx starts limiting alone once Redis has not
/// answered for [`ALONE_AFTER_INTERVALS`] intervals, and stops when it
/// answers again, charging Redis what it admitted alone; each said once.
fn alone_or_not(lz: &LeaseZone, zone: &RedisZone, now: u64, counters: Option<&LeaseSlot>) {
    let shared = lz.shared();
    let answered = shared.answered.load(Ordering::Relaxed);
    let since = shared.alone_since.load(Ordering::Relaxed);
    let silent = now.saturating_sub(answered) > ALONE_AFTER_INTERVALS * lz.sync.as_micros() as u64;
    if since == 0 && silent {
        shared.alone_since.store(answered.max(1), Ordering::Relaxed);
        if let Some(c) = counters {
            c.went_alone();
        }
        ngx_log_error!(
            NGX_LOG_WARN,
            log(),
            "rl_zone \"{}\" lost Redis {}, limiting locally at 1/{} of each line",
            lz.name,
            zone.shown,
            lz.nodes()
        );
    } else if since != 0 && !silent {
        shared.alone_since.store(0, Ordering::Relaxed);
        let owed = settle(lz);
        ngx_log_error!(
            NGX_LOG_NOTICE,
            log(),
            "rl_zone \"{}\" Redis {} is back, leases resume; {} units admitted locally are charged to it",
            lz.name,
            zone.shown,
            owed
        );
    }
}

/// Charges Redis what this nginx admitted alone (in `charge=after`'s
/// calls: in full, beyond the burst if need be), so that a window the
/// outage spans is not given twice: the units owed.
fn settle(lz: &LeaseZone) -> u64 {
    let mut owed = Vec::new();
    each_record(lz, |_, words| {
        let Some(mut kept) = Kept::read(words) else { return };
        if kept.owed > 0 {
            owed.push((kept.tag, kept.line_id, lz.decided_by(&kept), kept.owed));
            kept.owed = 0;
            kept.write(words);
        }
    });
    let mut total: u64 = 0;
    for (tag, line_id, limit, cost) in owed {
        let Some(limit) = limit else { continue };
        total = total.saturating_add(cost);
        let line = JobLine {
            tag,
            line_id,
            limit,
            cost: cost.min(rl_core::redis::MAX_EXACT - 1),
            dry_run: false,
            check_only: false,
            next: false,
            deepest_queue: rl_core::redis::OVERDRAWN,
            lease_life: 0,
            kept: 0,
            holder: None,
            wait: None,
            classes: None,
        };
        redis_zone::charge(log(), lz.redis, line);
    }
    total
}

/// What the sync at `now` sends (the next of the cadence at `next`): on
/// the cadence (`regular`), each record's [`Kept::sync`], which also folds
/// in the interval's demand, for every record, asked for or not; between,
/// the records' whose leases ended. And when the first lease held ends.
fn collect(lz: &LeaseZone, now: u64, next: u64, regular: bool) -> (Vec<([u64; 2], LeaseKey)>, Option<u64>) {
    let mut asks = Vec::new();
    let mut ends: Option<u64> = None;
    if let Some(mut locked) = lz.table.lock() {
        locked.expire((now / 1_000_000) as u32);
        locked.unlock();
    }
    let interval = lz.sync.as_micros() as u64;
    each_record(lz, |hash, words| {
        // (passed over without being read whole: on the cadence, a record of a key gone idle,
        // which a sync would leave as it is; between two syncs of the cadence, which are for
        // the keys whose leases ended, a record whose leases have not)
        if regular && Kept::idle_of(words) {
            return;
        }
        let first = Kept::ends_first_of(words);
        if !regular && first.is_none_or(|e| e > now) {
            ends = sooner(ends, first);
            return;
        }
        let Some(mut kept) = Kept::read(words) else { return };
        let leasing = lz.leasing_of(&kept);
        // (when a lease granted now would end: what it is sized for)
        let h = Horizon { next, interval, ends: leasing.map_or(next, |l| l.end(now)), wait: lz.lives.bucket_us };
        let arg = match regular {
            true => kept.sync(now, h, lz.nodes()),
            false => kept.sync_between(now, h, lz.nodes()),
        };
        ends = sooner(ends, kept.slot.ends_first());
        if let Some(arg) = arg {
            match leasing {
                Some(leasing) => {
                    // (a give-back its window no longer counts is not sent)
                    if let Some(arg) = leasing.worth_sending(arg, now) {
                        let arg = LeaseArg { line: *leasing.line(), want: arg.want, back: arg.back, words: arg.words };
                        asks.push((hash, LeaseKey { tag: kept.tag, line_id: kept.line_id, arg }));
                    }
                }
                // (a line no longer configured, or a key whose values cannot be leased: its lease
                // is left to end)
                None => kept.slot.unanswered(now),
            }
        }
        kept.write(words);
    });
    (asks, ends)
}

/// The sooner of two times, either of which may be none.
fn sooner(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        _ => a.or(b),
    }
}

/// Records a walk of the zone visits under one hold of its lock: the
/// workers' requests wait for it at most that long (a walk of a zone of
/// many keys under one hold would stop them for milliseconds, at every
/// sync).
const WALK_PART: usize = 256;

/// Runs `f` on the words of every record of the lease zone (with its
/// key's hash), in parts of [`WALK_PART`] records, each under a hold of
/// the zone's lock of its own (see `Table::live_entries_from`: a record
/// made or dropped meanwhile may be visited or not).
fn each_record(lz: &LeaseZone, mut f: impl FnMut([u64; 2], &mut [u64])) {
    let mut part = Vec::with_capacity(WALK_PART);
    let mut from = Some(0);
    while let Some(start) = from {
        let Some(mut locked) = lz.table.lock() else { return };
        from = locked.table.live_entries_from(start, WALK_PART, &mut part);
        for &(slot, hash) in &part {
            if let Some(words) = locked.words(slot, hash, Kept::WORDS) {
                f(hash, words);
            }
        }
        locked.unlock();
    }
}

/// Writes the sync's grants (sent at `sent`) into the records; a key with
/// none may be asked for again at the next sync.
fn apply(lz: &LeaseZone, asks: &[([u64; 2], LeaseKey)], grants: &[Result<LeaseGrant, RedisError>], sent: u64) {
    // (in parts, as a walk: the lock is the workers' requests' too)
    let asks = asks.chunks(WALK_PART).zip(grants.chunks(WALK_PART));
    for (asks, grants) in asks {
        let Some(mut locked) = lz.table.lock() else { return };
        for ((hash, _), grant) in asks.iter().zip(grants) {
            // (a record dropped meanwhile, the zone being full: its grant is lost)
            let Some(slot) = locked.table.peek(*hash) else { continue };
            let Some(words) = locked.words(slot, *hash, Kept::WORDS) else { continue };
            let Some(mut kept) = Kept::read(words) else { continue };
            match grant {
                Ok(g) => kept.granted(sent, g),
                Err(_) => kept.slot.unanswered(sent),
            }
            kept.write(words);
        }
        locked.unlock();
    }
}

/// The cycle's log, for a task that has no request.
fn log() -> *mut ngx_log_t {
    // SAFETY: ngx_cycle is set before any module code runs in a worker and stays valid.
    unsafe { (*ngx_cycle).log }
}
