//! The OpenStack backend: actions on host reservations become what Blazar's host plugin does
//! to Nova (spec section 4.1 and 9). Every step checks before it acts, so an action that runs
//! twice leaves the cloud as running it once.

use std::time::Duration;

use async_trait::async_trait;
use blazar_core::{
    ActionKind, ActionPurpose, HostFacts, LeaseStatus, MadeIds, PHYSICAL_HOST, ReservationStatus,
};
use blazar_db::{RepairItem, Store};
use std::collections::BTreeSet;

use blazar_service::{
    Action, ActionError, ActionOutput, Backend, DesiredState, HeldHosts, HostHealth,
    InventoryError, ReconcileReport,
};
use serde_json::{Map, json};

use crate::Cloud;
use crate::error::Error;
use crate::nova::{Aggregate, Nova};
use crate::placement::reservation_provider_name;

/// How long a reconcile pass waits for the servers it deleted from a host to go before it
/// moves the host (Nova refuses to move a host with servers out of its zone); past it, the
/// move is left to the next pass rather than holding this one up.
const EVICTION_WAIT: Duration = Duration::from_secs(30);

/// Whether reservation `id`, not kept when `desired` was read, exists now: one made while
/// the pass ran, whose aggregate, flavor or addresses may already be in the cloud. Left to
/// the next pass (also when the database cannot say).
pub(crate) async fn appeared_since(store: &Store, desired: &DesiredState, id: &str) -> bool {
    if desired.kept.contains(id) {
        return false;
    }
    let Ok(mut tx) = store.read().await else {
        return true;
    };
    match tx.get_reservation(id).await {
        // One in ERROR is not new: what the cloud holds for it is what a take-back that
        // failed for good left.
        Ok(Some(r)) => !matches!(
            r.status,
            ReservationStatus::Deleted | ReservationStatus::Error
        ),
        Ok(None) => false,
        Err(_) => true,
    }
}

/// Whether reservation `id` is one this database has had: what the cloud holds for one it
/// never had (another Blazar's, on a cloud being moved to blazar-rs or shared, or made by
/// hand) is listed, never removed, and its servers are never deleted. `None` when the
/// database cannot tell now: left to the next pass. An empty id (a bare `reservation:`
/// tag or name) is no reservation's, though lease and host actions carry one.
pub(crate) async fn made_here(store: &Store, id: &str) -> Option<bool> {
    if id.is_empty() {
        return Some(false);
    }
    let mut tx = store.read().await.ok()?;
    tx.reservation_recorded(id).await.ok()
}

/// Whether `action`'s reservation is still in force as the pass found it: its lease ACTIVE,
/// the reservation active, no action open on the lease. A pass reads the database once, at
/// its start; a lease that ended since (its take-back may have run already) must not have
/// what it held made again, in the way of the next lease of the same address or segment.
pub(crate) async fn still_live(store: &Store, action: &Action) -> bool {
    let Ok(mut tx) = store.read().await else {
        return false;
    };
    let (Ok(Some(lease)), Ok(Some(reservation)), Ok(actions)) = (
        tx.get_lease(&action.lease_id).await,
        tx.get_reservation(&action.reservation_id).await,
        tx.actions_of_lease(&action.lease_id).await,
    ) else {
        return false;
    };
    lease.status == LeaseStatus::Active
        && reservation.status == ReservationStatus::Active
        && !actions.iter().any(|a| a.status.is_open())
}

/// Puts `host` into `aggregate`; answers false, having done nothing, when Nova no longer
/// has the host (its compute service deleted, which takes it out of every aggregate):
/// there is nothing left to move, and a take-back must not fail for good on it.
async fn put_host(nova: &Nova<'_>, aggregate: &Aggregate, host: &str) -> Result<bool, Error> {
    match nova.add_host(aggregate, host).await {
        Ok(()) => Ok(true),
        Err(e) if e.is_not_found() => {
            if nova.has_compute_service(host).await? {
                return Err(e);
            }
            tracing::warn!(host, aggregate = %aggregate.name,
                "host no longer in Nova: nothing to put back");
            Ok(false)
        }
        Err(e) => Err(e),
    }
}

/// Moves `host` from `from` into `to`: added before it is taken out, so that a move that
/// fails half-way leaves it in one pool or both, never in none (where BlazarFilter lets
/// every project in); unless both have an availability zone, where Nova keeps a host in
/// one zone and it must leave `from` first. Answers false, having gone no further, when
/// Nova no longer has the host.
async fn move_host(
    nova: &Nova<'_>,
    from: &Aggregate,
    to: &Aggregate,
    host: &str,
) -> Result<bool, Error> {
    let one_zone = from.availability_zone.is_some() && to.availability_zone.is_some();
    if one_zone {
        nova.remove_host(from, host).await?;
    }
    if !put_host(nova, to, host).await? {
        return Ok(false);
    }
    if !one_zone {
        nova.remove_host(from, host).await?;
    }
    Ok(true)
}

/// The reconciler's add of `host` to `aggregate`. Nova, deleting a compute service, takes
/// its host out of every aggregate and then keeps for good any membership added before the
/// service is gone; the pass's list of services may be seconds old by now (evictions wait
/// on servers), so Nova is asked again right before the add.
async fn repair_add(nova: &Nova<'_>, aggregate: &Aggregate, host: &str) -> Result<(), Error> {
    if aggregate.hosts.iter().any(|h| h == host) {
        return Ok(());
    }
    has_service(nova, host).await?;
    nova.add_host(aggregate, host).await
}

/// Fails, naming the host, when Nova no longer has its compute service: asked before a
/// repair evicts servers for a host it is to add (and again right before the add).
async fn has_service(nova: &Nova<'_>, host: &str) -> Result<(), Error> {
    if nova.has_compute_service(host).await? {
        Ok(())
    } else {
        Err(Error::Refused(format!(
            "Nova no longer has a compute service for host {host}: not added"
        )))
    }
}

/// Whether Nova lists a compute service for `host`, by `services` (`None`: the list could
/// not be read, and every host counts as listed).
fn listed(services: Option<&BTreeSet<String>>, host: &str) -> bool {
    services.is_none_or(|s| s.contains(host))
}

/// What a repair of `hosts` (service names; of `lease_id`'s reservation, if given) changes,
/// to hold it against the action workers. A host no longer enrolled has no actions.
pub(crate) fn host_item<'a>(
    desired: &DesiredState,
    lease_id: Option<&str>,
    hosts: impl IntoIterator<Item = &'a String>,
) -> RepairItem {
    let mut resources: Vec<(String, i64)> = hosts
        .into_iter()
        .filter_map(|h| desired.host_ids.get(h))
        .map(|&id| (PHYSICAL_HOST.to_string(), id))
        .collect();
    resources.sort_unstable();
    resources.dedup();
    RepairItem {
        lease_id: lease_id.map(str::to_string),
        resources,
    }
}

