//! The memcached reply parser against streams as memcached writes them,
//! arriving in pieces split anywhere, and against garbage: it finds every
//! reply, in order, and never panics.

use proptest::prelude::*;
use rl_core::memcached::{parse_reply, McReply};

/// Flags memcached may echo after a code (` O123 t10`): ignored by the
/// parser, so any of them.
fn flags() -> impl Strategy<Value = String> {
    prop::collection::vec("[a-zA-Z][a-zA-Z0-9]{0,10}", 0..4).prop_map(|f| f.iter().map(|t| format!(" {t}")).collect())
}

/// A reply and its bytes on the wire.
fn reply() -> impl Strategy<Value = (McReply, Vec<u8>)> {
    prop_oneof![
        (any::<u64>(), flags()).prop_map(|(n, f)| {
            let data = n.to_string();
            (McReply::Value(n), format!("VA {}{f}\r\n{data}\r\n", data.len()).into_bytes())
        }),
        (0u64..1000, flags()).prop_map(|(n, f)| {
            let data = n.to_string();
            (McReply::Value(n), format!("VA {}{f}\r\n{data}\r\n", data.len()).into_bytes())
        }),
        // `mg` of a counter an `ma` shrank in place: padded with spaces.
        (any::<u64>(), 0usize..20).prop_map(|(n, pad)| {
            let data = format!("{n:<width$}", width = (n.to_string().len() + pad).min(20));
            (McReply::Value(n), format!("VA {}\r\n{data}\r\n", data.len()).into_bytes())
        }),
        flags().prop_map(|f| (McReply::Done, format!("HD{f}\r\n").into_bytes())),
        (prop::sample::select(vec!["NF", "EN"]), flags())
            .prop_map(|(code, f)| (McReply::Miss, format!("{code}{f}\r\n").into_bytes())),
        Just((McReply::Error("ERROR".to_string()), b"ERROR\r\n".to_vec())),
        (prop::sample::select(vec!["ERROR", "CLIENT_ERROR", "SERVER_ERROR"]), "[ -~]{1,200}").prop_map(
            |(code, text)| {
                let line = format!("{code} {text}");
                (McReply::Error(line.clone()), format!("{line}\r\n").into_bytes())
            }
        ),
    ]
}

/// Feeds `wire` to the parser in pieces of the given lengths (the rest in
/// one last piece), taking every complete reply after each piece.
fn parse_in_pieces(wire: &[u8], pieces: &[usize]) -> Result<Vec<McReply>, String> {
    let mut got = Vec::new();
    let mut buf = Vec::new();
    let mut rest = wire;
    let mut lengths = pieces.iter().copied().chain(core::iter::once(usize::MAX));
    while !rest.is_empty() {
        let n = lengths.next().unwrap_or(usize::MAX).min(rest.len());
        let (piece, tail) = rest.split_at(n);
        rest = tail;
        buf.extend_from_slice(piece);
        loop {
            match parse_reply(&buf) {
                Ok(Some((r, used))) => {
                    got.push(r);
                    buf.drain(..used);
                }
                Ok(None) => break,
                Err(e) => return Err(format!("{e} at {:?}", String::from_utf8_lossy(&buf))),
            }
        }
    }
    if buf.is_empty() {
        Ok(got)
    } else {
        Err(format!("left over: {:?}", String::from_utf8_lossy(&buf)))
    }
}

/// What `parse_reply` must hold to on any bytes: a reply found used some
/// of them, and exactly those.
fn check_any(buf: &[u8]) -> Result<(), TestCaseError> {
    if let Ok(Some((r, n))) = parse_reply(buf) {
        prop_assert!(n > 0 && n <= buf.len(), "consumed {} of {}", n, buf.len());
        prop_assert_eq!(parse_reply(&buf[..n]), Ok(Some((r, n))));
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    /// Replies as memcached writes them, concatenated and split at random
    /// points: parsed back exactly, in order, nothing left over.
    #[test]
    fn memcached_replies_in_pieces(replies in prop::collection::vec(reply(), 0..20), pieces in prop::collection::vec(1usize..40, 0..40)) {
        let wire: Vec<u8> = replies.iter().flat_map(|(_, w)| w.iter().copied()).collect();
        let want: Vec<McReply> = replies.into_iter().map(|(r, _)| r).collect();
        prop_assert_eq!(parse_in_pieces(&wire, &pieces), Ok(want));
    }

    /// Arbitrary bytes: no panic, and a reply found is within them.
    #[test]
    fn memcached_any_bytes(buf in prop::collection::vec(any::<u8>(), 0..1500)) {
        check_any(&buf)?;
    }

    /// Bytes that look like replies: valid streams with bytes changed,
    /// inserted or cut, and short lines from reply-like alphabets.
    #[test]
    fn memcached_near_replies(
        replies in prop::collection::vec(reply(), 1..6),
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..3), 0..4),
        cut in any::<prop::sample::Index>(),
        line in "(VA|HD|NF|EN|ERROR)?[ 0-9A-Z\r\n]{0,30}",
    ) {
        let mut wire: Vec<u8> = replies.iter().flat_map(|(_, w)| w.iter().copied()).collect();
        for (at, byte, op) in edits {
            let i = at.index(wire.len());
            match op {
                0 => wire[i] = byte,
                1 => wire.insert(i, byte),
                _ => {
                    wire.remove(i);
                }
            }
            if wire.is_empty() {
                break;
            }
        }
        check_any(&wire)?;
        check_any(&wire[..cut.index(wire.len() + 1)])?;
        check_any(line.as_bytes())?;
    }
}
