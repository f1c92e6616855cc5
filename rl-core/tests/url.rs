//! Redis URLs: every accepted form and every refusal, the redaction of
//! passwords, and properties over generated credentials and hosts.

use std::net::{Ipv4Addr, Ipv6Addr};

use proptest::prelude::*;
use rl_core::url::{redact, Kind, RedisUrl, UrlError};

/// What a test expects of a parsed URL.
#[derive(Debug, PartialEq)]
struct Parts<'a> {
    kind: Kind,
    tls: bool,
    hosts: Vec<(&'a str, u16)>,
    username: Option<&'a str>,
    password: Option<&'a str>,
    db: u32,
}

fn parts(u: &RedisUrl) -> Parts<'_> {
    Parts {
        kind: u.kind().clone(),
        tls: u.tls(),
        hosts: u.hosts().iter().map(|(h, p)| (h.as_str(), *p)).collect(),
        username: u.username(),
        password: u.password(),
        db: u.db(),
    }
}

fn sentinel(master: &str) -> Kind {
    Kind::Sentinel { master: master.to_string() }
}

#[test]
fn accepted_forms() {
    let none: Option<&str> = None;
    let cases: Vec<(&str, Parts)> = vec![
        (
            "redis://127.0.0.1",
            Parts {
                kind: Kind::Single,
                tls: false,
                hosts: vec![("127.0.0.1", 6379)],
                username: none,
                password: none,
                db: 0,
            },
        ),
        (
            "redis://cache.example.com:6380/3",
            Parts {
                kind: Kind::Single,
                tls: false,
                hosts: vec![("cache.example.com", 6380)],
                username: none,
                password: none,
                db: 3,
            },
        ),
        (
            "redis://h_1/",
            Parts { kind: Kind::Single, tls: false, hosts: vec![("h_1", 6379)], username: none, password: none, db: 0 },
        ),
        (
            "rediss://u:p@h:1/2",
            Parts {
                kind: Kind::Single,
                tls: true,
                hosts: vec![("h", 1)],
                username: Some("u"),
                password: Some("p"),
                db: 2,
            },
        ),
        (
            "redis://:p@h:65535/4294967295",
            Parts {
                kind: Kind::Single,
                tls: false,
                hosts: vec![("h", 65535)],
                username: none,
                password: Some("p"),
                db: u32::MAX,
            },
        ),
        (
            "redis://@h",
            Parts { kind: Kind::Single, tls: false, hosts: vec![("h", 6379)], username: none, password: none, db: 0 },
        ),
        (
            "redis://:@h",
            Parts { kind: Kind::Single, tls: false, hosts: vec![("h", 6379)], username: none, password: none, db: 0 },
        ),
        (
            "redis://[::1]:6379",
            Parts { kind: Kind::Single, tls: false, hosts: vec![("::1", 6379)], username: none, password: none, db: 0 },
        ),
        (
            "redis://[::1]",
            Parts { kind: Kind::Single, tls: false, hosts: vec![("::1", 6379)], username: none, password: none, db: 0 },
        ),
        (
            "rediss://u:p@[2001:db8::1]:7000/1",
            Parts {
                kind: Kind::Single,
                tls: true,
                hosts: vec![("2001:db8::1", 7000)],
                username: Some("u"),
                password: Some("p"),
                db: 1,
            },
        ),
        // The leak of old: the credentials run to the last `@`.
        (
            "redis://u:pre@S3cr3tPw@host:6379",
            Parts {
                kind: Kind::Single,
                tls: false,
                hosts: vec![("host", 6379)],
                username: Some("u"),
                password: Some("pre@S3cr3tPw"),
                db: 0,
            },
        ),
        // A password holds `: / ? #` as typed.
        (
            "redis://u:a/b?c#d:e@h:1/5",
            Parts {
                kind: Kind::Single,
                tls: false,
                hosts: vec![("h", 1)],
                username: Some("u"),
                password: Some("a/b?c#d:e"),
                db: 5,
            },
        ),
        // Percent-decoding; a `%` without two hex digits is itself.
        (
            "redis://us%40er:p%40ss%25%3a@h",
            Parts {
                kind: Kind::Single,
                tls: false,
                hosts: vec![("h", 6379)],
                username: Some("us@er"),
                password: Some("p@ss%:"),
                db: 0,
            },
        ),
        (
            "redis://:50%off%zz%4@h",
            Parts {
                kind: Kind::Single,
                tls: false,
                hosts: vec![("h", 6379)],
                username: none,
                password: Some("50%off%zz%4"),
                db: 0,
            },
        ),
        (
            "redis://ü:pässwörd€@h",
            Parts {
                kind: Kind::Single,
                tls: false,
                hosts: vec![("h", 6379)],
                username: Some("ü"),
                password: Some("pässwörd€"),
                db: 0,
            },
        ),
        (
            "redis+sentinel://s1:26379,s2:26380/mymaster",
            Parts {
                kind: sentinel("mymaster"),
                tls: false,
                hosts: vec![("s1", 26379), ("s2", 26380)],
                username: none,
                password: none,
                db: 0,
            },
        ),
        (
            "redis+sentinel://s1:26379/mymaster/",
            Parts {
                kind: sentinel("mymaster"),
                tls: false,
                hosts: vec![("s1", 26379)],
                username: none,
                password: none,
                db: 0,
            },
        ),
        (
            "rediss+sentinel://u:p@w@s1:26379,[::1]:26380/my-master.1/7",
            Parts {
                kind: sentinel("my-master.1"),
                tls: true,
                hosts: vec![("s1", 26379), ("::1", 26380)],
                username: Some("u"),
                password: Some("p@w"),
                db: 7,
            },
        ),
        (
            "redis+cluster://n1:7000,n2:7001,10.0.0.3:7002",
            Parts {
                kind: Kind::Cluster,
                tls: false,
                hosts: vec![("n1", 7000), ("n2", 7001), ("10.0.0.3", 7002)],
                username: none,
                password: none,
                db: 0,
            },
        ),
        (
            "rediss+cluster://:pw@n1:7000/",
            Parts {
                kind: Kind::Cluster,
                tls: true,
                hosts: vec![("n1", 7000)],
                username: none,
                password: Some("pw"),
                db: 0,
            },
        ),
    ];
    for (url, want) in cases {
        let u = RedisUrl::parse(url).unwrap_or_else(|e| panic!("{url}: {e}"));
        assert_eq!(parts(&u), want, "{url}");
        assert_eq!(url.parse::<RedisUrl>().as_ref(), Ok(&u), "{url}");
        let master = match &want.kind {
            Kind::Sentinel { master } => Some(master.as_str()),
            _ => None,
        };
        assert_eq!(u.master(), master, "{url}");
    }
}

