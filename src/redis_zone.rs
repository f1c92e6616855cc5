//! Redis zones (`rl_zone NAME redis=URL ...`): configuration, and the
//! worker's side of the Redis I/O thread — submitting jobs, suspending the
//! request, and resuming it when the eventfd says its reply is in.

pub mod io;

use core::cell::{Cell, RefCell};
use core::ffi::c_void;
use core::ptr;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use ngx::ffi::{
    ngx_add_timer, ngx_close_connection, ngx_connection_t, ngx_cycle_t, ngx_del_timer, ngx_delete_posted_event,
    ngx_event_actions, ngx_event_t, ngx_get_connection, ngx_http_block_reading, ngx_http_core_run_phases,
    ngx_http_request_t, ngx_http_run_posted_requests, ngx_http_test_reading, ngx_int_t, ngx_log_t, ngx_msec_t,
    ngx_pool_cleanup_add, ngx_post_event, ngx_posted_events, ngx_time, NGX_LOG_ERR,
};
use ngx::ngx_log_error;
use redis::{ClientTlsConfig, IntoConnectionInfo, RedisConnectionInfo, TlsCertificates};
use rl_core::parse::parse_duration_ms;
use tokio::sync::mpsc::{unbounded_channel, UnboundedSender};

use self::io::{Failure, Job, Reply, Shared, Target, ZoneSpec};

/// A Redis zone as configured.
pub struct RedisZone {
    pub name: String,
    /// The URL with any password replaced by `***`, for messages.
    pub shown: String,
    pub spec: ZoneSpec,
    pub on_error_allow: bool,
    /// Errors seen by this worker (timeouts included).
    pub errors: Cell<u64>,
    /// Log throttling: the second of the last message and messages in it.
    log_second: Cell<i64>,
    log_count: Cell<u32>,
}

/// Messages a zone logs per second at most.
const LOG_PER_SECOND: u32 = 3;

impl RedisZone {
    /// Parses `redis=URL [timeout=TIME] [on_error=allow|deny] [prefix=STRING]
    /// [ssl_trusted_certificate=FILE] [ssl_certificate=FILE
    /// ssl_certificate_key=FILE]`; relative file names are taken from
    /// `conf_prefix`, as nginx does.
    pub fn parse(name: &str, args: &[&str], conf_prefix: &str) -> Result<RedisZone, String> {
        let mut url = None;
        let mut timeout = Duration::from_millis(50);
        let mut allow = true;
        let mut prefix = "rl:".to_string();
        let (mut trusted, mut cert, mut key) = (None, None, None);
        for a in args {
            if let Some(v) = a.strip_prefix("redis=") {
                url = Some(v);
            } else if let Some(v) = a.strip_prefix("timeout=") {
                match parse_duration_ms(v) {
                    Ok(ms) if ms > 0 => timeout = Duration::from_millis(ms),
                    _ => return Err(format!("invalid timeout \"{v}\"")),
                }
            } else if let Some(v) = a.strip_prefix("on_error=") {
                allow = match v {
                    "allow" => true,
                    "deny" => false,
                    _ => return Err(format!("invalid on_error \"{v}\", it must be \"allow\" or \"deny\"")),
                };
            } else if let Some(v) = a.strip_prefix("prefix=") {
                prefix = v.to_string();
            } else if let Some(v) = a.strip_prefix("ssl_trusted_certificate=") {
                trusted = Some(v);
            } else if let Some(v) = a.strip_prefix("ssl_certificate=") {
                cert = Some(v);
            } else if let Some(v) = a.strip_prefix("ssl_certificate_key=") {
                key = Some(v);
            } else {
                return Err(format!("invalid parameter \"{}\"", redact(a)));
            }
        }
        let url = url.ok_or_else(|| "missing \"redis\" parameter".to_string())?;
        let target = parse_target(url).map_err(|e| format!("invalid redis URL \"{}\": {e}", redact(url)))?;
        match (cert, key) {
            (Some(c), None) => return Err(format!("no \"ssl_certificate_key\" is defined for certificate \"{c}\"")),
            (None, Some(_)) => return Err("\"ssl_certificate_key\" needs \"ssl_certificate\"".into()),
            _ => {}
        }
        let tls = tls_files(url, trusted, cert.zip(key), conf_prefix)?;
        Ok(RedisZone {
            name: name.to_string(),
            shown: redact(url),
            spec: ZoneSpec { target, timeout, prefix, tls },
            on_error_allow: allow,
            errors: Cell::new(0),
            log_second: Cell::new(0),
            log_count: Cell::new(0),
        })
    }

