//! `nginx -t` against malformed `rl_*` directives, generated systematically:
//! for each directive and parameter, a missing, empty, duplicate, signed,
//! spaced, overflowing or garbage value, an unknown parameter, bad URL forms
//! and bad certificate files, each at every level the directive is allowed
//! at and (for `rl_limit`) on both kinds of zone, and each Redis URL with and
//! without a password holding `@`. One malformed directive per run (nginx
//! stops at the first error). Every run must be refused with exactly one
//! `[emerg]` line, naming the directive and the reason, at the directive's
//! own `file:line`, with no password in it; never a crash or a hang.

mod common;

use std::fs;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

use common::redis::TestCerts;
use common::{conf_line_of, nginx_t_run, server};

/// A password holding `@`, and the parts of it a wrong split would show.
const CREDS: &str = "u:pre@S3cr3tPw@";
const SECRETS: [&str; 2] = ["S3cr3tPw", "pre@"];
/// Marks the malformed directive's line (a comment: nginx ignores it).
const MARK: &str = "#bad";
/// `nginx -t`s run at once: each mostly waits (exec, loading the module,
/// mapping zones), so more than the CPUs.
const THREADS: usize = 4;
/// One `nginx -t` may take this long on a loaded machine before it counts as hung.
const RUN_LIMIT: Duration = Duration::from_secs(30);

/// One malformed configuration.
struct Case {
    name: String,
    /// The `http {}` content; the malformed directive's line holds [`MARK`].
    block: String,
    /// The directive the message must name.
    directive: &'static str,
    /// Text the message must hold (the reason).
    needle: String,
}

/// Where a directive allowed at every level is put.
#[derive(Clone, Copy, Debug)]
enum Level {
    Http,
    Server,
    Location,
}

const LEVELS: [Level; 3] = [Level::Http, Level::Server, Level::Location];

/// The zones every `rl_limit` case can name: `z` in shared memory, `r` on
/// Redis (nothing connects at `nginx -t`).
const ZONES: &str = "rl_zone z size=64k;\nrl_zone r redis=redis://127.0.0.1:6379;";

/// `zones`, then `directive` (its line marked) at `level`.
fn at_level(level: Level, zones: &str, directive: &str) -> String {
    let line = format!("{directive} {MARK}");
    match level {
        Level::Http => server(&format!("{zones}\n{line}"), "location / { }"),
        Level::Server => server(zones, &format!("{line}\nlocation / {{ }}")),
        Level::Location => server(zones, &format!("location / {{\n{line}\n}}")),
    }
}

fn case(name: String, block: String, directive: &'static str, needle: &str) -> Case {
    Case { name, block, directive, needle: needle.to_string() }
}

