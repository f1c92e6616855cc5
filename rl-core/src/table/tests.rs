//! Layout and robustness tests that need the table's internals.

use super::layout::{Geometry, ENTRY_SIZE, HEADER_SIZE, NIL};
use super::{Attach, Dropped, Table, TableError};

/// Attaches to an 8-aligned `Vec<u64>` region.
fn attach(region: &mut [u64]) -> (Table<'_>, Attach) {
    let len = region.len() * 8;
    // SAFETY: the slice is valid, initialized, 8-aligned and borrowed
    // exclusively for the table's lifetime.
    unsafe { Table::attach(region.as_mut_ptr().cast(), len, [1, 2]) }.expect("attach")
}

/// xorshift64: deterministic noise without a dependency.
fn noise(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

#[test]
fn geometry_fits_and_stays_dense() {
    for len in (Table::min_len()..(1 << 16)).step_by(97).chain([1 << 20, 1 << 26]) {
        let g = Geometry::for_len(len).expect("fits");
        let (nb, cap) = (g.nbuckets as u64, g.capacity as u64);
        assert!(nb.is_power_of_two() && nb <= cap, "len {len}: {g:?}");
        assert!(g.entries_off as u64 == HEADER_SIZE + nb * 4);
        assert!(g.entries_off as u64 + cap * ENTRY_SIZE <= len as u64);
        assert!((nb * 4 + cap * ENTRY_SIZE) / cap <= 60, "len {len}: {g:?}");
    }
}

#[test]
fn min_len_is_exact() {
    assert_eq!(Table::capacity_for(Table::min_len()), 8);
    assert_eq!(Table::capacity_for(Table::min_len() - 1), 0);
    assert_eq!(Table::capacity_for(0), 0);
}

#[test]
fn misaligned_or_null_region_is_refused() {
    let mut region = vec![0u64; 256];
    let len = Table::min_len();
    // SAFETY: in bounds of `region`; the table is never created.
    let odd = unsafe { region.as_mut_ptr().cast::<u8>().add(4) };
    // SAFETY: attach checks alignment before touching memory.
    let r = unsafe { Table::attach(odd, len, [0, 0]) };
    assert_eq!(r.err(), Some(TableError::Misaligned));
    // SAFETY: as above, for null.
    let r = unsafe { Table::attach(core::ptr::null_mut(), len, [0, 0]) };
    assert_eq!(r.err(), Some(TableError::Misaligned));
}

#[test]
fn open_needs_a_laid_out_region() {
    let mut region = vec![0u64; 512];
    let len = region.len() * 8;
    let ptr = region.as_mut_ptr().cast::<u8>();
    // SAFETY: valid, exclusive region; each table is dropped before the next.
    assert!(unsafe { Table::open(ptr, len) }.is_none());
    // SAFETY: as above.
    let (mut t, _) = unsafe { Table::attach(ptr, len, [5, 6]) }.expect("attach");
    t.insert([1, 1], 0);
    // SAFETY: as above.
    let t = unsafe { Table::open(ptr, len) }.expect("open");
    assert!(t.peek([1, 1]).is_some());
}

#[test]
fn broken_lru_resets_instead_of_failing() {
    let mut region = vec![0u64; 128];
    let (mut t, _) = attach(&mut region);
    let cap = t.stats().capacity as u64;
    for k in 0..cap {
        t.insert([k, k], 0);
    }
    t.hdr.lru_tail = NIL;
    let r = t.insert([99, 99], 0);
    assert_eq!(r.dropped, Dropped::Reset);
    assert_eq!(t.stats().used, 1);
    assert!(t.find([99, 99]).is_some());
    t.check_invariants().expect("consistent after reset");
}

#[test]
fn scribbled_region_never_panics_or_hangs() {
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut opened = 0;
    for round in 0..200 {
        let mut region = vec![0u64; 160];
        {
            let (mut t, _) = attach(&mut region);
            for k in 0..40 {
                let r = t.find_or_insert([k, round], k as u32);
                t.set_idle_at(r.slot, (k * 3) as u32);
            }
        }
        // Keep the header's identity and sizes, scramble everything else.
        for w in region.iter_mut().skip(4) {
            if noise(&mut seed).is_multiple_of(4) {
                *w = if noise(&mut seed).is_multiple_of(2) { noise(&mut seed) } else { noise(&mut seed) % 64 };
            }
        }
        let Some(mut t) = ({
            let len = region.len() * 8;
            // SAFETY: valid, exclusive region.
            unsafe { Table::open(region.as_mut_ptr().cast(), len) }
        }) else {
            continue;
        };
        opened += 1;
        for step in 0..300u64 {
            let k = noise(&mut seed) % 64;
            let now = step as u32;
            match noise(&mut seed) % 4 {
                0 => drop(t.find([k, round])),
                1 => {
                    let r = t.find_or_insert([k, round], now);
                    t.set_idle_at(r.slot, now + 5);
                }
                2 => drop(t.remove(super::Slot((noise(&mut seed) % 80) as u32))),
                _ => drop(t.expire(now, 3, |_| {})),
            }
        }
    }
    assert!(opened > 50, "only {opened} scribbled regions opened");
}

#[test]
fn reopened_scribbled_region_never_panics_or_hangs() {
    // As above, but through `reopen`, which reads nothing back from the
    // header: the header is scribbled too, and every table is used.
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    for round in 0..200u64 {
        let mut region = vec![0u64; 160];
        let (len, base) = (region.len() * 8, region.as_mut_ptr());
        let place = {
            // SAFETY: valid, exclusive, 8-aligned region; the table is dropped at the end of the block.
            let (mut t, _) = unsafe { Table::attach(base.cast(), len, [3, 4]) }.expect("attach");
            for k in 0..40 {
                let r = t.find_or_insert([k, round], k as u32);
                t.set_idle_at(r.slot, (k * 3) as u32);
            }
            t.region()
        };
        for i in 0..region.len() {
            if noise(&mut seed).is_multiple_of(4) {
                let w = if noise(&mut seed).is_multiple_of(2) { noise(&mut seed) } else { noise(&mut seed) % 64 };
                // SAFETY: in bounds; written through the pointer the region was opened with.
                unsafe { base.add(i).write(w) };
            }
        }
        // SAFETY: valid, exclusive region, as attached.
        let mut t = unsafe { Table::reopen(&place) };
        for step in 0..300u64 {
            let k = noise(&mut seed) % 64;
            let now = step as u32;
            match noise(&mut seed) % 5 {
                0 => drop(t.find([k, round])),
                1 => {
                    let r = t.find_or_insert([k, round], now);
                    t.set_idle_at(r.slot, now + 5);
                    if let Some(s) = t.state_at(r.slot, [k, round]) {
                        s[0] += 1;
                    }
                }
                2 => drop(t.remove(super::Slot((noise(&mut seed) % 80) as u32))),
                3 => drop(t.state_at(super::Slot((noise(&mut seed) % 80) as u32), [k, round])),
                _ => drop(t.expire(now, 3, |_| {})),
            }
        }
    }
}

#[test]
fn state_at_refuses_a_slot_out_of_range() {
    let mut region = vec![0u64; 128];
    let (mut t, _) = attach(&mut region);
    let s = t.insert([1, 1], 0).slot;
    assert!(t.state_at(s, [1, 1]).is_some());
    assert!(t.state_at(super::Slot::NONE, [1, 1]).is_none());
    assert!(t.state_at(super::Slot::NONE, [0, 0]).is_none());
    assert!(t.state_at(super::Slot(t.stats().capacity as u32), [0, 0]).is_none());
}
