//! Applied once, counted truly (issue #37, part 2): with a proxy of the
//! test's own between nginx and Redis (`common/cutting_proxy.rs`) that
//! loses Redis' replies to script calls after Redis ran them, under load,
//! Redis must hold exactly the sum of the costs nginx admitted: no call
//! applied twice (a call whose reply was lost, sent again), no request
//! answered per `on_error` left charged.
//!
//! The truth is Redis itself: one line that never rejects on its own
//! (`fixed`, a burst of a billion units, windows of a billion / 1000r/h =
//! 114 years: the first one, 1970 to 2084, holds every run), one key, so
//! that its state's count is the sum of the costs charged; each request
//! has a cost of its own (1, 2, 3, ...), so that a cost charged twice shows
//! in the sum. A request is admitted when it is answered 200 (a static
//! file: the access phase runs); `on_error=deny` answers `rl_status`, 429.

mod common;

use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::cutting_proxy::{Block, CuttingProxy, Filter, Stats};
use common::redis::Redis;
use common::*;

/// The line: never rejects (see the top), cost from `X-Cost`.
const LINE: &str = "key=all rate=1000r/h burst=1000000000 algorithm=fixed cost=$http_x_cost";

/// The zone's key prefix (the default).
const PREFIX: &str = "rl:";

// ---------------------------------------------------------------------------
// Redis, read directly.
// ---------------------------------------------------------------------------

/// A RESP reply, as far as these tests need one.
#[derive(Debug, PartialEq)]
enum Reply {
    Status(String),
    Error(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Vec<Reply>),
}

/// A plain RESP connection (the state is binary: `redis-cli` output is text).
struct Client {
    s: TcpStream,
    buf: Vec<u8>,
}

impl Client {
    fn connect(port: u16) -> io::Result<Client> {
        let s = TcpStream::connect((Ipv4Addr::LOCALHOST, port))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        Ok(Client { s, buf: Vec::new() })
    }

    fn send(&mut self, args: &[&[u8]]) -> io::Result<()> {
        let mut out = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            out.extend_from_slice(a);
            out.extend_from_slice(b"\r\n");
        }
        self.s.write_all(&out)
    }

    fn cmd(&mut self, args: &[&[u8]]) -> io::Result<Reply> {
        self.send(args)?;
        self.reply()
    }

    fn line(&mut self) -> io::Result<Vec<u8>> {
        loop {
            if let Some(i) = self.buf.windows(2).position(|w| w == b"\r\n") {
                let l = self.buf[..i].to_vec();
                self.buf.drain(..i + 2);
                return Ok(l);
            }
            self.fill()?;
        }
    }

    fn fill(&mut self) -> io::Result<()> {
        let mut chunk = [0u8; 16 * 1024];
        let n = self.s.read(&mut chunk)?;
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "connection closed"));
        }
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(())
    }

    fn reply(&mut self) -> io::Result<Reply> {
        let l = self.line()?;
        let (kind, rest) = l.split_first().ok_or_else(|| io::Error::other("empty reply line"))?;
        let text = String::from_utf8_lossy(rest).into_owned();
        let num = || text.parse::<i64>().map_err(|_| io::Error::other(format!("bad number {text:?}")));
        match kind {
            b'+' => Ok(Reply::Status(text.clone())),
            b'-' => Ok(Reply::Error(text.clone())),
            b':' => Ok(Reply::Int(num()?)),
            b'$' => {
                let n = num()?;
                if n < 0 {
                    return Ok(Reply::Bulk(None));
                }
                let n = n as usize;
                while self.buf.len() < n + 2 {
                    self.fill()?;
                }
                let data = self.buf[..n].to_vec();
                self.buf.drain(..n + 2);
                Ok(Reply::Bulk(Some(data)))
            }
            b'*' => {
                let n = num()?;
                (0..n.max(0)).map(|_| self.reply()).collect::<io::Result<_>>().map(Reply::Array)
            }
            _ => Err(io::Error::other(format!("unexpected reply line {:?}", String::from_utf8_lossy(&l)))),
        }
    }
}

