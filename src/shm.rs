//! Shared-memory zones (`rl_zone`): an nginx slab pool holding one
//! [`rl_core::table::Table`] of per-key states, plus the out-of-line logs of
//! `sliding_log` limits. Every worker maps the same zone; all access goes
//! through [`Zone::lock`], which holds the pool's mutex.
//!
//! [`init`] lays a zone out (or takes over the previous cycle's on reload);
//! [`decide`] is the decision on a request's lines.

pub mod decide;
pub mod holds;
mod init;
mod mutex;
pub mod wait;
pub mod wake;

use core::sync::atomic::{AtomicU64, Ordering};
use core::{mem, ptr};

use ngx::ffi::{
    ngx_conf_t, ngx_current_msec, ngx_pagesize, ngx_shared_memory_add, ngx_shm_zone_t, ngx_slab_alloc_locked,
    ngx_slab_free_locked, ngx_slab_pool_t, ngx_str_t, ngx_timeofday, NGX_LOG_ALERT, NGX_LOG_EMERG, NGX_LOG_WARN,
};
use ngx::{ngx_conf_log_error, ngx_log_error};
use rl_core::limit::{Algorithm, Limit};
use rl_core::table::{Dropped, Region, Slot, Table};

/// `state[2]` of an entry whose log lives out of line (`state[0]` = offset + 1).
const RING_TAG: u64 = u64::MAX;
/// State words a table entry holds; a longer state lives in the pool.
const INLINE_WORDS: usize = 3;
/// Distinct zones one location may use (their locks are held together).
pub const MAX_ZONES_PER_LOCATION: usize = 16;
/// Idle states dropped from the LRU tail at a time, as limit_req does.
const EXPIRE_PER_REQUEST: usize = 2;
/// How long a state stays idle before a request drops it, as limit_req keeps
/// its nodes a minute: dropping an idle state changes no decision, but a key
/// that comes back would be inserted again (and a full zone drops idle
/// states first anyway).
const EXPIRE_AFTER_IDLE_S: u32 = 60;
/// Seconds between two "zone is full" messages.
const FULL_LOG_INTERVAL_S: u64 = 10;

/// Unix time less nginx's monotonic clock, in milliseconds, as each worker
/// found it when it started ([`init_clock`]).
static EPOCH_MS: AtomicU64 = AtomicU64::new(0);

/// Shared-memory decisions run on nginx's monotonic clock (as `limit_req`'s
/// do), moved to the Unix epoch once per worker: windows (a day, an hour)
/// then start where the wall clock's do, as on a Redis zone (Redis `TIME`),
/// so that a daily `fixed` line resets at midnight UTC on either; and the
/// clock never steps back within a worker, whatever the wall clock does.
pub fn init_clock() {
    let t = ngx_timeofday();
    // SAFETY: ngx_current_msec is the worker's cached monotonic clock, updated with the cached
    // wall clock `t`.
    let mono = unsafe { ngx_current_msec } as u64;
    let unix = (t.sec.max(0) as u64).saturating_mul(1000).saturating_add(t.msec as u64);
    EPOCH_MS.store(unix.saturating_sub(mono), Ordering::Relaxed);
}

/// Now, in µs, for shared-memory decisions (see [`init_clock`]).
#[inline(always)]
pub fn now_us() -> u64 {
    // SAFETY: ngx_current_msec is the worker's cached monotonic clock.
    let mono = unsafe { ngx_current_msec } as u64;
    // (Unix time in µs overflows a u64 in the year 586,000)
    mono.wrapping_add(EPOCH_MS.load(Ordering::Relaxed)).wrapping_mul(1000)
}

