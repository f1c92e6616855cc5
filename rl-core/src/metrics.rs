//! What `rl_metrics` shows: the verdict a line's request counts as, and the
//! rendering of a snapshot of the counters as the Prometheus text format
//! (version 0.0.4) and as JSON with the same numbers.
//!
//! The counters themselves live in shared memory, per worker (the module's
//! `metrics` store); this is the part that needs no nginx.

use core::fmt::Write as _;

/// The verdicts a line counts, in the order of [`LineSample::results`] and
/// of the counters in a row. A dry-run line that would have admitted
/// without delay counts as `passed`: it did what an enforced line would.
pub const RESULTS: [&str; 7] =
    ["passed", "delayed", "rejected", "dry_run_delayed", "dry_run_rejected", "error_allowed", "error_denied"];
pub const PASSED: usize = 0;
pub const DELAYED: usize = 1;
pub const REJECTED: usize = 2;
pub const DRY_RUN_DELAYED: usize = 3;
pub const DRY_RUN_REJECTED: usize = 4;
pub const ERROR_ALLOWED: usize = 5;
pub const ERROR_DENIED: usize = 6;

/// Why a Redis zone could not decide a request, as the metric labels it.
pub const ERROR_KINDS: [&str; 4] = ["timeout", "connection", "script", "refused"];
pub const ERR_TIMEOUT: usize = 0;
pub const ERR_CONNECTION: usize = 1;
pub const ERR_SCRIPT: usize = 2;
pub const ERR_REFUSED: usize = 3;

/// Upper bounds of the call latency histogram's buckets, µs (a last
/// bucket, `+Inf`, follows).
pub const LATENCY_BOUNDS_US: [u64; 11] =
    [250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 1_000_000];
/// Buckets of the latency histogram, `+Inf` included.
pub const LATENCY_BUCKETS: usize = LATENCY_BOUNDS_US.len() + 1;

/// The verdict an evaluated line counts for a request it decided:
/// admitted (delayed when it makes the request wait), or rejected; a
/// dry-run line counts what it would have done.
#[inline]
pub fn verdict(admitted: bool, dry_run: bool, delay_us: u64) -> usize {
    match (admitted, dry_run, delay_us > 0) {
        (true, _, false) => PASSED,
        (true, false, true) => DELAYED,
        (true, true, true) => DRY_RUN_DELAYED,
        (false, false, _) => REJECTED,
        (false, true, _) => DRY_RUN_REJECTED,
    }
}

/// The verdict a line counts when its Redis zone failed and `on_error`
/// decided: a dry-run line never denies.
#[inline]
pub fn error_verdict(allow: bool, dry_run: bool) -> usize {
    if allow || dry_run {
        ERROR_ALLOWED
    } else {
        ERROR_DENIED
    }
}

/// The latency bucket of a call that took `us` µs.
pub fn latency_bucket(us: u64) -> usize {
    LATENCY_BOUNDS_US.iter().position(|&b| us <= b).unwrap_or(LATENCY_BOUNDS_US.len())
}

/// One line (lines with one identity are one line), its counters summed
/// over the workers.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LineSample {
    pub zone: String,
    /// The line's `name=`, or its identity in 16 hex digits.
    pub line: String,
    pub results: [u64; RESULTS.len()],
    /// Requests per second (the rate's count over its period); `None` when
    /// the rate is taken from variables per request.
    pub rate_per_s: Option<f64>,
    /// `None` when the burst is taken from variables per request (and for
    /// an `rl_conn` line).
    pub burst: Option<u64>,
    /// An `rl_conn` line's `max=` (`None` for an `rl_limit` line).
    pub max: Option<u64>,
    /// A line of classes (`classes=`): each class's name and verdicts.
    pub classes: Vec<(String, [u64; RESULTS.len()])>,
}

