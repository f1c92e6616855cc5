//! Prints what nginx-rl sends a Redis zone's server, for
//! bench/redis_profile.sh to send under callgrind:
//!
//! ```text
//! redis_calls library
//!     the function library, as FUNCTION LOAD takes it
//! redis_calls fcall ALGORITHM REQUESTS CLIENTS CALLS HITS
//!     CALLS FCALLs of REQUESTS requests each, one line of ALGORITHM
//!     (rate=100000000r/s burst=65536, bench/conf/rlredis.conf's admit
//!     path), each request a client of its own out of CLIENTS, the same
//!     clients HITS calls in a row, then the next ones; one command a
//!     line, its words separated by tabs
//! ```
//!
//! The keys and arguments are written by rl-core's own `write_state_key`
//! and `write_args`, as src/redis_zone/script.rs writes them: Redis' clock
//! (no `now`), committing under a memo key of its own (mode "2"), with a
//! deadline a day from now (a microsecond later each call, as nginx's
//! deadlines differ from call to call).

use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use rl_core::limit::{Algorithm, Limit};
use rl_core::parse::Rate;
use rl_core::redis::{
    function_library, function_name, tag_of, write_args, write_memo_key, write_state_key, Call, LineArg,
};

/// The module's default key prefix.
const PREFIX: &str = "rl:";
/// A line id (any: a location's line has one of its own).
const LINE_ID: u64 = 0x5eed_0000_0000_0001;

fn usage() -> ExitCode {
    eprintln!("usage: redis_calls library | redis_calls fcall ALGORITHM REQUESTS CLIENTS CALLS HITS");
    ExitCode::FAILURE
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("library") => {
            print!("{}", function_library());
            ExitCode::SUCCESS
        }
        Some("fcall") => {
            let num = |i: usize| args.get(i).and_then(|n| n.parse::<u64>().ok()).filter(|&n| n > 0);
            let (Some(algorithm), Some(requests), Some(clients), Some(calls), Some(hits)) =
                (args.get(2).and_then(|a| a.parse::<Algorithm>().ok()), num(3), num(4), num(5), num(6))
            else {
                return usage();
            };
            let limit = match Limit::new(algorithm, Rate { count: 100_000_000, period_us: 1_000_000 }, 65_536) {
                Ok(l) => l,
                Err(e) => {
                    eprintln!("{e}");
                    return ExitCode::FAILURE;
                }
            };
            fcalls(limit, requests, clients, calls, hits);
            ExitCode::SUCCESS
        }
        _ => usage(),
    }
}

/// Prints `calls` FCALLs of `requests` one-line requests on `limit`, each
/// set of clients `hits` calls in a row.
fn fcalls(limit: Limit, requests: u64, clients: u64, calls: u64, hits: u64) {
    let day_us = 86_400_000_000u64;
    let now_us = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_micros() as u64).unwrap_or(0);
    let name = function_name();
    let line = LineArg::from((limit, 1));
    for c in 0..calls {
        let call = Call { commit: true, now_us: None, deadline_us: Some(now_us + day_us + c), memo: true };
        let mut words = vec!["FCALL".to_owned(), name.clone(), (requests + 1).to_string()];
        for r in 0..requests {
            let client = (c / hits * requests + r) % clients;
            let mut key = String::new();
            write_state_key(&mut key, PREFIX, tag_of(format!("user-{client}").as_bytes()), LINE_ID);
            words.push(key);
        }
        // The call's memo key, after the state keys, as nginx names it (a
        // name per run: each row's calls are new calls).
        let mut memo = String::new();
        write_memo_key(&mut memo, &words[3], (now_us, c));
        words.push(memo);
        let batch = (0..requests).map(|_| [line]);
        write_args(batch, call, |a| words.push(a.to_string()));
        println!("{}", words.join("\t"));
    }
}
