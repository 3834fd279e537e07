//! Instance reservations (`virtual:instance`, `flavor:instance`): what Blazar's instance and
//! flavor plugins make in Nova and Placement (spec sections 4.2, 4.3 and 9).
//!
//! At reservation (`prepare`): the server group `reservation:<id>` in the user's project when
//! affinity is set, the private flavor `<id>` with the reservation's extra specs, the
//! aggregate `<id>` with its `reservation`, `filter_tenant_id` and owner metadata, and the
//! resource class `CUSTOM_RESERVATION_<ID>`. At start: flavor access for the project, hosts
//! in the aggregate, and on each host's `blazar_<hostname>` provider an inventory of the class
//! equal to its slots. Changes (more instances, healing) bring the hosts and inventories in
//! line with the reservation's allocations as the database has them now. At the end: access
//! revoked, the flavor's servers deleted and waited for, then group, flavor, aggregate,
//! inventories and class removed. Every step checks before it acts.

use std::collections::{BTreeMap, BTreeSet};

use blazar_core::reservation::{Affinity, FlavorChoice, FlavorInstanceSpec};
use blazar_core::{ActionKind, ActionPurpose, MadeIds, PHYSICAL_HOST, ReservationSpec};
use blazar_db::Store;
use blazar_service::{Action, ActionError, ActionOutput};
use serde_json::{Map, Value, json};

use crate::backend::{OpenStackBackend, action_error};
use crate::error::Error;
use crate::nova::Nova;
use crate::placement::{reservation_class, reservation_provider_name};

pub(crate) const VIRTUAL_INSTANCE: &str = "virtual:instance";
pub(crate) const FLAVOR_INSTANCE: &str = "flavor:instance";

/// The reservation's affinity rule: `None` (no group), or affinity (`true`) /
/// anti-affinity (`false`).
fn affinity(action: &Action) -> Option<bool> {
    match action.spec.as_ref().and_then(ReservationSpec::affinity)? {
        Affinity::Same => Some(true),
        Affinity::Different => Some(false),
        Affinity::Any => None,
    }
}

/// The services and reservation provider names of the hosts that hold slots in `slots`.
fn granted(slots: &BTreeMap<(String, String), i64>) -> (BTreeSet<&str>, BTreeSet<String>) {
    let held = slots.iter().filter(|(_, n)| **n > 0).map(|(host, _)| host);
    (
        held.clone().map(|(service, _)| service.as_str()).collect(),
        held.map(|(_, hypervisor)| reservation_provider_name(hypervisor))
            .collect(),
    )
}

fn group_name(reservation_id: &str) -> String {
    format!("reservation:{reservation_id}")
}

/// The reservation flavor Blazar makes (without extra specs), and the extra specs of the
/// source flavor it keeps (`flavor:instance`).
fn flavor_of(action: &Action) -> Result<(Value, Map<String, Value>), Error> {
    let mut flavor = json!({
        "id": action.reservation_id,
        "name": format!("reservation:{}", action.reservation_id),
        "os-flavor-access:is_public": false,
    });
    let mut extra = Map::new();
    match &action.spec {
        Some(ReservationSpec::Instance(i)) => {
            flavor["vcpus"] = json!(i.size.vcpus);
            flavor["ram"] = json!(i.size.memory_mb);
            flavor["disk"] = json!(i.size.disk_gb);
        }
        Some(ReservationSpec::FlavorInstance(FlavorInstanceSpec {
            flavor: FlavorChoice::Found(found),
            ..
        })) => {
            let source = &found.flavor;
            flavor["vcpus"] = json!(source.vcpus);
            flavor["ram"] = json!(source.ram);
            flavor["disk"] = json!(source.disk);
            flavor["OS-FLV-EXT-DATA:ephemeral"] = json!(source.ephemeral);
            extra = source.extra_specs.clone();
        }
        _ => {
            return Err(Error::Refused(format!(
                "reservation {} has no instance size to make a flavor of",
                action.reservation_id
            )));
        }
    }
    Ok((flavor, extra))
}

