//! Time on the worker's event loop: sleeping and timeouts on nginx timers
//! (`ngx::async_::sleep`, cancelable: they never hold up a worker that is
//! exiting), and [`Hold`], the one timer that does.

use core::future::Future;
use core::ptr;
use std::time::Duration;

use futures_util::future::{select, Either};
use ngx::ffi::{ngx_add_timer, ngx_cycle, ngx_del_timer, ngx_event_t, ngx_msec_t};

pub use ngx::async_::sleep;

/// The future did not finish in time.
#[derive(Debug)]
pub struct Elapsed;

/// `f`, or [`Elapsed`] once `d` has passed.
pub async fn timeout<F: Future>(d: Duration, f: F) -> Result<F::Output, Elapsed> {
    let f = core::pin::pin!(f);
    let s = core::pin::pin!(sleep(d));
    match select(f, s).await {
        Either::Left((out, _)) => Ok(out),
        Either::Right(_) => Err(Elapsed),
    }
}

/// What `ngx_event_ident` reads of a timer's `data` in debug logs (the
/// place of a connection's fd): as `ngx::async_` marks its own timers.
static IDENT: [usize; 4] = [0, 0, 0, 0x4c52_5452];

/// A timer that is not cancelable: while it is set, a worker that shuts
/// down gracefully keeps running its event loop (nginx waits for every such
/// timer), so that a call owed to Redis (a `charge=after` charge) is made
/// before the worker exits. It does nothing when it fires.
pub struct Hold {
    ev: Box<ngx_event_t>,
}

impl Hold {
    /// Holds the worker for `d` at most, or until dropped.
    pub fn new(d: Duration) -> Hold {
        // SAFETY: a zeroed event is nginx's initial state for a timer-only event.
        let mut ev: Box<ngx_event_t> = Box::new(unsafe { core::mem::zeroed() });
        ev.handler = Some(fired);
        ev.data = ptr::addr_of!(IDENT).cast_mut().cast();
        // SAFETY: ngx_cycle is set before any module code runs in a worker.
        ev.log = unsafe { (*ngx_cycle).log };
        let ms = ngx_msec_t::try_from(d.as_millis()).unwrap_or(ngx_msec_t::MAX / 2);
        // SAFETY: the event is boxed, so it stays put while in the timer tree; Drop removes it.
        unsafe { ngx_add_timer(&mut *ev, ms) };
        Hold { ev }
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        if self.ev.timer_set() != 0 {
            // SAFETY: the event is in the timer tree (timer_set), added by Hold::new.
            unsafe { ngx_del_timer(&mut *self.ev) };
        }
    }
}

extern "C" fn fired(_ev: *mut ngx_event_t) {}
