//! Who holds the units of `rl_conn` lines, so that the units of a worker
//! that died are given back without a restart.
//!
//! A concurrency line's state (one word: the units in flight of the key)
//! says how many, not whose. Beside it, each worker that holds units of the
//! key keeps a *hold* entry in the same table: its hash is the key's, mixed
//! with the worker's process slot (and the class, on a line of classes),
//! and its state is the key's hash (to find the line's state again) and one
//! word of owner, class and count ([`Meta`]).
//! Taking and giving back units changes both under the zone's lock.
//!
//! A worker that dies (`kill -9`, a crash) ends no request: its units stay
//! held. When nginx starts a worker, it takes the process slot of the one it
//! replaces (at once after a crash), and the new worker's [`reclaim`] gives
//! back every hold of its slot left by another process, and every hold of a
//! process that no longer exists (an old worker killed while it drained
//! after a reload, whose slot nobody takes).
//!
//! A hold is recognised in a scan by its hash: the table stores no key,
//! but a hold's hash is the one its own state's key hash and slot make,
//! which no other entry's is but by a 128-bit accident.

use ngx::ffi::{ngx_log_t, ngx_pid, ngx_process_slot, NGX_LOG_NOTICE};
use ngx::ngx_log_error;

use rl_core::table::PINNED;

use super::{idle_at, Locked, Zone};

/// The hash of the zone's totals: its units in flight, the units given
/// back for dead workers so far, and its requests waiting for a slot
/// ([`Zone::conn_totals`]).
const TOTALS: [u64; 2] = [0x726c_5f63_6f6e_6e5f, 0x746f_7461_6c73_0001];

/// What marks a worker's count of its waiting requests
/// ([`Locked::wait_starts`]): the third word of its record.
const WAITING_TAG: u64 = 0x726c_5f77_6169_7473;

/// The hash of the record of the requests waiting in process slot `slot`.
fn waiting_hash(slot: u64) -> [u64; 2] {
    [TOTALS[0] ^ 0x9e37_79b9_7f4a_7c15u64.wrapping_mul(slot + 1), TOTALS[1] ^ WAITING_TAG]
}

/// The hash of a hold of `key` by process slot `slot`, of class `class`
/// (its index plus one; 0 on a line of one class).
fn hold_hash(key: [u64; 2], slot: u64, class: u64) -> [u64; 2] {
    let mix = (slot + 1) | (class << SLOT_BITS);
    [key[0] ^ 0x9e37_79b9_7f4a_7c15u64.wrapping_mul(mix), key[1] ^ 0xc2b2_ae3d_27d4_eb4f]
}

/// A hold's owner, class and count, in one word: the pid in the high 22
/// bits (Linux's pids are below 2^22, `PID_MAX_LIMIT`), the process slot in
/// the next 10 (nginx has at most 1024), the class in the next 5 (its index
/// plus one: `rl_core::limit::wait::MAX_LANES` at most), the units in the
/// low 27 (a line holds at most `rl_core::spec::MAX_CONN`, 2^20).
#[derive(Clone, Copy, PartialEq, Eq)]
struct Meta {
    pid: u32,
    slot: u64,
    class: u64,
    count: u64,
}

const PID_BITS: u32 = 22;
const SLOT_BITS: u32 = 10;
const CLASS_BITS: u32 = 5;
const COUNT_BITS: u32 = 64 - PID_BITS - SLOT_BITS - CLASS_BITS;
const COUNT_MAX: u64 = (1 << COUNT_BITS) - 1;

impl Meta {
    fn read(w: u64) -> Meta {
        Meta {
            pid: (w >> (64 - PID_BITS)) as u32,
            slot: (w >> (COUNT_BITS + CLASS_BITS)) & ((1 << SLOT_BITS) - 1),
            class: (w >> COUNT_BITS) & ((1 << CLASS_BITS) - 1),
            count: w & COUNT_MAX,
        }
    }

    fn word(self) -> u64 {
        (u64::from(self.pid & ((1 << PID_BITS) - 1)) << (64 - PID_BITS))
            | (self.slot << (COUNT_BITS + CLASS_BITS))
            | ((self.class & ((1 << CLASS_BITS) - 1)) << COUNT_BITS)
            | self.count.min(COUNT_MAX)
    }
}

/// This worker: its pid and process slot.
fn me() -> Meta {
    // SAFETY: process globals nginx sets before it starts a worker, read-only since.
    let (pid, slot) = unsafe { (ngx_pid, ngx_process_slot) };
    Meta { pid: pid as u32, slot: (slot.max(0) as u64) & ((1 << SLOT_BITS) - 1), class: 0, count: 0 }
}

