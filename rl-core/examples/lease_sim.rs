//! Simulates one nginx's leases of a `fixed` line on many keys (Zipf's
//! law, as `make bench`'s `*_z10k` rows draw them) against a Redis that
//! never runs out, to see what lease mode sends Redis per request: the
//! requests no lease holds (decided by Redis), the keys the syncs carry,
//! and the units granted and given back. It drives rl-core's `Kept` as
//! `src/lease.rs` and `src/lease/sync.rs` do, on a simulated clock.
//!
//! cargo run --release -p rl-core --example lease_sim -- [req/s] [keys] [window s] [life s] [secs]
//!
//! (`secs` in whole windows, for a fair share of windows' starts)

use rl_core::lease::{Horizon, Kept, Leasing, Local};
use rl_core::limit::{Algorithm, Limit};
use rl_core::parse::Rate;
use rl_core::redis::LeaseGrant;

const SYNC: u64 = 100_000;
const TIMEOUT: u64 = 50_000;
/// How long Redis takes to answer a request's call, and a sync's.
const RTT_REQ: u64 = 500;
const RTT_SYNC: u64 = 2_000;

#[derive(Default, Debug, Clone, Copy)]
struct Counts {
    requests: u64,
    leased: u64,
    redis: u64,
    asked_with: u64,
    sync_keys: u64,
    only_back: u64,
    granted: u64,
    returned: u64,
}

/// A small deterministic generator (xorshift64*).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545F4914F6CDD1D) >> 11) as f64 / (1u64 << 53) as f64
    }
    fn exp(&mut self, rate_per_us: f64) -> u64 {
        (-(1.0 - self.next()).ln() / rate_per_us) as u64 + 1
    }
}

fn grant(leasing: &Leasing, now: u64, want: u64) -> LeaseGrant {
    let end = leasing.end(now);
    LeaseGrant {
        units: want,
        // (a `fixed` line's: its window k + 1, and what it counted)
        words: (now / leasing.line().window_us() + 1, 1),
        life_us: end - now,
        remaining: 1 << 40,
        reset_us: end - now,
        taken_back: true,
        at_us: now,
    }
}

/// One key at `rate` requests a second for `secs` (counted after `warm`).
fn key(rate: f64, leasing: &Leasing, life: u64, warm: u64, secs: u64, rng: &mut Rng) -> Counts {
    let mut c = Counts::default();
    let mut k = Kept::default();
    let end = (warm + secs) * 1_000_000;
    let per_us = rate / 1e6;
    let mut next_req = rng.exp(per_us);
    // (the cadence's phase, and the between-syncs every quarter interval)
    let mut tick = (rng.next() * SYNC as f64) as u64 / 4 * 4 + 1;
    let mut cadence = tick + SYNC;
    // pending answers: (at, kind 0 = request grant, 1 = sync grant, sent, want)
    let mut pending: Vec<(u64, u8, u64, u64)> = Vec::new();
    let horizon = |now: u64, next: u64| Horizon {
        next,
        interval: SYNC,
        ends: leasing.end(now).min(now + life),
        wait: SYNC + TIMEOUT,
    };
    loop {
        let at_pending = pending.iter().map(|p| p.0).min().unwrap_or(u64::MAX);
        let now = next_req.min(tick).min(at_pending);
        if now >= end {
            break;
        }
        let count = now >= warm * 1_000_000;
        if now == at_pending {
            let i = pending.iter().position(|p| p.0 == now).unwrap();
            let (_, kind, sent, want) = pending.swap_remove(i);
            let g = grant(leasing, sent, want);
            if kind == 0 {
                if want > 0 {
                    k.answered(Some(&g));
                }
                k.seen(now, sent, g.remaining, g.reset_us);
            } else {
                k.granted(sent, &g);
            }
            if count {
                c.granted += want;
            }
        } else if now == next_req {
            next_req = now + rng.exp(per_us);
            if count {
                c.requests += 1;
            }
            match k.decide(now, 1) {
                Local::Spent { .. } => c.leased += count as u64,
                Local::Ask => {
                    let want = k.ask_with(now, horizon(now, now + SYNC), 1);
                    if count {
                        c.redis += 1;
                        c.asked_with += (want > 0) as u64;
                    }
                    pending.push((now + RTT_REQ, 0, now, want));
                }
                other => panic!("{other:?}"),
            }
        } else {
            let regular = now >= cadence;
            if regular {
                cadence = now + SYNC;
            }
            let h = horizon(now, cadence);
            let arg = match regular {
                true => k.sync(now, h, 1),
                false if k.slot.ends_first().is_some_and(|e| e <= now) => k.sync_between(now, h, 1),
                false => None,
            };
            if let Some(a) = arg.and_then(|a| leasing.worth_sending(a, now)) {
                if count {
                    c.sync_keys += 1;
                    c.only_back += (a.want == 0) as u64;
                    c.returned += a.back;
                }
                pending.push((now + RTT_SYNC, 1, now, a.want));
            }
            tick = now + SYNC / 4;
        }
    }
    c
}