pub struct Zone {
    pub name: String,
    pub size: usize,
    /// `file:line` of the directive, for messages found after parsing.
    pub origin: String,
    shm_zone: *mut ngx_shm_zone_t,
    /// Largest sliding_log state (in u64 words) of any line on this zone.
    pub(crate) log_words: usize,
    /// Some `rl_conn` line counts requests in flight here, or some line
    /// has a waiting line: a worker that starts gives back what dead ones
    /// held, and their waiters' count ([`holds::reclaim`]).
    pub(crate) has_conn: bool,
    /// Where this worker last found the zone's `rl_conn` totals in the
    /// table (checked against their hash on every use).
    pub(crate) totals: core::cell::Cell<Slot>,
    /// This worker is on the zone's watch list ([`holds::watch`]), or tried
    /// to be: once it has held units here.
    pub(crate) watched: core::cell::Cell<bool>,
    /// Where the table lives and how it is split, once the zone is
    /// initialised: laid out once per cycle, so worked out once, not on
    /// every request.
    pub(crate) table: Option<Region>,
}

/// The largest zone, on any machine: far more keys than any client
/// population needs, so that a larger size is more likely a slip (`100g`
/// for `100m`) than a wish, refused by `nginx -t` rather than by the
/// machine when nginx maps it.
pub const MAX_SIZE: usize = 64 << 30;

/// The machine's RAM plus swap, in bytes, if known. Linux, by default,
/// refuses to map shared memory larger than that (its overcommit
/// heuristic), and nginx would fail to start with a message of its own
/// that names no zone; a zone that large could never be filled anyway.
pub fn memory_and_swap() -> Option<u64> {
    // SAFETY: an all-zero sysinfo is a valid value for sysinfo(2) to fill.
    let mut info: libc::sysinfo = unsafe { core::mem::zeroed() };
    // SAFETY: info is a valid, writable sysinfo.
    if unsafe { libc::sysinfo(&mut info) } != 0 {
        return None;
    }
    let unit = u64::from(info.mem_unit.max(1));
    let (ram, swap): (u64, u64) = (info.totalram, info.totalswap);
    ram.checked_add(swap)?.checked_mul(unit)
}

/// The smallest zone: as for limit_req, eight pages.
pub fn min_size() -> usize {
    // SAFETY: ngx_pagesize is set when nginx starts, before any configuration is read.
    8 * unsafe { ngx_pagesize }
}

impl Zone {
    /// Registers the shared memory zone for `rl_zone NAME size=SIZE`.
    pub fn add(cf: *mut ngx_conf_t, name: &str, size: usize) -> Result<Box<Zone>, ()> {
        let mut zone = Box::new(Zone {
            name: name.to_string(),
            size,
            origin: String::new(),
            shm_zone: ptr::null_mut(),
            log_words: 0,
            has_conn: false,
            totals: core::cell::Cell::new(Slot::NONE),
            watched: core::cell::Cell::new(false),
            table: None,
        });
        let mut ngx_name = ngx_str_t { len: zone.name.len(), data: zone.name.as_ptr() as *mut u8 };
        // SAFETY: cf is the configuration being parsed; the tag identifies zones of this module so
        // that nginx reuses them on reload only for us.
        let shm_zone = unsafe { ngx_shared_memory_add(cf, &mut ngx_name, size, crate::module_tag()) };
        // SAFETY: ngx_shared_memory_add returns NULL or a zone entry of the new cycle.
        let Some(shm) = (unsafe { shm_zone.as_mut() }) else {
            return Err(());
        };
        if !shm.data.is_null() {
            ngx_conf_log_error!(NGX_LOG_EMERG, cf, "duplicate zone \"{}\" in \"rl_zone\" directive", name);
            return Err(());
        }
        shm.init = Some(init::zone_init);
        shm.data = (&mut *zone as *mut Zone).cast();
        zone.shm_zone = shm_zone;
        Ok(zone)
    }

