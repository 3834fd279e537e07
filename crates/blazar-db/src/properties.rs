//! Resource properties and the extra capabilities that give them values, for hosts and for
//! every other kind of resource alike.

use std::collections::{BTreeMap, HashMap, HashSet};

use blazar_core::Property;
use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::any::AnyRow;

use crate::{DbError, DbResult, Tx, from_opt_secs, from_secs, to_secs};

#[derive(Debug, Clone, PartialEq)]
pub struct PropertyWithValues {
    pub property_name: String,
    pub private: bool,
    pub is_unique: bool,
    pub values: Vec<String>,
}

/// Where one inventory keeps its extra capabilities: hosts in a table of their own, every
/// other kind in one shared table. Both have the same shape but for the owner's column.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Capabilities {
    table: &'static str,
    /// The column naming the resource that holds a capability.
    owner: &'static str,
}

pub(crate) const HOST_CAPABILITIES: Capabilities = Capabilities {
    table: "host_capabilities",
    owner: "host_id",
};

pub(crate) const RESOURCE_CAPABILITIES: Capabilities = Capabilities {
    table: "resource_capabilities",
    owner: "resource_id",
};

impl Capabilities {
    /// Where a resource type's capabilities live.
    fn of(resource_type: &str) -> Capabilities {
        if resource_type == blazar_core::PHYSICAL_HOST {
            HOST_CAPABILITIES
        } else {
            RESOURCE_CAPABILITIES
        }
    }
}

