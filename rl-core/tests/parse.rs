//! nginx.conf value parsing: rates, sizes, durations, numbers.

use rl_core::parse::{parse_duration_ms, parse_number, parse_rate, parse_size, parse_u64, ParseErrorKind, Rate};

/// The error kind of a failed parse.
fn kind<T: std::fmt::Debug>(r: Result<T, rl_core::parse::ParseError>) -> ParseErrorKind {
    r.expect_err("should fail").kind
}

#[test]
fn rate_units() {
    let cases = [
        ("1r/s", 1, 1_000_000),
        ("100r/m", 100, 60_000_000),
        ("7r/h", 7, 3_600_000_000),
        ("2r/d", 2, 86_400_000_000),
        ("18446744073709551615r/s", u64::MAX, 1_000_000),
    ];
    for (s, count, period_us) in cases {
        assert_eq!(parse_rate(s), Ok(Rate { count, period_us }), "{s}");
        assert_eq!(parse_rate(s).unwrap().to_string(), s);
        assert_eq!(s.parse::<Rate>(), parse_rate(s));
    }
}

#[test]
fn rate_errors() {
    for s in [
        "", "r/s", "10", "10r", "10r/", "10r/x", "10r/ss", "10r/S", "+10r/s", "-1r/s", " 10r/s", "10 r/s", "10r/s ",
        "1.5r/s", "10r/r/s", "0x10r/s", "10/s",
    ] {
        assert_eq!(kind(parse_rate(s)), ParseErrorKind::Invalid, "{s:?}");
    }
    assert_eq!(kind(parse_rate("0r/s")), ParseErrorKind::NotPositive);
    assert_eq!(kind(parse_rate("000r/m")), ParseErrorKind::NotPositive);
    assert_eq!(kind(parse_rate("18446744073709551616r/s")), ParseErrorKind::TooLarge);
}

#[test]
fn rate_messages() {
    assert_eq!(parse_rate("100r/x").unwrap_err().to_string(), "invalid rate \"100r/x\"");
    assert_eq!(parse_rate("0r/s").unwrap_err().to_string(), "invalid rate \"0r/s\": must be positive");
    assert_eq!(
        parse_rate("99999999999999999999r/s").unwrap_err().to_string(),
        "invalid rate \"99999999999999999999r/s\": too large"
    );
}

#[test]
fn rate_display_unknown_period() {
    let r = Rate { count: 3, period_us: 1500 };
    assert_eq!(r.to_string(), "3r/1500us");
}

#[test]
fn size_like_nginx() {
    let cases = [
        ("0", 0),
        ("1", 1),
        ("512", 512),
        ("10k", 10 << 10),
        ("10K", 10 << 10),
        ("1m", 1 << 20),
        ("32M", 32 << 20),
        ("2g", 2 << 30),
        ("1G", 1 << 30),
        ("007k", 7 << 10),
    ];
    for (s, n) in cases {
        assert_eq!(parse_size(s), Ok(n), "{s}");
    }
    let max = isize::MAX as usize;
    assert_eq!(parse_size(&max.to_string()), Ok(max));
    assert_eq!(parse_size(&format!("{}k", max / 1024)), Ok(max / 1024 * 1024));
}

#[test]
fn size_errors() {
    for s in ["", "k", "m", "G", "1.5m", "-1", "+1", " 1", "1 ", "1kb", "1t", "1T", "1mk", "abc", "0x10"] {
        assert_eq!(kind(parse_size(s)), ParseErrorKind::Invalid, "{s:?}");
    }
    let max = isize::MAX as u128;
    for s in [
        (max + 1).to_string(),
        format!("{}k", max / 1024 + 1),
        format!("{}m", max / (1 << 20) + 1),
        format!("{}g", max / (1 << 30) + 1),
        "99999999999999999999999".to_owned(),
    ] {
        assert_eq!(kind(parse_size(&s)), ParseErrorKind::TooLarge, "{s:?}");
    }
    assert_eq!(parse_size("10x").unwrap_err().to_string(), "invalid size \"10x\"");
}

#[test]
fn duration_like_nginx() {
    let cases = [
        ("0", 0),
        ("0s", 0),
        ("1", 1_000),
        ("30", 30_000),
        ("50ms", 50),
        ("1s", 1_000),
        ("1m", 60_000),
        ("1m30s", 90_000),
        ("1m 30s", 90_000),
        ("1h", 3_600_000),
        ("2h", 7_200_000),
        ("1d", 86_400_000),
        ("1w", 604_800_000),
        ("1M", 2_592_000_000),
        ("1y", 31_536_000_000),
        ("1s500ms", 1_500),
        ("1y1M1w1d1h1m1s1ms", 34_822_861_001),
        ("1m30", 90_000),
        ("1h 5", 3_605_000),
        ("5 ", 5_000),
        ("5 3", 8_000),
        ("1s ", 1_000),
        ("1s 1", 2_000),
    ];
    for (s, ms) in cases {
        assert_eq!(parse_duration_ms(s), Ok(ms), "{s:?}");
    }
}