/// `rl_limit` arguments (with `{Z}` for the zone) and the reason they are refused.
fn limit_args() -> Vec<(String, &'static str)> {
    let mut v: Vec<(String, &'static str)> = vec![
        // missing
        ("rate=10r/s".into(), "must have \"zone\" parameter"),
        ("zone={Z}".into(), "must have \"rate\" parameter"),
        ("key=$uri burst=5".into(), "must have \"zone\" parameter"),
        // empty
        ("zone= rate=10r/s".into(), "invalid parameter \"zone=\""),
        ("zone={Z} rate=".into(), "invalid rate \"\""),
        ("zone={Z} rate=10r/s key=".into(), "invalid parameter \"key=\""),
        ("zone={Z} rate=10r/s algorithm=".into(), "invalid algorithm \"\""),
        ("zone={Z} rate=10r/s burst=".into(), "invalid burst \"\""),
        ("zone={Z} rate=10r/s cost=".into(), "invalid cost \"\""),
        ("zone={Z} rate=10r/s \"\"".into(), "invalid parameter \"\""),
        // signs, spaces, zero, overflow, garbage
        ("zone={Z} rate=+10r/s".into(), "invalid rate \"+10r/s\""),
        ("zone={Z} rate=-10r/s".into(), "invalid rate \"-10r/s\""),
        ("zone={Z} \"rate= 10r/s\"".into(), "invalid rate \" 10r/s\""),
        ("zone={Z} \"rate=10r/s \"".into(), "invalid rate \"10r/s \""),
        ("zone={Z} rate=0r/s".into(), "invalid rate \"0r/s\""),
        ("zone={Z} rate=99999999999999999999r/s".into(), "invalid rate \"99999999999999999999r/s\""),
        ("zone={Z} rate=abc".into(), "invalid rate \"abc\""),
        ("zone={Z} rate=10r/x".into(), "invalid rate \"10r/x\""),
        ("zone={Z} rate=10".into(), "invalid rate \"10\""),
        ("zone={Z} rate=1.5r/s".into(), "invalid rate \"1.5r/s\""),
        ("zone={Z} rate=10r/S".into(), "invalid rate \"10r/S\""),
        ("zone={Z} algorithm=foo rate=10r/s".into(), "invalid algorithm \"foo\""),
        ("zone={Z} rate=10r/s algorithm=SLIDING".into(), "invalid algorithm \"SLIDING\""),
        ("zone={Z} rate=10r/s algorithm=sliding_log2".into(), "invalid algorithm \"sliding_log2\""),
        // unknown parameters
        ("zone={Z} rate=10r/s foo=bar".into(), "invalid parameter \"foo=bar\""),
        ("zone={Z} rate=10r/s nodelay".into(), "invalid parameter \"nodelay\""),
        ("zone={Z} rate=10r/s delay=5".into(), "invalid parameter \"delay=5\""),
        ("zone={Z} rate=10r/s =5".into(), "invalid parameter \"=5\""),
        ("zone={Z} rate=10r/s Burst=5".into(), "invalid parameter \"Burst=5\""),
        ("zone".into(), "invalid parameter \"zone\""),
        // limit_req habits: refused, with the nginx-rl form
        (
            "zone={Z} rate=10r/s burst=5 nodelay".into(),
            "invalid parameter \"nodelay\" in \"rl_limit\" directive, limit_req's \"burst=B nodelay\" is \"burst=6\" \
             here (see \"Moving from limit_req\" in the README)",
        ),
        ("zone={Z} nodelay rate=10r/s".into(), "invalid parameter \"nodelay\" in \"rl_limit\" directive, limit_req's \"burst=B nodelay\" is \"burst=1\" here"),
        (
            "zone={Z} rate=10r/s burst=10 delay=2".into(),
            "invalid parameter \"delay=2\" in \"rl_limit\" directive, limit_req's \"burst=B delay=D\" is \"burst=3 queue=8\" here",
        ),
        (
            "zone=z:10m rate=10r/s".into(),
            "unknown zone \"z:10m\" in \"rl_limit\" directive, did you mean \"zone=z\", declared by \"rl_zone z size=10m\"?",
        ),
        // refused together
        ("zone={Z} rate=10r/s burst=4 cost=5".into(), "cost=5 exceeds burst=4"),
        ("zone={Z} rate=10r/s cost=11".into(), "cost=11 exceeds burst=10"),
        ("zone={Z} rate=10r/s burst=100000 algorithm=sliding_log".into(), "invalid limit"),
        ("zone=nope rate=10r/s".into(), "unknown zone \"nope\""),
        // queue=, name=, dry_run
        ("zone={Z} rate=10r/s algorithm=gcra queue=".into(), "invalid queue \"\""),
        ("zone={Z} rate=10r/s algorithm=gcra queue=-1".into(), "invalid queue \"-1\""),
        ("zone={Z} rate=10r/s algorithm=gcra queue=x".into(), "invalid queue \"x\""),
        ("zone={Z} rate=10r/s algorithm=gcra queue=99999999999999999999".into(), "invalid queue \"999"),
        ("zone={Z} rate=10r/s queue=5".into(), "\"queue\" is not supported by algorithm \"sliding\""),
        ("zone={Z} rate=10r/s algorithm=fixed queue=5".into(), "\"queue\" is not supported by algorithm \"fixed\""),
        ("zone={Z} rate=10r/s name=".into(), "invalid name \"\""),
        ("zone={Z} rate=10r/s name=a.b".into(), "invalid name \"a.b\""),
        ("zone={Z} rate=10r/s dry_run dry_run".into(), "duplicate \"dry_run\" parameter"),
        ("zone={Z} rate=10r/s dry_run=on".into(), "invalid parameter \"dry_run=on\""),
    ];
    // each parameter twice: the same value, and another
    for (p, value, other) in [
        ("zone", "{Z}", "nope"),
        ("rate", "10r/s", "20r/s"),
        ("key", "$uri", "$host"),
        ("algorithm", "gcra", "fixed"),
        ("burst", "5", "6"),
        ("cost", "1", "2"),
    ] {
        let needle = leak(format!("duplicate \"{p}\" parameter"));
        let base = match p {
            "zone" => "rate=10r/s",
            "rate" => "zone={Z}",
            _ => "zone={Z} rate=10r/s",
        };
        v.push((format!("{p}={value} {base} {p}={value}"), needle));
        v.push((format!("{base} {p}={value} {p}={other}"), needle));
    }
    // long values, control characters: quoted shortened and escaped, the
    // reason and the directive still said
    let long = "x".repeat(3000);
    let digits = "9".repeat(3000);
    v.push((format!("zone={{Z}} rate={long}"), "invalid rate \"xxx"));
    v.push((format!("zone={{Z}} rate={digits}r/s"), "invalid rate \"999"));
    v.push((format!("zone={{Z}} rate=10r/s burst={digits}"), "invalid burst \"999"));
    v.push((format!("zone={{Z}} rate=10r/s algorithm={long}"), "invalid algorithm \"xxx"));
    v.push((format!("zone={{Z}} rate=10r/s {long}=1"), "invalid parameter \"xxx"));
    v.push(("zone={Z} rate=10r/s\\n".into(), "invalid rate \"10r/s\\n\""));
    v.push(("zone={Z} rate=10r/s burst=5\\r".into(), "invalid burst \"5\\r\""));
    for p in ["burst", "cost"] {
        let base = if p == "cost" { "zone={Z} rate=10r/s burst=10" } else { "zone={Z} rate=10r/s" };
        for bad in ["+5", "-5", "0", "abc", "5x", "1e3", "0x10", "5.0", "99999999999999999999", "18446744073709551616"]
        {
            v.push((format!("{base} {p}={bad}"), leak(format!("invalid {p} \"{bad}\""))));
        }
        // (in quotes: a space, a tab)
        for bad in [" 5", "5 ", "5\\t"] {
            v.push((format!("{base} \"{p}={bad}\""), leak(format!("invalid {p} \""))));
        }
    }
    v
}

fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

/// Redis URLs (with `{C}` where credentials may go) and the reason they are refused.
fn bad_urls() -> Vec<(String, &'static str)> {
    let long = "h".repeat(3000);
    vec![
        ("".into(), "no scheme"),
        ("{C}127.0.0.1:6379".into(), "no scheme"),
        ("http://{C}127.0.0.1:6379".into(), "unknown scheme \"http\""),
        ("Redis://{C}127.0.0.1:6379".into(), "unknown scheme \"Redis\""),
        ("redis:/{C}127.0.0.1:6379".into(), "no scheme"),
        ("redis://{C}".into(), "no host"),
        ("redis://{C}:6379".into(), "empty host"),
        ("redis://{C}/0".into(), "no host"),
        ("redis://{C}127.0.0.1:0".into(), "invalid port \"0\""),
        ("redis://{C}127.0.0.1:65536".into(), "invalid port \"65536\""),
        ("redis://{C}127.0.0.1:-1".into(), "invalid port \"-1\""),
        ("redis://{C}127.0.0.1:+6379".into(), "invalid port \"+6379\""),
        ("redis://{C}127.0.0.1:".into(), "invalid port \"\""),
        ("redis://{C}127.0.0.1:63a9".into(), "invalid port \"63a9\""),
        ("redis://{C}127.0.0.1:6379/-1".into(), "invalid db \"-1\""),
        ("redis://{C}127.0.0.1:6379/+1".into(), "invalid db \"+1\""),
        ("redis://{C}127.0.0.1:6379/abc".into(), "invalid db \"abc\""),
        ("redis://{C}127.0.0.1:6379/4294967296".into(), "invalid db \"4294967296\""),
        ("redis://{C}127.0.0.1:6379/0/1".into(), "invalid db \"0/1\""),
        ("redis://{C}127.0.0.1:6379/0?protocol=resp3".into(), "query strings are not supported"),
        ("redis://{C}127.0.0.1:6379?db=1".into(), "query strings are not supported"),
        ("rediss://{C}127.0.0.1:6379/#insecure".into(), "always verified"),
        ("redis://{C}127.0.0.1:6379\\t".into(), "control characters"),
        ("redis://{C}127.0.0.1:6379/0\\n".into(), "control characters"),
        ("redis://{C}127.0.0.1\0:6379".into(), "control characters"),
        (format!("redis://{{C}}{long}:6379"), "host is too long"),
        (format!("redis://{{C}}{}:6379", "a".repeat(256)), "host is too long"),
        ("redis://{C}0.0.0.0:6379".into(), "wildcard address"),
        ("redis://{C}[::]:6379".into(), "wildcard address"),
        ("redis://{C}[::1:6379".into(), "invalid host"),
        ("redis://{C}[zz::1]:6379".into(), "invalid host"),
        ("redis://{C}ho$t:6379".into(), "invalid host \"ho$t\""),
        ("redis://{C}127.0.0.1:6379,127.0.0.1:6380".into(), "several hosts"),
        ("redis://u@127.0.0.1:6379".into(), "no password"),
        ("redis://u:@127.0.0.1:6379".into(), "no password"),
        ("redis+sentinel://{C}127.0.0.1:26379".into(), "no master name"),
        ("redis+sentinel://{C}127.0.0.1:26379/".into(), "no master name"),
        ("redis+sentinel://{C}127.0.0.1/mymaster".into(), "no port in \"127.0.0.1\""),
        ("redis+sentinel://{C}127.0.0.1:26379,/mymaster".into(), "empty host"),
        ("redis+sentinel://{C}127.0.0.1:26379/mymaster/x".into(), "invalid db \"x\""),
        ("redis+sentinel://{C}127.0.0.1:26379/mymaster/-2".into(), "invalid db \"-2\""),
        ("rediss+sentinel://{C}127.0.0.1:0/mymaster".into(), "invalid port \"0\""),
        ("redis+cluster://{C}127.0.0.1".into(), "no port in \"127.0.0.1\""),
        ("redis+cluster://{C}127.0.0.1:7000/0".into(), "a cluster has no db"),
        ("redis+cluster://{C}127.0.0.1:7000,,127.0.0.1:7001".into(), "empty host"),
        ("rediss+cluster://{C}127.0.0.1:7000?x".into(), "query strings are not supported"),
        ("redis+clusters://{C}127.0.0.1:7000".into(), "unknown scheme \"redis+clusters\""),
    ]
}

