//! `rl_limit zone=NAME rate=RATE [key=KEY] [algorithm=ALG] [burst=N]
//! [cost=N] [name=NAME] [queue=N] [charge=before|after] [dry_run]
//! [after_auth];` and `rl_conn zone=NAME max=N [key=KEY] [cost=N]
//! [queue=N [timeout=T]] [priority=VALUE classes=CLASS,...] [name=NAME]
//! [dry_run] [after_auth];`: their arguments are read by
//! [`LineSpec::parse`] and [`ConnSpec::parse`]; here is what needs nginx:
//! variables compiled, the location's zones counted, the line stored in the
//! main configuration.

use core::ffi::{c_char, c_void};
use core::ptr;
use core::sync::atomic::AtomicPtr;

use ngx::ffi::{ngx_command_t, ngx_conf_t, ngx_str_t};
use ngx::http::HttpModuleMainConf;
use rl_core::limit::Limit;
use rl_core::spec::{one_variable, ClassSpec, ConnSpec, LineSpec, SpecError};

use super::{args, bytes, compile_complex_value, origin, variable_index};
use crate::conf::{self, refuse, ConfError, LocConf, MainConf};
use crate::line::{Backend, Classes, KeySource, Line, LineId, Stage, VarParam, VarValue, Varying};
use crate::shm::MAX_ZONES_PER_LOCATION;
use crate::Module;

pub extern "C" fn cmd_rl_limit(cf: *mut ngx_conf_t, _cmd: *mut ngx_command_t, conf: *mut c_void) -> *mut c_char {
    // SAFETY: the location configuration of this module (NGX_HTTP_LOC_CONF_OFFSET).
    let lcf = unsafe { &mut *conf.cast::<LocConf>() };
    // SAFETY: called by nginx while parsing, cf is valid.
    let args = unsafe { args(cf) };
    conf::at_directive(cf, rl_limit(cf, lcf, args))
}

pub extern "C" fn cmd_rl_conn(cf: *mut ngx_conf_t, _cmd: *mut ngx_command_t, conf: *mut c_void) -> *mut c_char {
    // SAFETY: the location configuration of this module (NGX_HTTP_LOC_CONF_OFFSET).
    let lcf = unsafe { &mut *conf.cast::<LocConf>() };
    // SAFETY: called by nginx while parsing, cf is valid.
    let args = unsafe { args(cf) };
    conf::at_directive(cf, rl_conn(cf, lcf, args))
}

fn rl_limit(cf: *mut ngx_conf_t, lcf: &mut LocConf, args: &[ngx_str_t]) -> Result<(), ConfError> {
    // SAFETY: the module's main configuration exists while parsing http{}.
    let Some(mcf) = (unsafe { Module::main_conf_mut(&*cf) }) else {
        refuse!("\"rl_limit\" directive is not allowed here");
    };
    // rate=, burst= and cost= may hold variables: those are compiled, and
    // the line holds a placeholder for them until a request comes.
    let spec = LineSpec::parse(&bytes(args.get(1..).unwrap_or_default()), |v| var_param(cf, v))?;
    let name = match spec.name {
        None => None,
        Some(n) if Line::valid_name(n) => Some(n.to_string()),
        Some(n) => return Err(SpecError::Name(n.to_string()).into()),
    };
    count_zones(mcf, lcf, spec.zone, "rl_limit")?;
    let key_src = spec.key()?;
    let limit = spec.limit;
    let kept = rl_core::spec::classes::kept(&spec.classes);
    let classes = classes(cf, spec.priority, &spec.classes, kept)?;
    let line = Line {
        burst_text: if spec.burst_varies { String::new() } else { limit.burst().to_string() },
        queue: spec.queue,
        deepest_queue: spec.queue,
        rate_src: spec.rate_src,
        burst_src: spec.burst_src,
        vars: Varying::new(spec.vars.rate, spec.vars.burst, spec.vars.cost),
        charge_after: spec.charge_after,
        // (only a line of classes with `queue=` waits: see `Line::wait_in`)
        wait_ms: if spec.lanes.is_empty() { 0 } else { rate_wait_ms(&limit, spec.queue) },
        lanes: spec.lanes.clone(),
        classes,
        ..new_line(cf, spec.zone, key_src, limit, spec.cost, name, spec.dry_run, spec.after_auth)?
    };
    push_line(mcf, lcf, line, "rl_limit")
}

