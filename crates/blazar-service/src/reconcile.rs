//! The reconciler: what the database says the cloud should look like, handed to the backend,
//! which compares it with what the cloud says and repairs the difference (or only reports it,
//! on a dry run). Hosts and reservations with actions still open are left to those actions.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;

use blazar_core::{ActionFilter, ActionStatus, LeaseFilter, MadeIds};
use blazar_core::{ActionKind, ActionPurpose, LeaseStatus, PHYSICAL_HOST, ReservationStatus};
use blazar_db::{ActionsSeen, RECONCILE_TASK, RepairItem, Store, TaskTerm};
use chrono::{DateTime, Utc};

use crate::{Action, Identity, Service, ServiceError, ServiceResult};

/// One host reservation as the cloud should show it now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldHosts {
    pub lease_id: String,
    pub reservation_id: String,
    pub project_id: String,
    /// Compute service names.
    pub hosts: Vec<String>,
}

/// What the cloud should look like.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DesiredState {
    /// Host reservations in force (their lease ACTIVE, no action open on them).
    pub reservations: Vec<HeldHosts>,
    /// Service names of every enrolled host.
    pub enrolled: Vec<String>,
    /// Host reservations of leases that have not started (no hosts yet): their aggregates
    /// exist from the reservation on, owned by the project, empty until the start.
    pub upcoming: Vec<HeldHosts>,
    /// Reservations and hosts with actions still open: not to be touched now.
    pub busy_reservations: BTreeSet<String>,
    pub busy_hosts: BTreeSet<String>,
    /// Instance, floating-IP and network reservations in force (lease ACTIVE, no action
    /// open), each as the `start` action that makes what it holds exist: carried out again,
    /// it repairs what is missing.
    pub live: Vec<Action>,
    /// Every reservation of a lease that has not ended (whatever its type): what the cloud
    /// holds for any other reservation is an orphan.
    pub kept: BTreeSet<String>,
    /// (service name, hypervisor hostname) of every enrolled host.
    pub hypervisors: Vec<(String, String)>,
    /// Host reservations that hold their hosts now without being in force: the lease, or
    /// the reservation, in ERROR after a start or change that failed for good. The cloud is
    /// left as it is for them (not repaired, not taken back): the lease's end, or an
    /// operator, decides; taking the hosts away would end a lease the database still
    /// grants them to.
    pub stranded: Vec<HeldHosts>,
    /// Enrolled hosts' ids by service name.
    pub host_ids: BTreeMap<String, i64>,
    /// The actions recorded when this state was read: one recorded since makes it stale
    /// for what that action touches.
    pub seen: ActionsSeen,
    /// The repairing pass this state is for (`None`: a dry run, which changes nothing).
    pub pass: Option<RepairPass>,
}

/// A repairing pass: the holder of its task claim, and the service's clock its claim is
/// judged by.
#[derive(Clone)]
pub struct RepairPass {
    pub holder: String,
    pub clock: std::sync::Arc<dyn crate::Clock>,
}

impl std::fmt::Debug for RepairPass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RepairPass")
            .field("holder", &self.holder)
            .finish_non_exhaustive()
    }
}

impl PartialEq for RepairPass {
    fn eq(&self, other: &Self) -> bool {
        self.holder == other.holder
    }
}

impl DesiredState {
    /// Holds `item` for a repair (see [`blazar_db::Tx::hold_for_repair`]): until the pass
    /// releases it, no action on it runs. False when an action on it is open or was
    /// recorded after this state was read (the state is stale for it: it is left to the
    /// next pass, which reads it anew), or when the database cannot say. A dry run holds
    /// nothing and is answered true.
    pub async fn hold(&self, store: &Store, item: &RepairItem) -> bool {
        let Some(pass) = &self.pass else {
            return true;
        };
        let held = async {
            let mut tx = store.write().await?;
            let held = tx
                .hold_for_repair(&pass.holder, item, &self.seen, pass.clock.now())
                .await?;
            tx.commit().await?;
            Ok::<_, blazar_db::DbError>(held)
        }
        .await;
        match held {
            Ok(held) => {
                if !held {
                    tracing::info!(
                        ?item,
                        "changed since the reconciler read it: left to the next pass"
                    );
                }
                held
            }
            Err(e) => {
                tracing::warn!(error = %e, ?item, "could not hold for a repair: left to the next pass");
                false
            }
        }
    }

