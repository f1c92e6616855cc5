//! Configuration: the `rl_zone`, `rl_limit`, `rl_status` and `rl_headers`
//! directives, and what they leave behind for the request handler.

use core::ffi::{c_char, c_void};
use core::{mem, ptr};
use std::collections::HashMap;

use ngx::core::{Pool, NGX_CONF_ERROR, NGX_CONF_OK};
use ngx::ffi::{
    ngx_command_t, ngx_conf_t, ngx_http_compile_complex_value, ngx_http_compile_complex_value_t,
    ngx_http_complex_value_t, ngx_str_t, ngx_uint_t, NGX_LOG_EMERG,
};
use ngx::http::HttpModuleMainConf;
use ngx::ngx_conf_log_error;
use rl_core::limit::{Algorithm, Limit};
use rl_core::parse::{parse_rate, parse_size};

use crate::redis_zone::RedisZone;
use crate::zone::Zone;
use crate::Module;

/// Which rate-limit response fields are sent (`rl_headers`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeadersMode {
    Off,
    Legacy,
    Draft,
    Both,
}

impl HeadersMode {
    pub fn legacy(self) -> bool {
        matches!(self, HeadersMode::Legacy | HeadersMode::Both)
    }
    pub fn draft(self) -> bool {
        matches!(self, HeadersMode::Draft | HeadersMode::Both)
    }
}

/// Where a line's states live, resolved in postconfiguration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Backend {
    /// Index into [`MainConf::zones`].
    Shm(usize),
    /// Index into [`MainConf::redis`].
    Redis(usize),
}

/// One `rl_limit` line.
pub struct Line {
    pub backend: Backend,
    pub zone_name: String,
    /// The key, a complex value allocated from the configuration pool.
    pub key: *mut ngx_http_complex_value_t,
    pub key_src: String,
    pub limit: Limit,
    pub cost: u64,
    /// Identity of this line's states inside the zone; stable across reloads
    /// while the line is unchanged.
    pub id: u64,
    /// The item name in the `RateLimit` / `RateLimit-Policy` fields.
    pub item: String,
    /// `file:line` of the directive, for messages found after parsing.
    pub origin: String,
}

/// Boxed elements: their addresses are kept elsewhere (the shm zone's
/// `data`, the location configurations' line lists) and must not move.
#[derive(Default)]
#[allow(clippy::vec_box)]
pub struct MainConf {
    pub zones: Vec<Box<Zone>>,
    pub redis: Vec<Box<RedisZone>>,
    /// Every `rl_limit` line, in configuration order.
    pub lines: Vec<Box<Line>>,
    /// Location configurations that have lines, sorted by zone at postconfiguration.
    pub locs: Vec<*mut LocConf>,
}

pub struct LocConf {
    /// Lines of this level; empty means "inherit".
    pub lines: Vec<*const Line>,
    /// Some line is on a Redis zone (set at postconfiguration).
    pub has_redis: bool,
    pub status: ngx_uint_t,
    pub headers: Option<HeadersMode>,
}

impl Default for LocConf {
    fn default() -> Self {
        LocConf { lines: Vec::new(), has_redis: false, status: ngx_uint_t::MAX, headers: None }
    }
}

pub const DEFAULT_STATUS: ngx_uint_t = 429;

/// Redis zones one nginx may declare (a request tracks them in a 64-bit mask).
pub const MAX_REDIS_ZONES: usize = 64;

impl ngx::http::Merge for LocConf {
    fn merge(&mut self, prev: &LocConf) -> Result<(), ngx::http::MergeConfigError> {
        LocConf::merge(self, prev);
        Ok(())
    }
}

impl LocConf {
    /// Merges with the enclosing level, as nginx does for `limit_req`: lines
    /// at an inner level replace the outer ones.
    pub fn merge(&mut self, prev: &LocConf) {
        if self.lines.is_empty() {
            self.lines = prev.lines.clone();
        }
        if self.status == ngx_uint_t::MAX {
            self.status = if prev.status == ngx_uint_t::MAX { DEFAULT_STATUS } else { prev.status };
        }
        if self.headers.is_none() {
            self.headers = Some(prev.headers.unwrap_or(HeadersMode::Legacy));
        }
    }

