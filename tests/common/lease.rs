//! What the lease tests (`lease.rs`, `lease_lines.rs`) share: their load,
//! what they read of nginx, and what they hold admissions to (the exact
//! line's model, and its envelope over any span of time).

use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::{concurrent, get};

/// The wall clock in µs: when a request was sent or answered, across the
/// client threads.
pub fn wall_us() -> u64 {
    let d = SystemTime::now().duration_since(UNIX_EPOCH).expect("after 1970");
    d.as_micros() as u64
}

/// What the exact line `limit` admits of one key's requests (by when they
/// were sent): rl-core's model, as Redis runs it in exact mode.
pub fn exact_admits(limit: &rl_core::limit::Limit, sent: &[u64]) -> usize {
    let mut state = vec![0; limit.state_words()];
    sent.iter().filter(|&&t| limit.acquire(&mut state, t, 1).admitted).count()
}

/// Admissions of one key (when sent, when answered) above what a line of
/// `burst` and `per_s` a second lets through in any span of time: the
/// requests sent at or after one's sending and answered by another's
/// answer were all decided in between, and a line admits at most its
/// burst and what its rate refills over a span (and one more, for the
/// rounding of the state to whole µs). Returns the worst span found
/// beyond it: (its admissions, its µs, the most allowed).
pub fn beyond_envelope(admitted: &[(u64, u64)], burst: u64, per_s: u64) -> Option<(usize, u64, u64)> {
    let mut worst = None;
    for &(from, _) in admitted {
        let mut ends: Vec<u64> = admitted.iter().filter(|(s, _)| *s >= from).map(|(_, g)| *g).collect();
        ends.sort_unstable();
        for (k, &to) in ends.iter().enumerate() {
            let span = to.saturating_sub(from);
            let most = burst + per_s * span / 1_000_000 + 1;
            if k as u64 + 1 > most {
                worst = Some((k + 1, span, most));
            }
        }
    }
    worst
}

/// Requests for `path` with key `key` (`X-K`) on every nginx of `ports`,
/// `per_round` at once on each, a round every `gap` for `rounds` rounds
/// (open loop: a round does not wait for the last): the statuses of all.
pub fn load(ports: &[u16], path: &'static str, rounds: usize, per_round: usize, gap: Duration, key: &str) -> Vec<u16> {
    let got = Arc::new(Mutex::new(Vec::new()));
    let mut handles = Vec::new();
    let start = Instant::now();
    for round in 0..rounds {
        let at = start + gap * round as u32;
        if let Some(wait) = at.checked_duration_since(Instant::now()) {
            thread::sleep(wait);
        }
        for &port in ports {
            let (got, key) = (got.clone(), key.to_string());
            handles.push(thread::spawn(move || {
                let rs = concurrent(port, per_round, path, &[("X-K", key.as_str())]);
                got.lock().unwrap().extend(rs.iter().map(|r| r.status));
            }));
        }
    }
    for h in handles {
        h.join().unwrap();
    }
    let got = got.lock().unwrap().clone();
    got
}

/// How many of `got` are each status.
pub fn statuses_of(got: &[u16]) -> std::collections::BTreeMap<u16, usize> {
    let mut m = std::collections::BTreeMap::new();
    for s in got {
        *m.entry(*s).or_insert(0) += 1;
    }
    m
}

/// `n` requests one after another on `port`, each with key `key` (`X-K`):
/// their statuses and `X-RateLimit-Remaining` values.
pub fn sequential(port: u16, n: usize, path: &str, key: &str) -> Vec<(u16, Option<u64>)> {
    (0..n)
        .map(|_| {
            let r = get(port, path, &[("X-K", key)]);
            (r.status, r.header("X-RateLimit-Remaining").and_then(|v| v.parse().ok()))
        })
        .collect()
}

/// The value of the metric `name` of zone `zone` of nginx on `port`.
pub fn metric(port: u16, name: &str, zone: &str) -> u64 {
    let body = get(port, "/metrics", &[]).body;
    let series = format!("{name}{{zone=\"{zone}\"}} ");
    body.lines()
        .find_map(|l| l.strip_prefix(series.as_str()))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {series} in {body}"))
}
