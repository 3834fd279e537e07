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

    /// How many outside-world actions are waiting or being carried out, and how many
    /// were given up on (each status from the index on `status`).
    pub async fn action_gauges(&mut self) -> DbResult<ActionCounts> {
        let rows = self
            .fetch_rows(
                "SELECT status, CAST(COUNT(*) AS BIGINT) AS n FROM actions \
                 WHERE status IN ('pending', 'running', 'failed') GROUP BY status",
                vec![],
            )
            .await?;
        let mut counts = ActionCounts::default();
        for row in &rows {
            let status: String = row.try_get("status")?;
            let n: i64 = row.try_get("n")?;
            match status.as_str() {
                "failed" => counts.failed += n,
                _ => counts.open += n,
            }
        }
        Ok(counts)
    }
}

/// Outside-world actions by where they stand.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ActionCounts {
    /// Pending or running.
    pub open: i64,
    /// Given up on: the cloud refused them or never answered in time.
    pub failed: i64,
}
