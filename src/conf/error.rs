//! A configuration refused, in nginx's words, and the one place such a
//! refusal is logged: at the directive while nginx parses (its `file:line`
//! added by nginx), or, once parsing is over, with the `file:line` the
//! message names itself. Whatever fails logs through here before nginx is
//! told: an `NGX_CONF_ERROR` nobody logged makes `nginx -t` fail silently.

use core::ffi::c_char;
use core::fmt;

use ngx::core::{NGX_CONF_ERROR, NGX_CONF_OK};
use ngx::ffi::{ngx_conf_t, ngx_log_t, NGX_LOG_EMERG};
use ngx::{ngx_conf_log_error, ngx_log_error};
use rl_core::spec::{ParamError, SpecError};

/// Why the configuration is refused.
#[derive(Debug)]
pub enum ConfError {
    /// The whole message (`invalid rate "x" in "rl_limit" directive, ...`),
    /// logged at `emerg`.
    Refused(String),
    /// The message is already logged: by nginx (a variable it could not
    /// compile, memory it could not allocate, a zone it could not add) or
    /// by the code that failed.
    Logged,
}

impl ConfError {
    /// A refusal in these words.
    pub fn refused(msg: fmt::Arguments<'_>) -> ConfError {
        ConfError::Refused(msg.to_string())
    }
}

impl fmt::Display for ConfError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfError::Refused(msg) => f.write_str(msg),
            ConfError::Logged => f.write_str("(logged)"),
        }
    }
}

impl std::error::Error for ConfError {}

impl From<SpecError> for ConfError {
    fn from(e: SpecError) -> Self {
        ConfError::Refused(e.to_string())
    }
}

impl From<rl_core::spec::ConnError> for ConfError {
    fn from(e: rl_core::spec::ConnError) -> Self {
        ConfError::Refused(e.to_string())
    }
}

impl From<ParamError> for ConfError {
    fn from(e: ParamError) -> Self {
        ConfError::Refused(e.to_string())
    }
}

/// Returns early with a [`ConfError::Refused`] in these words.
macro_rules! refuse {
    ($($arg:tt)+) => {
        return Err($crate::conf::ConfError::refused(format_args!($($arg)+)))
    };
}
pub(crate) use refuse;

/// A directive handler's answer to nginx: `NGX_CONF_OK`, or the error
/// logged at the directive being parsed, as `ngx_conf_log_error` does.
pub fn at_directive(cf: *mut ngx_conf_t, result: Result<(), ConfError>) -> *mut c_char {
    match result {
        Ok(()) => NGX_CONF_OK,
        Err(ConfError::Refused(msg)) => {
            ngx_conf_log_error!(NGX_LOG_EMERG, cf, "{}", msg);
            NGX_CONF_ERROR
        }
        Err(ConfError::Logged) => NGX_CONF_ERROR,
    }
}

/// The error found after parsing, logged to the cycle's log (nginx's
/// position would be the end of `http {}`: the message names the
/// directive's `file:line` itself, as nginx does for such errors).
pub fn after_parsing(log: *mut ngx_log_t, result: Result<(), ConfError>) -> Result<(), ConfError> {
    if let Err(ConfError::Refused(msg)) = &result {
        ngx_log_error!(NGX_LOG_EMERG, log, "{}", msg);
    }
    result.map_err(|_| ConfError::Logged)
}