/// Whether `key` is a line's state key: `PREFIX{16 hex}:16 hex`.
fn is_state_key(key: &[u8]) -> bool {
    let Some(rest) = key.strip_prefix(PREFIX.as_bytes()) else { return false };
    let hex = |b: &[u8]| b.len() == 16 && b.iter().all(u8::is_ascii_hexdigit);
    rest.len() == 35 && rest[0] == b'{' && hex(&rest[1..17]) && &rest[17..19] == b"}:" && hex(&rest[19..])
}

/// Every state key of the line's and its state: a string, checked to be
/// a `fixed` window's (a 0 byte, then little-endian doubles, [window + 1,
/// count], then the key's expiry in ms); its key `PREFIX{tag}:line` (other
/// keys, of other shapes, are not looked at).
fn states(redis: &Redis) -> Vec<(String, [f64; 2])> {
    let mut c = Client::connect(redis.port).expect("cannot connect to redis-server");
    let pattern = format!("{PREFIX}*");
    let Reply::Array(keys) = c.cmd(&[b"KEYS", pattern.as_bytes()]).unwrap() else { panic!("KEYS: not an array") };
    let mut states = Vec::new();
    for key in keys {
        let Reply::Bulk(Some(key)) = key else { continue };
        if !is_state_key(&key) {
            continue;
        }
        let name = String::from_utf8_lossy(&key).into_owned();
        match c.cmd(&[b"GET", &key]).unwrap() {
            Reply::Bulk(Some(v)) if v.len() == 1 + 8 * 3 && v[0] == 0 => {
                let word = |i: usize| f64::from_le_bytes(v[1 + 8 * i..9 + 8 * i].try_into().unwrap());
                let (window, count) = (word(0), word(1));
                assert!(window == 1.0 && count >= 0.0 && count.fract() == 0.0, "{name}: state [{window}, {count}]");
                states.push((name, [window, count]));
            }
            other => panic!("{name}: not a fixed window's state: {other:02x?}"),
        }
    }
    states
}

/// What Redis has charged the line of one key: the count of its fixed
/// window (0 before anything is).
fn charged(redis: &Redis) -> u64 {
    let states = states(redis);
    assert!(states.len() <= 1, "one line, one key: one state expected, Redis has {states:?}");
    states.first().map_or(0, |(_, [_, count])| *count as u64)
}

/// What Redis has charged a line of many keys: their counts, summed.
fn charged_all(redis: &Redis) -> u64 {
    states(redis).iter().map(|(_, [_, count])| *count as u64).sum()
}

/// Waits until nothing is in flight through the proxy and Redis' count has
/// not changed for `settle` (polled, not slept through): the count. Fails
/// if it is still changing after 20 s.
fn settled(redis: &Redis, proxy: &CuttingProxy, settle: Duration) -> u64 {
    settled_by(charged, redis, proxy, settle)
}

/// [`settled`], Redis' count read by `count`.
fn settled_by(count: fn(&Redis) -> u64, redis: &Redis, proxy: &CuttingProxy, settle: Duration) -> u64 {
    let give_up = Instant::now() + Duration::from_secs(20);
    let mut last = (count(redis), Instant::now());
    loop {
        thread::sleep(Duration::from_millis(50));
        let now = count(redis);
        if now != last.0 || proxy.outstanding() > 0 {
            last = (now, Instant::now());
        } else if last.1.elapsed() >= settle {
            return now;
        }
        assert!(
            Instant::now() < give_up,
            "Redis' count still changing after 20 s ({now}; {} calls in flight)",
            proxy.outstanding()
        );
    }
}

// ---------------------------------------------------------------------------
// Load, and the verdict.
// ---------------------------------------------------------------------------

