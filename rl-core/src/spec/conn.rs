//! What `rl_conn`'s arguments say: [`ConnSpec`].

use std::fmt;

use super::{flags, number_hint, params, ParamError, Quote};
use crate::limit::Limit;
use crate::parse::{parse_u64, ParseError, ParseErrorKind};

/// One `rl_conn` line as its arguments specify it.
#[derive(Debug)]
pub struct ConnSpec<'a> {
    pub zone: &'a str,
    /// `key=` as given: see [`ConnSpec::key`].
    key: Option<&'a str>,
    /// `max=`, as a [`Limit::concurrent`].
    pub limit: Limit,
    /// Units each request holds (`cost=`, default 1).
    pub cost: u64,
    /// `name=` as given (what may name a line is the caller's to check).
    pub name: Option<&'a str>,
    pub dry_run: bool,
    pub after_auth: bool,
}

/// Why `rl_conn`'s arguments are refused; displays as `nginx -t` says it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConnError {
    Param(ParamError),
    /// `zone=` or `key=` with nothing after it.
    Empty(&'static str),
    /// `zone=` or `max=` not given.
    Missing(&'static str),
    /// `max=` or `cost=`.
    Number(&'static str, ParseError),
    CostOverMax {
        cost: u64,
        max: u64,
    },
}

impl fmt::Display for ConnError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const AT: &str = "in \"rl_conn\" directive";
        match self {
            ConnError::Param(e) => e.fmt(f),
            ConnError::Empty(name) => write!(f, "invalid parameter \"{name}=\" {AT}"),
            ConnError::Missing(name) => write!(f, "\"rl_conn\" directive must have \"{name}\" parameter"),
            ConnError::Number(what, e) => write!(f, "invalid {what} \"{}\" {AT}, {}", Quote(&e.value), number_hint(e)),
            ConnError::CostOverMax { cost, max } => {
                write!(f, "cost={cost} exceeds max={max} {AT}: no request could ever pass")
            }
        }
    }
}

impl std::error::Error for ConnError {}

/// `rl_conn`'s `name=value` parameters and flags.
const KNOWN: [&str; 5] = ["zone", "max", "key", "cost", "name"];
const FLAGS: [&str; 2] = ["dry_run", "after_auth"];

/// The largest `max=`: a request's units are counted in one word, and no
/// nginx holds more requests at once.
pub const MAX_CONN: u64 = 1 << 20;

impl<'a> ConnSpec<'a> {
    /// Reads `rl_conn`'s arguments (its name not included).
    pub fn parse(args: &[&'a [u8]]) -> Result<Self, ConnError> {
        let ([dry_run, after_auth], rest) = flags("rl_conn", args, FLAGS).map_err(ConnError::Param)?;
        let given = params("rl_conn", &rest, &KNOWN, hint).map_err(ConnError::Param)?;
        let zone = match given.get("zone") {
            Some("") => return Err(ConnError::Empty("zone")),
            Some(z) => z,
            None => return Err(ConnError::Missing("zone")),
        };
        let number = |what: &'static str, v: &str| match parse_u64(v) {
            Ok(n) if n > MAX_CONN => Err(ConnError::Number(what, ParseError::new(ParseErrorKind::TooLarge, what, v))),
            Ok(n) => Ok(n),
            Err(e) => Err(ConnError::Number(what, e)),
        };
        let max = match given.get("max") {
            Some(m) => number("max", m)?,
            None => return Err(ConnError::Missing("max")),
        };
        let cost = match given.get("cost") {
            Some(c) => number("cost", c)?,
            None => 1,
        };
        if cost > max {
            return Err(ConnError::CostOverMax { cost, max });
        }
        let limit = Limit::concurrent(max).map_err(|_| {
            ConnError::Number("max", ParseError::new(ParseErrorKind::NotPositive, "max", &max.to_string()))
        })?;
        Ok(ConnSpec { zone, key: given.get("key"), limit, cost, name: given.get("name"), dry_run, after_auth })
    }

    /// The key as written, `$binary_remote_addr` where none is given; an
    /// empty `key=` refused.
    pub fn key(&self) -> Result<&'a str, ConnError> {
        match self.key {
            Some("") => Err(ConnError::Empty("key")),
            Some(k) => Ok(k),
            None => Ok("$binary_remote_addr"),
        }
    }
}

/// What an unknown parameter of `rl_conn` is, when it is `limit_conn`'s
/// habit: `rl_conn zone=addr 10` for `limit_conn addr 10`.
fn hint(arg: &str) -> Option<String> {
    match arg.parse::<u64>() {
        Ok(n) => Some(format!("use \"max={n}\"")),
        Err(_) if arg.starts_with('$') => Some(format!("use \"key={}\"", Quote(arg))),
        Err(_) if !arg.contains('=') => Some(format!("use \"zone={}\"", Quote(arg))),
        Err(_) => None,
    }
}