#[test]
fn refusals() {
    let long = format!("redis://{}:1", "h".repeat(256));
    let fragment = "\"#\" fragments are not supported (the certificate of a rediss server is always verified: \
                    \"ssl_trusted_certificate\" names a private CA)";
    let cases: Vec<(&str, UrlError, &str)> = vec![
        ("redis://h:0", UrlError::InvalidPort("0".into()), "invalid port \"0\""),
        ("redis://h:x", UrlError::InvalidPort("x".into()), "invalid port \"x\""),
        ("redis://h:65536", UrlError::InvalidPort("65536".into()), "invalid port \"65536\""),
        ("redis://h:", UrlError::InvalidPort("".into()), "invalid port \"\""),
        ("redis://h:+1", UrlError::InvalidPort("+1".into()), "invalid port \"+1\""),
        ("redis://[::1]:0", UrlError::InvalidPort("0".into()), "invalid port \"0\""),
        ("redis+cluster://a:1,b:0", UrlError::InvalidPort("0".into()), "invalid port \"0\""),
        ("redis://h/-1", UrlError::InvalidDb("-1".into()), "invalid db \"-1\""),
        ("redis://h/x", UrlError::InvalidDb("x".into()), "invalid db \"x\""),
        ("redis://h/+1", UrlError::InvalidDb("+1".into()), "invalid db \"+1\""),
        ("redis://h/0/1", UrlError::InvalidDb("0/1".into()), "invalid db \"0/1\""),
        ("redis://h/4294967296", UrlError::InvalidDb("4294967296".into()), "invalid db \"4294967296\""),
        ("redis+sentinel://s:1/m/-1", UrlError::InvalidDb("-1".into()), "invalid db \"-1\""),
        ("redis://:6379", UrlError::EmptyHost, "empty host"),
        ("redis://u:p@:6379", UrlError::EmptyHost, "empty host"),
        ("redis+cluster://a:1,,b:2", UrlError::EmptyHost, "empty host"),
        ("redis+cluster://a:1,", UrlError::EmptyHost, "empty host"),
        ("redis://", UrlError::NoHost, "no host"),
        ("redis://u:p@", UrlError::NoHost, "no host"),
        ("redis:///0", UrlError::NoHost, "no host"),
        ("redis+cluster://", UrlError::NoHost, "no host"),
        ("redis+sentinel:///m", UrlError::NoHost, "no host"),
        ("redis://h?protocol=resp3", UrlError::Query, "query strings are not supported"),
        ("redis://h:1/0?x", UrlError::Query, "query strings are not supported"),
        ("redis://u:p@h/?", UrlError::Query, "query strings are not supported"),
        ("rediss://h:6379/#insecure", UrlError::Fragment, fragment),
        ("rediss://u:p@h#insecure", UrlError::Fragment, fragment),
        ("redis://h\0", UrlError::ControlCharacter, "control characters are not allowed"),
        ("redis://u:p\0w@h", UrlError::ControlCharacter, "control characters are not allowed"),
        ("redis://h\t:1", UrlError::ControlCharacter, "control characters are not allowed"),
        ("redis://h\u{7f}", UrlError::ControlCharacter, "control characters are not allowed"),
        ("redis://h\u{85}", UrlError::ControlCharacter, "control characters are not allowed"),
        (&long, UrlError::HostTooLong, "host is too long"),
        ("redis+sentinel://s:1", UrlError::NoMaster, "no master name"),
        ("redis+sentinel://s:1/", UrlError::NoMaster, "no master name"),
        ("redis+sentinel://s:1//0", UrlError::NoMaster, "no master name"),
        ("redis+sentinel://s:1/m m", UrlError::InvalidMaster("m m".into()), "invalid master name \"m m\""),
        ("x://h", UrlError::UnknownScheme(Some("x".into())), "unknown scheme \"x\""),
        ("REDIS://h", UrlError::UnknownScheme(Some("REDIS".into())), "unknown scheme \"REDIS\""),
        ("valkey://h", UrlError::UnknownScheme(Some("valkey".into())), "unknown scheme \"valkey\""),
        (
            "redis+unix:///tmp/r.sock",
            UrlError::UnknownScheme(Some("redis+unix".into())),
            "unknown scheme \"redis+unix\"",
        ),
        ("u:s3cret@h://x", UrlError::UnknownScheme(None), "unknown scheme"),
        ("h:6379", UrlError::NoScheme, "no scheme"),
        ("redis:/h", UrlError::NoScheme, "no scheme"),
        ("redis+sentinel://s/m", UrlError::NoPort("s".into()), "no port in \"s\""),
        ("redis+cluster://a:1,[::1]", UrlError::NoPort("[::1]".into()), "no port in \"[::1]\""),
        ("redis://a:1,b:2", UrlError::SeveralHosts, "several hosts need \"redis+sentinel://\" or \"redis+cluster://\""),
        ("redis://s3cret@h", UrlError::NoPassword, "no password (the credentials are \"[user]:password@\")"),
        ("redis://u:@h", UrlError::NoPassword, "no password (the credentials are \"[user]:password@\")"),
        ("redis://%ff:p@h", UrlError::NotUtf8("user"), "the user is not valid UTF-8 once percent-decoded"),
        ("redis://u:%c3%28@h", UrlError::NotUtf8("password"), "the password is not valid UTF-8 once percent-decoded"),
        ("redis://h h", UrlError::InvalidHost("h h".into()), "invalid host \"h h\""),
        ("redis://hé:1", UrlError::InvalidHost("hé".into()), "invalid host \"hé\""),
        ("redis://[::1", UrlError::InvalidHost("[::1".into()), "invalid host \"[::1\""),
        ("redis://[zz]:1", UrlError::InvalidHost("[zz]:1".into()), "invalid host \"[zz]:1\""),
        ("redis://[::1]x", UrlError::InvalidHost("[::1]x".into()), "invalid host \"[::1]x\""),
        ("redis://::1:6379", UrlError::EmptyHost, "empty host"),
        (
            "redis://0.0.0.0",
            UrlError::WildcardHost("0.0.0.0".into()),
            "cannot connect to the wildcard address \"0.0.0.0\"",
        ),
        ("redis://[::]:1", UrlError::WildcardHost("[::]".into()), "cannot connect to the wildcard address \"[::]\""),
        ("redis+cluster://a:1/0", UrlError::InvalidPath("/0".into()), "invalid path \"/0\" (a cluster has no db)"),
    ];
    for (url, err, text) in cases {
        let got = RedisUrl::parse(url).expect_err(url);
        assert_eq!(got, err, "{url:?}");
        assert_eq!(got.to_string(), text, "{url:?}");
    }
}