    /// Records that a limit uses this zone (sizes the sliding_log area).
    pub fn note_line(&mut self, limit: &Limit) {
        // (a rate line's waiting line counts its waiters in the same totals)
        self.has_conn |= limit.is_concurrent() || limit.rate_waits();
        // (an rl_conn line's waiting line lives out of line, as sliding_log's timestamps do)
        if limit.algorithm() == Algorithm::SlidingLog || limit.state_words() > INLINE_WORDS {
            self.log_words = self.log_words.max(limit.state_words());
        }
    }

    /// Records that the zone holds states of `words` words, out of line
    /// (a lease zone's records: sizes their area as sliding_log's).
    pub fn note_words(&mut self, words: usize) {
        self.log_words = self.log_words.max(words);
    }

    /// Refuses a configuration whose sliding_log state cannot fit the zone.
    pub fn check_fits(&self) -> Result<(), String> {
        let need = self.log_words * 8 * 8;
        if self.log_words > 0 && need > self.size / 2 {
            return Err(format!(
                "zone \"{}\" is too small for its sliding_log limits or rl_conn queues: each key needs {} bytes, \
                 the zone should be at least {}k",
                self.name,
                self.log_words * 8,
                (need * 2).div_ceil(1024)
            ));
        }
        Ok(())
    }

    /// What `rl_metrics` shows of the zone: its table's counters, and the
    /// bytes in use (the zone less its free pages and its table's entries
    /// that hold no key). `None` until the zone is initialised.
    pub fn usage(&self) -> Option<(rl_core::table::Stats, usize)> {
        let locked = self.lock()?;
        let stats = locked.table.stats();
        // SAFETY: the pool's mutex is held (by `locked`); ngx_pagesize is set at startup.
        let free = unsafe { (*self.shpool()).pfree * ngx_pagesize };
        let empty = stats.capacity.saturating_sub(stats.used) * Table::ENTRY_BYTES;
        Some((stats, self.size.saturating_sub(free).saturating_sub(empty)))
    }

    /// An `rl_conn` zone's units in flight and the units given back for
    /// dead workers so far; `None` for a zone without `rl_conn` lines.
    pub fn conn_totals(&self) -> Option<rl_core::metrics::ConnSample> {
        if !self.has_conn {
            return None;
        }
        let mut locked = self.lock()?;
        Some(holds::totals(&mut locked))
    }

    fn shpool(&self) -> *mut ngx_slab_pool_t {
        // SAFETY: shm_zone was returned by ngx_shared_memory_add and lives as long as the cycle.
        unsafe { (*self.shm_zone).shm.addr.cast() }
    }

    /// Locks the zone. `None` until the zone is initialised.
    #[inline(always)]
    pub fn lock(&self) -> Option<Locked<'_>> {
        let region = self.table.as_ref()?;
        let shpool = self.shpool();
        // SAFETY: the pool's mutex is initialised by nginx with the pool; a worker never locks a
        // zone it holds (a request's decision locks each of its zones once, in zone order).
        unsafe { mutex::lock(&mut (*shpool).mutex) };
        // SAFETY: the region was laid out by zone_init in the zone's memory, mapped for the
        // cycle; the mutex is held for as long as the Table lives (Locked unlocks in Drop, after
        // dropping the table).
        let table = unsafe { Table::reopen(region) };
        Some(Locked { zone: self, shpool, table })
    }
}

/// A locked zone: the table and the slab pool it lives in.
pub struct Locked<'a> {
    zone: &'a Zone,
    shpool: *mut ngx_slab_pool_t,
    pub table: Table<'a>,
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        // SAFETY: locked in Zone::lock.
        unsafe { mutex::unlock(&mut (*self.shpool).mutex) };
    }
}

impl Locked<'_> {
    /// Unlocks the zone where the caller says, written inline there (the
    /// compiler keeps a drop out of line).
    #[inline(always)]
    pub fn unlock(self) {
        let shpool = self.shpool;
        mem::forget(self);
        // SAFETY: locked in Zone::lock; `self` is gone, so nothing unlocks it again.
        unsafe { mutex::unlock(&mut (*shpool).mutex) };
    }
}

