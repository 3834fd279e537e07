//! Hosts and their extra capabilities.

use std::collections::BTreeMap;

use blazar_core::{HostFacts, HostRecord, PHYSICAL_HOST};
use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::any::AnyRow;

use crate::properties::HOST_CAPABILITIES;
use crate::{Columns, DbResult, Tx, from_opt_secs, from_secs};

const HOST_COLUMNS: &str = "id, hypervisor_hostname, service_name, hypervisor_type, \
    hypervisor_version, vcpus, memory_mb, local_gb, cpu_info, availability_zone, status, \
    reservable, trust_id, created_at, updated_at";

#[derive(Debug, Clone)]
pub struct NewHost {
    pub facts: HostFacts,
    pub trust_id: String,
    pub capabilities: BTreeMap<String, String>,
    pub created_at: DateTime<Utc>,
}

fn host_from_row(row: &AnyRow) -> DbResult<HostRecord> {
    Ok(HostRecord {
        id: row.try_get("id")?,
        facts: HostFacts {
            hypervisor_hostname: row.try_get("hypervisor_hostname")?,
            service_name: row.try_get("service_name")?,
            hypervisor_type: row.try_get("hypervisor_type")?,
            hypervisor_version: row.try_get("hypervisor_version")?,
            vcpus: row.try_get("vcpus")?,
            memory_mb: row.try_get("memory_mb")?,
            local_gb: row.try_get("local_gb")?,
            cpu_info: row.try_get("cpu_info")?,
            availability_zone: row.try_get("availability_zone")?,
        },
        status: row.try_get("status")?,
        reservable: row.try_get::<i64, _>("reservable")? != 0,
        trust_id: row.try_get("trust_id")?,
        capabilities: BTreeMap::new(),
        created_at: from_secs(row.try_get("created_at")?)?,
        updated_at: from_opt_secs(row.try_get("updated_at")?)?,
    })
}

/// The facts of a host an update may change, first in its insert and update alike, so both
/// store them the same way.
fn facts_columns(f: &HostFacts) -> Columns {
    Columns::default()
        .set("service_name", &f.service_name)
        .set("hypervisor_type", &f.hypervisor_type)
        .set("hypervisor_version", f.hypervisor_version)
        .set("vcpus", f.vcpus)
        .set("memory_mb", f.memory_mb)
        .set("local_gb", f.local_gb)
        .set("cpu_info", &f.cpu_info)
        .set("availability_zone", &f.availability_zone)
}

impl Tx {
    pub async fn insert_host(&mut self, host: &NewHost) -> DbResult<i64> {
        let f = &host.facts;
        let columns = facts_columns(f)
            .set("hypervisor_hostname", &f.hypervisor_hostname)
            .set("status", None::<&str>)
            .set("reservable", true)
            .set("trust_id", &host.trust_id)
            .set("created_at", host.created_at)
            .set("updated_at", None::<DateTime<Utc>>);
        let id = self.insert_returning_id("hosts", columns).await?;
        self.insert_capabilities(PHYSICAL_HOST, id, &host.capabilities, host.created_at)
            .await?;
        Ok(id)
    }

    pub async fn get_host(&mut self, id: i64) -> DbResult<Option<HostRecord>> {
        let sql = format!("SELECT {HOST_COLUMNS} FROM hosts WHERE id = $1");
        let Some(mut host) = self
            .fetch_optional_as(&sql, vec![id.into()], host_from_row)
            .await?
        else {
            return Ok(None);
        };
        host.capabilities = self.capabilities_of(HOST_CAPABILITIES, id).await?;
        Ok(Some(host))
    }

    /// Locks a host row against concurrent changes (PostgreSQL) for the rest of the transaction.
    pub async fn lock_host(&mut self, id: i64) -> DbResult<bool> {
        self.lock_row("hosts", id).await
    }

    /// Of `ids`, the hosts that still exist and are reservable, share-locked on PostgreSQL so a
    /// concurrent delete or maintenance switch waits for this transaction.
    pub async fn lock_reservable_hosts(&mut self, ids: &[i64]) -> DbResult<Vec<i64>> {
        self.lock_reservable_rows("hosts", ids).await
    }

    pub async fn list_hosts(&mut self) -> DbResult<Vec<HostRecord>> {
        let sql = format!("SELECT {HOST_COLUMNS} FROM hosts ORDER BY id");
        let mut hosts = self.fetch_all_as(&sql, Vec::new(), host_from_row).await?;
        let mut caps = self.all_capabilities(HOST_CAPABILITIES, None).await?;
        for host in &mut hosts {
            host.capabilities = caps.remove(&host.id).unwrap_or_default();
        }
        Ok(hosts)
    }

    pub async fn update_host_facts(
        &mut self,
        id: i64,
        facts: &HostFacts,
        reservable: bool,
        now: DateTime<Utc>,
    ) -> DbResult<()> {
        self.update_host(id, reservable, now, facts_columns(facts))
            .await
    }

    /// Sets whether the host may be reserved and the status that says why not (`down`: the
    /// monitor found it failed), in one statement.
    pub async fn set_host_health(
        &mut self,
        id: i64,
        reservable: bool,
        status: Option<&str>,
        now: DateTime<Utc>,
    ) -> DbResult<()> {
        let columns = Columns::default().set("status", status);
        self.update_host(id, reservable, now, columns).await
    }

    /// Writes `columns` of host `id`, whether it is reservable and when it changed (`now`),
    /// and moves the host inventory's version: what a change of facts and of health share.
    async fn update_host(
        &mut self,
        id: i64,
        reservable: bool,
        now: DateTime<Utc>,
        columns: Columns,
    ) -> DbResult<()> {
        let (sql, args) = columns
            .set("reservable", reservable)
            .set("updated_at", now)
            .update("hosts", "", "id", id);
        self.execute(&sql, args).await?;
        self.bump_inventory(PHYSICAL_HOST).await
    }

    pub async fn delete_host(&mut self, id: i64) -> DbResult<()> {
        self.delete_with_capabilities(HOST_CAPABILITIES, "hosts", id)
            .await?;
        self.bump_inventory(PHYSICAL_HOST).await?;
        Ok(())
    }
}
