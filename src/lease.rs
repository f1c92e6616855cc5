//! Lease mode (`rl_zone NAME redis=URL lease=SIZE sync=TIME`): a Redis
//! zone whose requests are decided on this nginx's leases, part of each
//! key's budget that Redis granted it and charged at once (rl-core's
//! [`rl_core::lease`]), kept in shared memory by all its workers. A request
//! a lease holds is admitted here, with no round trip; one it does not
//! (a key with no lease yet, a lease spent) is decided by Redis, as in
//! exact mode. One worker syncs every interval ([`sync`]): gives back what
//! ended leases left, takes new ones sized by each key's demand.
//!
//! What this nginx decides alone never admits more than the line: a lease
//! is units the line admitted. It may refuse more: units held by a lease
//! that ends unspent are lost to the fleet until given back.

mod sync;

use core::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ngx::ffi::ngx_log_t;
use rl_core::lease::{Horizon, Kept, Leasing, Local, Part};
use rl_core::limit::Limit;
use rl_core::redis::{LeaseGrant, Lives};
use rl_core::verdict::Outcome;

pub use self::sync::init_worker;
use crate::line::Line;
use crate::metrics::store::lease_slot;
use crate::request::{Ctx, LineResult};
use crate::shm::{now_us, Zone};

/// A Redis zone in lease mode: where its leases live on this nginx, and
/// how often they are synced.
pub struct LeaseZone {
    /// The zone's name (the Redis zone's), for messages and the membership
    /// set's key.
    pub name: String,
    /// The Redis zone's index in [`crate::conf::MainConf::redis`].
    pub redis: usize,
    /// `on_error=local`: while Redis cannot be reached, what it would
    /// decide is decided here, on this nginx's share of each line.
    pub local: bool,
    /// What the workers know of Redis, in memory they all share (see
    /// [`LeaseZone::share_in`]), else in each worker's own.
    shared: *const Shared,
    own: Shared,
    /// The shared memory that holds a record ([`Kept`]) per key leased.
    pub table: Box<Zone>,
    /// `sync=`: how often this nginx syncs its leases.
    pub sync: Duration,
    /// How long a lease lives: for the buckets and `gcra`, an interval and
    /// the zone's timeout for the next sync's reply (a key in steady demand
    /// is never without one); for `fixed` and `sliding`, `life=` (to the
    /// end of its window at most).
    pub lives: Lives,
    /// Each leased line's identity, and how it is leased.
    pub lines: Vec<(u64, Leasing)>,
}

/// A lease zone's times: `sync=`, the Redis zone's `timeout=`, `life=`.
pub struct Times {
    pub sync: Duration,
    pub timeout: Duration,
    pub life: Duration,
}

/// The default `sync=`.
pub const DEFAULT_SYNC: Duration = Duration::from_millis(100);

/// What every worker of this nginx knows of a lease zone's Redis.
#[derive(Default)]
pub struct Shared {
    /// When Redis last answered a sync (µs of the nginx clock; 0: never).
    pub answered: AtomicU64,
    /// The zone's live nodes, as the last heartbeat counted them (0: not
    /// known yet).
    pub nodes: AtomicU64,
    /// While this nginx limits alone (`on_error=local`): when Redis last
    /// answered before it stopped (0: it answers).
    pub alone_since: AtomicU64,
}

impl LeaseZone {
    pub fn new(name: &str, redis: usize, table: Box<Zone>, times: Times, local: bool) -> LeaseZone {
        let us = |d: Duration| d.as_micros().min(u128::from(u64::MAX)) as u64;
        LeaseZone {
            name: name.to_string(),
            redis,
            local,
            shared: core::ptr::null(),
            own: Shared::default(),
            table,
            sync: times.sync,
            lives: Lives { bucket_us: us(times.sync.saturating_add(times.timeout)), window_us: us(times.life) },
            lines: Vec::new(),
        }
    }

    /// How long the leases of `limit` live.
    pub fn life_of(&self, limit: &Limit) -> u64 {
        self.lives.of(limit)
    }

    /// Keeps what the workers know of Redis in `shared`, which every
    /// worker of the configuration's cycle maps.
    ///
    /// # Safety
    /// `shared` must stay valid, and be used only atomically, as long as
    /// the zone exists.
    pub unsafe fn share_in(&mut self, shared: *const Shared) {
        self.shared = shared;
    }

