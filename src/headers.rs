//! The header filter: `X-RateLimit-*` and `Retry-After` (legacy), the IETF
//! `RateLimit-Policy` / `RateLimit` fields (draft 10/11) and draft 6's
//! `RateLimit-Limit` / `-Remaining` / `-Reset` (draft-6), on every response
//! of a limited request, rejected or not.

use core::cell::Cell;
use core::{mem, ptr};

use ngx::core::Status;
use ngx::ffi::{
    ngx_http_output_header_filter_pt, ngx_http_request_t, ngx_int_t, ngx_list_push, ngx_pnalloc, ngx_str_t,
    ngx_table_elt_t,
};
use ngx::http::{HttpModuleMainConf, Request};

use crate::line::{HeadersMode, Line};
use crate::request::{get_ctx, Ctx, LineResult, NoMemory};
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
    /// The room set aside with the context (`Ctx::legacy_values`, where
    /// the location sends the legacy fields), or a new allocation of `cap`
    /// bytes from the request pool.
    fn with_room(r: *mut ngx_http_request_t, ctx: &Ctx, cap: usize) -> Option<Out> {
        match cap <= HeadersMode::LEGACY_BYTES && !ctx.legacy_values.is_null() {
            true => Some(Out { buf: ctx.legacy_values, cap, len: 0 }),
            false => Out::new(r, cap),
        }
    }

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

    fn num(&mut self, n: u64) {
        let digits = Digits::of(n);
        self.bytes(digits.as_bytes());
    }

    /// `n` in decimal as a value of its own: written in place, no copy.
    fn value(&mut self, n: u64) -> ngx_str_t {
        let start = self.len;
        let Some(room) = self.reserve() else {
            return ngx_str_t::empty();
        };
        let skip = Digits::write(n, room);
        // SAFETY: start + NUM <= cap and skip < NUM.
        ngx_str_t { len: NUM - skip, data: unsafe { self.buf.add(start + skip) } }
    }

    /// Digits as a value of their own: copied whole (a fixed size, no call
    /// to `memcpy`), the value starting at the first digit.
    fn digits(&mut self, d: &Digits) -> ngx_str_t {
        let start = self.len;
        let Some(room) = self.reserve() else {
            return ngx_str_t::empty();
        };
        *room = d.buf;
        let skip = d.skip.min(NUM);
        // SAFETY: start + NUM <= cap and skip <= NUM.
        ngx_str_t { len: NUM - skip, data: unsafe { self.buf.add(start + skip) } }
    }

    /// The next NUM bytes of the buffer, if there is room.
    fn reserve(&mut self) -> Option<&mut [u8; NUM]> {
        if self.cap - self.len < NUM {
            return None;
        }
        // SAFETY: buf has cap bytes, len + NUM <= cap, and nothing else refers to them.
        let room = unsafe { &mut *self.buf.add(self.len).cast::<[u8; NUM]>() };
        self.len += NUM;
        Some(room)
    }

    /// The value written since `start`.
    fn since(&self, start: usize) -> ngx_str_t {
        // SAFETY: start <= len <= cap.
        ngx_str_t { len: self.len - start, data: unsafe { self.buf.add(start) } }
    }
}

/// The last `X-RateLimit-Reset` value a worker wrote, in decimal: keys
/// charged alike (every fresh key, one key under a steady load) reset at the
/// same second, so consecutive responses repeat it.
struct LastReset(Cell<(u64, Digits)>);

// SAFETY: header filters run on the worker's event-loop thread alone (the
// worker has no other thread that touches responses).
unsafe impl Sync for LastReset {}

static LAST_RESET: LastReset = LastReset(Cell::new((0, Digits { buf: [b'0'; NUM], skip: NUM - 1 })));

/// `t` in decimal, from [`LAST_RESET`] when it is the same.
fn reset_digits(t: u64) -> Digits {
    let (last, digits) = LAST_RESET.0.get();
    if last == t {
        return digits;
    }
    let digits = Digits::of(t);
    LAST_RESET.0.set((t, digits));
    digits
}