/// Whether `host` (a service name) is granted now to a host reservation in force or
/// stranded.
fn granted(desired: &DesiredState, host: &str) -> bool {
    desired
        .reservations
        .iter()
        .chain(&desired.stranded)
        .any(|r| r.hosts.iter().any(|h| h == host))
}

/// One reconciler pass's findings: every difference, and each repair that failed with its
/// error. A failed repair is recorded and the pass goes on, so that one piece of the cloud
/// that cannot be repaired (a deleted hypervisor, a host Nova will not move) does not keep
/// every other difference from being repaired.
#[derive(Default)]
pub(crate) struct Pass {
    pub(crate) repairs: Vec<String>,
    pub(crate) failed: Vec<String>,
    /// (reservation id, ids) of what repairs made again for instance reservations.
    pub(crate) made: Vec<(String, MadeIds)>,
    /// (kind, resource id) of reserved resources another project holds in the cloud.
    pub(crate) held_outside: Vec<(String, i64)>,
    /// The lines of `repairs` that are differences left as they are on purpose (nothing
    /// to change, nothing to hold).
    pub(crate) left: Vec<String>,
}

impl Pass {
    /// Whether it found anything to change.
    pub(crate) fn changes(&self) -> bool {
        self.repairs.len() > self.left.len()
    }

    /// Records a difference that is left as it is.
    pub(crate) fn leave(&mut self, line: String) {
        self.repairs.push(line.clone());
        self.left.push(line);
    }

    /// Takes `other`'s findings as this pass's.
    pub(crate) fn absorb(&mut self, other: Pass) {
        self.left.extend(other.left);
        self.repairs.extend(other.repairs);
        self.failed.extend(other.failed);
        self.made.extend(other.made);
        self.held_outside.extend(other.held_outside);
    }

    /// Records a difference; returns its line, to name a failed repair of it.
    pub(crate) fn found(&mut self, line: String) -> String {
        self.repairs.push(line.clone());
        line
    }

    /// Takes the repairs that failed (a failure names its repair's line, then the error)
    /// out of `repairs`: an applied pass reports them as failed only, not also as repaired.
    pub(crate) fn drop_failed_repairs(&mut self) {
        let failed = &self.failed;
        self.repairs.retain(|line| {
            let prefix = format!("{line}: ");
            !failed.iter().any(|f| f.starts_with(&prefix))
        });
    }

    /// Whether a repair step of `line` worked; a failure is recorded.
    pub(crate) fn done<T, E: std::fmt::Display>(
        &mut self,
        line: &str,
        result: Result<T, E>,
    ) -> bool {
        self.value(line, result).is_some()
    }

    /// The result of a repair step of `line`, or `None` with the failure recorded.
    pub(crate) fn value<T, E: std::fmt::Display>(
        &mut self,
        line: &str,
        result: Result<T, E>,
    ) -> Option<T> {
        match result {
            Ok(value) => Some(value),
            Err(e) => {
                self.failed.push(format!("{line}: {e}"));
                None
            }
        }
    }
}

#[derive(Debug, Clone)]
pub struct OpenStackSettings {
    /// The aggregate of hosts no reservation holds (Blazar's `[nova] aggregate_freepool_name`).
    pub freepool: String,
    /// Metadata key naming the owning project (`[nova] blazar_owner`).
    pub owner_key: String,
    /// Availability-zone prefix of reservation aggregates (`[nova] blazar_az_prefix`).
    pub az_prefix: String,
    /// How long a take-back waits for the servers on a host to be gone.
    pub server_delete_timeout: Duration,
}

impl Default for OpenStackSettings {
    fn default() -> Self {
        OpenStackSettings {
            freepool: "freepool".into(),
            owner_key: "blazar:owner".into(),
            az_prefix: "blazar_".into(),
            server_delete_timeout: Duration::from_secs(240),
        }
    }
}

pub struct OpenStackBackend {
    cloud: Cloud,
    settings: OpenStackSettings,
}

pub(crate) fn action_error(e: Error) -> ActionError {
    if e.is_transient() {
        ActionError::Transient(e.to_string())
    } else {
        ActionError::Permanent(e.to_string())
    }
}

impl OpenStackBackend {
    pub fn new(cloud: Cloud, settings: OpenStackSettings) -> OpenStackBackend {
        OpenStackBackend { cloud, settings }
    }

    pub fn cloud(&self) -> &Cloud {
        &self.cloud
    }

    pub fn settings(&self) -> &OpenStackSettings {
        &self.settings
    }

    /// The compute service hosts of the action's resources, as aggregates name them.
    /// With each, the hypervisor hostname: what Nova names its compute node's provider.
    async fn service_hosts(
        store: &Store,
        ids: &[i64],
    ) -> Result<Vec<(String, String)>, ActionError> {
        let db = |e: blazar_db::DbError| ActionError::Transient(format!("database: {e}"));
        let mut tx = store.read().await.map_err(db)?;
        let mut hosts = Vec::with_capacity(ids.len());
        for &id in ids {
            match tx.get_host(id).await.map_err(db)? {
                Some(h) => hosts.push((h.facts.service_name, h.facts.hypervisor_hostname)),
                // Deleted from the inventory since: nothing of ours to move.
                None => tracing::warn!(host.id = id, "host of an action no longer enrolled"),
            }
        }
        Ok(hosts)
    }

    /// Hand-over: the reservation's aggregate (created, with its zone and owner, if it is
    /// not there), and each host moved from the freepool into it, servers on it deleted
    /// first (Blazar's "terminate preemptibles").
    ///
    /// Each move adds to the new place before it takes out of the old one: a host in no
    /// pool is open to every project's servers (BlazarFilter passes it without a hint), so
    /// an attempt that fails half-way must leave it in one pool or both, never in none. In
    /// the freepool and its reservation's aggregate at once, only the owner (with the hint)
    /// gets in.
    async fn start_hosts(&self, action: &Action, hosts: &[String]) -> Result<(), Error> {
        let nova = self.cloud.nova(action.request_id.as_deref());
        let aggregate = self.reservation_aggregate(&nova, action).await?;
        let freepool = nova.ensure_aggregate(&self.settings.freepool, None).await?;
        let aggregates = nova.aggregates().await?;
        for host in hosts {
            // Cleared while still in the freepool, where no new server can land. A host
            // still in this reservation's aggregate is handed back to it (healed away while
            // its servers ran there, or a hand-over half done): in both pools only the
            // owner's servers, booted with the reservation's hint, can be there, and they
            // are the lease's own; only other projects' servers go.
            let cleared = if aggregate.hosts.iter().any(|h| h == host) {
                let owner = action.project_id.as_str();
                nova.evict_from_host(
                    host,
                    |project| project != owner,
                    self.settings.server_delete_timeout,
                )
                .await?
            } else {
                nova.clear_host(host, self.settings.server_delete_timeout)
                    .await?
            };
            if cleared > 0 {
                tracing::info!(host, servers = cleared, reservation.id = %action.reservation_id,
                    "deleted servers left on a host before handing it over");
            }
            // The host is this reservation's now: an earlier one whose take-back failed
            // for good still has it in its zone, where Nova would keep it from moving.
            for stale in self.held_elsewhere(&aggregates, host, &action.reservation_id) {
                tracing::warn!(host, aggregate = %stale.name, reservation.id = %action.reservation_id,
                    "host still in an earlier reservation's aggregate: taken out before the hand-over");
                nova.remove_host(stale, host).await?;
            }
            // A host Nova no longer has (healed away since this start was recorded: the
            // change that replaced it comes after) has nothing to hand over.
            if !move_host(&nova, &freepool, &aggregate, host).await? {
                continue;
            }
            tracing::info!(host, aggregate = %action.reservation_id, project.id = %action.project_id,
                "host moved into its reservation's aggregate");
        }
        Ok(())
    }