    /// What the workers know of Redis.
    pub fn shared(&self) -> &Shared {
        // SAFETY: null, or set by `share_in`, whose caller keeps it valid while the zone exists.
        unsafe { self.shared.as_ref() }.unwrap_or(&self.own)
    }

    /// The zone's live nodes, 1 while not known.
    pub fn nodes(&self) -> u64 {
        self.shared().nodes.load(Ordering::Relaxed).max(1)
    }

    /// Whether this nginx limits alone, having lost Redis (`on_error=local`).
    pub fn alone(&self) -> bool {
        self.local && self.shared().alone_since.load(Ordering::Relaxed) != 0
    }

    /// The times a lease granted by `leasing` asked for at `now` is sized
    /// by (the next sync taken to be an interval away).
    fn horizon(&self, leasing: &Leasing, now: u64) -> Horizon {
        let interval = self.sync.as_micros() as u64;
        Horizon { next: now.saturating_add(interval), interval, ends: leasing.end(now), wait: self.lives.bucket_us }
    }

    /// How the line of identity `id` is leased.
    pub fn leasing(&self, id: u64) -> Option<&Leasing> {
        self.lines.iter().find(|(l, _)| *l == id).map(|(_, leasing)| leasing)
    }

    /// How the key `kept` keeps is leased: as its line is, or, on a line
    /// whose values vary, under the values its requests brought; `None`
    /// for a line no longer configured, or a key whose values cannot be
    /// leased.
    pub fn leasing_of(&self, kept: &Kept) -> Option<Leasing> {
        let leasing = self.leasing(kept.line_id)?;
        leasing.with_values(&kept.limit_of(leasing.line())?).ok()
    }

    /// The line Redis decides the key `kept` keeps by, as a request's call
    /// names it (see `eval::redis::job_line`): the line that grants its
    /// leases, or, for a key of a plan that cannot be leased, its own;
    /// `None` for a line no longer configured, or a key whose values are
    /// not known.
    pub fn decided_by(&self, kept: &Kept) -> Option<Limit> {
        let leasing = self.leasing(kept.line_id)?;
        Some(decided_by(leasing, &kept.limit_of(leasing.line())?))
    }
}

/// Decides the active lines of the request's current stage that are in
/// lease mode (but `charge=after` ones, which Redis charges after the
/// response) on this nginx's leases, where a lease holds the request or a
/// refusal Redis gave is still good: such a line is `leased`, and not
/// sent to Redis. Returns whether every enforced line so decided admits.
pub fn spend(leases: &[LeaseZone], lines: &[Line], ctx: &mut Ctx, log: *mut ngx_log_t) -> bool {
    let now = now_us();
    let mut admitted = true;
    for (line, res) in ctx.staged_mut(lines) {
        let Some((z, leasing)) = line.lease.filter(|_| res.active && !line.charge_after) else { continue };
        let Some(lz) = leases.get(z) else { continue };
        let limit = res.limit(line);
        let alone = match lz.local {
            true => lz.shared().alone_since.load(Ordering::Relaxed),
            false => 0,
        };
        // (a key of a plan whose burst is too small to be leased: Redis decides it, and while
        // this nginx limits alone, it does)
        let leasing = leased(&leasing, limit);
        if leasing.is_none() && alone == 0 {
            continue;
        }
        let cost = res.cost;
        let here = with_kept(lz, line, res.key.as_bytes(), now, log, |k| {
            k.set_values(limit);
            let local = match leasing {
                Some(_) => k.decide(now, cost),
                None => Local::Ask,
            };
            if alone != 0 && matches!(local, Local::Ask | Local::Part(_)) {
                if let Local::Part(part) = local {
                    k.slot.put_back_part(&part);
                }
                return Here::Decided(decide_alone(lz, limit, k, now, cost, alone), None);
            }
            match local {
                // (Redis decides the rest, with no lease asked for: one that brought none
                // would let the emptied lease be dropped, and the units, should Redis refuse,
                // find nowhere to go back to)
                Local::Part(part) => Here::Part(part),
                // (Redis decides: the key's lease may come with its answer)
                Local::Ask => Here::Redis(leasing.map_or(0, |l| k.ask_with(now, lz.horizon(&l, now), lz.nodes()))),
                local => local.outcome().map_or(Here::Redis(0), |(o, spent)| Here::Decided(o, spent)),
            }
        });
        let (o, spent) = match here {
            None => continue,
            Some(Here::Redis(want)) => {
                res.lease_want = want;
                continue;
            }
            Some(Here::Part(part)) => {
                res.spent = part;
                continue;
            }
            Some(Here::Decided(o, spent)) => (o, spent),
        };
        // (a line decided alone is charged to Redis later, as what it owes: not here)
        res.set(&o, spent.is_some());
        if let Some(spent) = spent {
            res.spent = spent;
        }
        admitted &= o.admitted || res.dry_run;
        res.leased = true;
    }
    admitted
}

