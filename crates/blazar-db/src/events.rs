//! Lease events and their claiming by the scheduler.

use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::any::AnyRow;

use blazar_core::Event;

use crate::{Columns, DbResult, Tx, from_opt_secs, from_secs, wire};

const EVENT_COLUMNS: &str =
    "e.id, e.lease_id, e.event_type, e.event_time, e.rank, e.status, e.created_at, e.updated_at";

/// Event columns in table order, as a row or as a JSON array holds them.
pub(crate) type EventTuple = (String, String, String, i64, i64, String, i64, Option<i64>);

fn event_from_row(row: &AnyRow) -> DbResult<Event> {
    event_from_tuple((
        row.try_get("id")?,
        row.try_get("lease_id")?,
        row.try_get("event_type")?,
        row.try_get("event_time")?,
        row.try_get("rank")?,
        row.try_get("status")?,
        row.try_get("created_at")?,
        row.try_get("updated_at")?,
    ))
}

/// The columns of an event an update may change, first in its insert and update alike.
fn event_changes(e: &Event) -> Columns {
    Columns::default()
        .set("event_time", e.time)
        .set("status", e.status)
        .set("updated_at", e.updated_at)
}

pub(crate) fn event_from_tuple(t: EventTuple) -> DbResult<Event> {
    Ok(Event {
        id: t.0,
        lease_id: t.1,
        event_type: wire(&t.2, "event type")?,
        time: from_secs(t.3)?,
        rank: t.4,
        status: wire(&t.5, "event status")?,
        created_at: from_secs(t.6)?,
        updated_at: from_opt_secs(t.7)?,
    })
}

impl Tx {
    pub async fn insert_event(&mut self, e: &Event) -> DbResult<()> {
        self.revise_lease(&e.lease_id);
        let (sql, args) = event_changes(e)
            .set("id", &e.id)
            .set("lease_id", &e.lease_id)
            .set("event_type", e.event_type)
            .set("rank", e.rank)
            .set("created_at", e.created_at)
            .insert("events");
        self.write(&sql, args).await
    }

    pub async fn update_event(&mut self, e: &Event) -> DbResult<()> {
        self.revise_lease(&e.lease_id);
        let (sql, args) = event_changes(e).update("events", "", "id", &e.id);
        self.write(&sql, args).await
    }

    pub async fn events_of(&mut self, lease_id: &str) -> DbResult<Vec<Event>> {
        self.events_of_leases(&[lease_id]).await
    }

    /// The events of several leases, each lease's in time order.
    pub async fn events_of_leases(&mut self, ids: &[&str]) -> DbResult<Vec<Event>> {
        self.fetch_all_in(
            ids,
            |list| {
                format!(
                    "SELECT {EVENT_COLUMNS} FROM events e WHERE e.lease_id IN ({list}) \
                     ORDER BY e.lease_id, e.event_time, e.rank"
                )
            },
            event_from_row,
        )
        .await
    }

    /// The `limit` first undone events due at `now`, in the order they run (time, then
    /// ends before starts): a burst is read in one query, not one per event. Callers hold
    /// the scheduler lock, so no other scheduler claims them meanwhile; the rows are not
    /// locked here, so that a lease update that holds the lease and moves its events never
    /// waits on the scheduler while the scheduler waits on the lease (the scheduler reads
    /// each event again under its lease's lock before running it).
    pub async fn claim_due_events(
        &mut self,
        now: DateTime<Utc>,
        limit: usize,
    ) -> DbResult<Vec<Event>> {
        let sql = format!(
            "SELECT {EVENT_COLUMNS} FROM events e WHERE e.status = 'UNDONE' AND e.event_time <= $1 \
             ORDER BY e.event_time, e.rank, e.id LIMIT $2"
        );
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.fetch_all_as(&sql, vec![now.into(), limit.into()], event_from_row)
            .await
    }

    /// When the next undone event is due, if any.
    pub async fn next_event_time(&mut self) -> DbResult<Option<DateTime<Utc>>> {
        let row = sqlx::query("SELECT MIN(event_time) AS t FROM events WHERE status = 'UNDONE'")
            .fetch_one(self.conn().await?)
            .await?;
        let t: Option<i64> = row.try_get("t")?;
        t.map(from_secs).transpose()
    }
}
