//! The directive handlers: `rl_zone`, `rl_limit`, `rl_status`, `rl_headers`,
//! `rl_log_level`.
//! Each logs its own error at the directive (so that `nginx -t` says what is
//! wrong and where) before it returns `NGX_CONF_ERROR`.

use core::ffi::{c_char, c_void};
use core::sync::atomic::AtomicPtr;
use core::{mem, ptr};

use ngx::core::{Pool, NGX_CONF_ERROR, NGX_CONF_OK};
use ngx::ffi::{
    ngx_command_t, ngx_conf_t, ngx_http_compile_complex_value, ngx_http_compile_complex_value_t,
    ngx_http_complex_value_t, ngx_http_get_variable_index, ngx_str_t, ngx_uint_t, NGX_LOG_EMERG, NGX_LOG_ERR,
    NGX_LOG_INFO, NGX_LOG_NOTICE, NGX_LOG_WARN,
};
use ngx::http::HttpModuleMainConf;
use ngx::ngx_conf_log_error;
use rl_core::habits;
use rl_core::limit::{Algorithm, Limit};
use rl_core::parse::{parse_number, parse_rate, parse_size, parse_u64, ParseError, ParseErrorKind, Rate};
use rl_core::url::redact;

use super::{LocConf, MainConf, Quote, MAX_REDIS_ZONES};
use crate::line::{Backend, HeadersMode, KeySource, Line, LineId, Stage, VarParam, VarValue, Varying};
use crate::shm::{Zone, MAX_ZONES_PER_LOCATION};
use crate::Module;

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

/// A parameter a directive refuses: the message without the directive,
/// and for an unknown parameter that is a `limit_req` habit, its nginx-rl
/// form ([`rl_core::habits`]).
struct ParamError {
    msg: String,
    hint: Option<String>,
}

impl ParamError {
    /// The whole message, at `directive`.
    fn at(&self, directive: &str) -> String {
        match &self.hint {
            Some(hint) => format!("{} in \"{directive}\" directive, {hint}", self.msg),
            None => format!("{} in \"{directive}\" directive", self.msg),
        }
    }
}

/// The `name=value` parameters of a directive, each one of `known` and
/// given at most once, in order. An unknown parameter is quoted with any
/// password hidden, with what `hint` says of it.
fn params<'a>(
    args: &'a [ngx_str_t],
    known: &[&'static str],
    hint: impl Fn(&str) -> Option<String>,
) -> Result<Vec<(&'static str, &'a str)>, ParamError> {
    let mut given: Vec<(&'static str, &'a str)> = Vec::with_capacity(args.len());
    for arg in args {
        let param = arg
            .to_str()
            .ok()
            .and_then(|a| a.split_once('='))
            .and_then(|(name, value)| known.iter().find(|k| **k == name).map(|k| (*k, value)));
        let Some((name, value)) = param else {
            let msg = format!("invalid parameter \"{}\"", Quote(&redact(&arg.to_string())));
            return Err(ParamError { msg, hint: hint(text(arg)) });
        };
        if given.iter().any(|(n, _)| *n == name) {
            return Err(ParamError { msg: format!("duplicate \"{name}\" parameter"), hint: None });
        }
        given.push((name, value));
    }
    Ok(given)
}

/// The value of parameter `name` among `given`.
fn param<'a>(given: &[(&'static str, &'a str)], name: &str) -> Option<&'a str> {
    given.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
}

