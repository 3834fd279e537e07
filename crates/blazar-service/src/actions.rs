//! Outside-world actions: recorded in the transaction that decides them, carried out after
//! commit by workers (bounded concurrency, retries with backoff, one claim per action among
//! replicas), and finished in a short transaction that moves the lease on.
//!
//! A lease start records one `start` action per reservation (per resource type it holds) and
//! leaves the start event `IN_PROGRESS` and the lease `STARTING`; once none of them is open,
//! the event is `DONE` and the lease `ACTIVE`, or both `ERROR` if one failed for good. A lease
//! end does the same with `stop` actions, `TERMINATING` and `TERMINATED`. Updates, healing
//! and re-allocation record `change` actions; a delete records `delete` ones and cancels the
//! starts nobody has taken yet, so deleting works whatever state the actions are in.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;

use blazar_core::lease::event_status;
use blazar_core::{
    ACTION_LOST_ATTEMPTS, ActionKind, ActionPurpose, EventStatus, EventType, LeaseStatus,
    ReservationStatus, action_backoff,
};
use blazar_core::{ActionIntent, ActionRecord};
use blazar_core::{Allocation, Lease, LeaseView, Reservation};
use blazar_core::{MadeIds, ReservationSpec};
use blazar_db::{ActionOutcome, NewAction, Tx};
use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use tokio::task::JoinSet;

use crate::backend::{Action, ActionError, ActionOutput, HandoverChange};
use crate::leases::lock_views;
use crate::{Service, ServiceError, ServiceResult};

/// What a run of the workers did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ActionReport {
    pub done: usize,
    pub retried: usize,
    pub failed: usize,
}

/// One attempt at a claimed action, as the backend answered it; recorded afterwards,
/// possibly with others in one transaction.
struct Attempt {
    row: ActionRecord,
    outcome: ActionOutcome,
    output: ActionOutput,
    at: DateTime<Utc>,
}

/// Writes the hand-over records a done action changed.
async fn record_handovers(tx: &mut Tx, changes: &[HandoverChange]) -> ServiceResult<()> {
    for change in changes {
        match change {
            HandoverChange::Start(handover) => tx.start_handover(handover).await?,
            HandoverChange::End {
                reservation_id,
                resource_id,
                at,
            } => {
                tx.end_handovers(reservation_id, Some(*resource_id), *at)
                    .await?;
            }
        }
    }
    Ok(())
}

/// Whether `reservation` has something in the cloud before it starts, with a backend that
/// prepares reservations (hosts: an aggregate; instances: a flavor, a group and a resource
/// class).
fn prepared(reservation: &Reservation) -> bool {
    [
        blazar_core::PHYSICAL_HOST,
        crate::instance::VIRTUAL_INSTANCE,
        crate::instance::FLAVOR_INSTANCE,
    ]
    .contains(&reservation.resource_type())
}

/// An attempt whose action is over: done, or failed for good with `failure`.
struct Finished<'a> {
    attempt: &'a Attempt,
    failure: Option<&'a str>,
}

impl Finished<'_> {
    /// Whether its end moves its reservation, event and lease on (hand-overs, take-backs
    /// and changes do; actions in the cloud that nothing waits for do not).
    fn moves_statuses(&self) -> bool {
        !matches!(
            self.attempt.row.intent.purpose,
            ActionPurpose::Delete
                | ActionPurpose::Inventory
                | ActionPurpose::Reserve
                | ActionPurpose::BeforeEnd
                | ActionPurpose::Enforcement
        )
    }

    /// The ids of what a done action made for its reservation, if any.
    fn made(&self) -> Option<&MadeIds> {
        let made = &self.attempt.output.made;
        if self.failure.is_some()
            || self.attempt.row.intent.reservation_id.is_empty()
            || made.is_empty()
        {
            return None;
        }
        Some(made)
    }
}

/// The in-progress `event_type` event of `events`, marked done (ERROR if one of its
/// actions failed) when none of them is open any more (`counts`: open, failed); `None`
/// while some are, or when there is no such event.
fn conclude_event(
    events: &mut [blazar_core::Event],
    event_type: EventType,
    (open, failed): (i64, i64),
    now: DateTime<Utc>,
) -> Option<&blazar_core::Event> {
    if open > 0 {
        return None;
    }
    let event = events
        .iter_mut()
        .find(|e| e.event_type == event_type && e.status == EventStatus::InProgress)?;
    event.status = if failed > 0 {
        EventStatus::Error
    } else {
        EventStatus::Done
    };
    event.updated_at = Some(now);
    Some(event)
}

impl Attempt {
    fn count(&self, report: &mut ActionReport) {
        match self.outcome {
            ActionOutcome::Done => report.done += 1,
            ActionOutcome::Retry { .. } => report.retried += 1,
            ActionOutcome::Failed { .. } | ActionOutcome::GaveUp { .. } => report.failed += 1,
        }
    }
}

/// Most attempts recorded in one transaction: enough to absorb a burst, few enough that
/// the write lock is held for milliseconds.
const ATTEMPTS_PER_TRANSACTION: usize = 64;

tokio::task_local! {
    /// The request id of the API call being served, recorded on the actions it causes.
    pub static REQUEST_ID: String;
}

