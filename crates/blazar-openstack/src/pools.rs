//! Floating IPs and network segments: what Blazar's floating-IP plugin and Chameleon's
//! network plugin make exist in Neutron while a reservation is in force.

use std::collections::BTreeMap;

use blazar_core::ResourceRecord;
use blazar_core::{ActionKind, ReservationSpec};
use blazar_db::Store;
use blazar_service::{Action, ActionError, PoolCheck};
use serde_json::Value;

use crate::backend::OpenStackBackend;
use crate::error::Error;
use crate::neutron::{FloatingIp, Network, NewNetwork};

pub(crate) const FLOATINGIP: &str = "virtual:floatingip";
pub(crate) const NETWORK: &str = "network";

/// The tags that mark what blazar-rs made for a reservation (as Blazar tags floating IPs).
pub(crate) fn reservation_tags(reservation_id: &str) -> Vec<String> {
    vec!["blazar".into(), reservation_tag(reservation_id)]
}

pub(crate) fn reservation_tag(reservation_id: &str) -> String {
    format!("reservation:{reservation_id}")
}

/// The reservation id of a `reservation:<id>` tag among `tags`.
pub(crate) fn tagged_reservation(tags: &[String]) -> Option<&str> {
    tags.iter().find_map(|t| t.strip_prefix("reservation:"))
}

fn attr<'a>(r: &'a ResourceRecord, key: &str) -> Option<&'a str> {
    r.resource.attrs.get(key).and_then(Value::as_str)
}

/// The external network and the address of a floating-IP record.
fn floating_address(r: &ResourceRecord) -> Option<(&str, &str)> {
    Some((
        attr(r, "floating_network_id")?,
        attr(r, "floating_ip_address")?,
    ))
}

/// The network type (VLAN unless the record says) and the segmentation id of a segment
/// record.
fn segment_of(r: &ResourceRecord) -> Option<(&str, Option<&str>, i64)> {
    let segmentation_id = r.resource.attrs.get("segment_id").and_then(Value::as_i64)?;
    Some((
        attr(r, "network_type").unwrap_or("vlan"),
        attr(r, "physical_network"),
        segmentation_id,
    ))
}

/// The inventory records of the action's resources (those still registered).
pub(crate) async fn records(
    store: &Store,
    kind: &str,
    ids: &[i64],
) -> Result<Vec<ResourceRecord>, ActionError> {
    let db = |e: blazar_db::DbError| ActionError::Transient(format!("database: {e}"));
    let mut tx = store.read().await.map_err(db)?;
    let all = tx.list_resources(kind).await.map_err(db)?;
    let found: Vec<ResourceRecord> = all.into_iter().filter(|r| ids.contains(&r.id)).collect();
    if found.len() < ids.len() {
        tracing::warn!(
            resource.kind = kind,
            wanted = ids.len(),
            found = found.len(),
            "resources of an action no longer registered"
        );
    }
    Ok(found)
}

/// Runs what an action of `kind` asks of one resource: `start` or `stop` (only the one
/// asked for is ever awaited); other kinds change nothing here. A start refused because
/// something of another project holds the resource is not a failure of the action: the
/// resource goes into `held_outside` and the others are handed over (the service takes it
/// out of service and heals the reservation).
async fn start_or_stop(
    kind: ActionKind,
    record: &ResourceRecord,
    start: impl Future<Output = Result<(), Error>>,
    stop: impl Future<Output = Result<(), Error>>,
    held_outside: &mut Vec<i64>,
) -> Result<(), ActionError> {
    let result = match kind {
        ActionKind::Start => start.await,
        ActionKind::Stop => stop.await,
        _ => Ok(()),
    };
    match result {
        Err(Error::HeldOutside(why)) => {
            tracing::warn!(resource.id = record.id, resource = %record.resource.display_name(),
                reason = %why, "reserved resource held outside blazar-rs: not handed over");
            held_outside.push(record.id);
            Ok(())
        }
        other => other.map_err(crate::backend::action_error),
    }
}

