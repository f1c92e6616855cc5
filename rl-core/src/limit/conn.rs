//! `concurrent`: the requests of a key in flight, at most the burst (`max`).
//! One word, the units held. A request holds its cost from its admission
//! until it ends, when the caller gives it back with [`Limit::refund`];
//! time plays no part (`now` is ignored), so nothing refills and a state is
//! back to full only once every holder has ended.
//!
//! Rejected requests have no honest wait (no one knows when a holder
//! ends): their `retry_after_us` is `None`, as for a cost that never
//! passes, and `reset_us` is always 0.

use super::{Charge, Decision, Limit, Outcome};

/// Whether a request of `cost` fits beside the `held` units, and what is
/// left after it (or now, when it does not fit).
fn fits(limit: &Limit, held: u64, cost: u64) -> Outcome {
    let free = limit.burst.saturating_sub(held);
    match cost <= free {
        true => Outcome::admit(free - cost, 0, 0),
        false => Outcome::reject(free, 0, None),
    }
}

pub(super) fn check(limit: &Limit, s: &[u64; 1], cost: u64) -> Outcome {
    fits(limit, s[0], cost)
}

pub(super) fn acquire(limit: &Limit, s: &mut [u64; 1], cost: u64, out: &mut Decision) {
    let outcome = fits(limit, s[0], cost);
    out.outcome = outcome;
    out.charge = Charge::NONE;
    if outcome.admitted && cost != 0 {
        s[0] += cost;
        out.charge = Charge { cost, ..Charge::NONE };
    }
}

/// Holds `cost` whatever is held already (saturating).
pub(super) fn overdraw(s: &mut [u64], cost: u64) -> Charge {
    let Some(held) = s.first_mut() else {
        return Charge::NONE;
    };
    match held.checked_add(cost) {
        Some(n) => {
            *held = n;
            Charge { cost, ..Charge::NONE }
        }
        None => {
            *held = u64::MAX;
            Charge::NONE
        }
    }
}

/// Gives back what a charge holds, as far as the state holds it: from the
/// units in flight, and from its class's on a line of several
/// ([`Charge::held`]).
pub(super) fn refund(s: &mut [u64], charge: &Charge) {
    super::wait::give_back_units(s, charge.held_class(), charge.cost);
}