    /// Counts a failure and logs it, a few lines per second at most.
    pub fn failed(&self, log: *mut ngx_log_t, what: &str) {
        self.errors.set(self.errors.get() + 1);
        let now = ngx_time() as i64;
        if self.log_second.get() != now {
            self.log_second.set(now);
            self.log_count.set(0);
        }
        if self.log_count.get() < LOG_PER_SECOND {
            self.log_count.set(self.log_count.get() + 1);
            let action = if self.on_error_allow { "allowing" } else { "denying" };
            ngx_log_error!(
                NGX_LOG_ERR,
                log,
                "rl_zone \"{}\" redis {} failed: {}, {} request ({} errors so far)",
                self.name,
                self.shown,
                what,
                action,
                self.errors.get()
            );
        }
    }
}

/// The certificates of a `rediss` zone's `ssl_*` parameters, read (and
/// checked) now: the trusted CAs, and the client certificate and its key.
fn tls_files(
    url: &str,
    trusted: Option<&str>,
    client: Option<(&str, &str)>,
    conf_prefix: &str,
) -> Result<Option<TlsCertificates>, String> {
    if trusted.is_none() && client.is_none() {
        return Ok(None);
    }
    if !url.starts_with("rediss") {
        return Err("\"ssl_*\" parameters need a \"rediss\" URL".into());
    }
    let read = |what: &str, file: &str| {
        let path = if file.starts_with('/') { file.to_string() } else { format!("{conf_prefix}{file}") };
        std::fs::read(&path).map_err(|e| format!("cannot load {what} \"{path}\": {e}"))
    };
    let root_cert = match trusted {
        Some(file) => {
            let pem = read("trusted certificates", file)?;
            const BEGIN: &[u8] = b"-----BEGIN CERTIFICATE-----";
            if !pem.windows(BEGIN.len()).any(|w| w == BEGIN) {
                return Err(format!("no certificate in \"{file}\" (\"ssl_trusted_certificate\" wants PEM)"));
            }
            Some(pem)
        }
        None => None,
    };
    let client_tls = match client {
        Some((cert, key)) => {
            Some(ClientTlsConfig { client_cert: read("certificate", cert)?, client_key: read("certificate key", key)? })
        }
        None => None,
    };
    let certs = TlsCertificates { client_tls, root_cert };
    // Parses them as a connection will (it connects to nothing).
    let probe = "rediss://127.0.0.1:6379".into_connection_info().map_err(|e| e.to_string())?;
    io::client(probe, &Some(certs.clone())).map_err(|e| e.to_string())?;
    Ok(Some(certs))
}

/// Replaces the password of `scheme://user:password@host` with `***`.
pub fn redact(s: &str) -> String {
    let Some(scheme_end) = s.find("://") else {
        return s.to_string();
    };
    let rest = &s[scheme_end + 3..];
    match rest.find('@') {
        Some(at) => {
            let creds = &rest[..at];
            let user = creds.split_once(':').map_or("", |(u, _)| u);
            format!("{}{}:***@{}", &s[..scheme_end + 3], user, &rest[at + 1..])
        }
        None => s.to_string(),
    }
}

fn parse_target(url: &str) -> Result<Target, String> {
    let (scheme, rest) = url.split_once("://").ok_or("no scheme")?;
    if url.contains('#') {
        return Err("no \"#\" fragment is supported (the certificate of a rediss server is always verified: \"ssl_trusted_certificate\" names a private CA)".into());
    }
    match scheme {
        "redis" | "rediss" => {
            url.into_connection_info().map_err(|e| e.to_string())?;
            Ok(Target::Single(url.to_string()))
        }
        "redis+sentinel" | "rediss+sentinel" => {
            let (creds, rest) = split_creds(rest);
            let (hosts, path) = rest.split_once('/').ok_or("no master name")?;
            let (master, db) = match path.split_once('/') {
                Some((m, d)) => (m, d.parse::<i64>().map_err(|_| format!("invalid db \"{d}\""))?),
                None => (path, 0),
            };
            if master.is_empty() {
                return Err("no master name".into());
            }
            let mut node = RedisConnectionInfo::default().set_db(db);
            if let Some((user, pass)) = creds {
                if !user.is_empty() {
                    node = node.set_username(user);
                }
                node = node.set_password(pass);
            }
            let base = if scheme.starts_with("rediss") { "rediss" } else { "redis" };
            let sentinels = hosts_of(hosts)?.into_iter().map(|h| format!("{base}://{h}")).collect();
            Ok(Target::Sentinel { sentinels, master: master.to_string(), node, tls: base == "rediss" })
        }
        "redis+cluster" | "rediss+cluster" => {
            let (creds, hosts) = split_creds(rest);
            let base = if scheme.starts_with("rediss") { "rediss" } else { "redis" };
            let auth = creds.map_or(String::new(), |(u, p)| format!("{u}:{p}@"));
            let nodes: Vec<String> =
                hosts_of(hosts.trim_end_matches('/'))?.into_iter().map(|h| format!("{base}://{auth}{h}")).collect();
            for n in &nodes {
                n.as_str().into_connection_info().map_err(|e| e.to_string())?;
            }
            Ok(Target::Cluster(nodes))
        }
        _ => Err(format!("unknown scheme \"{scheme}\"")),
    }
}

