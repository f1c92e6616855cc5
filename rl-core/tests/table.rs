//! Behaviour of the shared-memory table over a `Vec<u64>` region.

use rl_core::table::{Attach, Dropped, Table, TableError, PINNED};

/// An 8-aligned region of `len` bytes (rounded down to 8).
fn region(len: usize) -> Vec<u64> {
    vec![0xa5a5_a5a5_a5a5_a5a5; len / 8]
}

/// Attaches to `region` with a fixed seed.
fn attach(region: &mut [u64]) -> (Table<'_>, Attach) {
    attach_len(region, region.len() * 8)
}

/// Attaches to the first `len` bytes of `region`.
fn attach_len(region: &mut [u64], len: usize) -> (Table<'_>, Attach) {
    assert!(len <= region.len() * 8);
    // SAFETY: the slice is valid, initialized, 8-aligned and exclusively
    // borrowed for the table's lifetime.
    unsafe { Table::attach(region.as_mut_ptr().cast(), len, [7, 11]) }.expect("attach")
}

/// A region holding exactly `cap` entries or a little more.
fn small(cap: usize) -> Vec<u64> {
    let len = (Table::min_len()..).find(|&l| Table::capacity_for(l) >= cap);
    region(len.unwrap_or(0) + 8)
}

#[test]
fn insert_find_round_trip() {
    let mut r = region(4096);
    let (mut t, how) = attach(&mut r);
    assert_eq!(how, Attach::Fresh);
    let h = t.hash_key(1, b"10.0.0.1");
    assert!(t.find(h).is_none());
    let ins = t.insert(h, 100);
    assert!(ins.new);
    assert_eq!(ins.dropped, Dropped::Nothing);
    assert_eq!(t.state(ins.slot), Some(&[0; 3]));
    *t.state_mut(ins.slot).unwrap() = [1, 2, 3];
    t.set_idle_at(ins.slot, 160);
    let slot = t.find(h).expect("found");
    assert_eq!(slot, ins.slot);
    assert_eq!(t.state(slot), Some(&[1, 2, 3]));
    assert_eq!(t.idle_at(slot), Some(160));
    let again = t.find_or_insert(h, 101);
    assert!(!again.new && again.slot == slot);
    assert_eq!(t.stats().used, 1);
    assert_eq!(t.stats().inserts, 1);
    // The state and the idle time of one entry, found once: writes land where state() and idle_at() read.
    let (state, idle) = t.state_and_idle_mut(slot).expect("in range");
    *state = [4, 5, 6];
    *idle = 170;
    assert_eq!(t.state(slot), Some(&[4, 5, 6]));
    assert_eq!(t.idle_at(slot), Some(170));
    assert!(t.state_and_idle_mut(rl_core::table::Slot::NONE).is_none());
    t.check_invariants().unwrap();
}

#[test]
fn line_ids_separate_equal_keys() {
    let mut r = region(4096);
    let (mut t, _) = attach(&mut r);
    let (a, b) = (t.hash_key(1, b"k"), t.hash_key(2, b"k"));
    assert_ne!(a, b);
    assert_eq!(a, t.hash_key(1, b"k"));
    let sa = t.insert(a, 0).slot;
    let sb = t.insert(b, 0).slot;
    assert_ne!(sa, sb);
    *t.state_mut(sa).unwrap() = [1; 3];
    assert_eq!(t.state(t.peek(b).unwrap()), Some(&[0; 3]));
    assert_eq!(t.state(t.peek(a).unwrap()), Some(&[1; 3]));
}

#[test]
fn remove_frees_the_entry() {
    let mut r = region(4096);
    let (mut t, _) = attach(&mut r);
    let s = t.insert([1, 1], 0).slot;
    *t.state_mut(s).unwrap() = [4, 5, 6];
    assert_eq!(t.remove(s), Some([4, 5, 6]));
    assert_eq!(t.remove(s), None);
    assert!(t.find([1, 1]).is_none());
    assert_eq!(t.stats().used, 0);
    assert_eq!(t.insert([2, 2], 0).slot, s, "freed entry is reused");
    t.check_invariants().unwrap();
}