/// Requests of costs 1, 2, 3, ... (`X-Cost`, the next from `next`):
/// `concurrency` clients, each sending GET `/index.html` on a connection
/// of its own, then pausing 10 ms, until `dur` has passed: (cost, status)
/// of each.
fn load(port: u16, next: &Arc<AtomicU64>, dur: Duration, concurrency: usize) -> Vec<(u64, u16)> {
    let until = Instant::now() + dur;
    let threads: Vec<_> = (0..concurrency)
        .map(|_| {
            let next = next.clone();
            thread::spawn(move || {
                let mut out = Vec::new();
                while Instant::now() < until {
                    let cost = next.fetch_add(1, Ordering::SeqCst);
                    let r = try_get(port, "/index.html", &[("X-Cost", &cost.to_string())])
                        .unwrap_or_else(|e| panic!("GET with cost {cost}: {e}"));
                    out.push((cost, r.status));
                    thread::sleep(Duration::from_millis(10));
                }
                out
            })
        })
        .collect();
    let mut out: Vec<(u64, u16)> =
        threads.into_iter().flat_map(|t| t.join().expect("a client thread panicked")).collect();
    out.sort();
    out
}

/// Costs from 1 on.
fn costs() -> Arc<AtomicU64> {
    Arc::new(AtomicU64::new(1))
}

/// How many requests had each status.
fn by_status(results: &[(u64, u16)]) -> BTreeMap<u16, usize> {
    let mut m = BTreeMap::new();
    for (_, s) in results {
        *m.entry(*s).or_insert(0) += 1;
    }
    m
}

/// The sum of the costs of the requests answered 200.
fn admitted(results: &[(u64, u16)]) -> u64 {
    results.iter().filter(|(_, s)| *s == 200).map(|(c, _)| c).sum()
}

/// Redis must hold exactly what nginx admitted.
fn assert_applied_once(what: &str, in_redis: u64, results: &[(u64, u16)], stats: &Stats, ngx: &Nginx) {
    let owed = admitted(results);
    let all: u64 = results.iter().map(|(c, _)| c).sum();
    let answered: Vec<u64> = results.iter().filter(|(_, s)| *s != 200).map(|(c, _)| *c).take(20).collect();
    let diff = in_redis as i64 - owed as i64;
    let why = if diff > 0 {
        "charged beyond what nginx admitted (calls applied twice, or requests answered per on_error left charged)"
    } else {
        "admitted without being charged"
    };
    assert!(
        in_redis == owed,
        "{what}: Redis holds {in_redis} units, the requests nginx answered 200 cost {owed}: {} units {why}; \
         {} requests {:?} costing {all} in all, the costs of the first (at most 20) not answered 200: {answered:?}; \
         proxy: {stats:?}; Redis failures logged: {}",
        diff.abs(),
        results.len(),
        by_status(results),
        failed_lines(&ngx.error_log(), "r").len(),
    );
}

/// No worker crashed, the proxy understood every byte, and it did cut.
fn assert_sane(stats: &Stats, ngx: &Nginx) {
    let log = ngx.error_log();
    assert!(crash_lines(&log).is_empty(), "{:?}", crash_lines(&log));
    assert_eq!(stats.protocol_errors, 0, "the proxy met bytes it could not follow: {stats:?}");
    assert!(stats.cuts > 0, "the proxy cut no reply: the test proved nothing: {stats:?}");
}

/// nginx on the proxy: zone `r` with `params`, `/` limited by `line`.
fn nginx(proxy: &CuttingProxy, params: &str, line: &str) -> Nginx {
    Nginx::start(&server(
        &format!("rl_zone r redis={} {params};", proxy.url()),
        &format!("location / {{ rl_limit zone=r {line}; }}"),
    ))
}

// ---------------------------------------------------------------------------
// The proxy itself: it cuts script replies only, after Redis ran the call.
// ---------------------------------------------------------------------------

