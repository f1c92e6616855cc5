//! A delayed request (`queue=`) sleeps on a timer, as `limit_req` delays
//! one: it holds no worker, other requests are served meanwhile, and a
//! client that goes away while it waits is noticed by nginx's own
//! `ngx_http_test_reading` and its request finalized (closing the connection
//! removes the timer). The request's place was charged when it arrived.

use ngx::ffi::{
    ngx_add_timer, ngx_handle_read_event, ngx_handle_write_event, ngx_http_block_reading, ngx_http_core_run_phases,
    ngx_http_finalize_request, ngx_http_request_t, ngx_http_test_reading, ngx_msec_t, NGX_HTTP_INTERNAL_SERVER_ERROR,
};
use ngx::http::Request;

use crate::request::{get_ctx, Phase};

/// Puts the request to sleep for `delay_ms` (at least 1); the stage's
/// phase handler returns `NGX_AGAIN` and is run again when it wakes.
pub fn sleep(r: *mut ngx_http_request_t, delay_ms: u64) {
    // SAFETY: r is the live request being processed in a phase handler; as limit_req does, the
    // write event carries the timer (and `delayed`, so that a writable socket does not wake it).
    unsafe {
        (*r).read_event_handler = Some(ngx_http_test_reading);
        (*r).write_event_handler = Some(wake);
        let wev = (*(*r).connection).write;
        (*wev).set_delayed(1);
        ngx_add_timer(wev, delay_ms.clamp(1, ngx_msec_t::MAX as u64 / 2) as ngx_msec_t);
    }
}

/// The write event of a sleeping request: the timer fired (nginx cleared
/// `delayed`), or the socket became writable (still `delayed`: keep waiting).
extern "C" fn wake(r: *mut ngx_http_request_t) {
    // SAFETY: called by nginx for a live request; its connection and events are valid.
    unsafe {
        let c = (*r).connection;
        let wev = (*c).write;
        if (*wev).delayed() != 0 {
            if ngx_handle_write_event(wev, 0) != 0 {
                ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR as isize);
            }
            return;
        }
        if ngx_handle_read_event((*c).read, 0) != 0 {
            ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR as isize);
            return;
        }
        let req = Request::from_ngx_http_request(r);
        // (a request waiting for an rl_conn slot looks again: its phase stays)
        if let Some(ctx) = get_ctx(req).filter(|ctx| ctx.phase == Phase::Delayed) {
            ctx.phase = Phase::Decided;
        }
        (*r).read_event_handler = Some(ngx_http_block_reading);
        (*r).write_event_handler = Some(ngx_http_core_run_phases);
        ngx_http_core_run_phases(r);
    }
}