/// Every malformed configuration, and the certificate files they name.
fn cases(certs: &TestCerts) -> Vec<Case> {
    let mut all = Vec::new();

    // rl_limit: every argument set, at every level, on either zone.
    for (args, needle) in limit_args() {
        for zone in ["z", "r"] {
            for level in LEVELS {
                let directive = format!("rl_limit {};", args.replace("{Z}", zone));
                all.push(case(
                    format!("{directive} at {level:?}"),
                    at_level(level, ZONES, &directive),
                    "rl_limit",
                    needle,
                ));
            }
        }
    }
    // Lines a Redis zone cannot compute exactly; a location with too many zones.
    for level in LEVELS {
        let directive = "rl_limit zone=r rate=1r/d burst=100000 algorithm=fixed;";
        all.push(case(
            format!("{directive} at {level:?}"),
            at_level(level, ZONES, directive),
            "rl_limit",
            "out of the range a Redis zone computes exactly",
        ));
    }
    // Lines a lease cannot take.
    let leased = format!("{ZONES}\nrl_zone l redis=redis://127.0.0.1:6379 lease=1m sync=100ms;");
    let unleasable = [
        ("algorithm=sliding_log", "algorithm=sliding_log cannot be leased: it keeps a timestamp per request"),
        ("algorithm=gcra burst=50 queue=5", "a line with a queue cannot be leased: a lease admits at once"),
        // (a lease lives 150 ms: the sync and the timeout; 100r/s refills 15 in it)
        ("burst=5 algorithm=gcra", "burst=5 is too small to be leased: leases hold back the 15 units"),
        ("burst=15 algorithm=token_bucket", "burst=15 is too small to be leased: leases hold back the 15 units"),
    ];
    for (args, needle) in unleasable {
        for level in LEVELS {
            let directive = format!("rl_limit zone=l rate=100r/s {args};");
            all.push(case(
                format!("{directive} at {level:?}"),
                at_level(level, &leased, &directive),
                "rl_limit",
                leak(format!(
                    "{needle}{} (zone \"l\" has \"lease\")",
                    if needle.contains("hold back") { " the rate refills in a lease's life" } else { "" }
                )),
            ));
        }
    }
    for n in [17, 20] {
        let zones: String = (0..n).map(|i| format!("rl_zone z{i} size=64k;\n")).collect();
        let lines: String = (0..n)
            .map(|i| {
                format!("rl_limit zone=z{i} rate=1r/s;{}\n", if i == 16 { format!(" {MARK}") } else { String::new() })
            })
            .collect();
        all.push(case(
            format!("{n} zones in one location"),
            server(&zones, &format!("location / {{\n{lines}}}")),
            "rl_limit",
            "too many zones",
        ));
    }

    // rl_status, rl_headers: every value, at every level.
    let status: &[(&str, &str)] = &[
        ("+429", "invalid status \"+429\""),
        ("-429", "invalid status \"-429\""),
        ("\" 429\"", "invalid status \" 429\""),
        ("\"429 \"", "invalid status \"429 \""),
        ("abc", "invalid status \"abc\""),
        ("200", "invalid status \"200\""),
        ("399", "invalid status \"399\""),
        ("600", "invalid status \"600\""),
        ("0", "invalid status \"0\""),
        ("4.29e2", "invalid status \"4.29e2\""),
        ("0x1AD", "invalid status \"0x1AD\""),
        ("99999999999999999999", "invalid status \"99999999999999999999\""),
        ("18446744073709551645", "invalid status \"18446744073709551645\""),
        ("\"\"", "invalid status \"\""),
        ("429\\n", "invalid status \"429\\n\""),
        (leak("4".repeat(3000)), "invalid status \"444"),
        ("429 503", "invalid number of arguments"),
        ("", "invalid number of arguments"),
    ];
    let headers: &[(&str, &str)] = &[
        ("bogus", "invalid value \"bogus\""),
        ("\"\"", "invalid value \"\""),
        ("OFF", "invalid value \"OFF\""),
        ("Legacy", "invalid value \"Legacy\""),
        ("\"both \"", "invalid value \"both \""),
        ("on", "invalid value \"on\""),
        ("both\\t", "invalid value \"both\\t\""),
        (leak("b".repeat(3000)), "invalid value \"bbb"),
        ("draft6", "invalid value \"draft6\""),
        ("draft-7", "invalid value \"draft-7\""),
        ("legacy draft-7", "invalid value \"draft-7\""),
        // `off` alone: with another value it says nothing sensible.
        ("legacy off", "invalid value \"off\" in \"rl_headers\" directive, it must be the only value"),
        ("off off", "invalid value \"off\" in \"rl_headers\" directive, it must be the only value"),
        ("off draft-6", "invalid value \"off\" in \"rl_headers\" directive, it must be the only value"),
        ("", "invalid number of arguments"),
    ];
    for (directive, values) in [("rl_status", status), ("rl_headers", headers)] {
        let name: &'static str = if directive == "rl_status" { "rl_status" } else { "rl_headers" };
        for (value, needle) in values {
            for level in LEVELS {
                let d = format!("{directive} {value};");
                all.push(case(format!("{d} at {level:?}"), at_level(level, ZONES, &d), name, needle));
            }
        }
        let good = if directive == "rl_status" { "503" } else { "both" };
        for level in LEVELS {
            let d = format!("{directive} {good};\n{directive} {good};");
            all.push(case(
                format!("{directive} twice at {level:?}"),
                at_level(level, ZONES, &d),
                name,
                "directive is duplicate",
            ));
        }
    }

    // rl_zone, shared memory.
    let zone = |params: &str| server(&format!("rl_zone {params}; {MARK}"), "location / { }");
    let mut shm: Vec<(String, String)> = vec![
        ("".into(), "invalid number of arguments".into()),
        ("z".into(), "must have \"size\", \"redis\" or \"memcached\" parameter".into()),
        ("\"\" size=64k".into(), "invalid zone name \"\"".into()),
        ("a=b size=64k".into(), "invalid zone name \"a=b\"".into()),
        ("z size=".into(), "invalid zone size \"size=\"".into()),
        ("z size=+64k".into(), "invalid zone size \"size=+64k\"".into()),
        ("z size=-64k".into(), "invalid zone size \"size=-64k\"".into()),
        ("z \"size= 64k\"".into(), "invalid zone size \"size= 64k\"".into()),
        ("z \"size=64k \"".into(), "invalid zone size \"size=64k \"".into()),
        ("z size=abc".into(), "invalid zone size \"size=abc\"".into()),
        ("z size=64kb".into(), "invalid zone size \"size=64kb\"".into()),
        ("z size=1.5m".into(), "invalid zone size \"size=1.5m\"".into()),
        ("z size=1t".into(), "invalid zone size \"size=1t\"".into()),
        ("z size=0x100000".into(), "invalid zone size \"size=0x100000\"".into()),
        ("z size=99999999999999999999".into(), "invalid zone size \"size=99999999999999999999\"".into()),
        ("z size=9999999999999g".into(), "invalid zone size \"size=9999999999999g\"".into()),
        ("z size=100g".into(), "zone \"z\" is too large in \"rl_zone\" directive: size=100g".into()),
        ("z size=65g".into(), "size=65g".into()),
        ("z size=1024g".into(), "size=1024g".into()),
        ("z size=8589934592k".into(), "size=8589934592k".into()),
        (format!("z size={}", "9".repeat(3000)), "invalid zone size \"size=999".into()),
        (format!("z size={}k", "x".repeat(3000)), "invalid zone size \"size=xxx".into()),
        (format!("{} size=64k size=1", "z".repeat(3000)), "duplicate \"size\" parameter".into()),
        ("z size=64k\\n".into(), "invalid zone size \"size=64k\\n\"".into()),
        ("z size=1k".into(), "zone \"z\" is too small in \"rl_zone\" directive: size=1k".into()),
        ("z size=0".into(), "zone \"z\" is too small in \"rl_zone\" directive: size=0".into()),
        ("z size=64k size=1m".into(), "duplicate \"size\" parameter".into()),
        ("z size=64k size=1".into(), "duplicate \"size\" parameter".into()),
        ("z size=64k size=64k".into(), "duplicate \"size\" parameter".into()),
        ("z size".into(), "invalid parameter \"size\"".into()),
        ("z size=64k foo=1".into(), "invalid parameter \"foo=1\"".into()),
        // limit_req_zone habits: refused, with the nginx-rl form
        ("api 10m".into(), "invalid parameter \"10m\" in \"rl_zone\" directive, did you mean \"size=10m\"?".into()),
        (
            "zone=api:10m".into(),
            "invalid zone name \"zone=api:10m\" in \"rl_zone\" directive, did you mean \"rl_zone api size=10m\"?".into(),
        ),
        (
            "$binary_remote_addr zone=api:10m rate=10r/s".into(),
            "invalid parameter \"zone=api:10m\" in \"rl_zone\" directive, did you mean \"rl_zone api size=10m\"? (the key \
             and the rate go on \"rl_limit\" here)"
                .into(),
        ),
        ("api size=10m rate=10r/s".into(), "\"rate\" is a parameter of \"rl_limit\" here".into()),
        (
            "z size=64k redis=redis://127.0.0.1:6379".into(),
            "\"size\" and \"redis\" parameters cannot be used together".into(),
        ),
        (
            "z redis=redis://127.0.0.1:6379 size=64k".into(),
            "\"size\" and \"redis\" parameters cannot be used together".into(),
        ),
        ("z size=64k timeout=1s".into(), "\"size\" and \"timeout\" parameters cannot be used together".into()),
        ("z size=64k on_error=deny".into(), "\"size\" and \"on_error\" parameters cannot be used together".into()),
        ("z size=64k prefix=a:".into(), "\"size\" and \"prefix\" parameters cannot be used together".into()),
        (
            format!("z size=64k ssl_trusted_certificate={}", certs.path("ca.pem")),
            "\"size\" and \"ssl_trusted_certificate\" parameters cannot be used together".into(),
        ),
    ];
    // Below the fixed bound, a zone larger than this machine's memory and swap.
    if let Some(g) = memory_and_swap_g().map(|g| g + 1).filter(|&g| g <= 64) {
        shm.push((format!("z size={g}g"), format!("size={g}g, more than the memory")));
    }
    for (params, needle) in shm {
        all.push(case(format!("rl_zone {params}"), zone(&params), "rl_zone", &needle));
    }
    // The same name twice, whatever the kinds; rl_zone outside http{}.
    let kinds = ["size=64k", "redis=redis://127.0.0.1:6379"];
    for first in kinds {
        for second in kinds {
            all.push(case(
                format!("rl_zone a {first} then {second}"),
                server(&format!("rl_zone a {first};\nrl_zone a {second}; {MARK}"), "location / { }"),
                "rl_zone",
                "duplicate zone \"a\"",
            ));
        }
    }
    all.push(case(
        "rl_zone in server{}".into(),
        server("", &format!("rl_zone a size=64k; {MARK}")),
        "rl_zone",
        "directive is not allowed here",
    ));
    // A zone too small for its sliding_log lines: found after parsing, at the zone.
    for (size, burst) in [("32k", 2000), ("64k", 4000), ("1m", 65536)] {
        all.push(case(
            format!("rl_zone size={size} with sliding_log burst={burst}"),
            server(
                &format!("rl_zone s size={size}; {MARK}"),
                &format!("location / {{ rl_limit zone=s rate=1r/s burst={burst} algorithm=sliding_log; }}"),
            ),
            "rl_zone",
            "is too small for its sliding_log limits",
        ));
    }

    // rl_zone, Redis: every bad URL, with and without a password holding "@".
    let rzone = |params: &str| server(&format!("rl_zone r {params}; {MARK}"), "location / { }");
    for (url, needle) in bad_urls() {
        let variants: &[&str] = if url.contains("{C}") { &["", CREDS] } else { &[""] };
        for creds in variants {
            let params = format!("redis={}", url.replace("{C}", creds));
            all.push(case(format!("rl_zone r {params}"), rzone(&params), "rl_zone", needle));
        }
    }
    // Every other parameter, on each kind of URL, with and without a password.
    let (ca, cert, key) = (certs.path("ca.pem"), certs.path("client.pem"), certs.path("client.key"));
    let redis_params: Vec<(String, String)> = vec![
        ("timeout=".into(), "invalid timeout \"\"".into()),
        ("timeout=+5s".into(), "invalid timeout \"+5s\"".into()),
        ("timeout=-5s".into(), "invalid timeout \"-5s\"".into()),
        ("timeout=soon".into(), "invalid timeout \"soon\"".into()),
        ("timeout=0".into(), "invalid timeout \"0\"".into()),
        ("timeout=0ms".into(), "invalid timeout \"0ms\"".into()),
        ("timeout=5x".into(), "invalid timeout \"5x\"".into()),
        ("timeout=1s1s".into(), "invalid timeout \"1s1s\"".into()),
        ("timeout=99999999999999999999s".into(), "invalid timeout \"99999999999999999999s\"".into()),
        ("timeout=9223372036854775807ms".into(), "invalid timeout \"9223372036854775807ms\"".into()),
        ("timeout=25d".into(), "invalid timeout \"25d\"".into()),
        ("timeout=60s1ms".into(), "invalid timeout \"60s1ms\"".into()),
        ("timeout=1y".into(), "invalid timeout \"1y\"".into()),
        ("timeout=1s timeout=2s".into(), "duplicate \"timeout\" parameter".into()),
        ("on_error=".into(), "invalid on_error \"\"".into()),
        ("on_error=maybe".into(), "invalid on_error \"maybe\"".into()),
        ("on_error=ALLOW".into(), "invalid on_error \"ALLOW\"".into()),
        ("on_error=deny on_error=allow".into(), "duplicate \"on_error\" parameter".into()),
        ("prefix=a: prefix=b:".into(), "duplicate \"prefix\" parameter".into()),
        ("pool=3".into(), "invalid parameter \"pool=3\"".into()),
        (format!("timeout={}", "1".repeat(3000)), "invalid timeout \"111".into()),
        (format!("on_error={}", "x".repeat(3000)), "invalid on_error \"xxx".into()),
        (format!("{}=1", "x".repeat(3000)), "invalid parameter \"xxx".into()),
        ("redis".into(), "invalid parameter \"redis\"".into()),
        ("sync=100ms".into(), "\"sync\" needs \"lease\"".into()),
        ("on_error=local".into(), "on_error=local needs \"lease\"".into()),
        ("lease=1m sync=5ms".into(), "invalid sync \"5ms\", it must be from 10ms to 10s".into()),
        ("lease=1m sync=11s".into(), "invalid sync \"11s\", it must be from 10ms to 10s".into()),
        ("lease=1m sync=".into(), "invalid sync \"\"".into()),
        ("life=1s".into(), "\"life\" needs \"lease\"".into()),
        (
            "lease=1m sync=100ms life=100ms".into(),
            "invalid life \"100ms\", it must be from 150ms (sync plus timeout) to 60s".into(),
        ),
        ("lease=1m life=61s".into(), "invalid life \"61s\", it must be from 150ms (sync plus timeout) to 60s".into()),
        ("lease=1m sync=10s timeout=60s life=1m".into(), "invalid life \"1m\", it must be from 70000ms".into()),
        ("lease=big".into(), "invalid zone size \"lease=big\"".into()),
        ("lease=".into(), "invalid zone size \"lease=\"".into()),
        ("lease=1k".into(), "is too small in \"rl_zone\" directive: lease=1k".into()),
        ("lease=1m lease=2m".into(), "duplicate \"lease\" parameter".into()),
        ("redis=redis://127.0.0.1:6380".into(), "duplicate \"redis\" parameter".into()),
        (format!("ssl_trusted_certificate={ca}"), "\"ssl_*\" parameters need a \"rediss\" URL".into()),
        (
            format!("ssl_certificate={cert} ssl_certificate_key={key}"),
            "\"ssl_*\" parameters need a \"rediss\" URL".into(),
        ),
    ];
    let tls_params: Vec<(String, String)> = vec![
        (
            format!("ssl_trusted_certificate={ca} ssl_trusted_certificate={ca}"),
            "duplicate \"ssl_trusted_certificate\" parameter".into(),
        ),
        (
            format!("ssl_certificate={cert} ssl_certificate={cert} ssl_certificate_key={key}"),
            "duplicate \"ssl_certificate\" parameter".into(),
        ),
        (
            format!("ssl_certificate={cert} ssl_certificate_key={key} ssl_certificate_key={key}"),
            "duplicate \"ssl_certificate_key\" parameter".into(),
        ),
        ("ssl_trusted_certificate=".into(), "cannot load trusted certificates".into()),
        (format!("ssl_trusted_certificate=/{}", "x".repeat(3000)), "cannot load trusted certificates \"/xxx".into()),
        (
            format!("ssl_trusted_certificate={}", certs.path("missing.pem")),
            format!("cannot load trusted certificates \"{}\"", certs.path("missing.pem")),
        ),
        (format!("ssl_trusted_certificate={}", certs.path("empty.pem")), "no certificate in".into()),
        (format!("ssl_trusted_certificate={}", certs.path("server.ext")), "no certificate in".into()),
        (format!("ssl_trusted_certificate={}", certs.path("ca.key")), "no certificate in".into()),
        (
            format!("ssl_trusted_certificate={}", certs.path("junk.pem")),
            format!("cannot load trusted certificates \"{}\": invalid certificate", certs.path("junk.pem")),
        ),
        (format!("ssl_certificate={cert}"), "no \"ssl_certificate_key\" is defined for certificate".into()),
        (format!("ssl_certificate_key={key}"), "\"ssl_certificate_key\" needs \"ssl_certificate\"".into()),
        (
            format!("ssl_certificate={} ssl_certificate_key={key}", certs.path("missing.pem")),
            "cannot load certificate".into(),
        ),
        (
            format!("ssl_certificate={cert} ssl_certificate_key={}", certs.path("missing.key")),
            "cannot load certificate key".into(),
        ),
        (format!("ssl_certificate={} ssl_certificate_key={key}", certs.path("empty.pem")), "no certificate in".into()),
        (format!("ssl_certificate={key} ssl_certificate_key={key}"), "no certificate in".into()),
        (
            format!("ssl_certificate={} ssl_certificate_key={key}", certs.path("junk.pem")),
            format!("cannot load certificate \"{}\": invalid certificate", certs.path("junk.pem")),
        ),
        (format!("ssl_certificate={cert} ssl_certificate_key={}", certs.path("empty.pem")), "no private key in".into()),
        (format!("ssl_certificate={cert} ssl_certificate_key={cert}"), "no private key in".into()),
        (format!("ssl_certificate={cert} ssl_certificate_key={ca}"), "no private key in".into()),
        (
            format!("ssl_certificate={cert} ssl_certificate_key={}", certs.path("ed448.key")),
            format!("cannot load certificate key \"{}\"", certs.path("ed448.key")),
        ),
        (
            format!("ssl_certificate={cert} ssl_certificate_key={}", certs.path("other.key")),
            "does not match certificate".into(),
        ),
        (
            format!("ssl_certificate={} ssl_certificate_key={key}", certs.path("server.pem")),
            "does not match certificate".into(),
        ),
    ];
    let urls = [
        "redis://{C}127.0.0.1:6379/1",
        "redis+sentinel://{C}127.0.0.1:26379,[::1]:26380/mymaster/2",
        "redis+cluster://{C}127.0.0.1:7000,127.0.0.1:7001",
    ];
    for url in urls {
        for creds in ["", CREDS] {
            let plain = url.replace("{C}", creds);
            let tls = plain.replacen("redis", "rediss", 1);
            for (p, needle) in &redis_params {
                let params = format!("redis={plain} {p}");
                all.push(case(format!("rl_zone r {params}"), rzone(&params), "rl_zone", needle));
            }
            for (p, needle) in &tls_params {
                let params = format!("redis={tls} {p}");
                all.push(case(format!("rl_zone r {params}"), rzone(&params), "rl_zone", needle));
            }
        }
    }
    // One Redis zone too many.
    let zones: String = (0..65)
        .map(|i| {
            format!(
                "rl_zone r{i} redis=redis://127.0.0.1:6379;{}\n",
                if i == 64 { format!(" {MARK}") } else { String::new() }
            )
        })
        .collect();
    all.push(case("65 Redis zones".into(), server(&zones, "location / { }"), "rl_zone", "too many Redis zones"));
    all
}