/// A shared-memory zone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShmZoneSample {
    pub zone: String,
    pub size_bytes: u64,
    pub keys: u64,
    pub capacity_keys: u64,
    pub bytes_used: u64,
    /// States dropped to make room that were idle (back to full).
    pub evicted_idle: u64,
    /// States dropped to make room that were still limiting their key.
    pub evicted_limited: u64,
    /// A zone of `rl_conn` lines: its units in flight and for workers
    /// that died, and its requests waiting for a slot.
    pub conn: Option<ConnSample>,
}

/// An `rl_conn` zone's totals.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConnSample {
    /// Units held by requests in flight.
    pub in_flight: u64,
    /// Units given back for workers that died, so far.
    pub reclaimed: u64,
    /// Requests waiting for a slot (`queue=`).
    pub waiting: u64,
}

/// A Redis zone, summed over the workers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RedisZoneSample {
    pub zone: String,
    /// Script calls answered (or failed) by Redis.
    pub calls: u64,
    /// Requests those calls decided (their sum: requests per call is this
    /// over `calls`).
    pub call_requests: u64,
    /// Calls per latency bucket (not cumulative; the last is `+Inf`).
    pub latency: [u64; LATENCY_BUCKETS],
    pub latency_sum_us: u64,
    /// Requests the zone could not decide, by [`ERROR_KINDS`].
    pub errors: [u64; ERROR_KINDS.len()],
    /// Requests `on_error` let through, and rejected.
    pub on_error_allowed: u64,
    pub on_error_denied: u64,
    /// Connections opened.
    pub connects: u64,
    /// `charge=after` charges known not charged (the call was not sent, or
    /// Redis refused it).
    pub charge_failures: u64,
    /// `charge=after` charges whose outcome is unknown (no reply: Redis
    /// may have run the call).
    pub charge_unknown: u64,
    /// A zone of `rl_conn` lines: the units this nginx's requests hold, and
    /// those Redis reclaimed from workers gone as its calls were told.
    pub conn: Option<ConnSample>,
    /// For a Sentinel zone: the masters the workers' connections go to
    /// (`host:port`, distinct, sorted).
    pub masters: Vec<String>,
    /// A Memcached zone (its families are `nginx_rl_memcached_*`).
    pub memcached: bool,
    /// A Memcached zone's counters found lost within their window.
    pub counters_lost: u64,
}

/// A Redis zone in lease mode: its syncs summed over the workers (one
/// worker syncs; a reload's new one goes on in the same row), and the keys
/// this nginx keeps leases for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeaseZoneSample {
    /// The Redis zone's name.
    pub zone: String,
    /// Lease calls made, answered or failed.
    pub syncs: u64,
    /// Lease calls that failed or timed out.
    pub sync_failures: u64,
    /// Their time, from the start of a call to its answer or failure.
    pub sync_latency_sum_us: u64,
    /// Keys sent in those calls (per call: this over `syncs`).
    pub keys_synced: u64,
    /// Grants of at least one unit.
    pub leases_granted: u64,
    pub units_granted: u64,
    /// Units given back that Redis took back.
    pub units_returned: u64,
    /// Times this nginx lost Redis and limited alone (`on_error=local`).
    pub alone: u64,
    /// 1 while this nginx limits alone, 0 otherwise.
    pub alone_now: u64,
    /// The nginx that share the zone, as this one last heard (its
    /// heartbeat's count; 1 before any).
    pub nodes: u64,
    /// Keys the zone keeps a lease record for, and most it can.
    pub keys: u64,
    pub capacity_keys: u64,
}

/// Everything one scrape shows.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    pub lines: Vec<LineSample>,
    pub shm: Vec<ShmZoneSample>,
    pub redis: Vec<RedisZoneSample>,
    pub leases: Vec<LeaseZoneSample>,
}

