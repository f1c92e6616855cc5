//! A request's state across the phases: which lines apply, each line's
//! verdict, and where the decision stands. Allocated from the request pool
//! and kept across internal redirects (see [`get_ctx`]).

use core::cmp::Reverse;
use core::{mem, ptr, slice};

use ngx::core::Status;
use ngx::ffi::{ngx_http_request_t, ngx_palloc, ngx_str_t, ngx_time, ngx_uint_t, NGX_HTTP_INTERNAL_SERVER_ERROR};
use ngx::http::{HttpModule, HttpModuleMainConf, Request};
use rl_core::lease::Part;
use rl_core::limit::{Charge, Decision, Limit, Outcome};
use rl_core::table::Slot;

use crate::line::{HeadersMode, Line, LineId, Stage};
use crate::Module;

/// nginx could not allocate what a request needed (a complex value, the
/// copy of a limit, a response field), and its allocator has logged it: a
/// request stopped by it is answered 500.
#[derive(Clone, Copy, Debug)]
pub struct NoMemory;

impl From<NoMemory> for Status {
    fn from(_: NoMemory) -> Status {
        Status(NGX_HTTP_INTERNAL_SERVER_ERROR as isize)
    }
}

/// The outcome of one line for this request.
#[derive(Clone, Copy)]
pub struct LineResult {
    /// The key was non-empty and the line was evaluated.
    pub active: bool,
    /// The line's state was charged for this request.
    pub charged: bool,
    /// The line is dry-run: its verdict is reported, never enforced.
    pub dry_run: bool,
    /// The line's verdict (from shared memory, where rl-core writes it in
    /// place, or a Redis reply) and what was charged to a shared-memory
    /// line, for a refund.
    pub decision: Decision,
    pub key: ngx_str_t,
    /// The limit from the request's variables, in the request pool (`None`:
    /// the line's own). A reference: the result of every line is
    /// initialised on every request, the limit of few.
    pub var_limit: Option<&'static Limit>,
    /// The request's cost for the line.
    pub cost: u64,
    /// Where the state is in a shared-memory zone: its hash, its entry (found
    /// once, by the hash, and checked against it on every later use), and the
    /// index of the zone's lock among those the request holds.
    pub hash: [u64; 2],
    pub slot: Slot,
    pub lock: usize,
    /// A line in lease mode decided on this node's leases (spent from
    /// them, or refused here), not by Redis; and the units its leases paid
    /// and from which, to put them back if the request is refused all the
    /// same. A line Redis decides may have had part of its cost paid so
    /// (all its leases held, too little for the whole: Redis is asked for
    /// the rest), put back unless Redis admits.
    pub leased: bool,
    pub spent: Part,
    /// A line in lease mode that Redis decides: the units of the lease its
    /// call asks for with the request (0: none).
    pub lease_want: u64,
    /// An `rl_conn` line with a queue: decided by its waiting line before
    /// the stage's other lines ([`crate::shm::wait`], on Redis
    /// [`crate::eval::redis::wait`]), which take its verdict as it is; and,
    /// while the request waits, its ticket (plus one on shared memory; 0:
    /// none), and on Redis the places ahead of it at its last look.
    pub waited: bool,
    pub ticket: u64,
    pub ahead: u64,
    /// A waiting `rl_conn` line on a Redis zone in the call in flight (its
    /// arrival, or a look again).
    pub asking: bool,
    /// The request's class on a line with `classes=` (0, the highest, on
    /// others: their one class), and on an `rl_limit` line what it must
    /// leave of the budget for the classes above it.
    pub class: u8,
    pub kept: u64,
    /// An `rl_conn` line on a Redis zone whose take is in flight: the
    /// generation it was sent in (0: none in flight), until its reply (or
    /// the request's end) settles it.
    pub take_gen: u64,
}

impl LineResult {
    /// Writes a line not evaluated (yet) at `p`: every field zero (false,
    /// 0, empty, `None`, `Charge::NONE`) but the slot, a placeholder in which
    /// the table finds nothing. Zeroing and one store cost less than copying a
    /// constant with one field that is not zero.
    ///
    /// # Safety
    /// `p` is valid for writes of one `LineResult` and aligned.
    #[inline(always)]
    unsafe fn write_inactive(p: *mut LineResult) {
        // SAFETY: the caller's contract; all-zero bytes are a valid value of every field above
        // (`Option<&Limit>` is a nullable pointer; `Decision::REJECTED` is integers and a
        // `None` that are all zeroes, as a constant below checks; `Part` is integers), and the
        // slot is written next.
        unsafe {
            ptr::write_bytes(p, 0, 1);
            ptr::addr_of_mut!((*p).slot).write(Slot::NONE);
        }
    }

