//! One `rl_limit` line as the configuration leaves it: where its states
//! live, its key, its limit and cost, and the identity its states are
//! stored under. Lines are owned by [`crate::conf::MainConf::lines`] and
//! named elsewhere by their [`LineId`].

use core::cell::OnceCell;
use core::sync::atomic::{AtomicPtr, AtomicU64, Ordering};
use core::{mem, ptr};

use ngx::ffi::{
    in6_addr, in_addr, ngx_http_complex_value, ngx_http_complex_value_t, ngx_http_get_flushed_variable,
    ngx_http_request_t, ngx_log_t, ngx_str_t, ngx_time, ngx_uint_t, ngx_variable_value_t, sockaddr_in, sockaddr_in6,
    AF_INET6, AF_UNIX, NGX_LOG_ERR,
};
use ngx::ngx_log_error;
use rl_core::limit::Limit;
use rl_core::parse::{parse_number, parse_rate, parse_u64, ParseError};

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
    /// This worker's counters of the line in `rl_metrics`' zone (null
    /// without it): set when the worker starts, so that counting a verdict
    /// looks nothing up.
    pub counters: AtomicPtr<LineSlot>,
}

/// A parameter of `rl_limit` that holds variables: compiled, and as written.
pub struct VarParam {
    pub cv: *mut ngx_http_complex_value_t,
    /// The variable's index when the value is one variable and nothing else
    /// (`$plan_rate`): read as is, as a key of one variable is.
    pub var: Option<ngx_uint_t>,
    pub src: String,
}

impl VarParam {
    /// The value for the request, or `Err` if it cannot be evaluated (no memory).
    fn eval(&self, r: *mut ngx_http_request_t) -> Result<ngx_str_t, ()> {
        if let Some(index) = self.var {
            return Ok(flushed(r, index));
        }
        let mut value = ngx_str_t::empty();
        // SAFETY: compiled at configuration time; the value is allocated in r->pool.
        if unsafe { ngx_http_complex_value(r, self.cv, &mut value) } != 0 {
            return Err(());
        }
        Ok(value)
    }
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
    fn logged(&self) -> &AtomicU64 {
        // SAFETY: set by `share`, whose caller keeps the word valid while the line exists.
        unsafe { self.shared_s.as_ref() }.unwrap_or(&self.logged_s)
    }

    /// Whether the rate or burst varies (the state then keeps its scale).
    pub fn limit_varies(&self) -> bool {
        self.rate.is_some() || self.burst.is_some()
    }
}

/// A line's limit and cost for one request.
pub enum Params {
    /// As configured.
    Static,
    /// From the request's variables: the cost (and the limit, written
    /// where [`Line::eval_params`] was told).
    Per(u64),
    /// An empty or bad value: the line does not apply to the request.
    Off,
}

