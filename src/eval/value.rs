//! The values a line reads from a request: its key, and the text of a
//! parameter that holds variables. A value of one variable and nothing else
//! is read as nginx stores it, without the complex value's length pass and
//! copy; the default key, `$binary_remote_addr`, from the connection.

use core::{mem, ptr};

use ngx::ffi::{
    in6_addr, in_addr, ngx_http_complex_value, ngx_http_complex_value_t, ngx_http_get_flushed_variable,
    ngx_http_request_t, ngx_str_t, ngx_uint_t, sockaddr_in, sockaddr_in6, AF_INET6, AF_UNIX,
};

use crate::line::{KeySource, Line, VarParam, VarValue};
pub use crate::request::NoMemory;

/// The line's key for the request (empty: the line does not apply to it).
#[inline(always)]
pub fn key(line: &Line, r: *mut ngx_http_request_t) -> Result<ngx_str_t, NoMemory> {
    match line.key_source {
        KeySource::ClientAddr => Ok(client_addr(r)),
        KeySource::Var(index) => Ok(flushed(r, index)),
        KeySource::Complex => complex(r, line.key),
    }
}

/// A parameter's value for the request.
pub fn param(p: &VarParam, r: *mut ngx_http_request_t) -> Result<ngx_str_t, NoMemory> {
    match p.var {
        Some(index) => Ok(flushed(r, index)),
        None => complex(r, p.cv),
    }
}

/// A parameter's value as text: `None` when empty (the line does not apply).
/// Bytes that are not UTF-8 cannot parse: they read as text that fails to.
pub fn param_text<'r>(p: &VarParam, r: *mut ngx_http_request_t) -> Result<Option<&'r str>, NoMemory> {
    let v = param(p, r)?;
    Ok((v.len > 0).then(|| text(v)))
}

/// A value as text. Bytes that are not UTF-8 cannot parse: they read as
/// text that fails to.
pub fn text<'r>(v: ngx_str_t) -> &'r str {
    if v.len == 0 {
        return "";
    }
    // SAFETY: the value was allocated in r->pool, which outlives the phase handler.
    let bytes = unsafe { core::slice::from_raw_parts(v.data, v.len) };
    core::str::from_utf8(bytes).unwrap_or("\u{fffd}")
}

/// A complex value evaluated for the request, in its pool.
#[inline(always)]
fn complex(r: *mut ngx_http_request_t, cv: *mut ngx_http_complex_value_t) -> Result<ngx_str_t, NoMemory> {
    let mut value = ngx_str_t::empty();
    // SAFETY: compiled at configuration time; the value is allocated in r->pool.
    if unsafe { ngx_http_complex_value(r, cv, &mut value) } != 0 {
        return Err(NoMemory);
    }
    Ok(value)
}

/// The value of the variable registered at `index`, as the complex value
/// `"$name"` evaluates it: flushed, empty when not found.
#[inline(always)]
fn flushed(r: *mut ngx_http_request_t, index: ngx_uint_t) -> ngx_str_t {
    // SAFETY: the index was registered for this configuration; r is the request being handled;
    // an index is only kept where VarValue reads the value's layout right (VarValue::matches).
    let value = unsafe { ngx_http_get_flushed_variable(r, index).cast::<VarValue>().as_ref() };
    value.and_then(VarValue::found).unwrap_or_else(ngx_str_t::empty)
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
