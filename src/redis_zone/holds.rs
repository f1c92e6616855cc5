//! A worker's units of `rl_conn` lines on Redis zones: what it counts as
//! held per key (its requests' units and its takes in flight), the
//! give-backs of requests that ended (sent with the calls of the loop
//! iteration, once), and its heartbeat every [`BEAT`], which sets each of
//! its keys' fields in Redis to its count and keeps them alive. A field a
//! heartbeat no longer renews lapses after [`LAPSE_BEATS`] beats (and the
//! zone's timeout): the units of a worker killed, or cut off from Redis,
//! are given back then (reclaimed). rl-core's `redis::holders` is the model
//! of what Redis keeps, and says why a lost give-back or reply is set right
//! by the next heartbeat, and a call is never sent twice. The calls
//! themselves (the give-backs, the heartbeats) are the worker's
//! ([`super::worker`]).

use core::cell::RefCell;
use core::sync::atomic::Ordering;
use std::collections::HashMap;
use std::time::Duration;

use rl_core::redis::{HoldOp, Holder};

use super::{HoldBatch, RedisZone};
use crate::metrics::store::redis_slot;

/// How often a worker renews its fields, and sets them to what it counts.
pub const BEAT: Duration = Duration::from_secs(1);

/// How many beats a field outlives its last renewal (the zone's timeout
/// besides): a worker's beat that comes late, or fails once, loses nothing.
pub const LAPSE_BEATS: u64 = 3;

/// A client key's tag and a line id: one state key of a zone; and, on a
/// line of classes, the request's class plus one (0 on other lines): a
/// worker holds a key's units of each class in a field of its own
/// ([`Holds::names`]).
pub type Key = (u64, u64, u8);

/// The state key of a [`Key`].
fn state(key: Key) -> (u64, u64) {
    (key.0, key.1)
}

/// One zone's bookkeeping.
struct ZoneHolds {
    /// How long the worker's fields live unless renewed (ms).
    life_ms: u64,
    /// The generation of the last heartbeat (1 before any).
    gen: u64,
    /// What the worker counts as held, per key: a key at 0 stays until the
    /// next heartbeat has deleted its field.
    counts: HashMap<Key, u64>,
    /// Give-backs, corrections and places given up for the loop
    /// iteration's calls.
    outbox: Vec<(Key, HoldOp)>,
    /// The sum of `counts` (`nginx_rl_conn_in_flight`).
    total: u64,
}

impl ZoneHolds {
    /// Counts `more` units of `key` more and `fewer` fewer, and shows the
    /// total.
    fn count(&mut self, zone: usize, key: Key, more: u64, fewer: u64) {
        let n = self.counts.entry(key).or_insert(0);
        let before = *n;
        *n = n.saturating_add(more).saturating_sub(fewer);
        self.total = self.total.saturating_sub(before).saturating_add(*n);
        if let Some(m) = redis_slot(zone) {
            m.conn_held.store(self.total, Ordering::Relaxed);
        }
    }
}

struct Holds {
    /// The worker's field names: its host, process id and a random part;
    /// then of its fields of class k on lines of classes, that and "/k"
    /// (by a [`Key`]'s class plus one).
    names: Vec<&'static str>,
    /// The worker's Redis zones (for their connections' messages).
    redis: &'static [Box<RedisZone>],
    /// By zone index: `None` for a zone without `rl_conn` lines.
    zones: Vec<Option<ZoneHolds>>,
}

thread_local! {
    static HOLDS: RefCell<Option<Holds>> = const { RefCell::new(None) };
}