    /// Take-back: every server on the hosts deleted and waited for, each host moved back to
    /// the freepool; at the end of the lease (or its delete) the aggregate goes too.
    ///
    /// A host taken from a lease still in force (healing, re-allocation) keeps its servers,
    /// as Blazar's healing only moves the host out of the aggregate: a compute service
    /// down for a minute or disabled by an operator must not cost a running lease its
    /// servers. The next hand-over of the host clears it.
    async fn stop_hosts(&self, action: &Action, hosts: &[String]) -> Result<(), Error> {
        let keep_servers = action.purpose == ActionPurpose::Change;
        let nova = self.cloud.nova(action.request_id.as_deref());
        let freepool = nova.ensure_aggregate(&self.settings.freepool, None).await?;
        let aggregates = nova.aggregates().await?;
        let aggregate = aggregates
            .iter()
            .find(|a| a.name == action.reservation_id)
            .cloned();
        for host in hosts {
            // Handed over to another reservation since (a take-back that came late, after
            // the next lease's hand-over): the host and its servers are that one's now.
            if let Some(other) = self
                .held_elsewhere(&aggregates, host, &action.reservation_id)
                .next()
            {
                tracing::warn!(host, aggregate = %other.name, reservation.id = %action.reservation_id,
                    "host already handed to another reservation: left to it");
                continue;
            }
            if !keep_servers {
                let cleared = nova
                    .clear_host(host, self.settings.server_delete_timeout)
                    .await?;
                if cleared > 0 {
                    tracing::info!(host, servers = cleared, reservation.id = %action.reservation_id,
                        "deleted the servers of an ended reservation");
                }
            }
            // `move_host`'s order, spelled out: only a refusal to take the host out of the
            // aggregate may leave it there.
            let zoned = freepool.availability_zone.is_some();
            if !zoned && !put_host(&nova, &freepool, host).await? {
                continue;
            }
            if let Some(aggregate) = &aggregate {
                match nova.remove_host(aggregate, host).await {
                    // Nova keeps a host with servers in its zone. Taken from a lease in
                    // force, it stays in the aggregate with them (in the freepool as well,
                    // so only the owner gets in) until they go, the lease ends, or the
                    // host's next hand-over clears it.
                    Err(e) if keep_servers && e.is_conflict() => {
                        tracing::warn!(host, reservation.id = %action.reservation_id, error = %e,
                            "host taken from a reservation still holds its servers: left in its aggregate");
                        continue;
                    }
                    other => other?,
                }
            }
            if zoned && !put_host(&nova, &freepool, host).await? {
                continue;
            }
            tracing::info!(host, "host back in the freepool");
        }
        let whole = matches!(
            action.purpose,
            ActionPurpose::LeaseEnd | ActionPurpose::Delete
        );
        if whole && let Some(aggregate) = nova.find_aggregate(&action.reservation_id).await? {
            // Hosts in the aggregate that were not part of this action (none, normally: a
            // host healed away whose take-back did not finish, or one put there by hand).
            // Only the project's servers go: another project's were there before the host
            // was, and are not the reservation's to end.
            for host in &aggregate.hosts {
                let project = (!action.project_id.is_empty()).then_some(action.project_id.as_str());
                nova.clear_host_of(host, project, self.settings.server_delete_timeout)
                    .await?;
                move_host(&nova, &aggregate, &freepool, host).await?;
            }
            nova.delete_aggregate(&aggregate).await?;
            tracing::info!(aggregate = %action.reservation_id, "reservation aggregate deleted");
        }
        Ok(())
    }
}

/// Blazar's `HostHavingServers` (409) when Nova lists servers on compute service
/// `service`, named `name` in the answer.
async fn refuse_with_servers(
    nova: &Nova<'_>,
    service: &str,
    name: &str,
) -> Result<(), InventoryError> {
    let servers = nova
        .servers_on_host(service)
        .await
        .map_err(|e| InventoryError::Unavailable(format!("nova: {e}")))?;
    if servers.is_empty() {
        return Ok(());
    }
    let ids: Vec<String> = servers.into_iter().map(|(id, _)| id).collect();
    Err(InventoryError::Conflict(format!(
        "Servers [{}] found for host {name}",
        ids.join(", ")
    )))
}

#[async_trait]
impl Backend for OpenStackBackend {
    async fn apply(&self, store: &Store, action: &Action) -> Result<ActionOutput, ActionError> {
        match (action.reservation_type.as_str(), action.kind) {
            (crate::instances::VIRTUAL_INSTANCE | crate::instances::FLAVOR_INSTANCE, kind)
                if !matches!(kind, ActionKind::Enrol | ActionKind::Withdraw) =>
            {
                self.instances(store, action).await
            }
            (crate::pools::FLOATINGIP, ActionKind::Start | ActionKind::Stop) => Ok(ActionOutput {
                held_outside: self.floatingips(store, action).await?,
                ..ActionOutput::default()
            }),
            (crate::pools::NETWORK, ActionKind::Start | ActionKind::Stop) => Ok(ActionOutput {
                held_outside: self.networks(store, action).await?,
                ..ActionOutput::default()
            }),
            _ => self
                .apply_plain(store, action)
                .await
                .map(|()| ActionOutput::default()),
        }
    }

    fn prepares_reservations(&self) -> bool {
        true
    }

