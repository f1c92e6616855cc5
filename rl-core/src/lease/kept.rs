//! What a node keeps of one key in its shared memory, as words ([`Kept`]):
//! the key's [`Slot`], whose state it is on Redis, and what the node last
//! learnt of the line there; and how a request is decided on it alone
//! ([`Kept::decide`]). A plain copy in and out of the words, so that memory
//! every worker maps holds nothing but integers.

use super::{Held, Horizon, Part, Slot, MAX_UNITS};
use crate::limit::{Decision, Limit};
use crate::parse::Rate;
use crate::redis::LeaseGrant;
use crate::verdict::Outcome;

/// One key's leases and what the node knows of its line.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Kept {
    pub slot: Slot,
    /// The Redis state key's parts: the client key's tag and the line id.
    pub tag: u64,
    pub line_id: u64,
    /// What the line had left at once when Redis last said (a grant, or
    /// a reply to a request the leases did not hold), and when (on the
    /// node's clock) it is back to full, as Redis saw it then; and when
    /// that was on Redis' clock, which orders what the node hears: the
    /// replies of two calls that crossed (a sync's and a request's) may
    /// come back in either order, and only the later call's view holds.
    pub remaining: u64,
    pub full_at: u64,
    pub heard_at: u64,
    /// Until when a lone request is refused without asking: Redis refused
    /// one, and said when one would pass.
    pub refused_until: u64,
    /// While Redis cannot be reached: the state of this node's share of the
    /// line ([`super::share`]), the time Redis last answered that it
    /// belongs to (a state of an earlier outage is stale), and the units
    /// it admitted, owed to Redis once it answers again.
    pub local: [u64; 4],
    pub local_since: u64,
    pub owed: u64,
    /// The key's own rate (count, period in µs) and burst, on a line whose
    /// values come from variables, as its last request brought them (what
    /// its leases are sized and granted under, see [`Kept::limit_of`]);
    /// zeroes on a line whose values do not vary.
    pub values: [u64; 3],
}

/// How a request is decided on a key's leases.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Local {
    /// Spent from the leases (one, or both together): admitted, with the
    /// node's view of what the line has left and of its reset.
    Spent { spent: Part, remaining: u64, reset_us: u64 },
    /// Refused on the node: Redis refused a lone request lately, and said
    /// when one would pass.
    Refused { retry_after_us: u64, reset_us: u64 },
    /// Partly spent from the leases (all they held), the rest of the cost
    /// for Redis to decide (see [`Slot::take_part`]): the units go back to
    /// their leases unless it admits.
    Part(Part),
    /// Neither: Redis decides (the exact call).
    Ask,
}

impl Local {
    /// The outcome of a request decided on the node, and what it spent of
    /// its leases; `None`: Redis decides ([`Local::Ask`]).
    pub fn outcome(self) -> Option<(Outcome, Option<Part>)> {
        match self {
            Local::Spent { spent, remaining, reset_us } => Some((Outcome::admit(remaining, reset_us, 0), Some(spent))),
            Local::Refused { retry_after_us, reset_us } => {
                // (one more unit passes when a lone request does)
                let o = Outcome { next_us: retry_after_us, ..Outcome::reject(0, reset_us, Some(retry_after_us)) };
                Some((o, None))
            }
            Local::Ask | Local::Part(_) => None,
        }
    }
}

impl Kept {
    /// Words a [`Kept`] takes: 31, 248 bytes, in a slab slot of 256 (one
    /// more word would take a slot of 512, and halve the keys a zone holds).
    pub const WORDS: usize = 3 * HELD_WORDS + 4 + 6 + 6 + 3;