/// `rl_zone NAME size=SIZE;` or `rl_zone NAME redis=URL ...;`
pub extern "C" fn cmd_rl_zone(cf: *mut ngx_conf_t, _cmd: *mut ngx_command_t, conf: *mut c_void) -> *mut c_char {
    // SAFETY: the main configuration of this module, as registered with NGX_HTTP_MAIN_CONF_OFFSET.
    let mcf = unsafe { &mut *conf.cast::<MainConf>() };
    // SAFETY: called by nginx while parsing, cf is valid.
    let args = unsafe { args(cf) };
    // (NGX_CONF_1MORE: nginx has checked there is a name)
    let (Some(name_arg), Some(rest)) = (args.get(1), args.get(2..)) else {
        return NGX_CONF_ERROR;
    };
    let name = text(name_arg);
    if name.is_empty() || name.contains('=') {
        let hint = habits::zone_name(name).map(|h| format!(", {h}")).unwrap_or_default();
        conf_err!(cf, "invalid zone name \"{}\" in \"rl_zone\" directive{}", Quote(&name_arg.to_string()), hint);
    }
    if mcf.zones.iter().any(|z| z.name == name) || mcf.redis.iter().any(|z| z.name == name) {
        conf_err!(cf, "duplicate zone \"{}\" in \"rl_zone\" directive", Quote(name));
    }
    let known: Vec<&'static str> = ["size", "redis"].into_iter().chain(super::redis::PARAMS).collect();
    // `rl_zone $binary_remote_addr zone=api:10m rate=10r/s;`: limit_req_zone's line.
    let key_hint = habits::zone_key(name);
    let hint = |arg: &str| match (habits::zone_param(arg), &key_hint) {
        (Some(h), Some(k)) => Some(format!("{h} ({k})")),
        (h, k) => h.or_else(|| k.clone()),
    };
    let given = match params(rest, &known, hint) {
        Ok(given) => given,
        Err(e) => conf_err!(cf, "{}", e.at("rl_zone")),
    };
    if let Some(url) = param(&given, "redis") {
        if param(&given, "size").is_some() {
            conf_err!(cf, "\"size\" and \"redis\" parameters cannot be used together in \"rl_zone\" directive");
        }
        if mcf.redis.len() == MAX_REDIS_ZONES {
            conf_err!(cf, "too many Redis zones in \"rl_zone\" directive, at most {} are supported", MAX_REDIS_ZONES);
        }
        // SAFETY: cf and its cycle are valid while the configuration is parsed.
        let conf_prefix = unsafe { (*(*cf).cycle).conf_prefix.to_str().unwrap_or("") };
        match super::redis::parse(name, url, |p| param(&given, p), conf_prefix) {
            Ok(z) => mcf.redis.push(Box::new(z)),
            Err(e) => conf_err!(cf, "{} in \"rl_zone\" directive", e),
        }
        return NGX_CONF_OK;
    }
    let Some(value) = param(&given, "size") else {
        conf_err!(cf, "\"rl_zone\" directive must have \"size\" or \"redis\" parameter");
    };
    if let Some((other, _)) = given.iter().find(|(n, _)| *n != "size") {
        conf_err!(cf, "\"size\" and \"{}\" parameters cannot be used together in \"rl_zone\" directive", other);
    }
    let size = match parse_size(value) {
        Ok(n) => n,
        Err(_) => conf_err!(cf, "invalid zone size \"size={}\" in \"rl_zone\" directive", Quote(value)),
    };
    let min = crate::shm::min_size();
    if size < min {
        conf_err!(
            cf,
            "zone \"{}\" is too small in \"rl_zone\" directive: size={}, it must be at least {}k",
            Quote(name),
            Quote(value),
            min / 1024
        );
    }
    if size > crate::shm::MAX_SIZE {
        conf_err!(
            cf,
            "zone \"{}\" is too large in \"rl_zone\" directive: size={}, it must be at most {}g",
            Quote(name),
            Quote(value),
            crate::shm::MAX_SIZE >> 30
        );
    }
    if let Some(memory) = crate::shm::memory_and_swap().filter(|m| size as u64 > *m) {
        conf_err!(
            cf,
            "zone \"{}\" is too large in \"rl_zone\" directive: size={}, more than the memory of this machine \
             (RAM and swap: {}m)",
            Quote(name),
            Quote(value),
            memory >> 20
        );
    }
    match Zone::add(cf, name, size) {
        Ok(mut zone) => {
            zone.origin = conf_origin(cf);
            mcf.zones.push(zone);
        }
        Err(()) => return NGX_CONF_ERROR,
    }
    NGX_CONF_OK
}

