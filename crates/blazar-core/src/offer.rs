//! "When can I have it?": the earliest (or longest) windows in which a whole lease request
//! fits, and what each of its reservations would be granted there.
//!
//! The search works on what the store read for the request's candidate resources (their
//! allocations inside the search window) and decides exactly as a lease create decides:
//! whole resources are picked with [`engine::pick`] in the same preference order, instance
//! slots are placed with [`engine::place_in_batches`] over the peak usage of the window, and each
//! reservation sees what the ones before it in the same lease were given.
//!
//! Why checking a few starts is exact: whether a window fits depends only on which
//! allocations it overlaps (for instance slots too: intervals that all overlap the window
//! and each other share an instant inside it, so the peak use is fixed by the set). That set
//! changes, as the start moves minute by minute with the length fixed, only where the start
//! passes an allocation's end or the window's end passes an allocation's start. So the
//! earliest fitting start is the first minute of the search or one of those points, and
//! the longest fitting length at a start is the longest wanted or one that ends just where
//! an allocation starts. The search checks those only, and answers what a minute-by-minute
//! scan would (a property test below checks it against a brute-force scan).
//!
//! A project's quotas on what it holds at once ([`Ceiling`]) are decided the same way: what
//! a window adds is fixed by its grants, and what the project already holds there changes
//! only where the window passes the end or reaches the start of one of its holdings, which
//! are checked as well.

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Duration, DurationRound, Utc};

use crate::engine::{self, HostSlots, Usage, free_slots, peak_usage};
use crate::reservation::Affinity;
use crate::time::TimeWindow;

/// One allocation of a resource, as far as the search cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Busy {
    pub start: DateTime<Utc>,
    /// Its end plus the cleaning margin: the resource is taken until then.
    pub until: DateTime<Utc>,
    /// A whole resource (a host, an address, ...) rather than instance slots on a host.
    pub exclusive: bool,
    /// What instance slots use of a host, all units together (nothing for whole resources).
    pub usage: Usage,
}

impl Busy {
    fn overlaps(&self, start: DateTime<Utc>, until: DateTime<Utc>) -> bool {
        self.start < until && start < self.until
    }
}

/// The allocations of the candidate resources that reach into the search window, by
/// resource type and resource id.
#[derive(Debug, Clone, Default)]
pub struct Occupancy {
    by_kind: HashMap<String, HashMap<i64, Vec<Busy>>>,
    /// The requesting project's limits on what it holds at once.
    ceilings: Vec<Ceiling>,
    /// The requesting project's monthly budget of host-hours.
    budget: Option<Budget>,
}

/// A project's budget of (weighted) whole-host hours per calendar month (UTC), with what
/// it has booked in each month already: a window fits only if, in every month it touches,
/// what it adds stays within what is left.
#[derive(Debug, Clone, PartialEq)]
pub struct Budget {
    /// The kind of the hosts it counts.
    pub kind: String,
    pub limit: f64,
    /// Hours already booked, by month; a month not listed has none.
    pub booked: HashMap<TimeWindow, f64>,
    /// A host's weight when it is not 1.
    pub weights: HashMap<i64, f64>,
}

/// Most total weights a budget tries per month start (see [`Budget::starts`]).
const MAX_BUDGET_WEIGHTS: usize = 64;

impl Budget {
    /// Where a window of `minutes` starting between `first` and `last` is worth trying
    /// under the budget: at each month start it may reach (with the whole month's budget
    /// ahead of it), and from where, reaching into that month, it spends exactly what is
    /// left of the month before; that depends on the weight of the hosts granted, so once
    /// per total weight the lease may have (every count it may be granted, of hosts of one
    /// weight).
    fn starts(
        &self,
        demands: &[Demand],
        first: DateTime<Utc>,
        last: DateTime<Utc>,
        minutes: i64,
    ) -> Vec<DateTime<Utc>> {
        let Ok(span) = TimeWindow::new(first, last + Duration::minutes(minutes)) else {
            return Vec::new();
        };
        let (mut fewest, mut most) = (0usize, 0usize);
        for demand in demands {
            if let Demand::Whole {
                kind,
                candidates,
                min,
                max,
                ..
            } = demand
                && *kind == self.kind
            {
                fewest = fewest.saturating_add(*min);
                most = most.saturating_add((*max).min(candidates.len()));
            }
        }
        let mut unit: Vec<f64> = self
            .weights
            .values()
            .copied()
            .filter(|w| *w > 0.0)
            .collect();
        unit.push(1.0);
        unit.sort_by(f64::total_cmp);
        unit.dedup();
        let totals: Vec<f64> = (fewest.max(1)..=most)
            .flat_map(|count| unit.iter().map(move |w| w * count as f64))
            .take(MAX_BUDGET_WEIGHTS)
            .collect();
        let mut starts = Vec::new();
        for month in crate::quota::months(span).into_iter().skip(1) {
            let boundary = month.start();
            starts.push(boundary);
            let before = crate::quota::month_of(boundary - Duration::seconds(1));
            let booked = before
                .and_then(|m| self.booked.get(&m))
                .copied()
                .unwrap_or(0.0);
            let left = self.limit - booked;
            if left <= 0.0 {
                continue;
            }
            for total in &totals {
                // Whole seconds down, then the minute up: never more than is left (less a
                // rounding residue well inside `allows`'s tolerance: 13 / 3 hours is 15,600 s,
                // not 15,599.99...).
                let seconds = (left / total * 3600.0 + 1e-6).floor();
                if seconds.is_finite() && seconds < 1e12 {
                    starts.push(ceil_to_minute(boundary - Duration::seconds(seconds as i64)));
                }
            }
        }
        starts
    }

    /// How many more hosts, each of the heaviest weight any host has, a lease over
    /// `window` that was granted `granted` of them so far may have within the budget (see
    /// [`crate::quota::budget_room`]).
    fn room(&self, granted: &HashSet<i64>, window: TimeWindow) -> i64 {
        let weight = |id: &i64| self.weights.get(id).copied().unwrap_or(1.0);
        let so_far: f64 = granted.iter().map(weight).sum();
        let heaviest = self.weights.values().copied().fold(1.0, f64::max);
        crate::quota::budget_room(self.limit, window, heaviest, so_far, |month| {
            self.booked.get(&month).copied().unwrap_or(0.0)
        })
    }

    /// Whether a lease over `window` granted `granted` stays within the budget.
    fn allows(&self, demands: &[Demand], granted: &[Granted], window: TimeWindow) -> bool {
        let weight: f64 = demands
            .iter()
            .zip(granted)
            .filter(|(d, _)| matches!(d, Demand::Whole { kind, .. } if *kind == self.kind))
            .flat_map(|(_, g)| g.iter())
            .map(|(id, _)| self.weights.get(id).copied().unwrap_or(1.0))
            .sum();
        if weight <= 0.0 {
            return true;
        }
        crate::quota::months(window).into_iter().all(|month| {
            let from = window.start().max(month.start());
            let until = window.end().min(month.end());
            let hours = (until - from).num_seconds() as f64 / 3600.0 * weight;
            let booked = self.booked.get(&month).copied().unwrap_or(0.0);
            // As a create is measured: sums of whole hours and weights, a tiny residue is
            // nothing.
            hours <= 0.0 || booked + hours <= self.limit + 1e-9
        })
    }
}

/// What a [`Ceiling`] counts of a lease's grants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Counted {
    /// Whole resources of this kind (hosts, addresses).
    Whole(String),
    /// Instance slots on resources of this kind.
    Slots(String),
}

/// A project's limit on what it holds at any one instant (a quota), with what it holds
/// already: a window fits only if what the lease is granted there, added to the most the
/// project holds at any instant of the window, stays within the limit. Lease windows count,
/// not the cleaning margin after them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ceiling {
    pub counted: Counted,
    pub limit: i64,
    /// The project's holdings that count toward it: `[start, end)` and how many.
    pub held: Vec<(DateTime<Utc>, DateTime<Utc>, i64)>,
}

