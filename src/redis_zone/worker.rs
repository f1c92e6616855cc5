//! A worker's Redis zones in its event loop: submitting jobs (one batch
//! per loop iteration, sent by [`super::calls`]), suspending a request and
//! resuming it when its reply is in ([`super::inbox`]).

use core::cell::RefCell;
use core::ffi::c_void;
use core::ptr::{self, NonNull};
use std::collections::HashMap;
use std::rc::Rc;
use std::time::{Duration, Instant};

use ngx::async_::{sleep, spawn};
use ngx::ffi::{
    ngx_add_timer, ngx_cycle_t, ngx_del_timer, ngx_delete_posted_event, ngx_event_t, ngx_http_block_reading,
    ngx_http_core_run_phases, ngx_http_request_t, ngx_http_run_posted_requests, ngx_http_test_reading, ngx_log_t,
    ngx_msec_t, ngx_pool_cleanup_add, ngx_post_event, ngx_posted_events, ngx_resolver_t, NGX_LOG_ALERT,
};
use ngx::ngx_log_error;
use rl_core::redis::Lives;

use super::calls::Calls;
use super::conn::Target;
use super::timers::Hold;
use super::{cycle_log, holds, inbox, open, peer};
use super::{HoldBatch, Job, LeaseKey, RedisError, RedisZone, Reply, ZoneSpec, CHARGE_ID, UNDO_ID};
use crate::metrics::store::redis_slot;

/// What the worker calls back with replies, in its event loop.
#[derive(Clone, Copy)]
pub struct Hooks {
    /// With each reply, for the request it belongs to.
    pub on_reply: fn(*mut ngx_http_request_t, Reply),
    /// For a request whose replies did not come in time.
    pub on_lost: fn(*mut ngx_http_request_t),
    /// For each line of a `charge=after` charge that failed, with the zone
    /// and why.
    pub on_charge_failed: fn(usize, &RedisError),
    /// For each request of a call answered per `on_error` whose undo
    /// failed, with the zone and why.
    pub on_undo_failed: fn(usize, &RedisError),
}

/// Why the worker's Redis zones could not start, or take a request.
#[derive(Debug)]
pub enum WorkerError {
    /// The worker has no Redis zones running (not started, or exiting).
    NotRunning,
    /// nginx could not allocate the request's cleanup.
    NoMemory,
}

/// What a worker keeps while it has Redis zones.
struct Worker {
    calls: Rc<Calls>,
    /// Jobs of this event-loop iteration, sent together by `flush_ev` (one
    /// batch per zone and iteration, not one call per request).
    outbox: Vec<Job>,
    flush_ev: Box<ngx_event_t>,
    /// Suspended requests by job id.
    pending: HashMap<u64, *mut ngx_http_request_t>,
    next_id: u64,
    hooks: Hooks,
    /// How long a suspended request waits at most (the longest zone timeout
    /// plus a margin): a backstop should a call never end, and a timer that
    /// keeps a gracefully exiting worker alive while requests wait.
    backstop_ms: u64,
}

/// Added to the longest zone timeout for the backstop timer.
const BACKSTOP_MARGIN_MS: u64 = 500;

