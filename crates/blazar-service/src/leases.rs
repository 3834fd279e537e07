//! Lease use cases: create, show, list, update, delete.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use blazar_core::lease::{
    CreatePlan, DatesRequest, EventMove, UpdatePlan, When, event_status, plan_create, plan_update,
};
use blazar_core::reservation::FlavorChoice;
use blazar_core::time::truncate_to_minute;
use blazar_core::{ActionFilter, ActionRecord, LeaseFilter};
use blazar_core::{
    ActionKind, ActionPurpose, ActionStatus, EventStatus, EventType, LeaseStatus, ReservationSpec,
    ReservationStatus, TimeWindow,
};
use blazar_core::{
    Allocation, Event, Lease, LeaseView, Reservation, ReservationChange, ReservationRequest,
};
use blazar_db::{Backend, Tx};
use chrono::{DateTime, Duration, Utc};
use serde_json::{Map, Value, json};

use crate::enforcement::{EnforcedLease, UsageFilter, iso};
use crate::offers::SearchDeadline;
use crate::policy::Target;
use crate::quotas::QuotaCheck;
use crate::resources::AllocationRequest;
use crate::{
    Identity, Reason, RefusalKind, Requested, ReservationRef, Retry, Service, ServiceError,
    ServiceResult, new_id,
};

/// How often an update put to the enforcement filters is tried again because the lease
/// changed between the filters' decision and the write.
const FILTERED_UPDATE_ATTEMPTS: usize = 3;

/// Lease `id`'s revision (moved by every change to it, its reservations or its events),
/// `None` if it does not exist.
async fn revision_of(tx: &mut Tx, id: &str) -> ServiceResult<Option<i64>> {
    let filter = LeaseFilter {
        id: Some(id.to_string()),
        ..LeaseFilter::default()
    };
    Ok(tx.lease_revisions(&filter).await?.pop().map(|(_, r)| r))
}

/// Where in `window` a reservation whose allocations start at `starts` holds them from: a
/// reservation whose resources healing all replaced holds them from the replacement on, not
/// from the lease's start (another lease may have had them before).
pub(crate) fn held_since(
    window: TimeWindow,
    starts: impl Iterator<Item = DateTime<Utc>>,
) -> DateTime<Utc> {
    starts
        .min()
        .filter(|t| *t > window.start() && *t < window.end())
        .unwrap_or(window.start())
}

/// Whether an allocation's refusal says too few resources were free (a conflict with what
/// another lease holds counts: a concurrent create took them).
fn shortfall(e: &ServiceError) -> bool {
    match e {
        ServiceError::Conflict(_) => true,
        ServiceError::Refused(r) => r.shortfall || r.kind == RefusalKind::Conflict,
        _ => false,
    }
}

/// Whether `e` refuses for a project quota that counts the project's other leases (what it
/// holds at once, its monthly host-hours): a window searched before another create of the
/// project committed may be over it now, though a later one would not be.
fn over_shared_quota(e: &ServiceError) -> bool {
    use blazar_core::quota::QuotaKind;
    match e {
        ServiceError::Refused(r) => r.reasons.iter().any(|reason| {
            reason.quota.as_ref().is_some_and(|q| {
                q.in_use > 0.0
                    && matches!(
                        q.kind,
                        QuotaKind::Hosts
                            | QuotaKind::FloatingIps
                            | QuotaKind::Instances
                            | QuotaKind::HostHoursPerMonth
                    )
            })
        }),
        _ => false,
    }
}

/// The policy rule deciding whether a refused create or update says why.
pub const EXPLAIN_REFUSAL: &str = "blazar:leases:explain_refusal";

/// How many times an `earliest` create held by usage filters to one window searches again
/// when a concurrent create took that window (its resources, or its project's quota). Of N
/// such creates racing for the same window, one gets it each round (on SQLite a batch of
/// concurrent creates finds the same window), so the bound is generous: eight refused all
/// but about nine of sixteen racing creates while the host stayed free for weeks.
const EARLIEST_FILTERED_TRIES: u32 = 64;

/// Why one try of a create failed: its filtered `earliest` window was taken, or anything else.
enum Lost {
    Window(ServiceError),
    Other(ServiceError),
}

impl From<ServiceError> for Lost {
    fn from(e: ServiceError) -> Self {
        Lost::Other(e)
    }
}

/// Longest lease name Blazar's schema holds.
pub const MAX_LEASE_NAME_LEN: usize = 80;

/// Most reservations in one lease (Blazar has no bound). Real leases hold a handful; each
/// one multiplies the work of a window search, so thousands would hold a core for minutes.
pub const MAX_RESERVATIONS: usize = 100;

#[derive(Debug, Clone)]
pub struct NewLease {
    pub name: String,
    pub start: When,
    pub end: When,
    pub before_end: Option<DateTime<Utc>>,
    /// The reservations, read where the request entered.
    pub reservations: Vec<ReservationRequest>,
    /// Book the earliest window of this search instead of `start` and `end`
    /// (`start_date: "earliest"`), found and booked in one transaction.
    pub earliest: Option<crate::offers::SearchWindow>,
    /// The caller's Keystone token (auth mode keystone): the lease's trust is made with it
    /// when the service acts for users through trusts.
    pub user_token: Option<crate::UserToken>,
}

#[derive(Debug, Clone, Default)]
pub struct LeaseUpdate {
    pub name: Option<String>,
    pub start: Option<When>,
    pub end: Option<When>,
    pub before_end: Option<DateTime<Utc>>,
    /// Changes to reservations, each naming the reservation it changes.
    pub reservations: Option<Vec<ReservationChange>>,
}

impl LeaseUpdate {
    /// Whether it changes more than the name: what Blazar puts to the filters.
    fn moves_anything(&self) -> bool {
        self.start.is_some()
            || self.end.is_some()
            || self.before_end.is_some()
            || self.reservations.is_some()
    }

    fn dates(&self) -> DatesRequest {
        DatesRequest {
            start: self.start,
            end: self.end,
            before_end: self.before_end,
            changes_reservations: self.reservations.is_some(),
        }
    }
}

/// Leases a batch of a lease list reads at most: about 400 kB of JSON.
const LEASE_BATCH: usize = 250;

/// A lease list being read: the ids and revisions of its leases, in list order, read when
/// it began; the leases a batch at a time, each batch in a short read transaction of its
/// own, so that the list's size never sits in memory (10,000 leases are 15 MB of JSON, and
/// were about 90 MB in the making) however many clients read it. A lease deleted since the
/// list began is left out, as a later list would; one changed since is shown as it is now.
pub struct LeaseList {
    service: Service,
    leases: ListedIds,
    done: usize,
}

/// The ids of a list's leases one after another in one string, with where each ends and
/// its revision: two thirds of the memory of a string per lease, which counts because a
/// list can name every lease of the site and every reader of it holds its own.
#[derive(Default)]
struct ListedIds {
    text: String,
    ends: Vec<(usize, i64)>,
}

impl ListedIds {
    fn new(leases: Vec<(String, i64)>) -> Self {
        let mut ids = ListedIds {
            text: String::with_capacity(leases.iter().map(|(id, _)| id.len()).sum()),
            ends: Vec::with_capacity(leases.len()),
        };
        for (id, revision) in leases {
            ids.text.push_str(&id);
            ids.ends.push((ids.text.len(), revision));
        }
        ids
    }

    fn len(&self) -> usize {
        self.ends.len()
    }

    /// The id and revision of the `at`th lease.
    fn get(&self, at: usize) -> Option<(&str, i64)> {
        let (end, revision) = *self.ends.get(at)?;
        let start = match at.checked_sub(1) {
            Some(before) => self.ends.get(before)?.0,
            None => 0,
        };
        Some((self.text.get(start..end)?, revision))
    }
}

