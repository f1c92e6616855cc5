//! Shedding by class in front of a slow upstream (#39 §3), the recipe
//! `nginx-conf/priority.conf` as it is: an upstream that serves 200
//! requests a second (20 at once, 100 ms each) is offered 400 a second, a
//! fifth of them premium. `rl_conn` with the upstream's 20 as `max`, a
//! reserve for premium and a waiting line premium alone may use: premium
//! keeps at least 99% success and a p99 latency within twice the unloaded
//! one, standard is refused first, and the upstream never has more than 20
//! requests at once.
//!
//! The load is open: each request leaves at its own time, whatever the
//! others' fate, from a pool of client threads.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::conf_nginx::ConfNginx;
use common::*;

/// Requests the upstream serves at once, and how long each takes.
const WORKERS: usize = 20;
const SERVICE: Duration = Duration::from_millis(100);

/// An upstream of [`WORKERS`] workers: requests beyond them wait for one
/// (as a real server's backlog does). Counts the most requests it had at
/// once, waiting or served.
struct Upstream {
    port: u16,
    most: Arc<AtomicUsize>,
}

fn upstream() -> Upstream {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let most = Arc::new(AtomicUsize::new(0));
    let now = Arc::new(AtomicUsize::new(0));
    let free = Arc::new((Mutex::new(WORKERS), Condvar::new()));
    let m = most.clone();
    thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let (most, now, free) = (m.clone(), now.clone(), free.clone());
            thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut line = String::new();
                while reader.read_line(&mut line).is_ok_and(|n| n > 0) && line != "\r\n" {
                    line.clear();
                }
                let at_once = now.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(at_once, Ordering::SeqCst);
                let (lock, cv) = &*free;
                let mut n = lock.lock().unwrap();
                while *n == 0 {
                    n = cv.wait(n).unwrap();
                }
                *n -= 1;
                drop(n);
                thread::sleep(SERVICE);
                *lock.lock().unwrap() += 1;
                cv.notify_one();
                now.fetch_sub(1, Ordering::SeqCst);
                let _ = stream.write_all(b"HTTP/1.0 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nok\n");
            });
        }
    });
    Upstream { port, most }
}

/// One request's fate: premium or not, its status, its latency.
struct Fate {
    premium: bool,
    status: u16,
    took: Duration,
}

/// Sends `n` requests at `rate` a second, every `premium_every`-th one
/// premium, from `threads` client threads.
fn offer(port: u16, n: usize, rate: u64, premium_every: usize, threads: usize) -> Vec<Fate> {
    let start = Instant::now() + Duration::from_millis(50);
    let fates = Arc::new(Mutex::new(Vec::with_capacity(n)));
    let mut handles = Vec::new();
    for t in 0..threads {
        let fates = fates.clone();
        handles.push(thread::spawn(move || {
            for i in (t..n).step_by(threads) {
                let at = start + Duration::from_micros(i as u64 * 1_000_000 / rate);
                if let Some(wait) = at.checked_duration_since(Instant::now()) {
                    thread::sleep(wait);
                }
                let premium = i % premium_every == 0;
                let plan = [("X-Plan", if premium { "premium" } else { "standard" })];
                let sent = Instant::now();
                let status = try_get(port, &format!("/api/?i={i}"), &plan).map_or(0, |r| r.status);
                fates.lock().unwrap().push(Fate { premium, status, took: sent.elapsed() });
            }
        }));
    }
    for h in handles {
        h.join().unwrap();
    }
    Arc::try_unwrap(fates).ok().unwrap().into_inner().unwrap()
}

fn p99(mut took: Vec<Duration>) -> Duration {
    took.sort();
    took[(took.len() * 99).div_ceil(100) - 1]
}

#[test]
fn premium_keeps_its_service_while_standard_is_shed() {
    let up = upstream();
    let backend = format!("127.0.0.1:{}", up.port);
    let ngx = ConfNginx::start_with("priority.conf", &[], &[("127.0.0.1:9000", &backend)]);
    // Unloaded: premium alone, 20 a second.
    let quiet = offer(ngx.port, 60, 20, 1, 8);
    assert!(
        quiet.iter().all(|f| f.status == 200),
        "unloaded: {:?}",
        quiet.iter().map(|f| f.status).collect::<Vec<_>>()
    );
    let quiet_p99 = p99(quiet.iter().map(|f| f.took).collect());
    // Twice the upstream's capacity, a fifth premium, for 5 s.
    let loaded = offer(ngx.port, 2000, 400, 5, 96);
    let (premium, standard): (Vec<&Fate>, Vec<&Fate>) = loaded.iter().partition(|f| f.premium);
    let ok = |fs: &[&Fate]| fs.iter().filter(|f| f.status == 200).count();
    let shed = |fs: &[&Fate]| fs.iter().filter(|f| f.status == 503).count();
    let premium_ok = ok(&premium) as f64 / premium.len() as f64;
    let premium_p99 = p99(premium.iter().filter(|f| f.status == 200).map(|f| f.took).collect());
    let report = format!(
        "premium: {}/{} ok, p99 {premium_p99:?} (unloaded {quiet_p99:?}); standard: {} ok, {} shed of {}; \
         upstream at most {} at once",
        ok(&premium),
        premium.len(),
        ok(&standard),
        shed(&standard),
        standard.len(),
        up.most.load(Ordering::SeqCst)
    );
    eprintln!("{report}");
    assert!(premium_ok >= 0.99, "{report}");
    assert!(premium_p99 <= quiet_p99 * 2, "{report}");
    assert!(shed(&standard) > standard.len() / 4, "standard is shed first: {report}");
    assert_eq!(ok(&standard) + shed(&standard), standard.len(), "{report}");
    assert!(up.most.load(Ordering::SeqCst) <= WORKERS, "beyond the cap: {report}");
    // What the upstream served is what it can: about 200 a second for 5 s.
    let served = ok(&premium) + ok(&standard);
    assert!(served <= 1100, "{report}");
    // The metrics count each class's verdicts (the unloaded premium requests too).
    let m = ngx.get("/metrics", &[]).body;
    promtool_check_metrics(&m);
    let class = |c: &str, r: &str| -> usize {
        m.lines()
            .filter(|l| {
                l.starts_with("nginx_rl_class_requests_total{zone=\"backend\",")
                    && l.contains(&format!("class=\"{c}\",result=\"{r}\"}}"))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<usize>().ok())
            .sum()
    };
    assert_eq!(class("premium", "passed") + class("premium", "delayed"), ok(&premium) + quiet.len(), "{m}");
    assert_eq!(class("standard", "rejected"), shed(&standard), "{m}");
    assert_eq!(class("standard", "passed"), ok(&standard), "{m}");
}