/// Runs `fut` with `id` as the request id that actions it records carry.
pub async fn with_request_id<F: Future>(id: String, fut: F) -> F::Output {
    REQUEST_ID.scope(id, fut).await
}

/// The request id of the API call (or action) being served, if any: outbound calls send it
/// as `X-OpenStack-Request-Id`, so the called service logs the same global id.
pub fn current_request_id() -> Option<String> {
    REQUEST_ID.try_with(Clone::clone).ok()
}

/// The lease status the events imply, with the transitional states of running actions.
fn status_from_events(events: &[blazar_core::Event]) -> LeaseStatus {
    let (start, end) = (
        event_status(events, EventType::StartLease),
        event_status(events, EventType::EndLease),
    );
    match (start, end) {
        (_, EventStatus::InProgress) => LeaseStatus::Terminating,
        (EventStatus::InProgress, _) => LeaseStatus::Starting,
        _ => LeaseStatus::derive(start, end),
    }
}

/// Moves `lease` to the status its events imply (ERROR when `failed`) and writes it, if
/// that changes it; a lease in ERROR stays there until it terminates. Returns whether it
/// moved.
/// `events` are the lease's events as the transaction has them (read once by the caller,
/// which keeps them in step with its own changes).
pub(crate) async fn settle_lease_status(
    tx: &mut Tx,
    lease: &mut Lease,
    events: &[blazar_core::Event],
    failed: bool,
    now: DateTime<Utc>,
) -> ServiceResult<bool> {
    let mut status = status_from_events(events);
    if failed || (lease.status == LeaseStatus::Error && status != LeaseStatus::Terminating) {
        status = LeaseStatus::Error;
    }
    if status == lease.status {
        return Ok(false);
    }
    lease.status = status;
    lease.updated_at = Some(now);
    tx.update_lease(lease).await?;
    Ok(true)
}

