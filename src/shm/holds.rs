//! Who holds the units of `rl_conn` lines, so that the units of a worker
//! that died are given back without a restart.
//!
//! A concurrency line's state (one word: the units in flight of the key)
//! says how many, not whose. Beside it, each worker that holds units of the
//! key keeps a *hold* entry in the same table: its hash is the key's, mixed
//! with the worker's process slot (and the class, on a line of classes),
//! and its state is the key's hash (to find the line's state again) and one
//! word of owner, class and count ([`Holder`]). A plain line's state keeps
//! its first holders inline instead ([`holders`]), and spills to hold
//! entries only beyond them.
//! Taking and giving back units changes both under the zone's lock.
//!
//! A worker that dies (`kill -9`, a crash) ends no request: its units stay
//! held. When nginx starts a worker, it takes the process slot of the one it
//! replaces (at once after a crash), and the new worker's [`reclaim`] gives
//! back every hold of its slot left by another process, and every hold of a
//! process that no longer exists (an old worker killed while it drained
//! after a reload, whose slot nobody takes).
//!
//! A worker that dies with no worker started after it (an old worker
//! killed while it drains after a reload, whose slot nobody takes) is
//! noticed by the live workers instead: each worker that holds units in a
//! zone puts itself on the zone's watch list, and every worker looks at the
//! list every [`WATCH_EVERY`]; the first to find one of them gone runs the
//! same [`reclaim`] ([`watch`]). A worker that exits takes itself off.
//!
//! A hold is recognised in a scan by its hash: the table stores no key,
//! but a hold's hash is the one its own state's key hash and slot make,
//! which no other entry's is but by a 128-bit accident.

use std::time::Duration;

use ngx::async_::{sleep, spawn};
use ngx::ffi::{ngx_log_t, ngx_pid, ngx_process_slot, NGX_LOG_NOTICE};
use ngx::ngx_log_error;

use rl_core::limit::holders::{self, Holder, SLOT_BITS};
use rl_core::limit::Limit;
use rl_core::table::{Slot, PINNED};

use super::{idle_at, Locked, Zone, RING_TAG};

/// The hash of the zone's totals: its units in flight, the units given
/// back for dead workers so far, and its requests waiting for a slot
/// ([`Zone::conn_totals`]).
const TOTALS: [u64; 2] = [0x726c_5f63_6f6e_6e5f, 0x746f_7461_6c73_0001];

/// The hash of the zone's watch list: how many, then a [`Holder`] word (of
/// no count) per worker that has held units in the zone and not exited.
const WATCHED: [u64; 2] = [0x726c_5f63_6f6e_6e5f, 0x7761_7463_6865_6401];

/// Workers the watch list keeps at most (more than any nginx runs at once,
/// old workers draining included); one beyond is not watched, and its
/// units come back only when a worker starts in its slot.
const MAX_WATCHED: usize = 64;
const WATCHED_WORDS: usize = 1 + MAX_WATCHED;

/// How often each worker looks for holders gone.
pub const WATCH_EVERY: Duration = Duration::from_secs(1);

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

/// This worker: its pid and process slot.
fn me() -> Holder {
    // SAFETY: process globals nginx sets before it starts a worker, read-only since.
    let (pid, slot) = unsafe { (ngx_pid, ngx_process_slot) };
    Holder::worker(pid as u32, slot.max(0) as u64)
}

/// Whether a line's states keep their holders inline ([`holders`]): a
/// plain `rl_conn` line's (one word of units; a waiting line or classes
/// take a state out of line, and their holds are entries of their own).
#[inline(always)]
pub fn inline(limit: &Limit) -> bool {
    limit.is_concurrent() && limit.state_words() == 1
}

