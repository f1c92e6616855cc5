//! The region's layout: header, bucket array and entry array, all
//! `#[repr(C)]` plain integers (any byte pattern is a valid value), addressed
//! by `u32` indices so the region is position-independent.

use core::fmt;
use core::mem::size_of;

/// "nginx-rl table", marks a region laid out by this module.
pub(super) const MAGIC: u64 = 0x6e67_782d_726c_7462;
/// Bumped on any change to [`Header`], [`Entry`] or the hash (a table laid
/// out under another is laid out anew, not misread).
pub(super) const VERSION: u32 = 3;
/// The "no entry" index.
pub(super) const NIL: u32 = u32::MAX;
/// `lru_prev` of an entry on the free list (never a valid index).
pub(super) const FREE: u32 = u32::MAX - 1;
/// Fewest entries a region must hold.
pub(super) const MIN_CAPACITY: u64 = 8;
/// Most entries a region may hold (keeps every index below [`FREE`]).
const MAX_CAPACITY: u64 = 1 << 31;
/// Bytes of [`Entry`] plus the bucket share used to size the bucket array.
const BYTES_PER_KEY: u64 = ENTRY_SIZE + 4;

pub(super) const HEADER_SIZE: u64 = size_of::<Header>() as u64;
pub(super) const ENTRY_SIZE: u64 = size_of::<Entry>() as u64;

/// The table header, at offset 0 of the region.
#[repr(C)]
#[derive(Debug)]
pub(super) struct Header {
    pub magic: u64,
    /// Length of the region the table was laid out in.
    pub region_len: u64,
    pub version: u32,
    pub capacity: u32,
    pub nbuckets: u32,
    /// Live entries.
    pub used: u32,
    /// Head of the free list (linked through `chain_next`).
    pub free_head: u32,
    /// Entries at or above this index have never been used.
    pub unused_next: u32,
    /// Most recently used entry.
    pub lru_head: u32,
    /// Least recently used entry.
    pub lru_tail: u32,
    /// Non-idle states dropped to make room.
    pub evictions: u64,
    /// Idle states dropped, by expiry or to make room.
    pub expirations: u64,
    /// Idle states dropped to make room.
    pub evicted_idle: u64,
    pub inserts: u64,
    /// The key of the table's hash ([`super::KeyHash`]), from the caller's
    /// seed at first layout.
    pub key_seed: [u64; 2],
    /// Free for the caller (e.g. the time of the last "zone full" log).
    pub spare: u64,
}

/// One key's slot: 56 bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(super) struct Entry {
    /// 128-bit keyed hash of (line id, key): the key's identity.
    pub hash: [u64; 2],
    /// The caller's algorithm state, all-zero on insert.
    pub state: [u64; 3],
    /// Toward the LRU head (more recent), or [`FREE`] when on the free list.
    pub lru_prev: u32,
    /// Toward the LRU tail (less recent).
    pub lru_next: u32,
    /// Next entry in the same bucket, or in the free list.
    pub chain_next: u32,
    /// Caller clock (seconds) after which the state is fresh again.
    pub idle_at: u32,
}

const _: () = assert!(size_of::<Entry>() == 56);
const _: () = assert!(size_of::<Header>().is_multiple_of(8));

/// Where things go in a region of a given length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Geometry {
    pub nbuckets: u32,
    pub capacity: u32,
    /// Byte offset of the entry array (the buckets start at `HEADER_SIZE`).
    pub entries_off: usize,
}

impl Geometry {
    /// The layout for `len` bytes, or `None` if fewer than
    /// [`MIN_CAPACITY`] entries fit.
    pub fn for_len(len: usize) -> Option<Geometry> {
        let avail = (len as u64).checked_sub(HEADER_SIZE)?;
        let estimate = (avail / BYTES_PER_KEY).min(MAX_CAPACITY);
        if estimate < MIN_CAPACITY {
            return None;
        }
        // Largest power of two <= estimate: load factor between 1 and 2.
        let nbuckets = 1u64 << (63 - estimate.leading_zeros());
        let buckets_size = nbuckets * 4; // a multiple of 8: nbuckets >= 8
        let capacity = ((avail - buckets_size) / ENTRY_SIZE).min(MAX_CAPACITY);
        Some(Geometry {
            nbuckets: u32::try_from(nbuckets).ok()?,
            capacity: u32::try_from(capacity).ok()?,
            entries_off: usize::try_from(HEADER_SIZE + buckets_size).ok()?,
        })
    }

    /// The smallest region length [`Geometry::for_len`] accepts.
    pub const fn min_len() -> usize {
        (HEADER_SIZE + MIN_CAPACITY * BYTES_PER_KEY) as usize
    }
}

/// Why a region cannot hold a table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TableError {
    /// The region is shorter than `min` bytes.
    TooSmall {
        /// Length given.
        len: usize,
        /// Minimum length ([`super::Table::min_len`]).
        min: usize,
    },
    /// The region pointer is null or not 8-byte aligned.
    Misaligned,
}

impl fmt::Display for TableError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TableError::TooSmall { len, min } => {
                write!(f, "zone of {len} bytes is too small, need at least {min}")
            }
            TableError::Misaligned => f.write_str("zone memory is not 8-byte aligned"),
        }
    }
}

impl std::error::Error for TableError {}