/// One batch of a lease list, in order, holding its permit of the large reads (when it
/// read leases) until dropped: the caller renders it first.
pub struct LeaseBatch<T> {
    pub leases: Vec<Listed<T>>,
    _permit: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl LeaseList {
    /// The next batch of leases; `None` once all are read. For a caller that keeps what it
    /// rendered of each lease: `kept(id, revision)` returns the caller's rendering of that
    /// lease at that revision, if it has one, and only the other leases are read whole. A
    /// lease's revision moves with every committed change to it, its reservations or its
    /// events, so a kept rendering is never stale.
    pub async fn next_batch<T>(
        &mut self,
        kept: impl Fn(&str, i64) -> Option<T>,
    ) -> ServiceResult<Option<LeaseBatch<T>>> {
        let batch: Vec<(&str, i64)> = (self.done..self.leases.len().min(self.done + LEASE_BATCH))
            .filter_map(|at| self.leases.get(at))
            .collect();
        if batch.is_empty() {
            return Ok(None);
        }
        self.done += batch.len();
        let mut listed: Vec<Option<Listed<T>>> = Vec::with_capacity(batch.len());
        let mut missing = Vec::new();
        for &(id, revision) in &batch {
            let found = kept(id, revision).map(Listed::Kept);
            if found.is_none() {
                missing.push(id.to_owned());
            }
            listed.push(found);
        }
        if missing.is_empty() {
            return Ok(Some(LeaseBatch {
                leases: listed.into_iter().flatten().collect(),
                _permit: None,
            }));
        }
        let service = &self.service;
        let permit = service.large_read_permit().await?;
        let trees = in_tx!(service, read, |tx| {
            Ok(tx
                .revised_lease_trees(&LeaseFilter {
                    ids: Some(missing.clone()),
                    ..LeaseFilter::default()
                })
                .await?)
        })?;
        let mut fresh: HashMap<String, Listed<T>> = trees
            .into_iter()
            .map(|(revision, (lease, reservations, events))| {
                let view = Box::new(LeaseView {
                    lease,
                    reservations,
                    events,
                });
                (view.lease.id.clone(), Listed::Fresh(revision, view))
            })
            .collect();
        let leases = batch
            .iter()
            .zip(listed)
            .filter_map(|((id, _), found)| found.or_else(|| fresh.remove(*id)))
            .collect();
        Ok(Some(LeaseBatch {
            leases,
            _permit: Some(permit),
        }))
    }
}

/// One lease of a batch of a [`LeaseList`].
#[derive(Debug, Clone)]
pub enum Listed<T> {
    /// The caller's own rendering of the lease, still current.
    Kept(T),
    /// The lease as stored, at this revision: the caller's rendering was missing or stale.
    Fresh(i64, Box<LeaseView>),
}

/// What a create or update would have answered, found by carrying it out in a transaction
/// that is then rolled back: the lease, and what each reservation would be granted.
#[derive(Debug, Clone)]
pub struct DryRun {
    pub view: LeaseView,
    pub grants: Vec<blazar_db::GrantRow>,
}

/// A create or update carried out and rolled back, with the resources each reservation
/// would hold (by reservation id) as usage-enforcement filters see them.
type Trial = (DryRun, HashMap<String, Vec<Value>>);

/// `now` gives a lease the current minute, which began before the request. A lease that
/// ended early within that minute (an end of `now` in its first minute lasts one second)
/// still holds that second of it, in the past; a lease given the minute starts when the
/// last such release happened instead, so that it does not wait for the next minute for
/// what is free now.
async fn clear_of_early_ends(
    tx: &mut Tx,
    start: DateTime<Utc>,
    now: DateTime<Utc>,
) -> ServiceResult<DateTime<Utc>> {
    if start >= now {
        return Ok(start);
    }
    Ok(tx.last_release_between(start, now).await?.unwrap_or(start))
}

/// A lease that `clear_of_early_ends` moved to a later second of its minute starts back at
/// the minute (or at the latest of those early ends on what it was granted) once it knows
/// what it holds: only an early end of a resource it holds was a reason to wait. On what the
/// lease holds nothing was released in between, so whatever else overlaps the earlier
/// seconds there held it at the later start as well, and what was checked there still
/// holds. Moves the allocations that start with the lease and answers where to, if
/// anywhere; the caller moves the lease and its events.
async fn start_back_in_minute(
    tx: &mut Tx,
    lease_id: &str,
    asked: DateTime<Utc>,
    start: DateTime<Utc>,
) -> ServiceResult<Option<DateTime<Utc>>> {
    let back = tx
        .last_release_on_lease_resources(lease_id, asked, start)
        .await?
        .unwrap_or(asked);
    if back >= start {
        return Ok(None);
    }
    let held = tx.allocations_of_lease(lease_id).await?;
    let moved: Vec<(&Allocation, DateTime<Utc>)> = held
        .iter()
        .filter(|a| a.occupancy.start == start)
        .map(|a| (a, back))
        .collect();
    tx.restore_allocation_starts(&moved).await?;
    Ok(Some(back))
}

/// Blazar's input date format, in which `before_end_date` reaches its filters.
const BLAZAR_INPUT_DATE: &str = "%Y-%m-%d %H:%M";

/// The new lease of an update as Blazar's `check_update` gets it: the values the request
/// sets, the dates it leads to, and the reservations (those of the request, or all the
/// lease's if it names none), each with the resources it would hold.
fn update_values(
    update: &LeaseUpdate,
    after: &LeaseView,
    held: &HashMap<String, Vec<Value>>,
) -> EnforcedLease {
    let reservations = match &update.reservations {
        Some(entries) => Value::Array(
            entries
                .iter()
                .map(|change| {
                    let mut r = change.as_sent();
                    let resources = change
                        .id()
                        .and_then(|id| held.get(id))
                        .cloned()
                        .unwrap_or_default();
                    r["allocations"] = Value::Array(resources);
                    r
                })
                .collect(),
        ),
        None => crate::enforcement::stored_lease_values(after, held)["reservations"].take(),
    };
    let mut values = Map::new();
    if let Some(name) = &update.name {
        values.insert("name".into(), json!(name));
    }
    values.insert("start_date".into(), json!(iso(after.lease.start)));
    values.insert("end_date".into(), json!(iso(after.lease.end)));
    if let Some(t) = update.before_end {
        values.insert(
            "before_end_date".into(),
            json!(t.format(BLAZAR_INPUT_DATE).to_string()),
        );
    }
    values.insert("reservations".into(), reservations);
    EnforcedLease {
        start: after.lease.start,
        end: after.lease.end,
        values: Value::Object(values),
    }
}

/// How long a lease create waits for the cloud to make what its instance reservations need
/// (aggregate, flavor, server group; as host enrolment waits for the freepool).
const PREPARE_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// A lease create that passed validation: everything its transaction needs.
pub(crate) struct LeasePlan {
    identity: Identity,
    name: String,
    dates: PlanDates,
    requests: Vec<ReservationSpec>,
    /// The Keystone trust made for the lease, if the service makes them.
    trust: Option<String>,
}

/// When a new lease takes place.
enum PlanDates {
    /// The dates asked for, checked.
    Fixed(CreatePlan),
    /// The earliest window of a search, decided in the writing transaction, so that no
    /// concurrent create can take it in between.
    Earliest(EarliestPlan),
}

/// An `earliest` create's search: made first among what is committed, before the writing
/// transaction and under a search permit, so that the writers a create's transaction holds
/// up (every one on SQLite) wait for a check of the window found, not for a search; then
/// again in the transaction, from that window on (at once when it is still free, further on
/// when a concurrent create took it).
struct EarliestPlan {
    /// The search as asked.
    asked: blazar_core::offer::Search,
    /// Where the first search found the earliest window; `None` when nothing fit anywhere,
    /// and the transaction does not search again. What was freed before it since is not
    /// looked for: the lease gets the window that was earliest when it was asked for.
    found_at: Option<DateTime<Utc>>,
}

/// A lease name as Blazar's schema holds it: not empty, no NUL, at most 80 characters.
pub fn check_name(name: &str) -> ServiceResult<()> {
    if name.trim().is_empty() {
        return Err(
            ServiceError::BadRequest("The lease name must not be empty".into())
                .with_reason(Reason::field("name")),
        );
    }
    if name.contains('\0') {
        return Err(ServiceError::BadRequest(
            "The lease name must not contain a NUL character".into(),
        )
        .with_reason(Reason::field("name")));
    }
    let len = name.chars().count();
    if len > MAX_LEASE_NAME_LEN {
        return Err(ServiceError::BadRequest(format!(
            "The lease name is {len} characters long; the limit is {MAX_LEASE_NAME_LEN}"
        ))
        .with_reason(Reason::field("name")));
    }
    Ok(())
}

pub(crate) fn lease_target(lease: &Lease) -> Target<'_> {
    Target {
        project_id: &lease.project_id,
        user_id: &lease.user_id,
    }
}

pub(crate) fn lease_not_found(id: &str) -> ServiceError {
    ServiceError::NotFound(format!("Object with {{'lease_id': '{id}'}} not found"))
}

fn new_event(lease_id: &str, kind: EventType, time: DateTime<Utc>, now: DateTime<Utc>) -> Event {
    Event::new(new_id(), lease_id, kind, time, now)
}

/// The id of a new reservation's server group: where the backend makes groups, empty (shown
/// as `null`) until the cloud gives its own, so that no id of a group that does not exist
/// is ever shown; elsewhere one of the same shape, as no group will exist.
fn new_group_id(made_by_cloud: bool) -> impl FnOnce() -> String {
    move || {
        if made_by_cloud {
            String::new()
        } else {
            uuid::Uuid::new_v4().to_string()
        }
    }
}

/// A random 32-hex-digit id, the shape of a Keystone trust id.
fn new_trust_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

pub(crate) async fn load_view(tx: &mut Tx, lease: Lease) -> ServiceResult<LeaseView> {
    let reservations = tx.reservations_of(&lease.id).await?;
    let events = tx.events_of(&lease.id).await?;
    Ok(LeaseView {
        lease,
        reservations,
        events,
    })
}

/// [`load_view`] for several leases at once, locking them (in id order, the order every
/// transaction that locks more than one lease takes them in): a few queries for a whole
/// batch of leases, not several per lease. Leases that are gone are left out.
pub(crate) async fn lock_views(tx: &mut Tx, ids: &[&str]) -> ServiceResult<Vec<LeaseView>> {
    let leases = tx.lock_leases(ids).await?;
    let mut events = group_by_lease(tx.events_of_leases(ids).await?, |e| &e.lease_id);
    let mut reservations = group_by_lease(tx.reservations_of_leases(ids).await?, |r| &r.lease_id);
    Ok(leases
        .into_iter()
        .map(|lease| LeaseView {
            reservations: reservations.remove(&lease.id).unwrap_or_default(),
            events: events.remove(&lease.id).unwrap_or_default(),
            lease,
        })
        .collect())
}

/// `items` by the lease `lease_of` names, each lease's in the order they came.
pub(crate) fn group_by_lease<T>(
    items: Vec<T>,
    lease_of: impl Fn(&T) -> &String,
) -> HashMap<String, Vec<T>> {
    let mut by_lease: HashMap<String, Vec<T>> = HashMap::new();
    for item in items {
        by_lease
            .entry(lease_of(&item).clone())
            .or_default()
            .push(item);
    }
    by_lease
}

impl Service {
    /// Wakes the scheduler if the lease has an event due before it would look anyway.
    fn wake_for(&self, view: &LeaseView) {
        if let Some(due) = view.next_due() {
            self.wake_scheduler_for(due);
        }
    }

    fn check_visible(&self, identity: &Identity, lease: &Lease) -> ServiceResult<()> {
        self.authorize("blazar:leases:get", identity, &lease_target(lease))
    }

