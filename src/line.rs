//! One `rl_limit` line as the configuration leaves it: where its states
//! live, its key, its limit and cost, and the identity its states are
//! stored under; and, where its rate or burst holds variables, the limits
//! it keeps for the values a plan repeats. Lines are owned by
//! [`crate::conf::MainConf::lines`] and named elsewhere by their
//! [`LineId`]; a request's are evaluated in [`crate::eval`].

use core::cell::OnceCell;
use core::sync::atomic::{AtomicPtr, AtomicU64, Ordering};
use core::{mem, ptr};

use ngx::ffi::{ngx_http_complex_value_t, ngx_str_t, ngx_uint_t, ngx_variable_value_t};
use rl_core::limit::wait::{Lane, Wait};
use rl_core::limit::Limit;

use crate::metrics::store::LineSlot;

/// A line's index in [`crate::conf::MainConf::lines`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LineId(pub u32);

impl LineId {
    /// The line in `lines`, the main configuration's lines.
    pub fn of(self, lines: &[Line]) -> Option<&Line> {
        lines.get(self.0 as usize)
    }
}

/// Where a line's states live, resolved in postconfiguration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Backend {
    /// Index into [`crate::conf::MainConf::zones`].
    Shm(usize),
    /// Index into [`crate::conf::MainConf::redis`].
    Redis(usize),
}

impl Backend {
    /// The Redis zone index, if the line is on a Redis zone.
    pub fn redis(self) -> Option<usize> {
        match self {
            Backend::Redis(z) => Some(z),
            Backend::Shm(_) => None,
        }
    }

    /// The shared-memory zone index, if the line is on one.
    pub fn shm(self) -> Option<usize> {
        match self {
            Backend::Shm(z) => Some(z),
            Backend::Redis(_) => None,
        }
    }
}

/// When a line is decided: before nginx's access-control handlers
/// (`allow`/`deny`, `auth_basic`, `auth_request`) run, as `limit_req` is, in
/// the pre-access phase; or, with `after_auth`, once they have allowed the
/// request, at the start of the pre-content phase (the access phase may end
/// early under `satisfy any`, and modules cannot add post-access handlers).
/// Each stage is all-or-nothing on its own: a request rejected after
/// authentication keeps the charges of the lines before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    BeforeAuth,
    AfterAuth,
}

/// Which rate-limit response fields are sent (`rl_headers`): a set of
/// dialects, a bit each, so that every header filter asks about one with a
/// single test of one byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeadersMode(u8);

impl HeadersMode {
    /// None.
    pub const OFF: HeadersMode = HeadersMode(0);
    /// `X-RateLimit-Limit`, `-Remaining`, `-Reset` (Unix time).
    pub const LEGACY: HeadersMode = HeadersMode(1);
    /// draft-ietf-httpapi-ratelimit-headers-10/-11: `RateLimit-Policy` and
    /// `RateLimit`, an item per line.
    pub const DRAFT: HeadersMode = HeadersMode(2);
    /// `legacy` and `draft`.
    pub const BOTH: HeadersMode = HeadersMode(1 | 2);
    /// draft-ietf-httpapi-ratelimit-headers-06 (express-rate-limit's
    /// `draft-6`): `RateLimit-Limit`, `-Remaining`, `-Reset` (seconds) and
    /// `RateLimit-Policy` (unless `draft`'s is sent).
    pub const DRAFT6: HeadersMode = HeadersMode(4);

    /// The most bytes the legacy fields' values take (four numbers of up to
    /// 20 digits): set aside with the request's context.
    pub const LEGACY_BYTES: usize = 80;

    pub fn legacy(self) -> bool {
        self.0 & HeadersMode::LEGACY.0 != 0
    }
    pub fn draft(self) -> bool {
        self.0 & HeadersMode::DRAFT.0 != 0
    }
    pub fn draft6(self) -> bool {
        self.0 & HeadersMode::DRAFT6.0 != 0
    }
    /// `draft` or `draft-6`: the fields named `RateLimit*`, asked once where
    /// `legacy` alone has nothing more to do.
    pub fn ietf(self) -> bool {
        self.0 & (HeadersMode::DRAFT.0 | HeadersMode::DRAFT6.0) != 0
    }
    /// Both sets of fields.
    pub fn with(self, other: HeadersMode) -> HeadersMode {
        HeadersMode(self.0 | other.0)
    }
    /// Whether every field of `other` is in this set.
    pub fn has(self, other: HeadersMode) -> bool {
        self.0 & other.0 == other.0
    }
}