    /// The kept record of the words (zeroes: a key with nothing kept);
    /// `None` if they are too few.
    pub fn read(w: &[u64]) -> Option<Kept> {
        let w: &[u64; Kept::WORDS] = w.get(..Kept::WORDS)?.try_into().ok()?;
        let held = |i: usize| {
            let h = &w[i * HELD_WORDS..(i + 1) * HELD_WORDS];
            let (left, granted) = (h[0] & MAX_UNITS, h[0] >> 32);
            Held { left: left.min(granted), granted, words: (h[1], h[2]), ends: h[3] }
        };
        let s = 3 * HELD_WORDS;
        let slot = Slot {
            held: [held(0), held(1)],
            back: held(2),
            demand: super::Demand { milli: w[s], mean: w[s + 1] },
            asked: w[s + 2],
            asking_since: w[s + 3],
        };
        Some(Kept {
            slot,
            tag: w[s + 4],
            line_id: w[s + 5],
            remaining: w[s + 6],
            full_at: w[s + 7],
            heard_at: w[s + 8],
            refused_until: w[s + 9],
            local: [w[s + 10], w[s + 11], w[s + 12], w[s + 13]],
            local_since: w[s + 14],
            owed: w[s + 15],
            values: [w[s + 16], w[s + 17], w[s + 18]],
        })
    }

    /// When the first lease of the record in `w` ends ([`Slot::ends_first`]),
    /// read from its words alone: for a walk that passes over the records
    /// whose leases have not ended without reading them whole.
    pub fn ends_first_of(w: &[u64]) -> Option<u64> {
        let held = &w.get(..Kept::WORDS)?[..2 * HELD_WORDS];
        // (a lease's units granted are its first word's upper half; its end its last word)
        held.chunks_exact(HELD_WORDS).filter(|h| h[0] >> 32 > 0).map(|h| h[HELD_WORDS - 1]).min()
    }

    /// Whether a sync of the cadence leaves the record in `w` as it is,
    /// read from its first words alone: a key that holds no lease and has
    /// nothing to give back, asked for nothing this interval, and whose
    /// demand has decayed (its estimate to 2 thousandths of a unit at
    /// most, which no demand leaves where it is; its plain average to
    /// nothing): the most of a zone whose keys come and go.
    pub fn idle_of(w: &[u64]) -> bool {
        let Some(w) = w.get(..Kept::WORDS) else { return false };
        let d = 3 * HELD_WORDS;
        w[..d].iter().all(|&x| x == 0) && w[d] <= 2 && w[d + 1] == 0 && w[d + 2] == 0
    }

    /// Writes it into `w` (at least [`Kept::WORDS`] words; nothing if fewer).
    pub fn write(&self, w: &mut [u64]) {
        let Some(w) = w.get_mut(..Kept::WORDS) else { return };
        let s = &self.slot;
        for (i, h) in [s.held[0], s.held[1], s.back].iter().enumerate() {
            // (units left and granted in one word: a lease holds at most MAX_UNITS)
            let units = h.granted.min(MAX_UNITS) << 32 | h.left.min(MAX_UNITS);
            w[i * HELD_WORDS..(i + 1) * HELD_WORDS].copy_from_slice(&[units, h.words.0, h.words.1, h.ends]);
        }
        let o = 3 * HELD_WORDS;
        w[o..].copy_from_slice(&[
            s.demand.milli,
            s.demand.mean,
            s.asked,
            s.asking_since,
            self.tag,
            self.line_id,
            self.remaining,
            self.full_at,
            self.heard_at,
            self.refused_until,
            self.local[0],
            self.local[1],
            self.local[2],
            self.local[3],
            self.local_since,
            self.owed,
            self.values[0],
            self.values[1],
            self.values[2],
        ]);
    }

    /// Keeps the values of `limit`, a request's limit, if they vary (see
    /// [`Kept::values`]).
    pub fn set_values(&mut self, limit: &Limit) {
        if limit.is_varying() {
            let r = limit.rate();
            self.values = [r.count, r.period_us, limit.burst()];
        }
    }

    /// The key's limit on `line` (the line as configured): `line` itself
    /// if its values do not vary, else a line of the values kept; `None`
    /// where none are (or they make no line).
    pub fn limit_of(&self, line: &Limit) -> Option<Limit> {
        if !line.is_varying() {
            return Some(*line);
        }
        let [count, period_us, burst] = self.values;
        Limit::new(line.algorithm(), Rate { count, period_us }, burst).ok().map(Limit::varying)
    }