    /// Whether the line holds something for the request that only its end
    /// gives back: an `rl_conn` line's units (taken, or a take in flight on
    /// Redis), or a place in a waiting line (an `rl_conn` line's, or a
    /// rate line's of classes).
    pub fn holds(&self, line: &Line) -> bool {
        match line.limit.is_concurrent() {
            true => self.charged || self.ticket != 0 || self.take_gen != 0,
            false => self.ticket != 0,
        }
    }

    /// The units of the request's cost Redis is asked for: all but what
    /// this nginx's leases paid.
    pub fn redis_cost(&self) -> u64 {
        match self.leased {
            true => self.cost,
            false => self.cost.saturating_sub(self.spent.units()),
        }
    }

    /// The limit the line applies to this request.
    pub fn limit<'a>(&'a self, line: &'a Line) -> &'a Limit {
        self.var_limit.unwrap_or(&line.limit)
    }

    /// Records a verdict (from shared memory or a Redis reply).
    pub fn set(&mut self, o: &Outcome, charged: bool) {
        self.decision.outcome = *o;
        self.charged = charged;
    }

    /// The verdict as rl-core gave it.
    #[inline(always)]
    pub fn outcome(&self) -> &Outcome {
        &self.decision.outcome
    }

    /// Whether the line admits the request (at once or delayed).
    #[inline(always)]
    pub fn admitted(&self) -> bool {
        self.decision.outcome.admitted
    }

    /// Cost-1 requests the line would admit now.
    #[inline(always)]
    pub fn remaining(&self) -> u64 {
        self.decision.outcome.remaining
    }

    /// Microseconds until the line is back to full.
    #[inline(always)]
    pub fn reset_us(&self) -> u64 {
        self.decision.outcome.reset_us
    }

    /// When rejected: the wait until a lone request passes (`None`: never).
    #[inline(always)]
    pub fn retry_after_us(&self) -> Option<u64> {
        self.decision.outcome.retry_after_us
    }

    /// When rejected: the wait until a lone request passes, `u64::MAX` when it never
    /// does (the longest wait, for ranking lines by it).
    #[inline(always)]
    pub fn wait_us(&self) -> u64 {
        self.retry_after_us().unwrap_or(u64::MAX)
    }

    /// How long the line delays the request (0: not delayed).
    #[inline(always)]
    pub fn delay_us(&self) -> u64 {
        self.decision.outcome.delay_us
    }

    /// What the request charged a shared-memory line, for a refund.
    #[inline(always)]
    pub fn charge(&self) -> &Charge {
        &self.decision.charge
    }

    /// Whole seconds until the line is back to full (rounded up):
    /// `X-RateLimit-Reset` less now, `RateLimit-Reset`, `$rl_reset` and
    /// `rl_quota`'s `reset`, one number wherever the line is described.
    #[inline(always)]
    pub fn reset_s(&self) -> u64 {
        self.reset_us().div_ceil(1_000_000)
    }

    /// Whole seconds until the line lets one more unit pass (rounded up):
    /// `t` of the `RateLimit` field, "the time until additional quota is
    /// made available" (rl-core's `Outcome::next_us`, which the decision
    /// fills in where that field is sent).
    #[inline(always)]
    pub fn next_s(&self) -> u64 {
        self.decision.outcome.next_us.div_ceil(1_000_000)
    }

    /// What the line did to the request, as `$rl_status` names it.
    pub fn verdict(&self) -> Verdict {
        match (self.admitted(), self.delay_us() > 0, self.dry_run) {
            (false, _, false) => Verdict::Rejected,
            (false, _, true) => Verdict::RejectedDryRun,
            (true, true, false) => Verdict::Delayed,
            (true, true, true) => Verdict::DelayedDryRun,
            (true, false, _) => Verdict::Passed,
        }
    }

    /// How the line ranks for [`behind`] (least first).
    fn rank(&self) -> (Reverse<Verdict>, bool, Reverse<u64>, u64, Reverse<u64>) {
        let verdict = self.verdict();
        // How long the verdict holds the request back: the wait until a lone request passes
        // when rejected, the delay when delayed.
        let wait = match verdict {
            Verdict::Rejected | Verdict::RejectedDryRun => self.wait_us(),
            Verdict::Delayed | Verdict::DelayedDryRun => self.delay_us(),
            Verdict::Passed => 0,
        };
        (Reverse(verdict), self.dry_run, Reverse(wait), self.remaining(), Reverse(self.reset_us()))
    }
}