thread_local! {
    static WORKER: RefCell<Option<Worker>> = const { RefCell::new(None) };
    /// Requests freed while `WORKER` was borrowed (see [`forget_request`]):
    /// forgotten before the next reply is dispatched.
    static FREED: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` on the worker's state, if there is one. The state is borrowed
/// only inside these calls, which call back into nothing that could borrow
/// it again; should a handler ever be re-entered all the same, the call
/// fails (logged) rather than aborting the worker.
fn with_worker<T>(log: *mut ngx_log_t, f: impl FnOnce(&mut Worker) -> T) -> Option<T> {
    WORKER.with(|w| match w.try_borrow_mut() {
        Ok(mut w) => w.as_mut().map(f),
        Err(_) => {
            ngx_log_error!(NGX_LOG_ALERT, log, "rl: Redis worker state in use, handler re-entered");
            None
        }
    })
}

/// Sets up the worker's Redis zones (in a worker, never in the master), if
/// there are any: host names are resolved now, connections opened at the
/// first call.
pub fn init_worker(
    cycle: *mut ngx_cycle_t,
    zones: &[Box<RedisZone>],
    resolver: Option<(NonNull<ngx_resolver_t>, ngx_msec_t)>,
    hooks: Hooks,
) -> Result<(), WorkerError> {
    if zones.is_empty() {
        return Ok(());
    }
    open::use_resolver(resolver);
    // SAFETY: the cycle is valid in init_process.
    let log = unsafe { (*cycle).log };
    let specs: Vec<ZoneSpec> = zones.iter().map(|z| z.spec.clone()).collect();
    open::resolve_at_start(specs.iter().flat_map(|s| match &s.target {
        Target::Single(u) => vec![u.as_str()],
        Target::Sentinel { sentinels, .. } => sentinels.iter().map(String::as_str).collect(),
        Target::Cluster(nodes) => nodes.iter().map(String::as_str).collect(),
        Target::Memcached(_) => vec![],
    }));
    for s in &specs {
        if let Target::Memcached(servers) = &s.target {
            servers.iter().for_each(|a| open::resolve_host_at_start(&a.host, a.port));
        }
    }
    inbox::open(on_inbox);
    // SAFETY: a zeroed event is nginx's initial state for a posted-only event.
    let mut flush_ev: Box<ngx_event_t> = Box::new(unsafe { core::mem::zeroed() });
    flush_ev.handler = Some(flush);
    flush_ev.log = log;
    let installed = WORKER.with(|w| {
        let Ok(mut w) = w.try_borrow_mut() else { return false };
        *w = Some(Worker {
            calls: Rc::new(Calls::new(specs, &zones.iter().map(|z| z.name.as_str()).collect::<Vec<_>>())),
            outbox: Vec::new(),
            flush_ev,
            pending: HashMap::new(),
            next_id: 1,
            hooks,
            backstop_ms: zones.iter().map(|z| z.spec.timeout.as_millis() as u64).max().unwrap_or(0)
                + BACKSTOP_MARGIN_MS,
        });
        true
    });
    if !installed {
        ngx_log_error!(NGX_LOG_ALERT, log, "rl: Redis worker state in use at start");
        return Err(WorkerError::NotRunning);
    }
    Ok(())
}

/// Closes the zones' connections (exit_process: the event loop has ended,
/// and nginx checks that no socket is left open).
pub fn exit_worker() {
    let Ok(w) = WORKER.with(|w| w.try_borrow_mut().map(|mut w| w.take())) else {
        ngx_log_error!(NGX_LOG_ALERT, cycle_log(), "rl: Redis worker state in use at exit");
        return;
    };
    if let Some(mut w) = w {
        if w.flush_ev.posted() != 0 {
            // SAFETY: the event is in the posted queue; remove it before it is freed.
            unsafe { ngx_delete_posted_event(&mut *w.flush_ev) };
        }
    }
    inbox::close();
    peer::close_all();
}

/// Sends a job for a request; the request is resumed when its reply arrives.
pub fn submit(r: *mut ngx_http_request_t, mut job: Job) -> Result<(), WorkerError> {
    // SAFETY: r is the live request being processed.
    let log = unsafe { (*(*r).connection).log };
    with_worker(log, |w| {
        let id = w.next_id;
        w.next_id += 1;
        job.id = id;
        // Forget the request if it goes away before the reply (client closed it).
        // SAFETY: the request pool is valid; the cleanup entry lives as long as the pool.
        let cln = unsafe { ngx_pool_cleanup_add((*r).pool, 0).as_mut() }.ok_or(WorkerError::NoMemory)?;
        cln.handler = Some(forget_request);
        cln.data = id as usize as *mut c_void;
        w.outbox.push(job);
        w.pending.insert(id, r);
        if w.flush_ev.posted() == 0 {
            // SAFETY: the event lives as long as the worker state; posted events run after this
            // iteration's I/O events.
            unsafe { ngx_post_event(&mut *w.flush_ev, ptr::addr_of_mut!(ngx_posted_events)) };
        }
        Ok(())
    })
    .unwrap_or(Err(WorkerError::NotRunning))
}

/// Queues a `charge=after` charge of a line on zone `zone`: it goes with
/// the jobs of this event-loop iteration, and no request waits for it.
pub fn charge(log: *mut ngx_log_t, zone: usize, line: super::JobLine) {
    with_worker(log, |w| {
        // One job per zone and iteration: the charges go in one call.
        match w.outbox.iter_mut().find(|j| j.charge && j.zone == zone) {
            Some(job) => job.lines.push(line),
            None => {
                let mut lines = smallvec::SmallVec::new();
                lines.push(line);
                w.outbox.push(Job { id: CHARGE_ID, zone, commit: true, charge: true, lines });
            }
        }
        if w.flush_ev.posted() == 0 {
            // SAFETY: as in submit.
            unsafe { ngx_post_event(&mut *w.flush_ev, ptr::addr_of_mut!(ngx_posted_events)) };
        }
    });
}

/// A node's sync of its leases on zone `zone`, from this worker (see
/// [`Calls::lease`]): each key's grant, in order, or why it has none.
pub async fn lease(
    zone: usize,
    keys: &[LeaseKey],
    lives: Lives,
) -> Vec<Result<rl_core::redis::LeaseGrant, RedisError>> {
    // (the calls are taken out of the worker's state: the call runs outside it)
    let Some(calls) = with_worker(cycle_log(), |w| w.calls.clone()) else {
        return keys.iter().map(|_| Err(RedisError::NotSent)).collect();
    };
    calls.lease(zone, keys, lives).await
}

/// A node's heartbeat on zone `zone`, from this worker (see
/// [`Calls::beat`]): how many nodes are live.
pub async fn beat(zone: usize, key: &str, node: &str, ttl_ms: u64) -> Result<u64, RedisError> {
    let calls = with_worker(cycle_log(), |w| w.calls.clone()).ok_or(RedisError::NotSent)?;
    calls.beat(zone, key, node, ttl_ms).await
}

/// Sends the jobs of this event-loop iteration, and its `rl_conn`
/// give-backs after them.
extern "C" fn flush(ev: *mut ngx_event_t) {
    // SAFETY: nginx passes the posted event, whose log init_worker set.
    let log = unsafe { (*ev).log };
    // The calls start (and may run) outside the worker's state.
    if let Some((calls, jobs)) = with_worker(log, |w| (w.calls.clone(), std::mem::take(&mut w.outbox))) {
        calls.send(jobs);
    }
    send_holds();
}

/// Has the loop iteration's calls sent when it ends (with its jobs').
pub fn post_flush() {
    with_worker(cycle_log(), |w| {
        if w.flush_ev.posted() == 0 {
            // SAFETY: as in submit.
            unsafe { ngx_post_event(&mut *w.flush_ev, ptr::addr_of_mut!(ngx_posted_events)) };
        }
    });
}

/// Starts the bookkeeping of what the worker holds of the zones with
/// `rl_conn` lines ([`holds`]), and their heartbeats. The zones live as
/// long as the worker's cycle, which is the worker's whole life.
pub fn start_holds(zones: &'static [Box<RedisZone>]) {
    holds::init_worker(zones);
    for (i, z) in zones.iter().enumerate().filter(|(_, z)| z.holds) {
        spawn(beats(i, z)).detach();
    }
}

/// Zone `zone`'s heartbeats, every [`holds::BEAT`], for as long as the
/// worker runs, and at once after the zone opens a new connection (which
/// may go to a Redis that lost the fields: restarted, failed over). One
/// that fails is not sent again: the next sets what it would have, and the
/// fields outlive a few.
async fn beats(zone: usize, rz: &'static RedisZone) {
    let opened = || with_worker(cycle_log(), |w| w.calls.opened(zone)).unwrap_or(0);
    let mut seen = opened();
    loop {
        let due = Instant::now() + holds::BEAT;
        while Instant::now() < due && opened() == seen {
            sleep(REOPENED_LOOK).await;
        }
        seen = opened();
        let Some(batches) = holds::next_beat(zone) else { return };
        for batch in batches.into_iter().filter(|b| !b.ops.is_empty()) {
            if let Some(e) = put(zone, batch, true).await {
                rz.failed_doing(cycle_log(), &e, "rl_conn units not renewed until the next heartbeat");
            }
        }
    }
}

/// How often the heartbeats look for a new connection.
const REOPENED_LOOK: Duration = Duration::from_millis(50);

/// Sends the loop iteration's `rl_conn` give-backs and corrections, one
/// task per zone: each call once (see [`holds`]), the worker held until it
/// ends.
fn send_holds() {
    for (zone, rz, batch) in holds::take_outbox() {
        spawn(async move {
            let _hold = Hold::new(2 * rz.spec.timeout);
            let n = batch.ops.len();
            if let Some(e) = put(zone, batch, false).await {
                let action = match n {
                    1 => "one rl_conn give-back left to the next heartbeat".to_string(),
                    n => format!("{n} rl_conn give-backs left to the next heartbeat"),
                };
                rz.failed_doing(cycle_log(), &e, &action);
            }
        })
        .detach();
    }
}

/// One `conn_put` call's worth of `rl_conn` changes (see [`Calls::put`]):
/// the units Redis reclaimed are counted; the error, if any.
async fn put(zone: usize, batch: HoldBatch, again: bool) -> Option<RedisError> {
    let Some(calls) = with_worker(cycle_log(), |w| w.calls.clone()) else {
        return Some(RedisError::NotSent);
    };
    let (reclaimed, e) = calls.put(zone, &batch, again).await;
    if let Some(m) = redis_slot(zone) {
        m.reclaimed(reclaimed);
    }
    e
}

/// A request's pool is freed: its reply, if it comes, has no request to go
/// to. Should the worker's state be in use (it is not, where pools are
/// freed), the id is kept in `FREED` and forgotten before the next reply is
/// dispatched.
extern "C" fn forget_request(data: *mut c_void) {
    let id = data as usize as u64;
    let forgotten = WORKER.with(|w| match w.try_borrow_mut() {
        Ok(mut w) => {
            if let Some(w) = w.as_mut() {
                w.pending.remove(&id);
            }
            true
        }
        Err(_) => false,
    });
    if !forgotten && !FREED.with(|f| f.try_borrow_mut().map(|mut f| f.push(id)).is_ok()) {
        ngx_log_error!(NGX_LOG_ALERT, cycle_log(), "rl: cannot forget a freed request waiting for Redis");
    }
}

/// Suspends the request until its replies are in (the phase handler then
/// returns NGX_AGAIN), with a backstop timer on its write event.
pub fn suspend(r: *mut ngx_http_request_t) {
    // SAFETY: r is the live request being processed.
    let log = unsafe { (*(*r).connection).log };
    let backstop = with_worker(log, |w| w.backstop_ms).unwrap_or(BACKSTOP_MARGIN_MS);
    // SAFETY: the request and its connection are valid; these are nginx's own handlers, and the
    // timer is removed in resume() or fires into backstop() below.
    unsafe {
        (*r).read_event_handler = Some(ngx_http_test_reading);
        (*r).write_event_handler = Some(on_backstop);
        ngx_add_timer((*(*r).connection).write, backstop as ngx_msec_t);
    }
}

/// The backstop timer fired (or the socket became writable: ignored).
extern "C" fn on_backstop(r: *mut ngx_http_request_t) {
    // SAFETY: called by nginx for a live request.
    let wev = unsafe { (*(*r).connection).write };
    // SAFETY: as above.
    if unsafe { (*wev).timedout() } == 0 {
        return;
    }
    // SAFETY: as above.
    unsafe { (*wev).set_timedout(0) };
    // SAFETY: as above.
    let log = unsafe { (*(*r).connection).log };
    let on_lost = with_worker(log, |w| {
        w.pending.retain(|_, p| *p != r);
        w.hooks.on_lost
    });
    if let Some(on_lost) = on_lost {
        on_lost(r);
    }
}

/// Continues a suspended request from the phase handler that suspended it.
pub fn resume(r: *mut ngx_http_request_t) {
    // SAFETY: r is pending, hence alive (its pool cleanup removes it otherwise).
    unsafe {
        let c = (*r).connection;
        if (*(*c).write).timer_set() != 0 {
            ngx_del_timer((*c).write);
        }
        (*r).read_event_handler = Some(ngx_http_block_reading);
        (*r).write_event_handler = Some(ngx_http_core_run_phases);
        ngx_http_core_run_phases(r);
        ngx_http_run_posted_requests(c);
    }
}

/// Replies are in: dispatch each to its request.
extern "C" fn on_inbox(ev: *mut ngx_event_t) {
    // SAFETY: nginx passes the inbox's posted event, whose log inbox::open set.
    let log = unsafe { (*ev).log };
    let Some(on_reply) = with_worker(log, |w| w.hooks.on_reply) else {
        return;
    };
    let replies = inbox::take();
    let freed = FREED.with(|f| f.try_borrow_mut().map(|mut f| std::mem::take(&mut *f)).unwrap_or_default());
    if !freed.is_empty() {
        let forgotten = with_worker(log, |w| {
            for id in &freed {
                w.pending.remove(id);
            }
        });
        if forgotten.is_none() {
            FREED.with(|f| f.try_borrow_mut().map(|mut f| f.extend(freed)).ok());
        }
    }
    for reply in replies {
        // Id 0: a charge (request ids start at 1), answered only when it failed.
        if reply.id == CHARGE_ID {
            if let (Some(on_failed), Err(e)) = (with_worker(log, |w| w.hooks.on_charge_failed), &reply.result) {
                on_failed(reply.zone, e);
            }
            continue;
        }
        if reply.id == UNDO_ID {
            if let (Some(on_failed), Err(e)) = (with_worker(log, |w| w.hooks.on_undo_failed), &reply.result) {
                on_failed(reply.zone, e);
            }
            continue;
        }
        if let Some(r) = with_worker(log, |w| w.pending.remove(&reply.id)).flatten() {
            on_reply(r, reply);
        }
    }
}