impl Locked<'_> {
    /// Records that this worker holds `cost` more units of the key whose
    /// state hash is `key`, for class `class` (its index plus one; 0 on a
    /// line of one class): in the state's own words where its line keeps
    /// holders inline (`inline`: where the state was found, [`inline`]),
    /// else (or when they are taken) in a hold entry. A hold that cannot be
    /// recorded (the zone is too small to keep it) costs only its reclaim,
    /// should this worker die.
    #[inline(always)]
    pub fn hold(
        &mut self,
        key: [u64; 2],
        inline: Option<Slot>,
        cost: u64,
        class: u64,
        now_s: u32,
        log: *mut ngx_log_t,
    ) {
        self.in_flight_more(cost, now_s, log);
        if !self.zone.watched.get() {
            self.watch_me(now_s, log);
        }
        if let Some(at) = inline {
            if let Some(state) = self.table.state_at(at, key).filter(|s| s[2] != RING_TAG) {
                if holders::take_inline(&mut state[1..], me(), cost) {
                    return;
                }
            }
        }
        self.hold_apart(key, cost, class, now_s, log);
    }

    /// Puts this worker on the zone's watch list (once: a list full, or
    /// dropped from a full zone, leaves it unwatched).
    #[cold]
    #[inline(never)]
    fn watch_me(&mut self, now_s: u32, log: *mut ngx_log_t) {
        self.zone.watched.set(true);
        let me = me().word();
        let Some(slot) = self.ensure_words(WATCHED, WATCHED_WORDS, now_s, log) else { return };
        self.table.set_idle_at(slot, PINNED);
        let Some(w) = self.words(slot, WATCHED, WATCHED_WORDS) else { return };
        let n = (w[0] as usize).min(MAX_WATCHED);
        if n < MAX_WATCHED && !w[1..=n].contains(&me) {
            w[1 + n] = me;
            w[0] = n as u64 + 1;
        }
    }

    /// The workers on the zone's watch list.
    fn watched(&mut self) -> Vec<u64> {
        let Some(slot) = self.table.peek(WATCHED) else { return Vec::new() };
        let Some(w) = self.words(slot, WATCHED, WATCHED_WORDS) else { return Vec::new() };
        let n = (w[0] as usize).min(MAX_WATCHED);
        w[1..=n].to_vec()
    }

    /// Takes the workers `gone` (their words) off the zone's watch list;
    /// returns how many were on it.
    fn unwatch(&mut self, gone: &[u64]) -> usize {
        let Some(slot) = self.table.peek(WATCHED) else { return 0 };
        let Some(w) = self.words(slot, WATCHED, WATCHED_WORDS) else { return 0 };
        let n = (w[0] as usize).min(MAX_WATCHED);
        let mut kept = 0;
        for i in 1..=n {
            if !gone.contains(&w[i]) {
                w[1 + kept] = w[i];
                kept += 1;
            }
        }
        w[1 + kept..=n].fill(0);
        w[0] = kept as u64;
        n - kept
    }

    /// [`Locked::hold`] in a hold entry of its own.
    #[inline(never)]
    fn hold_apart(&mut self, key: [u64; 2], cost: u64, class: u64, now_s: u32, log: *mut ngx_log_t) {
        let me = Holder { class, ..me() };
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
        let held = Holder::read(state[2]);
        let count = match state[..2] == key && held.pid == me.pid {
            true => held.count,
            // (a fresh entry; or a hold a worker of this slot left, which reclaim would have
            // given back: its units are not this worker's)
            false => 0,
        };
        *state = [key[0], key[1], Holder { count: count.saturating_add(cost), ..me }.word()];
        self.table.set_idle_at(slot, PINNED);
    }

    /// Counts `units` more in flight in the zone's totals: where this
    /// worker last found them, else looked up or made.
    #[inline(always)]
    fn in_flight_more(&mut self, units: u64, now_s: u32, log: *mut ngx_log_t) {
        if let Some(t) = self.table.state_at(self.zone.totals.get(), TOTALS) {
            t[0] = t[0].saturating_add(units);
        } else if let Some(t) = self.totals_or_new(now_s, log) {
            t[0] = t[0].saturating_add(units);
        }
    }

    /// Counts `units` fewer in flight ([`Locked::in_flight_more`]).
    #[inline(always)]
    fn in_flight_fewer(&mut self, units: u64) {
        if let Some(t) = self.table.state_at(self.zone.totals.get(), TOTALS) {
            t[0] = t[0].saturating_sub(units);
        } else if let Some(t) = self.totals_mut() {
            t[0] = t[0].saturating_sub(units);
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
    /// WAITING_TAG]`, the owner a [`Holder`] of no count), made where missing
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
    /// state hash is `key` ([`Locked::hold`], `inline` as there); a hold
    /// entry, then of nothing, is kept for the key's next request and
    /// expires as an idle state.
    #[inline(always)]
    pub fn unhold(&mut self, key: [u64; 2], inline: Option<Slot>, cost: u64, class: u64, now_s: u32) {
        self.in_flight_fewer(cost);
        let mut rest = cost;
        if let Some(at) = inline {
            if let Some(state) = self.table.state_at(at, key).filter(|s| s[2] != RING_TAG) {
                rest = holders::give_inline(&mut state[1..], me(), cost);
            }
        }
        if rest > 0 {
            self.unhold_apart(key, rest, class, now_s);
        }
    }

    /// Gives back `cost` units this worker holds of a plain line's state
    /// (`key`, found at `at`; [`inline`]): from the units in flight and from
    /// this worker's count, inline or apart, the state's refund and holder
    /// found in one look.
    #[inline(always)]
    pub fn give_back_plain(&mut self, key: [u64; 2], at: Slot, cost: u64, limit: &Limit, now_us: u64) {
        self.in_flight_fewer(cost);
        let mut rest = cost;
        if let Some(state) = self.table.state_at(at, key).filter(|s| s[2] != RING_TAG) {
            rl_core::limit::wait::give_back_units(&mut state[..1], 0, cost);
            rest = holders::give_inline(&mut state[1..], me(), cost);
            let held = limit.held(&state[..1]);
            self.table.set_idle_at(at, super::idle_time(held, now_us, 0));
        }
        if rest > 0 {
            self.unhold_apart(key, rest, 0, (now_us / 1_000_000) as u32);
        }
    }

    /// [`Locked::unhold`] of units kept in a hold entry.
    #[inline(never)]
    fn unhold_apart(&mut self, key: [u64; 2], cost: u64, class: u64, now_s: u32) {
        let me = me();
        let h = hold_hash(key, me.slot, class);
        let Some(slot) = self.table.find(h) else {
            return;
        };
        let Some(state) = self.table.state_at(slot, h) else {
            return;
        };
        let held = Holder::read(state[2]);
        let count = if held.pid == me.pid { held.count.saturating_sub(cost) } else { 0 };
        state[2] = Holder { count, ..held }.word();
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
/// process that is gone. Run when a worker starts, and when a worker finds
/// one on the watch list gone ([`watch`]); logged at `notice` per process,
/// as nginx logs the locks of a worker that exited.
pub fn reclaim(zone: &Zone, now_s: u32, log: *mut ngx_log_t) -> u64 {
    let Some(mut locked) = zone.lock() else {
        return 0;
    };
    let me = me();
    let gone = |h: &Holder| h.pid != me.pid && (h.slot == me.slot || !alive(h.pid));
    // (hold entries of dead workers, and the states of plain lines in flight, whose inline
    // holders may be)
    let mut dead: Vec<(Slot, [u64; 2], [u64; 2], Holder)> = Vec::new();
    let mut plain: Vec<(Slot, [u64; 2])> = Vec::new();
    let mut dead_waiting: Vec<(Slot, [u64; 2], u64)> = Vec::new();
    let entries: Vec<_> = locked.table.live_entries().collect();
    for (slot, hash) in entries {
        let Some(state) = locked.table.state(slot) else { continue };
        let owner = Holder::read(state[0]);
        if state[2] == WAITING_TAG && waiting_hash(owner.slot) == hash {
            if gone(&owner) {
                dead_waiting.push((slot, hash, state[1]));
            }
            continue;
        }
        let held = Holder::read(state[2]);
        let key = [state[0], state[1]];
        if hold_hash(key, held.slot, held.class) == hash {
            if held.count > 0 && gone(&held) {
                dead.push((slot, hash, key, held));
            }
            continue;
        }
        // Pinned, of the other entries, are the states of rl_conn lines with units in flight
        // (besides the totals): a plain line's keeps its holders in its last words, one of a
        // waiting line or classes is out of line (tagged).
        if locked.table.idle_at(slot) == Some(PINNED) && hash != TOTALS && state[2] != RING_TAG {
            plain.push((slot, hash));
        }
    }
    let mut given: Vec<Holder> = dead.iter().map(|d| d.3).collect();
    let mut total = 0;
    for &(slot, hash, key, held) in &dead {
        if locked.table.state_at(slot, hash).is_none() {
            continue;
        }
        locked.table.remove(slot);
        locked.give_back(key, held.count, held.class, now_s);
        // (a hold of another process left in this slot is this worker's to make anew)
        total += held.count;
    }
    for &(slot, hash) in &plain {
        let Some(state) = locked.table.state_at(slot, hash) else { continue };
        let out = holders::reclaim_inline(&mut state[1..], gone);
        let units: u64 = out.iter().flatten().map(|h| h.count).sum();
        if units == 0 {
            continue;
        }
        state[0] = state[0].saturating_sub(units);
        if state[0] == 0 {
            locked.table.set_idle_at(slot, idle_at(u64::from(now_s) * 1_000_000, 0));
        }
        given.extend(out.into_iter().flatten());
        total += units;
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
    let mut pids: Vec<u32> = given.iter().map(|h| h.pid).collect();
    pids.sort_unstable();
    pids.dedup();
    for pid in pids {
        let units: u64 = given.iter().filter(|h| h.pid == pid).map(|h| h.count).sum();
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

/// Looks at `zone`'s watch list every [`WATCH_EVERY`], for as long as the
/// worker runs, and gives back what its workers that are gone held (their
/// units, and their waiters in the gauge). `log`: the cycle's.
pub fn watch(zone: &'static Zone, log: *mut ngx_log_t) {
    spawn(async move {
        loop {
            sleep(WATCH_EVERY).await;
            look(zone, log);
        }
    })
    .detach();
}

/// One look at the watch list: workers gone are taken off it (under the
/// lock, so that one worker alone reclaims them) and reclaimed.
fn look(zone: &Zone, log: *mut ngx_log_t) {
    let listed = match zone.lock() {
        Some(mut locked) => locked.watched(),
        None => return,
    };
    let me = me();
    let gone: Vec<u64> = listed
        .into_iter()
        .filter(|&w| {
            let h = Holder::read(w);
            h.pid != me.pid && !alive(h.pid)
        })
        .collect();
    if gone.is_empty() {
        return;
    }
    // (none left on the list: another worker took them off first, and reclaims them)
    let taken = zone.lock().map_or(0, |mut locked| locked.unwatch(&gone));
    if taken > 0 {
        reclaim(zone, (super::now_us() / 1_000_000) as u32, log);
    }
}

/// Takes this worker off the watch list of each zone it held units in: it
/// exits, having given back what it held.
pub fn exiting(zone: &Zone) {
    if !zone.watched.get() {
        return;
    }
    if let Some(mut locked) = zone.lock() {
        locked.unwatch(&[me().word()]);
    }
}
