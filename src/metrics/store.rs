//! The counters of `rl_metrics` in shared memory: one zone of this module,
//! laid out by the master when a cycle starts, holding one row per line
//! identity, per Redis zone and per Redis zone in lease mode. A row has
//! one slot per worker (by `ngx_worker`, modulo the row's slot count), a
//! cache line or four: a worker only adds to its own slot, so its
//! increments are atomic adds that no other worker contends for (but for
//! the old worker of the same index while a reload drains it, which the
//! atomics keep exact), and a scrape sums the slots. No lock is taken on
//! the request path.
//!
//! On reload nginx hands the memory over when the zone's size is unchanged
//! (see [`zone_size`]); the rows of lines and zones that are unchanged are
//! found again by their identity, so their counters go on. Rows are never
//! freed: the old cycle's workers may still write to them while they drain.
//!
//! This file imports nothing of the rest of the module: the Redis I/O
//! thread and the lease syncs write to their worker's slots through it.

use core::ffi::c_void;
use core::ptr;
use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;

use ngx::core::Status;
use ngx::ffi::{ngx_int_t, ngx_pagesize, ngx_shm_zone_t, ngx_slab_alloc_locked, ngx_slab_pool_t, NGX_LOG_EMERG};
use ngx::ngx_log_error;
use rl_core::metrics::{latency_bucket, ERROR_KINDS, LATENCY_BUCKETS, RESULTS};

/// One worker's counters of one line: a cache line.
#[repr(C, align(64))]
pub struct LineSlot(pub [AtomicU64; 8]);

/// One worker's counters of one Redis zone (five cache lines). Only that
/// worker writes them: its requests (errors, `on_error`) and its zone's
/// calls (calls, connections, master), all on its event loop.
#[repr(C, align(64))]
pub struct RedisSlot {
    pub calls: AtomicU64,
    pub call_requests: AtomicU64,
    pub latency: [AtomicU64; LATENCY_BUCKETS],
    pub latency_sum_us: AtomicU64,
    pub errors: [AtomicU64; ERROR_KINDS.len()],
    /// `on_error` let through, rejected.
    pub on_error: [AtomicU64; 2],
    pub connects: AtomicU64,
    /// `charge=after` charges known not charged, and charges of unknown
    /// outcome (the call may have run).
    pub charge_failures: AtomicU64,
    pub charge_unknown: AtomicU64,
    /// `rl_conn` units the worker holds (its requests', and its takes in
    /// flight), and units Redis reclaimed from workers gone, as its calls
    /// were told.
    pub conn_held: AtomicU64,
    pub conn_reclaimed: AtomicU64,
    /// The worker's requests waiting in `rl_conn` waiting lines (`queue=`).
    pub conn_waiting: AtomicU64,
    /// A Memcached zone's counters found lost within their window.
    pub counters_lost: AtomicU64,
    /// The Sentinel master, `host:port`, under a sequence lock (odd while
    /// being written): length, then up to 48 bytes.
    master_seq: AtomicU64,
    master_len: AtomicU64,
    master: [AtomicU64; 6],
}

/// One worker's counters of one Redis zone in lease mode: a cache line.
/// Only the worker that syncs the zone writes them (one per nginx; while a
/// reload drains the old one, both may: the atomics keep that exact).
#[repr(C, align(64))]
pub struct LeaseSlot {
    /// Lease calls made, answered or failed.
    pub syncs: AtomicU64,
    /// Lease calls that failed or timed out.
    pub sync_failures: AtomicU64,
    pub sync_latency_sum_us: AtomicU64,
    /// Keys sent in lease calls.
    pub keys_synced: AtomicU64,
    /// Grants of at least one unit, and their units.
    pub leases_granted: AtomicU64,
    pub units_granted: AtomicU64,
    /// Units given back that Redis took back.
    pub units_returned: AtomicU64,
    /// Times this nginx lost Redis and limited alone (`on_error=local`).
    pub alone: AtomicU64,
}

const _: () = assert!(RESULTS.len() <= 8);
const _: () = assert!(core::mem::size_of::<LineSlot>() == 64);
const _: () = assert!(core::mem::size_of::<RedisSlot>() == 320);
const _: () = assert!(core::mem::size_of::<LeaseSlot>() == 64);

