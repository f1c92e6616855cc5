//! Waking this worker's requests that wait for a slot of a key when units
//! of that key are given back here: a waiter otherwise looks again only on
//! its timer (every few milliseconds), and a slot freed meanwhile stays
//! idle. Across workers nothing is woken: there a waiter's timer is what
//! finds the slot.
//!
//! Each worker keeps the requests it has put to sleep in a waiting line
//! ([`sleeping`]), until they wake ([`awake`]) or end. Of those waiting for
//! a key, the one first in line here (highest class, then earliest ticket)
//! is woken ([`wake`]): the others are behind it, and it wakes the next once
//! it is let in. The worker runs one thread: the list is its own, and no
//! call here runs another while it holds the list.

use core::cell::RefCell;

use ngx::ffi::{ngx_add_timer, ngx_del_timer, ngx_event_t};

/// A request asleep in a waiting line: whose (its context, as a token), the
/// state's zone and hash, its class and ticket, and the event its timer is
/// on.
struct Sleeper {
    owner: usize,
    zone: usize,
    hash: [u64; 2],
    order: (u8, u64),
    wev: *mut ngx_event_t,
}

thread_local! {
    static SLEEPERS: RefCell<Vec<Sleeper>> = const { RefCell::new(Vec::new()) };
}

/// Records that the request of `owner` sleeps, its timer on `wev`, waiting
/// in the line of the state `hash` of zone `zone` as class `class` with
/// ticket `ticket`.
pub fn sleeping(owner: usize, zone: usize, hash: [u64; 2], class: u8, ticket: u64, wev: *mut ngx_event_t) {
    SLEEPERS.with(|s| {
        if let Ok(mut s) = s.try_borrow_mut() {
            s.push(Sleeper { owner, zone, hash, order: (class, ticket), wev });
        }
    });
}

/// Forgets the request of `owner`: it woke, or it ends.
pub fn awake(owner: usize) {
    SLEEPERS.with(|s| {
        if let Ok(mut s) = s.try_borrow_mut() {
            s.retain(|x| x.owner != owner);
        }
    });
}

/// Units of the state `hash` of zone `zone` were given back (or a place in
/// its line): the request first in its line here, if any, looks again at
/// once (its timer moved to now; it is forgotten when it wakes).
pub fn wake(zone: usize, hash: [u64; 2]) {
    SLEEPERS.with(|s| {
        let Ok(s) = s.try_borrow() else { return };
        let first = s.iter().filter(|x| x.zone == zone && x.hash == hash).min_by_key(|x| x.order);
        if let Some(x) = first {
            // SAFETY: the event of a live request's connection: a request is forgotten when it
            // wakes and when it ends, before its connection can go. As its own timer would, the
            // expiry leaves `delayed` for nginx's request handler to clear.
            unsafe {
                if (*x.wev).timer_set() != 0 {
                    ngx_del_timer(x.wev);
                }
                ngx_add_timer(x.wev, 0);
            }
        }
    });
}
