//! The allocation engine: which resources to grant for a request, and an in-memory ledger of
//! blocked windows per resource.
//!
//! The store keeps the authoritative copy of allocations and the database enforces that they
//! never overlap; the engine decides what to ask for.

use std::collections::{BTreeMap, HashSet};

use crate::reservation::Affinity;
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

/// Resource usage in the dimensions instance capacity is counted in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub vcpus: i64,
    pub memory_mb: i64,
    pub disk_gb: i64,
}

impl Usage {
    /// `n` times this usage. Saturating: sizes and counts come from requests, and an
    /// overflow must read as "too much", never wrap to a small or negative number.
    pub fn times(self, n: i64) -> Usage {
        Usage {
            vcpus: self.vcpus.saturating_mul(n),
            memory_mb: self.memory_mb.saturating_mul(n),
            disk_gb: self.disk_gb.saturating_mul(n),
        }
    }

    /// This usage with `by` added (an interval that starts) or taken away (one that ends);
    /// saturating, as `times`.
    fn shifted(self, by: Usage, starts: bool) -> Usage {
        let step = |now: i64, by: i64| {
            if starts {
                now.saturating_add(by)
            } else {
                now.saturating_sub(by)
            }
        };
        Usage {
            vcpus: step(self.vcpus, by.vcpus),
            memory_mb: step(self.memory_mb, by.memory_mb),
            disk_gb: step(self.disk_gb, by.disk_gb),
        }
    }

    /// This usage less `by`, never below zero in any dimension.
    pub fn less(self, by: Usage) -> Usage {
        let step = |now: i64, by: i64| now.saturating_sub(by).max(0);
        Usage {
            vcpus: step(self.vcpus, by.vcpus),
            memory_mb: step(self.memory_mb, by.memory_mb),
            disk_gb: step(self.disk_gb, by.disk_gb),
        }
    }

    /// Whether it asks for anything at all (a slot of size zero would fit without end).
    pub fn is_positive(self) -> bool {
        self.vcpus > 0 || self.memory_mb > 0 || self.disk_gb > 0
    }
}

/// The highest concurrent use of each dimension inside `window`, given the intervals during
/// which other reservations use a resource. Exact over time: usage outside the window, or in
/// parts of it where reservations do not overlap each other, does not add up (Blazar sums the
/// whole lifetimes of every overlapping reservation instead). Intervals are half-open, so one
/// that ends when another starts never counts twice.
pub fn peak_usage(intervals: &[(TimeWindow, Usage)], window: &TimeWindow) -> Usage {
    // (time, is_start, usage): at one instant ends sort before starts.
    let mut points: Vec<(chrono::DateTime<chrono::Utc>, bool, Usage)> =
        Vec::with_capacity(intervals.len() * 2);
    for (w, usage) in intervals {
        if !w.overlaps(window) {
            continue;
        }
        points.push((w.start().max(window.start()), true, *usage));
        points.push((w.end().min(window.end()), false, *usage));
    }
    points.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)));
    let mut current = Usage::default();
    let mut peak = Usage::default();
    for (_, is_start, usage) in points {
        current = current.shifted(usage, is_start);
        peak.vcpus = peak.vcpus.max(current.vcpus);
        peak.memory_mb = peak.memory_mb.max(current.memory_mb);
        peak.disk_gb = peak.disk_gb.max(current.disk_gb);
    }
    peak
}

/// How many more slots of size `slot` fit under `capacity` on top of `peak`; none for a slot
/// that asks for nothing (requests are validated against that; this is the backstop).
pub fn free_slots(capacity: Usage, peak: Usage, slot: Usage) -> i64 {
    if !slot.is_positive() {
        return 0;
    }
    let fit = |cap: i64, used: i64, need: i64| -> i64 {
        if need <= 0 {
            i64::MAX
        } else {
            (cap.saturating_sub(used) / need).max(0)
        }
    };
    fit(capacity.vcpus, peak.vcpus, slot.vcpus)
        .min(fit(capacity.memory_mb, peak.memory_mb, slot.memory_mb))
        .min(fit(capacity.disk_gb, peak.disk_gb, slot.disk_gb))
}