    /// A request of `cost` at `now`: spent from a lease if one holds it,
    /// else refused while Redis said a lone request would be, else asked
    /// of Redis, with what a lease holds of it spent.
    pub fn decide(&mut self, now: u64, cost: u64) -> Local {
        if let Some(spent) = self.slot.take(now, cost) {
            return self.spent(now, Part::one(spent, cost));
        }
        if now < self.refused_until {
            return Local::Refused {
                retry_after_us: self.refused_until - now,
                reset_us: self.full_at.saturating_sub(now),
            };
        }
        match self.slot.take_part(now, cost) {
            Some(part) if part.units() == cost => self.spent(now, part),
            Some(part) => Local::Part(part),
            None => Local::Ask,
        }
    }

    /// A request admitted at `now` on the units `spent` of the leases.
    fn spent(&self, now: u64, spent: Part) -> Local {
        let remaining = self.remaining.saturating_add(self.slot.left(now));
        Local::Spent { spent, remaining, reset_us: self.full_at.saturating_sub(now) }
    }

    /// Redis refused at `at` (its clock) a request of `cost` that the
    /// leases did not hold, answered at `now`, a lone one passing
    /// `retry_after_us` later (`None`: never), the line full `reset_us`
    /// later: lone requests are refused here until then. Only a request
    /// of one unit says when a lone request passes; a costlier one
    /// teaches nothing.
    pub fn refused(&mut self, now: u64, at: u64, cost: u64, retry_after_us: Option<u64>, reset_us: u64) {
        if cost != 1 {
            return;
        }
        // (never: a line whose burst is below one unit, which nginx -t refuses)
        let wait = retry_after_us.unwrap_or(reset_us);
        self.refused_until = now.saturating_add(wait);
        self.heard(at, 0, now.saturating_add(reset_us));
    }

    /// What the sync at `now` sends for the key, with the times of `h`,
    /// `nodes` nodes sharing the line ([`Slot::sync`]): no new lease while
    /// Redis' last refusal holds past the next sync (a lease then would
    /// be granted nothing, and a key refused under a flood would cost
    /// Redis a call every interval).
    pub fn sync(&mut self, now: u64, h: Horizon, nodes: u64) -> Option<super::SyncArg> {
        self.slot.end_interval();
        self.sync_between(now, h, nodes)
    }

    /// [`Kept::sync`] between two syncs of the cadence, the interval's
    /// demand not folded in yet (see [`Slot::sync_asking`]).
    pub fn sync_between(&mut self, now: u64, h: Horizon, nodes: u64) -> Option<super::SyncArg> {
        let ask = h.next >= self.refused_until;
        self.slot.sync_asking(now, h, self.last_remaining(), nodes, ask)
    }

    /// A request of `cost` at `now` that the leases do not hold, decided on
    /// this node alone while Redis cannot be reached (it last answered at
    /// `since`): on `share`, this node's share of `line` among `nodes`
    /// ([`super::share`]; `None`: a share of nothing, refused). A share's
    /// state starts afresh for each outage, charged first with this node's
    /// part of what the line had used when last heard of, so that the
    /// nodes together admit about what the line had left, not a whole
    /// line more. What it admits is owed to Redis.
    pub fn decide_local(
        &mut self,
        now: u64,
        cost: u64,
        line: &Limit,
        share: Option<&Limit>,
        nodes: u64,
        since: u64,
    ) -> Outcome {
        let Some(share) = share else { return Outcome::reject(0, 0, None) };
        if self.local_since != since {
            self.local = [0; 4];
            self.local_since = since;
            let left = self.last_remaining().min(line.burst());
            let used = (line.burst() - left).div_ceil(nodes.max(1)).min(share.burst());
            if used > 0 {
                share.commit(&mut self.local, now, used);
            }
        }
        let mut d = Decision::REJECTED;
        share.acquire_into(&mut self.local, now, cost, &mut d);
        if d.outcome.admitted {
            self.owed = self.owed.saturating_add(cost);
        }
        d.outcome
    }

