//! Which memcached server holds a line's counters: consistent hashing over
//! the zone's servers, so that every worker of every node sends a key to
//! the same server, and a server added to or removed from the list moves
//! only the keys it gains or loses.

use core::hash::Hasher;

use siphasher::sip::SipHasher13;

/// Points of each server on the circle: ketama's 160, enough for an even
/// share (each server within a few percent of 1/N) at a small table.
const POINTS: u32 = 160;

/// Servers on a consistent-hash ring (ketama's scheme): each server has
/// POINTS points on a 32-bit circle, hashed from its name; a key goes to
/// the server of the first point at or after the key's hash (wrapping).
/// A server added or removed moves about 1/N of the keys, and the same list
/// in any order maps every key alike.
#[derive(Clone, Debug)]
pub struct Ring {
    /// (point, server index), sorted by point, then by server name; empty
    /// for one server (or none), which takes every key without hashing.
    points: Vec<(u32, u32)>,
    /// The number of servers.
    servers: usize,
}

/// A fixed-key SipHash: the same on every node and every run.
fn hasher() -> SipHasher13 {
    SipHasher13::new_with_keys(0, 0)
}

impl Ring {
    /// `servers`: the names as nginx.conf writes them ("host:port"); not empty, no duplicates (the caller refuses those).
    pub fn new<S: AsRef<str>>(servers: &[S]) -> Ring {
        if servers.len() <= 1 {
            return Ring { points: Vec::new(), servers: servers.len() };
        }
        let mut points = Vec::with_capacity(servers.len() * POINTS as usize);
        for (index, name) in servers.iter().enumerate() {
            // A list of more than 2^32 servers cannot be written in a
            // configuration; saturating keeps this total all the same.
            let index = u32::try_from(index).unwrap_or(u32::MAX);
            // Each hash of "{name}-{i}" gives two points.
            for i in 0..POINTS / 2 {
                let mut h = hasher();
                h.write(name.as_ref().as_bytes());
                h.write(format!("-{i}").as_bytes());
                let hash = h.finish();
                points.push((hash as u32, index));
                points.push(((hash >> 32) as u32, index));
            }
        }
        // Equal points of two servers go to the smaller name, not the
        // earlier index: the order of the list must not matter. (The index
        // last only orders duplicate names, which the caller refuses.)
        let name = |index: u32| servers.get(index as usize).map(AsRef::as_ref);
        points
            .sort_unstable_by(|a, b| a.0.cmp(&b.0).then_with(|| name(a.1).cmp(&name(b.1))).then_with(|| a.1.cmp(&b.1)));
        // Of equal points only the first is ever found.
        points.dedup_by_key(|p| p.0);
        Ring { points, servers: servers.len() }
    }

    /// The index (into the list given to `new`) of the server of a line's key: a client key's tag (a 64-bit hash) and the line's id (64-bit).
    ///
    /// 0 for a ring of no server (which the caller never builds).
    pub fn server(&self, tag: u64, line_id: u64) -> usize {
        if self.points.is_empty() {
            return 0;
        }
        // The line is in the hash: a client's lines spread over the
        // servers rather than all landing on one.
        let mut h = hasher();
        h.write(&tag.to_le_bytes());
        h.write(&line_id.to_le_bytes());
        let hash = h.finish();
        let point = (hash ^ (hash >> 32)) as u32;
        let at = self.points.partition_point(|p| p.0 < point);
        // Past the last point the circle wraps to the first.
        let (_, index) = self.points.get(at).or_else(|| self.points.first()).copied().unwrap_or_default();
        index as usize
    }

    /// The number of servers.
    pub fn len(&self) -> usize {
        self.servers
    }