/// An `ngx_variable_value_t` as C lays it out: `len:28, valid:1,
/// no_cacheable:1, not_found:1, escape:1` in one 32-bit unit, then `data`.
/// bindgen's getters read a bitfield one bit at a time (about 50
/// instructions for `len` and `not_found`); this reads the unit once.
/// [`VarValue::matches`] checks the layout against bindgen's before a line
/// relies on it.
#[repr(C)]
pub struct VarValue {
    bits: u32,
    data: *mut u8,
}

impl VarValue {
    const LEN: u32 = (1 << 28) - 1;
    const NOT_FOUND: u32 = 1 << 30;

    /// Whether a value written with bindgen's setters reads back the same
    /// through `VarValue` (the bitfields' order is the compiler's ABI).
    pub fn matches() -> bool {
        if mem::size_of::<VarValue>() != mem::size_of::<ngx_variable_value_t>()
            || mem::offset_of!(VarValue, data) != mem::offset_of!(ngx_variable_value_t, data)
        {
            return false;
        }
        // SAFETY: an all-zero ngx_variable_value_t is a valid value (no length, null data).
        let mut v: ngx_variable_value_t = unsafe { mem::zeroed() };
        let (found, missing) = (0x0abc_defe, 0x0123_4567);
        v.set_len(found);
        v.set_escape(1);
        // SAFETY: same size and data offset, checked above; any bits are a valid u32.
        let got = unsafe { &*ptr::addr_of!(v).cast::<VarValue>() };
        if got.bits & VarValue::LEN != found || got.bits & VarValue::NOT_FOUND != 0 {
            return false;
        }
        v.set_len(missing);
        v.set_not_found(1);
        v.set_escape(0);
        // SAFETY: as above.
        let got = unsafe { &*ptr::addr_of!(v).cast::<VarValue>() };
        got.bits & VarValue::LEN == missing && got.bits & VarValue::NOT_FOUND != 0
    }

    /// The value, `None` when the variable was not found.
    #[inline(always)]
    pub fn found(&self) -> Option<ngx_str_t> {
        (self.bits & VarValue::NOT_FOUND == 0)
            .then_some(ngx_str_t { len: (self.bits & VarValue::LEN) as usize, data: self.data })
    }
}

/// How a line reads its key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeySource {
    /// The complex value, which evaluates any text with variables.
    Complex,
    /// One variable and nothing else (`$http_x_user`), by its index: its
    /// value is the key as is, without the complex value's length pass and
    /// copy.
    Var(ngx_uint_t),
    /// `$binary_remote_addr`, the default key, read from the connection
    /// where nginx's handler for the variable reads it, without the
    /// variable's lookup and call.
    ClientAddr,
}

/// One `rl_limit` line.
pub struct Line {
    pub backend: Backend,
    pub zone_name: String,
    /// The key, a complex value allocated from the configuration pool.
    pub key: *mut ngx_http_complex_value_t,
    /// How the key is read: see [`KeySource`].
    pub key_source: KeySource,
    pub key_src: String,
    pub limit: Limit,
    pub cost: u64,
    /// Identity of this line's states inside the zone; stable across reloads
    /// while the line is unchanged.
    pub id: u64,
    /// The item name in the `RateLimit` / `RateLimit-Policy` fields.
    pub item: String,
    /// The burst in decimal, the `X-RateLimit-Limit` value: written once.
    pub burst_text: String,
    /// `file:line` of the directive, for messages found after parsing.
    pub origin: String,
    /// `name=`: the line's identity within its zone, wherever it appears.
    pub name: Option<String>,
    /// `dry_run`: evaluated and charged as if enforced, never rejects or
    /// delays (also set by `rl_dry_run on`).
    pub dry_run: bool,
    /// `queue=`: requests of a key that may wait for their turn.
    pub queue: u64,
    /// The longest a request waits in the line's waiting line (ms):
    /// `rl_conn ... timeout=`, or what an `rl_limit` line of classes lets
    /// its `queue=` through in.
    pub wait_ms: u64,
    /// `after_auth`: decided once access control has allowed the request.
    /// Not part of the identity: the stage is when a state is charged, not
    /// what it means.
    pub stage: Stage,
    /// The largest `queue=` of the lines with this one's identity (their
    /// states are shared): how far a state may go beyond the burst;
    /// [`rl_core::redis::OVERDRAWN`] if one of them charges after the response.
    pub deepest_queue: u64,
    /// `rate=` and `burst=` as written (the parsed value for static ones):
    /// what identities and `nginx -t`'s messages compare.
    pub rate_src: String,
    pub burst_src: String,
    /// The parameters that hold variables, evaluated per request.
    pub vars: Option<Box<Varying>>,
    /// `charge=after`: the access phase asks for one unit and charges
    /// nothing; the cost is charged when the request is logged.
    pub charge_after: bool,
    /// On a Redis zone in lease mode: the zone's index in
    /// [`crate::conf::MainConf::leases`] and how the line is leased (set at
    /// postconfiguration).
    pub lease: Option<(usize, rl_core::lease::Leasing)>,
    /// This worker's counters of the line in `rl_metrics`' zone (null
    /// without it): set when the worker starts, so that counting a verdict
    /// looks nothing up.
    pub counters: AtomicPtr<LineSlot>,
    /// A line's waiting line, by class (`rl_conn ... queue=`, `classes=`;
    /// `rl_limit ... queue= classes=`): what its state is laid out for.
    /// Empty for other lines.
    pub lanes: Vec<Lane>,
    /// `rl_conn ... priority= classes=`: what a request's class is.
    pub classes: Option<Box<Classes>>,
}

