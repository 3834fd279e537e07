//! Placement's copy of Blazar's host aggregates. Nova writes each host it adds to or
//! removes from an aggregate into Placement too (the compute node's resource provider
//! becomes a member of the aggregate's uuid), but only after its own database: when
//! Placement does not answer, Nova keeps the change, answers 500 or only logs a warning, and
//! the copy stays wrong until an operator runs `nova-manage placement sync_aggregates`.
//! Nova's scheduler asks Placement by aggregate (`limit_tenants_to_placement_aggregate`,
//! `query_placement_for_availability_zone`), so a stale copy sends servers to the wrong
//! hosts, or to none. The reconciler brings the copy of the aggregates it owns (the
//! freepool, every reservation's) in line with Nova, for enrolled hosts only: other
//! providers in them (sharing providers an operator put there) are not Blazar's.
//!
//! The same pass makes again an enrolled host's own `blazar_<hypervisor>` provider (where
//! instance reservations put their slots) when it was deleted by hand: an instance
//! reservation's start would make it too, but an operator reading the report should see it.

use std::collections::{BTreeMap, BTreeSet};

use blazar_db::Store;
use blazar_service::{Action, DesiredState};

use crate::backend::{OpenStackBackend, Pass, host_item};
use crate::error::Error;
use crate::nova::Aggregate;
use crate::placement::reservation_provider_name;

/// How Placement's members of one aggregate differ from Nova's hosts of it, as
/// (service name, hypervisor hostname) pairs.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct MemberDrift {
    /// In the aggregate, not in Placement's copy.
    pub(crate) missing: Vec<(String, String)>,
    /// In Placement's copy, not in the aggregate.
    pub(crate) extra: Vec<(String, String)>,
}

/// Compares Nova's hosts of an aggregate (service names) with the names of Placement's
/// member providers, for the enrolled hosts of `nodes` (service name to hypervisor
/// hostname, which is what Nova names a compute node's provider).
pub(crate) fn member_drift(
    hosts: &[String],
    providers: &BTreeSet<String>,
    nodes: &BTreeMap<&str, &str>,
) -> MemberDrift {
    let in_nova: BTreeSet<&str> = hosts.iter().map(String::as_str).collect();
    let mut drift = MemberDrift::default();
    for (&service, &node) in nodes {
        match (in_nova.contains(service), providers.contains(node)) {
            (true, false) => drift.missing.push((service.into(), node.into())),
            (false, true) => drift.extra.push((service.into(), node.into())),
            _ => {}
        }
    }
    drift
}

/// Enrolled hosts of `nodes` (service name to hypervisor hostname) whose compute node has
/// a provider in `providers` (name to uuid) but whose `blazar_<hypervisor>` provider is
/// gone: (service name, the node's provider uuid, the name to make under it).
pub(crate) fn missing_host_providers(
    providers: &BTreeMap<&str, &str>,
    nodes: &BTreeMap<&str, &str>,
) -> Vec<(String, String, String)> {
    nodes
        .iter()
        .filter_map(|(&service, &node)| {
            let name = reservation_provider_name(node);
            let parent = providers.get(node)?;
            (!providers.contains_key(name.as_str()))
                .then(|| (service.to_string(), parent.to_string(), name))
        })
        .collect()
}

impl OpenStackBackend {
    /// Placement's copy of the freepool and of `action`'s reservation aggregate, for the
    /// action's `hosts` ((service name, hypervisor hostname)), made as Nova has them now.
    pub(crate) async fn copy_memberships(
        &self,
        action: &Action,
        hosts: &[(String, String)],
    ) -> Result<(), Error> {
        let nova = self.cloud().nova(action.request_id.as_deref());
        let placement = self.cloud().placement(action.request_id.as_deref());
        let aggregates = nova.aggregates().await?;
        let owned: Vec<&Aggregate> = aggregates
            .iter()
            .filter(|a| {
                !a.uuid.is_empty()
                    && (a.name == self.settings().freepool || a.name == action.reservation_id)
            })
            .collect();
        for (service, node) in hosts {
            let Some(provider) = placement.provider_by_name(node).await? else {
                continue;
            };
            for aggregate in &owned {
                let member = aggregate.hosts.iter().any(|h| h == service);
                placement
                    .set_member_of(&provider.uuid, &aggregate.uuid, member)
                    .await?;
            }
        }
        Ok(())
    }

