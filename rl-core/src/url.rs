//! Redis URLs as `rl_zone NAME redis=URL` takes them: one parser for the
//! three kinds of target (a server, sentinels, a cluster), and [`redact`],
//! which hides the password of any string for messages.
//!
//! # Syntax
//!
//! ```text
//! redis[s]://[CREDENTIALS@]HOST[:PORT][/[DB]]
//! redis[s]+sentinel://[CREDENTIALS@]HOST:PORT[,HOST:PORT...]/MASTER[/[DB]]
//! redis[s]+cluster://[CREDENTIALS@]HOST:PORT[,HOST:PORT...][/]
//! ```
//!
//! `rediss` is TLS. A single server's PORT defaults to [`DEFAULT_PORT`], as
//! in the redis crate; sentinels and cluster nodes are listed with theirs.
//! HOST is a name, an IPv4 address or an IPv6 address in brackets
//! (`[::1]:6379`). DB is a decimal number (default 0).
//!
//! # Credentials
//!
//! CREDENTIALS are `[USER]:PASSWORD`: everything from `://` to the **last**
//! `@`, split at its **first** `:`. So a password may hold `@`, `:`, `/`,
//! `?` and `#` as typed, and [`redact`] hides exactly the span the parser
//! reads as the password: the two cannot disagree. (They once did: the
//! redaction split at the first `@`, the parser at the last, and
//! `redis://u:pre@S3cr3tPw@host` was logged as `redis://u:***@S3cr3tPw@host`.)
//! Every other part (host, port, db, master name) comes after the last `@`,
//! and [`UrlError`]s quote only those parts, so no error holds the password.
//!
//! USER and PASSWORD are percent-decoded as URLs are, and as the redis crate
//! does (`%40` is `@`, `%25` is `%`; a `%` not followed by two hex digits is
//! kept as is); [`RedisUrl::node_urls`] encodes them again for the redis
//! crate. A password needs encoding only for a `%` that two hex digits
//! follow, or for bytes nginx.conf cannot hold.
//!
//! Refused, with a message that reads like nginx's ([`UrlError`]): query
//! strings and fragments (the redis crate would read `?protocol=` and
//! `#insecure` from them; neither is a setting of ours), control characters,
//! a user without a password (the redis crate would silently not
//! authenticate; it is more likely a password without its `:`), a port 0,
//! a negative db.

use std::fmt::{self, Write as _};
use std::net::{Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use crate::parse::parse_number;

/// The port of a single server's URL that names none (the redis crate's).
pub const DEFAULT_PORT: u16 = 6379;

/// The longest host name (a DNS name is at most 253 bytes as text).
pub const MAX_HOST_LEN: usize = 255;

/// What a URL points at.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// `redis://` or `rediss://`: one server.
    Single,
    /// `redis+sentinel://`: the sentinels to ask where the master named
    /// `master` is.
    Sentinel {
        /// The name the sentinels monitor the master under.
        master: String,
    },
    /// `redis+cluster://`: some nodes of a cluster (the client learns the
    /// others from them).
    Cluster,
}

/// A parsed Redis URL; see the [module documentation](self) for its syntax.
///
/// Its `Debug` and `Display` hide the password, so that it can be logged.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct RedisUrl {
    kind: Kind,
    tls: bool,
    hosts: Vec<(String, u16)>,
    username: Option<String>,
    password: Option<String>,
    db: u32,
}

