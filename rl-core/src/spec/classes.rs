//! `classes=` of `rl_conn` and `rl_limit`: a request's class (`priority=`)
//! among classes listed highest first, each with its places in a waiting
//! line (`queue=`) and the units it keeps from the classes below it
//! (`reserve=`), which they may borrow while it is unused (`lend`,
//! `rl_conn` only).

use crate::limit::wait::MAX_LANES;
use crate::limit::MAX_LOG_BURST;
use crate::parse::{parse_number, parse_u64};

/// One class of `classes=`: `name[:queue=N][:reserve=N|P%][:lend]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClassSpec<'a> {
    pub name: &'a str,
    /// Its places in the waiting line (`None`: the line's `queue=`; 0: it
    /// never waits).
    pub places: Option<u64>,
    /// Units kept from the classes below it (0: none).
    pub reserve: u64,
    /// `lend`: the classes below may borrow the reserve while the class is
    /// unused.
    pub lend: bool,
}

/// A class that does not parse: the class as written, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClassError {
    pub class: String,
    pub why: String,
}

/// The class a request whose `priority=` is `value` is in: the class of
/// that name, else the lowest.
pub fn class_of<S: AsRef<str>>(classes: &[S], value: &[u8]) -> usize {
    classes.iter().position(|c| c.as_ref().as_bytes() == value).unwrap_or(classes.len().saturating_sub(1))
}

/// What a request of each class must leave of a rate line's budget: the
/// reserves of the classes above it.
pub fn kept(classes: &[ClassSpec<'_>]) -> Vec<u64> {
    let mut above = 0u64;
    classes
        .iter()
        .map(|c| {
            let kept = above;
            above = above.saturating_add(c.reserve);
            kept
        })
        .collect()
}

/// Reads `classes=`: `name[:queue=N][:reserve=N|P%],...`, highest first,
/// a percentage of a reserve taken of `of` (named `what`: `max` or
/// `burst`).
pub fn parse<'a>(list: &'a str, of: u64, what: &str) -> Result<Vec<ClassSpec<'a>>, ClassError> {
    let mut classes: Vec<ClassSpec<'_>> = Vec::new();
    for class in list.split(',') {
        let bad = |why: String| ClassError { class: class.to_string(), why };
        let mut parts = class.split(':');
        let name = parts.next().unwrap_or_default();
        if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') {
            return Err(bad("a class name must be letters, digits, \"_\" and \"-\"".into()));
        }
        if classes.iter().any(|c| c.name == name) {
            return Err(bad("the class is named twice".into()));
        }
        let mut spec = ClassSpec { name, places: None, reserve: 0, lend: false };
        for part in parts {
            if part == "lend" {
                spec.lend = true;
                continue;
            }
            match part.split_once('=') {
                Some(("queue", q)) => match parse_number(q) {
                    Ok(n) if n <= MAX_LOG_BURST => spec.places = Some(n),
                    _ => return Err(bad(format!("queue must be a number of 0 to {MAX_LOG_BURST}"))),
                },
                Some(("reserve", r)) => match reserve(r, of) {
                    Some(n) => spec.reserve = n,
                    None => {
                        return Err(bad(format!("reserve must be a number of units below {what}, or a percentage")))
                    }
                },
                _ => return Err(bad("a class takes \"queue=\", \"reserve=\" and \"lend\"".into())),
            }
        }
        if spec.lend && spec.reserve == 0 {
            return Err(bad("\"lend\" needs a \"reserve=\" to lend".into()));
        }
        classes.push(spec);
    }
    if classes.len() > MAX_LANES {
        return Err(ClassError { class: list.to_string(), why: format!("at most {MAX_LANES} classes are supported") });
    }
    match classes.last() {
        Some(low) if low.reserve > 0 => Err(ClassError {
            class: low.name.to_string(),
            why: "the lowest class has no class below it to keep a reserve from".into(),
        }),
        _ => Ok(classes),
    }
}

/// `reserve=` of a class: `N` units, or `P%` of `max` (rounded up: the
/// share is kept whole); `None` when it is 0, `max` or more, or does not
/// parse.
fn reserve(r: &str, max: u64) -> Option<u64> {
    let units = match r.strip_suffix('%') {
        Some(p) => match parse_u64(p) {
            Ok(p) if p > 0 && p < 100 => (max * p).div_ceil(100),
            _ => return None,
        },
        None => parse_u64(r).ok()?,
    };
    (units > 0 && units < max).then_some(units)
}
