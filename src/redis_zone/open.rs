//! Opening a connection to one server (a Redis node, or a sentinel) on the
//! worker's event loop: where it is ([`addr`]), the nginx connection to it
//! ([`super::peer`]), TLS for `rediss` ([`super::tls`]), then the `redis`
//! crate's connection over that stream (its setup: `AUTH`, `SELECT`, the
//! protocol), whose driver runs as a task of the event loop.
//!
//! Host names: where the `http` block has a `resolver`, a name is resolved
//! with it at each connection attempt (a Redis behind a name that moves is
//! followed, as nginx's own upstreams with `resolve` are); elsewhere it is
//! resolved once, when the worker starts ([`resolve_at_start`]), or when
//! first met (a master a sentinel names by host name), and kept.

use core::cell::{Cell, RefCell};
use core::ptr::NonNull;
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs};
use std::sync::Arc;

use ngx::async_::resolver::Resolver;
use ngx::async_::{spawn, Task};
use ngx::core::Pool;
use ngx::ffi::{ngx_create_pool, ngx_cycle, ngx_destroy_pool, ngx_msec_t, ngx_resolver_t, ngx_str_t};
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, ConnectionAddr, ConnectionInfo};
use rustls::ClientConfig;

use super::peer::PeerStream;
use super::tls::handshake;
use super::RedisError;

thread_local! {
    /// Host names resolved so far, with their addresses.
    static RESOLVED: RefCell<HashMap<(String, u16), Vec<SocketAddr>>> = RefCell::new(HashMap::new());
    /// The `http` block's `resolver` and `resolver_timeout`, if it has one.
    static RESOLVER: Cell<Option<(NonNull<ngx_resolver_t>, ngx_msec_t)>> = const { Cell::new(None) };
}

/// Resolves names with nginx's `resolver` (the `http` block's), from now on.
pub fn use_resolver(resolver: Option<(NonNull<ngx_resolver_t>, ngx_msec_t)>) {
    RESOLVER.with(|r| r.set(resolver));
}

/// Resolves the host names of `urls` (those that are not addresses) now,
/// while the worker starts, where there is no `resolver`: an unknown name is
/// reported when a connection to it is tried.
pub fn resolve_at_start<'a>(urls: impl IntoIterator<Item = &'a str>) {
    use redis::IntoConnectionInfo;
    if RESOLVER.with(Cell::get).is_some() {
        return;
    }
    for url in urls {
        if let Ok(info) = url.into_connection_info() {
            if let Some((host, port)) = host_port(info.addr()) {
                let _ = known_addr(host, port);
            }
        }
    }
}

/// Resolves `host` (a memcached server's, not an address) now, as
/// [`resolve_at_start`] does a URL's.
pub fn resolve_host_at_start(host: &str, port: u16) {
    if RESOLVER.with(Cell::get).is_none() && host.parse::<IpAddr>().is_err() {
        let _ = known_addr(host, port);
    }
}

/// The host and port of a TCP (or TLS) address.
pub fn host_port(a: &ConnectionAddr) -> Option<(&str, u16)> {
    match a {
        ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => Some((host, *port)),
        _ => None,
    }
}

/// The socket addresses of `host:port`, tried in turn (see the module's
/// comment for names).
pub async fn addrs(host: &str, port: u16) -> Result<Vec<SocketAddr>, RedisError> {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = bare.parse::<IpAddr>() {
        return Ok(vec![SocketAddr::new(ip, port)]);
    }
    match RESOLVER.with(Cell::get) {
        Some((resolver, timeout)) => OnWorkerThread(resolve(resolver, timeout, bare, port)).await,
        None => known_addr(bare, port),
    }
}

/// `host` resolved by nginx's resolver.
async fn resolve(
    resolver: NonNull<ngx_resolver_t>,
    timeout: ngx_msec_t,
    host: &str,
    port: u16,
) -> Result<Vec<SocketAddr>, RedisError> {
    let pool = TempPool::new().ok_or_else(|| RedisError::Io("no memory to resolve a host name".into()))?;
    let name = ngx_str_t { len: host.len(), data: host.as_ptr().cast_mut() };
    let found = Resolver::from_resolver(resolver, timeout)
        .resolve_name(&name, &pool.0)
        .await
        .map_err(|e| RedisError::Io(format!("{host} could not be resolved ({e})")))?;
    let all: Vec<SocketAddr> = found
        .iter()
        // SAFETY: the resolver's addresses point into the pool, alive until it is dropped below.
        .filter_map(|a| unsafe { socket_addr(a.sockaddr.cast_const().cast(), port) })
        .collect();
    if all.is_empty() {
        return Err(RedisError::Io(format!("{host} could not be resolved (no address)")));
    }
    Ok(all)
}

/// A future of nginx's (the resolver's) inside one the `redis` crate wants
/// `Send` (a Cluster's commands open node connections).
struct OnWorkerThread<F>(F);

// SAFETY: every task of nginx-rl runs on the worker's one thread (the `ngx::async_` executor has no
// other); the `redis` crate asks for `Send` because it also serves multi-threaded runtimes.
unsafe impl<F> Send for OnWorkerThread<F> {}

