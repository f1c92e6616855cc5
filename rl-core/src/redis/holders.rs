//! A [`Limit::concurrent`] line's key on Redis, as the script keeps it: a
//! field per nginx worker holding units of it, renewed by the worker's
//! takes, give-backs and heartbeats, given back (reclaimed) once it lapses.
//! The model the script's `concurrent` and `conn_put` are held to (the
//! Lua-vs-model tests), and what the module's bookkeeping relies on.
//!
//! What makes the count right whatever is lost on the way: a worker's
//! heartbeat of generation `g` sets its field to what the worker counts
//! (its held units and its takes in flight, each counted from when it was
//! sent). A take sent before that heartbeat, coming after it, finds a later
//! generation in the field: its units are counted already, and it is let
//! in only while what the key holds, its units among them, is within the
//! max (a heartbeat that overtook the take set the field without asking);
//! refused, the correction below gives them back; a give-back
//! sent before it is counted in it, and is dropped; a take of that
//! heartbeat counted but that did not hold is given back by a correction,
//! applied only where that heartbeat set the field. A lost give-back, or a
//! take whose reply was lost, is so set right by the next heartbeat, and a
//! copy of a call that comes late can only count more, never less.
//!
//! A line with a queue keeps a waiting line in the same key: a place per
//! request waiting for units (`#ticket` in the script: its units and when
//! it lapses), tickets handed out in order (`#`). A request is let in when
//! its units and those of every live place ahead of it fit in what is free
//! (so an arrival never passes a waiter, and every waiter that fits gets in
//! at its next look, not one at a time); a place lapses unless its request
//! looks again (a worker gone, a leave lost), and one of a request whose
//! wait is over lapses a second after it, whoever looks first dropping it.

use std::collections::BTreeMap;

use super::{ClassArg, HoldOp, Holder, Wait};
use crate::limit::{Limit, Outcome};

/// A worker's field: what it holds, and how it was last written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Field {
    pub count: u64,
    /// The generation of the worker's last heartbeat applied, or of its
    /// last change when that was newer.
    pub gen: u64,
    /// When the field lapses unless renewed (ms of the Redis clock).
    pub deadline_ms: u64,
    /// The count was set by the heartbeat of `gen`.
    pub set: bool,
}

/// A place in a key's waiting line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Place {
    /// The units its request asks for.
    pub cost: u64,
    /// When it lapses unless renewed (ms of the Redis clock).
    pub deadline_ms: u64,
    /// Its request's class, on a line of classes (`None`: written without
    /// one, read as the lowest).
    pub class: Option<u64>,
}

/// A key's fields, by worker, and its waiting line.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Holders {
    pub fields: BTreeMap<String, Field>,
    /// The waiting line's places, by ticket.
    pub places: BTreeMap<u64, Place>,
    /// The ticket the next place gets (0 before any: the first is 1).
    pub next_ticket: u64,
}

/// How a take that waits ends: let in (the outcome says so), waiting in
/// the line with `ticket` (`ahead`: the live places before it), or
/// refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Turn {
    Admitted,
    Waiting { ticket: u64, ahead: u64 },
    Refused,
}

/// The class of a worker's field named `name` on a line whose lowest
/// class is `low`: the digits after its last "/", if they name one up to
/// `low`; else the lowest.
pub fn field_class(name: &str, low: usize) -> usize {
    match name.rsplit_once('/') {
        Some((_, d)) if !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()) => {
            d.parse::<usize>().ok().filter(|&k| k <= low).unwrap_or(low)
        }
        _ => low,
    }
}

/// The deadline a place is given at `now_ms`: its request's wait
/// (`left_ms`) and a second, at most the fields' `life_ms` (a request
/// that looks again renews it).
pub fn place_deadline(now_ms: u64, left_ms: u64, life_ms: u64) -> u64 {
    now_ms.saturating_add(left_ms.saturating_add(1000).min(life_ms))
}

impl Holders {
    /// The units the live fields hold at `now_ms`.
    pub fn held(&self, now_ms: u64) -> u64 {
        self.fields.values().filter(|f| f.deadline_ms >= now_ms).map(|f| f.count).sum()
    }

    /// Drops the fields and places lapsed at `now_ms`: the units the
    /// fields held.
    fn reclaim(&mut self, now_ms: u64) -> u64 {
        let lapsed: u64 = self.fields.values().filter(|f| f.deadline_ms < now_ms).map(|f| f.count).sum();
        self.fields.retain(|_, f| f.deadline_ms >= now_ms);
        self.places.retain(|_, p| p.deadline_ms >= now_ms);
        lapsed
    }

    /// A take of `cost` units on `limit` by `holder` at `now_ms` (the
    /// script's `concurrent`), committed or only checked: the outcome, and
    /// the units reclaimed from lapsed fields (committing only; whatever it
    /// decides). A cost of 0 passes and writes nothing but the reclaim.
    pub fn take(&mut self, limit: &Limit, cost: u64, holder: &Holder, now_ms: u64, commit: bool) -> (Outcome, u64) {
        let (o, reclaimed, _) = self.take_waiting(limit, cost, holder, None, None, now_ms, commit);
        (o, reclaimed)
    }