/// The classes of a line: `priority=` names a request's, among `classes=`
/// (highest first; a name that is none of them is the lowest).
pub struct Classes {
    pub priority: VarParam,
    pub names: Vec<String>,
    /// An `rl_limit` line's: what a request of each class must leave of
    /// the budget, the reserves of the classes above it (an `rl_conn`
    /// line's waiting line keeps its own: empty).
    pub kept: Vec<u64>,
    /// This worker's counters of each class in `rl_metrics`' zone (null
    /// without it), as the line's own.
    pub counters: Vec<AtomicPtr<LineSlot>>,
}

impl Classes {
    /// This worker's counters of class `class`, if counted.
    pub fn counters(&self, class: usize) -> Option<&LineSlot> {
        // SAFETY: null, or set by `set_counters` to a slot in the counters' zone, which is mapped
        // for the cycle the configuration is of.
        self.counters.get(class).and_then(|c| unsafe { c.load(Ordering::Relaxed).as_ref() })
    }

    /// Sets this worker's counters of class `class`, when the worker starts.
    pub fn set_counters(&self, class: usize, slot: &LineSlot) {
        if let Some(c) = self.counters.get(class) {
            c.store(ptr::from_ref(slot).cast_mut(), Ordering::Relaxed);
        }
    }

    /// The class of a request whose `priority=` is `value`.
    pub fn of(&self, value: &[u8]) -> usize {
        rl_core::spec::classes::class_of(&self.names, value)
    }
}

/// A parameter of `rl_limit` that holds variables: compiled, and as written.
pub struct VarParam {
    pub cv: *mut ngx_http_complex_value_t,
    /// The variable's index when the value is one variable and nothing else
    /// (`$plan_rate`): read as is, as a key of one variable is.
    pub var: Option<ngx_uint_t>,
    pub src: String,
}

/// The variable parameters of a line (at least one of them is set).
pub struct Varying {
    pub rate: Option<VarParam>,
    pub burst: Option<VarParam>,
    pub cost: Option<VarParam>,
    /// When a bad value was last logged (seconds): at most once a second
    /// per line. In memory every worker shares ([`Varying::share`]), else
    /// (that memory could not be had) in the worker's own.
    logged_s: AtomicU64,
    shared_s: *const AtomicU64,
    /// The first rate and burst texts the worker parsed, and the limits they
    /// gave: a plan's values repeat from request to request, and comparing
    /// a few bytes costs far less than parsing them, building a limit and
    /// copying it into the request's pool. Each entry is written once and
    /// never changed, so that a request keeps a reference to its limit for
    /// as long as it lives (values beyond the entries are parsed every time,
    /// and copied). Each worker has its own (the configuration is copied
    /// into each on fork), and only its event loop reads lines.
    memo: [OnceCell<Memo>; Memo::ENTRIES],
}

/// A request's limit from its variables: kept by the line (see
/// [`Varying::memo`]), or made for the request alone.
pub enum VarLimit<'a> {
    Kept(&'a Limit),
    Made(Limit),
}

/// A parameter's text as [`Memo`] keeps it: up to [`Memo::TEXT`] bytes.
type MemoText = (u8, [u8; Memo::TEXT]);

/// See [`Varying::memo`]: `rate` and `burst` are `None` for a fixed one.
#[derive(Clone, Copy)]
struct Memo {
    rate: Option<MemoText>,
    burst: Option<MemoText>,
    limit: Limit,
}

