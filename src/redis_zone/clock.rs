//! A zone connection's view of Redis' clock ([`rl_core::redis::clock`]):
//! the deadline each script call carries, so that a call Redis runs after
//! nginx stopped waiting for it charges nothing, and what each reply
//! teaches of the offset.
//!
//! The guarantee: while Redis' clock does not step back, a call that Redis
//! commits ran (on the local clock) no later than [`script_deadline`], which
//! is [`grace`] before nginx gives up on it. So a request answered per
//! `on_error` was charged only if the reply of a call Redis ran in time
//! took longer than that grace to come back (Redis finishing the call and
//! the calls queued with it, the network, this thread reading it).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use rl_core::redis::clock::Offset;

use super::conn::Conn;

/// The offset of one zone's connection, on the worker's clock.
pub struct Clock {
    /// Local times are microseconds since this.
    epoch: Instant,
    offset: Mutex<Offset>,
}

impl Clock {
    pub fn new() -> Clock {
        Clock { epoch: Instant::now(), offset: Mutex::new(Offset::default()) }
    }

    fn us(&self, t: Instant) -> u64 {
        u64::try_from(t.saturating_duration_since(self.epoch).as_micros()).unwrap_or(u64::MAX)
    }

    fn with<T>(&self, f: impl FnOnce(&mut Offset) -> T) -> T {
        // Nothing panics while holding the lock; should it ever be
        // poisoned, the offset inside is still a valid one.
        let mut o = self.offset.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut o)
    }

    /// The deadline, on Redis' clock (µs), of a call that must not run
    /// after the local instant `until`; `None` before the first reply.
    pub fn deadline(&self, until: Instant) -> Option<u64> {
        let local = self.us(until);
        self.with(|o| o.redis_time(local))
    }

    /// A call sent at `sent` was run by Redis at `redis_us` (its clock), and
    /// its reply read at `received`.
    pub fn learn(&self, sent: Instant, received: Instant, redis_us: u64) {
        let (sent, received) = (self.us(sent), self.us(received));
        self.with(|o| o.learn(sent, received, redis_us));
    }

    /// Whether a reply taught the offset since the last [`Clock::forget`].
    pub fn known(&self) -> bool {
        self.with(|o| o.lower_bound().is_some())
    }

    /// A new connection may lead to another server (a Sentinel failover),
    /// whose clock is another: start again.
    pub fn forget(&self) {
        self.with(|o| *o = Offset::default());
    }

    /// Learns the offset from Redis `TIME` (before a connection's first
    /// call, so that it carries a deadline too). A failure is left to the
    /// call that follows.
    pub async fn sync(&self, conn: &Conn) {
        let cmd = redis::cmd("TIME");
        let sent = Instant::now();
        let mut conn = conn.clone();
        let time: redis::RedisResult<(u64, u64)> = cmd.query_async(&mut conn).await;
        if let Ok((s, us)) = time {
            self.learn(sent, Instant::now(), s.saturating_mul(1_000_000).saturating_add(us));
        }
    }
}

/// The part of a zone's `timeout` kept between the script's deadline and
/// nginx giving up on the call, for the reply's way back: the larger, the
/// slower a way back the guarantee survives; the smaller, the longer Redis
/// may take to run a call that still counts.
pub fn grace(timeout: Duration) -> Duration {
    timeout / 4
}

/// The local instant after which a call that nginx gives up on `timeout`
/// from now must not run.
pub fn script_deadline(timeout: Duration) -> Instant {
    Instant::now() + timeout.saturating_sub(grace(timeout))
}
