//! Memcached's meta text protocol (memcached 1.6), as far as a memcached
//! zone speaks it: the commands that create, add to, take back from and
//! read a counter (`ma`, `mg`), and a parser of their replies that works on
//! a buffer filling from a socket, one reply at a time.
//!
//! Replies are a header line (`VA <len> [flags]`, `HD`, `NF`, `EN`, `ERROR`,
//! `CLIENT_ERROR <text>`, `SERVER_ERROR <text>`), ended by `\r\n`; a `VA`
//! header is followed by `<len>` bytes of data and `\r\n`. The commands
//! carry no opaque (`O`) flag: replies come back in the order of the
//! commands, and the flags memcached echoes after a code are ignored.
//!
//! Nothing here panics on any input: it runs in an nginx worker, where a
//! panic aborts the process. Bytes memcached would never send are a
//! [`ProtoError`], after which the caller drops the connection (it no
//! longer knows where the next reply starts).

use core::fmt;
use core::fmt::Write as _;

use super::MAX_KEY;

/// A reply to one command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum McReply {
    /// `VA <len> [flags]\r\n<data>\r\n` whose data is a decimal counter.
    Value(u64),
    /// `HD [flags]`: done, nothing returned.
    Done,
    /// `NF` (ma: not found) or `EN` (mg: miss), with any flags.
    Miss,
    /// `ERROR`, `CLIENT_ERROR <text>`, `SERVER_ERROR <text>`: the whole line, for the log.
    Error(String),
}

/// Bytes that are no reply memcached sends: what they look like, for the log
/// (at most 60 characters, non-printable bytes escaped as \xNN).
///
/// The string is the whole message (`unexpected reply "FOO bar"`), which
/// [`Display`](fmt::Display) writes as is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProtoError(pub String);

impl fmt::Display for ProtoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The longest header line taken, without its `\r\n`: memcached's own are
/// far shorter (a `VA` line with every flag is under 300 bytes), and a
/// stream that sends more without a line end is garbage, not a reply still
/// on its way.
const MAX_LINE: usize = 1024;

/// The most digits of a u64 (`u64::MAX` has 20): the longest `VA` data.
const MAX_DIGITS: usize = 20;

/// The most characters of the bytes quoted in a [`ProtoError`].
const MAX_QUOTE: usize = 60;

/// `bytes` for a message: printable ASCII as is (but `"` and `\`), other
/// bytes as `\xNN`, cut to [`MAX_QUOTE`] characters (the last three `...`
/// if cut), so that a garbage stream neither floods nor corrupts the log.
fn quote(bytes: &[u8]) -> String {
    let printable = |b: u8| (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\';
    let width = |b: u8| if printable(b) { 1 } else { 4 };
    let whole = bytes.iter().map(|&b| width(b)).sum::<usize>() <= MAX_QUOTE;
    let room = if whole { MAX_QUOTE } else { MAX_QUOTE - 3 };
    let mut s = String::new();
    for &b in bytes {
        if s.len() + width(b) > room {
            break;
        }
        if printable(b) {
            s.push(char::from(b));
        } else {
            // Writing into a String cannot fail.
            let _ = write!(s, "\\x{b:02x}");
        }
    }
    if !whole {
        s.push_str("...");
    }
    s
}

/// The error for a reply whose line is `line`.
fn unexpected(line: &[u8]) -> ProtoError {
    ProtoError(format!("unexpected reply \"{}\"", quote(line)))
}

/// `digits` as a decimal number: ASCII digits only, 1 to [`MAX_DIGITS`] of
/// them, the value fitting in u64 (`None` otherwise).
fn parse_decimal(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() || digits.len() > MAX_DIGITS {
        return None;
    }
    digits.iter().try_fold(0u64, |n, &d| {
        if d.is_ascii_digit() {
            n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
        } else {
            None
        }
    })
}

/// The first reply in `buf`: Ok(None) while more bytes are needed; Ok(Some((reply, bytes consumed))).
pub fn parse_reply(buf: &[u8]) -> Result<Option<(McReply, usize)>, ProtoError> {
    // Only the first MAX_LINE + 2 bytes can hold the line end of a line
    // taken; a longer search would only find a line refused anyway.
    let window = &buf[..buf.len().min(MAX_LINE + 2)];
    let Some(nl) = window.iter().position(|&b| b == b'\n') else {
        if buf.len() >= MAX_LINE + 2 {
            return Err(ProtoError("reply line too long".to_string()));
        }
        return Ok(None);
    };
    // memcached ends every line with "\r\n": a bare "\n" is not its.
    let Some(line) = buf[..nl].strip_suffix(b"\r") else {
        return Err(ProtoError(format!("malformed reply line \"{}\"", quote(&buf[..=nl]))));
    };
    // Nor does it send control bytes within a line (a stray "\r" would
    // otherwise hide in the ignored flags).
    if line.iter().any(|&b| b < 0x20 || b == 0x7f) {
        return Err(ProtoError(format!("malformed reply line \"{}\"", quote(&buf[..=nl]))));
    }
    let header_len = nl + 1;
    let mut tokens = line.split(|&b| b == b' ');
    let code = tokens.next().unwrap_or_default();
    let reply = match code {
        b"HD" => McReply::Done,
        b"NF" | b"EN" => McReply::Miss,
        b"ERROR" | b"CLIENT_ERROR" | b"SERVER_ERROR" => McReply::Error(String::from_utf8_lossy(line).into_owned()),
        b"VA" => {
            let len = tokens.next().and_then(parse_decimal).unwrap_or(0);
            // A counter is 1 to 20 bytes; anything else is not ours (and
            // a bound on the length is a bound on what is waited for).
            let len = match usize::try_from(len) {
                Ok(len @ 1..=MAX_DIGITS) => len,
                _ => return Err(unexpected(line)),
            };
            let end = header_len + len + 2;
            let Some(block) = buf.get(header_len..end) else {
                return Ok(None);
            };
            let (data, crlf) = block.split_at(len);
            if crlf != b"\r\n" {
                return Err(ProtoError(format!("malformed value \"{}\"", quote(block))));
            }
            // A counter that an `ma` shrank in place (10 to 5) is padded
            // with spaces to its old length, and `mg` returns it so
            // ("VA 2\r\n5 \r\n"); `ma` replies the number alone.
            let digits = data.len() - data.iter().rev().take_while(|&&b| b == b' ').count();
            let Some(n) = parse_decimal(&data[..digits]) else {
                return Err(ProtoError(format!("non-numeric value \"{}\"", quote(data))));
            };
            return Ok(Some((McReply::Value(n), end)));
        }
        _ => return Err(unexpected(line)),
    };
    Ok(Some((reply, header_len)))
}

/// `n` in decimal, without allocating.
fn push_decimal(out: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; MAX_DIGITS];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
}