#[test]
fn full_table_evicts_instead_of_failing() {
    let mut r = small(64);
    let (mut t, _) = attach(&mut r);
    let cap = t.stats().capacity as u64;
    for k in 0..cap * 3 {
        let ins = t.find_or_insert([k, 0], 0);
        t.set_idle_at(ins.slot, 1000);
        assert!(t.find([k, 0]).is_some());
        assert!(t.stats().used as u64 == (k + 1).min(cap));
    }
    let s = t.stats();
    assert_eq!(s.evictions, 2 * cap);
    assert_eq!(s.expirations, 0);
    assert_eq!(s.evicted_idle, 0);
    assert_eq!(s.inserts, 3 * cap);
    t.check_invariants().unwrap();
}

#[test]
fn idle_entries_go_before_busy_ones() {
    let mut r = small(32);
    let (mut t, _) = attach(&mut r);
    let cap = t.stats().capacity as u64;
    for k in 0..cap {
        let s = t.insert([k, 0], 10).slot;
        // Key 2 is idle at 50, the others much later.
        t.set_idle_at(s, if k == 2 { 50 } else { 500 + k as u32 });
    }
    let ins = t.insert([100, 0], 60);
    assert!(matches!(ins.dropped, Dropped::Expired { .. }), "{:?}", ins.dropped);
    assert!(t.find([2, 0]).is_none());
    assert_eq!(t.stats().expirations, 1);
    assert_eq!(t.stats().evicted_idle, 1);
    assert_eq!(t.stats().evictions, 0);
    // Expiry by age is not an eviction: the table was not full for it.
    assert_eq!(t.expire(10_000, 3, |_| {}), 3);
    assert_eq!((t.stats().expirations, t.stats().evicted_idle), (4, 1));
    t.check_invariants().unwrap();
}

#[test]
fn busy_entries_go_in_order_of_idle_at() {
    let mut r = small(32);
    let (mut t, _) = attach(&mut r);
    let cap = t.stats().capacity as u64;
    // The 16 oldest (the scan window) are busy until 100..250 in shuffled
    // order: key 9 first, then key 6. Newer keys are idle sooner (50), but
    // are outside the window.
    for k in 0..cap {
        let s = t.insert([k, 0], 0).slot;
        let at = if k < 16 { 100 + (5 * k as u32 + 3) % 16 * 10 } else { 50 };
        t.set_idle_at(s, at);
    }
    let ins = t.insert([1000, 0], 0);
    assert_eq!(ins.dropped, Dropped::Evicted { state: [0; 3], idle_at: 100 });
    assert!(t.peek([9, 0]).is_none());
    t.set_idle_at(ins.slot, 5000);
    // Key 16 has slid into the window.
    let ins = t.insert([1001, 0], 0);
    assert_eq!(ins.dropped, Dropped::Evicted { state: [0; 3], idle_at: 50 });
    assert!(t.peek([16, 0]).is_none());
    t.set_idle_at(ins.slot, 5000);
    for k in 1002..1020 {
        let s = t.insert([k, 0], 0).slot;
        t.set_idle_at(s, 5000);
    }
    assert!(t.peek([6, 0]).is_none() && t.peek([0, 0]).is_none());
    assert!(t.peek([1, 0]).is_some(), "not plain LRU");
    assert_eq!(t.stats().evictions, 20);
    assert_eq!(t.stats().expirations, 0);
    t.check_invariants().unwrap();
}

#[test]
fn recently_found_entry_survives() {
    let mut r = small(16);
    let (mut t, _) = attach(&mut r);
    let cap = t.stats().capacity as u64;
    for k in 0..cap {
        t.insert([k, 0], 0); // idle_at 0: all idle
    }
    assert!(t.find([0, 0]).is_some()); // the oldest becomes the newest
    let ins = t.insert([100, 0], 1);
    assert!(matches!(ins.dropped, Dropped::Expired { .. }));
    assert!(t.peek([0, 0]).is_some());
    assert!(t.peek([1, 0]).is_none(), "next oldest was dropped");
    t.check_invariants().unwrap();
}