/// A line's verdict, in `$limit_req_status`'s words, ordered by precedence:
/// with several lines, the request's is the greatest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Verdict {
    Passed,
    DelayedDryRun,
    RejectedDryRun,
    Delayed,
    Rejected,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Passed => "PASSED",
            Verdict::DelayedDryRun => "DELAYED_DRY_RUN",
            Verdict::RejectedDryRun => "REJECTED_DRY_RUN",
            Verdict::Delayed => "DELAYED",
            Verdict::Rejected => "REJECTED",
        }
    }
}

/// The line behind the request's verdict among `lines`: the greatest
/// verdict; of several lines with it, the longest wait; then (all passed,
/// or equal waits) the most restrictive: fewest remaining, then the longest
/// until full. Enforced lines before dry-run ones, then the first in the
/// location. `$rl_*`, the legacy fields and the log line all describe it.
fn behind<'a>(lines: impl Iterator<Item = (&'a Line, &'a LineResult)>) -> Option<(&'a Line, &'a LineResult)> {
    lines.min_by_key(|(_, r)| r.rank())
}

/// Where the request is in the evaluation of its current stage
/// ([`Ctx::stage`]).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Waiting for this many Redis replies.
    Waiting(u32),
    /// Redis replies are in; the decision is still to be made.
    Replied,
    /// Admitted, and sleeping until its turn (`queue=`).
    Delayed,
    /// Waiting in the line of an `rl_conn` line's queue, looking again
    /// when it wakes; the stage's other lines are decided after.
    Queued,
    /// Decided: later passes through the stage's phase (internal redirects) let it through.
    Decided,
}

/// Per-request state.
pub struct Ctx {
    /// The location's lines (its configuration lives as long as the cycle).
    ids: *const LineId,
    /// The location's line when it has one (else null), found once: most
    /// locations have one line, which every stage of the request reads.
    one: *const Line,
    results: *mut LineResult,
    n: usize,
    /// The stage being decided, or decided last: the lines the decision
    /// works on ([`Ctx::staged`]). Lines of a later stage stay inactive
    /// until it starts.
    pub stage: Stage,
    pub phase: Phase,
    /// An internal redirect happened after the context was made: the
    /// request left the location its lines are of.
    pub redirected: bool,
    pub rejected: bool,
    /// A Redis zone with `on_error=deny` failed (for an `rl_quota` read,
    /// any zone failed: it answers 503).
    pub denied_by_error: bool,
    /// When the request has Redis lines, the verdict of its shared-memory
    /// lines, taken (and charged, if they admit) before Redis is asked:
    /// to be refunded if Redis rejects. `None` while they are to be decided
    /// with the rest.
    pub reserved: Option<bool>,
    /// Redis zones (bit = zone index) whose reply is still awaited.
    pub awaited: u64,
    pub headers: HeadersMode,
    /// Unix time of the decision, seconds.
    pub now_unix: i64,
    /// A `charge=after` line applies: its cost is charged when the request
    /// is logged (then this is cleared: once).
    pub charge_after: bool,
    /// The give-back of what the request's `rl_conn` lines hold is
    /// registered in a cleanup of its pool (once).
    pub release_set: bool,
    /// When the request started waiting for an `rl_conn` slot (µs, the
    /// shared-memory clock).
    pub queued_at_us: u64,
    /// The Redis call in flight is about waiting `rl_conn` lines
    /// ([`crate::eval::redis::wait`]), not the stage's decision.
    pub polling: bool,
    /// Room for the legacy fields' values ([`HeadersMode::LEGACY_BYTES`]),
    /// allocated with the context where they are sent (else null).
    pub legacy_values: *mut u8,
}