/// Errors about URLs with credentials quote none of them.
#[test]
fn refusals_hide_the_password() {
    for url in [
        "redis://u:S3cr3tPw@h:0",
        "redis://u:S3cr3tPw@h/-1",
        "redis://u:S3cr3tPw@h h",
        "redis://u:pre@S3cr3tPw@h:x",
        "redis+sentinel://u:S3cr3tPw@s:1",
        "redis+cluster://u:S3cr3tPw@a:1,b",
        "redis://S3cr3tPw@h",
        "redis://u:S3cr3tPw@",
        "redis://u:S3cr3tPw:1@h?x",
        "redis://u:S3cr3tPw/x@:1",
        "u:S3cr3tPw@h://x",
        "u:S3cr3tPw@h",
    ] {
        let e = RedisUrl::parse(url).expect_err(url).to_string();
        assert!(!e.contains("S3cr3tPw"), "{url}: {e}");
        let shown = redact(url);
        // The scheme is not a password, even when it is this one.
        if !url.starts_with("S3cr3tPw") {
            assert!(!shown.contains("S3cr3tPw"), "{url}: {shown}");
        }
    }
}

#[test]
fn redaction() {
    let cases = [
        // The leak of old: the first `@` ended the credentials.
        ("redis://u:pre@S3cr3tPw@host:6379", "redis://u:***@host:6379"),
        ("redis://u:p@h:1/2", "redis://u:***@h:1/2"),
        ("rediss://:p@h", "rediss://:***@h"),
        ("redis+sentinel://u:p@s:1,s:2/m/1", "redis+sentinel://u:***@s:1,s:2/m/1"),
        ("redis+cluster://u:a:b/c?d#e@n:1", "redis+cluster://u:***@n:1"),
        ("redis://u:p%40ss@h", "redis://u:***@h"),
        ("redis://ü:pässwörd@h", "redis://ü:***@h"),
        // No password: as is.
        ("redis://h:6379/0", "redis://h:6379/0"),
        ("redis://u:@h", "redis://u:@h"),
        ("redis://@h", "redis://@h"),
        ("redis://[::1]:6379", "redis://[::1]:6379"),
        // Credentials without `:` are likely a password.
        ("redis://S3cr3t@h", "redis://***@h"),
        // Not URLs, or bad ones.
        ("u:s3cret@h:6379", "u:***@h:6379"),
        ("redis:/u:s3cret@h", "redis:***@h"),
        ("u:s3cret@h://x", "u:***@h://x"),
        ("redis://u:s3cret@h:0", "redis://u:***@h:0"),
        ("redis://u:s3cret@", "redis://u:***@"),
        ("reddis=redis://u:s3cret@h", "reddis=redis://u:***@h"),
        ("no credentials at all", "no credentials at all"),
        ("", ""),
        ("@", "@"),
        (":@", ":@"),
        ("x@", "***@"),
    ];
    for (s, want) in cases {
        assert_eq!(redact(s), want, "{s:?}");
        assert_eq!(redact(want), want, "{want:?}");
    }
    let leak = redact("redis://u:pre@S3cr3tPw@host:6379");
    assert!(!leak.contains("pre@S3cr3tPw") && !leak.contains("S3cr3tPw"), "{leak}");
}

