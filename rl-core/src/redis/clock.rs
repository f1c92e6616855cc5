//! Redis' clock as nginx sees it, so that a script call can carry a deadline
//! in Redis time (see the module docs of [`crate::redis`]).
//!
//! Redis' `TIME` (a wall clock, on another host) and the caller's local
//! monotonic clock differ by an offset θ = Redis time − local time. Each
//! call tells something of it: Redis ran the call at `redis_us` (the time
//! the script reports), which was after the call was sent at local
//! `sent_us` and before its reply was received at local `received_us`, so
//! `redis_us − received_us ≤ θ ≤ redis_us − sent_us`.
//!
//! [`Offset`] keeps the tightest lower bound: the largest `redis_us −
//! received_us` seen. A local time plus a lower bound of θ is never later
//! than the true Redis time of that instant, so a deadline computed that
//! way is conservative: whatever Redis runs before it, it runs before the
//! local instant it stands for.
//!
//! The bound is only sound while θ does not shrink. Redis' `TIME` can step
//! (an operator, or NTP stepping rather than slewing): a step forward just
//! makes the bound looser until the next reply raises it (meanwhile calls
//! look later than they are: refused as late, never charged); a step back
//! makes the bound too high, which the next reply shows when its upper bound
//! falls below it: then the estimate starts again from that reply. Until
//! that reply, deadlines are late by up to the step.

/// The tightest lower bound of θ known so far (µs; `None` before the first
/// reply).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Offset {
    lower: Option<i64>,
}

impl Offset {
    /// Learns from a call sent at local `sent_us`, whose reply, received at
    /// local `received_us`, says Redis ran it at `redis_us`. A reply that
    /// came back before it was sent (impossible on a monotonic clock) is
    /// ignored.
    pub fn learn(&mut self, sent_us: u64, received_us: u64, redis_us: u64) {
        if received_us < sent_us {
            return;
        }
        let lower = diff(redis_us, received_us);
        let upper = diff(redis_us, sent_us);
        self.lower = Some(match self.lower {
            Some(l) if l <= upper => l.max(lower),
            // None yet, or the clock stepped back: this call's bound alone.
            _ => lower,
        });
    }

    /// The local time `local_us` on Redis' clock, never later than the
    /// true one while the offset has not shrunk since the last reply; `None`
    /// before the first reply (or if it would be before Redis' epoch).
    pub fn redis_time(&self, local_us: u64) -> Option<u64> {
        let t = i128::from(local_us) + i128::from(self.lower?);
        u64::try_from(t).ok()
    }

    /// The lower bound itself (µs), for tests and logs.
    pub fn lower_bound(&self) -> Option<i64> {
        self.lower
    }
}

/// `a − b` as a signed number, saturating (times are far below 2^63 µs).
fn diff(a: u64, b: u64) -> i64 {
    let d = i128::from(a) - i128::from(b);
    i64::try_from(d).unwrap_or(if d < 0 { i64::MIN } else { i64::MAX })
}