/// Why a URL was refused. Its variants hold only text from after the last
/// `@` of the URL (hosts, ports, db, master name) or the scheme when it is
/// made of scheme characters: never the credentials.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum UrlError {
    /// No `://`.
    NoScheme,
    /// Not one of the six schemes; the scheme when it is printable as one.
    UnknownScheme(Option<String>),
    /// A control character (NUL included) anywhere.
    ControlCharacter,
    /// A `?` after the credentials.
    Query,
    /// A `#` after the credentials.
    Fragment,
    /// Credentials without a password: `user@` or `user:@`.
    NoPassword,
    /// The user (`"user"`) or password (`"password"`) is not UTF-8 once
    /// percent-decoded.
    NotUtf8(&'static str),
    /// Nothing where the hosts go.
    NoHost,
    /// An empty host: `:6379`, or an empty item of a list.
    EmptyHost,
    /// A host longer than [`MAX_HOST_LEN`].
    HostTooLong,
    /// A host with characters other than letters, digits, `-`, `.` and `_`,
    /// or a bracketed host that is not an IPv6 address.
    InvalidHost(String),
    /// `0.0.0.0` or `[::]`: no server to connect to.
    WildcardHost(String),
    /// A sentinel or cluster node without its port.
    NoPort(String),
    /// A port that is not a number from 1 to 65535.
    InvalidPort(String),
    /// A list of hosts in a single server's URL.
    SeveralHosts,
    /// A sentinel URL without the master name.
    NoMaster,
    /// A master name with spaces.
    InvalidMaster(String),
    /// A db that is not a decimal number within `u32`.
    InvalidDb(String),
    /// A path after the nodes of a cluster.
    InvalidPath(String),
}

impl fmt::Display for UrlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UrlError::NoScheme => f.write_str("no scheme"),
            UrlError::UnknownScheme(Some(s)) => write!(f, "unknown scheme \"{s}\""),
            UrlError::UnknownScheme(None) => f.write_str("unknown scheme"),
            UrlError::ControlCharacter => f.write_str("control characters are not allowed"),
            UrlError::Query => f.write_str("query strings are not supported"),
            UrlError::Fragment => f.write_str(
                "\"#\" fragments are not supported (the certificate of a rediss server is always verified: \
                 \"ssl_trusted_certificate\" names a private CA)",
            ),
            UrlError::NoPassword => f.write_str("no password (the credentials are \"[user]:password@\")"),
            UrlError::NotUtf8(what) => write!(f, "the {what} is not valid UTF-8 once percent-decoded"),
            UrlError::NoHost => f.write_str("no host"),
            UrlError::EmptyHost => f.write_str("empty host"),
            UrlError::HostTooLong => f.write_str("host is too long"),
            UrlError::InvalidHost(h) => write!(f, "invalid host \"{h}\""),
            UrlError::WildcardHost(h) => write!(f, "cannot connect to the wildcard address \"{h}\""),
            UrlError::NoPort(h) => write!(f, "no port in \"{h}\""),
            UrlError::InvalidPort(p) => write!(f, "invalid port \"{p}\""),
            UrlError::SeveralHosts => f.write_str("several hosts need \"redis+sentinel://\" or \"redis+cluster://\""),
            UrlError::NoMaster => f.write_str("no master name"),
            UrlError::InvalidMaster(m) => write!(f, "invalid master name \"{m}\""),
            UrlError::InvalidDb(d) => write!(f, "invalid db \"{d}\""),
            UrlError::InvalidPath(p) => write!(f, "invalid path \"{p}\" (a cluster has no db)"),
        }
    }
}

impl std::error::Error for UrlError {}