#[test]
fn display_and_debug_hide_the_password() {
    for (url, shown) in [
        ("redis://u:S3cr3tPw@h", "redis://u:***@h:6379"),
        ("rediss://:S3cr3tPw@[::1]/2", "rediss://:***@[::1]:6379/2"),
        ("redis+sentinel://u%3a1:S3cr3tPw@s:1,s:2/m/3", "redis+sentinel://u%3A1:***@s:1,s:2/m/3"),
        ("rediss+cluster://h:1,h:2/", "rediss+cluster://h:1,h:2"),
    ] {
        let u = RedisUrl::parse(url).unwrap();
        assert_eq!(u.to_string(), shown);
        assert_eq!(RedisUrl::parse(&u.to_string().replace("***", "S3cr3tPw")), Ok(u.clone()));
        let debug = format!("{u:?}");
        assert!(!debug.contains("S3cr3tPw"), "{debug}");
        assert!(u.password().is_none() || debug.contains("\"***\""), "{debug}");
    }
}

#[test]
fn urls_for_the_redis_crate() {
    let u = RedisUrl::parse("rediss://us@r:p@ss:w/rd%@h:1/2").unwrap();
    assert_eq!(u.password(), Some("p@ss:w/rd%"));
    assert_eq!(u.node_urls(), ["rediss://us%40r:p%40ss%3Aw%2Frd%25@h:1/2"]);
    assert_eq!(u.url_for("::1", 7), "rediss://us%40r:p%40ss%3Aw%2Frd%25@[::1]:7/2");

    let u = RedisUrl::parse("redis://h").unwrap();
    assert_eq!(u.node_urls(), ["redis://h:6379"]);

    let u = RedisUrl::parse("redis://:pw@[::1]").unwrap();
    assert_eq!(u.node_urls(), ["redis://:pw@[::1]:6379"]);

    let u = RedisUrl::parse("rediss+cluster://u:pw@a:1,[::1]:2").unwrap();
    assert_eq!(u.node_urls(), ["rediss://u:pw@a:1", "rediss://u:pw@[::1]:2"]);

    // Sentinels get neither the credentials nor the db: those are the master's.
    let u = RedisUrl::parse("redis+sentinel://u:pw@s1:26379,[::1]:26380/m/3").unwrap();
    assert_eq!(u.node_urls(), ["redis://s1:26379", "redis://[::1]:26380"]);
    assert_eq!(u.url_for("10.0.0.9", 6379), "redis://u:pw@10.0.0.9:6379/3");
    assert_eq!(u.master(), Some("m"));
}

