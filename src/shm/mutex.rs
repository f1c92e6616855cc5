//! The slab pool's mutex (`ngx_shmtx_t`), taken and released without a call
//! when nobody else wants it: the first step of `ngx_shmtx_lock` and of
//! `ngx_shmtx_unlock` written inline, nginx's own functions for the rest.
//! Every request locks its zone once, and the two calls and their
//! prologues were a tenth of what a limit costs a request.
//!
//! The protocol is nginx's (`src/core/ngx_shmtx.c`, atomic-ops build): the
//! lock word holds the owner's pid (`ngx_pid`), 0 when free; a waiter
//! counts itself in `*wait` and sleeps on the semaphore, which the owner
//! posts when it unlocks. The master's recovery of a killed worker's lock
//! (`ngx_shmtx_force_unlock` by pid) works on the same word.

use core::sync::atomic::{AtomicU64, Ordering};

use ngx::ffi::{ngx_cycle, ngx_pid, ngx_shmtx_lock, ngx_shmtx_t, NGX_LOG_ALERT};
use ngx::ngx_log_error;

/// The mutex's lock word and `*wait`, as the atomics nginx uses them as.
///
/// # Safety
/// `p` is the `lock` or `wait` pointer of an initialised `ngx_shmtx_t`:
/// an aligned word in shared memory, mapped for the cycle.
unsafe fn word<'a>(p: *mut ngx::ffi::ngx_atomic_t) -> &'a AtomicU64 {
    // SAFETY: forwarded to our caller; ngx_atomic_t is a u64 that nginx only accesses atomically.
    unsafe { AtomicU64::from_ptr(p.cast()) }
}

/// This process's value of the lock word.
fn me() -> u64 {
    // SAFETY: ngx_pid is set when the process starts (after fork, for a worker).
    unsafe { ngx_pid as u64 }
}

/// Locks `mtx`: at once when it is free, else through `ngx_shmtx_lock`
/// (which spins, then sleeps on the semaphore).
///
/// # Safety
/// `mtx` is an initialised `ngx_shmtx_t` (a slab pool's) that this process
/// does not hold.
#[inline(always)]
pub unsafe fn lock(mtx: *mut ngx_shmtx_t) {
    // SAFETY: the caller's contract.
    let lock = unsafe { word((*mtx).lock) };
    // (ngx_shmtx_trylock: a read first, so that a held lock is not written)
    if lock.load(Ordering::Relaxed) == 0 && lock.compare_exchange(0, me(), Ordering::SeqCst, Ordering::Relaxed).is_ok()
    {
        return;
    }
    // SAFETY: the caller's contract.
    unsafe { ngx_shmtx_lock(mtx) };
}

/// Unlocks `mtx`, and wakes one waiter if any sleeps (`ngx_shmtx_unlock`).
///
/// # Safety
/// `mtx` is an initialised `ngx_shmtx_t` that this process holds.
#[inline(always)]
pub unsafe fn unlock(mtx: *mut ngx_shmtx_t) {
    // SAFETY: the caller's contract.
    let lock = unsafe { word((*mtx).lock) };
    // SeqCst, here and on `wait`: a waiter counts itself in `wait` and then
    // reads the lock; the owner frees the lock and then reads `wait`. One of
    // the two sees the other's write, so no waiter sleeps unwoken.
    // SAFETY: the caller's contract (for `semaphore`).
    if lock.compare_exchange(me(), 0, Ordering::SeqCst, Ordering::Relaxed).is_ok() && unsafe { (*mtx).semaphore } != 0 {
        // SAFETY: `wait` is set where `semaphore` is (ngx_shmtx_create).
        let wait = unsafe { word((*mtx).wait) };
        if wait.load(Ordering::SeqCst) as i64 > 0 {
            // SAFETY: the caller's contract.
            unsafe { wakeup(mtx, wait) };
        }
    }
}

/// `ngx_shmtx_wakeup` (static in nginx): takes one waiter off the count and
/// posts the semaphore it sleeps on.
///
/// # Safety
/// As for [`unlock`]; `wait` is `(*mtx).wait`.
#[cold]
#[inline(never)]
unsafe fn wakeup(mtx: *mut ngx_shmtx_t, wait: &AtomicU64) {
    let mut n = wait.load(Ordering::SeqCst);
    loop {
        if n as i64 <= 0 {
            return;
        }
        match wait.compare_exchange(n, n - 1, Ordering::SeqCst, Ordering::SeqCst) {
            Ok(_) => break,
            Err(now) => n = now,
        }
    }
    // SAFETY: the semaphore is initialised (`semaphore` is set) and lives in shared memory with
    // the mutex, shared between processes.
    if unsafe { libc::sem_post(core::ptr::addr_of_mut!((*mtx).sem).cast()) } == -1 {
        let err = std::io::Error::last_os_error();
        // SAFETY: ngx_cycle is the current cycle, valid in a worker.
        let log = unsafe { (*ngx_cycle).log };
        ngx_log_error!(NGX_LOG_ALERT, log, "sem_post() failed while wake shmtx ({})", err);
    }
}
