//! The reconciler's part beyond host aggregates: instance, floating-IP and network
//! reservations in force are checked piece by piece and, where something is missing, their
//! start is carried out again (every step of it checks before it acts, so only the missing
//! pieces are made); what the cloud holds for reservations that are over or gone (flavors
//! and aggregates and classes named after them, floating IPs and networks tagged with them)
//! is removed.

use std::collections::BTreeSet;

use blazar_core::engine::Usage;
use blazar_core::reservation::{Affinity, InstanceSpec, Query};
use blazar_core::{ActionKind, ActionPurpose, ReservationSpec};
use blazar_db::{RepairItem, Store};
use blazar_service::{Action, ActionError, ActionOutput, DesiredState, InventoryError};
use chrono::Utc;
use serde_json::Value;

use crate::backend::{OpenStackBackend, Pass, appeared_since, made_here};
use crate::error::Error;
use crate::instances::{FLAVOR_INSTANCE, VIRTUAL_INSTANCE};
use crate::placement::class_reservation;
use crate::pools::{FLOATINGIP, NETWORK, tagged_reservation};

/// How long a reconcile pass waits for the servers of one orphaned instance reservation.
const ORPHAN_SERVER_WAIT: std::time::Duration = std::time::Duration::from_secs(20);

fn unavailable(e: Error) -> InventoryError {
    InventoryError::Unavailable(e.to_string())
}

fn failed(e: ActionError) -> InventoryError {
    InventoryError::Unavailable(e.to_string())
}

/// Whether what the cloud holds under reservation `id` may be removed: only when the
/// database had that reservation. One it never had is listed as left (`left` says what is
/// left); one it cannot tell about now waits for the next pass.
async fn removable(
    store: &Store,
    pass: &mut Pass,
    id: &str,
    left: impl FnOnce() -> String,
) -> bool {
    match made_here(store, id).await {
        Some(true) => true,
        Some(false) => {
            pass.leave(left());
            false
        }
        None => false,
    }
}

impl OpenStackBackend {
    /// Live reservations: what is missing is made again (`apply`), or only listed; a
    /// reservation that cannot be checked or made again is recorded in `pass`.
    pub(crate) async fn reconcile_live(
        &self,
        store: &Store,
        desired: &DesiredState,
        apply: bool,
        pass: &mut Pass,
    ) {
        for action in &desired.live {
            // Each line with the resource it is about, where it is about one.
            let checked = match action.reservation_type.as_str() {
                VIRTUAL_INSTANCE | FLAVOR_INSTANCE => {
                    self.instance_drift(store, action)
                        .await
                        .map(|(lines, left)| {
                            for line in left {
                                pass.leave(line);
                            }
                            lines
                                .into_iter()
                                .map(|line| (None, line))
                                .collect::<Vec<_>>()
                        })
                }
                FLOATINGIP | NETWORK => self.pool_drift(store, action).await.map(|lines| {
                    lines
                        .into_iter()
                        .map(|(id, line)| (Some(id), line))
                        .collect()
                }),
                _ => continue,
            };
            let what = format!("reservation {}", action.reservation_id);
            let Some(drift) = pass.value(&format!("{what} could not be checked"), checked) else {
                continue;
            };
            // Ended (or changing) since the pass read the database: its own actions decide
            // what the cloud holds for it.
            if drift.is_empty() || !crate::backend::still_live(store, action).await {
                continue;
            }
            let lines: Vec<(Option<i64>, String)> = drift
                .into_iter()
                .map(|(resource, line)| {
                    (resource, pass.found(format!("{line}: put back as granted")))
                })
                .collect();
            let item = RepairItem {
                lease_id: Some(action.lease_id.clone()),
                resources: action
                    .resources
                    .iter()
                    .map(|&id| (action.resource_type.clone(), id))
                    .collect(),
            };
            if !apply || !desired.hold(store, &item).await {
                continue;
            }
            let made = self.apply_now(store, action).await;
            desired.release(store).await;
            match made {
                Ok(output) => {
                    if !output.made.is_empty() {
                        pass.made.push((action.reservation_id.clone(), output.made));
                    }
                    // Not made: another project holds it. The service takes it out of
                    // service and heals the reservation.
                    for (_, line) in lines.iter().filter(|(resource, _)| {
                        resource.is_some_and(|id| output.held_outside.contains(&id))
                    }) {
                        pass.failed.push(format!(
                            "{line}: held by another project; taken out of service, its \
                             reservation healed"
                        ));
                    }
                    for id in output.held_outside {
                        pass.held_outside.push((action.resource_type.clone(), id));
                    }
                }
                // Each difference it was to repair failed with it.
                Err(e) => {
                    for (_, line) in lines {
                        pass.failed.push(format!("{line}: {e}"));
                    }
                }
            }
        }
    }

    /// Carries out `action` again. A group made again gets a new id from Nova: the output
    /// says so, and the service writes it to the reservation.
    async fn apply_now(
        &self,
        store: &Store,
        action: &Action,
    ) -> Result<ActionOutput, InventoryError> {
        use blazar_service::Backend;
        self.apply(store, action).await.map_err(failed)
    }

