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
//! generation in the field and is decided as charged already; a give-back
//! sent before it is counted in it, and is dropped; a take of that
//! heartbeat counted but that did not hold is given back by a correction,
//! applied only where that heartbeat set the field. A lost give-back, or a
//! take whose reply was lost, is so set right by the next heartbeat, and a
//! copy of a call that comes late can only count more, never less.

use std::collections::BTreeMap;

use super::{HoldOp, Holder};
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

/// A key's fields, by worker.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Holders {
    pub fields: BTreeMap<String, Field>,
}

impl Holders {
    /// The units the live fields hold at `now_ms`.
    pub fn held(&self, now_ms: u64) -> u64 {
        self.fields.values().filter(|f| f.deadline_ms >= now_ms).map(|f| f.count).sum()
    }

    /// Drops the fields lapsed at `now_ms`: the units they held.
    fn reclaim(&mut self, now_ms: u64) -> u64 {
        let lapsed: u64 = self.fields.values().filter(|f| f.deadline_ms < now_ms).map(|f| f.count).sum();
        self.fields.retain(|_, f| f.deadline_ms >= now_ms);
        lapsed
    }

    /// A take of `cost` units on `limit` by `holder` at `now_ms` (the
    /// script's `concurrent`), committed or only checked: the outcome, and
    /// the units reclaimed from lapsed fields (committing only; whatever it
    /// decides). A cost of 0 passes and writes nothing but the reclaim.
    pub fn take(&mut self, limit: &Limit, cost: u64, holder: &Holder, now_ms: u64, commit: bool) -> (Outcome, u64) {
        let held = self.held(now_ms);
        let reclaimed = match commit {
            true => self.reclaim(now_ms),
            false => 0,
        };
        // (live only: a lapsed field is a worker gone, whether or not this
        // take commits and drops it)
        let mine = self.fields.get(holder.worker).copied().filter(|f| f.deadline_ms >= now_ms);
        // A take the worker's later heartbeat counted already.
        let need = match mine {
            Some(f) if f.gen > holder.gen => 0,
            _ => cost,
        };
        let free = limit.burst().saturating_sub(held);
        if need > free {
            return (Outcome::reject(free, 0, None), reclaimed);
        }
        if commit && need > 0 {
            let (count, gen, set) = match mine {
                Some(f) if f.gen >= holder.gen => (f.count + need, f.gen, f.set),
                Some(f) => (f.count + need, holder.gen, false),
                None => (need, holder.gen, false),
            };
            let deadline_ms = now_ms + holder.life_ms;
            self.fields.insert(holder.worker.to_string(), Field { count, gen, deadline_ms, set });
        }
        (Outcome::admit(free - need, 0, 0), reclaimed)
    }

    /// One op of `worker`'s `conn_put` call at `now_ms`, its field living
    /// `life_ms` more if written: the units reclaimed from lapsed fields.
    pub fn put(&mut self, worker: &str, life_ms: u64, op: HoldOp, now_ms: u64) -> u64 {
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
