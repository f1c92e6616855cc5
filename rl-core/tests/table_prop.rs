//! The table against a model: a list of (key, idle_at, state) in LRU order
//! with the same drop policy.

use proptest::prelude::*;
use rl_core::table::{Dropped, Table};

/// Entries the table scans from the LRU tail when full.
const SCAN: usize = 16;

#[derive(Debug, Clone)]
enum Op {
    /// Advance the clock, find or insert a key, set its idle time and
    /// maybe write its state.
    Use { key: (u64, u8), dt: u32, idle_in: u32, write: bool },
    /// Find without inserting.
    Find((u64, u8)),
    /// Remove a key.
    Remove((u64, u8)),
    /// Advance the clock and expire up to `max` idle tail entries.
    Expire { dt: u32, max: usize },
}

/// Operations whose states stay busy for up to `idle_max` seconds.
fn op(idle_max: u32) -> impl Strategy<Value = Op> {
    let key = (0u64..3, 0u8..40);
    prop_oneof![
        6 => (key.clone(), 0u32..4, 0u32..idle_max, any::<bool>())
            .prop_map(|(key, dt, idle_in, write)| Op::Use { key, dt, idle_in, write }),
        1 => key.clone().prop_map(Op::Find),
        1 => key.prop_map(Op::Remove),
        1 => (0u32..10, 0usize..4).prop_map(|(dt, max)| Op::Expire { dt, max }),
    ]
}

/// One model entry.
#[derive(Debug, Clone, Copy)]
struct Ent {
    key: (u64, u8),
    idle_at: u32,
    state: [u64; 3],
}

/// Entries from LRU tail (index 0) to head.
#[derive(Default)]
struct Model {
    lru: Vec<Ent>,
}

impl Model {
    fn pos(&self, key: (u64, u8)) -> Option<usize> {
        self.lru.iter().position(|e| e.key == key)
    }

    /// Moves `key` to the head, returning whether it was present.
    fn touch(&mut self, key: (u64, u8)) -> bool {
        let Some(p) = self.pos(key) else { return false };
        let e = self.lru.remove(p);
        self.lru.push(e);
        true
    }

    /// The table's drop policy.
    fn make_room(&mut self, cap: usize, now: u32) -> Dropped {
        if self.lru.len() < cap {
            return Dropped::Nothing;
        }
        let window = &self.lru[..SCAN.min(self.lru.len())];
        let pick = match window.iter().position(|e| e.idle_at <= now) {
            Some(p) => p,
            None => (0..window.len()).min_by_key(|&i| (window[i].idle_at, i)).unwrap(),
        };
        let e = self.lru.remove(pick);
        if e.idle_at <= now {
            Dropped::Expired { state: e.state }
        } else {
            Dropped::Evicted { state: e.state, idle_at: e.idle_at }
        }
    }
}

fn hash(t: &Table<'_>, (line, k): (u64, u8)) -> [u64; 2] {
    t.hash_key(line, &[k])
}

/// Applies `op` to both and compares what they report.
fn step(t: &mut Table<'_>, m: &mut Model, now: &mut u32, n: u64, op: &Op) {
    let cap = t.stats().capacity;
    match *op {
        Op::Use { key, dt, idle_in, write } => {
            *now += dt;
            let present = m.touch(key);
            let expect = if present { Dropped::Nothing } else { m.make_room(cap, *now) };
            let r = t.find_or_insert(hash(t, key), *now);
            assert_eq!(r.new, !present);
            assert_eq!(r.dropped, expect);
            if !present {
                m.lru.push(Ent { key, idle_at: *now, state: [0; 3] });
            }
            let e = m.lru.last_mut().unwrap();
            e.idle_at = *now + idle_in;
            t.set_idle_at(r.slot, e.idle_at);
            if write {
                e.state = [n, key.0, u64::from(key.1)];
                *t.state_mut(r.slot).unwrap() = e.state;
            }
        }
        Op::Find(key) => {
            assert_eq!(t.find(hash(t, key)).is_some(), m.touch(key));
        }
        Op::Remove(key) => {
            let got = t.peek(hash(t, key)).and_then(|s| t.remove(s));
            let want = m.pos(key).map(|p| m.lru.remove(p).state);
            assert_eq!(got, want);
        }
        Op::Expire { dt, max } => {
            *now += dt;
            let mut got = Vec::new();
            t.expire(*now, max, |s| got.push(*s));
            let n = m.lru.iter().take(max).take_while(|e| e.idle_at <= *now).count();
            let want: Vec<_> = m.lru.drain(..n).map(|e| e.state).collect();
            assert_eq!(got, want);
        }
    }
}

/// Everything the model holds is in the table, with its state.
fn same_contents(t: &Table<'_>, m: &Model) {
    t.check_invariants().unwrap();
    assert_eq!(t.stats().used, m.lru.len());
    assert!(t.stats().used <= t.stats().capacity);
    for e in &m.lru {
        let s = t.peek(hash(t, e.key)).expect("model key present");
        assert_eq!(t.state(s), Some(&e.state));
        assert_eq!(t.idle_at(s), Some(e.idle_at));
    }
}

/// Runs `ops` on a table of `min_len() + extra` bytes and on the model.
fn run(extra: usize, ops: &[Op]) {
    let len = Table::min_len() + extra / 8 * 8;
    let mut region = vec![0x5a5a_5a5a_5a5a_5a5au64; len / 8];
    // SAFETY: valid, initialized, 8-aligned, exclusively borrowed.
    let (mut t, _) = unsafe { Table::attach(region.as_mut_ptr().cast(), len, [3, 4]) }.expect("attach");
    let (mut m, mut now) = (Model::default(), 0u32);
    for (n, op) in ops.iter().enumerate() {
        step(&mut t, &mut m, &mut now, n as u64 + 1, op);
        same_contents(&t, &m);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// States go idle quickly: mostly expirations.
    #[test]
    fn table_matches_model(
        extra in 0usize..1200,
        ops in prop::collection::vec(op(30), 1..300),
    ) {
        run(extra, &ops);
    }

    /// States stay busy: mostly evictions by smallest idle_at.
    #[test]
    fn busy_table_matches_model(
        extra in 600usize..1500,
        ops in prop::collection::vec(op(2000), 1..300),
    ) {
        run(extra, &ops);
    }
}