impl Locked<'_> {
    /// Records that this worker holds `cost` more units of the key whose
    /// state hash is `key`, for class `class` (its index plus one; 0 on a
    /// line of one class). A hold that cannot be recorded (the zone is too
    /// small to keep it) costs only its reclaim, should this worker die.
    pub fn hold(&mut self, key: [u64; 2], cost: u64, class: u64, now_s: u32, log: *mut ngx_log_t) {
        let me = Meta { class, ..me() };
        let h = hold_hash(key, me.slot, class);
        let found = match self.table.find(h) {
            Some(slot) => Some(slot),
            None => self.insert(h, super::INLINE_WORDS, now_s, log),
        };
        let Some(slot) = found else {
            return;
        };
        let Some(state) = self.table.state_at(slot, h) else {
            return;
        };
        let held = Meta::read(state[2]);
        let count = match state[..2] == key && held.pid == me.pid {
            true => held.count,
            // (a fresh entry; or a hold a worker of this slot left, which reclaim would have
            // given back: its units are not this worker's)
            false => 0,
        };
        *state = [key[0], key[1], Meta { count: count.saturating_add(cost), ..me }.word()];
        self.table.set_idle_at(slot, PINNED);
        if let Some(t) = self.totals_or_new(now_s, log) {
            t[0] = t[0].saturating_add(cost);
        }
    }

    /// The zone's totals, where this worker last found them (checked
    /// against their hash), else looked up; `None` when there are none yet.
    fn totals_mut(&mut self) -> Option<&mut [u64; 3]> {
        let cached = self.zone.totals.get();
        if self.table.state_at(cached, TOTALS).is_some() {
            return self.table.state_at(cached, TOTALS);
        }
        let slot = self.table.peek(TOTALS)?;
        self.zone.totals.set(slot);
        self.table.state_at(slot, TOTALS)
    }

    /// Counts a request that starts waiting for a slot in the zone's
    /// totals, and in this worker's own count, which [`reclaim`] takes off
    /// the totals should the worker die with it.
    pub fn wait_starts(&mut self, now_s: u32, log: *mut ngx_log_t) {
        if let Some(t) = self.totals_or_new(now_s, log) {
            t[2] = t[2].saturating_add(1);
        }
        if let Some(w) = self.my_waiting(now_s, log) {
            w[1] = w[1].saturating_add(1);
        }
    }

    /// Counts a request that stops waiting (let in, refused, or gone).
    pub fn wait_ends(&mut self) {
        if let Some(t) = self.totals_mut() {
            t[2] = t[2].saturating_sub(1);
        }
        let me = me();
        let h = waiting_hash(me.slot);
        let mine = self.table.find(h).and_then(|slot| self.table.state_at(slot, h));
        if let Some(w) = mine.filter(|w| w[0] == me.word()) {
            w[1] = w[1].saturating_sub(1);
        }
    }

    /// This worker's record of its waiting requests (`[owner, count,
    /// WAITING_TAG]`, the owner a [`Meta`] of no count), made where missing
    /// or left by another process in this slot (whose waiters [`reclaim`]
    /// took off the totals); kept whatever time passes.
    fn my_waiting(&mut self, now_s: u32, log: *mut ngx_log_t) -> Option<&mut [u64; 3]> {
        let me = me();
        let h = waiting_hash(me.slot);
        let slot = match self.table.find(h) {
            Some(slot) => slot,
            None => self.insert(h, super::INLINE_WORDS, now_s, log)?,
        };
        self.table.set_idle_at(slot, PINNED);
        let w = self.table.state_at(slot, h)?;
        if w[0] != me.word() || w[2] != WAITING_TAG {
            *w = [me.word(), 0, WAITING_TAG];
        }
        Some(w)
    }

    /// The zone's totals, made (all 0) where there are none yet; kept
    /// whatever time passes. `None` only when the zone cannot hold them.
    fn totals_or_new(&mut self, now_s: u32, log: *mut ngx_log_t) -> Option<&mut [u64; 3]> {
        if self.totals_mut().is_none() {
            let slot = self.insert(TOTALS, super::INLINE_WORDS, now_s, log)?;
            self.table.set_idle_at(slot, PINNED);
            self.zone.totals.set(slot);
        }
        self.totals_mut()
    }

    /// Records that this worker gives back `cost` units of the key whose
    /// state hash is `key`; its hold, then of nothing, is kept for the key's
    /// next request and expires as an idle state.
    pub fn unhold(&mut self, key: [u64; 2], cost: u64, class: u64, now_s: u32) {
        if let Some(t) = self.totals_mut() {
            t[0] = t[0].saturating_sub(cost);
        }
        let me = me();
        let h = hold_hash(key, me.slot, class);
        let Some(slot) = self.table.find(h) else {
            return;
        };
        let Some(state) = self.table.state_at(slot, h) else {
            return;
        };
        let held = Meta::read(state[2]);
        let count = if held.pid == me.pid { held.count.saturating_sub(cost) } else { 0 };
        state[2] = Meta { count, ..held }.word();
        // A hold of nothing is kept while it is used (the key's next request finds it instead of
        // making it anew), and expires as an idle state.
        if count == 0 {
            self.table.set_idle_at(slot, now_s);
        }
    }

    /// Gives back `units` of the concurrency state of `key` (its first word,
    /// the units in flight, and the units of the class, `class` plus one, on
    /// a line of several), found by its hash: what a dead worker held.
    fn give_back(&mut self, key: [u64; 2], units: u64, class: u64, now_s: u32) {
        let Some(slot) = self.table.find(key) else {
            return;
        };
        let Some(state) = self.table.state_at(slot, key) else {
            return;
        };
        // (a line with a queue or classes keeps its state out of line: its first word is the
        // units too, then its live places and, with classes, the units of each)
        let words = match (state[2] == super::RING_TAG, class.checked_sub(1)) {
            (true, Some(k)) => (rl_core::limit::wait::held_at(k as usize) + 1).max(super::INLINE_WORDS + 1),
            (true, None) => super::INLINE_WORDS + 1,
            (false, _) => 1,
        };
        let (shpool, size) = (self.shpool, self.zone.size);
        let Some(state) = super::words_of(state, words, shpool, size) else {
            return;
        };
        rl_core::limit::wait::give_back_units(state, class, units);
        if state.first() == Some(&0) {
            // (a waiter still in its line pins it again when it looks)
            self.table.set_idle_at(slot, idle_at(u64::from(now_s) * 1_000_000, 0));
        }
    }
}

