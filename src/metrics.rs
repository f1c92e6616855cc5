//! `rl_metrics`: counters of every line's verdicts, of the shared-memory
//! zones, of the Redis zones and of their leases, for the whole nginx,
//! served in the Prometheus text format or as JSON by the location that
//! has the directive.
//!
//! Counting is one atomic add per active line and request on the worker's
//! own slot ([`store`]); nothing is counted without `rl_metrics` anywhere in
//! the configuration (no zone is laid out). The rendering is rl-core's
//! [`rl_core::metrics`].

pub mod store;

use core::ffi::{c_char, c_void};
use core::ptr;
use std::collections::HashSet;
use std::sync::atomic::Ordering;

use ngx::core::{Status, NGX_CONF_ERROR, NGX_CONF_OK};
use ngx::ffi::{
    ngx_chain_t, ngx_command_t, ngx_conf_t, ngx_core_conf_t, ngx_core_module, ngx_create_temp_buf, ngx_http_arg,
    ngx_http_discard_request_body, ngx_http_output_filter, ngx_http_request_t, ngx_http_send_header, ngx_ncpu,
    ngx_shared_memory_add, ngx_str_t, ngx_worker, NGX_HTTP_GET, NGX_HTTP_HEAD, NGX_HTTP_NOT_ALLOWED, NGX_LOG_EMERG,
};
use ngx::http::{HttpModuleLocationConf, HttpModuleMainConf, NgxHttpCoreModule, Request};
use ngx::ngx_conf_log_error;
use rl_core::metrics::{
    error_verdict, verdict, ConnSample, LeaseZoneSample, LineSample, RedisZoneSample, ShmZoneSample, Snapshot,
    ERROR_KINDS, ERR_CONNECTION, ERR_REFUSED, ERR_SCRIPT, ERR_TIMEOUT, LATENCY_BUCKETS, RESULTS,
};

use self::store::{Kind, Layout, Want};
use crate::conf::{ConfError, MainConf};
use crate::line::{Line, Stage};
use crate::redis_zone::RedisError;
use crate::request::{Ctx, LineResult};
use crate::Module;

/// The counters' shared memory zone: a name no `rl_zone` can have (those
/// refuse `=`), so that it never meets a user's zone.
const ZONE_NAME: &str = "=rl_metrics";

/// The identity of a Redis zone's row: its name.
fn redis_ident(name: &str) -> u64 {
    siphasher::sip::SipHasher13::new_with_keys(0, 0).hash(name.as_bytes())
}

/// The identity of a lease zone's row: its Redis zone's name, hashed apart
/// from [`redis_ident`]'s (rows are matched by kind as well; this keeps the
/// identities distinct for whoever reads them alone).
fn lease_ident(name: &str) -> u64 {
    siphasher::sip::SipHasher13::new_with_keys(0, 1).hash(name.as_bytes())
}

/// The identity of the row of class `name` of a line of identity `line`:
/// hashed apart from line identities (rows of one kind share one space).
fn class_ident(line: u64, name: &str) -> u64 {
    siphasher::sip::SipHasher13::new_with_keys(0, 2).hash(format!("{line:016x}\0{name}").as_bytes())
}

/// Slots per row: the workers (`worker_processes`, else the CPUs), as a
/// power of two.
fn nslots(cf: *mut ngx_conf_t) -> usize {
    // SAFETY: cf is the configuration being finished; the core module's configuration exists
    // from the start of the cycle (worker_processes is set if it came before http{}).
    let workers = unsafe {
        let ctx = (*(*cf).cycle).conf_ctx;
        let ccf = (*ctx.add(ngx_core_module.index)).cast::<ngx_core_conf_t>();
        ccf.as_ref().map_or(-1, |c| c.worker_processes)
    };
    // SAFETY: ngx_ncpu is set when nginx starts.
    let n = if workers > 0 { workers as usize } else { unsafe { ngx_ncpu }.max(1) as usize };
    n.next_power_of_two().min(256)
}

