//! Leases (escrow): a node takes part of a key's budget from the exact
//! line (the state all nodes share, in Redis), charged there at once as a
//! request of that cost would be, then spends it alone, with no round trip,
//! and gives back what it did not spend.
//!
//! The bound: whatever the nodes, their leases, the order of grants, spends
//! and give-backs, and whatever is lost (a node that dies with its lease, a
//! give-back that never arrives), the units the nodes admit, in the order
//! they admit them, are units the configured line itself would admit. A
//! lease can only take less: units granted and not spent before the lease
//! ends are wasted until given back or, for the window algorithms, until
//! their window ends.
//!
//! Why it holds:
//! - A grant is the largest cost up to what the node asks for that the line
//!   admits at once at that instant, committed as one request.
//! - `fixed` and `sliding`: a lease ends with the window it was granted in,
//!   so every unit is admitted in the window that counts it; admitted
//!   units are a part of the units granted, which the line admitted.
//! - The buckets and `gcra` count time, not windows: a unit granted at t0
//!   and spent at t1 > t0 was admitted by the line at t0, and spending it
//!   later can bunch it with units the line admitted after t0, by as much
//!   as the rate refills in a lease's life. So the line that grants them
//!   has the configured burst less that refill, ⌈life · count / period⌉
//!   units: over any span, the units spent are at most the units granted
//!   over that span and the lease life before it, which the smaller burst
//!   keeps within what the configured burst admits over the span alone.
//! - `sliding_log`, which stores one timestamp per unit, cannot be leased,
//!   nor a line with a queue (a lease admits at once or not at all).
//! - A line whose rate or burst comes from variables (plans) is leased per
//!   key, under the values its requests carry ([`Leasing::with_values`]):
//!   a key's leases are units of its own line. A key whose burst is too
//!   small to be leased is decided on the shared state alone, exactly.
//!
//! Also here: [`Slot`], one key's leases as a node keeps them, on its own
//! clock, with syncs in flight while requests spend; [`Demand`], which
//! sizes them; [`share`], the line a node enforces alone when the shared
//! state is out of reach, so that the fleet's nodes together stay within
//! the line. The script's lease call (`NAME_lease`) is this model on
//! Redis, held to it by rl-core's tests.
//!
//! Pure: times are the caller's (integer µs), state is the caller's.

mod kept;

use core::fmt;

pub use self::kept::{Kept, Local};
use crate::limit::{Algorithm, Charge, Limit};
use crate::parse::Rate;

/// Why a line cannot be leased.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseError {
    /// `sliding_log` keeps a timestamp per unit: a lease has none to give.
    SlidingLog,
    /// A line that delays (`queue=`): a lease admits at once or not at all.
    Queue,
    /// Requests in flight (`rl_conn`): units held until the request ends,
    /// which no lease of a rate can hold.
    Concurrent,
    /// A lease life of 0, or one past which its figures overflow.
    Life,
    /// The buckets and `gcra`: the burst is not above what the rate refills
    /// in a lease's life, which the line that grants leases holds back.
    Burst { burst: u64, held_back: u64 },
}

impl fmt::Display for LeaseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LeaseError::SlidingLog => {
                write!(f, "algorithm=sliding_log cannot be leased: it keeps a timestamp per request")
            }
            LeaseError::Concurrent => write!(f, "a concurrency limit cannot be leased"),
            LeaseError::Queue => write!(f, "a line with a queue cannot be leased: a lease admits at once"),
            LeaseError::Life => write!(f, "invalid lease life"),
            LeaseError::Burst { burst, held_back } => write!(
                f,
                "burst={burst} is too small to be leased: leases hold back the {held_back} units \
                 the rate refills in a lease's life"
            ),
        }
    }
}

impl std::error::Error for LeaseError {}

/// How a line is leased: the line that grants leases (on the state all
/// nodes share) and how long a lease lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Leasing {
    /// The configured line, for the buckets and `gcra` with its burst less
    /// what the rate refills in `life`.
    line: Limit,
    /// How long a lease may be spent from, in µs (at most to the end of its
    /// window, for `fixed` and `sliding`).
    life: u64,
    /// `line` is a [`Limit::varying`] line as configured, whose values each
    /// request brings: not a line that grants (see [`Leasing::with_values`]).
    per_key: bool,
}