#[test]
fn expire_drops_only_idle_tail_entries() {
    let mut r = region(8192);
    let (mut t, _) = attach(&mut r);
    // Oldest first: idle at 10, 20, 1000, 30.
    for (k, at) in [(0u64, 10u32), (1, 20), (2, 1000), (3, 30)] {
        let s = t.insert([k, 0], 0).slot;
        *t.state_mut(s).unwrap() = [k; 3];
        t.set_idle_at(s, at);
    }
    let mut dropped = Vec::new();
    assert_eq!(t.expire(15, 5, |s| dropped.push(s[0])), 1);
    assert_eq!(t.expire(100, 5, |s| dropped.push(s[0])), 1, "stops at key 2");
    assert_eq!(dropped, [0, 1]);
    assert!(t.peek([3, 0]).is_some());
    t.find([2, 0]);
    assert_eq!(t.expire(100, 1, |s| dropped.push(s[0])), 1, "max respected");
    assert_eq!(dropped, [0, 1, 3]);
    assert_eq!(t.stats().expirations, 3);
    assert_eq!(t.stats().used, 1);
    t.check_invariants().unwrap();
}

/// A pinned entry (requests in flight) at the tail is never dropped, and
/// does not keep the idle entries behind it from expiring: it goes to the
/// head; the moves count in `max`.
#[test]
fn expire_moves_pinned_tail_entries_to_the_head() {
    let mut r = region(8192);
    let (mut t, _) = attach(&mut r);
    // Oldest first: pinned, idle at 10, pinned, idle at 20.
    for (k, at) in [(0u64, PINNED), (1, 10), (2, PINNED), (3, 20)] {
        let s = t.insert([k, 0], 0).slot;
        *t.state_mut(s).unwrap() = [k; 3];
        t.set_idle_at(s, at);
    }
    let mut dropped = Vec::new();
    assert_eq!(t.expire(100, 2, |s| dropped.push(s[0])), 1, "moved 0, dropped 1");
    assert_eq!(t.expire(100, 5, |s| dropped.push(s[0])), 1, "moved 2, dropped 3, then 0 and 2 again up to max");
    assert_eq!(dropped, [1, 3]);
    assert!(t.peek([0, 0]).is_some() && t.peek([2, 0]).is_some());
    assert_eq!(t.expire(u32::MAX - 1, 8, |s| dropped.push(s[0])), 0, "pinned entries never expire");
    assert_eq!(t.stats().used, 2);
    t.check_invariants().unwrap();
}

#[test]
fn reattach_keeps_entries() {
    let mut r = region(16384);
    let hashes: Vec<_> = {
        let (mut t, how) = attach(&mut r);
        assert_eq!(how, Attach::Fresh);
        *t.header_spare_mut() = 42;
        (0..100u64)
            .map(|k| {
                let h = t.hash_key(3, &k.to_le_bytes());
                let s = t.insert(h, 0).slot;
                *t.state_mut(s).unwrap() = [k, k + 1, k + 2];
                h
            })
            .collect()
    };
    // A different seed must not matter: the table keeps its hash key.
    let len = r.len() * 8;
    // SAFETY: valid, exclusive, 8-aligned region.
    let (mut t, how) = unsafe { Table::attach(r.as_mut_ptr().cast(), len, [99, 99]) }.expect("attach");
    assert_eq!(how, Attach::Reused);
    assert_eq!(*t.header_spare_mut(), 42);
    assert_eq!(t.stats().used, 100);
    for (k, h) in hashes.iter().enumerate() {
        assert_eq!(*h, t.hash_key(3, &(k as u64).to_le_bytes()));
        let k = k as u64;
        assert_eq!(t.state(t.peek(*h).unwrap()), Some(&[k, k + 1, k + 2]));
    }
    t.check_invariants().unwrap();
}

#[test]
fn wrong_magic_or_len_lays_out_fresh() {
    let mut r = region(16384);
    attach(&mut r).0.insert([1, 2], 0);
    let (t, how) = attach_len(&mut r, 16384 - 64);
    assert_eq!(how, Attach::Fresh, "different length");
    assert_eq!(t.stats().used, 0);
    attach(&mut r).0.insert([1, 2], 0);
    r[0] ^= 1; // magic
    let (t, how) = attach(&mut r);
    assert_eq!(how, Attach::Fresh, "bad magic");
    assert!(t.peek([1, 2]).is_none());
    t.check_invariants().unwrap();
}

