//! The keyed state table that lives in an nginx shared-memory zone.
//!
//! One region of caller-provided memory holds a header, a bucket array of
//! `u32` chain heads and an array of 56-byte entries (about 60 bytes per key
//! with the buckets). Everything is `#[repr(C)]` plain
//! integers linked by `u32` indices, so the region is position-independent
//! and any process mapping it can use it. The table does no locking: the
//! caller holds the zone's mutex around every use of a [`Table`].
//!
//! Keys are identified by a 128-bit keyed hash of (line id, key bytes),
//! AES-CMAC ([`KeyHash`], see [`Table::hash_key`]); the key bytes are not
//! stored. Two keys with equal 128-bit hashes are treated as the same key
//! (with a secret seed this happens with probability ~2^-128 per pair).
//!
//! The table never refuses a key: when full it drops an idle entry
//! (an *expiration*) or, failing that, the least-limiting one near the LRU
//! tail (an *eviction*). Every operation is O(1) amortized, and indices read
//! from the region are bounds-checked, so a corrupted region can lose state
//! but cannot cause out-of-bounds access, a panic or an endless loop.

mod check;
mod hash;
mod layout;

pub use hash::KeyHash;
pub use layout::TableError;
use layout::{Entry, Geometry, Header, FREE, HEADER_SIZE, MAGIC, NIL, VERSION};

/// Entries examined from the LRU tail to choose what to drop when full.
const VICTIM_SCAN: usize = 16;

/// The idle time of an entry whose state is to be kept whatever time
/// passes (requests in flight): never expired, and moved to the head of the
/// LRU list when [`Table::expire`] finds it at the tail, so that it does not
/// keep the idle entries behind it from expiring. A full table drops one
/// only when every entry it examines is pinned.
pub const PINNED: u32 = u32::MAX;

/// A view of a table laid out in a shared-memory region.
pub struct Table<'a> {
    hdr: &'a mut Header,
    buckets: &'a mut [u32],
    entries: &'a mut [Entry],
    len: usize,
    /// The region, for [`Table::region`] (the fields above are views of it).
    base: *mut u8,
    /// The hash keyed with the table's seed, when the table was reopened
    /// from a [`Region`] (which keeps it); else made on each use.
    keyed: Option<&'a KeyHash>,
}

/// Where a laid-out table lives and how it is split, as worked out when it
/// was attached or opened: what a process keeps to open the table again on
/// every use with [`Table::reopen`], without recomputing the split or
/// re-reading the header. Only a [`Table`] makes one ([`Table::region`]), so
/// its split always fits its length. It keeps the hash keyed with the
/// table's seed, too: a key schedule costs more than a hash.
#[derive(Clone)]
pub struct Region {
    base: *mut u8,
    len: usize,
    geo: Geometry,
    keyed: KeyHash,
}

impl Region {
    /// The region's first byte.
    pub fn base(&self) -> *mut u8 {
        self.base
    }

    /// The region's length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never true: a table needs [`Table::min_len`] bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// How [`Table::attach`] found the region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attach {
    /// A new, empty table was laid out (the caller's seed is used).
    Fresh,
    /// A table from an earlier attach was kept with all its entries (and
    /// its original hash key).
    Reused,
}

/// The position of an entry. Valid until the next insert, remove or expire
/// on the table (which may reuse the entry for another key); the `_at`
/// methods, given the key's hash too, tell a slot that no longer holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Slot(u32);

impl Slot {
    /// No entry: a placeholder in which the `_at` methods find nothing.
    pub const NONE: Slot = Slot(NIL);

    /// The entry index.
    pub fn index(self) -> u32 {
        self.0
    }
}

/// What an insert dropped to make room.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dropped {
    /// Nothing: there was room.
    Nothing,
    /// An idle entry (its state no longer changes any decision).
    Expired {
        /// The dropped state.
        state: [u64; 3],
    },
    /// A non-idle entry: a key lost state that was still limiting it.
    Evicted {
        /// The dropped state.
        state: [u64; 3],
        /// When it would have become idle.
        idle_at: u32,
    },
    /// The region was found corrupted and laid out afresh: every entry was
    /// dropped (without their states being reported).
    Reset,
}

