//! The directive handlers, each filling the configuration ([`crate::conf`])
//! from its arguments: `rl_zone` ([`zone`], a Redis zone's parameters in
//! [`redis`], a Memcached zone's in [`memcached`]), `rl_limit` ([`limit`], a shell over
//! [`rl_core::spec::LineSpec`]), and the four that set one value of a
//! location, `rl_status`, `rl_headers`, `rl_dry_run` and `rl_log_level`
//! ([`values`], one handler over a table).
//!
//! Each handler's work returns a [`ConfError`], which
//! [`conf::at_directive`] logs at the directive (so that `nginx -t` says
//! what is wrong and where) before nginx is told `NGX_CONF_ERROR`.
//!
//! Imports run one way: `directives` → `conf`, never back.

mod limit;
mod memcached;
mod redis;
mod values;
mod zone;

use core::mem;

use ngx::core::Pool;
use ngx::ffi::{
    ngx_conf_t, ngx_http_compile_complex_value, ngx_http_compile_complex_value_t, ngx_http_complex_value_t,
    ngx_http_get_variable_index, ngx_str_t, ngx_uint_t,
};

pub use self::limit::{cmd_rl_conn, cmd_rl_limit};
// `rl_status`, `rl_headers`, `rl_dry_run` and `rl_log_level`: one handler,
// which finds the directive in its table by name.
pub use self::values::{
    cmd_value as cmd_rl_status, cmd_value as cmd_rl_headers, cmd_value as cmd_rl_dry_run, cmd_value as cmd_rl_log_level,
};
pub use self::zone::cmd_rl_zone;
use crate::conf::ConfError;

/// The directive's arguments, `args[0]` being its name.
///
/// # Safety
/// `cf` must be the configuration being parsed, as passed to a directive handler.
unsafe fn args<'a>(cf: *mut ngx_conf_t) -> &'a [ngx_str_t] {
    // SAFETY: nginx fills cf->args with the directive name and its arguments
    // (an ngx_array_t of ngx_str_t) before calling the handler.
    unsafe { (*(*cf).args).as_slice() }
}

/// Arguments as bytes, as [`rl_core::spec`] reads them (they live in the
/// configuration pool as long as the cycle).
fn bytes(args: &[ngx_str_t]) -> Vec<&[u8]> {
    args.iter().map(ngx_str_t::as_bytes).collect()
}

/// An argument as text: one that is not UTF-8 reads as empty, which no
/// value is.
fn text(s: &ngx_str_t) -> &str {
    s.to_str().unwrap_or("")
}

/// The refusal for a directive given the wrong number of arguments, in
/// nginx's words: nginx checks the number before it calls a handler, so
/// that this is only said should a handler be registered wrong.
fn arguments(directive: &str) -> ConfError {
    ConfError::refused(format_args!("invalid number of arguments in \"{directive}\" directive"))
}

/// A value with variables compiled from the configuration pool; nginx
/// logs why it cannot be.
fn compile_complex_value(cf: *mut ngx_conf_t, value: &str) -> Result<*mut ngx_http_complex_value_t, ConfError> {
    // The value is part of an argument, which lives in the configuration pool as long as the cycle.
    let mut value = ngx_str_t { len: value.len(), data: value.as_ptr().cast_mut() };
    // SAFETY: cf->pool is the configuration pool, valid while parsing.
    let pool = unsafe { Pool::from_ngx_pool((*cf).pool) };
    let cv = pool.calloc_type::<ngx_http_complex_value_t>();
    if cv.is_null() {
        return Err(ConfError::Logged);
    }
    // SAFETY: an all-zero ngx_http_compile_complex_value_t is its documented initial state.
    let mut ccv: ngx_http_compile_complex_value_t = unsafe { mem::zeroed() };
    ccv.cf = cf;
    ccv.value = &mut value;
    ccv.complex_value = cv;
    // SAFETY: ccv is fully initialised; nginx logs its own message on failure.
    if unsafe { ngx_http_compile_complex_value(&mut ccv) } != 0 {
        return Err(ConfError::Logged);
    }
    Ok(cv)
}

/// The index of variable `name`, which a complex value compiled before
/// registered: read by index, as the complex value `"$name"` would.
fn variable_index(cf: *mut ngx_conf_t, name: &str) -> Result<ngx_uint_t, ConfError> {
    let mut name = ngx_str_t { len: name.len(), data: name.as_ptr().cast_mut() };
    // SAFETY: cf is the configuration being parsed; nginx copies the name.
    let index = unsafe { ngx_http_get_variable_index(cf, &mut name) };
    // (NGX_ERROR: nginx has logged why, an allocation)
    ngx_uint_t::try_from(index).map_err(|_| ConfError::Logged)
}

/// `file:line` of the directive being parsed.
fn origin(cf: *mut ngx_conf_t) -> String {
    // SAFETY: conf_file is set while a configuration file is being parsed.
    unsafe {
        let Some(file) = (*cf).conf_file.as_ref() else {
            return String::new();
        };
        format!("{}:{}", file.file.name, file.line)
    }
}