    /// The specs of a create's reservations, or the first one's 400 with its position.
    pub(crate) fn validated_requests(
        &self,
        requests: &[ReservationRequest],
    ) -> ServiceResult<Vec<ReservationSpec>> {
        if requests.len() > MAX_RESERVATIONS {
            return Err(ServiceError::BadRequest(format!(
                "A lease may have at most {MAX_RESERVATIONS} reservations, got {}",
                requests.len()
            )));
        }
        requests
            .iter()
            .map(|request| {
                request.spec().cloned().map_err(|e| {
                    ServiceError::from(e.clone()).with_reason(Reason {
                        reservation: Some(ReservationRef::Position(request.position())),
                        resource_type: request.resource_type().map(str::to_string),
                        ..Reason::default()
                    })
                })
            })
            .collect()
    }

    /// Asks the cloud, before any transaction, what `flavor:instance` requests name: the
    /// flavor as the caller sees it (Blazar reads it with the user's token), and which hosts
    /// satisfy its `trait:` requirements now.
    pub(crate) async fn ask_cloud_for_flavors(
        &self,
        identity: &Identity,
        requests: &mut [ReservationSpec],
    ) -> ServiceResult<()> {
        for spec in requests.iter_mut() {
            let ReservationSpec::FlavorInstance(f) = spec else {
                continue;
            };
            let FlavorChoice::Named(requested) = &f.flavor else {
                continue;
            };
            let Some(flavor) = self.backend.flavor(identity, requested).await? else {
                continue;
            };
            let found = crate::instance::found_in_cloud(&flavor)?;
            if !found.traits.is_empty()
                && let Some(hosts) = self.backend.hosts_with_traits(&found.traits).await?
            {
                self.trait_hosts.remember(&found.traits, hosts);
            }
            f.flavor = FlavorChoice::Found(found);
        }
        Ok(())
    }

    pub async fn create_lease(
        &self,
        identity: &Identity,
        request: &NewLease,
    ) -> ServiceResult<LeaseView> {
        let mut attempt = 0;
        let created = loop {
            // An `earliest` create that usage filters held to the window they were asked
            // about loses that window to a concurrent create now and then (the resources,
            // or the room its project's quota left): it searches and asks again, a few
            // times, as the search itself would have moved on.
            match self.create_lease_once(identity, request).await {
                Ok(view) => break Ok(view),
                Err(Lost::Window(_)) if attempt < EARLIEST_FILTERED_TRIES => {
                    attempt += 1;
                    // A short jittered pause: the losers of one round would otherwise search
                    // again in step and meet in the same batch.
                    let spread = u64::from(attempt.min(8)) * 4;
                    let pause = 1 + getrandom::u64().map_or(0, |r| r % spread);
                    tokio::time::sleep(std::time::Duration::from_millis(pause)).await;
                }
                Err(Lost::Window(e) | Lost::Other(e)) => break Err(e),
            }
        };
        match created {
            Ok(view) => Ok(view),
            Err(e) => {
                let e = e.explained();
                self.notify_refusal(
                    identity,
                    "lease.create.refused",
                    None,
                    Some(&request.name),
                    &e,
                )
                .await;
                Err(self.with_next_offer(identity, e).await)
            }
        }
    }

    /// One try of [`Self::create_lease`]: plan, enforcement, trust, write. A shortfall at
    /// the write of an `earliest` create that enforcement held to the window it asked the
    /// filters about is `Err(Lost)`: that window went to a concurrent create.
    async fn create_lease_once(
        &self,
        identity: &Identity,
        request: &NewLease,
    ) -> Result<LeaseView, Lost> {
        let mut plan = self.plan_lease(identity, request).await?;
        self.enforce_create(identity, request, &mut plan).await?;
        let held_to_window =
            request.earliest.is_some() && matches!(plan.dates, PlanDates::Fixed(_));
        // After every check that can refuse without writing, so that those make no
        // trust; before the write, which calls nobody.
        plan.trust = self
            .make_trust(identity, request.user_token.as_ref())
            .await?;
        let written = match plan.trust.clone() {
            None => self.write_lease_of(plan).await,
            // The write and what follows it (the trust's removal if it failed, the
            // scheduler woken if it did not) run to the end even when the request is
            // dropped meanwhile (client gone, timeout): otherwise a trust made for a
            // lease that was never written would stay in Keystone. In a task of its
            // own, with the request's id and log span.
            Some(trust) => {
                use tracing::Instrument;
                let service = self.clone();
                let token = request.user_token.clone();
                let request_id = crate::actions::current_request_id();
                let write = async move {
                    let written = service.write_lease_of(plan).await;
                    if written.is_err() {
                        service.forget_trust(&trust, token.as_ref()).await;
                    }
                    written
                }
                .in_current_span();
                tokio::spawn(async move {
                    match request_id {
                        Some(id) => crate::actions::with_request_id(id, write).await,
                        None => write.await,
                    }
                })
                .await
                .map_err(|e| ServiceError::Internal(format!("a lease write failed: {e}")))?
            }
        };
        let view = match written {
            Ok(view) => view,
            Err(e) if held_to_window && (shortfall(&e) || over_shared_quota(&e)) => {
                return Err(Lost::Window(e));
            }
            Err(e) => return Err(Lost::Other(e)),
        };
        Ok(self.with_pieces_made(identity, view).await?)
    }

    /// What [`Self::create_lease`] would answer, the same 201 or refusal, and what it would
    /// grant, with nothing written and nobody (scheduler, workers, cloud) told. Not through
    /// the group-commit writer, whose transaction commits: in a transaction of its own that
    /// is rolled back. The answer does not wait for the cloud's server groups.
    pub async fn dry_run_create_lease(
        &self,
        identity: &Identity,
        request: &NewLease,
    ) -> ServiceResult<DryRun> {
        let planned = async {
            let plan = self.plan_lease(identity, request).await?;
            let filters = self.enforcement.consulted(true);
            let trial = self.trial_create(&plan, !filters.is_empty()).await?;
            if !filters.is_empty() {
                self.check_create(identity, request, &plan, &filters, Some(&trial))
                    .await?;
            }
            Ok::<_, ServiceError>(trial.0)
        }
        .await;
        match planned {
            Ok(dry_run) => Ok(dry_run),
            Err(e) => Err(self.with_next_offer(identity, e.explained()).await),
        }
    }

    /// Asks the enabled usage-enforcement filters whether `request` may be created, before
    /// its write transaction. A filter that reads the resources (or a create whose dates are
    /// only found by writing it, `earliest`) needs a trial first: the create carried out in
    /// a transaction that is rolled back, whose refusal, if any, is answered as is (Blazar
    /// searches the candidates before it asks the filters too). An `earliest` create is then
    /// held to the window the filters allowed: the write books those dates or is refused,
    /// never other dates nobody asked the filters about.
    async fn enforce_create(
        &self,
        identity: &Identity,
        request: &NewLease,
        plan: &mut LeasePlan,
    ) -> ServiceResult<()> {
        let filters = self.enforcement.consulted(false);
        if filters.is_empty() {
            return Ok(());
        }
        let needs_trial = matches!(plan.dates, PlanDates::Earliest(_))
            || (!plan.requests.is_empty() && filters.iter().any(|f| f.reads_allocations()));
        let trial = match needs_trial {
            true => Some(self.trial_create(plan, true).await?),
            false => None,
        };
        self.check_create(identity, request, plan, &filters, trial.as_ref())
            .await?;
        if let (PlanDates::Earliest(_), Some((tried, _))) = (&plan.dates, &trial) {
            let lease = &tried.view.lease;
            let before_end = tried
                .view
                .events
                .iter()
                .find(|e| e.event_type == EventType::BeforeEndLease)
                .map(|e| e.time);
            plan.dates = PlanDates::Fixed(CreatePlan {
                window: TimeWindow::new(lease.start, lease.end)
                    .map_err(|e| ServiceError::Internal(format!("a trial's window: {e}")))?,
                before_end,
            });
        }
        Ok(())
    }

    /// The create of `plan` carried out and rolled back: what it would answer and grant,
    /// and (`with_resources`) the resources each reservation would hold, as filters see them.
    async fn trial_create(&self, plan: &LeasePlan, with_resources: bool) -> ServiceResult<Trial> {
        in_tx!(self, write, dry_run = true, |tx| {
            let view = self.write_new_lease(tx, plan).await?;
            let grants = tx.grants_of_lease(&view.lease.id).await?;
            let resources = if with_resources {
                let allocations = tx.allocations_of_lease(&view.lease.id).await?;
                crate::enforcement::resources_by_reservation(tx, &allocations).await?
            } else {
                HashMap::new()
            };
            Ok((DryRun { view, grants }, resources))
        })
    }

    /// Asks `filters`, in order, about a create; the first refusal is the answer. The lease
    /// is given as Blazar's `check_create` gets it: the request's values with the dates
    /// parsed, `user_id`, `project_id`, `status` `CREATING`, and each reservation request as
    /// sent with the resources it would hold (none without a trial).
    async fn check_create(
        &self,
        identity: &Identity,
        request: &NewLease,
        plan: &LeasePlan,
        filters: &[Arc<dyn UsageFilter>],
        trial: Option<&Trial>,
    ) -> ServiceResult<()> {
        let window = match (trial, &plan.dates) {
            (Some((dry, _)), _) => (dry.view.lease.start, dry.view.lease.end),
            (None, PlanDates::Fixed(dates)) => (dates.window.start(), dates.window.end()),
            (None, PlanDates::Earliest(_)) => {
                return Err(ServiceError::Internal(
                    "a create of the earliest window is checked without its dates".into(),
                ));
            }
        };
        let reservations: Vec<Value> = request
            .reservations
            .iter()
            .enumerate()
            .map(|(i, sent)| {
                let held = trial
                    .and_then(|(dry, resources)| {
                        dry.view
                            .reservations
                            .get(i)
                            .and_then(|r| resources.get(&r.id))
                    })
                    .cloned()
                    .unwrap_or_default();
                let mut r = sent.as_sent().clone();
                r["allocations"] = Value::Array(held);
                r
            })
            .collect();
        let mut values = json!({
            "name": request.name,
            "start_date": iso(window.0),
            "end_date": iso(window.1),
            "user_id": identity.user_id,
            "project_id": identity.project_id,
            "status": LeaseStatus::Creating.as_str(),
            "reservations": reservations,
        });
        if let Some(t) = request.before_end {
            values["before_end_date"] = json!(t.format(BLAZAR_INPUT_DATE).to_string());
        }
        let lease = EnforcedLease {
            start: window.0,
            end: window.1,
            values,
        };
        let context = self
            .enforcement
            .context(&identity.user_id, &identity.project_id);
        for filter in filters {
            filter
                .check_create(&context, &lease)
                .await
                .map_err(|d| crate::enforcement::refusal(filter.name(), d))?;
        }
        Ok(())
    }