/// A node's lease: units granted at once, spent one request at a time
/// until it ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lease {
    charge: Charge,
    spent: u64,
    /// When it ends: no unit is spent at or after this time.
    until: u64,
}

impl Leasing {
    /// `limit` leased for `life_us` at most a lease (for `fixed` and
    /// `sliding` also to the end of the window it is granted in). A
    /// [`Limit::varying`] line is checked here for what its values cannot
    /// change; each key's values are leased by [`Leasing::with_values`].
    pub fn new(limit: Limit, life_us: u64) -> Result<Leasing, LeaseError> {
        if limit.queue() > 0 {
            return Err(LeaseError::Queue);
        }
        if life_us == 0 {
            return Err(LeaseError::Life);
        }
        match limit.algorithm() {
            Algorithm::SlidingLog => return Err(LeaseError::SlidingLog),
            Algorithm::Concurrent => return Err(LeaseError::Concurrent),
            _ => {}
        }
        match limit.is_varying() {
            true => Ok(Leasing { line: limit, life: life_us, per_key: true }),
            false => Leasing::granting(limit, life_us),
        }
    }

    /// How a key is leased whose requests bring `limit` (the line's values
    /// for them) on a line whose values vary: under a line of those values
    /// ([`LeaseError::Burst`]: a burst too small to be leased, the key is
    /// decided on the shared state alone). A line whose values do not vary
    /// is leased as it is, whatever `limit`.
    pub fn with_values(&self, limit: &Limit) -> Result<Leasing, LeaseError> {
        match self.per_key {
            true => Leasing::granting(*limit, self.life),
            false => Ok(*self),
        }
    }

    /// Whether each key is leased under its own values
    /// ([`Leasing::with_values`]).
    pub fn per_key(&self) -> bool {
        self.per_key
    }

    /// `limit` (a line of values) leased for `life_us`: for the buckets and
    /// `gcra`, granted by a line with its burst less what the rate refills
    /// in a lease's life.
    fn granting(limit: Limit, life_us: u64) -> Result<Leasing, LeaseError> {
        let line = match limit.algorithm() {
            Algorithm::SlidingLog => return Err(LeaseError::SlidingLog),
            Algorithm::Concurrent => return Err(LeaseError::Concurrent),
            Algorithm::Fixed | Algorithm::Sliding => limit,
            Algorithm::TokenBucket | Algorithm::LeakyBucket | Algorithm::Gcra => {
                let held_back = held_back(&limit, life_us).ok_or(LeaseError::Life)?;
                let burst = limit.burst();
                if burst <= held_back {
                    return Err(LeaseError::Burst { burst, held_back });
                }
                let line =
                    Limit::new(limit.algorithm(), limit.rate(), burst - held_back).map_err(|_| LeaseError::Life)?;
                match limit.is_varying() {
                    true => line.varying(),
                    false => line,
                }
            }
        };
        Ok(Leasing { line, life: life_us, per_key: false })
    }

    /// The line that grants leases, on the state all nodes share (of a
    /// line whose values vary: the line as configured, see
    /// [`Leasing::with_values`]).
    pub fn line(&self) -> &Limit {
        &self.line
    }

    /// Grants up to `want` units at `now`, charged on `state`: the most the
    /// line admits at once as one request (none: a lease of 0 units).
    pub fn grant(&self, state: &mut [u64], now: u64, want: u64) -> Lease {
        let units = self.most_admitted(state, now, want);
        let charge = match units {
            0 => Charge::NONE,
            n => self.line.commit(state, now, n),
        };
        Lease { charge, spent: 0, until: self.end(now) }
    }

    /// Gives back, at `now`, what `lease` has not spent: the line refunds it
    /// as far as its state still holds it.
    pub fn give_back(&self, state: &mut [u64], lease: &Lease, now: u64) {
        let unspent = lease.left();
        if unspent > 0 {
            self.line.refund_part(state, &lease.charge, unspent, now);
        }
    }