/// What this nginx's leases make of a request's line ([`spend`]).
enum Here {
    /// Decided here: spent from a lease (which one), refused, or decided
    /// alone.
    Decided(Outcome, Option<Part>),
    /// Partly spent from the leases, the rest of its cost for Redis.
    Part(Part),
    /// For Redis, with the units of a lease to ask for with it (0: none).
    Redis(u64),
}

/// How a request whose limit is `limit` is leased on a line leased as
/// `leasing` says (under its own values, on a line whose values vary):
/// `None` if it cannot be.
pub fn leased(leasing: &Leasing, limit: &Limit) -> Option<Leasing> {
    leasing.with_values(limit).ok()
}

/// The line Redis decides a request whose limit is `limit` by, on a line
/// leased as `leasing` says: the line that grants its key's leases (the
/// buckets' burst less what the rate refills in a lease's life), so that
/// units a lease spends late never bunch with these beyond the line; or,
/// for a key of a plan that cannot be leased, its own.
pub fn decided_by(leasing: &Leasing, limit: &Limit) -> Limit {
    leased(leasing, limit).map_or(*limit, |l| *l.line())
}

/// A request of `cost` under `limit` decided on `kept` at `now` by this
/// nginx alone, Redis last answering at `since`: on its share of the line.
fn decide_alone(lz: &LeaseZone, limit: &Limit, kept: &mut Kept, now: u64, cost: u64, since: u64) -> Outcome {
    let nodes = lz.nodes();
    let share = rl_core::lease::share(limit, nodes);
    kept.decide_local(now, cost, limit, share.as_ref(), nodes, since)
}

/// Redis zone `redis` failed for the request (`on_error=local`): its
/// lines in lease mode are decided by this nginx alone, on its share of
/// each; whether there was such a zone (else `on_error` does as it says).
pub fn alone(leases: &[LeaseZone], lines: &[Line], ctx: &mut Ctx, redis: usize, log: *mut ngx_log_t) -> bool {
    let Some(lz) = leases.iter().find(|lz| lz.redis == redis && lz.local) else { return false };
    let now = now_us();
    let since = lz.shared().answered.load(Ordering::Relaxed).max(1);
    for (line, res) in ctx.staged_mut(lines) {
        if !res.active || res.leased || line.lease.is_none() || line.backend.redis() != Some(redis) {
            continue;
        }
        // (what a lease paid of the cost goes back: the whole is decided alone)
        let part = core::mem::take(&mut res.spent);
        let (cost, limit) = (res.cost, res.limit(line));
        let decide = |k: &mut Kept| {
            k.set_values(limit);
            k.slot.put_back_part(&part);
            decide_alone(lz, limit, k, now, cost, since)
        };
        match with_kept(lz, line, res.key.as_bytes(), now, log, decide) {
            Some(o) => res.set(&o, false),
            None => res.active = false,
        }
        res.leased = true;
    }
    true
}

/// Puts back what [`spend`] took from leases for a request refused all the
/// same (by another of its lines), and the parts of costs leases paid of
/// lines Redis decided ([`LineResult::spent`]).
pub fn put_back(leases: &[LeaseZone], lines: &[Line], ctx: &mut Ctx, log: *mut ngx_log_t) {
    // (a line spent from leases is charged: whatever they paid goes back)
    give_back(leases, lines, ctx, log, |_, _| true);
}

/// Puts back the parts of costs leases paid ([`LineResult::spent`]) of the
/// request's lines on Redis zone `redis`, which does not decide them (it
/// failed, or the request was refused before its call).
pub fn parts_back(leases: &[LeaseZone], lines: &[Line], ctx: &mut Ctx, redis: usize, log: *mut ngx_log_t) {
    give_back(leases, lines, ctx, log, |line, res| !res.leased && line.backend.redis() == Some(redis));
}