/// How many units of each of a shared resource's allocations must leave it for the rest to
/// fit under `capacity` at every instant: the resource's capacity fell (new facts or
/// allocation ratios from the operator or the cloud) below what it was granted for. Each
/// allocation is `(key, window, size of one unit, units)`. At the first instant over
/// capacity, of the allocations in force then that use an overrun dimension, the one that
/// starts last (the booking least far along, the cheapest to move; ties: the greater key)
/// gives up as few units as bring that instant under capacity, and the sweep runs again
/// until nothing is over. Returns `(key, units leaving)` in the order the allocations were
/// first cut; an allocation appears once. Every one of them was in force at an instant
/// that was over capacity.
pub fn overflowing<K: Ord + Clone>(
    capacity: Usage,
    held: &[(K, TimeWindow, Usage, i64)],
) -> Vec<(K, i64)> {
    let over = |u: Usage| {
        u.vcpus > capacity.vcpus || u.memory_mb > capacity.memory_mb || u.disk_gb > capacity.disk_gb
    };
    // Units of each allocation still staying.
    let mut staying: Vec<i64> = held.iter().map(|h| h.3.max(0)).collect();
    let mut leaving: Vec<(usize, i64)> = Vec::new();
    loop {
        // (time, is_start, index): at one instant ends sort before starts, as in `peak_usage`.
        let mut points: Vec<(chrono::DateTime<chrono::Utc>, bool, usize)> = held
            .iter()
            .enumerate()
            .filter(|(i, _)| staying[*i] > 0)
            .flat_map(|(i, (_, w, _, _))| [(w.start(), true, i), (w.end(), false, i)])
            .collect();
        points.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)));
        let mut current = Usage::default();
        let mut first_over = None;
        for (at, is_start, i) in points {
            current = current.shifted(held[i].2.times(staying[i]), is_start);
            if is_start && over(current) {
                first_over = Some(at);
                break;
            }
        }
        let Some(at) = first_over else {
            break;
        };
        // Per dimension: (in use, capacity, one unit's size of candidate `i`).
        let dimensions = |i: usize| {
            let slot = held[i].2;
            [
                (current.vcpus, capacity.vcpus, slot.vcpus),
                (current.memory_mb, capacity.memory_mb, slot.memory_mb),
                (current.disk_gb, capacity.disk_gb, slot.disk_gb),
            ]
        };
        let helps = |i: usize| {
            dimensions(i)
                .iter()
                .any(|&(used, cap, one)| used > cap && one > 0)
        };
        let in_force = |i: usize| {
            let w = held[i].1;
            staying[i] > 0 && w.start() <= at && at < w.end()
        };
        let latest = |pick: &dyn Fn(usize) -> bool| {
            (0..held.len())
                .filter(|&i| in_force(i) && pick(i))
                .max_by(|&a, &b| {
                    let (ka, wa) = (&held[a].0, held[a].1);
                    let (kb, wb) = (&held[b].0, held[b].1);
                    wa.start().cmp(&wb.start()).then(ka.cmp(kb))
                })
        };
        // Normally one that uses an overrun dimension; one that does not (a capacity below
        // zero) leaves whole, as nothing smaller can help.
        let (chosen, cut) = match latest(&helps) {
            Some(i) => {
                let needed = dimensions(i)
                    .iter()
                    .filter(|&&(used, cap, one)| used > cap && one > 0)
                    .map(|&(used, cap, one)| used.saturating_sub(cap).saturating_add(one - 1) / one)
                    .max()
                    .unwrap_or(1);
                (i, needed.clamp(1, staying[i]))
            }
            None => match latest(&|_| true) {
                Some(i) => (i, staying[i]),
                None => break,
            },
        };
        staying[chosen] -= cut;
        match leaving.iter_mut().find(|(i, _)| *i == chosen) {
            Some((_, units)) => *units += cut,
            None => leaving.push((chosen, cut)),
        }
    }
    leaving
        .into_iter()
        .map(|(i, units)| (held[i].0.clone(), units))
        .collect()
}

/// One host's free slots in a window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostSlots {
    pub host: i64,
    pub slots: i64,
    /// Whether other instance reservations already use the host in the window (packing
    /// prefers those, keeping empty hosts whole for host reservations).
    pub in_use: bool,
}