#[test]
fn duration_errors() {
    for s in [
        "", " ", "s", "ms", "m", "1x", "1S", "1s1s", "1s1m", "1ms1s", "1m1h", "1mm", "1msms", "-1s", "+1s", "1.5s",
        "5 1s", " 1s", "1u", "1d1M",
    ] {
        assert_eq!(kind(parse_duration_ms(s)), ParseErrorKind::Invalid, "{s:?}");
    }
    let max = i64::MAX as u64;
    assert_eq!(parse_duration_ms(&format!("{max}ms")), Ok(max));
    for s in [
        format!("{}ms", max as u128 + 1),
        format!("{}s", max / 1000 + 1),
        format!("{}", max / 1000 + 1),
        format!("{}s1000ms", max / 1000),
        "99999999999999999999999ms".to_owned(),
        format!("{}y", max / 31_536_000_000 + 1),
    ] {
        assert_eq!(kind(parse_duration_ms(&s)), ParseErrorKind::TooLarge, "{s:?}");
    }
    assert_eq!(parse_duration_ms("5x").unwrap_err().to_string(), "invalid duration \"5x\"");
}

#[test]
fn u64_positive() {
    assert_eq!(parse_u64("1"), Ok(1));
    assert_eq!(parse_u64("0042"), Ok(42));
    assert_eq!(parse_u64(&u64::MAX.to_string()), Ok(u64::MAX));
    assert_eq!(kind(parse_u64("0")), ParseErrorKind::NotPositive);
    assert_eq!(kind(parse_u64("18446744073709551616")), ParseErrorKind::TooLarge);
    for s in ["", "-1", "+1", "1 ", "1e3", "x"] {
        assert_eq!(kind(parse_u64(s)), ParseErrorKind::Invalid, "{s:?}");
    }
    assert_eq!(parse_u64("x").unwrap_err().to_string(), "invalid number \"x\"");
}

#[test]
fn number_strict() {
    assert_eq!(parse_number("0"), Ok(0));
    assert_eq!(parse_number("000"), Ok(0));
    assert_eq!(parse_number("429"), Ok(429));
    assert_eq!(parse_number("0429"), Ok(429));
    assert_eq!(parse_number(&u64::MAX.to_string()), Ok(u64::MAX));
    for s in [
        "", " ", "+1", "-1", "+0", "-0", " 1", "1 ", "1\t", "\n1", "1_000", "1,000", "1.0", "1e3", "0x10", "x", "٣",
        "１", "1\0",
    ] {
        assert_eq!(kind(parse_number(s)), ParseErrorKind::Invalid, "{s:?}");
    }
    for s in ["18446744073709551616", "99999999999999999999999", "000018446744073709551616"] {
        assert_eq!(kind(parse_number(s)), ParseErrorKind::TooLarge, "{s:?}");
    }
    assert_eq!(parse_number("+5").unwrap_err().to_string(), "invalid number \"+5\"");
    assert_eq!(
        parse_number("99999999999999999999").unwrap_err().to_string(),
        "invalid number \"99999999999999999999\": too large"
    );
}

/// Every parser reads its digits as `parse_number` does: a sign or a space
/// is refused by all of them alike.
#[test]
fn one_number_rule() {
    for bad in ["+5", "-5", " 5", "5 ", "0x5", "5.0"] {
        assert!(parse_number(bad).is_err(), "{bad:?}");
        assert!(parse_u64(bad).is_err(), "{bad:?}");
        assert!(parse_size(bad).is_err(), "{bad:?}");
        assert!(parse_size(&format!("{bad}k")).is_err(), "{bad:?}k");
        assert!(parse_rate(&format!("{bad}r/s")).is_err(), "{bad:?}r/s");
    }
    // (A space separates a duration's parts, as in nginx: " 5" and "5 " are 5 s.)
    for bad in ["+5", "-5", "0x5", "5.0"] {
        assert!(parse_duration_ms(bad).is_err(), "{bad:?}");
        assert!(parse_duration_ms(&format!("{bad}s")).is_err(), "{bad:?}s");
    }
}

proptest::proptest! {
    /// Any string of digits that fits is its value; anything with a
    /// non-digit is refused.
    #[test]
    fn number_matches_u64(s in "[0-9]{1,22}|[-+ ]?[0-9]{0,5}[^0-9]?[0-9]{0,5}") {
        let digits = !s.is_empty() && s.bytes().all(|c| c.is_ascii_digit());
        match parse_number(&s) {
            Ok(n) => {
                proptest::prop_assert!(digits);
                proptest::prop_assert_eq!(Some(n), s.parse::<u64>().ok());
            }
            Err(e) if e.kind == ParseErrorKind::TooLarge => {
                proptest::prop_assert!(digits && s.parse::<u64>().is_err());
            }
            Err(e) => {
                proptest::prop_assert_eq!(e.kind, ParseErrorKind::Invalid);
                proptest::prop_assert!(!digits);
            }
        }
    }
}
