//! Per-project quotas: the use cases that show and set them, and their enforcement inside
//! the transaction that allocates.
//!
//! A create or update is measured after its allocations are written, in the same write
//! transaction and under the allocation lock (PostgreSQL's advisory lock; SQLite has one
//! writer, and creates written together in one batch read each other's rows), so two
//! concurrent creates can never both fit under a limit that only one of them fits.
//! Concurrent limits count the project's peak over the lease's window, instant by instant;
//! the monthly budget counts weighted host-hours per calendar month (UTC). An update is only
//! refused for a limit it makes worse, at some instant (or in some month): a project above
//! a limit lowered since keeps its leases, and may shorten or shrink them, but not make them
//! longer or move them to where they were not while it is above.

use std::collections::HashMap;

use blazar_core::offer::{Budget, Ceiling, Counted};
use blazar_core::quota::{self, QuotaExcess, QuotaKind, QuotaValues, Use};
use blazar_core::reservation::{FLAVOR_INSTANCE, FLOATINGIP, VIRTUAL_INSTANCE};
use blazar_core::time::truncate_to_minute;
use blazar_core::{HostRecord, PHYSICAL_HOST, ReservationSpec, TimeWindow};
use blazar_db::{ProjectAllocation, QuotaRow, Tx};
use chrono::{DateTime, Utc};

use crate::policy::Target;
use crate::refusal::{Reason, RefusalKind, Refused};
use crate::{Identity, Service, ServiceError, ServiceResult};

/// Rules guarding the quota use cases.
pub const QUOTAS_GET: &str = "blazar:quotas:get";
pub const QUOTAS_PUT: &str = "blazar:quotas:put";
pub const QUOTAS_DELETE: &str = "blazar:quotas:delete";

/// How much one hour of a host counts toward the monthly budget: hosts whose property `key`
/// has `value` weigh `weight` (Chameleon's service-unit factors, `node_type=gpu` at 2, say).
#[derive(Debug, Clone, PartialEq)]
pub struct HostWeight {
    pub key: String,
    pub value: String,
    pub weight: f64,
}

/// Quotas as an operator configured them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct QuotaSettings {
    /// Every project's limits unless it has an override (`None` or `-1`: no limit).
    pub defaults: QuotaValues,
    /// A host matching several weights weighs the largest; matching none, 1.
    pub host_weights: Vec<HostWeight>,
}

/// A project's quotas as shown: every limit in force (`-1`: none), which come from the
/// project's own overrides, and what it holds now.
#[derive(Debug, Clone, PartialEq)]
pub struct ProjectQuota {
    pub project_id: String,
    pub limits: QuotaValues,
    pub overrides: QuotaValues,
    pub usage: QuotaUsage,
}

/// What a project's reservations hold at one instant, and its host-hours in that month.
#[derive(Debug, Clone, PartialEq)]
pub struct QuotaUsage {
    pub at: DateTime<Utc>,
    pub hosts: f64,
    pub floatingips: f64,
    pub instances: f64,
    pub month: Option<TimeWindow>,
    pub host_hours: f64,
}

/// What a project used over an update's new window before the update, so that an update is
/// only refused for what it makes worse.
pub(crate) struct QuotaBaseline {
    pub(crate) limits: QuotaValues,
    window: TimeWindow,
    measure: Measure,
}

/// A project's use over a lease's window, split into the lease's own and the others'.
#[derive(Default)]
struct Measure {
    /// What counts toward each concurrent limit that applies.
    uses: HashMap<QuotaKind, Vec<Use>>,
    /// Per month the window touches: (the month, others' host-hours, the lease's).
    months: Vec<(TimeWindow, f64, f64)>,
}

impl Measure {
    /// Each month's total, to look up: a window to the year 9999 has some 95,000 months,
    /// and searching them for each of as many months held the write transaction for
    /// seconds.
    fn month_totals(&self) -> HashMap<TimeWindow, f64> {
        self.months
            .iter()
            .map(|(month, others, own)| (*month, others + own))
            .collect()
    }
}

const CONCURRENT: [QuotaKind; 3] = [
    QuotaKind::Hosts,
    QuotaKind::FloatingIps,
    QuotaKind::Instances,
];