/// The zone's totals (see [`TOTALS`]), none yet being 0.
pub fn totals(locked: &mut Locked<'_>) -> rl_core::metrics::ConnSample {
    let Some(slot) = locked.table.peek(TOTALS) else {
        return Default::default();
    };
    locked.table.state_at(slot, TOTALS).map_or(Default::default(), |t| rl_core::metrics::ConnSample {
        in_flight: t[0],
        reclaimed: t[1],
        waiting: t[2],
    })
}

/// Whether process `pid` exists (one of another user's counts: its pid is
/// not free for a worker to have left).
fn alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: signal 0 only checks that the process exists.
    if unsafe { libc::kill(pid, 0) } == 0 {
        return true;
    }
    std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// Gives back what the workers that died held in `zone`: every hold of
/// this worker's process slot left by another process, and every hold of a
/// process that is gone. Run once, when a worker starts; logged at
/// `notice` per process, as nginx logs the locks of a worker that exited.
pub fn reclaim(zone: &Zone, now_s: u32, log: *mut ngx_log_t) -> u64 {
    let Some(mut locked) = zone.lock() else {
        return 0;
    };
    let me = me();
    let mut dead: Vec<(rl_core::table::Slot, [u64; 2], [u64; 2], Meta)> = Vec::new();
    let mut dead_waiting: Vec<(rl_core::table::Slot, [u64; 2], u64)> = Vec::new();
    let entries: Vec<_> = locked.table.live_entries().collect();
    for (slot, hash) in entries {
        let Some(state) = locked.table.state(slot) else { continue };
        let owner = Meta::read(state[0]);
        if state[2] == WAITING_TAG && waiting_hash(owner.slot) == hash {
            if owner.pid != me.pid && (owner.slot == me.slot || !alive(owner.pid)) {
                dead_waiting.push((slot, hash, state[1]));
            }
            continue;
        }
        let meta = Meta::read(state[2]);
        let key = [state[0], state[1]];
        if hold_hash(key, meta.slot, meta.class) != hash || meta.pid == me.pid || meta.count == 0 {
            continue;
        }
        if meta.slot == me.slot || !alive(meta.pid) {
            dead.push((slot, hash, key, meta));
        }
    }
    let mut total = 0;
    for &(slot, hash, key, meta) in &dead {
        if locked.table.state_at(slot, hash).is_none() {
            continue;
        }
        locked.table.remove(slot);
        locked.give_back(key, meta.count, meta.class, now_s);
        // (a hold of another process left in this slot is this worker's to make anew)
        total += meta.count;
    }
    if total > 0 {
        if let Some(t) = locked.totals_or_new(now_s, log) {
            // (in flight never goes below 0, whatever was dropped from a full zone)
            t[0] = t[0].saturating_sub(total);
            t[1] = t[1].saturating_add(total);
        }
    }
    // A dead worker's waiters are no longer waiting (their places in the lines go at their
    // deadlines, as any place whose waiter does not look again).
    for &(slot, hash, waiting) in &dead_waiting {
        if locked.table.state_at(slot, hash).is_none() {
            continue;
        }
        locked.table.remove(slot);
        if let Some(t) = locked.totals_mut() {
            t[2] = t[2].saturating_sub(waiting);
        }
    }
    drop(locked);
    let mut pids: Vec<u32> = dead.iter().map(|d| d.3.pid).collect();
    pids.sort_unstable();
    pids.dedup();
    for pid in pids {
        let units: u64 = dead.iter().filter(|d| d.3.pid == pid).map(|d| d.3.count).sum();
        ngx_log_error!(
            NGX_LOG_NOTICE,
            log,
            "rl_zone \"{}\": {} unit{} held by worker process {}, which exited, given back",
            zone.name,
            units,
            if units == 1 { "" } else { "s" },
            pid
        );
    }
    total
}