/// Most bytes a number takes.
const NUM: usize = 20;
const _: () = assert!(4 * NUM == HeadersMode::LEGACY_BYTES);

/// A number in decimal, right-aligned in NUM bytes.
#[derive(Clone, Copy)]
struct Digits {
    buf: [u8; NUM],
    skip: usize,
}

impl Digits {
    fn of(n: u64) -> Digits {
        let mut buf = [0; NUM];
        let skip = Digits::write(n, &mut buf);
        Digits { buf, skip }
    }

    fn as_bytes(&self) -> &[u8] {
        self.buf.get(self.skip..).unwrap_or_default()
    }

    /// Writes `n` right-aligned in `buf`, two digits at a time; returns how
    /// many bytes lead it.
    fn write(mut n: u64, buf: &mut [u8; NUM]) -> usize {
        // A static, not a const: a const array indexed at run time may be copied to the stack
        // on every use.
        static PAIRS: [[u8; 2]; 100] = {
            let mut t = [[0; 2]; 100];
            let mut i = 0;
            while i < 100 {
                t[i] = [b'0' + (i / 10) as u8, b'0' + (i % 10) as u8];
                i += 1;
            }
            t
        };
        let (pairs, _) = buf.as_chunks_mut::<2>();
        // The pairs from the right; u64::MAX has 20 digits, 10 pairs: the loop ends on n.
        for (k, pair) in pairs.iter_mut().enumerate().rev() {
            *pair = PAIRS[(n % 100) as usize];
            n /= 100;
            if n == 0 {
                // The leading pair's zero.
                return 2 * k + usize::from(pair[0] == b'0');
            }
        }
        0
    }
}

pub unsafe extern "C" fn header_filter(r: *mut ngx_http_request_t) -> ngx_int_t {
    // SAFETY: nginx calls header filters with a valid request.
    let req = unsafe { Request::from_ngx_http_request(r) };
    // SAFETY: as above.
    if unsafe { (*r).main } == r {
        // (the mode first: a location with `rl_headers off` adds nothing, and needs nothing more)
        if let Some(ctx) = get_ctx(req).filter(|ctx| ctx.headers != HeadersMode::OFF) {
            if let Some(mcf) = Module::main_conf(req) {
                if let Err(NoMemory) = add_headers(r, ctx, &mcf.lines) {
                    return Status::NGX_ERROR.into();
                }
            }
        }
    }
    // SAFETY: set in postconfiguration to the filter that was on top before ours.
    match unsafe { NEXT_HEADER_FILTER } {
        // SAFETY: the next filter in nginx's chain, given the request nginx gave us.
        Some(next) => unsafe { next(r) },
        None => 0,
    }
}

fn ceil_s(us: u64) -> u64 {
    us.div_ceil(1_000_000)
}

fn add_headers(r: *mut ngx_http_request_t, ctx: &Ctx, lines: &[Line]) -> Result<(), NoMemory> {
    // The line `$rl_*` describe (when it is enforced).
    let Some((line, res)) = ctx.enforced_behind(lines) else {
        return Ok(());
    };
    let mode = ctx.headers;
    // (one test where only the legacy fields are sent, as for each step below)
    let ietf_len = if mode.ietf() { ietf_len(mode, ctx, lines) } else { 0 };
    let mut out = Out::with_room(r, ctx, 4 * NUM + ietf_len).ok_or(NoMemory)?;
    let retry = retry_after_s(ctx, lines);
    if mode.legacy() {
        let limit = match line.burst_varies() {
            true => out.value(res.limit(line).burst()),
            false => line.burst_text(),
        };
        let remaining = out.value(res.remaining());
        let reset = out.digits(&reset_digits(ctx.now_unix as u64 + res.reset_s()));
        let legacy = [("X-RateLimit-Limit", limit), ("X-RateLimit-Remaining", remaining), ("X-RateLimit-Reset", reset)];
        match retry {
            Some(s) => {
                let [a, b, c] = legacy;
                push_all(r, [a, b, c, ("Retry-After", out.value(s))])?;
            }
            None => push_all(r, legacy)?,
        }
    } else if let Some(s) = retry {
        push(r, "Retry-After", out.value(s))?;
    }
    if mode.ietf() {
        ietf(r, &mut out, ctx, lines, (line, res))?;
    }
    Ok(())
}