/// `rl_limit zone=NAME rate=RATE [key=KEY] [algorithm=ALG] [burst=N] [cost=N] [name=NAME] [queue=N]
/// [dry_run] [after_auth];`
pub extern "C" fn cmd_rl_limit(cf: *mut ngx_conf_t, _cmd: *mut ngx_command_t, conf: *mut c_void) -> *mut c_char {
    // SAFETY: the location configuration of this module (NGX_HTTP_LOC_CONF_OFFSET).
    let lcf = unsafe { &mut *conf.cast::<LocConf>() };
    // SAFETY: the module's main configuration exists while parsing http{}.
    let Some(mcf) = (unsafe { Module::main_conf_mut(&*cf) }) else {
        return NGX_CONF_ERROR;
    };
    // SAFETY: called by nginx while parsing, cf is valid.
    let args = unsafe { args(cf) };
    // `dry_run` and `after_auth` are flags, as in `limit_req ... nodelay`; the rest are `name=value`.
    let all = args.get(1..).unwrap_or(&[]);
    let rest: Vec<ngx_str_t> = all.iter().filter(|a| !matches!(text(a), "dry_run" | "after_auth")).copied().collect();
    let mut flags = [false; 2];
    for (flag, name) in flags.iter_mut().zip(["dry_run", "after_auth"]) {
        match all.iter().filter(|a| text(a) == name).count() {
            0 => {}
            1 => *flag = true,
            _ => conf_err!(cf, "duplicate \"{}\" parameter in \"rl_limit\" directive", name),
        }
    }
    let [dry_run, after_auth] = flags;
    let burst_arg = rest.iter().find_map(|a| text(a).strip_prefix("burst="));
    let known = ["zone", "rate", "key", "algorithm", "burst", "cost", "name", "queue", "charge"];
    let given = match params(&rest, &known, |arg| habits::limit_param(arg, burst_arg)) {
        Ok(given) => given,
        Err(e) => conf_err!(cf, "{}", e.at("rl_limit")),
    };
    let get = |name| param(&given, name);
    let zone = match get("zone") {
        Some("") => conf_err!(cf, "invalid parameter \"zone=\" in \"rl_limit\" directive"),
        Some(z) => z.to_string(),
        None => conf_err!(cf, "\"rl_limit\" directive must have \"zone\" parameter"),
    };
    let alg = match get("algorithm").map(str::parse::<Algorithm>) {
        None => Algorithm::default(),
        Some(Ok(a)) => a,
        Some(Err(_)) => conf_err!(
            cf,
            "invalid algorithm \"{}\" in \"rl_limit\" directive, it must be \"fixed\", \"sliding\", \
             \"sliding_log\", \"token_bucket\", \"leaky_bucket\" or \"gcra\"",
            Quote(get("algorithm").unwrap_or_default())
        ),
    };
    // rate=, burst= and cost= may hold variables: those are compiled, and
    // the line holds a placeholder for them until a request comes.
    let Ok(rate_var) = var_param(cf, get("rate")) else {
        return NGX_CONF_ERROR;
    };
    let Ok(burst_var) = var_param(cf, get("burst")) else {
        return NGX_CONF_ERROR;
    };
    let Ok(cost_var) = var_param(cf, get("cost")) else {
        return NGX_CONF_ERROR;
    };
    let rate = match get("rate") {
        Some(_) if rate_var.is_some() => Rate { count: 1, period_us: 1_000_000 },
        Some(r) => match parse_rate(r) {
            Ok(r) => r,
            Err(e) => {
                conf_err!(cf, "invalid rate \"{}\" in \"rl_limit\" directive, {}", Quote(&e.value), rate_hint(&e))
            }
        },
        None => conf_err!(cf, "\"rl_limit\" directive must have \"rate\" parameter"),
    };
    let burst = match get("burst") {
        Some(_) if burst_var.is_some() => 1,
        None => rate.count,
        Some(b) => match parse_u64(b) {
            Ok(n) => n,
            Err(e) => {
                conf_err!(cf, "invalid burst \"{}\" in \"rl_limit\" directive, {}", Quote(&e.value), number_hint(&e))
            }
        },
    };
    let cost = match get("cost") {
        None => 1,
        Some(_) if cost_var.is_some() => 0,
        Some(c) => match parse_u64(c) {
            Ok(n) => n,
            Err(e) => {
                conf_err!(cf, "invalid cost \"{}\" in \"rl_limit\" directive, {}", Quote(&e.value), number_hint(&e))
            }
        },
    };
    let charge_after = match get("charge") {
        None | Some("before") => false,
        Some("after") => true,
        Some(v) => conf_err!(
            cf,
            "invalid charge \"{}\" in \"rl_limit\" directive, it must be \"before\" or \"after\"",
            Quote(v)
        ),
    };
    let burst_varies = burst_var.is_some() || (get("burst").is_none() && rate_var.is_some());
    if alg == Algorithm::SlidingLog && burst_varies {
        conf_err!(
            cf,
            "a burst from variables is not supported by algorithm \"sliding_log\", which lays out one timestamp \
             per unit of burst when the configuration is read, in \"rl_limit\" directive"
        );
    }
    if alg == Algorithm::SlidingLog && charge_after {
        conf_err!(
            cf,
            "\"charge=after\" is not supported by algorithm \"sliding_log\", which cannot record an overdraft, \
             in \"rl_limit\" directive"
        );
    }
    if rate_var.is_none() && burst_var.is_none() && cost_var.is_none() && cost > burst {
        conf_err!(cf, "cost={} exceeds burst={} in \"rl_limit\" directive: no request could ever pass", cost, burst);
    }
    let limit = match Limit::new(alg, rate, burst) {
        Ok(l) => l,
        Err(e) => conf_err!(cf, "invalid limit in \"rl_limit\" directive: {}", e),
    };
    let queue = match get("queue").map(parse_number) {
        None => 0,
        Some(Ok(n)) => n,
        Some(Err(e)) => {
            let hint = match e.kind {
                ParseErrorKind::TooLarge => "it is too large",
                _ => "it must be a number",
            };
            conf_err!(cf, "invalid queue \"{}\" in \"rl_limit\" directive, {}", Quote(&e.value), hint)
        }
    };
    if charge_after && queue > 0 {
        conf_err!(
            cf,
            "\"charge=after\" cannot be used with \"queue\" in \"rl_limit\" directive: delaying needs the cost up front"
        );
    }
    let limit = match limit.with_queue(queue) {
        Ok(l) => l,
        Err(e) => conf_err!(cf, "invalid limit in \"rl_limit\" directive: {}", e),
    };
    let rate_src = match &rate_var {
        Some(p) => p.src.clone(),
        None => rate.to_string(),
    };
    let burst_src = match (&burst_var, get("burst")) {
        (Some(p), _) => p.src.clone(),
        (None, None) if rate_var.is_some() => String::new(),
        _ => burst.to_string(),
    };
    let vars = Varying::new(rate_var, burst_var, cost_var);
    let limit = match &vars {
        Some(v) if v.limit_varies() => limit.varying(),
        _ => limit,
    };
    let name = match get("name") {
        None => None,
        Some(n) if Line::valid_name(n) => Some(n.to_string()),
        Some(n) => conf_err!(
            cf,
            "invalid name \"{}\" in \"rl_limit\" directive, it must be letters, digits, \"_\" and \"-\"",
            Quote(n)
        ),
    };
    // The lines of one level are all a location has (inner levels replace
    // outer ones), so its zones are counted here, where the message can
    // point at the line that goes over (zone names are unique across kinds).
    let mut zones: Vec<&str> = lcf.lines.iter().filter_map(|&id| mcf.line(id)).map(|l| l.zone_name.as_str()).collect();
    zones.push(&zone);
    zones.sort_unstable();
    zones.dedup();
    if zones.len() > MAX_ZONES_PER_LOCATION {
        conf_err!(
            cf,
            "too many zones in one location in \"rl_limit\" directive, at most {} are supported",
            MAX_ZONES_PER_LOCATION
        );
    }

    let mut key_src = match get("key") {
        Some("") => conf_err!(cf, "invalid parameter \"key=\" in \"rl_limit\" directive"),
        // The value is part of the argument, which lives in the configuration pool as long as the cycle.
        Some(k) => ngx_str_t { len: k.len(), data: k.as_ptr().cast_mut() },
        None => ngx::ngx_string!("$binary_remote_addr"),
    };
    let Some(cv) = compile_complex_value(cf, &mut key_src) else {
        return NGX_CONF_ERROR;
    };
    let key_source = match one_variable(text(&key_src)) {
        // (variable names are not case-sensitive)
        Some(name) if text(&name).eq_ignore_ascii_case("binary_remote_addr") => KeySource::ClientAddr,
        Some(mut name) if VarValue::matches() => {
            // SAFETY: cf is the configuration being parsed; nginx copies the name. The complex value
            // compiled above registered the same name: this finds its index.
            let index = unsafe { ngx_http_get_variable_index(cf, &mut name) };
            match ngx_uint_t::try_from(index) {
                Ok(i) => KeySource::Var(i),
                Err(_) => return NGX_CONF_ERROR,
            }
        }
        _ => KeySource::Complex,
    };

    let same_zone = lcf.lines.iter().filter_map(|&id| mcf.line(id)).filter(|l| l.zone_name == zone).count();
    let item = match &name {
        Some(n) => n.clone(),
        None if same_zone == 0 => zone.clone(),
        None => format!("{}-{}", zone, same_zone + 1),
    };
    let Ok(id) = u32::try_from(mcf.lines.len()) else {
        conf_err!(cf, "too many \"rl_limit\" directives");
    };
    let line = Line {
        backend: Backend::Shm(usize::MAX),
        zone_name: zone,
        key: cv,
        key_source,
        key_src: text(&key_src).to_string(),
        limit,
        cost,
        id: 0,
        item,
        burst_text: if burst_varies { String::new() } else { limit.burst().to_string() },
        origin: conf_origin(cf),
        name,
        dry_run,
        queue,
        deepest_queue: queue,
        rate_src,
        burst_src,
        vars,
        charge_after,
        stage: if after_auth { Stage::AfterAuth } else { Stage::BeforeAuth },
        counters: AtomicPtr::new(ptr::null_mut()),
    };
    // One budget per identity: the same line twice in one block would be
    // charged twice for one request.
    let identity = line.identity();
    if lcf.lines.iter().filter_map(|&id| mcf.line(id)).any(|l| l.identity() == identity) {
        conf_err!(cf, "\"rl_limit\" directive is duplicate");
    }
    mcf.lines.push(line);
    lcf.lines.push(LineId(id));
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
    // (NGX_CONF_TAKE1: nginx has checked there is one argument)
    let Some(arg) = args.get(1) else {
        return NGX_CONF_ERROR;
    };
    match parse_number(text(arg)).ok().and_then(|n| ngx_uint_t::try_from(n).ok()) {
        Some(code) if arg.to_str().is_ok() && (400..=599).contains(&code) => lcf.status = code,
        _ => conf_err!(
            cf,
            "invalid status \"{}\" in \"rl_status\" directive, it must be between 400 and 599",
            Quote(&arg.to_string())
        ),
    }
    NGX_CONF_OK
}