impl Dropped {
    /// The state that was dropped, if one was.
    pub fn state(&self) -> Option<&[u64; 3]> {
        match self {
            Dropped::Expired { state } | Dropped::Evicted { state, .. } => Some(state),
            Dropped::Nothing | Dropped::Reset => None,
        }
    }
}

/// The result of [`Table::insert`] and [`Table::find_or_insert`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Inserted {
    /// The key's entry.
    pub slot: Slot,
    /// Whether the entry was created (its state is all-zero).
    pub new: bool,
    /// What was dropped to make room.
    pub dropped: Dropped,
}

/// Counters for monitoring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stats {
    /// Entries the region holds.
    pub capacity: usize,
    /// Live entries.
    pub used: usize,
    /// Non-idle states dropped to make room.
    pub evictions: u64,
    /// Idle states dropped (by [`Table::expire`] or to make room).
    pub expirations: u64,
    /// Idle states dropped to make room (a full table): with `evictions`,
    /// every state dropped because the table was full.
    pub evicted_idle: u64,
    /// Entries created.
    pub inserts: u64,
}

impl<'a> Table<'a> {
    /// Lays out a new table in the region, or re-attaches to one already
    /// there (same magic, version and length), so state survives nginx
    /// reloads. `seed` keys the hash of a fresh table; a reused table keeps
    /// its own.
    ///
    /// # Safety
    /// `region` must be valid for reads and writes of `len` initialized
    /// bytes (any values) for `'a`, and nothing else may access it during
    /// `'a` (hold the zone's mutex for as long as the `Table` lives).
    pub unsafe fn attach(region: *mut u8, len: usize, seed: [u64; 2]) -> Result<(Table<'a>, Attach), TableError> {
        // SAFETY: forwarded to our caller.
        let mut table = unsafe { Self::view(region, len) }?;
        if table.is_laid_out() {
            return Ok((table, Attach::Reused));
        }
        table.lay_out(seed);
        Ok((table, Attach::Fresh))
    }

