//! The OpenStack backend: actions on host reservations become what Blazar's host plugin does
//! to Nova (spec section 4.1 and 9). Every step checks before it acts, so an action that runs
//! twice leaves the cloud as running it once.

use std::time::Duration;

use async_trait::async_trait;
use blazar_core::{ActionKind, ActionPurpose, PHYSICAL_HOST};
use blazar_db::Store;
use blazar_service::{Action, ActionError, Backend};
use serde_json::{Map, json};

use crate::Cloud;
use crate::error::Error;

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
            server_delete_timeout: Duration::from_secs(600),
        }
    }
}

pub struct OpenStackBackend {
    cloud: Cloud,
    settings: OpenStackSettings,
}

fn action_error(e: Error) -> ActionError {
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
    async fn service_hosts(store: &Store, ids: &[i64]) -> Result<Vec<String>, ActionError> {
        let db = |e: blazar_db::DbError| ActionError::Transient(format!("database: {e}"));
        let mut tx = store.read().await.map_err(db)?;
        let mut hosts = Vec::with_capacity(ids.len());
        for &id in ids {
            match tx.get_host(id).await.map_err(db)? {
                Some(h) => hosts.push(h.facts.service_name.clone()),
                // Deleted from the inventory since: nothing of ours to move.
                None => tracing::warn!(host.id = id, "host of an action no longer enrolled"),
            }
        }
        Ok(hosts)
    }

    /// Hand-over: the reservation's aggregate (created, with its zone and owner, if it is
    /// not there), and each host moved from the freepool into it, servers on it deleted
    /// first (Blazar's "terminate preemptibles").
    async fn start_hosts(&self, action: &Action, hosts: &[String]) -> Result<(), Error> {
        let nova = self.cloud.nova(action.request_id.as_deref());
        let zone = format!("{}{}", self.settings.az_prefix, action.reservation_id);
        let aggregate = nova
            .ensure_aggregate(&action.reservation_id, Some(&zone))
            .await?;
        let mut metadata = Map::new();
        metadata.insert(self.settings.owner_key.clone(), json!(action.project_id));
        nova.set_metadata(&aggregate, metadata).await?;
        let freepool = nova.ensure_aggregate(&self.settings.freepool, None).await?;
        for host in hosts {
            nova.remove_host(&freepool, host).await?;
            let cleared = nova
                .clear_host(host, self.settings.server_delete_timeout)
                .await?;
            if cleared > 0 {
                tracing::info!(host, servers = cleared, reservation.id = %action.reservation_id,
                    "deleted servers left on a host before handing it over");
            }
            nova.add_host(&aggregate, host).await?;
            tracing::info!(host, aggregate = %action.reservation_id, project.id = %action.project_id,
                "host moved into its reservation's aggregate");
        }
        Ok(())
    }

    /// Take-back: every server on the hosts deleted and waited for, each host moved back to
    /// the freepool; at the end of the lease (or its delete) the aggregate goes too.
    async fn stop_hosts(&self, action: &Action, hosts: &[String]) -> Result<(), Error> {
        let nova = self.cloud.nova(action.request_id.as_deref());
        let freepool = nova.ensure_aggregate(&self.settings.freepool, None).await?;
        let aggregate = nova.find_aggregate(&action.reservation_id).await?;
        for host in hosts {
            let cleared = nova
                .clear_host(host, self.settings.server_delete_timeout)
                .await?;
            if cleared > 0 {
                tracing::info!(host, servers = cleared, reservation.id = %action.reservation_id,
                    "deleted the servers of an ended reservation");
            }
            if let Some(aggregate) = &aggregate {
                nova.remove_host(aggregate, host).await?;
            }
            nova.add_host(&freepool, host).await?;
            tracing::info!(host, "host back in the freepool");
        }
        let whole = matches!(
            action.purpose,
            ActionPurpose::LeaseEnd | ActionPurpose::Delete
        );
        if whole && let Some(aggregate) = nova.find_aggregate(&action.reservation_id).await? {
            // Hosts of the reservation that were not part of this action (none, normally).
            for host in &aggregate.hosts {
                nova.clear_host(host, self.settings.server_delete_timeout)
                    .await?;
                nova.remove_host(&aggregate, host).await?;
                nova.add_host(&freepool, host).await?;
            }
            nova.delete_aggregate(&aggregate).await?;
            tracing::info!(aggregate = %action.reservation_id, "reservation aggregate deleted");
        }
        Ok(())
    }
}

#[async_trait]
impl Backend for OpenStackBackend {
    async fn apply(&self, store: &Store, action: &Action) -> Result<(), ActionError> {
        if action.reservation_type != PHYSICAL_HOST {
            return Err(ActionError::Permanent(format!(
                "the openstack backend does not act on {} reservations yet",
                action.reservation_type
            )));
        }
        let hosts = Self::service_hosts(store, &action.resources).await?;
        let result = match action.kind {
            ActionKind::Start => self.start_hosts(action, &hosts).await,
            ActionKind::Stop => self.stop_hosts(action, &hosts).await,
        };
        result.map_err(action_error)
    }
}
