//! The Redis Lua script (`rl_core::redis::LIMIT_SCRIPT`) held to the
//! pure-Rust model, run in Lua 5.1 (as embedded in Redis) against a fake
//! `redis` global: an in-memory store whose keys expire on a fake clock.
//!
//! What is where:
//! - `fake_redis.lua`: the fake Redis, in Lua: the commands the script may
//!   use, lazy expiry, counters, Redis' protection against globals, and
//!   helpers the tests read the store with.
//! - `load_library.lua`: loading the script as a Redis 7 function library
//!   (`FUNCTION LOAD`, then `FCALL`).
//! - `struct_lib.rs`: the port of Redis' `struct` library.
//! - `harness.rs`: [`harness::Redis`], the script run in mlua against the
//!   fake: setup, the clock, calls and reply conversion, the store read and
//!   written directly.
//! - `model.rs`: the Rust model the script is held to.
//! - `pair.rs`: [`pair::Pair`], one call on both sides, compared.
//! - `fixtures.rs`: limits, keys and times the tests share.
//! - `cases.rs`: table-driven and example tests.
//! - `memo.rs`: calls applied at most once (mode "2", the charge with a
//!   memo key), their repeats and their undo (`NAME_undo`), by hand and
//!   with [`memo::Batches`], calls of several requests on both sides.
//! - `lease.rs`: the lease call (`NAME_lease`) held to rl-core's lease model.
//! - `conn.rs`: `rl_conn` (a `concurrent` line's takes, and `NAME_conn`'s
//!   give-backs, corrections and heartbeats) held to rl-core's model of a
//!   key's fields (`rl_core::redis::holders`); its proptest's failures
//!   persist in `conn.proptest-regressions`.
//! - `props.rs`: proptests (failures persist in
//!   `props.proptest-regressions`, next to it).

mod cases;
mod conn;
mod fixtures;
mod harness;
mod lease;
mod memo;
mod model;
mod pair;
mod props;
mod struct_lib;