    /// Re-attaches to a table already laid out in the region, or returns
    /// `None` (never writes to a region that holds no table).
    ///
    /// # Safety
    /// As for [`Table::attach`].
    pub unsafe fn open(region: *mut u8, len: usize) -> Option<Table<'a>> {
        // SAFETY: forwarded to our caller.
        let table = unsafe { Self::view(region, len) }.ok()?;
        table.is_laid_out().then_some(table)
    }

    /// Opens the table of a [`Region`] taken from an earlier [`Table`]: the
    /// split is the one worked out then, and nothing is checked or written.
    /// A header that was overwritten since costs states, not safety: every
    /// index read from the region is bounds-checked against this split.
    ///
    /// # Safety
    /// The region's memory must still be valid for reads and writes for
    /// `'a`, and nothing else may access it during `'a` (hold the zone's
    /// mutex for as long as the `Table` lives).
    pub unsafe fn reopen(region: &'a Region) -> Table<'a> {
        // SAFETY: forwarded to our caller; `region` came from a `Table`, so its base is 8-aligned
        // and not null and its geometry is `Geometry::for_len(len)`.
        let table = unsafe { Self::split(region.base, region.len, region.geo) };
        Table { keyed: Some(&region.keyed), ..table }
    }

    /// This table's region, to [`Table::reopen`] it later.
    pub fn region(&self) -> Region {
        // The split `view` made: the entries follow the header and the buckets.
        let geo = Geometry {
            nbuckets: self.buckets.len() as u32,
            capacity: self.entries.len() as u32,
            entries_off: HEADER_SIZE as usize + self.buckets.len() * 4,
        };
        Region { base: self.base, len: self.len, geo, keyed: KeyHash::new(self.hdr.key_seed) }
    }

    /// Splits the region into header, buckets and entries.
    ///
    /// # Safety
    /// As for [`Table::attach`].
    unsafe fn view(region: *mut u8, len: usize) -> Result<Table<'a>, TableError> {
        let geo = Geometry::for_len(len).ok_or(TableError::TooSmall { len, min: Self::min_len() })?;
        if region.is_null() || !(region as usize).is_multiple_of(8) {
            return Err(TableError::Misaligned);
        }
        // SAFETY: forwarded to our caller; the region is 8-aligned and not null, and `geo` is
        // `Geometry::for_len(len)`.
        Ok(unsafe { Self::split(region, len, geo) })
    }

    /// # Safety
    /// As for [`Table::attach`]; `region` is 8-aligned and not null, and
    /// `geo` is `Geometry::for_len(len)`.
    unsafe fn split(region: *mut u8, len: usize, geo: Geometry) -> Table<'a> {
        let nbuckets = geo.nbuckets as usize;
        let capacity = geo.capacity as usize;
        // SAFETY: the caller gives us `len` bytes, exclusively, for 'a.
        // `Geometry` places the header at 0, the buckets at HEADER_SIZE and
        // the entries at `entries_off`, disjoint and within `len`; every
        // offset is a multiple of 8 from an 8-aligned base, matching the
        // types' alignment. The types are plain integers, valid for any
        // initialized bytes.
        unsafe {
            let hdr = &mut *region.cast::<Header>();
            let buckets = region.add(HEADER_SIZE as usize).cast::<u32>();
            let entries = region.add(geo.entries_off).cast::<Entry>();
            Table {
                hdr,
                buckets: core::slice::from_raw_parts_mut(buckets, nbuckets),
                entries: core::slice::from_raw_parts_mut(entries, capacity),
                len,
                base: region,
                keyed: None,
            }
        }
    }

    /// Whether the header describes a table laid out for this region.
    fn is_laid_out(&self) -> bool {
        let h = &*self.hdr;
        h.magic == MAGIC
            && h.version == VERSION
            && h.region_len == self.len as u64
            && h.capacity as usize == self.entries.len()
            && h.nbuckets as usize == self.buckets.len()
            && h.used <= h.capacity
            && h.unused_next <= h.capacity
    }

    /// Writes an empty table (entries are left untouched: the
    /// `unused_next` watermark hands them out).
    fn lay_out(&mut self, seed: [u64; 2]) {
        *self.hdr = Header {
            magic: MAGIC,
            region_len: self.len as u64,
            version: VERSION,
            capacity: self.entries.len() as u32,
            nbuckets: self.buckets.len() as u32,
            used: 0,
            free_head: NIL,
            unused_next: 0,
            lru_head: NIL,
            lru_tail: NIL,
            evictions: 0,
            expirations: 0,
            evicted_idle: 0,
            inserts: 0,
            key_seed: seed,
            spare: 0,
        };
        self.buckets.fill(NIL);
    }

    /// Bytes of one entry (a key's state) in the region.
    pub const ENTRY_BYTES: usize = layout::ENTRY_SIZE as usize;

    /// The smallest region [`Table::attach`] accepts (8 entries).
    pub const fn min_len() -> usize {
        Geometry::min_len()
    }

    /// How many entries a region of `len` bytes holds (0 if too small).
    pub fn capacity_for(len: usize) -> usize {
        Geometry::for_len(len).map_or(0, |g| g.capacity as usize)
    }

    /// The identity of `key` under limit `line_id`: a 128-bit [`KeyHash`]
    /// keyed with the table's seed, so that equal keys of different limits
    /// get different entries.
    #[inline(always)]
    pub fn hash_key(&self, line_id: u64, key: &[u8]) -> [u64; 2] {
        match self.keyed {
            Some(keyed) => keyed.hash(line_id, key),
            None => self.hash_unkeyed(line_id, key),
        }
    }

    /// [`Table::hash_key`] of a table not reopened from its region (one
    /// just attached): the key schedule is worked out for the call.
    #[cold]
    #[inline(never)]
    fn hash_unkeyed(&self, line_id: u64, key: &[u8]) -> [u64; 2] {
        KeyHash::new(self.hdr.key_seed).hash(line_id, key)
    }

    /// Finds the entry for `hash` and makes it the most recently used.
    /// Inline: a call would spill the table's view to the stack.
    #[inline(always)]
    pub fn find(&mut self, hash: [u64; 2]) -> Option<Slot> {
        let i = self.lookup(hash)?;
        self.touch(i);
        Some(Slot(i))
    }

    /// Every live entry, with the hash it holds, in entry order (not the
    /// LRU order, which it leaves as it is): for a caller that visits each
    /// of its keys in turn.
    pub fn live_entries(&self) -> impl Iterator<Item = (Slot, [u64; 2])> + '_ {
        (0..self.entries_in_use()).filter_map(|i| self.live(i).map(|e| (Slot(i), e.hash)))
    }

    /// [`Table::live_entries`] in parts: into `out` (cleared first), up to
    /// `max` live entries from entry `from` on; the entry the next part
    /// starts from, `None` once the last is walked. For a caller that walks
    /// a table shared with others in parts, each under a lock of its own:
    /// an entry's place never moves, so a walk sees each entry that lives
    /// through it once; an entry made or dropped between two parts may be
    /// seen or not.
    pub fn live_entries_from(&self, from: u32, max: usize, out: &mut Vec<(Slot, [u64; 2])>) -> Option<u32> {
        out.clear();
        let end = self.entries_in_use();
        let mut i = from;
        while i < end && out.len() < max {
            if let Some(e) = self.live(i) {
                out.push((Slot(i), e.hash));
            }
            i += 1;
        }
        (i < end).then_some(i)
    }

    /// The entries ever handed out: those a walk looks at (the rest were
    /// never used).
    fn entries_in_use(&self) -> u32 {
        (self.hdr.unused_next as usize).min(self.entries.len()) as u32
    }

    /// Finds the entry for `hash` without changing the LRU order.
    pub fn peek(&self, hash: [u64; 2]) -> Option<Slot> {
        self.lookup(hash).map(Slot)
    }

    /// Creates a zeroed entry for `hash` at the LRU head, dropping another
    /// if the table is full. The key must be absent (use
    /// [`Table::find_or_insert`] otherwise): a duplicate would shadow the
    /// older entry until that one ages out.
    pub fn insert(&mut self, hash: [u64; 2], now_s: u32) -> Inserted {
        let (i, dropped) = self.take_entry(now_s);
        self.link_new(i, hash, now_s);
        Inserted { slot: Slot(i), new: true, dropped }
    }

    /// [`Table::find`], or [`Table::insert`] if the key is absent.
    #[inline]
    pub fn find_or_insert(&mut self, hash: [u64; 2], now_s: u32) -> Inserted {
        match self.find(hash) {
            Some(slot) => Inserted { slot, new: false, dropped: Dropped::Nothing },
            None => self.insert(hash, now_s),
        }
    }

    /// The caller's state of an entry (`None` for an index out of range).
    pub fn state(&self, slot: Slot) -> Option<&[u64; 3]> {
        self.entry(slot.0).map(|e| &e.state)
    }

    /// The caller's state of an entry, to update.
    pub fn state_mut(&mut self, slot: Slot) -> Option<&mut [u64; 3]> {
        self.entry_mut(slot.0).map(|e| &mut e.state)
    }

    /// [`Table::state_mut`] with the entry's idle time ([`Table::set_idle_at`]),
    /// found once: what a request charges and then marks busy.
    #[inline(always)]
    pub fn state_and_idle_mut(&mut self, slot: Slot) -> Option<(&mut [u64; 3], &mut u32)> {
        self.entry_mut(slot.0).map(|e| (&mut e.state, &mut e.idle_at))
    }

    /// The caller's state of `hash`'s entry at `slot`, to update: `None` if
    /// that entry no longer holds `hash` (dropped, or reused for another key,
    /// since the slot was found). No hash chain is walked.
    pub fn state_at(&mut self, slot: Slot, hash: [u64; 2]) -> Option<&mut [u64; 3]> {
        if self.live(slot.0).is_none_or(|e| e.hash != hash) {
            return None;
        }
        self.entry_mut(slot.0).map(|e| &mut e.state)
    }

    /// When the entry's state becomes idle (droppable without changing any
    /// decision), in the caller's clock.
    pub fn idle_at(&self, slot: Slot) -> Option<u32> {
        self.entry(slot.0).map(|e| e.idle_at)
    }

    /// Sets when the entry's state becomes idle (ignored if out of range).
    pub fn set_idle_at(&mut self, slot: Slot, t: u32) {
        if let Some(e) = self.entry_mut(slot.0) {
            e.idle_at = t;
        }
    }

    /// Removes an entry, returning its state (`None` if it was not live).
    pub fn remove(&mut self, slot: Slot) -> Option<[u64; 3]> {
        let state = self.live(slot.0)?.state;
        self.unlink(slot.0);
        self.push_free(slot.0);
        Some(state)
    }

    /// Drops up to `max` idle entries from the LRU tail, stopping at the
    /// first non-idle one; `on_drop` sees each dropped state. Returns how
    /// many were dropped. A [`PINNED`] entry at the tail is moved to the
    /// head instead (counted in `max`, which so bounds the work).
    #[inline]
    pub fn expire(&mut self, now_s: u32, max: usize, on_drop: impl FnMut(&[u64; 3])) -> usize {
        // The common case, checked where the caller is: nothing idle (nor pinned) at the tail.
        if self.live(self.hdr.lru_tail).is_none_or(|e| e.idle_at > now_s && e.idle_at != PINNED) {
            return 0;
        }
        self.expire_idle(now_s, max, on_drop)
    }

    /// [`Table::expire`] once the tail is idle or pinned.
    #[inline(never)]
    fn expire_idle(&mut self, now_s: u32, max: usize, mut on_drop: impl FnMut(&[u64; 3])) -> usize {
        let mut n = 0;
        let mut moved = 0;
        while n + moved < max {
            let i = self.hdr.lru_tail;
            if self.live(i).is_some_and(|e| e.idle_at == PINNED) {
                self.touch(i);
                moved += 1;
                continue;
            }
            let Some(state) = self.live(i).filter(|e| e.idle_at <= now_s).map(|e| e.state) else {
                break;
            };
            self.unlink(i);
            self.push_free(i);
            self.hdr.expirations = self.hdr.expirations.wrapping_add(1);
            on_drop(&state);
            n += 1;
        }
        n
    }

    /// Drops the entry an insert would drop to make room (idle first, else
    /// the one closest to idle, from the LRU tail), sparing the entry at
    /// `keep`. For a caller whose out-of-line memory ran out: it frees what
    /// the returned state owned and tries again. `None` when nothing can be
    /// dropped. `keep` stays valid.
    pub fn evict_lru(&mut self, now_s: u32, keep: Slot) -> Option<Dropped> {
        let spare = self.live(keep.0).map(|_| keep.0);
        if let Some(k) = spare {
            // Move the entry to keep out of the victim window.
            self.touch(k);
        }
        let i = self.victim(now_s).filter(|i| Some(*i) != spare)?;
        let dropped = self.drop_victim(i, now_s);
        self.push_free(i);
        Some(dropped)
    }

    /// Counters for monitoring.
    pub fn stats(&self) -> Stats {
        Stats {
            capacity: self.entries.len(),
            used: self.hdr.used as usize,
            evictions: self.hdr.evictions,
            expirations: self.hdr.expirations,
            evicted_idle: self.hdr.evicted_idle,
            inserts: self.hdr.inserts,
        }
    }

    /// A header word the caller may use freely (e.g. the time of the last
    /// "zone full" log); 0 in a fresh table, kept on re-attach.
    pub fn header_spare_mut(&mut self) -> &mut u64 {
        &mut self.hdr.spare
    }

    fn entry(&self, i: u32) -> Option<&Entry> {
        self.entries.get(i as usize)
    }

    fn entry_mut(&mut self, i: u32) -> Option<&mut Entry> {
        self.entries.get_mut(i as usize)
    }

    /// The entry at `i` if it is in use (handed out and not on the free list).
    fn live(&self, i: u32) -> Option<&Entry> {
        let e = self.entry(i)?;
        (i < self.hdr.unused_next && e.lru_prev != FREE).then_some(e)
    }

    /// The bucket holding `hash`'s chain.
    fn bucket_of(&self, hash: [u64; 2]) -> usize {
        (hash[0] as usize) & self.buckets.len().wrapping_sub(1)
    }

    /// The chain head of `hash`'s bucket.
    fn chain_head(&self, hash: [u64; 2]) -> u32 {
        self.buckets.get(self.bucket_of(hash)).copied().unwrap_or(NIL)
    }

    /// Walks `hash`'s chain (at most `capacity` steps, in case of a cycle).
    #[inline(always)]
    fn lookup(&self, hash: [u64; 2]) -> Option<u32> {
        let mut i = self.chain_head(hash);
        for _ in 0..self.entries.len() {
            let e = self.entry(i)?;
            if e.hash == hash {
                return Some(i);
            }
            i = e.chain_next;
        }
        None
    }

    /// An entry for a new key: free, never used, or dropped from the tail.
    fn take_entry(&mut self, now_s: u32) -> (u32, Dropped) {
        if let Some(i) = self.pop_free().or_else(|| self.pop_unused()) {
            return (i, Dropped::Nothing);
        }
        match self.victim(now_s) {
            Some(i) => (i, self.drop_victim(i, now_s)),
            None => {
                let seed = self.hdr.key_seed;
                self.lay_out(seed);
                (self.pop_unused().unwrap_or(0), Dropped::Reset)
            }
        }
    }

    /// Pops the free list (discarding it if it is corrupted).
    fn pop_free(&mut self) -> Option<u32> {
        let i = self.hdr.free_head;
        let e = self.entry(i)?;
        if e.lru_prev != FREE {
            self.hdr.free_head = NIL;
            return None;
        }
        self.hdr.free_head = e.chain_next;
        Some(i)
    }

    /// Hands out the next never-used entry.
    fn pop_unused(&mut self) -> Option<u32> {
        let i = self.hdr.unused_next;
        if (i as usize) >= self.entries.len() {
            return None;
        }
        self.hdr.unused_next = i + 1;
        Some(i)
    }

    /// Of the [`VICTIM_SCAN`] entries at the LRU tail: the first idle one,
    /// else the one that becomes idle first.
    fn victim(&self, now_s: u32) -> Option<u32> {
        let mut i = self.hdr.lru_tail;
        let mut best: Option<(u32, u32)> = None;
        for _ in 0..VICTIM_SCAN {
            let Some(e) = self.live(i) else { break };
            if e.idle_at <= now_s {
                return Some(i);
            }
            if best.is_none_or(|(_, t)| e.idle_at < t) {
                best = Some((i, e.idle_at));
            }
            i = e.lru_prev;
        }
        best.map(|(i, _)| i)
    }

    /// Unlinks the victim `i` and counts and reports the drop.
    fn drop_victim(&mut self, i: u32, now_s: u32) -> Dropped {
        let Some(&Entry { state, idle_at, .. }) = self.entry(i) else {
            return Dropped::Nothing;
        };
        self.unlink(i);
        if idle_at <= now_s {
            self.hdr.expirations = self.hdr.expirations.wrapping_add(1);
            self.hdr.evicted_idle = self.hdr.evicted_idle.wrapping_add(1);
            Dropped::Expired { state }
        } else {
            self.hdr.evictions = self.hdr.evictions.wrapping_add(1);
            Dropped::Evicted { state, idle_at }
        }
    }

    /// Makes `i` a zeroed entry for `hash`, at its chain's and the LRU's head.
    fn link_new(&mut self, i: u32, hash: [u64; 2], now_s: u32) {
        let b = self.bucket_of(hash);
        let chain_next = self.buckets.get(b).copied().unwrap_or(NIL);
        let Some(e) = self.entry_mut(i) else { return };
        *e = Entry { hash, state: [0; 3], lru_prev: NIL, lru_next: NIL, chain_next, idle_at: now_s };
        if let Some(head) = self.buckets.get_mut(b) {
            *head = i;
        }
        self.lru_push_head(i);
        self.hdr.used = self.hdr.used.wrapping_add(1);
        self.hdr.inserts = self.hdr.inserts.wrapping_add(1);
    }

    /// Takes live entry `i` out of its chain and the LRU list.
    fn unlink(&mut self, i: u32) {
        self.unchain(i);
        self.lru_unlink(i);
        self.hdr.used = self.hdr.used.saturating_sub(1);
    }

    /// Puts unlinked entry `i` on the free list.
    fn push_free(&mut self, i: u32) {
        let next = self.hdr.free_head;
        if let Some(e) = self.entry_mut(i) {
            e.lru_prev = FREE;
            e.lru_next = NIL;
            e.chain_next = next;
            self.hdr.free_head = i;
        }
    }

    /// Takes entry `i` out of its bucket's chain.
    fn unchain(&mut self, i: u32) {
        let Some(&Entry { hash, chain_next, .. }) = self.entry(i) else {
            return;
        };
        let b = self.bucket_of(hash);
        let mut prev = NIL;
        let mut cur = self.chain_head(hash);
        for _ in 0..self.entries.len() {
            if cur == i {
                return self.set_chain_next(prev, b, chain_next);
            }
            let Some(e) = self.entry(cur) else { return };
            prev = cur;
            cur = e.chain_next;
        }
    }

    /// Points `prev`'s chain link (or bucket `b`'s head if `prev` is NIL)
    /// at `next`.
    fn set_chain_next(&mut self, prev: u32, b: usize, next: u32) {
        let link = match self.entries.get_mut(prev as usize) {
            Some(e) => &mut e.chain_next,
            None => match self.buckets.get_mut(b) {
                Some(head) => head,
                None => return,
            },
        };
        *link = next;
    }

    /// Makes `i` the most recently used.
    #[inline(always)]
    fn touch(&mut self, i: u32) {
        if self.hdr.lru_head != i {
            self.lru_unlink(i);
            self.lru_push_head(i);
        }
    }

    /// Takes `i` out of the LRU list.
    fn lru_unlink(&mut self, i: u32) {
        let Some(&Entry { lru_prev, lru_next, .. }) = self.entry(i) else {
            return;
        };
        match self.entry_mut(lru_prev) {
            Some(p) => p.lru_next = lru_next,
            None => self.hdr.lru_head = lru_next,
        }
        match self.entry_mut(lru_next) {
            Some(n) => n.lru_prev = lru_prev,
            None => self.hdr.lru_tail = lru_prev,
        }
    }

    /// Puts unlinked `i` at the LRU head.
    fn lru_push_head(&mut self, i: u32) {
        let old = self.hdr.lru_head;
        let Some(e) = self.entry_mut(i) else { return };
        e.lru_prev = NIL;
        e.lru_next = old;
        match self.entry_mut(old) {
            Some(o) => o.lru_prev = i,
            None => self.hdr.lru_tail = i,
        }
        self.hdr.lru_head = i;
    }
}

#[cfg(test)]
mod tests;
