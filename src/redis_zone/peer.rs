//! A connection to a Redis server (or a sentinel, or a cluster node) as an
//! nginx connection: opened with `ngx_event_connect_peer`, so that it counts
//! in `worker_connections` and its events come from the worker's own event
//! loop; read and written through the connection's `recv`/`send`, behind
//! tokio's `AsyncRead`/`AsyncWrite`, which the `redis` crate's connection
//! (and rustls, for `rediss://`) run over. Its read and write events wake
//! the task that waits on them (see `ngx::async_`, whose executor runs the
//! zone's calls).
//!
//! Every open connection is listed ([`close_all`]): nginx checks, as a
//! worker exits, that no socket is left open, and the tasks that own our
//! connections may outlive the worker's state.

use core::cell::RefCell;
use core::pin::Pin;
use core::ptr;
use core::task::{Context, Poll, Waker};
use std::io;
use std::net::SocketAddr;

use ngx::ffi::{
    ngx_close_connection, ngx_connection_log_error_e_NGX_ERROR_INFO, ngx_connection_t, ngx_cycle,
    ngx_event_connect_peer, ngx_event_get_peer, ngx_event_t, ngx_handle_read_event, ngx_handle_write_event,
    ngx_peer_connection_t, ngx_str_t, NGX_AGAIN, NGX_OK,
};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

thread_local! {
    /// The connections open in this worker.
    static OPEN: RefCell<Vec<*mut Peer>> = const { RefCell::new(Vec::new()) };
}

/// What nginx's connection points back to (`c->data`): boxed, so that its
/// address stays put while the connection lives.
struct Peer {
    pc: ngx_peer_connection_t,
    /// `pc.sockaddr` and `pc.name` point into these.
    addr: libc::sockaddr_storage,
    /// Owns the text `name` points to.
    _name_text: String,
    name: ngx_str_t,
    /// The tasks waiting for the connection to be readable, writable.
    rev: Option<Waker>,
    wev: Option<Waker>,
}

/// An open (or opening) connection; closed when dropped.
pub struct PeerStream {
    peer: Box<Peer>,
}

// SAFETY: an nginx worker runs its event loop, and every task of ours, on one
// thread; the `redis` crate asks for `Send` streams because it also serves
// multi-threaded runtimes, but this one never leaves the worker's thread.
unsafe impl Send for PeerStream {}