/// A row's header: a cache line before its slots.
#[repr(C, align(64))]
struct RowHeader {
    magic: u64,
    /// The next row (offset from the pool's start; 0: none).
    next: u64,
    kind: u64,
    ident: u64,
    nslots: u64,
}

/// The zone's directory: the list of rows.
#[repr(C, align(64))]
struct Dir {
    magic: u64,
    head: u64,
}

const DIR_MAGIC: u64 = 0x6e67_782d_726c_6d31;
const ROW_MAGIC: u64 = 0x6e67_782d_726c_7231;
/// Most slots a row has.
const MAX_SLOTS: usize = 256;

/// What a row counts.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kind {
    Line = 1,
    Redis = 2,
    Lease = 3,
}

impl Kind {
    fn slot_size(self) -> usize {
        match self {
            Kind::Line => core::mem::size_of::<LineSlot>(),
            Kind::Redis => core::mem::size_of::<RedisSlot>(),
            Kind::Lease => core::mem::size_of::<LeaseSlot>(),
        }
    }
}

/// A row as a worker uses it: its slots and how many (a power of two).
pub struct Row<T> {
    slots: *const T,
    mask: usize,
}

impl<T> Clone for Row<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Row<T> {}

// SAFETY: a row is shared memory of atomics, mapped for the life of the process's cycle.
unsafe impl<T> Send for Row<T> {}
// SAFETY: as above: every access is an atomic operation.
unsafe impl<T> Sync for Row<T> {}

impl<T> Row<T> {
    /// This worker's slot.
    #[inline]
    pub fn mine(&self) -> &T {
        self.slot(WORKER.load(Ordering::Relaxed))
    }

    /// Slot `i` (modulo the slot count).
    #[inline]
    pub fn slot(&self, i: usize) -> &T {
        // SAFETY: slots points to mask + 1 slots of T in the zone, checked to lie within it when
        // the row was found or allocated; the zone is mapped as long as the cycle.
        unsafe { &*self.slots.add(i & self.mask) }
    }

    /// Every slot.
    pub fn slots(&self) -> impl Iterator<Item = &T> {
        (0..=self.mask).map(move |i| self.slot(i))
    }
}

impl LineSlot {
    /// Counts one verdict (a worker's own slot).
    #[inline]
    pub fn add(&self, verdict: usize) {
        if let Some(c) = self.0.get(verdict) {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl RedisSlot {
    /// A script call for `requests` requests took `us` µs.
    pub fn call(&self, requests: usize, us: u64) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.call_requests.fetch_add(requests as u64, Ordering::Relaxed);
        if let Some(b) = self.latency.get(latency_bucket(us)) {
            b.fetch_add(1, Ordering::Relaxed);
        }
        self.latency_sum_us.fetch_add(us, Ordering::Relaxed);
    }

    /// Redis reclaimed `units` of `rl_conn` lines from workers gone, as a
    /// call of this worker was told.
    pub fn reclaimed(&self, units: u64) {
        if units > 0 {
            self.conn_reclaimed.fetch_add(units, Ordering::Relaxed);
        }
    }

    /// A Memcached zone's counter was found lost (see
    /// `redis_zone::memcached`).
    pub fn counter_lost(&self) {
        self.counters_lost.fetch_add(1, Ordering::Relaxed);
    }

    /// A connection was opened; for a Sentinel zone, to `master`.
    pub fn connected(&self, master: Option<&str>) {
        self.connects.fetch_add(1, Ordering::Relaxed);
        if let Some(m) = master {
            self.set_master(m);
        }
    }

    fn set_master(&self, m: &str) {
        let bytes = &m.as_bytes()[..m.len().min(self.master.len() * 8)];
        self.master_seq.fetch_add(1, Ordering::AcqRel);
        self.master_len.store(bytes.len() as u64, Ordering::Relaxed);
        for (word, chunk) in self.master.iter().zip(bytes.chunks(8)) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            word.store(u64::from_le_bytes(b), Ordering::Relaxed);
        }
        self.master_seq.fetch_add(1, Ordering::Release);
    }

    /// The master this slot's worker last connected to (`None`: none, or
    /// being written).
    pub fn master(&self) -> Option<String> {
        for _ in 0..4 {
            let seq = self.master_seq.load(Ordering::Acquire);
            if seq == 0 {
                return None;
            }
            if seq % 2 == 1 {
                continue;
            }
            let len = (self.master_len.load(Ordering::Relaxed) as usize).min(self.master.len() * 8);
            let mut bytes: Vec<u8> = self.master.iter().flat_map(|w| w.load(Ordering::Relaxed).to_le_bytes()).collect();
            bytes.truncate(len);
            if self.master_seq.load(Ordering::Acquire) == seq {
                return String::from_utf8(bytes).ok();
            }
        }
        None
    }
}

impl LeaseSlot {
    /// A lease call for `keys` keys took `us` µs; `failed`: it failed or
    /// timed out.
    pub fn synced(&self, keys: usize, us: u64, failed: bool) {
        self.syncs.fetch_add(1, Ordering::Relaxed);
        if failed {
            self.sync_failures.fetch_add(1, Ordering::Relaxed);
        }
        self.sync_latency_sum_us.fetch_add(us, Ordering::Relaxed);
        self.keys_synced.fetch_add(keys as u64, Ordering::Relaxed);
    }

