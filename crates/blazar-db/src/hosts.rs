//! Hosts, their extra capabilities, and resource properties.

use std::collections::{BTreeMap, HashMap};

use blazar_core::{HostFacts, HostRecord, Property};
use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::any::AnyRow;

use crate::{DbError, DbResult, Tx, from_opt_secs, from_secs, placeholders, to_secs};

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

#[derive(Debug, Clone, PartialEq)]
pub struct PropertyWithValues {
    pub property_name: String,
    pub private: bool,
    pub is_unique: bool,
    pub values: Vec<String>,
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

fn property_from_row(row: &AnyRow) -> DbResult<Property> {
    Ok(Property {
        id: row.try_get("id")?,
        resource_type: row.try_get("resource_type")?,
        property_name: row.try_get("property_name")?,
        private: row.try_get::<i64, _>("private")? != 0,
        is_unique: row.try_get::<i64, _>("is_unique")? != 0,
        created_at: from_secs(row.try_get("created_at")?)?,
        updated_at: from_opt_secs(row.try_get("updated_at")?)?,
    })
}

impl Tx {
    pub async fn insert_host(&mut self, host: &NewHost) -> DbResult<i64> {
        let f = &host.facts;
        let row = sqlx::query(
            "INSERT INTO hosts (hypervisor_hostname, service_name, hypervisor_type, \
             hypervisor_version, vcpus, memory_mb, local_gb, cpu_info, availability_zone, \
             status, reservable, trust_id, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, NULL, 1, $10, $11, NULL) RETURNING id",
        )
        .bind(&f.hypervisor_hostname)
        .bind(&f.service_name)
        .bind(&f.hypervisor_type)
        .bind(f.hypervisor_version)
        .bind(f.vcpus)
        .bind(f.memory_mb)
        .bind(f.local_gb)
        .bind(&f.cpu_info)
        .bind(&f.availability_zone)
        .bind(&host.trust_id)
        .bind(to_secs(host.created_at))
        .fetch_one(self.conn().await?)
        .await?;
        let id: i64 = row.try_get("id")?;
        for (key, value) in &host.capabilities {
            self.set_host_capability(id, key, value, host.created_at)
                .await?;
        }
        self.bump_inventory(blazar_core::PHYSICAL_HOST).await?;
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
        let property_id = self
            .ensure_property(blazar_core::PHYSICAL_HOST, key, now)
            .await?;
        self.check_unique_value(
            "host_capabilities",
            "host_id",
            &property_id,
            host_id,
            key,
            value,
        )
        .await?;
        sqlx::query(
            "INSERT INTO host_capabilities (host_id, property_id, value) VALUES ($1, $2, $3) \
             ON CONFLICT (host_id, property_id) DO UPDATE SET value = excluded.value",
        )
        .bind(host_id)
        .bind(&property_id)
        .bind(value)
        .execute(self.conn().await?)
        .await?;
        self.bump_inventory(blazar_core::PHYSICAL_HOST).await?;
        Ok(())
    }

    pub async fn remove_host_capability(&mut self, host_id: i64, key: &str) -> DbResult<bool> {
        let done = sqlx::query(
            "DELETE FROM host_capabilities WHERE host_id = $1 AND property_id IN \
             (SELECT id FROM resource_properties WHERE resource_type = $2 AND property_name = $3)",
        )
        .bind(host_id)
        .bind(blazar_core::PHYSICAL_HOST)
        .bind(key)
        .execute(self.conn().await?)
        .await?;
        self.bump_inventory(blazar_core::PHYSICAL_HOST).await?;
        Ok(done.rows_affected() > 0)
    }

    pub(crate) async fn ensure_property(
        &mut self,
        resource_type: &str,
        name: &str,
        now: DateTime<Utc>,
    ) -> DbResult<String> {
        sqlx::query(
            "INSERT INTO resource_properties (id, resource_type, property_name, private, created_at) \
             VALUES ($1, $2, $3, 0, $4) ON CONFLICT (resource_type, property_name) DO NOTHING",
        )
        .bind(uuid::Uuid::new_v4().to_string())
        .bind(resource_type)
        .bind(name)
        .bind(to_secs(now))
        .execute(self.conn().await?)
        .await?;
        let row = sqlx::query(
            "SELECT id FROM resource_properties WHERE resource_type = $1 AND property_name = $2",
        )
        .bind(resource_type)
        .bind(name)
        .fetch_one(self.conn().await?)
        .await?;
        Ok(row.try_get("id")?)
    }

