//! Per-project quotas: the limits, and the pure arithmetic that decides them (the peak of
//! concurrent use over a window, resource-hours per calendar month).
//!
//! A limit is an integer: `-1` means no limit, `0` or more is the limit. A project's own
//! value (an override an admin set) wins over the configured default.

use chrono::{DateTime, Datelike, TimeZone, Utc};

use crate::TimeWindow;

/// Each limit a project has, by the name the API and the configuration use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuotaKind {
    /// Hosts of `physical:host` reservations held at any one instant.
    Hosts,
    /// Floating IPs of `virtual:floatingip` reservations held at any one instant.
    FloatingIps,
    /// Instance slots (the instances `virtual:instance` and `flavor:instance` reservations
    /// hold room for) held at any one instant.
    Instances,
    /// Longest lease, in seconds.
    LeaseDuration,
    /// Furthest a lease may start from now, in seconds.
    StartAhead,
    /// Host-hours (weighted per host) per calendar month, UTC.
    HostHoursPerMonth,
}

impl QuotaKind {
    pub const ALL: [QuotaKind; 6] = [
        QuotaKind::Hosts,
        QuotaKind::FloatingIps,
        QuotaKind::Instances,
        QuotaKind::LeaseDuration,
        QuotaKind::StartAhead,
        QuotaKind::HostHoursPerMonth,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            QuotaKind::Hosts => "hosts",
            QuotaKind::FloatingIps => "floatingips",
            QuotaKind::Instances => "instances",
            QuotaKind::LeaseDuration => "max_lease_duration",
            QuotaKind::StartAhead => "max_start_ahead",
            QuotaKind::HostHoursPerMonth => "host_hours_per_month",
        }
    }

    pub fn parse(name: &str) -> Option<QuotaKind> {
        QuotaKind::ALL.into_iter().find(|k| k.as_str() == name)
    }

    /// What the limit counts, for messages.
    pub fn noun(self) -> &'static str {
        match self {
            QuotaKind::Hosts => "host(s)",
            QuotaKind::FloatingIps => "floating IP(s)",
            QuotaKind::Instances => "instance slot(s)",
            QuotaKind::LeaseDuration | QuotaKind::StartAhead => "second(s)",
            QuotaKind::HostHoursPerMonth => "host-hour(s)",
        }
    }
}

/// One value per limit; `None` where nothing is set (a project without that override).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QuotaValues {
    values: [Option<i64>; 6],
}

impl QuotaValues {
    fn index(kind: QuotaKind) -> usize {
        QuotaKind::ALL.iter().position(|k| *k == kind).unwrap_or(0)
    }

    pub fn get(&self, kind: QuotaKind) -> Option<i64> {
        self.values[Self::index(kind)]
    }

    pub fn set(&mut self, kind: QuotaKind, value: Option<i64>) {
        self.values[Self::index(kind)] = value;
    }

    /// `self` (a project's overrides) over `defaults`.
    pub fn over(&self, defaults: &QuotaValues) -> QuotaValues {
        let mut out = *defaults;
        for kind in QuotaKind::ALL {
            if let Some(v) = self.get(kind) {
                out.set(kind, Some(v));
            }
        }
        out
    }

    /// The limit in force: `None` when unset or `-1`.
    pub fn limit(&self, kind: QuotaKind) -> Option<i64> {
        self.get(kind).filter(|v| *v >= 0)
    }

    pub fn is_empty(&self) -> bool {
        self.values.iter().all(Option::is_none)
    }

    /// Whether any limit applies at all (most sites set none: nothing is then read).
    pub fn limits_anything(&self) -> bool {
        QuotaKind::ALL.iter().any(|k| self.limit(*k).is_some())
    }
}

/// A limit a create or update would go past: which, the limit, what the project uses
/// without the request, and what the request adds, at the instant (concurrent limits) or
/// in the month (the budget) where it is worst.
#[derive(Debug, Clone, PartialEq)]
pub struct QuotaExcess {
    pub kind: QuotaKind,
    pub limit: i64,
    pub in_use: f64,
    pub requested: f64,
    pub at: Option<DateTime<Utc>>,
    pub month: Option<TimeWindow>,
}