#[test]
fn proxy_cuts_script_replies_after_redis_ran_them() {
    let redis = Redis::start();
    let proxy = CuttingProxy::start(redis.port);
    proxy.cut_every(2);
    let incr: &[&[u8]] = &[b"eval", b"return redis.call('INCR', KEYS[1])", b"1", b"n"];
    let mut c = Client::connect(proxy.port).unwrap();
    // An inline command and a script call, pipelined; the first eligible reply passes.
    c.s.write_all(b"PING\r\n").unwrap();
    c.send(incr).unwrap();
    assert_eq!(c.reply().unwrap(), Reply::Status("PONG".into()));
    assert_eq!(c.reply().unwrap(), Reply::Int(1));
    assert_eq!(c.cmd(&[b"ECHO", b"x"]).unwrap(), Reply::Bulk(Some(b"x".to_vec())));
    // The second is cut: no reply, the connection closed; Redis ran it.
    let cut = c.cmd(incr);
    assert!(cut.is_err(), "a reply came through: {cut:?}");
    assert_eq!(redis.cli(&["GET", "n"]), "2");
    let s = proxy.stats();
    assert_eq!((s.calls, s.replies, s.cuts, s.protocol_errors), (2, 1, 1, 0), "{s:?}");
    // A filter: only FCALL-like calls whose second word ends with `_charge`.
    proxy.cut_every(1);
    proxy.only_calls(Some(charge_calls()));
    let mut c = Client::connect(proxy.port).unwrap();
    assert_eq!(c.cmd(incr).unwrap(), Reply::Int(3));
    proxy.only_calls(None);
    proxy.stop_cutting();
    // Refused, then blackholed, then through again.
    proxy.block_for(Duration::from_millis(300), Block::Refuse);
    let mut c = Client::connect(proxy.port).unwrap();
    assert!(c.cmd(&[b"PING"]).is_err(), "a refused connection answered");
    proxy.block_for(Duration::from_millis(300), Block::Blackhole);
    let mut c = Client::connect(proxy.port).unwrap();
    c.s.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
    let e = c.cmd(&[b"PING"]).expect_err("a blackholed connection answered");
    assert!(matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut), "{e}");
    while proxy.blocked() {
        thread::sleep(Duration::from_millis(10));
    }
    let mut c = Client::connect(proxy.port).unwrap();
    assert_eq!(c.cmd(&[b"PING"]).unwrap(), Reply::Status("PONG".into()));
    let s = proxy.stats();
    assert_eq!((s.refused, s.blackholed, s.cuts), (1, 1, 1), "{s:?}");
}

/// Cutting by chance: each call cut or not as the seeded RNG draws, the
/// same calls for the same seed; Redis ran every one.
#[test]
fn proxy_cuts_by_seeded_chance() {
    let redis = Redis::start();
    let cut_calls = |seed: u64| -> Vec<usize> {
        let proxy = CuttingProxy::start(redis.port);
        proxy.cut_randomly(0.3, seed);
        let mut cut = Vec::new();
        let mut c = Client::connect(proxy.port).unwrap();
        for i in 0..40 {
            if c.cmd(&[b"EVAL", b"return redis.call('INCR', KEYS[1])", b"1", b"n"]).is_err() {
                cut.push(i);
                c = Client::connect(proxy.port).unwrap();
            }
        }
        assert_eq!(proxy.stats().cuts, cut.len() as u64);
        cut
    };
    let (a, b, other) = (cut_calls(7), cut_calls(7), cut_calls(8));
    assert!(!a.is_empty() && a.len() < 40, "cut {a:?} of 40 at p = 0.3");
    assert_eq!(a, b, "the same seed cuts the same calls");
    assert_ne!(a, other, "another seed, other calls");
    assert_eq!(redis.cli(&["GET", "n"]), "120", "Redis ran every call, cut or not");
}

/// The `charge=after` charge calls: `FCALL rl_..._charge ...`.
fn charge_calls() -> Filter {
    Arc::new(|cmd: &[Vec<u8>]| cmd.get(1).is_some_and(|f| f.ends_with(b"_charge")))
}

/// How long each run sends requests.
const RUN: Duration = Duration::from_secs(5);