fn main() {
    let args: Vec<f64> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let total = args.first().copied().unwrap_or(50_000.0);
    let keys = args.get(1).copied().unwrap_or(10_000.0) as usize;
    let window = args.get(2).copied().unwrap_or(60.0);
    let life_s = args.get(3).copied().unwrap_or(0.15);
    let secs = args.get(4).copied().unwrap_or(30.0) as u64;
    let window_us = (window * 1e6) as u64;
    let limit = Limit::new(Algorithm::Fixed, Rate { count: 10_000_000, period_us: window_us }, 10_000_000).unwrap();
    let life = (life_s * 1e6) as u64;
    let leasing = Leasing::new(limit, life).unwrap();
    let h: f64 = (1..=keys).map(|i| 1.0 / i as f64).sum();
    let mut rng = Rng(0x9E3779B97F4A7C15);
    let mut sum = Counts::default();
    let mut bands = [Counts::default(); 6];
    for i in 1..=keys {
        let rate = total / (i as f64 * h);
        // (counted from a window's start, after one window at least: each window's first
        // requests, which no lease can hold, count as often as the windows in `secs`)
        let c = key(rate, &leasing, life, (window as u64).max(2), secs, &mut rng);
        let b = match rate {
            r if r >= 1000.0 => 0,
            r if r >= 100.0 => 1,
            r if r >= 20.0 => 2,
            r if r >= 5.0 => 3,
            r if r >= 1.0 => 4,
            _ => 5,
        };
        for x in [&mut sum, &mut bands[b]] {
            x.requests += c.requests;
            x.leased += c.leased;
            x.redis += c.redis;
            x.asked_with += c.asked_with;
            x.sync_keys += c.sync_keys;
            x.only_back += c.only_back;
            x.granted += c.granted;
            x.returned += c.returned;
        }
    }
    let s = secs as f64;
    println!("{total} req/s on {keys} keys, window {window} s, life {life_s} s, {secs} s");
    let show = |name: &str, c: &Counts| {
        println!(
            "{name:>10}: {:>9.0} req/s, by Redis {:>6.2}% ({:>7.0}/s, {:.0}/s asking a lease), sync keys {:>7.0}/s ({:.0}/s only giving back), granted {:.2}/req, returned {:.2}/req",
            c.requests as f64 / s,
            100.0 * c.redis as f64 / c.requests.max(1) as f64,
            c.redis as f64 / s,
            c.asked_with as f64 / s,
            c.sync_keys as f64 / s,
            c.only_back as f64 / s,
            c.granted as f64 / c.requests.max(1) as f64,
            c.returned as f64 / c.requests.max(1) as f64,
        )
    };
    for (name, b) in [">=1000/s", ">=100/s", ">=20/s", ">=5/s", ">=1/s", "<1/s"].iter().zip(&bands) {
        show(name, b);
    }
    show("all", &sum);
}