impl Ceiling {
    /// How much of `granted` (what each of `demands` is granted) counts toward the limit.
    fn counts(&self, demands: &[Demand], granted: &[Granted]) -> i64 {
        demands
            .iter()
            .zip(granted)
            .map(|(demand, grant)| match (demand, &self.counted) {
                (Demand::Whole { kind, .. }, Counted::Whole(counted)) if kind == counted => {
                    grant.len() as i64
                }
                (Demand::Slots { kind, .. }, Counted::Slots(counted)) if kind == counted => {
                    grant.iter().map(|(_, units)| *units).sum()
                }
                _ => 0,
            })
            .sum()
    }

    /// Whether a lease over `window` that adds `own` stays within the limit.
    fn allows(&self, own: i64, window: TimeWindow) -> bool {
        own == 0 || self.most_held(window).saturating_add(own) <= self.limit
    }

    /// The most the project holds at any one instant of `window`.
    fn most_held(&self, window: TimeWindow) -> i64 {
        let mut changes: Vec<(DateTime<Utc>, i64)> = Vec::new();
        for &(from, until, amount) in &self.held {
            let (from, until) = (from.max(window.start()), until.min(window.end()));
            if from < until {
                changes.push((from, amount));
                changes.push((until, -amount));
            }
        }
        // Half-open: at one instant every change applies before the sum is read (a holding
        // that ends where another starts never adds to it).
        changes.sort_unstable();
        let (mut held, mut peak) = (0i64, 0i64);
        let mut i = 0;
        while i < changes.len() {
            let at = changes[i].0;
            while i < changes.len() && changes[i].0 == at {
                held = held.saturating_add(changes[i].1);
                i += 1;
            }
            peak = peak.max(held);
        }
        peak
    }
}

impl Occupancy {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn add(&mut self, kind: &str, resource: i64, busy: Busy) {
        self.by_kind
            .entry(kind.to_string())
            .or_default()
            .entry(resource)
            .or_default()
            .push(busy);
    }

    fn of(&self, kind: &str, resource: i64) -> &[Busy] {
        self.by_kind
            .get(kind)
            .and_then(|m| m.get(&resource))
            .map_or(&[], Vec::as_slice)
    }

    fn all(&self) -> impl Iterator<Item = &Busy> + '_ {
        self.by_kind.values().flat_map(|m| m.values()).flatten()
    }

    /// Windows must also keep the project within `ceiling`.
    pub fn limit_by(&mut self, ceiling: Ceiling) {
        self.ceilings.push(ceiling);
    }

    /// Windows must also keep the project within its monthly `budget`.
    pub fn budget(&mut self, budget: Budget) {
        self.budget = Some(budget);
    }

    /// Whether any project limit (a ceiling or a budget) applies.
    fn limited(&self) -> bool {
        !self.ceilings.is_empty() || self.budget.is_some()
    }

    /// Whether a lease over `window` granted `granted` keeps within every ceiling and the
    /// budget.
    fn within_limits(&self, demands: &[Demand], granted: &[Granted], window: TimeWindow) -> bool {
        self.ceilings
            .iter()
            .all(|c| c.allows(c.counts(demands, granted), window))
            && self
                .budget
                .as_ref()
                .is_none_or(|b| b.allows(demands, granted, window))
    }

    /// The most a ranged demand for whole resources of `kind` (the `index`-th) may be
    /// granted in `window` under the project's ceilings on them (each ceiling's limit less
    /// the most the project holds at any instant of the window, less what the lease was
    /// granted of them so far, `granted`), and under its monthly budget (at the heaviest
    /// weight a host has, with what was booked and granted so far), each less the minimums
    /// of the demands after it; `None` for a limit that does not count them. A create caps
    /// such a request the same way (`quota::ranged_cap`).
    fn whole_room(
        &self,
        demands: &[Demand],
        index: usize,
        kind: &str,
        granted: &HashSet<i64>,
        window: TimeWindow,
    ) -> (Option<i64>, Option<i64>) {
        let later_min: i64 = demands[index + 1..]
            .iter()
            .map(|d| match d {
                Demand::Whole { kind: k, min, .. } if k == kind => *min as i64,
                _ => 0,
            })
            .sum();
        let ceiling = self
            .ceilings
            .iter()
            .filter(|c| matches!(&c.counted, Counted::Whole(k) if k == kind))
            .map(|c| {
                c.limit
                    .saturating_sub(c.most_held(window))
                    .saturating_sub(granted.len() as i64)
                    .saturating_sub(later_min)
            })
            .min();
        let budget = self
            .budget
            .as_ref()
            .filter(|b| b.kind == kind)
            .map(|b| b.room(granted, window).saturating_sub(later_min));
        (ceiling, budget)
    }

    /// The project's holdings under every ceiling.
    fn held(&self) -> impl Iterator<Item = &(DateTime<Utc>, DateTime<Utc>, i64)> + '_ {
        self.ceilings.iter().flat_map(|c| &c.held)
    }
}

/// What one reservation of the request needs, with its candidates already filtered by
/// its properties, reservability and (for instances) the fit of one instance.
#[derive(Debug, Clone, PartialEq)]
pub enum Demand {
    /// Between `min` and `max` whole resources of `kind` among `candidates` (in preference
    /// order); every one of `required` must be among those granted.
    Whole {
        kind: String,
        candidates: Vec<i64>,
        required: Vec<i64>,
        min: usize,
        max: usize,
    },
    /// `amount` instances of size `slot` on hosts of resource type `kind`, placed by
    /// `affinity`; `hosts` are the candidates with their capacity (totals times ratios).
    Slots {
        kind: String,
        hosts: Vec<(i64, Usage)>,
        slot: Usage,
        amount: i64,
        affinity: Affinity,
    },
}

impl Demand {
    /// How many resources (whole ones) or instances (slots) it asks for at least.
    pub fn asked(&self) -> usize {
        match self {
            Demand::Whole { min, .. } => *min,
            Demand::Slots { amount, .. } => usize::try_from(*amount).unwrap_or(usize::MAX),
        }
    }

    /// The same demand over `size` of its candidates, the first in preference order or
    /// (`last`) the last; required resources are always kept. `None` when that would be all
    /// of them.
    fn part(&self, size: usize, last: bool) -> Option<Demand> {
        fn keep<T>(list: &mut Vec<T>, size: usize, last: bool) {
            match last {
                true => drop(list.drain(..list.len() - size)),
                false => list.truncate(size),
            }
        }
        let len = match self {
            Demand::Whole { candidates, .. } => candidates.len(),
            Demand::Slots { hosts, .. } => hosts.len(),
        };
        if len <= size {
            return None;
        }
        let mut part = self.clone();
        match &mut part {
            Demand::Whole {
                candidates,
                required,
                ..
            } => {
                keep(candidates, size, last);
                // A required resource cut off with the rest could never be granted from the
                // part: kept, after the others (the order of the whole list among them).
                let kept: std::collections::HashSet<i64> = candidates.iter().copied().collect();
                let required: std::collections::HashSet<i64> = required.iter().copied().collect();
                let cut: Vec<i64> = match self {
                    Demand::Whole {
                        candidates: all, ..
                    } => all
                        .iter()
                        .copied()
                        .filter(|id| required.contains(id) && !kept.contains(id))
                        .collect(),
                    Demand::Slots { .. } => Vec::new(),
                };
                candidates.extend(cut);
            }
            Demand::Slots { hosts, .. } => keep(hosts, size, last),
        }
        Some(part)
    }

    /// Whether what this demand is granted, wherever it fits over the first of its
    /// candidates, is what it is granted over all of them: a fixed number of whole
    /// resources, picked in preference order. (Given a range, it takes up to the most it
    /// may, from further candidates too; instance slots pack onto hosts already in use,
    /// wherever they are.)
    fn settled_by_its_first_candidates(&self) -> bool {
        matches!(self, Demand::Whole { min, max, .. } if min == max)
    }
}

/// What a search over part of the candidates must answer like the whole search.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeFor {
    /// The windows only (a create books its window with the normal allocation path).
    Windows,
    /// The windows and what each reservation is granted there (offers show it).
    Grants,
}

