//! The verdict on one request by one line: [`Outcome`], the same type for
//! rl-core's model ([`crate::limit::Limit::check`] and friends) and for the
//! lines of the Redis script's reply ([`crate::redis::parse_reply`]);
//! [`combine`], which decides a request from its lines' outcomes, dry-run
//! lines included.

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
    /// Microseconds until `remaining` grows, if nothing else arrives: the
    /// wait until a lone request of cost `remaining + 1` is admitted at
    /// once (a queue aside); 0 when nothing more can come (`remaining` is
    /// the burst). The algorithms leave it 0: it is filled in where it is
    /// asked for, by [`crate::limit::Limit::next_us`] or the Redis script.
    pub next_us: u64,
}

impl Outcome {
    /// An admitted request.
    pub(crate) fn admit(remaining: u64, reset_us: u64, delay_us: u64) -> Self {
        Outcome { admitted: true, remaining, reset_us, retry_after_us: None, delay_us, next_us: 0 }
    }

    /// A rejected request; `retry` is `None` exactly when it can never pass.
    pub(crate) fn reject(remaining: u64, reset_us: u64, retry: Option<u64>) -> Self {
        Outcome { admitted: false, remaining, reset_us, retry_after_us: retry, delay_us: 0, next_us: 0 }
    }

    /// The outcome of a line that admitted a request but was not charged
    /// for it (another line rejected the request, or the line is
    /// `charge=after` and charges later): its verdict, and what is left as
    /// `left` says, the line's state read at the same time by
    /// [`crate::limit::Limit::left`] (a check that counts the charge says
    /// what would be left after it).
    pub fn uncharged(&self, left: &Outcome) -> Outcome {
        Outcome { remaining: left.remaining, reset_us: left.reset_us, next_us: left.next_us, ..*self }
    }
}

/// What a request's lines decide together ([`combine`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Decision {
    /// Every enforced line admits the request (at once or delayed); true
    /// when there is none.
    pub admitted: bool,
    /// How long the request waits: the longest delay of the enforced lines
    /// (0 when rejected).
    pub delay_us: u64,
}

impl Decision {
    /// Whether a line whose outcome is `line` is charged: iff the request
    /// is admitted and the line itself admits it. For an enforced line that
    /// is "iff the request is admitted"; a dry-run line that would reject is
    /// not charged, as if it were enforced, and is charged only with the
    /// request, as the enforced lines are.
    pub fn charges(&self, line: &Outcome) -> bool {
        self.admitted && line.admitted
    }
}

/// Decides a request from each of its lines' outcome and whether that line
/// is dry-run: it is admitted iff every enforced line admits it, and waits
/// for the longest of their delays. Dry-run lines never reject or delay
/// it; what is charged is [`Decision::charges`].
pub fn combine<'a>(lines: impl IntoIterator<Item = (&'a Outcome, bool)>) -> Decision {
    let mut d = Decision { admitted: true, delay_us: 0 };
    for (o, dry_run) in lines {
        if dry_run {
            continue;
        }
        d.admitted &= o.admitted;
        d.delay_us = d.delay_us.max(o.delay_us);
    }
    if !d.admitted {
        d.delay_us = 0;
    }
    d
}
