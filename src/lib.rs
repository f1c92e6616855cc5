//! ngx_http_rl_module: rate limiting for nginx.
//!
//! This file holds the module's statics and wires its hooks; the rest is by
//! concern, imports running one way (each imports only those before it):
//!
//! - [`metrics::store`]: the `rl_metrics` counters in shared memory;
//! - [`line`]: one `rl_limit` line as configured, and its identity;
//! - [`request`]: a request's lines and verdicts, across phases and
//!   redirects; [`delay`]: a delayed request's sleep;
//! - [`shm`]: shared-memory zones, their layout across reloads, the decision;
//! - [`redis_zone`]: Redis and Memcached zones, their calls and connections
//!   on the worker's event loop;
//! - [`lease`]: Redis zones in lease mode, decided on this nginx's leases
//!   in shared memory, and their syncs;
//! - [`conf`]: the configuration the directives leave, merged per location
//!   and finished;
//! - [`directives`]: the directive handlers, which fill the configuration;
//! - [`metrics`]: `rl_metrics`, counting verdicts and serving the counters;
//! - [`eval`]: a request's lines evaluated (keys, the rate, burst and cost
//!   of variables, the request's limits), and the wait for Redis, for the
//!   access phase and `rl_quota` alike;
//! - [`access`]: the pre-access and pre-content phases, the two stages,
//!   each combining its lines' verdicts all-or-nothing;
//! - [`quota`]: `rl_quota`, the lines read without charging anything;
//! - [`charge`]: `charge=after`, costs charged when the request is logged;
//! - [`headers`]: the response fields;
//! - [`variables`]: the `$rl_*` variables.
//!
//! The algorithms themselves are in the `rl-core` crate.

#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

use core::ffi::{c_char, c_void};
use core::sync::atomic::{AtomicBool, Ordering};
use core::{ptr, slice};

use ngx::core::{Status, NGX_CONF_ERROR};
use ngx::ffi::{
    ngx_array_push, ngx_command_t, ngx_conf_t, ngx_cycle_t, ngx_http_core_main_conf_t, ngx_http_handler_pt,
    ngx_http_module_t, ngx_http_phases, ngx_http_phases_NGX_HTTP_LOG_PHASE, ngx_http_phases_NGX_HTTP_PREACCESS_PHASE,
    ngx_http_phases_NGX_HTTP_PRECONTENT_PHASE, ngx_http_top_header_filter, ngx_int_t, ngx_module_t, ngx_process,
    ngx_str_t, ngx_test_config, ngx_uint_t, NGX_CONF_1MORE, NGX_CONF_FLAG, NGX_CONF_TAKE1, NGX_HTTP_LOC_CONF,
    NGX_HTTP_LOC_CONF_OFFSET, NGX_HTTP_MAIN_CONF, NGX_HTTP_MAIN_CONF_OFFSET, NGX_HTTP_MODULE, NGX_HTTP_SRV_CONF,
    NGX_LOG_NOTICE, NGX_PROCESS_MASTER,
};
use ngx::http::{HttpModule, HttpModuleLocationConf, HttpModuleMainConf, NgxHttpCoreModule};
use ngx::{ngx_log_error, ngx_string};

mod access;
mod charge;
mod conf;
mod delay;
mod directives;
mod eval;
mod headers;
mod lease;
mod line;
mod metrics;
mod quota;
mod redis_zone;
mod request;
mod shm;
mod variables;

use conf::{ConfError, LocConf, MainConf};
use directives::{
    cmd_rl_conn, cmd_rl_dry_run, cmd_rl_headers, cmd_rl_limit, cmd_rl_log_level, cmd_rl_status, cmd_rl_zone,
};
use line::Stage;

pub struct Module;