impl Ctx {
    /// The location's lines, in the order of [`Ctx::results`].
    pub fn ids(&self) -> &'static [LineId] {
        // SAFETY: n ids of the location configuration, alive for the cycle.
        unsafe { slice::from_raw_parts(self.ids, self.n) }
    }

    pub fn results(&mut self) -> &mut [LineResult] {
        // SAFETY: n results allocated with the context in the request pool.
        unsafe { slice::from_raw_parts_mut(self.results, self.n) }
    }

    /// Each line with its outcome.
    pub fn iter<'a>(&'a self, lines: &'a [Line]) -> impl Iterator<Item = (&'a Line, &'a LineResult)> {
        // SAFETY: as in `results`.
        let results = unsafe { slice::from_raw_parts(self.results, self.n) };
        self.ids().iter().zip(results.iter()).filter_map(|(&id, r)| Some((id.of(lines)?, r)))
    }

    /// The lines evaluated for this request, with their outcomes.
    pub fn active<'a>(&'a self, lines: &'a [Line]) -> impl Iterator<Item = (&'a Line, &'a LineResult)> {
        self.iter(lines).filter(|(_, r)| r.active)
    }

    /// The lines evaluated for this request and enforced (not dry-run):
    /// those the response fields describe.
    pub fn enforced<'a>(&'a self, lines: &'a [Line]) -> impl Iterator<Item = (&'a Line, &'a LineResult)> {
        self.iter(lines).filter(|(_, r)| r.active && !r.dry_run)
    }

    /// The line behind the request's verdict (see [`behind`]), among every
    /// active line: what `$rl_*` and the log line describe.
    pub fn behind<'a>(&'a self, lines: &'a [Line]) -> Option<(&'a Line, &'a LineResult)> {
        behind(self.active(lines))
    }

    /// The line behind the verdict among the enforced lines: what the
    /// response fields describe (dry-run lines add nothing to them). The same
    /// line as [`Ctx::behind`] whenever that one is enforced.
    pub fn enforced_behind<'a>(&'a self, lines: &'a [Line]) -> Option<(&'a Line, &'a LineResult)> {
        match self.only() {
            Some((line, res)) => Some((line, res)).filter(|_| res.active && !res.dry_run),
            None => behind(self.enforced(lines)),
        }
    }

    /// The location's one line with its outcome, when it has a single line
    /// (the common case, taken without walking the lines).
    #[inline(always)]
    pub fn only(&self) -> Option<(&Line, &LineResult)> {
        // SAFETY: `one` is null or a line of the configuration, which outlives the request; with
        // one line there is one result (see `results`).
        unsafe { self.one.as_ref().map(|line| (line, &*self.results)) }
    }

    /// [`Ctx::only`], its outcome to be written.
    #[inline(always)]
    pub fn only_mut(&mut self) -> Option<(&Line, &mut LineResult)> {
        // SAFETY: as in `only`.
        unsafe { self.one.as_ref().map(|line| (line, &mut *self.results)) }
    }

    /// The location's one line, when it is of the stage being decided.
    #[inline(always)]
    pub fn single(&mut self) -> Option<(&Line, &mut LineResult)> {
        let stage = self.stage;
        self.only_mut().filter(|(line, _)| line.stage == stage)
    }

    /// The lines of the stage being decided, with their outcomes.
    pub fn staged<'a>(&'a self, lines: &'a [Line]) -> impl Iterator<Item = (&'a Line, &'a LineResult)> {
        let stage = self.stage;
        self.iter(lines).filter(move |(l, _)| l.stage == stage)
    }

    /// The line behind the verdict of the stage being decided, among its
    /// active lines: what its log line describes.
    pub fn staged_behind<'a>(&'a self, lines: &'a [Line]) -> Option<(&'a Line, &'a LineResult)> {
        behind(self.staged(lines).filter(|(_, r)| r.active))
    }

    /// The lines of the stage being decided, with their outcomes, to be written.
    pub fn staged_mut<'a>(&'a mut self, lines: &'a [Line]) -> impl Iterator<Item = (&'a Line, &'a mut LineResult)> {
        let stage = self.stage;
        self.iter_mut(lines).filter(move |(l, _)| l.stage == stage)
    }

    /// Each line with its outcome, to be written.
    pub fn iter_mut<'a>(&'a mut self, lines: &'a [Line]) -> impl Iterator<Item = (&'a Line, &'a mut LineResult)> {
        let ids = self.ids();
        ids.iter().zip(self.results().iter_mut()).filter_map(|(&id, r)| Some((id.of(lines)?, r)))
    }

    /// One of the Redis replies the request waits for is in: whether it
    /// was the last (the request is then to be resumed).
    pub fn reply_in(&mut self) -> bool {
        self.phase = match self.phase {
            Phase::Waiting(n) if n > 1 => Phase::Waiting(n - 1),
            _ => Phase::Replied,
        };
        self.phase == Phase::Replied
    }
}