impl<F: core::future::Future> core::future::Future for OnWorkerThread<F> {
    type Output = F::Output;
    fn poll(self: core::pin::Pin<&mut Self>, cx: &mut core::task::Context<'_>) -> core::task::Poll<F::Output> {
        // SAFETY: the inner future is never moved out of the pinned wrapper.
        unsafe { self.map_unchecked_mut(|s| &mut s.0) }.poll(cx)
    }
}

/// A pool for one resolution, destroyed after it.
struct TempPool(Pool);

impl TempPool {
    fn new() -> Option<TempPool> {
        // SAFETY: ngx_cycle is set before any module code runs in a worker; a pool of the
        // default size for such short-lived uses.
        let p = unsafe { ngx_create_pool(1024, (*ngx_cycle).log) };
        // SAFETY: p is a fresh pool, destroyed once in Drop.
        (!p.is_null()).then(|| TempPool(unsafe { Pool::from_ngx_pool(p) }))
    }
}

impl Drop for TempPool {
    fn drop(&mut self) {
        // SAFETY: the pool was created in new and nothing allocated in it outlives this.
        unsafe { ngx_destroy_pool(self.0.as_ptr()) };
    }
}

/// An IPv4 or IPv6 socket address as a `SocketAddr`, with `port`.
///
/// # Safety
/// `sa` is null or points to a socket address of the size its family says.
unsafe fn socket_addr(sa: *const libc::sockaddr, port: u16) -> Option<SocketAddr> {
    // SAFETY: the caller's promise.
    let family = i32::from(unsafe { sa.as_ref() }?.sa_family);
    if family == libc::AF_INET {
        // SAFETY: an AF_INET address is a sockaddr_in.
        let sin = unsafe { &*sa.cast::<libc::sockaddr_in>() };
        Some(SocketAddr::new(IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr))), port))
    } else if family == libc::AF_INET6 {
        // SAFETY: an AF_INET6 address is a sockaddr_in6.
        let sin6 = unsafe { &*sa.cast::<libc::sockaddr_in6>() };
        Some(SocketAddr::new(IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr)), port))
    } else {
        None
    }
}

/// `host:port` from the worker's own resolution (at start, or now, once).
fn known_addr(host: &str, port: u16) -> Result<Vec<SocketAddr>, RedisError> {
    let key = (host.to_string(), port);
    if let Some(a) = RESOLVED.with(|r| r.try_borrow().ok().and_then(|r| r.get(&key).cloned())) {
        return Ok(a);
    }
    let found: Vec<SocketAddr> =
        (host, port).to_socket_addrs().map_err(|e| RedisError::Io(format!("host {host} not found: {e}")))?.collect();
    if found.is_empty() {
        return Err(RedisError::Io(format!("host {host} not found")));
    }
    RESOLVED.with(|r| r.try_borrow_mut().map(|mut r| r.insert(key, found.clone())).ok());
    Ok(found)
}

/// The connections' settings: no timeouts of the client's own, which would
/// need a tokio runtime (the caller bounds an attempt by the stall limit;
/// the zone's timeout answers the requests, the watchdog gives a silent
/// connection up).
pub fn data_config() -> AsyncConnectionConfig {
    AsyncConnectionConfig::new().set_connection_timeout(None).set_response_timeout(None)
}

/// A TCP connection to the first of `addrs` that takes one (as nginx tries
/// an upstream's addresses).
pub async fn connect(addrs: &[SocketAddr]) -> Result<PeerStream, RedisError> {
    let mut last = RedisError::Io("no address".into());
    for &sa in addrs {
        let mut stream = match PeerStream::connect(sa) {
            Ok(s) => s,
            Err(e) => {
                last = RedisError::Io(e.to_string());
                continue;
            }
        };
        match stream.connected().await {
            Ok(()) => return Ok(stream),
            Err(e) => last = RedisError::Io(format!("connect() to {sa} failed: {e}")),
        }
    }
    Err(last)
}

/// An open connection and the task that drives it (reads replies, writes
/// calls): dropping the task closes the connection.
pub struct Opened {
    pub conn: MultiplexedConnection,
    pub driver: Task<()>,
}

/// Opens a connection to the server `info` names (TLS with `tls` for a
/// `rediss` URL).
pub async fn open(
    info: &ConnectionInfo,
    tls: Option<&Arc<ClientConfig>>,
    config: AsyncConnectionConfig,
) -> Result<Opened, RedisError> {
    let (host, port) = host_port(info.addr()).ok_or_else(|| RedisError::Io("not a TCP address".into()))?;
    let stream = connect(&addrs(host, port).await?).await?;
    let setup = |e: redis::RedisError| RedisError::Io(e.to_string());
    let (conn, driver) = match (info.addr(), tls) {
        (ConnectionAddr::TcpTls { .. }, Some(tls)) => {
            let stream = handshake(tls.clone(), host, stream).await?;
            let (conn, driver) =
                MultiplexedConnection::new_with_config(info.redis_settings(), stream, config).await.map_err(setup)?;
            (conn, spawn(driver))
        }
        (ConnectionAddr::TcpTls { .. }, None) => return Err(RedisError::Io("TLS not set up".into())),
        _ => {
            let (conn, driver) =
                MultiplexedConnection::new_with_config(info.redis_settings(), stream, config).await.map_err(setup)?;
            (conn, spawn(driver))
        }
    };
    Ok(Opened { conn, driver })
}