/// A label value as the text format writes it: `\`, `"` and newline escaped.
pub fn escape_label(v: &str, out: &mut String) {
    // Zone and line names are tokens: nearly always nothing to escape, and one copy.
    if !v.bytes().any(|b| matches!(b, b'\\' | b'"' | b'\n')) {
        out.push_str(v);
        return;
    }
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// A JSON string (quotes included).
pub fn escape_json(v: &str, out: &mut String) {
    out.push('"');
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Writes `# HELP` and `# TYPE` for a metric family.
fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = write!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n");
}

/// Writes one sample: `name{l1="v1",...} value`.
fn sample(out: &mut String, name: &str, labels: &[(&str, &str)], value: impl core::fmt::Display) {
    out.push_str(name);
    if !labels.is_empty() {
        out.push('{');
        for (i, (k, v)) in labels.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(k);
            out.push_str("=\"");
            escape_label(v, out);
            out.push('"');
        }
        out.push('}');
    }
    let _ = writeln!(out, " {value}");
}

/// µs as seconds, exactly as a decimal.
struct Seconds(u64);

impl core::fmt::Display for Seconds {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let (s, us) = (self.0 / 1_000_000, self.0 % 1_000_000);
        if us == 0 {
            return write!(f, "{s}");
        }
        let frac = format!("{us:06}");
        write!(f, "{s}.{}", frac.trim_end_matches('0'))
    }
}

/// A number of a zone's sample.
type ZoneField = fn(&ShmZoneSample) -> u64;
/// A number of a lease zone's sample.
type LeaseField = fn(&LeaseZoneSample) -> u64;

/// The Prometheus text exposition format, version 0.0.4. A family with no
/// sample is left out.
pub fn prometheus(s: &Snapshot, out: &mut String) {
    if !s.lines.is_empty() {
        family(out, "nginx_rl_requests_total", "counter", "Requests each rl_limit line decided, by verdict.");
        for l in &s.lines {
            for (r, n) in RESULTS.iter().zip(l.results) {
                sample(out, "nginx_rl_requests_total", &[("zone", &l.zone), ("line", &l.line), ("result", r)], n);
            }
        }
        if s.lines.iter().any(|l| !l.classes.is_empty()) {
            let name = "nginx_rl_class_requests_total";
            family(out, name, "counter", "Requests each line of classes decided, by the request's class and verdict.");
            for l in &s.lines {
                for (class, results) in &l.classes {
                    for (r, n) in RESULTS.iter().zip(results) {
                        let labels = [("zone", l.zone.as_str()), ("line", &l.line), ("class", class), ("result", r)];
                        sample(out, name, &labels, *n);
                    }
                }
            }
        }
        family(out, "nginx_rl_limit", "gauge", "Configured limit of each rl_limit line: rate (per second) and burst.");
        for l in &s.lines {
            if let Some(rate) = l.rate_per_s {
                sample(out, "nginx_rl_limit", &[("zone", &l.zone), ("line", &l.line), ("param", "rate")], rate);
            }
            if let Some(burst) = l.burst {
                sample(out, "nginx_rl_limit", &[("zone", &l.zone), ("line", &l.line), ("param", "burst")], burst);
            }
            if let Some(max) = l.max {
                sample(out, "nginx_rl_limit", &[("zone", &l.zone), ("line", &l.line), ("param", "max")], max);
            }
        }
    }
    if !s.shm.is_empty() {
        let gauges: [(&str, &str, ZoneField); 4] = [
            ("nginx_rl_zone_keys", "Keys a shared-memory zone holds a state for.", |z| z.keys),
            ("nginx_rl_zone_capacity_keys", "Keys a shared-memory zone can hold.", |z| z.capacity_keys),
            ("nginx_rl_zone_size_bytes", "Size of a shared-memory zone.", |z| z.size_bytes),
            (
                "nginx_rl_zone_bytes_used",
                "Bytes of a shared-memory zone in use: its table's header and buckets, its keys' entries and logs.",
                |z| z.bytes_used,
            ),
        ];
        for (name, help, get) in gauges {
            family(out, name, "gauge", help);
            for z in &s.shm {
                sample(out, name, &[("zone", &z.zone)], get(z));
            }
        }
        family(
            out,
            "nginx_rl_zone_evictions_total",
            "counter",
            "States dropped to make room in a full zone: idle (back to full) or still limiting their key.",
        );
        for z in &s.shm {
            sample(out, "nginx_rl_zone_evictions_total", &[("zone", &z.zone), ("state", "idle")], z.evicted_idle);
            sample(out, "nginx_rl_zone_evictions_total", &[("zone", &z.zone), ("state", "limited")], z.evicted_limited);
        }
    }
    conn_prometheus(s, out);
    if !s.redis.is_empty() {
        redis_prometheus(&s.redis, out);
    }
    if !s.leases.is_empty() {
        lease_prometheus(&s.leases, out);
    }
}

