//! Claims on tasks that one replica at a time may run (`task_claims`).

use chrono::{DateTime, Utc};
use sqlx::Row;

use crate::{DbResult, Tx, from_secs, to_secs};

/// Who holds a task, and until when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskClaim {
    pub holder: String,
    pub held_until: DateTime<Utc>,
}

impl Tx {
    /// Claims task `name` for `holder` until `until`, if no one holds it at `now` (a claim
    /// whose time has passed is free). Returns whether `holder` got it. One statement, so
    /// two replicas racing for a free task cannot both get it: the row's key decides.
    pub async fn claim_task(
        &mut self,
        name: &str,
        holder: &str,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
    ) -> DbResult<bool> {
        let rows = self
            .fetch_rows(
                "INSERT INTO task_claims (name, holder, held_until) VALUES ($1, $2, $3) \
                 ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, \
                     held_until = excluded.held_until \
                 WHERE task_claims.held_until <= $4 \
                 RETURNING holder",
                vec![
                    name.into(),
                    holder.into(),
                    to_secs(until).into(),
                    to_secs(now).into(),
                ],
            )
            .await?;
        Ok(!rows.is_empty())
    }

    /// Holds task `name` until `until`, if `holder` still holds it at `now`. Returns whether
    /// it does. A claim that ran out is lost, even if no one took it meanwhile: what its
    /// holder did under it (a repair's holds) stopped counting when it ran out.
    pub async fn renew_task(
        &mut self,
        name: &str,
        holder: &str,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
    ) -> DbResult<bool> {
        let rows = self
            .fetch_rows(
                "UPDATE task_claims SET held_until = $1 WHERE name = $2 AND holder = $3 \
                 AND held_until > $4 RETURNING holder",
                vec![
                    to_secs(until).into(),
                    name.into(),
                    holder.into(),
                    to_secs(now).into(),
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
}
