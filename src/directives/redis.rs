//! `rl_zone NAME redis=URL ...`: the parameters of a Redis zone, its URL
//! and its certificates, read and checked while nginx reads the
//! configuration (so that `nginx -t` reports them).

use std::fmt;
use std::time::Duration;

use redis::{ClientTlsConfig, IntoConnectionInfo, TlsCertificates};
use rl_core::parse::parse_duration_ms;
use rl_core::spec::Quote;
use rl_core::url::{redact, Kind, RedisUrl};
use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::redis_zone::{self, RedisZone, Target, ZoneSpec};

/// The parameters of a Redis zone besides `redis`.
pub const PARAMS: [&str; 9] = [
    "timeout",
    "on_error",
    "prefix",
    "ssl_trusted_certificate",
    "ssl_certificate",
    "ssl_certificate_key",
    "lease",
    "sync",
    "life",
];

/// The shortest and longest `sync=`: more often than every 10 ms, the
/// syncs of a fleet would cost Redis what its requests do; past 10 s a
/// lease outlives any use of it (and the buckets hold back what the rate
/// refills in its life).
const MIN_SYNC: Duration = Duration::from_millis(10);
const MAX_SYNC: Duration = Duration::from_secs(10);

/// `sync=` of a zone with `lease=` (the default where it is not given);
/// an error where it is given without `lease=`, or out of range.
pub fn sync_param<'a>(get: impl Fn(&str) -> Option<&'a str>) -> Result<Option<Duration>, String> {
    let sync = get("sync");
    if get("lease").is_none() {
        return match sync {
            Some(_) => Err("\"sync\" needs \"lease\"".into()),
            None => Ok(None),
        };
    }
    let Some(v) = sync else { return Ok(Some(crate::lease::DEFAULT_SYNC)) };
    match parse_duration_ms(v).map(Duration::from_millis) {
        Ok(t) if (MIN_SYNC..=MAX_SYNC).contains(&t) => Ok(Some(t)),
        _ => Err(format!("invalid sync \"{}\", it must be from 10ms to 10s", Quote(v))),
    }
}

/// The longest `life=`: a lease must end before its record, idle for a
/// minute, can go.
const MAX_LIFE: Duration = Duration::from_secs(60);

/// `life=` of a zone with `lease=`, `sync` and `timeout` given: from a
/// sync interval and the timeout (the life of every lease where it is not
/// given: a key in steady demand always holds one while the next sync's
/// reply comes); an error where it is given without `lease=`, or out of
/// range.
pub fn life_param<'a>(
    get: impl Fn(&str) -> Option<&'a str>,
    sync: Option<Duration>,
    timeout: Duration,
) -> Result<Option<Duration>, String> {
    let life = get("life");
    let Some(sync) = sync else {
        return match life {
            Some(_) => Err("\"life\" needs \"lease\"".into()),
            None => Ok(None),
        };
    };
    let least = sync.saturating_add(timeout);
    let most = MAX_LIFE.max(least);
    let Some(v) = life else { return Ok(Some(least)) };
    match parse_duration_ms(v).map(Duration::from_millis) {
        Ok(t) if (least..=most).contains(&t) => Ok(Some(t)),
        _ => Err(format!(
            "invalid life \"{}\", it must be from {}ms (sync plus timeout) to {}s",
            Quote(v),
            least.as_millis(),
            most.as_secs()
        )),
    }
}

const DEFAULT_TIMEOUT: Duration = Duration::from_millis(50);
/// The longest `timeout`: a request held longer for a rate-limiting
/// decision is no longer served in any useful sense (nginx's own timeouts
/// for a peer default to 60s), every request of a zone whose Redis froze
/// waits that long before the connection is given up (see
/// `redis_zone::conn`), and a gracefully exiting worker (reload) lives on
/// for as long as its requests may wait. (nginx's timers would allow about
/// 24 days.)
const MAX_TIMEOUT: Duration = Duration::from_secs(60);
const DEFAULT_PREFIX: &str = "rl:";

/// `timeout=` of a Redis or Memcached zone (the default where it is not
/// given); an error if out of range.
pub fn timeout_param(value: Option<&str>) -> Result<Duration, String> {
    let Some(v) = value else { return Ok(DEFAULT_TIMEOUT) };
    match parse_duration_ms(v).map(Duration::from_millis) {
        Ok(t) if !t.is_zero() && t <= MAX_TIMEOUT => Ok(t),
        _ => {
            let max = MAX_TIMEOUT.as_secs();
            Err(format!("invalid timeout \"{}\", it must be from 1ms to {max}s", Quote(v)))
        }
    }
}