    pub async fn get_host(&mut self, id: i64) -> DbResult<Option<HostRecord>> {
        let sql = format!("SELECT {HOST_COLUMNS} FROM hosts WHERE id = $1");
        let Some(row) = sqlx::query(&sql)
            .bind(id)
            .fetch_optional(self.conn().await?)
            .await?
        else {
            return Ok(None);
        };
        let mut host = host_from_row(&row)?;
        host.capabilities = self
            .capabilities_of(&[id])
            .await?
            .remove(&id)
            .unwrap_or_default();
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
        let rows = sqlx::query(&sql).fetch_all(self.conn().await?).await?;
        let mut caps = self.all_host_capabilities().await?;
        rows.iter()
            .map(|row| {
                let mut host = host_from_row(row)?;
                host.capabilities = caps.remove(&host.id).unwrap_or_default();
                Ok(host)
            })
            .collect()
    }

    async fn all_host_capabilities(&mut self) -> DbResult<HashMap<i64, BTreeMap<String, String>>> {
        let rows = sqlx::query(
            "SELECT c.host_id, p.property_name, c.value FROM host_capabilities c \
             JOIN resource_properties p ON p.id = c.property_id",
        )
        .fetch_all(self.conn().await?)
        .await?;
        group_capabilities(&rows)
    }

    async fn capabilities_of(
        &mut self,
        ids: &[i64],
    ) -> DbResult<HashMap<i64, BTreeMap<String, String>>> {
        let sql = format!(
            "SELECT c.host_id, p.property_name, c.value FROM host_capabilities c \
             JOIN resource_properties p ON p.id = c.property_id WHERE c.host_id IN ({})",
            placeholders(1, ids.len())
        );
        let mut query = sqlx::query(&sql);
        for id in ids {
            query = query.bind(*id);
        }
        let rows = query.fetch_all(self.conn().await?).await?;
        group_capabilities(&rows)
    }

    pub async fn update_host_facts(
        &mut self,
        id: i64,
        facts: &HostFacts,
        reservable: bool,
        now: DateTime<Utc>,
    ) -> DbResult<()> {
        sqlx::query(
            "UPDATE hosts SET service_name = $1, hypervisor_type = $2, hypervisor_version = $3, \
             vcpus = $4, memory_mb = $5, local_gb = $6, cpu_info = $7, availability_zone = $8, \
             reservable = $9, updated_at = $10 WHERE id = $11",
        )
        .bind(&facts.service_name)
        .bind(&facts.hypervisor_type)
        .bind(facts.hypervisor_version)
        .bind(facts.vcpus)
        .bind(facts.memory_mb)
        .bind(facts.local_gb)
        .bind(&facts.cpu_info)
        .bind(&facts.availability_zone)
        .bind(i64::from(reservable))
        .bind(to_secs(now))
        .bind(id)
        .execute(self.conn().await?)
        .await?;
        self.bump_inventory(blazar_core::PHYSICAL_HOST).await?;
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
        self.bump_inventory(blazar_core::PHYSICAL_HOST).await?;
        Ok(())
    }

    pub async fn delete_host(&mut self, id: i64) -> DbResult<()> {
        sqlx::query("DELETE FROM host_capabilities WHERE host_id = $1")
            .bind(id)
            .execute(self.conn().await?)
            .await?;
        sqlx::query("DELETE FROM hosts WHERE id = $1")
            .bind(id)
            .execute(self.conn().await?)
            .await?;
        self.bump_inventory(blazar_core::PHYSICAL_HOST).await?;
        Ok(())
    }

    /// Property names with their distinct values, for one resource type.
    pub async fn list_properties(
        &mut self,
        resource_type: &str,
    ) -> DbResult<Vec<PropertyWithValues>> {
        let rows = sqlx::query(
            "SELECT DISTINCT p.property_name, p.private, p.is_unique, c.value \
             FROM resource_properties p JOIN host_capabilities c ON c.property_id = p.id \
             WHERE p.resource_type = $1 ORDER BY p.property_name, c.value",
        )
        .bind(resource_type)
        .fetch_all(self.conn().await?)
        .await?;
        group_property_values(&rows)
    }

    /// The names of a resource type's private properties.
    pub async fn private_property_names(
        &mut self,
        resource_type: &str,
    ) -> DbResult<std::collections::HashSet<String>> {
        let rows = sqlx::query(
            "SELECT property_name FROM resource_properties \
             WHERE resource_type = $1 AND private <> 0",
        )
        .bind(resource_type)
        .fetch_all(self.conn().await?)
        .await?;
        rows.iter()
            .map(|r| Ok(r.try_get::<String, _>("property_name")?))
            .collect()
    }

    pub async fn get_property(
        &mut self,
        resource_type: &str,
        name: &str,
    ) -> DbResult<Option<Property>> {
        let row = sqlx::query(
            "SELECT id, resource_type, property_name, private, is_unique, created_at, \
             updated_at FROM resource_properties WHERE resource_type = $1 AND property_name = $2",
        )
        .bind(resource_type)
        .bind(name)
        .fetch_optional(self.conn().await?)
        .await?;
        row.as_ref().map(property_from_row).transpose()
    }