/// MemTotal + SwapTotal of /proc/meminfo, in GiB rounded up.
fn memory_and_swap_g() -> Option<u64> {
    let info = fs::read_to_string("/proc/meminfo").ok()?;
    let kb = |name: &str| -> Option<u64> {
        let line = info.lines().find(|l| l.starts_with(name))?;
        line.split_whitespace().nth(1)?.parse().ok()
    };
    Some((kb("MemTotal:")? + kb("SwapTotal:")?).div_ceil(1 << 20))
}

/// Test certificates, and the malformed files the cases name.
fn certs() -> TestCerts {
    let certs = TestCerts::make();
    fs::write(certs.dir.join("empty.pem"), "").unwrap();
    // A key of a kind rustls does not sign with.
    let out = std::process::Command::new("openssl")
        .args(["genpkey", "-algorithm", "ed448", "-out"])
        .arg(certs.dir.join("ed448.key"))
        .output()
        .expect("cannot run openssl");
    assert!(out.status.success(), "openssl genpkey: {}", String::from_utf8_lossy(&out.stderr));
    fs::write(
        certs.dir.join("junk.pem"),
        "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    certs
}

/// What is wrong with `nginx -t`'s answer to `case`, if anything.
fn check(case: &Case) -> Option<String> {
    let Some(line) = conf_line_of(&case.block, MARK) else {
        return Some("no marked line".into());
    };
    let run = nginx_t_run(&case.block, RUN_LIMIT);
    let out = &run.output;
    let emerg: Vec<&str> = out.lines().filter(|l| l.contains("[emerg]")).collect();
    let mut wrong = Vec::new();
    if run.timed_out {
        wrong.push(format!("hung (killed after {RUN_LIMIT:?})"));
    }
    if let Some(sig) = run.signal {
        wrong.push(format!("killed by signal {sig}"));
    }
    if run.ok {
        wrong.push("accepted".into());
    }
    match emerg[..] {
        [e] => {
            let directive = format!("\"{}\"", case.directive);
            if !e.contains(&directive) {
                wrong.push(format!("does not name {directive}"));
            }
            if !e.contains(&case.needle) {
                wrong.push(format!("does not say {:?}", case.needle));
            }
            let at = format!("nginx.conf:{line}");
            if !e.ends_with(&at) || e.matches("nginx.conf:").count() != 1 {
                wrong.push(format!("not at {at} (once)"));
            }
        }
        _ => wrong.push(format!("{} [emerg] lines", emerg.len())),
    }
    if let Some(s) = SECRETS.iter().find(|s| out.contains(*s)) {
        wrong.push(format!("shows {s:?}"));
    }
    (!wrong.is_empty()).then(|| format!("{}: {}\n{}", case.name, wrong.join(", "), out.trim_end()))
}

#[test]
fn malformed_directives_are_refused() {
    let certs = certs();
    let cases = cases(&certs);
    let start = Instant::now();
    let next = AtomicUsize::new(0);
    let failures = Mutex::new(Vec::new());
    let threads = THREADS;
    thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                while let Some(case) = cases.get(next.fetch_add(1, Ordering::Relaxed)) {
                    if let Some(f) = check(case) {
                        failures.lock().unwrap().push(f);
                    }
                }
            });
        }
    });
    let failures = failures.into_inner().unwrap();
    eprintln!("{} malformed configurations, {} threads, {:.1?}", cases.len(), threads, start.elapsed());
    let accepted = failures.iter().filter(|f| f.lines().next().is_some_and(|l| l.contains("accepted"))).count();
    assert!(
        failures.is_empty(),
        "{} of {} wrong ({accepted} accepted):\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n----\n")
    );
}