    pub fn headers(&self) -> HeadersMode {
        self.headers.unwrap_or(HeadersMode::Legacy)
    }
}

/// The directive's arguments, `args[0]` being its name.
///
/// # Safety
/// `cf` must be the configuration being parsed, as passed to a directive handler.
unsafe fn args<'a>(cf: *mut ngx_conf_t) -> &'a [ngx_str_t] {
    // SAFETY: nginx fills cf->args with the directive name and its arguments
    // (an ngx_array_t of ngx_str_t) before calling the handler.
    unsafe { (*(*cf).args).as_slice() }
}

fn text(s: &ngx_str_t) -> &str {
    s.to_str().unwrap_or("")
}

/// Logs a configuration error at the directive being parsed and fails it.
macro_rules! conf_err {
    ($cf:expr, $($arg:tt)+) => {{
        ngx_conf_log_error!(NGX_LOG_EMERG, $cf, $($arg)+);
        return NGX_CONF_ERROR;
    }};
}

/// `rl_zone NAME size=SIZE;`
pub extern "C" fn cmd_rl_zone(cf: *mut ngx_conf_t, _cmd: *mut ngx_command_t, conf: *mut c_void) -> *mut c_char {
    // SAFETY: the main configuration of this module, as registered with NGX_HTTP_MAIN_CONF_OFFSET.
    let mcf = unsafe { &mut *conf.cast::<MainConf>() };
    // SAFETY: called by nginx while parsing, cf is valid.
    let args = unsafe { args(cf) };
    let name = text(&args[1]);
    if name.is_empty() || name.contains('=') {
        conf_err!(cf, "invalid zone name \"{}\" in \"rl_zone\" directive", args[1]);
    }
    if mcf.zones.iter().any(|z| z.name == name) || mcf.redis.iter().any(|z| z.name == name) {
        conf_err!(cf, "duplicate zone \"{}\" in \"rl_zone\" directive", name);
    }
    if args[2..].iter().any(|a| text(a).starts_with("redis=")) {
        if mcf.redis.len() == MAX_REDIS_ZONES {
            conf_err!(cf, "too many Redis zones in \"rl_zone\" directive, at most {} are supported", MAX_REDIS_ZONES);
        }
        let params: Vec<&str> = args[2..].iter().map(text).collect();
        // SAFETY: cf and its cycle are valid while the configuration is parsed.
        let conf_prefix = unsafe { (*(*cf).cycle).conf_prefix.to_str().unwrap_or("") };
        match RedisZone::parse(name, &params, conf_prefix) {
            Ok(z) => mcf.redis.push(Box::new(z)),
            Err(e) => conf_err!(cf, "{} in \"rl_zone\" directive", e),
        }
        return NGX_CONF_OK;
    }
    let mut size = None;
    for arg in &args[2..] {
        let a = text(arg);
        if let Some(v) = a.strip_prefix("size=") {
            match parse_size(v) {
                Ok(n) => size = Some(n),
                Err(_) => conf_err!(cf, "invalid zone size \"{}\" in \"rl_zone\" directive", arg),
            }
        } else {
            conf_err!(cf, "invalid parameter \"{}\" in \"rl_zone\" directive", arg);
        }
    }
    let Some(size) = size else {
        conf_err!(cf, "\"rl_zone\" directive must have \"size\" or \"redis\" parameter");
    };
    let min = crate::zone::min_size();
    if size < min {
        conf_err!(
            cf,
            "zone \"{}\" is too small in \"rl_zone\" directive: size={}, it must be at least {}k",
            name,
            text(&args[2]).trim_start_matches("size="),
            min / 1024
        );
    }
    let index = mcf.zones.len();
    match Zone::add(cf, name, size, index) {
        Ok(zone) => mcf.zones.push(zone),
        Err(()) => return NGX_CONF_ERROR,
    }
    NGX_CONF_OK
}