/// Connections younger than this are not cut: nginx-rl counts a connection
/// lost before it served a second as a failed attempt and backs off (its
/// requests meanwhile answered per `on_error` without a call), where one
/// lost later is replaced at once, which is the case at hand.
const SERVED: Duration = Duration::from_millis(1100);

/// The control: through the proxy, cutting nothing, Redis holds exactly the
/// costs of the requests answered 200, with either kind of line (what the
/// tests below measure is the cuts' doing, not the measure's).
#[test]
fn nothing_cut_is_counted_exactly() {
    for line in [LINE.to_string(), format!("{LINE} charge=after")] {
        let redis = Redis::start();
        let proxy = CuttingProxy::start(redis.port);
        let ngx = nginx(&proxy, "timeout=2s on_error=deny", &line);
        let results = load(ngx.port, &costs(), Duration::from_secs(2), 8);
        let in_redis = settled(&redis, &proxy, Duration::from_millis(500));
        let stats = proxy.stats();
        assert_eq!((stats.cuts, stats.protocol_errors), (0, 0), "{stats:?}");
        assert!(in_redis > 0, "{line}: nothing charged");
        assert_applied_once(&format!("nothing cut, {line}"), in_redis, &results, &stats, &ngx);
    }
}

// ---------------------------------------------------------------------------
// 1. Check-and-commit calls.
// ---------------------------------------------------------------------------

/// 8 clients for 5 s; on each connection open for a second, every 7th
/// script reply is lost after Redis ran the call: whatever nginx does
/// about it, Redis holds exactly the costs of the requests answered 200.
#[test]
fn check_and_commit_calls_are_applied_once() {
    let redis = Redis::start();
    let proxy = CuttingProxy::start(redis.port);
    let ngx = nginx(&proxy, "timeout=2s on_error=deny", LINE);
    proxy.only_connections_older_than(SERVED);
    proxy.cut_every(7);
    let results = load(ngx.port, &costs(), RUN, 8);
    proxy.stop_cutting();
    let in_redis = settled(&redis, &proxy, Duration::from_millis(500));
    let stats = proxy.stats();
    assert_sane(&stats, &ngx);
    let ok = by_status(&results).get(&200).copied().unwrap_or(0);
    assert!(ok * 2 >= results.len(), "most requests should pass: {:?}; proxy: {stats:?}", by_status(&results));
    assert_applied_once("check-and-commit calls, every 7th reply cut", in_redis, &results, &stats, &ngx);
}

// ---------------------------------------------------------------------------
// 2. charge=after: the charge calls.
// ---------------------------------------------------------------------------

/// `charge=after`: each request is admitted (a unit is left), and charged
/// its cost when it is logged, in a call of its own. On each connection
/// open for a second, every 5th charge call alone on it loses its reply
/// (alone: no check call is lost with it, so every request is admitted).
/// Once the charges are all in, Redis holds the sum of every cost, once.
#[test]
fn charge_after_calls_are_applied_once() {
    let redis = Redis::start();
    let proxy = CuttingProxy::start(redis.port);
    let ngx = nginx(&proxy, "timeout=2s on_error=deny", &format!("{LINE} charge=after"));
    proxy.only_calls(Some(charge_calls()));
    proxy.only_lone_calls(true);
    proxy.only_connections_older_than(SERVED);
    proxy.cut_every(5);
    let results = load(ngx.port, &costs(), RUN, 8);
    let in_redis = settled(&redis, &proxy, Duration::from_millis(500));
    proxy.stop_cutting();
    let stats = proxy.stats();
    assert_sane(&stats, &ngx);
    assert_applied_once("charge=after calls, every 5th lone charge reply cut", in_redis, &results, &stats, &ngx);
    assert_eq!(by_status(&results), counts(&[(200, results.len())]), "every request admitted; proxy: {stats:?}");
}