    /// Releases what this pass holds: the action workers may claim it again.
    pub async fn release(&self, store: &Store) {
        let Some(pass) = &self.pass else {
            return;
        };
        let released = async {
            let mut tx = store.write().await?;
            tx.release_repair_holds(&pass.holder).await?;
            tx.commit().await
        }
        .await;
        if let Err(e) = released {
            // They lapse with the pass's claim.
            tracing::warn!(error = %e, "could not release the reconciler's holds");
        }
    }
}

/// What a pass found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct ReconcileReport {
    /// Whether the repairs were made (false: a dry run only lists them).
    pub applied: bool,
    /// One line per difference found (and repaired, if applied).
    pub repairs: Vec<String>,
    /// Repairs that failed and parts of the cloud that could not be read, each with its
    /// error. The pass goes on past them: one broken piece does not keep the rest from
    /// being repaired, and the next pass tries again.
    pub failed: Vec<String>,
    /// (reservation id, ids) of what the pass made again for instance reservations (an
    /// affinity group, an aggregate): the reservation is told their new ids (users boot
    /// with the group as their hint), as an action that made them tells it.
    #[serde(skip)]
    pub made: Vec<(String, MadeIds)>,
    /// (kind, resource id) of reserved resources a repair could not make again because
    /// another project holds them in the cloud: taken out of service and healed, as the
    /// monitor does.
    #[serde(skip)]
    pub held_outside: Vec<(String, i64)>,
    /// The lines of `repairs` left as they are on purpose (a healed host kept in its
    /// aggregate while the lease's servers run there): listed, never repaired.
    #[serde(skip)]
    pub left: Vec<String>,
}

impl ReconcileReport {
    /// The repairs that change something (those of `repairs` not `left` as they are).
    pub fn changes(&self) -> impl Iterator<Item = &String> {
        self.repairs.iter().filter(|line| !self.left.contains(line))
    }
}

/// Sleeps for `pause` unless `shutdown` comes first; false when it did.
async fn sleep_unless(
    pause: std::time::Duration,
    shutdown: &mut std::pin::Pin<&mut impl Future<Output = ()>>,
) -> bool {
    tokio::select! {
        () = tokio::time::sleep(pause) => true,
        () = shutdown.as_mut() => false,
    }
}

/// How long a repairing pass may run. Passes read the whole cloud, but at a few seconds
/// even for thousands of hosts; one that runs this long is stuck on the cloud.
const PASS_LIMIT: std::time::Duration = std::time::Duration::from_secs(15 * 60);