#[test]
fn too_small_region_is_an_error() {
    let mut r = region(4096);
    let min = Table::min_len();
    // SAFETY: valid, exclusive region; len is within it.
    let res = unsafe { Table::attach(r.as_mut_ptr().cast(), min - 8, [0, 0]) };
    assert_eq!(res.err(), Some(TableError::TooSmall { len: min - 8, min }));
    let e = TableError::TooSmall { len: min - 8, min };
    assert!(e.to_string().contains(&min.to_string()));
    // SAFETY: as above.
    assert!(unsafe { Table::attach(r.as_mut_ptr().cast(), min, [0, 0]) }.is_ok());
}

#[test]
fn keys_per_mib() {
    let cap = Table::capacity_for(1 << 20);
    println!("{cap} keys per MiB ({:.1} bytes per key)", (1 << 20) as f64 / cap as f64);
    assert!(cap >= 16_000, "{cap}");
}

/// AES-CMAC (RFC 4493) of `msg` under `key`, written as the RFC gives it.
fn cmac(key: [u8; 16], msg: &[u8]) -> [u8; 16] {
    use aes::cipher::{generic_array::GenericArray, BlockEncrypt, KeyInit};
    let aes = aes::Aes128::new(&GenericArray::from(key));
    let enc = |b: [u8; 16]| {
        let mut g = GenericArray::from(b);
        aes.encrypt_block(&mut g);
        <[u8; 16]>::from(g)
    };
    let dbl = |v: u128| (v << 1) ^ if v >> 127 == 1 { 0x87 } else { 0 };
    let k1 = dbl(u128::from_be_bytes(enc([0; 16])));
    let k2 = dbl(k1);
    let n = msg.len().div_ceil(16).max(1);
    let complete = !msg.is_empty() && msg.len().is_multiple_of(16);
    let mut x = [0u8; 16];
    for i in 0..n {
        let chunk = &msg[16 * i..msg.len().min(16 * i + 16)];
        let mut block = [0u8; 16];
        block[..chunk.len()].copy_from_slice(chunk);
        if i == n - 1 {
            let k = match complete {
                true => k1,
                false => {
                    block[chunk.len()] = 0x80;
                    k2
                }
            };
            block = (u128::from_be_bytes(block) ^ k).to_be_bytes();
        }
        x = enc((u128::from_be_bytes(x) ^ u128::from_be_bytes(block)).to_be_bytes());
    }
    x
}