impl OpenStackBackend {
    /// Start: each reserved address exists as a floating IP of the lease's project, tagged
    /// `blazar` and `reservation:<id>`. Stop: it is detached and deleted.
    pub(crate) async fn floatingips(
        &self,
        store: &Store,
        action: &Action,
    ) -> Result<Vec<i64>, ActionError> {
        let mut held_outside = Vec::new();
        let neutron = self.cloud().neutron(action.request_id.as_deref());
        let tags = reservation_tags(&action.reservation_id);
        for fip in records(store, FLOATINGIP, &action.resources).await? {
            let Some((network, address)) = floating_address(&fip) else {
                continue;
            };
            let start = async {
                neutron
                    .ensure_floatingip(
                        network,
                        attr(&fip, "subnet_id"),
                        address,
                        &action.project_id,
                        &tags,
                    )
                    .await
                    .map(|(fip, done)| {
                        tracing::info!(address, floatingip.id = %fip.id,
                            project.id = %action.project_id, reservation.id = %action.reservation_id,
                            "floating IP of its reservation {}", done.done());
                    })
            };
            let stop = self.delete_reserved_floatingip(action, network, address);
            start_or_stop(action.kind, &fip, start, stop, &mut held_outside).await?;
        }
        Ok(held_outside)
    }

    /// Deletes the floating IP of `address` if it is the reservation's (a user may have
    /// deleted it already; an address re-made by someone else is not ours to delete).
    async fn delete_reserved_floatingip(
        &self,
        action: &Action,
        network: &str,
        address: &str,
    ) -> Result<(), Error> {
        let neutron = self.cloud().neutron(action.request_id.as_deref());
        let Some(fip) = neutron.find_floatingip(network, address).await? else {
            return Ok(());
        };
        if !fip.tags.contains(&reservation_tag(&action.reservation_id))
            && fip.project_id != action.project_id
        {
            tracing::warn!(address, floatingip.id = %fip.id, project.id = %fip.project_id,
                "a floating IP of another project holds a reserved address; left alone");
            return Ok(());
        }
        neutron.delete_floatingip(&fip).await?;
        tracing::info!(address, floatingip.id = %fip.id, reservation.id = %action.reservation_id,
            "floating IP of an ended reservation deleted");
        Ok(())
    }

    /// Start: a provider network on each reserved segment, in the lease's project, named as
    /// the reservation asks (`network_name`, `network_description`). Stop: the network goes
    /// with its ports, router interfaces and subnets.
    pub(crate) async fn networks(
        &self,
        store: &Store,
        action: &Action,
    ) -> Result<Vec<i64>, ActionError> {
        let mut held_outside = Vec::new();
        let neutron = self.cloud().neutron(action.request_id.as_deref());
        let tags = reservation_tags(&action.reservation_id);
        let spec = match &action.spec {
            Some(ReservationSpec::Network(n)) => Some(n),
            _ => None,
        };
        let name = spec
            .map(|n| n.network_name.as_str())
            .filter(|n| !n.is_empty())
            .map(str::to_string)
            .unwrap_or_else(|| format!("reservation:{}", action.reservation_id));
        let description = spec
            .and_then(|n| n.network_description.as_deref())
            .filter(|d| !d.is_empty());
        for segment in records(store, NETWORK, &action.resources).await? {
            let Some((network_type, physical_network, segmentation_id)) = segment_of(&segment)
            else {
                continue;
            };
            let start = async {
                neutron
                    .ensure_network(&NewNetwork {
                        name: &name,
                        description,
                        project_id: &action.project_id,
                        network_type,
                        physical_network,
                        segmentation_id,
                        tags: &tags,
                    })
                    .await
                    .map(|(network, done)| {
                        tracing::info!(network.id = %network.id, segment = segmentation_id,
                            project.id = %action.project_id, reservation.id = %action.reservation_id,
                            "network on its reserved segment {}", done.done());
                    })
            };
            let stop = self.delete_reserved_network(
                action,
                network_type,
                physical_network,
                segmentation_id,
            );
            start_or_stop(action.kind, &segment, start, stop, &mut held_outside).await?;
        }
        Ok(held_outside)
    }

    async fn delete_reserved_network(
        &self,
        action: &Action,
        network_type: &str,
        physical_network: Option<&str>,
        segmentation_id: i64,
    ) -> Result<(), Error> {
        let neutron = self.cloud().neutron(action.request_id.as_deref());
        let Some(network) = neutron
            .network_on_segment(network_type, physical_network, segmentation_id)
            .await?
        else {
            return Ok(());
        };
        // Ours by its tag, or (tags and name being the project's to edit) as the network the
        // lease's project has on the segment its reservation held: Blazar deletes the
        // network it made whatever became of its tags.
        // (The project alone says so only when the lookup named the physical network: a
        // segment without one may be matched by a network on any.)
        let ours = network
            .tags
            .contains(&reservation_tag(&action.reservation_id))
            || (physical_network.is_some() && network.project_id == action.project_id);
        if !ours {
            tracing::warn!(network.id = %network.id, segment = segmentation_id,
                "the network on a reserved segment is not the reservation's; left alone");
            return Ok(());
        }
        neutron.delete_network(&network.id).await?;
        tracing::info!(network.id = %network.id, segment = segmentation_id,
            reservation.id = %action.reservation_id, "network of an ended reservation deleted");
        Ok(())
    }