fn action_from_row(row: &ActionRecord) -> ServiceResult<Action> {
    let corrupt = |what: &str| ServiceError::Internal(format!("action {}: bad {what}", row.seq));
    let (kind, purpose) = (row.intent.kind, row.intent.purpose);
    let payload: Value =
        serde_json::from_str(&row.intent.payload).map_err(|_| corrupt("payload"))?;
    // Inventory actions have no lease: their times default to when they were recorded.
    let time = |key: &str| -> ServiceResult<DateTime<Utc>> {
        match &payload[key] {
            Value::Null => Ok(row.created_at),
            v => v
                .as_i64()
                .and_then(|s| DateTime::from_timestamp(s, 0))
                .ok_or_else(|| corrupt(key)),
        }
    };
    Ok(Action {
        seq: row.seq,
        kind,
        purpose,
        lease_id: row.intent.lease_id.clone(),
        lease_name: payload["lease_name"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        reservation_id: row.intent.reservation_id.clone(),
        project_id: row.intent.project_id.clone(),
        user_id: payload["user_id"].as_str().unwrap_or_default().to_string(),
        resource_type: row.intent.resource_type.clone(),
        reservation_type: payload["reservation_type"]
            .as_str()
            .unwrap_or(&row.intent.resource_type)
            .to_string(),
        hosts: payload["hosts"]
            .as_array()
            .map(|hosts| {
                hosts
                    .iter()
                    .map(|h| {
                        (
                            h[0].as_str().unwrap_or_default().to_string(),
                            h[1].as_str().unwrap_or_default().to_string(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default(),
        units: payload["units"]
            .as_array()
            .map(|u| u.iter().filter_map(Value::as_i64).collect())
            .unwrap_or_default(),
        resources: payload["resources"]
            .as_array()
            .ok_or_else(|| corrupt("resources"))?
            .iter()
            .filter_map(Value::as_i64)
            .collect(),
        spec: payload["params"].as_object().and_then(|fields| {
            let reservation_type = payload["reservation_type"].as_str().unwrap_or(&row.intent.resource_type);
            ReservationSpec::from_stored(reservation_type, fields)
                .inspect_err(|e| tracing::warn!(action.seq = row.seq, error = %e, "action without its reservation's fields"))
                .ok()
        }),
        lease_start: time("lease_start")?,
        lease_end: time("lease_end")?,
        at: time("at")?,
        attempt: u32::try_from(row.attempts).unwrap_or(u32::MAX),
        request_id: row.intent.request_id.clone(),
        trust_id: payload["trust_id"].as_str().map(str::to_string),
    })
}

impl Service {
    /// Records that `allocations` of `reservation` are to be handed over (`Start`) or taken
    /// back (`Stop`), one action per resource type. Returns whether anything was recorded.
    pub(crate) async fn record_action(
        &self,
        tx: &mut Tx,
        lease: &Lease,
        reservation: &Reservation,
        (kind, purpose): (ActionKind, ActionPurpose),
        allocations: &[Allocation],
        at: DateTime<Utc>,
    ) -> ServiceResult<bool> {
        let mut by_type: BTreeMap<&str, Vec<(i64, i64)>> = BTreeMap::new();
        for a in allocations {
            by_type
                .entry(a.resource_type.as_str())
                .or_default()
                .push((a.resource_id, a.occupancy.units));
        }
        for (resource_type, held) in &by_type {
            let action = self.lease_action(
                lease,
                reservation,
                (kind, purpose),
                resource_type,
                held,
                Some(at),
            );
            tx.queue_action(&action).await?;
            tracing::debug!(
                action.kind = %kind, action.purpose = %purpose,
                lease.id = %lease.id, reservation.id = %reservation.id, "action recorded"
            );
        }
        Ok(!by_type.is_empty())
    }

    /// Records the take-back (`Stop`) for `purpose` (an end, a delete) of what `reservation`
    /// holds. One that holds nothing any more still has what the backend keeps for it in
    /// the cloud (its aggregate; its flavor and resource class), and may have servers there
    /// (healing took its last host, which kept its servers in the aggregate): it gets a
    /// take-back of the reservation as a whole, which the end then waits for. Returns
    /// whether an action was recorded.
    pub(crate) async fn record_take_back(
        &self,
        tx: &mut Tx,
        lease: &Lease,
        reservation: &Reservation,
        purpose: ActionPurpose,
        allocations: &[Allocation],
        at: DateTime<Utc>,
    ) -> ServiceResult<bool> {
        let kind_purpose = (ActionKind::Stop, purpose);
        if self
            .record_action(tx, lease, reservation, kind_purpose, allocations, at)
            .await?
        {
            return Ok(true);
        }
        if !self.backend.prepares_reservations() || !prepared(reservation) {
            return Ok(false);
        }
        let action = self.lease_action(
            lease,
            reservation,
            kind_purpose,
            reservation.resource_type(),
            &[],
            Some(at),
        );
        tx.queue_action(&action).await?;
        Ok(true)
    }

    /// Records an action on a host or instance reservation as a whole (`prepare`, `release`), when the
    /// backend prepares reservations. It names no resource, so nothing waits for it.
    pub(crate) async fn record_reservation_action(
        &self,
        tx: &mut Tx,
        lease: &Lease,
        reservation: &Reservation,
        (kind, purpose): (ActionKind, ActionPurpose),
    ) -> ServiceResult<()> {
        if !self.backend.prepares_reservations() || !prepared(reservation) {
            return Ok(());
        }
        let action = self.lease_action(
            lease,
            reservation,
            (kind, purpose),
            reservation.resource_type(),
            &[],
            None,
        );
        tx.insert_action(&action).await?;
        Ok(())
    }

    /// An action of `reservation` on `held` (resources of `resource_type`, with the units of
    /// each), carrying what a worker needs to know of the lease; `at` is when a hand-over
    /// was decided.
    fn lease_action(
        &self,
        lease: &Lease,
        reservation: &Reservation,
        (kind, purpose): (ActionKind, ActionPurpose),
        resource_type: &str,
        held: &[(i64, i64)],
        at: Option<DateTime<Utc>>,
    ) -> NewAction {
        let resources: Vec<i64> = held.iter().map(|h| h.0).collect();
        let units: Vec<i64> = held.iter().map(|h| h.1).collect();
        let mut payload = json!({
            "lease_name": lease.name,
            "user_id": lease.user_id,
            "reservation_type": reservation.resource_type(),
            "resources": resources,
            "units": units,
            "params": Value::Object(reservation.spec.fields()),
            "lease_start": lease.start.timestamp(),
            "lease_end": lease.end.timestamp(),
        });
        if let Some(at) = at {
            payload["at"] = json!(at.timestamp());
        }
        if lease.keystone_trust {
            payload["trust_id"] = json!(lease.trust_id);
        }
        NewAction {
            intent: ActionIntent {
                lease_id: lease.id.clone(),
                reservation_id: reservation.id.clone(),
                project_id: lease.project_id.clone(),
                kind,
                purpose,
                resource_type: resource_type.to_string(),
                payload: payload.to_string(),
                request_id: current_request_id(),
            },
            resources,
            created_at: self.now(),
        }
    }

    /// An action of `lease` as a whole (no reservation, no resources, no backend): what its
    /// worker needs of the lease, and the fields of `extra`.
    pub(crate) fn whole_lease_action(
        &self,
        lease: &Lease,
        (kind, purpose): (ActionKind, ActionPurpose),
        extra: Value,
    ) -> NewAction {
        let mut payload = json!({
            "lease_name": lease.name,
            "user_id": lease.user_id,
            "resources": [],
            "units": [],
        });
        if let (Value::Object(payload), Value::Object(extra)) = (&mut payload, extra) {
            payload.extend(extra);
        }
        NewAction {
            intent: ActionIntent {
                lease_id: lease.id.clone(),
                reservation_id: String::new(),
                project_id: lease.project_id.clone(),
                kind,
                purpose,
                resource_type: String::new(),
                payload: payload.to_string(),
                request_id: current_request_id(),
            },
            resources: Vec::new(),
            created_at: self.now(),
        }
    }

    /// Records that the usage-enforcement filters are to be told that `view`'s lease ended
    /// (its end, or a delete before it ended), with the lease as Blazar's `on_end` gets it,
    /// resources included: the lease may be gone by the time the action runs. After the
    /// lease's other actions, so the service hears of the end once the resources are back.
    pub(crate) async fn record_on_end(
        &self,
        tx: &mut Tx,
        view: &blazar_core::LeaseView,
        allocations: &[Allocation],
    ) -> ServiceResult<()> {
        if !self.enforcement.wants_on_end() {
            return Ok(());
        }
        let lease = &view.lease;
        let resources = crate::enforcement::resources_by_reservation(tx, allocations).await?;
        let context = self
            .enforcement
            .context(&lease.user_id, &lease.project_id)
            .to_value();
        let action = self.whole_lease_action(
            lease,
            (ActionKind::OnEnd, ActionPurpose::Enforcement),
            json!({
                "context": context,
                "lease": crate::enforcement::stored_lease_values(view, &resources),
            }),
        );
        let seq = tx.insert_action(&action).await?;
        tracing::debug!(action.seq = seq, lease.id = %lease.id, "usage enforcement to be told of the lease end");
        Ok(())
    }

    /// Tells the usage-enforcement filters of a lease end, bounded by the action timeout.
    /// A failure is logged by the caller and retried like any action; it never holds up the
    /// lease.
    async fn tell_lease_end(&self, row: &ActionRecord) -> Result<ActionOutput, ActionError> {
        let payload: Value = serde_json::from_str(&row.intent.payload)
            .map_err(|_| ActionError::Permanent(format!("action {}: bad payload", row.seq)))?;
        let tell = self
            .enforcement
            .on_end(&payload["context"], &payload["lease"]);
        // The call carries the id of the request that ended or deleted the lease.
        let told = match row.intent.request_id.clone() {
            Some(id) => {
                tokio::time::timeout(self.settings.action_timeout, with_request_id(id, tell)).await
            }
            None => tokio::time::timeout(self.settings.action_timeout, tell).await,
        };
        match told {
            Ok(Ok(())) => Ok(ActionOutput::default()),
            Ok(Err(crate::enforcement::OnEndError::Transient(e))) => Err(ActionError::Transient(e)),
            Ok(Err(crate::enforcement::OnEndError::Permanent(e))) => Err(ActionError::Permanent(e)),
            Err(_) => Err(ActionError::Transient(format!(
                "no answer within {} s",
                self.settings.action_timeout.as_secs()
            ))),
        }
    }

    /// Records an inventory action on one host (`Enrol` after it is added, `Withdraw` after
    /// it is removed), when the backend acts on the inventory.
    pub(crate) async fn record_host_action(
        &self,
        tx: &mut Tx,
        kind: ActionKind,
        host: &blazar_core::HostRecord,
    ) -> ServiceResult<Option<i64>> {
        if !self.backend.acts_on_inventory() {
            return Ok(None);
        }
        let payload = json!({
            "resources": [host.id],
            "units": [1],
            "hosts": [[host.facts.service_name, host.facts.hypervisor_hostname]],
        });
        let seq = tx
            .insert_action(&NewAction {
                intent: ActionIntent {
                    lease_id: String::new(),
                    reservation_id: String::new(),
                    project_id: String::new(),
                    kind,
                    purpose: ActionPurpose::Inventory,
                    resource_type: blazar_core::PHYSICAL_HOST.to_string(),
                    payload: payload.to_string(),
                    request_id: current_request_id(),
                },
                resources: vec![host.id],
                created_at: self.now(),
            })
            .await?;
        Ok(Some(seq))
    }

    /// Sees action `seq` through for a caller that answers only once it is done (as Blazar
    /// answers a host enrolment once the host is in the freepool): carries it out in this
    /// task if it may run now, else waits for whoever has it, at most `within`. Returns the
    /// action as it ended, or `None` if it is still open then (it finishes later).
    pub(crate) async fn see_through(
        &self,
        seq: i64,
        within: std::time::Duration,
    ) -> ServiceResult<Option<ActionRecord>> {
        let deadline = tokio::time::Instant::now() + within;
        let claim_for = self.action_claim();
        loop {
            let now = self.now();
            let claimed = in_tx!(self, write, |tx| {
                Ok(tx
                    .claim_action(seq, now, &self.worker_id, claim_for)
                    .await?)
            })?;
            if let Some(row) = claimed {
                // In a task of its own: a caller that goes away (a client hanging up) must
                // not drop the attempt half-way, leaving its claim to run out and the
                // attempt counted as one that did not report back.
                let service = self.clone();
                tokio::spawn(
                    async move { service.carry_out(row, &mut ActionReport::default()).await },
                )
                .await
                .map_err(|e| ServiceError::Internal(format!("action attempt: {e}")))??;
            }
            let row = in_tx!(self, read, |tx| { Ok(tx.get_action(seq).await?) })?;
            match row {
                Some(r) if r.status.is_open() => {}
                other => return Ok(other),
            }
            if tokio::time::Instant::now() > deadline {
                return Ok(None);
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }

    /// Wakes this process's workers: actions were committed.
    pub(crate) fn wake_workers(&self) {
        self.action_wake.notify_one();
    }

    /// Claims and carries out every action that may run at `now`, one at a time, until none
    /// is left (actions that become runnable because an earlier one finished included).
    /// The scheduler's tests and `blazar-server actions run` use it; servers run workers.
    pub async fn run_actions(&self, now: DateTime<Utc>) -> ServiceResult<ActionReport> {
        let mut report = ActionReport::default();
        loop {
            let claimed = self.claim(now, 1).await?;
            let Some(row) = claimed.into_iter().next() else {
                return Ok(report);
            };
            self.carry_out(row, &mut report).await?;
        }
    }

    async fn claim(&self, now: DateTime<Utc>, limit: usize) -> ServiceResult<Vec<ActionRecord>> {
        Ok(in_tx!(self, write, |tx| {
            self.claim_in(tx, now, limit).await
        })?)
    }

    /// How long a claim of an action holds without renewal: four renewals, so that a slow
    /// one (a write lock waited for) does not lose it, and short enough (a minute by
    /// default) that the actions of a process killed mid-attempt are soon taken over.
    fn action_claim(&self) -> chrono::Duration {
        chrono::Duration::from_std(self.settings.action_claim_renewal * 4)
            .unwrap_or_else(|_| chrono::Duration::minutes(1))
    }

    /// Renews this worker's claim of action `seq` every `Settings::action_claim_renewal`
    /// until dropped (with the attempt it runs beside). A renewal that fails is logged:
    /// the claim may then run out and another worker take the action (every action is
    /// safe to run twice).
    async fn keep_action_claim(&self, seq: i64) -> std::convert::Infallible {
        loop {
            tokio::time::sleep(self.settings.action_claim_renewal).await;
            let until = self.now() + self.action_claim();
            let renewed = in_tx!(self, write, |tx| {
                Ok(tx.renew_action_claim(seq, &self.worker_id, until).await?)
            });
            match renewed {
                Ok(true) => {}
                Ok(false) => {
                    tracing::warn!(action.seq = seq, "action claim lost while carrying it out");
                }
                Err(e) => {
                    tracing::warn!(action.seq = seq, error = %e, "could not renew an action claim");
                }
            }
        }
    }

    /// Claims up to `limit` runnable actions in `tx`, for [`Self::action_claim`].
    async fn claim_in(
        &self,
        tx: &mut Tx,
        now: DateTime<Utc>,
        limit: usize,
    ) -> ServiceResult<Vec<ActionRecord>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        Ok(tx
            .claim_actions(now, &self.worker_id, self.action_claim(), limit)
            .await?)
    }

    /// One attempt at one claimed action, and its outcome recorded.
    async fn carry_out(&self, row: ActionRecord, report: &mut ActionReport) -> ServiceResult<()> {
        let attempt = self.attempt(row).await;
        attempt.count(report);
        self.record_attempts(std::slice::from_ref(&attempt), 0)
            .await
            .map(|_| ())
    }

    /// One attempt at one claimed action: what the backend answered, not yet recorded.
    async fn attempt(&self, row: ActionRecord) -> Attempt {
        // Each claim counts an attempt, and a claim taken again once it expired counts a
        // lost one (its worker stopped or hung mid-attempt): an action that takes its worker
        // down would otherwise be taken again for as long as it may be retried, holding
        // back its lease and every later action on its resources.
        let max_attempts = self.settings.action_max_attempts.map(i64::from);
        if row.lost_attempts >= ACTION_LOST_ATTEMPTS
            || max_attempts.is_some_and(|max| row.attempts > max)
        {
            let error = format!(
                "gave up after {} attempts: the last did not report back (its worker \
                 stopped or hung)",
                row.attempts - 1
            );
            tracing::error!(action.seq = row.seq, action.kind = %row.intent.kind,
                lease.id = %row.intent.lease_id, attempts = row.attempts, error = %error,
                "action failed for good");
            return Attempt {
                row,
                outcome: ActionOutcome::GaveUp { error },
                output: ActionOutput::default(),
                at: self.now(),
            };
        }
        let work = async {
            match action_from_row(&row) {
                Ok(_) if row.intent.kind == ActionKind::OnEnd => self.tell_lease_end(&row).await,
                Ok(action) if row.intent.kind == ActionKind::DeleteTrust => {
                    self.delete_trust(&action).await
                }
                Ok(action) => {
                    let applied = tokio::time::timeout(
                        self.settings.action_timeout,
                        self.backend.apply(&self.store, &action),
                    )
                    .await;
                    match applied {
                        Ok(r) => r,
                        Err(_) => Err(ActionError::Transient(format!(
                            "no answer within {} s",
                            self.settings.action_timeout.as_secs()
                        ))),
                    }
                }
                Err(e) => Err(ActionError::Permanent(e.to_string())),
            }
        };
        // The claim is short and renewed while the attempt runs: a process killed
        // mid-attempt lets its actions go within a claim's length, not an action timeout.
        // (The work holds no write transaction, so a renewal never waits on it.)
        let result = tokio::select! {
            result = work => result,
            never = self.keep_action_claim(row.seq) => match never {},
        };
        let now = self.now();
        let output = result.as_ref().ok().cloned().unwrap_or_default();
        // A before-end snapshot is not tried again once its lease has ended: the take-back
        // waits for it, and Blazar's before-end action never holds an end back.
        let past_end = row.intent.kind == ActionKind::Snapshot
            && action_from_row(&row).is_ok_and(|a| a.lease_end <= now);
        let outcome = match result {
            Ok(_) => ActionOutcome::Done,
            Err(ActionError::Transient(error)) if past_end => ActionOutcome::Failed {
                error: format!("not done before the lease ended: {error}"),
            },
            Err(ActionError::Transient(error)) => self.retry_or_give_up(&row, error, now),
            Err(ActionError::Permanent(error)) => ActionOutcome::Failed { error },
        };
        match &outcome {
            ActionOutcome::Done => {
                tracing::info!(action.seq = row.seq, action.kind = %row.intent.kind,
                    lease.id = %row.intent.lease_id, attempts = row.attempts, "action done");
            }
            ActionOutcome::Retry { error, not_before } => {
                tracing::warn!(action.seq = row.seq, action.kind = %row.intent.kind,
                    lease.id = %row.intent.lease_id, attempts = row.attempts, error = %error,
                    retry_at = %not_before, "action failed; will retry");
            }
            ActionOutcome::Failed { error } | ActionOutcome::GaveUp { error } => {
                tracing::error!(action.seq = row.seq, action.kind = %row.intent.kind,
                    lease.id = %row.intent.lease_id, attempts = row.attempts, error = %error,
                    "action failed for good");
            }
        }
        Attempt {
            row,
            outcome,
            output,
            at: now,
        }
    }

    /// What a transient failure leads to: another attempt after a pause, while the action
    /// is within its retry span (counted from its first attempt) and its attempts allow.
    fn retry_or_give_up(
        &self,
        row: &ActionRecord,
        error: String,
        now: DateTime<Utc>,
    ) -> ActionOutcome {
        if self
            .settings
            .action_max_attempts
            .is_some_and(|max| row.attempts >= i64::from(max))
        {
            return ActionOutcome::Failed {
                error: format!("gave up after {} attempts: {error}", row.attempts),
            };
        }
        let retried_for = now - row.first_tried_at.unwrap_or(now);
        let span = chrono::Duration::from_std(self.settings.action_retry_for)
            .unwrap_or(chrono::Duration::MAX);
        // A before-end snapshot is retried until its lease ends (see `attempt`), however
        // long before the end it started.
        if retried_for >= span && row.intent.kind != ActionKind::Snapshot {
            return ActionOutcome::Failed {
                error: format!(
                    "gave up after {} attempts in {} min: {error}",
                    row.attempts,
                    retried_for.num_minutes()
                ),
            };
        }
        let mut wait = action_backoff(u32::try_from(row.attempts).unwrap_or(u32::MAX));
        // At the cap, actions that failed together (one hour's starts, caught by one
        // outage) would all come back in the same second every 30 s, and hit the service
        // that just returned at once: spread over the cap's last third.
        if wait >= action_backoff(u32::MAX) {
            let spread = getrandom::u64().map_or(0, |r| r % 11);
            wait -= chrono::Duration::seconds(i64::try_from(spread).unwrap_or(0));
        }
        ActionOutcome::Retry {
            error,
            not_before: now + wait,
        }
    }

    /// Records the outcomes of attempts in one transaction, in lease order (so that two
    /// batches lock the leases they share in the same order). At the top of the hour a large
    /// site finishes hundreds of hand-overs at once: one commit each would make the last
    /// lease ACTIVE seconds after its actions were done.
    ///
    /// The same transaction then claims up to `claim` more actions (those the outcomes just
    /// made runnable included): a worker that records and claims in one commit instead of
    /// two gets through a burst of fast actions in half the commits.
    async fn record_attempts(
        &self,
        attempts: &[Attempt],
        claim: usize,
    ) -> ServiceResult<Vec<ActionRecord>> {
        let mut ordered: Vec<&Attempt> = attempts.iter().collect();
        ordered.sort_by(|a, b| {
            (&a.row.intent.lease_id, a.row.seq).cmp(&(&b.row.intent.lease_id, b.row.seq))
        });
        let (claimed, before_end_due, held_outside) = in_tx!(self, write, |tx| {
            let mut finished = Vec::new();
            let mut held_outside = Vec::new();
            for attempt in &ordered {
                let Attempt {
                    row, outcome, at, ..
                } = *attempt;
                if !tx
                    .finish_action(row.seq, &self.worker_id, outcome, *at)
                    .await?
                {
                    tracing::warn!(action.seq = row.seq, "action was claimed again meanwhile");
                    continue;
                }
                match outcome {
                    ActionOutcome::Retry { .. } => {}
                    ActionOutcome::Done => {
                        record_handovers(tx, &attempt.output.handovers).await?;
                        for &id in &attempt.output.held_outside {
                            held_outside.push((row.intent.resource_type.clone(), id));
                        }
                        finished.push(Finished {
                            attempt,
                            failure: None,
                        });
                    }
                    ActionOutcome::Failed { error } | ActionOutcome::GaveUp { error } => finished
                        .push(Finished {
                            attempt,
                            failure: Some(error),
                        }),
                }
            }
            let before_end_due = self.settle_finished(tx, &finished).await?;
            Ok((
                self.claim_in(tx, self.now(), claim).await?,
                before_end_due,
                held_outside,
            ))
        })?;
        // What a start could not hand over because another project holds it in the cloud
        // is taken out and its reservation healed now, in transactions of their own (a
        // crash before leaves it to the monitor's next pass).
        for (kind, id) in held_outside {
            if let Err(e) = self
                .take_out_held(&kind, id, "another project, found by a hand-over")
                .await
            {
                tracing::warn!(error = %e, resource.kind = %kind, resource.id = id,
                    "could not take out a resource held outside blazar-rs; the monitor will");
            }
        }
        // A before-end that waited for its lease's start is due now that the start is done.
        if before_end_due {
            self.wake_scheduler_for(self.now());
        }
        Ok(claimed)
    }

    /// Moves reservations, events and leases on after the actions of `finished` ended
    /// (in lease order): what a done action made (Nova's server group id) becomes part of
    /// its reservation; a start or end that has no action open any more is done (or ERROR,
    /// if one failed for good) and its lease moves on. What it needs is read for the whole
    /// batch at once, after every outcome is written, so the counts of open actions see
    /// them all.
    /// Returns whether a lease's start finished with its before-end due (it waited for the
    /// start: the scheduler runs it now).
    async fn settle_finished(&self, tx: &mut Tx, finished: &[Finished<'_>]) -> ServiceResult<bool> {
        let mut by_lease: BTreeMap<&str, Vec<&Finished>> = BTreeMap::new();
        for f in finished {
            if f.moves_statuses() || f.made().is_some() {
                by_lease
                    .entry(&f.attempt.row.intent.lease_id)
                    .or_default()
                    .push(f);
            }
        }
        if by_lease.is_empty() {
            return Ok(false);
        }
        let ids: Vec<&str> = by_lease.keys().copied().collect();
        let views = lock_views(tx, &ids).await?;
        let counts: HashMap<(String, String), (i64, i64)> = tx
            .action_counts_of_leases(&ids)
            .await?
            .into_iter()
            .map(|(lease, purpose, open, failed)| ((lease, purpose), (open, failed)))
            .collect();
        let mut before_end_due = false;
        for mut view in views {
            let Some(ended) = by_lease.get(view.lease.id.as_str()) else {
                continue;
            };
            before_end_due |= self.settle_lease(tx, &mut view, ended, &counts).await?;
        }
        Ok(before_end_due)
    }

    /// [`Service::settle_finished`] for one lease and the actions of it that ended.
    async fn settle_lease(
        &self,
        tx: &mut Tx,
        view: &mut LeaseView,
        ended: &[&Finished<'_>],
        counts: &HashMap<(String, String), (i64, i64)>,
    ) -> ServiceResult<bool> {
        let now = ended
            .iter()
            .map(|f| f.attempt.at)
            .max()
            .unwrap_or_else(|| self.now());
        let mut changed = vec![false; view.reservations.len()];
        let mut settles = Vec::new();
        let mut failed_change = false;
        for f in ended {
            let row = &f.attempt.row;
            let index = view
                .reservations
                .iter()
                .position(|r| r.id == row.intent.reservation_id);
            if let (Some(made), Some(i)) = (f.made(), index)
                && view.reservations[i].spec.set_made(made)
            {
                view.reservations[i].updated_at = Some(f.attempt.at);
                changed[i] = true;
            }
            if !f.moves_statuses() {
                continue;
            }
            if let Some(i) = index {
                let reservation = &mut view.reservations[i];
                let next = match (row.intent.purpose, f.failure) {
                    (_, Some(_)) => Some(ReservationStatus::Error),
                    (ActionPurpose::LeaseStart, None)
                        if reservation.status == ReservationStatus::Pending =>
                    {
                        Some(ReservationStatus::Active)
                    }
                    (ActionPurpose::LeaseEnd, None)
                        if reservation.status != ReservationStatus::Error =>
                    {
                        Some(ReservationStatus::Deleted)
                    }
                    _ => None,
                };
                if let Some(next) = next
                    && reservation.status != next
                {
                    reservation.status = next;
                    reservation.updated_at = Some(f.attempt.at);
                    changed[i] = true;
                }
            }
            let event_type = match row.intent.purpose {
                ActionPurpose::LeaseStart => Some(EventType::StartLease),
                ActionPurpose::LeaseEnd => Some(EventType::EndLease),
                _ => None,
            };
            if let Some(event_type) = event_type
                && !settles.contains(&(event_type, row.intent.purpose))
            {
                settles.push((event_type, row.intent.purpose));
            }
            // A change that failed for good leaves the lease in ERROR, as a failed update
            // does in Blazar.
            failed_change |= f.failure.is_some() && row.intent.purpose == ActionPurpose::Change;
        }
        for (reservation, changed) in view.reservations.iter().zip(changed) {
            if changed {
                tx.update_reservation(reservation).await?;
            }
        }
        if !ended.iter().any(|f| f.moves_statuses()) {
            return Ok(false);
        }
        let mut finished = Vec::new();
        for (event_type, purpose) in settles {
            let key = (view.lease.id.clone(), purpose.as_str().to_string());
            let counts = counts.get(&key).copied().unwrap_or((0, 0));
            if let Some(event) = conclude_event(&mut view.events, event_type, counts, now) {
                tx.update_event(event).await?;
                finished.push(event_type);
            }
        }
        if settle_lease_status(tx, &mut view.lease, &view.events, failed_change, now).await? {
            tracing::info!(lease.id = %view.lease.id, lease.status = %view.lease.status,
                "lease status");
        }
        self.notify_events_done(tx, view, &finished).await?;
        Ok(finished.contains(&EventType::StartLease)
            && view.events.iter().any(|e| {
                e.event_type == EventType::BeforeEndLease
                    && e.status == EventStatus::Undone
                    && e.time <= now
            }))
    }

    /// Marks the lease's `event_type` event done (or ERROR, if one of its actions failed)
    /// once none of the actions of `purpose` is open any more, in the database and in
    /// `events` (the lease's events as the caller read them). Returns whether it did.
    pub(crate) async fn settle_event(
        &self,
        tx: &mut Tx,
        lease_id: &str,
        events: &mut [blazar_core::Event],
        event_type: EventType,
        purpose: ActionPurpose,
        now: DateTime<Utc>,
    ) -> ServiceResult<bool> {
        if !events
            .iter()
            .any(|e| e.event_type == event_type && e.status == EventStatus::InProgress)
        {
            return Ok(false);
        }
        let counts = tx.action_counts(lease_id, purpose.as_str()).await?;
        match conclude_event(events, event_type, counts, now) {
            Some(event) => {
                tx.update_event(event).await?;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// Records what workers' attempts came to: together, or one by one if the batch fails
    /// (so one action whose recording fails does not hold back the others). An attempt not
    /// recorded is run again once its claim expires. Answers the actions claimed with the
    /// batch (up to `claim`), or `None` if it did not commit.
    async fn record_finished(
        &self,
        attempts: Vec<Attempt>,
        claim: usize,
    ) -> Option<Vec<ActionRecord>> {
        if attempts.is_empty() {
            return None;
        }
        match self.record_attempts(&attempts, claim).await {
            Ok(claimed) => return Some(claimed),
            Err(e) if attempts.len() > 1 => tracing::warn!(error = %e, count = attempts.len(),
                "recording a batch of action outcomes failed; recording them one by one"),
            Err(e) => {
                tracing::error!(error = %e, action.seq = attempts[0].row.seq,
                    "recording an action's outcome failed; it will run again");
                return None;
            }
        }
        for attempt in &attempts {
            if let Err(e) = self.record_attempts(std::slice::from_ref(attempt), 0).await {
                tracing::error!(error = %e, action.seq = attempt.row.seq,
                    "recording an action's outcome failed; it will run again");
            }
        }
        None
    }

    /// Runs workers until `shutdown`: at most `settings.action_workers` actions at a time,
    /// looking for runnable actions when woken by a commit that recorded some, when one of
    /// its own finishes, when a retry falls due, and at least every `poll` (actions recorded
    /// by other replicas).
    pub async fn run_workers(&self, poll: std::time::Duration, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        let limit = self.settings.action_workers.max(1);
        let mut running: JoinSet<Attempt> = JoinSet::new();
        // Actions claimed by the transaction that recorded the last outcomes.
        let mut claimed_with_outcomes: Option<Vec<ActionRecord>> = None;
        loop {
            let claimed = match claimed_with_outcomes.take() {
                Some(claimed) => claimed,
                None => {
                    let free = limit.saturating_sub(running.len());
                    if free == 0 {
                        Vec::new()
                    } else {
                        self.claim(self.now(), free).await.unwrap_or_else(|e| {
                            tracing::error!(error = %e, "could not claim actions");
                            Vec::new()
                        })
                    }
                }
            };
            for row in claimed {
                let service = self.clone();
                running.spawn(async move { service.attempt(row).await });
            }
            let wait = match in_tx!(self, read, |tx| { Ok(tx.next_action_time().await?) }) {
                Ok(Some(t)) => crate::wait_until(t, self.clock.now(), poll)
                    .max(std::time::Duration::from_millis(10)),
                _ => poll,
            };
            tokio::select! {
                Some(done) = running.join_next(), if !running.is_empty() => {
                    // This attempt and every other that has finished meanwhile.
                    let mut finished = vec![done];
                    while finished.len() < ATTEMPTS_PER_TRANSACTION {
                        match running.try_join_next() {
                            Some(more) => finished.push(more),
                            None => break,
                        }
                    }
                    let attempts: Vec<Attempt> = finished
                        .into_iter()
                        .filter_map(|joined| {
                            joined
                                .map_err(|e| tracing::error!(error = %e, "an action worker panicked"))
                                .ok()
                        })
                        .collect();
                    let free = limit.saturating_sub(running.len());
                    claimed_with_outcomes = self.record_finished(attempts, free).await;
                }
                _ = self.action_wake.notified() => {}
                _ = tokio::time::sleep(wait) => {}
                _ = &mut shutdown => break,
            }
        }
        // Let the actions under way finish and record what they did.
        while let Some(joined) = running.join_next().await {
            if let Ok(attempt) = joined {
                self.record_finished(vec![attempt], 0).await;
            }
        }
        tracing::info!("action workers stopped");
    }
}