fn split_creds(s: &str) -> (Option<(&str, &str)>, &str) {
    match s.rsplit_once('@') {
        Some((creds, rest)) => (Some(creds.split_once(':').unwrap_or(("", creds))), rest),
        None => (None, s),
    }
}

fn hosts_of(s: &str) -> Result<Vec<&str>, String> {
    let hosts: Vec<&str> = s.split(',').filter(|h| !h.is_empty()).collect();
    if hosts.is_empty() || hosts.iter().any(|h| h.rsplit_once(':').is_none_or(|(_, p)| p.parse::<u16>().is_err())) {
        return Err("hosts must be host:port[,host:port...]".into());
    }
    Ok(hosts)
}

/// What a worker keeps while it has Redis zones.
struct Worker {
    tx: Option<UnboundedSender<Vec<Job>>>,
    /// Jobs of this event-loop iteration, sent together by `flush_ev` (one
    /// wake-up of the I/O thread per iteration, not per request).
    outbox: Vec<Job>,
    flush_ev: Box<ngx_event_t>,
    shared: Arc<Shared>,
    conn: *mut ngx_connection_t,
    thread: Option<JoinHandle<()>>,
    /// Suspended requests by job id.
    pending: HashMap<u64, *mut ngx_http_request_t>,
    next_id: u64,
    /// Called with each reply, for the request it belongs to.
    on_reply: fn(*mut ngx_http_request_t, Reply),
    /// Called for a request whose replies did not come in time.
    on_lost: fn(*mut ngx_http_request_t),
    /// How long a suspended request waits at most (the longest zone timeout
    /// plus a margin): a backstop should the I/O thread not answer, and a
    /// timer that keeps a gracefully exiting worker alive while requests wait.
    backstop_ms: u64,
}

/// Added to the longest zone timeout for the nginx-side backstop timer.
const BACKSTOP_MARGIN_MS: u64 = 500;

thread_local! {
    static WORKER: RefCell<Option<Worker>> = const { RefCell::new(None) };
}

/// Starts the I/O thread (in a worker, never in the master) if there are Redis zones.
pub fn init_worker(
    cycle: *mut ngx_cycle_t,
    zones: &[Box<RedisZone>],
    on_reply: fn(*mut ngx_http_request_t, Reply),
    on_lost: fn(*mut ngx_http_request_t),
) -> Result<(), ()> {
    if zones.is_empty() {
        return Ok(());
    }
    // SAFETY: plain syscall; the fd is owned by the worker from here on.
    let efd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    // SAFETY: the cycle is valid in init_process.
    let log = unsafe { (*cycle).log };
    if efd < 0 {
        ngx_log_error!(NGX_LOG_ERR, log, "rl: eventfd() failed");
        return Err(());
    }
    // SAFETY: registers the eventfd as an nginx connection so the event loop watches it.
    let conn = unsafe { ngx_get_connection(efd, log) };
    if conn.is_null() {
        // SAFETY: not registered anywhere.
        unsafe { libc::close(efd) };
        return Err(());
    }
    // SAFETY: conn and its read event were just set up by ngx_get_connection; `add` is the event
    // module's function (epoll), level-triggered with flags 0; we drain the eventfd on every call.
    unsafe {
        let rev = (*conn).read;
        (*rev).handler = Some(on_notify);
        (*rev).log = log;
        (*conn).log = log;
        let Some(add) = ngx_event_actions.add else {
            ngx_close_connection(conn);
            return Err(());
        };
        if add(rev, READ_EVENT, 0) != 0 {
            ngx_close_connection(conn);
            return Err(());
        }
    }
    let shared = Arc::new(Shared { replies: Mutex::new(Vec::new()), efd });
    let (tx, rx) = unbounded_channel();
    let specs: Vec<ZoneSpec> = zones.iter().map(|z| z.spec.clone()).collect();
    let sh = shared.clone();
    let thread = std::thread::Builder::new().name("rl-redis".into()).spawn(move || io::run(specs, rx, sh)).ok();
    // SAFETY: a zeroed event is nginx's initial state for a posted-only event.
    let mut flush_ev: Box<ngx_event_t> = Box::new(unsafe { core::mem::zeroed() });
    flush_ev.handler = Some(flush);
    flush_ev.log = log;
    WORKER.with(|w| {
        *w.borrow_mut() = Some(Worker {
            tx: Some(tx),
            outbox: Vec::new(),
            flush_ev,
            shared,
            conn,
            thread,
            pending: HashMap::new(),
            next_id: 1,
            on_reply,
            on_lost,
            backstop_ms: zones.iter().map(|z| z.spec.timeout.as_millis() as u64).max().unwrap_or(0)
                + BACKSTOP_MARGIN_MS,
        })
    });
    Ok(())
}

