//! The verdict on one request by one line: [`Outcome`], the same type for
//! rl-core's model ([`crate::limit::Limit::check`] and friends) and for the
//! lines of the Redis script's reply ([`crate::redis::parse_reply`]).

/// The verdict on one request by one line.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Outcome {
    /// Whether the request is (or would be) admitted, at once or delayed.
    pub admitted: bool,
    /// Cost-1 requests that would be admitted right now; when admitted this is
    /// counted after the request's own charge (for `check` and `acquire` alike).
    pub remaining: u64,
    /// Microseconds until the key is back to full capacity (`remaining ==
    /// burst`) if nothing else arrives; 0 if already full.
    pub reset_us: u64,
    /// When rejected: the exact wait until a lone request of the same cost is
    /// admitted — it passes at `now + d` and not at `now + d − 1`, if nothing
    /// else is charged meanwhile. `None` when admitted or when it never can be
    /// (cost > burst).
    pub retry_after_us: Option<u64>,
    /// How long the request waits before it is answered; 0 = at once.
    pub delay_us: u64,
}

impl Outcome {
    /// An admitted request.
    pub(crate) fn admit(remaining: u64, reset_us: u64, delay_us: u64) -> Self {
        Outcome { admitted: true, remaining, reset_us, retry_after_us: None, delay_us }
    }

    /// A rejected request; `retry` is `None` exactly when it can never pass.
    pub(crate) fn reject(remaining: u64, reset_us: u64, retry: Option<u64>) -> Self {
        Outcome { admitted: false, remaining, reset_us, retry_after_us: retry, delay_us: 0 }
    }
}