// ---- properties --------------------------------------------------------

/// Percent-encodes `c` (its UTF-8 bytes).
fn push_encoded(c: char, out: &mut String) {
    let mut buf = [0; 4];
    for b in c.encode_utf8(&mut buf).bytes() {
        out.push_str(&format!("%{b:02X}"));
    }
}

/// `s` with the characters `mask` picks (cycling), every `%` and the
/// characters of `always` percent-encoded: one of the ways a person may
/// write it in a URL.
fn encode_some(s: &str, mask: &[bool], always: &[char]) -> String {
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if c == '%' || always.contains(&c) || mask.get(i % mask.len().max(1)).copied().unwrap_or(false) {
            push_encoded(c, &mut out);
        } else {
            out.push(c);
        }
    }
    out
}

/// A host as the URL writes it and as the parser returns it.
fn host() -> impl Strategy<Value = (String, String)> {
    prop_oneof![
        "[a-z][a-z0-9_-]{0,10}(\\.[a-z0-9-]{1,10}){0,2}".prop_map(|h| (h.clone(), h)),
        (1u8..=255, any::<u8>(), any::<u8>(), any::<u8>()).prop_map(|(a, b, c, d)| {
            let h = Ipv4Addr::new(a, b, c, d).to_string();
            (h.clone(), h)
        }),
        any::<u128>().prop_filter("not ::", |&x| x != 0).prop_map(|x| {
            let h = Ipv6Addr::from(x).to_string();
            (format!("[{h}]"), h)
        }),
    ]
}

/// Hosts as written and as parsed, with their ports.
type Hosts = Vec<((String, String), u16)>;

/// A URL's form: kind, tls, hosts, and db.
fn target() -> impl Strategy<Value = (Kind, bool, Hosts, u32)> {
    let hosts = |n| proptest::collection::vec((host(), 1u16..=65535), 1..=n);
    let db = prop_oneof![Just(0u32), any::<u32>()];
    prop_oneof![
        (any::<bool>(), hosts(1), db.clone()).prop_map(|(tls, h, db)| (Kind::Single, tls, h, db)),
        ("[A-Za-z0-9_.-]{1,12}", any::<bool>(), hosts(4), db).prop_map(|(m, tls, h, db)| (
            Kind::Sentinel { master: m },
            tls,
            h,
            db
        )),
        (any::<bool>(), hosts(4)).prop_map(|(tls, h)| (Kind::Cluster, tls, h, 0)),
    ]
}