impl Memo {
    /// Longer values are parsed every time.
    const TEXT: usize = 30;
    /// Distinct rate and burst pairs a line keeps (a plan each, usually).
    const ENTRIES: usize = 8;

    fn text(v: Option<ngx_str_t>) -> Option<Option<MemoText>> {
        let Some(v) = v else { return Some(None) };
        let bytes = v.as_bytes();
        let mut text = [0; Memo::TEXT];
        text.get_mut(..bytes.len())?.copy_from_slice(bytes);
        Some(Some((bytes.len() as u8, text)))
    }

    fn same(kept: &Option<MemoText>, v: Option<ngx_str_t>) -> bool {
        match (kept, v) {
            (None, None) => true,
            (Some((len, text)), Some(v)) => text.get(..usize::from(*len)) == Some(v.as_bytes()),
            _ => false,
        }
    }
}

impl Varying {
    pub fn new(rate: Option<VarParam>, burst: Option<VarParam>, cost: Option<VarParam>) -> Option<Box<Varying>> {
        (rate.is_some() || burst.is_some() || cost.is_some()).then(|| {
            Box::new(Varying {
                rate,
                burst,
                cost,
                logged_s: AtomicU64::new(0),
                shared_s: ptr::null(),
                memo: Default::default(),
            })
        })
    }

    /// Keeps the time of the last bad value logged in `word`, which every
    /// worker of the configuration's cycle shares.
    ///
    /// # Safety
    /// `word` must stay valid, and be used only atomically, as long as the
    /// line exists.
    pub unsafe fn share(&mut self, word: *const AtomicU64) {
        self.shared_s = word;
    }

    /// When a bad value was last logged.
    pub fn logged(&self) -> &AtomicU64 {
        // SAFETY: set by `share`, whose caller keeps the word valid while the line exists.
        unsafe { self.shared_s.as_ref() }.unwrap_or(&self.logged_s)
    }

    /// Whether the rate or burst varies (the state then keeps its scale).
    pub fn limit_varies(&self) -> bool {
        self.rate.is_some() || self.burst.is_some()
    }

    /// The limit of a request's rate and burst values (`None`: the line's
    /// own): the one kept for them, else the one `make` makes of them, kept
    /// while there is room for it (see [`Varying::memo`]).
    #[inline(always)]
    pub fn limit_for<E>(
        &self,
        rate_v: Option<ngx_str_t>,
        burst_v: Option<ngx_str_t>,
        make: impl FnOnce() -> Result<Limit, E>,
    ) -> Result<VarLimit<'_>, E> {
        // Entries fill in order: the first empty one ends the kept values.
        let mut empty = None;
        for entry in &self.memo {
            match entry.get() {
                Some(m) if Memo::same(&m.rate, rate_v) && Memo::same(&m.burst, burst_v) => {
                    return Ok(VarLimit::Kept(&m.limit));
                }
                Some(_) => {}
                None => {
                    empty = Some(entry);
                    break;
                }
            }
        }
        let limit = make()?;
        if let (Some(entry), Some(rate), Some(burst)) = (empty, Memo::text(rate_v), Memo::text(burst_v)) {
            let m = entry.get_or_init(|| Memo { rate, burst, limit });
            return Ok(VarLimit::Kept(&m.limit));
        }
        Ok(VarLimit::Made(limit))
    }
}

impl Line {
    /// This worker's counters of the line (`None` without `rl_metrics`).
    #[inline(always)]
    pub fn counters(&self) -> Option<&LineSlot> {
        // SAFETY: null, or set by `set_counters` to a slot in the counters' zone, which is mapped
        // for the cycle the configuration is of.
        unsafe { self.counters.load(Ordering::Relaxed).as_ref() }
    }

    /// Sets this worker's counters of the line, when the worker starts.
    pub fn set_counters(&self, slot: &LineSlot) {
        self.counters.store(ptr::from_ref(slot).cast_mut(), Ordering::Relaxed);
    }

    /// Whether the rate or burst holds variables.
    pub fn limit_varies(&self) -> bool {
        self.vars.as_deref().is_some_and(Varying::limit_varies)
    }

    /// Whether the burst may differ from request to request: it holds
    /// variables, or is left out (the rate's count) of a rate that does.
    pub fn burst_varies(&self) -> bool {
        self.vars.as_deref().is_some_and(|v| v.burst.is_some() || (v.rate.is_some() && self.burst_src.is_empty()))
    }

    /// The `X-RateLimit-Limit` value (it lives as long as the configuration).
    pub fn burst_text(&self) -> ngx_str_t {
        ngx_str_t { len: self.burst_text.len(), data: self.burst_text.as_ptr() as *mut u8 }
    }