/// Registers the counters' zone, in postconfiguration, when some location
/// has `rl_metrics` (lines are finished: their identities are known).
/// nginx logs why a zone cannot be added (its name or size taken).
pub fn setup(cf: *mut ngx_conf_t, mcf: &mut MainConf) -> Result<(), ConfError> {
    let m = &mut mcf.metrics;
    if !m.enabled {
        return Ok(());
    }
    // (lines of one identity share one row, and their classes one row each)
    let mut want = |want: Want| match m.layout.wants.iter().position(|w| *w == want) {
        Some(i) => i,
        None => {
            m.layout.wants.push(want);
            m.layout.wants.len() - 1
        }
    };
    let line_want: Vec<usize> = mcf.lines.iter().map(|line| want(Want { kind: Kind::Line, ident: line.id })).collect();
    let mut class_want = Vec::new();
    for (li, line) in mcf.lines.iter().enumerate() {
        for (c, name) in line.classes.iter().flat_map(|cl| cl.names.iter().enumerate()) {
            class_want.push((li, c, want(Want { kind: Kind::Line, ident: class_ident(line.id, name) })));
        }
    }
    m.layout.line_want = line_want;
    m.layout.class_want = class_want;
    for z in &mcf.redis {
        m.layout.wants.push(Want { kind: Kind::Redis, ident: redis_ident(&z.name) });
        m.layout.redis_want.push(m.layout.wants.len() - 1);
    }
    // (one want per lease zone, whatever: lease_want is indexed as mcf.leases)
    for lz in &mcf.leases {
        let name = mcf.redis.get(lz.redis).map_or("", |z| z.name.as_str());
        m.layout.wants.push(Want { kind: Kind::Lease, ident: lease_ident(name) });
        m.layout.lease_want.push(m.layout.wants.len() - 1);
    }
    m.layout.nslots = nslots(cf);
    let size = store::zone_size(&m.layout.wants, m.layout.nslots);
    let mut name = ngx_str_t { len: ZONE_NAME.len(), data: ZONE_NAME.as_ptr() as *mut u8 };
    // SAFETY: cf is the configuration being finished; the tag marks the zone as ours.
    let shm_zone = unsafe { ngx_shared_memory_add(cf, &mut name, size, crate::module_tag()) };
    // SAFETY: NULL or a zone entry of the new cycle.
    let Some(shm) = (unsafe { shm_zone.as_mut() }) else {
        return Err(ConfError::Logged);
    };
    shm.init = Some(store::zone_init);
    shm.data = (&mut m.layout as *mut Layout).cast();
    Ok(())
}

/// In each worker, when it starts: its slot, its Redis zones' rows for its
/// calls and its lease zones' rows for its syncs.
pub fn init_worker(mcf: &MainConf) {
    if mcf.metrics.enabled {
        // SAFETY: set by nginx before init_process.
        let worker = unsafe { ngx_worker };
        store::init_worker(worker, &mcf.metrics.layout.redis, &mcf.metrics.layout.lease);
        for (line, row) in mcf.lines.iter().zip(&mcf.metrics.layout.lines) {
            if let Some(row) = row {
                line.set_counters(row.slot(worker));
            }
        }
        for (&(li, c, _), row) in mcf.metrics.layout.class_want.iter().zip(&mcf.metrics.layout.classes) {
            let classes = mcf.lines.get(li).and_then(|l| l.classes.as_deref());
            if let (Some(classes), Some(row)) = (classes, row) {
                classes.set_counters(c, row.slot(worker));
            }
        }
    }
}

/// Counts the verdict of each active line of the stage just decided: once
/// per request and stage, where the stage's decision is final.
#[inline(always)]
pub fn count(mcf: &MainConf, ctx: &Ctx) {
    if !mcf.metrics.enabled {
        return;
    }
    let stage = ctx.stage;
    match ctx.only() {
        Some((line, res)) => count_line(stage, line, res),
        None => ctx.iter(&mcf.lines).for_each(|(line, res)| count_line(stage, line, res)),
    }
}

/// [`count`] for one line of the request.
#[inline(always)]
fn count_line(stage: Stage, line: &Line, res: &LineResult) {
    if res.active && line.stage == stage {
        let v = verdict(res.admitted(), res.dry_run, res.delay_us());
        if let Some(slot) = line.counters() {
            slot.add(v);
        }
        if let Some(slot) = line.classes.as_deref().and_then(|c| c.counters(usize::from(res.class))) {
            slot.add(v);
        }
    }
}