/// Some use of a resource over `[start, end)`: `amount` of it (hosts, addresses, slots or
/// weighted host counts), by the lease being decided (`own`) or another of the project's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Use {
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
    pub amount: f64,
    pub own: bool,
}

/// The worst instant of a window for a concurrent limit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Peak {
    pub at: DateTime<Utc>,
    pub others: f64,
    pub own: f64,
}

impl Peak {
    pub fn total(&self) -> f64 {
        self.others + self.own
    }
}

/// The most `uses` add up to at any one instant of `window` (0 when none overlaps it).
/// Half-open, as [`peak`]: a use ending when another starts never overlaps it.
pub fn most_at_once(uses: &[Use], window: TimeWindow) -> f64 {
    let mut changes: Vec<(DateTime<Utc>, f64)> = Vec::with_capacity(uses.len() * 2);
    for u in uses {
        let start = u.start.max(window.start());
        let end = u.end.min(window.end());
        if start < end {
            changes.push((start, u.amount));
            changes.push((end, -u.amount));
        }
    }
    changes.sort_by_key(|a| a.0);
    let (mut held, mut most) = (0.0f64, 0.0f64);
    let mut i = 0;
    while i < changes.len() {
        let at = changes[i].0;
        while i < changes.len() && changes[i].0 == at {
            held += changes[i].1;
            i += 1;
        }
        most = most.max(held);
    }
    most
}

/// The instant of `window` an update makes worse past `limit`: where the project uses more
/// than `limit` after it (`after`), more than it did before it (`before`), while the own
/// lease uses some; the worst such instant (the earliest on a tie), or `None`. With no
/// `before` (a create), any instant past the limit while the lease uses some. A project
/// over a limit lowered since keeps what it held, at each instant, not only at its peak:
/// a lease over the limit may not be made longer or moved to where it was not.
pub fn worse_past(before: &[Use], after: &[Use], window: TimeWindow, limit: f64) -> Option<Peak> {
    // (time, before's change, after's others' change, after's own change).
    let mut changes: Vec<(DateTime<Utc>, f64, f64, f64)> =
        Vec::with_capacity((before.len() + after.len()) * 2);
    let clipped = |u: &Use| {
        let start = u.start.max(window.start());
        let end = u.end.min(window.end());
        (start < end && u.amount != 0.0).then_some((start, end))
    };
    for u in before {
        if let Some((start, end)) = clipped(u) {
            changes.push((start, u.amount, 0.0, 0.0));
            changes.push((end, -u.amount, 0.0, 0.0));
        }
    }
    for u in after {
        if let Some((start, end)) = clipped(u) {
            let (others, own) = if u.own {
                (0.0, u.amount)
            } else {
                (u.amount, 0.0)
            };
            changes.push((start, 0.0, others, own));
            changes.push((end, 0.0, -others, -own));
        }
    }
    changes.sort_by_key(|c| c.0);
    let mut worst: Option<Peak> = None;
    let (mut held_before, mut others, mut own) = (0.0, 0.0, 0.0);
    let mut i = 0;
    while i < changes.len() {
        let at = changes[i].0;
        while i < changes.len() && changes[i].0 == at {
            held_before += changes[i].1;
            others += changes[i].2;
            own += changes[i].3;
            i += 1;
        }
        let total = others + own;
        // Sums of whole numbers and weights; a tiny residue from subtraction is nothing.
        if at < window.end()
            && own > 1e-9
            && total > limit + 1e-9
            && total > held_before + 1e-9
            && worst.is_none_or(|w| total > w.total() + 1e-9)
        {
            worst = Some(Peak { at, others, own });
        }
    }
    worst
}