    /// The largest cost up to `want` that the line admits at once at `now`
    /// (admission is monotone in the cost: a binary search).
    fn most_admitted(&self, state: &[u64], now: u64, want: u64) -> u64 {
        let at_once = |cost: u64| {
            let o = self.line.check(state, now, cost);
            o.admitted && o.delay_us == 0
        };
        let (mut lo, mut hi) = (0, want.min(self.line.burst()));
        while lo < hi {
            let mid = hi - (hi - lo) / 2;
            if at_once(mid) {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        lo
    }

    /// How long a lease may live (for `fixed` and `sliding`, at most to
    /// the end of its window).
    pub fn life(&self) -> u64 {
        self.life
    }

    /// What a sync sends for a key at `now` (`arg`), less a give-back that
    /// can no longer count (`None`: nothing left to send): a `fixed`
    /// lease's units once its window has ended on this clock, a `sliding`
    /// one's once the window after it has (their state counts them no
    /// more, and Redis would refund nothing). A clock ahead of Redis' drops
    /// units Redis could still have refunded, for as long as it is ahead:
    /// the key may admit less, never more.
    pub fn worth_sending(&self, arg: SyncArg, now: u64) -> Option<SyncArg> {
        // (the window, k + 1 = the words' first, whose end the give-back counts until)
        let counted_until = match self.line.algorithm() {
            Algorithm::Fixed => Some(arg.words.0),
            Algorithm::Sliding => Some(arg.words.0.saturating_add(1)),
            _ => None,
        };
        let w = self.line.window_us();
        let arg = match counted_until.is_none_or(|k| now < k.saturating_mul(w)) {
            true => arg,
            false => SyncArg { back: 0, words: (0, 0), ..arg },
        };
        (arg.want > 0 || arg.back > 0).then_some(arg)
    }

    /// When a lease granted at `now` ends.
    pub fn end(&self, now: u64) -> u64 {
        let end = now.saturating_add(self.life);
        match self.line.algorithm() {
            Algorithm::Fixed | Algorithm::Sliding => {
                let w = self.line.window_us();
                end.min((now / w).saturating_add(1).saturating_mul(w))
            }
            _ => end,
        }
    }
}

/// What the rate refills in a lease's life, in units, rounded up (`gcra`,
/// whose interval is rounded up, refills no faster); `None` on overflow.
fn held_back(l: &Limit, life: u64) -> Option<u64> {
    let r = l.rate();
    let units = (u128::from(life) * u128::from(r.count)).div_ceil(u128::from(r.period_us));
    u64::try_from(units).ok()
}

/// Whether a line that had `remaining` left can spare the `units` a lease
/// holds: the nodes holding as much would hold under half of it.
fn spared(units: u64, remaining: u64, nodes: u64) -> bool {
    units.saturating_mul(nodes.max(1)).saturating_mul(2) < remaining
}

/// Whether a line that had `remaining` left is far enough from its limit
/// for leases of `units` (see [`LONG_INTERVALS`]): the nodes holding as
/// much would hold under an eighth of it: [`spared`], four times over.
/// (Half, as `spared` allows, left nginx that lost Redis with views of the
/// line lagging by as much: alone, they limited on less than it had left.)
fn far(units: u64, remaining: u64, nodes: u64) -> bool {
    spared(units.saturating_mul(4), remaining, nodes)
}

/// `per_interval` over `span` µs, intervals being `interval` µs long.
fn spread(per_interval: u64, span: u64, interval: u64) -> u64 {
    let x = u128::from(per_interval) * u128::from(span) / u128::from(interval.max(1));
    u64::try_from(x).unwrap_or(u64::MAX)
}

/// A node's demand for one key, for sizing its leases: an estimate of the
/// units it spends in a sync interval (an average over the last few,
/// weighted to the latest: a quarter each interval; an interval above it
/// at once), in thousandths; and the plain average, which says whether
/// the key is seen often enough to be leased at all (one request now and
/// then looks, the interval it comes in, like a steady one).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Demand {
    milli: u64,
    mean: u64,
}

impl Demand {
    /// Folds in one interval's demand: the units its requests asked for
    /// (spent from a lease, or that found it empty).
    pub fn observe(&mut self, units: u64) {
        let x = units.saturating_mul(1000);
        // (3 parts the old estimate, 1 the new, rounded: a steady demand of
        // n settles within a few thousandths of n; a demand above the
        // estimate is taken at once: leases grow with a rising demand in
        // one interval, where an average would leave them short for many)
        let sum = u128::from(self.milli) * 3 + u128::from(x) + 2;
        self.milli = u64::try_from(sum / 4).unwrap_or(u64::MAX).max(x);
        // (rounded down: with no demand it decays to nothing, where rounded
        // it would stop at 2 thousandths, and a key long gone, over a life
        // of a thousand intervals, would still be worth a lease)
        let mean = u128::from(self.mean) * 3 + u128::from(x);
        self.mean = u64::try_from(mean / 4).unwrap_or(u64::MAX);
    }