    /// A line decided by its waiting line ([`crate::shm::wait`]): an
    /// `rl_conn` one with a queue, or with classes (whose reserves count
    /// what each class holds); an `rl_limit` one of classes with a queue.
    pub fn waits(&self) -> bool {
        (self.limit.is_concurrent() && (self.limit.queue() > 0 || self.lanes.len() > 1)) || self.limit.rate_waits()
    }

    /// The waiting line in a [`Line::waits`] line's `state` at `now_us`.
    pub fn wait_in<'a>(&'a self, state: &'a mut [u64], now_us: u64) -> Option<Wait<'a>> {
        match self.limit.is_concurrent() {
            true => self.limit.wait(state, &self.lanes),
            false => {
                let kept = self.classes.as_deref().map_or(&[][..], |c| &c.kept[..]);
                self.limit.rate_wait(state, &self.lanes, self.queue, kept, now_us)
            }
        }
    }

    /// How an `rl_conn` line's state is laid out beyond its units (its
    /// waiting line's places in all and per class, and the units of each
    /// class), as part of its identity: a reload that changes it starts the
    /// line afresh, so that no state is read with a layout it was not made
    /// with (old workers draining still use theirs). Empty for a line
    /// without a waiting line, and for `rl_limit` lines, whose identities
    /// (and Redis keys) it leaves as they were.
    fn waiting_layout(&self) -> String {
        if !self.waits() {
            return String::new();
        }
        let places: Vec<String> = self.lanes.iter().map(|l| l.places.to_string()).collect();
        // (an rl_limit line's own queue is 0: its waiter is let in only where the algorithm admits)
        format!("|wait:{}:{}", self.limit.queue().max(self.queue), places.join(","))
    }

    /// The directive the line comes from, as messages name it.
    pub fn directive(&self) -> &'static str {
        match self.limit.is_concurrent() {
            true => "rl_conn",
            false => "rl_limit",
        }
    }

    /// Whether `name` may name a line: a token, as it is quoted in the
    /// `RateLimit` fields and logged.
    pub fn valid_name(name: &str) -> bool {
        !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    }

    /// The identity of a line's states: lines with one identity share one
    /// state per key wherever they appear. A named line's is its zone and
    /// name; an unnamed line's its zone, key, algorithm, rate and burst (not
    /// its cost, queue or dry run). The same on every nginx of a fleet
    /// running the same line (SipHash with fixed keys, not std's hasher,
    /// whose algorithm may change between Rust releases), and for unnamed
    /// lines the same as before names existed, so that their Redis keys stay.
    pub fn identity(&self) -> u64 {
        self.identity_with(&self.waiting_layout())
    }

    /// The identity of the requests an `rl_conn` line counts, whatever its
    /// waiting line: lines of one such identity must have one layout
    /// (`nginx -t` refuses others, [`Line::identity`] keeps them apart).
    pub fn counted_identity(&self) -> u64 {
        self.identity_with("")
    }

    /// [`Line::identity`] with `layout` (see [`Line::waiting_layout`]).
    fn identity_with(&self, layout: &str) -> u64 {
        let sip = siphasher::sip::SipHasher13::new_with_keys(0, 0);
        if let Some(name) = &self.name {
            // An unnamed line's text starts with its zone name, which is
            // never empty and holds no NUL: named and unnamed never share.
            return sip.hash(format!("\0{}\0{}{}", self.zone_name, name, layout).as_bytes());
        }
        if self.limit.is_concurrent() {
            // Requests in flight of one key, whatever the max each line allows (as limit_conn's
            // nodes): never shared with a rate's.
            let canon = format!("{}|{}|{}{}", self.zone_name, self.key_src, self.limit.algorithm(), layout);
            return sip.hash(canon.as_bytes());
        }
        if self.vars.as_deref().is_some_and(Varying::limit_varies) {
            // A state that keeps its scale: never shared with a static line's.
            let canon = format!(
                "{}|{}|{}|{}|{}|varying",
                self.zone_name,
                self.key_src,
                self.limit.algorithm(),
                self.rate_src,
                self.burst_src
            );
            return sip.hash(canon.as_bytes());
        }
        let rate = self.limit.rate();
        let canon = format!(
            "{}|{}|{}|{}|{}|{}",
            self.zone_name,
            self.key_src,
            self.limit.algorithm(),
            rate.count,
            rate.period_us,
            self.limit.burst()
        );
        sip.hash(canon.as_bytes())
    }
}