/// `rl_limit zone=NAME rate=RATE [key=KEY] [algorithm=ALG] [burst=N] [cost=N];`
pub extern "C" fn cmd_rl_limit(cf: *mut ngx_conf_t, _cmd: *mut ngx_command_t, conf: *mut c_void) -> *mut c_char {
    // SAFETY: the location configuration of this module (NGX_HTTP_LOC_CONF_OFFSET).
    let lcf = unsafe { &mut *conf.cast::<LocConf>() };
    // SAFETY: the module's main configuration exists while parsing http{}.
    let Some(mcf) = (unsafe { Module::main_conf_mut(&*cf) }) else {
        return NGX_CONF_ERROR;
    };
    // SAFETY: called by nginx while parsing, cf is valid.
    let args = unsafe { args(cf) };

    let (mut zone, mut rate, mut key, mut alg, mut burst, mut cost) = (None, None, None, None, None, 1u64);
    for arg in &args[1..] {
        let a = text(arg);
        let Some((name, value)) = a.split_once('=') else {
            conf_err!(cf, "invalid parameter \"{}\" in \"rl_limit\" directive", arg);
        };
        match name {
            "zone" if !value.is_empty() => zone = Some(value.to_string()),
            "rate" => match parse_rate(value) {
                Ok(r) => rate = Some(r),
                Err(e) => conf_err!(cf, "invalid rate \"{}\" in \"rl_limit\" directive, {}", value, rate_hint(&e)),
            },
            "key" if !value.is_empty() => key = Some(*arg),
            "algorithm" => match value.parse::<Algorithm>() {
                Ok(v) => alg = Some(v),
                Err(_) => conf_err!(
                    cf,
                    "invalid algorithm \"{}\" in \"rl_limit\" directive, it must be \"fixed\", \"sliding\", \
                     \"sliding_log\", \"token_bucket\", \"leaky_bucket\" or \"gcra\"",
                    value
                ),
            },
            "burst" => match value.parse::<u64>() {
                Ok(n) if n > 0 => burst = Some(n),
                _ => {
                    conf_err!(cf, "invalid burst \"{}\" in \"rl_limit\" directive, it must be a positive number", value)
                }
            },
            "cost" => match value.parse::<u64>() {
                Ok(n) if n > 0 => cost = n,
                _ => {
                    conf_err!(cf, "invalid cost \"{}\" in \"rl_limit\" directive, it must be a positive number", value)
                }
            },
            _ => conf_err!(cf, "invalid parameter \"{}\" in \"rl_limit\" directive", arg),
        }
    }
    let Some(zone) = zone else {
        conf_err!(cf, "\"rl_limit\" directive must have \"zone\" parameter");
    };
    let Some(rate) = rate else {
        conf_err!(cf, "\"rl_limit\" directive must have \"rate\" parameter");
    };
    let burst = burst.unwrap_or(rate.count);
    if cost > burst {
        conf_err!(cf, "cost={} exceeds burst={} in \"rl_limit\" directive: no request could ever pass", cost, burst);
    }
    let limit = match Limit::new(alg.unwrap_or_default(), rate, burst) {
        Ok(l) => l,
        Err(e) => conf_err!(cf, "invalid limit in \"rl_limit\" directive: {}", e),
    };

    let mut key_src = key.unwrap_or(ngx_str_t { len: 0, data: ptr::null_mut() });
    if key.is_some() {
        // "key=..." -> the value after "key="
        key_src.data = unsafe { key_src.data.add(4) };
        key_src.len -= 4;
    } else {
        key_src = ngx::ngx_string!("$binary_remote_addr");
    }
    let Some(cv) = compile_complex_value(cf, &mut key_src) else {
        return NGX_CONF_ERROR;
    };

    let same_zone = lcf.lines.iter().filter(|l| unsafe { &***l }.zone_name == zone).count();
    let item = if same_zone == 0 { zone.clone() } else { format!("{}-{}", zone, same_zone + 1) };
    let line = Box::new(Line {
        backend: Backend::Shm(usize::MAX),
        zone_name: zone,
        key: cv,
        key_src: text(&key_src).to_string(),
        limit,
        cost,
        id: 0,
        item,
        origin: conf_origin(cf),
    });
    lcf.lines.push(&*line as *const Line);
    mcf.lines.push(line);
    NGX_CONF_OK
}

