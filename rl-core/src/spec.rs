//! What a directive's arguments say, read without nginx: an `rl_limit`
//! line's [`LineSpec`], and what every directive's parsing shares, its
//! `name=value` [`params`] and the [`Quote`] its messages put values in.
//!
//! Arguments are bytes, as nginx hands them over (a configuration need not
//! be UTF-8); one that is not UTF-8 matches no parameter and is shown as
//! nginx-sys shows it ([`shown`]). Every refusal's text is the whole
//! `nginx -t` message, naming the directive. What needs nginx (compiling
//! variables, finding zones, allocating) is the caller's: [`LineSpec::parse`]
//! hands each value that holds variables to the caller's `compile`, in the
//! order the checks run, so that the first error nginx reports stays the
//! same whichever side finds it.

pub mod classes;
mod conn;

use std::fmt::{self, Write as _};

use crate::habits;
use crate::limit::wait::Lane;
use crate::limit::{Algorithm, Limit, LimitError, MAX_LOG_BURST};
use crate::parse::{parse_number, parse_rate, parse_u64, ParseError, ParseErrorKind, Rate};
use crate::url::redact;

pub use self::classes::ClassSpec;
pub use self::conn::{ConnError, ConnSpec, MAX_CONN};

/// Text from the configuration as a message quotes it: control characters
/// escaped (a message is one line) and cut after [`Quote::MAX`] bytes, so
/// that nginx, which truncates long configuration messages, does not cut
/// off the reason and the directive that follow.
pub struct Quote<'a>(pub &'a str);

impl Quote<'_> {
    pub const MAX: usize = 255;
}

impl fmt::Display for Quote<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut end = self.0.len().min(Quote::MAX);
        while !self.0.is_char_boundary(end) {
            end -= 1;
        }
        for c in self.0[..end].chars() {
            if c.is_control() {
                write!(f, "{}", c.escape_default())?;
            } else {
                f.write_char(c)?;
            }
        }
        if end < self.0.len() {
            f.write_str("...")?;
        }
        Ok(())
    }
}

/// An argument as nginx-sys displays an `ngx_str_t`: UTF-8 as is, each
/// byte of an invalid sequence as `\xNN`.
pub fn shown(arg: &[u8]) -> String {
    let mut s = String::with_capacity(arg.len());
    for chunk in arg.utf8_chunks() {
        s.push_str(chunk.valid());
        for b in chunk.invalid() {
            let _ = write!(s, "\\x{b:02x}");
        }
    }
    s
}

/// An argument as text: one that is not UTF-8 reads as empty, which no
/// parameter or value is.
pub fn text(arg: &[u8]) -> &str {
    std::str::from_utf8(arg).unwrap_or("")
}

/// The words a value may be, as a message lists them:
/// `"on" or "off"`, `"a", "b" or "c"`.
pub fn one_of(words: &[&str]) -> String {
    let mut s = String::new();
    for (i, w) in words.iter().enumerate() {
        let sep = match i {
            0 => "",
            _ if i + 1 == words.len() => " or ",
            _ => ", ",
        };
        let _ = write!(s, "{sep}\"{w}\"");
    }
    s
}

/// A parameter a directive refuses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParamError {
    pub directive: &'static str,
    pub kind: ParamErrorKind,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ParamErrorKind {
    /// Not one of the directive's parameters: the argument as shown, any
    /// password hidden, and what a `limit_req` habit it is ([`habits`]).
    Invalid { arg: String, hint: Option<String> },
    /// Given twice.
    Duplicate(&'static str),
}

impl fmt::Display for ParamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let directive = self.directive;
        match &self.kind {
            ParamErrorKind::Invalid { arg, hint } => {
                write!(f, "invalid parameter \"{}\" in \"{directive}\" directive", Quote(arg))?;
                match hint {
                    Some(hint) => write!(f, ", {hint}"),
                    None => Ok(()),
                }
            }
            ParamErrorKind::Duplicate(name) => write!(f, "duplicate \"{name}\" parameter in \"{directive}\" directive"),
        }
    }
}

impl std::error::Error for ParamError {}

/// The `name=value` parameters a directive was given, each one it knows.
pub struct Params<'a>(Vec<(&'static str, &'a str)>);

impl<'a> Params<'a> {
    /// The value of parameter `name`, if given.
    pub fn get(&self, name: &str) -> Option<&'a str> {
        self.0.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
    }

    /// The parameters given, in order.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, &'a str)> + '_ {
        self.0.iter().copied()
    }
}

