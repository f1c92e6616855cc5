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
//! it is let in.

use core::cell::UnsafeCell;

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

/// The worker's sleepers. A plain static, not a thread-local: in a module
/// nginx loads, every thread-local access is a call (`__tls_get_addr`) that
/// each request giving back a slot would pay.
struct Sleepers(UnsafeCell<Vec<Sleeper>>);

// SAFETY: only a worker's nginx thread (its event loop, which runs every
// request and cleanup) touches the list; no other thread of the worker
// calls into this file.
unsafe impl Sync for Sleepers {}

static SLEEPERS: Sleepers = Sleepers(UnsafeCell::new(Vec::new()));

/// The list, for the time of one call of this file.
fn list() -> &'static mut Vec<Sleeper> {
    // SAFETY: see `Sleepers`: one thread; and no function here calls out to anything that could
    // come back into this file while it holds the list (nginx's timer functions do not).
    unsafe { &mut *SLEEPERS.0.get() }
}

/// Records that the request of `owner` sleeps, its timer on `wev`, waiting
/// in the line of the state `hash` of zone `zone` as class `class` with
/// ticket `ticket`.
pub fn sleeping(owner: usize, zone: usize, hash: [u64; 2], class: u8, ticket: u64, wev: *mut ngx_event_t) {
    list().push(Sleeper { owner, zone, hash, order: (class, ticket), wev });
}

/// Forgets the request of `owner`: it woke, or it ends.
pub fn awake(owner: usize) {
    let s = list();
    if !s.is_empty() {
        s.retain(|x| x.owner != owner);
    }
}

/// Units of the state `hash` of zone `zone` were given back (or a place in
/// its line): the request first in its line here, if any, looks again at
/// once (its timer moved to now; it is forgotten when it wakes).
pub fn wake(zone: usize, hash: [u64; 2]) {
    let s = list();
    if s.is_empty() {
        return;
    }
    let first = s.iter().filter(|x| x.zone == zone && x.hash == hash).min_by_key(|x| x.order);
    if let Some(x) = first {
        // SAFETY: the event of a live request's connection: a request is forgotten when it wakes
        // and when it ends, before its connection can go. As its own timer would, the expiry
        // leaves `delayed` for nginx's request handler to clear.
        unsafe {
            if (*x.wev).timer_set() != 0 {
                ngx_del_timer(x.wev);
            }
            ngx_add_timer(x.wev, 0);
        }
    }
}