    /// Redis decided at `at` (its clock) `cost` units of a request the
    /// leases did not hold, answered at `now` with `o`, the leases having
    /// paid `part` of it ([`Local::Part`]): what the node learns, and what
    /// it reports the line has left (its view: what Redis said last and
    /// what the leases hold; a refusal's, Redis' own, which what it said
    /// last may be older than). A part of a cost Redis refused the rest of
    /// goes back to its leases at once, whatever becomes of the request (a
    /// dry-run line's goes on), and counts in the view.
    pub fn decided(&mut self, now: u64, at: u64, o: &Outcome, cost: u64, part: &Part) -> u64 {
        let said = match o.admitted {
            true => {
                self.seen(now, at, o.remaining, o.reset_us);
                self.remaining
            }
            false => {
                self.slot.put_back_part(part);
                self.refused(now, at, cost, o.retry_after_us, o.reset_us);
                o.remaining
            }
        };
        said.saturating_add(self.slot.left(now))
    }

    /// Redis admitted at `at` (its clock) a request the leases did not
    /// hold, answered at `now`, the line left with `remaining` at once and
    /// full `reset_us` later.
    pub fn seen(&mut self, now: u64, at: u64, remaining: u64, reset_us: u64) {
        self.heard(at, remaining, now.saturating_add(reset_us));
        self.refused_until = 0;
    }

    /// What the node knows of the line, and so what it reports, once
    /// Redis said at `at` (its clock; 0: unknown, taken as the latest)
    /// that the line has `remaining` at once, full at `full_at`: unless
    /// Redis said something later already (a grant ran after the request
    /// whose reply comes now, or the other way round), which holds then.
    /// What the line has left, as the node sees it, is then this plus
    /// what its leases hold, but while a grant Redis made before `at` has
    /// not come back: those units are the node's, yet not known to it.
    fn heard(&mut self, at: u64, remaining: u64, full_at: u64) {
        if at != 0 && at < self.heard_at && self.heard_at - at <= CROSSING_US {
            return;
        }
        self.remaining = remaining;
        self.full_at = full_at;
        if at != 0 {
            self.heard_at = at;
        }
    }

    /// What the line had left at once when last heard of: as much as may
    /// be asked for (`u64::MAX`) before anything is known.
    pub fn last_remaining(&self) -> u64 {
        match self.full_at {
            0 => u64::MAX,
            _ => self.remaining,
        }
    }

    /// How many units to ask for, in its call, with a request of `cost`
    /// at `now` that [`Kept::decide`] left to Redis, with the times of `h`
    /// and `nodes` nodes sharing the line ([`Slot::ask_with`]).
    pub fn ask_with(&mut self, now: u64, h: Horizon, nodes: u64) -> u64 {
        self.slot.ask_with(now, h, self.last_remaining(), nodes)
    }

    /// The answer to a request that asked for a lease ([`Kept::ask_with`]):
    /// the grant it brought (`None`: the call failed, or its reply held
    /// none), living from when it was asked for.
    pub fn answered(&mut self, g: Option<&LeaseGrant>) {
        let sent = self.slot.asking_since();
        match g {
            // (asked for since, by no other call: a lease never lives from a later time than
            // its call was sent)
            Some(g) if sent != 0 => self.granted(sent, g),
            _ => self.slot.unanswered(sent),
        }
    }

    /// The grant a sync sent at `sent` brought (see [`Slot::granted`]),
    /// and what it says of the line.
    pub fn granted(&mut self, sent: u64, g: &LeaseGrant) {
        self.slot.granted(sent, g.units, g.words, g.life_us);
        self.heard(g.at_us, g.remaining, sent.saturating_add(g.reset_us));
        if g.units > 0 {
            self.refused_until = 0;
        }
    }
}

/// How much earlier than the last word heard a reply may say Redis ran
/// its call, and be taken for one that crossed it (and so be older): more,
/// and Redis' clock stepped back (a restart, a failover to another host),
/// and the reply is news.
const CROSSING_US: u64 = 1_000_000;

/// Words of a [`Held`]: its units left and granted share one, so that a
/// record fits a 256-byte slab slot (see [`Kept::WORDS`]).
const HELD_WORDS: usize = 4;