/// The `name=value` parameters of `directive`, each one of `known` and
/// given at most once, in order. An unknown parameter is quoted with any
/// password hidden, with what `hint` says of it.
pub fn params<'a>(
    directive: &'static str,
    args: &[&'a [u8]],
    known: &[&'static str],
    hint: impl Fn(&str) -> Option<String>,
) -> Result<Params<'a>, ParamError> {
    let refuse = |kind| ParamError { directive, kind };
    let mut given: Vec<(&'static str, &'a str)> = Vec::with_capacity(args.len());
    for &arg in args {
        let param = std::str::from_utf8(arg)
            .ok()
            .and_then(|a| a.split_once('='))
            .and_then(|(name, value)| known.iter().find(|k| **k == name).map(|k| (*k, value)));
        let Some((name, value)) = param else {
            return Err(refuse(ParamErrorKind::Invalid { arg: redact(&shown(arg)), hint: hint(text(arg)) }));
        };
        if given.iter().any(|(n, _)| *n == name) {
            return Err(refuse(ParamErrorKind::Duplicate(name)));
        }
        given.push((name, value));
    }
    Ok(Params(given))
}

/// The flags of a directive (`dry_run`, `after_auth`), each given at most
/// once, and its other arguments, in order.
fn flags<'a, const N: usize>(
    directive: &'static str,
    args: &[&'a [u8]],
    names: [&'static str; N],
) -> Result<([bool; N], Vec<&'a [u8]>), ParamError> {
    let mut given = [false; N];
    for (flag, name) in given.iter_mut().zip(names) {
        match args.iter().filter(|a| text(a) == name).count() {
            0 => {}
            1 => *flag = true,
            _ => return Err(ParamError { directive, kind: ParamErrorKind::Duplicate(name) }),
        }
    }
    Ok((given, args.iter().copied().filter(|a| !names.contains(&text(a))).collect()))
}

/// The second half of an "invalid burst/cost/max" message.
fn number_hint(e: &ParseError) -> &'static str {
    match e.kind {
        ParseErrorKind::TooLarge => "it is too large",
        ParseErrorKind::NotPositive | ParseErrorKind::Invalid => "it must be a positive number",
    }
}