/// Which concurrent limit an allocation counts toward, and how much: a whole host, an
/// address, or the instance slots a shared host allocation holds.
fn counted(a: &ProjectAllocation) -> Option<(QuotaKind, f64)> {
    match a.resource_type.as_str() {
        PHYSICAL_HOST if a.exclusive => Some((QuotaKind::Hosts, 1.0)),
        PHYSICAL_HOST => Some((QuotaKind::Instances, a.units as f64)),
        FLOATINGIP => Some((QuotaKind::FloatingIps, 1.0)),
        _ => None,
    }
}

/// What a window search counts toward a concurrent limit (see [`counted`]).
fn counted_as(kind: QuotaKind) -> Option<Counted> {
    match kind {
        QuotaKind::Hosts => Some(Counted::Whole(PHYSICAL_HOST.into())),
        QuotaKind::FloatingIps => Some(Counted::Whole(FLOATINGIP.into())),
        QuotaKind::Instances => Some(Counted::Slots(PHYSICAL_HOST.into())),
        _ => None,
    }
}

/// A number as a person writes it: whole numbers without decimals, others with two.
pub fn format_amount(v: f64) -> String {
    if (v - v.round()).abs() < 1e-9 {
        format!("{}", v.round() as i64)
    } else {
        format!("{v:.2}")
    }
}

fn excess_message(project_id: &str, e: &QuotaExcess) -> String {
    let name = e.kind.as_str();
    match e.kind {
        QuotaKind::LeaseDuration => format!(
            "Quota {name} of project {project_id} exceeded: the lease would last {} \
             second(s), the limit is {} second(s)",
            format_amount(e.requested),
            e.limit
        ),
        QuotaKind::StartAhead => format!(
            "Quota {name} of project {project_id} exceeded: the lease would start {} \
             second(s) from now, the limit is {} second(s) ahead",
            format_amount(e.requested),
            e.limit
        ),
        QuotaKind::HostHoursPerMonth => format!(
            "Quota {name} of project {project_id} exceeded in {}: {} host-hour(s) in use \
             and {} requested, the limit is {}",
            e.month
                .map(|m| m.start().format("%Y-%m").to_string())
                .unwrap_or_default(),
            format_amount(e.in_use),
            format_amount(e.requested),
            e.limit
        ),
        QuotaKind::Hosts | QuotaKind::FloatingIps | QuotaKind::Instances if e.at.is_none() => {
            format!(
                "Quota {name} of project {project_id} exceeded: the lease alone would hold {} \
                 {} at once, the limit is {}",
                format_amount(e.requested),
                e.kind.noun(),
                e.limit
            )
        }
        QuotaKind::Hosts | QuotaKind::FloatingIps | QuotaKind::Instances => format!(
            "Quota {name} of project {project_id} exceeded: {} {} reserved at {} and {} \
             requested, the limit is {}",
            format_amount(e.in_use),
            e.kind.noun(),
            e.at.map(|t| t.format("%Y-%m-%d %H:%M").to_string())
                .unwrap_or_default(),
            format_amount(e.requested),
            e.limit
        ),
    }
}

/// What of the quotas that depend on the window alone (lease duration, how far ahead it
/// starts) a lease over `window` at minute `now` goes over; with `before`, the window an
/// update starts from, only what it makes worse.
pub(crate) fn window_excesses(
    limits: &QuotaValues,
    window: TimeWindow,
    now: DateTime<Utc>,
    before: Option<TimeWindow>,
) -> Vec<QuotaExcess> {
    let seconds = |w: TimeWindow| (w.end() - w.start()).num_seconds() as f64;
    let ahead = |w: TimeWindow| (w.start() - now).num_seconds() as f64;
    let mut excesses = Vec::new();
    for (kind, after, before) in [
        (
            QuotaKind::LeaseDuration,
            seconds(window),
            before.map(seconds),
        ),
        (QuotaKind::StartAhead, ahead(window), before.map(ahead)),
    ] {
        if let Some(limit) = limits.limit(kind)
            && after > limit as f64
            && before.is_none_or(|b| after > b)
        {
            excesses.push(QuotaExcess {
                kind,
                limit,
                in_use: 0.0,
                requested: after,
                at: None,
                month: None,
            });
        }
    }
    excesses
}

