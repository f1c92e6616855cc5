//! What `rl_conn`'s arguments say: [`ConnSpec`].

use std::fmt;

use super::classes::{self, ClassSpec};
use super::{flags, number_hint, params, ParamError, Quote};
use crate::limit::wait::Lane;
use crate::limit::{Limit, MAX_LOG_BURST};
use crate::parse::{parse_duration_ms, parse_number, parse_u64, ParseError, ParseErrorKind};

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
    /// `queue=`: requests of a key that may wait for a slot (0: none).
    pub queue: u64,
    /// `timeout=`: the longest a request waits, in ms.
    pub timeout_ms: u64,
    /// `priority=` as given: what names a request's class.
    pub priority: Option<&'a str>,
    /// `classes=`, highest first (empty: none).
    pub classes: Vec<ClassSpec<'a>>,
    /// The waiting line's classes: one per class, or one for all when
    /// there are none. What [`Limit::wait`] takes.
    pub lanes: Vec<Lane>,
}

/// How long a request waits for a slot by default (`timeout=`): nginx's
/// usual 60 s (`proxy_read_timeout`, `send_timeout`).
pub const DEFAULT_TIMEOUT_MS: u64 = 60_000;

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
    Queue(ParseError),
    Timeout(ParseError),
    /// `timeout=` without `queue=`.
    TimeoutAlone,
    /// `priority=` without `classes=`, or the other way round.
    Alone(&'static str, &'static str),
    /// A class of `classes=` that does not parse: the class as written,
    /// and why.
    Class(String, String),
    /// The reserves above a class leave it less than a request's cost.
    Starved {
        class: String,
        ceiling: u64,
        cost: u64,
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
            ConnError::Queue(e) => {
                let hint = match e.kind {
                    ParseErrorKind::TooLarge => "it is too large (at most 65536)",
                    _ => "it must be a number",
                };
                write!(f, "invalid queue \"{}\" {AT}, {hint}", Quote(&e.value))
            }
            ConnError::Timeout(e) => write!(f, "invalid timeout \"{}\" {AT}", Quote(&e.value)),
            ConnError::TimeoutAlone => {
                write!(f, "\"timeout\" needs \"queue\" {AT}: a request that cannot wait never times out")
            }
            ConnError::Alone(given, needs) => write!(f, "\"{given}\" needs \"{needs}\" {AT}"),
            ConnError::Class(class, why) => write!(f, "invalid class \"{}\" {AT}, {why}", Quote(class)),
            ConnError::Starved { class, ceiling, cost } => write!(
                f,
                "the reserves of the classes above class \"{}\" leave it {ceiling} of max, less than cost={cost} {AT}",
                Quote(class)
            ),
        }
    }
}

impl std::error::Error for ConnError {}

/// `rl_conn`'s `name=value` parameters and flags.
const KNOWN: [&str; 9] = ["zone", "max", "key", "cost", "name", "queue", "timeout", "priority", "classes"];
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
        let queue = match given.get("queue") {
            None => 0,
            Some(q) => match parse_number(q) {
                Ok(n) if n > MAX_LOG_BURST => {
                    return Err(ConnError::Queue(ParseError::new(ParseErrorKind::TooLarge, "queue", q)))
                }
                Ok(n) => n,
                Err(e) => return Err(ConnError::Queue(e)),
            },
        };
        let priority = given.get("priority");
        let classes = match (priority, given.get("classes")) {
            (None, None) => Vec::new(),
            (Some(_), None) => return Err(ConnError::Alone("priority", "classes")),
            (None, Some(_)) => return Err(ConnError::Alone("classes", "priority")),
            (Some(""), _) => return Err(ConnError::Empty("priority")),
            (Some(_), Some(list)) => classes::parse(list, max, "max").map_err(|e| ConnError::Class(e.class, e.why))?,
        };
        // (without queue=, the line waits as long as its classes' places together)
        let queue = match queue {
            0 => classes.iter().filter_map(|c| c.places).sum::<u64>().min(MAX_LOG_BURST),
            q => q,
        };
        let timeout_ms = match given.get("timeout") {
            None => DEFAULT_TIMEOUT_MS,
            Some(_) if queue == 0 => return Err(ConnError::TimeoutAlone),
            Some(t) => match parse_duration_ms(t) {
                Ok(ms) if ms > 0 => ms,
                Ok(_) => return Err(ConnError::Timeout(ParseError::new(ParseErrorKind::NotPositive, "timeout", t))),
                Err(e) => return Err(ConnError::Timeout(e)),
            },
        };
        let lanes = lanes(&classes, max, queue, cost)?;
        let bad_max =
            |_| ConnError::Number("max", ParseError::new(ParseErrorKind::NotPositive, "max", &max.to_string()));
        let limit = Limit::concurrent(max).map_err(bad_max)?.with_lanes(queue, &lanes).map_err(bad_max)?;
        Ok(ConnSpec {
            zone,
            key: given.get("key"),
            limit,
            cost,
            name: given.get("name"),
            dry_run,
            after_auth,
            queue,
            timeout_ms,
            priority,
            classes,
            lanes,
        })
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

/// The waiting line's classes: each one's places (its `queue=`, else the
/// line's) and reserve; one class of all places without `classes=`. A
/// class whose room (`max` less the reserves above it) is below the cost
/// could never pass: refused.
fn lanes(classes: &[ClassSpec<'_>], max: u64, queue: u64, cost: u64) -> Result<Vec<Lane>, ConnError> {
    if classes.is_empty() {
        return Ok(vec![Lane { places: queue, reserve: 0, lend: false }]);
    }
    let mut ceiling = max;
    let mut lanes = Vec::with_capacity(classes.len());
    for class in classes {
        if ceiling < cost.max(1) {
            return Err(ConnError::Starved { class: class.name.to_string(), ceiling, cost });
        }
        if class.places.is_some_and(|p| p > queue) {
            return Err(ConnError::Class(
                class.name.to_string(),
                format!("its queue={} exceeds the line's queue={queue}", class.places.unwrap_or(0)),
            ));
        }
        let places = class.places.unwrap_or(queue);
        if class.lend && places == 0 {
            return Err(ConnError::Class(
                class.name.to_string(),
                "a lent reserve comes back to its class through the waiting line: the class needs places (\"queue=\")"
                    .to_string(),
            ));
        }
        lanes.push(Lane { places, reserve: class.reserve, lend: class.lend });
        ceiling = ceiling.saturating_sub(class.reserve);
    }
    Ok(lanes)
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
