//! One `rl_limit` line as the configuration leaves it: where its states
//! live, its key, its limit and cost, and the identity its states are
//! stored under. Lines are owned by [`crate::conf::MainConf::lines`] and
//! named elsewhere by their [`LineId`].

use ngx::ffi::ngx_http_complex_value_t;
use rl_core::limit::Limit;

/// A line's index in [`crate::conf::MainConf::lines`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LineId(pub u32);

impl LineId {
    /// The line in `lines`, the main configuration's lines.
    pub fn of(self, lines: &[Line]) -> Option<&Line> {
        lines.get(self.0 as usize)
    }
}

/// Where a line's states live, resolved in postconfiguration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Backend {
    /// Index into [`crate::conf::MainConf::zones`].
    Shm(usize),
    /// Index into [`crate::conf::MainConf::redis`].
    Redis(usize),
}

impl Backend {
    /// The Redis zone index, if the line is on a Redis zone.
    pub fn redis(self) -> Option<usize> {
        match self {
            Backend::Redis(z) => Some(z),
            Backend::Shm(_) => None,
        }
    }

    /// The shared-memory zone index, if the line is on one.
    pub fn shm(self) -> Option<usize> {
        match self {
            Backend::Shm(z) => Some(z),
            Backend::Redis(_) => None,
        }
    }
}

/// Which rate-limit response fields are sent (`rl_headers`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeadersMode {
    Off,
    Legacy,
    Draft,
    Both,
}

impl HeadersMode {
    pub fn legacy(self) -> bool {
        matches!(self, HeadersMode::Legacy | HeadersMode::Both)
    }
    pub fn draft(self) -> bool {
        matches!(self, HeadersMode::Draft | HeadersMode::Both)
    }
}

/// One `rl_limit` line.
pub struct Line {
    pub backend: Backend,
    pub zone_name: String,
    /// The key, a complex value allocated from the configuration pool.
    pub key: *mut ngx_http_complex_value_t,
    pub key_src: String,
    pub limit: Limit,
    pub cost: u64,
    /// Identity of this line's states inside the zone; stable across reloads
    /// while the line is unchanged.
    pub id: u64,
    /// The item name in the `RateLimit` / `RateLimit-Policy` fields.
    pub item: String,
    /// `file:line` of the directive, for messages found after parsing.
    pub origin: String,
}

impl Line {
    /// The identity of a line's states: the same on every nginx of a fleet
    /// running the same line (SipHash with fixed keys, not std's hasher, whose
    /// algorithm may change between Rust releases).
    pub fn identity(&self) -> u64 {
        let rate = self.limit.rate();
        let canon = format!(
            "{}|{}|{}|{}|{}|{}",
            self.zone_name,
            self.key_src,
            self.limit.algorithm(),
            rate.count,
            rate.period_us,
            self.limit.burst()
        );
        siphasher::sip::SipHasher13::new_with_keys(0, 0).hash(canon.as_bytes())
    }
}