/// The extra specs of reservation `id`'s flavor: those of its source flavor, and the keys
/// that hold its servers to the reservation's slots (the resource class) and aggregate, and
/// to its server group (`group_id`), as Blazar sets them.
fn flavor_extra_specs(
    id: &str,
    mut extra_specs: Map<String, Value>,
    group_id: Option<&str>,
) -> Map<String, Value> {
    extra_specs.insert(
        "aggregate_instance_extra_specs:reservation".into(),
        json!(id),
    );
    extra_specs.insert(format!("resources:{}", reservation_class(id)), json!("1"));
    if let Some(g) = group_id {
        extra_specs.insert("affinity_id".into(), json!(g));
    }
    extra_specs
}

impl OpenStackBackend {
    fn nova_in_project<'a>(&self, session: &'a crate::Session, action: &'a Action) -> Nova<'a> {
        Nova::new(session, action.request_id.as_deref())
    }

    /// Carries out an action of an instance reservation. Making it ready (`prepare`, and
    /// `start`, which makes sure of it) answers the ids Nova gave its server group and its
    /// aggregate, which the reservation shows as `server_group_id` (users pass it as the
    /// `group` hint) and `aggregate_id`.
    pub(crate) async fn instances(
        &self,
        store: &Store,
        action: &Action,
    ) -> Result<ActionOutput, ActionError> {
        let made = match (action.kind, action.purpose) {
            (ActionKind::Prepare, _) => self.prepare_instances(action).await,
            (ActionKind::Release, _) => self
                .teardown_instances(action, &[], self.settings().server_delete_timeout)
                .await
                .map(|()| MadeIds::default()),
            (ActionKind::Start, _) => {
                let made = self.prepare_instances(action).await.map_err(action_error)?;
                let slots = self.slots(store, action).await?;
                self.start_instances(action, &slots).await.map(|()| made)
            }
            (ActionKind::Stop, ActionPurpose::LeaseEnd | ActionPurpose::Delete) => {
                let hosts = self.hosts_of(store, &action.resources).await?;
                self.teardown_instances(action, &hosts, self.settings().server_delete_timeout)
                    .await
                    .map(|()| MadeIds::default())
            }
            (ActionKind::Stop, _) => {
                // A host taken out (healing): the others keep their slots.
                let mut slots = self.slots(store, action).await?;
                for host in self.hosts_of(store, &action.resources).await? {
                    slots.entry(host).or_insert(0);
                }
                self.start_instances(action, &slots)
                    .await
                    .map(|()| MadeIds::default())
            }
            _ => Ok(MadeIds::default()),
        }
        .map_err(action_error)?;
        Ok(ActionOutput {
            made,
            ..ActionOutput::default()
        })
    }

    /// (service name, hypervisor hostname) of enrolled hosts by id.
    async fn hosts_of(
        &self,
        store: &Store,
        ids: &[i64],
    ) -> Result<Vec<(String, String)>, ActionError> {
        let db = |e: blazar_db::DbError| ActionError::Transient(format!("database: {e}"));
        let mut tx = store.read().await.map_err(db)?;
        let mut hosts = Vec::new();
        for &id in ids {
            if let Some(h) = tx.get_host(id).await.map_err(db)? {
                hosts.push((h.facts.service_name, h.facts.hypervisor_hostname));
            }
        }
        Ok(hosts)
    }

    /// Slots per host the reservation holds now and later, from its allocations.
    async fn slots(
        &self,
        store: &Store,
        action: &Action,
    ) -> Result<BTreeMap<(String, String), i64>, ActionError> {
        let db = |e: blazar_db::DbError| ActionError::Transient(format!("database: {e}"));
        let mut tx = store.read().await.map_err(db)?;
        let mut by_id: BTreeMap<i64, i64> = BTreeMap::new();
        for a in tx
            .allocations_of_lease(&action.lease_id)
            .await
            .map_err(db)?
        {
            if a.reservation_id == action.reservation_id
                && a.resource_type == PHYSICAL_HOST
                && a.occupancy.end > action.at
            {
                *by_id.entry(a.resource_id).or_default() += a.occupancy.units.max(1);
            }
        }
        drop(tx);
        let mut slots = BTreeMap::new();
        for (id, n) in by_id {
            for host in self.hosts_of(store, &[id]).await? {
                slots.insert(host, n);
            }
        }
        Ok(slots)
    }

