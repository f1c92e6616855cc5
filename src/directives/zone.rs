//! `rl_zone NAME size=SIZE;`, `rl_zone NAME redis=URL ...;` or `rl_zone
//! NAME memcached=ADDRESS,... ...;`: a zone in shared memory, on Redis
//! ([`super::redis`]), or on Memcached ([`super::memcached`]).

use core::ffi::{c_char, c_void};

use ngx::ffi::{ngx_command_t, ngx_conf_t, ngx_str_t};
use rl_core::habits;
use rl_core::lease::Kept;
use rl_core::parse::parse_size;
use rl_core::spec::{params, Quote};

use super::{args, arguments, bytes, memcached, origin, redis, text};
use crate::conf::{self, refuse, ConfError, MainConf, MAX_REDIS_ZONES};
use crate::lease::LeaseZone;
use crate::shm::{self, Zone};

pub extern "C" fn cmd_rl_zone(cf: *mut ngx_conf_t, _cmd: *mut ngx_command_t, conf: *mut c_void) -> *mut c_char {
    // SAFETY: the main configuration of this module, as registered with NGX_HTTP_MAIN_CONF_OFFSET.
    let mcf = unsafe { &mut *conf.cast::<MainConf>() };
    // SAFETY: called by nginx while parsing, cf is valid.
    let args = unsafe { args(cf) };
    conf::at_directive(cf, rl_zone(cf, mcf, args))
}

fn rl_zone(cf: *mut ngx_conf_t, mcf: &mut MainConf, args: &[ngx_str_t]) -> Result<(), ConfError> {
    // (NGX_CONF_1MORE: nginx has checked there is a name)
    let Some(name_arg) = args.get(1) else {
        return Err(arguments("rl_zone"));
    };
    let name = text(name_arg);
    if name.is_empty() || name.contains('=') {
        let hint = habits::zone_name(name).map(|h| format!(", {h}")).unwrap_or_default();
        refuse!("invalid zone name \"{}\" in \"rl_zone\" directive{}", Quote(&name_arg.to_string()), hint);
    }
    if mcf.zones.iter().any(|z| z.name == name) || mcf.redis.iter().any(|z| z.name == name) {
        refuse!("duplicate zone \"{}\" in \"rl_zone\" directive", Quote(name));
    }
    let known: Vec<&'static str> = ["size", "redis", "memcached"].into_iter().chain(redis::PARAMS).collect();
    // `rl_zone $binary_remote_addr zone=api:10m rate=10r/s;`: limit_req_zone's line.
    let key_hint = habits::zone_key(name);
    let hint = |arg: &str| match (habits::zone_param(arg), &key_hint) {
        (Some(h), Some(k)) => Some(format!("{h} ({k})")),
        (h, k) => h.or_else(|| k.clone()),
    };
    let given = params("rl_zone", &bytes(args.get(2..).unwrap_or_default()), &known, hint)?;
    if let Some(servers) = given.get("memcached") {
        if let Some((other, _)) = given.iter().find(|(n, _)| *n != "memcached" && !memcached::PARAMS.contains(n)) {
            refuse!("\"memcached\" and \"{}\" parameters cannot be used together in \"rl_zone\" directive", other);
        }
        if mcf.redis.len() == MAX_REDIS_ZONES {
            refuse!(
                "too many Redis and Memcached zones in \"rl_zone\" directive, at most {} are supported",
                MAX_REDIS_ZONES
            );
        }
        match memcached::parse(name, servers, |p| given.get(p)) {
            Ok(z) => mcf.redis.push(Box::new(z)),
            Err(e) => refuse!("{} in \"rl_zone\" directive", e),
        }
        return Ok(());
    }
    if let Some(url) = given.get("redis") {
        if given.get("size").is_some() {
            refuse!("\"size\" and \"redis\" parameters cannot be used together in \"rl_zone\" directive");
        }
        if mcf.redis.len() == MAX_REDIS_ZONES {
            refuse!("too many Redis zones in \"rl_zone\" directive, at most {} are supported", MAX_REDIS_ZONES);
        }
        // SAFETY: cf and its cycle are valid while the configuration is parsed.
        let conf_prefix = unsafe { (*(*cf).cycle).conf_prefix.to_str().unwrap_or("") };
        let zone = match redis::parse(name, url, |p| given.get(p), conf_prefix) {
            Ok(z) => Box::new(z),
            Err(e) => refuse!("{} in \"rl_zone\" directive", e),
        };
        let sync = match redis::sync_param(|p| given.get(p)) {
            Ok(sync) => sync,
            Err(e) => refuse!("{} in \"rl_zone\" directive", e),
        };
        let life = match redis::life_param(|p| given.get(p), sync, zone.spec.timeout) {
            Ok(life) => life,
            Err(e) => refuse!("{} in \"rl_zone\" directive", e),
        };
        if let (Some(sync), Some(life), Some(value)) = (sync, life, given.get("lease")) {
            let size = checked_size(name, "lease", value)?;
            // (Zone::add logs why it fails, as nginx's ngx_shared_memory_add does)
            let mut table = Zone::add(cf, name, size).map_err(|()| ConfError::Logged)?;
            table.origin = origin(cf);
            table.note_words(Kept::WORDS);
            let local = given.get("on_error") == Some("local");
            let times = crate::lease::Times { sync, timeout: zone.spec.timeout, life };
            mcf.leases.push(LeaseZone::new(name, mcf.redis.len(), table, times, local));
        }
        mcf.redis.push(zone);
        return Ok(());
    }
    let Some(value) = given.get("size") else {
        refuse!("\"rl_zone\" directive must have \"size\", \"redis\" or \"memcached\" parameter");
    };
    if let Some((other, _)) = given.iter().find(|(n, _)| *n != "size") {
        refuse!("\"size\" and \"{}\" parameters cannot be used together in \"rl_zone\" directive", other);
    }
    let size = checked_size(name, "size", value)?;
    // (Zone::add logs why it fails, as nginx's ngx_shared_memory_add does)
    let mut zone = Zone::add(cf, name, size).map_err(|()| ConfError::Logged)?;
    zone.origin = origin(cf);
    mcf.zones.push(zone);
    Ok(())
}

/// The size of zone `name`'s shared memory, `param=value`, checked: from
/// nginx's smallest zone to what this machine can map.
fn checked_size(name: &str, param: &str, value: &str) -> Result<usize, ConfError> {
    let Ok(size) = parse_size(value) else {
        refuse!("invalid zone size \"{}={}\" in \"rl_zone\" directive", param, Quote(value));
    };
    let min = shm::min_size();
    if size < min {
        refuse!(
            "zone \"{}\" is too small in \"rl_zone\" directive: {}={}, it must be at least {}k",
            Quote(name),
            param,
            Quote(value),
            min / 1024
        );
    }
    if size > shm::MAX_SIZE {
        refuse!(
            "zone \"{}\" is too large in \"rl_zone\" directive: {}={}, it must be at most {}g",
            Quote(name),
            param,
            Quote(value),
            shm::MAX_SIZE >> 30
        );
    }
    if let Some(memory) = shm::memory_and_swap().filter(|m| size as u64 > *m) {
        refuse!(
            "zone \"{}\" is too large in \"rl_zone\" directive: {}={}, more than the memory of this machine \
             (RAM and swap: {}m)",
            Quote(name),
            param,
            Quote(value),
            memory >> 20
        );
    }
    Ok(size)
}
