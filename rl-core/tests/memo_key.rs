//! A call's memo key: in its first state key's Cluster slot (the same hash
//! tag), and of a form no state key has.

use rl_core::redis::{state_key, write_memo_key};

/// The hash tag Redis Cluster hashes: between the first `{` and the first
/// `}` after it, if not empty; else the whole key.
fn hash_tag(key: &str) -> &str {
    if let Some(open) = key.find('{') {
        if let Some(len) = key[open + 1..].find('}') {
            if len > 0 {
                return &key[open + 1..open + 1 + len];
            }
        }
    }
    key
}

#[test]
fn memo_key_shares_the_state_keys_slot() {
    for prefix in ["rl:", "", "myapp:", "a{b:"] {
        let state = state_key(prefix, 0x0123_4567_89ab_cdef, 0xfeed);
        let mut memo = String::new();
        write_memo_key(&mut memo, &state, (0x5eed, 0x2a));
        assert_eq!(hash_tag(&memo), hash_tag(&state), "{state} / {memo}");
        assert!(memo.ends_with(":c:0000000000005eed2a"), "{memo}");
        assert_ne!(memo, state);
        // (a state key is prefix{tag}:<16 hex digits>: no second colon after the tag)
        assert!(!state.ends_with(&memo[memo.len() - 21..]), "{memo}");
    }
    let mut memo = String::new();
    write_memo_key(&mut memo, "rl:{0123456789abcdef}:000000000000feed", (1, 2));
    assert_eq!(memo, "rl:{0123456789abcdef}:c:00000000000000012");
    // A key without a hash tag: the whole key, then the name.
    let mut memo = String::new();
    write_memo_key(&mut memo, "k", (1, 0x10));
    assert_eq!(memo, "k:c:000000000000000110");
}