    pub async fn set_property_private(
        &mut self,
        id: &str,
        private: bool,
        now: DateTime<Utc>,
    ) -> DbResult<()> {
        sqlx::query("UPDATE resource_properties SET private = $1, updated_at = $2 WHERE id = $3")
            .bind(i64::from(private))
            .bind(to_secs(now))
            .bind(id)
            .execute(self.conn().await?)
            .await?;
        Ok(())
    }

    /// Makes a property unique or not. Refuses (`Duplicate`) to make it unique while two
    /// resources share a value of it.
    pub async fn set_property_unique(
        &mut self,
        property: &Property,
        is_unique: bool,
        now: DateTime<Utc>,
    ) -> DbResult<()> {
        let table = capability_table(&property.resource_type);
        if is_unique {
            let shared = sqlx::query(&format!(
                "SELECT value FROM {table} WHERE property_id = $1 \
                 GROUP BY value HAVING COUNT(*) > 1 ORDER BY value LIMIT 1"
            ))
            .bind(&property.id)
            .fetch_optional(self.conn().await?)
            .await?;
            if let Some(row) = shared {
                let value: String = row.try_get("value")?;
                return Err(DbError::NotUnique(format!(
                    "{} cannot be made unique: several resources have {} = {value}",
                    property.property_name, property.property_name
                )));
            }
        }
        sqlx::query("UPDATE resource_properties SET is_unique = $1, updated_at = $2 WHERE id = $3")
            .bind(i64::from(is_unique))
            .bind(to_secs(now))
            .bind(&property.id)
            .execute(self.conn().await?)
            .await?;
        Ok(())
    }

    /// Refuses (`Duplicate`) to give `owner` a value of a unique property another resource
    /// of the type already holds. A unique property's row is locked (PostgreSQL) so two
    /// concurrent writers of one value cannot both pass the check.
    pub(crate) async fn check_unique_value(
        &mut self,
        table: &str,
        owner_column: &str,
        property_id: &str,
        owner: i64,
        key: &str,
        value: &str,
    ) -> DbResult<()> {
        // Unlocked first: most properties are not unique, and locking every one would queue
        // all enrolments that share a key behind each other.
        for lock in ["", self.for_update()] {
            let unique = sqlx::query(&format!(
                "SELECT is_unique FROM resource_properties WHERE id = $1{lock}"
            ))
            .bind(property_id)
            .fetch_one(self.conn().await?)
            .await?
            .try_get::<i64, _>("is_unique")?
                != 0;
            if !unique {
                return Ok(());
            }
        }
        let taken = sqlx::query(&format!(
            "SELECT 1 AS one FROM {table} WHERE property_id = $1 AND value = $2 AND {owner_column} <> $3 LIMIT 1"
        ))
        .bind(property_id)
        .bind(value)
        .bind(owner)
        .fetch_optional(self.conn().await?)
        .await?;
        if taken.is_some() {
            return Err(DbError::NotUnique(format!(
                "{key} must be unique: another resource already has {key} = {value}"
            )));
        }
        Ok(())
    }
}

/// Where a resource type's capabilities live.
fn capability_table(resource_type: &str) -> &'static str {
    if resource_type == blazar_core::PHYSICAL_HOST {
        "host_capabilities"
    } else {
        "resource_capabilities"
    }
}

/// Rows of (property_name, private, is_unique, value), ordered by name, folded into one entry per name.
pub(crate) fn group_property_values(rows: &[AnyRow]) -> DbResult<Vec<PropertyWithValues>> {
    let mut out: Vec<PropertyWithValues> = Vec::new();
    for row in rows {
        let name: String = row.try_get("property_name")?;
        let private = row.try_get::<i64, _>("private")? != 0;
        let is_unique = row.try_get::<i64, _>("is_unique")? != 0;
        let value: String = row.try_get("value")?;
        match out.last_mut() {
            Some(last) if last.property_name == name => last.values.push(value),
            _ => out.push(PropertyWithValues {
                property_name: name,
                private,
                is_unique,
                values: vec![value],
            }),
        }
    }
    Ok(out)
}

fn group_capabilities(rows: &[AnyRow]) -> DbResult<HashMap<i64, BTreeMap<String, String>>> {
    let mut out: HashMap<i64, BTreeMap<String, String>> = HashMap::new();
    for row in rows {
        let host_id: i64 = row.try_get("host_id")?;
        let name: String = row.try_get("property_name")?;
        let value: String = row.try_get("value")?;
        out.entry(host_id).or_default().insert(name, value);
    }
    Ok(out)
}