/// The lease zones' families: one series per zone each.
fn lease_prometheus(zones: &[LeaseZoneSample], out: &mut String) {
    let per_zone = |out: &mut String, name: &str, kind: &str, help: &str, get: LeaseField| {
        family(out, name, kind, help);
        for z in zones {
            sample(out, name, &[("zone", &z.zone)], get(z));
        }
    };
    let help = "Lease calls a lease zone's syncs made to Redis, answered or failed.";
    per_zone(out, "nginx_rl_lease_syncs_total", "counter", help, |z| z.syncs);
    let help = "Lease calls that failed or timed out (their keys' leases not renewed until the next sync).";
    per_zone(out, "nginx_rl_lease_sync_failures_total", "counter", help, |z| z.sync_failures);
    // A summary without quantiles: the mean is all a sync's time needs (a sync per interval).
    let h = "nginx_rl_lease_sync_duration_seconds";
    family(out, h, "summary", "Time from a lease call's start to its answer (or failure).");
    for z in zones {
        sample(out, &format!("{h}_sum"), &[("zone", &z.zone)], Seconds(z.sync_latency_sum_us));
        sample(out, &format!("{h}_count"), &[("zone", &z.zone)], z.syncs);
    }
    let help = "Keys sent in lease calls (per call: over syncs_total).";
    per_zone(out, "nginx_rl_lease_keys_synced_total", "counter", help, |z| z.keys_synced);
    let help = "Leases of at least one unit Redis granted.";
    per_zone(out, "nginx_rl_leases_granted_total", "counter", help, |z| z.leases_granted);
    let help = "Units Redis granted in leases.";
    per_zone(out, "nginx_rl_lease_units_granted_total", "counter", help, |z| z.units_granted);
    let help = "Units left by ended leases, given back and taken back by Redis.";
    per_zone(out, "nginx_rl_lease_units_returned_total", "counter", help, |z| z.units_returned);
    let help = "Times this nginx lost Redis and limited alone, with its share of each line (on_error=local).";
    per_zone(out, "nginx_rl_lease_alone_total", "counter", help, |z| z.alone);
    let help = "1 while this nginx limits alone, having lost Redis (on_error=local), else 0.";
    per_zone(out, "nginx_rl_lease_alone", "gauge", help, |z| z.alone_now);
    let help = "Live nginx sharing a lease zone's Redis, as this one's last heartbeat counted them.";
    per_zone(out, "nginx_rl_lease_nodes", "gauge", help, |z| z.nodes);
    let help = "Keys a lease zone keeps a lease record for.";
    per_zone(out, "nginx_rl_lease_keys", "gauge", help, |z| z.keys);
    let help = "Keys a lease zone can keep a lease record for.";
    per_zone(out, "nginx_rl_lease_capacity_keys", "gauge", help, |z| z.capacity_keys);
}

