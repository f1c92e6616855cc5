//! `limit_req` habits: parameters written as `limit_req_zone` and
//! `limit_req` take them, which `rl_zone` and `rl_limit` refuse. Each
//! function gives the nginx-rl form to append to the refusal (`did you mean
//! "size=10m"?`), or `None` where the argument is no such habit.

use crate::parse::{parse_number, parse_size};

/// Where the README says how each `limit_req` form is written here.
const MOVING: &str = "(see \"Moving from limit_req\" in the README)";

/// `limit_req_zone`'s `zone=NAME:SIZE`, split, where SIZE is a size.
fn zone_and_size(value: &str) -> Option<(&str, &str)> {
    let (name, size) = value.rsplit_once(':')?;
    (!name.is_empty() && parse_size(size).is_ok()).then_some((name, size))
}

/// A hint for an `rl_zone` argument after the name that is not a parameter
/// `rl_zone` knows: a bare size (`rl_zone api 10m`), `zone=NAME:SIZE`, or
/// one of `limit_req_zone`'s parameters that belong to `rl_limit` here.
pub fn zone_param(arg: &str) -> Option<String> {
    if parse_size(arg).is_ok() {
        return Some(format!("did you mean \"size={arg}\"?"));
    }
    let (name, value) = arg.split_once('=')?;
    match name {
        "zone" => zone_and_size(value).map(|(z, size)| format!("did you mean \"rl_zone {z} size={size}\"?")),
        "rate" => Some(format!("\"{name}\" is a parameter of \"rl_limit\" here {MOVING}")),
        _ => None,
    }
}

/// A hint for an `rl_zone` name that is no name: `limit_req_zone`'s
/// `zone=NAME:SIZE` given as the first argument (`rl_zone zone=api:10m`).
pub fn zone_name(name: &str) -> Option<String> {
    let (z, size) = zone_and_size(name.strip_prefix("zone=")?)?;
    Some(format!("did you mean \"rl_zone {z} size={size}\"?"))
}

/// A hint for an `rl_zone` name that names a variable: the key of a
/// `limit_req_zone` line (`rl_zone $binary_remote_addr zone=api:10m ...`).
pub fn zone_key(name: &str) -> Option<String> {
    name.starts_with('$').then(|| "the key and the rate go on \"rl_limit\" here".to_string())
}

/// A hint for an `rl_limit` argument that is not one of its parameters:
/// `nodelay` and `delay=D`, given the line's `burst=` (as written, if any),
/// in the `rl_limit` form that behaves the same.
pub fn limit_param(arg: &str, burst: Option<&str>) -> Option<String> {
    // limit_req's burst: its excess, 0 when not given.
    let excess = match burst {
        None => Some(0),
        Some(b) => parse_number(b).ok(),
    };
    if arg == "nodelay" {
        let form = match excess {
            Some(b) => format!("\"burst={}\"", b.saturating_add(1)),
            None => "\"burst=B+1\"".to_string(),
        };
        return Some(format!("limit_req's \"burst=B nodelay\" is {form} here {MOVING}"));
    }
    let d = parse_number(arg.strip_prefix("delay=")?).ok();
    let form = match (excess, d) {
        (Some(b), Some(d)) if d < b => format!("\"burst={} queue={}\"", d + 1, b - d),
        (Some(_), Some(_)) => "\"burst=B+1\"".to_string(),
        _ => "\"burst=D+1 queue=B-D\"".to_string(),
    };
    Some(format!("limit_req's \"burst=B delay=D\" is {form} here {MOVING}"))
}

/// A hint for an `rl_limit` zone that no `rl_zone` declares, when it reads
/// as `limit_req_zone`'s `NAME:SIZE` (`rl_limit zone=api:10m`).
pub fn limit_zone(zone: &str) -> Option<String> {
    let (z, size) = zone_and_size(zone)?;
    Some(format!("did you mean \"zone={z}\", declared by \"rl_zone {z} size={size}\"?"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zone_params() {
        assert_eq!(zone_param("10m").as_deref(), Some("did you mean \"size=10m\"?"));
        assert_eq!(zone_param("64k").as_deref(), Some("did you mean \"size=64k\"?"));
        assert_eq!(zone_param("zone=api:10m").as_deref(), Some("did you mean \"rl_zone api size=10m\"?"));
        assert!(zone_param("rate=10r/s").is_some_and(|h| h.contains("\"rate\" is a parameter of \"rl_limit\"")));
        for other in ["foo=1", "zone=api", "zone=:10m", "zone=api:10x", "10x", "", "size"] {
            assert_eq!(zone_param(other), None, "{other}");
        }
    }

    #[test]
    fn zone_names() {
        assert_eq!(zone_name("zone=api:10m").as_deref(), Some("did you mean \"rl_zone api size=10m\"?"));
        assert_eq!(zone_name("api"), None);
        assert_eq!(zone_name("zone=api"), None);
        assert_eq!(zone_key("$binary_remote_addr").as_deref(), Some("the key and the rate go on \"rl_limit\" here"));
        assert_eq!(zone_key("api"), None);
    }

    #[test]
    fn limit_params() {
        let hint = |a, b| limit_param(a, b).unwrap_or_default();
        assert!(hint("nodelay", Some("5")).starts_with("limit_req's \"burst=B nodelay\" is \"burst=6\" here"));
        assert!(hint("nodelay", None).contains("is \"burst=1\" here"));
        assert!(hint("nodelay", Some("x")).contains("is \"burst=B+1\" here"));
        assert!(hint("nodelay", Some("5")).ends_with(" here (see \"Moving from limit_req\" in the README)"));
        assert!(hint("delay=2", Some("10")).contains("is \"burst=3 queue=8\" here"));
        assert!(hint("delay=10", Some("10")).contains("is \"burst=B+1\" here"));
        assert!(hint("delay=x", Some("10")).contains("is \"burst=D+1 queue=B-D\" here"));
        assert_eq!(limit_param("foo=bar", None), None);
        assert_eq!(limit_param("delay", None), None);
    }

    #[test]
    fn limit_zones() {
        assert_eq!(
            limit_zone("api:10m").as_deref(),
            Some("did you mean \"zone=api\", declared by \"rl_zone api size=10m\"?")
        );
        assert_eq!(limit_zone("api"), None);
        assert_eq!(limit_zone("api:x"), None);
    }
}