    /// Checks a create (policy, name, dates, reservations) and asks the cloud what it needs
    /// to know, before any transaction.
    async fn plan_lease(
        &self,
        identity: &Identity,
        request: &NewLease,
    ) -> ServiceResult<LeasePlan> {
        self.authorize_explained("blazar:leases:post", identity, &Target::own(identity))?;
        check_name(&request.name)?;
        let now = truncate_to_minute(self.now());
        // The dates asked for, checked before the reservations (as Blazar does); an
        // `earliest` search is made once they are known.
        enum Asked {
            Dates(CreatePlan),
            Earliest(blazar_core::offer::Search),
        }
        let asked = match &request.earliest {
            // As offers do: the next whole minute, so that an `earliest` lease gets all of its
            // duration and the same start the offer asked just before names.
            Some(search) => Asked::Earliest(search.resolve(
                blazar_core::time::first_whole_minute(self.now()),
                self.settings().cleaning(),
                blazar_core::offer::Order::Earliest,
                1,
            )?),
            None => Asked::Dates(plan_create(
                request.start,
                request.end,
                request.before_end,
                Duration::minutes(self.settings().minutes_before_end_lease),
                now,
            )?),
        };
        let mut requests = self.validated_requests(&request.reservations)?;
        self.ask_cloud_for_flavors(identity, &mut requests).await?;
        let dates = match asked {
            Asked::Dates(dates) => PlanDates::Fixed(dates),
            Asked::Earliest(search) => PlanDates::Earliest(
                self.search_before_writing(identity, &requests, search)
                    .await?,
            ),
        };
        Ok(LeasePlan {
            identity: identity.clone(),
            name: request.name.clone(),
            dates,
            requests,
            trust: None,
        })
    }

    /// The first search of an `earliest` create (see [`EarliestPlan`]), in a read
    /// transaction.
    async fn search_before_writing(
        &self,
        identity: &Identity,
        requests: &[ReservationSpec],
        asked: blazar_core::offer::Search,
    ) -> ServiceResult<EarliestPlan> {
        let deadline = SearchDeadline::from_now();
        let _permit = self.search_permit(deadline).await?;
        let found = in_tx!(self, read, |tx| {
            self.first_offer(tx, identity, requests, &asked, deadline)
                .await
        })?;
        Ok(EarliestPlan {
            found_at: found.map(|offer| offer.window.start()),
            asked,
        })
    }

    /// Blazar answers a lease create once what its instance reservations need in Nova
    /// exists, with the ids Nova gave it (`aggregate_id`, and `server_group_id`, which
    /// users pass as the `group` hint). Where the backend makes them, the create waits for
    /// those `prepare` actions, at most [`PREPARE_WAIT`]; after that the ids appear when
    /// the actions are done.
    async fn with_pieces_made(
        &self,
        identity: &Identity,
        view: LeaseView,
    ) -> ServiceResult<LeaseView> {
        if !self.backend.prepares_reservations() {
            return Ok(view);
        }
        let prepared: HashSet<&str> = view
            .reservations
            .iter()
            .filter(|r| r.spec.instance_ids().is_some())
            .map(|r| r.id.as_str())
            .collect();
        if prepared.is_empty() {
            return Ok(view);
        }
        let lease_id = view.lease.id.clone();
        let actions = in_tx!(self, read, |tx| {
            Ok(tx.actions_of_lease(&lease_id).await?)
        })?;
        // All at once, and [`PREPARE_WAIT`] for them all: a lease of many reservations while
        // Nova does not answer waits no longer than one. An attempt cut short by the wait
        // goes on in its own task (`see_through`).
        let waits = actions
            .iter()
            .filter(|a| {
                a.intent.kind == ActionKind::Prepare
                    && prepared.contains(a.intent.reservation_id.as_str())
                    && a.status.is_open()
            })
            .map(|a| self.see_through(a.seq, PREPARE_WAIT));
        if let Ok(seen) = tokio::time::timeout(PREPARE_WAIT, futures::future::join_all(waits)).await
        {
            for result in seen {
                result?;
            }
        }
        self.get_lease(identity, &lease_id).await
    }

    /// Writes a validated new lease, through the group-commit writer if there is one.
    /// Then the scheduler and event streams are told.
    async fn write_lease_of(&self, plan: LeasePlan) -> ServiceResult<LeaseView> {
        let view = match &self.batcher {
            Some(batcher) => {
                let view = batcher.create(self, plan).await?;
                // The create writer commits outside `in_tx!`: event streams look again, and
                // the `lease.create` notification goes out now rather than at the next poll.
                self.announce_lease_change();
                self.wake_publisher();
                self.wake_webhooks();
                view
            }
            None => self.write_new_lease_alone(&plan).await?,
        };
        tracing::info!(lease.id = %view.lease.id, project.id = %view.lease.project_id, "lease created");
        self.wake_for(&view);
        Ok(view)
    }

    /// Writes a validated new lease in a transaction of its own (re-run if it lost a race).
    pub(crate) async fn write_new_lease_alone(&self, plan: &LeasePlan) -> ServiceResult<LeaseView> {
        in_tx!(self, write, |tx| { self.write_new_lease(tx, plan).await })
    }

    /// Writes a validated new lease, its reservations with their allocations, and its events,
    /// in `tx`. Returns the lease as written.
    pub(crate) async fn write_new_lease(
        &self,
        tx: &mut Tx,
        plan: &LeasePlan,
    ) -> ServiceResult<LeaseView> {
        let earliest = matches!(plan.dates, PlanDates::Earliest(_));
        let limits = self.take_quota_turn(tx, &plan.identity.project_id).await?;
        let CreatePlan { window, before_end } = match &plan.dates {
            PlanDates::Fixed(dates) => *dates,
            PlanDates::Earliest(earliest) => self.earliest_dates(tx, plan, earliest).await?,
        };
        // Whole seconds (Service::now), as stored: the view built here equals a read.
        let created = self.now();
        let asked = window.start();
        let start = clear_of_early_ends(tx, asked, created).await?;
        let mut window = TimeWindow::new(start, window.end()).unwrap_or(window);
        let blocked_until = window.end() + self.settings().cleaning();
        let mut lease = Lease {
            id: new_id(),
            name: plan.name.clone(),
            user_id: plan.identity.user_id.clone(),
            project_id: plan.identity.project_id.clone(),
            trust_id: plan.trust.clone().unwrap_or_else(new_trust_id),
            keystone_trust: plan.trust.is_some(),
            start: window.start(),
            end: window.end(),
            status: LeaseStatus::Pending,
            degraded: false,
            created_at: created,
            updated_at: Some(created),
        };
        tx.insert_lease(&lease).await?;
        let mut reservations = Vec::with_capacity(plan.requests.len());
        for (i, spec) in plan.requests.iter().enumerate() {
            let id = new_id();
            let mut spec = spec.clone();
            crate::instance::resolve_flavor(tx, &mut spec).await?;
            spec.assign_ids(&id, new_group_id(self.backend.prepares_reservations()));
            let mut reservation = Reservation {
                id,
                lease_id: lease.id.clone(),
                ordinal: i as i64,
                resource_id: new_id(),
                status: ReservationStatus::Pending,
                missing_resources: false,
                resources_changed: false,
                spec,
                granted_units: 0,
                created_at: created,
                updated_at: Some(created),
            };
            tx.insert_reservation(&reservation).await?;
            let explain = self
                .may_explain(tx, &plan.identity, &reservation.spec)
                .await?;
            let allocation = AllocationRequest {
                lease_id: &lease.id,
                reservation_id: &reservation.id,
                named: ReservationRef::Position(i + 1),
                window,
                blocked_until,
                keep: &[],
                explain,
            };
            // A ranged host request asks for as many as it can get up to max: under a host
            // quota or a monthly budget, as many as they leave (as offers do; never below
            // min, refused below if even that is too many).
            let later_min: i64 = plan.requests[i + 1..]
                .iter()
                .map(|s| match s {
                    ReservationSpec::Host(h) => i64::from(h.min),
                    _ => 0,
                })
                .sum();
            let capped = self
                .capped_host_request(
                    tx,
                    &limits,
                    (&lease.project_id, window),
                    &reservation.spec,
                    (later_min, 0),
                )
                .await?;
            let spec = capped.as_ref().unwrap_or(&reservation.spec);
            let grant = match self.allocate(tx, spec, &allocation).await {
                Ok(grant) => grant,
                // On PostgreSQL an earliest window is found among committed allocations,
                // while an ordinary create may hold a claim on one of its resources, about to
                // commit: a shortfall then says the search is stale, not that the request
                // cannot be met. The whole create runs again and searches anew.
                Err(e) if earliest && tx.backend() == Backend::Postgres && shortfall(&e) => {
                    return Err(ServiceError::Retry(
                        "a resource of the earliest window was taken concurrently".into(),
                    ));
                }
                Err(e) => {
                    let at = ReservationRef::Position(i + 1);
                    return Err(self.finalise_refusal(e, at, &reservation.spec, || Retry {
                        specs: plan.requests.clone(),
                        window,
                        except_lease: None,
                        started: false,
                        owner: None,
                    }));
                }
            };
            reservation.granted_units = grant.units;
            tx.update_reservation(&reservation).await?;
            self.record_reservation_action(
                tx,
                &lease,
                &reservation,
                (ActionKind::Prepare, ActionPurpose::Reserve),
            )
            .await?;
            reservations.push(reservation);
        }
        if asked < window.start()
            && let Some(back) = start_back_in_minute(tx, &lease.id, asked, window.start()).await?
        {
            lease.start = back;
            tx.update_lease(&lease).await?;
            window = TimeWindow::new(back, window.end()).unwrap_or(window);
        }
        let before_end = before_end.map(|t| t.max(window.start()));
        // After every allocation of the lease is written (and under the allocation lock), so
        // the project's use it measures includes this lease and every create before it.
        self.check_quotas(
            tx,
            &lease.project_id,
            &lease.id,
            window,
            QuotaCheck::Create(&limits),
        )
        .await?;
        let mut events = vec![
            new_event(&lease.id, EventType::StartLease, window.start(), created),
            new_event(&lease.id, EventType::EndLease, window.end(), created),
        ];
        if let Some(t) = before_end {
            events.push(new_event(&lease.id, EventType::BeforeEndLease, t, created));
        }
        tx.insert_events(&events).await?;
        // The order a read returns them in (events_of).
        events.sort_by_key(|e| (e.time, e.rank));
        // Built from what was written rather than read back: the writes stay queued until
        // the commit, one round trip for all of them.
        let view = LeaseView {
            lease,
            reservations,
            events,
        };
        self.notify_lease_view(tx, "lease.create", &view).await?;
        Ok(view)
    }