/// `rl_headers off | legacy | draft | both | draft-6 ...;`: `off` alone, or
/// any of the others, whose fields are all sent (`legacy draft` is `both`).
pub extern "C" fn cmd_rl_headers(cf: *mut ngx_conf_t, _cmd: *mut ngx_command_t, conf: *mut c_void) -> *mut c_char {
    // SAFETY: the location configuration of this module (NGX_HTTP_LOC_CONF_OFFSET).
    let lcf = unsafe { &mut *conf.cast::<LocConf>() };
    // SAFETY: called by nginx while parsing, cf is valid.
    let args = unsafe { args(cf) };
    if lcf.headers.is_some() {
        conf_err!(cf, "\"rl_headers\" directive is duplicate");
    }
    // (NGX_CONF_1MORE: nginx has checked there is at least one argument)
    let values = args.get(1..).unwrap_or_default();
    let mut mode = HeadersMode::OFF;
    for arg in values {
        let one = match text(arg) {
            "off" if values.len() == 1 => HeadersMode::OFF,
            "off" => conf_err!(cf, "invalid value \"off\" in \"rl_headers\" directive, it must be the only value"),
            "legacy" => HeadersMode::LEGACY,
            "draft" => HeadersMode::DRAFT,
            "both" => HeadersMode::BOTH,
            "draft-6" => HeadersMode::DRAFT6,
            _ => conf_err!(
                cf,
                "invalid value \"{}\" in \"rl_headers\" directive, it must be \"off\", \"legacy\", \"draft\", \"both\" or \"draft-6\"",
                Quote(&arg.to_string())
            ),
        };
        // As nginx's bitmask directives (ssl_protocols, proxy_next_upstream): a warning.
        if one != HeadersMode::OFF && mode.has(one) {
            ngx_conf_log_error!(
                NGX_LOG_WARN,
                cf,
                "duplicate value \"{}\" in \"rl_headers\" directive",
                Quote(&arg.to_string())
            );
        }
        mode = mode.with(one);
    }
    lcf.headers = Some(mode);
    NGX_CONF_OK
}

