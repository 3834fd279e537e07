//! Counts read for monitoring (`/metrics`): cheap aggregate queries over indexed tables.

use sqlx::Row;

use crate::{DbResult, Tx};

impl Tx {
    /// How many leases there are in each status.
    pub async fn lease_status_counts(&mut self) -> DbResult<Vec<(String, i64)>> {
        let rows = self
            .fetch_rows(
                "SELECT status, CAST(COUNT(*) AS BIGINT) AS n FROM leases GROUP BY status",
                vec![],
            )
            .await?;
        rows.iter()
            .map(|row| {
                let status: Option<String> = row.try_get("status")?;
                Ok((status.unwrap_or_default(), row.try_get("n")?))
            })
            .collect()
    }

    /// How many outside-world actions are waiting or being carried out.
    pub async fn open_action_count(&mut self) -> DbResult<i64> {
        let rows = self
            .fetch_rows(
                "SELECT CAST(COUNT(*) AS BIGINT) AS n FROM actions \
                 WHERE status IN ('pending', 'running')",
                vec![],
            )
            .await?;
        match rows.first() {
            Some(row) => Ok(row.try_get("n")?),
            None => Ok(0),
        }
    }
}
