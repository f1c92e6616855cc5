//! Limits hold through what production does to nginx: reload storms under
//! load, and workers killed under load.
//!
//! `RL_SOAK=N` (an integer, default 1; `make soak` sets it) makes the storm
//! and the kills N times longer: 30 × N reloads, 5 × N kills, and as many
//! requests a load thread at most; the number of load threads stays the same.

mod common;

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::*;

/// Keys the load spreads over.
const KEYS: usize = 4;
/// Every line admits this many per key and per state (10 an hour: nothing refills during a test).
const BURST: u64 = 10;

/// The factor `RL_SOAK` sets: how many times longer the loops run (1 unless set).
fn soak() -> usize {
    std::env::var("RL_SOAK").ok().and_then(|s| s.trim().parse().ok()).filter(|&n: &usize| n >= 1).unwrap_or(1)
}

/// How many requests got each status, by (path, key, status; 0 = no response).
type Seen = BTreeMap<(&'static str, usize, u16), u64>;

/// Requests on every path and key, from `threads` threads, until `stop`;
/// returns how many of each (path, key) got each status.
fn load(
    port: u16,
    paths: &'static [&'static str],
    threads: usize,
    stop: Arc<AtomicBool>,
) -> Vec<thread::JoinHandle<Seen>> {
    (0..threads)
        .map(|t| {
            let stop = stop.clone();
            thread::spawn(move || {
                let mut seen = BTreeMap::new();
                // Bounded: at most this many requests a thread, whatever happens.
                for i in t..t + 200_000 * soak() {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let (path, key) = (paths[i % paths.len()], i / paths.len() % KEYS);
                    let status = match try_get(port, path, &[("X-Key", &format!("k{key}"))]) {
                        Ok(r) => r.status,
                        Err(_) => 0,
                    };
                    *seen.entry((path, key, status)).or_insert(0) += 1;
                }
                seen
            })
        })
        .collect()
}

fn merge(handles: Vec<thread::JoinHandle<Seen>>) -> Seen {
    let mut all = BTreeMap::new();
    for h in handles {
        for (k, v) in h.join().expect("load thread") {
            *all.entry(k).or_insert(0) += v;
        }
    }
    all
}

/// The configuration of reload `i` of the storm:
/// - `/keep.html`: a line on zone `keep`, the same in every configuration,
///   beside a looser line on the same zone that comes and goes;
/// - `/resize.html`: a line on zone `resize`, whose size changes every
///   other reload (nginx lays out a new zone: fresh states);
/// - `/alg.html`: a line on zone `alg` whose algorithm changes every third
///   reload (a changed line: fresh states).
fn storm_conf(i: usize) -> String {
    let line = |zone: &str, alg: &str| {
        format!("rl_limit zone={zone} key=$http_x_key rate={BURST}r/h burst={BURST} algorithm={alg};")
    };
    let extra = if i % 2 == 1 {
        "rl_limit zone=keep key=$http_x_key rate=1000r/h burst=1000 algorithm=token_bucket;"
    } else {
        ""
    };
    let size = if (i / 2).is_multiple_of(2) { "1m" } else { "2m" };
    let alg = ["fixed", "gcra", "sliding"][(i / 3) % 3];
    server(
        &format!("rl_zone keep size=1m; rl_zone resize size={size}; rl_zone alg size=1m;"),
        &format!(
            "location = /keep.html {{ {} {extra} }}\n\
             location = /resize.html {{ {} }}\n\
             location = /alg.html {{ {} }}",
            line("keep", "sliding_log"),
            line("resize", "token_bucket"),
            line("alg", alg),
        ),
    )
}

const PAGES: &[&str] = &["/keep.html", "/resize.html", "/alg.html"];