fn rl_conn(cf: *mut ngx_conf_t, lcf: &mut LocConf, args: &[ngx_str_t]) -> Result<(), ConfError> {
    // SAFETY: the module's main configuration exists while parsing http{}.
    let Some(mcf) = (unsafe { Module::main_conf_mut(&*cf) }) else {
        refuse!("\"rl_conn\" directive is not allowed here");
    };
    let spec = ConnSpec::parse(&bytes(args.get(1..).unwrap_or_default()))?;
    let name = match spec.name {
        None => None,
        Some(n) if Line::valid_name(n) => Some(n.to_string()),
        Some(n) => {
            refuse!("invalid name \"{}\" in \"rl_conn\" directive, it must be letters, digits, \"_\" and \"-\"", n)
        }
    };
    count_zones(mcf, lcf, spec.zone, "rl_conn")?;
    let key_src = spec.key()?;
    // (the limit is not part of a concurrency line's identity: as limit_conn's, lines of one zone
    // and key count the same requests, each against its own max)
    // (its waiting line keeps the reserves: nothing kept per request)
    let classes = classes(cf, spec.priority, &spec.classes, Vec::new())?;
    let line = Line {
        burst_text: spec.limit.burst().to_string(),
        queue: spec.queue,
        deepest_queue: spec.queue,
        wait_ms: spec.timeout_ms,
        lanes: spec.lanes.clone(),
        classes,
        ..new_line(cf, spec.zone, key_src, spec.limit, spec.cost, name, spec.dry_run, spec.after_auth)?
    };
    push_line(mcf, lcf, line, "rl_conn")
}

/// How long a request waits at most in the waiting line of an `rl_limit`
/// line of classes with `queue` places (ms): as long as the rate takes to
/// let that many through, the most a line without classes delays one, and
/// one emission interval more, so that the last place, whose turn comes
/// as its wait ends, is not refused by a timer a tick late.
fn rate_wait_ms(limit: &Limit, queue: u64) -> u64 {
    let rate = limit.rate();
    let us = u128::from(queue.saturating_add(1)) * u128::from(rate.period_us) / u128::from(rate.count.max(1));
    u64::try_from(us.div_ceil(1000)).unwrap_or(u64::MAX).max(1)
}