/// `rl_dry_run on | off;`
pub extern "C" fn cmd_rl_dry_run(cf: *mut ngx_conf_t, _cmd: *mut ngx_command_t, conf: *mut c_void) -> *mut c_char {
    // SAFETY: the location configuration of this module (NGX_HTTP_LOC_CONF_OFFSET).
    let lcf = unsafe { &mut *conf.cast::<LocConf>() };
    // SAFETY: called by nginx while parsing, cf is valid.
    let args = unsafe { args(cf) };
    if lcf.dry_run.is_some() {
        conf_err!(cf, "\"rl_dry_run\" directive is duplicate");
    }
    // (NGX_CONF_FLAG: nginx has checked there is one argument)
    let Some(arg) = args.get(1) else {
        return NGX_CONF_ERROR;
    };
    // As ngx_conf_set_flag_slot: case-insensitive, and its message.
    lcf.dry_run = Some(match text(arg) {
        v if v.eq_ignore_ascii_case("on") => true,
        v if v.eq_ignore_ascii_case("off") => false,
        _ => conf_err!(
            cf,
            "invalid value \"{}\" in \"rl_dry_run\" directive, it must be \"on\" or \"off\"",
            Quote(&arg.to_string())
        ),
    });
    NGX_CONF_OK
}

/// `rl_log_level info | notice | warn | error;`
pub extern "C" fn cmd_rl_log_level(cf: *mut ngx_conf_t, _cmd: *mut ngx_command_t, conf: *mut c_void) -> *mut c_char {
    // SAFETY: the location configuration of this module (NGX_HTTP_LOC_CONF_OFFSET).
    let lcf = unsafe { &mut *conf.cast::<LocConf>() };
    // SAFETY: called by nginx while parsing, cf is valid.
    let args = unsafe { args(cf) };
    if lcf.log_level != ngx_uint_t::MAX {
        conf_err!(cf, "\"rl_log_level\" directive is duplicate");
    }
    // (NGX_CONF_TAKE1: nginx has checked there is one argument)
    let Some(arg) = args.get(1) else {
        return NGX_CONF_ERROR;
    };
    lcf.log_level = match text(arg) {
        "info" => NGX_LOG_INFO,
        "notice" => NGX_LOG_NOTICE,
        "warn" => NGX_LOG_WARN,
        "error" => NGX_LOG_ERR,
        _ => conf_err!(
            cf,
            "invalid value \"{}\" in \"rl_log_level\" directive, it must be \"info\", \"notice\", \"warn\" or \"error\"",
            Quote(&arg.to_string())
        ),
    } as ngx_uint_t;
    NGX_CONF_OK
}