/// Why `rl_limit`'s arguments are refused; displays as `nginx -t` says it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SpecError {
    Param(ParamError),
    /// `zone=` or `key=` with nothing after it.
    Empty(&'static str),
    /// `zone=` or `rate=` not given.
    Missing(&'static str),
    Algorithm(String),
    Rate(ParseError),
    /// `burst=` or `cost=`.
    Number(&'static str, ParseError),
    Queue(ParseError),
    Charge(String),
    VaryingBurstLog,
    ChargeAfterLog,
    CostOverBurst {
        cost: u64,
        burst: u64,
    },
    Limit(LimitError),
    ChargeAfterQueue,
    /// A `name=` that is no token (the caller knows what names a line).
    Name(String),
    /// `priority=` without `classes=`, or the other way round.
    Alone(&'static str, &'static str),
    /// A class that does not parse: the class as written, and why.
    Class(String, String),
    /// `classes=` with `queue=` on a line whose rate holds variables.
    ClassesQueue,
    ClassesVaryingBurst,
    /// A class with more places than the line: the class, its, the line's.
    ClassPlaces(String, u64, u64),
    /// The reserves above a class leave it less than a request's cost.
    Starved {
        class: String,
        left: u64,
        cost: u64,
    },
}

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const AT: &str = "in \"rl_limit\" directive";
        match self {
            SpecError::Param(e) => e.fmt(f),
            SpecError::Empty(name) => write!(f, "invalid parameter \"{name}=\" {AT}"),
            SpecError::Missing(name) => write!(f, "\"rl_limit\" directive must have \"{name}\" parameter"),
            SpecError::Algorithm(a) => {
                let all = Algorithm::ALL.map(Algorithm::name);
                write!(f, "invalid algorithm \"{}\" {AT}, it must be {}", Quote(a), one_of(&all))
            }
            SpecError::Rate(e) => write!(f, "invalid rate \"{}\" {AT}, {}", Quote(&e.value), rate_hint(e)),
            SpecError::Number(what, e) => write!(f, "invalid {what} \"{}\" {AT}, {}", Quote(&e.value), number_hint(e)),
            SpecError::Queue(e) => {
                let hint = match e.kind {
                    ParseErrorKind::TooLarge => "it is too large",
                    _ => "it must be a number",
                };
                write!(f, "invalid queue \"{}\" {AT}, {hint}", Quote(&e.value))
            }
            SpecError::Charge(v) => {
                write!(f, "invalid charge \"{}\" {AT}, it must be \"before\" or \"after\"", Quote(v))
            }
            SpecError::VaryingBurstLog => write!(
                f,
                "a burst from variables is not supported by algorithm \"sliding_log\", which lays out one \
                 timestamp per unit of burst when the configuration is read, {AT}"
            ),
            SpecError::ChargeAfterLog => write!(
                f,
                "\"charge=after\" is not supported by algorithm \"sliding_log\", which cannot record an \
                 overdraft, {AT}"
            ),
            SpecError::CostOverBurst { cost, burst } => {
                write!(f, "cost={cost} exceeds burst={burst} {AT}: no request could ever pass")
            }
            SpecError::Limit(e) => write!(f, "invalid limit {AT}: {e}"),
            SpecError::ChargeAfterQueue => {
                write!(f, "\"charge=after\" cannot be used with \"queue\" {AT}: delaying needs the cost up front")
            }
            SpecError::Name(n) => {
                write!(f, "invalid name \"{}\" {AT}, it must be letters, digits, \"_\" and \"-\"", Quote(n))
            }
            SpecError::Alone(given, needs) => write!(f, "\"{given}\" needs \"{needs}\" {AT}"),
            SpecError::Class(class, why) => write!(f, "invalid class \"{}\" {AT}, {why}", Quote(class)),
            SpecError::ClassesQueue => write!(
                f,
                "\"classes\" with \"queue\" needs a rate that does not come from variables {AT}: \
                 the waiting line is laid out for it"
            ),
            SpecError::ClassPlaces(class, places, queue) => write!(
                f,
                "invalid class \"{}\" {AT}, its queue={places} exceeds the line's queue={queue}",
                Quote(class)
            ),
            SpecError::ClassesVaryingBurst => {
                write!(f, "\"classes\" needs a burst that does not come from variables {AT}")
            }
            SpecError::Starved { class, left, cost } => write!(
                f,
                "the reserves of the classes above class \"{}\" leave it {left} of burst, less than cost={cost} {AT}",
                Quote(class)
            ),
        }
    }
}

impl std::error::Error for SpecError {}

impl From<ParamError> for SpecError {
    fn from(e: ParamError) -> Self {
        SpecError::Param(e)
    }
}

/// The second half of an "invalid rate" message.
fn rate_hint(e: &ParseError) -> &'static str {
    match e.kind {
        ParseErrorKind::NotPositive => "it must be positive",
        ParseErrorKind::TooLarge => "it is too large",
        ParseErrorKind::Invalid => {
            "it must be a number of requests per second, minute, hour or day: \"10r/s\", \"100r/m\", \
             \"1000r/h\", \"10000r/d\""
        }
    }
}

/// The parameters of a line that hold variables, each as the caller's
/// `compile` left it.
pub struct Vars<V> {
    pub rate: Option<V>,
    pub burst: Option<V>,
    pub cost: Option<V>,
}

/// One `rl_limit` line as its arguments specify it.
pub struct LineSpec<'a, V> {
    pub zone: &'a str,
    /// `key=` as given: see [`LineSpec::key`].
    key: Option<&'a str>,
    /// With its queue, and varying where the rate or burst holds variables
    /// (then a placeholder until a request comes: `1r/s`, burst 1).
    pub limit: Limit,
    /// The cost; 0 where it holds variables.
    pub cost: u64,
    pub vars: Vars<V>,
    /// `rate=` and `burst=` as written where they hold variables, else the
    /// parsed value (`burst_src` empty for the rate's varying burst).
    pub rate_src: String,
    pub burst_src: String,
    /// The burst holds variables, or follows a rate that does.
    pub burst_varies: bool,
    pub queue: u64,
    /// `name=` as given: what may name a line is the caller's to check
    /// ([`SpecError::Name`]).
    pub name: Option<&'a str>,
    pub dry_run: bool,
    pub after_auth: bool,
    pub charge_after: bool,
    /// `priority=` as given: what names a request's class.
    pub priority: Option<&'a str>,
    /// `classes=`, highest first (empty: none); each keeps its reserve of
    /// the burst from the classes below it.
    pub classes: Vec<ClassSpec<'a>>,
    /// With `queue=` (on the line or its classes), the classes' places in
    /// the line's waiting line (empty: no waiting line).
    pub lanes: Vec<Lane>,
}