    /// What exists from reservation time on: group, flavor, aggregate, resource class.
    /// Returns the ids of the aggregate and of the server group, when it has one.
    async fn prepare_instances(&self, action: &Action) -> Result<MadeIds, Error> {
        let nova = self.cloud().nova(action.request_id.as_deref());
        let id = &action.reservation_id;
        let mut group_id = None;
        if let Some(affine) = affinity(action) {
            // Made as the user (Blazar: the trust's context), so the group is theirs.
            let session = self
                .cloud()
                .for_user(action.trust_id.as_deref(), &action.project_id)?;
            let in_project = self.nova_in_project(&session, action);
            let policy = if affine { "affinity" } else { "anti-affinity" };
            group_id = Some(
                in_project
                    .ensure_server_group(&group_name(id), policy)
                    .await?,
            );
        }
        let class = reservation_class(id);
        let (flavor, source_specs) = flavor_of(action)?;
        let extra_specs = flavor_extra_specs(id, source_specs, group_id.as_deref());
        nova.ensure_flavor(flavor, extra_specs).await?;
        let aggregate = nova.ensure_aggregate(id, None).await?;
        let metadata = self.instance_aggregate_metadata(action, group_id.as_deref());
        nova.set_exact_metadata(&aggregate, &metadata).await?;
        self.cloud()
            .placement(action.request_id.as_deref())
            .ensure_resource_class(&class)
            .await?;
        Ok(MadeIds {
            server_group_id: group_id,
            aggregate_id: Some(aggregate.id),
        })
    }

    /// The metadata of an instance reservation's aggregate, and nothing else (a stray
    /// project key would admit that project through BlazarFilter).
    fn instance_aggregate_metadata(
        &self,
        action: &Action,
        group_id: Option<&str>,
    ) -> Map<String, Value> {
        let id = &action.reservation_id;
        let mut metadata = Map::new();
        metadata.insert("reservation".into(), json!(id));
        metadata.insert("filter_tenant_id".into(), json!(action.project_id));
        metadata.insert(self.settings().owner_key.clone(), json!(action.project_id));
        if let Some(g) = group_id {
            metadata.insert("affinity_id".into(), json!(g));
        }
        metadata
    }

