//! Memcached zones (`rl_zone NAME memcached=...`): what can be decided
//! without I/O. A line's state is one counter per window, created and
//! incremented in one round trip by memcached's meta arithmetic
//! (`ma <key> N<ttl> J<cost> D<cost> v`), so that concurrent requests of a
//! fleet see distinct counts and exactly `burst` units are admitted in a
//! window; a request that a line rejects gives its units back (a
//! decrement). Which server holds a key is [`ring`]'s; the commands and
//! replies are [`proto`]'s; what a count means is [`decide`]'s.

pub mod decide;
pub mod proto;
pub mod ring;

pub use decide::{line_keys, outcome, supports, Counts, Decided, LineKeys, McLine};
pub use proto::{parse_reply, write_decr, write_get, write_incr, McReply, ProtoError};
pub use ring::Ring;

/// memcached's longest key.
pub const MAX_KEY: usize = 250;

/// The longest `prefix=` a memcached zone takes: room is left for the
/// rest of a key (tag, line, window: 60 characters at most).
pub const MAX_PREFIX: usize = 128;