/// The calendar month (UTC) that `t` falls in (`None` only past chrono's last year).
pub fn month_of(t: DateTime<Utc>) -> Option<TimeWindow> {
    let start = Utc
        .with_ymd_and_hms(t.year(), t.month(), 1, 0, 0, 0)
        .single()?;
    let (year, month) = if t.month() == 12 {
        (t.year() + 1, 1)
    } else {
        (t.year(), t.month() + 1)
    };
    let end = Utc.with_ymd_and_hms(year, month, 1, 0, 0, 0).single()?;
    TimeWindow::new(start, end).ok()
}

/// The calendar months (UTC) a window touches, in order.
pub fn months(window: TimeWindow) -> Vec<TimeWindow> {
    let mut out: Vec<TimeWindow> = month_of(window.start()).into_iter().collect();
    while let Some(last) = out.last().copied() {
        if last.end() >= window.end() {
            break;
        }
        match month_of(last.end()) {
            Some(next) => out.push(next),
            None => break,
        }
    }
    out
}

/// Use within `month`, in amount-hours: (the others', the own lease's).
pub fn hours_in(uses: &[Use], month: TimeWindow) -> (f64, f64) {
    let (mut others, mut own) = (0.0, 0.0);
    for u in uses {
        let start = u.start.max(month.start());
        let end = u.end.min(month.end());
        if start >= end {
            continue;
        }
        let hours = (end - start).num_seconds() as f64 / 3600.0 * u.amount;
        if u.own {
            own += hours;
        } else {
            others += hours;
        }
    }
    (others, own)
}

/// The most hosts, each weighing at most `heaviest`, that a lease over `window` may add
/// under a monthly budget of `limit` host-hours, when `used(month)` are already booked in
/// each month it touches and the lease holds hosts weighing `so_far` in all over `window`.
/// Negative when even one is over in some month. Rounded as a create is measured: what
/// fits exactly fits.
pub fn budget_room(
    limit: f64,
    window: TimeWindow,
    heaviest: f64,
    so_far: f64,
    used: impl Fn(TimeWindow) -> f64,
) -> i64 {
    let heaviest = heaviest.max(f64::MIN_POSITIVE);
    months(window)
        .into_iter()
        .filter_map(|month| {
            let from = window.start().max(month.start());
            let until = window.end().min(month.end());
            let hours = (until - from).num_seconds() as f64 / 3600.0;
            if hours <= 0.0 {
                return None;
            }
            let left = limit - used(month) - hours * so_far;
            let room = ((left + 1e-9) / (hours * heaviest)).floor();
            // Saturating: a month with no budget left, or a minute-long lease of a huge one.
            Some(room.clamp(i64::MIN as f64, i64::MAX as f64) as i64)
        })
        .min()
        .unwrap_or(i64::MAX)
}