    /// Flavor access for the project, and hosts and inventories as `slots` says (a host at
    /// 0 leaves the aggregate and loses its inventory).
    async fn start_instances(
        &self,
        action: &Action,
        slots: &BTreeMap<(String, String), i64>,
    ) -> Result<(), Error> {
        let nova = self.cloud().nova(action.request_id.as_deref());
        let placement = self.cloud().placement(action.request_id.as_deref());
        let id = &action.reservation_id;
        let class = reservation_class(id);
        nova.grant_flavor_only_to(id, &action.project_id).await?;
        // Another project's servers booted with the flavor while it could hold the owner's
        // slots: they go, as other projects' servers on a reserved host do.
        for server in nova
            .foreign_servers_with_flavor(id, &action.project_id)
            .await?
        {
            tracing::warn!(server.id = %server, reservation.id = %id,
                "deleting another project's server booted with the reservation's flavor");
            nova.delete_server(&server).await?;
        }
        let aggregate = nova.ensure_aggregate(id, None).await?;
        for ((service, hypervisor), &n) in slots {
            let provider = placement
                .provider_by_name(&reservation_provider_name(hypervisor))
                .await?;
            if n > 0 {
                nova.add_host(&aggregate, service).await?;
                let provider = match provider {
                    Some(provider) => provider,
                    // Removed by hand (or never made): made again under the host's own
                    // provider, as at enrolment.
                    None => {
                        // nova-compute makes its node's provider again when it starts:
                        // worth waiting for.
                        let Some(node) = placement.provider_by_name(hypervisor).await? else {
                            return Err(Error::NotYet(format!(
                                "host {hypervisor} has no resource provider in Placement yet"
                            )));
                        };
                        placement
                            .ensure_child_provider(
                                &reservation_provider_name(hypervisor),
                                &node.uuid,
                            )
                            .await?
                    }
                };
                placement.set_slots(&provider.uuid, &class, n).await?;
                tracing::info!(host = %service, slots = n, reservation.id = %id,
                    "host holds instance slots of its reservation");
            } else {
                if let Some(provider) = provider {
                    match placement.delete_inventory(&provider.uuid, &class).await {
                        // Servers still hold slots there (a failed host being healed around):
                        // the inventory goes with them at the end of the reservation.
                        Err(e) if e.is_conflict() => {
                            tracing::warn!(host = %service, reservation.id = %id, error = %e,
                                "instance slots still in use on a host taken out; kept")
                        }
                        other => other?,
                    }
                }
                nova.remove_host(&aggregate, service).await?;
                tracing::info!(host = %service, reservation.id = %id,
                    "host no longer holds instance slots of its reservation");
            }
        }
        // What holds none of its slots goes: a host put in the aggregate by hand (its
        // servers would be let in as the reservation's), an inventory of the class on
        // another host's provider (capacity nobody booked).
        let (hosts, providers) = granted(slots);
        if let Some(current) = nova.find_aggregate(id).await? {
            for host in current.hosts.iter().filter(|h| !hosts.contains(h.as_str())) {
                nova.remove_host(&current, host).await?;
                tracing::info!(host = %host, reservation.id = %id,
                    "host without slots of its reservation taken out of its aggregate");
            }
        }
        for provider in placement.providers_with_class(&class).await? {
            if providers.contains(&provider.name) {
                continue;
            }
            match placement.delete_inventory(&provider.uuid, &class).await {
                Err(e) if e.is_conflict() => {
                    tracing::warn!(provider = %provider.name, reservation.id = %id, error = %e,
                        "slots not granted are in use; kept until the reservation ends")
                }
                other => other?,
            }
        }
        Ok(())
    }