    /// The dates of the earliest window of `search` in which the plan's reservations fit,
    /// read under the allocation lock so that what the search saw stays true until the
    /// allocations are written.
    async fn earliest_dates(
        &self,
        tx: &mut Tx,
        plan: &LeasePlan,
        earliest: &EarliestPlan,
    ) -> ServiceResult<CreatePlan> {
        tx.lock_allocations().await?;
        let search = &earliest.asked;
        let found = match earliest.found_at {
            Some(at) => {
                let from = blazar_core::offer::Search {
                    not_before: at.max(search.not_before),
                    ..search.clone()
                };
                self.first_offer(
                    tx,
                    &plan.identity,
                    &plan.requests,
                    &from,
                    SearchDeadline::from_now(),
                )
                .await?
            }
            None => None,
        };
        let Some(offer) = found else {
            // A concurrent quota the lease goes over on its own: the refusal a create of
            // any window gets.
            let limits = self.project_limits(tx, &plan.identity.project_id).await?;
            let alone = crate::quotas::request_excesses(&limits, &plan.requests);
            if !alone.is_empty() {
                return Err(crate::quotas::refusal(
                    &plan.identity.project_id,
                    alone,
                    RefusalKind::Forbidden,
                ));
            }
            // No single reservation is at fault (together they fit nowhere); each is named
            // with what it asked for.
            let refusal = ServiceError::Conflict(format!(
                "No window of {} minute(s) between {} and {} fits the request",
                search.min_minutes,
                search.not_before.format("%Y-%m-%d %H:%M"),
                search.not_after.format("%Y-%m-%d %H:%M"),
            ));
            return Err(plan
                .requests
                .iter()
                .enumerate()
                .fold(refusal, |e, (i, spec)| {
                    e.with_reason(Reason {
                        reservation: Some(ReservationRef::Position(i + 1)),
                        resource_type: Some(spec.resource_type().to_string()),
                        requested: Some(Requested::of(spec)),
                        ..Reason::default()
                    })
                }));
        };
        let now = truncate_to_minute(self.now());
        Ok(plan_create(
            When::At(offer.window.start()),
            When::At(offer.window.end()),
            None,
            Duration::minutes(self.settings().minutes_before_end_lease),
            now.min(offer.window.start()),
        )?)
    }

    /// The one place where the reasons of a refused allocation are completed, with the
    /// request at hand: which reservation it was (its position in a create, its id in an
    /// update) and what it asked for. Counts are there only if the caller may be told them
    /// (`AllocationRequest::explain`); so is the next offer, searched for `retry` once the
    /// refused transaction is gone ([`Self::with_next_offer`]).
    fn finalise_refusal(
        &self,
        error: ServiceError,
        reservation: ReservationRef,
        spec: &ReservationSpec,
        retry: impl FnOnce() -> Retry,
    ) -> ServiceError {
        let ServiceError::Refused(mut refused) = error else {
            return error;
        };
        for reason in &mut refused.reasons {
            reason.reservation = Some(reservation.clone());
            reason.requested.get_or_insert_with(|| Requested::of(spec));
        }
        if refused.reasons.iter().any(|r| r.availability.is_some()) {
            refused.retry = Some(Box::new(retry()));
        }
        ServiceError::Refused(refused)
    }

    /// `error` with the next offer in its explained reasons: the earliest window of the
    /// refused one's length, starting from its start (or now) within the default search
    /// window, in which every reservation of the lease fits. Searched in a read transaction
    /// of its own, after the refused one, so a refusal never holds the allocation lock
    /// longer; the answer is advice, not a hold. An update of a lease that has started
    /// gets none (it cannot move); the extension check answers how far it can go.
    async fn with_next_offer(&self, identity: &Identity, error: ServiceError) -> ServiceError {
        let ServiceError::Refused(mut refused) = error else {
            return error;
        };
        let Some(retry) = refused.retry.take() else {
            return ServiceError::Refused(refused);
        };
        // Searched and screened as the lease's owner: an update is measured by its project's
        // quotas and its owner's filters, whoever asks for it.
        let owner = match &retry.owner {
            Some((user_id, project_id)) => Identity {
                user_id: user_id.clone(),
                project_id: project_id.clone(),
                roles: identity.roles.clone(),
            },
            None => identity.clone(),
        };
        let identity = &owner;
        // Advice, booked later: see `offers`.
        let now = blazar_core::time::first_whole_minute(self.now());
        // Whole minutes, rounded up: a window from `now` (seconds included) asked for its
        // last part-minute too, and advice is at least as long as what was asked.
        let seconds = (retry.window.end() - retry.window.start()).num_seconds();
        let minutes = (seconds + 59).div_euclid(60);
        let longest = Duration::days(crate::offers::MAX_SEARCH_DAYS).num_minutes();
        if retry.started || !(1..=longest).contains(&minutes) {
            return ServiceError::Refused(refused);
        }
        let not_before = retry.window.start().max(now);
        let mut search = blazar_core::offer::Search {
            not_before,
            not_after: crate::offers::within_the_wire(
                not_before
                    + Duration::days(crate::offers::DEFAULT_SEARCH_DAYS)
                    + Duration::minutes(minutes),
            ),
            min_minutes: minutes,
            max_minutes: minutes,
            cleaning: self.settings().cleaning(),
            order: blazar_core::offer::Order::Earliest,
            limit: 1,
            start_by: None,
        };
        // Only a window the project may book is advice: within its lease-length and
        // start-ahead quotas and the usage filters, as offers are.
        let screen = match self.advice_screen(identity, &mut search).await {
            Ok(Some(screen)) => Some(screen),
            Ok(None) => None,
            Err(e) => {
                tracing::warn!(error = %e, "no next offer for a refusal: the limits were not read");
                None
            }
        };
        let Some(screen) = screen else {
            return ServiceError::Refused(refused);
        };
        let deadline = SearchDeadline::from_now();
        let permit = match self.search_permit(deadline).await {
            Ok(permit) => permit,
            Err(_) => return ServiceError::Refused(refused),
        };
        let found = in_tx!(self, read, |tx| {
            self.find_offers(
                tx,
                identity,
                &retry.specs,
                &search,
                retry.except_lease.as_deref(),
                deadline,
            )
            .await
        });
        drop(permit);
        let next = match found {
            Ok(offers) => match offers.first().map(|o| o.window) {
                Some(w)
                    if self
                        .advice_allowed(identity, &screen, w.start(), w.end())
                        .await =>
                {
                    Some(w)
                }
                _ => None,
            },
            Err(e) => {
                tracing::warn!(error = %e, "no next offer for a refusal: the search failed");
                None
            }
        };
        for reason in &mut refused.reasons {
            if let Some(availability) = &mut reason.availability {
                availability.next_offer = next;
            }
        }
        ServiceError::Refused(refused)
    }

    /// Whether refusals of this reservation may carry counts and reasons for `identity`:
    /// the `blazar:leases:explain_refusal` rule allows it, and a non-admin's queries name no
    /// private property (a count would tell which resources have it).
    pub(crate) async fn may_explain(
        &self,
        tx: &mut Tx,
        identity: &Identity,
        spec: &ReservationSpec,
    ) -> ServiceResult<bool> {
        if !self
            .authorizer
            .allows(EXPLAIN_REFUSAL, identity, &Target::own(identity))
        {
            return Ok(false);
        }
        Ok(!self.hides_resources(tx, identity, spec).await?)
    }

    pub async fn get_lease(&self, identity: &Identity, id: &str) -> ServiceResult<LeaseView> {
        let filter = LeaseFilter {
            id: Some(id.to_string()),
            ..LeaseFilter::default()
        };
        let (lease, reservations, events) = in_tx!(self, read, |tx| {
            Ok(tx.lease_trees(&filter).await?.pop())
        })?
        .ok_or_else(|| lease_not_found(id))?;
        self.check_visible(identity, &lease)?;
        Ok(LeaseView {
            lease,
            reservations,
            events,
        })
    }

    /// What each reservation of a lease was granted (for `?allocations=true`).
    pub async fn lease_grants(
        &self,
        identity: &Identity,
        id: &str,
    ) -> ServiceResult<Vec<blazar_db::GrantRow>> {
        in_tx!(self, read, |tx| {
            let lease = tx.get_lease(id).await?.ok_or_else(|| lease_not_found(id))?;
            self.check_visible(identity, &lease)?;
            Ok(tx.grants_of_lease(id).await?)
        })
    }