/// The `rl_conn` families: shared-memory zones' and Redis zones' lines.
fn conn_prometheus(s: &Snapshot, out: &mut String) {
    let shm = s.shm.iter().filter_map(|z| Some((z.zone.as_str(), z.conn?)));
    let redis = s.redis.iter().filter_map(|z| Some((z.zone.as_str(), z.conn?)));
    let conn: Vec<(&str, ConnSample)> = shm.chain(redis).collect();
    if !conn.is_empty() {
        family(
            out,
            "nginx_rl_conn_in_flight",
            "gauge",
            "Units of rl_conn lines held by requests in flight (on a Redis zone, this nginx's).",
        );
        for (zone, c) in &conn {
            sample(out, "nginx_rl_conn_in_flight", &[("zone", zone)], c.in_flight);
        }
        family(out, "nginx_rl_conn_waiting", "gauge", "Requests waiting for a slot of an rl_conn line (queue=).");
        for (zone, c) in &conn {
            sample(out, "nginx_rl_conn_waiting", &[("zone", zone)], c.waiting);
        }
        family(
            out,
            "nginx_rl_conn_reclaimed_total",
            "counter",
            "Units of rl_conn lines held by worker processes that died, given back by the workers started after them (on a Redis zone, by Redis, as this nginx's calls were told).",
        );
        for (zone, c) in &conn {
            sample(out, "nginx_rl_conn_reclaimed_total", &[("zone", zone)], c.reclaimed);
        }
    }
}