/// The URL's text after the credentials' `@` (and its scheme).
fn tail_of(kind: &Kind, tls: bool, hosts: &[((String, String), u16)], db: u32, trailing: bool) -> (String, String) {
    let s = if tls { "s" } else { "" };
    let scheme = match kind {
        Kind::Single => format!("redis{s}"),
        Kind::Sentinel { .. } => format!("redis{s}+sentinel"),
        Kind::Cluster => format!("redis{s}+cluster"),
    };
    let list: Vec<String> = hosts.iter().map(|((h, _), p)| format!("{h}:{p}")).collect();
    let mut tail = list.join(",");
    if let Kind::Sentinel { master } = kind {
        tail.push('/');
        tail.push_str(master);
    }
    if db != 0 {
        tail.push_str(&format!("/{db}"));
    } else if trailing {
        tail.push('/');
    }
    (scheme, tail)
}

/// Pieces of URLs, for strings that are often nearly URLs.
const TOKENS: &[&str] = &[
    "redis://",
    "rediss+sentinel://",
    "redis+cluster://",
    "://",
    "u",
    ":",
    "@",
    "pw",
    "%40",
    "%",
    "h",
    ":6379",
    ":0",
    "[::1]",
    "/",
    "/2",
    "/m",
    ",",
    "?",
    "#",
    "-1",
];

/// Starts of URLs.
const SCHEMES: &[&str] = &["redis://", "rediss://", "rediss+sentinel://", "redis+cluster://"];

/// Ends of URLs.
const HOSTS: &[&str] = &["h", "h:1", "[::1]:2/3", "a:1,b:2", "a:1,b:2/m/4", "h/", "h:1,"];