impl HttpModule for Module {
    fn module() -> &'static ngx_module_t {
        // SAFETY: the module static is only written by nginx while loading, before any handler runs.
        unsafe { &*ptr::addr_of!(ngx_http_rl_module) }
    }

    unsafe extern "C" fn preconfiguration(cf: *mut ngx_conf_t) -> ngx_int_t {
        match variables::add(cf) {
            Ok(()) => Status::NGX_OK.into(),
            Err(_) => Status::NGX_ERROR.into(),
        }
    }

    unsafe extern "C" fn postconfiguration(cf: *mut ngx_conf_t) -> ngx_int_t {
        // SAFETY: cf is the http{} configuration being finished.
        let Some(mcf) = (unsafe { Module::main_conf_mut(&*cf) }) else {
            return Status::NGX_ERROR.into();
        };
        if conf::finish(cf, mcf).is_err() || metrics::setup(cf, mcf).is_err() {
            return Status::NGX_ERROR.into();
        }
        mcf.ctx_var = variables::ctx_index(cf);
        if mcf.ctx_var.is_none() {
            return Status::NGX_ERROR.into();
        }
        // SAFETY: as above; the core module's main configuration always exists in http{}.
        let Some(cmcf) = (unsafe { NgxHttpCoreModule::main_conf_mut(&*cf) }) else {
            return Status::NGX_ERROR.into();
        };
        let cmcf: &mut ngx_http_core_main_conf_t = cmcf;
        // A phase runs its handlers last registered first. The lines before authentication where
        // limit_req decides, and after the handlers registered before ours there: realip's (set
        // in a location, it finds the client's address in this phase), limit_conn's, limit_req's.
        // The `after_auth` lines where every request access control allowed passes, `satisfy any`
        // or not, before try_files or mirror act on it. A handler (and the header filter) is
        // registered only where some line needs it: nginx calls a phase's handlers on every
        // request, of every location.
        let after_auth = mcf.lines.iter().any(|l| l.stage == Stage::AfterAuth);
        let charge_after = mcf.lines.iter().any(|l| l.charge_after);
        let added = [
            (!mcf.lines.is_empty(), ngx_http_phases_NGX_HTTP_PREACCESS_PHASE, access::preaccess_handler_pt(), true),
            (after_auth, ngx_http_phases_NGX_HTTP_PRECONTENT_PHASE, access::precontent_handler_pt(), false),
            // The costs charged after the response, where a line does that.
            (charge_after, ngx_http_phases_NGX_HTTP_LOG_PHASE, charge::log_handler_pt(), false),
        ];
        for (wanted, phase, handler, last) in added {
            if wanted && add_handler(cmcf, phase, handler, last).is_err() {
                return Status::NGX_ERROR.into();
            }
        }
        if mcf.lines.is_empty() {
            return Status::NGX_OK.into();
        }
        // SAFETY: the top header filter is a process global that every filter module rewires in
        // postconfiguration.
        unsafe {
            headers::NEXT_HEADER_FILTER = ngx_http_top_header_filter;
            ngx_http_top_header_filter = Some(headers::header_filter);
        }
        Status::NGX_OK.into()
    }

    unsafe extern "C" fn merge_loc_conf(cf: *mut ngx_conf_t, prev: *mut c_void, conf: *mut c_void) -> *mut c_char {
        // SAFETY: nginx passes the enclosing and the current location configuration of this module.
        let (prev, conf) = unsafe { (&*prev.cast::<LocConf>(), &mut *conf.cast::<LocConf>()) };
        conf.merge(prev);
        if !conf.lines.is_empty() {
            // SAFETY: cf is the configuration being merged.
            let Some(mcf) = (unsafe { Module::main_conf_mut(&*cf) }) else {
                return NGX_CONF_ERROR;
            };
            mcf.locs.push(conf);
        }
        ptr::null_mut()
    }
}

// SAFETY: MainConf is the type allocated by create_main_conf for this module.
unsafe impl HttpModuleMainConf for Module {
    type MainConf = MainConf;
}

// SAFETY: LocConf is the type allocated by create_loc_conf for this module.
unsafe impl HttpModuleLocationConf for Module {
    type LocationConf = LocConf;
}

const ANY_LEVEL: ngx_uint_t = (NGX_HTTP_MAIN_CONF | NGX_HTTP_SRV_CONF | NGX_HTTP_LOC_CONF) as ngx_uint_t;

/// A directive handler, as nginx calls it.
type SetFn = unsafe extern "C" fn(*mut ngx_conf_t, *mut ngx_command_t, *mut c_void) -> *mut c_char;

