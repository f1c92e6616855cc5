//! Runs `Limit::acquire_charged` on one key in a loop, for counting the
//! instructions a call costs under callgrind (the cost the module's
//! shared-memory path pays for a request with one line):
//!
//! ```text
//! cargo build -p rl-core --release --example acquire_ir
//! valgrind --tool=callgrind --callgrind-out-file=/dev/null \
//!     --toggle-collect='acquire_ir::step' \
//!     target/release/examples/acquire_ir gcra admit 100000
//! ```
//!
//! and dividing the instructions it collected by the count. `step` is never
//! inlined, so that only the call is collected (with its own call and
//! return), not the loop around it.
//!
//! `admit`: `rate=100000000r/s burst=65536`, as bench/conf/rl.conf's admit
//! path, the clock moving 1 µs a call so that the key never fills up.
//! `reject`: `rate=1r/m burst=1`, the first call admitted and every other
//! one rejected.

use std::hint::black_box;
use std::process::ExitCode;

use rl_core::limit::{Algorithm, Charge, Limit, Outcome};
use rl_core::parse::Rate;

/// One call, out of line so that callgrind can collect it alone.
#[inline(never)]
fn step(limit: &Limit, state: &mut [u64], now: u64, cost: u64) -> (Outcome, Charge) {
    limit.acquire_charged(state, now, cost)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let (Some(algorithm), Some(mode), Some(n)) = (
        args.get(1).and_then(|a| a.parse::<Algorithm>().ok()),
        args.get(2).map(String::as_str),
        args.get(3).and_then(|n| n.parse::<u64>().ok()),
    ) else {
        eprintln!("usage: acquire_ir ALGORITHM admit|reject COUNT");
        return ExitCode::FAILURE;
    };
    let (rate, burst) = match mode {
        "admit" => (Rate { count: 100_000_000, period_us: 1_000_000 }, 65_536),
        "reject" => (Rate { count: 1, period_us: 60_000_000 }, 1),
        _ => {
            eprintln!("mode: admit or reject");
            return ExitCode::FAILURE;
        }
    };
    let limit = match Limit::new(algorithm, rate, burst) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let limit = black_box(limit);
    let mut state = vec![0u64; limit.state_words()];
    // A clock far from 0, as a worker's is.
    let start = 1_700_000_000_000_000u64;
    let mut admitted = 0u64;
    for i in 0..n {
        let (o, charge) = step(&limit, &mut state, black_box(start + i), black_box(1));
        admitted += u64::from(black_box(o).admitted);
        black_box(charge);
    }
    println!("{algorithm} {mode}: {admitted} of {n} admitted");
    ExitCode::SUCCESS
}
