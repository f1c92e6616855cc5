//! `rl_zone NAME redis=URL ...`: the parameters of a Redis zone, its URL
//! and its certificates, read and checked while nginx reads the
//! configuration (so that `nginx -t` reports them).

use std::time::Duration;

use redis::{ClientTlsConfig, IntoConnectionInfo, RedisConnectionInfo, TlsCertificates};
use rl_core::parse::parse_duration_ms;

use crate::redis_zone::{self, RedisZone, Target, ZoneSpec};

/// The longest `timeout`: a request held longer for a rate-limiting
/// decision is no longer served in any useful sense (nginx's own timeouts
/// for a peer default to 60s), every request of a zone whose Redis froze
/// waits that long before the connection is given up (see
/// `redis_zone::conn`), and a gracefully exiting worker (reload) lives on
/// for as long as its requests may wait.
const MAX_TIMEOUT_MS: u64 = 60_000;

/// Parses `redis=URL [timeout=TIME] [on_error=allow|deny] [prefix=STRING]
/// [ssl_trusted_certificate=FILE] [ssl_certificate=FILE
/// ssl_certificate_key=FILE]`; relative file names are taken from
/// `conf_prefix`, as nginx does.
pub fn parse(name: &str, args: &[&str], conf_prefix: &str) -> Result<RedisZone, String> {
    let mut url = None;
    let mut timeout = Duration::from_millis(50);
    let mut allow = true;
    let mut prefix = "rl:".to_string();
    let (mut trusted, mut cert, mut key) = (None, None, None);
    for a in args {
        if let Some(v) = a.strip_prefix("redis=") {
            url = Some(v);
        } else if let Some(v) = a.strip_prefix("timeout=") {
            match parse_duration_ms(v) {
                Ok(ms) if ms > MAX_TIMEOUT_MS => {
                    let max = MAX_TIMEOUT_MS / 1000;
                    return Err(format!("timeout \"{v}\" is too long, nginx-rl waits for Redis at most {max}s"));
                }
                Ok(ms) if ms > 0 => timeout = Duration::from_millis(ms),
                _ => return Err(format!("invalid timeout \"{v}\"")),
            }
        } else if let Some(v) = a.strip_prefix("on_error=") {
            allow = match v {
                "allow" => true,
                "deny" => false,
                _ => return Err(format!("invalid on_error \"{v}\", it must be \"allow\" or \"deny\"")),
            };
        } else if let Some(v) = a.strip_prefix("prefix=") {
            prefix = v.to_string();
        } else if let Some(v) = a.strip_prefix("ssl_trusted_certificate=") {
            trusted = Some(v);
        } else if let Some(v) = a.strip_prefix("ssl_certificate=") {
            cert = Some(v);
        } else if let Some(v) = a.strip_prefix("ssl_certificate_key=") {
            key = Some(v);
        } else {
            return Err(format!("invalid parameter \"{}\"", redact(a)));
        }
    }
    let url = url.ok_or_else(|| "missing \"redis\" parameter".to_string())?;
    let target = parse_target(url).map_err(|e| format!("invalid redis URL \"{}\": {e}", redact(url)))?;
    match (cert, key) {
        (Some(c), None) => return Err(format!("no \"ssl_certificate_key\" is defined for certificate \"{c}\"")),
        (None, Some(_)) => return Err("\"ssl_certificate_key\" needs \"ssl_certificate\"".into()),
        _ => {}
    }
    let tls = tls_files(url, trusted, cert.zip(key), conf_prefix)?;
    Ok(RedisZone::new(name, redact(url), ZoneSpec { target, timeout, prefix, tls }, allow))
}