/// Why a variable parameter's value was not applied.
enum BadValue {
    Parse(&'static str, ParseError),
    Limit(String),
    /// A `charge=after` cost beyond [`Limit::max_cost`], and that cap.
    Cost(u64, u64),
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

    /// The line's key for the request (empty: the line does not apply to
    /// it), or `Err` if it cannot be evaluated (no memory).
    #[inline(always)]
    pub fn eval_key(&self, r: *mut ngx_http_request_t) -> Result<ngx_str_t, ()> {
        match self.key_source {
            KeySource::ClientAddr => return Ok(client_addr(r)),
            KeySource::Var(index) => return Ok(flushed(r, index)),
            KeySource::Complex => {}
        }
        let mut key = ngx_str_t::empty();
        // SAFETY: the key was compiled at configuration time; the value is allocated in r->pool.
        if unsafe { ngx_http_complex_value(r, self.key, &mut key) } != 0 {
            return Err(());
        }
        Ok(key)
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

    /// The line's limit and cost for the request: evaluated when they hold
    /// variables, the limit written to `limit` when the rate or burst
    /// does (straight into the request's result: a limit is a few words).
    /// `cost=` is not evaluated for `charge=after`, whose cost is known when
    /// the request is logged. A bad value is logged, at most once a second
    /// per line; `Err`: no memory.
    pub fn eval_params<'a>(
        &'a self,
        r: *mut ngx_http_request_t,
        log: *mut ngx_log_t,
        redis: bool,
        limit: &mut Option<VarLimit<'a>>,
    ) -> Result<Params, ()> {
        let Some(vars) = self.vars.as_deref() else {
            return Ok(Params::Static);
        };
        let mut cost = self.cost;
        let mut bad = None;
        if vars.limit_varies() {
            match self.eval_limit(vars, r, redis)? {
                Some(Ok(l)) => *limit = Some(l),
                Some(Err(e)) => bad = Some(e),
                None => return Ok(Params::Off),
            }
        }
        if let (None, Some(p), false) = (&bad, &vars.cost, self.charge_after) {
            match eval_text(p, r)? {
                None => return Ok(Params::Off),
                Some(t) => match parse_number(t) {
                    Ok(c) => cost = c,
                    Err(e) => bad = Some(BadValue::Parse("cost", e)),
                },
            }
        }
        match bad {
            None => Ok(Params::Per(cost)),
            Some(bad) => {
                self.log_bad(vars, log, bad);
                Ok(Params::Off)
            }
        }
    }

    /// The request's limit from its variable rate or burst: `None` when a
    /// value is empty.
    fn eval_limit<'a>(
        &self,
        vars: &'a Varying,
        r: *mut ngx_http_request_t,
        redis: bool,
    ) -> Result<Option<Result<VarLimit<'a>, BadValue>>, ()> {
        let (mut rate_v, mut burst_v) = (None, None);
        for (p, v) in [(&vars.rate, &mut rate_v), (&vars.burst, &mut burst_v)] {
            if let Some(p) = p {
                match p.eval(r)? {
                    e if e.len == 0 => return Ok(None),
                    e => *v = Some(e),
                }
            }
        }
        // Entries fill in order: the first empty one ends the kept values.
        let mut empty = None;
        for entry in &vars.memo {
            match entry.get() {
                Some(m) if Memo::same(&m.rate, rate_v) && Memo::same(&m.burst, burst_v) => {
                    return Ok(Some(Ok(VarLimit::Kept(&m.limit))));
                }
                Some(_) => {}
                None => {
                    empty = Some(entry);
                    break;
                }
            }
        }
        let limit = match self.parse_limit(rate_v, burst_v, redis) {
            Ok(limit) => limit,
            Err(e) => return Ok(Some(Err(e))),
        };
        if let (Some(entry), Some(rate), Some(burst)) = (empty, Memo::text(rate_v), Memo::text(burst_v)) {
            let m = entry.get_or_init(|| Memo { rate, burst, limit });
            return Ok(Some(Ok(VarLimit::Kept(&m.limit))));
        }
        Ok(Some(Ok(VarLimit::Made(limit))))
    }

    /// The limit of a request's rate and burst texts (`None`: the line's own).
    fn parse_limit(
        &self,
        rate_v: Option<ngx_str_t>,
        burst_v: Option<ngx_str_t>,
        redis: bool,
    ) -> Result<Limit, BadValue> {
        let rate = match rate_v {
            Some(v) => parse_rate(text(v)).map_err(|e| BadValue::Parse("rate", e))?,
            None => self.limit.rate(),
        };
        let burst = match burst_v {
            Some(v) => parse_u64(text(v)).map_err(|e| BadValue::Parse("burst", e))?,
            // Left out: the rate's count, as for a static line.
            None if self.burst_src.is_empty() => rate.count,
            None => self.limit.burst(),
        };
        match Limit::new(self.limit.algorithm(), rate, burst).and_then(|l| l.with_queue(self.queue)) {
            Ok(l) if redis && !rl_core::redis::exact(&l) => Err(BadValue::Limit(format!(
                "rate {rate} with burst {burst} is out of the range a Redis zone computes exactly"
            ))),
            Ok(l) => Ok(l.varying()),
            Err(e) => Err(BadValue::Limit(e.to_string())),
        }
    }

    /// The cost of a `charge=after` line, evaluated when the request is
    /// logged: `None` to charge nothing (empty, zero, or a bad value,
    /// logged).
    pub fn after_cost(&self, r: *mut ngx_http_request_t, log: *mut ngx_log_t) -> Option<u64> {
        let Some((vars, p)) = self.vars.as_deref().and_then(|v| Some((v, v.cost.as_ref()?))) else {
            return Some(self.cost).filter(|c| *c > 0);
        };
        let text = eval_text(p, r).ok()??;
        match parse_number(text) {
            Ok(cost) => Some(cost).filter(|c| *c > 0),
            Err(e) => {
                self.log_bad(vars, log, BadValue::Parse("cost", e));
                None
            }
        }
    }

    /// What a `charge=after` line charges for `cost` under the request's
    /// `limit`: the cost, or, for a figure no real cost reaches (beyond what
    /// the rate refills in [`rl_core::limit::MAX_CHARGE_US`]), the cap,
    /// logged. A static cost never exceeds the burst, so only a cost from
    /// variables can be capped.
    pub fn capped_cost(&self, cost: u64, limit: &Limit, log: *mut ngx_log_t) -> u64 {
        let cap = limit.max_cost();
        if cost <= cap {
            return cost;
        }
        if let Some(vars) = self.vars.as_deref() {
            self.log_bad(vars, log, BadValue::Cost(cost, cap));
        }
        cap
    }

    /// Says why a value was not applied (or, for a cost, what was charged
    /// instead), at most once a second per line.
    fn log_bad(&self, vars: &Varying, log: *mut ngx_log_t, bad: BadValue) {
        let now = ngx_time() as u64;
        if vars.logged().swap(now, Ordering::Relaxed) == now {
            return;
        }
        let src = |p: Option<&VarParam>| p.map_or("", |p| p.src.as_str()).to_string();
        let (why, then) = match bad {
            BadValue::Parse(what, e) => {
                let from = match what {
                    "rate" => src(vars.rate.as_ref()),
                    "burst" => src(vars.burst.as_ref()),
                    _ => src(vars.cost.as_ref()),
                };
                let value: String = e.value.chars().take(64).collect();
                (format!("invalid {what} \"{value}\" from \"{from}\""), "the line is not applied".to_string())
            }
            BadValue::Limit(m) => (m, "the line is not applied".to_string()),
            BadValue::Cost(cost, cap) => (
                format!(
                    "cost {cost} from \"{}\" is more than the rate refills in {} days",
                    src(vars.cost.as_ref()),
                    rl_core::limit::MAX_CHARGE_US / 86_400_000_000
                ),
                format!("charged as {cap}"),
            ),
        };
        ngx_log_error!(
            NGX_LOG_ERR,
            log,
            "{} in rl_limit \"{}\" of zone \"{}\" ({}), {}",
            why,
            self.item,
            self.zone_name,
            self.origin,
            then
        );
    }

    /// The `X-RateLimit-Limit` value (it lives as long as the configuration).
    pub fn burst_text(&self) -> ngx_str_t {
        ngx_str_t { len: self.burst_text.len(), data: self.burst_text.as_ptr() as *mut u8 }
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
        let sip = siphasher::sip::SipHasher13::new_with_keys(0, 0);
        if let Some(name) = &self.name {
            // An unnamed line's text starts with its zone name, which is
            // never empty and holds no NUL: named and unnamed never share.
            return sip.hash(format!("\0{}\0{}", self.zone_name, name).as_bytes());
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

/// The value of the variable registered at `index`, as the complex value
/// `"$name"` evaluates it: flushed, empty when not found.
#[inline(always)]
fn flushed(r: *mut ngx_http_request_t, index: ngx_uint_t) -> ngx_str_t {
    // SAFETY: the index was registered for this configuration; r is the request being handled;
    // an index is only kept where VarValue reads the value's layout right (VarValue::matches).
    let value = unsafe { ngx_http_get_flushed_variable(r, index).cast::<VarValue>().as_ref() };
    match value {
        Some(v) if v.bits & VarValue::NOT_FOUND == 0 => {
            ngx_str_t { len: (v.bits & VarValue::LEN) as usize, data: v.data }
        }
        _ => ngx_str_t::empty(),
    }
}

/// `$binary_remote_addr`'s value, as nginx's handler for it
/// (`ngx_http_variable_binary_remote_addr`) makes it: the client's IPv6
/// address (16 bytes) or IPv4 address (4 bytes), or the address text of a
/// UNIX-domain socket's client. Read from the request's connection when the
/// key is evaluated, as the handler reads it, so that an address the realip
/// module set counts as it does for the variable.
#[inline(always)]
fn client_addr(r: *mut ngx_http_request_t) -> ngx_str_t {
    // SAFETY: r is the request being handled: its connection, and the connection's address
    // (a sockaddr of the family it says, sockaddr_in6 or sockaddr_in) and address text, are
    // valid for the request's lifetime.
    unsafe {
        let c = (*r).connection;
        let sa = (*c).sockaddr;
        match u32::from((*sa).sa_family) {
            AF_INET6 => ngx_str_t {
                len: mem::size_of::<in6_addr>(),
                data: ptr::addr_of_mut!((*sa.cast::<sockaddr_in6>()).sin6_addr).cast(),
            },
            AF_UNIX => (*c).addr_text,
            _ => ngx_str_t {
                len: mem::size_of::<in_addr>(),
                data: ptr::addr_of_mut!((*sa.cast::<sockaddr_in>()).sin_addr).cast(),
            },
        }
    }
}

/// A parameter's value as text: `None` when empty (the line does not apply).
/// Bytes that are not UTF-8 cannot parse: they read as text that fails to.
fn eval_text<'r>(p: &VarParam, r: *mut ngx_http_request_t) -> Result<Option<&'r str>, ()> {
    let v = p.eval(r)?;
    Ok((v.len > 0).then(|| text(v)))
}

/// A value as text. Bytes that are not UTF-8 cannot parse: they read as
/// text that fails to.
fn text<'r>(v: ngx_str_t) -> &'r str {
    if v.len == 0 {
        return "";
    }
    // SAFETY: the value was allocated in r->pool, which outlives the phase handler.
    let bytes = unsafe { core::slice::from_raw_parts(v.data, v.len) };
    core::str::from_utf8(bytes).unwrap_or("\u{fffd}")
}