/// The demands over part of their candidates (`size(demand)` of each), for a first search
/// that reads less: whatever fits there fits over all the candidates, as long as each
/// demand but the last is granted the same there as over all of them (the demands of a
/// lease are met in order, and a grant takes resources from those after it), which its
/// first candidates in preference order give; for [`ProbeFor::Grants`] the last as well.
/// For windows alone, the last demand is probed over its last candidates instead: the ones
/// creates take least (they take the first free ones), so the likeliest to be free. `None`
/// when that does not hold or when no demand has more candidates than its size.
pub fn probe(
    demands: &[Demand],
    size: impl Fn(&Demand) -> usize,
    needs: ProbeFor,
) -> Option<Vec<Demand>> {
    let (_, before_last) = demands.split_last()?;
    let settled = match needs {
        ProbeFor::Windows => before_last,
        ProbeFor::Grants => demands,
    };
    if !settled.iter().all(Demand::settled_by_its_first_candidates) {
        return None;
    }
    let count = demands.len();
    let parts: Vec<Option<Demand>> = demands
        .iter()
        .enumerate()
        .map(|(i, d)| d.part(size(d), needs == ProbeFor::Windows && i + 1 == count))
        .collect();
    if parts.iter().all(Option::is_none) {
        return None;
    }
    Some(
        parts
            .into_iter()
            .zip(demands)
            .map(|(p, d)| p.unwrap_or_else(|| d.clone()))
            .collect(),
    )
}

/// What one reservation would be granted: (resource, units) pairs, one unit per whole
/// resource and the number of instances per host for slots.
pub type Granted = Vec<(i64, i64)>;

/// Why a window does not fit: the reservation (0-based) that could not be met there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unmet(pub usize);

/// Grants made so far in one window, which later reservations of the lease must respect.
#[derive(Default)]
struct Overlay {
    /// Whole resources taken, by kind.
    whole: HashMap<String, HashSet<i64>>,
    /// Instance slots placed on hosts, by kind and host.
    slots: HashMap<String, HashMap<i64, Usage>>,
}

impl Overlay {
    fn taken(&self, kind: &str, id: i64) -> bool {
        self.whole.get(kind).is_some_and(|s| s.contains(&id))
    }

    fn slots_on(&self, kind: &str, id: i64) -> Option<Usage> {
        self.slots.get(kind).and_then(|m| m.get(&id)).copied()
    }
}

fn add(a: Usage, b: Usage) -> Usage {
    Usage {
        vcpus: a.vcpus.saturating_add(b.vcpus),
        memory_mb: a.memory_mb.saturating_add(b.memory_mb),
        disk_gb: a.disk_gb.saturating_add(b.disk_gb),
    }
}

/// What every reservation would be granted if the lease took `window` and was blocked
/// `until` (its end plus the cleaning margin), reservation by reservation in request order,
/// or which reservation could not be met. A ranged request for whole resources is granted
/// no more than the project's ceilings on them leave (never less than its minimum).
pub fn fit(
    demands: &[Demand],
    occupancy: &Occupancy,
    window: TimeWindow,
    until: DateTime<Utc>,
) -> Result<Vec<Granted>, Unmet> {
    let start = window.start();
    let mut overlay = Overlay::default();
    let mut granted = Vec::with_capacity(demands.len());
    for (i, demand) in demands.iter().enumerate() {
        let grant = match demand {
            Demand::Whole {
                kind,
                candidates,
                required,
                min,
                max,
            } => {
                let busy: HashSet<i64> = candidates
                    .iter()
                    .chain(required)
                    .copied()
                    .filter(|&id| {
                        overlay.taken(kind, id)
                            || overlay.slots_on(kind, id).is_some()
                            || occupancy
                                .of(kind, id)
                                .iter()
                                .any(|b| b.overlaps(start, until))
                    })
                    .collect();
                if required.iter().any(|id| busy.contains(id)) {
                    return Err(Unmet(i));
                }
                let mut max = *max;
                if *min < max {
                    let none = HashSet::new();
                    let so_far = overlay.whole.get(kind).unwrap_or(&none);
                    let (ceiling, budget) = occupancy.whole_room(demands, i, kind, so_far, window);
                    max = crate::quota::ranged_cap(*min, max, ceiling, budget);
                }
                let chosen =
                    engine::pick(candidates, &busy, required, *min, max).map_err(|_| Unmet(i))?;
                let taken = overlay.whole.entry(kind.clone()).or_default();
                taken.extend(chosen.iter().copied());
                chosen.into_iter().map(|id| (id, 1)).collect()
            }
            Demand::Slots {
                kind,
                hosts,
                slot,
                amount,
                affinity,
            } => {
                let window = TimeWindow::new(start, until).map_err(|_| Unmet(i))?;
                // One entry per candidate, in order, those that cannot be used with zero
                // slots: the probes of `place_in_batches` then cover the hosts a create's
                // do.
                let mut free = Vec::with_capacity(hosts.len());
                for &(id, capacity) in hosts {
                    let unusable = HostSlots {
                        host: id,
                        slots: 0,
                        in_use: true,
                    };
                    if overlay.taken(kind, id) {
                        free.push(unusable);
                        continue;
                    }
                    let uses = occupancy.of(kind, id);
                    let overlapping: Vec<&Busy> =
                        uses.iter().filter(|b| b.overlaps(start, until)).collect();
                    if overlapping.iter().any(|b| b.exclusive) {
                        free.push(unusable);
                        continue;
                    }
                    let intervals: Vec<(TimeWindow, Usage)> = overlapping
                        .iter()
                        .filter_map(|b| {
                            TimeWindow::new(b.start, b.until).ok().map(|w| (w, b.usage))
                        })
                        .collect();
                    let mine = overlay.slots_on(kind, id);
                    // This lease's earlier slots cover the whole window: they add to the peak.
                    let used = add(peak_usage(&intervals, &window), mine.unwrap_or_default());
                    free.push(HostSlots {
                        host: id,
                        slots: free_slots(capacity, used, *slot),
                        in_use: !overlapping.is_empty() || mine.is_some(),
                    });
                }
                let placement =
                    engine::place_in_batches(&free, 0, &[], *amount, *affinity).ok_or(Unmet(i))?;
                let placed = overlay.slots.entry(kind.clone()).or_default();
                for &(host, units) in &placement {
                    let total = placed.entry(host).or_default();
                    *total = add(*total, slot.times(units));
                }
                placement
            }
        };
        granted.push(grant);
    }
    Ok(granted)
}

/// The order offers are ranked in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Order {
    /// Earliest start first.
    #[default]
    Earliest,
    /// Longest window first (with a range of durations), then earliest.
    Longest,
}

/// What to look for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Search {
    /// The first minute a lease may start.
    pub not_before: DateTime<Utc>,
    /// The last minute a lease may end.
    pub not_after: DateTime<Utc>,
    /// The shortest acceptable duration, in minutes (at least one).
    pub min_minutes: i64,
    /// The longest wanted duration, in minutes (`min_minutes` for a fixed duration).
    pub max_minutes: i64,
    /// The cleaning margin that follows every lease.
    pub cleaning: Duration,
    pub order: Order,
    /// How many offers, at most.
    pub limit: usize,
    /// The last minute a lease may start, when that is earlier than its end allows (a
    /// project may book only so far ahead).
    pub start_by: Option<DateTime<Utc>>,
}

/// A window in which the whole request fits, and what each reservation would get there.
#[derive(Debug, Clone, PartialEq)]
pub struct Offer {
    pub window: TimeWindow,
    pub granted: Vec<Granted>,
}

/// Rounds up to the next whole minute (dates a lease can be given are whole minutes).
pub fn ceil_to_minute(t: DateTime<Utc>) -> DateTime<Utc> {
    let down = t.duration_trunc(Duration::minutes(1)).unwrap_or(t);
    if down < t {
        down + Duration::minutes(1)
    } else {
        down
    }
}

impl Search {
    /// The latest minute a window of `minutes` may start at.
    fn latest_start(&self, minutes: i64) -> DateTime<Utc> {
        let by_end = self.not_after - Duration::minutes(minutes);
        self.start_by.map_or(by_end, |t| t.min(by_end))
    }