    /// The outside-world actions of a lease, oldest first: what was (or is being) done in
    /// the cloud for it, with attempts and the last error.
    pub async fn lease_actions(
        &self,
        identity: &Identity,
        id: &str,
    ) -> ServiceResult<Vec<ActionRecord>> {
        in_tx!(self, read, |tx| {
            let lease = tx.get_lease(id).await?;
            let actions = tx.actions_of_lease(id).await?;
            // A deleted lease's actions stay (its clean-up may still be running, or have
            // failed): they are shown to whoever could see the lease, by its project.
            let project_id = match (&lease, actions.first()) {
                (Some(lease), _) => &lease.project_id,
                (None, Some(action)) => &action.intent.project_id,
                (None, None) => return Err(lease_not_found(id)),
            };
            let user_id = lease.as_ref().map_or("", |l| l.user_id.as_str());
            let target = Target {
                project_id,
                user_id,
            };
            self.authorize("blazar:leases:get", identity, &target)?;
            Ok(actions)
        })
    }

    /// Actions of every lease the caller may see, deleted leases included, newest first:
    /// an admin's view of what failed or is still running in the cloud; a project's own
    /// otherwise (another project's answers none, as lease lists do).
    pub async fn list_actions(
        &self,
        identity: &Identity,
        filter: &ActionFilter,
    ) -> ServiceResult<Vec<ActionRecord>> {
        self.authorize_own("blazar:leases:get", identity)?;
        let mut filter = filter.clone();
        if !self.is_admin(identity) {
            match &filter.project_id {
                Some(p) if *p != identity.project_id => return Ok(Vec::new()),
                _ => filter.project_id = Some(identity.project_id.clone()),
            }
        }
        in_tx!(self, read, |tx| { Ok(tx.list_actions(&filter).await?) })
    }

    /// The resources of `kind` a lease holds through its reservations of that type
    /// (Chameleon's `GET /v1/leases/{id}/hosts|networks|devices`), each once, by id: the
    /// hosts of host reservations (not those lending instance slots), or the pool resources.
    pub async fn lease_resource_ids(
        &self,
        identity: &Identity,
        id: &str,
        kind: &str,
    ) -> ServiceResult<Vec<i64>> {
        in_tx!(self, read, |tx| {
            let lease = tx.get_lease(id).await?.ok_or_else(|| lease_not_found(id))?;
            self.check_visible(identity, &lease)?;
            self.authorize("blazar:leases:get", identity, &lease_target(&lease))?;
            let of_kind: HashSet<String> = tx
                .reservations_of(id)
                .await?
                .into_iter()
                .filter(|r| r.resource_type() == kind)
                .map(|r| r.id)
                .collect();
            let mut ids: Vec<i64> = tx
                .allocations_of_lease(id)
                .await?
                .into_iter()
                .filter(|a| of_kind.contains(&a.reservation_id) && a.resource_type == kind)
                .map(|a| a.resource_id)
                .collect();
            ids.sort_unstable();
            ids.dedup();
            Ok(ids)
        })
    }

    /// The hosts of a lease's host reservations.
    pub async fn lease_hosts(
        &self,
        identity: &Identity,
        id: &str,
    ) -> ServiceResult<Vec<blazar_core::HostRecord>> {
        let ids = self
            .lease_resource_ids(identity, id, blazar_core::PHYSICAL_HOST)
            .await?;
        let admin = self.is_admin(identity);
        in_tx!(self, read, |tx| {
            let private = match admin {
                true => HashSet::new(),
                false => {
                    tx.private_property_names(blazar_core::PHYSICAL_HOST)
                        .await?
                }
            };
            let mut hosts = Vec::with_capacity(ids.len());
            for &host in &ids {
                if let Some(mut h) = tx.get_host(host).await? {
                    // What the host route (admins) shows, less what members are not told:
                    // private properties, and the operator's trust.
                    if !admin {
                        h.capabilities.retain(|k, _| !private.contains(k));
                        h.trust_id.clear();
                    }
                    hosts.push(h);
                }
            }
            Ok(hosts)
        })
    }

    /// The network segments or devices (`kind`) of a lease's reservations of that type.
    pub async fn lease_pool_resources(
        &self,
        identity: &Identity,
        id: &str,
        kind: &str,
    ) -> ServiceResult<Vec<blazar_core::ResourceRecord>> {
        let ids = self.lease_resource_ids(identity, id, kind).await?;
        let admin = self.is_admin(identity);
        in_tx!(self, read, |tx| {
            let private = match admin {
                true => HashSet::new(),
                false => tx.private_property_names(kind).await?,
            };
            Ok(tx
                .list_resources(kind)
                .await?
                .into_iter()
                .filter(|r| ids.binary_search(&r.id).is_ok())
                .map(|mut r| {
                    // Members are not told private properties.
                    r.resource.capabilities.retain(|k, _| !private.contains(k));
                    r
                })
                .collect())
        })
    }

    /// Starts reading the leases the caller may see, narrowed by `filter` (non-admins only
    /// ever see their project): their ids and revisions, in list order, in one read. The
    /// leases themselves are read a batch at a time ([`LeaseList::next_batch`]).
    pub async fn lease_list(
        &self,
        identity: &Identity,
        filter: &LeaseFilter,
    ) -> ServiceResult<LeaseList> {
        self.authorize_own("blazar:leases:get", identity)?;
        let mut filter = filter.clone();
        // A member asking for another project's leases sees none; otherwise only their own.
        let mut none = false;
        if !self.is_admin(identity) {
            match &filter.project_id {
                Some(p) if *p != identity.project_id => none = true,
                _ => filter.project_id = Some(identity.project_id.clone()),
            }
        }
        let leases = if none {
            ListedIds::default()
        } else {
            ListedIds::new(in_tx!(self, read, |tx| {
                Ok(tx.lease_revisions(&filter).await?)
            })?)
        };
        Ok(LeaseList {
            service: self.clone(),
            leases,
            done: 0,
        })
    }

    pub async fn update_lease(
        &self,
        identity: &Identity,
        id: &str,
        update: &LeaseUpdate,
    ) -> ServiceResult<LeaseView> {
        let view = match self.change_lease(identity, id, update, false).await {
            Ok(changed) => changed.view,
            Err(e) => {
                let e = e.explained();
                self.notify_refusal(identity, "lease.update.refused", Some(id), None, &e)
                    .await;
                return Err(self.with_next_offer(identity, e).await);
            }
        };
        tracing::info!(lease.id = %view.lease.id, "lease updated");
        self.wake_for(&view);
        Ok(view)
    }

    /// What [`Self::update_lease`] would answer, the same 200 or refusal, and what the
    /// lease would then hold, with nothing written (its revision and `updated_at` stay) and
    /// nobody told.
    pub async fn dry_run_update_lease(
        &self,
        identity: &Identity,
        id: &str,
        update: &LeaseUpdate,
    ) -> ServiceResult<DryRun> {
        match self.change_lease(identity, id, update, true).await {
            Ok(dry_run) => Ok(dry_run),
            Err(e) => Err(self.with_next_offer(identity, e.explained()).await),
        }
    }

    /// An update in one transaction, rolled back if `dry_run` (then with the grants).
    async fn change_lease(
        &self,
        identity: &Identity,
        id: &str,
        update: &LeaseUpdate,
        dry_run: bool,
    ) -> ServiceResult<DryRun> {
        if let Some(name) = &update.name {
            check_name(name)?;
        }
        // As Blazar: a rename (or nothing) is not put to the filters.
        let filters = if update.moves_anything() {
            self.enforcement.consulted(dry_run)
        } else {
            Vec::new()
        };
        if filters.is_empty() {
            return in_tx!(self, write, dry_run = dry_run, |tx| {
                self.apply_update(tx, identity, id, update, dry_run).await
            });
        }
        // A trial gives the filters the lease before and after; they decide outside every
        // transaction; then the update is carried out (a dry run answers the trial), if the
        // lease is still as the trial read it. Otherwise (another update, a rename, an event
        // came between) what the filters allowed is not what would be written: the trial and
        // the filters run again on the lease as it is now.
        for _ in 0..FILTERED_UPDATE_ATTEMPTS {
            let (trial, current, new, revision) = in_tx!(self, write, dry_run = true, |tx| {
                let revision = revision_of(tx, id).await?;
                let filter = LeaseFilter {
                    id: Some(id.to_string()),
                    ..LeaseFilter::default()
                };
                let before = tx.lease_trees(&filter).await?.pop();
                let held_before = tx.allocations_of_lease(id).await?;
                let held_before =
                    crate::enforcement::resources_by_reservation(tx, &held_before).await?;
                let trial = self.apply_update(tx, identity, id, update, true).await?;
                let Some((lease, reservations, events)) = before else {
                    return Err(lease_not_found(id));
                };
                let before = LeaseView {
                    lease,
                    reservations,
                    events,
                };
                let current = EnforcedLease {
                    start: before.lease.start,
                    end: before.lease.end,
                    values: crate::enforcement::stored_lease_values(&before, &held_before),
                };
                let held_after = tx.allocations_of_lease(id).await?;
                let held_after =
                    crate::enforcement::resources_by_reservation(tx, &held_after).await?;
                let new = update_values(update, &trial.view, &held_after);
                Ok((trial, current, new, revision))
            })?;
            // Blazar's context names the lease's owner, whoever asks.
            let owner = &trial.view.lease;
            let context = self.enforcement.context(&owner.user_id, &owner.project_id);
            for filter in &filters {
                filter
                    .check_update(&context, &current, &new)
                    .await
                    .map_err(|d| crate::enforcement::refusal(filter.name(), d))?;
            }
            if dry_run {
                return Ok(trial);
            }
            let applied = in_tx!(self, write, |tx| {
                // Locked first, so that nothing changes it between the check and the write.
                tx.lock_lease(id).await?;
                if revision_of(tx, id).await? != revision {
                    return Ok(None);
                }
                Ok(Some(
                    self.apply_update(tx, identity, id, update, false).await?,
                ))
            })?;
            if let Some(done) = applied {
                return Ok(done);
            }
        }
        Err(ServiceError::Conflict(format!(
            "Lease {id} kept changing while the update was put to the enforcement filters; \
             try again"
        )))
    }