/// `rl_status CODE;`
pub extern "C" fn cmd_rl_status(cf: *mut ngx_conf_t, _cmd: *mut ngx_command_t, conf: *mut c_void) -> *mut c_char {
    // SAFETY: the location configuration of this module (NGX_HTTP_LOC_CONF_OFFSET).
    let lcf = unsafe { &mut *conf.cast::<LocConf>() };
    // SAFETY: called by nginx while parsing, cf is valid.
    let args = unsafe { args(cf) };
    if lcf.status != ngx_uint_t::MAX {
        conf_err!(cf, "\"rl_status\" directive is duplicate");
    }
    match text(&args[1]).parse::<ngx_uint_t>() {
        Ok(code) if (400..=599).contains(&code) => lcf.status = code,
        _ => conf_err!(cf, "invalid status \"{}\" in \"rl_status\" directive, it must be between 400 and 599", args[1]),
    }
    NGX_CONF_OK
}

/// `rl_headers off | legacy | draft | both;`
pub extern "C" fn cmd_rl_headers(cf: *mut ngx_conf_t, _cmd: *mut ngx_command_t, conf: *mut c_void) -> *mut c_char {
    // SAFETY: the location configuration of this module (NGX_HTTP_LOC_CONF_OFFSET).
    let lcf = unsafe { &mut *conf.cast::<LocConf>() };
    // SAFETY: called by nginx while parsing, cf is valid.
    let args = unsafe { args(cf) };
    if lcf.headers.is_some() {
        conf_err!(cf, "\"rl_headers\" directive is duplicate");
    }
    lcf.headers = Some(match text(&args[1]) {
        "off" => HeadersMode::Off,
        "legacy" => HeadersMode::Legacy,
        "draft" => HeadersMode::Draft,
        "both" => HeadersMode::Both,
        _ => conf_err!(
            cf,
            "invalid value \"{}\" in \"rl_headers\" directive, it must be \"off\", \"legacy\", \"draft\" or \"both\"",
            args[1]
        ),
    });
    NGX_CONF_OK
}

/// The second half of an "invalid rate" message.
fn rate_hint(e: &rl_core::parse::ParseError) -> &'static str {
    use rl_core::parse::ParseErrorKind;
    match e.kind {
        ParseErrorKind::NotPositive => "it must be positive",
        ParseErrorKind::TooLarge => "it is too large",
        ParseErrorKind::Invalid => "it must be a number of requests per second, minute, hour or day: \"10r/s\", \"100r/m\", \"1000r/h\", \"10000r/d\"",
    }
}

fn compile_complex_value(cf: *mut ngx_conf_t, value: &mut ngx_str_t) -> Option<*mut ngx_http_complex_value_t> {
    // SAFETY: cf->pool is the configuration pool, valid while parsing.
    let pool = unsafe { Pool::from_ngx_pool((*cf).pool) };
    let cv = pool.calloc_type::<ngx_http_complex_value_t>();
    if cv.is_null() {
        return None;
    }
    // SAFETY: an all-zero ngx_http_compile_complex_value_t is its documented initial state.
    let mut ccv: ngx_http_compile_complex_value_t = unsafe { mem::zeroed() };
    ccv.cf = cf;
    ccv.value = value;
    ccv.complex_value = cv;
    // SAFETY: ccv is fully initialised; nginx logs its own message on failure.
    if unsafe { ngx_http_compile_complex_value(&mut ccv) } != 0 {
        return None;
    }
    Some(cv)
}