impl RedisUrl {
    /// Parses a URL of one of the forms of the [module documentation](self).
    pub fn parse(s: &str) -> Result<RedisUrl, UrlError> {
        if s.chars().any(char::is_control) {
            return Err(UrlError::ControlCharacter);
        }
        let (scheme, rest) = s.split_once("://").ok_or(UrlError::NoScheme)?;
        let (form, tls) = match scheme {
            "redis" => (Form::Single, false),
            "rediss" => (Form::Single, true),
            "redis+sentinel" => (Form::Sentinel, false),
            "rediss+sentinel" => (Form::Sentinel, true),
            "redis+cluster" => (Form::Cluster, false),
            "rediss+cluster" => (Form::Cluster, true),
            _ => return Err(UrlError::UnknownScheme(printable_scheme(scheme))),
        };
        let (creds, tail) = match rest.rfind('@') {
            Some(at) => (Some(&rest[..at]), &rest[at + 1..]),
            None => (None, rest),
        };
        if let Some(i) = tail.find(['?', '#']) {
            return Err(if tail[i..].starts_with('#') { UrlError::Fragment } else { UrlError::Query });
        }
        let (username, password) = creds.map_or(Ok((None, None)), credentials)?;
        let (hosts, path) = match tail.split_once('/') {
            Some((h, p)) => (h, Some(p)),
            None => (tail, None),
        };
        if hosts.is_empty() {
            return Err(UrlError::NoHost);
        }
        let (kind, db, hosts) = match form {
            Form::Single => {
                if hosts.contains(',') {
                    return Err(UrlError::SeveralHosts);
                }
                (Kind::Single, db(path.unwrap_or(""))?, vec![host_port(hosts, Some(DEFAULT_PORT))?])
            }
            Form::Sentinel => {
                let path = path.ok_or(UrlError::NoMaster)?;
                let (master, db_text) = path.split_once('/').unwrap_or((path, ""));
                if master.is_empty() {
                    return Err(UrlError::NoMaster);
                }
                if master.contains(char::is_whitespace) {
                    return Err(UrlError::InvalidMaster(master.to_string()));
                }
                (Kind::Sentinel { master: master.to_string() }, db(db_text)?, host_list(hosts)?)
            }
            Form::Cluster => match path {
                None | Some("") => (Kind::Cluster, 0, host_list(hosts)?),
                Some(p) => return Err(UrlError::InvalidPath(format!("/{p}"))),
            },
        };
        Ok(RedisUrl { kind, tls, hosts, username, password, db })
    }

    /// What the URL points at (and for sentinels, the master name).
    pub fn kind(&self) -> &Kind {
        &self.kind
    }

    /// Whether the scheme is `rediss`: TLS to every server, sentinels
    /// included.
    pub fn tls(&self) -> bool {
        self.tls
    }

    /// The hosts as listed, in order, with their ports: the server, the
    /// sentinels, or the cluster nodes. Never empty. IPv6 addresses are
    /// without their brackets, as the redis crate's `ConnectionAddr` wants
    /// them.
    pub fn hosts(&self) -> &[(String, u16)] {
        &self.hosts
    }

    /// The user, percent-decoded; `None` for `:password@` (the `default`
    /// user of Redis ACLs).
    pub fn username(&self) -> Option<&str> {
        self.username.as_deref()
    }

    /// The password, percent-decoded; `None` for a URL without credentials.
    pub fn password(&self) -> Option<&str> {
        self.password.as_deref()
    }

    /// The database to `SELECT`: 0 unless the URL names one (a cluster has
    /// only 0).
    pub fn db(&self) -> u32 {
        self.db
    }

    /// The master name of a sentinel URL.
    pub fn master(&self) -> Option<&str> {
        match &self.kind {
            Kind::Sentinel { master } => Some(master),
            _ => None,
        }
    }

    /// The URL of a data server at `host:port` as the redis crate parses it
    /// (`IntoConnectionInfo`): `redis[s]://[[user]:password@]host:port[/db]`,
    /// with this URL's TLS, credentials (percent-encoded) and db. For the
    /// master a sentinel names, and behind [`node_urls`](Self::node_urls).
    pub fn url_for(&self, host: &str, port: u16) -> String {
        let mut url = self.bare_url(host, port);
        if let Some(password) = &self.password {
            let mut creds = String::new();
            if let Some(user) = &self.username {
                percent_encode(user, &mut creds);
            }
            creds.push(':');
            percent_encode(password, &mut creds);
            creds.push('@');
            let at = url.find("://").map_or(0, |i| i + 3);
            url.insert_str(at, &creds);
        }
        if self.db != 0 {
            let _ = write!(url, "/{}", self.db);
        }
        url
    }

    /// One URL per listed host, for the redis crate: the server's
    /// ([`url_for`](Self::url_for)), or the cluster nodes' (each a
    /// `redis[s]://` URL with the credentials), or the sentinels'. The
    /// sentinels' URLs have neither credentials nor db (`redis[s]://host:port`):
    /// those are the master's, see [`url_for`](Self::url_for).
    pub fn node_urls(&self) -> Vec<String> {
        let sentinel = matches!(self.kind, Kind::Sentinel { .. });
        self.hosts.iter().map(|(h, p)| if sentinel { self.bare_url(h, *p) } else { self.url_for(h, *p) }).collect()
    }