    /// Nova's view of the hypervisor (by hostname, id or service host), refused as Blazar
    /// refuses it: unknown (404), or with servers on it (409).
    async fn describe_host(&self, name: &str) -> Result<Option<HostFacts>, InventoryError> {
        let unavailable = |e: Error| InventoryError::Unavailable(format!("nova: {e}"));
        let nova = self.cloud.nova(None);
        let Some(h) = nova.find_hypervisor(name).await.map_err(unavailable)? else {
            return Err(InventoryError::NotFound(format!(
                "Host '{name}' not found!"
            )));
        };
        refuse_with_servers(&nova, &h.facts.service_name, name).await?;
        let mut facts = h.facts;
        facts.availability_zone = nova
            .compute_services()
            .await
            .map_err(unavailable)?
            .into_iter()
            .find(|s| s.host == facts.service_name)
            .map(|s| s.zone)
            .unwrap_or_default();
        Ok(Some(facts))
    }

    /// Refused while servers run on the host (Blazar's `HostHavingServers`): a host healed
    /// away from a running lease keeps the lease's servers, and its aggregate with them.
    async fn check_withdrawal(&self, facts: &HostFacts) -> Result<(), InventoryError> {
        let nova = self.cloud.nova(None);
        refuse_with_servers(&nova, &facts.service_name, &facts.hypervisor_hostname).await
    }

    fn acts_on_inventory(&self) -> bool {
        true
    }

    /// The compute node's Placement provider: its allocation ratios (what instance slots
    /// are counted with, as Blazar reads them at enrolment) and its custom traits (what
    /// `trait:CUSTOM_*=required` flavors match). Standard traits are not copied: every
    /// host of a driver has the same ones.
    async fn host_capabilities(
        &self,
        facts: &HostFacts,
    ) -> Result<std::collections::BTreeMap<String, String>, InventoryError> {
        let unavailable = |e: Error| InventoryError::Unavailable(format!("placement: {e}"));
        let placement = self.cloud.placement(None);
        let mut capabilities = std::collections::BTreeMap::new();
        let Some(node) = placement
            .provider_by_name(&facts.hypervisor_hostname)
            .await
            .map_err(unavailable)?
        else {
            return Ok(capabilities);
        };
        for (class, _total, ratio, _reserved) in placement
            .inventories(&node.uuid)
            .await
            .map_err(unavailable)?
        {
            let key = match class.as_str() {
                "VCPU" => "cpu_allocation_ratio",
                "MEMORY_MB" => "ram_allocation_ratio",
                "DISK_GB" => "disk_allocation_ratio",
                _ => continue,
            };
            capabilities.insert(key.to_string(), ratio.to_string());
        }
        for t in placement.traits(&node.uuid).await.map_err(unavailable)? {
            if t.starts_with("CUSTOM_") {
                capabilities.insert(t, "true".to_string());
            }
        }
        Ok(capabilities)
    }

    /// The source flavor of a `flavor:instance` reservation, as the caller sees it in Nova
    /// (admins see every flavor, others public ones and those shared with their project).
    async fn flavor(
        &self,
        identity: &blazar_service::Identity,
        id_or_name: &str,
    ) -> Result<Option<serde_json::Value>, InventoryError> {
        let project = (!identity.is_admin()).then_some(identity.project_id.as_str());
        match self
            .cloud
            .nova(None)
            .flavor_seen_by(id_or_name, project)
            .await
        {
            Ok(Some(flavor)) => Ok(Some(flavor)),
            // Nova's words for a flavor it does not show.
            Ok(None) => Err(InventoryError::NotFound(format!(
                "Flavor {id_or_name} could not be found."
            ))),
            Err(e) => Err(InventoryError::Unavailable(format!("compute: {e}"))),
        }
    }

    /// Placement's `GET /resource_providers?required=T1,!T2`, as Blazar's flavor plugin
    /// asks it: the compute nodes (named as their hypervisors) with those traits.
    async fn hosts_with_traits(
        &self,
        traits: &[(String, bool)],
    ) -> Result<Option<std::collections::HashSet<String>>, InventoryError> {
        let required: Vec<String> = traits
            .iter()
            .filter(|(_, r)| *r)
            .map(|(t, _)| t.clone())
            .collect();
        let forbidden: Vec<String> = traits
            .iter()
            .filter(|(_, r)| !*r)
            .map(|(t, _)| t.clone())
            .collect();
        let names = self
            .cloud
            .placement(None)
            .providers_with_traits(&required, &forbidden)
            .await
            .map_err(|e| match e.status() {
                // A trait Placement does not know (or a malformed name).
                Some(400) => InventoryError::Invalid(format!(
                    "Malformed parameter trait: Placement refuses {}: {e}",
                    traits
                        .iter()
                        .map(|(t, r)| if *r { t.clone() } else { format!("!{t}") })
                        .collect::<Vec<_>>()
                        .join(",")
                )),
                _ => InventoryError::Unavailable(format!("placement: {e}")),
            })?;
        Ok(Some(names.into_iter().collect()))
    }

    /// Blazar's `FloatingIPPool.fetch_subnet`, with its messages.
    async fn check_floatingip(
        &self,
        network_id: &str,
        address: std::net::IpAddr,
    ) -> Result<Option<String>, InventoryError> {
        use crate::neutron::AddressCheck;
        let checked = self
            .cloud
            .neutron(None)
            .check_address(network_id, address)
            .await
            .map_err(|e| InventoryError::Unavailable(format!("neutron: {e}")))?;
        match checked {
            AddressCheck::NoNetwork => Err(InventoryError::Invalid(format!(
                "Failed to find network {network_id}"
            ))),
            AddressCheck::NoSubnet => Err(InventoryError::NotFound(format!(
                "Valid subnet for the floating IP {address} is not found."
            ))),
            AddressCheck::UsedByNeutron { subnet_id } => Err(InventoryError::Invalid(format!(
                "The floating IP {address} is used in allocation_pools or gateway_ip in subnet \
                 {subnet_id} ."
            ))),
            AddressCheck::Reservable { subnet_id } => Ok(Some(subnet_id)),
        }
    }

    async fn reconcile(
        &self,
        store: &Store,
        desired: &DesiredState,
        apply: bool,
    ) -> Result<ReconcileReport, InventoryError> {
        // Each part goes on past a failed repair, and a part that cannot read the cloud
        // does not keep the others from running; the pass fails only when neither the
        // aggregates nor the leftovers could be listed (the cloud does not answer).
        let mut pass = Pass::default();
        let mut unread = Vec::new();
        if let Err(e) = self.reconcile_hosts(store, desired, apply, &mut pass).await {
            unread.push(format!("host aggregates could not be read: nova: {e}"));
        } else if let Err(e) = self
            .reconcile_placement_members(store, desired, apply, &mut pass)
            .await
        {
            pass.failed.push(format!(
                "Placement's copy of the aggregates could not be checked: {e}"
            ));
        }
        self.reconcile_live(store, desired, apply, &mut pass).await;
        if let Err(e) = self
            .reconcile_orphans(store, desired, apply, &mut pass)
            .await
        {
            unread.push(format!("leftovers could not be listed: {e}"));
        }
        if unread.len() == 2 {
            return Err(InventoryError::Unavailable(unread.join("; ")));
        }
        pass.failed.extend(unread);
        if apply {
            pass.drop_failed_repairs();
        }
        Ok(ReconcileReport {
            applied: apply,
            repairs: pass.repairs,
            failed: pass.failed,
            made: pass.made,
            held_outside: pass.held_outside,
            left: pass.left,
        })
    }

