//! The notification outbox: written in the transaction whose change a notification
//! describes, claimed and marked sent by a publisher in short transactions of its own.

use std::sync::LazyLock;

use chrono::{DateTime, Duration, Utc};
use serde_json::Value;
use sqlx::Row;
use sqlx::any::AnyRow;

use blazar_core::{Notification, SequencedNotification};

use crate::{Arg, Backend, DbError, DbResult, Tx, from_secs, to_secs};

const COLUMNS: &str = "id, event_type, lease_id, payload, created_at, request_id";

fn notification_from_row(row: &AnyRow) -> DbResult<Notification> {
    let payload: String = row.try_get("payload")?;
    Ok(Notification {
        id: row.try_get("id")?,
        event_type: row.try_get("event_type")?,
        lease_id: row.try_get("lease_id")?,
        payload: serde_json::from_str(&payload)
            .map_err(|_| DbError::Corrupt(format!("notification payload {payload:?}")))?,
        created_at: from_secs(row.try_get("created_at")?)?,
        request_id: row.try_get("request_id")?,
    })
}

impl Tx {
    /// Adds a notification after those written before it, and a pending delivery of it to
    /// every webhook that takes it. A lease's notifications are written under its row lock,
    /// so their order is the order of the changes. Its `request_id`, the global id of the
    /// API call that caused it, also goes with each webhook delivery.
    pub async fn insert_notification(&mut self, n: &Notification) -> DbResult<()> {
        self.recorded_notifications = true;
        let project = n.payload.get("project_id").and_then(Value::as_str);
        let mut args = vec![
            (&n.id).into(),
            (&n.event_type).into(),
            Arg::Text(n.lease_id.clone()),
            n.payload.to_string().into(),
            n.created_at.into(),
            Arg::Text(n.request_id.clone()),
        ];
        match self.backend {
            // SQLite's one writer makes MAX + 1 the final place. The writes are queued
            // (sent together before the next read or the commit), so whether any webhook
            // took the notification is not known here: the webhook workers are woken anyway.
            Backend::Sqlite => {
                self.write(
                    "INSERT INTO notifications \
                         (id, seq, written, event_type, lease_id, payload, created_at, \
                          request_id) \
                     SELECT $1, m.next, m.next, $2, $3, $4, $5, $6 \
                     FROM (SELECT COALESCE(MAX(seq), 0) + 1 AS next FROM notifications) m",
                    args,
                )
                .await?;
                self.fan_out_to_webhooks(&n.id, project, n.request_id.as_deref())
                    .await?;
                self.wrote_deliveries = true;
            }
            // The row and its deliveries in one statement (one round trip, not two); its
            // `written` comes from a sequence and its place waits for
            // `sequence_notifications`. The count it answers is the deliveries'.
            Backend::Postgres => {
                static SQL: LazyLock<String> = LazyLock::new(|| {
                    format!(
                        "WITH n AS (INSERT INTO notifications \
                             (id, event_type, lease_id, payload, created_at, request_id) \
                             VALUES ($1, $2, $3, $4, $5, $6) \
                             RETURNING id, written, lease_id, event_type, created_at) \
                         {}",
                        crate::webhooks::fan_out("n", "$7", "$6")
                    )
                });
                args.push(Arg::Text(project.map(String::from)));
                let deliveries = self.execute(&SQL, args).await?;
                self.wrote_deliveries |= deliveries > 0;
            }
        }
        Ok(())
    }

    /// Gives the committed notifications that have no place in the event stream yet
    /// (PostgreSQL only) the next places, in the order they were written. One sequencer at
    /// a time, under an advisory lock held to its commit, numbers only rows already
    /// committed, so a reader that has seen place `n` has seen every place before it, and
    /// no row is ever numbered behind a place already read. Call it in its own write
    /// transaction before reading by place; nothing to do on SQLite. Answers how many rows
    /// it numbered.
    pub async fn sequence_notifications(&mut self) -> DbResult<u64> {
        if self.backend != Backend::Postgres {
            return Ok(0);
        }
        let waiting = self
            .fetch_rows(
                "SELECT 1 AS one FROM notifications WHERE seq IS NULL LIMIT 1",
                vec![],
            )
            .await?;
        if waiting.is_empty() {
            return Ok(0);
        }
        self.advisory_lock(7_355_612).await?;
        self.execute(
            "UPDATE notifications n SET seq = s.base + s.place \
             FROM (SELECT id, row_number() OVER (ORDER BY written) AS place, \
                          (SELECT COALESCE(MAX(seq), 0) FROM notifications) AS base \
                   FROM notifications WHERE seq IS NULL) s \
             WHERE n.id = s.id",
            vec![],
        )
        .await
    }