/// `file:line` of the directive being parsed.
fn conf_origin(cf: *mut ngx_conf_t) -> String {
    // SAFETY: conf_file is set while a configuration file is being parsed.
    unsafe {
        let Some(file) = (*cf).conf_file.as_ref() else {
            return String::new();
        };
        format!("{}:{}", file.file.name, file.line)
    }
}

/// The identity of a line's states: the same on every nginx of a fleet
/// running the same line (SipHash with fixed keys, not std's hasher, whose
/// algorithm may change between Rust releases).
fn line_identity(line: &Line) -> u64 {
    let rate = line.limit.rate();
    let canon = format!(
        "{}|{}|{}|{}|{}|{}",
        line.zone_name,
        line.key_src,
        line.limit.algorithm(),
        rate.count,
        rate.period_us,
        line.limit.burst()
    );
    siphasher::sip::SipHasher13::new_with_keys(0, 0).hash(canon.as_bytes())
}

/// Resolves zone names, gives each line its identity and sorts every
/// location's lines by zone (the order in which zone locks are taken).
pub fn finish(cf: *mut ngx_conf_t, mcf: &mut MainConf) -> Result<(), ()> {
    let mut seen: HashMap<u64, u64> = HashMap::new();
    for line in mcf.lines.iter_mut() {
        let shm = mcf.zones.iter().position(|z| z.name == line.zone_name);
        let redis = mcf.redis.iter().position(|z| z.name == line.zone_name);
        line.backend = match (shm, redis) {
            (Some(i), _) => Backend::Shm(i),
            (None, Some(i)) => Backend::Redis(i),
            (None, None) => {
                ngx_conf_log_error!(
                    NGX_LOG_EMERG,
                    cf,
                    "unknown zone \"{}\" in \"rl_limit\" directive in {}",
                    line.zone_name,
                    line.origin
                );
                return Err(());
            }
        };
        let base = line_identity(line);
        let dup = seen.entry(base).or_insert(0);
        line.id = base ^ dup.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        *dup += 1;
        match line.backend {
            Backend::Shm(i) => mcf.zones[i].note_line(&line.limit),
            Backend::Redis(_) if !rl_core::redis::exact(&line.limit) => {
                ngx_conf_log_error!(
                    NGX_LOG_EMERG,
                    cf,
                    "rate {} with burst {} is out of the range a Redis zone computes exactly in \"rl_limit\" directive in {}",
                    line.limit.rate(),
                    line.limit.burst(),
                    line.origin
                );
                return Err(());
            }
            Backend::Redis(_) => {}
        }
    }
    for &loc in &mcf.locs {
        // SAFETY: registered in merge_loc_conf; location confs live as long as the cycle.
        let loc = unsafe { &mut *loc };
        // SAFETY: lines point into mcf.lines, alive as long as the cycle.
        loc.lines.sort_by_key(|l| unsafe { (**l).backend });
        let mut zones: Vec<Backend> = loc.lines.iter().map(|l| unsafe { (**l).backend }).collect();
        loc.has_redis = zones.iter().any(|b| matches!(b, Backend::Redis(_)));
        zones.dedup();
        if zones.len() > crate::handler::MAX_ZONES_PER_LOCATION {
            ngx_conf_log_error!(
                NGX_LOG_EMERG,
                cf,
                "too many zones in one location: {}, at most {} are supported",
                zones.len(),
                crate::handler::MAX_ZONES_PER_LOCATION
            );
            return Err(());
        }
    }
    for zone in mcf.zones.iter_mut() {
        if let Err(msg) = zone.check_fits() {
            ngx_conf_log_error!(NGX_LOG_EMERG, cf, "{}", msg);
            return Err(());
        }
    }
    Ok(())
}