/// 30 reloads (× `RL_SOAK`) under load that add and remove lines, change a line's
/// algorithm and change a zone's size: every request is limited by the old
/// or the new configuration. A key gets at most one fresh budget per reload
/// that resets its state (a new zone, a changed line), and none on a line
/// and zone that stay the same; no 5xx, no alert, crit or emerg.
#[test]
fn reload_storm_under_load() {
    let reloads = 30 * soak();
    let mut setup = Nginx::setup(&storm_conf(0));
    for p in PAGES {
        setup = setup.file(&format!("html{p}"), "page\n");
    }
    let mut ngx = setup.start();
    let stop = Arc::new(AtomicBool::new(false));
    let handles = load(ngx.port, PAGES, 4, stop.clone());
    let (mut resizes, mut alg_changes) = (0u64, 0u64);
    let started = Instant::now();
    for i in 1..=reloads {
        ngx.reload_with(&storm_conf(i));
        resizes += u64::from((i / 2) % 2 != ((i - 1) / 2) % 2);
        alg_changes += u64::from((i / 3) % 3 != ((i - 1) / 3) % 3);
        thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, Ordering::Relaxed);
    let seen = merge(handles);
    let took = started.elapsed();

    let count = |path: &str, key: usize, status: u16| seen.get(&(path, key, status)).copied().unwrap_or(0);
    let summary = format!("{resizes} resizes, {alg_changes} algorithm changes in {took:?}: {seen:?}");
    for key in 0..KEYS {
        assert_eq!(count("/keep.html", key, 200), BURST, "an unchanged line lost its state: {summary}");
        assert!(count("/resize.html", key, 200) <= BURST * (1 + resizes), "{summary}");
        assert!(count("/alg.html", key, 200) <= BURST * (1 + alg_changes), "{summary}");
        for p in PAGES {
            assert!(count(p, key, 429) > 0, "no request on {p} was limited: {summary}");
        }
    }
    let other: Vec<_> = seen.iter().filter(|((_, _, s), _)| *s != 200 && *s != 429).collect();
    // A connection a draining worker closes may fail (status 0); never a 5xx.
    assert!(other.iter().all(|((_, _, s), _)| *s == 0), "{other:?}");
    let log = ngx.error_log();
    let bad: Vec<&str> = log
        .lines()
        .filter(|l| {
            l.contains("[alert]")
                || l.contains("[crit]")
                || l.contains("[emerg]")
                || l.contains("exited on signal")
                || l.contains("is not initialised")
        })
        .take(5)
        .collect();
    assert!(bad.is_empty(), "{bad:?}");
}

/// Workers killed with SIGKILL under load, five times (× `RL_SOAK`): the master starts
/// new ones, the zone's lock is released (nginx unlocks a dead worker's
/// mutexes), and the count stays exact: at most `burst` admitted, and every
/// unit of the budget is either a 200 or a request the killed worker took
/// down with it.
#[test]
fn kill_9_workers_under_load() {
    let ngx = Nginx::start(&server(
        "rl_zone z size=1m;",
        "location / { rl_limit zone=z key=$http_x_key rate=100r/h burst=100 algorithm=gcra; }",
    ));
    let stop = Arc::new(AtomicBool::new(false));
    let handles = load(ngx.port, &["/index.html"], 6, stop.clone());
    let killed = Mutex::new(0);
    let kills = 5 * soak();
    for _ in 0..kills {
        thread::sleep(Duration::from_millis(150));
        if let Some(pid) = ngx.worker_pids().first() {
            let ok = Command::new("kill").args(["-KILL", &pid.to_string()]).status().is_ok_and(|s| s.success());
            *killed.lock().unwrap() += u32::from(ok);
        }
    }
    thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    let seen = merge(handles);
    let killed = *killed.lock().unwrap();
    assert!(killed as usize * 5 >= kills * 3, "only {killed} of {kills} workers killed");
    for key in 0..KEYS {
        let get = |status: u16| seen.get(&("/index.html", key, status)).copied().unwrap_or(0);
        let (ok, lost) = (get(200), get(0));
        assert!(ok <= 100, "key {key}: {ok} admitted with burst=100: {seen:?}");
        // Check what is left: a key whose 100 units went to 200s and lost requests.
        let r = ngx.get("/index.html", &[("X-Key", &format!("k{key}"))]);
        assert_eq!(r.status, 429, "key {key}: budget left after {ok} admitted: {seen:?}");
        assert!(ok + lost >= 100, "key {key}: {ok} admitted + {lost} lost < 100 charged: {seen:?}");
    }
    let log = ngx.error_log();
    let signals = log.lines().filter(|l| l.contains("exited on signal 9")).count();
    assert!(signals as u32 >= killed, "{log}");
    // A worker killed while it held the zone's lock: nginx's master unlocks it and says so
    // (ngx_unlock_mutexes), as it would for limit_req's zone. Any other alert is ours.
    let unlocked = |l: &str| l.contains("shared memory zone \"z\" was locked by ");
    let bad: Vec<&str> =
        log.lines().filter(|l| l.contains("[alert]") && !l.contains("exited on signal 9") && !unlocked(l)).collect();
    assert!(bad.is_empty(), "{bad:?}");
}