    /// Redis granted a key `units` units (a lease when at least one).
    pub fn granted(&self, units: u64) {
        if units > 0 {
            self.leases_granted.fetch_add(1, Ordering::Relaxed);
            self.units_granted.fetch_add(units, Ordering::Relaxed);
        }
    }

    /// This nginx lost Redis and limits alone.
    pub fn went_alone(&self) {
        self.alone.fetch_add(1, Ordering::Relaxed);
    }

    /// Redis took back `units` units given back.
    pub fn returned(&self, units: u64) {
        self.units_returned.fetch_add(units, Ordering::Relaxed);
    }
}

/// This worker's index among the slots of a row (`ngx_worker`).
static WORKER: AtomicUsize = AtomicUsize::new(0);

/// The Redis zones' rows, by zone index, for this worker's calls.
static REDIS_ROWS: OnceLock<Vec<Option<Row<RedisSlot>>>> = OnceLock::new();

/// The lease zones' rows, by lease zone index, for this worker's syncs.
static LEASE_ROWS: OnceLock<Vec<Option<Row<LeaseSlot>>>> = OnceLock::new();

/// Records this worker's slot, its Redis rows and its lease rows (once,
/// when the worker starts, before its calls and its syncs do).
pub fn init_worker(worker: usize, redis: &[Option<Row<RedisSlot>>], lease: &[Option<Row<LeaseSlot>>]) {
    WORKER.store(worker, Ordering::Relaxed);
    let _ = REDIS_ROWS.set(redis.to_vec());
    let _ = LEASE_ROWS.set(lease.to_vec());
}

/// This worker's counters of Redis zone `zone` (`None` without `rl_metrics`).
pub fn redis_slot(zone: usize) -> Option<&'static RedisSlot> {
    REDIS_ROWS.get()?.get(zone)?.as_ref().map(|r| {
        let r: &'static Row<RedisSlot> = r;
        r.mine()
    })
}

/// This worker's counters of lease zone `zone` (its index among the lease
/// zones; `None` without `rl_metrics`).
pub fn lease_slot(zone: usize) -> Option<&'static LeaseSlot> {
    LEASE_ROWS.get()?.get(zone)?.as_ref().map(|r| {
        let r: &'static Row<LeaseSlot> = r;
        r.mine()
    })
}

/// A row the configuration wants: what it counts and its identity.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Want {
    pub kind: Kind,
    pub ident: u64,
}

/// The bytes a row takes in the slab pool (a power of two, as the slab
/// allocator rounds it).
fn row_bytes(kind: Kind, nslots: usize) -> usize {
    (core::mem::size_of::<RowHeader>() + nslots * kind.slot_size()).next_power_of_two()
}