/// The configurations the cases are variations of are accepted: the
/// cases fail for the reason they test, not for their surroundings.
#[test]
fn their_good_forms_are_accepted() {
    let certs = certs();
    let (ca, cert, key) = (certs.path("ca.pem"), certs.path("client.pem"), certs.path("client.key"));
    let tls = format!("ssl_trusted_certificate={ca} ssl_certificate={cert} ssl_certificate_key={key}");
    let good = [
        "rl_limit zone=z rate=10r/s key=$uri algorithm=gcra burst=0005 cost=1;",
        "rl_limit zone=r rate=10r/s key=$uri algorithm=sliding_log burst=10 cost=10;",
        "rl_limit zone=z rate=10r/s algorithm=gcra queue=0010 name=a-B_9 dry_run;",
        "rl_limit dry_run zone=r rate=10r/s algorithm=token_bucket queue=0;",
        "rl_dry_run on;",
        "rl_log_level warn;",
        "rl_status 0429;",
        "rl_status 599;",
        "rl_headers both;",
    ];
    let mut failures = Vec::new();
    for d in good {
        for level in LEVELS {
            let block = at_level(level, ZONES, d);
            let (ok, out) = common::nginx_t(&block);
            if !ok {
                failures.push(format!("{d} at {level:?}:\n{out}"));
            }
        }
    }
    let zones = [
        "rl_zone a size=32k;".to_string(),
        format!("rl_zone a redis=redis://{CREDS}127.0.0.1:6379/1 \"timeout=1s 500ms\" on_error=deny prefix=;"),
        format!("rl_zone a redis=rediss+sentinel://{CREDS}127.0.0.1:26379,[::1]:26380/mymaster/2 {tls};"),
        format!("rl_zone a redis=rediss+cluster://{CREDS}127.0.0.1:7000,127.0.0.1:7001 {tls};"),
        format!("rl_zone a redis=rediss://[::1]:6380 ssl_trusted_certificate={ca};"),
        "rl_zone a redis=redis://127.0.0.1:6379 timeout=60s;".to_string(),
        "rl_zone a redis=redis://127.0.0.1:6379 lease=1m;".to_string(),
        "rl_zone a redis=redis://127.0.0.1:6379 lease=1m on_error=local;".to_string(),
        format!("rl_zone a redis=rediss+cluster://{CREDS}127.0.0.1:7000 lease=10m sync=10ms {tls};"),
        "rl_zone a redis=redis+sentinel://127.0.0.1:26379/m lease=64k sync=10s timeout=1s;".to_string(),
        "rl_zone a redis=redis://127.0.0.1:6379 lease=1m sync=100ms life=60s;".to_string(),
        "rl_zone a redis=redis://127.0.0.1:6379 lease=1m sync=10s timeout=60s life=70s;".to_string(),
    ];
    for z in &zones {
        let (ok, out) = common::nginx_t(&server(z, "location / { rl_limit zone=a rate=1r/s; }"));
        if !ok || SECRETS.iter().any(|s| out.contains(s)) {
            failures.push(format!("{z}:\n{out}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n----\n"));
}
