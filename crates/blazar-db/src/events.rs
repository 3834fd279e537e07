//! Lease events and their claiming by the scheduler.

use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::any::AnyRow;

use crate::{DbResult, Tx, from_opt_secs, from_secs, to_secs};

#[derive(Debug, Clone, PartialEq)]
pub struct EventRow {
    pub id: String,
    pub lease_id: String,
    pub event_type: String,
    pub time: DateTime<Utc>,
    /// Order among events due at the same instant (ends before starts).
    pub rank: i64,
    pub status: String,
    pub created_at: DateTime<Utc>,
    pub updated_at: Option<DateTime<Utc>>,
}

const EVENT_COLUMNS: &str =
    "e.id, e.lease_id, e.event_type, e.event_time, e.rank, e.status, e.created_at, e.updated_at";

fn event_from_row(row: &AnyRow) -> DbResult<EventRow> {
    Ok(EventRow {
        id: row.try_get("id")?,
        lease_id: row.try_get("lease_id")?,
        event_type: row.try_get("event_type")?,
        time: from_secs(row.try_get("event_time")?)?,
        rank: row.try_get("rank")?,
        status: row.try_get("status")?,
        created_at: from_secs(row.try_get("created_at")?)?,
        updated_at: from_opt_secs(row.try_get("updated_at")?)?,
    })
}

impl Tx {
    pub async fn insert_event(&mut self, e: &EventRow) -> DbResult<()> {
        sqlx::query(
            "INSERT INTO events (id, lease_id, event_type, event_time, rank, status, created_at, \
             updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        )
        .bind(&e.id)
        .bind(&e.lease_id)
        .bind(&e.event_type)
        .bind(to_secs(e.time))
        .bind(e.rank)
        .bind(&e.status)
        .bind(to_secs(e.created_at))
        .bind(e.updated_at.map(to_secs))
        .execute(self.conn())
        .await?;
        Ok(())
    }

    pub async fn update_event(&mut self, e: &EventRow) -> DbResult<()> {
        sqlx::query(
            "UPDATE events SET event_time = $1, status = $2, updated_at = $3 WHERE id = $4",
        )
        .bind(to_secs(e.time))
        .bind(&e.status)
        .bind(e.updated_at.map(to_secs))
        .bind(&e.id)
        .execute(self.conn())
        .await?;
        Ok(())
    }

    pub async fn delete_event(&mut self, id: &str) -> DbResult<()> {
        sqlx::query("DELETE FROM events WHERE id = $1")
            .bind(id)
            .execute(self.conn())
            .await?;
        Ok(())
    }

    pub async fn events_of(&mut self, lease_id: &str) -> DbResult<Vec<EventRow>> {
        let sql = format!(
            "SELECT {EVENT_COLUMNS} FROM events e WHERE e.lease_id = $1 ORDER BY e.event_time, e.rank"
        );
        let rows = sqlx::query(&sql)
            .bind(lease_id)
            .fetch_all(self.conn())
            .await?;
        rows.iter().map(event_from_row).collect()
    }

    /// Events of the given leases (an indexed lookup per lease, in chunks).
    pub async fn events_of_leases(&mut self, ids: &[String]) -> DbResult<Vec<EventRow>> {
        let mut out = Vec::new();
        for chunk in ids.chunks(500) {
            let sql = format!(
                "SELECT {EVENT_COLUMNS} FROM events e WHERE e.lease_id IN ({}) \
                 ORDER BY e.lease_id, e.event_time, e.rank",
                crate::placeholders(1, chunk.len())
            );
            let mut query = sqlx::query(&sql);
            for id in chunk {
                query = query.bind(id.as_str());
            }
            for row in query.fetch_all(self.conn()).await? {
                out.push(event_from_row(&row)?);
            }
        }
        Ok(out)
    }

    /// The earliest undone event due at `now`. Callers hold the scheduler lock, so no other
    /// scheduler claims it meanwhile; the row is not locked here, so that a lease update that
    /// holds the lease and moves its events never waits on the scheduler while the scheduler
    /// waits on the lease.
    pub async fn claim_due_event(&mut self, now: DateTime<Utc>) -> DbResult<Option<EventRow>> {
        let sql = format!(
            "SELECT {EVENT_COLUMNS} FROM events e WHERE e.status = 'UNDONE' AND e.event_time <= $1 \
             ORDER BY e.event_time, e.rank, e.id LIMIT 1"
        );
        let row = sqlx::query(&sql)
            .bind(to_secs(now))
            .fetch_optional(self.conn())
            .await?;
        row.as_ref().map(event_from_row).transpose()
    }

    /// When the next undone event is due, if any.
    pub async fn next_event_time(&mut self) -> DbResult<Option<DateTime<Utc>>> {
        let row = sqlx::query("SELECT MIN(event_time) AS t FROM events WHERE status = 'UNDONE'")
            .fetch_one(self.conn())
            .await?;
        let t: Option<i64> = row.try_get("t")?;
        t.map(from_secs).transpose()
    }
}