/// The concurrent limits a lease of `specs` goes over on its own, however little else the
/// project holds and whenever it starts (`at` is `None`): no window can grant it, so a
/// search for one answers the refusal a create would get rather than "no window".
pub(crate) fn request_excesses(
    limits: &QuotaValues,
    specs: &[ReservationSpec],
) -> Vec<QuotaExcess> {
    let mut least: HashMap<QuotaKind, f64> = HashMap::new();
    for spec in specs {
        let (kind, units) = match spec {
            ReservationSpec::Host(h) => (QuotaKind::Hosts, h.min),
            ReservationSpec::Instance(i) => (QuotaKind::Instances, i.amount),
            ReservationSpec::FlavorInstance(f) => (QuotaKind::Instances, f.amount),
            ReservationSpec::FloatingIp(f) => (QuotaKind::FloatingIps, f.amount),
            ReservationSpec::Network(_) | ReservationSpec::Device(_) => continue,
        };
        *least.entry(kind).or_default() += f64::from(units);
    }
    CONCURRENT
        .iter()
        .filter_map(|&kind| {
            let limit = limits.limit(kind)?;
            let requested = least.get(&kind).copied().unwrap_or(0.0);
            (requested > limit as f64 + 1e-9).then_some(QuotaExcess {
                kind,
                limit,
                in_use: 0.0,
                requested,
                at: None,
                month: None,
            })
        })
        .collect()
}

/// The refusal of a create (403, as Blazar refuses a create its enforcement denies) or an
/// update (400, as Blazar refuses an update its enforcement denies), naming every limit
/// exceeded; the message is the first one's.
pub(crate) fn refusal(
    project_id: &str,
    excesses: Vec<QuotaExcess>,
    kind: RefusalKind,
) -> ServiceError {
    let message = excesses
        .first()
        .map(|e| excess_message(project_id, e))
        .unwrap_or_default();
    ServiceError::Refused(Box::new(Refused {
        kind,
        message,
        reasons: excesses
            .into_iter()
            .map(|e| Reason {
                quota: Some(e),
                ..Reason::default()
            })
            .collect(),
        retry: None,
        shortfall: false,
    }))
}

