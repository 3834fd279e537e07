//! Per-project quota overrides, and what a project's reservations hold over a window (what
//! quotas are decided on).

use blazar_core::quota::{QuotaKind, QuotaValues};
use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::any::AnyRow;

use crate::{Arg, DbResult, Tx, from_opt_secs, from_secs};

/// A project's overrides as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct QuotaRow {
    pub project_id: String,
    pub values: QuotaValues,
    pub created_at: DateTime<Utc>,
    pub updated_at: Option<DateTime<Utc>>,
}

/// One allocation of a project's lease, as quotas count it.
#[derive(Debug, Clone, PartialEq)]
pub struct ProjectAllocation {
    pub lease_id: String,
    pub resource_type: String,
    pub resource_id: i64,
    pub exclusive: bool,
    pub units: i64,
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
}

/// What a degraded reservation of a project's lease was granted and does not hold: its
/// grant stands (healing gives it back when it can), so quotas count it as held.
#[derive(Debug, Clone, PartialEq)]
pub struct ProjectShortfall {
    pub lease_id: String,
    /// The reservation's type (`physical:host`, `virtual:instance`, ...).
    pub reservation_type: String,
    /// Units granted less those held by allocations that end after `now`.
    pub units: i64,
    pub lease_start: DateTime<Utc>,
    pub lease_end: DateTime<Utc>,
}

/// The columns, in `QuotaKind::ALL` order (their names are the kinds' names).
fn value_columns() -> String {
    QuotaKind::ALL
        .iter()
        .map(|k| k.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

fn quota_from_row(row: &AnyRow) -> DbResult<QuotaRow> {
    let mut values = QuotaValues::default();
    for kind in QuotaKind::ALL {
        values.set(kind, row.try_get::<Option<i64>, _>(kind.as_str())?);
    }
    Ok(QuotaRow {
        project_id: row.try_get("project_id")?,
        values,
        created_at: from_secs(row.try_get("created_at")?)?,
        updated_at: from_opt_secs(row.try_get("updated_at")?)?,
    })
}

impl Tx {
    pub async fn quota_of(&mut self, project_id: &str) -> DbResult<Option<QuotaRow>> {
        let sql = format!(
            "SELECT project_id, {}, created_at, updated_at FROM quotas WHERE project_id = $1",
            value_columns()
        );
        self.fetch_optional_as(&sql, vec![project_id.into()], quota_from_row)
            .await
    }

    /// Every project's overrides, by project id.
    pub async fn list_quotas(&mut self) -> DbResult<Vec<QuotaRow>> {
        let sql = format!(
            "SELECT project_id, {}, created_at, updated_at FROM quotas ORDER BY project_id",
            value_columns()
        );
        self.fetch_all_as(&sql, Vec::new(), quota_from_row).await
    }

    /// Stores a project's overrides whole (insert or replace).
    pub async fn put_quota(&mut self, row: &QuotaRow) -> DbResult<()> {
        let columns = value_columns();
        let updates = QuotaKind::ALL
            .iter()
            .map(|k| format!("{0} = excluded.{0}", k.as_str()))
            .collect::<Vec<_>>()
            .join(", ");
        let sql = format!(
            "INSERT INTO quotas (project_id, {columns}, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) \
             ON CONFLICT (project_id) DO UPDATE SET {updates}, updated_at = excluded.updated_at"
        );
        let mut args: Vec<Arg> = vec![(&row.project_id).into()];
        args.extend(QuotaKind::ALL.iter().map(|k| Arg::from(row.values.get(*k))));
        args.push(row.created_at.into());
        args.push(row.updated_at.into());
        self.write(&sql, args).await
    }

    /// Removes a project's overrides; false if it had none.
    pub async fn delete_quota(&mut self, project_id: &str) -> DbResult<bool> {
        let done = sqlx::query("DELETE FROM quotas WHERE project_id = $1")
            .bind(project_id)
            .execute(self.conn().await?)
            .await?;
        Ok(done.rows_affected() > 0)
    }

    /// The allocations of a project's leases that overlap `[start, end)` (the lease
    /// windows, not the cleaning time after them), in one row: what this transaction wrote
    /// included, so creates written together count each other.
    pub async fn project_allocations(
        &mut self,
        project_id: &str,
        start: DateTime<Utc>,
        end: DateTime<Utc>,
    ) -> DbResult<Vec<ProjectAllocation>> {
        let (agg, array) = self.json_functions();
        let sql = format!(
            "SELECT CAST({agg}({array}(a.lease_id, a.resource_type, a.resource_id, a.exclusive, \
             a.units, a.start_at, a.end_at)) AS TEXT) AS json \
             FROM allocations a JOIN leases l ON l.id = a.lease_id \
             WHERE l.project_id = $1 AND a.start_at < $3 AND a.end_at > $2"
        );
        type Tuple = (String, String, i64, i64, i64, i64, i64);
        let tuples: Vec<Tuple> = self
            .fetch_json_array(
                &sql,
                vec![project_id.into(), start.into(), end.into()],
                "project allocations",
            )
            .await?;
        tuples
            .into_iter()
            .map(|t| {
                Ok(ProjectAllocation {
                    lease_id: t.0,
                    resource_type: t.1,
                    resource_id: t.2,
                    exclusive: t.3 != 0,
                    units: t.4,
                    start: from_secs(t.5)?,
                    end: from_secs(t.6)?,
                })
            })
            .collect()
    }

    /// The shortfalls of the project's degraded reservations (pending or active) whose
    /// lease overlaps `[start, end)` and has not ended at `now`.
    pub async fn project_shortfalls(
        &mut self,
        project_id: &str,
        start: DateTime<Utc>,
        end: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> DbResult<Vec<ProjectShortfall>> {
        let (agg, array) = self.json_functions();
        let sql = format!(
            "SELECT CAST({agg}({array}(s.lease_id, s.resource_type, s.short, s.start_at, \
             s.end_at)) AS TEXT) AS json FROM (\
             SELECT r.lease_id, r.resource_type, l.start_at, l.end_at, r.granted_units - \
             COALESCE((SELECT CAST(SUM(a.units) AS BIGINT) FROM allocations a \
             WHERE a.reservation_id = r.id AND a.end_at > $4), 0) AS short \
             FROM reservations r JOIN leases l ON l.id = r.lease_id \
             WHERE l.project_id = $1 AND r.missing_resources = 1 \
             AND r.status IN ('pending', 'active') \
             AND l.start_at < $3 AND l.end_at > $2 AND l.end_at > $4) s WHERE s.short > 0"
        );
        type Tuple = (String, String, i64, i64, i64);
        let tuples: Vec<Tuple> = self
            .fetch_json_array(
                &sql,
                vec![project_id.into(), start.into(), end.into(), now.into()],
                "project shortfalls",
            )
            .await?;
        tuples
            .into_iter()
            .map(|t| {
                Ok(ProjectShortfall {
                    lease_id: t.0,
                    reservation_type: t.1,
                    units: t.2,
                    lease_start: from_secs(t.3)?,
                    lease_end: from_secs(t.4)?,
                })
            })
            .collect()
    }
}
