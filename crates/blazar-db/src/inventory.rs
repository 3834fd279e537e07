//! The inventory besides hosts: floating IPs, network segments and devices in one table
//! (`kind` tells them apart, type-specific fields live in `attrs`), their extra
//! capabilities, and flavors.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde_json::{Map, Value};
use sqlx::Row;
use sqlx::any::AnyRow;

use blazar_core::reservation::SourceFlavor;
use blazar_core::{Flavor, Resource, ResourceRecord};

use crate::properties::RESOURCE_CAPABILITIES;
use crate::{Columns, DbError, DbResult, Tx, from_opt_secs, from_secs};

const RESOURCE_COLUMNS: &str =
    "id, uid, kind, uniq, attrs, reservable, status, created_at, updated_at";

/// Column `column` of `row`, a JSON object stored as text (`what` names it when it is not).
fn json_object(row: &AnyRow, column: &str, what: &str) -> DbResult<Map<String, Value>> {
    let text: String = row.try_get(column)?;
    match serde_json::from_str(&text) {
        Ok(Value::Object(map)) => Ok(map),
        _ => Err(DbError::Corrupt(format!("{what} {text:?}"))),
    }
}

fn resource_from_row(row: &AnyRow) -> DbResult<ResourceRecord> {
    let resource = Resource {
        uid: row.try_get("uid")?,
        kind: row.try_get("kind")?,
        uniq: row.try_get("uniq")?,
        attrs: json_object(row, "attrs", "resource attrs")?,
        reservable: row.try_get::<i64, _>("reservable")? != 0,
        capabilities: BTreeMap::new(),
    };
    Ok(ResourceRecord {
        id: row.try_get("id")?,
        resource,
        status: row.try_get("status")?,
        created_at: from_secs(row.try_get("created_at")?)?,
        updated_at: from_opt_secs(row.try_get("updated_at")?)?,
    })
}

fn flavor_from_row(row: &AnyRow) -> DbResult<Flavor> {
    Ok(Flavor {
        source: SourceFlavor {
            id: row.try_get("id")?,
            name: row.try_get("name")?,
            vcpus: row.try_get("vcpus")?,
            ram: row.try_get("ram")?,
            disk: row.try_get("disk")?,
            ephemeral: row.try_get("ephemeral")?,
            extra_specs: json_object(row, "extra_specs", "flavor extra specs")?,
        },
        created_at: from_secs(row.try_get("created_at")?)?,
        updated_at: from_opt_secs(row.try_get("updated_at")?)?,
    })
}

impl Tx {
    /// Records resource `r`, registered at `now`; returns its internal id.
    pub async fn insert_resource(&mut self, r: &Resource, now: DateTime<Utc>) -> DbResult<i64> {
        let columns = Columns::default()
            .set("uid", &r.uid)
            .set("kind", &r.kind)
            .set("uniq", &r.uniq)
            .set("attrs", Value::Object(r.attrs.clone()).to_string())
            .set("reservable", r.reservable)
            .set("created_at", now)
            .set("updated_at", None::<DateTime<Utc>>);
        let id = self.insert_returning_id("resources", columns).await?;
        self.insert_capabilities(&r.kind, id, &r.capabilities, now)
            .await?;
        Ok(id)
    }

    pub async fn get_resource(
        &mut self,
        kind: &str,
        uid: &str,
    ) -> DbResult<Option<ResourceRecord>> {
        let sql = format!("SELECT {RESOURCE_COLUMNS} FROM resources WHERE kind = $1 AND uid = $2");
        let args = vec![kind.into(), uid.into()];
        let Some(mut record) = self
            .fetch_optional_as(&sql, args, resource_from_row)
            .await?
        else {
            return Ok(None);
        };
        record.resource.capabilities = self
            .capabilities_of(RESOURCE_CAPABILITIES, record.id)
            .await?;
        Ok(Some(record))
    }

    /// Locks a resource row (PostgreSQL) and tells whether it exists.
    pub async fn lock_resource(&mut self, id: i64) -> DbResult<bool> {
        self.lock_row("resources", id).await
    }

    /// Of `ids`, the resources that still exist and are reservable, share-locked on PostgreSQL.
    pub async fn lock_reservable_resources(&mut self, ids: &[i64]) -> DbResult<Vec<i64>> {
        self.lock_reservable_rows("resources", ids).await
    }

    pub async fn list_resources(&mut self, kind: &str) -> DbResult<Vec<ResourceRecord>> {
        let sql = format!("SELECT {RESOURCE_COLUMNS} FROM resources WHERE kind = $1 ORDER BY id");
        let mut records = self
            .fetch_all_as(&sql, vec![kind.into()], resource_from_row)
            .await?;
        let ids: Vec<i64> = records.iter().map(|r| r.id).collect();
        if !ids.is_empty() {
            let mut caps = self
                .all_capabilities(RESOURCE_CAPABILITIES, Some(kind))
                .await?;
            for r in records.iter_mut() {
                r.resource.capabilities = caps.remove(&r.id).unwrap_or_default();
            }
        }
        Ok(records)
    }

