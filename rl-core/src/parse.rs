//! nginx.conf value parsing: numbers, rates (`10r/s`), sizes (`10m`) and
//! durations (`1m30s`), with nginx's syntax and overflow rules. Integer-only;
//! every failure is a [`ParseError`] whose message reads like nginx's. Every
//! run of digits is read by one function, [`parse_number`]'s: digits only,
//! no sign, no space, overflow refused.

use std::fmt;
use std::str::FromStr;

/// Largest value nginx's `ngx_parse_time` returns on 64-bit (`NGX_MAX_INT_T_VALUE`).
const MAX_TIME: u64 = i64::MAX as u64;

/// Why a value was rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ParseErrorKind {
    /// Malformed: empty, a stray character, an unknown unit.
    Invalid,
    /// Well-formed but zero where a positive number is required.
    NotPositive,
    /// Well-formed but too large to represent.
    TooLarge,
}

/// A rejected configuration value; displays as e.g. `invalid rate "100r/x"`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ParseError {
    /// Why it was rejected.
    pub kind: ParseErrorKind,
    /// What was being parsed: `rate`, `size`, `duration`, `number`, ...
    pub what: &'static str,
    /// The offending text, verbatim.
    pub value: String,
}

impl ParseError {
    /// Builds an error about `value`, a `what`.
    pub fn new(kind: ParseErrorKind, what: &'static str, value: &str) -> Self {
        ParseError { kind, what, value: value.to_owned() }
    }
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid {} \"{}\"", self.what, self.value)?;
        match self.kind {
            ParseErrorKind::Invalid => Ok(()),
            ParseErrorKind::NotPositive => f.write_str(": must be positive"),
            ParseErrorKind::TooLarge => f.write_str(": too large"),
        }
    }
}

impl std::error::Error for ParseError {}

/// A rate: `count` events per `period_us` microseconds (`100r/m`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Rate {
    /// Events per period; positive when produced by [`parse_rate`].
    pub count: u64,
    /// The period in microseconds; one of [`PERIODS`] when parsed.
    pub period_us: u64,
}

/// The rate units `r/<unit>` accepts and their periods in microseconds.
pub const PERIODS: [(char, u64); 4] =
    [('s', 1_000_000), ('m', 60_000_000), ('h', 3_600_000_000), ('d', 86_400_000_000)];

impl fmt::Display for Rate {
    /// `100r/m`; a period that is not a unit prints as `100r/1500us`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match PERIODS.iter().find(|(_, p)| *p == self.period_us) {
            Some((unit, _)) => write!(f, "{}r/{}", self.count, unit),
            None => write!(f, "{}r/{}us", self.count, self.period_us),
        }
    }
}

impl FromStr for Rate {
    type Err = ParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_rate(s)
    }
}

/// Parses `Nr/s`, `Nr/m`, `Nr/h` or `Nr/d`; N is a positive decimal integer
/// (digits only: no sign, no spaces).
pub fn parse_rate(s: &str) -> Result<Rate, ParseError> {
    // Parsed per request where the rate comes from variables: no
    // allocation unless it fails, and a byte search rather than a
    // substring one (the digits before "r/" hold no 'r').
    let err = |kind| ParseError::new(kind, "rate", s);
    let (digits, unit) = match s.bytes().position(|b| b == b'r') {
        Some(i) => (&s[..i], s[i + 1..].strip_prefix('/')),
        None => (s, None),
    };
    let period_us = unit
        .and_then(|unit| PERIODS.iter().find(|(u, _)| unit.len() == 1 && unit.starts_with(*u)))
        .map(|(_, p)| *p)
        .ok_or_else(|| err(ParseErrorKind::Invalid))?;
    let count = positive(digits, u64::MAX).map_err(err)?;
    Ok(Rate { count, period_us })
}

/// Parses a decimal integer the one way every number of the configuration
/// is read (a status code, a port, a db, and the digits of rates, sizes and
/// durations): ASCII digits only, at least one (no sign, no space, no
/// `0x`); leading zeros are allowed; above `u64::MAX` it is
/// [`ParseErrorKind::TooLarge`]. Zero is allowed.
pub fn parse_number(s: &str) -> Result<u64, ParseError> {
    decimal(s, u64::MAX).map_err(|kind| ParseError::new(kind, "number", s))
}

/// Parses a positive decimal integer (as [`parse_number`], zero refused),
/// e.g. a burst or a cost.
pub fn parse_u64(s: &str) -> Result<u64, ParseError> {
    positive(s, u64::MAX).map_err(|kind| ParseError::new(kind, "number", s))
}