    /// The update itself, in `tx`; `dry_run` adds what the lease would then be granted.
    async fn apply_update(
        &self,
        tx: &mut Tx,
        identity: &Identity,
        id: &str,
        update: &LeaseUpdate,
        dry_run: bool,
    ) -> ServiceResult<DryRun> {
        {
            let mut lease = tx
                .lock_lease(id)
                .await?
                .ok_or_else(|| lease_not_found(id))?;
            self.authorize_explained("blazar:leases:get", identity, &lease_target(&lease))?;
            // Checked against the lease's project (Blazar checks the caller's own).
            self.authorize_explained("blazar:leases:put", identity, &lease_target(&lease))?;
            let stamp = self.now();
            let events = tx.events_of(&lease.id).await?;
            let mut dates = update.dates();
            let minute = truncate_to_minute(stamp);
            // The minute `now` names, when the start was moved past it (see create).
            let mut asked = None;
            if dates.start == Some(When::Now) && lease.status == LeaseStatus::Pending {
                let start = clear_of_early_ends(tx, minute, stamp).await?;
                asked = (start > minute).then_some(minute);
                dates.start = Some(When::At(start));
            }
            let plan = plan_update(&lease, &events, &dates, minute)?;
            if let Some(name) = &update.name {
                lease.name = name.clone();
            }
            let view = match plan {
                UpdatePlan::Rename => {
                    lease.updated_at = Some(stamp);
                    tx.update_lease(&lease).await?;
                    load_view(tx, lease).await
                }
                UpdatePlan::Reschedule {
                    window,
                    window_changed,
                    moves,
                    new_before_end,
                } => {
                    let baseline = self.quota_baseline(tx, &lease, window).await?;
                    self.change_reservations(
                        tx,
                        identity,
                        &lease,
                        update,
                        (window, window_changed),
                        baseline.as_ref().map(|b| &b.limits),
                        stamp,
                    )
                    .await?;
                    if let Some(baseline) = &baseline {
                        self.check_quotas(
                            tx,
                            &lease.project_id,
                            &lease.id,
                            window,
                            QuotaCheck::Update(baseline),
                        )
                        .await?;
                    }
                    let back = match asked {
                        Some(asked) => {
                            start_back_in_minute(tx, &lease.id, asked, window.start()).await?
                        }
                        None => None,
                    };
                    // Planned again from the earlier start: the events move with it.
                    let (window, moves, new_before_end) = match back {
                        Some(back) => {
                            dates.start = Some(When::At(back));
                            match plan_update(&lease, &events, &dates, minute)? {
                                UpdatePlan::Reschedule {
                                    window,
                                    moves,
                                    new_before_end,
                                    ..
                                } => (window, moves, new_before_end),
                                UpdatePlan::Rename => (window, moves, new_before_end),
                            }
                        }
                        None => (window, moves, new_before_end),
                    };
                    let mut rearmed = false;
                    for EventMove {
                        index,
                        time,
                        status,
                    } in moves
                    {
                        let Some(event) = events.get(index) else {
                            continue;
                        };
                        // Blazar announces a lease-ending notice that will come again.
                        rearmed |= event.event_type == EventType::BeforeEndLease
                            && event.status == EventStatus::Done
                            && status == EventStatus::Undone;
                        let mut event = event.clone();
                        event.time = time;
                        event.status = status;
                        event.updated_at = Some(stamp);
                        tx.update_event(&event).await?;
                    }
                    if let Some(t) = new_before_end {
                        tx.insert_event(&new_event(&lease.id, EventType::BeforeEndLease, t, stamp))
                            .await?;
                    }
                    lease.start = window.start();
                    lease.end = window.end();
                    lease.updated_at = Some(stamp);
                    tx.update_lease(&lease).await?;
                    let view = load_view(tx, lease).await?;
                    // Blazar sends both from inside the update's status transition: the
                    // lease reads UPDATING there, as the update's own answer does.
                    let mut announced = view.clone();
                    announced.lease.status = LeaseStatus::Updating;
                    self.notify_lease_view(tx, "lease.update", &announced)
                        .await?;
                    if rearmed {
                        self.notify_lease_view(tx, "lease.event.before_end_lease.stop", &announced)
                            .await?;
                    }
                    Ok(view)
                }
            }?;
            let grants = if dry_run {
                tx.grants_of_lease(id).await?
            } else {
                Vec::new()
            };
            Ok(DryRun { view, grants })
        }
    }

    /// Carries out the reservation part of an update: the requested changes, validated
    /// against what is stored, and every reservation allocated again whose window or request
    /// changed. An active reservation may grow but not give resources back; what it gains
    /// is handed over at once. A ranged host request is granted no more than the project's
    /// `limits` leave, as at create, and no fewer than it holds.
    #[allow(clippy::too_many_arguments)]
    async fn change_reservations(
        &self,
        tx: &mut Tx,
        identity: &Identity,
        lease: &Lease,
        update: &LeaseUpdate,
        (window, window_changed): (TimeWindow, bool),
        limits: Option<&blazar_core::quota::QuotaValues>,
        stamp: DateTime<Utc>,
    ) -> ServiceResult<()> {
        let reservations = tx.reservations_of(&lease.id).await?;
        // Requested reservation changes, validated against what is stored.
        let mut changes: HashMap<String, ReservationSpec> = HashMap::new();
        if let Some(entries) = &update.reservations {
            let mut invalid = Vec::new();
            for entry in entries {
                let Some(rid) = entry.id().map(str::to_string) else {
                    return Err(ServiceError::BadRequest(
                        "Missing parameter reservation ID".into(),
                    ));
                };
                let Some(stored) = reservations.iter().find(|r| r.id == rid) else {
                    invalid.push(rid);
                    continue;
                };
                if entry.changes_type(stored.resource_type()) {
                    return Err(ServiceError::Conflict(
                        "resource_type cannot be updated".into(),
                    ));
                }
                // Blazar's instance plugin: the flavor of a reservation in force serves
                // running servers, so only the number of slots may change; a reservation
                // in error takes no change.
                let size = blazar_core::reservation::sizing_fields(stored.resource_type());
                if !size.is_empty() {
                    if stored.status == ReservationStatus::Active && entry.sets_any(&size) {
                        return Err(ServiceError::Conflict(
                            "An active reservation only accepts to update amount.".into(),
                        ));
                    }
                    if stored.status == ReservationStatus::Error
                        && (entry.sets_any(&size) || entry.sets_any(&["amount"]))
                    {
                        return Err(ServiceError::Conflict(
                            "An error reservation doesn't accept an updating request.".into(),
                        ));
                    }
                }
                let spec = entry
                    .apply(stored.resource_type(), &stored.spec)
                    .map_err(|e| {
                        ServiceError::from(e).with_reason(Reason {
                            reservation: Some(ReservationRef::Id(rid.clone())),
                            resource_type: Some(stored.resource_type().to_string()),
                            ..Reason::default()
                        })
                    })?;
                changes.insert(rid, spec);
            }
            if !invalid.is_empty() {
                return Err(ServiceError::BadRequest(format!(
                    "Please enter valid reservation IDs. Invalid reservation IDs are: {}",
                    invalid.join(",")
                )));
            }
        }

        let blocked_until = window.end() + self.settings().cleaning();
        let allocations = tx.allocations_of_lease(&lease.id).await?;
        for reservation in reservations.iter() {
            let spec = match changes.get(&reservation.id) {
                Some(changed) => {
                    let mut spec = changed.clone();
                    crate::instance::resolve_flavor(tx, &mut spec).await?;
                    spec.assign_ids(
                        &reservation.id,
                        new_group_id(self.backend.prepares_reservations()),
                    );
                    spec
                }
                None => reservation.spec.clone(),
            };
            if !window_changed && spec == reservation.spec {
                continue;
            }
            let own: Vec<&Allocation> = allocations
                .iter()
                .filter(|a| a.reservation_id == reservation.id)
                .collect();
            // A resource once per unit held there, as `engine::place` keeps instance slots.
            let held: Vec<i64> = own
                .iter()
                .flat_map(|a| {
                    let units = usize::try_from(a.occupancy.units).unwrap_or(0).max(1);
                    std::iter::repeat_n(a.resource_id, units)
                })
                .collect();
            // An active reservation is allocated again from now on: the past is over, and
            // whoever held a resource before (a lease that ended) does not keep a new one
            // from joining. (Everything it holds was allocated by this minute.) What it
            // keeps gets its history back below.
            let window = if reservation.status == ReservationStatus::Active {
                let from = window.start().max(truncate_to_minute(stamp));
                TimeWindow::new(from, window.end()).unwrap_or(window)
            } else {
                window
            };
            tx.delete_allocations_of_reservation(&reservation.id)
                .await?;
            // What the project holds now leaves this reservation out; the lease's other
            // reservations count with what they hold (their minimums are not set aside
            // again). Never fewer than it holds: a project over a limit lowered since keeps
            // its hosts (and is refused only for what the update makes worse).
            let capped = match limits {
                Some(limits) => {
                    self.capped_host_request(
                        tx,
                        limits,
                        (&lease.project_id, window),
                        &spec,
                        (0, held.len()),
                    )
                    .await?
                }
                None => None,
            };
            let explain = self.may_explain(tx, identity, &spec).await?;
            let request = AllocationRequest {
                lease_id: &lease.id,
                reservation_id: &reservation.id,
                named: ReservationRef::Id(reservation.id.clone()),
                window,
                blocked_until,
                keep: &held,
                explain,
            };
            let grant = match self
                .allocate(tx, capped.as_ref().unwrap_or(&spec), &request)
                .await
            {
                Ok(grant) => grant,
                Err(e) => {
                    let at = ReservationRef::Id(reservation.id.clone());
                    return Err(self.finalise_refusal(e, at, &spec, || Retry {
                        specs: reservations
                            .iter()
                            .map(|r| changes.get(&r.id).unwrap_or(&r.spec).clone())
                            .collect(),
                        window,
                        except_lease: Some(lease.id.clone()),
                        started: lease.status != LeaseStatus::Pending,
                        owner: Some((lease.user_id.clone(), lease.project_id.clone())),
                    }));
                }
            };
            if reservation.status == ReservationStatus::Active {
                // Whole resources must all stay; instance slots must stay on their hosts,
                // as many as before (their servers run there), so units count per host.
                let units = |allocations: &mut dyn Iterator<Item = &Allocation>| {
                    let mut by: HashMap<i64, i64> = HashMap::new();
                    for a in allocations {
                        *by.entry(a.resource_id).or_default() += a.occupancy.units.max(1);
                    }
                    by
                };
                let before = units(&mut own.iter().copied());
                let after_rows = tx.allocations_of_lease(&lease.id).await?;
                let after = units(
                    &mut after_rows
                        .iter()
                        .filter(|a| a.reservation_id == reservation.id),
                );
                // A resource it keeps is held since it was first held, as before the update
                // (instance slots only on a host where it holds no more than it did: the
                // added ones were not held before).
                let mut since: HashMap<i64, DateTime<Utc>> = HashMap::new();
                for a in &own {
                    let t = since.entry(a.resource_id).or_insert(a.occupancy.start);
                    *t = (*t).min(a.occupancy.start);
                }
                let restored: Vec<(&Allocation, DateTime<Utc>)> = after_rows
                    .iter()
                    .filter(|a| a.reservation_id == reservation.id)
                    .filter(|a| after.get(&a.resource_id) <= before.get(&a.resource_id))
                    .filter_map(|a| {
                        let t = *since.get(&a.resource_id)?;
                        (t < a.occupancy.start).then_some((a, t))
                    })
                    .collect();
                let mut lost: Vec<i64> = before
                    .iter()
                    .filter(|(id, n)| after.get(id).copied().unwrap_or(0) < **n)
                    .map(|(id, _)| *id)
                    .collect();
                lost.sort_unstable();
                if !lost.is_empty() {
                    let lost = if spec.kind() == spec.resource_type() {
                        resource_names(tx, spec.resource_type(), &lost).await?
                    } else {
                        // Instance slots: the hosts they are on.
                        lost.iter().map(i64::to_string).collect()
                    };
                    let refusal = if spec.resource_type() == blazar_core::reservation::FLOATINGIP {
                        // Blazar's floating-IP plugin answers this one with a 400.
                        ServiceError::BadRequest(format!(
                            "Cannot remove allocations from an active reservation: \
                             reservation {} would give back floating IP(s) {}",
                            reservation.id,
                            lost.join(", ")
                        ))
                    } else if spec.kind() == spec.resource_type() {
                        // Blazar's words first (its plugins answer this one with their
                        // shortfall), so that scripts matching them still do; then which.
                        let bare = if spec.resource_type() == blazar_core::PHYSICAL_HOST {
                            crate::resources::NOT_ENOUGH_HOSTS.to_string()
                        } else {
                            crate::pool::bare_refusal(spec.resource_type())
                        };
                        ServiceError::Conflict(format!(
                            "{bare}: reservation {} is active and would lose resource(s) {}; \
                             an active reservation can grow but not give resources back",
                            reservation.id,
                            lost.join(", ")
                        ))
                    } else {
                        // Blazar's words (its servers run on those hosts), then which.
                        ServiceError::Conflict(format!(
                            "Instance reservation doesn't allow to reduce/replace reserved \
                             instance slots when the reservation is in active status. \
                             Reservation {} would give back slots on host(s) {}.",
                            reservation.id,
                            lost.join(", ")
                        ))
                    };
                    return Err(refusal.with_reason(Reason {
                        reservation: Some(ReservationRef::Id(reservation.id.clone())),
                        resource_type: Some(spec.resource_type().to_string()),
                        requested: Some(Requested::of(&spec)),
                        ..Reason::default()
                    }));
                }
                tx.restore_allocation_starts(&restored).await?;
                self.hand_over_added(
                    tx,
                    lease,
                    reservation,
                    // New resources, and hosts given more slots than they had (the
                    // backend sets a host's slots from all the reservation holds there).
                    |a| {
                        before.get(&a.resource_id).copied().unwrap_or(0)
                            < after.get(&a.resource_id).copied().unwrap_or(0)
                    },
                    stamp,
                )
                .await?;
            }
            let mut changed = reservation.clone();
            changed.spec = spec;
            changed.granted_units = grant.units;
            changed.updated_at = Some(stamp);
            tx.update_reservation(&changed).await?;
        }

        Ok(())
    }

