//! Lease use cases: create, show, list, update, delete.

use std::collections::{HashMap, HashSet};

use blazar_core::LeaseFilter;
use blazar_core::lease::{
    CreatePlan, DatesRequest, EventMove, UpdatePlan, When, event_status, plan_create, plan_update,
};
use blazar_core::reservation::FlavorChoice;
use blazar_core::time::truncate_to_minute;
use blazar_core::{
    ActionKind, ActionPurpose, EventStatus, EventType, LeaseStatus, ReservationSpec,
    ReservationStatus, TimeWindow,
};
use blazar_core::{Allocation, Event, Lease, LeaseView, Reservation};
use blazar_db::Tx;
use chrono::{DateTime, Duration, Utc};
use serde_json::{Map, Value};

use crate::policy::Target;
use crate::resources::AllocationRequest;
use crate::{
    Identity, Reason, Requested, ReservationRef, Service, ServiceError, ServiceResult, new_id,
};

/// The policy rule deciding whether a refused create or update says why.
pub const EXPLAIN_REFUSAL: &str = "blazar:leases:explain_refusal";

/// Longest lease name Blazar's schema holds.
pub const MAX_LEASE_NAME_LEN: usize = 80;

#[derive(Debug, Clone)]
pub struct NewLease {
    pub name: String,
    pub start: When,
    pub end: When,
    pub before_end: Option<DateTime<Utc>>,
    /// Reservation requests as sent: `resource_type` plus the fields of that type.
    pub reservations: Vec<Map<String, Value>>,
    /// Book the earliest window of this search instead of `start` and `end`
    /// (`start_date: "earliest"`), found and booked in one transaction.
    pub earliest: Option<crate::offers::SearchWindow>,
}

#[derive(Debug, Clone, Default)]
pub struct LeaseUpdate {
    pub name: Option<String>,
    pub start: Option<When>,
    pub end: Option<When>,
    pub before_end: Option<DateTime<Utc>>,
    /// Changes to reservations, each with the `id` of the reservation it changes.
    pub reservations: Option<Vec<Map<String, Value>>>,
}

impl LeaseUpdate {
    fn dates(&self) -> DatesRequest {
        DatesRequest {
            start: self.start,
            end: self.end,
            before_end: self.before_end,
            changes_reservations: self.reservations.is_some(),
        }
    }
}

/// One lease of a list read with [`Service::list_leases_reusing`].
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

/// How long a lease create waits for the cloud to make its instance reservations' server
/// groups (as host enrolment waits for the freepool).
const PREPARE_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// A lease create that passed validation: everything its transaction needs.
pub(crate) struct LeasePlan {
    identity: Identity,
    name: String,
    dates: PlanDates,
    requests: Vec<ReservationSpec>,
}

/// When a new lease takes place.
enum PlanDates {
    /// The dates asked for, checked.
    Fixed(CreatePlan),
    /// The earliest window of a search, decided in the writing transaction, so that no
    /// concurrent create can take it in between.
    Earliest(blazar_core::offer::Search),
}