    /// `redis[s]://host:port`, with an IPv6 address in brackets.
    fn bare_url(&self, host: &str, port: u16) -> String {
        let scheme = if self.tls { "rediss" } else { "redis" };
        if host.contains(':') {
            format!("{scheme}://[{host}]:{port}")
        } else {
            format!("{scheme}://{host}:{port}")
        }
    }

    /// The scheme as written in URLs.
    fn scheme(&self) -> &'static str {
        match (&self.kind, self.tls) {
            (Kind::Single, false) => "redis",
            (Kind::Single, true) => "rediss",
            (Kind::Sentinel { .. }, false) => "redis+sentinel",
            (Kind::Sentinel { .. }, true) => "rediss+sentinel",
            (Kind::Cluster, false) => "redis+cluster",
            (Kind::Cluster, true) => "rediss+cluster",
        }
    }
}

impl FromStr for RedisUrl {
    type Err = UrlError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        RedisUrl::parse(s)
    }
}

impl fmt::Display for RedisUrl {
    /// The URL in its canonical form, with the password as `***`: e.g.
    /// `redis+sentinel://u:***@h1:26379,h2:26379/mymaster/2`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://", self.scheme())?;
        if self.password.is_some() {
            let mut user = String::new();
            percent_encode(self.username.as_deref().unwrap_or(""), &mut user);
            write!(f, "{user}:***@")?;
        }
        for (i, (host, port)) in self.hosts.iter().enumerate() {
            let sep = if i == 0 { "" } else { "," };
            if host.contains(':') {
                write!(f, "{sep}[{host}]:{port}")?;
            } else {
                write!(f, "{sep}{host}:{port}")?;
            }
        }
        if let Kind::Sentinel { master } = &self.kind {
            write!(f, "/{master}")?;
        }
        if self.db != 0 {
            write!(f, "/{}", self.db)?;
        }
        Ok(())
    }
}

impl fmt::Debug for RedisUrl {
    /// Every field, but the password as `"***"`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisUrl")
            .field("kind", &self.kind)
            .field("tls", &self.tls)
            .field("hosts", &self.hosts)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("db", &self.db)
            .finish()
    }
}

/// Replaces the password of `scheme://user:password@host...` with `***`, in
/// any string, URL or not (so that a message about a bad URL can show it).
///
/// The credentials are what the parser reads as such: from the first `://`
/// (or the start of the string, when it has none before its last `@`) to
/// the last `@`; the password runs from their first `:`. Credentials
/// without a `:` are hidden whole (`redis://***@host`): the parser refuses
/// them, and they are more likely a password missing its `:` than a user.
/// A string without `@`, or with nothing after the `:`, is returned as is.
pub fn redact(s: &str) -> String {
    let Some(at) = s.rfind('@') else {
        return s.to_string();
    };
    let start = s.find("://").map(|i| i + 3).filter(|&i| i <= at).unwrap_or(0);
    let hide_from = s[start..at].find(':').map_or(start, |c| start + c + 1);
    if hide_from == at {
        return s.to_string();
    }
    format!("{}***{}", &s[..hide_from], &s[at..])
}

/// The three URL forms.
#[derive(Clone, Copy)]
enum Form {
    Single,
    Sentinel,
    Cluster,
}

/// The scheme, for [`UrlError::UnknownScheme`], if it is made of the
/// characters of a scheme (so it cannot be a piece of credentials).
fn printable_scheme(scheme: &str) -> Option<String> {
    let ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.');
    (!scheme.is_empty() && scheme.len() <= 32 && scheme.chars().all(ok)).then(|| scheme.to_string())
}