/// A charge whose reply is lost late: Redis ran it, and its connection
/// breaks 11 s later, with `timeout=20s`. Its memo (10 s) is gone by then,
/// so a copy sent now would charge again: nginx does not send one (a
/// charge goes again only within 5 s of the first); Redis holds the cost
/// once.
#[test]
fn charge_lost_late_is_not_sent_again() {
    let redis = Redis::start();
    let proxy = CuttingProxy::start(redis.port);
    let ngx = nginx(&proxy, "timeout=20s", &format!("{LINE} charge=after"));
    proxy.only_calls(Some(charge_calls()));
    proxy.hold_before_cut(Duration::from_secs(11));
    proxy.cut_every(1);
    let r = ngx.get("/index.html", &[("X-Cost", "7")]);
    assert_eq!(r.status, 200, "{r:?}");
    let until = Instant::now() + Duration::from_secs(15);
    while proxy.stats().cuts == 0 {
        assert!(Instant::now() < until, "no charge cut: {:?}", proxy.stats());
        thread::sleep(Duration::from_millis(50));
    }
    proxy.stop_cutting();
    let in_redis = settled(&redis, &proxy, Duration::from_millis(500));
    let stats = proxy.stats();
    assert_sane(&stats, &ngx);
    assert_eq!(in_redis, 7, "a cost of 7 charged, as Redis holds it; proxy: {stats:?}");
}

// ---------------------------------------------------------------------------
// 3. Requests answered per on_error.
// ---------------------------------------------------------------------------

/// A short timeout (200 ms), `on_error=deny`: on each connection open for
/// a second, every 20th script reply is lost, and new connections are
/// blackholed for 600 ms after it, so the requests of the lost call (and
/// others) are answered 429 by the timeout. Then the proxy heals, requests
/// go on for a second, and once all is quiet Redis holds the costs of the
/// requests answered 200, and of no other: nginx takes back what its
/// requests answered per `on_error` were charged.
#[test]
fn requests_answered_per_on_error_are_not_charged() {
    let redis = Redis::start();
    let proxy = CuttingProxy::start(redis.port);
    let ngx = nginx(&proxy, "timeout=200ms on_error=deny", LINE);
    proxy.block_after_cut(Some((Duration::from_millis(600), Block::Blackhole)));
    proxy.only_connections_older_than(SERVED);
    proxy.cut_every(20);
    let next = costs();
    let mut results = load(ngx.port, &next, RUN, 8);
    proxy.stop_cutting();
    while proxy.blocked() {
        thread::sleep(Duration::from_millis(10));
    }
    // Healed: requests for a second yet (each worker meets Redis again).
    results.extend(load(ngx.port, &next, Duration::from_secs(1), 4));
    let in_redis = settled(&redis, &proxy, Duration::from_secs(1));
    let stats = proxy.stats();
    assert_sane(&stats, &ngx);
    assert!(stats.blackholed > 0, "no connection met the blackhole: {stats:?}");
    let statuses = by_status(&results);
    assert!(
        statuses.get(&429).copied().unwrap_or(0) > 0,
        "no request was answered per on_error: {statuses:?}; proxy: {stats:?}"
    );
    assert!(statuses.get(&200).copied().unwrap_or(0) > 0, "no request passed: {statuses:?}");
    assert_applied_once("requests answered per on_error (timeout 200 ms)", in_redis, &results, &stats, &ngx);
}

// ---------------------------------------------------------------------------
// 3. Lease mode: the syncs' lease calls.
// ---------------------------------------------------------------------------

fn lease_calls() -> Filter {
    Arc::new(|cmd: &[Vec<u8>]| cmd.get(1).is_some_and(|f| f.ends_with(b"_lease")))
}