    /// Whether the ring has no server.
    pub fn is_empty(&self) -> bool {
        self.servers == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEYS: u64 = 100_000;

    /// Deterministic, well-spread tags and line ids.
    fn keys() -> impl Iterator<Item = (u64, u64)> {
        (0..KEYS).map(|i| {
            let mut h = hasher();
            h.write(&i.to_le_bytes());
            (h.finish(), i % 3)
        })
    }

    /// The server name of every key.
    fn names<'a>(servers: &[&'a str]) -> Vec<&'a str> {
        let ring = Ring::new(servers);
        keys().map(|(tag, line)| servers[ring.server(tag, line)]).collect()
    }

    const FIVE: [&str; 5] = ["10.0.0.1:11211", "10.0.0.2:11211", "10.0.0.3:11211", "10.0.0.4:11211", "mc5.local:11211"];

    #[test]
    fn one_server() {
        let ring = Ring::new(&["127.0.0.1:11211"]);
        assert_eq!(ring.len(), 1);
        assert!(!ring.is_empty());
        for (tag, line) in keys().take(1000) {
            assert_eq!(ring.server(tag, line), 0);
        }
        let ring = Ring::new(&[String::from("a:1"), String::from("b:1")]);
        assert_eq!(ring.len(), 2);
        assert_eq!(ring.points.len(), 2 * POINTS as usize);
    }

    #[test]
    fn no_server_does_not_panic() {
        let ring = Ring::new::<&str>(&[]);
        assert!(ring.is_empty());
        assert_eq!(ring.server(1, 2), 0);
    }

    #[test]
    fn even_shares() {
        let servers = &FIVE[..4];
        let names = names(servers);
        for s in servers {
            let share = names.iter().filter(|n| *n == s).count() as u64;
            assert!((KEYS * 15 / 100..=KEYS * 35 / 100).contains(&share), "{s}: {share} of {KEYS}");
        }
    }

    #[test]
    fn adding_moves_keys_to_the_new_server_only() {
        let before = names(&FIVE[..4]);
        let after = names(&FIVE);
        let mut moved = 0u64;
        for (b, a) in before.iter().zip(&after) {
            if b != a {
                assert_eq!(*a, FIVE[4]);
                moved += 1;
            }
        }
        assert!((KEYS * 12 / 100..=KEYS * 28 / 100).contains(&moved), "{moved} of {KEYS} moved");
    }

    #[test]
    fn removing_moves_only_the_removed_servers_keys() {
        let before = names(&FIVE);
        let gone = FIVE[1];
        let rest: Vec<&str> = FIVE.iter().copied().filter(|s| *s != gone).collect();
        let after = names(&rest);
        let mut moved = 0u64;
        for (b, a) in before.iter().zip(&after) {
            if *b == gone {
                assert_ne!(*a, gone);
                moved += 1;
            } else {
                assert_eq!(b, a);
            }
        }
        assert!(moved > 0);
    }

    #[test]
    fn order_does_not_matter() {
        let mut reversed = FIVE;
        reversed.reverse();
        assert_eq!(names(&FIVE), names(&reversed));
        let shuffled = [FIVE[2], FIVE[4], FIVE[0], FIVE[3], FIVE[1]];
        assert_eq!(names(&FIVE), names(&shuffled));
    }

    #[test]
    fn equal_points_go_to_the_smaller_name() {
        // The same name twice under two indexes stands for two servers
        // whose points all tie: the tie goes to the name, then to the
        // index, and never to a server of another name.
        let ring = Ring::new(&["b:1", "a:1", "a:1"]);
        for (tag, line) in keys().take(10_000) {
            assert_ne!(ring.server(tag, line), 2);
        }
        assert!(ring.points.windows(2).all(|w| w[0].0 < w[1].0));
    }

    #[test]
    fn wraps_past_the_last_point() {
        let ring = Ring::new(&["a:1", "b:1"]);
        let (last, _) = ring.points[ring.points.len() - 1];
        let first = ring.points[0].1 as usize;
        // About 1 key in 320 hashes past the last point.
        for (tag, line) in keys() {
            let mut h = hasher();
            h.write(&tag.to_le_bytes());
            h.write(&line.to_le_bytes());
            let hash = h.finish();
            if (hash ^ (hash >> 32)) as u32 > last {
                assert_eq!(ring.server(tag, line), first);
                return;
            }
        }
        panic!("no key hashes past the last point");
    }
}