/// The zone's size for these rows: twice what they take (room for the
/// rows of lines added by later reloads), plus the pool's own pages,
/// rounded up to a power of two so that it rarely changes (nginx keeps the
/// memory, and so the counters, only for an unchanged size).
pub fn zone_size(wants: &[Want], nslots: usize) -> usize {
    // SAFETY: ngx_pagesize is set when nginx starts, before any configuration is read.
    let page = unsafe { ngx_pagesize };
    let rows: usize = wants.iter().map(|w| row_bytes(w.kind, nslots)).sum();
    (2 * rows + 16 * page).next_power_of_two().max(128 * 1024)
}

/// What the zone's init needs: the rows wanted and where to put them.
pub struct Layout {
    pub wants: Vec<Want>,
    pub nslots: usize,
    /// Index into `wants` of each line (by [`crate::line::LineId`]), of
    /// each Redis zone and of each lease zone.
    pub line_want: Vec<usize>,
    /// Each class of a line of classes: the line (by index), the class, and
    /// its row's index into `wants`.
    pub class_want: Vec<(usize, usize, usize)>,
    pub redis_want: Vec<usize>,
    pub lease_want: Vec<usize>,
    /// Each line's row, by line (lines with one identity share one), once
    /// the zone is initialised (before the workers start).
    pub lines: Vec<Option<Row<LineSlot>>>,
    /// Each class's row, as `class_want`.
    pub classes: Vec<Option<Row<LineSlot>>>,
    /// Each Redis zone's row, by zone index.
    pub redis: Vec<Option<Row<RedisSlot>>>,
    /// Each lease zone's row, by lease zone index.
    pub lease: Vec<Option<Row<LeaseSlot>>>,
}