    /// The longest duration in `[min_minutes, max_minutes]` (and ending by `not_after`)
    /// that fits at `start`, with its grants; none when the shortest does not. Below
    /// the longest wanted, only lengths that end just before an allocation starts (after
    /// the cleaning margin) can be the longest that fits.
    fn longest_at(
        &self,
        demands: &[Demand],
        occupancy: &Occupancy,
        start: DateTime<Utc>,
    ) -> Option<(i64, Vec<Granted>)> {
        let room = (self.not_after - start).num_minutes();
        let max = self.max_minutes.min(room);
        if max < self.min_minutes {
            return None;
        }
        let at = |minutes: i64| {
            let end = start + Duration::minutes(minutes);
            let window = TimeWindow::new(start, end).ok()?;
            let granted = fit(demands, occupancy, window, end + self.cleaning).ok()?;
            occupancy
                .within_limits(demands, &granted, window)
                .then_some(granted)
        };
        // The shortest must fit: offers start where the shortest wanted window fits.
        let shortest = at(self.min_minutes)?;
        if max == self.min_minutes {
            return Some((max, shortest));
        }
        if let Some(granted) = at(max) {
            return Some((max, granted));
        }
        let mut lengths: Vec<i64> = occupancy
            .all()
            .map(|b| (b.start - start - self.cleaning).num_minutes())
            .chain(occupancy.held().map(|h| (h.0 - start).num_minutes()))
            .filter(|m| (self.min_minutes..max).contains(m))
            .collect();
        lengths.sort_unstable();
        lengths.dedup();
        // The longest that fits among `(fits, refused)`, `fits` fitting, by halving: for
        // lengths that meet the same allocations, where only a budget can run out.
        let halve = |mut fits: (i64, Vec<Granted>), mut refused: i64| {
            while refused - fits.0 > 1 {
                let mid = fits.0 + (refused - fits.0) / 2;
                match at(mid) {
                    Some(granted) => fits = (mid, granted),
                    None => refused = mid,
                }
            }
            fits
        };
        if !monotone(demands, occupancy) {
            // Longest first, each tried: see `monotone`. Every length above the one before
            // up to this one meets the same allocations and holdings, so fits alike, but for
            // a budget: that runs out with length, so the shortest of them is tried too.
            let mut tops = lengths;
            tops.push(max);
            for i in (0..tops.len()).rev() {
                let top = tops[i];
                if top < max
                    && let Some(granted) = at(top)
                {
                    return Some((top, granted));
                }
                let bottom = if i == 0 {
                    self.min_minutes
                } else {
                    tops[i - 1] + 1
                };
                if occupancy.budget.is_some()
                    && bottom < top
                    && let Some(granted) = at(bottom)
                {
                    return Some(halve((bottom, granted), top));
                }
            }
            return Some((self.min_minutes, shortest));
        }
        // A window only gets harder to fit as it grows (it meets every allocation a shorter
        // one meets): the longest that fits is found by halving, in a few fits rather than
        // one per allocation of the window.
        let mut best = (self.min_minutes, shortest);
        let (mut fitting, mut beyond) = (0, lengths.len());
        while fitting < beyond {
            let mid = fitting + (beyond - fitting) / 2;
            match at(lengths[mid]) {
                Some(granted) => {
                    best = (lengths[mid], granted);
                    fitting = mid + 1;
                }
                None => beyond = mid,
            }
        }
        if occupancy.budget.is_some() {
            // A budget runs out at any minute, not where an allocation starts: between the
            // longest found and the next length that did not fit.
            let refused = lengths.get(fitting).copied().unwrap_or(max);
            best = halve(best, refused);
        }
        Some(best)
    }
}

/// Whether a window of `demands` that fits at a start fits there at every shorter length.
/// True of one demand alone, and of demands that each hold exactly their resources (an
/// extension's): a longer window meets every allocation a shorter one meets. Not of
/// several demands in general: one granted a range takes as many as are free in preference
/// order, so over a longer window it may take fewer hosts and leave the next demand room
/// it did not have over a shorter one. Nor, under a ceiling, of a demand granted a range:
/// over a shorter window it takes more, which may take the project past the ceiling; nor
/// under a budget that weighs hosts: over a longer window a heavy host may be busy and a
/// lighter one granted, which the budget allows for longer.
fn monotone(demands: &[Demand], occupancy: &Occupancy) -> bool {
    let ranged = |d: &Demand| matches!(d, Demand::Whole { min, max, .. } if min != max);
    let weighted = occupancy
        .budget
        .as_ref()
        .is_some_and(|b| !b.weights.is_empty());
    if weighted || (occupancy.limited() && demands.iter().any(ranged)) {
        return false;
    }
    demands.len() <= 1
        || demands.iter().all(|d| match d {
            Demand::Whole {
                candidates,
                required,
                min,
                max,
                ..
            } => min == max && *max == candidates.len() && required.len() == candidates.len(),
            Demand::Slots { hosts, .. } => hosts.len() == 1,
        })
}

/// The starts worth checking for windows of `minutes`, in order: the first minute of the
/// search, every allocation end after it (rounded up to a minute), and every first minute
/// at which such a window reaches an allocation's start, up to the latest start possible;
/// the same for the project's holdings under a ceiling.
fn candidate_starts(
    demands: &[Demand],
    occupancy: &Occupancy,
    search: &Search,
    minutes: i64,
) -> Vec<DateTime<Utc>> {
    let first = ceil_to_minute(search.not_before);
    let last = search.latest_start(minutes);
    let reach = Duration::minutes(minutes) + search.cleaning;
    let held = occupancy
        .held()
        .map(|&(start, end, _)| (start, end, Duration::minutes(minutes)));
    let mut starts: Vec<DateTime<Utc>> = occupancy
        .all()
        .map(|b| (b.start, b.until, reach))
        .chain(held)
        .flat_map(|(start, until, reach)| {
            let reaching = floor_to_minute(start - reach) + Duration::minutes(1);
            [ceil_to_minute(until), reaching]
        })
        .filter(|t| *t > first && *t <= last)
        .collect();
    if first <= last {
        starts.push(first);
    }
    if let Some(budget) = &occupancy.budget {
        starts.extend(
            budget
                .starts(demands, first, last, minutes)
                .into_iter()
                .filter(|t| *t > first && *t <= last),
        );
    }
    starts.sort_unstable();
    starts.dedup();
    starts
}

fn floor_to_minute(t: DateTime<Utc>) -> DateTime<Utc> {
    t.duration_trunc(Duration::minutes(1)).unwrap_or(t)
}

/// The offers for a request, ranked, at most `search.limit`. Offers never overlap each
/// other: after one, the next is the best window that starts once it has ended, so they
/// read as alternatives across the search window.
pub fn search(demands: &[Demand], occupancy: &Occupancy, search: &Search) -> Vec<Offer> {
    search_until(demands, occupancy, search, || false).unwrap_or_default()
}

