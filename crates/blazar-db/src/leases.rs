//! Leases and reservations.

use chrono::{DateTime, Utc};
use serde_json::{Map, Value};
use sqlx::Row;
use sqlx::any::AnyRow;

use crate::{DbError, DbResult, Tx, from_opt_secs, from_secs, to_secs};

#[derive(Debug, Clone, PartialEq)]
pub struct LeaseRow {
    pub id: String,
    pub name: String,
    pub user_id: String,
    pub project_id: String,
    pub trust_id: String,
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
    pub status: String,
    pub degraded: bool,
    pub created_at: DateTime<Utc>,
    pub updated_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ReservationRow {
    pub id: String,
    pub lease_id: String,
    pub ordinal: i64,
    pub resource_id: String,
    pub resource_type: String,
    pub status: String,
    pub missing_resources: bool,
    pub resources_changed: bool,
    /// The type-specific fields of the request, as shown in the reservation object.
    pub params: Map<String, Value>,
    /// How many units (hosts, slots, addresses) the reservation was granted.
    pub granted_units: i64,
    pub created_at: DateTime<Utc>,
    pub updated_at: Option<DateTime<Utc>>,
}

/// Which leases a list returns. Every field narrows the result.
#[derive(Debug, Clone, Default)]
pub struct LeaseFilter {
    pub project_id: Option<String>,
    pub user_id: Option<String>,
    pub status: Option<String>,
    pub name: Option<String>,
}

const LEASE_COLUMNS: &str = "id, name, user_id, project_id, trust_id, start_at, end_at, status, \
    degraded, created_at, updated_at";

const RESERVATION_COLUMNS: &str = "r.id, r.lease_id, r.ordinal, r.resource_id, r.resource_type, \
    r.status, r.missing_resources, r.resources_changed, r.params, r.granted_units, r.created_at, \
    r.updated_at";

fn lease_from_row(row: &AnyRow) -> DbResult<LeaseRow> {
    Ok(LeaseRow {
        id: row.try_get("id")?,
        name: row.try_get("name")?,
        user_id: row.try_get("user_id")?,
        project_id: row.try_get("project_id")?,
        trust_id: row.try_get("trust_id")?,
        start: from_secs(row.try_get("start_at")?)?,
        end: from_secs(row.try_get("end_at")?)?,
        status: row.try_get("status")?,
        degraded: row.try_get::<i64, _>("degraded")? != 0,
        created_at: from_secs(row.try_get("created_at")?)?,
        updated_at: from_opt_secs(row.try_get("updated_at")?)?,
    })
}

fn reservation_from_row(row: &AnyRow) -> DbResult<ReservationRow> {
    let params_text: String = row.try_get("params")?;
    let params = match serde_json::from_str(&params_text) {
        Ok(Value::Object(map)) => map,
        _ => {
            return Err(DbError::Corrupt(format!(
                "reservation params {params_text:?}"
            )));
        }
    };
    Ok(ReservationRow {
        id: row.try_get("id")?,
        lease_id: row.try_get("lease_id")?,
        ordinal: row.try_get("ordinal")?,
        resource_id: row.try_get("resource_id")?,
        resource_type: row.try_get("resource_type")?,
        status: row.try_get("status")?,
        missing_resources: row.try_get::<i64, _>("missing_resources")? != 0,
        resources_changed: row.try_get::<i64, _>("resources_changed")? != 0,
        params,
        granted_units: row.try_get("granted_units")?,
        created_at: from_secs(row.try_get("created_at")?)?,
        updated_at: from_opt_secs(row.try_get("updated_at")?)?,
    })
}

impl LeaseFilter {
    /// The WHERE clause (over table alias `l`) and its bound values, numbered from `$1`.
    fn clause(&self) -> (String, Vec<String>) {
        let mut conditions = Vec::new();
        let mut values = Vec::new();
        for (column, value) in [
            ("l.project_id", &self.project_id),
            ("l.user_id", &self.user_id),
            ("l.status", &self.status),
            ("l.name", &self.name),
        ] {
            if let Some(v) = value {
                values.push(v.clone());
                conditions.push(format!("{column} = ${}", values.len()));
            }
        }
        if conditions.is_empty() {
            (String::new(), values)
        } else {
            (format!(" WHERE {}", conditions.join(" AND ")), values)
        }
    }
}

impl Tx {
    pub async fn insert_lease(&mut self, lease: &LeaseRow) -> DbResult<()> {
        sqlx::query(
            "INSERT INTO leases (id, name, user_id, project_id, trust_id, start_at, end_at, status, \
             degraded, created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
        )
        .bind(&lease.id)
        .bind(&lease.name)
        .bind(&lease.user_id)
        .bind(&lease.project_id)
        .bind(&lease.trust_id)
        .bind(to_secs(lease.start))
        .bind(to_secs(lease.end))
        .bind(&lease.status)
        .bind(i64::from(lease.degraded))
        .bind(to_secs(lease.created_at))
        .bind(lease.updated_at.map(to_secs))
        .execute(self.conn())
        .await?;
        Ok(())
    }

    /// Rewrites the mutable columns of a lease.
    pub async fn update_lease(&mut self, lease: &LeaseRow) -> DbResult<()> {
        sqlx::query(
            "UPDATE leases SET name = $1, start_at = $2, end_at = $3, status = $4, degraded = $5, \
             updated_at = $6 WHERE id = $7",
        )
        .bind(&lease.name)
        .bind(to_secs(lease.start))
        .bind(to_secs(lease.end))
        .bind(&lease.status)
        .bind(i64::from(lease.degraded))
        .bind(lease.updated_at.map(to_secs))
        .bind(&lease.id)
        .execute(self.conn())
        .await?;
        Ok(())
    }