/// Parses a size exactly like nginx's `ngx_parse_size`: decimal digits with an
/// optional `k`/`K` (×1024), `m`/`M` (×1024²) or `g`/`G` (×1024³) suffix; the
/// result must not exceed `isize::MAX`. Zero is allowed.
pub fn parse_size(s: &str) -> Result<usize, ParseError> {
    let err = |kind| ParseError::new(kind, "size", s);
    let (digits, scale) = match s.as_bytes().last() {
        Some(b'k' | b'K') => (&s[..s.len() - 1], 1 << 10),
        Some(b'm' | b'M') => (&s[..s.len() - 1], 1 << 20),
        Some(b'g' | b'G') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    let max = u64::try_from(isize::MAX).unwrap_or(u64::MAX);
    let n = decimal(digits, max).map_err(err)?;
    n.checked_mul(scale)
        .filter(|v| *v <= max)
        .and_then(|v| usize::try_from(v).ok())
        .ok_or(err(ParseErrorKind::TooLarge))
}

/// Order of the units within a duration, as in `ngx_parse_time`.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Step {
    Start,
    Year,
    Month,
    Week,
    Day,
    Hour,
    Min,
    Sec,
    Msec,
    Last,
}

/// A unit (`ms` when `c` is `m` followed by `s`): a guard (the units before
/// it must be of a smaller step), the step it sets, and its length in ms.
fn unit(c: u8, ms: bool) -> Option<(Step, Step, u64)> {
    const DAY: u64 = 86_400_000;
    if ms {
        return Some((Step::Msec, Step::Msec, 1));
    }
    Some(match c {
        b'y' => (Step::Year, Step::Year, 365 * DAY),
        b'M' => (Step::Month, Step::Month, 30 * DAY),
        b'w' => (Step::Week, Step::Week, 7 * DAY),
        b'd' => (Step::Day, Step::Day, DAY),
        b'h' => (Step::Hour, Step::Hour, 3_600_000),
        b'm' => (Step::Min, Step::Min, 60_000),
        b's' => (Step::Sec, Step::Sec, 1_000),
        // A space directly after digits ends a bare "seconds" number.
        b' ' => (Step::Sec, Step::Last, 1_000),
        _ => return None,
    })
}

/// Parses a duration into milliseconds like nginx's `ngx_parse_time(line, 0)`:
/// a sequence such as `1h30m`, `1s500ms` or `2d` with units in decreasing
/// order, each at most once: `y` (365d), `M` (30d), `w`, `d`, `h`, `m`, `s`,
/// `ms`; a trailing bare number means seconds (`30` = 30 s). The result is at
/// most `i64::MAX`. Unlike nginx (which rejects `y` and `M` in millisecond
/// mode to protect 32-bit builds) `y` and `M` are accepted here.
pub fn parse_duration_ms(s: &str) -> Result<u64, ParseError> {
    let err = |kind| ParseError::new(kind, "duration", s);
    let b = s.as_bytes();
    let (mut i, mut value, mut total, mut step, mut valid) = (0, 0u64, 0u64, Step::Start, false);
    while let Some(&c) = b.get(i) {
        i += 1;
        if c.is_ascii_digit() {
            value = push_digit(value, c, MAX_TIME).map_err(err)?;
            valid = true;
            continue;
        }
        let ms = c == b'm' && b.get(i) == Some(&b's');
        i += usize::from(ms);
        let (guard, next, scale) = unit(c, ms).ok_or(err(ParseErrorKind::Invalid))?;
        if step >= guard {
            return Err(err(ParseErrorKind::Invalid));
        }
        step = next;
        total = add_scaled(total, value, scale).ok_or(err(ParseErrorKind::TooLarge))?;
        value = 0;
        while b.get(i) == Some(&b' ') {
            i += 1;
        }
    }
    if !valid {
        return Err(err(ParseErrorKind::Invalid));
    }
    add_scaled(total, value, 1_000).ok_or(err(ParseErrorKind::TooLarge))
}

/// `total + value * scale` if it stays within [`MAX_TIME`].
fn add_scaled(total: u64, value: u64, scale: u64) -> Option<u64> {
    value.checked_mul(scale).and_then(|v| v.checked_add(total)).filter(|v| *v <= MAX_TIME)
}

/// A non-empty string of ASCII digits as a number no larger than `max`.
fn decimal(s: &str, max: u64) -> Result<u64, ParseErrorKind> {
    if s.is_empty() || !s.bytes().all(|c| c.is_ascii_digit()) {
        return Err(ParseErrorKind::Invalid);
    }
    s.bytes().try_fold(0, |n, c| push_digit(n, c, max))
}

/// Like [`decimal`], but zero is rejected.
fn positive(s: &str, max: u64) -> Result<u64, ParseErrorKind> {
    match decimal(s, max)? {
        0 => Err(ParseErrorKind::NotPositive),
        n => Ok(n),
    }
}

/// `n * 10 + digit`, failing above `max`.
fn push_digit(n: u64, digit: u8, max: u64) -> Result<u64, ParseErrorKind> {
    n.checked_mul(10)
        .and_then(|n| n.checked_add(u64::from(digit.saturating_sub(b'0'))))
        .filter(|n| *n <= max)
        .ok_or(ParseErrorKind::TooLarge)
}