/// Spreads `amount` instances over hosts by affinity. `keep` lists hosts the reservation
/// uses already, preferred, each once per slot it holds there: spread freely, a reservation
/// first keeps as many slots on each of its hosts as it holds (its servers run there), and
/// only then fills free slots in order. Returns (host, units) or `None` when they do not
/// fit.
pub fn place(
    candidates: &[HostSlots],
    keep: &[i64],
    amount: i64,
    affinity: Affinity,
) -> Option<Vec<(i64, i64)>> {
    let mut ordered: Vec<HostSlots> = candidates.iter().copied().filter(|c| c.slots > 0).collect();
    ordered.sort_by_key(|c| (!keep.contains(&c.host), !c.in_use, c.host));
    match affinity {
        Affinity::Same => ordered
            .iter()
            .find(|c| c.slots >= amount)
            .map(|c| vec![(c.host, amount)]),
        Affinity::Different => {
            let wanted = usize::try_from(amount).ok()?;
            (ordered.len() >= wanted)
                .then(|| ordered.iter().take(wanted).map(|c| (c.host, 1)).collect())
        }
        Affinity::Any => {
            let mut held: BTreeMap<i64, i64> = BTreeMap::new();
            for host in keep {
                *held.entry(*host).or_default() += 1;
            }
            let mut left = amount;
            let mut out: Vec<(i64, i64)> = Vec::new();
            for c in &ordered {
                let take = c
                    .slots
                    .min(held.get(&c.host).copied().unwrap_or(0))
                    .min(left);
                if take > 0 {
                    out.push((c.host, take));
                    left -= take;
                }
            }
            for c in &ordered {
                if left == 0 {
                    break;
                }
                let taken = out.iter_mut().find(|(host, _)| *host == c.host);
                let already = taken.as_ref().map_or(0, |(_, n)| *n);
                let take = (c.slots - already).min(left);
                if take <= 0 {
                    continue;
                }
                match taken {
                    Some((_, n)) => *n += take,
                    None => out.push((c.host, take)),
                }
                left -= take;
            }
            (left == 0).then_some(out)
        }
    }
}

/// Candidates a batched placement reads first, after the ones the reservation keeps; each
/// further probe reads twice as many more.
pub const PLACE_BATCH: usize = 32;

/// Where each probe of a batched placement ends, over `total` candidates of which the first
/// `kept` are the reservation's own: `kept + 32`, then `+ 64`, `+ 128`, ..., the last at
/// `total`. Doubling keeps a search that must see every candidate to a few probes.
pub fn probe_ends(kept: usize, total: usize) -> Vec<usize> {
    let mut ends = Vec::new();
    let mut size = PLACE_BATCH;
    let mut end = kept.saturating_add(size);
    loop {
        ends.push(end.min(total));
        if end >= total {
            return ends;
        }
        size = size.saturating_mul(2);
        end = end.saturating_add(size);
    }
}