impl PeerStream {
    /// Connects to `addr`: the connection is set up (a refusal on loopback
    /// comes at once), and [`PeerStream::connected`] waits for the handshake.
    pub fn connect(addr: SocketAddr) -> io::Result<PeerStream> {
        let name_text = addr.to_string();
        let mut peer = Box::new(Peer {
            // SAFETY: zeroed is the initial state nginx's own callers give these C structures.
            pc: unsafe { core::mem::zeroed() },
            // SAFETY: as above.
            addr: unsafe { core::mem::zeroed() },
            name: ngx_str_t { len: name_text.len(), data: name_text.as_ptr().cast_mut() },
            _name_text: name_text,
            rev: None,
            wev: None,
        });
        let socklen = sockaddr_of(addr, &mut peer.addr);
        peer.pc.sockaddr = ptr::addr_of_mut!(peer.addr).cast();
        peer.pc.socklen = socklen;
        peer.pc.name = ptr::addr_of_mut!(peer.name);
        peer.pc.get = Some(ngx_event_get_peer);
        // SAFETY: ngx_cycle is set before any module code runs in a worker.
        peer.pc.log = unsafe { (*ngx_cycle).log };
        // A reset or a refusal is the zone's to report (once, with its name).
        peer.pc.set_log_error(ngx_connection_log_error_e_NGX_ERROR_INFO);
        // SAFETY: pc is set up as ngx_event_connect_peer requires; its sockaddr and name live in
        // the box, as long as the connection.
        let rc = unsafe { ngx_event_connect_peer(&mut peer.pc) };
        if rc != NGX_OK as isize && rc != NGX_AGAIN as isize {
            // nginx closed the socket it may have opened (pc.connection is null).
            return Err(io::Error::new(io::ErrorKind::ConnectionRefused, format!("connect() to {addr} failed")));
        }
        let c = peer.pc.connection;
        let data: *mut Peer = &mut *peer;
        // SAFETY: ngx_event_connect_peer returned a live connection; its data and handlers are
        // ours until it is closed (in Drop or close_all).
        unsafe {
            (*c).data = data.cast();
            (*(*c).read).handler = Some(on_read);
            (*(*c).write).handler = Some(on_write);
            let one: libc::c_int = 1;
            // Calls sent while another is in flight must not wait for its reply (Nagle).
            libc::setsockopt(
                (*c).fd,
                libc::IPPROTO_TCP,
                libc::TCP_NODELAY,
                (&one as *const libc::c_int).cast(),
                core::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
        // (The list is borrowed only inside these short calls, none of which opens a connection.)
        OPEN.with(|o| o.try_borrow_mut().map(|mut o| o.push(data)).ok());
        Ok(PeerStream { peer })
    }

    fn conn(&self) -> Option<*mut ngx_connection_t> {
        let c = self.peer.pc.connection;
        (!c.is_null()).then_some(c)
    }

    /// Resolves once the TCP handshake is done (or failed).
    pub async fn connected(&mut self) -> io::Result<()> {
        core::future::poll_fn(|cx| self.poll_connected(cx)).await
    }

    fn poll_connected(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let Some(c) = self.conn() else { return Poll::Ready(Err(closed())) };
        // SAFETY: the connection is live (closing it nulls pc.connection).
        let wev = unsafe { (*c).write };
        // SAFETY: as above.
        if unsafe { (*wev).ready() } == 0 {
            self.peer.wev = Some(cx.waker().clone());
            return Poll::Pending;
        }
        let mut err: libc::c_int = 0;
        let mut len = core::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: getsockopt on the connection's own socket, into a local of the right size.
        let rc = unsafe {
            libc::getsockopt((*c).fd, libc::SOL_SOCKET, libc::SO_ERROR, (&mut err as *mut libc::c_int).cast(), &mut len)
        };
        if rc == -1 {
            return Poll::Ready(Err(io::Error::last_os_error()));
        }
        if err != 0 {
            return Poll::Ready(Err(io::Error::from_raw_os_error(err)));
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncRead for PeerStream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let Some(c) = this.conn() else { return Poll::Ready(Err(closed())) };
        let room = buf.initialize_unfilled();
        // SAFETY: the connection is live; recv writes at most room.len() bytes into room.
        let n = unsafe { ((*c).recv.unwrap_or(no_io))(c, room.as_mut_ptr(), room.len()) };
        if n == NGX_AGAIN as isize {
            this.peer.rev = Some(cx.waker().clone());
            // SAFETY: the connection's own read event; with epoll it is already registered.
            if unsafe { ngx_handle_read_event((*c).read, 0) } != NGX_OK as isize {
                return Poll::Ready(Err(io::Error::other("cannot watch the connection")));
            }
            return Poll::Pending;
        }
        if n < 0 {
            return Poll::Ready(Err(io::Error::new(io::ErrorKind::ConnectionReset, "recv() failed")));
        }
        buf.advance(n as usize);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for PeerStream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let Some(c) = this.conn() else { return Poll::Ready(Err(closed())) };
        // SAFETY: the connection is live; send reads at most buf.len() bytes of buf.
        let n = unsafe { ((*c).send.unwrap_or(no_io))(c, buf.as_ptr().cast_mut(), buf.len()) };
        if n == NGX_AGAIN as isize {
            this.peer.wev = Some(cx.waker().clone());
            // SAFETY: the connection's own write event.
            if unsafe { ngx_handle_write_event((*c).write, 0) } != NGX_OK as isize {
                return Poll::Ready(Err(io::Error::other("cannot watch the connection")));
            }
            return Poll::Pending;
        }
        if n < 0 {
            return Poll::Ready(Err(io::Error::new(io::ErrorKind::BrokenPipe, "send() failed")));
        }
        Poll::Ready(Ok(n as usize))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

impl Drop for PeerStream {
    fn drop(&mut self) {
        let me: *mut Peer = &mut *self.peer;
        OPEN.with(|o| {
            if let Ok(mut o) = o.try_borrow_mut() {
                o.retain(|p| *p != me);
            }
        });
        close(&mut self.peer);
    }
}

fn close(peer: &mut Peer) {
    let c = core::mem::replace(&mut peer.pc.connection, ptr::null_mut());
    if !c.is_null() {
        // SAFETY: the connection is ours and closed once (pc.connection is nulled first);
        // ngx_close_connection removes its events, timers and posted events.
        unsafe { ngx_close_connection(c) };
    }
    peer.rev = None;
    peer.wev = None;
}

/// Closes every connection still open (the worker exits): the tasks that
/// own them find them closed should they ever run again.
pub fn close_all() {
    let open = OPEN.with(|o| o.try_borrow_mut().map(|mut o| std::mem::take(&mut *o)).unwrap_or_default());
    for p in open {
        // SAFETY: listed peers are live boxes (a PeerStream unlists its peer before freeing it).
        close(unsafe { &mut *p });
    }
}

fn closed() -> io::Error {
    io::Error::new(io::ErrorKind::NotConnected, "connection closed")
}

/// Stands for a missing `recv`/`send` (nginx always sets both).
unsafe extern "C" fn no_io(_c: *mut ngx_connection_t, _buf: *mut u8, _size: usize) -> isize {
    -1
}

/// The connection is readable (or failed): wake the task reading it.
extern "C" fn on_read(ev: *mut ngx_event_t) {
    // SAFETY: nginx calls this with the read event of a connection we set up, whose data is our
    // live Peer (closing the connection removes its events first).
    let peer = unsafe { &mut *(*((*ev).data as *mut ngx_connection_t)).data.cast::<Peer>() };
    if let Some(w) = peer.rev.take() {
        w.wake();
    }
}

/// The connection is writable (or connected, or failed): wake the task
/// writing it (or waiting for the handshake).
extern "C" fn on_write(ev: *mut ngx_event_t) {
    // SAFETY: as in on_read, for the write event.
    let peer = unsafe { &mut *(*((*ev).data as *mut ngx_connection_t)).data.cast::<Peer>() };
    if let Some(w) = peer.wev.take() {
        w.wake();
    }
}

/// Writes `addr` as a C socket address into `out`; returns its length.
fn sockaddr_of(addr: SocketAddr, out: &mut libc::sockaddr_storage) -> libc::socklen_t {
    match addr {
        SocketAddr::V4(a) => {
            // SAFETY: sockaddr_storage is large and aligned enough for any socket address.
            let sin = unsafe { &mut *(out as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_port = a.port().to_be();
            sin.sin_addr = libc::in_addr { s_addr: u32::from_ne_bytes(a.ip().octets()) };
            core::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t
        }
        SocketAddr::V6(a) => {
            // SAFETY: as above.
            let sin6 = unsafe { &mut *(out as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sin6.sin6_port = a.port().to_be();
            sin6.sin6_flowinfo = a.flowinfo();
            sin6.sin6_addr = libc::in6_addr { s6_addr: a.ip().octets() };
            sin6.sin6_scope_id = a.scope_id();
            core::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t
        }
    }
}
