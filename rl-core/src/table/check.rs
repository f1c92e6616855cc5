//! Whole-table consistency checks, for tests (O(capacity), allocates).

use super::layout::{FREE, NIL};
use super::Table;
use std::collections::HashSet;

impl Table<'_> {
    /// Checks every structural invariant: the LRU list, the chains and the
    /// free list partition the handed-out entries, links agree both ways,
    /// every entry sits in its hash's bucket, no hash appears twice and the
    /// header counts match. Returns the first violation found.
    #[doc(hidden)]
    pub fn check_invariants(&self) -> Result<(), String> {
        let lru = self.check_lru()?;
        let chained = self.check_chains()?;
        let free = self.check_free()?;
        if lru != chained {
            return Err("LRU list and chains hold different entries".into());
        }
        if lru.len() != self.hdr.used as usize {
            return Err(format!("used {} but {} live", self.hdr.used, lru.len()));
        }
        if lru.len() + free.len() != self.hdr.unused_next as usize {
            return Err("live + free entries != handed-out entries".into());
        }
        if lru.iter().any(|i| free.contains(i)) {
            return Err("an entry is both live and free".into());
        }
        Ok(())
    }

    /// Walks the LRU list head to tail, checking back links and the tail.
    fn check_lru(&self) -> Result<HashSet<u32>, String> {
        let mut seen = HashSet::new();
        let (mut prev, mut i) = (NIL, self.hdr.lru_head);
        while i != NIL {
            let e = self.live(i).ok_or(format!("LRU entry {i} not live"))?;
            if e.lru_prev != prev {
                return Err(format!("entry {i}: lru_prev {} != {prev}", e.lru_prev));
            }
            if !seen.insert(i) {
                return Err(format!("LRU cycle at {i}"));
            }
            (prev, i) = (i, e.lru_next);
        }
        if self.hdr.lru_tail != prev {
            return Err(format!("lru_tail {} != {prev}", self.hdr.lru_tail));
        }
        Ok(seen)
    }

    /// Walks every bucket's chain, checking buckets and hash uniqueness.
    fn check_chains(&self) -> Result<HashSet<u32>, String> {
        let mut seen = HashSet::new();
        let mut hashes = HashSet::new();
        for (b, &head) in self.buckets.iter().enumerate() {
            let mut i = head;
            while i != NIL {
                let e = self.live(i).ok_or(format!("chained entry {i} not live"))?;
                if self.bucket_of(e.hash) != b {
                    return Err(format!("entry {i} in wrong bucket {b}"));
                }
                if !seen.insert(i) {
                    return Err(format!("entry {i} chained twice"));
                }
                if !hashes.insert(e.hash) {
                    return Err(format!("duplicate hash at entry {i}"));
                }
                i = e.chain_next;
            }
        }
        Ok(seen)
    }

    /// Walks the free list.
    fn check_free(&self) -> Result<HashSet<u32>, String> {
        let mut seen = HashSet::new();
        let mut i = self.hdr.free_head;
        while i != NIL {
            let e = self.entry(i).ok_or(format!("free index {i} out of range"))?;
            if e.lru_prev != FREE || i >= self.hdr.unused_next {
                return Err(format!("free-list entry {i} not free"));
            }
            if !seen.insert(i) {
                return Err(format!("free-list cycle at {i}"));
            }
            i = e.chain_next;
        }
        Ok(seen)
    }
}