/// Runs `f` on zone `zone`'s bookkeeping, if the worker keeps one. Never
/// re-entered (nothing in `f` calls back here); should it be, nothing is
/// done rather than the worker aborted.
fn with_zone<T>(zone: usize, f: impl FnOnce(&[&'static str], &mut ZoneHolds) -> T) -> Option<T> {
    HOLDS.with(|h| {
        let mut h = h.try_borrow_mut().ok()?;
        let h = h.as_mut()?;
        let names = &h.names;
        h.zones.get_mut(zone)?.as_mut().map(|z| f(names, z))
    })
}

/// The field name of class code `class` (a [`Key`]'s) in `names`.
fn name_of(names: &[&'static str], class: u8) -> &'static str {
    names.get(usize::from(class)).or(names.first()).copied().unwrap_or("")
}

/// Starts the bookkeeping of the worker's zones that have `rl_conn` lines
/// (the worker's calls start their heartbeats). The zones live as long as
/// the worker's cycle, which is the worker's whole life.
pub fn init_worker(zones: &'static [Box<RedisZone>]) {
    if !zones.iter().any(|z| z.holds) {
        return;
    }
    // (one name for the worker's life, and one per class: leaked once, as
    // the worker's lines name them in every take; a random part besides, as
    // containers of one image may share a host name and process ids)
    let name = format!("{}:{}:{:08x}", super::host_name(), std::process::id(), random32());
    let classes: Vec<String> = (0..rl_core::limit::wait::MAX_LANES).map(|k| format!("{name}/{k}")).collect();
    let names = core::iter::once(name).chain(classes).map(|n| &*Box::leak(n.into_boxed_str())).collect();
    let state = Holds {
        names,
        redis: zones,
        zones: zones
            .iter()
            .map(|z| {
                z.holds.then(|| ZoneHolds {
                    life_ms: LAPSE_BEATS * BEAT.as_millis() as u64 + z.spec.timeout.as_millis() as u64,
                    gen: 1,
                    counts: HashMap::new(),
                    outbox: Vec::new(),
                    total: 0,
                })
            })
            .collect(),
    };
    HOLDS.with(|h| h.try_borrow_mut().map(|mut h| *h = Some(state)).ok());
}

/// 32 random bits, drawn in the worker: std's random hasher keys, the
/// process and the time.
fn random32() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos());
    h.finish() as u32
}

/// A take of `cost` units of `key` on zone `zone`, sent now: counted held
/// until it is [`settle`]d otherwise. Who takes them, for the line.
pub fn take(zone: usize, key: Key, cost: u64) -> Option<Holder> {
    with_zone(zone, |names, z| {
        z.count(zone, key, cost, 0);
        Holder { worker: name_of(names, key.2), gen: z.gen, life_ms: z.life_ms }
    })
}

/// Who would take units of `key` on zone `zone` now, for a line only read
/// (`rl_quota`): nothing is counted.
pub fn peek(zone: usize, key: Key) -> Option<Holder> {
    with_zone(zone, |names, z| Holder { worker: name_of(names, key.2), gen: z.gen, life_ms: z.life_ms })
}

/// A take sent in generation `gen` that does not hold (refused, or
/// answered per `on_error`): no longer counted; if a heartbeat counted it
/// meanwhile, Redis is told (a correction). Whether a correction is to be
/// sent with the loop iteration's calls.
pub fn settle_unheld(zone: usize, key: Key, cost: u64, gen: u64) -> bool {
    with_zone(zone, |_, z| {
        z.count(zone, key, 0, cost);
        let counted = gen < z.gen;
        if counted {
            z.outbox.push((key, HoldOp::Correct { units: cost, gen: z.gen }));
        }
        counted
    })
    .unwrap_or(false)
}

/// A request that held `cost` units of `key` ended: given back with the
/// loop iteration's calls. Whether it is to be sent (the worker keeps the
/// zone's bookkeeping).
pub fn give_back(zone: usize, key: Key, cost: u64) -> bool {
    with_zone(zone, |_, z| {
        z.count(zone, key, 0, cost);
        z.outbox.push((key, HoldOp::GiveBack { units: cost, gen: z.gen }));
    })
    .is_some()
}

/// A request gives up its place `ticket` in the waiting line of `key` on
/// zone `zone` (it ends, or its wait is over): sent with the loop
/// iteration's calls, once (a place whose leave is lost lapses). Whether it
/// is to be sent.
pub fn leave(zone: usize, key: (u64, u64), ticket: u64) -> bool {
    with_zone(zone, |_, z| z.outbox.push(((key.0, key.1, 0), HoldOp::Leave { ticket }))).is_some()
}

/// The give-backs, corrections and places given up of the loop
/// iteration, by zone and field name (one call each), each with its zone,
/// the field name and its fields' life.
pub fn take_outbox() -> Vec<Outgoing> {
    HOLDS.with(|h| {
        let Ok(mut h) = h.try_borrow_mut() else { return Vec::new() };
        let Some(h) = h.as_mut() else { return Vec::new() };
        let redis = h.redis;
        let mut out = Vec::new();
        for (i, z) in h.zones.iter_mut().enumerate() {
            let Some(z) = z.as_mut().filter(|z| !z.outbox.is_empty()) else { continue };
            let Some(rz) = redis.get(i) else { continue };
            for batch in batches(&h.names, std::mem::take(&mut z.outbox), z.life_ms) {
                out.push((i, &**rz, batch));
            }
        }
        out
    })
}

/// `ops` in one batch per field name (most often one: lines of classes
/// have a field per class).
fn batches(names: &[&'static str], mut ops: Vec<(Key, HoldOp)>, life_ms: u64) -> Vec<HoldBatch> {
    ops.sort_by_key(|(k, _)| k.2);
    let mut out: Vec<HoldBatch> = Vec::new();
    let mut class = None;
    for (key, op) in ops {
        if class != Some(key.2) {
            class = Some(key.2);
            out.push(HoldBatch { ops: Vec::new(), worker: name_of(names, key.2), life_ms });
        }
        if let Some(b) = out.last_mut() {
            b.ops.push((state(key), op));
        }
    }
    out
}

/// A zone's changes to send: its index, the zone, the changes.
pub type Outgoing = (usize, &'static RedisZone, HoldBatch);

/// The next heartbeat of zone `zone`: a new generation, and every key's
/// count (0: its field deleted), a call per field name; keys at 0 are then
/// forgotten. `None` when the worker keeps no bookkeeping of the zone.
pub fn next_beat(zone: usize) -> Option<Vec<HoldBatch>> {
    with_zone(zone, |names, z| {
        z.gen += 1;
        let gen = z.gen;
        let ops = z.counts.iter().map(|(k, &units)| (*k, HoldOp::Set { units, gen })).collect();
        z.counts.retain(|_, n| *n > 0);
        batches(names, ops, z.life_ms)
    })
}
