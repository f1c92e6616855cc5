//! Postconfiguration: zone names resolved, every line given its identity,
//! every location's lines sorted by zone, and what can only be checked
//! once every directive is read (two lines of one name that differ, a
//! Redis zone's exact range, a zone too small for its lines).

use core::ffi::c_void;
use core::sync::atomic::AtomicU64;
use core::{mem, ptr};
use std::collections::HashMap;

use ngx::ffi::{ngx_conf_t, ngx_pool_cleanup_add};
use rl_core::lease::Leasing;
use rl_core::spec::Quote;

use super::{after_parsing, refuse, ConfError, MainConf};
use crate::lease::{LeaseZone, Shared};
use crate::line::{Backend, Line, LineId, Stage};

/// Refuses two lines of one zone and name that differ in what a state
/// means (key, algorithm, rate, burst): they would share states.
fn check_names(lines: &[Line]) -> Result<(), ConfError> {
    let mut first: HashMap<(&str, &str), &Line> = HashMap::new();
    for line in lines {
        let Some(name) = line.name.as_deref() else { continue };
        let prev = *first.entry((&line.zone_name, name)).or_insert(line);
        let differs = if prev.key_src != line.key_src {
            Some(("key", prev.key_src.clone(), line.key_src.clone()))
        } else if prev.limit.algorithm() != line.limit.algorithm() {
            Some(("algorithm", prev.limit.algorithm().to_string(), line.limit.algorithm().to_string()))
        } else if prev.rate_src != line.rate_src {
            Some(("rate", prev.rate_src.clone(), line.rate_src.clone()))
        } else if prev.burst_src != line.burst_src {
            Some(("burst", prev.burst_src.clone(), line.burst_src.clone()))
        } else {
            None
        };
        if let Some((what, was, is)) = differs {
            refuse!(
                "{} \"{}\" of zone \"{}\" uses {}={} while previously ({}) it used {}={} in {}",
                line.directive(),
                name,
                Quote(&line.zone_name),
                what,
                Quote(&is),
                prev.origin,
                what,
                Quote(&was),
                line.origin
            );
        }
    }
    Ok(())
}

/// Refuses `rl_conn` lines that count the same requests (one state per
/// key) but wait in different lines: their state is laid out for one
/// waiting line, by its places in all and per class.
fn same_waiting_lines(lines: &[Line]) -> Result<(), ConfError> {
    let layout = |l: &Line| -> (u64, Vec<u64>) {
        match l.limit.queue() {
            0 => (0, Vec::new()),
            q => (q, l.lanes.iter().map(|lane| lane.places).collect()),
        }
    };
    let mut seen: HashMap<u64, &Line> = HashMap::new();
    for line in lines.iter().filter(|l| l.limit.is_concurrent()) {
        match seen.get(&line.counted_identity()) {
            Some(first) if layout(first) != layout(line) => refuse!(
                "\"rl_conn\" directive in {} counts the requests of the one in {} (zone \"{}\", key \"{}\") \
                 and must have the same \"queue\" and class queues",
                line.origin,
                first.origin,
                Quote(&line.zone_name),
                Quote(&line.key_src)
            ),
            Some(_) => {}
            None => {
                seen.insert(line.counted_identity(), line);
            }
        }
    }
    Ok(())
}