    /// Up to `limit` notifications (of one lease, or all) after the one at place `after`
    /// (its `written` and id; from the first with `None`), in the order they were written,
    /// each with its place to resume after. The id breaks ties: rows written before
    /// migration 0013 took `written` from `seq`, which PostgreSQL could repeat.
    pub async fn outbox_page(
        &mut self,
        lease_id: Option<&str>,
        after: Option<(i64, &str)>,
        limit: usize,
    ) -> DbResult<Vec<((i64, String), Notification)>> {
        let (written, id) = after.unwrap_or((i64::MIN, ""));
        let mut args: Vec<Arg> = vec![written.into(), id.into(), (limit as i64).into()];
        let filter = match lease_id {
            Some(l) => {
                args.push(l.into());
                " AND lease_id = $4"
            }
            None => "",
        };
        let sql = format!(
            "SELECT written, {COLUMNS} FROM notifications \
             WHERE (written, id) > ($1, $2){filter} \
             ORDER BY written, id LIMIT $3"
        );
        let rows = self.fetch_rows(&sql, args).await?;
        rows.iter()
            .map(|row| {
                let n = notification_from_row(row)?;
                Ok(((row.try_get("written")?, n.id.clone()), n))
            })
            .collect()
    }

    /// Claims up to `limit` unsent notifications for `worker` until `now + claim_for`,
    /// oldest first: those nobody holds (or whose claim expired), each only if no earlier
    /// unsent notification of its lease is held by another publisher, so a lease's
    /// notifications go out in order. Only notifications with a place are claimed: call
    /// [`Tx::lock_notification_claims`] and [`Tx::sequence_notifications`] first.
    pub async fn claim_notifications(
        &mut self,
        now: DateTime<Utc>,
        worker: &str,
        claim_for: Duration,
        limit: usize,
    ) -> DbResult<Vec<Notification>> {
        let sql = format!(
            "SELECT {COLUMNS} FROM notifications n \
             WHERE n.sent_at IS NULL AND n.seq IS NOT NULL \
             AND (n.claimed_until IS NULL OR n.claimed_until < $1 OR n.claimed_by = $2) \
             AND NOT EXISTS (SELECT 1 FROM notifications b WHERE b.lease_id = n.lease_id \
                 AND b.sent_at IS NULL AND (b.seq < n.seq OR (b.seq = n.seq AND b.id < n.id)) \
                 AND b.claimed_by <> $2 AND b.claimed_until >= $1) \
             ORDER BY n.seq, n.id LIMIT $3"
        );
        let rows = self
            .fetch_rows_replanned(
                &sql,
                vec![to_secs(now).into(), worker.into(), (limit as i64).into()],
            )
            .await?;
        let claimed: Vec<Notification> = rows
            .iter()
            .map(notification_from_row)
            .collect::<DbResult<_>>()?;
        for n in &claimed {
            self.write(
                "UPDATE notifications SET claimed_by = $1, claimed_until = $2 WHERE id = $3",
                vec![worker.into(), (now + claim_for).into(), (&n.id).into()],
            )
            .await?;
        }
        Ok(claimed)
    }

    /// Marks notifications sent (the broker confirmed them).
    pub async fn mark_notifications_sent(
        &mut self,
        ids: &[String],
        now: DateTime<Utc>,
    ) -> DbResult<()> {
        for id in ids {
            self.write(
                "UPDATE notifications SET sent_at = $1, claimed_by = NULL, claimed_until = NULL \
                 WHERE id = $2",
                vec![now.into(), id.into()],
            )
            .await?;
        }
        Ok(())
    }

    /// Gives back `worker`'s claims on notifications it could not send, so that they (and
    /// the later ones of their leases) may be claimed again at once.
    pub async fn release_notifications(&mut self, ids: &[String], worker: &str) -> DbResult<()> {
        for id in ids {
            self.write(
                "UPDATE notifications SET claimed_by = NULL, claimed_until = NULL \
                 WHERE id = $1 AND claimed_by = $2 AND sent_at IS NULL",
                vec![id.into(), worker.into()],
            )
            .await?;
        }
        Ok(())
    }

    /// Up to `limit` notifications written after sequence number `after`, in order. A
    /// stream of them resumes from the last `seq` it delivered.
    pub async fn notifications_after(
        &mut self,
        after: i64,
        limit: usize,
    ) -> DbResult<Vec<SequencedNotification>> {
        let sql = format!(
            "SELECT seq, {COLUMNS} FROM notifications WHERE seq > $1 ORDER BY seq, id LIMIT $2"
        );
        let rows = self
            .fetch_rows(&sql, vec![after.into(), (limit as i64).into()])
            .await?;
        rows.iter()
            .map(|row| {
                Ok(SequencedNotification {
                    seq: row.try_get("seq")?,
                    notification: notification_from_row(row)?,
                })
            })
            .collect()
    }

    /// The sequence number of the latest notification (0 when there is none).
    pub async fn last_notification_seq(&mut self) -> DbResult<i64> {
        let rows = self
            .fetch_rows(
                "SELECT CAST(COALESCE(MAX(seq), 0) AS BIGINT) AS seq FROM notifications",
                vec![],
            )
            .await?;
        match rows.first() {
            Some(row) => Ok(row.try_get("seq")?),
            None => Ok(0),
        }
    }

    /// How many notifications are not sent yet.
    pub async fn unsent_notifications(&mut self) -> DbResult<i64> {
        let rows = self
            .fetch_rows(
                "SELECT CAST(COUNT(*) AS BIGINT) AS n FROM notifications WHERE sent_at IS NULL",
                vec![],
            )
            .await?;
        match rows.first() {
            Some(row) => Ok(row.try_get("n")?),
            None => Ok(0),
        }
    }
}