/// Users: printable, non-ASCII too; a `:` only encoded.
const USER: &str = "[ -~é€]{0,12}";
/// Passwords: printable ASCII (`@ : / ? # %` included) and some non-ASCII.
const PASSWORD: &str = "[ -~é€]{4,20}";

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Any credentials and target round-trip, whatever the user encodes;
    /// the redaction shows the URL but the password; the node URLs carry
    /// the credentials back.
    #[test]
    fn round_trip(
        user in USER,
        password in PASSWORD,
        user_mask in proptest::collection::vec(any::<bool>(), 1..8),
        pw_mask in proptest::collection::vec(prop::bool::weighted(0.2), 1..8),
        (kind, tls, hosts, db) in target(),
        trailing in any::<bool>(),
    ) {
        let user_enc = encode_some(&user, &user_mask, &[':']);
        let pw_enc = encode_some(&password, &pw_mask, &[]);
        let (scheme, tail) = tail_of(&kind, tls, &hosts, db, trailing);
        let url = format!("{scheme}://{user_enc}:{pw_enc}@{tail}");

        let u = RedisUrl::parse(&url).map_err(|e| TestCaseError::fail(format!("{url}: {e}")))?;
        prop_assert_eq!(u.kind(), &kind);
        prop_assert_eq!(u.tls(), tls);
        let want: Vec<(String, u16)> = hosts.iter().map(|((_, h), p)| (h.clone(), *p)).collect();
        prop_assert_eq!(u.hosts(), &want[..]);
        prop_assert_eq!(u.username(), (!user.is_empty()).then_some(user.as_str()));
        prop_assert_eq!(u.password(), Some(password.as_str()));
        prop_assert_eq!(u.db(), db);

        let redacted = format!("{scheme}://{user_enc}:***@{tail}");
        prop_assert_eq!(redact(&url), redacted.clone());
        // A password that the rest of the URL holds anyway cannot leak.
        prop_assume!(!redacted.contains(&password) && !redacted.contains(&pw_enc));
        prop_assert!(!redact(&url).contains(&password));
        prop_assert!(!redact(&url).contains(&pw_enc));
        let shown = u.to_string();
        prop_assume!(!shown.replace(":***@", ":@").contains(&password));
        prop_assert!(!shown.contains(&password), "{}", shown);
        let debug = format!("{u:?}");
        prop_assert!(!debug.contains(&password));

        for (node, (host, port)) in u.node_urls().iter().zip(u.hosts()) {
            let n = RedisUrl::parse(node).map_err(|e| TestCaseError::fail(format!("{node}: {e}")))?;
            prop_assert_eq!(n.kind(), &Kind::Single);
            prop_assert_eq!(n.tls(), tls);
            prop_assert_eq!(n.hosts(), &[(host.clone(), *port)][..]);
            if matches!(kind, Kind::Sentinel { .. }) {
                prop_assert_eq!((n.username(), n.password(), n.db()), (None, None, 0));
            } else {
                prop_assert_eq!(n.username(), u.username());
                prop_assert_eq!(n.password(), u.password());
                prop_assert_eq!(n.db(), db);
            }
        }
    }

    /// After the credentials, anything (but an `@`): a refusal quotes none
    /// of the password, nor does the redaction.
    #[test]
    fn errors_hide_the_password(
        user in USER,
        password in PASSWORD,
        pw_mask in proptest::collection::vec(prop::bool::weighted(0.2), 1..8),
        scheme in prop_oneof![
            Just("redis"), Just("rediss"), Just("redis+sentinel"), Just("rediss+cluster"), Just("x"), Just("redis:/"),
        ],
        tail in "[ -?A-~é]{0,30}",
    ) {
        let user_enc = encode_some(&user, &[false], &[':']);
        let pw_enc = encode_some(&password, &pw_mask, &[]);
        let url = format!("{scheme}://{user_enc}:{pw_enc}@{tail}");
        let shown = redact(&url);
        let redacted = format!("{scheme}://{user_enc}:***@{tail}");
        prop_assert_eq!(&shown, &redacted);
        // A password that the rest of the URL holds anyway cannot leak.
        if !redacted.contains(&password) && !redacted.contains(&pw_enc) {
            prop_assert!(!shown.contains(&password) && !shown.contains(&pw_enc));
        }
        if let Err(e) = RedisUrl::parse(&url) {
            let e = e.to_string();
            // Errors may quote the scheme and the tail, and only them.
            let quotable = format!("{scheme} {tail}");
            if !quotable.contains(&password) && !quotable.contains(&pw_enc) {
                prop_assert!(!e.contains(&password), "{}: {}", url, e);
                prop_assert!(!e.contains(&pw_enc), "{}: {}", url, e);
            }
        }
    }

    /// Any string: neither function panics, the redaction is idempotent and
    /// keeps the text from the last `@` on, and a parsed password is hidden.
    #[test]
    fn any_string(s in prop_oneof![
        "\\PC{0,40}",
        "[a-z:/@%.,\\[\\]0-9?#+ ]{0,40}",
        any::<String>(),
        proptest::collection::vec(proptest::sample::select(TOKENS), 0..12).prop_map(|t| t.concat()),
        (
            proptest::sample::select(SCHEMES),
            proptest::collection::vec(proptest::sample::select(TOKENS), 0..4),
            proptest::collection::vec(proptest::sample::select(TOKENS), 0..6),
            proptest::sample::select(HOSTS),
        )
            .prop_map(|(scheme, user, pw, hosts)| format!("{scheme}{}:{}@{hosts}", user.concat(), pw.concat())),
    ]) {
        let shown = redact(&s);
        prop_assert_eq!(redact(&shown), shown.clone());
        if let Some(at) = s.rfind('@') {
            prop_assert!(shown.ends_with(&s[at..]));
        } else {
            prop_assert_eq!(&shown, &s);
        }
        if let Ok(u) = RedisUrl::parse(&s) {
            let start = s.find("://").unwrap() + 3;
            let at = s.rfind('@');
            if let (Some(at), Some(_)) = (at, u.password()) {
                let creds = &s[start..at];
                let raw = &creds[creds.find(':').unwrap() + 1..];
                prop_assert_eq!(shown, format!("{}***{}", &s[..at - raw.len()], &s[at..]));
            } else {
                prop_assert_eq!(shown, s.clone());
            }
            let _ = (u.node_urls(), u.to_string(), format!("{u:?}"));
        }
    }
}
