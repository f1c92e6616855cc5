//! A node's sync in lease mode: every `sync=` interval, one worker of the
//! nginx (the first) walks the zone's records and, in one lease call per
//! zone (per slot on a cluster; in calls of [`MAX_KEYS`] keys), gives back
//! what ended leases left and takes new leases for the keys that run low,
//! then writes the grants into the records.
//!
//! A record is never synced twice at once (its `asking`), a give-back
//! leaves it with the call that carries it, and a grant's life counts from
//! when the call was sent: whatever becomes of a call, nothing is spent
//! twice or beyond the line (see rl-core's `lease::Slot`).

use futures_util::future::join_all;
use ngx::async_::{sleep, spawn};
use ngx::ffi::{ngx_cycle, ngx_log_t, ngx_worker};
use rl_core::lease::Kept;
use rl_core::redis::{LeaseArg, LeaseGrant};

use super::LeaseZone;
use crate::redis_zone::{self, LeaseKey, RedisError, RedisZone};
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
    for lz in leases {
        if let Some(zone) = redis.get(lz.redis) {
            spawn(run(lz, zone)).detach();
        }
    }
}

/// Syncs `lz` every interval, for as long as the worker runs.
async fn run(lz: &'static LeaseZone, zone: &'static RedisZone) {
    loop {
        sleep(lz.sync).await;
        once(lz, zone).await;
    }
}

/// One sync of the zone's records.
async fn once(lz: &LeaseZone, zone: &RedisZone) {
    let sent = now_us();
    let next = sent.saturating_add(lz.sync.as_micros() as u64);
    let asks = collect(lz, sent, next);
    if asks.is_empty() {
        return;
    }
    let keys: Vec<LeaseKey> = asks.iter().map(|(_, k)| *k).collect();
    let calls = keys.chunks(MAX_KEYS).map(|chunk| redis_zone::lease(lz.redis, chunk, lz.life_us));
    let grants: Vec<Result<LeaseGrant, RedisError>> = join_all(calls).await.into_iter().flatten().collect();
    if let Some(e) = grants.iter().find_map(|g| g.as_ref().err()) {
        zone.failed_doing(log(), e, "leases not renewed until the next sync");
    }
    apply(lz, &asks, &grants, sent);
}

/// What the sync at `now` sends (the next at `next`): each record's
/// [`Kept::sync`], which also folds in the interval's demand, for every
/// record, asked for or not.
fn collect(lz: &LeaseZone, now: u64, next: u64) -> Vec<([u64; 2], LeaseKey)> {
    let mut asks = Vec::new();
    let Some(mut locked) = lz.table.lock() else { return asks };
    locked.expire((now / 1_000_000) as u32);
    let entries: Vec<_> = locked.table.live_entries().collect();
    for (slot, hash) in entries {
        let Some(words) = locked.words(slot, hash, Kept::WORDS) else { continue };
        let Some(mut kept) = Kept::read(words) else { continue };
        if let Some(arg) = kept.sync(now, next, 1) {
            match lz.leasing(kept.line_id) {
                Some(leasing) => {
                    let arg = LeaseArg { line: *leasing.line(), want: arg.want, back: arg.back, words: arg.words };
                    asks.push((hash, LeaseKey { tag: kept.tag, line_id: kept.line_id, arg }));
                }
                // (a line no longer configured: its lease is left to end)
                None => kept.slot.unanswered(),
            }
        }
        kept.write(words);
    }
    locked.unlock();
    asks
}

/// Writes the sync's grants (sent at `sent`) into the records; a key with
/// none may be asked for again at the next sync.
fn apply(lz: &LeaseZone, asks: &[([u64; 2], LeaseKey)], grants: &[Result<LeaseGrant, RedisError>], sent: u64) {
    let Some(mut locked) = lz.table.lock() else { return };
    for ((hash, _), grant) in asks.iter().zip(grants) {
        // (a record dropped meanwhile, the zone being full: its grant is lost)
        let Some(slot) = locked.table.peek(*hash) else { continue };
        let Some(words) = locked.words(slot, *hash, Kept::WORDS) else { continue };
        let Some(mut kept) = Kept::read(words) else { continue };
        match grant {
            Ok(g) => kept.granted(sent, g),
            Err(_) => kept.slot.unanswered(),
        }
        kept.write(words);
    }
    locked.unlock();
}

/// The cycle's log, for a task that has no request.
fn log() -> *mut ngx_log_t {
    // SAFETY: ngx_cycle is set before any module code runs in a worker and stays valid.
    unsafe { (*ngx_cycle).log }
}
