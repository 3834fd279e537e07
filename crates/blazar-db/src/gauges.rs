//! Counts read for monitoring (`/metrics`): cheap aggregate queries over indexed tables.

use sqlx::Row;

use crate::{DbResult, Tx};

impl Tx {
    /// Leases per status. Ended leases pile up over the years, so they are not read one by
    /// one: the others are counted from their partial index (`leases_unsettled`), and the
    /// ended ones are the rest of a count of all (from the smallest index), in one statement
    /// so that both see the same leases.
    pub async fn lease_status_counts(&mut self) -> DbResult<Vec<(String, i64)>> {
        let rows = self
            .fetch_rows(
                "SELECT status, CAST(COUNT(*) AS BIGINT) AS n FROM leases \
                 WHERE status <> 'TERMINATED' GROUP BY status \
                 UNION ALL SELECT NULL, CAST(COUNT(*) AS BIGINT) FROM leases",
                vec![],
            )
            .await?;
        let mut counts = Vec::with_capacity(rows.len());
        let mut all = 0;
        for row in &rows {
            let n: i64 = row.try_get("n")?;
            match row.try_get::<Option<String>, _>("status")? {
                Some(status) => counts.push((status, n)),
                None => all = n,
            }
        }
        let unsettled: i64 = counts.iter().map(|(_, n)| n).sum();
        if all > unsettled {
            counts.push(("TERMINATED".to_string(), all - unsettled));
        }
        Ok(counts)
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