impl<'a> Locked<'a> {
    /// Drops a few idle states from the LRU tail (and their logs).
    #[inline(always)]
    pub fn expire(&mut self, now_s: u32) {
        let shpool = self.shpool;
        let before = now_s.saturating_sub(EXPIRE_AFTER_IDLE_S);
        self.table.expire(before, EXPIRE_PER_REQUEST, |state| free_ring(shpool, state));
    }

    /// Makes sure `hash` has an entry (and, for sliding_log, its log), and
    /// returns where it is. `None` only when the zone cannot hold the state
    /// at all.
    #[inline(always)]
    pub fn ensure(&mut self, hash: [u64; 2], limit: &Limit, now_s: u32, log: *mut ngx::ffi::ngx_log_t) -> Option<Slot> {
        match self.table.find(hash) {
            Some(slot) => Some(slot),
            None => self.insert(hash, limit.state_words(), now_s, log),
        }
    }

    /// [`Locked::ensure`] of a state of `words` words (more than an entry
    /// holds: it lives in the pool), for a caller that keeps records of its
    /// own, not a line's state.
    pub fn ensure_words(
        &mut self,
        hash: [u64; 2],
        words: usize,
        now_s: u32,
        log: *mut ngx::ffi::ngx_log_t,
    ) -> Option<Slot> {
        match self.table.find(hash) {
            Some(slot) => Some(slot),
            None => self.insert(hash, words.max(INLINE_WORDS + 1), now_s, log),
        }
    }

    /// The `words` words of the record [`Locked::ensure_words`] found at
    /// `slot` for `hash`: `None` if that entry no longer holds `hash`.
    pub fn words(&mut self, slot: Slot, hash: [u64; 2], words: usize) -> Option<&mut [u64]> {
        let state = self.table.state_at(slot, hash)?;
        words_of(state, words.max(INLINE_WORDS + 1), self.shpool, self.zone.size)
    }

    /// [`Locked::ensure`] for a request's one line in the zone, which drops
    /// idle states (see [`Locked::expire`]) only when `hash` is new, before
    /// its entry is made, as `limit_req` expires its nodes only before it
    /// allocates one: a request for a known key drops nothing. (Where a
    /// request has several lines in the zone, the zone expires once, when
    /// locked, before any line's entry is found: an expiry between two lines
    /// could drop the entry found for the first.)
    ///
    /// A new key's entry is made out of line, on a view of the table of its
    /// own ([`insert_new`]): no call takes the address of this view, which
    /// then stays in registers on the usual request's path.
    #[inline(always)]
    pub fn ensure_one(
        &mut self,
        hash: [u64; 2],
        limit: &Limit,
        now_s: u32,
        log: *mut ngx::ffi::ngx_log_t,
    ) -> Option<Slot> {
        if let Some(slot) = self.table.find(hash) {
            return Some(slot);
        }
        let slot = insert_new(self.zone, self.shpool, hash, limit, now_s, log);
        // The view insert_new made is gone; this one, not used meanwhile, is made again (what it
        // had read of the table's header is stale).
        let region = self.zone.table.as_ref()?;
        // SAFETY: the zone's mutex is held (by `self`), and no other view of the table is alive.
        self.table = unsafe { Table::reopen(region) };
        slot
    }

    /// The entry of `hash`, absent from the table, made (see
    /// [`Locked::ensure`]).
    #[inline(always)]
    fn insert(&mut self, hash: [u64; 2], words: usize, now_s: u32, log: *mut ngx::ffi::ngx_log_t) -> Option<Slot> {
        let ins = self.table.insert(hash, now_s);
        if ins.dropped != Dropped::Nothing {
            self.dropped(&ins.dropped, now_s, log);
        }
        // A state the table's entry cannot hold (sliding_log's, a varying
        // sliding line's) lives in the zone's pool; the entry points to it.
        if words <= INLINE_WORDS {
            return Some(ins.slot);
        }
        self.ensure_out_of_line(hash, ins.slot, words, now_s, log)
    }