/// The families of one kind of store zone: Redis zones' or Memcached
/// zones' names and words.
struct Store {
    memcached: bool,
    /// The families' prefix.
    p: &'static str,
    zone: &'static str,
    call: &'static str,
    /// [`ERROR_KINDS`] as this store's errors are labelled.
    kinds: [&'static str; ERROR_KINDS.len()],
}

const REDIS: Store =
    Store { memcached: false, p: "nginx_rl_redis", zone: "a Redis zone", call: "script call", kinds: ERROR_KINDS };

/// (a Memcached call is one round trip per server the batch touches, side by side)
const MEMCACHED: Store = Store {
    memcached: true,
    p: "nginx_rl_memcached",
    zone: "a Memcached zone",
    call: "call (its round trips to the zone's servers)",
    kinds: ["timeout", "connection", "reply", "refused"],
};

fn redis_prometheus(all: &[RedisZoneSample], out: &mut String) {
    for store in [REDIS, MEMCACHED] {
        let zones: Vec<&RedisZoneSample> = all.iter().filter(|z| z.memcached == store.memcached).collect();
        if !zones.is_empty() {
            store_prometheus(&zones, &store, out);
        }
    }
    family(
        out,
        "nginx_rl_charge_failures_total",
        "counter",
        "Costs of charge=after lines a Redis or Memcached zone did not charge: the call was not sent, or the server refused it (logged, not retried).",
    );
    for z in all {
        sample(out, "nginx_rl_charge_failures_total", &[("zone", &z.zone)], z.charge_failures);
    }
    family(
        out,
        "nginx_rl_charge_unknown_total",
        "counter",
        "Costs of charge=after lines whose call got no reply: the server may or may not have charged them (logged, not retried).",
    );
    for z in all {
        sample(out, "nginx_rl_charge_unknown_total", &[("zone", &z.zone)], z.charge_unknown);
    }
}

/// The families of one store's zones.
fn store_prometheus(zones: &[&RedisZoneSample], st: &Store, out: &mut String) {
    let p = st.p;
    let name = |n: &str| format!("{p}_{n}");
    let calls = name("calls_total");
    family(out, &calls, "counter", &format!("Calls made to {} (each a {}).", st.zone, st.call));
    for z in zones {
        sample(out, &calls, &[("zone", &z.zone)], z.calls);
    }
    let reqs = name("call_requests_total");
    family(out, &reqs, "counter", "Requests decided by those calls (per call: over calls).");
    for z in zones {
        sample(out, &reqs, &[("zone", &z.zone)], z.call_requests);
    }
    let h = name("call_duration_seconds");
    family(out, &h, "histogram", "Time from a call's start to its answer (or failure).");
    for z in zones {
        let mut cum = 0u64;
        for (i, n) in z.latency.iter().enumerate() {
            cum = cum.wrapping_add(*n);
            let le = match LATENCY_BOUNDS_US.get(i) {
                Some(&b) => Seconds(b).to_string(),
                None => "+Inf".to_string(),
            };
            sample(out, &format!("{h}_bucket"), &[("zone", &z.zone), ("le", &le)], cum);
        }
        sample(out, &format!("{h}_sum"), &[("zone", &z.zone)], Seconds(z.latency_sum_us));
        sample(out, &format!("{h}_count"), &[("zone", &z.zone)], cum);
    }
    let errors = name("errors_total");
    family(out, &errors, "counter", &format!("Requests {} could not decide, by kind of error.", st.zone));
    for z in zones {
        for (k, n) in st.kinds.iter().zip(z.errors) {
            sample(out, &errors, &[("zone", &z.zone), ("kind", k)], n);
        }
    }
    let on_error = name("on_error_total");
    family(out, &on_error, "counter", "Requests on_error let through (allowed) or rejected (denied).");
    for z in zones {
        sample(out, &on_error, &[("zone", &z.zone), ("action", "allowed")], z.on_error_allowed);
        sample(out, &on_error, &[("zone", &z.zone), ("action", "denied")], z.on_error_denied);
    }
    let connects = name("connects_total");
    family(
        out,
        &connects,
        "counter",
        &format!(
            "Connections opened to {}'s servers (one per worker and server at first use; more are reconnects).",
            st.zone
        ),
    );
    for z in zones {
        sample(out, &connects, &[("zone", &z.zone)], z.connects);
    }
    if st.memcached {
        let lost = name("counters_lost_total");
        family(
            out,
            &lost,
            "counter",
            "Counters found lost within their window (evicted, or the server restarted): their keys were counted again from zero.",
        );
        for z in zones {
            sample(out, &lost, &[("zone", &z.zone)], z.counters_lost);
        }
    }
    if zones.iter().any(|z| !z.masters.is_empty()) {
        let master = name("master");
        family(out, &master, "gauge", "The master a Sentinel zone's connections go to (1 per address).");
        for z in zones {
            for m in &z.masters {
                sample(out, &master, &[("zone", &z.zone), ("addr", m)], 1);
            }
        }
    }
}

/// Writes `"name":value` pairs of counters as a JSON object.
fn json_object<'a>(out: &mut String, pairs: impl IntoIterator<Item = (&'a str, u64)>) {
    out.push('{');
    for (i, (k, v)) in pairs.into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        escape_json(k, out);
        let _ = write!(out, ":{v}");
    }
    out.push('}');
}

/// Opens the `i`-th object of a JSON array (a comma before all but the
/// first) with its first member, `"zone"`; the caller writes the rest.
fn open_object(out: &mut String, i: usize, zone: &str) {
    if i > 0 {
        out.push(',');
    }
    out.push_str("{\"zone\":");
    escape_json(zone, out);
}