/// Splits `[user]:password` at the first `:` and percent-decodes both.
/// Empty credentials (`@`, `:@`) are none.
fn credentials(creds: &str) -> Result<(Option<String>, Option<String>), UrlError> {
    let (user, password) = match creds.split_once(':') {
        Some(split) => split,
        None if creds.is_empty() => return Ok((None, None)),
        None => return Err(UrlError::NoPassword),
    };
    if password.is_empty() {
        return if user.is_empty() { Ok((None, None)) } else { Err(UrlError::NoPassword) };
    }
    let user = match user {
        "" => None,
        u => Some(percent_decode(u).ok_or(UrlError::NotUtf8("user"))?),
    };
    let password = percent_decode(password).ok_or(UrlError::NotUtf8("password"))?;
    Ok((user, Some(password)))
}

/// `host:port[,host:port...]`, every port given.
fn host_list(s: &str) -> Result<Vec<(String, u16)>, UrlError> {
    s.split(',').map(|h| host_port(h, None)).collect()
}

/// `host[:port]` or `[ipv6][:port]`; the port is `default` when missing
/// (an error if `None`).
fn host_port(s: &str, default: Option<u16>) -> Result<(String, u16), UrlError> {
    let (host, port) = match s.strip_prefix('[') {
        Some(bracketed) => {
            let (inner, after) = bracketed.split_once(']').ok_or_else(|| UrlError::InvalidHost(shorten(s)))?;
            if inner.len() > MAX_HOST_LEN {
                return Err(UrlError::HostTooLong);
            }
            let ip: Ipv6Addr = inner.parse().map_err(|_| UrlError::InvalidHost(shorten(s)))?;
            if ip.is_unspecified() {
                return Err(UrlError::WildcardHost(format!("[{inner}]")));
            }
            let port = match after {
                "" => None,
                a => Some(a.strip_prefix(':').ok_or_else(|| UrlError::InvalidHost(shorten(s)))?),
            };
            (inner, port)
        }
        None => {
            let (host, port) = match s.split_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (s, None),
            };
            if host.is_empty() {
                return Err(UrlError::EmptyHost);
            }
            if host.len() > MAX_HOST_LEN {
                return Err(UrlError::HostTooLong);
            }
            if !host.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_')) {
                return Err(UrlError::InvalidHost(host.to_string()));
            }
            if host.parse::<Ipv4Addr>().is_ok_and(|ip| ip.is_unspecified()) {
                return Err(UrlError::WildcardHost(host.to_string()));
            }
            (host, port)
        }
    };
    let port = match port {
        Some(p) => parse_number(p)
            .ok()
            .and_then(|n| u16::try_from(n).ok())
            .filter(|&n| n != 0)
            .ok_or_else(|| UrlError::InvalidPort(shorten(p)))?,
        None => default.ok_or_else(|| UrlError::NoPort(shorten(s)))?,
    };
    Ok((host.to_string(), port))
}

/// A db: empty (0) or decimal digits within `u32`.
fn db(s: &str) -> Result<u32, UrlError> {
    if s.is_empty() {
        return Ok(0);
    }
    parse_number(s).ok().and_then(|n| u32::try_from(n).ok()).ok_or_else(|| UrlError::InvalidDb(shorten(s)))
}

/// Quoted text for an error, cut after [`MAX_HOST_LEN`] bytes (at a
/// character boundary) with `...`.
fn shorten(s: &str) -> String {
    if s.len() <= MAX_HOST_LEN {
        return s.to_string();
    }
    let mut end = MAX_HOST_LEN;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}

/// URL percent-decoding: `%` and two hex digits is that byte; any other
/// `%` is itself. `None` if the bytes are not UTF-8.
fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |j: usize| b.get(j).and_then(|c| (*c as char).to_digit(16));
        match (b[i], hex(i + 1), hex(i + 2)) {
            (b'%', Some(hi), Some(lo)) => {
                out.push((hi * 16 + lo) as u8);
                i += 3;
            }
            (c, _, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// Percent-encodes every byte but the URL's unreserved characters
/// (`A-Z a-z 0-9 - . _ ~`): the url crate leaves such text as it is, and
/// the redis crate decodes it back to `s`.
fn percent_encode(s: &str, out: &mut String) {
    for c in s.bytes() {
        if c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_' | b'~') {
            out.push(c as char);
        } else {
            let _ = write!(out, "%{c:02X}");
        }
    }
}