    /// [`Locked::ensure`] of a new entry whose state lives in the pool.
    #[inline(never)]
    fn ensure_out_of_line(
        &mut self,
        hash: [u64; 2],
        slot: Slot,
        words: usize,
        now_s: u32,
        log: *mut ngx::ffi::ngx_log_t,
    ) -> Option<Slot> {
        let bytes = words * 8;
        loop {
            // SAFETY: the pool mutex is held.
            let p = unsafe { ngx_slab_alloc_locked(self.shpool, bytes) };
            if !p.is_null() {
                // SAFETY: p is a fresh allocation of `bytes` bytes; a zeroed log is a fresh state.
                unsafe { ptr::write_bytes(p.cast::<u8>(), 0, bytes) };
                let off = p as usize - self.shpool as usize;
                if let Some(s) = self.table.state_at(slot, hash) {
                    *s = [off as u64 + 1, 0, RING_TAG];
                    return Some(slot);
                }
                // SAFETY: allocated above, not referenced by anything.
                unsafe { ngx_slab_free_locked(self.shpool, p) };
                return None;
            }
            // Out of memory: give up the least recently used states until the log fits.
            let dropped = self.table.evict_lru(now_s, slot)?;
            self.dropped(&dropped, now_s, log);
        }
    }

    /// Frees what a dropped state owned and reports a full zone, once in a
    /// while: states dropped to make room, and how many of them were still
    /// limiting their keys (those keys come back with a full budget).
    #[cold]
    #[inline(never)]
    fn dropped(&mut self, dropped: &Dropped, now_s: u32, log: *mut ngx::ffi::ngx_log_t) {
        if let Some(state) = dropped.state() {
            free_ring(self.shpool, state);
        }
        match dropped {
            Dropped::Nothing => {}
            Dropped::Expired { .. } | Dropped::Evicted { .. } => {
                let last = self.table.header_spare_mut();
                if u64::from(now_s) >= *last + FULL_LOG_INTERVAL_S || *last == 0 {
                    *last = u64::from(now_s).max(1);
                    let stats = self.table.stats();
                    ngx_log_error!(
                        NGX_LOG_WARN,
                        log,
                        "rl_zone \"{}\" is full, evicting least recently used states \
                         ({} evicted so far, {} still limiting)",
                        self.zone.name,
                        stats.evictions.wrapping_add(stats.evicted_idle),
                        stats.evictions
                    );
                }
            }
            Dropped::Reset => {
                ngx_log_error!(
                    NGX_LOG_ALERT,
                    log,
                    "rl_zone \"{}\" was found corrupted and laid out anew: every state was dropped",
                    self.zone.name
                );
            }
        }
    }

    /// The state words for `limit` of the entry `ensure` found at `slot` for
    /// `hash`: `None` if that entry no longer holds `hash` (another line's
    /// insert dropped it to make room).
    #[inline(always)]
    pub fn state(&mut self, slot: Slot, hash: [u64; 2], limit: &Limit) -> Option<&mut [u64]> {
        let state = self.table.state_at(slot, hash)?;
        words_of(state, limit.state_words(), self.shpool, self.zone.size)
    }

    /// Records that the state at `slot`, charged at `now_us`, is back to
    /// full `reset_us` later (whole seconds, rounded up): until then it is
    /// not idle.
    #[inline(always)]
    pub fn charged(&mut self, slot: Slot, now_us: u64, reset_us: u64) {
        self.table.set_idle_at(slot, idle_at(now_us, reset_us));
    }

