//! What a repairing reconciler pass is changing in the cloud (`repair_holds`), kept from
//! the action workers meanwhile.
//!
//! A pass reads the database, then the cloud, then repairs the difference. An action that
//! ran in between (a lease starting or ending, a host healed) makes the pass's picture
//! stale: repairing from it would undo the action. So before it changes anything a pass
//! holds what it changes (a lease, hosts or other resources): the hold is refused when an
//! action on them is open or was recorded after the pass read the database, and while it
//! stands no action on them is claimed. A hold counts only while its pass holds the
//! `reconcile` task claim, so the holds of a pass that stopped lapse with its claim.

use std::collections::HashSet;

use sqlx::Row;

use chrono::{DateTime, Utc};

use crate::actions::OPEN;
use crate::{DbResult, Tx, to_secs};

/// The task claim a repairing pass holds; its holds count while it does.
pub const RECONCILE_TASK: &str = "reconcile";

/// The advisory lock between holds (exclusive) and action claims (shared), on PostgreSQL:
/// a claim either committed before a hold looks at the actions, or looks at the holds
/// after the hold committed.
pub(crate) const REPAIR_LOCK: i64 = 7_355_613;

/// How far below the newest action a read of the recent ones reaches: far more actions
/// than can be recorded while one transaction commits.
const RECENT_ACTIONS: i64 = 10_000;

/// The actions recorded lately, as one read saw them. An action above `above` that is not
/// among `seqs` is news to the reader: recorded after the read, or (on PostgreSQL, which
/// hands seqs out before commit) committed after it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ActionsSeen {
    pub above: i64,
    pub seqs: HashSet<i64>,
}

/// What a repair changes in the cloud: a lease's (its actions), and resources (the actions
/// on them), each as (resource type, resource id).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RepairItem {
    pub lease_id: Option<String>,
    pub resources: Vec<(String, i64)>,
}

impl Tx {
    /// The actions recorded lately. Read it first, before what it is to date.
    pub async fn actions_seen(&mut self) -> DbResult<ActionsSeen> {
        let rows = self
            .fetch_rows(
                "SELECT seq FROM actions \
                 WHERE seq > (SELECT COALESCE(MAX(seq), 0) FROM actions) - $1",
                vec![RECENT_ACTIONS.into()],
            )
            .await?;
        let mut seqs = HashSet::with_capacity(rows.len());
        for row in rows {
            seqs.insert(row.try_get::<i64, _>("seq")?);
        }
        let top = seqs.iter().copied().max().unwrap_or(0);
        Ok(ActionsSeen {
            above: top - RECENT_ACTIONS,
            seqs,
        })
    }

    /// Holds `item` for the repair of `holder`, a pass holding the `reconcile` task claim at
    /// `now`, unless an action on it is open or news to `seen`; answers whether it did.
    /// Until the holds of `holder` are released, or its claim runs out, no action of the
    /// item's lease or on its resources is claimed.
    pub async fn hold_for_repair(
        &mut self,
        holder: &str,
        item: &RepairItem,
        seen: &ActionsSeen,
        now: DateTime<Utc>,
    ) -> DbResult<bool> {
        self.advisory_lock(REPAIR_LOCK).await?;
        // A hold counts only under its pass's claim: one taken after the claim ran out
        // would keep nothing from the workers.
        let claimed = self
            .fetch_rows(
                "SELECT holder FROM task_claims WHERE name = $1 AND holder = $2 \
                 AND held_until > $3",
                vec![RECONCILE_TASK.into(), holder.into(), to_secs(now).into()],
            )
            .await?;
        if claimed.is_empty() {
            return Ok(false);
        }
        let mut touching = Vec::new();
        if let Some(lease_id) = &item.lease_id {
            touching.extend(
                self.fetch_rows(
                    &format!(
                        "SELECT seq, status FROM actions \
                         WHERE lease_id = $1 AND (seq > $2 OR status IN {OPEN})"
                    ),
                    vec![lease_id.into(), seen.above.into()],
                )
                .await?,
            );
        }
        for (kind, id) in &item.resources {
            touching.extend(
                self.fetch_rows(
                    &format!(
                        "SELECT b.seq, b.status FROM action_resources s \
                         JOIN actions b ON b.seq = s.seq \
                         WHERE s.resource_type = $1 AND s.resource_id = $2 \
                         AND (s.seq > $3 OR b.status IN {OPEN})"
                    ),
                    vec![kind.into(), (*id).into(), seen.above.into()],
                )
                .await?,
            );
        }
        for row in &touching {
            let seq: i64 = row.try_get("seq")?;
            let status: String = row.try_get("status")?;
            if status == "pending" || status == "running" || !seen.seqs.contains(&seq) {
                return Ok(false);
            }
        }
        if let Some(lease_id) = &item.lease_id {
            self.write(
                "INSERT INTO repair_holds (holder, lease_id) VALUES ($1, $2)",
                vec![holder.into(), lease_id.into()],
            )
            .await?;
        }
        for (kind, id) in &item.resources {
            self.write(
                "INSERT INTO repair_holds (holder, resource_type, resource_id) \
                 VALUES ($1, $2, $3)",
                vec![holder.into(), kind.into(), (*id).into()],
            )
            .await?;
        }
        Ok(true)
    }

    /// Releases the holds of `holder`.
    pub async fn release_repair_holds(&mut self, holder: &str) -> DbResult<()> {
        self.write(
            "DELETE FROM repair_holds WHERE holder = $1",
            vec![holder.into()],
        )
        .await
    }

    /// Removes the holds of every pass but `holder`'s: left by passes that stopped (they
    /// count for nothing once their claim ran out; one pass runs at a time).
    pub async fn drop_stale_repair_holds(&mut self, holder: &str) -> DbResult<()> {
        self.write(
            "DELETE FROM repair_holds WHERE holder <> $1",
            vec![holder.into()],
        )
        .await
    }
}
