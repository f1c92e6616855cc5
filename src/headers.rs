//! The header filter: `X-RateLimit-*` and `Retry-After` (legacy), and the
//! IETF `RateLimit-Policy` / `RateLimit` fields (draft), on every response of
//! a limited request, rejected or not.

use core::fmt::{self, Write};
use core::ptr;

use ngx::ffi::{
    ngx_http_output_header_filter_pt, ngx_http_request_t, ngx_int_t, ngx_list_push, ngx_pnalloc, ngx_str_t,
    ngx_table_elt_t,
};
use ngx::http::Request;

use crate::config::HeadersMode;
use crate::handler::{get_ctx, Ctx, LineResult};

/// The next filter in nginx's header filter chain.
pub static mut NEXT_HEADER_FILTER: ngx_http_output_header_filter_pt = None;

/// A small stack buffer for header values (no heap on the request path).
struct Buf {
    data: [u8; 512],
    len: usize,
}

impl Buf {
    fn new() -> Self {
        Buf { data: [0; 512], len: 0 }
    }
    fn as_bytes(&self) -> &[u8] {
        &self.data[..self.len]
    }
}

impl Write for Buf {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let end = self.len + s.len();
        if end > self.data.len() {
            return Err(fmt::Error);
        }
        self.data[self.len..end].copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

pub unsafe extern "C" fn header_filter(r: *mut ngx_http_request_t) -> ngx_int_t {
    // SAFETY: nginx calls header filters with a valid request.
    let req = unsafe { Request::from_ngx_http_request(r) };
    // SAFETY: as above.
    if unsafe { (*r).main } == r {
        if let Some(ctx) = get_ctx(req) {
            if add_headers(r, ctx).is_err() {
                return -1;
            }
        }
    }
    // SAFETY: set in postconfiguration to the filter that was on top before ours.
    match unsafe { NEXT_HEADER_FILTER } {
        Some(next) => unsafe { next(r) },
        None => 0,
    }
}

fn ceil_s(us: u64) -> u64 {
    us.div_ceil(1_000_000)
}

/// The line the legacy fields describe: the most restrictive (fewest
/// remaining; among rejecting lines, the longest wait).
fn most_restrictive(ctx: &Ctx) -> Option<(&crate::config::Line, &LineResult)> {
    ctx.iter().filter(|(_, r)| r.active).min_by_key(|(_, r)| {
        let rejected = ctx.rejected && !r.admitted;
        (!rejected, r.remaining, u64::MAX - r.reset_us)
    })
}

fn add_headers(r: *mut ngx_http_request_t, ctx: &Ctx) -> Result<(), ()> {
    if ctx.headers == HeadersMode::Off {
        return Ok(());
    }
    let Some((line, res)) = most_restrictive(ctx) else {
        return Ok(());
    };
    if ctx.headers.legacy() {
        let mut b = Buf::new();
        push(r, "X-RateLimit-Limit", fmt_with(&mut b, format_args!("{}", line.limit.burst())))?;
        push(r, "X-RateLimit-Remaining", fmt_with(&mut b, format_args!("{}", res.remaining)))?;
        let reset = ctx.now_unix as u64 + ceil_s(res.reset_us);
        push(r, "X-RateLimit-Reset", fmt_with(&mut b, format_args!("{}", reset)))?;
    }
    if ctx.rejected {
        // Honest: a lone request sent after this long passes every line.
        let wait = ctx.iter().filter(|(_, r)| r.active && !r.admitted).map(|(_, r)| r.retry_after_us).max();
        if let Some(wait) = wait.filter(|w| *w != u64::MAX) {
            let mut b = Buf::new();
            push(r, "Retry-After", fmt_with(&mut b, format_args!("{}", ceil_s(wait).max(1))))?;
        }
    }
    if ctx.headers.draft() {
        let mut policy = Buf::new();
        let mut state = Buf::new();
        for (i, (line, res)) in ctx.iter().filter(|(_, r)| r.active).enumerate() {
            let sep = if i == 0 { "" } else { ", " };
            let w = ceil_s(line.limit.window_us()).max(1);
            write!(policy, "{sep}\"{}\";q={};w={}", line.item, line.limit.burst(), w).map_err(|_| ())?;
            write!(state, "{sep}\"{}\";r={};t={}", line.item, res.remaining, ceil_s(res.reset_us)).map_err(|_| ())?;
        }
        push(r, "RateLimit-Policy", policy.as_bytes())?;
        push(r, "RateLimit", state.as_bytes())?;
    }
    Ok(())
}

fn fmt_with<'b>(b: &'b mut Buf, args: fmt::Arguments<'_>) -> &'b [u8] {
    b.len = 0;
    if b.write_fmt(args).is_err() {
        b.len = 0;
    }
    b.as_bytes()
}

/// Appends `name: value` to the response headers (value copied to the request pool).
fn push(r: *mut ngx_http_request_t, name: &'static str, value: &[u8]) -> Result<(), ()> {
    // SAFETY: the request is valid; headers_out.headers is an initialised ngx_list_t of
    // ngx_table_elt_t allocated from r->pool.
    unsafe {
        let h = ngx_list_push(&mut (*r).headers_out.headers).cast::<ngx_table_elt_t>();
        if h.is_null() {
            return Err(());
        }
        let data = ngx_pnalloc((*r).pool, value.len()).cast::<u8>();
        if data.is_null() {
            return Err(());
        }
        ptr::copy_nonoverlapping(value.as_ptr(), data, value.len());
        ptr::write_bytes(h, 0, 1);
        (*h).hash = 1;
        (*h).key = ngx_str_t { len: name.len(), data: name.as_ptr() as *mut u8 };
        (*h).value = ngx_str_t { len: value.len(), data };
    }
    Ok(())
}