/// Lays out the zone, or takes over the previous cycle's: finds or
/// allocates every wanted row. A row that does not fit is left out (its
/// counts are lost), and said so.
pub extern "C" fn zone_init(shm_zone: *mut ngx_shm_zone_t, data: *mut c_void) -> ngx_int_t {
    // SAFETY: nginx passes the zone being initialised; its data was set to our Layout.
    let shm = unsafe { &mut *shm_zone };
    // SAFETY: as above; the Layout lives in the main configuration, for the cycle.
    let layout = unsafe { &mut *shm.data.cast::<Layout>() };
    let shpool: *mut ngx_slab_pool_t = shm.shm.addr.cast();
    let (base, size) = (shpool as usize, shm.shm.size);
    // SAFETY: nginx has initialised the slab pool (or kept the old one) at shm.addr.
    let pool = unsafe { &mut *shpool };
    let log = shm.shm.log;

    let in_zone = |off: u64, len: usize| -> Option<usize> {
        let off = usize::try_from(off).ok()?;
        (off >= core::mem::size_of::<ngx_slab_pool_t>() && off.checked_add(len)? <= size && off.is_multiple_of(64))
            .then_some(base + off)
    };
    let mut dir: *mut Dir = ptr::null_mut();
    if !data.is_null() && !pool.data.is_null() {
        let off = (pool.data as usize).wrapping_sub(base) as u64;
        // SAFETY: within the zone, aligned; any bytes are a valid Dir.
        dir = in_zone(off, core::mem::size_of::<Dir>())
            .map(|a| a as *mut Dir)
            .filter(|d| unsafe { (**d).magic } == DIR_MAGIC)
            .unwrap_or(ptr::null_mut());
    }
    if dir.is_null() {
        // SAFETY: the pool is the master's alone during initialisation (locked allocation: the
        // old cycle's workers never allocate here).
        dir = unsafe { ngx_slab_alloc_locked(shpool, core::mem::size_of::<Dir>()) }.cast();
        if dir.is_null() {
            ngx_log_error!(NGX_LOG_EMERG, log, "rl_metrics: could not lay out its shared memory");
            return Status::NGX_ERROR.into();
        }
        // SAFETY: a fresh allocation of a Dir.
        unsafe { dir.write(Dir { magic: DIR_MAGIC, head: 0 }) };
        pool.data = dir.cast();
        pool.set_log_nomem(0);
    }

    // The rows already there, by identity.
    let mut found: Vec<(Kind, u64, usize, usize)> = Vec::new();
    // SAFETY: checked to be a Dir in the zone above.
    let mut next = unsafe { (*dir).head };
    let max_rows = size / 64;
    while next != 0 && found.len() < max_rows {
        let Some(addr) = in_zone(next, core::mem::size_of::<RowHeader>()) else { break };
        // SAFETY: within the zone, aligned; any bytes are a valid RowHeader.
        let h = unsafe { &*(addr as *const RowHeader) };
        let kind = match h.kind {
            1 => Kind::Line,
            2 => Kind::Redis,
            3 => Kind::Lease,
            _ => break,
        };
        let nslots = h.nslots as usize;
        if h.magic != ROW_MAGIC || !nslots.is_power_of_two() || nslots > MAX_SLOTS {
            break;
        }
        if in_zone(next, core::mem::size_of::<RowHeader>() + nslots * kind.slot_size()).is_none() {
            break;
        }
        found.push((kind, h.ident, addr, nslots));
        next = h.next;
    }

    let mut rows: Vec<Option<(*const u8, usize)>> = Vec::with_capacity(layout.wants.len());
    let mut lost = 0;
    for w in &layout.wants {
        if let Some(&(_, _, addr, n)) = found.iter().find(|f| f.0 == w.kind && f.1 == w.ident) {
            rows.push(Some((addr as *const u8, n)));
            continue;
        }
        let bytes = core::mem::size_of::<RowHeader>() + layout.nslots * w.kind.slot_size();
        // SAFETY: as above.
        let p = unsafe { ngx_slab_alloc_locked(shpool, bytes) }.cast::<u8>();
        if p.is_null() || !(p as usize).is_multiple_of(64) {
            lost += 1;
            rows.push(None);
            continue;
        }
        // SAFETY: a fresh allocation of `bytes` bytes; zeroed counters are fresh ones; the
        // header goes first, then the row is linked in (the old cycle's workers never read the
        // list: they keep their own rows).
        unsafe {
            ptr::write_bytes(p, 0, bytes);
            p.cast::<RowHeader>().write(RowHeader {
                magic: ROW_MAGIC,
                next: (*dir).head,
                kind: w.kind as u64,
                ident: w.ident,
                nslots: layout.nslots as u64,
            });
            (*dir).head = (p as usize - base) as u64;
        }
        found.push((w.kind, w.ident, p as usize, layout.nslots));
        rows.push(Some((p as *const u8, layout.nslots)));
    }
    let row_of = |i: &usize| rows.get(*i).copied().flatten();
    layout.lines = layout.line_want.iter().map(|i| row_of(i).map(|(a, n)| row(a, n))).collect();
    layout.classes = layout.class_want.iter().map(|(_, _, i)| row_of(i).map(|(a, n)| row(a, n))).collect();
    layout.redis = layout.redis_want.iter().map(|i| row_of(i).map(|(a, n)| row(a, n))).collect();
    layout.lease = layout.lease_want.iter().map(|i| row_of(i).map(|(a, n)| row(a, n))).collect();
    if lost > 0 {
        ngx_log_error!(
            ngx::ffi::NGX_LOG_WARN,
            log,
            "rl_metrics: no room for the counters of {} lines or zones, they are not counted until nginx restarts",
            lost
        );
    }
    Status::NGX_OK.into()
}

/// The row at `addr` with `nslots` slots, as a worker uses it.
pub fn row<T>(addr: *const u8, nslots: usize) -> Row<T> {
    // SAFETY: the slots follow the header within the row (checked in zone_init).
    Row { slots: unsafe { addr.add(core::mem::size_of::<RowHeader>()) }.cast(), mask: nslots.max(1) - 1 }
}

/// The metrics of one cycle, in the main configuration.
pub struct Metrics {
    /// Some location has `rl_metrics`.
    pub enabled: bool,
    /// The rows, found when the zone is initialised: no line has one
    /// without `rl_metrics`.
    pub(crate) layout: Layout,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            enabled: false,
            layout: Layout {
                wants: Vec::new(),
                nslots: 1,
                line_want: Vec::new(),
                class_want: Vec::new(),
                redis_want: Vec::new(),
                lease_want: Vec::new(),
                lines: Vec::new(),
                classes: Vec::new(),
                redis: Vec::new(),
                lease: Vec::new(),
            },
        }
    }
}
