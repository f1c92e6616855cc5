//! nginx-rl core: everything that can be tested without nginx.
//!
//! - [`habits`]: the nginx-rl form of a `limit_req` parameter that
//!   `rl_zone` or `rl_limit` refuses, for the refusal to name.
//! - [`lease`]: leases (escrow) of a line's budget: granted by the exact
//!   line, spent by one node alone, never more than the line admits.
//! - [`limit`]: the rate-limiting algorithms as pure state transitions over
//!   integer time (microseconds, passed in by the caller).
//! - [`memcached`]: Memcached zones' keys, servers, protocol and
//!   decisions from counters.
//! - [`metrics`]: the verdicts `rl_metrics` counts and their rendering
//!   (Prometheus text format, JSON).
//! - [`parse`]: rates, sizes and durations as nginx.conf writes them.
//! - [`spec`]: what a directive's arguments say (an `rl_limit` line's
//!   specification, `name=value` parameters), with `nginx -t`'s messages.
//! - [`table`]: the keyed state table that lives in a shared-memory zone
//!   (hash chains + LRU over a caller-provided memory region).
//! - [`verdict`]: [`verdict::Outcome`], a line's verdict on a request,
//!   from the model or the Redis script.
//! - [`url`]: Redis URLs (server, sentinels, cluster) and the redaction of
//!   their passwords for messages.
#![forbid(unsafe_op_in_unsafe_fn)]

pub mod habits;
pub mod lease;
pub mod limit;
pub mod memcached;
pub mod metrics;
pub mod parse;
pub mod redis;
pub mod spec;
pub mod table;
pub mod url;
pub mod verdict;