    /// The units one interval's demand is estimated at, rounded.
    pub fn per_interval(&self) -> u64 {
        self.milli.saturating_add(500) / 1000
    }

    /// The units the demand is estimated at over `span` µs, intervals
    /// being `interval` µs long, in thousandths.
    pub fn over(&self, span: u64, interval: u64) -> u64 {
        spread(self.milli, span, interval)
    }

    /// How many units a sync asks for, for a lease that would live `life`
    /// µs (see [`Demand::want`]): none for a key seen less than twice in
    /// an interval lately (the estimate, which takes a busier interval at
    /// once, under two) whose plain average over the lease's life is under
    /// two units (a lease that serves one request costs Redis what deciding
    /// the request would); else at least two, and no more than the
    /// estimate over its life.
    pub fn want_for(&self, life: u64, interval: u64, remaining: u64, nodes: u64) -> u64 {
        if self.per_interval() < 2 && spread(self.mean, life, interval) < 2000 {
            return 0;
        }
        self.size(life, interval, remaining, nodes)
    }

    /// [`Demand::want_for`] for a lease asked with a request, which only
    /// the plain average warrants (a lease asked for on the request path,
    /// on a key's busy moment, would mostly go back unspent).
    pub fn want_with(&self, life: u64, interval: u64, remaining: u64, nodes: u64) -> u64 {
        if spread(self.mean, life, interval) < 2000 {
            return 0;
        }
        self.size(life, interval, remaining, nodes)
    }

    /// A lease's size, for a lease living `life` µs: an interval's
    /// estimate and half again (the syncs top it up), or, for a few units
    /// an interval, two standard deviations of a random demand and a unit
    /// more (requests that come at random bunch: half again of a few runs
    /// dry before the next sync's lease comes); or, for a key seen less
    /// than twice an interval, half the plain average over its life (such
    /// a key renews a long lease on its requests, not at the syncs: a lease
    /// of two would cost Redis a call every other request); at least two
    /// units, no more than the estimate over its life, and at most this
    /// node's share of what is left. For a key seen twice an interval or
    /// more, where the line is far from its limit (see [`far`]), the estimate
    /// over [`LONG_INTERVALS`] intervals, if more and the lease lives that
    /// long: a busy key far from its limit is then topped up every few
    /// intervals, not at every sync, and what its lease holds unspent the
    /// line can spare.
    fn size(&self, life: u64, interval: u64, remaining: u64, nodes: u64) -> u64 {
        let over = self.over(life, interval);
        let est = self.per_interval();
        let base = match est {
            0 | 1 => spread(self.mean, life, interval).div_ceil(2000),
            _ => est.saturating_add(est.div_ceil(2).max(2 * est.isqrt() + 1)),
        };
        let want = base.max(2).min(over.div_ceil(1000));
        let long = match est {
            0 | 1 => 0,
            _ => self.over(life.min(interval.saturating_mul(LONG_INTERVALS)), interval).div_ceil(1000),
        };
        let want = match long > want && far(long, remaining, nodes) {
            true => long,
            false => want,
        };
        want.min((remaining / nodes.max(1)).max(1))
    }

    /// How many units to ask for: half again the demand of an interval
    /// (a lease lives about that long; the half covers the demand's
    /// growth and the sync's own delay), at least 1, and at most this
    /// node's share of what the line had left at once (`remaining`, as of
    /// the last grant, shared by `nodes`; at least 1): as the line runs
    /// low, leases shrink to a unit each, and what they can hold unspent
    /// with them.
    pub fn want(&self, remaining: u64, nodes: u64) -> u64 {
        let est = self.per_interval();
        let want = est.saturating_add(est.div_ceil(2)).max(1);
        want.min((remaining / nodes.max(1)).max(1))
    }
}

impl Lease {
    /// Whether the node should ask for more before the next sync: it has
    /// spent three quarters of the lease (or all of a lease of up to 3).
    pub fn low(&self) -> bool {
        runs_low(self.left(), self.granted())
    }
}

/// [`Lease::low`] of a lease with `left` of `granted` units left.
fn runs_low(left: u64, granted: u64) -> bool {
    left.saturating_mul(4) <= granted
}

/// How many intervals of its key's demand a lease holds at most, where
/// the line is far from its limit (see [`Demand::want_for`]): a sync
/// carries such a key once in about as many intervals (a sync's key costs
/// Redis about what a request does), and an nginx killed holding it wastes
/// no more than that.
pub const LONG_INTERVALS: u64 = 10;

/// The most units a lease holds (a node keeps a lease's units left and
/// granted in one word): no demand comes near it in a sync interval.
pub const MAX_UNITS: u64 = u32::MAX as u64;

/// A lease as a node holds it: units left and granted, the words to give
/// it back with, and when it ends on the node's own clock.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Held {
    pub left: u64,
    pub granted: u64,
    pub words: (u64, u64),
    pub ends: u64,
}