/// Whether `key` is a key memcached's text protocol takes: 1 to 250 bytes,
/// none of them a space or a control byte (they would end it early).
fn valid_key(key: &str) -> bool {
    (1..=MAX_KEY).contains(&key.len()) && key.bytes().all(|b| b.is_ascii_graphic())
}

/// `<cmd> <key>`, the start of every command.
fn push_head(out: &mut Vec<u8>, cmd: &[u8], key: &str) {
    debug_assert!(valid_key(key), "invalid memcached key {key:?}");
    out.extend_from_slice(cmd);
    out.push(b' ');
    out.extend_from_slice(key.as_bytes());
}

/// `ma <key> N<ttl> J<delta> D<delta> v\r\n`: creates the counter at `delta`, living `ttl` (memcached's exptime token as is), or adds `delta` to it; replied by Value(new count).
pub fn write_incr(out: &mut Vec<u8>, key: &str, delta: u64, ttl: u32) {
    push_head(out, b"ma", key);
    // N: autovivify on a miss, J: the initial value, so that the first
    // request of a window is one round trip like the others.
    out.extend_from_slice(b" N");
    push_decimal(out, u64::from(ttl));
    out.extend_from_slice(b" J");
    push_decimal(out, delta);
    out.extend_from_slice(b" D");
    push_decimal(out, delta);
    out.extend_from_slice(b" v\r\n");
}

/// `ma <key> MD D<delta> v\r\n`: takes `delta` back (memcached stops at 0): Value(new count) or Miss.
pub fn write_decr(out: &mut Vec<u8>, key: &str, delta: u64) {
    push_head(out, b"ma", key);
    // No N: a counter that expired meanwhile stays gone, not recreated.
    out.extend_from_slice(b" MD D");
    push_decimal(out, delta);
    out.extend_from_slice(b" v\r\n");
}