/// Builds the zone from `redis=URL` and the other parameters of
/// [`PARAMS`] (`get` returns a parameter's value, each given at most
/// once); relative file names are taken from `conf_prefix`, as nginx does.
/// An error is the message, without the directive.
pub fn parse<'a>(
    name: &str,
    url: &str,
    get: impl Fn(&str) -> Option<&'a str>,
    conf_prefix: &str,
) -> Result<RedisZone, String> {
    let shown = redact(url);
    let invalid = |e: &dyn fmt::Display| format!("invalid redis URL \"{}\": {e}", Quote(&shown));
    let parsed = RedisUrl::parse(url).map_err(|e| invalid(&e))?;
    let timeout = timeout_param(get("timeout"))?;
    let allow = match get("on_error") {
        None | Some("allow") => true,
        Some("deny") => false,
        // (what Redis would decide is decided on this nginx, with its share of each line: see
        // `lease`; what nothing can decide there, an `rl_quota` read, is answered as allow does)
        Some("local") if get("lease").is_some() => true,
        Some("local") => return Err("on_error=local needs \"lease\"".into()),
        Some(v) => {
            return Err(format!("invalid on_error \"{}\", it must be \"allow\", \"deny\" or \"local\"", Quote(v)))
        }
    };
    let prefix = get("prefix").unwrap_or(DEFAULT_PREFIX).to_string();
    let (cert, key) = (get("ssl_certificate"), get("ssl_certificate_key"));
    let client = match (cert, key) {
        (Some(c), Some(k)) => Some((c, k)),
        (Some(c), None) => {
            return Err(format!("no \"ssl_certificate_key\" is defined for certificate \"{}\"", Quote(c)))
        }
        (None, Some(_)) => return Err("\"ssl_certificate_key\" needs \"ssl_certificate\"".into()),
        (None, None) => None,
    };
    let certs = tls_files(&parsed, get("ssl_trusted_certificate"), client, conf_prefix)?;
    // The TLS client every connection of the zone uses, made once (its
    // certificates parsed as a connection uses them).
    let tls = match parsed.tls() {
        true => Some(redis_zone::tls_config(&certs).map_err(|e| e.to_string())?),
        false => None,
    };
    let target = target(&parsed).map_err(|e| invalid(&e))?;
    Ok(RedisZone::new(name, shown, ZoneSpec { target, timeout, prefix, tls }, allow))
}

/// Where the zone connects, in the URLs the redis crate takes (the
/// credentials percent-encoded by [`RedisUrl`], IPv6 hosts in brackets).
fn target(url: &RedisUrl) -> Result<Target, &'static str> {
    let nodes = url.node_urls();
    // The forms RedisUrl accepts are ones the redis crate parses; should it
    // refuse one all the same, say so now rather than at every connection.
    // (Its error is not shown: it could quote the password.)
    if nodes.iter().any(|n| n.as_str().into_connection_info().is_err()) {
        return Err("the Redis client does not accept it");
    }
    Ok(match url.kind() {
        Kind::Single => Target::Single(nodes.into_iter().next().ok_or("no host")?),
        Kind::Sentinel { master } => Target::Sentinel { sentinels: nodes, master: master.clone(), url: url.clone() },
        Kind::Cluster => Target::Cluster(nodes),
    })
}

/// The certificates of a `rediss` zone's `ssl_*` parameters, read and
/// checked now as a connection would use them: the trusted CAs, and the
/// client certificate with a key that matches it.
fn tls_files(
    url: &RedisUrl,
    trusted: Option<&str>,
    client: Option<(&str, &str)>,
    conf_prefix: &str,
) -> Result<Option<TlsCertificates>, String> {
    if trusted.is_none() && client.is_none() {
        return Ok(None);
    }
    if !url.tls() {
        return Err("\"ssl_*\" parameters need a \"rediss\" URL".into());
    }
    let file = |name: &str| File(if name.starts_with('/') { name.to_string() } else { format!("{conf_prefix}{name}") });
    let root_cert = match trusted.map(file) {
        Some(file) => {
            let pem = file.read("trusted certificates")?;
            let bad = |e: &dyn fmt::Display| format!("cannot load trusted certificates \"{file}\": {e}");
            let certs = certificates(&pem).map_err(|e| bad(&e))?;
            if certs.is_empty() {
                return Err(format!("no certificate in \"{file}\" (\"ssl_trusted_certificate\" wants PEM)"));
            }
            let mut store = rustls::RootCertStore::empty();
            for cert in certs {
                store.add(cert).map_err(|_| bad(&"invalid certificate"))?;
            }
            Some(pem)
        }
        None => None,
    };
    let client_tls = match client {
        Some((cert_name, key_name)) => {
            let (cert_file, key_file) = (file(cert_name), file(key_name));
            let cert = cert_file.read("certificate")?;
            let key = key_file.read("certificate key")?;
            let chain = certificates(&cert).map_err(|e| format!("cannot load certificate \"{cert_file}\": {e}"))?;
            if chain.is_empty() {
                return Err(format!("no certificate in \"{cert_file}\" (\"ssl_certificate\" wants PEM)"));
            }
            let der = PrivateKeyDer::from_pem_slice(&key).map_err(|e| match e {
                pem::Error::NoItemsFound => {
                    format!("no private key in \"{key_file}\" (\"ssl_certificate_key\" wants PEM)")
                }
                e => format!("cannot load certificate key \"{key_file}\": {e}"),
            })?;
            let provider = rustls::crypto::ring::default_provider();
            let signer = provider
                .key_provider
                .load_private_key(der)
                .map_err(|e| format!("cannot load certificate key \"{key_file}\": {e}"))?;
            // The key must be the certificate's: rustls compares the key's
            // public half with the certificate's (else every server that
            // asks for the certificate would refuse every connection).
            match rustls::sign::CertifiedKey::new(chain, signer).keys_match() {
                Ok(()) | Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => {}
                Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch)) => {
                    return Err(format!("certificate key \"{key_file}\" does not match certificate \"{cert_file}\""));
                }
                Err(_) => return Err(format!("cannot load certificate \"{cert_file}\": invalid certificate")),
            }
            Some(ClientTlsConfig { client_cert: cert, client_key: key })
        }
        None => None,
    };
    Ok(Some(TlsCertificates { client_tls, root_cert }))
}

/// A file an `ssl_*` parameter names, by its full path; displays as
/// messages quote it.
struct File(String);

impl File {
    fn read(&self, what: &str) -> Result<Vec<u8>, String> {
        std::fs::read(&self.0).map_err(|e| format!("cannot load {what} \"{self}\": {e}"))
    }
}

impl fmt::Display for File {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        Quote(&self.0).fmt(f)
    }
}

/// The certificates of a PEM file, in order.
fn certificates(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, pem::Error> {
    CertificateDer::pem_slice_iter(pem).collect()
}
