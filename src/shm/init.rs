//! Laying out a zone's memory when a cycle starts: a fresh table, or the
//! previous cycle's taken over when nginx reuses the memory on reload.

use core::ffi::c_void;
use core::ptr;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;

use ngx::ffi::{
    ngx_int_t, ngx_pagesize, ngx_shm_zone_t, ngx_slab_alloc, ngx_slab_free, ngx_slab_pool_t, NGX_LOG_EMERG,
    NGX_LOG_WARN,
};
use ngx::ngx_log_error;
use rl_core::table::Table;

use super::Zone;

/// Pages of the slab pool left for nginx itself (the zone's log context).
const RESERVED_PAGES: usize = 2;

/// Initialises a zone in a new cycle, re-attaching to the table of the old
/// cycle when nginx reuses the memory (reload with the same name and size).
pub extern "C" fn zone_init(shm_zone: *mut ngx_shm_zone_t, data: *mut c_void) -> ngx_int_t {
    // SAFETY: nginx passes the zone being initialised; data was set to our Zone in Zone::add.
    let shm = unsafe { &mut *shm_zone };
    let zone = unsafe { &mut *shm.data.cast::<Zone>() };
    let shpool: *mut ngx_slab_pool_t = shm.shm.addr.cast();
    // SAFETY: nginx has initialised the slab pool (or kept the old one) at shm.addr.
    let pool = unsafe { &mut *shpool };

    // SAFETY: ngx_pagesize is set at startup.
    let page = unsafe { ngx_pagesize };
    if !data.is_null() {
        // Reused memory (reload, same name and size): the previous cycle's table is at pool.data.
        // SAFETY: data is the previous cycle's Zone, alive until the old cycle is freed.
        let len = unsafe { (*data.cast::<Zone>()).region_len };
        let region = pool.data.cast::<u8>();
        // SAFETY: the region was laid out by the previous cycle's zone_init.
        if !region.is_null() && len > 0 && unsafe { Table::open(region, len) }.is_some() {
            let log_room = pool.pfree * page >= zone.log_words * 8 * 8;
            if log_room {
                zone.region = region;
                zone.region_len = len;
                return 0;
            }
            // A sliding_log limit now uses a zone laid out without room for logs: start afresh.
            ngx_log_error!(
                NGX_LOG_WARN,
                shm.shm.log,
                "rl_zone \"{}\" has no room for sliding_log states, its state is reset",
                zone.name
            );
            // SAFETY: the region was allocated from this pool by a previous zone_init.
            unsafe { ngx_slab_free(shpool, region.cast()) };
        }
    }

    let free = pool.pfree * page;
    let mut len = free.saturating_sub(RESERVED_PAGES * page);
    if zone.log_words > 0 {
        len /= 2;
    }
    len &= !7;
    // SAFETY: the pool is fresh and owned by the master during cycle initialisation.
    let region = unsafe { ngx_slab_alloc(shpool, len) }.cast::<u8>();
    if region.is_null() || len < Table::min_len() {
        // SAFETY: cycle log is valid during initialisation.
        ngx_log_error!(NGX_LOG_EMERG, unsafe { (*shm_zone).shm.log }, "rl_zone \"{}\" is too small", zone.name);
        return -1;
    }
    let s = RandomState::new();
    let seed = [s.hash_one(0xA5u8), s.hash_one(0x5Au8)];
    // SAFETY: region is a fresh allocation of len bytes in the zone.
    if unsafe { Table::attach(region, len, seed) }.is_err() {
        return -1;
    }
    pool.data = region.cast();
    zone.region = region;
    zone.region_len = len;
    set_log_ctx(pool, &zone.name);
    0
}

/// Names the zone in the slab allocator's own messages.
fn set_log_ctx(pool: &mut ngx_slab_pool_t, name: &str) {
    let ctx = format!(" in rl_zone \"{}\"\0", name);
    // SAFETY: a fresh pool, owned by the master during initialisation.
    let p = unsafe { ngx_slab_alloc(pool, ctx.len()) }.cast::<u8>();
    if !p.is_null() {
        // SAFETY: p has room for ctx.len() bytes.
        unsafe { ptr::copy_nonoverlapping(ctx.as_ptr(), p, ctx.len()) };
        pool.log_ctx = p;
    }
}