/// The request's context: from `r->ctx`, or recovered after an internal
/// redirect (index, try_files, error_page) wiped `r->ctx`, from the slot of
/// the variable that carries it ([`new_ctx`]), so that a request is counted
/// once.
pub fn get_ctx(r: &Request) -> Option<&'static mut Ctx> {
    let raw: *const ngx_http_request_t = r.into();
    let index = Module::module().ctx_index;
    // SAFETY: r->ctx has one slot per http module; ours holds NULL or a pool-allocated Ctx.
    let ctx = unsafe { *(*raw).ctx.add(index) }.cast::<Ctx>();
    // SAFETY: see above; the Ctx lives as long as the request.
    if let Some(ctx) = unsafe { ctx.as_mut() } {
        return Some(ctx);
    }
    // Only an internal redirect wipes r->ctx.
    // SAFETY: the request is valid.
    if unsafe { (*raw).internal() } == 0 {
        return None;
    }
    let var = Module::main_conf(r)?.ctx_var?;
    // SAFETY: r->variables holds a value per indexed variable of the request's configuration,
    // which `var` is one of; only new_ctx writes its `data`, with the request's Ctx.
    let ctx = unsafe { (*(*raw).variables.add(var)).data }.cast::<Ctx>();
    // SAFETY: null, or the Ctx new_ctx allocated in the request pool.
    let ctx = unsafe { ctx.as_mut() }?;
    r.set_module_ctx(ptr::from_mut(ctx).cast(), Module::module());
    ctx.redirected = true;
    Some(ctx)
}

/// A new context for the location's lines, with every line inactive, kept
/// in `r->ctx` and in the value slot of the variable `var` (see
/// [`get_ctx`]).
pub fn new_ctx(
    r: &Request,
    lines: &[Line],
    ids: &[LineId],
    headers: HeadersMode,
    var: Option<ngx_uint_t>,
) -> Option<&'static mut Ctx> {
    let raw: *const ngx_http_request_t = r.into();
    // SAFETY: the request pool is valid for the request's lifetime.
    let pool = unsafe { (*raw).pool };
    // One allocation: the context, its results, the room for the legacy fields' values (what the
    // header filter would allocate on every response).
    let values = if headers.legacy() { HeadersMode::LEGACY_BYTES } else { 0 };
    let size = mem::size_of::<Ctx>() + ids.len() * mem::size_of::<LineResult>() + values;
    // SAFETY: pool is valid; ngx_palloc aligns to NGX_ALIGNMENT (pointer size), and every part
    // needs 8 and has a size that is a multiple of 8.
    let ctx = unsafe { ngx_palloc(pool, size) }.cast::<Ctx>();
    if ctx.is_null() {
        return None;
    }
    // SAFETY: within the size bytes allocated.
    let results = unsafe { ctx.add(1).cast::<LineResult>() };
    // One LineResult each (a location of one line without a loop).
    match ids.len() {
        // SAFETY: as above; the allocation has room for the one line's LineResult.
        1 => unsafe { LineResult::write_inactive(results) },
        // SAFETY: as above; the allocation has room for n LineResults, and i < n.
        n => (0..n).for_each(|i| unsafe { LineResult::write_inactive(results.add(i)) }),
    }
    let one = match ids {
        [id] => id.of(lines).map_or(ptr::null(), ptr::from_ref),
        _ => ptr::null(),
    };
    let value = Ctx {
        ids: ids.as_ptr(),
        one,
        results,
        n: ids.len(),
        stage: Stage::BeforeAuth,
        phase: Phase::Decided,
        redirected: false,
        rejected: false,
        denied_by_error: false,
        reserved: None,
        awaited: 0,
        headers,
        now_unix: ngx_time() as i64,
        charge_after: false,
        release_set: false,
        queued_at_us: 0,
        polling: false,
        // SAFETY: within the size bytes allocated (the last `values` of them).
        legacy_values: if values > 0 { unsafe { results.add(ids.len()).cast::<u8>() } } else { ptr::null_mut() },
    };
    // SAFETY: ctx points to the allocation; r->variables holds a value per indexed variable of the
    // request's configuration, `var` among them (its value is only ever read through `data`).
    unsafe {
        ptr::write(ctx, value);
        if let Some(var) = var {
            (*(*raw).variables.add(var)).data = ctx.cast();
        }
    }
    r.set_module_ctx(ctx.cast(), Module::module());
    // SAFETY: initialised above.
    Some(unsafe { &mut *ctx })
}

// write_inactive's zeroed `Decision` holds a `retry_after_us` of `None`: a layout Rust does not
// promise for `Option<u64>`, so the compiler checks it.
const _: () = {
    // SAFETY: 16 initialised bytes, the size of `Option<u64>`; the assertion is what checks the
    // value they make.
    let none = unsafe { mem::transmute::<[u8; 16], Option<u64>>([0; 16]) };
    assert!(none.is_none());
};

// new_ctx places the parts one after the other in one allocation.
const _: () = assert!(mem::size_of::<Ctx>().is_multiple_of(8) && mem::size_of::<LineResult>().is_multiple_of(8));
