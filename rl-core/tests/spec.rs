//! `rl_limit`'s arguments read into a line's specification, and the
//! messages `nginx -t` prints for those it refuses.

use rl_core::limit::Algorithm;
use rl_core::parse::Rate;
use rl_core::spec::{one_of, one_variable, params, shown, LineSpec, ParamErrorKind, Quote, SpecError};

/// What the test's `compile` leaves: the value as written.
type Spec = LineSpec<'static, String>;

fn args(line: &'static str) -> Vec<&'static [u8]> {
    line.split(' ').filter(|a| !a.is_empty()).map(str::as_bytes).collect()
}

fn parse(line: &'static str) -> Result<Spec, SpecError> {
    LineSpec::parse(&args(line), |v| Ok::<_, SpecError>(v.to_string()))
}

/// The message a line is refused with.
fn refused(line: &'static str) -> String {
    match parse(line) {
        Ok(_) => panic!("{line}: accepted"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_plain_line() {
    let s = parse("zone=z rate=10r/s").unwrap();
    assert_eq!(s.zone, "z");
    assert_eq!(s.key(), Ok("$binary_remote_addr"));
    assert_eq!(s.limit.algorithm(), Algorithm::Sliding);
    assert_eq!(s.limit.rate(), Rate { count: 10, period_us: 1_000_000 });
    assert_eq!(s.limit.burst(), 10, "the burst is the rate's count by default");
    assert_eq!((s.cost, s.queue), (1, 0));
    assert_eq!((s.rate_src.as_str(), s.burst_src.as_str()), ("10r/s", "10"));
    assert!(!s.burst_varies && !s.dry_run && !s.after_auth && !s.charge_after);
    assert!(s.vars.rate.is_none() && s.vars.burst.is_none() && s.vars.cost.is_none());
    assert_eq!(s.name, None);
}

#[test]
fn every_parameter() {
    let s =
        parse("dry_run zone=z rate=100r/m key=$uri algorithm=gcra burst=0005 cost=2 name=a-B_9 queue=0010 after_auth")
            .unwrap();
    assert_eq!(s.key(), Ok("$uri"));
    assert_eq!(s.limit.algorithm(), Algorithm::Gcra);
    assert_eq!((s.limit.burst(), s.cost, s.queue, s.limit.queue()), (5, 2, 10, 10));
    assert_eq!(s.name, Some("a-B_9"));
    assert!(s.dry_run && s.after_auth);
    let s = parse("zone=z rate=1r/s burst=5 charge=after").unwrap();
    assert!(s.charge_after);
    assert!(!parse("zone=z rate=1r/s charge=before").unwrap().charge_after);
}

#[test]
fn variables_are_compiled_in_order() {
    let mut seen = Vec::new();
    let a = args("zone=z cost=$c burst=$b rate=$r");
    let s = LineSpec::parse(&a, |v| {
        seen.push(v);
        Ok::<_, SpecError>(v.len())
    })
    .unwrap();
    assert_eq!(seen, ["$r", "$b", "$c"]);
    assert_eq!((s.vars.rate, s.vars.burst, s.vars.cost), (Some(2), Some(2), Some(2)));
    assert!(s.limit.varying() == s.limit && s.burst_varies);
    assert_eq!((s.rate_src.as_str(), s.burst_src.as_str(), s.cost), ("$r", "$b", 0));

    // A rate from variables: the burst follows it, unless given.
    let s = parse("zone=z rate=$plan_rate").unwrap();
    assert!(s.burst_varies);
    assert_eq!((s.rate_src.as_str(), s.burst_src.as_str()), ("$plan_rate", ""));
    let s = parse("zone=z rate=$plan_rate burst=7").unwrap();
    assert!(!s.burst_varies);
    assert_eq!(s.burst_src, "7");
    // A cost from variables does not make the limit vary.
    let s = parse("zone=z rate=1r/s cost=$c").unwrap();
    assert!(!s.burst_varies && s.vars.cost.is_some());
    assert_eq!(s.rate_src, "1r/s");
}

#[test]
fn the_callers_refusal_comes_first_where_it_did() {
    #[derive(Debug, PartialEq)]
    enum E {
        Spec(String),
        Compile,
    }
    impl From<SpecError> for E {
        fn from(e: SpecError) -> Self {
            E::Spec(e.to_string())
        }
    }
    let a = args("zone=z rate=${ charge=bogus");
    assert_eq!(LineSpec::parse(&a, |_| Err::<(), _>(E::Compile)).err(), Some(E::Compile));
    // Checks before the variables still come first.
    let a = args("zone=z rate=${ algorithm=x");
    assert!(matches!(LineSpec::parse(&a, |_| Err::<(), _>(E::Compile)).err(), Some(E::Spec(_))));
}

#[test]
fn messages() {
    let cases = [
        ("rate=10r/s", "\"rl_limit\" directive must have \"zone\" parameter"),
        ("zone=z", "\"rl_limit\" directive must have \"rate\" parameter"),
        ("zone= rate=10r/s", "invalid parameter \"zone=\" in \"rl_limit\" directive"),
        ("zone=z rate=10r/s zone=y", "duplicate \"zone\" parameter in \"rl_limit\" directive"),
        ("zone=z rate=10r/s dry_run dry_run", "duplicate \"dry_run\" parameter in \"rl_limit\" directive"),
        ("zone=z rate=10r/s after_auth after_auth", "duplicate \"after_auth\" parameter in \"rl_limit\" directive"),
        ("zone=z rate=10r/s foo=1", "invalid parameter \"foo=1\" in \"rl_limit\" directive"),
        (
            "zone=z rate=10r/s burst=5 nodelay",
            "invalid parameter \"nodelay\" in \"rl_limit\" directive, limit_req's \"burst=B nodelay\" is \
             \"burst=6\" here (see \"Moving from limit_req\" in the README)",
        ),
        (
            "zone=z rate=10r/s algorithm=x",
            "invalid algorithm \"x\" in \"rl_limit\" directive, it must be \"fixed\", \"sliding\", \
             \"sliding_log\", \"token_bucket\", \"leaky_bucket\" or \"gcra\"",
        ),
        (
            "zone=z rate=10r/x",
            "invalid rate \"10r/x\" in \"rl_limit\" directive, it must be a number of requests per second, \
             minute, hour or day: \"10r/s\", \"100r/m\", \"1000r/h\", \"10000r/d\"",
        ),
        ("zone=z rate=0r/s", "invalid rate \"0r/s\" in \"rl_limit\" directive, it must be positive"),
        (
            "zone=z rate=99999999999999999999r/s",
            "invalid rate \"99999999999999999999r/s\" in \"rl_limit\" directive, it is too large",
        ),
        ("zone=z rate=1r/s burst=0", "invalid burst \"0\" in \"rl_limit\" directive, it must be a positive number"),
        ("zone=z rate=1r/s burst=-1", "invalid burst \"-1\" in \"rl_limit\" directive, it must be a positive number"),
        (
            "zone=z rate=1r/s cost=99999999999999999999",
            "invalid cost \"99999999999999999999\" in \"rl_limit\" directive, it is too large",
        ),
        ("zone=z rate=1r/s queue=x", "invalid queue \"x\" in \"rl_limit\" directive, it must be a number"),
        (
            "zone=z rate=1r/s queue=99999999999999999999",
            "invalid queue \"99999999999999999999\" in \"rl_limit\" directive, it is too large",
        ),
        (
            "zone=z rate=1r/s charge=later",
            "invalid charge \"later\" in \"rl_limit\" directive, it must be \"before\" or \"after\"",
        ),
        (
            "zone=z rate=$r algorithm=sliding_log",
            "a burst from variables is not supported by algorithm \"sliding_log\", which lays out one timestamp \
             per unit of burst when the configuration is read, in \"rl_limit\" directive",
        ),
        (
            "zone=z rate=1r/s algorithm=sliding_log charge=after",
            "\"charge=after\" is not supported by algorithm \"sliding_log\", which cannot record an overdraft, \
             in \"rl_limit\" directive",
        ),
        (
            "zone=z rate=1r/s burst=2 cost=3",
            "cost=3 exceeds burst=2 in \"rl_limit\" directive: no request could ever pass",
        ),
        (
            "zone=z rate=1r/s burst=5 charge=after queue=1",
            "\"charge=after\" cannot be used with \"queue\" in \"rl_limit\" directive: delaying needs the cost up \
             front",
        ),
        ("zone=z rate=1r/s algorithm=fixed queue=1", "invalid limit in \"rl_limit\" directive: "),
    ];
    for (line, message) in cases {
        let got = refused(line);
        assert!(got.starts_with(message) && (message.ends_with(": ") || got == message), "{line}: {got}");
    }
    // A cost from variables is not held to the burst.
    assert!(parse("zone=z rate=1r/s burst=2 cost=$c").is_ok());
}

#[test]
fn the_key() {
    assert_eq!(parse("zone=z rate=1r/s key=").unwrap().key().unwrap_err().to_string(), {
        "invalid parameter \"key=\" in \"rl_limit\" directive"
    });
    assert_eq!(parse("zone=z rate=1r/s key=$a$b").unwrap().key(), Ok("$a$b"));
    let name = SpecError::Name("a b".into()).to_string();
    assert_eq!(name, "invalid name \"a b\" in \"rl_limit\" directive, it must be letters, digits, \"_\" and \"-\"");
}

#[test]
fn parameters_of_any_directive() {
    let a = args("size=10m redis=x");
    let given = params("rl_zone", &a, &["size", "redis"], |_| None).unwrap();
    assert_eq!((given.get("size"), given.get("redis"), given.get("x")), (Some("10m"), Some("x"), None));
    assert_eq!(given.iter().map(|(n, _)| n).collect::<Vec<_>>(), ["size", "redis"]);
    // Not UTF-8: shown as nginx shows it, and no hint is asked for it.
    let bad: [&[u8]; 1] = [b"size=\xff1"];
    let e = params("rl_zone", &bad, &["size"], |a| Some(format!("hint for {a:?}"))).err().unwrap();
    assert_eq!(e.kind, ParamErrorKind::Invalid { arg: "size=\\xff1".into(), hint: Some("hint for \"\"".into()) });
    assert_eq!(e.to_string(), "invalid parameter \"size=\\xff1\" in \"rl_zone\" directive, hint for \"\"");
    // A password is hidden.
    let url: [&[u8]; 1] = [b"url=redis://u:secret@h"];
    let e = params("rl_zone", &url, &["redis"], |_| None).err().unwrap().to_string();
    assert!(!e.contains("secret"), "{e}");
}

#[test]
fn helpers() {
    assert_eq!(one_of(&["on", "off"]), "\"on\" or \"off\"");
    assert_eq!(one_of(&["a", "b", "c"]), "\"a\", \"b\" or \"c\"");
    assert_eq!(one_of(&["a"]), "\"a\"");
    assert_eq!(shown(b"a\xffb\xc3"), "a\\xffb\\xc3");
    assert_eq!(shown("é".as_bytes()), "é");
    assert_eq!(Quote("a\nb").to_string(), "a\\nb");
    let long = "x".repeat(300);
    assert_eq!(Quote(&long).to_string(), format!("{}...", &long[..Quote::MAX]));
    for (value, name) in [("$a", Some("a")), ("${a_1}", Some("a_1")), ("$1", None), ("$a$b", None), ("a", None)] {
        assert_eq!(one_variable(value), name, "{value}");
    }
    assert_eq!(one_variable("${a"), None);
    assert_eq!(one_variable("$"), None);
}

/// `priority=` and `classes=` on a rate line: reserves of the burst, kept
/// from the classes below.
#[test]
fn rate_classes() {
    let s =
        parse("zone=a rate=100r/m priority=$plan classes=critical:reserve=20%,premium:reserve=10,standard").unwrap();
    assert_eq!(s.priority, Some("$plan"));
    let reserves: Vec<u64> = s.classes.iter().map(|c| c.reserve).collect();
    assert_eq!(reserves, vec![20, 10, 0]);
    assert_eq!(rl_core::spec::classes::kept(&s.classes), vec![0, 20, 30]);
    assert_eq!(refused("zone=a rate=1r/s priority=$p"), "\"priority\" needs \"classes\" in \"rl_limit\" directive");
    assert_eq!(
        refused("zone=a rate=10r/s priority=$p classes=a:queue=5,b"),
        "invalid limit in \"rl_limit\" directive: \"queue\" is not supported by algorithm \"sliding\": only \"token_bucket\", \"leaky_bucket\" and \"gcra\" can \
         delay requests"
    );
    assert_eq!(
        refused("zone=a rate=$r burst=10 algorithm=gcra queue=5 priority=$p classes=a:reserve=2,b"),
        "\"classes\" with \"queue\" needs a rate that does not come from variables in \"rl_limit\" directive: the \
         waiting line is laid out for it"
    );
    assert_eq!(
        refused("zone=a rate=10r/s algorithm=gcra queue=5 priority=$p classes=a:queue=6,b"),
        "invalid class \"a\" in \"rl_limit\" directive, its queue=6 exceeds the line's queue=5"
    );
    // A waiting line: the line's places, or its classes' together.
    let s =
        parse("zone=a rate=10r/s algorithm=gcra burst=2 queue=8 priority=$p classes=a:reserve=1,b:queue=3").unwrap();
    let lanes: Vec<(u64, u64)> = s.lanes.iter().map(|l| (l.places, l.reserve)).collect();
    assert_eq!((s.queue, lanes), (8, vec![(8, 1), (3, 0)]));
    assert_eq!(s.limit.queue(), 0, "a waiter is let in only where the algorithm admits it at once");
    assert!(s.limit.rate_waits());
    let s = parse("zone=a rate=10r/s algorithm=token_bucket priority=$p classes=a:queue=5,b:queue=2").unwrap();
    assert_eq!((s.queue, s.lanes.len()), (7, 2));
    let s = parse("zone=a rate=10r/s algorithm=gcra priority=$p classes=a:reserve=2,b").unwrap();
    assert!(s.lanes.is_empty() && !s.limit.rate_waits(), "reserves alone: no waiting line");
    assert_eq!(
        refused("zone=a rate=$r priority=$p classes=a:reserve=2,b"),
        "\"classes\" needs a burst that does not come from variables in \"rl_limit\" directive"
    );
    assert_eq!(
        refused("zone=a rate=10r/s cost=3 priority=$p classes=a:reserve=8,b"),
        "the reserves of the classes above class \"b\" leave it 2 of burst, less than cost=3 in \"rl_limit\" directive"
    );
    assert_eq!(
        refused("zone=a rate=10r/s priority=$p classes=a:reserve=10,b"),
        "invalid class \"a:reserve=10\" in \"rl_limit\" directive, reserve must be a number of units below burst, or a \
         percentage"
    );
}
