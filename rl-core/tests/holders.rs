//! A plain concurrency state's inline holders, with the units that do not
//! fit kept apart (as the module's hold entries keep them), against a model:
//! what each worker holds of the key. Whatever the interleaving, a worker's
//! units inline and apart sum to what it holds, and reclaiming a worker
//! gives back exactly that.

use std::collections::HashMap;

use proptest::prelude::*;
use rl_core::limit::holders::{give_inline, reclaim_inline, take_inline, Holder, INLINE};

#[derive(Clone, Debug)]
enum Op {
    Take(usize, u64),
    Give(usize, u64),
    Reclaim(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..5usize, 1..4u64).prop_map(|(w, c)| Op::Take(w, c)),
        6 => (0..5usize, 1..4u64).prop_map(|(w, c)| Op::Give(w, c)),
        1 => (0..5usize).prop_map(Op::Reclaim),
    ]
}

/// Worker `i`: pids and slots that collide in pairs (a restarted worker
/// takes its predecessor's slot).
fn worker(i: usize) -> Holder {
    Holder::worker(100 + i as u32, (i / 2) as u64)
}

/// What `h`'s words hold (0 where it has none).
fn inline_of(words: &[u64; INLINE], h: Holder) -> u64 {
    let mine = |r: &Holder| (r.pid, r.slot) == (h.pid, h.slot);
    words.iter().filter(|&&w| w != 0).map(|&w| Holder::read(w)).filter(mine).map(|r| r.count).sum()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]
    #[test]
    fn inline_and_apart_sum_to_what_each_worker_holds(ops in proptest::collection::vec(op(), 1..60)) {
        let mut words = [0u64; INLINE];
        let mut apart: HashMap<usize, u64> = HashMap::new();
        let mut model: HashMap<usize, u64> = HashMap::new();
        for op in ops {
            match op {
                Op::Take(i, cost) => {
                    if !take_inline(&mut words, worker(i), cost) {
                        *apart.entry(i).or_default() += cost;
                    }
                    *model.entry(i).or_default() += cost;
                }
                Op::Give(i, cost) => {
                    let cost = cost.min(model.get(&i).copied().unwrap_or(0));
                    let rest = give_inline(&mut words, worker(i), cost);
                    let a = apart.entry(i).or_default();
                    prop_assert!(*a >= rest, "{} given apart, {} kept there", rest, *a);
                    *a -= rest;
                    *model.entry(i).or_default() -= cost;
                }
                Op::Reclaim(i) => {
                    let gone = worker(i);
                    let got = reclaim_inline(&mut words, |h| (h.pid, h.slot) == (gone.pid, gone.slot));
                    let inline: u64 = got.iter().flatten().map(|h| h.count).sum();
                    let held = model.remove(&i).unwrap_or(0);
                    prop_assert_eq!(inline + apart.remove(&i).unwrap_or(0), held);
                }
            }
            for i in 0..5 {
                prop_assert_eq!(
                    inline_of(&words, worker(i)) + apart.get(&i).copied().unwrap_or(0),
                    model.get(&i).copied().unwrap_or(0),
                    "worker {}", i
                );
            }
            prop_assert!(words.iter().all(|&w| w != u64::MAX));
        }
    }
}