/// [`search`], giving up (`None`) as soon as `give_up` says so; it is asked before each
/// start is tried, the unit of a search's work.
pub fn search_until(
    demands: &[Demand],
    occupancy: &Occupancy,
    search: &Search,
    give_up: impl Fn() -> bool,
) -> Option<Vec<Offer>> {
    if search.limit == 0 || search.min_minutes < 1 || search.max_minutes < search.min_minutes {
        return Some(Vec::new());
    }
    let starts = candidate_starts(demands, occupancy, search, search.min_minutes);
    let offer = |start: DateTime<Utc>, (minutes, granted): (i64, Vec<Granted>)| {
        TimeWindow::new(start, start + Duration::minutes(minutes))
            .ok()
            .map(|window| Offer { window, granted })
    };
    let mut offers: Vec<Offer> = Vec::new();
    match search.order {
        Order::Earliest => {
            // After an offer, its end is a start worth checking too.
            let mut from = ceil_to_minute(search.not_before);
            let mut next = 0;
            while offers.len() < search.limit {
                let mut found = None;
                let check = |t: DateTime<Utc>| {
                    if t > search.latest_start(search.min_minutes) {
                        return None;
                    }
                    search.longest_at(demands, occupancy, t).map(|f| (t, f))
                };
                if !offers.is_empty() {
                    found = check(from);
                }
                while found.is_none() && next < starts.len() {
                    let t = starts[next];
                    next += 1;
                    if t >= from {
                        if give_up() {
                            return None;
                        }
                        found = check(t);
                    }
                }
                let Some((t, fitted)) = found else { break };
                let Some(o) = offer(t, fitted) else { break };
                from = o.window.end();
                offers.push(o);
            }
        }
        Order::Longest => {
            let mut all: Vec<(DateTime<Utc>, i64, Vec<Granted>)> = Vec::new();
            // In start order; the end of each window found is a start worth checking too,
            // as after an offer in the earliest order: windows of the longest length wanted
            // can follow each other where nothing is booked.
            let mut pending: std::collections::BTreeSet<DateTime<Utc>> =
                starts.into_iter().collect();
            let last = search.latest_start(search.min_minutes);
            while let Some(t) = pending.pop_first() {
                if give_up() {
                    return None;
                }
                if let Some((minutes, granted)) = search.longest_at(demands, occupancy, t) {
                    let end = t + Duration::minutes(minutes);
                    if end <= last {
                        pending.insert(end);
                    }
                    all.push((t, minutes, granted));
                    // Scanning in start order, `limit` disjoint windows of the longest
                    // length wanted are the best answer already.
                    let full = all.iter().filter(|(_, m, _)| *m == search.max_minutes);
                    if disjoint_count(full) >= search.limit {
                        break;
                    }
                }
            }
            all.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
            for (t, minutes, granted) in all {
                if offers.len() >= search.limit {
                    break;
                }
                let Some(o) = offer(t, (minutes, granted)) else {
                    continue;
                };
                if offers.iter().all(|other| !other.window.overlaps(&o.window)) {
                    offers.push(o);
                }
            }
        }
    }
    Some(offers)
}

/// Whether a search over more candidates would answer these `offers` too: there are as
/// many as asked for, the first starts at the search's first minute and each next one
/// where the one before ends, and each lasts the longest wanted (or up to the search's
/// end). More candidates only make more windows fit, and none can start earlier or last
/// longer, so a search over part of the candidates ([`probe`]) that finds such offers has
/// found the whole search's.
pub fn cannot_be_bettered(offers: &[Offer], search: &Search) -> bool {
    let mut from = ceil_to_minute(search.not_before);
    offers.len() == search.limit
        && offers.iter().all(|o| {
            let longest = search
                .max_minutes
                .min((search.not_after - from).num_minutes());
            let fits = o.window.start() == from && (o.window.end() - from).num_minutes() == longest;
            from = o.window.end();
            fits
        })
}

/// A search that answers the same first window as `search` over all the candidates but
/// reads less: `found`, the first window over part of them ([`probe`]), fits over all of
/// them too, so theirs starts no later, and windows that start by then need allocations
/// only until the longest wanted from there has ended. `None` unless `search` asks for one
/// window, earliest first.
pub fn bounded_by(search: &Search, found: &Offer) -> Option<Search> {
    (search.limit == 1 && search.order == Order::Earliest).then(|| Search {
        not_after: search
            .not_after
            .min(found.window.start() + Duration::minutes(search.max_minutes)),
        ..search.clone()
    })
}

/// How many of these windows (in start order, all the same length) can be kept without
/// overlapping each other, taken greedily.
fn disjoint_count<'a>(
    windows: impl Iterator<Item = &'a (DateTime<Utc>, i64, Vec<Granted>)>,
) -> usize {
    let mut count = 0;
    let mut free_from: Option<DateTime<Utc>> = None;
    for (t, minutes, _) in windows {
        if free_from.is_none_or(|f| *t >= f) {
            count += 1;
            free_from = Some(*t + Duration::minutes(*minutes));
        }
    }
    count
}

