//! Hosts and their extra capabilities.

use std::collections::BTreeMap;

use blazar_core::{HostFacts, HostRecord, PHYSICAL_HOST};
use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::any::AnyRow;

use crate::properties::HOST_CAPABILITIES;
use crate::{DbResult, Tx, from_opt_secs, from_secs, to_secs};

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

type Query<'q> = sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments<'q>>;

/// Binds the facts of a host an update may change, in the order its insert and update both
/// name them (from `service_name` to `availability_zone`).
fn bind_facts<'q>(query: Query<'q>, f: &'q HostFacts) -> Query<'q> {
    query
        .bind(&f.service_name)
        .bind(&f.hypervisor_type)
        .bind(f.hypervisor_version)
        .bind(f.vcpus)
        .bind(f.memory_mb)
        .bind(f.local_gb)
        .bind(&f.cpu_info)
        .bind(&f.availability_zone)
}

impl Tx {
    pub async fn insert_host(&mut self, host: &NewHost) -> DbResult<i64> {
        let f = &host.facts;
        let query = sqlx::query(
            "INSERT INTO hosts (hypervisor_hostname, service_name, hypervisor_type, \
             hypervisor_version, vcpus, memory_mb, local_gb, cpu_info, availability_zone, \
             status, reservable, trust_id, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, NULL, 1, $10, $11, NULL) RETURNING id",
        )
        .bind(&f.hypervisor_hostname);
        let row = bind_facts(query, f)
            .bind(&host.trust_id)
            .bind(to_secs(host.created_at))
            .fetch_one(self.conn().await?)
            .await?;
        let id: i64 = row.try_get("id")?;
        for (key, value) in &host.capabilities {
            self.set_host_capability(id, key, value, host.created_at)
                .await?;
        }
        self.bump_inventory(PHYSICAL_HOST).await?;
        Ok(id)
    }

    /// Sets (adds or replaces) one extra capability, creating its property on first use.
    pub async fn set_host_capability(
        &mut self,
        host_id: i64,
        key: &str,
        value: &str,
        now: DateTime<Utc>,
    ) -> DbResult<()> {
        self.set_capability(HOST_CAPABILITIES, PHYSICAL_HOST, host_id, key, value, now)
            .await
    }

    pub async fn remove_host_capability(&mut self, host_id: i64, key: &str) -> DbResult<bool> {
        self.remove_capability(HOST_CAPABILITIES, PHYSICAL_HOST, host_id, key)
            .await
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
        let query = sqlx::query(
            "UPDATE hosts SET service_name = $1, hypervisor_type = $2, hypervisor_version = $3, \
             vcpus = $4, memory_mb = $5, local_gb = $6, cpu_info = $7, availability_zone = $8, \
             reservable = $9, updated_at = $10 WHERE id = $11",
        );
        bind_facts(query, facts)
            .bind(i64::from(reservable))
            .bind(to_secs(now))
            .bind(id)
            .execute(self.conn().await?)
            .await?;
        self.bump_inventory(PHYSICAL_HOST).await?;
        Ok(())
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
        sqlx::query("UPDATE hosts SET reservable = $1, status = $2, updated_at = $3 WHERE id = $4")
            .bind(i64::from(reservable))
            .bind(status)
            .bind(to_secs(now))
            .bind(id)
            .execute(self.conn().await?)
            .await?;
        self.bump_inventory(PHYSICAL_HOST).await?;
        Ok(())
    }

    pub async fn delete_host(&mut self, id: i64) -> DbResult<()> {
        self.delete_with_capabilities(HOST_CAPABILITIES, "hosts", id)
            .await?;
        self.bump_inventory(PHYSICAL_HOST).await?;
        Ok(())
    }
}