    /// Of `ids` (internal ids of resources of `kind`), those that exist, without their
    /// capabilities: for naming them by their API ids and addresses.
    pub async fn resources_named(
        &mut self,
        kind: &str,
        ids: &[i64],
    ) -> DbResult<Vec<ResourceRecord>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let (list, ids) = crate::in_list(self.backend, 2, ids);
        let sql = format!(
            "SELECT {RESOURCE_COLUMNS} FROM resources WHERE kind = $1 AND id IN ({list}) ORDER BY id"
        );
        let mut args: Vec<crate::Arg> = vec![kind.into()];
        args.extend(ids.into_iter().map(crate::Arg::from));
        self.fetch_all_as(&sql, args, resource_from_row).await
    }

    /// The kind of a resource, for bumping its inventory version.
    async fn kind_of(&mut self, id: i64) -> DbResult<Option<String>> {
        self.fetch_optional_as(
            "SELECT kind FROM resources WHERE id = $1",
            vec![id.into()],
            |r| Ok(r.try_get("kind")?),
        )
        .await
    }

    pub async fn update_resource(
        &mut self,
        id: i64,
        attrs: &Map<String, Value>,
        uniq: &str,
        reservable: bool,
        now: DateTime<Utc>,
    ) -> DbResult<()> {
        let columns = Columns::default()
            .set("attrs", Value::Object(attrs.clone()).to_string())
            .set("uniq", uniq)
            // The operator decides from now on: the monitor puts back only what it took out.
            .set("status", None::<&str>);
        self.update_resource_row(id, reservable, now, columns).await
    }

    /// Sets whether resource `id` may be reserved and the status that says why not
    /// (`taken`: the monitor found it held outside blazar-rs; `None`: an operator's choice).
    pub async fn set_resource_health(
        &mut self,
        id: i64,
        reservable: bool,
        status: Option<&str>,
        now: DateTime<Utc>,
    ) -> DbResult<()> {
        let columns = Columns::default().set("status", status);
        self.update_resource_row(id, reservable, now, columns).await
    }

    /// Writes `columns` of resource `id`, whether it is reservable and when it changed
    /// (`now`), and moves its kind's inventory version: what an operator's update and a
    /// change of health share (as `update_host` does for hosts).
    async fn update_resource_row(
        &mut self,
        id: i64,
        reservable: bool,
        now: DateTime<Utc>,
        columns: Columns,
    ) -> DbResult<()> {
        let kind = self.kind_of(id).await?;
        let (sql, args) = columns
            .set("reservable", reservable)
            .set("updated_at", now)
            .update("resources", "", "id", id);
        self.execute(&sql, args).await?;
        if let Some(kind) = kind {
            self.bump_inventory(&kind).await?;
        }
        Ok(())
    }

    pub async fn delete_resource(&mut self, id: i64) -> DbResult<()> {
        let kind = self.kind_of(id).await?;
        self.delete_with_capabilities(RESOURCE_CAPABILITIES, "resources", id)
            .await?;
        if let Some(kind) = kind {
            self.bump_inventory(&kind).await?;
        }
        Ok(())
    }

    /// Run at once, so that a taken id or name fails here, where the caller tells it apart.
    pub async fn insert_flavor(&mut self, f: &Flavor) -> DbResult<()> {
        let s = &f.source;
        let (sql, args) = Columns::default()
            .set("id", &s.id)
            .set("name", &s.name)
            .set("vcpus", s.vcpus)
            .set("ram", s.ram)
            .set("disk", s.disk)
            .set("ephemeral", s.ephemeral)
            .set(
                "extra_specs",
                Value::Object(s.extra_specs.clone()).to_string(),
            )
            .set("created_at", f.created_at)
            .set("updated_at", f.updated_at)
            .insert("flavors");
        self.execute(&sql, args).await?;
        Ok(())
    }

    /// A flavor by id, or else by name.
    pub async fn find_flavor(&mut self, id_or_name: &str) -> DbResult<Option<Flavor>> {
        self.fetch_optional_as(
            "SELECT id, name, vcpus, ram, disk, ephemeral, extra_specs, created_at, updated_at \
             FROM flavors WHERE id = $1 OR name = $1 ORDER BY CASE WHEN id = $1 THEN 0 ELSE 1 END LIMIT 1",
            vec![id_or_name.into()],
            flavor_from_row,
        )
        .await
    }

    pub async fn list_flavors(&mut self) -> DbResult<Vec<Flavor>> {
        self.fetch_all_as(
            "SELECT id, name, vcpus, ram, disk, ephemeral, extra_specs, created_at, updated_at \
             FROM flavors ORDER BY name",
            Vec::new(),
            flavor_from_row,
        )
        .await
    }

    /// Whether the flavor was there to delete.
    pub async fn delete_flavor(&mut self, id: &str) -> DbResult<bool> {
        let done = sqlx::query("DELETE FROM flavors WHERE id = $1")
            .bind(id)
            .execute(self.conn().await?)
            .await?;
        Ok(done.rows_affected() > 0)
    }
}