/// Redis zone `zone` could not decide the request (`e`) and `on_error`
/// does: counts the error, what `on_error` did, and each of the zone's
/// active lines of the stage being decided as `error_allowed` or
/// `error_denied` (they are left out of [`count`] afterwards: inactive).
pub fn redis_failed(mcf: &MainConf, ctx: &Ctx, zone: usize, allow: bool, e: &RedisError) {
    let m = &mcf.metrics;
    if !m.enabled {
        return;
    }
    let mut denied = false;
    let stage = ctx.stage;
    for (line, res) in ctx.iter(&mcf.lines) {
        // (a line decided on this nginx, by its leases or alone, has its verdict counted)
        if !res.active || res.leased || line.backend.redis() != Some(zone) || line.stage != stage {
            continue;
        }
        let v = error_verdict(allow, res.dry_run);
        denied |= v == rl_core::metrics::ERROR_DENIED;
        if let Some(slot) = line.counters() {
            slot.add(v);
        }
    }
    if let Some(Some(row)) = m.layout.redis.get(zone) {
        let slot = row.mine();
        if let Some(c) = slot.errors.get(error_kind(e)) {
            c.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(c) = slot.on_error.get(usize::from(denied)) {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A `charge=after` charge of `lines` lines on Redis zone `zone` failed:
/// known not charged (`lost`), or of unknown outcome.
pub fn charge_failed(mcf: &MainConf, zone: usize, lines: usize, lost: bool) {
    if let Some(Some(row)) = mcf.metrics.layout.redis.get(zone) {
        let slot = row.mine();
        let counter = if lost { &slot.charge_failures } else { &slot.charge_unknown };
        counter.fetch_add(lines as u64, Ordering::Relaxed);
    }
}

/// The kind an error counts as.
fn error_kind(e: &RedisError) -> usize {
    match e.inner() {
        RedisError::Timeout | RedisError::Late => ERR_TIMEOUT,
        RedisError::Io(_) | RedisError::NotConnected { .. } | RedisError::Unreachable(_) => ERR_CONNECTION,
        RedisError::Server(_) | RedisError::Malformed(_) | RedisError::Protocol(_) => ERR_SCRIPT,
        RedisError::Overloaded
        | RedisError::Unanswered
        | RedisError::NotSent
        | RedisError::NoZone
        | RedisError::At(..) => ERR_REFUSED,
    }
}

/// The line's label: its name, else its identity (16 hex digits: names
/// are tokens a user writes, unlikely to be one).
fn line_label(line: &Line) -> String {
    match &line.name {
        Some(n) => n.clone(),
        None => format!("{:016x}", line.id),
    }
}

/// The verdicts a row of a line (or of a class) counts, summed over the
/// workers' slots.
fn verdicts(row: &store::Row<store::LineSlot>) -> [u64; RESULTS.len()] {
    let mut results = [0u64; RESULTS.len()];
    for slot in row.slots() {
        for (sum, c) in results.iter_mut().zip(slot.0.iter()) {
            *sum = sum.wrapping_add(c.load(Ordering::Relaxed));
        }
    }
    results
}

/// Every counter, summed over the workers' slots.
pub fn snapshot(mcf: &MainConf) -> Snapshot {
    let m = &mcf.metrics;
    let mut s = Snapshot::default();
    let mut seen = HashSet::new();
    for (i, line) in mcf.lines.iter().enumerate() {
        if !seen.insert(line.id) {
            continue;
        }
        let results = m.layout.lines.get(i).and_then(Option::as_ref).map_or([0; RESULTS.len()], verdicts);
        let rate = line.limit.rate();
        let conn = line.limit.is_concurrent();
        let mut classes = Vec::new();
        for (&(li, c, _), row) in m.layout.class_want.iter().zip(&m.layout.classes) {
            let name = line.classes.as_deref().and_then(|cl| cl.names.get(c));
            let (Some(name), Some(row), true) = (name, row, li == i) else { continue };
            classes.push((name.clone(), verdicts(row)));
        }
        s.lines.push(LineSample {
            zone: line.zone_name.clone(),
            line: line_label(line),
            results,
            rate_per_s: (!conn && line.vars.as_ref().is_none_or(|v| v.rate.is_none()))
                .then(|| rate.count as f64 * 1e6 / rate.period_us.max(1) as f64),
            burst: (!line.burst_varies() && !conn).then(|| line.limit.burst()),
            max: conn.then(|| line.limit.burst()),
            classes,
        });
    }
    for zone in &mcf.zones {
        let Some((stats, used)) = zone.usage() else { continue };
        s.shm.push(ShmZoneSample {
            zone: zone.name.clone(),
            size_bytes: zone.size as u64,
            keys: stats.used as u64,
            capacity_keys: stats.capacity as u64,
            bytes_used: used as u64,
            evicted_idle: stats.evicted_idle,
            evicted_limited: stats.evictions,
            conn: zone.conn_totals(),
        });
    }
    for (z, zone) in mcf.redis.iter().enumerate() {
        let conn = zone.holds.then(ConnSample::default);
        let memcached = zone.is_memcached();
        let mut r = RedisZoneSample { zone: zone.name.clone(), conn, memcached, ..Default::default() };
        if let Some(Some(row)) = m.layout.redis.get(z) {
            let add =
                |sum: &mut u64, c: &core::sync::atomic::AtomicU64| *sum = sum.wrapping_add(c.load(Ordering::Relaxed));
            for slot in row.slots() {
                add(&mut r.calls, &slot.calls);
                add(&mut r.call_requests, &slot.call_requests);
                for b in 0..LATENCY_BUCKETS {
                    if let (Some(sum), Some(c)) = (r.latency.get_mut(b), slot.latency.get(b)) {
                        add(sum, c);
                    }
                }
                add(&mut r.latency_sum_us, &slot.latency_sum_us);
                for k in 0..ERROR_KINDS.len() {
                    if let (Some(sum), Some(c)) = (r.errors.get_mut(k), slot.errors.get(k)) {
                        add(sum, c);
                    }
                }
                add(&mut r.on_error_allowed, &slot.on_error[0]);
                add(&mut r.on_error_denied, &slot.on_error[1]);
                add(&mut r.charge_failures, &slot.charge_failures);
                add(&mut r.charge_unknown, &slot.charge_unknown);
                add(&mut r.connects, &slot.connects);
                add(&mut r.counters_lost, &slot.counters_lost);
                if let Some(master) = slot.master() {
                    r.masters.push(master);
                }
                if let Some(c) = r.conn.as_mut() {
                    add(&mut c.in_flight, &slot.conn_held);
                    add(&mut c.reclaimed, &slot.conn_reclaimed);
                    add(&mut c.waiting, &slot.conn_waiting);
                }
            }
        }
        r.masters.sort();
        r.masters.dedup();
        s.redis.push(r);
    }
    for (z, lz) in mcf.leases.iter().enumerate() {
        let Some(zone) = mcf.redis.get(lz.redis) else { continue };
        let mut l = LeaseZoneSample { zone: zone.name.clone(), ..Default::default() };
        if let Some(Some(row)) = m.layout.lease.get(z) {
            let add =
                |sum: &mut u64, c: &core::sync::atomic::AtomicU64| *sum = sum.wrapping_add(c.load(Ordering::Relaxed));
            for slot in row.slots() {
                add(&mut l.syncs, &slot.syncs);
                add(&mut l.sync_failures, &slot.sync_failures);
                add(&mut l.sync_latency_sum_us, &slot.sync_latency_sum_us);
                add(&mut l.keys_synced, &slot.keys_synced);
                add(&mut l.leases_granted, &slot.leases_granted);
                add(&mut l.units_granted, &slot.units_granted);
                add(&mut l.units_returned, &slot.units_returned);
                add(&mut l.alone, &slot.alone);
            }
        }
        l.nodes = lz.nodes();
        l.alone_now = u64::from(lz.alone());
        // (a zone not initialised yet shows no keys)
        if let Some((stats, _)) = lz.table.usage() {
            l.keys = stats.used as u64;
            l.capacity_keys = stats.capacity as u64;
        }
        s.leases.push(l);
    }
    s
}

/// `rl_metrics;`: the location answers with the metrics.
pub extern "C" fn cmd_rl_metrics(cf: *mut ngx_conf_t, _cmd: *mut ngx_command_t, _conf: *mut c_void) -> *mut c_char {
    // SAFETY: called by nginx while parsing a location: cf is valid.
    let (mcf, clcf) = unsafe { (Module::main_conf_mut(&*cf), NgxHttpCoreModule::location_conf_mut(&*cf)) };
    let (Some(mcf), Some(clcf)) = (mcf, clcf) else {
        ngx_conf_log_error!(NGX_LOG_EMERG, cf, "\"rl_metrics\" directive: no configuration to attach to");
        return NGX_CONF_ERROR;
    };
    mcf.metrics.enabled = true;
    clcf.handler = Some(metrics_handler);
    NGX_CONF_OK
}

ngx::http_request_handler!(metrics_handler, serve);

const PROMETHEUS_TYPE: &str = "text/plain; version=0.0.4";
const JSON_TYPE: &str = "application/json";

fn serve(r: &mut Request) -> Status {
    let raw: *mut ngx_http_request_t = (&mut *r).into();
    if let Err(status) = get_or_head(raw) {
        return status;
    }
    let Some(mcf) = Module::main_conf(r) else {
        return Status(500);
    };
    let mut value = ngx_str_t::empty();
    let name = b"format";
    // SAFETY: the request is valid in its content handler; the name is read for its length only.
    let json = unsafe { ngx_http_arg(raw, name.as_ptr() as *mut u8, name.len(), &mut value) } == 0
        && value.as_bytes() == b"json";
    let snap = snapshot(mcf);
    let mut body = String::with_capacity(4096);
    let ctype = if json {
        rl_core::metrics::json(&snap, &mut body);
        JSON_TYPE
    } else {
        rl_core::metrics::prometheus(&snap, &mut body);
        if body.is_empty() {
            body.push_str("# no rl_limit line and no rl_zone\n");
        }
        PROMETHEUS_TYPE
    };
    send(raw, 200, ctype, body.as_bytes())
}

/// What a content handler that answers GET and HEAD (`rl_metrics`,
/// `rl_quota`) does first: another method is answered 405, and the request
/// body is discarded. `Err`: the status the handler returns.
pub(crate) fn get_or_head(r: *mut ngx_http_request_t) -> Result<(), Status> {
    // SAFETY: the request is valid in its content handler.
    let method = unsafe { (*r).method } as u32;
    if method & (NGX_HTTP_GET | NGX_HTTP_HEAD) == 0 {
        return Err(Status(NGX_HTTP_NOT_ALLOWED as isize));
    }
    // SAFETY: as above.
    match unsafe { ngx_http_discard_request_body(r) } {
        0 => Ok(()),
        rc => Err(Status(rc)),
    }
}

/// Sends `status` with `body`, from a content handler.
pub(crate) fn send(r: *mut ngx_http_request_t, status: usize, ctype: &'static str, body: &[u8]) -> Status {
    // SAFETY: the request is valid in its content handler; the content type is static.
    unsafe {
        let h = &mut (*r).headers_out;
        h.status = status;
        h.content_length_n = body.len() as i64;
        h.content_type = ngx_str_t { len: ctype.len(), data: ctype.as_ptr() as *mut u8 };
        h.content_type_len = ctype.len();
        h.content_type_lowcase = ptr::null_mut();
    }
    // SAFETY: as above.
    let rc = unsafe { ngx_http_send_header(r) };
    // SAFETY: as above.
    if rc == Status::NGX_ERROR.0 || rc > 0 || unsafe { (*r).header_only() } != 0 {
        return Status(rc);
    }
    // SAFETY: the request pool is valid; the buffer gets body.len() bytes.
    let b = unsafe { ngx_create_temp_buf((*r).pool, body.len()) };
    // SAFETY: NULL or a fresh buffer.
    let Some(buf) = (unsafe { b.as_mut() }) else {
        return Status::NGX_ERROR;
    };
    // SAFETY: the buffer has room for body.len() bytes from pos.
    unsafe {
        ptr::copy_nonoverlapping(body.as_ptr(), buf.pos, body.len());
        buf.last = buf.pos.add(body.len());
    }
    buf.set_last_buf(1);
    buf.set_last_in_chain(1);
    let mut out = ngx_chain_t { buf: b, next: ptr::null_mut() };
    // SAFETY: the chain lives until the call returns; nginx copies what it keeps.
    Status(unsafe { ngx_http_output_filter(r, &mut out) })
}