fn hex(s: &str) -> Vec<u8> {
    let s: String = s.split_whitespace().collect();
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

#[test]
fn cmac_reference_gives_the_rfc_4493_examples() {
    let key: [u8; 16] = hex("2b7e1516 28aed2a6 abf71588 09cf4f3c").try_into().unwrap();
    let msg = hex("6bc1bee2 2e409f96 e93d7e11 7393172a ae2d8a57 1e03ac9c 9eb76fac 45af8e51 \
         30c81c46 a35ce411 e5fbc119 1a0a52ef f69f2445 df4f9b17 ad2b417b e66c3710");
    for (len, mac) in [
        (0, "bb1d6929 e9593728 7fa37d12 9b756746"),
        (16, "070a16b4 6b4d4144 f79bdd9d d04a287c"),
        (40, "dfa66747 de9ae630 30ca3261 1497c827"),
        (64, "51f0bebf 7e3b9d92 fc497417 79363cfe"),
    ] {
        assert_eq!(cmac(key, &msg[..len]).to_vec(), hex(mac), "{len} bytes");
    }
}

#[test]
fn hash_key_is_aes_cmac_of_line_id_then_key() {
    let mut r = region(4096);
    let (t, _) = attach(&mut r);
    // The table's seed [7, 11] is the AES key, both words little-endian.
    let mut key = [0u8; 16];
    key[..8].copy_from_slice(&7u64.to_le_bytes());
    key[8..].copy_from_slice(&11u64.to_le_bytes());
    let bytes: Vec<u8> = (0..80u8).map(|i| i.wrapping_mul(37) ^ 0x5a).collect();
    for line_id in [0, 1, 0x0123_4567_89ab_cdef, u64::MAX] {
        for len in 0..=bytes.len() {
            let msg = [&line_id.to_le_bytes()[..], &bytes[..len]].concat();
            let mac = cmac(key, &msg);
            let want =
                [u64::from_le_bytes(mac[..8].try_into().unwrap()), u64::from_le_bytes(mac[8..].try_into().unwrap())];
            assert_eq!(t.hash_key(line_id, &bytes[..len]), want, "line {line_id:#x}, {len} bytes");
        }
    }
}

#[test]
fn reopen_sees_the_table_as_attached() {
    let mut r = region(16384);
    let len = r.len() * 8;
    let base = r.as_mut_ptr().cast::<u8>();
    // Each table is used in its own block, never two at a time.
    let (place, stats, h, s) = {
        // SAFETY: valid, exclusive, 8-aligned region.
        let (mut t, _) = unsafe { Table::attach(base, len, [7, 11]) }.expect("attach");
        let h = t.hash_key(1, b"k");
        let s = t.insert(h, 0).slot;
        *t.state_mut(s).unwrap() = [1, 2, 3];
        (t.region(), t.stats(), h, s)
    };
    assert_eq!((place.base(), place.len()), (base, len));
    {
        // SAFETY: as above.
        let mut t = unsafe { Table::reopen(&place) };
        assert_eq!(t.stats(), stats);
        // The hash the region keeps keyed is the table's.
        assert_eq!(t.hash_key(1, b"k"), h);
        assert_ne!(t.hash_key(2, b"k"), h);
        assert_eq!(t.find(h), Some(s));
        assert_eq!(t.state_at(s, h), Some(&mut [1, 2, 3]));
        t.insert([2, 2], 0);
        t.check_invariants().unwrap();
    }
    // SAFETY: as above.
    let t = unsafe { Table::open(base, len) }.expect("still laid out");
    assert_eq!(t.stats().used, 2);
}

#[test]
fn state_at_refuses_a_slot_that_lost_its_key() {
    let mut r = small(8);
    let (mut t, _) = attach(&mut r);
    let a = t.insert([1, 0], 0).slot;
    *t.state_at(a, [1, 0]).expect("live") = [9; 3];
    assert_eq!(t.state(a), Some(&[9; 3]));
    assert!(t.state_at(a, [2, 0]).is_none(), "another key's hash");
    t.remove(a);
    assert!(t.state_at(a, [1, 0]).is_none(), "removed");
    // The freed entry is reused for another key: the old slot does not see it.
    let b = t.insert([2, 0], 0).slot;
    assert_eq!(a, b);
    assert!(t.state_at(a, [1, 0]).is_none(), "reused");
    assert_eq!(t.state_at(b, [2, 0]), Some(&mut [0; 3]));
    // Dropped to make room in a full table.
    let cap = t.stats().capacity as u64;
    for k in 3..3 + cap {
        t.insert([k, 0], 0);
    }
    assert!(t.state_at(b, [2, 0]).is_none(), "evicted");
}

#[test]
fn evict_lru_spares_the_slot_kept() {
    let mut r = small(16);
    let (mut t, _) = attach(&mut r);
    let cap = t.stats().capacity as u64;
    for k in 0..cap {
        let s = t.insert([k, 0], 0).slot;
        t.set_idle_at(s, 100 + k as u32);
    }
    // The oldest entry, the first victim, is the one to keep (and it
    // becomes idle last, so that it is never the best victim).
    let keep = t.peek([0, 0]).expect("present");
    t.set_idle_at(keep, 10_000);
    let dropped = t.evict_lru(0, keep).expect("something to drop");
    assert_eq!(dropped, Dropped::Evicted { state: [0; 3], idle_at: 101 });
    assert!(t.peek([1, 0]).is_none());
    assert_eq!(t.state_at(keep, [0, 0]), Some(&mut [0; 3]));
    for _ in 2..cap {
        t.evict_lru(0, keep).expect("something to drop");
    }
    assert_eq!(t.evict_lru(0, keep), None, "only the kept entry is left");
    assert_eq!(t.peek([0, 0]), Some(keep));
    t.check_invariants().unwrap();
}

#[test]
fn hash_is_the_same_with_or_without_aes_instructions() {
    use rl_core::table::KeyHash;
    let bytes: Vec<u8> = (0..80u8).map(|i| i.wrapping_mul(91) ^ 0xa5).collect();
    for seed in [[0, 0], [7, 11], [u64::MAX, 0x0123_4567_89ab_cdef]] {
        let (fast, portable) = (KeyHash::new(seed), KeyHash::portable(seed));
        for line_id in [0, 3, u64::MAX] {
            for len in 0..=bytes.len() {
                let key = &bytes[..len];
                assert_eq!(fast.hash(line_id, key), portable.hash(line_id, key), "seed {seed:?}, {len} bytes");
            }
        }
    }
}

#[test]
fn live_entries_are_every_key_held_once() {
    let mut r = small(16);
    let (mut t, _) = attach(&mut r);
    let hashes: Vec<[u64; 2]> = (0..10u64).map(|i| t.hash_key(3, &i.to_le_bytes())).collect();
    let slots: Vec<_> = hashes.iter().map(|&h| t.insert(h, 1).slot).collect();
    // Two removed: their entries go to the free list, and are not walked.
    t.remove(slots[2]);
    t.remove(slots[7]);
    let mut seen: Vec<[u64; 2]> = t
        .live_entries()
        .map(|(s, h)| {
            assert_eq!(t.peek(h), Some(s));
            h
        })
        .collect();
    seen.sort();
    let mut want: Vec<[u64; 2]> =
        hashes.iter().enumerate().filter(|(i, _)| *i != 2 && *i != 7).map(|(_, h)| *h).collect();
    want.sort();
    assert_eq!(seen, want);
    // A removed entry handed out again is walked once, for its new key.
    let h = t.hash_key(4, b"new");
    t.insert(h, 2);
    assert_eq!(t.live_entries().filter(|(_, x)| *x == h).count(), 1);
    assert_eq!(t.live_entries().count(), 9);
}

/// A walk in parts (a lease zone's sync, each part under a hold of the
/// lock of its own) sees what a walk at once does, in the same order; an
/// entry dropped between two parts, ahead of the walk, is not seen, and a
/// key given an entry ahead of it is; one given an entry behind it waits
/// for the next walk.
#[test]
fn live_entries_walked_in_parts() {
    let mut r = small(16);
    let cap = Table::capacity_for(r.len() * 8);
    let (mut t, _) = attach(&mut r);
    let hashes: Vec<[u64; 2]> = (0..cap as u64).map(|i| t.hash_key(3, &i.to_le_bytes())).collect();
    let slots: Vec<_> = hashes.iter().map(|&h| t.insert(h, 1).slot).collect();
    t.remove(slots[1]);
    t.remove(slots[5]);
    let whole: Vec<_> = t.live_entries().collect();
    assert_eq!(whole.len(), cap - 2);
    let mut part = Vec::new();
    for max in [1, 3, 4, 10, cap] {
        let (mut walked, mut from, mut parts) = (Vec::new(), Some(0), 0);
        while let Some(start) = from {
            from = t.live_entries_from(start, max, &mut part);
            assert!(part.len() <= max, "parts of {max} at most");
            walked.extend_from_slice(&part);
            parts += 1;
        }
        assert_eq!(walked, whole, "in parts of {max}");
        assert!(parts >= whole.len().div_ceil(max), "{parts} parts of {max}");
    }
    // Changed between two parts, the table full but for the two entries
    // dropped before: the walk has passed the first three live entries; one
    // ahead of it is dropped, and three new keys take the three free
    // entries, two ahead of the walk and one behind it.
    let mut walked = Vec::new();
    let from = t.live_entries_from(0, 3, &mut part).expect("more to walk");
    walked.extend_from_slice(&part);
    let ahead = whole[6];
    t.remove(ahead.0);
    let made: Vec<_> = (0..3u64)
        .map(|i| {
            let h = t.hash_key(4, &i.to_le_bytes());
            (t.insert(h, 2).slot, h)
        })
        .collect();
    let mut next = Some(from);
    while let Some(start) = next {
        next = t.live_entries_from(start, 3, &mut part);
        walked.extend_from_slice(&part);
    }
    assert!(!walked.contains(&ahead), "dropped ahead of the walk");
    let behind = made.iter().filter(|(slot, _)| slot.index() < from).count();
    assert_eq!(behind, 1, "entry 1 is behind the walk, 5 and {} ahead", ahead.0.index());
    for (slot, h) in &made {
        let want = usize::from(slot.index() >= from);
        let seen = walked.iter().filter(|(_, x)| x == h).count();
        assert_eq!(seen, want, "made at entry {} (the walk went on from {from})", slot.index());
    }
    let mut rest = walked.clone();
    rest.retain(|e| !made.iter().any(|(_, h)| *h == e.1));
    let mut want = whole.clone();
    want.retain(|e| *e != ahead);
    assert_eq!(rest, want, "every other entry once");
}