/// The bytes the fields named `RateLimit*` take at most.
#[inline(never)]
fn ietf_len(mode: HeadersMode, ctx: &Ctx, lines: &[Line]) -> usize {
    let mut len = 0;
    if mode.draft() {
        // (a concurrency line's `;qu="concurrent-requests"` in place of a number)
        len += ctx.enforced(lines).map(|(l, _)| 2 * (l.item.len() + 2 * NUM + 12) + QU.len()).sum::<usize>();
    }
    if mode.draft6() {
        // Three numbers, and draft 6's policy list unless draft's is sent.
        len += 3 * NUM;
        if !mode.draft() {
            len += ctx.enforced(lines).count() * (2 * NUM + 6);
        }
    }
    len
}

/// The fields named `RateLimit*`: draft 6's (`RateLimit-Limit`,
/// `-Remaining`, `-Reset`, describing `behind`, the line the legacy fields
/// describe) and draft 10/11's (`RateLimit`, an item per enforced line).
/// Both drafts name their policy field `RateLimit-Policy`; one is sent:
/// draft 10's when it is on, whose `RateLimit` items name its policies,
/// where draft 6's is informative (its clients may ignore it, and
/// express-rate-limit's parser does).
#[inline(never)]
fn ietf(
    r: *mut ngx_http_request_t,
    out: &mut Out,
    ctx: &Ctx,
    lines: &[Line],
    behind: (&Line, &LineResult),
) -> Result<(), NoMemory> {
    let mode = ctx.headers;
    if mode.draft6() {
        let (line, res) = behind;
        let limit = out.value(res.limit(line).burst());
        let remaining = out.value(res.remaining());
        let reset = out.value(res.reset_s());
        push_all(r, [("RateLimit-Limit", limit), ("RateLimit-Remaining", remaining), ("RateLimit-Reset", reset)])?;
        if !mode.draft() {
            // `100;w=60`, a policy per enforced line as `RateLimit-Policy` below, without names.
            let at = out.len;
            for (i, (line, res)) in ctx.enforced(lines).enumerate() {
                let limit = res.limit(line);
                if i > 0 {
                    out.bytes(b", ");
                }
                out.num(limit.burst());
                // (requests in flight have no window)
                if !limit.is_concurrent() {
                    out.bytes(b";w=");
                    out.num(ceil_s(limit.window_us()).max(1));
                }
            }
            push(r, "RateLimit-Policy", out.since(at))?;
        }
    }
    if mode.draft() {
        let at = out.len;
        for (i, (line, res)) in ctx.enforced(lines).enumerate() {
            let limit = res.limit(line);
            match limit.is_concurrent() {
                // Requests in flight have no window: draft 11's quota unit says what the quota counts.
                true => {
                    item(out, i, &line.item, b"\";q=", limit.burst(), b"", u64::MAX);
                    out.bytes(QU);
                }
                false => item(out, i, &line.item, b"\";q=", limit.burst(), b";w=", ceil_s(limit.window_us()).max(1)),
            }
        }
        push(r, "RateLimit-Policy", out.since(at))?;
        let at = out.len;
        for (i, (line, res)) in ctx.enforced(lines).enumerate() {
            match line.limit.is_concurrent() {
                // (no one knows when a request in flight ends: no `t`)
                true => item(out, i, &line.item, b"\";r=", res.remaining(), b"", u64::MAX),
                false => item(out, i, &line.item, b"\";r=", res.remaining(), b";t=", res.next_s()),
            }
        }
        push(r, "RateLimit", out.since(at))?;
    }
    Ok(())
}

