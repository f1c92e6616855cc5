//! Where a zone's calls leave their replies for the requests: a queue and
//! a posted event, so that a reply resumes its request from the event loop
//! (in the iteration that read it), never from inside the call's task.

use core::cell::RefCell;
use core::ptr;

use ngx::ffi::{ngx_cycle, ngx_delete_posted_event, ngx_event_t, ngx_post_event, ngx_posted_events};

use super::{RedisError, Reply, CHARGE_ID};

thread_local! {
    static INBOX: RefCell<Option<Inbox>> = const { RefCell::new(None) };
}

struct Inbox {
    replies: Vec<Reply>,
    ev: Box<ngx_event_t>,
}

/// Opens the inbox: `handler` runs (from the event loop) when replies wait.
pub fn open(handler: extern "C" fn(*mut ngx_event_t)) {
    // SAFETY: a zeroed event is nginx's initial state for a posted-only event.
    let mut ev: Box<ngx_event_t> = Box::new(unsafe { core::mem::zeroed() });
    ev.handler = Some(handler);
    // SAFETY: ngx_cycle is set before any module code runs in a worker.
    ev.log = unsafe { (*ngx_cycle).log };
    INBOX.with(|i| i.try_borrow_mut().map(|mut i| *i = Some(Inbox { replies: Vec::new(), ev })).ok());
}

/// Closes it (the worker exits): replies still queued are dropped.
pub fn close() {
    let inbox = INBOX.with(|i| i.try_borrow_mut().ok().and_then(|mut i| i.take()));
    if let Some(mut inbox) = inbox {
        if inbox.ev.posted() != 0 {
            // SAFETY: the event is in the posted queue; it is removed before it is freed.
            unsafe { ngx_delete_posted_event(&mut *inbox.ev) };
        }
    }
}

/// Leaves replies; the handler runs once for all left in this iteration.
pub fn put(replies: impl IntoIterator<Item = Reply>) {
    INBOX.with(|i| {
        let Ok(mut i) = i.try_borrow_mut() else { return };
        let Some(inbox) = i.as_mut() else { return };
        inbox.replies.extend(replies);
        if !inbox.replies.is_empty() && inbox.ev.posted() == 0 {
            // SAFETY: the event lives as long as the inbox; close() unposts it before freeing it.
            unsafe { ngx_post_event(&mut *inbox.ev, ptr::addr_of_mut!(ngx_posted_events)) };
        }
    });
}

/// Takes every reply left.
pub fn take() -> Vec<Reply> {
    INBOX.with(|i| {
        i.try_borrow_mut().ok().and_then(|mut i| i.as_mut().map(|i| std::mem::take(&mut i.replies))).unwrap_or_default()
    })
}

/// Reports `n` lines of a `charge=after` charge on zone `zone` as failed
/// (a Redis zone's call, or a Memcached zone's round trips).
pub fn charge_failed(zone: usize, n: usize, e: RedisError) {
    put((0..n).map(|_| Reply { id: CHARGE_ID, zone, result: Err(e.clone()) }));
}