    /// What of an instance reservation in force is not in the cloud as it should be, one
    /// line each (empty: nothing): what its start makes again, then what is left as it is.
    pub(crate) async fn instance_drift(
        &self,
        store: &Store,
        action: &Action,
    ) -> Result<(Vec<String>, Vec<String>), ActionError> {
        let nova = self.cloud().nova(None);
        let placement = self.cloud().placement(None);
        let id = &action.reservation_id;
        let mut drift = Vec::new();
        let mut left = Vec::new();
        let group = match affinity(action) {
            Some(_) => {
                let group = nova
                    .find_server_group(&group_name(id), true)
                    .await
                    .map_err(action_error)?;
                if group.is_none() {
                    drift.push(format!("server group of instance reservation {id} missing"));
                }
                group
            }
            None => None,
        };
        // A group made again has a new id: the flavor and the aggregate get it then.
        let group_known = affinity(action).is_none() || group.is_some();
        match nova.flavor(id).await.map_err(action_error)? {
            None => drift.push(format!("flavor of instance reservation {id} missing")),
            Some(found) => {
                let (wanted, source_specs) = flavor_of(action).map_err(action_error)?;
                if crate::nova::flavor_differs(&found, &wanted) {
                    // Made again whole (a public flavor has no access list to read).
                    drift.push(format!(
                        "flavor of instance reservation {id}: size or visibility not as granted"
                    ));
                } else {
                    if group_known {
                        let specs = flavor_extra_specs(id, source_specs, group.as_deref());
                        let keys = crate::nova::extra_specs_drift(&found, &specs);
                        if !keys.is_empty() {
                            drift.push(format!(
                                "flavor of instance reservation {id}: extra specs {} not as \
                                 granted",
                                keys.join(", ")
                            ));
                        }
                    }
                    let access = nova.flavor_access(id).await.map_err(action_error)?;
                    if !access.contains(&action.project_id) {
                        drift.push(format!(
                            "project {} may not use the flavor of instance reservation {id}",
                            action.project_id
                        ));
                    }
                    for other in access.iter().filter(|p| **p != action.project_id) {
                        drift.push(format!(
                            "project {other} may use the flavor of instance reservation {id}, \
                             not granted to it"
                        ));
                    }
                }
            }
        }
        // Servers another project booted with the flavor while it could (access given or
        // the flavor made public by hand) hold the owner's slots.
        for server in nova
            .foreign_servers_with_flavor(id, &action.project_id)
            .await
            .map_err(action_error)?
        {
            drift.push(format!(
                "server {server} of another project runs with the flavor of instance \
                 reservation {id}"
            ));
        }
        let aggregate = nova.find_aggregate(id).await.map_err(action_error)?;
        match &aggregate {
            None => drift.push(format!("aggregate of instance reservation {id} missing")),
            Some(a) if group_known => {
                let wanted = self.instance_aggregate_metadata(action, group.as_deref());
                let keys = crate::nova::metadata_drift(a, &wanted);
                if !keys.is_empty() {
                    drift.push(format!(
                        "aggregate of instance reservation {id}: metadata {} not as granted",
                        keys.join(", ")
                    ));
                }
            }
            Some(_) => {}
        }
        let class = reservation_class(id);
        let slots = self.slots(store, action).await?;
        let (hosts, providers) = granted(&slots);
        if let Some(a) = &aggregate {
            for host in a.hosts.iter().filter(|h| !hosts.contains(h.as_str())) {
                drift.push(format!(
                    "host {host} in the aggregate of instance reservation {id} without slots \
                     of it"
                ));
            }
        }
        for provider in placement
            .providers_with_class(&class)
            .await
            .map_err(action_error)?
        {
            if !providers.contains(&provider.name) {
                drift.push(format!(
                    "{} has slots of instance reservation {id} not granted to it",
                    provider.name
                ));
            }
        }
        for ((service, hypervisor), n) in slots {
            if let Some(a) = &aggregate
                && !a.hosts.contains(&service)
            {
                drift.push(format!(
                    "host {service} missing from the aggregate of instance reservation {id}"
                ));
            }
            let provider = reservation_provider_name(&hypervisor);
            let inventory = match placement
                .provider_by_name(&provider)
                .await
                .map_err(action_error)?
            {
                Some(p) => {
                    // More servers than slots (an inventory raised by hand let them in):
                    // which to delete is the owner's or an operator's call, not a repair.
                    let used = placement
                        .usage_of(&p.uuid, &class)
                        .await
                        .map_err(action_error)?;
                    if used > n {
                        left.push(format!(
                            "{provider} runs {used} server(s) of instance reservation {id} on \
                             {n} slot(s): left"
                        ));
                    }
                    placement
                        .inventory_of(&p.uuid, &class)
                        .await
                        .map_err(action_error)?
                }
                None => None,
            };
            let total = inventory.as_ref().and_then(|i| i["total"].as_i64());
            if total != Some(n) {
                drift.push(format!(
                    "{provider} has {} slot(s) of instance reservation {id}, not {n}",
                    total.unwrap_or(0)
                ));
            } else if !inventory
                .as_ref()
                .is_some_and(|i| crate::placement::slots_as_granted(i, n))
            {
                drift.push(format!(
                    "{provider}: the slots of instance reservation {id} are not one server \
                     each (reserved, units or allocation ratio changed)"
                ));
            }
        }
        Ok((drift, left))
    }