    /// [`Holders::take`] of a line that may wait (`wait`; `None`: one that
    /// never does, as [`Holders::take`]), of classes or not (`classes`):
    /// also how it ends in the line. A waiting outcome (not admitted)
    /// reports its ticket as `reset_us` and the live places ahead as
    /// `delay_us`, as the script's reply does. Every take leaves what is
    /// free to the live places ahead of it (all of them for one that
    /// arrives: on a line of classes, those of its class and above); what
    /// remains is what is free beyond those places (and, admitted, its own
    /// units). On a line of classes, what is free for class `k` also
    /// leaves the unused reserve of each class above it (its reserve less
    /// what its fields hold; a worker's field of class `k` is named with
    /// "/k"). A request whose place is gone (lapsed, taken by a higher
    /// class, or never made) is refused; one that arrives takes a place
    /// when it must wait, its units fit in what the reserves above leave
    /// of the max, its class has a place free, and the line has one
    /// (or, of classes, a lower class has one to give up: the newest of
    /// the lowest), committing at a cost above 0; else it is refused. A
    /// cost of 0 passes and writes nothing but the reclaim.
    #[allow(clippy::too_many_arguments)]
    pub fn take_waiting(
        &mut self,
        limit: &Limit,
        cost: u64,
        holder: &Holder,
        wait: Option<Wait>,
        classes: Option<ClassArg>,
        now_ms: u64,
        commit: bool,
    ) -> (Outcome, u64, Turn) {
        let ticket = wait.map_or(0, |w| w.ticket);
        let low = classes.map_or(1, |c| c.lanes.len()).saturating_sub(1);
        let k = classes.map(|c| usize::from(c.class));
        let place_class = |p: &Place| p.class.map_or(low, |c| usize::try_from(c).unwrap_or(usize::MAX).min(low));
        let live: Vec<(u64, Place)> =
            self.places.iter().filter(|(_, p)| p.deadline_ms >= now_ms).map(|(t, p)| (*t, *p)).collect();
        let own = live.iter().find(|(t, _)| ticket > 0 && *t == ticket).map(|(_, p)| *p);
        let is_ahead = |t: u64, p: &Place| {
            let pk = place_class(p);
            t != ticket
                && match k {
                    Some(k) => pk < k || (pk == k && (ticket == 0 || t < ticket)),
                    None => ticket == 0 || t < ticket,
                }
        };
        let (nahead, ahead) = live
            .iter()
            .filter(|(t, p)| is_ahead(*t, p))
            .fold((0u64, 0u64), |(n, units), (_, p)| (n + 1, units.saturating_add(p.cost)));
        let held = self.held(now_ms);
        // The unused reserves of the classes above, and all their reserves.
        let (unused, kept) = match (classes, k) {
            (Some(c), Some(k)) => c.lanes.iter().take(k).enumerate().fold((0u64, 0u64), |(u, kept), (j, l)| {
                (u.saturating_add(l.reserve.saturating_sub(self.held_by_class(now_ms, j, low))), kept + l.reserve)
            }),
            _ => (0, 0),
        };
        let reclaimed = match commit {
            true => self.reclaim(now_ms),
            false => 0,
        };
        // (live only: a lapsed field is a worker gone, whether or not this
        // take commits and drops it)
        let mine = self.fields.get(holder.worker).copied().filter(|f| f.deadline_ms >= now_ms);
        // A take the worker's later heartbeat counted already: its units need no room of
        // their own.
        let need = match mine {
            Some(f) if f.gen > holder.gen => 0,
            _ => cost,
        };
        let taken = held.saturating_add(unused).saturating_add(ahead);
        let avail = limit.burst().saturating_sub(taken);
        if ticket > 0 && own.is_none() && cost > 0 {
            return (Outcome::reject(avail, 0, None), reclaimed, Turn::Refused);
        }
        // (a take the heartbeat counted is in `held` already: let in only while what is held,
        // with it, is within the max; that heartbeat may have come first and set the field
        // beyond it)
        if cost == 0 || taken.saturating_add(need) <= limit.burst() {
            if commit && need > 0 {
                let (count, gen, set) = match mine {
                    Some(f) if f.gen >= holder.gen => (f.count + need, f.gen, f.set),
                    Some(f) => (f.count + need, holder.gen, false),
                    None => (need, holder.gen, false),
                };
                let deadline_ms = now_ms + holder.life_ms;
                self.fields.insert(holder.worker.to_string(), Field { count, gen, deadline_ms, set });
            }
            if commit && cost > 0 && ticket > 0 {
                self.places.remove(&ticket);
            }
            return (Outcome::admit(avail - need, 0, 0), reclaimed, Turn::Admitted);
        }
        let waits = |ticket: u64| Outcome { reset_us: ticket, delay_us: nahead, ..Outcome::reject(avail, 0, None) };
        let class = k.map(|k| k as u64);
        let refused = (Outcome::reject(avail, 0, None), reclaimed, Turn::Refused);
        let Some(w) = wait else { return refused };
        if let Some(p) = own {
            // (renewed once half its life is gone, if that gains a second: a look a request
            // makes every few ms writes nothing, nor does one late in its wait, whose
            // deadline stays at its end)
            let deadline_ms = place_deadline(now_ms, w.left_ms, holder.life_ms);
            if commit
                && cost > 0
                && p.deadline_ms.saturating_sub(now_ms) < holder.life_ms / 2
                && deadline_ms >= p.deadline_ms.saturating_add(1000)
            {
                self.places.insert(ticket, Place { cost: p.cost, deadline_ms, class });
            }
            return (waits(ticket), reclaimed, Turn::Waiting { ticket, ahead: nahead });
        }
        // (a request that asks for more than the reserves above leave of the max never fits:
        // no place)
        if !(limit.queue() > 0 && commit && cost > 0 && cost <= limit.burst().saturating_sub(kept)) {
            return refused;
        }
        if let (Some(c), Some(k)) = (classes, k) {
            let of_class = live.iter().filter(|(_, p)| place_class(p) == k).count() as u64;
            if of_class >= c.lanes.get(k).map_or(0, |l| l.places) {
                return refused;
            }
        }
        let nplaces = live.len() as u64;
        if nplaces >= limit.queue() {
            // The places of the classes below, newest of the lowest first.
            let mut below: Vec<(usize, u64)> = match k {
                Some(k) => live.iter().map(|(t, p)| (place_class(p), *t)).filter(|(pk, _)| *pk > k).collect(),
                None => Vec::new(),
            };
            let want = (nplaces - limit.queue() + 1) as usize;
            if below.len() < want {
                return refused;
            }
            below.sort_unstable_by(|x, y| y.cmp(x));
            for (_, t) in below.into_iter().take(want) {
                self.places.remove(&t);
            }
        }
        let t = self.next_ticket.max(1);
        self.next_ticket = t + 1;
        let deadline_ms = place_deadline(now_ms, w.left_ms, holder.life_ms);
        self.places.insert(t, Place { cost, deadline_ms, class });
        (waits(t), reclaimed, Turn::Waiting { ticket: t, ahead: nahead })
    }