    async fn pools_taken(
        &self,
        checks: &[blazar_service::PoolCheck],
    ) -> Result<Option<std::collections::BTreeMap<i64, String>>, InventoryError> {
        self.pools_held_outside(checks)
            .await
            .map(Some)
            .map_err(|e| InventoryError::Unavailable(format!("neutron: {e}")))
    }

    /// Blazar's polling monitor: a hypervisor `state=down` or `status=disabled` is failed.
    async fn host_health(&self) -> Result<Option<Vec<HostHealth>>, InventoryError> {
        let nova = self.cloud.nova(None);
        let unavailable = |e: Error| InventoryError::Unavailable(format!("nova: {e}"));
        let hypervisors = nova.hypervisors().await.map_err(unavailable)?;
        let zones = nova.compute_services().await.map_err(unavailable)?;
        Ok(Some(
            hypervisors
                .into_iter()
                .map(|h| {
                    let mut facts = h.facts;
                    facts.availability_zone = zones
                        .iter()
                        .find(|s| s.host == facts.service_name)
                        .map(|s| s.zone.clone())
                        .unwrap_or_default();
                    HostHealth {
                        healthy: h.state == "up" && h.status == "enabled",
                        reason: format!("state={} status={}", h.state, h.status),
                        hypervisor_hostname: facts.hypervisor_hostname.clone(),
                        facts: Some(facts),
                    }
                })
                .collect(),
        ))
    }
}

impl OpenStackBackend {
    /// Every action but those of instance reservations: nothing to show afterwards.
    async fn apply_plain(&self, store: &Store, action: &Action) -> Result<(), ActionError> {
        match action.kind {
            ActionKind::Enrol => return self.enrol(action).await.map_err(action_error),
            ActionKind::Withdraw => return self.withdraw(action).await.map_err(action_error),
            ActionKind::Start
            | ActionKind::Stop
            | ActionKind::Prepare
            | ActionKind::Release
            | ActionKind::Snapshot => {}
            // The service's workers tell usage enforcement and delete trusts themselves;
            // nothing in the cloud.
            ActionKind::OnEnd | ActionKind::DeleteTrust => return Ok(()),
        }
        // Starts and stops of these are carried out by `apply` (their output says what was
        // held outside); nothing else acts on them.
        if matches!(
            action.reservation_type.as_str(),
            crate::pools::FLOATINGIP | crate::pools::NETWORK
        ) {
            return Ok(());
        }
        if action.reservation_type != PHYSICAL_HOST {
            return Err(ActionError::Permanent(format!(
                "the openstack backend does not act on {} reservations yet",
                action.reservation_type
            )));
        }
        let nodes = Self::service_hosts(store, &action.resources).await?;
        // An earlier attempt may have moved a host in Nova without Nova's copy of it
        // reaching Placement (Nova keeps the change and answers 500 when Placement does
        // not answer); this attempt finds the host moved and would not call Nova again.
        if action.attempt > 1 && matches!(action.kind, ActionKind::Start | ActionKind::Stop) {
            self.copy_memberships(action, &nodes)
                .await
                .map_err(action_error)?;
        }
        let hosts: Vec<String> = nodes.into_iter().map(|(service, _)| service).collect();
        let result = match action.kind {
            ActionKind::Prepare => self.prepare(action).await,
            ActionKind::Release => self.release(action).await,
            ActionKind::Snapshot => self.snapshot(action, &hosts).await,
            ActionKind::Stop => self.stop_hosts(action, &hosts).await,
            _ => self.start_hosts(action, &hosts).await,
        };
        result.map_err(action_error)
    }

    /// At reservation: the aggregate named after it, in its own zone, owned by the project
    /// (the hosts join it at start).
    async fn prepare(&self, action: &Action) -> Result<(), Error> {
        let nova = self.cloud.nova(action.request_id.as_deref());
        self.reservation_aggregate(&nova, action).await.map(|_| ())
    }

    /// The aggregate named after the reservation, in its own zone and owned by its project,
    /// made (or its owner set) if need be.
    async fn reservation_aggregate(
        &self,
        nova: &Nova<'_>,
        action: &Action,
    ) -> Result<Aggregate, Error> {
        let zone = format!("{}{}", self.settings.az_prefix, action.reservation_id);
        let aggregate = nova
            .ensure_aggregate(&action.reservation_id, Some(&zone))
            .await?;
        nova.set_zone(&aggregate, &zone).await?;
        nova.set_exact_metadata(
            &aggregate,
            &self.host_aggregate_metadata(&action.project_id),
        )
        .await?;
        Ok(aggregate)
    }