    /// Everything of the reservation goes, whatever is left of it. Its servers are deleted
    /// and waited for, `wait` in all (the inventories cannot go while they hold units).
    pub(crate) async fn teardown_instances(
        &self,
        action: &Action,
        hosts: &[(String, String)],
        wait: std::time::Duration,
    ) -> Result<(), Error> {
        let nova = self.cloud().nova(action.request_id.as_deref());
        let placement = self.cloud().placement(action.request_id.as_deref());
        let id = &action.reservation_id;
        let class = reservation_class(id);
        // Servers are looked for three ways below; the waits share one deadline.
        let deadline = tokio::time::Instant::now() + wait;
        let left = || deadline.saturating_duration_since(tokio::time::Instant::now());
        // An orphan found by the reconciler may not say whose it was.
        if !action.project_id.is_empty() && nova.flavor(id).await?.is_some() {
            nova.remove_flavor_access(id, &action.project_id).await?;
        }
        let cleared = nova.clear_flavor(id, left()).await?;
        if cleared > 0 {
            tracing::info!(servers = cleared, reservation.id = %id,
                "deleted the servers of an ended instance reservation");
        }
        // Servers whose flavor was deleted by hand are no longer found by it; Nova still
        // names it in each server.
        if !action.project_id.is_empty() {
            let orphaned = nova
                .servers_of_flavor_named(&action.project_id, &format!("reservation:{id}"))
                .await?;
            if !orphaned.is_empty() {
                tracing::info!(servers = orphaned.len(), reservation.id = %id,
                    "deleting servers of an ended instance reservation that its flavor no \
                     longer finds (booted with a flavor of its name deleted since)");
                nova.clear_servers(&orphaned, left()).await?;
            }
        }
        // Every group of that name, whatever the reservation's spec says (a leftover's is
        // not known): two passes or attempts that raced may each have made one.
        let name = group_name(id);
        for (group, _) in nova
            .server_groups(true)
            .await?
            .into_iter()
            .filter(|(_, n)| *n == name)
        {
            nova.delete_server_group(&group).await?;
        }
        nova.delete_flavor(id).await?;
        let mut services: BTreeSet<String> = hosts.iter().map(|h| h.0.clone()).collect();
        let aggregate = nova.find_aggregate(id).await?;
        if let Some(a) = &aggregate {
            services.extend(a.hosts.iter().cloned());
        }
        // Inventories on every provider of the hosts (by hypervisor name when known, else
        // by the service host, which the fake and libvirt drivers share), and on any other
        // provider that still has a unit of the class (a host healed away from the
        // reservation whose take-back did not finish).
        let known: BTreeMap<&str, &str> = hosts
            .iter()
            .map(|(s, h)| (s.as_str(), h.as_str()))
            .collect();
        let mut providers = BTreeSet::new();
        for service in &services {
            let hypervisor = known.get(service.as_str()).copied().unwrap_or(service);
            if let Some(provider) = placement
                .provider_by_name(&reservation_provider_name(hypervisor))
                .await?
            {
                providers.insert(provider.uuid);
            }
        }
        let with_class = || async {
            let found = placement.providers_with_class(&class).await?;
            Ok::<_, Error>(found.into_iter().map(|p| p.uuid))
        };
        providers.extend(with_class().await?);
        // Anything else still holding units (a server of an orphan whose project is not
        // known, or one moved to another project): Placement knows them all.
        let mut holders = BTreeSet::new();
        for provider in &providers {
            holders.extend(placement.consumers_of(provider, &class).await?);
        }
        if !holders.is_empty() {
            let holders: Vec<String> = holders.into_iter().collect();
            tracing::info!(servers = holders.len(), reservation.id = %id,
                "deleting servers that still hold units of an ended instance reservation");
            nova.clear_servers(&holders, left()).await?;
            // Nova says they are gone, but frees their units in Placement only when
            // Placement answers: a server deleted while it was down keeps them until
            // nova-compute's next periodic task (a minute), and the inventory cannot go
            // until then. Freed here, as `nova-manage placement audit --delete` would, but
            // for a migration's (a resize not yet confirmed): the end waits for it.
            for consumer in &holders {
                if placement.not_a_migration(consumer).await? {
                    placement.delete_allocations(consumer).await?;
                }
            }
        }
        // Providers whose every unit was held show up now that the units are free.
        providers.extend(with_class().await?);
        for provider in &providers {
            placement.delete_inventory(provider, &class).await?;
        }
        if let Some(a) = &aggregate {
            for host in &a.hosts {
                nova.remove_host(a, host).await?;
            }
            nova.delete_aggregate(a).await?;
        }
        placement.delete_resource_class(&class).await?;
        tracing::info!(reservation.id = %id, "instance reservation removed from the cloud");
        Ok(())
    }
}