/// Which lease a request's units came from ([`Slot::take`]): integers
/// only (all zeroes: no lease).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Spent {
    granted: u64,
    ends: u64,
    words: (u64, u64),
}

/// The units a request took from a node's leases, and from which: from
/// one ([`Slot::take`]), or from both where neither held its cost alone
/// ([`Slot::take_part`]); integers only (all zeroes: none).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Part {
    from: [(Spent, u64); 2],
}

impl Part {
    /// `units` from the lease `spent` says.
    pub fn one(spent: Spent, units: u64) -> Part {
        Part { from: [(spent, units), (Spent::default(), 0)] }
    }

    /// The units taken.
    pub fn units(&self) -> u64 {
        self.from[0].1.saturating_add(self.from[1].1)
    }
}

/// What a node's sync sends for one key: units wanted, and what it gives
/// back of an ended lease (units and words; 0 units: nothing).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SyncArg {
    pub want: u64,
    pub back: u64,
    pub words: (u64, u64),
}

/// What a sync knows of time, for sizing a key's leases (on the node's
/// clock): when the next sync of the cadence runs, how long an interval
/// is, when a lease granted now would end, and how long a call that asks
/// for one may go unanswered (past that, given up on).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Horizon {
    pub next: u64,
    pub interval: u64,
    pub ends: u64,
    pub wait: u64,
}

impl Horizon {
    /// A sync at `now`, the next at `next`, one interval later, of a key
    /// whose lease would live half an interval beyond it (a bucket line
    /// of a zone whose `timeout` is half its `sync`).
    pub fn of(now: u64, next: u64) -> Horizon {
        let interval = next.saturating_sub(now);
        let ends = next.saturating_add(interval / 2);
        Horizon { next, interval, ends, wait: ends - now }
    }
}

/// One key's leases as a node keeps them (all its workers, in shared
/// memory), on the node's own clock: the lease being spent and, granted
/// while it still runs, the next; an ended lease's units to give back; the
/// demand that sizes the next.
///
/// Never spent twice, never given back twice: a lease is given back only
/// once it has ended (what it left is final), and a give-back leaves the
/// slot with the call that carries it, whatever becomes of the call (a
/// call lost on the way loses it: units wasted, never granted twice). A
/// lease ends on the node no later than where Redis ran the grant: its
/// life counts from when the node sent the call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Slot {
    held: [Held; 2],
    back: Held,
    demand: Demand,
    /// Units this interval's requests asked for.
    asked: u64,
    /// Since when (the node's clock) a call that asked for a lease for the
    /// key (a sync's, or a request's) has not been answered (0: none):
    /// while it may still be, within a lease's life, no other asks (two
    /// grants at once would waste one). A lease it brings lives from then.
    asking_since: u64,
}

impl Slot {
    /// A request of `cost` at `now`: spent from one lease (the older first)
    /// that has not ended and holds it all; whether it was.
    pub fn spend(&mut self, now: u64, cost: u64) -> bool {
        self.take(now, cost).is_some()
    }

    /// [`Slot::spend`], saying which lease the units came from, for
    /// [`Slot::put_back`].
    pub fn take(&mut self, now: u64, cost: u64) -> Option<Spent> {
        self.asked = self.asked.saturating_add(cost);
        for h in self.held.iter_mut() {
            if now < h.ends && cost <= h.left {
                h.left -= cost;
                return Some(Spent { granted: h.granted, ends: h.ends, words: h.words });
            }
        }
        None
    }