    /// What the cloud holds for reservations that are not kept any more: removed (`apply`),
    /// or only listed.
    pub(crate) async fn reconcile_orphans(
        &self,
        store: &Store,
        desired: &DesiredState,
        apply: bool,
        pass: &mut Pass,
    ) -> Result<(), InventoryError> {
        let nova = self.cloud().nova(None);
        let placement = self.cloud().placement(None);
        let neutron = self.cloud().neutron(None);
        let orphan = |id: &str| !desired.kept.contains(id);

        // Instance reservations: a flavor, an aggregate with `reservation` metadata, or a
        // resource class of a reservation no longer kept. The aggregate says whose it was.
        let mut instance_orphans: BTreeSet<String> = BTreeSet::new();
        instance_orphans.extend(
            nova.reservation_flavors()
                .await
                .map_err(unavailable)?
                .into_iter()
                .filter(|id| orphan(id)),
        );
        let aggregates = nova.aggregates().await.map_err(unavailable)?;
        instance_orphans.extend(
            aggregates
                .iter()
                .filter(|a| crate::nova::names_reservation(a) && orphan(&a.name))
                .map(|a| a.name.clone()),
        );
        instance_orphans.extend(
            nova.server_groups(true)
                .await
                .map_err(unavailable)?
                .into_iter()
                .filter_map(|(_, name)| name.strip_prefix("reservation:").map(str::to_string))
                .filter(|id| orphan(id)),
        );
        instance_orphans.extend(
            placement
                .reservation_classes()
                .await
                .map_err(unavailable)?
                .iter()
                .filter_map(|c| class_reservation(c))
                .filter(|id| orphan(id)),
        );
        for id in instance_orphans {
            if appeared_since(store, desired, &id).await {
                continue;
            }
            let left = || {
                format!(
                    "instance reservation {id} is not one of this database's: its flavor, \
                     group, aggregate and class left as they are"
                )
            };
            if !removable(store, pass, &id, left).await {
                continue;
            }
            let line = pass.found(format!(
                "instance reservation {id} is over or gone: its servers, flavor, group, \
                 aggregate, inventories and class removed"
            ));
            if !apply {
                continue;
            }
            let project = aggregates
                .iter()
                .find(|a| a.name == id)
                .and_then(|a| a.metadata.get("filter_tenant_id"))
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            let action = orphan_action(&id, &project);
            // A pass does not wait out slow server deletes (one orphan would hold the whole
            // pass for minutes): what is still there fails this time and the next pass,
            // finding the servers gone, removes the rest.
            let wait = self
                .settings()
                .server_delete_timeout
                .min(ORPHAN_SERVER_WAIT);
            pass.done(
                &line,
                self.teardown_instances(&action, &desired.hypervisors, wait)
                    .await,
            );
        }

        // Floating IPs and networks carry their reservation's tag.
        for fip in neutron
            .floatingips_tagged("blazar")
            .await
            .map_err(unavailable)?
        {
            let Some(id) = tagged_reservation(&fip.tags) else {
                continue;
            };
            if !orphan(id) || appeared_since(store, desired, id).await {
                continue;
            }
            let left = || {
                format!(
                    "floating IP {} of reservation {id}, not one of this database's: left",
                    fip.address
                )
            };
            if !removable(store, pass, id, left).await {
                continue;
            }
            let line = pass.found(format!(
                "floating IP {} of reservation {id}, which is over or gone: deleted",
                fip.address
            ));
            if apply {
                pass.done(&line, neutron.delete_floatingip(&fip).await);
            }
        }
        for network in neutron
            .networks_tagged("blazar")
            .await
            .map_err(unavailable)?
        {
            let Some(id) = tagged_reservation(&network.tags) else {
                continue;
            };
            if !orphan(id) || appeared_since(store, desired, id).await {
                continue;
            }
            let left = || {
                format!(
                    "network {} of reservation {id}, not one of this database's: left",
                    network.id
                )
            };
            if !removable(store, pass, id, left).await {
                continue;
            }
            let line = pass.found(format!(
                "network {} of reservation {id}, which is over or gone: deleted",
                network.id
            ));
            if apply {
                pass.done(&line, neutron.delete_network(&network.id).await);
            }
        }
        Ok(())
    }
}

/// A take-back of a reservation the database no longer has: only its id is known.
fn orphan_action(reservation_id: &str, project_id: &str) -> Action {
    let now = Utc::now();
    // Look for a group whatever the reservation asked: it may have had one. The size is
    // never read by a take-back.
    let spec = ReservationSpec::Instance(InstanceSpec {
        size: Usage {
            vcpus: 1,
            memory_mb: 1,
            disk_gb: 0,
        },
        amount: 1,
        affinity: Affinity::Same,
        resource_properties: Query::default(),
        ids: None,
    });
    Action {
        seq: 0,
        kind: ActionKind::Stop,
        purpose: ActionPurpose::Delete,
        lease_id: String::new(),
        lease_name: String::new(),
        reservation_id: reservation_id.to_string(),
        project_id: project_id.to_string(),
        user_id: String::new(),
        resource_type: blazar_core::PHYSICAL_HOST.to_string(),
        reservation_type: VIRTUAL_INSTANCE.to_string(),
        resources: Vec::new(),
        units: Vec::new(),
        hosts: Vec::new(),
        spec: Some(spec),
        lease_start: now,
        lease_end: now,
        at: now,
        attempt: 1,
        request_id: None,
        trust_id: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reservation_tag_names_its_reservation() {
        let tags = vec!["blazar".to_string(), "reservation:abc-1".to_string()];
        assert_eq!(tagged_reservation(&tags), Some("abc-1"));
        assert_eq!(tagged_reservation(&["blazar".to_string()]), None);
    }

    #[test]
    fn a_class_names_its_reservation_back() {
        let id = "0b9e7c1a-55f4-4b8e-9c1d-3f2a6e8d7c10";
        assert_eq!(
            class_reservation(&crate::placement::reservation_class(id)).as_deref(),
            Some(id)
        );
        assert_eq!(class_reservation("CUSTOM_GPU"), None);
    }
}