    /// The host reservations' aggregates (named by their zone) other than
    /// `reservation_id`'s that hold `host`.
    fn held_elsewhere<'a>(
        &'a self,
        aggregates: &'a [Aggregate],
        host: &'a str,
        reservation_id: &'a str,
    ) -> impl Iterator<Item = &'a Aggregate> + 'a {
        aggregates.iter().filter(move |a| {
            a.name != reservation_id && a.hosts.iter().any(|h| h == host) && self.in_our_zone(a)
        })
    }

    /// Whether `aggregate` has a zone of ours (`az_prefix`): a host reservation's.
    fn in_our_zone(&self, aggregate: &Aggregate) -> bool {
        aggregate
            .availability_zone
            .as_deref()
            .is_some_and(|z| z.starts_with(&self.settings.az_prefix))
    }

    /// The metadata of a host reservation's aggregate: its owner, nothing else.
    fn host_aggregate_metadata(&self, project_id: &str) -> Map<String, serde_json::Value> {
        let mut metadata = Map::new();
        metadata.insert(self.settings.owner_key.clone(), json!(project_id));
        metadata
    }

    /// A reservation deleted before it started: its (empty) aggregate goes.
    async fn release(&self, action: &Action) -> Result<(), Error> {
        let nova = self.cloud.nova(action.request_id.as_deref());
        if let Some(aggregate) = nova.find_aggregate(&action.reservation_id).await? {
            if !aggregate.hosts.is_empty() {
                let freepool = nova.ensure_aggregate(&self.settings.freepool, None).await?;
                for host in &aggregate.hosts {
                    nova.remove_host(&aggregate, host).await?;
                    nova.add_host(&freepool, host).await?;
                }
            }
            nova.delete_aggregate(&aggregate).await?;
        }
        Ok(())
    }

    /// `before_end: snapshot`: an image of every server on the hosts, named as Blazar names
    /// them (`reserved_<server name>`).
    async fn snapshot(&self, action: &Action, hosts: &[String]) -> Result<(), Error> {
        let nova = self.cloud.nova(action.request_id.as_deref());
        for host in hosts {
            for (id, name) in nova.servers_on_host(host).await? {
                let image = format!("reserved_{name}");
                // Once per server, however many times the action runs.
                if self.cloud.image_of_server_exists(&image, &id).await? {
                    continue;
                }
                nova.create_image(&id, &image).await?;
                tracing::info!(server.id = %id, host, "snapshot requested before the lease ends");
            }
        }
        Ok(())
    }

    /// Nova's aggregates against the database: every reservation in force has its aggregate
    /// with its owner and exactly its hosts; no aggregate of a reservation no longer in force
    /// is left; every other enrolled host is in the freepool. Returns what differed.
    async fn reconcile_hosts(
        &self,
        store: &Store,
        desired: &DesiredState,
        apply: bool,
        pass: &mut Pass,
    ) -> Result<(), Error> {
        let nova = self.cloud.nova(None);
        let aggregates = nova.aggregates().await?;
        // A host whose compute service Nova no longer has (or is deleting) is put into no
        // aggregate and taken out of none: the monitor takes it out of service, and a host
        // added while Nova deletes its service stays a member no call can take out (see
        // `Service::reconcile_on_word`). Unread, every host counts as listed.
        let services = match nova.compute_services().await {
            Ok(list) => Some(list.into_iter().map(|s| s.host).collect::<BTreeSet<_>>()),
            Err(e) => {
                pass.failed
                    .push(format!("compute services could not be listed: nova: {e}"));
                None
            }
        };
        let in_nova = services.as_ref();
        let freepool = match aggregates.iter().find(|a| a.name == self.settings.freepool) {
            Some(f) => Some(f.clone()),
            None => {
                let line = pass.found(format!(
                    "aggregate {} missing: created",
                    self.settings.freepool
                ));
                if apply {
                    pass.value(
                        &line,
                        nova.ensure_aggregate(&self.settings.freepool, None).await,
                    )
                } else {
                    None
                }
            }
        };
        let busy = |h: &String| desired.busy_hosts.contains(h);
        let mut in_force: BTreeSet<&str> = BTreeSet::new();
        let mut reserved: BTreeSet<&str> = BTreeSet::new();
        // Reservations in force, then those of leases not started: their aggregates exist
        // from the reservation on, empty, owned by the project, in their own zone.
        let upcoming = desired.upcoming.iter().map(|r| (r, true));
        for (r, pending) in desired
            .reservations
            .iter()
            .map(|r| (r, false))
            .chain(upcoming)
        {
            in_force.insert(&r.reservation_id);
            reserved.extend(r.hosts.iter().map(String::as_str));
            if r.hosts.iter().any(busy) {
                continue;
            }
            // Looked at first without a change: only a reservation that differs is held, and
            // one an action changed since the pass read the database is left to the next.
            let mut look = Pass::default();
            let freepool = freepool.as_ref();
            let check = async |apply: bool, pass: &mut Pass| {
                self.reconcile_reservation(
                    &aggregates,
                    freepool,
                    desired,
                    in_nova,
                    r,
                    pending,
                    apply,
                    pass,
                )
                .await
            };
            check(false, &mut look).await;
            if !apply || !look.changes() {
                pass.absorb(look);
                continue;
            }
            let touched: Vec<&String> = aggregates
                .iter()
                .filter(|a| a.name == r.reservation_id)
                .flat_map(|a| &a.hosts)
                .collect();
            // A host of its aggregate that an open action is moving: left to that action.
            if touched.iter().any(|h| busy(h)) {
                continue;
            }
            let item = host_item(desired, Some(&r.lease_id), r.hosts.iter().chain(touched));
            if !desired.hold(store, &item).await {
                continue;
            }
            check(true, pass).await;
            desired.release(store).await;
        }
        // Reservations whose start or change failed for good keep their hosts and aggregate
        // as they are, but no other project may be let in.
        for r in &desired.stranded {
            in_force.insert(&r.reservation_id);
            let own = aggregates.iter().find(|a| a.name == r.reservation_id);
            for host in &r.hosts {
                let pooled = freepool.as_ref().is_some_and(|f| f.hosts.contains(host))
                    || aggregates
                        .iter()
                        .any(|a| self.in_our_zone(a) && a.hosts.contains(host));
                // A host in no pool (taken out of every pool by hand) lets anyone's
                // servers in, BlazarFilter passing it: into the owner's aggregate, or,
                // with none, back to the freepool (below) rather than open to all.
                match (pooled, own) {
                    (false, Some(_)) if !listed(in_nova, host) => {
                        pass.leave(format!(
                            "host {host} of reservation {} has no compute service in Nova: \
                             left out of its aggregate",
                            r.reservation_id
                        ));
                        // Still its reservation's: not listed again as missing from the
                        // freepool.
                        reserved.insert(host.as_str());
                        continue;
                    }
                    (false, Some(aggregate)) => {
                        let line = pass.found(format!(
                            "host {host} of reservation {} in no pool: put into its aggregate",
                            r.reservation_id
                        ));
                        let item = host_item(desired, Some(&r.lease_id), [host]);
                        if apply && desired.hold(store, &item).await {
                            // Others' servers that landed there meanwhile go first, as when
                            // a granted host is put back.
                            let owner = r.project_id.as_str();
                            if pass.done(&line, has_service(&nova, host).await)
                                && pass.done(
                                    &line,
                                    nova.evict_from_host(host, |p| p != owner, EVICTION_WAIT)
                                        .await,
                                )
                            {
                                pass.done(&line, repair_add(&nova, aggregate, host).await);
                            }
                            desired.release(store).await;
                        }
                    }
                    (false, None) => continue,
                    (true, _) => {}
                }
                reserved.insert(host.as_str());
            }
            if let Some(aggregate) = own {
                self.repair_owner(&nova, aggregate, r, apply, pass).await;
            }
        }
        // Aggregates of reservations no longer in force (an ended or deleted lease whose
        // take-back did not finish, or a hand-made copy).
        let mut put_back: BTreeSet<&str> = BTreeSet::new();
        for aggregate in &aggregates {
            if !self.in_our_zone(aggregate)
                || in_force.contains(aggregate.name.as_str())
                // An instance reservation's aggregate given a zone by hand: its own
                // checks own it, not the host reservations'.
                || (crate::nova::names_reservation(aggregate)
                    && desired.kept.contains(&aggregate.name))
                || desired.busy_reservations.contains(&aggregate.name)
                || aggregate.hosts.iter().any(busy)
                || appeared_since(store, desired, &aggregate.name).await
            {
                continue;
            }
            // One of a reservation this database never had is left as it is, but for
            // enrolled hosts put into it: those are taken out (into the freepool, or their
            // reservation's aggregate above), its servers never deleted.
            let Some(ours) = made_here(store, &aggregate.name).await else {
                continue;
            };
            let taken: Vec<&String> = aggregate
                .hosts
                .iter()
                .filter(|h| ours || desired.host_ids.contains_key(*h))
                .collect();
            let line = if ours {
                pass.found(format!(
                    "aggregate {} belongs to no reservation in force: removed",
                    aggregate.name
                ))
            } else if taken.is_empty() {
                pass.leave(format!(
                    "aggregate {} in Blazar's zones belongs to no reservation of this \
                     database: left",
                    aggregate.name
                ));
                continue;
            } else {
                let names: Vec<&str> = taken.iter().map(|h| h.as_str()).collect();
                pass.found(format!(
                    "aggregate {} in Blazar's zones belongs to no reservation of this \
                     database: enrolled {} taken out",
                    aggregate.name,
                    names.join(", ")
                ))
            };
            if apply
                && desired
                    .hold(store, &host_item(desired, None, taken.iter().copied()))
                    .await
            {
                let mut emptied = true;
                // Its owner's servers end with it, as at a lease's end (and Nova keeps a
                // host with servers in the zone), when the reservation was this database's.
                let owner = aggregate
                    .metadata
                    .get(&self.settings.owner_key)
                    .and_then(|v| v.as_str())
                    .filter(|_| ours);
                for host in taken {
                    if !listed(in_nova, host) {
                        pass.leave(format!(
                            "host {host} of aggregate {} has no compute service in Nova: left",
                            aggregate.name
                        ));
                        emptied = false;
                        continue;
                    }
                    if let Some(owner) = owner
                        && !pass.done(
                            &line,
                            nova.evict_from_host(host, |p| p == owner, EVICTION_WAIT)
                                .await,
                        )
                    {
                        emptied = false;
                        continue;
                    }
                    // Into the freepool first: out of both, it would be open to all (a
                    // freepool with a zone of its own takes it only once it is out).
                    let pool = freepool.as_ref().filter(|_| {
                        desired.host_ids.contains_key(host) && !reserved.contains(host.as_str())
                    });
                    let zoned = pool.is_some_and(|f| f.availability_zone.is_some());
                    if let Some(f) = pool
                        && !zoned
                    {
                        if !pass.done(&line, repair_add(&nova, f, host).await) {
                            emptied = false;
                            continue;
                        }
                        put_back.insert(host.as_str());
                    }
                    let removed = pass.done(&line, nova.remove_host(aggregate, host).await);
                    emptied &= removed;
                    if removed
                        && zoned
                        && let Some(f) = pool
                        && pass.done(&line, repair_add(&nova, f, host).await)
                    {
                        put_back.insert(host.as_str());
                    }
                }
                if ours && emptied {
                    pass.done(&line, nova.delete_aggregate(aggregate).await);
                }
                desired.release(store).await;
            }
        }
        // Every other enrolled host waits in the freepool.
        let pooled: BTreeSet<&str> = freepool
            .as_ref()
            .map(|f| f.hosts.iter().map(String::as_str).collect())
            .unwrap_or_default();
        for host in &desired.enrolled {
            if reserved.contains(host.as_str())
                || busy(host)
                || pooled.contains(host.as_str())
                || put_back.contains(host.as_str())
            {
                continue;
            }
            if !listed(in_nova, host) {
                pass.leave(format!(
                    "host {host} has no compute service in Nova: left out of {}",
                    self.settings.freepool
                ));
                continue;
            }
            let line = pass.found(format!(
                "host {host} missing from {}: put back",
                self.settings.freepool
            ));
            if apply
                && let Some(f) = &freepool
                && desired.hold(store, &host_item(desired, None, [host])).await
            {
                pass.done(&line, repair_add(&nova, f, host).await);
                desired.release(store).await;
            }
        }
        Ok(())
    }

    /// Brings host reservation `r`'s aggregate in line with the database (`apply`), or only
    /// lists how it differs. `pending`: its lease has not started (it holds no host yet).
    #[allow(clippy::too_many_arguments)]
    async fn reconcile_reservation(
        &self,
        aggregates: &[Aggregate],
        freepool: Option<&Aggregate>,
        desired: &DesiredState,
        in_nova: Option<&BTreeSet<String>>,
        r: &HeldHosts,
        pending: bool,
        apply: bool,
        pass: &mut Pass,
    ) {
        let nova = &self.cloud.nova(None);
        let zone = format!("{}{}", self.settings.az_prefix, r.reservation_id);
        let found = aggregates.iter().find(|a| a.name == r.reservation_id);
        let aggregate = match found {
            Some(a) => a.clone(),
            None => {
                let line = pass.found(format!(
                    "aggregate of reservation {} missing: re-created",
                    r.reservation_id
                ));
                if !apply {
                    return;
                }
                let made = nova.ensure_aggregate(&r.reservation_id, Some(&zone)).await;
                match pass.value(&line, made) {
                    Some(a) => a,
                    None => return,
                }
            }
        };
        self.repair_owner(nova, &aggregate, r, apply, pass).await;
        if aggregate.availability_zone.as_deref() != Some(zone.as_str()) {
            let line = pass.found(format!(
                "aggregate {}: availability zone {} not {zone}: set",
                r.reservation_id,
                aggregate.availability_zone.as_deref().unwrap_or("(none)")
            ));
            if apply {
                pass.done(&line, nova.set_zone(&aggregate, &zone).await);
            }
        }
        for host in r.hosts.iter().filter(|h| !aggregate.hosts.contains(h)) {
            if !listed(in_nova, host) {
                pass.leave(format!(
                    "host {host} of reservation {} has no compute service in Nova: left out \
                     of its aggregate",
                    r.reservation_id
                ));
                continue;
            }
            let line = pass.found(format!(
                "host {host} missing from the aggregate of reservation {}: put back",
                r.reservation_id
            ));
            if apply {
                // While out, anyone's servers could land there; the host is the
                // owner's alone, as at the start. Added before it leaves the freepool,
                // as a hand-over does.
                let owner = r.project_id.as_str();
                if !pass.done(&line, has_service(nova, host).await) {
                    continue;
                }
                let evicted = nova
                    .evict_from_host(host, |p| p != owner, EVICTION_WAIT)
                    .await;
                if !pass.done(&line, evicted) {
                    continue;
                }
                // A freepool with a zone of its own must let the host go first.
                let zoned = freepool.filter(|f| f.availability_zone.is_some());
                if let Some(f) = zoned
                    && !pass.done(&line, nova.remove_host(f, host).await)
                {
                    continue;
                }
                // So must another reservation's aggregate it was put into by hand: Nova
                // keeps a host in one zone. Its servers there went just above. (An
                // operator's own zone is theirs: that move is reported as failed.)
                let mut freed = true;
                for other in aggregates.iter().filter(|a| {
                    a.name != r.reservation_id
                        && a.hosts.contains(host)
                        && self.in_our_zone(a)
                        && freepool.is_none_or(|f| f.id != a.id)
                }) {
                    freed &= pass.done(&line, nova.remove_host(other, host).await);
                }
                if !freed {
                    continue;
                }
                if pass.done(&line, repair_add(nova, &aggregate, host).await)
                    && zoned.is_none()
                    && let Some(f) = freepool
                {
                    pass.done(&line, nova.remove_host(f, host).await);
                }
            }
        }
        // A reserved host put into the freepool by hand: BlazarFilter turns everyone
        // away from freepool hosts, the owner included.
        let pooled_hosts = freepool.map(|f| f.hosts.as_slice()).unwrap_or(&[]);
        for host in r.hosts.iter().filter(|h| pooled_hosts.contains(h)) {
            let line = pass.found(format!(
                "host {host} of reservation {} in {}: taken out",
                r.reservation_id, self.settings.freepool
            ));
            if apply && let Some(f) = freepool {
                pass.done(&line, nova.remove_host(f, host).await);
            }
        }
        for host in aggregate.hosts.iter().filter(|h| !r.hosts.contains(h)) {
            // Taken from the reservation (healing) with the project's servers still on
            // it, and granted to no one else: Nova keeps it in the zone while they run,
            // and they are the lease's to keep until it ends. A lease not started was
            // granted nothing to keep: whatever landed there goes.
            if !pending && !granted(desired, host) {
                let owner = r.project_id.as_str();
                let kept = pass.value(
                    &format!("servers on host {host} could not be listed"),
                    nova.servers_on_host_of(host, Some(owner)).await,
                );
                match kept {
                    Some(servers) if !servers.is_empty() => {
                        pass.leave(format!(
                            "host {host} in the aggregate of reservation {} without being \
                             granted to it: left while {} server(s) of project {owner} run \
                             there",
                            r.reservation_id,
                            servers.len()
                        ));
                        continue;
                    }
                    Some(_) => {}
                    None => continue,
                }
            }
            let line = pass.found(format!(
                "host {host} in the aggregate of reservation {} without being granted to it: \
                 taken out",
                r.reservation_id
            ));
            if apply {
                // Servers the project started there meanwhile hold the host in the zone
                // (Nova refuses to move it): they were never granted it.
                let owner = r.project_id.as_str();
                let evicted = nova
                    .evict_from_host(host, |p| p == owner, EVICTION_WAIT)
                    .await;
                if pass.done(&line, evicted) {
                    pass.done(&line, nova.remove_host(&aggregate, host).await);
                }
            }
        }
    }

    /// The metadata of host reservation `r`'s aggregate made exactly its owner's. Only the
    /// owner may be named: another project's id as a key (or another owner) would let
    /// BlazarFilter admit that project too.
    async fn repair_owner(
        &self,
        nova: &crate::nova::Nova<'_>,
        aggregate: &crate::nova::Aggregate,
        r: &blazar_service::HeldHosts,
        apply: bool,
        pass: &mut Pass,
    ) {
        let wanted = self.host_aggregate_metadata(&r.project_id);
        let drift = crate::nova::metadata_drift(aggregate, &wanted);
        if drift.is_empty() {
            return;
        }
        let line = pass.found(format!(
            "aggregate {}: metadata {} not as granted to {}: set",
            r.reservation_id,
            drift.join(", "),
            r.project_id
        ));
        if apply {
            pass.done(&line, nova.set_exact_metadata(aggregate, &wanted).await);
        }
    }

    /// A new host goes into the freepool, and gets its `blazar_<hostname>` provider under
    /// its compute node's provider (where instance reservations put their classes).
    async fn enrol(&self, action: &Action) -> Result<(), Error> {
        let nova = self.cloud.nova(action.request_id.as_deref());
        let placement = self.cloud.placement(action.request_id.as_deref());
        let freepool = nova.ensure_aggregate(&self.settings.freepool, None).await?;
        for (service, hypervisor) in &action.hosts {
            nova.add_host(&freepool, service).await?;
            let Some(node) = placement.provider_by_name(hypervisor).await? else {
                return Err(Error::Status {
                    service: "placement".into(),
                    request: format!("provider {hypervisor}"),
                    status: 404,
                    message: format!("no resource provider named {hypervisor}"),
                });
            };
            placement
                .ensure_child_provider(&reservation_provider_name(hypervisor), &node.uuid)
                .await?;
            tracing::info!(host = %service, "host enrolled: in the freepool, with its provider");
        }
        Ok(())
    }

    /// A removed host leaves the freepool, and its `blazar_<hostname>` provider goes.
    async fn withdraw(&self, action: &Action) -> Result<(), Error> {
        let nova = self.cloud.nova(action.request_id.as_deref());
        let placement = self.cloud.placement(action.request_id.as_deref());
        if let Some(freepool) = nova.find_aggregate(&self.settings.freepool).await? {
            for (service, _) in &action.hosts {
                nova.remove_host(&freepool, service).await?;
            }
        }
        for (service, hypervisor) in &action.hosts {
            if let Some(p) = placement
                .provider_by_name(&reservation_provider_name(hypervisor))
                .await?
            {
                placement.delete_provider(&p.uuid).await?;
            }
            tracing::info!(host = %service, "host withdrawn from the freepool");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::Pass;

    #[test]
    fn a_failed_repair_is_reported_as_failed_only() {
        let mut pass = Pass::default();
        let moved = pass.found("host h1 not in aggregate r1: put back".into());
        pass.done(&moved, Ok::<(), String>(()));
        let refused = pass.found("aggregate r2 left over: deleted".into());
        pass.done(
            &refused,
            Err::<(), _>("nova: 409 host already has 1 instance(s)"),
        );
        pass.failed
            .push("leftovers could not be listed: neutron: timeout".into());
        pass.drop_failed_repairs();
        assert_eq!(pass.repairs, vec![moved]);
        assert_eq!(
            pass.failed,
            vec![
                "aggregate r2 left over: deleted: nova: 409 host already has 1 instance(s)"
                    .to_string(),
                "leftovers could not be listed: neutron: timeout".to_string(),
            ]
        );
    }
}
