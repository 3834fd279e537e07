//! Claims on tasks that one replica at a time may run (`task_claims`).

use chrono::{DateTime, Utc};
use sqlx::Row;

use crate::{Backend, DbError, DbResult, Tx, from_secs, to_secs};

/// Who holds a task, and until when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskClaim {
    pub holder: String,
    pub held_until: DateTime<Utc>,
}

/// A term asked for on a task: `holder` holds task `task` from `now` until `until`. One value,
/// so the two instants cannot be passed the wrong way round.
#[derive(Debug, Clone, Copy)]
pub struct TaskTerm<'a> {
    pub task: &'a str,
    pub holder: &'a str,
    pub now: DateTime<Utc>,
    pub until: DateTime<Utc>,
}

impl Tx {
    /// Claims the task for the term's holder, if no one holds it at the term's `now` (a claim
    /// whose time has passed is free). Returns whether the holder got it. One statement, so
    /// two replicas racing for a free task cannot both get it: the row's key decides.
    pub async fn claim_task(&mut self, term: &TaskTerm<'_>) -> DbResult<bool> {
        let rows = self
            .fetch_rows(
                "INSERT INTO task_claims (name, holder, held_until) VALUES ($1, $2, $3) \
                 ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, \
                     held_until = excluded.held_until \
                 WHERE task_claims.held_until <= $4 \
                 RETURNING holder",
                vec![
                    term.task.into(),
                    term.holder.into(),
                    to_secs(term.until).into(),
                    to_secs(term.now).into(),
                ],
            )
            .await?;
        Ok(!rows.is_empty())
    }

    /// Extends the term's holder's claim on the task, if it still holds it at the term's
    /// `now`. Returns whether it does. A claim that ran out is lost, even if no one took it
    /// meanwhile: what its holder did under it (a repair's holds) stopped counting when it
    /// ran out.
    pub async fn renew_task(&mut self, term: &TaskTerm<'_>) -> DbResult<bool> {
        let rows = self
            .fetch_rows(
                "UPDATE task_claims SET held_until = $1 WHERE name = $2 AND holder = $3 \
                 AND held_until > $4 RETURNING holder",
                vec![
                    to_secs(term.until).into(),
                    term.task.into(),
                    term.holder.into(),
                    to_secs(term.now).into(),
                ],
            )
            .await?;
        Ok(!rows.is_empty())
    }

    /// Gives task `name` up, if `holder` still holds it.
    pub async fn release_task(&mut self, name: &str, holder: &str) -> DbResult<()> {
        self.write(
            "DELETE FROM task_claims WHERE name = $1 AND holder = $2",
            vec![name.into(), holder.into()],
        )
        .await
    }

    /// Who holds task `name` (perhaps past its time), if anyone.
    pub async fn task_claim(&mut self, name: &str) -> DbResult<Option<TaskClaim>> {
        let rows = self
            .fetch_rows(
                "SELECT holder, held_until FROM task_claims WHERE name = $1",
                vec![name.into()],
            )
            .await?;
        rows.first()
            .map(|row| {
                Ok(TaskClaim {
                    holder: row.try_get("holder")?,
                    held_until: from_secs(row.try_get("held_until")?)?,
                })
            })
            .transpose()
    }

    /// The database server's clock, on PostgreSQL. Claims, their renewals and due events
    /// are judged by each replica's own clock, so replicas must agree on the time; the
    /// shared database is the one clock they can all compare theirs with. `None` on SQLite,
    /// whose clock is the process's own.
    pub async fn database_clock(&mut self) -> DbResult<Option<DateTime<Utc>>> {
        if self.backend != Backend::Postgres {
            return Ok(None);
        }
        let rows = self
            .fetch_rows(
                "SELECT CAST(FLOOR(EXTRACT(EPOCH FROM clock_timestamp()) * 1000) AS BIGINT) \
                 AS ms",
                vec![],
            )
            .await?;
        let ms: i64 = match rows.first() {
            Some(row) => row.try_get("ms")?,
            None => return Err(DbError::Corrupt("the database told no time".into())),
        };
        DateTime::from_timestamp_millis(ms)
            .map(Some)
            .ok_or_else(|| DbError::Corrupt(format!("database time {ms} ms")))
    }
}