    pub async fn get_lease(&mut self, id: &str) -> DbResult<Option<LeaseRow>> {
        let sql = format!("SELECT {LEASE_COLUMNS} FROM leases WHERE id = $1");
        let row = sqlx::query(&sql)
            .bind(id)
            .fetch_optional(self.conn())
            .await?;
        row.as_ref().map(lease_from_row).transpose()
    }

    /// Reads a lease and, on PostgreSQL, locks it until the transaction ends, so an update,
    /// a delete and an event of one lease never interleave.
    pub async fn lock_lease(&mut self, id: &str) -> DbResult<Option<LeaseRow>> {
        let sql = format!(
            "SELECT {LEASE_COLUMNS} FROM leases WHERE id = $1{}",
            self.for_update()
        );
        let row = sqlx::query(&sql)
            .bind(id)
            .fetch_optional(self.conn())
            .await?;
        row.as_ref().map(lease_from_row).transpose()
    }

    pub async fn list_leases(&mut self, filter: &LeaseFilter) -> DbResult<Vec<LeaseRow>> {
        let (clause, values) = filter.clause();
        let sql =
            format!("SELECT {LEASE_COLUMNS} FROM leases l{clause} ORDER BY l.created_at, l.id");
        let mut query = sqlx::query(&sql);
        for v in &values {
            query = query.bind(v.as_str());
        }
        let rows = query.fetch_all(self.conn()).await?;
        rows.iter().map(lease_from_row).collect()
    }

    pub async fn delete_lease(&mut self, id: &str) -> DbResult<()> {
        // Children first: not every SQLite connection enforces ON DELETE CASCADE.
        for sql in [
            "DELETE FROM allocations WHERE lease_id = $1",
            "DELETE FROM events WHERE lease_id = $1",
            "DELETE FROM reservations WHERE lease_id = $1",
            "DELETE FROM leases WHERE id = $1",
        ] {
            sqlx::query(sql).bind(id).execute(self.conn()).await?;
        }
        Ok(())
    }

    pub async fn insert_reservation(&mut self, r: &ReservationRow) -> DbResult<()> {
        sqlx::query(
            "INSERT INTO reservations (id, lease_id, ordinal, resource_id, resource_type, status, \
             missing_resources, resources_changed, params, created_at, updated_at, granted_units) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
        )
        .bind(&r.id)
        .bind(&r.lease_id)
        .bind(r.ordinal)
        .bind(&r.resource_id)
        .bind(&r.resource_type)
        .bind(&r.status)
        .bind(i64::from(r.missing_resources))
        .bind(i64::from(r.resources_changed))
        .bind(Value::Object(r.params.clone()).to_string())
        .bind(to_secs(r.created_at))
        .bind(r.updated_at.map(to_secs))
        .bind(r.granted_units)
        .execute(self.conn())
        .await?;
        Ok(())
    }

    pub async fn update_reservation(&mut self, r: &ReservationRow) -> DbResult<()> {
        sqlx::query(
            "UPDATE reservations SET status = $1, missing_resources = $2, resources_changed = $3, \
             params = $4, updated_at = $5, granted_units = $6 WHERE id = $7",
        )
        .bind(&r.status)
        .bind(i64::from(r.missing_resources))
        .bind(i64::from(r.resources_changed))
        .bind(Value::Object(r.params.clone()).to_string())
        .bind(r.updated_at.map(to_secs))
        .bind(r.granted_units)
        .bind(&r.id)
        .execute(self.conn())
        .await?;
        Ok(())
    }

    pub async fn reservations_of(&mut self, lease_id: &str) -> DbResult<Vec<ReservationRow>> {
        let sql = format!(
            "SELECT {RESERVATION_COLUMNS} FROM reservations r WHERE r.lease_id = $1 ORDER BY r.ordinal"
        );
        let rows = sqlx::query(&sql)
            .bind(lease_id)
            .fetch_all(self.conn())
            .await?;
        rows.iter().map(reservation_from_row).collect()
    }

    /// Reservations of the given leases (an indexed lookup per lease, in chunks).
    pub async fn reservations_of_leases(
        &mut self,
        ids: &[String],
    ) -> DbResult<Vec<ReservationRow>> {
        let mut out = Vec::new();
        for chunk in ids.chunks(500) {
            let sql = format!(
                "SELECT {RESERVATION_COLUMNS} FROM reservations r WHERE r.lease_id IN ({}) \
                 ORDER BY r.lease_id, r.ordinal",
                crate::placeholders(1, chunk.len())
            );
            let mut query = sqlx::query(&sql);
            for id in chunk {
                query = query.bind(id.as_str());
            }
            for row in query.fetch_all(self.conn()).await? {
                out.push(reservation_from_row(&row)?);
            }
        }
        Ok(out)
    }

    /// Reservations that hold fewer units than they were granted (healing fills them).
    pub async fn reservations_missing_resources(&mut self) -> DbResult<Vec<ReservationRow>> {
        let sql = format!(
            "SELECT {RESERVATION_COLUMNS} FROM reservations r WHERE r.missing_resources = 1 \
             AND r.status IN ('pending', 'active') ORDER BY r.lease_id, r.ordinal"
        );
        let rows = sqlx::query(&sql).fetch_all(self.conn()).await?;
        rows.iter().map(reservation_from_row).collect()
    }

    pub async fn get_reservation(&mut self, id: &str) -> DbResult<Option<ReservationRow>> {
        let sql = format!("SELECT {RESERVATION_COLUMNS} FROM reservations r WHERE r.id = $1");
        let row = sqlx::query(&sql)
            .bind(id)
            .fetch_optional(self.conn())
            .await?;
        row.as_ref().map(reservation_from_row).transpose()
    }
}