    /// Placement's copy of the freepool's and the reservations' aggregates against Nova's
    /// (read again here: the host pass before this one may have changed them).
    pub(crate) async fn reconcile_placement_members(
        &self,
        store: &Store,
        desired: &DesiredState,
        apply: bool,
        pass: &mut Pass,
    ) -> Result<(), Error> {
        let nova = self.cloud().nova(None);
        let placement = self.cloud().placement(None);
        let nodes: BTreeMap<&str, &str> = desired
            .hypervisors
            .iter()
            .filter(|(service, _)| !desired.busy_hosts.contains(service))
            .map(|(service, node)| (service.as_str(), node.as_str()))
            .collect();
        if nodes.is_empty() {
            return Ok(());
        }
        let providers = placement.providers().await?;
        let by_name: BTreeMap<&str, &str> = providers
            .iter()
            .map(|p| (p.name.as_str(), p.uuid.as_str()))
            .collect();
        for (service, parent, name) in missing_host_providers(&by_name, &nodes) {
            let line = pass.found(format!(
                "provider {name} of host {service} missing: created"
            ));
            if !apply
                || !desired
                    .hold(store, &host_item(desired, None, [&service]))
                    .await
            {
                continue;
            }
            let made = placement.ensure_child_provider(&name, &parent).await;
            pass.done(&line, made.map(|_| ()));
            desired.release(store).await;
        }
        let owned = |a: &Aggregate| {
            !a.uuid.is_empty()
                && (a.name == self.settings().freepool
                    || (desired.kept.contains(&a.name)
                        && !desired.busy_reservations.contains(&a.name)))
        };
        for aggregate in nova.aggregates().await?.iter().filter(|a| owned(a)) {
            let what = format!("Placement's copy of aggregate {}", aggregate.name);
            let Some(providers) = pass.value(
                &format!("{what} could not be read"),
                placement.providers_in_aggregate(&aggregate.uuid).await,
            ) else {
                continue;
            };
            let providers: BTreeSet<String> = providers.into_iter().map(|p| p.name).collect();
            let drift = member_drift(&aggregate.hosts, &providers, &nodes);
            let changes = drift
                .missing
                .into_iter()
                .map(|host| (host, true))
                .chain(drift.extra.into_iter().map(|host| (host, false)));
            for ((service, node), member) in changes {
                let line = pass.found(if member {
                    format!("host {service} missing from {what}: added")
                } else {
                    format!("host {service} in {what} but not in the aggregate: taken out")
                });
                if !apply
                    || !desired
                        .hold(store, &host_item(desired, None, [&service]))
                        .await
                {
                    continue;
                }
                let set = match placement.provider_by_name(&node).await {
                    Ok(Some(provider)) => {
                        placement
                            .set_member_of(&provider.uuid, &aggregate.uuid, member)
                            .await
                    }
                    // Deleted since it was listed: nothing of it left to copy.
                    Ok(None) => Ok(()),
                    Err(e) => Err(e),
                };
                pass.done(&line, set);
                desired.release(store).await;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_enrolled_hosts_are_compared_by_their_node_name() {
        let nodes: BTreeMap<&str, &str> = [
            ("compute-1", "node-1"),
            ("compute-2", "node-2"),
            ("compute-3", "node-3"),
        ]
        .into();
        let hosts = vec!["compute-1".to_string(), "compute-2".to_string()];
        // node-2 lost, node-3 left behind; a sharing provider is not Blazar's to judge.
        let providers: BTreeSet<String> = ["node-1", "node-3", "shared-disk"]
            .into_iter()
            .map(String::from)
            .collect();
        let drift = member_drift(&hosts, &providers, &nodes);
        assert_eq!(
            drift,
            MemberDrift {
                missing: vec![("compute-2".into(), "node-2".into())],
                extra: vec![("compute-3".into(), "node-3".into())],
            }
        );
        let providers = ["node-1", "node-2"].into_iter().map(String::from).collect();
        assert_eq!(
            member_drift(&hosts, &providers, &nodes),
            MemberDrift::default()
        );
    }

    #[test]
    fn a_host_provider_is_missing_only_under_a_node_that_is_there() {
        let nodes: BTreeMap<&str, &str> = [
            ("compute-1", "node-1"),
            ("compute-2", "node-2"),
            ("compute-3", "node-3"),
        ]
        .into();
        // node-2 lost its blazar_ provider; node-3 has none at all (its compute was
        // removed from Placement): nothing to make it under.
        let providers: BTreeMap<&str, &str> = [
            ("node-1", "u1"),
            ("blazar_node-1", "b1"),
            ("node-2", "u2"),
            ("blazar_node-3", "b3"),
        ]
        .into();
        assert_eq!(
            missing_host_providers(&providers, &nodes),
            vec![(
                "compute-2".to_string(),
                "u2".to_string(),
                "blazar_node-2".to_string()
            )]
        );
    }
}