/// [`place`] over the shortest probe of `candidates` (the kept ones first, then in the
/// order the search reads them) in which the instances fit, as an allocation that reads the
/// candidates' usage probe by probe finds it; `None` when they do not fit in all of them.
/// A candidate that cannot be used has zero slots but keeps its place, so that every
/// caller's probes cover the same hosts.
pub fn place_in_batches(
    candidates: &[HostSlots],
    kept: usize,
    keep: &[i64],
    amount: i64,
    affinity: Affinity,
) -> Option<Vec<(i64, i64)>> {
    probe_ends(kept, candidates.len())
        .into_iter()
        .find_map(|end| place(&candidates[..end], keep, amount, affinity))
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
    fn probes_double_after_the_kept_candidates() {
        assert_eq!(probe_ends(0, 0), vec![0]);
        assert_eq!(probe_ends(0, 10), vec![10]);
        assert_eq!(probe_ends(0, 32), vec![32]);
        assert_eq!(probe_ends(0, 100), vec![32, 96, 100]);
        assert_eq!(probe_ends(3, 300), vec![35, 99, 227, 300]);
    }

    #[test]
    fn batched_placement_stops_at_the_first_probe_that_fits() {
        let hosts = |slots: &[i64], used: &[i64]| -> Vec<HostSlots> {
            slots
                .iter()
                .enumerate()
                .map(|(i, &n)| HostSlots {
                    host: i as i64 + 1,
                    slots: n,
                    in_use: used.contains(&(i as i64 + 1)),
                })
                .collect()
        };
        // 100 hosts of 2 slots, host 90 already in use: a whole search would pack onto
        // host 90; the first probe (hosts 1 to 32) already fits.
        let many = hosts(&[2; 100], &[90]);
        assert_eq!(place(&many, &[], 2, Affinity::Any), Some(vec![(90, 2)]));
        assert_eq!(
            place_in_batches(&many, 0, &[], 2, Affinity::Any),
            Some(vec![(1, 2)])
        );
        // Hosts that cannot be used keep their place: the first 40 are full, so the second
        // probe (33 to 96) is where 8 instances on different hosts are found.
        let mut slots = vec![0; 40];
        slots.extend([1; 60]);
        let placed = place_in_batches(&hosts(&slots, &[]), 0, &[], 8, Affinity::Different);
        assert_eq!(placed, Some((41..=48).map(|h| (h, 1)).collect::<Vec<_>>()));
        // What fits nowhere is None, as with a whole search.
        assert_eq!(
            place_in_batches(&hosts(&[1; 100], &[]), 0, &[], 3, Affinity::Same),
            None
        );
        // Kept hosts come first and are preferred.
        let mut kept = hosts(&[2; 50], &[]);
        kept.rotate_left(45);
        assert_eq!(
            place_in_batches(&kept, 1, &[46], 2, Affinity::Any),
            Some(vec![(46, 2)])
        );
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

    fn u(vcpus: i64, memory_mb: i64, disk_gb: i64) -> Usage {
        Usage {
            vcpus,
            memory_mb,
            disk_gb,
        }
    }

    fn w(start_h: i64, end_h: i64) -> TimeWindow {
        let base = Utc.with_ymd_and_hms(2030, 1, 1, 0, 0, 0).unwrap();
        TimeWindow::new(
            base + Duration::hours(start_h),
            base + Duration::hours(end_h),
        )
        .unwrap()
    }

    #[test]
    fn overflowing_table() {
        type Row = (Usage, Vec<(u32, TimeWindow, Usage, i64)>, Vec<(u32, i64)>);
        let rows: Vec<Row> = vec![
            // Nothing held, or everything fits: nothing leaves.
            (u(0, 0, 0), vec![], vec![]),
            (
                u(8, 8, 8),
                vec![(1, w(0, 10), u(4, 4, 4), 1), (2, w(0, 10), u(2, 2, 2), 2)],
                vec![],
            ),
            // Touching windows never add up.
            (
                u(4, 4, 4),
                vec![(1, w(0, 5), u(4, 4, 4), 1), (2, w(5, 10), u(4, 4, 4), 1)],
                vec![],
            ),
            // Over in one dimension: the later start leaves.
            (
                u(8, 100, 100),
                vec![(1, w(0, 10), u(6, 1, 1), 1), (2, w(2, 10), u(4, 1, 1), 1)],
                vec![(2, 1)],
            ),
            // Same start: the greater key leaves.
            (
                u(8, 8, 8),
                vec![(2, w(0, 10), u(6, 0, 0), 1), (1, w(0, 10), u(6, 0, 0), 1)],
                vec![(2, 1)],
            ),
            // Only the units over capacity leave: two of the later booking's four.
            (
                u(6, 100, 100),
                vec![(1, w(0, 10), u(1, 1, 1), 4), (2, w(2, 10), u(1, 1, 1), 4)],
                vec![(2, 2)],
            ),
            // Three vCPUs over with units of two: two units leave, one stays.
            (
                u(5, 100, 100),
                vec![(1, w(0, 10), u(1, 1, 1), 2), (2, w(1, 10), u(2, 1, 1), 3)],
                vec![(2, 2)],
            ),
            // A capacity below the first booking's own: it gives up units at its start, then
            // the later one at its own.
            (
                u(2, 100, 100),
                vec![(1, w(0, 10), u(1, 1, 1), 4), (2, w(2, 10), u(1, 1, 1), 1)],
                vec![(1, 2), (2, 1)],
            ),
            // As many over as the later booking holds: it leaves whole.
            (
                u(2, 100, 100),
                vec![(1, w(0, 10), u(1, 1, 1), 2), (2, w(2, 10), u(1, 1, 1), 3)],
                vec![(2, 3)],
            ),
            // The later booking uses none of the dimension over capacity: the earlier one
            // gives up units, the later one keeps all of its own.
            (
                u(100, 100, 1),
                vec![(1, w(0, 10), u(1, 1, 1), 2), (2, w(1, 10), u(1, 1, 0), 3)],
                vec![(1, 1)],
            ),
            // Two separate overruns, each settled by its own latest booking; the one that
            // fits between them stays.
            (
                u(4, 4, 4),
                vec![
                    (1, w(0, 3), u(4, 0, 0), 1),
                    (2, w(1, 2), u(1, 0, 0), 1),
                    (3, w(3, 6), u(0, 4, 0), 1),
                    (4, w(5, 9), u(0, 1, 0), 1),
                    (5, w(6, 9), u(0, 3, 0), 1),
                ],
                vec![(2, 1), (4, 1)],
            ),
            // A capacity that fell to nothing: everything leaves, in the order of the
            // instants they overrun it.
            (
                u(0, 0, 0),
                vec![(2, w(3, 4), u(1, 0, 0), 2), (1, w(0, 10), u(1, 0, 0), 3)],
                vec![(1, 3), (2, 2)],
            ),
        ];
        for (capacity, held, expected) in rows {
            assert_eq!(
                overflowing(capacity, &held),
                expected,
                "{held:?} under {capacity:?}"
            );
        }
    }

    proptest! {
        /// What stays fits at every instant; no allocation loses more units than it holds,
        /// or any when it was never in force at an instant over capacity with everything
        /// held; nothing leaves when all fits.
        #[test]
        fn overflowing_leaves_what_fits(
            capacity in (0i64..12, 0i64..12, 0i64..12),
            held in proptest::collection::vec(
                ((0i64..12, 1i64..6), (0i64..4, 0i64..4, 0i64..4), 1i64..5), 0..10),
        ) {
            let capacity = u(capacity.0, capacity.1, capacity.2);
            let held: Vec<(usize, TimeWindow, Usage, i64)> = held
                .iter()
                .enumerate()
                .map(|(i, ((s, len), (a, b, c), n))| (i, w(*s, s + len), u(*a, *b, *c), *n))
                .collect();
            let leaving = overflowing(capacity, &held);
            let left = |key: usize| {
                leaving.iter().find(|(k, _)| *k == key).map_or(0, |(_, n)| *n)
            };
            let fits = |set: &[(TimeWindow, Usage)], window: &TimeWindow| {
                let p = peak_usage(set, window);
                p.vcpus <= capacity.vcpus && p.memory_mb <= capacity.memory_mb && p.disk_gb <= capacity.disk_gb
            };
            let everything = w(0, 24);
            let all: Vec<(TimeWindow, Usage)> = held.iter().map(|(_, w, s, n)| (*w, s.times(*n))).collect();
            if fits(&all, &everything) {
                prop_assert!(leaving.is_empty());
            }
            let staying: Vec<(TimeWindow, Usage)> = held
                .iter()
                .map(|(k, w, s, n)| (*w, s.times(n - left(*k))))
                .collect();
            prop_assert!(fits(&staying, &everything));
            let mut keys: Vec<usize> = leaving.iter().map(|(k, _)| *k).collect();
            keys.sort();
            keys.dedup();
            prop_assert_eq!(keys.len(), leaving.len());
            for (key, units) in &leaving {
                let (_, window, _, n) = held[*key];
                prop_assert!(*units >= 1 && *units <= n, "{key} loses {units} of {n}");
                prop_assert!(!fits(&all, &window), "{key} lost units though its window fit");
            }
        }
    }

    #[test]
    fn peak_usage_table() {
        type Row = (Vec<(TimeWindow, Usage)>, TimeWindow, Usage);
        let rows: Vec<Row> = vec![
            (vec![], w(0, 10), u(0, 0, 0)),
            (vec![(w(0, 10), u(2, 1024, 10))], w(2, 4), u(2, 1024, 10)),
            // Two reservations that never overlap each other: the peak is the larger one.
            (
                vec![(w(0, 5), u(4, 0, 0)), (w(5, 10), u(6, 0, 0))],
                w(0, 10),
                u(6, 0, 0),
            ),
            // Overlapping ones add up where they overlap.
            (
                vec![(w(0, 6), u(4, 100, 0)), (w(5, 10), u(6, 50, 0))],
                w(0, 10),
                u(10, 150, 0),
            ),
            // ... but not when the overlap lies outside the window.
            (
                vec![(w(0, 6), u(4, 0, 0)), (w(5, 10), u(6, 0, 0))],
                w(6, 10),
                u(6, 0, 0),
            ),
            // Outside the window entirely: nothing.
            (vec![(w(0, 2), u(8, 8, 8))], w(2, 4), u(0, 0, 0)),
            // Dimensions peak at different instants; each is its own maximum.
            (
                vec![(w(0, 2), u(8, 1, 0)), (w(2, 4), u(1, 8, 0))],
                w(0, 4),
                u(8, 8, 0),
            ),
        ];
        for (intervals, window, expected) in rows {
            assert_eq!(
                peak_usage(&intervals, &window),
                expected,
                "{intervals:?} in {window:?}"
            );
        }
    }

    #[test]
    fn usage_arithmetic_saturates() {
        let big = u(i64::MAX / 2, 3, i64::MAX);
        assert_eq!(big.times(4), u(i64::MAX, 12, i64::MAX));
        assert_eq!(u(-3, 0, 1).times(i64::MAX), u(i64::MIN, 0, i64::MAX));
        let peak = peak_usage(
            &[(w(0, 10), u(i64::MAX, 1, 1)), (w(5, 15), u(i64::MAX, 1, 1))],
            &w(0, 20),
        );
        assert_eq!(peak, u(i64::MAX, 2, 2));
    }

    #[test]
    fn free_slots_table() {
        let rows = [
            (u(16, 65536, 500), u(0, 0, 0), u(2, 4096, 20), 8),
            (u(16, 65536, 500), u(10, 0, 0), u(2, 4096, 20), 3),
            (u(16, 8192, 500), u(0, 0, 0), u(2, 4096, 20), 2),
            (u(16, 65536, 30), u(0, 0, 0), u(2, 4096, 20), 1),
            (u(16, 65536, 500), u(16, 0, 0), u(1, 1, 1), 0),
            (u(16, 65536, 500), u(20, 0, 0), u(1, 1, 1), 0),
            (u(4, 0, 0), u(0, 0, 0), u(1, 0, 0), 4),
            // A slot of size zero fits nowhere rather than everywhere.
            (u(4, 4096, 40), u(0, 0, 0), u(0, 0, 0), 0),
            // Extreme sizes and usages neither overflow nor wrap.
            (u(4, 4096, 40), u(i64::MIN, 0, 0), u(1, 1, 1), 40),
            (
                u(i64::MAX, i64::MAX, i64::MAX),
                u(-5, 0, 0),
                u(1, i64::MAX, 1),
                1,
            ),
        ];
        for (capacity, peak, slot, expected) in rows {
            assert_eq!(
                free_slots(capacity, peak, slot),
                expected,
                "{capacity:?} {peak:?} {slot:?}"
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
        /// A batched placement fits exactly when a whole one does, and what it grants is
        /// a valid placement: within each host's slots and by the affinity.
        #[test]
        fn batched_placement_fits_when_a_whole_one_does(
            slots in proptest::collection::vec(0i64..4, 0..200),
            amount in 1i64..12,
            affinity in prop_oneof![
                Just(Affinity::Any), Just(Affinity::Same), Just(Affinity::Different)
            ],
        ) {
            let candidates: Vec<HostSlots> = slots
                .iter()
                .enumerate()
                .map(|(i, &n)| HostSlots { host: i as i64, slots: n, in_use: i % 7 == 0 })
                .collect();
            let whole = place(&candidates, &[], amount, affinity);
            let batched = place_in_batches(&candidates, 0, &[], amount, affinity);
            prop_assert_eq!(whole.is_some(), batched.is_some());
            if let Some(placement) = batched {
                prop_assert_eq!(placement.iter().map(|p| p.1).sum::<i64>(), amount);
                for (host, units) in &placement {
                    prop_assert!(*units <= slots[*host as usize]);
                }
                match affinity {
                    Affinity::Same => prop_assert_eq!(placement.len(), 1),
                    Affinity::Different => prop_assert!(placement.iter().all(|p| p.1 == 1)),
                    Affinity::Any => {}
                }
            }
        }
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
