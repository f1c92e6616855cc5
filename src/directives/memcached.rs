//! `rl_zone NAME memcached=ADDRESS[,ADDRESS...] ...`: the parameters of a
//! Memcached zone, read and checked while nginx reads the configuration.

use rl_core::memcached::MAX_PREFIX;
use rl_core::spec::Quote;

use crate::redis_zone::{McAddr, RedisZone, Target, ZoneSpec};

/// The parameters a Memcached zone takes besides `memcached`; the other
/// parameters of `rl_zone` (`size`, `redis` and Redis' own) are refused
/// with it.
pub const PARAMS: [&str; 3] = ["timeout", "on_error", "prefix"];

/// memcached's own port.
const DEFAULT_PORT: u16 = 11211;

const DEFAULT_PREFIX: &str = "rl:";

/// Builds the zone from `memcached=ADDRESS,...` and [`PARAMS`] (`get`
/// returns a parameter's value). An error is the message, without the
/// directive.
pub fn parse<'a>(name: &str, servers: &str, get: impl Fn(&str) -> Option<&'a str>) -> Result<RedisZone, String> {
    let mut addrs: Vec<McAddr> = Vec::new();
    for s in servers.split(',') {
        let a = address(s).ok_or_else(|| format!("invalid memcached server \"{}\"", Quote(s)))?;
        if addrs.iter().any(|b| b.to_string() == a.to_string()) {
            return Err(format!("duplicate memcached server \"{}\"", Quote(&a.to_string())));
        }
        addrs.push(a);
    }
    let timeout = super::redis::timeout_param(get("timeout"))?;
    let allow = match get("on_error") {
        None | Some("allow") => true,
        Some("deny") => false,
        Some(v) => return Err(format!("invalid on_error \"{}\", it must be \"allow\" or \"deny\"", Quote(v))),
    };
    let prefix = get("prefix").unwrap_or(DEFAULT_PREFIX);
    // (memcached's keys are printable, without spaces, of 250 bytes at most)
    if prefix.is_empty() || prefix.len() > MAX_PREFIX || !prefix.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!(
            "invalid prefix \"{}\", it must be 1 to {MAX_PREFIX} printable characters without spaces",
            Quote(prefix)
        ));
    }
    let shown = addrs.iter().map(McAddr::to_string).collect::<Vec<_>>().join(",");
    let spec = ZoneSpec { target: Target::Memcached(addrs), timeout, prefix: prefix.to_string(), tls: None };
    Ok(RedisZone::new(name, shown, spec, allow))
}

/// `host:port`, `[ipv6]:port`, or a host alone (memcached's port).
fn address(s: &str) -> Option<McAddr> {
    let (host, port) = match s.strip_prefix('[') {
        Some(rest) => {
            let (host, after) = rest.split_once(']')?;
            match after {
                "" => (host, None),
                p => (host, Some(p.strip_prefix(':')?)),
            }
        }
        None => match s.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (s, None),
        },
    };
    let port = match port {
        None => DEFAULT_PORT,
        Some(p) => p.parse::<u16>().ok().filter(|p| *p > 0)?,
    };
    let name_ok =
        |h: &str| !h.is_empty() && h.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-' || b == b'_');
    let v6 = s.starts_with('[');
    if (v6 && host.parse::<std::net::Ipv6Addr>().is_err()) || (!v6 && !name_ok(host)) {
        return None;
    }
    Some(McAddr { host: host.to_string(), port, v6 })
}
