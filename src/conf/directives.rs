//! The directive handlers: `rl_zone`, `rl_limit`, `rl_status`, `rl_headers`.
//! Each logs its own error at the directive (so that `nginx -t` says what is
//! wrong and where) before it returns `NGX_CONF_ERROR`.

use core::ffi::{c_char, c_void};
use core::mem;

use ngx::core::{Pool, NGX_CONF_ERROR, NGX_CONF_OK};
use ngx::ffi::{
    ngx_command_t, ngx_conf_t, ngx_http_compile_complex_value, ngx_http_compile_complex_value_t,
    ngx_http_complex_value_t, ngx_http_get_variable_index, ngx_str_t, ngx_uint_t, NGX_LOG_EMERG,
};
use ngx::http::HttpModuleMainConf;
use ngx::ngx_conf_log_error;
use rl_core::limit::{Algorithm, Limit};
use rl_core::parse::{parse_rate, parse_size};

use super::{LocConf, MainConf, MAX_REDIS_ZONES};
use crate::line::{Backend, HeadersMode, Line, LineId, VarValue};
use crate::shm::Zone;
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

/// `rl_zone NAME size=SIZE;` or `rl_zone NAME redis=URL ...;`
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
        match super::redis::parse(name, &params, conf_prefix) {
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
    let min = crate::shm::min_size();
    if size < min {
        conf_err!(
            cf,
            "zone \"{}\" is too small in \"rl_zone\" directive: size={}, it must be at least {}k",
            name,
            text(&args[2]).trim_start_matches("size="),
            min / 1024
        );
    }
    match Zone::add(cf, name, size) {
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

    let mut key_src = match key {
        // SAFETY: the argument starts with "key=": the value is the rest of it, in the same buffer.
        Some(k) => ngx_str_t { len: k.len - 4, data: unsafe { k.data.add(4) } },
        None => ngx::ngx_string!("$binary_remote_addr"),
    };
    let Some(cv) = compile_complex_value(cf, &mut key_src) else {
        return NGX_CONF_ERROR;
    };
    let key_var = match one_variable(text(&key_src)) {
        Some(mut name) if VarValue::matches() => {
            // SAFETY: cf is the configuration being parsed; nginx copies the name. The complex value
            // compiled above registered the same name: this finds its index.
            let index = unsafe { ngx_http_get_variable_index(cf, &mut name) };
            match ngx_uint_t::try_from(index) {
                Ok(i) => Some(i),
                Err(_) => return NGX_CONF_ERROR,
            }
        }
        _ => None,
    };

    let same_zone = lcf.lines.iter().filter_map(|&id| mcf.line(id)).filter(|l| l.zone_name == zone).count();
    let item = if same_zone == 0 { zone.clone() } else { format!("{}-{}", zone, same_zone + 1) };
    let Ok(id) = u32::try_from(mcf.lines.len()) else {
        conf_err!(cf, "too many \"rl_limit\" directives");
    };
    mcf.lines.push(Line {
        backend: Backend::Shm(usize::MAX),
        zone_name: zone,
        key: cv,
        key_var,
        key_src: text(&key_src).to_string(),
        limit,
        cost,
        id: 0,
        item,
        burst_text: limit.burst().to_string(),
        origin: conf_origin(cf),
    });
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