/// The certificates of a `rediss` zone's `ssl_*` parameters, read (and
/// checked) now: the trusted CAs, and the client certificate and its key.
fn tls_files(
    url: &str,
    trusted: Option<&str>,
    client: Option<(&str, &str)>,
    conf_prefix: &str,
) -> Result<Option<TlsCertificates>, String> {
    if trusted.is_none() && client.is_none() {
        return Ok(None);
    }
    if !url.starts_with("rediss") {
        return Err("\"ssl_*\" parameters need a \"rediss\" URL".into());
    }
    let read = |what: &str, file: &str| {
        let path = if file.starts_with('/') { file.to_string() } else { format!("{conf_prefix}{file}") };
        std::fs::read(&path).map_err(|e| format!("cannot load {what} \"{path}\": {e}"))
    };
    let root_cert = match trusted {
        Some(file) => {
            let pem = read("trusted certificates", file)?;
            const BEGIN: &[u8] = b"-----BEGIN CERTIFICATE-----";
            if !pem.windows(BEGIN.len()).any(|w| w == BEGIN) {
                return Err(format!("no certificate in \"{file}\" (\"ssl_trusted_certificate\" wants PEM)"));
            }
            Some(pem)
        }
        None => None,
    };
    let client_tls = match client {
        Some((cert, key)) => {
            Some(ClientTlsConfig { client_cert: read("certificate", cert)?, client_key: read("certificate key", key)? })
        }
        None => None,
    };
    let certs = TlsCertificates { client_tls, root_cert };
    // Parses them as a connection will (it connects to nothing).
    let probe = "rediss://127.0.0.1:6379".into_connection_info().map_err(|e| e.to_string())?;
    redis_zone::client(probe, &Some(certs.clone())).map_err(|e| e.to_string())?;
    Ok(Some(certs))
}

/// Replaces the password of `scheme://user:password@host` with `***`.
pub fn redact(s: &str) -> String {
    let Some(scheme_end) = s.find("://") else {
        return s.to_string();
    };
    let rest = &s[scheme_end + 3..];
    match rest.find('@') {
        Some(at) => {
            let creds = &rest[..at];
            let user = creds.split_once(':').map_or("", |(u, _)| u);
            format!("{}{}:***@{}", &s[..scheme_end + 3], user, &rest[at + 1..])
        }
        None => s.to_string(),
    }
}

fn parse_target(url: &str) -> Result<Target, String> {
    let (scheme, rest) = url.split_once("://").ok_or("no scheme")?;
    if url.contains('#') {
        return Err("no \"#\" fragment is supported (the certificate of a rediss server is always verified: \"ssl_trusted_certificate\" names a private CA)".into());
    }
    match scheme {
        "redis" | "rediss" => {
            url.into_connection_info().map_err(|e| e.to_string())?;
            Ok(Target::Single(url.to_string()))
        }
        "redis+sentinel" | "rediss+sentinel" => {
            let (creds, rest) = split_creds(rest);
            let (hosts, path) = rest.split_once('/').ok_or("no master name")?;
            let (master, db) = match path.split_once('/') {
                Some((m, d)) => (m, d.parse::<i64>().map_err(|_| format!("invalid db \"{d}\""))?),
                None => (path, 0),
            };
            if master.is_empty() {
                return Err("no master name".into());
            }
            let mut node = RedisConnectionInfo::default().set_db(db);
            if let Some((user, pass)) = creds {
                if !user.is_empty() {
                    node = node.set_username(user);
                }
                node = node.set_password(pass);
            }
            let base = if scheme.starts_with("rediss") { "rediss" } else { "redis" };
            let sentinels = hosts_of(hosts)?.into_iter().map(|h| format!("{base}://{h}")).collect();
            Ok(Target::Sentinel { sentinels, master: master.to_string(), node, tls: base == "rediss" })
        }
        "redis+cluster" | "rediss+cluster" => {
            let (creds, hosts) = split_creds(rest);
            let base = if scheme.starts_with("rediss") { "rediss" } else { "redis" };
            let auth = creds.map_or(String::new(), |(u, p)| format!("{u}:{p}@"));
            let nodes: Vec<String> =
                hosts_of(hosts.trim_end_matches('/'))?.into_iter().map(|h| format!("{base}://{auth}{h}")).collect();
            for n in &nodes {
                n.as_str().into_connection_info().map_err(|e| e.to_string())?;
            }
            Ok(Target::Cluster(nodes))
        }
        _ => Err(format!("unknown scheme \"{scheme}\"")),
    }
}

fn split_creds(s: &str) -> (Option<(&str, &str)>, &str) {
    match s.rsplit_once('@') {
        Some((creds, rest)) => (Some(creds.split_once(':').unwrap_or(("", creds))), rest),
        None => (None, s),
    }
}

fn hosts_of(s: &str) -> Result<Vec<&str>, String> {
    let hosts: Vec<&str> = s.split(',').filter(|h| !h.is_empty()).collect();
    if hosts.is_empty() || hosts.iter().any(|h| h.rsplit_once(':').is_none_or(|(_, p)| p.parse::<u16>().is_err())) {
        return Err("hosts must be host:port[,host:port...]".into());
    }
    Ok(hosts)
}