/// How many of a ranged request (`min` to `max` whole resources) to ask for, given the
/// room its project's ceilings on them leave (`ceiling`, exact counts) and the room its
/// monthly budget leaves at the heaviest weight (`budget`). Room under a ceiling below
/// `min` leaves the request as it is (refused by that ceiling whatever it is granted); room
/// under the budget below `min` asks for `min`, which lighter resources may still fit.
pub fn ranged_cap(min: usize, max: usize, ceiling: Option<i64>, budget: Option<i64>) -> usize {
    let room = |r: i64| usize::try_from(r.max(0)).unwrap_or(usize::MAX);
    let mut cap = max;
    if let Some(r) = ceiling
        && r >= min as i64
    {
        cap = cap.min(room(r));
    }
    if let Some(r) = budget {
        cap = cap.min(room(r).max(min));
    }
    cap
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(d: u32, h: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2030, 1, d, h, 0, 0).unwrap()
    }

    fn used(from: (u32, u32), to: (u32, u32), amount: f64, own: bool) -> Use {
        Use {
            start: at(from.0, from.1),
            end: at(to.0, to.1),
            amount,
            own,
        }
    }

    #[test]
    fn peak_table() {
        let w = TimeWindow::new(at(1, 10), at(1, 20)).unwrap();
        // (uses, the peak expected: hour, others, own)
        type Row = (Vec<Use>, Option<(u32, f64, f64)>);
        let rows: Vec<Row> = vec![
            (vec![], None),
            (
                vec![used((1, 10), (1, 20), 2.0, true)],
                Some((10, 0.0, 2.0)),
            ),
            // Others overlapping only before the window do not count.
            (
                vec![
                    used((1, 0), (1, 10), 5.0, false),
                    used((1, 10), (1, 20), 1.0, true),
                ],
                Some((10, 0.0, 1.0)),
            ),
            // Two others that never overlap each other: the peak is 2 + own, not 3 + own.
            (
                vec![
                    used((1, 10), (1, 12), 2.0, false),
                    used((1, 14), (1, 16), 1.0, false),
                    used((1, 10), (1, 20), 1.0, true),
                ],
                Some((10, 2.0, 1.0)),
            ),
            // Back to back: the end applies before the start.
            (
                vec![
                    used((1, 8), (1, 12), 3.0, false),
                    used((1, 12), (1, 20), 3.0, false),
                    used((1, 10), (1, 20), 1.0, true),
                ],
                Some((10, 3.0, 1.0)),
            ),
            // Where the own lease holds nothing, the others' peak does not count.
            (
                vec![
                    used((1, 10), (1, 12), 9.0, false),
                    used((1, 14), (1, 16), 1.0, false),
                    used((1, 13), (1, 20), 1.0, true),
                ],
                Some((14, 1.0, 1.0)),
            ),
            (vec![used((1, 10), (1, 20), 3.0, false)], None),
        ];
        for (uses, expected) in rows {
            // A create: nothing before, any use past a limit of none.
            let got = worse_past(&[], &uses, w, 0.0).map(|p| (p.at, p.others, p.own));
            let expected = expected.map(|(h, o, m)| (at(1, h), o, m));
            assert_eq!(got, expected, "{uses:?}");
        }
    }

    #[test]
    fn an_update_is_refused_only_where_it_adds_past_the_limit() {
        let w = TimeWindow::new(at(1, 10), at(1, 20)).unwrap();
        let before = [used((1, 10), (1, 14), 2.0, true)];
        // (after, limit, the instant expected: hour, others, own)
        type Row = (Vec<Use>, f64, Option<(u32, f64, f64)>);
        let rows: Vec<Row> = vec![
            // The same: over a limit lowered since, but nothing added.
            (vec![used((1, 10), (1, 14), 2.0, true)], 1.0, None),
            // Shorter.
            (vec![used((1, 10), (1, 12), 2.0, true)], 1.0, None),
            // Longer at the same peak: the hours added are past the limit.
            (
                vec![used((1, 10), (1, 16), 2.0, true)],
                1.0,
                Some((14, 0.0, 2.0)),
            ),
            // Longer within the limit.
            (vec![used((1, 10), (1, 16), 2.0, true)], 2.0, None),
            // Moved: where it was not before.
            (
                vec![used((1, 12), (1, 16), 2.0, true)],
                1.0,
                Some((14, 0.0, 2.0)),
            ),
            // Others added meanwhile count where the lease adds something.
            (
                vec![
                    used((1, 10), (1, 15), 2.0, true),
                    used((1, 14), (1, 20), 1.0, false),
                ],
                2.0,
                Some((14, 1.0, 2.0)),
            ),
        ];
        for (after, limit, expected) in rows {
            let got = worse_past(&before, &after, w, limit).map(|p| (p.at, p.others, p.own));
            let expected = expected.map(|(h, o, m)| (at(1, h), o, m));
            assert_eq!(got, expected, "{after:?} under {limit}");
        }
    }

    #[test]
    fn months_of_windows() {
        let w = TimeWindow::new(
            at(30, 0),
            Utc.with_ymd_and_hms(2030, 3, 1, 0, 0, 0).unwrap(),
        )
        .unwrap();
        let starts: Vec<String> = months(w)
            .iter()
            .map(|m| m.start().format("%Y-%m").to_string())
            .collect();
        assert_eq!(starts, ["2030-01", "2030-02"]);
        let dec = month_of(Utc.with_ymd_and_hms(2029, 12, 31, 23, 0, 0).unwrap()).unwrap();
        assert_eq!(
            dec.end(),
            Utc.with_ymd_and_hms(2030, 1, 1, 0, 0, 0).unwrap()
        );
    }

    #[test]
    fn hours_are_clipped_to_the_month() {
        let jan = month_of(at(1, 0)).unwrap();
        let uses = [
            Use {
                start: Utc.with_ymd_and_hms(2029, 12, 31, 22, 0, 0).unwrap(),
                end: at(1, 2),
                amount: 2.0,
                own: false,
            },
            Use {
                start: at(31, 23),
                end: Utc.with_ymd_and_hms(2030, 2, 1, 5, 0, 0).unwrap(),
                amount: 1.0,
                own: true,
            },
        ];
        assert_eq!(hours_in(&uses, jan), (4.0, 1.0));
    }

    #[test]
    fn overrides_win_and_minus_one_is_no_limit() {
        let mut defaults = QuotaValues::default();
        defaults.set(QuotaKind::Hosts, Some(4));
        defaults.set(QuotaKind::Instances, Some(10));
        let mut project = QuotaValues::default();
        project.set(QuotaKind::Hosts, Some(-1));
        project.set(QuotaKind::FloatingIps, Some(2));
        let effective = project.over(&defaults);
        assert_eq!(effective.limit(QuotaKind::Hosts), None);
        assert_eq!(effective.limit(QuotaKind::FloatingIps), Some(2));
        assert_eq!(effective.limit(QuotaKind::Instances), Some(10));
        assert!(effective.limits_anything());
        assert!(!QuotaValues::default().limits_anything());
    }

    #[test]
    fn budget_room_is_the_tightest_month_at_the_heaviest_weight() {
        let jan = month_of(at(1, 0)).unwrap();
        // 12 hours in January, 6 in February; 100 a month, 64 booked in January.
        let w = TimeWindow::new(
            at(31, 12),
            Utc.with_ymd_and_hms(2030, 2, 1, 6, 0, 0).unwrap(),
        )
        .unwrap();
        let used = |m: TimeWindow| if m == jan { 64.0 } else { 0.0 };
        // January: 36 left / 12 h = 3 hosts; February: 100 / 6 = 16.
        assert_eq!(budget_room(100.0, w, 1.0, 0.0, used), 3);
        // At weight 2, 36 / 24 = 1.5: one host.
        assert_eq!(budget_room(100.0, w, 2.0, 0.0, used), 1);
        // What fits exactly fits: 36 / 12 at weight 1, after a residue.
        assert_eq!(
            budget_room(100.0, w, 1.0, 0.0, |m| if m == jan {
                64.000_000_000_1
            } else {
                0.0
            }),
            3
        );
        // A month already over leaves less than none.
        assert!(budget_room(100.0, w, 1.0, 0.0, |m| if m == jan { 120.0 } else { 0.0 }) < 0);
    }

    #[test]
    fn ranged_cap_table() {
        // (min, max, ceiling room, budget room, asked for)
        type Row = (usize, usize, Option<i64>, Option<i64>, usize);
        let rows: [Row; 9] = [
            (1, 5, None, None, 5),
            (1, 5, Some(3), None, 3),
            (1, 5, Some(9), None, 5),
            // Below min under a ceiling: as asked (the ceiling refuses it).
            (2, 5, Some(1), None, 5),
            (1, 5, None, Some(2), 2),
            // Below min under the budget: min, which lighter hosts may fit.
            (2, 5, None, Some(1), 2),
            (2, 5, None, Some(-4), 2),
            (1, 5, Some(3), Some(2), 2),
            (1, 5, Some(2), Some(4), 2),
        ];
        for (min, max, ceiling, budget, want) in rows {
            assert_eq!(
                ranged_cap(min, max, ceiling, budget),
                want,
                "{min}..{max} {ceiling:?} {budget:?}"
            );
        }
    }
}