/// The second half of an "invalid rate" message.
fn rate_hint(e: &ParseError) -> &'static str {
    match e.kind {
        ParseErrorKind::NotPositive => "it must be positive",
        ParseErrorKind::TooLarge => "it is too large",
        ParseErrorKind::Invalid => "it must be a number of requests per second, minute, hour or day: \"10r/s\", \"100r/m\", \"1000r/h\", \"10000r/d\"",
    }
}

/// The second half of an "invalid burst" or "invalid cost" message.
fn number_hint(e: &ParseError) -> &'static str {
    match e.kind {
        ParseErrorKind::TooLarge => "it is too large",
        ParseErrorKind::NotPositive | ParseErrorKind::Invalid => "it must be a positive number",
    }
}

/// A parameter that holds variables, compiled; `None` for a static one (or
/// one not given). `Err`: logged by nginx.
fn var_param(cf: *mut ngx_conf_t, value: Option<&str>) -> Result<Option<VarParam>, ()> {
    let Some(v) = value.filter(|v| v.contains('$')) else {
        return Ok(None);
    };
    // The value is part of the argument, which lives in the configuration pool as long as the cycle.
    let mut src = ngx_str_t { len: v.len(), data: v.as_ptr().cast_mut() };
    let cv = compile_complex_value(cf, &mut src).ok_or(())?;
    let var = match one_variable(v) {
        Some(mut name) if VarValue::matches() => {
            // SAFETY: cf is the configuration being parsed; nginx copies the name. The complex
            // value compiled above registered the same name: this finds its index.
            let index = unsafe { ngx_http_get_variable_index(cf, &mut name) };
            Some(ngx_uint_t::try_from(index).map_err(|_| ())?)
        }
        _ => None,
    };
    Ok(Some(VarParam { cv, var, src: v.to_string() }))
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

/// The variable's name when `key` is one variable and nothing else (`$name`
/// or `${name}`), as nginx's script compiler reads names: letters, digits
/// and `_`, not starting with a digit (`$1` is a regex capture).
fn one_variable(key: &str) -> Option<ngx_str_t> {
    let name = key.strip_prefix('$')?;
    let name = match name.strip_prefix('{') {
        Some(braced) => braced.strip_suffix('}')?,
        None => name,
    };
    let first = name.bytes().next()?;
    if first.is_ascii_digit() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        return None;
    }
    Some(ngx_str_t { len: name.len(), data: name.as_ptr() as *mut u8 })
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