pub(crate) fn check_name(name: &str) -> ServiceResult<()> {
    if name.trim().is_empty() {
        return Err(
            ServiceError::BadRequest("The lease name must not be empty".into())
                .with_reason(Reason::field("name")),
        );
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

/// The id of a new reservation's server group, until the cloud gives it one.
fn new_group_id() -> String {
    uuid::Uuid::new_v4().to_string()
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

    pub(crate) fn validated_requests(
        &self,
        requests: &[Map<String, Value>],
    ) -> ServiceResult<Vec<ReservationSpec>> {
        requests
            .iter()
            .enumerate()
            .map(|(i, request)| {
                let kind = match request.get("resource_type") {
                    Some(Value::String(s)) => s.as_str(),
                    None | Some(Value::Null) => {
                        return Err(ServiceError::BadRequest(format!(
                            "Missing parameter resource_type in reservation {}",
                            i + 1
                        )));
                    }
                    Some(other) => {
                        return Err(ServiceError::BadRequest(format!(
                            "Malformed parameter resource_type in reservation {}: expected a string, got {other}",
                            i + 1
                        )));
                    }
                };
                ReservationSpec::parse(kind, request, None).map_err(|e| {
                    ServiceError::from(e).with_reason(Reason {
                        reservation: Some(ReservationRef::Position(i + 1)),
                        resource_type: Some(kind.to_string()),
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
        async {
            let plan = self.plan_lease(identity, request).await?;
            let view = match &self.batcher {
                Some(batcher) => batcher.create(self, plan).await?,
                None => self.write_new_lease_alone(&plan).await?,
            };
            tracing::info!(lease.id = %view.lease.id, project.id = %view.lease.project_id, "lease created");
            self.wake_for(&view);
            self.with_groups_made(identity, view).await
        }
        .await
        .map_err(ServiceError::explained)
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
        async {
            let plan = self.plan_lease(identity, request).await?;
            in_tx!(self, write, dry_run = true, |tx| {
                let view = self.write_new_lease(tx, &plan).await?;
                let grants = tx.grants_of_lease(&view.lease.id).await?;
                Ok(DryRun { view, grants })
            })
        }
        .await
        .map_err(ServiceError::explained)
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
        let dates = match &request.earliest {
            Some(search) => PlanDates::Earliest(search.resolve(
                now,
                self.settings().cleaning(),
                blazar_core::offer::Order::Earliest,
                1,
            )?),
            None => PlanDates::Fixed(plan_create(
                request.start,
                request.end,
                request.before_end,
                Duration::minutes(self.settings().minutes_before_end_lease),
                now,
            )?),
        };
        let mut requests = self.validated_requests(&request.reservations)?;
        self.ask_cloud_for_flavors(identity, &mut requests).await?;
        Ok(LeasePlan {
            identity: identity.clone(),
            name: request.name.clone(),
            dates,
            requests,
        })
    }

    /// Blazar answers a lease create once the server groups of its instance reservations
    /// exist, with the ids Nova gave them (users pass one as the `group` hint). Where the
    /// backend makes them, the create waits for those `prepare` actions, at most
    /// [`PREPARE_WAIT`]; after that the ids appear when the actions are done.
    async fn with_groups_made(
        &self,
        identity: &Identity,
        view: LeaseView,
    ) -> ServiceResult<LeaseView> {
        if !self.backend.prepares_reservations() {
            return Ok(view);
        }
        let grouped: HashSet<&str> = view
            .reservations
            .iter()
            .filter(|r| {
                r.spec
                    .instance_ids()
                    .is_some_and(|ids| ids.server_group_id.is_some())
            })
            .map(|r| r.id.as_str())
            .collect();
        if grouped.is_empty() {
            return Ok(view);
        }
        let lease_id = view.lease.id.clone();
        let actions = in_tx!(self, read, |tx| {
            Ok(tx.actions_of_lease(&lease_id).await?)
        })?;
        for action in actions.iter().filter(|a| {
            a.kind == ActionKind::Prepare
                && grouped.contains(a.reservation_id.as_str())
                && a.status.is_open()
        }) {
            self.see_through(action.seq, PREPARE_WAIT).await?;
        }
        self.get_lease(identity, &lease_id).await
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
        let CreatePlan { window, before_end } = match &plan.dates {
            PlanDates::Fixed(dates) => *dates,
            PlanDates::Earliest(search) => self.earliest_dates(tx, plan, search).await?,
        };
        let blocked_until = window.end() + self.settings().cleaning();
        // Whole seconds (Service::now), as stored: the view built here equals a read.
        let created = self.now();
        let lease = Lease {
            id: new_id(),
            name: plan.name.clone(),
            user_id: plan.identity.user_id.clone(),
            project_id: plan.identity.project_id.clone(),
            trust_id: new_trust_id(),
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
            spec.assign_ids(&id, new_group_id);
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
                ordinal: i + 1,
                window,
                blocked_until,
                keep: &[],
                explain,
            };
            let grant = match self.allocate(tx, &reservation.spec, &allocation).await {
                Ok(grant) => grant,
                Err(e) => {
                    let at = ReservationRef::Position(i + 1);
                    return Err(self
                        .finalise_refusal(tx, &plan.identity, e, at, &reservation.spec, &allocation)
                        .await);
                }
            };
            reservation.granted_units = grant.units;
            tx.update_reservation(&reservation).await?;
            self.record_reservation_action(
                tx,
                &lease,
                &reservation,
                ActionKind::Prepare,
                ActionPurpose::Reserve,
            )
            .await?;
            reservations.push(reservation);
        }
        let mut events = vec![
            new_event(&lease.id, EventType::StartLease, window.start(), created),
            new_event(&lease.id, EventType::EndLease, window.end(), created),
        ];
        if let Some(t) = before_end {
            events.push(new_event(&lease.id, EventType::BeforeEndLease, t, created));
        }
        for event in &events {
            tx.insert_event(event).await?;
        }
        // The order a read returns them in (events_of).
        events.sort_by_key(|e| (e.time, e.rank));
        // Built from what was written rather than read back: the writes stay queued until
        // the commit, one round trip for all of them.
        Ok(LeaseView {
            lease,
            reservations,
            events,
        })
    }

    /// The dates of the earliest window of `search` in which the plan's reservations fit,
    /// read under the allocation lock so that what the search saw stays true until the
    /// allocations are written.
    async fn earliest_dates(
        &self,
        tx: &mut Tx,
        plan: &LeasePlan,
        search: &blazar_core::offer::Search,
    ) -> ServiceResult<CreatePlan> {
        tx.lock_allocations().await?;
        let found = self
            .find_offers(tx, &plan.identity, &plan.requests, search, None)
            .await?;
        let Some(offer) = found.first() else {
            return Err(ServiceError::Conflict(format!(
                "No window of {} minute(s) between {} and {} fits the request",
                search.min_minutes,
                search.not_before.format("%Y-%m-%d %H:%M"),
                search.not_after.format("%Y-%m-%d %H:%M"),
            )));
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
    /// (`AllocationRequest::explain`); so will be the next offer.
    async fn finalise_refusal(
        &self,
        _tx: &mut Tx,
        _identity: &Identity,
        error: ServiceError,
        reservation: ReservationRef,
        spec: &ReservationSpec,
        _request: &AllocationRequest<'_>,
    ) -> ServiceError {
        let ServiceError::Refused(mut refused) = error else {
            return error;
        };
        for reason in &mut refused.reasons {
            reason.reservation = Some(reservation.clone());
            reason.requested.get_or_insert_with(|| Requested::of(spec));
            if let Some(availability) = &mut reason.availability {
                // Hook for the offer search: the next window of the same length in which
                // `spec` fits, searched in `_tx` for `_identity` from `_request.window`.
                availability.next_offer = None;
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
        if self.is_admin(identity) {
            return Ok(true);
        }
        let keys = spec.query_keys();
        if keys.is_empty() {
            return Ok(true);
        }
        let private = tx.private_property_names(spec.kind()).await?;
        Ok(!keys.iter().any(|k| private.contains(*k)))
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
    ) -> ServiceResult<Vec<blazar_core::ActionRecord>> {
        in_tx!(self, read, |tx| {
            let lease = tx.get_lease(id).await?.ok_or_else(|| lease_not_found(id))?;
            self.check_visible(identity, &lease)?;
            self.authorize("blazar:leases:get", identity, &lease_target(&lease))?;
            Ok(tx.actions_of_lease(id).await?)
        })
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
        in_tx!(self, read, |tx| {
            let mut hosts = Vec::with_capacity(ids.len());
            for &host in &ids {
                if let Some(h) = tx.get_host(host).await? {
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
        in_tx!(self, read, |tx| {
            Ok(tx
                .list_resources(kind)
                .await?
                .into_iter()
                .filter(|r| ids.binary_search(&r.id).is_ok())
                .collect())
        })
    }

    /// Leases the caller may see, narrowed by `filter`; non-admins only ever see their
    /// project. For a caller that keeps what it rendered of each lease: `kept(id, revision)`
    /// returns the caller's rendering of that lease at that revision, if it has one, and only
    /// the other leases are read whole. A lease's revision moves with every committed change
    /// to it, its reservations or its events, so a kept rendering is never stale. One read
    /// transaction.
    pub async fn list_leases_reusing<T>(
        &self,
        identity: &Identity,
        filter: &LeaseFilter,
        kept: impl Fn(&str, i64) -> Option<T>,
    ) -> ServiceResult<Vec<Listed<T>>> {
        self.authorize_own("blazar:leases:get", identity)?;
        let mut filter = filter.clone();
        if !self.is_admin(identity) {
            match &filter.project_id {
                Some(p) if *p != identity.project_id => return Ok(Vec::new()),
                _ => filter.project_id = Some(identity.project_id.clone()),
            }
        }
        in_tx!(self, read, |tx| {
            let revisions = tx.lease_revisions(&filter).await?;
            let mut listed: Vec<Option<Listed<T>>> = Vec::with_capacity(revisions.len());
            let mut missing = Vec::new();
            for (id, revision) in &revisions {
                let found = kept(id, *revision).map(Listed::Kept);
                if found.is_none() {
                    missing.push(id.clone());
                }
                listed.push(found);
            }
            if missing.is_empty() {
                return Ok(listed.into_iter().flatten().collect());
            }
            let trees = tx
                .revised_lease_trees(&LeaseFilter {
                    ids: Some(missing),
                    ..LeaseFilter::default()
                })
                .await?;
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
            // A lease deleted between the two reads (PostgreSQL reads each statement's
            // committed state) is left out, as a later list would.
            Ok(revisions
                .iter()
                .zip(listed)
                .filter_map(|((id, _), found)| found.or_else(|| fresh.remove(id)))
                .collect())
        })
    }

    pub async fn update_lease(
        &self,
        identity: &Identity,
        id: &str,
        update: &LeaseUpdate,
    ) -> ServiceResult<LeaseView> {
        let view = self
            .change_lease(identity, id, update, false)
            .await
            .map_err(ServiceError::explained)?
            .view;
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
        self.change_lease(identity, id, update, true)
            .await
            .map_err(ServiceError::explained)
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
        in_tx!(self, write, dry_run = dry_run, |tx| {
            let mut lease = tx
                .lock_lease(id)
                .await?
                .ok_or_else(|| lease_not_found(id))?;
            self.authorize_explained("blazar:leases:get", identity, &lease_target(&lease))?;
            // Checked against the lease's project (Blazar checks the caller's own).
            self.authorize_explained("blazar:leases:put", identity, &lease_target(&lease))?;
            let stamp = self.now();
            let events = tx.events_of(&lease.id).await?;
            let plan = plan_update(&lease, &events, &update.dates(), truncate_to_minute(stamp))?;
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
                    self.change_reservations(
                        tx,
                        identity,
                        &lease,
                        update,
                        window,
                        window_changed,
                        stamp,
                    )
                    .await?;
                    for EventMove {
                        index,
                        time,
                        status,
                    } in moves
                    {
                        let Some(event) = events.get(index) else {
                            continue;
                        };
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
                    load_view(tx, lease).await
                }
            }?;
            let grants = if dry_run {
                tx.grants_of_lease(id).await?
            } else {
                Vec::new()
            };
            Ok(DryRun { view, grants })
        })
    }

    /// Carries out the reservation part of an update: the requested changes, validated
    /// against what is stored, and every reservation allocated again whose window or request
    /// changed. An active reservation may grow but not give resources back; what it gains
    /// is handed over at once.
    #[allow(clippy::too_many_arguments)]
    async fn change_reservations(
        &self,
        tx: &mut Tx,
        identity: &Identity,
        lease: &Lease,
        update: &LeaseUpdate,
        window: TimeWindow,
        window_changed: bool,
        stamp: DateTime<Utc>,
    ) -> ServiceResult<()> {
        let reservations = tx.reservations_of(&lease.id).await?;
        // Requested reservation changes, validated against what is stored.
        let mut changes: HashMap<String, ReservationSpec> = HashMap::new();
        if let Some(entries) = &update.reservations {
            let mut invalid = Vec::new();
            for entry in entries {
                let rid = match entry.get("id") {
                    Some(Value::String(s)) => s.clone(),
                    _ => {
                        return Err(ServiceError::BadRequest(
                            "Missing parameter reservation ID".into(),
                        ));
                    }
                };
                let Some(stored) = reservations.iter().find(|r| r.id == rid) else {
                    invalid.push(rid);
                    continue;
                };
                if let Some(kind) = entry.get("resource_type")
                    && kind.as_str() != Some(stored.resource_type())
                {
                    return Err(ServiceError::Conflict(format!(
                        "resource_type cannot be updated (reservation {rid} is {})",
                        stored.resource_type()
                    )));
                }
                let spec =
                    ReservationSpec::parse(stored.resource_type(), entry, Some(&stored.spec))
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
                    invalid.join(", ")
                )));
            }
        }

        let blocked_until = window.end() + self.settings().cleaning();
        let allocations = tx.allocations_of_lease(&lease.id).await?;
        for (i, reservation) in reservations.iter().enumerate() {
            let spec = match changes.get(&reservation.id) {
                Some(changed) => {
                    let mut spec = changed.clone();
                    crate::instance::resolve_flavor(tx, &mut spec).await?;
                    spec.assign_ids(&reservation.id, new_group_id);
                    spec
                }
                None => reservation.spec.clone(),
            };
            if !window_changed && spec == reservation.spec {
                continue;
            }
            let held: Vec<i64> = allocations
                .iter()
                .filter(|a| a.reservation_id == reservation.id)
                .map(|a| a.resource_id)
                .collect();
            tx.delete_allocations_of_reservation(&reservation.id)
                .await?;
            let explain = self.may_explain(tx, identity, &spec).await?;
            let request = AllocationRequest {
                lease_id: &lease.id,
                reservation_id: &reservation.id,
                ordinal: i + 1,
                window,
                blocked_until,
                keep: &held,
                explain,
            };
            let grant = match self.allocate(tx, &spec, &request).await {
                Ok(grant) => grant,
                Err(e) => {
                    let at = ReservationRef::Id(reservation.id.clone());
                    return Err(self
                        .finalise_refusal(tx, identity, e, at, &spec, &request)
                        .await);
                }
            };
            if reservation.status == ReservationStatus::Active {
                let chosen_set: HashSet<i64> = grant.resources.iter().copied().collect();
                let lost: Vec<String> = held
                    .iter()
                    .filter(|h| !chosen_set.contains(h))
                    .map(|h| h.to_string())
                    .collect();
                if !lost.is_empty() {
                    return Err(ServiceError::Conflict(format!(
                        "Reservation {} is active and would lose resource(s) {}; an active \
                         reservation can grow but not give resources back",
                        i + 1,
                        lost.join(", ")
                    ))
                    .with_reason(Reason {
                        reservation: Some(ReservationRef::Id(reservation.id.clone())),
                        resource_type: Some(spec.kind().to_string()),
                        requested: Some(Requested::of(&spec)),
                        ..Reason::default()
                    }));
                }
                self.hand_over_added(
                    tx,
                    lease,
                    reservation,
                    |a| !held.contains(&a.resource_id),
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
            for reservation in &reservations {
                if !started {
                    // Nothing was handed over; only what was prepared goes.
                    self.record_reservation_action(
                        tx,
                        &lease,
                        reservation,
                        ActionKind::Release,
                        ActionPurpose::Delete,
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
                self.record_action(
                    tx,
                    &lease,
                    reservation,
                    ActionKind::Stop,
                    ActionPurpose::Delete,
                    &held,
                    now,
                )
                .await?;
            }
            tx.delete_lease(&lease.id).await?;
            Ok(())
        })?;
        tracing::info!(lease.id = %id, "lease deleted");
        Ok(())
    }
}