/// A line's classes (`priority=`, `classes=`), what a request of each must
/// leave of the budget (`kept`, an `rl_limit` line's), and its counters to
/// come; `None` without `priority=`.
fn classes(
    cf: *mut ngx_conf_t,
    priority: Option<&str>,
    specs: &[ClassSpec<'_>],
    kept: Vec<u64>,
) -> Result<Option<Box<Classes>>, ConfError> {
    let Some(priority) = priority else {
        return Ok(None);
    };
    let names = specs.iter().map(|c| c.name.to_string()).collect();
    let counters = specs.iter().map(|_| AtomicPtr::new(ptr::null_mut())).collect();
    Ok(Some(Box::new(Classes { priority: var_param(cf, priority)?, names, kept, counters })))
}

/// Counts the location's zones with `zone`: the lines of one level are all a
/// location has (inner levels replace outer ones), so its zones are counted
/// here, where the message can point at the line that goes over (zone names
/// are unique across kinds).
fn count_zones(mcf: &MainConf, lcf: &LocConf, zone: &str, directive: &str) -> Result<(), ConfError> {
    let mut zones: Vec<&str> =
        lcf.limits.iter().chain(&lcf.conns).filter_map(|&id| mcf.line(id)).map(|l| l.zone_name.as_str()).collect();
    zones.push(zone);
    zones.sort_unstable();
    zones.dedup();
    if zones.len() > MAX_ZONES_PER_LOCATION {
        refuse!(
            "too many zones in one location in \"{}\" directive, at most {} are supported",
            directive,
            MAX_ZONES_PER_LOCATION
        );
    }
    Ok(())
}

/// A line of what both directives give; the rest as a static line has it.
#[allow(clippy::too_many_arguments)]
fn new_line(
    cf: *mut ngx_conf_t,
    zone: &str,
    key_src: &str,
    limit: Limit,
    cost: u64,
    name: Option<String>,
    dry_run: bool,
    after_auth: bool,
) -> Result<Line, ConfError> {
    // (the value is part of an argument, or static: either lives as long as the cycle)
    let key = compile_complex_value(cf, key_src)?;
    let key_source = match one_variable(key_src) {
        // (variable names are not case-sensitive)
        Some(name) if name.eq_ignore_ascii_case("binary_remote_addr") => KeySource::ClientAddr,
        Some(name) if VarValue::matches() => KeySource::Var(variable_index(cf, name)?),
        _ => KeySource::Complex,
    };
    Ok(Line {
        backend: Backend::Shm(usize::MAX),
        zone_name: zone.to_string(),
        key,
        key_source,
        key_src: key_src.to_string(),
        limit,
        cost,
        id: 0,
        item: String::new(),
        burst_text: String::new(),
        origin: origin(cf),
        name,
        dry_run,
        queue: 0,
        wait_ms: 0,
        deepest_queue: 0,
        rate_src: String::new(),
        burst_src: String::new(),
        vars: None,
        charge_after: false,
        stage: if after_auth { Stage::AfterAuth } else { Stage::BeforeAuth },
        lease: None,
        counters: AtomicPtr::new(ptr::null_mut()),
        lanes: Vec::new(),
        classes: None,
    })
}

/// Names the line's item, refuses it where the level has its identity
/// already, and stores it with the level's lines of its directive.
fn push_line(mcf: &mut MainConf, lcf: &mut LocConf, mut line: Line, directive: &str) -> Result<(), ConfError> {
    let level = |lcf: &LocConf| -> Vec<LineId> { lcf.limits.iter().chain(&lcf.conns).copied().collect() };
    let same_zone = level(lcf).iter().filter_map(|&id| mcf.line(id)).filter(|l| l.zone_name == line.zone_name).count();
    line.item = match &line.name {
        Some(n) => n.clone(),
        None if same_zone == 0 => line.zone_name.clone(),
        None => format!("{}-{}", line.zone_name, same_zone + 1),
    };
    let Ok(id) = u32::try_from(mcf.lines.len()) else {
        refuse!("too many \"{}\" directives", directive);
    };
    // One budget per identity: the same line twice in one block would be
    // charged twice for one request.
    let identity = line.identity();
    if level(lcf).iter().filter_map(|&id| mcf.line(id)).any(|l| l.identity() == identity) {
        refuse!("\"{}\" directive is duplicate", directive);
    }
    let conn = line.limit.is_concurrent();
    mcf.lines.push(line);
    match conn {
        true => lcf.conns.push(LineId(id)),
        false => lcf.limits.push(LineId(id)),
    }
    Ok(())
}

/// A parameter that holds variables, compiled (nginx logs why it cannot
/// be), and read by index where it is one variable and nothing else.
fn var_param(cf: *mut ngx_conf_t, value: &str) -> Result<VarParam, ConfError> {
    let cv = compile_complex_value(cf, value)?;
    let var = match one_variable(value) {
        // (the complex value compiled above registered the same name)
        Some(name) if VarValue::matches() => Some(variable_index(cf, name)?),
        _ => None,
    };
    Ok(VarParam { cv, var, src: value.to_string() })
}