    /// A request of `cost` at `now` that no one lease holds (after
    /// [`Slot::take`] found none): what the leases that have not ended
    /// hold of it, up to its cost, the older first; the whole cost if they
    /// hold it together, else part of it, for the shared state to decide
    /// the rest. Without it a request costing more than one unit could find
    /// the units it needs split between leases, or between a lease and the
    /// shared state, none able to pay it: refused while the line has its
    /// cost left. `None`: no lease holds a unit.
    pub fn take_part(&mut self, now: u64, cost: u64) -> Option<Part> {
        let mut part = Part::default();
        let mut need = cost;
        for (h, from) in self.held.iter_mut().zip(part.from.iter_mut()) {
            if now < h.ends && h.left > 0 && need > 0 {
                let units = h.left.min(need);
                h.left -= units;
                need -= units;
                *from = (Spent { granted: h.granted, ends: h.ends, words: h.words }, units);
            }
        }
        (part.units() > 0).then_some(part)
    }

    /// [`Slot::put_back`] of what a request took from each lease.
    pub fn put_back_part(&mut self, part: &Part) {
        for &(spent, units) in part.from.iter().filter(|(_, units)| *units > 0) {
            self.put_back(spent, units);
        }
    }

    /// Units `take` spent for a request that was then refused (by another
    /// of its lines): back to their lease, wherever it is now (held, or
    /// ended and waiting to be given back), or, if it is gone (given back
    /// meanwhile), wasted: never put where they could be spent twice.
    pub fn put_back(&mut self, spent: Spent, cost: u64) {
        let same = |h: &Held| h.granted == spent.granted && h.ends == spent.ends && h.words == spent.words;
        let lease = self.held.iter_mut().chain(core::iter::once(&mut self.back)).find(|h| h.granted > 0 && same(h));
        if let Some(h) = lease {
            h.left = h.left.saturating_add(cost).min(h.granted);
        }
        self.asked = self.asked.saturating_sub(cost);
    }

    /// The i-th lease held (0: the one spent first), if any.
    pub fn held(&self, i: usize) -> Option<&Held> {
        self.held.get(i).filter(|h| h.granted > 0)
    }

    /// The units the slot's leases hold, unended at `now`.
    pub fn left(&self, now: u64) -> u64 {
        self.held.iter().filter(|h| now < h.ends).map(|h| h.left).sum()
    }

    /// What the sync at `now` sends for this key, the next sync being at
    /// `next`: what an ended lease left (moved out of the slot), and a
    /// new lease if the key was asked for and what its leases hold to
    /// the next sync falls short of [`Demand::want`] (from `remaining` and
    /// `nodes`): the shortfall. `None`: nothing to send. A lease spent to
    /// the last unit is let go at once: it has nothing to give back, and
    /// its place may hold the next.
    pub fn sync(&mut self, now: u64, next: u64, remaining: u64, nodes: u64) -> Option<SyncArg> {
        self.end_interval();
        self.sync_asking(now, Horizon::of(now, next), remaining, nodes, true)
    }

    /// Folds the interval's demand into the estimate (what [`Slot::sync`]
    /// does first): at each sync of the regular cadence, the intervals
    /// the estimate counts in.
    pub fn end_interval(&mut self) {
        self.demand.observe(self.asked);
        self.asked = 0;
    }