/// Gives the lines with variables a word in memory every worker shares,
/// for the time each last logged a bad value (at most once a second per
/// line, whatever the workers), and each lease zone what its workers know
/// of Redis ([`crate::lease::Shared`]): anonymous shared memory mapped
/// before the workers fork, unmapped with the cycle's pool. Without it
/// (mmap failed), each worker keeps its own.
fn share_among_workers(cf: *mut ngx_conf_t, mcf: &mut MainConf) {
    let n = mcf.lines.iter().filter(|l| l.vars.is_some()).count();
    let words = n * mem::size_of::<AtomicU64>();
    let bytes = words + mcf.leases.len() * mem::size_of::<Shared>();
    if bytes == 0 {
        return;
    }
    // SAFETY: a new anonymous mapping, shared with the processes forked after it.
    let p = unsafe {
        libc::mmap(
            ptr::null_mut(),
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return;
    }
    // SAFETY: cf->pool is the cycle's pool, destroyed with the cycle.
    let Some(cln) = (unsafe { ngx_pool_cleanup_add((*cf).pool, mem::size_of::<Mapping>()).as_mut() }) else {
        // SAFETY: mapped above, used by nothing yet.
        unsafe { libc::munmap(p, bytes) };
        return;
    };
    // SAFETY: ngx_pool_cleanup_add allocated size_of::<Mapping>() bytes for the data.
    unsafe { cln.data.cast::<Mapping>().write(Mapping { addr: p, bytes }) };
    cln.handler = Some(unmap);
    let times = p.cast::<AtomicU64>();
    for (i, vars) in mcf.lines.iter_mut().filter_map(|l| l.vars.as_deref_mut()).enumerate() {
        // SAFETY: i < n words of the zero-filled mapping (zero is a valid AtomicU64), which lives
        // as long as the cycle's pool, as the lines do.
        unsafe { vars.share(times.add(i)) };
    }
    // (`Shared` is atomics of 8 bytes: its alignment is the words')
    // SAFETY: the bytes after the words, within the mapping.
    let zones = unsafe { p.cast::<u8>().add(words) }.cast::<Shared>();
    for (i, lz) in mcf.leases.iter_mut().enumerate() {
        // SAFETY: i < the zones the mapping has room for; zero-filled atomics are a valid Shared,
        // and the mapping lives as long as the cycle's pool, as the zones do.
        unsafe { lz.share_in(zones.add(i)) };
    }
}

/// A mapping to undo when the cycle's pool is destroyed.
struct Mapping {
    addr: *mut c_void,
    bytes: usize,
}

extern "C" fn unmap(data: *mut c_void) {
    // SAFETY: the Mapping written by share_log_times, in the cleanup's data.
    let m = unsafe { &*data.cast::<Mapping>() };
    // SAFETY: mapped by share_log_times; the lines that used it go with the same pool.
    unsafe { libc::munmap(m.addr, m.bytes) };
}

/// Resolves zone names, gives each line its identity and sorts every
/// location's lines by zone (the order in which zone locks are taken).
/// Errors are logged here ([`after_parsing`]), naming the directive and its
/// `file:line` as nginx does for errors found after parsing.
pub fn finish(cf: *mut ngx_conf_t, mcf: &mut MainConf) -> Result<(), ConfError> {
    // SAFETY: cf is the http{} configuration being finished; its log is the cycle's.
    let log = unsafe { (*cf).log };
    mcf.resolver = http_resolver(cf);
    after_parsing(log, resolve(cf, mcf))
}

/// The `http` block's `resolver`, with its `resolver_timeout` (nginx's
/// default, 30 s, where none is set), if it has one: nginx gives every
/// block a resolver object, one with no name server where none is set.
fn http_resolver(cf: *mut ngx_conf_t) -> Option<(core::ptr::NonNull<ngx::ffi::ngx_resolver_t>, ngx::ffi::ngx_msec_t)> {
    use ngx::http::{HttpModuleLocationConf, NgxHttpCoreModule};
    // SAFETY: cf is the http{} configuration: its location configuration is the block's own.
    let clcf = unsafe { NgxHttpCoreModule::location_conf(&*cf) }?;
    let resolver = core::ptr::NonNull::new(clcf.resolver).filter(|r| r.as_ptr() as isize != -1)?;
    // SAFETY: a set resolver pointer is a resolver nginx created for this configuration.
    if unsafe { resolver.as_ref() }.connections.nelts == 0 {
        return None;
    }
    let timeout = if clcf.resolver_timeout == ngx::ffi::ngx_msec_t::MAX { 30_000 } else { clcf.resolver_timeout };
    Some((resolver, timeout))
}

/// An `rl_conn` line on Redis zone `r`: refused on a zone in lease mode,
/// whose leases are units of a rate, and with a lent reserve, which the
/// zone's script does not lend.
fn redis_conn(leases: &[LeaseZone], r: usize, line: &Line) -> Result<(), ConfError> {
    if leases.iter().any(|l| l.redis == r) {
        refuse!(
            "zone \"{}\" has \"lease\", whose leases cannot hold requests in flight, in \"rl_conn\" directive in {}",
            Quote(&line.zone_name),
            line.origin
        );
    }
    if line.lanes.iter().any(|l| l.lend) {
        refuse!(
            "\"lend\" needs a shared-memory zone, \"{}\" is on Redis, in \"rl_conn\" directive in {}",
            Quote(&line.zone_name),
            line.origin
        );
    }
    Ok(())
}

/// A line on Memcached zone `zone`: its counters serve `fixed` and
/// `sliding` lines, which hold no request in flight and keep no class
/// reserves.
fn memcached_line(zone: &str, line: &Line) -> Result<(), ConfError> {
    if line.limit.is_concurrent() {
        refuse!(
            "memcached zone \"{}\" cannot hold requests in flight in \"{}\" directive in {}",
            Quote(zone),
            line.directive(),
            line.origin
        );
    }
    if !rl_core::memcached::supports(&line.limit) {
        refuse!(
            "algorithm \"{}\" is not supported on memcached zone \"{}\", which supports \"fixed\" and \"sliding\", \
             in \"{}\" directive in {}",
            line.limit.algorithm().name(),
            Quote(zone),
            line.directive(),
            line.origin
        );
    }
    if line.classes.is_some() {
        refuse!(
            "memcached zone \"{}\" cannot keep class reserves in \"{}\" directive in {}",
            Quote(zone),
            line.directive(),
            line.origin
        );
    }
    Ok(())
}

fn resolve(cf: *mut ngx_conf_t, mcf: &mut MainConf) -> Result<(), ConfError> {
    check_names(&mcf.lines)?;
    for line in mcf.lines.iter_mut() {
        let shm = mcf.zones.iter().position(|z| z.name == line.zone_name);
        let redis = mcf.redis.iter().position(|z| z.name == line.zone_name);
        line.backend = match (shm, redis) {
            (Some(i), _) => Backend::Shm(i),
            (None, Some(i)) => Backend::Redis(i),
            (None, None) => {
                // (a limit_req habit's hint before the place, where nginx's own messages end)
                let hint = rl_core::habits::limit_zone(&line.zone_name).map(|h| format!(", {h}")).unwrap_or_default();
                refuse!(
                    "unknown zone \"{}\" in \"{}\" directive{} in {}",
                    Quote(&line.zone_name),
                    line.directive(),
                    hint,
                    line.origin
                );
            }
        };
        line.id = line.identity();
        let memcached = line.backend.redis().and_then(|r| mcf.redis.get(r)).filter(|z| z.is_memcached());
        if let Some(z) = memcached {
            memcached_line(&z.name, line)?;
        }
        if let Some(r) = line.backend.redis().filter(|_| line.limit.is_concurrent()) {
            redis_conn(&mcf.leases, r, line)?;
        }
        if line.limit.rate_waits() && line.backend.redis().is_some() {
            refuse!(
                "\"classes\" with \"queue\" need a shared-memory zone, \"{}\" is on Redis, in \"rl_limit\" directive in {}",
                Quote(&line.zone_name),
                line.origin
            );
        }
        match line.backend {
            Backend::Shm(i) => mcf.zones[i].note_line(&line.limit),
            // A rate or burst from variables is checked per request.
            Backend::Redis(_) if memcached.is_none() && !line.limit_varies() && !rl_core::redis::exact(&line.limit) => {
                refuse!(
                    "rate {} with burst {} is out of the range a Redis zone computes exactly in \"rl_limit\" directive in {}",
                    line.limit.rate(),
                    line.limit.burst(),
                    line.origin
                );
            }
            Backend::Redis(_) => {}
        }
        if let Some(z) = line.backend.redis().and_then(|r| mcf.leases.iter().position(|l| l.redis == r)) {
            let lz = &mut mcf.leases[z];
            // (a line whose rate or burst comes from variables: each key leased under its own)
            let limit = match line.limit_varies() {
                true => line.limit.varying(),
                false => line.limit,
            };
            let leasing = match Leasing::new(limit, lz.life_of(&line.limit)) {
                Ok(leasing) => leasing,
                Err(e) => refuse!(
                    "{} (zone \"{}\" has \"lease\") in \"rl_limit\" directive in {}",
                    e,
                    Quote(&line.zone_name),
                    line.origin
                ),
            };
            if lz.leasing(line.id).is_none() {
                lz.lines.push((line.id, leasing));
            }
            line.lease = Some((z, leasing));
            if line.classes.is_some() {
                refuse!(
                    "zone \"{}\" has \"lease\", whose leases cannot keep class reserves, in \"rl_limit\" directive in {}",
                    Quote(&line.zone_name),
                    line.origin
                );
            }
        }
    }
    // (the workers keep what they hold of a Redis zone with rl_conn lines)
    for line in mcf.lines.iter().filter(|l| l.limit.is_concurrent()) {
        if let Some(z) = line.backend.redis().and_then(|r| mcf.redis.get_mut(r)) {
            z.holds = true;
        }
    }
    same_waiting_lines(&mcf.lines)?;
    share_among_workers(cf, mcf);
    // Lines with one identity share states, queued units included, and
    // overdrafts (which only the script's exact range bounds).
    let mut deepest: HashMap<u64, u64> = HashMap::new();
    for line in &mcf.lines {
        let d = deepest.entry(line.id).or_insert(0);
        *d = match line.charge_after {
            true => rl_core::redis::OVERDRAWN,
            false => (*d).max(line.limit.queue()),
        };
    }
    for line in mcf.lines.iter_mut() {
        line.deepest_queue = deepest.get(&line.id).copied().unwrap_or(0);
        // (`on_error=local`: what a nginx admitted alone is charged in full when Redis is back)
        if line.lease.is_some_and(|(z, _)| mcf.leases.get(z).is_some_and(|l| l.local)) {
            line.deepest_queue = rl_core::redis::OVERDRAWN;
        }
    }
    let lines = &mcf.lines;
    let backend = |id: &LineId| lines.get(id.0 as usize).map(|l| l.backend);
    for &loc in &mcf.locs {
        // SAFETY: registered in merge_loc_conf; location confs live as long as the cycle.
        let loc = unsafe { &mut *loc };
        // (at most MAX_ZONES_PER_LOCATION zones: cmd_rl_limit counts them)
        loc.lines.sort_by_key(backend);
        loc.has_redis = loc.lines.iter().any(|id| matches!(backend(id), Some(Backend::Redis(_))));
        loc.has_conn = !loc.conns.is_empty();
        // (rl_limit lines of classes with a queue wait in a line too)
        loc.conn_queue = loc.lines.iter().any(|id| lines.get(id.0 as usize).is_some_and(Line::waits));
        loc.redis_queue = loc
            .conns
            .iter()
            .any(|id| lines.get(id.0 as usize).is_some_and(|l| l.waits() && l.backend.redis().is_some()));
        // (a request's look at a Redis zone's waiting lines is one request's lines in one call,
        // all or nothing: one line each)
        let mut waits_on: Vec<usize> = Vec::new();
        for l in loc.conns.iter().filter_map(|id| lines.get(id.0 as usize)) {
            let Some(z) = l.backend.redis().filter(|_| l.waits()) else { continue };
            if waits_on.contains(&z) {
                refuse!(
                    "Redis zone \"{}\" can keep one waiting line (\"queue=\") per location, \
                     a second in \"rl_conn\" directive in {}",
                    Quote(&l.zone_name),
                    l.origin
                );
            }
            waits_on.push(z);
        }
        loc.after_auth =
            loc.lines.iter().any(|id| lines.get(id.0 as usize).is_some_and(|l| l.stage == Stage::AfterAuth));
        loc.may_delay = loc.lines.iter().any(|id| lines.get(id.0 as usize).is_some_and(|l| l.limit.queue() > 0));
        loc.may_dry_run =
            loc.dry_run() || loc.lines.iter().any(|id| lines.get(id.0 as usize).is_some_and(|l| l.dry_run));
    }
    for zone in mcf.zones.iter_mut() {
        if let Err(msg) = zone.check_fits() {
            refuse!("{} in \"rl_zone\" directive in {}", msg, zone.origin);
        }
    }
    Ok(())
}