/// `EPOLLIN | EPOLLRDHUP`, nginx's NGX_READ_EVENT with epoll.
const READ_EVENT: ngx_int_t = (libc::EPOLLIN | libc::EPOLLRDHUP) as ngx_int_t;

/// Stops the I/O thread and closes the eventfd (exit_process).
pub fn exit_worker() {
    let Some(mut w) = WORKER.with(|w| w.borrow_mut().take()) else {
        return;
    };
    if w.flush_ev.posted() != 0 {
        // SAFETY: the event is in the posted queue; remove it before it is freed.
        unsafe { ngx_delete_posted_event(&mut *w.flush_ev) };
    }
    w.tx = None;
    if let Some(t) = w.thread.take() {
        let _ = t.join();
    }
    // SAFETY: the connection was created in init_worker and is closed once.
    unsafe { ngx_close_connection(w.conn) };
}

/// Sends a job for a request; the request is resumed when its reply arrives.
pub fn submit(r: *mut ngx_http_request_t, mut job: Job) -> Result<(), ()> {
    WORKER.with(|w| {
        let mut w = w.borrow_mut();
        let w = w.as_mut().ok_or(())?;
        let id = w.next_id;
        w.next_id += 1;
        job.id = id;
        // Forget the request if it goes away before the reply (client closed it).
        // SAFETY: the request pool is valid; the cleanup entry lives as long as the pool.
        let cln = unsafe { ngx_pool_cleanup_add((*r).pool, 0).as_mut() }.ok_or(())?;
        cln.handler = Some(forget_request);
        cln.data = id as usize as *mut c_void;
        if w.tx.is_none() {
            return Err(());
        }
        w.outbox.push(job);
        w.pending.insert(id, r);
        if w.flush_ev.posted() == 0 {
            // SAFETY: the event lives as long as the worker state; posted events run after this
            // iteration's I/O events.
            unsafe { ngx_post_event(&mut *w.flush_ev, ptr::addr_of_mut!(ngx_posted_events)) };
        }
        Ok(())
    })
}

/// Sends the jobs of this event-loop iteration to the I/O thread at once.
extern "C" fn flush(_ev: *mut ngx_event_t) {
    WORKER.with(|w| {
        let mut w = w.borrow_mut();
        let Some(w) = w.as_mut() else { return };
        let jobs = std::mem::take(&mut w.outbox);
        if let Some(tx) = &w.tx {
            // The receiver lives until exit_worker drops the sender.
            let _ = tx.send(jobs);
        }
    });
}

extern "C" fn forget_request(data: *mut c_void) {
    let id = data as usize as u64;
    WORKER.with(|w| {
        if let Ok(mut w) = w.try_borrow_mut() {
            if let Some(w) = w.as_mut() {
                w.pending.remove(&id);
            }
        }
    });
}

/// Suspends the request until its replies are in (the access handler then
/// returns NGX_AGAIN), with a backstop timer on its write event.
pub fn suspend(r: *mut ngx_http_request_t) {
    let backstop = WORKER.with(|w| w.borrow().as_ref().map_or(BACKSTOP_MARGIN_MS, |w| w.backstop_ms));
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
    let on_lost = WORKER.with(|w| {
        let mut w = w.borrow_mut();
        let w = w.as_mut()?;
        w.pending.retain(|_, p| *p != r);
        Some(w.on_lost)
    });
    if let Some(on_lost) = on_lost {
        on_lost(r);
    }
}

/// Continues a suspended request from the access phase.
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

/// The eventfd is readable: dispatch every reply to its request.
extern "C" fn on_notify(_ev: *mut ngx_event_t) {
    let Some((shared, on_reply)) = WORKER.with(|w| w.borrow().as_ref().map(|w| (w.shared.clone(), w.on_reply))) else {
        return;
    };
    let mut buf = 0u64;
    // SAFETY: reading the 8-byte eventfd counter resets it; EAGAIN is harmless.
    unsafe { libc::read(shared.efd, (&mut buf as *mut u64).cast(), 8) };
    let replies = match shared.replies.lock() {
        Ok(mut q) => std::mem::take(&mut *q),
        Err(_) => return,
    };
    for reply in replies {
        let r = WORKER.with(|w| w.borrow_mut().as_mut().and_then(|w| w.pending.remove(&reply.id)));
        if let Some(r) = r {
            on_reply(r, reply);
        }
    }
}

/// Describes a failure for the log.
pub fn failure_text(f: &Failure, timeout: Duration) -> String {
    match f {
        Failure::Timeout => format!("timed out ({} ms)", timeout.as_millis()),
        Failure::Error(e) => e.trim_start_matches("io: ").to_string(),
    }
}