    /// Of `checks`, the floating IPs and segments Neutron shows held by something blazar-rs
    /// did not make for a reservation (no `reservation:` tag) in a project other than the
    /// one holding the resource now, each with what holds it. One listing of floating IPs
    /// per external network and one of networks, whatever the number of resources.
    pub(crate) async fn pools_held_outside(
        &self,
        checks: &[PoolCheck],
    ) -> Result<BTreeMap<i64, String>, Error> {
        let neutron = self.cloud().neutron(None);
        let ours = |tags: &[String], project: &str, check: &PoolCheck| {
            tagged_reservation(tags).is_some() || check.holder_project.as_deref() == Some(project)
        };
        let mut taken = BTreeMap::new();
        let mut on_network: BTreeMap<&str, Vec<FloatingIp>> = BTreeMap::new();
        let mut networks: Option<Vec<Network>> = None;
        for check in checks {
            let record = &check.record;
            match record.resource.kind.as_str() {
                FLOATINGIP => {
                    let Some((network, address)) = floating_address(record) else {
                        continue;
                    };
                    if !on_network.contains_key(network) {
                        on_network.insert(network, neutron.floatingips_on(network).await?);
                    }
                    let holder = on_network.get(network).and_then(|fips| {
                        fips.iter()
                            .find(|f| f.address == address && !ours(&f.tags, &f.project_id, check))
                    });
                    if let Some(f) = holder {
                        taken.insert(
                            record.id,
                            format!("floating IP {} of project {}", f.id, f.project_id),
                        );
                    }
                }
                NETWORK => {
                    let Some((network_type, physical, seg)) = segment_of(record) else {
                        continue;
                    };
                    if networks.is_none() {
                        networks = Some(neutron.networks().await?);
                    }
                    let holder = networks.iter().flatten().find(|n| {
                        n.network_type == network_type
                            && n.segmentation_id == Some(seg)
                            && (physical.is_none() || n.physical_network.as_deref() == physical)
                            && !ours(&n.tags, &n.project_id, check)
                    });
                    if let Some(n) = holder {
                        taken.insert(
                            record.id,
                            format!("network {} of project {}", n.id, n.project_id),
                        );
                    }
                }
                _ => {}
            }
        }
        Ok(taken)
    }

    /// What of a floating-IP or network reservation in force is not in Neutron as it
    /// should be, one line each with the resource it is about (empty: nothing).
    pub(crate) async fn pool_drift(
        &self,
        store: &Store,
        action: &Action,
    ) -> Result<Vec<(i64, String)>, ActionError> {
        let neutron = self.cloud().neutron(None);
        let id = &action.reservation_id;
        let tag = reservation_tag(id);
        let mut drift = Vec::new();
        let err = crate::backend::action_error;
        match action.resource_type.as_str() {
            FLOATINGIP => {
                for fip in records(store, FLOATINGIP, &action.resources).await? {
                    let Some((network, address)) = floating_address(&fip) else {
                        continue;
                    };
                    let found = neutron
                        .find_floatingip(network, address)
                        .await
                        .map_err(err)?;
                    if !found.is_some_and(|f| f.tags.contains(&tag)) {
                        drift.push((
                            fip.id,
                            format!("floating IP {address} of reservation {id} missing"),
                        ));
                    }
                }
            }
            NETWORK => {
                for segment in records(store, NETWORK, &action.resources).await? {
                    let Some((network_type, physical, seg)) = segment_of(&segment) else {
                        continue;
                    };
                    let found = neutron
                        .network_on_segment(network_type, physical, seg)
                        .await
                        .map_err(err)?;
                    if !found.is_some_and(|n| n.tags.contains(&tag)) {
                        drift.push((
                            segment.id,
                            format!(
                                "network on segment {network_type}/{seg} of reservation {id} missing"
                            ),
                        ));
                    }
                }
            }
            _ => {}
        }
        Ok(drift)
    }
}
