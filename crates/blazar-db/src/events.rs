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

/// Whether event `e` is a before-end whose lease's start has not finished (not run yet, or
/// its hand-overs still running): as in Blazar, which runs no event of a lease in a
/// transitional status, the "ends soon" notice never comes before the start's.
pub const WAITS_FOR_START: &str = "(e.event_type = 'before_end_lease' AND EXISTS (SELECT 1 \
    FROM events s WHERE s.lease_id = e.lease_id AND s.event_type = 'start_lease' \
    AND s.status IN ('UNDONE', 'IN_PROGRESS')))";

impl Tx {
    pub async fn insert_event(&mut self, e: &Event) -> DbResult<()> {
        self.insert_events(std::slice::from_ref(e)).await
    }

    /// Inserts several events in one statement (a new lease's start, end and before-end:
    /// one round trip on PostgreSQL, not three).
    pub async fn insert_events(&mut self, events: &[Event]) -> DbResult<()> {
        for e in events {
            self.revise_lease(&e.lease_id);
        }
        let rows = events
            .iter()
            .map(|e| {
                event_changes(e)
                    .set("id", &e.id)
                    .set("lease_id", &e.lease_id)
                    .set("event_type", e.event_type)
                    .set("rank", e.rank)
                    .set("created_at", e.created_at)
            })
            .collect();
        match Columns::insert_rows("events", rows) {
            Some((sql, args)) => self.write(&sql, args).await,
            None => Ok(()),
        }
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

    /// The `limit` first undone events due at `now` (a before-end waits for its lease's
    /// start: [`WAITS_FOR_START`]), in the order they run (time, then
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
             AND NOT {WAITS_FOR_START} ORDER BY e.event_time, e.rank, e.id LIMIT $2"
        );
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.fetch_all_as(&sql, vec![now.into(), limit.into()], event_from_row)
            .await
    }

    /// The id and lease of the first undone event due at `now` (in the order events run),
    /// read without the rest of its row: the scheduler names an event before running it, so
    /// that an event which cannot run (a row that does not read back, a handler that fails
    /// whatever it is given) can be set aside by id.
    pub async fn first_due_event(
        &mut self,
        now: DateTime<Utc>,
    ) -> DbResult<Option<(String, String)>> {
        let sql = format!(
            "SELECT e.id, e.lease_id FROM events e WHERE e.status = 'UNDONE' \
             AND e.event_time <= $1 AND NOT {WAITS_FOR_START} \
             ORDER BY e.event_time, e.rank, e.id LIMIT 1"
        );
        self.fetch_optional_as(&sql, vec![now.into()], |row| {
            Ok((row.try_get("id")?, row.try_get("lease_id")?))
        })
        .await
    }

    /// Event `id` if it is still undone and due at `now`.
    pub async fn due_event(&mut self, id: &str, now: DateTime<Utc>) -> DbResult<Option<Event>> {
        let sql = format!(
            "SELECT {EVENT_COLUMNS} FROM events e \
             WHERE e.id = $1 AND e.status = 'UNDONE' AND e.event_time <= $2 \
             AND NOT {WAITS_FOR_START}"
        );
        self.fetch_optional_as(&sql, vec![id.into(), now.into()], event_from_row)
            .await
    }

    /// Sets event `id` aside as ERROR, and its lease with it, as Blazar does with an event
    /// whose handler raised; written column by column, so that it works when the rows do not
    /// read back. Returns whether the event was still undone (another scheduler may have
    /// run it meanwhile; then nothing changes).
    pub async fn fail_event(
        &mut self,
        id: &str,
        lease_id: &str,
        now: DateTime<Utc>,
    ) -> DbResult<bool> {
        let failed = self
            .execute(
                "UPDATE events SET status = 'ERROR', updated_at = $2 \
                 WHERE id = $1 AND status = 'UNDONE'",
                vec![id.into(), now.into()],
            )
            .await?;
        if failed == 0 {
            return Ok(false);
        }
        self.lease_revised(lease_id);
        self.execute(
            "UPDATE leases SET status = 'ERROR', updated_at = $2, revision = revision + 1 \
             WHERE id = $1",
            vec![lease_id.into(), now.into()],
        )
        .await?;
        Ok(true)
    }

    /// When the next undone event is due, if any (a before-end waiting for its lease's start
    /// is not: the start's end wakes the scheduler).
    pub async fn next_event_time(&mut self) -> DbResult<Option<DateTime<Utc>>> {
        // In index order, not MIN(): the first row that does not wait ends the read.
        let sql = format!(
            "SELECT e.event_time AS t FROM events e WHERE e.status = 'UNDONE' \
             AND NOT {WAITS_FOR_START} ORDER BY e.event_time, e.rank LIMIT 1"
        );
        let t: Option<i64> = self
            .fetch_optional_as(&sql, vec![], |row| Ok(row.try_get("t")?))
            .await?;
        t.map(from_secs).transpose()
    }
}