/// The latest end a lease starting at `start` can reach, keeping what it holds: each
/// demand lists only the resources the lease holds (all of them required), and the
/// occupancy leaves out the lease's own allocations. Searched up to `horizon`; `None`
/// when not even `at_least` minutes fit.
pub fn latest_end(
    demands: &[Demand],
    occupancy: &Occupancy,
    start: DateTime<Utc>,
    at_least: i64,
    horizon: DateTime<Utc>,
    cleaning: Duration,
) -> Option<DateTime<Utc>> {
    let search = Search {
        not_before: start,
        not_after: horizon,
        min_minutes: at_least.max(1),
        max_minutes: (horizon - start).num_minutes(),
        cleaning,
        order: Order::Earliest,
        limit: 1,
        start_by: None,
    };
    search
        .longest_at(demands, occupancy, start)
        .map(|(minutes, _)| start + Duration::minutes(minutes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use proptest::prelude::*;

    const HOST: &str = "physical:host";

    fn t0() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2030, 1, 1, 0, 0, 0).unwrap()
    }

    fn at(minute: i64) -> DateTime<Utc> {
        t0() + Duration::minutes(minute)
    }

    fn whole(kind: &str, candidates: &[i64], min: usize, max: usize) -> Demand {
        Demand::Whole {
            kind: kind.into(),
            candidates: candidates.to_vec(),
            required: Vec::new(),
            min,
            max,
        }
    }

    #[test]
    fn a_part_keeps_the_required_resources_it_would_cut() {
        let demand = Demand::Whole {
            kind: "virtual:floatingip".into(),
            candidates: (1..=300).collect(),
            required: vec![290, 5],
            min: 1,
            max: 1,
        };
        let Some(Demand::Whole { candidates, .. }) = demand.part(256, false) else {
            panic!("a part");
        };
        assert_eq!(candidates.len(), 257);
        assert_eq!(candidates[..256], (1..=256).collect::<Vec<i64>>()[..]);
        assert_eq!(candidates[256], 290);
        let Some(Demand::Whole { candidates, .. }) = demand.part(10, true) else {
            panic!("a part");
        };
        assert_eq!(
            candidates,
            [291, 292, 293, 294, 295, 296, 297, 298, 299, 300, 5, 290]
        );
    }

    fn busy(start: i64, until: i64) -> Busy {
        Busy {
            start: at(start),
            until: at(until),
            exclusive: true,
            usage: Usage::default(),
        }
    }

    fn slots(start: i64, until: i64, vcpus: i64) -> Busy {
        Busy {
            start: at(start),
            until: at(until),
            exclusive: false,
            usage: Usage {
                vcpus,
                memory_mb: 0,
                disk_gb: 0,
            },
        }
    }

    fn search_for(min: i64, max: i64, until: i64, order: Order, limit: usize) -> Search {
        Search {
            not_before: at(0),
            not_after: at(until),
            min_minutes: min,
            max_minutes: max,
            cleaning: Duration::zero(),
            order,
            limit,
            start_by: None,
        }
    }

    fn windows(offers: &[Offer]) -> Vec<(i64, i64)> {
        offers
            .iter()
            .map(|o| {
                (
                    (o.window.start() - t0()).num_minutes(),
                    (o.window.end() - t0()).num_minutes(),
                )
            })
            .collect()
    }

    #[test]
    fn a_probe_decides_only_when_nothing_can_start_earlier_or_last_longer() {
        let mut occ = Occupancy::new();
        occ.add(HOST, 1, busy(0, 60));
        let demands = [whole(HOST, &[1, 2, 3], 1, 1)];
        let s = search_for(30, 30, 600, Order::Earliest, 1);
        // Over host 1 alone the first window waits for it; another host is free at once.
        let only_first = probe(&demands, |_| 1, ProbeFor::Grants).unwrap();
        let probed = search(&only_first, &occ, &s);
        assert_eq!(windows(&probed), vec![(60, 90)]);
        assert!(!cannot_be_bettered(&probed, &s));
        // Over hosts 1 and 2 the window starts at the first minute: that is the answer.
        let first_two = probe(&demands, |_| 2, ProbeFor::Grants).unwrap();
        let probed = search(&first_two, &occ, &s);
        assert!(cannot_be_bettered(&probed, &s));
        assert_eq!(probed, search(&demands, &occ, &s));
        // For a window alone, the last candidate (the least taken) is probed: host 3.
        let last = probe(&demands, |_| 1, ProbeFor::Windows).unwrap();
        assert_eq!(last, vec![whole(HOST, &[3], 1, 1)]);
        let probed = search(&last, &occ, &s);
        assert!(cannot_be_bettered(&probed, &s));
        assert_eq!(windows(&probed), windows(&search(&demands, &occ, &s)));
        assert_eq!(probe(&demands, |_| 3, ProbeFor::Grants), None);
        // With a range of durations the longest wanted must fit as well.
        occ.add(HOST, 2, busy(45, 50));
        let s = search_for(30, 120, 600, Order::Earliest, 1);
        let probed = search(&first_two, &occ, &s);
        assert_eq!(windows(&probed), vec![(0, 45)]);
        assert!(!cannot_be_bettered(&probed, &s));
        assert_eq!(windows(&search(&demands, &occ, &s)), vec![(0, 120)]);
    }

    #[test]
    fn the_earliest_window_starts_when_enough_resources_are_free() {
        let mut occ = Occupancy::new();
        occ.add(HOST, 1, busy(0, 60));
        occ.add(HOST, 2, busy(0, 90));
        occ.add(HOST, 3, busy(30, 200));
        let demands = [whole(HOST, &[1, 2, 3], 2, 2)];
        let offers = search(
            &demands,
            &occ,
            &search_for(60, 60, 1000, Order::Earliest, 3),
        );
        assert_eq!(windows(&offers), vec![(90, 150), (150, 210), (210, 270)]);
        assert_eq!(offers[0].granted, vec![vec![(1, 1), (2, 1)]]);
    }

    #[test]
    fn the_cleaning_margin_follows_the_window() {
        let mut occ = Occupancy::new();
        occ.add(HOST, 1, busy(100, 200));
        let demands = [whole(HOST, &[1], 1, 1)];
        let mut s = search_for(60, 60, 1000, Order::Earliest, 1);
        assert_eq!(windows(&search(&demands, &occ, &s)), vec![(0, 60)]);
        s.cleaning = Duration::minutes(41);
        assert_eq!(windows(&search(&demands, &occ, &s)), vec![(200, 260)]);
    }

    #[test]
    fn a_search_told_to_give_up_answers_nothing_rather_than_part() {
        let occ = Occupancy::new();
        let demands = [whole(HOST, &[1, 2], 1, 1)];
        for order in [Order::Earliest, Order::Longest] {
            let s = search_for(10, 10, 100, order, 3);
            assert_eq!(search_until(&demands, &occ, &s, || true), None);
            let all = search_until(&demands, &occ, &s, || false).unwrap();
            assert_eq!(all, search(&demands, &occ, &s));
            assert!(!all.is_empty());
        }
    }

    #[test]
    fn a_lease_reservations_do_not_share_whole_resources() {
        let occ = Occupancy::new();
        let demands = [whole(HOST, &[1, 2], 1, 1), whole(HOST, &[1, 2], 1, 1)];
        let offers = search(&demands, &occ, &search_for(10, 10, 100, Order::Earliest, 1));
        assert_eq!(offers[0].granted, vec![vec![(1, 1)], vec![(2, 1)]]);
        let three = [
            whole(HOST, &[1, 2], 1, 1),
            whole(HOST, &[1, 2], 1, 1),
            whole(HOST, &[1, 2], 1, 1),
        ];
        assert!(search(&three, &occ, &search_for(10, 10, 100, Order::Earliest, 1)).is_empty());
    }

    #[test]
    fn instance_slots_count_peak_use_and_exclude_whole_hosts() {
        let cap = Usage {
            vcpus: 4,
            memory_mb: 0,
            disk_gb: 0,
        };
        let mut occ = Occupancy::new();
        occ.add(HOST, 1, slots(0, 50, 3));
        occ.add(HOST, 1, slots(50, 100, 2));
        occ.add(HOST, 2, busy(0, 120));
        let demand = |amount| Demand::Slots {
            kind: HOST.into(),
            hosts: vec![(1, cap), (2, cap)],
            slot: Usage {
                vcpus: 1,
                memory_mb: 0,
                disk_gb: 0,
            },
            amount,
            affinity: Affinity::Any,
        };
        // Two slots fit on host 1 from minute 50 (peak 2 of 4), three only from 100.
        let two = search(
            &[demand(2)],
            &occ,
            &search_for(30, 30, 500, Order::Earliest, 1),
        );
        assert_eq!(windows(&two), vec![(50, 80)]);
        let five = search(
            &[demand(5)],
            &occ,
            &search_for(30, 30, 500, Order::Earliest, 1),
        );
        assert_eq!(windows(&five), vec![(120, 150)]);
        assert_eq!(five[0].granted, vec![vec![(1, 4), (2, 1)]]);
    }

    #[test]
    fn longest_windows_rank_first() {
        let mut occ = Occupancy::new();
        occ.add(HOST, 1, busy(30, 40));
        occ.add(HOST, 1, busy(100, 110));
        let demands = [whole(HOST, &[1], 1, 1)];
        let offers = search(&demands, &occ, &search_for(10, 100, 300, Order::Longest, 3));
        // The window after the first offer counts too: 90 minutes to the search's end.
        assert_eq!(windows(&offers), vec![(110, 210), (210, 300), (40, 100)]);
        let earliest = search(
            &demands,
            &occ,
            &search_for(10, 100, 300, Order::Earliest, 3),
        );
        assert_eq!(windows(&earliest), vec![(0, 30), (40, 100), (110, 210)]);
    }

    #[test]
    fn longest_windows_follow_each_other_where_nothing_is_booked() {
        let occ = Occupancy::new();
        let demands = [whole(HOST, &[1], 1, 1)];
        let fixed = search(&demands, &occ, &search_for(60, 60, 480, Order::Longest, 5));
        assert_eq!(
            windows(&fixed),
            vec![(0, 60), (60, 120), (120, 180), (180, 240), (240, 300)]
        );
        let ranged = search(&demands, &occ, &search_for(30, 180, 480, Order::Longest, 5));
        assert_eq!(windows(&ranged), vec![(0, 180), (180, 360), (360, 480)]);
    }

    #[test]
    fn latest_end_keeps_the_resources_held() {
        let mut occ = Occupancy::new();
        occ.add(HOST, 1, busy(300, 400));
        let held = [Demand::Whole {
            kind: HOST.into(),
            candidates: vec![1],
            required: vec![1],
            min: 1,
            max: 1,
        }];
        assert_eq!(
            latest_end(&held, &occ, at(0), 60, at(10_000), Duration::minutes(10)),
            Some(at(290))
        );
        assert_eq!(
            latest_end(&held, &occ, at(0), 295, at(10_000), Duration::minutes(10)),
            None
        );
    }

    /// A direct check of one minute, written independently of `fit`: counts free whole
    /// resources and the instance use minute by minute.
    fn fits_naive(demands: &[Demand], occ: &Occupancy, start: i64, len: i64, clean: i64) -> bool {
        let until = start + len + clean;
        let mut taken: HashSet<i64> = HashSet::new();
        let mut mine: HashMap<i64, i64> = HashMap::new();
        let mut slots_taken = 0;
        let minute_of = |t: DateTime<Utc>| (t - t0()).num_minutes();
        // What a ceiling on whole hosts leaves at the busiest minute of the window: a ranged
        // demand takes no more than that, less the minimums of the whole demands after it.
        let mut room: Option<i64> = occ
            .ceilings
            .iter()
            .filter(|c| matches!(c.counted, Counted::Whole(_)))
            .map(|c| {
                let most = (start..start + len)
                    .map(|m| {
                        c.held
                            .iter()
                            .filter(|h| minute_of(h.0) <= m && m < minute_of(h.1))
                            .map(|h| h.2)
                            .sum::<i64>()
                    })
                    .max()
                    .unwrap_or(0);
                c.limit - most
            })
            .min();
        for (i, d) in demands.iter().enumerate() {
            match d {
                Demand::Whole {
                    candidates,
                    min,
                    max,
                    ..
                } => {
                    let later_min: i64 = demands[i + 1..]
                        .iter()
                        .map(|d| match d {
                            Demand::Whole { min, .. } => *min as i64,
                            Demand::Slots { .. } => 0,
                        })
                        .sum();
                    let mut max = match room {
                        Some(r) if r - later_min >= *min as i64 => {
                            (*max).min((r - later_min) as usize)
                        }
                        _ => *max,
                    };
                    // What the budget leaves (one month), every host counted at the heaviest
                    // weight: no less than min.
                    if let Some(b) = &occ.budget
                        && *min < max
                    {
                        let weight = |id: &i64| b.weights.get(id).copied().unwrap_or(1.0);
                        let heaviest = b.weights.values().copied().fold(1.0, f64::max);
                        let hours = len as f64 / 60.0;
                        let spent: f64 = b.booked.values().sum::<f64>()
                            + hours * taken.iter().map(weight).sum::<f64>();
                        let fit = ((b.limit - spent + 1e-9) / (hours * heaviest)).floor() as i64;
                        max = max.min((fit - later_min).max(*min as i64) as usize);
                    }
                    let free: Vec<i64> = candidates
                        .iter()
                        .copied()
                        .filter(|id| !taken.contains(id) && !mine.contains_key(id))
                        .filter(|id| {
                            occ.of(HOST, *id)
                                .iter()
                                .all(|b| minute_of(b.until) <= start || minute_of(b.start) >= until)
                        })
                        .collect();
                    if free.len() < *min {
                        return false;
                    }
                    let took = free.len().min(max);
                    room = room.map(|r| r - took as i64);
                    taken.extend(free.into_iter().take(max));
                }
                Demand::Slots {
                    hosts,
                    slot,
                    amount,
                    affinity,
                    ..
                } => {
                    let mut per_host = Vec::new();
                    for &(id, cap) in hosts {
                        if taken.contains(&id) {
                            continue;
                        }
                        let uses = occ.of(HOST, id);
                        let mut peak = 0;
                        let mut blocked = false;
                        for m in start..until {
                            let mut used = mine.get(&id).copied().unwrap_or(0);
                            for b in uses {
                                if minute_of(b.start) <= m && m < minute_of(b.until) {
                                    blocked |= b.exclusive;
                                    used += b.usage.vcpus;
                                }
                            }
                            peak = peak.max(used);
                        }
                        if !blocked {
                            per_host.push((id, (cap.vcpus - peak).max(0) / slot.vcpus));
                        }
                    }
                    let total: i64 = per_host.iter().map(|(_, s)| *s).sum();
                    let ok = match affinity {
                        Affinity::Any => total >= *amount,
                        Affinity::Same => per_host.iter().any(|(_, s)| *s >= *amount),
                        Affinity::Different => {
                            per_host.iter().filter(|(_, s)| *s >= 1).count() as i64 >= *amount
                        }
                    };
                    if !ok {
                        return false;
                    }
                    // Record what `place` would take, for the demands after this one.
                    let placed = engine::place(
                        &per_host
                            .iter()
                            .map(|&(host, slots)| HostSlots {
                                host,
                                slots,
                                in_use: uses_in(occ, host, start, until)
                                    || mine.contains_key(&host),
                            })
                            .collect::<Vec<_>>(),
                        &[],
                        *amount,
                        *affinity,
                    );
                    for (host, units) in placed.unwrap_or_default() {
                        *mine.entry(host).or_default() += units * slot.vcpus;
                        slots_taken += units;
                    }
                }
            }
        }
        // The budget (the tests stay within one month): booked hours plus the window's, the
        // hosts weighed.
        if let Some(b) = &occ.budget {
            let weight: f64 = taken
                .iter()
                .map(|id| b.weights.get(id).copied().unwrap_or(1.0))
                .sum();
            let booked: f64 = b.booked.values().sum();
            if weight > 0.0 && booked + weight * len as f64 / 60.0 > b.limit + 1e-9 {
                return false;
            }
        }
        // Each ceiling, minute by minute over the lease's window (not its cleaning margin).
        occ.ceilings.iter().all(|c| {
            let own = match c.counted {
                Counted::Whole(_) => taken.len() as i64,
                Counted::Slots(_) => slots_taken,
            };
            own == 0
                || (start..start + len).all(|m| {
                    let held: i64 = c
                        .held
                        .iter()
                        .filter(|h| minute_of(h.0) <= m && m < minute_of(h.1))
                        .map(|h| h.2)
                        .sum();
                    held + own <= c.limit
                })
        })
    }

    /// The first window a minute-by-minute scan finds: the earliest start at which the
    /// shortest length fits, and the longest length of `(min, max)` that fits there.
    fn brute_first(
        demands: &[Demand],
        occ: &Occupancy,
        (min, max): (i64, i64),
        horizon: i64,
        clean: i64,
    ) -> Option<(i64, i64)> {
        let start = (0..=horizon - min).find(|&m| fits_naive(demands, occ, m, min, clean))?;
        let longest = (min..=max.min(horizon - start))
            .rev()
            .find(|&l| fits_naive(demands, occ, start, l, clean))
            .unwrap_or(min);
        Some((start, start + longest))
    }

    /// Over 700 minutes, the first of `limit` earliest offers with lengths `(min, max)` is
    /// the window a brute-force scan finds first, and every offer fits by that scan.
    fn first_offer_is_the_scans(
        demands: &[Demand],
        occ: &Occupancy,
        (min, max): (i64, i64),
        clean: i64,
        limit: usize,
    ) -> Result<(), TestCaseError> {
        let horizon = 700;
        let mut s = search_for(min, max, horizon, Order::Earliest, limit);
        s.cleaning = Duration::minutes(clean);
        let offers = search(demands, occ, &s);
        let brute = brute_first(demands, occ, (min, max), horizon, clean);
        prop_assert_eq!(windows(&offers).first().copied(), brute);
        for (start, end) in windows(&offers) {
            prop_assert!(fits_naive(demands, occ, start, end - start, clean));
        }
        Ok(())
    }

    fn uses_in(occ: &Occupancy, host: i64, start: i64, until: i64) -> bool {
        occ.of(HOST, host)
            .iter()
            .any(|b| b.overlaps(at(start), at(until)))
    }

    /// Allocations as (host, start, span, exclusive, vCPUs of the slots otherwise).
    fn occupancy_of(allocs: Vec<(i64, i64, i64, bool, i64)>) -> Occupancy {
        let mut occ = Occupancy::new();
        for (host, start, span, exclusive, vcpus) in allocs {
            let b = if exclusive {
                busy(start, start + span)
            } else {
                slots(start, start + span, vcpus)
            };
            occ.add(HOST, host, b);
        }
        occ
    }

    /// `amount` one-vCPU instances on these hosts of four vCPUs each, in this order.
    fn four_cpu_hosts(
        hosts: impl IntoIterator<Item = i64>,
        amount: i64,
        affinity: Affinity,
    ) -> Demand {
        let cpus = |vcpus| Usage {
            vcpus,
            memory_mb: 0,
            disk_gb: 0,
        };
        Demand::Slots {
            kind: HOST.into(),
            hosts: hosts.into_iter().map(|h| (h, cpus(4))).collect(),
            slot: cpus(1),
            amount,
            affinity,
        }
    }

    fn scenario() -> impl Strategy<Value = (Occupancy, Vec<Demand>, i64, i64)> {
        let allocation = (0i64..5, 0i64..400, 1i64..120, any::<bool>(), 1i64..4);
        (
            prop::collection::vec(allocation, 0..14),
            1usize..4,
            any::<bool>(),
            0usize..4,
            prop::sample::select(vec![Affinity::Any, Affinity::Same, Affinity::Different]),
            1i64..180,
            0i64..20,
        )
            .prop_map(
                |(allocs, hosts_wanted, with_slots, amount, affinity, len, clean)| {
                    let mut demands = vec![whole(HOST, &[0, 1, 2, 3, 4], 1, hosts_wanted)];
                    if with_slots {
                        demands.push(four_cpu_hosts(0..5, amount as i64 + 1, affinity));
                    }
                    (occupancy_of(allocs), demands, len, clean)
                },
            )
    }

    /// [`scenario`] with a project ceiling on hosts or on instance slots, the project holding
    /// some of them at times, and maybe a budget of host-hours (host 0 weighing two).
    fn ceiling_scenario() -> impl Strategy<Value = (Occupancy, Vec<Demand>, i64, i64)> {
        let holding = (0i64..400, 1i64..120, 1i64..3);
        (
            scenario(),
            any::<bool>(),
            0i64..5,
            prop::collection::vec(holding, 0..6),
            prop::option::of((1i64..24, 0i64..6)),
        )
            .prop_map(
                |((mut occ, demands, len, clean), slots, limit, held, budget)| {
                    if let Some((limit, booked)) = budget {
                        let month = TimeWindow::new(
                            t0(),
                            Utc.with_ymd_and_hms(2030, 2, 1, 0, 0, 0).unwrap(),
                        )
                        .unwrap();
                        occ.budget(Budget {
                            kind: HOST.into(),
                            limit: limit as f64,
                            booked: HashMap::from([(month, booked as f64)]),
                            weights: HashMap::from([(0, 2.0)]),
                        });
                    }
                    occ.limit_by(Ceiling {
                        counted: match slots {
                            true => Counted::Slots(HOST.into()),
                            false => Counted::Whole(HOST.into()),
                        },
                        limit,
                        held: held
                            .into_iter()
                            .map(|(start, span, amount)| (at(start), at(start + span), amount))
                            .collect(),
                    });
                    (occ, demands, len, clean)
                },
            )
    }

    /// Up to three demands on six hosts, each whole (a range of counts) or instance slots,
    /// with candidates in an order of their own.
    fn probe_scenario() -> impl Strategy<Value = (Occupancy, Vec<Demand>, i64, i64)> {
        let allocation = (0i64..6, 0i64..400, 1i64..120, any::<bool>(), 1i64..4);
        let order = Just((0i64..6).collect::<Vec<i64>>()).prop_shuffle();
        let demand = (
            order,
            any::<bool>(),
            1usize..4,
            0usize..3,
            prop::sample::select(vec![Affinity::Any, Affinity::Same, Affinity::Different]),
        )
            .prop_map(|(order, slots, min, extra, affinity)| {
                if slots {
                    four_cpu_hosts(order, (min + extra) as i64, affinity)
                } else {
                    whole(HOST, &order, min, min + extra)
                }
            });
        (
            prop::collection::vec(allocation, 0..16),
            prop::collection::vec(demand, 1..4),
            1i64..180,
            0i64..20,
        )
            .prop_map(|(allocs, demands, len, clean)| (occupancy_of(allocs), demands, len, clean))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        /// The first offer is the first minute at which a brute-force scan finds the request
        /// fits, and every offer fits by the same scan.
        #[test]
        fn the_first_offer_is_the_earliest_minute_that_fits((occ, demands, len, clean) in scenario()) {
            let horizon = 700;
            let mut s = search_for(len, len, horizon, Order::Earliest, 3);
            s.cleaning = Duration::minutes(clean);
            let offers = search(&demands, &occ, &s);
            let brute = (0..=horizon - len).find(|&m| fits_naive(&demands, &occ, m, len, clean));
            let first = offers.first().map(|o| (o.window.start() - t0()).num_minutes());
            prop_assert_eq!(first, brute);
            for o in &offers {
                let m = (o.window.start() - t0()).num_minutes();
                prop_assert!(fits_naive(&demands, &occ, m, len, clean));
            }
            for pair in offers.windows(2) {
                prop_assert!(pair[0].window.end() <= pair[1].window.start());
            }
        }

        /// With a range of durations, the first offer starts at the earliest minute the
        /// shortest fits and lasts the longest a brute-force scan finds at that start.
        #[test]
        fn the_first_offer_lasts_the_longest_that_fits((occ, demands, len, clean) in scenario(), extra in 0i64..200) {
            first_offer_is_the_scans(&demands, &occ, (len, len + extra), clean, 1)?;
        }

        /// Under a monthly budget, a window across a month's start is offered from the first
        /// minute a brute-force scan finds it within both months' budgets (January 31st
        /// to February 2nd, one to three hosts of weight one).
        #[test]
        fn budget_windows_across_a_month_start_are_found(
            limit in 1i64..30,
            booked in (0i64..30, 0i64..30),
            count in 1usize..4,
            len in 60i64..1800,
            allocations in prop::collection::vec((0i64..5, 0i64..2880, 1i64..600), 0..6),
        ) {
            let base = 30 * 1440;
            let boundary = 31 * 1440;
            let mut occ = Occupancy::new();
            for &(host, start, span) in &allocations {
                occ.add(HOST, host, busy(base + start, base + start + span));
            }
            let month = |m: u32| {
                let start = Utc.with_ymd_and_hms(2030, m, 1, 0, 0, 0).unwrap();
                let end = Utc.with_ymd_and_hms(2030, m + 1, 1, 0, 0, 0).unwrap();
                TimeWindow::new(start, end).unwrap()
            };
            occ.budget(Budget {
                kind: HOST.into(),
                limit: limit as f64,
                booked: HashMap::from([(month(1), booked.0 as f64), (month(2), booked.1 as f64)]),
                weights: HashMap::new(),
            });
            let demands = vec![whole(HOST, &[0, 1, 2, 3, 4], count, count)];
            let mut s = search_for(len, len, base + 2880, Order::Earliest, 1);
            s.not_before = at(base);
            let offers = search(&demands, &occ, &s);
            let fits = |m: i64| {
                let free = (0..5)
                    .filter(|h| {
                        allocations
                            .iter()
                            .filter(|a| a.0 == *h)
                            .all(|a| base + a.1 + a.2 <= m || base + a.1 >= m + len)
                    })
                    .count();
                let hours = |from: i64, until: i64| (until - from).max(0) as f64 / 60.0 * count as f64;
                let january = hours(m, (m + len).min(boundary));
                let february = hours(m.max(boundary), m + len);
                free >= count
                    && (january == 0.0 || booked.0 as f64 + january <= limit as f64 + 1e-9)
                    && (february == 0.0 || booked.1 as f64 + february <= limit as f64 + 1e-9)
            };
            let brute = (base..=base + 2880 - len).find(|&m| fits(m));
            let first = offers.first().map(|o| (o.window.start() - t0()).num_minutes());
            prop_assert_eq!(first, brute);
        }

        /// Under a project ceiling, the first offer is still the earliest minute, and the
        /// longest length there, that a brute-force scan finds within the ceiling.
        #[test]
        fn offers_keep_within_the_project_ceiling((occ, demands, len, clean) in ceiling_scenario(), extra in 0i64..200) {
            first_offer_is_the_scans(&demands, &occ, (len, len + extra), clean, 3)?;
        }

        /// Offers over part of the candidates that cannot be bettered are the offers over
        /// all of them (with what each reservation is granted, when a probe is made for
        /// grants), whatever the demands and their preference orders.
        #[test]
        fn a_probe_that_cannot_be_bettered_is_the_answer(
            (occ, demands, len, clean) in probe_scenario(),
            extra in 0i64..200,
            size in 1usize..6,
            limit in 1usize..4,
            order in prop::sample::select(vec![Order::Earliest, Order::Longest]),
            needs in prop::sample::select(vec![ProbeFor::Windows, ProbeFor::Grants]),
        ) {
            let horizon = 700;
            let mut s = search_for(len, len + extra, horizon, order, limit);
            s.cleaning = Duration::minutes(clean);
            let full = search(&demands, &occ, &s);
            if let Some(probed) = probe(&demands, |_| size, needs) {
                let found = search(&probed, &occ, &s);
                if cannot_be_bettered(&found, &s) {
                    prop_assert_eq!(windows(&full), windows(&found));
                    if needs == ProbeFor::Grants {
                        prop_assert_eq!(&full, &found);
                    }
                }
                // Whatever the probe found bounds the search over every candidate.
                if let Some(bounded) = found.first().and_then(|f| bounded_by(&s, f)) {
                    let within = search(&demands, &occ, &bounded);
                    prop_assert_eq!(windows(&full), windows(&within));
                    if needs == ProbeFor::Grants {
                        prop_assert_eq!(&full, &within);
                    }
                }
            }
        }
    }
}