/// What [`Service::check_quotas`] checks against.
pub(crate) enum QuotaCheck<'a> {
    /// A create: the project's limits, read when it took its turn.
    Create(&'a QuotaValues),
    /// An update: what the lease and the project held before it.
    Update(&'a QuotaBaseline),
}

/// Whether `limits` bound what a project holds (at once or per month), which its use must
/// be measured for under its lock; the others bound a lease's own dates.
fn measured(limits: &QuotaValues) -> bool {
    limits.limit(QuotaKind::HostHoursPerMonth).is_some()
        || CONCURRENT.iter().any(|k| limits.limit(*k).is_some())
}

impl Service {
    /// Uses these quotas (none by default).
    pub fn with_quotas(mut self, quotas: QuotaSettings) -> Self {
        self.quotas = std::sync::Arc::new(quotas);
        self
    }

    /// Takes the project's turn to write, when a limit on what it holds applies: before any
    /// other lock of the transaction (the allocation lock, resource claims). An update
    /// takes it first as well (`quota_baseline`), so a create and an update of one project
    /// never each hold what the other waits for, a circle PostgreSQL breaks only after
    /// `deadlock_timeout`.
    /// Answers the limits it read, which the create checks against once it has allocated.
    pub(crate) async fn take_quota_turn(
        &self,
        tx: &mut Tx,
        project_id: &str,
    ) -> ServiceResult<QuotaValues> {
        let limits = self.project_limits(tx, project_id).await?;
        if measured(&limits) {
            tx.lock_project_usage(project_id).await?;
        }
        Ok(limits)
    }

    /// A project's limits in force: its overrides over the configured defaults.
    pub(crate) async fn project_limits(
        &self,
        tx: &mut Tx,
        project_id: &str,
    ) -> ServiceResult<QuotaValues> {
        let own = tx.quota_of(project_id).await?.map(|r| r.values);
        Ok(own.unwrap_or_default().over(&self.quotas.defaults))
    }

    /// What the project holds over `[start, end)` as quotas count it: its allocations, and
    /// what its degraded reservations were granted and do not hold, from `now` (or their
    /// lease's start) to their lease's end. A grant stands while its lease waits for a
    /// replacement (healing gives it back without asking the quota again), so it is not
    /// room for another lease of the project. Whole resources are rows of one (`counted`
    /// counts them so), of no resource in particular (budget weight 1).
    async fn project_uses(
        &self,
        tx: &mut Tx,
        project_id: &str,
        start: DateTime<Utc>,
        end: DateTime<Utc>,
    ) -> ServiceResult<Vec<ProjectAllocation>> {
        let now = self.now();
        let mut rows = tx.project_allocations(project_id, start, end).await?;
        for short in tx.project_shortfalls(project_id, start, end, now).await? {
            let (resource_type, exclusive) = match short.reservation_type.as_str() {
                PHYSICAL_HOST => (PHYSICAL_HOST, true),
                VIRTUAL_INSTANCE | FLAVOR_INSTANCE => (PHYSICAL_HOST, false),
                FLOATINGIP => (FLOATINGIP, true),
                _ => continue,
            };
            let row = ProjectAllocation {
                lease_id: short.lease_id,
                resource_type: resource_type.to_string(),
                resource_id: 0,
                exclusive,
                units: if exclusive { 1 } else { short.units },
                start: short.lease_start.max(now),
                end: short.lease_end,
            };
            let copies = if exclusive { short.units } else { 1 };
            for _ in 1..copies {
                rows.push(row.clone());
            }
            rows.push(row);
        }
        Ok(rows)
    }

    /// A host's weight in the monthly budget: the largest configured weight whose property
    /// it has, else 1.
    fn host_weight(&self, host: &HostRecord) -> f64 {
        self.quotas
            .host_weights
            .iter()
            .filter(|w| host.property(&w.key).is_some_and(|v| v == w.value.as_str()))
            .map(|w| w.weight)
            .reduce(f64::max)
            .unwrap_or(1.0)
    }

    /// The whole-host allocations of `rows` as uses weighing their host's budget weight (1
    /// unless a configured weight matches the host), `lease_id`'s marked as its own.
    async fn weighted_hosts(
        &self,
        tx: &mut Tx,
        rows: &[ProjectAllocation],
        lease_id: &str,
    ) -> ServiceResult<Vec<Use>> {
        let inventory = match self.quotas.host_weights.is_empty() {
            true => None,
            false => Some(self.host_cache.inventory(tx).await?),
        };
        let weight = |id: i64| -> f64 {
            inventory
                .as_ref()
                .and_then(|inv| inv.get(id))
                .map_or(1.0, |host| self.host_weight(host))
        };
        Ok(rows
            .iter()
            .filter(|a| a.resource_type == PHYSICAL_HOST && a.exclusive)
            .map(|a| Use {
                start: a.start,
                end: a.end,
                amount: weight(a.resource_id),
                own: a.lease_id == lease_id,
            })
            .collect())
    }

    /// The project's use over `window` for the limits `limits` sets, with `lease_id`'s own
    /// allocations apart. Taken under the project's lock: what it reads stays true until
    /// the transaction ends.
    async fn measure(
        &self,
        tx: &mut Tx,
        limits: &QuotaValues,
        project_id: &str,
        lease_id: &str,
        window: TimeWindow,
    ) -> ServiceResult<Measure> {
        let budget = limits.limit(QuotaKind::HostHoursPerMonth).is_some();
        if !measured(limits) {
            return Ok(Measure::default());
        }
        // Two creates of one project must not both pass against the same usage.
        tx.lock_project_usage(project_id).await?;
        let months = if budget {
            quota::months(window)
        } else {
            Vec::new()
        };
        let start = months.first().map_or(window.start(), |m| m.start());
        let end = months.last().map_or(window.end(), |m| m.end());
        let rows = self.project_uses(tx, project_id, start, end).await?;
        let mut uses: HashMap<QuotaKind, Vec<Use>> = HashMap::new();
        for a in &rows {
            if let Some((kind, amount)) = counted(a) {
                uses.entry(kind).or_default().push(Use {
                    start: a.start,
                    end: a.end,
                    amount,
                    own: a.lease_id == lease_id,
                });
            }
        }
        let mut measure = Measure::default();
        for kind in CONCURRENT {
            if limits.limit(kind).is_some() {
                measure
                    .uses
                    .insert(kind, uses.remove(&kind).unwrap_or_default());
            }
        }
        if budget {
            let weighted = self.weighted_hosts(tx, &rows, lease_id).await?;
            for month in months {
                let (others, own) = quota::hours_in(&weighted, month);
                measure.months.push((month, others, own));
            }
        }
        Ok(measure)
    }

    /// The most hosts a ranged host reservation may be granted under the project's limits
    /// on hosts, less `later_min` for the lease's later host reservations; `None` for a
    /// limit the project does not have. Under the host quota (`.0`): the limit less the most
    /// the project (this lease's reservations written so far included) holds at any instant
    /// of `window`. Under the monthly budget (`.1`): in every month `window` touches, what
    /// is left of it, each host counted at the heaviest weight any host has (so the grant
    /// fits whichever it gets). Offers cap the same way (`Occupancy::whole_room`), so a
    /// create of an offer is granted what the offer showed; see `quota::ranged_cap`.
    async fn host_rooms(
        &self,
        tx: &mut Tx,
        limits: &QuotaValues,
        project_id: &str,
        window: TimeWindow,
        later_min: i64,
    ) -> ServiceResult<(Option<i64>, Option<i64>)> {
        let hosts = limits.limit(QuotaKind::Hosts);
        let budget = limits.limit(QuotaKind::HostHoursPerMonth);
        if hosts.is_none() && budget.is_none() {
            return Ok((None, None));
        }
        // The budget counts whole months: theirs are read.
        let months = match budget {
            Some(_) => quota::months(window),
            None => Vec::new(),
        };
        let from = months.first().map_or(window.start(), |m| m.start());
        let until = months.last().map_or(window.end(), |m| m.end());
        let rows = self.project_uses(tx, project_id, from, until).await?;
        let ceiling = hosts.map(|limit| {
            let uses: Vec<Use> = rows
                .iter()
                .filter(|a| a.resource_type == PHYSICAL_HOST && a.exclusive)
                .map(|a| Use {
                    start: a.start,
                    end: a.end,
                    amount: 1.0,
                    own: false,
                })
                .collect();
            let held = quota::most_at_once(&uses, window).round() as i64;
            limit.saturating_sub(held).saturating_sub(later_min)
        });
        let Some(budget) = budget else {
            return Ok((ceiling, None));
        };
        // No lease is "own" here: every hour booked counts against what is left.
        let weighted = self.weighted_hosts(tx, &rows, "").await?;
        let heaviest = match self.quotas.host_weights.is_empty() {
            true => 1.0,
            false => self
                .host_cache
                .inventory(tx)
                .await?
                .hosts
                .iter()
                .map(|h| self.host_weight(h))
                .fold(1.0, f64::max),
        };
        // The lease's hosts so far are among the rows.
        let room = quota::budget_room(budget as f64, window, heaviest, 0.0, |month| {
            quota::hours_in(&weighted, month).0
        });
        Ok((ceiling, Some(room.saturating_sub(later_min))))
    }

    /// A ranged host request (`spec`) as it asks under the project's `limits` over `window`:
    /// its `max` lowered to what they leave after the lease's later host reservations'
    /// minimums (`later_min`), as offers do (see [`Self::host_rooms`],
    /// `quota::ranged_cap`), never below `floor` hosts. `None` when it asks as it is (not a
    /// ranged host request, or nothing lowers it).
    pub(crate) async fn capped_host_request(
        &self,
        tx: &mut Tx,
        limits: &QuotaValues,
        (project_id, window): (&str, TimeWindow),
        spec: &ReservationSpec,
        (later_min, floor): (i64, usize),
    ) -> ServiceResult<Option<ReservationSpec>> {
        let ReservationSpec::Host(h) = spec else {
            return Ok(None);
        };
        if h.min >= h.max {
            return Ok(None);
        }
        let (ceiling, budget) = self
            .host_rooms(tx, limits, project_id, window, later_min)
            .await?;
        let (min, max) = (h.min as usize, h.max as usize);
        let cap = quota::ranged_cap(min, max, ceiling, budget).max(floor.min(max));
        if cap >= max {
            return Ok(None);
        }
        let mut capped = spec.clone();
        if let ReservationSpec::Host(h) = &mut capped {
            h.max = u32::try_from(cap).unwrap_or(h.min);
        }
        Ok(Some(capped))
    }

    /// What an update starts from (the lease's window before it, and the project's use
    /// over the new window), or `None` when no limit applies to the project.
    pub(crate) async fn quota_baseline(
        &self,
        tx: &mut Tx,
        lease: &blazar_core::Lease,
        new_window: TimeWindow,
    ) -> ServiceResult<Option<QuotaBaseline>> {
        let limits = self.project_limits(tx, &lease.project_id).await?;
        if !limits.limits_anything() {
            return Ok(None);
        }
        let window = TimeWindow::new(lease.start, lease.end)
            .map_err(|e| ServiceError::Internal(format!("lease {}: {e}", lease.id)))?;
        let measure = self
            .measure(tx, &limits, &lease.project_id, &lease.id, new_window)
            .await?;
        Ok(Some(QuotaBaseline {
            limits,
            window,
            measure,
        }))
    }

    /// Refuses a create or an update whose allocations, already written in `tx`, would take
    /// the project past a limit. Called in the allocating transaction.
    pub(crate) async fn check_quotas(
        &self,
        tx: &mut Tx,
        project_id: &str,
        lease_id: &str,
        window: TimeWindow,
        against: QuotaCheck<'_>,
    ) -> ServiceResult<()> {
        let (limits, baseline) = match against {
            QuotaCheck::Create(limits) => (*limits, None),
            QuotaCheck::Update(b) => (b.limits, Some(b)),
        };
        if !limits.limits_anything() {
            return Ok(());
        }
        let now = truncate_to_minute(self.now());
        let mut excesses = window_excesses(&limits, window, now, baseline.map(|b| b.window));
        let measure = self
            .measure(tx, &limits, project_id, lease_id, window)
            .await?;
        for kind in CONCURRENT {
            let (Some(limit), Some(after)) = (limits.limit(kind), measure.uses.get(&kind)) else {
                continue;
            };
            let before = baseline
                .and_then(|b| b.measure.uses.get(&kind))
                .map_or(&[][..], Vec::as_slice);
            if let Some(p) = quota::worse_past(before, after, window, limit as f64) {
                excesses.push(QuotaExcess {
                    kind,
                    limit,
                    in_use: p.others,
                    requested: p.own,
                    at: Some(p.at),
                    month: None,
                });
            }
        }
        if let Some(limit) = limits.limit(QuotaKind::HostHoursPerMonth) {
            let totals_before = baseline.map(|b| b.measure.month_totals());
            for &(month, others, own) in &measure.months {
                let before = totals_before
                    .as_ref()
                    .and_then(|t| t.get(&month).copied())
                    .unwrap_or(0.0);
                let total = others + own;
                if own > 0.0 && total > limit as f64 + 1e-9 && total > before + 1e-9 {
                    excesses.push(QuotaExcess {
                        kind: QuotaKind::HostHoursPerMonth,
                        limit,
                        in_use: others,
                        requested: own,
                        at: None,
                        month: Some(month),
                    });
                    break;
                }
            }
        }
        if excesses.is_empty() {
            return Ok(());
        }
        tracing::info!(
            project.id = %project_id,
            quotas = ?excesses.iter().map(|e| e.kind.as_str()).collect::<Vec<_>>(),
            "quota refused a lease"
        );
        let kind = match baseline {
            None => RefusalKind::Forbidden,
            Some(_) => RefusalKind::BadRequest,
        };
        Err(refusal(project_id, excesses, kind))
    }

    /// The project's limits a window search keeps within, so that a window it offers or
    /// books is one a create would not refuse for them: its concurrent limits as ceilings,
    /// with what the project holds between `from` and `until`, and its monthly host-hour
    /// budget, with what it has booked in each month of that span; lease `except`'s
    /// holdings left out.
    pub(crate) async fn search_quotas(
        &self,
        tx: &mut Tx,
        project_id: &str,
        except: Option<&str>,
        from: DateTime<Utc>,
        until: DateTime<Utc>,
    ) -> ServiceResult<(Vec<Ceiling>, Option<Budget>)> {
        let limits = self.project_limits(tx, project_id).await?;
        let concurrent = CONCURRENT.iter().any(|k| limits.limit(*k).is_some());
        let budget = limits.limit(QuotaKind::HostHoursPerMonth);
        let Ok(span) = TimeWindow::new(from, until) else {
            return Ok((Vec::new(), None));
        };
        if !concurrent && budget.is_none() {
            return Ok((Vec::new(), None));
        }
        // The budget counts whole months: the span's months are read.
        let months = match budget {
            Some(_) => quota::months(span),
            None => Vec::new(),
        };
        let read_from = months.first().map_or(from, |m| m.start().min(from));
        let read_until = months.last().map_or(until, |m| m.end().max(until));
        let mut rows = self
            .project_uses(tx, project_id, read_from, read_until)
            .await?;
        rows.retain(|a| except != Some(a.lease_id.as_str()));
        let mut ceilings = Vec::new();
        for kind in CONCURRENT {
            let (Some(limit), Some(counted)) = (limits.limit(kind), counted_as(kind)) else {
                continue;
            };
            let held = rows
                .iter()
                .filter_map(|a| match self::counted(a) {
                    // Whole numbers: a host or an address is one, slots are units.
                    Some((k, amount)) if k == kind => Some((a.start, a.end, amount as i64)),
                    _ => None,
                })
                .collect();
            ceilings.push(Ceiling {
                counted,
                limit,
                held,
            });
        }
        let Some(limit) = budget else {
            return Ok((ceilings, None));
        };
        let weighted = self.weighted_hosts(tx, &rows, "").await?;
        let booked = months
            .iter()
            .map(|month| (*month, quota::hours_in(&weighted, *month).0))
            .collect();
        let weights = match self.quotas.host_weights.is_empty() {
            true => HashMap::new(),
            false => {
                let inventory = self.host_cache.inventory(tx).await?;
                inventory
                    .hosts
                    .iter()
                    .map(|h| (h.id, self.host_weight(h)))
                    .filter(|(_, w)| *w != 1.0)
                    .collect()
            }
        };
        let budget = Budget {
            kind: PHYSICAL_HOST.into(),
            limit: limit as f64,
            booked,
            weights,
        };
        Ok((ceilings, Some(budget)))
    }

    /// A project's quotas as shown (`blazar:quotas:get` on that project).
    pub async fn get_quota(
        &self,
        identity: &Identity,
        project_id: &str,
    ) -> ServiceResult<ProjectQuota> {
        self.authorize(QUOTAS_GET, identity, &project_target(project_id))?;
        // What no project can be called is not shown the defaults as if it were one.
        crate::check_project_id(project_id)?;
        in_tx!(self, read, |tx| {
            let row = tx.quota_of(project_id).await?;
            self.shown(tx, project_id, row).await
        })
    }

    /// The projects that have overrides; a caller who may not see every project (the
    /// `admin` rule) sees only its own.
    pub async fn list_quotas(&self, identity: &Identity) -> ServiceResult<Vec<ProjectQuota>> {
        self.authorize_own(QUOTAS_GET, identity)?;
        let all = self.is_admin(identity);
        in_tx!(self, read, |tx| {
            let rows = if all {
                tx.list_quotas().await?
            } else {
                tx.quota_of(&identity.project_id)
                    .await?
                    .into_iter()
                    .collect()
            };
            let mut out = Vec::with_capacity(rows.len());
            for row in rows {
                let project = row.project_id.clone();
                out.push(self.shown(tx, &project, Some(row)).await?);
            }
            Ok(out)
        })
    }

    /// The rule a quota change needs, for the edge to check before it reads the body: a
    /// caller who may not change quotas is refused whatever it sends.
    pub fn authorize_quota_change(
        &self,
        identity: &Identity,
        project_id: &str,
    ) -> ServiceResult<()> {
        self.authorize(QUOTAS_PUT, identity, &project_target(project_id))
    }

    /// Sets (`Some`) or clears (`None`) some of a project's overrides; the others stay.
    pub async fn set_quota(
        &self,
        identity: &Identity,
        project_id: &str,
        changes: &[(QuotaKind, Option<i64>)],
    ) -> ServiceResult<ProjectQuota> {
        self.authorize_quota_change(identity, project_id)?;
        crate::check_project_id(project_id)?;
        for (kind, value) in changes {
            if let Some(v) = value
                && *v < -1
            {
                return Err(ServiceError::BadRequest(format!(
                    "Invalid value {v} for quota {}: use -1 (no limit) or a limit of 0 or more",
                    kind.as_str()
                ))
                .with_reason(Reason::field(kind.as_str())));
            }
        }
        let quota = in_tx!(self, write, |tx| {
            let now = self.now();
            let mut row = tx.quota_of(project_id).await?.unwrap_or(QuotaRow {
                project_id: project_id.to_string(),
                values: QuotaValues::default(),
                created_at: now,
                updated_at: None,
            });
            for (kind, value) in changes {
                row.values.set(*kind, *value);
            }
            row.updated_at = Some(now);
            if row.values.is_empty() {
                tx.delete_quota(project_id).await?;
                return self.shown(tx, project_id, None).await;
            }
            tx.put_quota(&row).await?;
            self.shown(tx, project_id, Some(row)).await
        })?;
        tracing::info!(project.id = %project_id, "quota overrides set");
        Ok(quota)
    }

    /// Removes every override of a project: the defaults apply again.
    pub async fn delete_quota(&self, identity: &Identity, project_id: &str) -> ServiceResult<()> {
        self.authorize(QUOTAS_DELETE, identity, &project_target(project_id))?;
        let removed = in_tx!(self, write, |tx| { Ok(tx.delete_quota(project_id).await?) })?;
        if !removed {
            return Err(ServiceError::NotFound(format!(
                "Object with {{'project_id': '{project_id}'}} not found"
            )));
        }
        tracing::info!(project.id = %project_id, "quota overrides removed");
        Ok(())
    }

    /// A project's quotas with what it holds now.
    async fn shown(
        &self,
        tx: &mut Tx,
        project_id: &str,
        row: Option<QuotaRow>,
    ) -> ServiceResult<ProjectQuota> {
        let overrides = row.map(|r| r.values).unwrap_or_default();
        let mut limits = overrides.over(&self.quotas.defaults);
        for kind in QuotaKind::ALL {
            if limits.limit(kind).is_none() {
                limits.set(kind, Some(-1));
            }
        }
        let usage = self.usage_now(tx, project_id).await?;
        Ok(ProjectQuota {
            project_id: project_id.to_string(),
            limits,
            overrides,
            usage,
        })
    }

    /// What a project's reservations hold now, and its host-hours this month.
    async fn usage_now(&self, tx: &mut Tx, project_id: &str) -> ServiceResult<QuotaUsage> {
        let now = self.now();
        let month = quota::month_of(now);
        let (start, end) = match month {
            Some(m) => (m.start(), m.end()),
            None => (now, now + chrono::Duration::seconds(1)),
        };
        let rows = self.project_uses(tx, project_id, start, end).await?;
        let mut usage = QuotaUsage {
            at: now,
            hosts: 0.0,
            floatingips: 0.0,
            instances: 0.0,
            month,
            host_hours: 0.0,
        };
        for a in rows.iter().filter(|a| a.start <= now && now < a.end) {
            match counted(a) {
                Some((QuotaKind::Hosts, n)) => usage.hosts += n,
                Some((QuotaKind::FloatingIps, n)) => usage.floatingips += n,
                Some((QuotaKind::Instances, n)) => usage.instances += n,
                _ => {}
            }
        }
        if let Some(month) = month {
            let weighted = self.weighted_hosts(tx, &rows, "").await?;
            usage.host_hours = quota::hours_in(&weighted, month).0;
        }
        Ok(usage)
    }
}

/// A project as the target of a quota rule (no user owns a quota).
fn project_target(project_id: &str) -> Target<'_> {
    Target {
        project_id,
        user_id: "",
    }
}