/// Gives what the leases paid for each line in lease mode of the request's
/// current stage that `which` picks back to its leases (a line spent from
/// them is no longer charged).
fn give_back(
    leases: &[LeaseZone],
    lines: &[Line],
    ctx: &mut Ctx,
    log: *mut ngx_log_t,
    which: impl Fn(&Line, &LineResult) -> bool,
) {
    let now = now_us();
    for (line, res) in ctx.staged_mut(lines) {
        let paid = res.spent.units() > 0 && which(line, res);
        let Some((z, _)) = line.lease.filter(|_| paid) else { continue };
        res.charged &= !res.leased;
        let part = core::mem::take(&mut res.spent);
        if let Some(lz) = leases.get(z) {
            with_kept(lz, line, res.key.as_bytes(), now, log, |k| k.slot.put_back_part(&part));
        }
    }
}

/// Learns from Redis' replies for the request's lines in lease mode that
/// Redis decided (the leases did not hold them) in a call it ran at `at`
/// (its clock): what the line has left, and when a lone request passes
/// again if it refused one. Their `remaining` becomes this nginx's view,
/// as for a request a lease held: what Redis said last and what the
/// leases hold.
pub fn learn(leases: &[LeaseZone], lines: &[Line], ctx: &mut Ctx, redis: usize, at: u64, log: *mut ngx_log_t) {
    let now = now_us();
    for (line, res) in ctx.staged_mut(lines) {
        let Some((z, leasing)) =
            line.lease.filter(|_| res.active && !res.leased && line.backend.redis() == Some(redis))
        else {
            continue;
        };
        // (a key of a plan that cannot be leased keeps no record: Redis' answer is all there is)
        let Some(lz) = leases.get(z).filter(|_| leased(&leasing, res.limit(line)).is_some()) else { continue };
        // (what Redis was asked: the cost but what a lease paid of it)
        let (o, cost) = (*res.outcome(), res.redis_cost());
        // (what the leases paid of a cost Redis refused the rest of goes back now, whatever the
        // request's fate (a dry-run line's request goes on): the view counts it)
        let part = match o.admitted {
            true => Part::default(),
            false => core::mem::take(&mut res.spent),
        };
        let view = with_kept(lz, line, res.key.as_bytes(), now, log, |k| k.decided(now, at, &o, cost, &part));
        res.decision.outcome.remaining = view.unwrap_or(o.remaining);
    }
}

/// The answer to a request whose call asked for a lease of `line`
/// ([`LineResult::lease_want`]): the grant it brought, `None` if it failed
/// or brought none; the line asks for none any more.
pub fn answered(leases: &[LeaseZone], line: &Line, res: &mut LineResult, g: Option<&LeaseGrant>, log: *mut ngx_log_t) {
    if res.lease_want == 0 {
        return;
    }
    res.lease_want = 0;
    let Some((z, lz)) = line.lease.and_then(|(z, _)| Some((z, leases.get(z)?))) else { return };
    with_kept(lz, line, res.key.as_bytes(), now_us(), log, |k| k.answered(g));
    if let (Some(c), Some(g)) = (lease_slot(z), g) {
        c.granted(g.units);
    }
}

/// Runs `f` on the record of `key` for `line`, under the lease
/// zone's lock (made if the key has none): `None` when the zone cannot
/// hold it (not initialised, or full to the last entry).
fn with_kept<T>(
    lz: &LeaseZone,
    line: &Line,
    key: &[u8],
    now: u64,
    log: *mut ngx_log_t,
    f: impl FnOnce(&mut Kept) -> T,
) -> Option<T> {
    let now_s = (now / 1_000_000) as u32;
    let mut locked = lz.table.lock()?;
    let hash = locked.table.hash_key(line.id, key);
    let slot = locked.ensure_words(hash, Kept::WORDS, now_s, log)?;
    let words = locked.words(slot, hash, Kept::WORDS)?;
    let mut kept = Kept::read(words)?;
    if kept.line_id == 0 && kept.tag == 0 {
        kept.tag = rl_core::redis::tag_of(key);
        kept.line_id = line.id;
    }
    let out = f(&mut kept);
    kept.write(words);
    // (idle from now: dropped a minute after its last request, as an idle state is; a
    // lease lives far less)
    locked.table.set_idle_at(slot, now_s);
    locked.unlock();
    Some(out)
}

// `Shared` lives in memory laid out as 8-byte words (see conf's `share_among_workers`).
const _: () = assert!(core::mem::align_of::<Shared>() <= core::mem::align_of::<AtomicU64>());