/// Lease mode (`lease=`): on each connection open for a second, every 3rd
/// lease call (a sync: leases granted, unspent units given back) loses its
/// reply after Redis ran it; nginx sends it again under its name. Once
/// every lease has ended and been given back, Redis holds exactly one unit
/// per request answered 200: no grant or give-back applied twice, none
/// lost.
#[test]
fn lease_calls_are_applied_once() {
    let redis = Redis::start();
    let proxy = CuttingProxy::start(redis.port);
    // (a lease lives the sync and the timeout: 1.05 s)
    let ngx = nginx(
        &proxy,
        "timeout=1s on_error=deny lease=1m sync=50ms",
        "key=all rate=1000r/h burst=1000000000 algorithm=fixed",
    );
    proxy.only_calls(Some(lease_calls()));
    proxy.only_connections_older_than(SERVED);
    proxy.cut_every(3);
    // (X-Cost is sent, and not read: every request costs one unit)
    let results = load(ngx.port, &costs(), RUN, 8);
    let in_redis = settled(&redis, &proxy, Duration::from_millis(1500));
    proxy.stop_cutting();
    let stats = proxy.stats();
    assert_sane(&stats, &ngx);
    let ok = by_status(&results).get(&200).copied().unwrap_or(0) as u64;
    assert_eq!(by_status(&results), counts(&[(200, results.len())]), "every request admitted; proxy: {stats:?}");
    assert_eq!(
        in_redis,
        ok,
        "lease calls, every 3rd reply cut: Redis holds {in_redis} units for {ok} requests admitted; proxy: {stats:?}; \
         Redis failures logged: {:?}",
        failed_lines(&ngx.error_log(), "r")
    );
}

/// The calls of requests that ask for a lease with them (a lease spent
/// before the next sync): the line string of the lease ends "0 16 LIFE".
fn calls_asking_for_a_lease() -> Filter {
    Arc::new(|cmd: &[Vec<u8>]| {
        let asks = |a: &Vec<u8>| {
            let s = String::from_utf8_lossy(a);
            let mut w = s.rsplit(' ');
            w.next().is_some_and(|life| life.bytes().all(|b| b.is_ascii_digit())) && w.next() == Some("16")
        };
        cmd.get(1).is_some_and(|f| !f.ends_with(b"_lease")) && cmd.iter().skip(2).any(asks)
    })
}

/// Lease mode: a request its leases do not hold asks Redis, and asks for a
/// lease in the same call. Keys of 10 ms each (`$msec` cut), `life=2s`:
/// each key's first request asks for one. On each connection open for a
/// second, every 2nd such call loses its reply after Redis ran it; nginx
/// sends it again under its name, and the copy answers the same request
/// and the same grant. Once every lease has ended and been given back,
/// Redis holds exactly one unit per request answered 200: no grant applied
/// twice.
#[test]
fn leases_asked_with_requests_are_applied_once() {
    let redis = Redis::start();
    let proxy = CuttingProxy::start(redis.port);
    let ngx = Nginx::start(&server(
        &format!(
            "rl_zone r redis={} timeout=1s on_error=deny lease=16m sync=50ms life=2s;\n\
             map $msec $per_10ms {{ \"~^(?<k>[0-9]+\\.[0-9][0-9])\" $k; }}",
            proxy.url()
        ),
        "location / { rl_limit zone=r key=$per_10ms rate=1000r/h burst=1000000000 algorithm=fixed; }",
    ));
    proxy.only_calls(Some(calls_asking_for_a_lease()));
    proxy.only_connections_older_than(SERVED);
    proxy.cut_every(2);
    let results = load(ngx.port, &costs(), Duration::from_secs(3), 8);
    let in_redis = settled_by(charged_all, &redis, &proxy, Duration::from_millis(2500));
    proxy.stop_cutting();
    let stats = proxy.stats();
    assert_sane(&stats, &ngx);
    assert!(stats.cuts > 0, "no call that asked for a lease was cut: {stats:?}");
    let ok = by_status(&results).get(&200).copied().unwrap_or(0) as u64;
    assert_eq!(by_status(&results), counts(&[(200, results.len())]), "every request admitted; proxy: {stats:?}");
    assert_eq!(
        in_redis,
        ok,
        "calls asking for a lease, every 2nd reply cut: Redis holds {in_redis} units for {ok} requests admitted; \
         proxy: {stats:?}; Redis failures logged: {:?}",
        failed_lines(&ngx.error_log(), "r")
    );
}