/// `mg <key> v\r\n`: reads a counter: Value or Miss.
pub fn write_get(out: &mut Vec<u8>, key: &str) {
    push_head(out, b"mg", key);
    out.extend_from_slice(b" v\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(buf: &[u8]) -> Result<Option<(McReply, usize)>, ProtoError> {
        parse_reply(buf)
    }

    fn err(buf: &[u8]) -> String {
        match parse_reply(buf) {
            Err(e) => e.to_string(),
            other => panic!("{buf:?}: expected an error, got {other:?}"),
        }
    }

    /// The replies memcached 1.6.18 sent to a zone's commands.
    #[test]
    fn observed_replies() {
        assert_eq!(one(b"VA 1 O7\r\n3\r\n"), Ok(Some((McReply::Value(3), 12))));
        assert_eq!(one(b"VA 1 t10 O8\r\n6\r\n"), Ok(Some((McReply::Value(6), 16))));
        assert_eq!(one(b"EN O9\r\n"), Ok(Some((McReply::Miss, 7))));
        assert_eq!(one(b"HD O10\r\n"), Ok(Some((McReply::Done, 8))));
        assert_eq!(one(b"VA 1\r\n0\r\n"), Ok(Some((McReply::Value(0), 9))));
        assert_eq!(one(b"NF O11\r\n"), Ok(Some((McReply::Miss, 8))));
        let line = "CLIENT_ERROR cannot increment or decrement non-numeric value";
        assert_eq!(one(format!("{line}\r\n").as_bytes()), Ok(Some((McReply::Error(line.to_string()), line.len() + 2))));
        let line = "CLIENT_ERROR bad command line format";
        assert_eq!(one(format!("{line}\r\n").as_bytes()), Ok(Some((McReply::Error(line.to_string()), line.len() + 2))));
        assert_eq!(one(b"ERROR\r\n"), Ok(Some((McReply::Error("ERROR".to_string()), 7))));
        assert_eq!(
            one(b"SERVER_ERROR out of memory\r\n"),
            Ok(Some((McReply::Error("SERVER_ERROR out of memory".into()), 28)))
        );
    }

    #[test]
    fn bare_codes_and_following_bytes() {
        assert_eq!(one(b"HD\r\nVA 1\r\n"), Ok(Some((McReply::Done, 4))));
        assert_eq!(one(b"NF\r\n"), Ok(Some((McReply::Miss, 4))));
        assert_eq!(one(b"EN\r\n"), Ok(Some((McReply::Miss, 4))));
        assert_eq!(one(b"VA 2 c1\r\n42\r\nHD\r\n"), Ok(Some((McReply::Value(42), 13))));
        assert_eq!(one(b"VA 20\r\n18446744073709551615\r\n"), Ok(Some((McReply::Value(u64::MAX), 29))));
        assert_eq!(one(b"VA 3\r\n007\r\n"), Ok(Some((McReply::Value(7), 11))));
        // mg of counters an ma shrank in place (seen from memcached 1.6.18).
        assert_eq!(one(b"VA 2\r\n5 \r\n"), Ok(Some((McReply::Value(5), 10))));
        let padded = format!("VA 20\r\n0{}\r\n", " ".repeat(19));
        assert_eq!(one(padded.as_bytes()), Ok(Some((McReply::Value(0), 29))));
    }

    #[test]
    fn incomplete_replies_wait() {
        for buf in
            [&b""[..], b"H", b"HD", b"HD\r", b"VA 2 O1\r", b"VA 2\r\n", b"VA 2\r\n4", b"VA 2\r\n42", b"VA 2\r\n42\r"]
        {
            assert_eq!(one(buf), Ok(None), "{buf:?}");
        }
        assert_eq!(one(&[b'X'; MAX_LINE + 1]), Ok(None));
        let mut line = b"SERVER_ERROR ".to_vec();
        line.resize(MAX_LINE, b'x');
        line.extend_from_slice(b"\r\n");
        assert!(matches!(one(&line), Ok(Some((McReply::Error(_), n))) if n == MAX_LINE + 2));
    }

    #[test]
    fn garbage_is_refused() {
        assert_eq!(err(&[b'H'; MAX_LINE + 2]), "reply line too long");
        assert_eq!(err(b"FOO bar\r\n"), "unexpected reply \"FOO bar\"");
        assert_eq!(err(b"\r\n"), "unexpected reply \"\"");
        assert_eq!(err(b"HDX\r\n"), "unexpected reply \"HDX\"");
        assert_eq!(err(b"hd\r\n"), "unexpected reply \"hd\"");
        assert_eq!(err(b" HD\r\n"), "unexpected reply \" HD\"");
        assert_eq!(err(b"HD\n"), "malformed reply line \"HD\\x0a\"");
        assert_eq!(err(b"HD O1\rx\r\n"), "malformed reply line \"HD O1\\x0dx\\x0d\\x0a\"");
        assert_eq!(err(b"VA\r\n"), "unexpected reply \"VA\"");
        assert_eq!(err(b"VA 0\r\n\r\n"), "unexpected reply \"VA 0\"");
        assert_eq!(err(b"VA 21\r\n"), "unexpected reply \"VA 21\"");
        assert_eq!(err(b"VA x\r\n"), "unexpected reply \"VA x\"");
        assert_eq!(err(b"VA +1\r\n"), "unexpected reply \"VA +1\"");
        assert_eq!(err(b"VA 99999999999999999999999\r\n"), "unexpected reply \"VA 99999999999999999999999\"");
        assert_eq!(err(b"VA 3\r\nabc\r\n"), "non-numeric value \"abc\"");
        assert_eq!(err(b"VA 2\r\n-1\r\n"), "non-numeric value \"-1\"");
        assert_eq!(err(b"VA 2\r\n  \r\n"), "non-numeric value \"  \"");
        assert_eq!(err(b"VA 2\r\n 5\r\n"), "non-numeric value \" 5\"");
        assert_eq!(err(b"VA 3\r\n5 5\r\n"), "non-numeric value \"5 5\"");
        assert_eq!(err(b"VA 20\r\n18446744073709551616\r\n"), "non-numeric value \"18446744073709551616\"");
        assert_eq!(err(b"VA 1\r\n12\r\n"), "malformed value \"12\\x0d\"");
        assert_eq!(err(b"VA 1\r\n1\n\r\n"), "malformed value \"1\\x0a\\x0d\"");
    }

    #[test]
    fn quotes_are_escaped_and_short() {
        let e = err(b"\xff\"\\ x\r\n");
        assert_eq!(e, "unexpected reply \"\\xff\\x22\\x5c x\"");
        assert_eq!(err(b"\x01\r\n"), "malformed reply line \"\\x01\\x0d\\x0a\"");
        let mut long = vec![b'Z'; 500];
        long.extend_from_slice(b"\r\n");
        let e = err(&long);
        assert_eq!(e, format!("unexpected reply \"{}...\"", "Z".repeat(57)));
        let mut bin = vec![0u8; 100];
        bin.extend_from_slice(b"\r\n");
        let e = err(&bin);
        let quoted = e.trim_start_matches("malformed reply line \"").trim_end_matches('"');
        assert!(quoted.len() <= MAX_QUOTE && quoted.ends_with("..."), "{e}");
        // Exactly 60 characters are quoted whole.
        assert_eq!(quote(&[b'a'; 60]), "a".repeat(60));
        assert_eq!(quote(&[b'a'; 61]), format!("{}...", "a".repeat(57)));
    }

    #[test]
    fn commands() {
        let mut out = Vec::new();
        write_incr(&mut out, "k1", 3, 10);
        assert_eq!(out, b"ma k1 N10 J3 D3 v\r\n");
        out.clear();
        write_incr(&mut out, "rl:api:t/0", u64::MAX, u32::MAX);
        assert_eq!(out, b"ma rl:api:t/0 N4294967295 J18446744073709551615 D18446744073709551615 v\r\n");
        out.clear();
        write_incr(&mut out, "k", 0, 0);
        assert_eq!(out, b"ma k N0 J0 D0 v\r\n");
        out.clear();
        write_decr(&mut out, "k1", 2);
        assert_eq!(out, b"ma k1 MD D2 v\r\n");
        // Commands append: a batch is written into one buffer.
        write_get(&mut out, "k2");
        assert_eq!(out, b"ma k1 MD D2 v\r\nmg k2 v\r\n");
        out.clear();
        let key = "k".repeat(MAX_KEY);
        write_get(&mut out, &key);
        assert_eq!(out, format!("mg {key} v\r\n").as_bytes());
    }

    #[test]
    fn keys() {
        assert!(valid_key("a"));
        assert!(valid_key(&"~".repeat(MAX_KEY)));
        assert!(!valid_key(""));
        assert!(!valid_key(&"a".repeat(MAX_KEY + 1)));
        assert!(!valid_key("a b"));
        assert!(!valid_key("a\r\nb"));
        assert!(!valid_key("é"));
    }

    #[test]
    fn decimals() {
        for n in [0, 1, 9, 10, 99, 100, 12345, u64::from(u32::MAX), u64::MAX - 1, u64::MAX] {
            let mut out = Vec::new();
            push_decimal(&mut out, n);
            assert_eq!(out, n.to_string().as_bytes());
            assert_eq!(parse_decimal(&out), Some(n));
        }
        assert_eq!(parse_decimal(b""), None);
        assert_eq!(parse_decimal(b"1a"), None);
        assert_eq!(parse_decimal(b"000000000000000000001"), None);
    }
}
