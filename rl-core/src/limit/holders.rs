//! Who holds the units of a concurrency state (`rl_conn`): each worker's
//! count, so that the units of a worker that died can be given back without
//! a restart.
//!
//! A holder is a worker process (its pid and nginx process slot), with the
//! class it holds for and how many units, packed in one [`Holder`] word.
//! A plain concurrency state (one word of units, no waiting line, one
//! class) keeps up to [`INLINE`] holders in the spare words of its own
//! table entry, so that the usual request finds its count where it found
//! the state: [`take_inline`] and [`give_inline`]. A holder that finds no
//! word of its own and none free keeps its units elsewhere (the caller's
//! hold entries); what a worker holds of a key is the sum of both.

/// Holders a plain state keeps in its entry's spare words.
pub const INLINE: usize = 2;

/// A holder's pid, process slot, class and count, in one word: the pid in
/// the high 22 bits (Linux's pids are below 2^22, `PID_MAX_LIMIT`), the
/// process slot in the next 10 (nginx has at most 1024), the class in the
/// next 5 (its index plus one, 0 for a line of one class), the units in the
/// low 27 (a line holds at most [`crate::spec::MAX_CONN`], 2^20). A word
/// of 0 is no holder (no worker has pid 0); no holder's word is
/// `u64::MAX` (that needs class 31: [`super::wait::MAX_LANES`] is
/// 16), the tag of a state kept out of line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Holder {
    pub pid: u32,
    pub slot: u64,
    pub class: u64,
    pub count: u64,
}

const PID_BITS: u32 = 22;
/// Bits of the process slot.
pub const SLOT_BITS: u32 = 10;
const CLASS_BITS: u32 = 5;
const COUNT_BITS: u32 = 64 - PID_BITS - SLOT_BITS - CLASS_BITS;
const COUNT_MAX: u64 = (1 << COUNT_BITS) - 1;

impl Holder {
    /// Worker `pid` in process slot `slot`, holding nothing of class 0.
    pub fn worker(pid: u32, slot: u64) -> Holder {
        Holder { pid: pid & ((1 << PID_BITS) - 1), slot: slot & ((1 << SLOT_BITS) - 1), class: 0, count: 0 }
    }

    pub fn read(w: u64) -> Holder {
        Holder {
            pid: (w >> (64 - PID_BITS)) as u32,
            slot: (w >> (COUNT_BITS + CLASS_BITS)) & ((1 << SLOT_BITS) - 1),
            class: (w >> COUNT_BITS) & ((1 << CLASS_BITS) - 1),
            count: w & COUNT_MAX,
        }
    }

    pub fn word(self) -> u64 {
        (u64::from(self.pid & ((1 << PID_BITS) - 1)) << (64 - PID_BITS))
            | ((self.slot & ((1 << SLOT_BITS) - 1)) << (COUNT_BITS + CLASS_BITS))
            | ((self.class & ((1 << CLASS_BITS) - 1)) << COUNT_BITS)
            | self.count.min(COUNT_MAX)
    }

    /// Whether `w` is this worker's word (whatever its count and class).
    #[inline(always)]
    fn owns(self, w: u64) -> bool {
        const WHO: u64 = !((1 << (COUNT_BITS + CLASS_BITS)) - 1);
        w != 0 && (w & WHO) == (self.word() & WHO)
    }
}

/// Records that `me` holds `cost` more units in a plain state's holder
/// `words`: in its own word, else in one that holds nothing. False when
/// there is neither: the caller keeps the units elsewhere.
#[inline(always)]
pub fn take_inline(words: &mut [u64], me: Holder, cost: u64) -> bool {
    if let Some(w) = words.iter_mut().find(|w| me.owns(**w)) {
        let count = (*w & COUNT_MAX).saturating_add(cost);
        if count > COUNT_MAX {
            return false;
        }
        *w = Holder { count, ..me }.word();
        return true;
    }
    match words.iter_mut().find(|w| **w & COUNT_MAX == 0) {
        Some(w) if cost <= COUNT_MAX => {
            *w = Holder { count: cost, ..me }.word();
            true
        }
        _ => false,
    }
}

/// Takes up to `cost` of `me`'s units out of a plain state's holder
/// `words`; returns what they did not hold (kept elsewhere).
#[inline(always)]
pub fn give_inline(words: &mut [u64], me: Holder, cost: u64) -> u64 {
    let Some(w) = words.iter_mut().find(|w| me.owns(**w)) else {
        return cost;
    };
    let held = *w & COUNT_MAX;
    let given = held.min(cost);
    *w -= given;
    cost - given
}

/// Takes the units of the holders `gone` says are gone out of a plain
/// state's holder `words`: each such holder with units, as it was.
pub fn reclaim_inline(words: &mut [u64], gone: impl Fn(&Holder) -> bool) -> [Option<Holder>; INLINE] {
    let mut out = [None; INLINE];
    for (w, o) in words.iter_mut().zip(out.iter_mut()) {
        let h = Holder::read(*w);
        if *w != 0 && h.count > 0 && gone(&h) {
            *w = 0;
            *o = Some(h);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn word_round_trips() {
        let h = Holder { pid: 4_194_303, slot: 1023, class: 16, count: 1 << 20 };
        assert_eq!(Holder::read(h.word()), h);
        assert_ne!(h.word(), u64::MAX);
        assert_ne!(Holder::worker(1, 0).word(), 0);
    }

    #[test]
    fn own_word_first_then_a_free_one_then_none() {
        let (a, b, c) = (Holder::worker(10, 0), Holder::worker(11, 1), Holder::worker(12, 2));
        let mut w = [0u64; INLINE];
        assert!(take_inline(&mut w, a, 1));
        assert!(take_inline(&mut w, b, 2));
        assert!(take_inline(&mut w, a, 3));
        assert!(!take_inline(&mut w, c, 1));
        assert_eq!(Holder::read(w[0]).count, 4);
        assert_eq!(Holder::read(w[1]).count, 2);
        assert_eq!(give_inline(&mut w, b, 2), 0);
        // b's word holds nothing: c may take it
        assert!(take_inline(&mut w, c, 1));
        assert_eq!(give_inline(&mut w, b, 1), 1);
        assert_eq!(give_inline(&mut w, a, 5), 1);
    }

    #[test]
    fn a_worker_of_another_pid_in_the_same_slot_is_another_holder() {
        let mut w = [0u64; INLINE];
        assert!(take_inline(&mut w, Holder::worker(10, 3), 1));
        assert_eq!(give_inline(&mut w, Holder::worker(20, 3), 1), 1);
        let gone = reclaim_inline(&mut w, |h| h.pid != 20);
        assert_eq!(gone[0], Some(Holder { count: 1, ..Holder::worker(10, 3) }));
        assert_eq!(w, [0, 0]);
    }
}