/// A directive: its name, where it may appear and how many arguments it
/// takes, its handler, and the configuration it writes.
const fn command(name: ngx_str_t, type_: ngx_uint_t, set: SetFn, conf: ngx_uint_t) -> ngx_command_t {
    ngx_command_t { name, type_, set: Some(set), conf, offset: 0, post: ptr::null_mut() }
}

const MAIN: ngx_uint_t = NGX_HTTP_MAIN_CONF_OFFSET;
const LOC: ngx_uint_t = NGX_HTTP_LOC_CONF_OFFSET;
const TAKE1: ngx_uint_t = NGX_CONF_TAKE1 as ngx_uint_t;
const FLAG: ngx_uint_t = NGX_CONF_FLAG as ngx_uint_t;
const MORE: ngx_uint_t = NGX_CONF_1MORE as ngx_uint_t;
const NOARGS: ngx_uint_t = ngx::ffi::NGX_CONF_NOARGS as ngx_uint_t;

static mut COMMANDS: [ngx_command_t; 10] = [
    command(ngx_string!("rl_zone"), NGX_HTTP_MAIN_CONF as ngx_uint_t | MORE, cmd_rl_zone, MAIN),
    command(ngx_string!("rl_limit"), ANY_LEVEL | MORE, cmd_rl_limit, LOC),
    command(ngx_string!("rl_conn"), ANY_LEVEL | MORE, cmd_rl_conn, LOC),
    command(ngx_string!("rl_status"), ANY_LEVEL | TAKE1, cmd_rl_status, LOC),
    command(ngx_string!("rl_headers"), ANY_LEVEL | MORE, cmd_rl_headers, LOC),
    command(ngx_string!("rl_dry_run"), ANY_LEVEL | FLAG, cmd_rl_dry_run, LOC),
    command(ngx_string!("rl_log_level"), ANY_LEVEL | TAKE1, cmd_rl_log_level, LOC),
    command(ngx_string!("rl_metrics"), NGX_HTTP_LOC_CONF as ngx_uint_t | NOARGS, metrics::cmd_rl_metrics, LOC),
    command(ngx_string!("rl_quota"), NGX_HTTP_LOC_CONF as ngx_uint_t | NOARGS, quota::cmd_rl_quota, LOC),
    ngx_command_t::empty(),
];

static NGX_HTTP_RL_MODULE_CTX: ngx_http_module_t = ngx_http_module_t {
    preconfiguration: Some(Module::preconfiguration),
    postconfiguration: Some(Module::postconfiguration),
    create_main_conf: Some(Module::create_main_conf),
    init_main_conf: None,
    create_srv_conf: None,
    merge_srv_conf: None,
    create_loc_conf: Some(Module::create_loc_conf),
    merge_loc_conf: Some(Module::merge_loc_conf),
};

ngx::ngx_modules!(ngx_http_rl_module);

#[used]
#[allow(non_upper_case_globals)]
pub static mut ngx_http_rl_module: ngx_module_t = ngx_module_t {
    ctx: ptr::addr_of!(NGX_HTTP_RL_MODULE_CTX) as *mut c_void,
    // SAFETY: a pointer to the first command; nginx reads the array until the empty entry.
    commands: unsafe { ptr::addr_of_mut!(COMMANDS[0]) },
    type_: NGX_HTTP_MODULE as ngx_uint_t,
    init_module: Some(init_module),
    init_process: Some(init_process),
    exit_process: Some(exit_process),
    ..ngx_module_t::default()
};