/// `Retry-After` of a rejected request, in whole seconds (at least 1): the
/// longest wait of its enforced lines that rejected it. Honest: a lone
/// request sent after it passes every line. `None` for a request not
/// rejected, or when no wait lets one through.
fn retry_after_s(ctx: &Ctx, lines: &[Line]) -> Option<u64> {
    if !ctx.rejected {
        return None;
    }
    let rejecting = |res: &LineResult| res.active && !res.dry_run && !res.admitted();
    let wait = match ctx.only() {
        Some((_, res)) => rejecting(res).then_some(res.wait_us()),
        None => ctx.enforced(lines).filter(|(_, res)| rejecting(res)).map(|(_, res)| res.wait_us()).max(),
    };
    wait.filter(|w| *w != u64::MAX).map(|w| ceil_s(w).max(1))
}

/// One structured-field item: `"name";a=1;b=2`, comma-separated after the
/// first (`"name";a=1` when `b` is empty).
fn item(out: &mut Out, i: usize, name: &str, a: &[u8], x: u64, b: &[u8], y: u64) {
    out.bytes(if i == 0 { b"\"" } else { b", \"" });
    out.bytes(name.as_bytes());
    out.bytes(a);
    out.num(x);
    if !b.is_empty() {
        out.bytes(b);
        out.num(y);
    }
}

/// The quota unit of a concurrency line's policy (draft 11).
const QU: &[u8] = b";qu=\"concurrent-requests\"";

/// Appends `name: value` to the response headers (the value lives in the request pool).
fn push(r: *mut ngx_http_request_t, name: &'static str, value: ngx_str_t) -> Result<(), NoMemory> {
    // SAFETY: the request is valid; headers_out.headers is an initialised ngx_list_t of
    // ngx_table_elt_t allocated from r->pool.
    let h = unsafe { ngx_list_push(&mut (*r).headers_out.headers) }.cast::<ngx_table_elt_t>();
    if h.is_null() {
        return Err(NoMemory);
    }
    // SAFETY: h is a new element of the list.
    unsafe { fill(h, name, value) };
    Ok(())
}

/// Appends the fields to the response headers in one step where the list's
/// last part has room for them all (what `ngx_list_push` does for one
/// element, done once), else one by one. Inlined: with draft-6 calling it
/// too, the compiler made it a call on the legacy fields' path, which every
/// limited response takes (seen with callgrind).
#[inline(always)]
fn push_all<const N: usize>(
    r: *mut ngx_http_request_t,
    fields: [(&'static str, ngx_str_t); N],
) -> Result<(), NoMemory> {
    // SAFETY: the request is valid; headers_out.headers is an initialised ngx_list_t (nginx
    // makes it with the request) whose `last` part exists and holds nelts of nalloc elements of
    // `size` bytes.
    let elts = unsafe {
        let list = &mut (*r).headers_out.headers;
        let last = &mut *list.last;
        match list.size == mem::size_of::<ngx_table_elt_t>() && last.nelts + N <= list.nalloc {
            true => {
                let elts = last.elts.cast::<ngx_table_elt_t>().add(last.nelts);
                last.nelts += N;
                elts
            }
            false => ptr::null_mut(),
        }
    };
    if elts.is_null() {
        return fields.into_iter().try_for_each(|(name, value)| push(r, name, value));
    }
    for (i, (name, value)) in fields.into_iter().enumerate() {
        // SAFETY: the N elements from elts were reserved above.
        unsafe { fill(elts.add(i), name, value) };
    }
    Ok(())
}

/// Writes a response field into a new element of the headers list: a
/// zeroed element has no `next` and no lowercase key, as nginx's own
/// `add_header` leaves them.
///
/// # Safety
/// `h` is a new, writable element of `r->headers_out.headers`.
unsafe fn fill(h: *mut ngx_table_elt_t, name: &'static str, value: ngx_str_t) {
    // SAFETY: forwarded to our caller.
    unsafe {
        ptr::write_bytes(h, 0, 1);
        (*h).hash = 1;
        (*h).key = ngx_str_t { len: name.len(), data: name.as_ptr() as *mut u8 };
        (*h).value = value;
    }
}