/// `rl_limit`'s `name=value` parameters; `dry_run` and `after_auth` are
/// flags, as in `limit_req ... nodelay`.
const KNOWN: [&str; 11] =
    ["zone", "rate", "key", "algorithm", "burst", "cost", "name", "queue", "charge", "priority", "classes"];
const FLAGS: [&str; 2] = ["dry_run", "after_auth"];

impl<'a, V> LineSpec<'a, V> {
    /// Reads `rl_limit`'s arguments (its name not included). A value with
    /// `$` in `rate=`, `burst=` or `cost=` is handed to `compile` (which
    /// refuses it with an `E` of its own, such as one that nginx has
    /// already logged) and checked per request instead.
    pub fn parse<E: From<SpecError>>(
        args: &[&'a [u8]],
        mut compile: impl FnMut(&'a str) -> Result<V, E>,
    ) -> Result<Self, E> {
        let ([dry_run, after_auth], rest) = flags("rl_limit", args, FLAGS).map_err(SpecError::from)?;
        let burst_arg = rest.iter().find_map(|a| text(a).strip_prefix("burst="));
        let given =
            params("rl_limit", &rest, &KNOWN, |arg| habits::limit_param(arg, burst_arg)).map_err(SpecError::from)?;
        let get = |name| given.get(name);
        let zone = match get("zone") {
            Some("") => return Err(SpecError::Empty("zone").into()),
            Some(z) => z,
            None => return Err(SpecError::Missing("zone").into()),
        };
        let algorithm = match get("algorithm") {
            None => Algorithm::default(),
            Some(a) => a.parse::<Algorithm>().map_err(|_| SpecError::Algorithm(a.to_string()))?,
        };
        let mut var = |value: Option<&'a str>| match value.filter(|v| v.contains('$')) {
            Some(v) => compile(v).map(Some),
            None => Ok(None),
        };
        let vars = Vars { rate: var(get("rate"))?, burst: var(get("burst"))?, cost: var(get("cost"))? };
        let rate = match get("rate") {
            Some(_) if vars.rate.is_some() => Rate { count: 1, period_us: 1_000_000 },
            Some(r) => parse_rate(r).map_err(SpecError::Rate)?,
            None => return Err(SpecError::Missing("rate").into()),
        };
        let burst = match get("burst") {
            Some(_) if vars.burst.is_some() => 1,
            None => rate.count,
            Some(b) => parse_u64(b).map_err(|e| SpecError::Number("burst", e))?,
        };
        let cost = match get("cost") {
            None => 1,
            Some(_) if vars.cost.is_some() => 0,
            Some(c) => parse_u64(c).map_err(|e| SpecError::Number("cost", e))?,
        };
        let charge_after = match get("charge") {
            None | Some("before") => false,
            Some("after") => true,
            Some(v) => return Err(SpecError::Charge(v.to_string()).into()),
        };
        let burst_varies = vars.burst.is_some() || (get("burst").is_none() && vars.rate.is_some());
        if algorithm == Algorithm::SlidingLog && burst_varies {
            return Err(SpecError::VaryingBurstLog.into());
        }
        if algorithm == Algorithm::SlidingLog && charge_after {
            return Err(SpecError::ChargeAfterLog.into());
        }
        let fixed = vars.rate.is_none() && vars.burst.is_none() && vars.cost.is_none();
        if fixed && cost > burst {
            return Err(SpecError::CostOverBurst { cost, burst }.into());
        }
        let limit = Limit::new(algorithm, rate, burst).map_err(SpecError::Limit)?;
        let queue = match get("queue") {
            None => 0,
            Some(q) => parse_number(q).map_err(SpecError::Queue)?,
        };
        if charge_after && queue > 0 {
            return Err(SpecError::ChargeAfterQueue.into());
        }
        let priority = get("priority");
        // (with classes, the queue is a waiting line: Limit::with_rate_lanes, below)
        let limit = match priority {
            Some(_) => limit,
            None => limit.with_queue(queue).map_err(SpecError::Limit)?,
        };
        let rate_src = match vars.rate {
            Some(_) => get("rate").unwrap_or_default().to_string(),
            None => rate.to_string(),
        };
        let burst_src = match (&vars.burst, get("burst")) {
            (Some(_), b) => b.unwrap_or_default().to_string(),
            (None, None) if vars.rate.is_some() => String::new(),
            _ => burst.to_string(),
        };
        let limit = if vars.rate.is_some() || vars.burst.is_some() { limit.varying() } else { limit };
        let classes = match (priority, get("classes")) {
            (None, None) => Vec::new(),
            (Some(_), None) => return Err(SpecError::Alone("priority", "classes").into()),
            (None, Some(_)) => return Err(SpecError::Alone("classes", "priority").into()),
            (Some(""), _) => return Err(SpecError::Empty("priority").into()),
            (Some(_), Some(_)) if burst_varies => return Err(SpecError::ClassesVaryingBurst.into()),
            (Some(_), Some(list)) => rate_classes(list, burst, cost)?,
        };
        // (without queue=, a line of classes with places waits as long as their places together)
        let queue = match queue {
            0 => classes.iter().filter_map(|c| c.places).sum::<u64>().min(MAX_LOG_BURST),
            q => q,
        };
        let lanes = match (classes.is_empty(), queue) {
            (true, _) | (false, 0) => Vec::new(),
            (false, _) if vars.rate.is_some() => return Err(SpecError::ClassesQueue.into()),
            (false, q) => rate_lanes(&classes, q)?,
        };
        let limit = match lanes.is_empty() {
            true => limit,
            false => limit.with_rate_lanes(queue, &lanes).map_err(SpecError::Limit)?,
        };
        Ok(LineSpec {
            zone,
            key: get("key"),
            limit,
            cost,
            vars,
            rate_src,
            burst_src,
            burst_varies,
            queue,
            name: get("name"),
            dry_run,
            after_auth,
            charge_after,
            priority,
            classes,
            lanes,
        })
    }

    /// The key as written, `$binary_remote_addr` where none is given; an
    /// empty `key=` refused. Asked for after the zones of the location are
    /// counted, as that check needs the configuration.
    pub fn key(&self) -> Result<&'a str, SpecError> {
        match self.key {
            Some("") => Err(SpecError::Empty("key")),
            Some(k) => Ok(k),
            None => Ok("$binary_remote_addr"),
        }
    }
}