/// Capabilities by owner.
type CapabilityMap = HashMap<i64, BTreeMap<String, String>>;

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
    /// Sets (adds or replaces) one extra capability of `owner`, a resource of
    /// `resource_type`, creating its property on first use.
    pub async fn set_capability(
        &mut self,
        resource_type: &str,
        owner: i64,
        key: &str,
        value: &str,
        now: DateTime<Utc>,
    ) -> DbResult<()> {
        self.write_capability(resource_type, owner, key, value, now)
            .await?;
        self.bump_inventory(resource_type).await
    }

    /// [`Tx::set_capability`] without moving the inventory's version.
    async fn write_capability(
        &mut self,
        resource_type: &str,
        owner: i64,
        key: &str,
        value: &str,
        now: DateTime<Utc>,
    ) -> DbResult<()> {
        let caps = Capabilities::of(resource_type);
        let property_id = self.ensure_property(resource_type, key, now).await?;
        self.check_unique_value(caps, &property_id, owner, key, value)
            .await?;
        let Capabilities {
            table,
            owner: column,
        } = caps;
        sqlx::query(&format!(
            "INSERT INTO {table} ({column}, property_id, value) VALUES ($1, $2, $3) \
             ON CONFLICT ({column}, property_id) DO UPDATE SET value = excluded.value"
        ))
        .bind(owner)
        .bind(&property_id)
        .bind(value)
        .execute(self.conn().await?)
        .await?;
        Ok(())
    }

    /// Records a new resource's extra capabilities, then moves its type's inventory version
    /// (also when it has none: the resource itself is new), not its count of changes.
    pub(crate) async fn insert_capabilities(
        &mut self,
        resource_type: &str,
        owner: i64,
        capabilities: &BTreeMap<String, String>,
        now: DateTime<Utc>,
    ) -> DbResult<()> {
        for (key, value) in capabilities {
            self.write_capability(resource_type, owner, key, value, now)
                .await?;
        }
        self.bump_inventory_added(resource_type).await
    }

    /// Removes one extra capability of `owner`; tells whether it had it.
    pub async fn remove_capability(
        &mut self,
        resource_type: &str,
        owner: i64,
        key: &str,
    ) -> DbResult<bool> {
        let Capabilities {
            table,
            owner: column,
        } = Capabilities::of(resource_type);
        let done = sqlx::query(&format!(
            "DELETE FROM {table} WHERE {column} = $1 AND property_id IN \
             (SELECT id FROM resource_properties WHERE resource_type = $2 AND property_name = $3)"
        ))
        .bind(owner)
        .bind(resource_type)
        .bind(key)
        .execute(self.conn().await?)
        .await?;
        self.bump_inventory(resource_type).await?;
        Ok(done.rows_affected() > 0)
    }

    /// The capabilities of every owner, or of the owners of type `kind`.
    pub(crate) async fn all_capabilities(
        &mut self,
        caps: Capabilities,
        kind: Option<&str>,
    ) -> DbResult<CapabilityMap> {
        let Capabilities { table, owner } = caps;
        let mut sql = format!(
            "SELECT c.{owner}, p.property_name, c.value FROM {table} c \
             JOIN resource_properties p ON p.id = c.property_id"
        );
        if kind.is_some() {
            sql.push_str(" WHERE p.resource_type = $1");
        }
        let mut query = sqlx::query(&sql);
        if let Some(kind) = kind {
            query = query.bind(kind);
        }
        let rows = query.fetch_all(self.conn().await?).await?;
        group_capabilities(&rows, owner)
    }

    /// The capabilities of one owner.
    pub(crate) async fn capabilities_of(
        &mut self,
        caps: Capabilities,
        owner: i64,
    ) -> DbResult<BTreeMap<String, String>> {
        let Capabilities {
            table,
            owner: column,
        } = caps;
        let rows = sqlx::query(&format!(
            "SELECT c.{column}, p.property_name, c.value FROM {table} c \
             JOIN resource_properties p ON p.id = c.property_id WHERE c.{column} = $1"
        ))
        .bind(owner)
        .fetch_all(self.conn().await?)
        .await?;
        Ok(group_capabilities(&rows, column)?
            .remove(&owner)
            .unwrap_or_default())
    }

    /// Deletes row `id` of `table` with its capabilities.
    pub(crate) async fn delete_with_capabilities(
        &mut self,
        caps: Capabilities,
        table: &str,
        id: i64,
    ) -> DbResult<()> {
        let Capabilities {
            table: capabilities,
            owner,
        } = caps;
        for sql in [
            format!("DELETE FROM {capabilities} WHERE {owner} = $1"),
            format!("DELETE FROM {table} WHERE id = $1"),
        ] {
            sqlx::query(&sql)
                .bind(id)
                .execute(self.conn().await?)
                .await?;
        }
        Ok(())
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

    /// Property names with their distinct values, for one resource type.
    pub async fn list_properties(
        &mut self,
        resource_type: &str,
    ) -> DbResult<Vec<PropertyWithValues>> {
        let table = Capabilities::of(resource_type).table;
        let rows = sqlx::query(&format!(
            "SELECT DISTINCT p.property_name, p.private, p.is_unique, c.value \
             FROM resource_properties p JOIN {table} c ON c.property_id = p.id \
             WHERE p.resource_type = $1 ORDER BY p.property_name, c.value"
        ))
        .bind(resource_type)
        .fetch_all(self.conn().await?)
        .await?;
        group_property_values(&rows)
    }

    /// The names of a resource type's private properties.
    pub async fn private_property_names(
        &mut self,
        resource_type: &str,
    ) -> DbResult<HashSet<String>> {
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
        self.fetch_optional_as(
            "SELECT id, resource_type, property_name, private, is_unique, created_at, \
             updated_at FROM resource_properties WHERE resource_type = $1 AND property_name = $2",
            vec![resource_type.into(), name.into()],
            property_from_row,
        )
        .await
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
        let table = Capabilities::of(&property.resource_type).table;
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
    async fn check_unique_value(
        &mut self,
        caps: Capabilities,
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
        let Capabilities {
            table,
            owner: column,
        } = caps;
        let taken = sqlx::query(&format!(
            "SELECT 1 AS one FROM {table} WHERE property_id = $1 AND value = $2 AND {column} <> $3 LIMIT 1"
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

/// Rows of (property_name, private, is_unique, value), ordered by name, folded into one entry per name.
fn group_property_values(rows: &[AnyRow]) -> DbResult<Vec<PropertyWithValues>> {
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

/// Rows of (`owner`, property_name, value) folded into the capabilities of each owner.
fn group_capabilities(rows: &[AnyRow], owner: &str) -> DbResult<CapabilityMap> {
    let mut out = CapabilityMap::new();
    for row in rows {
        let id: i64 = row.try_get(owner)?;
        let name: String = row.try_get("property_name")?;
        let value: String = row.try_get("value")?;
        out.entry(id).or_default().insert(name, value);
    }
    Ok(out)
}