/// The same numbers as [`prometheus`], as one JSON object:
/// `{"lines":[...],"zones":[...],"redis":[...],"leases":[...]}`.
pub fn json(s: &Snapshot, out: &mut String) {
    out.push_str("{\"lines\":[");
    for (i, l) in s.lines.iter().enumerate() {
        open_object(out, i, &l.zone);
        out.push_str(",\"line\":");
        escape_json(&l.line, out);
        out.push_str(",\"requests\":");
        json_object(out, RESULTS.iter().copied().zip(l.results));
        let null = |x: Option<String>| x.unwrap_or_else(|| "null".to_owned());
        let (rate, burst) = (null(l.rate_per_s.map(|r| r.to_string())), null(l.burst.map(|b| b.to_string())));
        let _ = write!(out, ",\"limit\":{{\"rate\":{rate},\"burst\":{burst}");
        if let Some(max) = l.max {
            let _ = write!(out, ",\"max\":{max}");
        }
        out.push('}');
        if !l.classes.is_empty() {
            out.push_str(",\"classes\":{");
            for (i, (class, results)) in l.classes.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                escape_json(class, out);
                out.push(':');
                json_object(out, RESULTS.iter().copied().zip(*results));
            }
            out.push('}');
        }
        out.push('}');
    }
    out.push_str("],\"zones\":[");
    for (i, z) in s.shm.iter().enumerate() {
        open_object(out, i, &z.zone);
        let _ = write!(
            out,
            ",\"keys\":{},\"capacity_keys\":{},\"size_bytes\":{},\"bytes_used\":{},\"evictions\":",
            z.keys, z.capacity_keys, z.size_bytes, z.bytes_used
        );
        json_object(out, [("idle", z.evicted_idle), ("limited", z.evicted_limited)]);
        if let Some(c) = z.conn {
            out.push_str(",\"conn\":");
            json_object(out, [("in_flight", c.in_flight), ("waiting", c.waiting), ("reclaimed", c.reclaimed)]);
        }
        out.push('}');
    }
    out.push_str("],\"redis\":[");
    for (i, z) in s.redis.iter().enumerate() {
        open_object(out, i, &z.zone);
        if z.memcached {
            let _ = write!(out, ",\"store\":\"memcached\",\"counters_lost\":{}", z.counters_lost);
        }
        let _ = write!(
            out,
            ",\"calls\":{},\"call_requests\":{},\"call_duration_seconds\":{{\"buckets\":{{",
            z.calls, z.call_requests
        );
        let mut cum = 0u64;
        for (i, n) in z.latency.iter().enumerate() {
            cum = cum.wrapping_add(*n);
            if i > 0 {
                out.push(',');
            }
            match LATENCY_BOUNDS_US.get(i) {
                Some(&b) => {
                    let _ = write!(out, "\"{}\":{cum}", Seconds(b));
                }
                None => {
                    let _ = write!(out, "\"+Inf\":{cum}");
                }
            }
        }
        let _ = write!(out, "}},\"sum\":{},\"count\":{cum}}},\"errors\":", Seconds(z.latency_sum_us));
        json_object(out, ERROR_KINDS.iter().copied().zip(z.errors));
        out.push_str(",\"on_error\":");
        json_object(out, [("allowed", z.on_error_allowed), ("denied", z.on_error_denied)]);
        let _ = write!(
            out,
            ",\"charge_failures\":{},\"charge_unknown\":{},\"connects\":{},\"masters\":[",
            z.charge_failures, z.charge_unknown, z.connects
        );
        for (i, m) in z.masters.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            escape_json(m, out);
        }
        out.push(']');
        if let Some(c) = z.conn {
            out.push_str(",\"conn\":");
            json_object(out, [("in_flight", c.in_flight), ("reclaimed", c.reclaimed)]);
        }
        out.push('}');
    }
    out.push_str("],\"leases\":[");
    for (i, z) in s.leases.iter().enumerate() {
        open_object(out, i, &z.zone);
        let _ = write!(
            out,
            ",\"syncs\":{},\"sync_failures\":{},\"sync_duration_seconds\":{{\"sum\":{},\"count\":{}}},\"keys_synced\":{},\
             \"leases_granted\":{},\"units_granted\":{},\"units_returned\":{},\"alone\":{},\"alone_now\":{},\"nodes\":{},\"keys\":{},\"capacity_keys\":{}}}",
            z.syncs,
            z.sync_failures,
            Seconds(z.sync_latency_sum_us),
            z.syncs,
            z.keys_synced,
            z.leases_granted,
            z.units_granted,
            z.units_returned,
            z.alone,
            z.alone_now,
            z.nodes,
            z.keys,
            z.capacity_keys
        );
    }
    out.push_str("]}\n");
}
