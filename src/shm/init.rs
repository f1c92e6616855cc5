//! Laying out a zone's memory when a cycle starts: a fresh table, or the
//! previous cycle's taken over when nginx reuses the memory on reload.

use core::ffi::c_void;
use core::ptr;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;

use ngx::core::Status;
use ngx::ffi::{ngx_int_t, ngx_pagesize, ngx_shm_zone_t, ngx_slab_alloc, ngx_slab_pool_t, NGX_LOG_EMERG};
use ngx::ngx_log_error;
use rl_core::table::Table;

use super::Zone;

/// Pages of the slab pool left for nginx itself (the zone's log context).
const RESERVED_PAGES: usize = 2;

/// Initialises a zone in a new cycle, re-attaching to the table of the old
/// cycle when nginx reuses the memory (reload with the same name and size).
pub extern "C" fn zone_init(shm_zone: *mut ngx_shm_zone_t, data: *mut c_void) -> ngx_int_t {
    // SAFETY: nginx passes the zone being initialised.
    let shm = unsafe { &mut *shm_zone };
    // SAFETY: data was set to our Zone in Zone::add.
    let zone = unsafe { &mut *shm.data.cast::<Zone>() };
    let shpool: *mut ngx_slab_pool_t = shm.shm.addr.cast();
    // SAFETY: nginx has initialised the slab pool (or kept the old one) at shm.addr.
    let pool = unsafe { &mut *shpool };

    // SAFETY: ngx_pagesize is set at startup.
    let page = unsafe { ngx_pagesize };
    if !data.is_null() {
        // Reused memory (reload, same name and size): the previous cycle's table is at pool.data,
        // and the old cycle's workers go on using it while they drain: it is never freed or laid
        // out anew here.
        // SAFETY: data is the previous cycle's Zone, alive until the old cycle is freed.
        let len = unsafe { (*data.cast::<Zone>()).table.as_ref() }.map_or(0, |t| t.len());
        let region = pool.data.cast::<u8>();
        let reused = if region.is_null() || len == 0 {
            None
        } else {
            // SAFETY: the region was laid out by the previous cycle's zone_init.
            unsafe { Table::open(region, len) }.map(|t| t.region())
        };
        if let Some(table) = reused {
            if pool.pfree * page < zone.log_words * 8 * 8 {
                // A sliding_log line now uses a zone laid out without room for its logs. As
                // limit_req refuses a zone whose key changed, refuse the reload: the running
                // configuration goes on; a new size makes nginx lay out a new zone.
                ngx_log_error!(
                    NGX_LOG_EMERG,
                    // SAFETY: cycle log is valid during initialisation.
                    unsafe { (*shm_zone).shm.log },
                    "rl_zone \"{}\" was laid out without room for sliding_log states; \
                     change its size to lay it out anew",
                    zone.name
                );
                return Status::NGX_ERROR.into();
            }
            // A full zone is reported by its own warning, not by the slab allocator's
            // [crit] on every failed allocation (as limit_req does).
            pool.set_log_nomem(0);
            zone.table = Some(table);
            return Status::NGX_OK.into();
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
        return Status::NGX_ERROR.into();
    }
    let s = RandomState::new();
    let seed = [s.hash_one(0xA5u8), s.hash_one(0x5Au8)];
    // SAFETY: region is a fresh allocation of len bytes in the zone.
    let table = match unsafe { Table::attach(region, len, seed) } {
        Ok((table, _)) => table.region(),
        Err(e) => {
            // SAFETY: cycle log is valid during initialisation.
            ngx_log_error!(NGX_LOG_EMERG, unsafe { (*shm_zone).shm.log }, "rl_zone \"{}\": {:?}", zone.name, e);
            return Status::NGX_ERROR.into();
        }
    };
    pool.data = region.cast();
    pool.set_log_nomem(0);
    zone.table = Some(table);
    set_log_ctx(pool, &zone.name);
    Status::NGX_OK.into()
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