    /// Deletes a lease in any status, taking back what it holds first.
    pub async fn delete_lease(&self, identity: &Identity, id: &str) -> ServiceResult<()> {
        in_tx!(self, write, |tx| {
            let lease = tx
                .lock_lease(id)
                .await?
                .ok_or_else(|| lease_not_found(id))?;
            self.check_visible(identity, &lease)?;
            self.authorize("blazar:leases:delete", identity, &lease_target(&lease))?;
            let now = self.now();
            let reservations = tx.reservations_of(&lease.id).await?;
            let allocations = tx.allocations_of_lease(&lease.id).await?;
            let events = tx.events_of(&lease.id).await?;
            // Hand-overs nobody has started are dropped; whatever may have been handed over
            // (the lease started, or is starting) is taken back after commit.
            tx.cancel_pending_actions(&lease.id, ActionKind::Start.as_str(), now)
                .await?;
            let started = event_status(&events, EventType::StartLease) != EventStatus::Undone;
            let ended = event_status(&events, EventType::EndLease) != EventStatus::Undone;
            // Reservations whose hand-overs were all just cancelled, none of them tried (a
            // delete at the very minute of the start): nothing of theirs reached the cloud,
            // so there is nothing to take back.
            let actions = if started && !ended {
                tx.actions_of_lease(&lease.id).await?
            } else {
                Vec::new()
            };
            let never_handed_over = |reservation: &Reservation| {
                let starts: Vec<_> = actions
                    .iter()
                    .filter(|a| {
                        a.intent.kind == ActionKind::Start
                            && a.intent.reservation_id == reservation.id
                    })
                    .collect();
                !starts.is_empty() && starts.iter().all(|a| a.status == ActionStatus::Cancelled)
            };
            for reservation in &reservations {
                if started && ended {
                    // The end recorded the take-back of everything (a reservation in ERROR
                    // included). Another one now would come after the next lease's
                    // hand-over of the same resources, and undo it.
                    continue;
                }
                if !started || never_handed_over(reservation) {
                    // Nothing was handed over; only what was prepared goes.
                    self.record_reservation_action(
                        tx,
                        &lease,
                        reservation,
                        (ActionKind::Release, ActionPurpose::Delete),
                    )
                    .await?;
                    continue;
                }
                if reservation.status == ReservationStatus::Deleted {
                    continue;
                }
                let held: Vec<Allocation> = allocations
                    .iter()
                    .filter(|a| a.reservation_id == reservation.id)
                    .cloned()
                    .collect();
                self.record_take_back(tx, &lease, reservation, ActionPurpose::Delete, &held, now)
                    .await?;
            }
            // Blazar tells usage enforcement of a delete unless the lease already ended.
            if !(started && ended) && self.enforcement.wants_on_end() {
                let view = LeaseView {
                    lease: lease.clone(),
                    reservations: reservations.clone(),
                    events: events.clone(),
                };
                self.record_on_end(tx, &view, &allocations).await?;
            }
            // After the lease's other actions, which may still act through it.
            self.record_trust_deletion(tx, &lease).await?;
            self.notify_lease_deleted(tx, &lease, reservations, events)
                .await?;
            tx.delete_lease(&lease.id).await?;
            Ok(())
        })?;
        tracing::info!(lease.id = %id, "lease deleted");
        Ok(())
    }
}

/// How a message names resources of `kind` by their internal ids: hosts by their ids,
/// floating IPs by their addresses, segments and devices by the ids the API shows.
async fn resource_names(tx: &mut Tx, kind: &str, ids: &[i64]) -> ServiceResult<Vec<String>> {
    if kind == blazar_core::PHYSICAL_HOST {
        return Ok(ids.iter().map(i64::to_string).collect());
    }
    let records = tx.resources_named(kind, ids).await?;
    let by_id: HashMap<i64, &blazar_core::ResourceRecord> =
        records.iter().map(|r| (r.id, r)).collect();
    Ok(ids
        .iter()
        .map(|id| match by_id.get(id) {
            Some(r) if kind == blazar_core::reservation::FLOATINGIP => r.resource.display_name(),
            Some(r) => r.resource.uid.clone(),
            None => id.to_string(),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::ListedIds;

    #[test]
    fn listed_ids_give_back_each_id_and_revision_in_order() {
        let ids = ListedIds::new(vec![
            ("a".to_owned(), 3),
            ("".to_owned(), 1),
            ("0ae1cd01-737a-4d15-9f14-4222a04d503d".to_owned(), 7),
        ]);
        assert_eq!(ids.len(), 3);
        assert_eq!(ids.get(0), Some(("a", 3)));
        assert_eq!(ids.get(1), Some(("", 1)));
        assert_eq!(
            ids.get(2),
            Some(("0ae1cd01-737a-4d15-9f14-4222a04d503d", 7))
        );
        assert_eq!(ids.get(3), None);
        assert_eq!(ListedIds::default().get(0), None);
    }
}