    /// [`Slot::sync`] without folding the demand (a sync between two of
    /// the cadence, where a lease ended: see [`Slot::ends_first`]), with
    /// the times of `h`, asking for no lease unless `ask` (what ended is
    /// given back all the same). A lease that holds more than twice what
    /// the key's demand is estimated at to its end, and two units, and
    /// would outlive the sync after next, is ended now, so that what it
    /// holds goes back at once, not when it ends (a `fixed` or `sliding`
    /// line's, with a long `life`), unless the line can spare it (see
    /// [`spared`]). A new lease is asked for only where what the leases
    /// hold would not last to the next sync and half again.
    pub fn sync_asking(&mut self, now: u64, h: Horizon, remaining: u64, nodes: u64, ask: bool) -> Option<SyncArg> {
        let Horizon { next, interval, .. } = h;
        let demand = self.demand;
        // (one lease goes back a call: only while no other waits to)
        let ended = |h: &Held| h.granted > 0 && now >= h.ends && h.left > 0;
        if self.back.left == 0 && !self.held.iter().any(ended) {
            // (a lease that ends by the sync after next is left to end: what it holds comes back
            // soon enough; and one whose units the line can spare is kept: the nodes holding as
            // much would hold under half of what it has left, and no other nginx goes short)
            let late = next.saturating_add(interval);
            let early = self.held.iter_mut().filter(|h| h.granted > 0 && late < h.ends).find(|h| {
                let to_end = demand.over(h.ends - now, interval).div_ceil(1000);
                h.left > to_end.saturating_mul(2).saturating_add(2) && !spared(h.left, remaining, nodes)
            });
            if let Some(h) = early {
                h.ends = now;
            }
        }
        self.settle(now);
        let (live, lasting) = (self.live(), self.lasting(next));
        let life = h.ends.saturating_sub(now);
        // (a lease pays for the call that carries it when it serves more than a request in
        // its life: a key seen less often is left to Redis)
        // (and only when its leases would not last to the next sync and half again: a key
        // seen seldom, whose lease is sized to its average over the lease's life, is not
        // topped up a unit or two at every sync)
        let needed = demand.over(next.saturating_sub(now).saturating_add(interval / 2), interval).div_ceil(1000);
        let want = match ask && !self.asking(now, h.wait) && live < 2 && (lasting < needed || lasting == 0) {
            true => self.demand.want_for(life, interval, remaining, nodes).saturating_sub(lasting),
            false => 0,
        };
        let back = core::mem::take(&mut self.back);
        let want = self.ask(now, want);
        (want > 0 || back.left > 0).then_some(SyncArg { want, back: back.left, words: back.words })
    }

    /// How many units to ask for with a request of the key that Redis
    /// decides at `now` (its units counted in this interval's), with the
    /// times of `h`: a lease in its call, asked for and sized as a sync
    /// would, the interval's requests so far folded in as a whole
    /// interval's (a key's first requests have no history to go by, and
    /// one seen now and then must not take a lease it will not spend); 0:
    /// none.
    pub fn ask_with(&mut self, now: u64, h: Horizon, remaining: u64, nodes: u64) -> u64 {
        let life = h.ends.saturating_sub(now);
        // (what an ended lease left goes back at the next sync: until then it keeps its place)
        for x in self.held.iter_mut().filter(|x| x.left == 0) {
            *x = Held::default();
        }
        if self.held[0].granted == 0 {
            self.held.swap(0, 1);
        }
        if self.asking(now, h.wait) || self.live() >= 2 {
            return 0;
        }
        // (the interval so far folded into the average, as a whole one; the estimate that
        // sizes it is not lowered by a part of an interval)
        let mut seen = self.demand;
        seen.observe(self.asked);
        seen.milli = self.demand.milli.max(self.asked.saturating_mul(1000));
        let want = seen.want_with(life, h.interval, remaining, nodes).saturating_sub(self.lasting(h.next));
        self.ask(now, want)
    }

    /// The leases held, ended or not.
    fn live(&self) -> usize {
        self.held.iter().filter(|h| h.granted > 0).count()
    }

    /// The units of the leases held that last past `next`.
    fn lasting(&self, next: u64) -> u64 {
        self.held.iter().filter(|h| h.ends > next).map(|h| h.left).sum()
    }

    /// `want` units asked for at `now` (0: none; at most [`MAX_UNITS`]):
    /// the call that carries them is the one that asks, until answered.
    fn ask(&mut self, now: u64, want: u64) -> u64 {
        let want = want.min(MAX_UNITS);
        if want > 0 {
            self.asking_since = now.max(1);
        }
        want
    }

    /// Whether a call that asked for a lease may still be answered at
    /// `now`, calls going unanswered `wait` at most.
    fn asking(&self, now: u64, wait: u64) -> bool {
        self.asking_since != 0 && now < self.asking_since.saturating_add(wait)
    }

    /// Lets go of the leases ended at `now` (what one left moves out, to be
    /// given back; one a sync) and those spent to the last unit: their
    /// places may hold the next.
    fn settle(&mut self, now: u64) {
        for h in self.held.iter_mut() {
            if h.granted > 0 && now >= h.ends && h.left > 0 {
                // (a second ended lease with units left, while one waits to go back: kept,
                // ended, for the next sync, which its end calls at once)
                if self.back.left == 0 {
                    self.back = core::mem::take(h);
                }
            } else if h.granted > 0 && (now >= h.ends || h.left == 0) {
                *h = Held::default();
            }
        }
        if self.held[0].granted == 0 {
            self.held.swap(0, 1);
        }
    }

