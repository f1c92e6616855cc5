//! The header filter: `X-RateLimit-*` and `Retry-After` (legacy), and the
//! IETF `RateLimit-Policy` / `RateLimit` fields (draft), on every response of
//! a limited request, rejected or not.

use core::ptr;

use ngx::ffi::{
    ngx_http_output_header_filter_pt, ngx_http_request_t, ngx_int_t, ngx_list_push, ngx_pnalloc, ngx_str_t,
    ngx_table_elt_t,
};
use ngx::http::{HttpModuleMainConf, Request};

use crate::line::{HeadersMode, Line};
use crate::request::{get_ctx, Ctx, LineResult};
use crate::Module;

/// The next filter in nginx's header filter chain.
pub static mut NEXT_HEADER_FILTER: ngx_http_output_header_filter_pt = None;

/// Header values, written straight into one allocation from the request
/// pool (no heap, no formatting machinery on the request path).
struct Out {
    buf: *mut u8,
    cap: usize,
    len: usize,
}

impl Out {
    fn new(r: *mut ngx_http_request_t, cap: usize) -> Option<Out> {
        // SAFETY: the request pool is valid for the request's lifetime.
        let buf = unsafe { ngx_pnalloc((*r).pool, cap) }.cast::<u8>();
        (!buf.is_null()).then_some(Out { buf, cap, len: 0 })
    }

    fn bytes(&mut self, b: &[u8]) {
        let n = b.len().min(self.cap - self.len);
        // SAFETY: buf has cap bytes and len + n <= cap.
        unsafe { ptr::copy_nonoverlapping(b.as_ptr(), self.buf.add(self.len), n) };
        self.len += n;
    }

    fn num(&mut self, mut n: u64) {
        const PAIRS: &[u8; 200] = b"0001020304050607080910111213141516171819\
2021222324252627282930313233343536373839\
4041424344454647484950515253545556575859\
6061626364656667686970717273747576777879\
8081828384858687888990919293949596979899";
        let mut digits = [0u8; 20];
        let mut i = digits.len();
        while n >= 100 {
            let p = (n % 100) as usize * 2;
            n /= 100;
            i -= 2;
            digits[i..i + 2].copy_from_slice(&PAIRS[p..p + 2]);
        }
        if n >= 10 {
            let p = n as usize * 2;
            i -= 2;
            digits[i..i + 2].copy_from_slice(&PAIRS[p..p + 2]);
        } else {
            i -= 1;
            digits[i] = b'0' + n as u8;
        }
        self.bytes(&digits[i..]);
    }

    /// The value written since `start`.
    fn since(&self, start: usize) -> ngx_str_t {
        // SAFETY: start <= len <= cap.
        ngx_str_t { len: self.len - start, data: unsafe { self.buf.add(start) } }
    }
}

/// Most bytes a number takes.
const NUM: usize = 20;

pub unsafe extern "C" fn header_filter(r: *mut ngx_http_request_t) -> ngx_int_t {
    // SAFETY: nginx calls header filters with a valid request.
    let req = unsafe { Request::from_ngx_http_request(r) };
    // SAFETY: as above.
    if unsafe { (*r).main } == r {
        if let (Some(ctx), Some(mcf)) = (get_ctx(req), Module::main_conf(req)) {
            if add_headers(r, ctx, &mcf.lines).is_err() {
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
fn most_restrictive<'a>(ctx: &'a Ctx, lines: &'a [Line]) -> Option<(&'a Line, &'a LineResult)> {
    ctx.active(lines).min_by_key(|(_, r)| {
        let rejected = ctx.rejected && !r.admitted;
        (!rejected, r.remaining, u64::MAX - r.reset_us)
    })
}

fn add_headers(r: *mut ngx_http_request_t, ctx: &Ctx, lines: &[Line]) -> Result<(), ()> {
    if ctx.headers == HeadersMode::Off {
        return Ok(());
    }
    let Some((line, res)) = most_restrictive(ctx, lines) else {
        return Ok(());
    };
    let draft_len: usize =
        if ctx.headers.draft() { ctx.active(lines).map(|(l, _)| 2 * (l.item.len() + 2 * NUM + 12)).sum() } else { 0 };
    let mut out = Out::new(r, 4 * NUM + draft_len).ok_or(())?;
    if ctx.headers.legacy() {
        let at = out.len;
        out.num(line.limit.burst());
        push(r, "X-RateLimit-Limit", out.since(at))?;
        let at = out.len;
        out.num(res.remaining);
        push(r, "X-RateLimit-Remaining", out.since(at))?;
        let at = out.len;
        out.num(ctx.now_unix as u64 + ceil_s(res.reset_us));
        push(r, "X-RateLimit-Reset", out.since(at))?;
    }
    if ctx.rejected {
        // Honest: a lone request sent after this long passes every line.
        let wait = ctx.active(lines).filter(|(_, r)| !r.admitted).map(|(_, r)| r.retry_after_us).max();
        if let Some(wait) = wait.filter(|w| *w != u64::MAX) {
            let at = out.len;
            out.num(ceil_s(wait).max(1));
            push(r, "Retry-After", out.since(at))?;
        }
    }
    if ctx.headers.draft() {
        let at = out.len;
        for (i, (line, _)) in ctx.active(lines).enumerate() {
            item(&mut out, i, &line.item, b"\";q=", line.limit.burst(), b";w=", ceil_s(line.limit.window_us()).max(1));
        }
        push(r, "RateLimit-Policy", out.since(at))?;
        let at = out.len;
        for (i, (line, res)) in ctx.active(lines).enumerate() {
            item(&mut out, i, &line.item, b"\";r=", res.remaining, b";t=", ceil_s(res.reset_us));
        }
        push(r, "RateLimit", out.since(at))?;
    }
    Ok(())
}

/// One structured-field item: `"name";a=1;b=2`, comma-separated after the first.
fn item(out: &mut Out, i: usize, name: &str, a: &[u8], x: u64, b: &[u8], y: u64) {
    out.bytes(if i == 0 { b"\"" } else { b", \"" });
    out.bytes(name.as_bytes());
    out.bytes(a);
    out.num(x);
    out.bytes(b);
    out.num(y);
}

/// Appends `name: value` to the response headers (the value lives in the request pool).
fn push(r: *mut ngx_http_request_t, name: &'static str, value: ngx_str_t) -> Result<(), ()> {
    // SAFETY: the request is valid; headers_out.headers is an initialised ngx_list_t of
    // ngx_table_elt_t allocated from r->pool; a zeroed element has no `next` and no lowcase key,
    // as nginx's own add_header leaves them.
    unsafe {
        let h = ngx_list_push(&mut (*r).headers_out.headers).cast::<ngx_table_elt_t>();
        if h.is_null() {
            return Err(());
        }
        ptr::write_bytes(h, 0, 1);
        (*h).hash = 1;
        (*h).key = ngx_str_t { len: name.len(), data: name.as_ptr() as *mut u8 };
        (*h).value = value;
    }
    Ok(())
}
