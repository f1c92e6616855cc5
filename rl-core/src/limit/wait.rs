//! The waiting line of a concurrency limit (`rl_conn ... queue=`): requests
//! over the limit wait for a slot, at most `q` of them, each at most until
//! its deadline; a waiter that leaves (its client gone, its wait over)
//! gives its place up at once.
//!
//! Waiters come in classes ([`Lane`]s, highest first; one when the line has
//! no `classes=`). Within a class, first come, first served; across
//! classes, a waiter is let in only while no waiter of a higher class is
//! left, and an arrival never passes a live waiter of its own class or a
//! higher one. Each class has its own places; when all `q` places of the
//! line are taken, an arrival of a higher class takes the place of the
//! newest waiter of the lowest class that has one, which finds its place
//! gone when it looks next.
//!
//! A class may keep a reserve ([`Lane::reserve`]) from the classes below
//! it: a request is let in only if it leaves free the unused part of the
//! reserve of every class above its own (what a class holds itself uses
//! its reserve up). So a class that holds less than its reserve always
//! finds a unit that no class below it could take; only a class above it,
//! which outranks it, may have taken it.
//!
//! A reserve may be lent ([`Lane::lend`]): while its class is unused
//! (holds nothing, and nobody of it waits), the classes below may take
//! it. A unit lent stays with its request until that request ends; once
//! the class is in use again, its reserve is kept as above: the classes
//! below take no unit of its unused part, so each unit given back goes to
//! the class (which, waiting, is ahead of them anyway) until it holds its
//! reserve. The guarantee is weaker: the class's first request after an
//! unused spell may have to wait for a borrowed unit to come back.
//!
//! A rate line (`rl_limit ... queue= classes=`) waits in the same line
//! ([`Gate::Rate`]): what a waiter waits for is the algorithm admitting a
//! request of its cost plus the reserves of the classes above it, as a
//! request of its class is decided without a queue; let in, it is charged
//! its cost. The line's order is the same; only the gate differs.
//!
//! The state is caller-owned words after the line's own (the units in
//! flight, [`super::conn`]): `[live, held per class, (head, tail) per
//! class, rings...]`, the units held per class only when there are
//! several. `live` counts the places whose deadline is set. Tickets of a lane are
//! issued in order (`tail`), served in order (`head`); ticket `t` keeps its
//! deadline (whole seconds, rounded up, plus one: a wait that runs late by a
//! timer's tick still finds its place) in the lane's `ring[t % places]`, two
//! to a word, 0 once given up. A place whose deadline has passed is given up
//! by whoever looks next; a waiter whose worker died (`kill -9`) holds its
//! place up to its deadline, never longer. Tickets are never issued twice:
//! a waiter whose place was taken cannot find it again under another's.

use super::{Decision, Limit, Outcome};

/// One class of requests: its places in the waiting line, and the units
/// it keeps from the classes below it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Lane {
    pub places: u64,
    pub reserve: u64,
    /// The reserve may be borrowed while the class is unused.
    pub lend: bool,
}

/// The most classes a line may have.
pub const MAX_LANES: usize = 16;

/// Words a waiting line of `lanes` takes after the line's own (a rate
/// line's too: its words of units held per class stay 0, and the layout is
/// one).
pub fn words(lanes: &[Lane]) -> usize {
    1 + held_words(lanes) + 2 * lanes.len() + lanes.iter().map(|l| l.places.div_ceil(2) as usize).sum::<usize>()
}

/// Words of units held per class: none for one class (all units are its).
fn held_words(lanes: &[Lane]) -> usize {
    match lanes.len() {
        0 | 1 => 0,
        n => n,
    }
}

/// Where class `k`'s units held are in a state of several classes: after
/// the units in flight and `live` (the same whatever the number of
/// classes, for a give-back that knows only the class).
pub const fn held_at(k: usize) -> usize {
    2 + k
}

/// Gives back `units` of a concurrency state `s` (its first word, the
/// units in flight), and of class `class` (its index plus one, as
/// [`super::Charge::held_class`]; 0 on a line of one class) in a state of
/// several classes; as far as the state holds them.
pub fn give_back_units(s: &mut [u64], class: u64, units: u64) {
    if let Some(held) = s.first_mut() {
        *held = held.saturating_sub(units);
    }
    let at = class.checked_sub(1).and_then(|k| usize::try_from(k).ok()).map_or(usize::MAX, held_at);
    if let Some(held) = s.get_mut(at) {
        *held = held.saturating_sub(units);
    }
}