    /// [`Locked::charged`] of a state that may hold units only a give-back
    /// frees (`held`, [`Limit::held`]): see [`idle_time`].
    #[inline(always)]
    pub fn charged_held(&mut self, slot: Slot, held: bool, now_us: u64, reset_us: u64) {
        self.table.set_idle_at(slot, idle_time(held, now_us, reset_us));
    }

    /// [`Locked::state`] of the entry [`Locked::ensure_one`] has just
    /// returned, nothing inserted since (it holds the hash, which is not
    /// compared again), with where [`Locked::charged`] writes the state's
    /// idle time: a request's one line finds its entry once.
    #[inline(always)]
    pub fn ensured_state_and_idle(&mut self, slot: Slot, limit: &Limit) -> Option<(&mut [u64], &mut u32)> {
        let (state, idle) = self.table.state_and_idle_mut(slot)?;
        Some((words_of(state, limit.state_words(), self.shpool, self.zone.size)?, idle))
    }
}

/// [`Locked::ensure_one`] of a key without an entry, under the lock the
/// caller's [`Locked`] holds, on a view of the table of its own: the
/// caller's is not used until this one is gone.
#[cold]
#[inline(never)]
fn insert_new(
    zone: &Zone,
    shpool: *mut ngx_slab_pool_t,
    hash: [u64; 2],
    limit: &Limit,
    now_s: u32,
    log: *mut ngx::ffi::ngx_log_t,
) -> Option<Slot> {
    let region = zone.table.as_ref()?;
    // SAFETY: the zone's mutex is held (see above), and the caller's view is not used meanwhile.
    let table = unsafe { Table::reopen(region) };
    // Not dropped: the caller's Locked unlocks the zone.
    let mut locked = mem::ManuallyDrop::new(Locked { zone, shpool, table });
    locked.expire(now_s);
    locked.insert(hash, limit.state_words(), now_s, log)
}

/// When a state charged at `now_us` and back to full `reset_us` later is
/// idle: whole seconds, rounded up (a sum that saturates is past `u32::MAX`
/// seconds either way).
#[inline(always)]
pub fn idle_at(now_us: u64, reset_us: u64) -> u32 {
    (now_us.saturating_add(reset_us).saturating_add(999_999) / 1_000_000).min(u64::from(u32::MAX)) as u32
}

/// When a state charged at `now_us` becomes idle: [`idle_at`], or never
/// ([`rl_core::table::PINNED`]) while it holds units in flight (`held`,
/// [`Limit::held`]), which only a give-back frees.
#[inline(always)]
pub fn idle_time(held: bool, now_us: u64, reset_us: u64) -> u32 {
    match held {
        true => rl_core::table::PINNED,
        false => idle_at(now_us, reset_us),
    }
}

/// The `words` state words of an entry's `state`: the entry's own, or the
/// out-of-line log it points to in the pool (`None` if that cannot be).
#[inline(always)]
fn words_of(state: &mut [u64; 3], words: usize, shpool: *mut ngx_slab_pool_t, size: usize) -> Option<&mut [u64]> {
    if state[2] == RING_TAG && state[0] != 0 {
        let off = (state[0] - 1) as usize;
        if words <= INLINE_WORDS || off + words * 8 > size {
            return None;
        }
        // SAFETY: the state was allocated in `ensure` with state_words() words for this line
        // (the line id is part of the hash, so the same limit owns it; in a lease zone every
        // record has the same words); the mutex is held.
        return Some(unsafe { core::slice::from_raw_parts_mut(shpool.cast::<u8>().add(off).cast(), words) });
    }
    state.get_mut(..words)
}

fn free_ring(shpool: *mut ngx_slab_pool_t, state: &[u64; 3]) {
    if state[2] == RING_TAG && state[0] != 0 {
        // SAFETY: the offset was produced by `ensure` from an allocation in this pool, and the
        // entry owning it has just been dropped; the mutex is held.
        unsafe { ngx_slab_free_locked(shpool, shpool.cast::<u8>().add((state[0] - 1) as usize).cast()) };
    }
}