    /// The units the live fields of class `k` hold (a line's lowest class
    /// being `low`): a field named "worker/k" is of class `k`, one that
    /// names no class (or none up to `low`) of the lowest.
    fn held_by_class(&self, now_ms: u64, k: usize, low: usize) -> u64 {
        self.fields
            .iter()
            .filter(|(name, f)| f.deadline_ms >= now_ms && field_class(name, low) == k)
            .map(|(_, f)| f.count)
            .sum()
    }

    /// A request gives up its place `ticket` (it ends, or its wait is
    /// over): the units reclaimed from lapsed fields.
    pub fn leave(&mut self, ticket: u64, now_ms: u64) -> u64 {
        let reclaimed = self.reclaim(now_ms);
        self.places.remove(&ticket);
        reclaimed
    }

    /// One op of `worker`'s `conn_put` call at `now_ms`, its field living
    /// `life_ms` more if written: the units reclaimed from lapsed fields.
    pub fn put(&mut self, worker: &str, life_ms: u64, op: HoldOp, now_ms: u64) -> u64 {
        if let HoldOp::Leave { ticket } = op {
            return self.leave(ticket, now_ms);
        }
        let reclaimed = self.reclaim(now_ms);
        let mine = self.fields.get(worker).copied();
        let next = match (op, mine) {
            (HoldOp::Set { gen, .. }, Some(f)) if f.gen >= gen => Some((f.count, f.gen, f.set)),
            (HoldOp::Set { units, gen }, _) => Some((units, gen, true)),
            (_, None) => None,
            (HoldOp::GiveBack { units, gen }, Some(f)) if f.gen < gen => {
                Some((f.count.saturating_sub(units), gen, false))
            }
            (HoldOp::GiveBack { units, gen }, Some(f)) if f.gen == gen => {
                Some((f.count.saturating_sub(units), f.gen, f.set))
            }
            (HoldOp::Correct { units, gen }, Some(f)) if f.gen == gen && f.set => {
                Some((f.count.saturating_sub(units), f.gen, f.set))
            }
            (_, Some(f)) => Some((f.count, f.gen, f.set)),
        };
        match next {
            None => {}
            Some((0, ..)) => {
                self.fields.remove(worker);
            }
            Some((count, gen, set)) => {
                self.fields.insert(worker.to_string(), Field { count, gen, deadline_ms: now_ms + life_ms, set });
            }
        }
        reclaimed
    }
}