    /// When the first of the leases it holds ends, if it holds any: a
    /// lease that ends with its window, before the next sync, is best
    /// replaced as the window ends, not up to an interval later.
    pub fn ends_first(&self) -> Option<u64> {
        self.held.iter().filter(|h| h.granted > 0).map(|h| h.ends).min()
    }

    /// The lease a sync sent at `sent` brought: `units` (0: none) for
    /// `life_us` from when Redis ran the call, given back with `words`.
    pub fn granted(&mut self, sent: u64, units: u64, words: (u64, u64), life_us: u64) {
        self.answered(sent);
        if units == 0 {
            return;
        }
        // (never more than asked for, at most MAX_UNITS: a reply that says more is held to it)
        let units = units.min(MAX_UNITS);
        let h = Held { left: units, granted: units, words, ends: sent.saturating_add(life_us) };
        // (two leases still held, when a call given up on was answered
        // after all: the units are wasted, never spent beyond the bound)
        if let Some(free) = self.held.iter_mut().find(|h| h.granted == 0) {
            *free = h;
        }
    }

    /// A call sent at `sent` got no answer (failed, or given up on): the
    /// next may ask again, if it was the one that asked. What the call
    /// asked for, and gave back, is lost.
    pub fn unanswered(&mut self, sent: u64) {
        self.answered(sent);
    }

    /// The call sent at `sent` is answered: if it asked for a lease, the
    /// next may. (Another call's answer, a sync's that only gave back,
    /// leaves the one that asked waiting: a lease it brings must find it.)
    fn answered(&mut self, sent: u64) {
        if self.asking_since == sent.max(1) {
            self.asking_since = 0;
        }
    }

    /// Since when a call that asked for a lease has not been answered (0:
    /// none): when a lease it brings lives from.
    pub fn asking_since(&self) -> u64 {
        self.asking_since
    }
}

/// The line one of `nodes` nodes enforces on its own when the shared
/// state cannot be reached (`on_error=local`), so that the nodes together
/// never admit what `limit` would not: each gets ⌊burst / nodes⌋ of the
/// burst (and of the queue) and a `nodes`-th of the rate, over the same
/// windows (`fixed`, `sliding`, `sliding_log`: the same window, so a
/// window's units add up across nodes; `gcra`: an interval `nodes` times
/// as long as the line's, which is rounded up). `None` when a node's share
/// of the burst is nothing (more nodes than the burst has units): such a
/// node admits nothing on its own.
pub fn share(limit: &Limit, nodes: u64) -> Option<Limit> {
    let nodes = nodes.max(1);
    let burst = limit.burst() / nodes;
    if burst == 0 {
        return None;
    }
    let r = limit.rate();
    let rate = match limit.algorithm() {
        Algorithm::Fixed | Algorithm::Sliding | Algorithm::SlidingLog => {
            Rate { count: burst, period_us: limit.window_us() }
        }
        Algorithm::TokenBucket | Algorithm::LeakyBucket => {
            Rate { count: r.count, period_us: r.period_us.checked_mul(nodes)? }
        }
        Algorithm::Gcra => Rate { count: 1, period_us: r.period_us.div_ceil(r.count).checked_mul(nodes)? },
        // (never leased)
        Algorithm::Concurrent => return None,
    };
    let shared = Limit::new(limit.algorithm(), rate, burst).ok()?.with_queue(limit.queue() / nodes).ok()?;
    Some(if limit.is_varying() { shared.varying() } else { shared })
}

impl Lease {
    /// Units granted.
    pub fn granted(&self) -> u64 {
        self.charge.cost()
    }

    /// Units not spent yet.
    pub fn left(&self) -> u64 {
        self.granted() - self.spent
    }

    /// When it ends: no unit is spent at or after this time.
    pub fn until(&self) -> u64 {
        self.until
    }

    /// Spends `cost` units at `now` if the lease has not ended and has them
    /// left; whether it did.
    pub fn spend(&mut self, now: u64, cost: u64) -> bool {
        if now >= self.until || cost > self.left() {
            return false;
        }
        self.spent += cost;
        true
    }
}