/// What an arrival gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arrival {
    /// Units free and nobody of its class or above waiting: admitted at
    /// once (the units are taken).
    Admitted,
    /// A place in the line, to [`Wait::poll`] with.
    Waiting { ticket: u64 },
    /// Its class's places or the line's are full (and no lower class has a
    /// place to give up), or `cost` can never fit: refused at once.
    Refused,
}

/// What a waiter finds when it looks again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Turn {
    /// Its turn, and its units: admitted (the units are taken, the place
    /// given up).
    Admitted,
    /// Still waiting, with this many places before it (its class's and the
    /// classes' above).
    Waiting { ahead: u64 },
    /// Its place is gone (its deadline passed, or a higher class took
    /// it): refused.
    Gone,
}

/// What a waiter at the head of the line waits for.
pub enum Gate<'a> {
    /// A free unit: a concurrency line's units in flight (`units`) of at
    /// most `max`, its classes' reserves kept ([`Wait::free`]).
    Units { units: &'a mut u64, max: u64 },
    /// A rate line's algorithm admitting the request ([`RateGate`]).
    Rate(RateGate<'a>),
}

/// A rate line's algorithm as a waiting line's gate: at `now_us`, a request
/// of class `k` passes where one of its cost plus `kept[k]` would
/// ([`Limit::check_keeping`]); let in, it is charged its cost, and what was
/// charged is left in `taken`.
pub struct RateGate<'a> {
    pub limit: &'a Limit,
    pub state: &'a mut [u64],
    pub now_us: u64,
    pub kept: &'a [u64],
    pub taken: Decision,
}

impl RateGate<'_> {
    fn kept(&self, k: usize) -> u64 {
        self.kept.get(k).copied().unwrap_or(0)
    }

    fn check(&self, k: usize, cost: u64) -> Outcome {
        self.limit.check_keeping(self.state, self.now_us, cost, self.kept(k))
    }
}

/// A view of one key's state: what its waiters wait for (`gate`), its
/// waiting line of `q` places in all (`line`, [`words`] long) and the line's classes (`lanes`, highest first, at least one).
pub struct Wait<'a> {
    pub gate: Gate<'a>,
    pub q: u64,
    pub lanes: &'a [Lane],
    pub line: &'a mut [u64],
}

