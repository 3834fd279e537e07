//! The allocation engine: which resources to grant for a request, and an in-memory ledger of
//! blocked windows per resource.
//!
//! The store keeps the authoritative copy of allocations and the database enforces that they
//! never overlap; the engine decides what to ask for.

use std::collections::{BTreeMap, HashSet};

use crate::time::TimeWindow;

/// Why a request for `min..=max` resources could not be met.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shortfall {
    pub min: usize,
    /// Resources that match the request's filters (and are reservable).
    pub matching: usize,
    /// Of those, the ones free for the whole window.
    pub free: usize,
}

/// Picks between `min` and `max` resources greedily toward `max`.
///
/// `matching` lists the resources that satisfy the request's filters, in preference order;
/// `busy` holds those unavailable in the window; `keep` lists resources the reservation holds
/// already (an update keeps them when it can, so a user does not lose a host they were given).
pub fn pick(
    matching: &[i64],
    busy: &HashSet<i64>,
    keep: &[i64],
    min: usize,
    max: usize,
) -> Result<Vec<i64>, Shortfall> {
    let free: Vec<i64> = matching
        .iter()
        .copied()
        .filter(|id| !busy.contains(id))
        .collect();
    if free.len() < min {
        return Err(Shortfall {
            min,
            matching: matching.len(),
            free: free.len(),
        });
    }
    let free_set: HashSet<i64> = free.iter().copied().collect();
    let mut chosen: Vec<i64> = Vec::with_capacity(max.min(free.len()));
    let mut taken = HashSet::new();
    for id in keep.iter().chain(free.iter()) {
        if chosen.len() >= max {
            break;
        }
        if free_set.contains(id) && taken.insert(*id) {
            chosen.push(*id);
        }
    }
    Ok(chosen)
}

/// Blocked windows per resource, for checking and for fast candidate search in memory.
#[derive(Debug, Default, Clone)]
pub struct Ledger {
    by_resource: BTreeMap<i64, Vec<TimeWindow>>,
}

impl Ledger {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn is_free(&self, resource: i64, window: &TimeWindow) -> bool {
        self.by_resource
            .get(&resource)
            .is_none_or(|ws| ws.iter().all(|w| !w.overlaps(window)))
    }

    pub fn busy_in(&self, window: &TimeWindow) -> HashSet<i64> {
        self.by_resource
            .iter()
            .filter(|(_, ws)| ws.iter().any(|w| w.overlaps(window)))
            .map(|(id, _)| *id)
            .collect()
    }

    /// Records a blocked window; refuses one that overlaps an existing window of the resource.
    pub fn insert(&mut self, resource: i64, window: TimeWindow) -> Result<(), TimeWindow> {
        let windows = self.by_resource.entry(resource).or_default();
        if let Some(clash) = windows.iter().find(|w| w.overlaps(&window)) {
            return Err(*clash);
        }
        windows.push(window);
        Ok(())
    }

    pub fn remove(&mut self, resource: i64, window: &TimeWindow) {
        if let Some(ws) = self.by_resource.get_mut(&resource) {
            ws.retain(|w| w != window);
        }
    }

    pub fn windows(&self) -> impl Iterator<Item = (i64, &TimeWindow)> {
        self.by_resource
            .iter()
            .flat_map(|(id, ws)| ws.iter().map(move |w| (*id, w)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{Duration, TimeZone, Utc};
    use proptest::prelude::*;

    fn set(ids: &[i64]) -> HashSet<i64> {
        ids.iter().copied().collect()
    }

    #[test]
    fn pick_table() {
        // (matching, busy, keep, min, max) -> expected
        type Row = (
            &'static [i64],
            &'static [i64],
            &'static [i64],
            usize,
            usize,
            Result<Vec<i64>, (usize, usize)>,
        );
        let rows: Vec<Row> = vec![
            (&[1, 2, 3], &[], &[], 1, 1, Ok(vec![1])),
            (&[1, 2, 3], &[], &[], 1, 2, Ok(vec![1, 2])),
            (&[1, 2, 3], &[1], &[], 1, 5, Ok(vec![2, 3])),
            (&[1, 2, 3], &[1, 2], &[], 2, 2, Err((3, 1))),
            (&[], &[], &[], 1, 1, Err((0, 0))),
            (&[1, 2, 3], &[], &[3], 1, 2, Ok(vec![3, 1])),
            (&[1, 2, 3], &[3], &[3], 1, 1, Ok(vec![1])),
            (&[1, 2], &[], &[9], 1, 2, Ok(vec![1, 2])),
            (&[1, 2, 3, 4], &[2, 4], &[], 2, 4, Ok(vec![1, 3])),
        ];
        for (matching, busy, keep, min, max, expected) in rows {
            let got = pick(matching, &set(busy), keep, min, max).map_err(|s| (s.matching, s.free));
            assert_eq!(
                got, expected,
                "matching={matching:?} busy={busy:?} keep={keep:?} {min}-{max}"
            );
        }
    }

    #[test]
    fn shortfall_reports_the_minimum() {
        let err = pick(&[1], &set(&[1]), &[], 1, 1).unwrap_err();
        assert_eq!(
            err,
            Shortfall {
                min: 1,
                matching: 1,
                free: 0
            }
        );
    }

    proptest! {
        /// Whatever sequence of requests arrives, granting through `pick` over the ledger never
        /// leaves two overlapping windows on one resource.
        #[test]
        fn granted_windows_never_overlap(
            requests in proptest::collection::vec((0i64..48, 1i64..12, 1usize..3, 0usize..3), 1..60)
        ) {
            let base = Utc.with_ymd_and_hms(2030, 1, 1, 0, 0, 0).unwrap();
            let hosts: Vec<i64> = (1..=4).collect();
            let mut ledger = Ledger::new();
            for (start_h, len_h, min, extra) in requests {
                let window = TimeWindow::new(
                    base + Duration::hours(start_h),
                    base + Duration::hours(start_h + len_h),
                ).unwrap();
                let busy = ledger.busy_in(&window);
                if let Ok(chosen) = pick(&hosts, &busy, &[], min, min + extra) {
                    prop_assert!(chosen.len() >= min && chosen.len() <= min + extra);
                    for id in chosen {
                        prop_assert!(ledger.insert(id, window).is_ok());
                    }
                }
            }
            let all: Vec<(i64, TimeWindow)> = ledger.windows().map(|(id, w)| (id, *w)).collect();
            for (i, (a_id, a)) in all.iter().enumerate() {
                for (b_id, b) in &all[i + 1..] {
                    prop_assert!(a_id != b_id || !a.overlaps(b));
                }
            }
        }
    }
}