/// `classes=` of a rate line of `burst`: reserves, and places in a waiting
/// line; none leaving a class less than `cost`.
fn rate_classes(list: &str, burst: u64, cost: u64) -> Result<Vec<ClassSpec<'_>>, SpecError> {
    let classes = classes::parse(list, burst, "burst").map_err(|e| SpecError::Class(e.class, e.why))?;
    if let Some(c) = classes.iter().find(|c| c.lend) {
        let why = "a rate line's reserve cannot be lent: what each class spends of the budget is not counted apart";
        return Err(SpecError::Class(c.name.to_string(), why.to_string()));
    }
    for (class, kept) in classes.iter().zip(classes::kept(&classes)) {
        if kept.saturating_add(cost.max(1)) > burst {
            let left = burst.saturating_sub(kept);
            return Err(SpecError::Starved { class: class.name.to_string(), left, cost });
        }
    }
    Ok(classes)
}

/// The waiting line's classes of a rate line with `queue` places: each
/// one's places (its `queue=`, else the line's) and reserve.
fn rate_lanes(classes: &[ClassSpec<'_>], queue: u64) -> Result<Vec<Lane>, SpecError> {
    classes
        .iter()
        .map(|c| match c.places {
            Some(p) if p > queue => Err(SpecError::ClassPlaces(c.name.to_string(), p, queue)),
            p => Ok(Lane { places: p.unwrap_or(queue), reserve: c.reserve, lend: false }),
        })
        .collect()
}

/// The variable's name when `value` is one variable and nothing else
/// (`$name` or `${name}`), as nginx's script compiler reads names: letters,
/// digits and `_`, not starting with a digit (`$1` is a regex capture).
pub fn one_variable(value: &str) -> Option<&str> {
    let name = value.strip_prefix('$')?;
    let name = match name.strip_prefix('{') {
        Some(braced) => braced.strip_suffix('}')?,
        None => name,
    };
    let first = name.bytes().next()?;
    if first.is_ascii_digit() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        return None;
    }
    Some(name)
}