/// Stops a task when dropped: the claim's renewals end with the pass, however it ends.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Service {
    /// What the database says the cloud should look like now.
    pub async fn desired_state(&self) -> ServiceResult<DesiredState> {
        in_tx!(self, read, |tx| {
            let mut desired = DesiredState {
                // First: an action recorded after any of what follows was read is news.
                seen: tx.actions_seen().await?,
                ..DesiredState::default()
            };
            let hosts = tx.list_hosts().await?;
            desired.host_ids = hosts
                .iter()
                .map(|h| (h.facts.service_name.clone(), h.id))
                .collect();
            let name_of = |id: i64| {
                hosts
                    .iter()
                    .find(|h| h.id == id)
                    .map(|h| h.facts.service_name.clone())
            };
            desired.enrolled = hosts.iter().map(|h| h.facts.service_name.clone()).collect();
            desired.hypervisors = hosts
                .iter()
                .map(|h| {
                    (
                        h.facts.service_name.clone(),
                        h.facts.hypervisor_hostname.clone(),
                    )
                })
                .collect();
            for action in tx
                .list_actions(&ActionFilter {
                    statuses: vec![ActionStatus::Pending, ActionStatus::Running],
                    limit: 100_000,
                    ..ActionFilter::default()
                })
                .await?
            {
                desired
                    .busy_reservations
                    .insert(action.intent.reservation_id.clone());
                if action.intent.resource_type == PHYSICAL_HOST {
                    let payload: serde_json::Value =
                        serde_json::from_str(&action.intent.payload).unwrap_or_default();
                    for id in payload["resources"].as_array().into_iter().flatten() {
                        if let Some(name) = id.as_i64().and_then(name_of) {
                            desired.busy_hosts.insert(name);
                        }
                    }
                }
            }
            let active = tx
                .lease_trees(&LeaseFilter {
                    status: Some(LeaseStatus::Active.as_str().to_string()),
                    ..LeaseFilter::default()
                })
                .await?;
            let pending = tx
                .lease_trees(&LeaseFilter {
                    status: Some(LeaseStatus::Pending.as_str().to_string()),
                    ..LeaseFilter::default()
                })
                .await?;
            let failed = tx
                .lease_trees(&LeaseFilter {
                    status: Some(LeaseStatus::Error.as_str().to_string()),
                    ..LeaseFilter::default()
                })
                .await?;
            let now = self.now();
            for status in [
                LeaseStatus::Pending,
                LeaseStatus::Active,
                LeaseStatus::Error,
                LeaseStatus::Creating,
                LeaseStatus::Starting,
                LeaseStatus::Updating,
                LeaseStatus::Terminating,
                LeaseStatus::Deleting,
            ] {
                let ids = tx
                    .lease_trees(&LeaseFilter {
                        status: Some(status.as_str().to_string()),
                        ..LeaseFilter::default()
                    })
                    .await?
                    .into_iter()
                    // A lease in ERROR past its end keeps nothing: its end ran, and what a
                    // take-back that failed for good left in the cloud is a leftover (or it
                    // would stay there, in the way of the next lease of the same address,
                    // segment or host, until the lease is deleted by hand).
                    .filter(|(lease, _, _)| status != LeaseStatus::Error || lease.end > now)
                    .flat_map(|(_, reservations, _)| reservations.into_iter().map(|r| r.id));
                desired.kept.extend(ids);
            }
            desired
                .kept
                .extend(desired.busy_reservations.iter().cloned());
            for (lease, reservations, _) in pending {
                desired.upcoming.extend(
                    reservations
                        .into_iter()
                        .filter(|r| {
                            r.resource_type() == PHYSICAL_HOST
                                && !desired.busy_reservations.contains(&r.id)
                        })
                        .map(|r| HeldHosts {
                            lease_id: lease.id.clone(),
                            reservation_id: r.id,
                            project_id: lease.project_id.clone(),
                            hosts: Vec::new(),
                        }),
                );
            }
            for (lease, reservations, _) in failed {
                let allocations = tx.allocations_of_lease(&lease.id).await?;
                for r in reservations {
                    if r.resource_type() != PHYSICAL_HOST
                        || desired.busy_reservations.contains(&r.id)
                    {
                        continue;
                    }
                    let hosts: Vec<String> = allocations
                        .iter()
                        .filter(|a| a.reservation_id == r.id && a.occupancy.end > now)
                        .filter_map(|a| name_of(a.resource_id))
                        .collect();
                    if !hosts.is_empty() {
                        desired.stranded.push(HeldHosts {
                            lease_id: lease.id.clone(),
                            reservation_id: r.id.clone(),
                            project_id: lease.project_id.clone(),
                            hosts,
                        });
                    }
                }
            }
            for (lease, reservations, _) in active {
                let allocations = tx.allocations_of_lease(&lease.id).await?;
                for r in reservations {
                    if r.resource_type() != PHYSICAL_HOST
                        && r.status == ReservationStatus::Active
                        && !desired.busy_reservations.contains(&r.id)
                    {
                        let held: Vec<_> = allocations
                            .iter()
                            .filter(|a| a.reservation_id == r.id && a.occupancy.end > now)
                            .collect();
                        let mut kinds: Vec<&str> =
                            held.iter().map(|a| a.resource_type.as_str()).collect();
                        kinds.sort_unstable();
                        kinds.dedup();
                        for kind in kinds {
                            let of_kind = held.iter().filter(|a| a.resource_type == kind);
                            desired.live.push(Action {
                                seq: 0,
                                kind: ActionKind::Start,
                                purpose: ActionPurpose::Change,
                                lease_id: lease.id.clone(),
                                lease_name: lease.name.clone(),
                                reservation_id: r.id.clone(),
                                project_id: lease.project_id.clone(),
                                user_id: lease.user_id.clone(),
                                resource_type: kind.to_string(),
                                reservation_type: r.resource_type().to_string(),
                                resources: of_kind.clone().map(|a| a.resource_id).collect(),
                                units: of_kind.map(|a| a.occupancy.units).collect(),
                                hosts: Vec::new(),
                                spec: Some(r.spec.clone()),
                                lease_start: lease.start,
                                lease_end: lease.end,
                                at: now,
                                attempt: 1,
                                request_id: None,
                                trust_id: lease.keystone_trust.then(|| lease.trust_id.clone()),
                            });
                        }
                        continue;
                    }
                    if r.resource_type() != PHYSICAL_HOST
                        || desired.busy_reservations.contains(&r.id)
                    {
                        continue;
                    }
                    let in_force = r.status == ReservationStatus::Active;
                    let held: Vec<String> = allocations
                        .iter()
                        .filter(|a| a.reservation_id == r.id && (in_force || a.occupancy.end > now))
                        .filter_map(|a| name_of(a.resource_id))
                        .collect();
                    let hosts = HeldHosts {
                        lease_id: lease.id.clone(),
                        reservation_id: r.id.clone(),
                        project_id: lease.project_id.clone(),
                        hosts: held,
                    };
                    if in_force {
                        desired.reservations.push(hosts);
                    } else if !hosts.hosts.is_empty() {
                        desired.stranded.push(hosts);
                    }
                }
            }
            Ok(desired)
        })
    }

    /// Compares the cloud with the database and repairs it (`apply`) or only reports.
    ///
    /// A pass that repairs runs in one replica at a time: two at once would both make what
    /// is missing (two networks, two server groups for one reservation) and undo each
    /// other's moves. It holds the `reconcile` task claim, renewed while it runs, so a
    /// replica that stops mid-pass frees it within four `Settings::claim_renewal`
    /// periods; a repairing pass asked for
    /// while another runs is refused (409), a dry run is not (it only reads).
    pub async fn reconcile(&self, apply: bool) -> ServiceResult<ReconcileReport> {
        if !apply {
            return self.reconcile_pass(None).await;
        }
        // The holder names the pass, not only the replica: two passes asked of one replica
        // (a timer and an operator) exclude each other as well.
        let holder = format!("{} {}", self.worker_id, crate::new_id());
        let now = self.now();
        let until = now + self.claim_for();
        let claimed = in_tx!(self, write, |tx| {
            let term = TaskTerm {
                task: RECONCILE_TASK,
                holder: &holder,
                now,
                until,
            };
            Ok(tx.claim_task(&term).await?)
        })?;
        if !claimed {
            return Err(ServiceError::Conflict(
                "A reconciliation pass is running; try again when it ends".into(),
            ));
        }
        // In a task of its own: a caller that goes away (an HTTP client that timed out)
        // must not cancel the pass between a repair and the claim's release.
        let this = self.clone();
        let pass = tokio::spawn(async move {
            let outcome = this.claimed_pass(&holder, until).await;
            let released = in_tx!(this, write, |tx| {
                Ok(tx.release_task(RECONCILE_TASK, &holder).await?)
            });
            if let Err(e) = released {
                tracing::warn!(error = %e, "could not release the reconciler's claim");
            }
            outcome
        });
        pass.await
            .map_err(|e| ServiceError::Internal(format!("reconciliation pass: {e}")))?
    }

    /// How long each claim or renewal of a repairing pass holds it.
    fn claim_for(&self) -> chrono::Duration {
        chrono::Duration::from_std(self.settings.claim_renewal * 4)
            .unwrap_or(chrono::Duration::minutes(2))
    }

    /// A repairing pass under the claim (held until `until`): stops the pass if the claim
    /// is lost or the pass overran `PASS_LIMIT`. The renewals run in a task beside the
    /// pass, not between its steps: on SQLite a renewal waits for the process's write
    /// lock, which the pass may hold while it is not being polled.
    async fn claimed_pass(
        &self,
        holder: &str,
        until: DateTime<Utc>,
    ) -> ServiceResult<ReconcileReport> {
        let keeper = self.clone();
        let kept = holder.to_string();
        let mut renewals = AbortOnDrop(tokio::spawn(async move {
            keeper.keep_claim(&kept, until).await
        }));
        let outcome = tokio::select! {
            report = self.reconcile_pass(Some(holder)) => report,
            stopped = &mut renewals.0 => {
                let why = stopped.unwrap_or_else(|e| format!("its renewals stopped: {e}"));
                Err(ServiceError::Unavailable(format!(
                    "The reconciliation pass was stopped half-way: {why}; the next pass goes on"
                )))
            }
            _ = tokio::time::sleep(PASS_LIMIT) => {
                Err(ServiceError::Unavailable(format!(
                    "The reconciliation pass did not end within {} s; the next pass goes on",
                    PASS_LIMIT.as_secs()
                )))
            }
        };
        // No renewal may land after the release. A finished task renews no more (and a
        // handle the select spent must not be polled again).
        if !renewals.0.is_finished() {
            renewals.0.abort();
            let _ = (&mut renewals.0).await;
        }
        outcome
    }

    /// Renews the claim until it cannot; answers why. A claim that could not be renewed
    /// before it runs out counts as lost: past it another replica may take over.
    async fn keep_claim(&self, holder: &str, mut held_until: DateTime<Utc>) -> String {
        let every = self.settings.claim_renewal;
        loop {
            tokio::time::sleep(every).await;
            let now = self.now();
            let until = now + self.claim_for();
            let renewed = in_tx!(self, write, |tx| {
                let term = TaskTerm {
                    task: RECONCILE_TASK,
                    holder,
                    now,
                    until,
                };
                Ok(tx.renew_task(&term).await?)
            });
            match renewed {
                Ok(true) => held_until = until,
                // Run out (a renewal that came too late: holds stopped counting then) or
                // taken over: either way lost.
                Ok(false) => return "its claim ran out or another replica took it over".into(),
                Err(e) => {
                    tracing::warn!(error = %e, "could not renew the reconciler's claim");
                    let next = self.now()
                        + chrono::Duration::from_std(every).unwrap_or(chrono::Duration::zero());
                    if next >= held_until {
                        return format!("its claim could not be renewed before running out: {e}");
                    }
                }
            }
        }
    }

    /// One pass, claim aside: a repairing one for `holder` (the claim's), or a dry run.
    async fn reconcile_pass(&self, holder: Option<&str>) -> ServiceResult<ReconcileReport> {
        let apply = holder.is_some();
        if let Some(holder) = holder {
            in_tx!(self, write, |tx| {
                Ok(tx.drop_stale_repair_holds(holder).await?)
            })?;
        }
        let mut desired = self.desired_state().await?;
        desired.pass = holder.map(|holder| RepairPass {
            holder: holder.to_string(),
            clock: self.clock.clone(),
        });
        let report = self.backend.reconcile(&self.store, &desired, apply).await;
        // Whatever the backend left held (a repair it returned from early).
        desired.release(&self.store).await;
        let report = report.map_err(|e| ServiceError::Unavailable(e.to_string()))?;
        for line in &report.repairs {
            if report.left.contains(line) {
                tracing::info!(drift = %line, "reconciler left drift as it is");
            } else if apply {
                tracing::warn!(repair = %line, "reconciler repaired drift");
            } else {
                tracing::info!(drift = %line, "reconciler found drift (dry run)");
            }
        }
        for line in &report.failed {
            tracing::warn!(failure = %line, "reconciler could not repair drift");
        }
        if !report.made.is_empty() {
            let now = self.now();
            in_tx!(self, write, |tx| {
                // Their leases are locked in id order, as every transaction that locks more
                // than one lease takes them.
                let mut made = Vec::with_capacity(report.made.len());
                for (reservation_id, ids) in &report.made {
                    if let Some(reservation) = tx.get_reservation(reservation_id).await? {
                        made.push((reservation.lease_id, reservation_id, ids));
                    }
                }
                made.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
                for (lease_id, reservation_id, ids) in made {
                    // Under its lease's lock, read again: an update may have just moved it.
                    tx.lock_lease(&lease_id).await?;
                    let Some(mut reservation) = tx.get_reservation(reservation_id).await? else {
                        continue;
                    };
                    if reservation.spec.set_made(ids) {
                        reservation.updated_at = Some(now);
                        tx.update_reservation(&reservation).await?;
                    }
                }
                Ok(())
            })?;
        }
        // Only a repairing pass carries out a start again, so only it finds these.
        for (kind, id) in &report.held_outside {
            if let Err(e) = self
                .take_out_held(kind, *id, "another project, found by the reconciler")
                .await
            {
                // The pass's repairs stand; the monitor's next pass takes it out.
                tracing::warn!(error = %e, resource.kind = %kind, resource.id = id,
                    "could not take out a resource held outside blazar-rs");
            }
        }
        Ok(report)
    }

    /// `POST /v1/reconcile` (admin): one pass on demand.
    pub async fn reconcile_for(
        &self,
        identity: &Identity,
        apply: bool,
    ) -> ServiceResult<ReconcileReport> {
        self.authorize_own("blazar:reconcile", identity)?;
        self.reconcile(apply).await
    }

    /// Reconciles (and repairs) every `interval` until `shutdown`, when this replica takes
    /// the interval's turn (`take_turn`): one pass an interval among replicas. Each time
    /// `wake` is notified (Nova said someone else changed an aggregate, a flavor or a server
    /// group), or a gone worker's claims were ended (its pass may have stopped half-way), a
    /// pass runs at once as well, whoever has the turn.
    ///
    /// The first pass comes soon after start (a replica restarted after a crash looks at
    /// once at what it may have left: 15 s), and a pass that failed (the cloud away) is
    /// tried again after `Settings::reconcile_retry` (30 s), doubling up to the interval, so
    /// that drift is repaired soon after the cloud is back rather than an interval later;
    /// past that, only the timed passes, until one succeeds.
    pub async fn run_reconciler(
        &self,
        interval: std::time::Duration,
        wake: Option<std::sync::Arc<tokio::sync::Notify>>,
        shutdown: impl Future<Output = ()>,
    ) {
        let first_retry = self.settings.reconcile_retry;
        tokio::pin!(shutdown);
        // Without notifications, a wake that never comes.
        let wake = wake.unwrap_or_default();
        let mut next = tokio::time::Instant::now() + interval.min(first_retry / 2);
        // The pause after a failed pass, while passes fail; once it would reach the
        // interval, the failures are left to the timed passes until one succeeds (a repair
        // the cloud keeps refusing must not start a new run of retries at every turn).
        let mut retry: Option<std::time::Duration> = None;
        let mut failing_for_long = false;
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(next) => {}
                () = wake.notified() => {
                    if !self.reconcile_on_word(&mut shutdown).await {
                        break;
                    }
                    continue;
                }
                () = self.reconcile_wake.notified() => {
                    if !self.reconcile_on_word(&mut shutdown).await {
                        break;
                    }
                    continue;
                }
                () = &mut shutdown => break,
            }
            next = tokio::time::Instant::now() + interval;
            // A retry is this replica's own: the turn of the interval was taken already.
            if retry.is_none() {
                match self.take_turn(crate::RECONCILE_TURN, interval).await {
                    Ok(true) => {}
                    // Another replica's reconciler took this interval's turn.
                    Ok(false) => continue,
                    Err(e) => {
                        tracing::warn!(error = %e, "reconciler could not take its turn");
                        continue;
                    }
                }
            }
            let failed = match self.reconcile(true).await {
                // An operator's pass is running: the next turn comes an interval later.
                Err(ServiceError::Conflict(reason)) => {
                    tracing::debug!(%reason, "reconciler pass skipped");
                    false
                }
                Ok(r) => {
                    Self::log_pass(&r);
                    !r.failed.is_empty()
                }
                Err(e) => {
                    tracing::warn!(error = %e, "reconciler pass failed");
                    true
                }
            };
            if !failed {
                failing_for_long = false;
            }
            retry = (failed && !failing_for_long)
                .then(|| retry.map_or(first_retry, |r| r * 2))
                .filter(|pause| *pause < interval);
            match retry {
                Some(pause) => next = tokio::time::Instant::now() + pause,
                None => failing_for_long |= failed,
            }
        }
    }

    /// A repairing pass because Nova said something the reconciler keeps was changed (not
    /// waiting for the turn). A pass already running may have read the cloud before the
    /// change: this one waits for it to end, and tries again for a minute. Then a pause of
    /// a few seconds, so that a burst of changes (an operator's script) comes to a few
    /// passes. False when shutdown came meanwhile.
    ///
    /// The pass waits a moment first: what Nova reports may be one step of a longer
    /// operation of its own. Deleting a compute service takes its host out of every
    /// aggregate before the service and its compute nodes go; a host put back in between
    /// stays a member that Nova, once the service is gone, can no longer take out, and the
    /// aggregate can never be deleted. (The wait narrows that window for the passes Nova's
    /// word starts; the timed passes skip hosts Nova no longer lists.)
    async fn reconcile_on_word(
        &self,
        shutdown: &mut std::pin::Pin<&mut impl Future<Output = ()>>,
    ) -> bool {
        const SETTLE: std::time::Duration = std::time::Duration::from_secs(2);
        const PAUSE: std::time::Duration = std::time::Duration::from_secs(5);
        if !sleep_unless(SETTLE, shutdown).await {
            return false;
        }
        for _ in 0..12 {
            match self.reconcile(true).await {
                Err(ServiceError::Conflict(_)) => {}
                Ok(r) => {
                    Self::log_pass(&r);
                    break;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "reconciler pass on Nova's word failed; the timed passes go on");
                    break;
                }
            }
            if !sleep_unless(PAUSE, shutdown).await {
                return false;
            }
        }
        sleep_unless(PAUSE, shutdown).await
    }

    fn log_pass(r: &ReconcileReport) {
        if r.changes().next().is_some() || !r.failed.is_empty() {
            tracing::warn!(
                repairs = r.changes().count(),
                failed = r.failed.len(),
                "reconciler pass found drift"
            );
        }
    }
}