/// Logs the module's version at `notice`, as nginx logs its own at start
/// (`nginx/1.22.1`), so that a log shows which build served: in the master
/// (or the single process), not for `nginx -t` nor `nginx -s`, as the event
/// module logs its method. Once: a reload runs this again in the same
/// master, with the module already loaded, and has nothing new to say.
extern "C" fn init_module(cycle: *mut ngx_cycle_t) -> ngx_int_t {
    static LOGGED: AtomicBool = AtomicBool::new(false);
    // SAFETY: process globals nginx sets from its command line before any
    // configuration is read, and only the main thread reads them here.
    let (testing, process) = unsafe { (ngx_test_config, ngx_process) };
    if testing != 0 || process > NGX_PROCESS_MASTER as ngx_uint_t || LOGGED.swap(true, Ordering::Relaxed) {
        return Status::NGX_OK.into();
    }
    // SAFETY: nginx passes the cycle being initialized, its log already set.
    if let Some(cycle) = unsafe { cycle.as_ref() } {
        ngx_log_error!(NGX_LOG_NOTICE, cycle.log, "nginx-rl/{}", env!("CARGO_PKG_VERSION"));
    }
    Status::NGX_OK.into()
}

/// Gives back what dead workers held in the `rl_conn` zones and watches
/// them for more, and sets up the worker's Redis zones, if any (workers
/// only: nginx calls this after forking, never in the master).
extern "C" fn init_process(cycle: *mut ngx_cycle_t) -> ngx_int_t {
    // SAFETY: nginx passes the running cycle.
    let Some(mcf) = (unsafe { cycle.as_ref() }).and_then(Module::main_conf) else {
        return Status::NGX_OK.into();
    };
    // SAFETY: the main configuration lives as long as the cycle, and a worker's cycle is its
    // whole life (a reload starts new workers).
    let mcf: &'static MainConf = unsafe { &*core::ptr::from_ref(mcf) };
    shm::init_clock();
    // SAFETY: nginx passes the running cycle, its log set.
    let log = unsafe { (*cycle).log };
    let now_s = (shm::now_us() / 1_000_000) as u32;
    for zone in mcf.zones.iter().filter(|z| z.has_conn) {
        shm::holds::reclaim(zone, now_s, log);
        shm::holds::watch(zone, log);
    }
    metrics::init_worker(mcf);
    let hooks = redis_zone::Hooks {
        on_reply: eval::redis::on_reply,
        on_lost: eval::redis::on_lost,
        on_charge_failed: charge::on_failed,
        on_undo_failed: charge::on_undo_failed,
    };
    if redis_zone::init_worker(cycle, &mcf.redis, mcf.resolver, hooks).is_err() {
        return Status::NGX_ERROR.into();
    }
    lease::init_worker(&mcf.leases, &mcf.redis);
    redis_zone::start_holds(&mcf.redis);
    Status::NGX_OK.into()
}

/// Takes the worker off the `rl_conn` zones' watch lists, and closes its
/// Redis connections.
extern "C" fn exit_process(cycle: *mut ngx_cycle_t) {
    // SAFETY: nginx passes the running cycle.
    if let Some(mcf) = (unsafe { cycle.as_ref() }).and_then(Module::main_conf) {
        for zone in mcf.zones.iter().filter(|z| z.has_conn) {
            shm::holds::exiting(zone);
        }
    }
    redis_zone::exit_worker();
}

/// The tag that marks shared memory zones as ours (nginx reuses a zone on
/// reload only for the same name, size and tag).
pub fn module_tag() -> *mut c_void {
    ptr::addr_of_mut!(ngx_http_rl_module).cast()
}

/// Registers `handler` in `phase`: to run first of the phase's handlers
/// registered so far, or last (`last`). Fails only where nginx's allocator
/// failed, which it logs.
fn add_handler(
    cmcf: &mut ngx_http_core_main_conf_t,
    phase: ngx_http_phases,
    handler: ngx_http_handler_pt,
    last: bool,
) -> Result<(), ConfError> {
    let handlers = &mut cmcf.phases[phase as usize].handlers;
    // SAFETY: phases[].handlers are ngx_array_t of ngx_http_handler_pt, created by the core module.
    let h = unsafe { ngx_array_push(handlers) }.cast::<ngx_http_handler_pt>();
    if h.is_null() {
        return Err(ConfError::Logged);
    }
    // SAFETY: h points to a new element of the array.
    unsafe { *h = handler };
    if last {
        // SAFETY: the array's nelts elements, the new one included, are initialised.
        let all = unsafe { slice::from_raw_parts_mut(handlers.elts.cast::<ngx_http_handler_pt>(), handlers.nelts) };
        all.rotate_right(1);
    }
    Ok(())
}