impl Wait<'_> {
    fn word(&self, i: usize) -> u64 {
        self.line.get(i).copied().unwrap_or(0)
    }

    fn set_word(&mut self, i: usize, v: u64) {
        if let Some(w) = self.line.get_mut(i) {
            *w = v;
        }
    }

    fn live(&self) -> u64 {
        self.word(0)
    }

    fn head(&self, k: usize) -> u64 {
        self.word(1 + held_words(self.lanes) + 2 * k)
    }

    fn tail(&self, k: usize) -> u64 {
        self.word(2 + held_words(self.lanes) + 2 * k)
    }

    /// Units class `k` holds (a rate line's classes hold none).
    fn held(&self, k: usize) -> u64 {
        match &self.gate {
            Gate::Units { units, .. } if self.lanes.len() <= 1 => **units,
            Gate::Units { .. } => self.word(held_at(k) - 1),
            Gate::Rate(_) => 0,
        }
    }

    /// Class `k` takes `cost` units: holds them, or is charged them.
    fn hold(&mut self, k: usize, cost: u64) {
        match &mut self.gate {
            Gate::Units { units, .. } => **units += cost,
            Gate::Rate(g) => {
                let kept = g.kept(k);
                g.limit.acquire_keeping(g.state, g.now_us, cost, kept, &mut g.taken);
                return;
            }
        }
        if self.lanes.len() > 1 {
            let held = self.word(held_at(k) - 1);
            self.set_word(held_at(k) - 1, held + cost);
        }
    }

    /// Class `k` gives back `cost` units (its request ended); a rate line
    /// has nothing to give back.
    pub fn give_back(&mut self, k: usize, cost: u64) {
        match &mut self.gate {
            Gate::Units { units, .. } => **units = units.saturating_sub(cost),
            Gate::Rate(_) => return,
        }
        if self.lanes.len() > 1 {
            let held = self.word(held_at(k) - 1);
            self.set_word(held_at(k) - 1, held.saturating_sub(cost));
        }
    }

    /// Where lane `k`'s ticket `t` keeps its deadline: its word, and the
    /// shift in it.
    fn at(&self, k: usize, t: u64) -> (usize, u32) {
        let lanes = self.lanes.len();
        let base = 1
            + held_words(self.lanes)
            + 2 * lanes
            + self.lanes.iter().take(k).map(|l| l.places.div_ceil(2) as usize).sum::<usize>();
        let places = self.lanes.get(k).map_or(1, |l| l.places.max(1));
        let i = (t % places) as usize;
        (base + i / 2, 32 * (i % 2) as u32)
    }

    /// The deadline kept for lane `k`'s ticket `t` (0: none).
    fn deadline(&self, k: usize, t: u64) -> u32 {
        let (w, shift) = self.at(k, t);
        (self.word(w) >> shift) as u32
    }

    /// Keeps deadline `d` for a new place.
    fn take(&mut self, k: usize, t: u64, d: u32) {
        let (w, shift) = self.at(k, t);
        let word = (self.word(w) & !(0xffff_ffffu64 << shift)) | (u64::from(d) << shift);
        self.set_word(w, word);
        self.set_word(0, self.live() + 1);
    }

    /// Gives up lane `k`'s place `t`, if it is still taken.
    fn give_up(&mut self, k: usize, t: u64) {
        if self.deadline(k, t) == 0 {
            return;
        }
        let (w, shift) = self.at(k, t);
        self.set_word(w, self.word(w) & !(0xffff_ffffu64 << shift));
        self.set_word(0, self.live().saturating_sub(1));
    }

    /// Gives up the places at the head of each lane that are empty or
    /// past their deadline at `now_s`.
    fn advance(&mut self, now_s: u32) {
        for k in 0..self.lanes.len() {
            let (mut head, tail) = (self.head(k), self.tail(k));
            while head < tail {
                let d = self.deadline(k, head);
                if d != 0 && d >= now_s {
                    break;
                }
                self.give_up(k, head);
                head += 1;
            }
            self.set_word(1 + held_words(self.lanes) + 2 * k, head);
        }
    }

    /// Places taken in lanes above `k` (after [`Wait::advance`]: 0 when
    /// none of them has a live waiter).
    fn above(&self, k: usize) -> u64 {
        (0..k).map(|j| self.tail(j) - self.head(j)).sum()
    }

    fn fits(&self, k: usize, cost: u64) -> bool {
        match &self.gate {
            Gate::Units { .. } => cost <= self.free(k),
            Gate::Rate(g) => g.check(k, cost).admitted,
        }
    }

    /// The newest place of the lowest lane below `k` that has one: what
    /// an arrival of lane `k` takes when the line is full.
    fn newest_below(&self, k: usize) -> Option<(usize, u64)> {
        (k + 1..self.lanes.len()).rev().find_map(|j| {
            let head = self.head(j);
            (head..self.tail(j)).rev().find(|&t| self.deadline(j, t) != 0).map(|t| (j, t))
        })
    }

    fn valid(&self, k: usize) -> bool {
        k < self.lanes.len() && self.line.len() >= words(self.lanes)
    }

    /// A request of class `k` and `cost` that cannot wait (a dry-run
    /// line's) comes at `now_s`: whether it is let in at once, as
    /// [`Wait::arrive`] would (the units are then taken).
    pub fn enter(&mut self, now_s: u32, k: usize, cost: u64) -> bool {
        if !self.valid(k) {
            return false;
        }
        self.advance(now_s);
        let first = self.head(k) == self.tail(k) && self.above(k) == 0;
        let enters = cost <= self.room(k) && first && self.fits(k, cost);
        if enters {
            self.hold(k, cost);
        }
        enters
    }

    /// A request of class `k` and `cost` arrives at `now_s` (seconds),
    /// willing to wait until `deadline_s`.
    pub fn arrive(&mut self, now_s: u32, k: usize, cost: u64, deadline_s: u32) -> Arrival {
        let Some(lane) = self.lanes.get(k).copied() else {
            return Arrival::Refused;
        };
        if self.enter(now_s, k, cost) {
            return Arrival::Admitted;
        }
        if !self.valid(k) || cost > self.room(k) {
            return Arrival::Refused;
        }
        let (head, tail) = (self.head(k), self.tail(k));
        if tail - head >= lane.places {
            return Arrival::Refused;
        }
        while self.live() >= self.q {
            match self.newest_below(k) {
                Some((j, t)) => self.give_up(j, t),
                None => return Arrival::Refused,
            }
        }
        self.take(k, tail, deadline_s.max(now_s).max(1));
        self.set_word(2 + held_words(self.lanes) + 2 * k, tail + 1);
        Arrival::Waiting { ticket: tail }
    }

    /// The waiter of lane `k` and `ticket` looks again at `now_s`.
    pub fn poll(&mut self, now_s: u32, k: usize, cost: u64, ticket: u64) -> Turn {
        if !self.valid(k) {
            return Turn::Gone;
        }
        self.advance(now_s);
        let head = self.head(k);
        if ticket < head || ticket >= self.tail(k) {
            return Turn::Gone;
        }
        let d = self.deadline(k, ticket);
        if d == 0 || d < now_s {
            // (past its deadline behind a live waiter: given up now, not when the head comes)
            self.give_up(k, ticket);
            return Turn::Gone;
        }
        let above = self.above(k);
        if ticket > head || above > 0 || !self.fits(k, cost) {
            return Turn::Waiting { ahead: above + ticket - head };
        }
        self.hold(k, cost);
        self.give_up(k, ticket);
        self.advance(now_s);
        Turn::Admitted
    }

    /// The waiter of lane `k` and `ticket` leaves the line (its client went
    /// away, or it stopped waiting).
    pub fn leave(&mut self, now_s: u32, k: usize, ticket: u64) {
        if !self.valid(k) {
            return;
        }
        if ticket >= self.head(k) && ticket < self.tail(k) {
            self.give_up(k, ticket);
        }
        self.advance(now_s);
    }

    /// Units free now for class `k`: what `max` leaves, less the unused
    /// reserves of the classes above it; on a rate line, what its class may
    /// still spend at once.
    pub fn free(&self, k: usize) -> u64 {
        match &self.gate {
            Gate::Units { units, max } => {
                let unused: u64 = (0..k).map(|j| self.kept_by(j)).sum();
                max.saturating_sub(**units).saturating_sub(unused)
            }
            Gate::Rate(g) => g.check(k, 0).remaining,
        }
    }

    /// What class `j`'s reserve keeps from the classes below it now: the
    /// part the class does not hold itself; nothing of a lent reserve
    /// while the class is unused (it holds nothing, and nobody of it waits).
    fn kept_by(&self, j: usize) -> u64 {
        let Some(lane) = self.lanes.get(j) else {
            return 0;
        };
        let held = self.held(j);
        match lane.lend && held == 0 && self.tail(j) == self.head(j) {
            true => 0,
            false => lane.reserve.saturating_sub(held),
        }
    }

    /// The most units class `k` may ever take at once: `max` (or the
    /// burst) less the reserves of the classes above it that are not lent.
    fn room(&self, k: usize) -> u64 {
        let kept: u64 = self.lanes.iter().take(k).filter(|l| !l.lend).map(|l| l.reserve).sum();
        let max = match &self.gate {
            Gate::Units { max, .. } => *max,
            Gate::Rate(g) => g.limit.burst(),
        };
        max.saturating_sub(kept)
    }

    /// On a rate line, the wait until a request of class `k` and `cost`
    /// would pass were it first in line (`None`: never, or not a rate
    /// line): when the head of the line looks next.
    pub fn retry_us(&self, k: usize, cost: u64) -> Option<u64> {
        match &self.gate {
            Gate::Units { .. } => None,
            Gate::Rate(g) => g.check(k, cost).retry_after_us,
        }
    }

    /// What a rate line's request let in was charged, and decided
    /// (`None` on a concurrency line).
    pub fn taken(&self) -> Option<Decision> {
        match &self.gate {
            Gate::Units { .. } => None,
            Gate::Rate(g) => Some(g.taken),
        }
    }

    /// Waiters with a place: those whose worker died count until their
    /// deadline is seen to pass (an arrival may so be refused with fewer
    /// than `q` waiting, never let in with more).
    pub fn waiting(&self) -> u64 {
        self.live()
    }
}
