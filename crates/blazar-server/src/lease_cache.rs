//! Leases rendered as JSON, kept between requests.
//!
//! A project's lease list re-sends mostly the same leases every time, and building each one
//! (reading its reservations and events, converting, serializing) was nearly all of a list's
//! cost. A rendered lease is kept with the revision it was rendered at; the store moves a
//! lease's revision in every transaction that changes the lease, its reservations or its
//! events, so a list reads only ids and revisions and renders just the leases that changed.
//! The revision lives in the database, so this stays correct with several replicas.

use axum::body::Bytes;
use quick_cache::sync::Cache;

/// The memory the kept leases may take, in bytes of JSON: tens of thousands of leases.
pub const DEFAULT_CAPACITY_BYTES: u64 = 32 * 1024 * 1024;

#[derive(Clone)]
struct JsonSize;

impl quick_cache::Weighter<String, (i64, Bytes)> for JsonSize {
    fn weight(&self, key: &String, value: &(i64, Bytes)) -> u64 {
        (key.len() + value.1.len()) as u64
    }
}

/// Rendered leases by id, each with the revision it shows. Least recently used ones go
/// first when the capacity is reached.
pub struct LeaseCache {
    leases: Cache<String, (i64, Bytes), JsonSize>,
}

impl LeaseCache {
    pub fn new(capacity_bytes: u64) -> LeaseCache {
        // A lease renders to about 1.5 KB with one reservation.
        let estimated_items = (capacity_bytes / 1_500).max(16) as usize;
        LeaseCache {
            leases: Cache::with_weighter(estimated_items, capacity_bytes.max(1), JsonSize),
        }
    }

    /// The lease as rendered at `revision`, if kept.
    pub fn get(&self, id: &str, revision: i64) -> Option<Bytes> {
        self.leases
            .get(id)
            .filter(|(kept, _)| *kept == revision)
            .map(|(_, json)| json)
    }

    /// Keeps `json`, the lease `id` rendered at `revision`, unless a later one is kept.
    pub fn insert(&self, id: String, revision: i64, json: Bytes) {
        if self
            .leases
            .get(&id)
            .is_some_and(|(kept, _)| kept > revision)
        {
            return;
        }
        self.leases.insert(id, (revision, json));
    }
}

impl Default for LeaseCache {
    fn default() -> Self {
        LeaseCache::new(DEFAULT_CAPACITY_BYTES)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_lease_is_returned_only_at_its_revision() {
        let cache = LeaseCache::default();
        cache.insert("a".into(), 3, Bytes::from_static(b"{\"v\":3}"));
        assert_eq!(cache.get("a", 3).as_deref(), Some(&b"{\"v\":3}"[..]));
        assert_eq!(cache.get("a", 4), None, "a later revision is not kept yet");
        assert_eq!(cache.get("b", 3), None);
        cache.insert("a".into(), 2, Bytes::from_static(b"{\"v\":2}"));
        assert_eq!(
            cache.get("a", 3).as_deref(),
            Some(&b"{\"v\":3}"[..]),
            "never goes back"
        );
        cache.insert("a".into(), 4, Bytes::from_static(b"{\"v\":4}"));
        assert_eq!(cache.get("a", 3), None);
        assert_eq!(cache.get("a", 4).as_deref(), Some(&b"{\"v\":4}"[..]));
    }

    #[test]
    fn capacity_bounds_what_is_kept() {
        let cache = LeaseCache::new(10_000);
        for i in 0..1_000 {
            cache.insert(format!("lease-{i:04}"), 0, Bytes::from(vec![b'x'; 100]));
        }
        let kept = (0..1_000)
            .filter(|i| cache.get(&format!("lease-{i:04}"), 0).is_some())
            .count();
        assert!(
            kept > 0 && kept <= 100,
            "kept {kept} leases of 110 bytes in 10,000"
        );
    }
}
