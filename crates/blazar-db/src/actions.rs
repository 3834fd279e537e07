//! The queue of outside-world actions: written in the transaction that decides them, claimed
//! and finished by workers in their own short transactions.

use chrono::{DateTime, Duration, Utc};
use sqlx::Row;
use sqlx::any::AnyRow;

use blazar_core::{ActionFilter, ActionIntent, ActionRecord};

use crate::repairs::RECONCILE_TASK;
use crate::{Arg, Backend, DbResult, Tx, from_opt_secs, from_secs, to_secs, wire};

/// An action to record.
#[derive(Debug, Clone, PartialEq)]
pub struct NewAction {
    pub intent: ActionIntent,
    /// The resources it touches, for ordering against other actions on them.
    pub resources: Vec<i64>,
    pub created_at: DateTime<Utc>,
}

const ACTION_COLUMNS: &str = "a.seq, a.lease_id, a.reservation_id, a.project_id, a.kind, \
    a.purpose, a.resource_type, a.payload, a.status, a.attempts, a.not_before, a.claimed_by, \
    a.claimed_until, a.last_error, a.request_id, a.created_at, a.updated_at, a.first_tried_at, \
    a.lost_attempts";

fn action_from_row(row: &AnyRow) -> DbResult<ActionRecord> {
    let intent = ActionIntent {
        lease_id: row.try_get("lease_id")?,
        reservation_id: row.try_get("reservation_id")?,
        project_id: row.try_get("project_id")?,
        kind: wire(&row.try_get::<String, _>("kind")?, "action kind")?,
        purpose: wire(&row.try_get::<String, _>("purpose")?, "action purpose")?,
        resource_type: row.try_get("resource_type")?,
        payload: row.try_get("payload")?,
        request_id: row.try_get("request_id")?,
    };
    Ok(ActionRecord {
        seq: row.try_get("seq")?,
        intent,
        status: wire(&row.try_get::<String, _>("status")?, "action status")?,
        attempts: row.try_get("attempts")?,
        not_before: from_secs(row.try_get("not_before")?)?,
        claimed_by: row.try_get("claimed_by")?,
        claimed_until: from_opt_secs(row.try_get("claimed_until")?)?,
        last_error: row.try_get("last_error")?,
        created_at: from_secs(row.try_get("created_at")?)?,
        updated_at: from_opt_secs(row.try_get("updated_at")?)?,
        first_tried_at: from_opt_secs(row.try_get("first_tried_at")?)?,
        lost_attempts: row.try_get("lost_attempts")?,
    })
}

/// An action is open while pending or running.
pub(crate) const OPEN: &str = "('pending', 'running')";

const INSERT_ACTION: &str = "INSERT INTO actions (lease_id, reservation_id, project_id, kind, \
     purpose, resource_type, payload, status, attempts, not_before, request_id, created_at) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, 'pending', 0, $8, $9, $10)";

fn action_args(a: &NewAction) -> Vec<Arg> {
    let intent = &a.intent;
    vec![
        (&intent.lease_id).into(),
        (&intent.reservation_id).into(),
        (&intent.project_id).into(),
        intent.kind.into(),
        intent.purpose.into(),
        (&intent.resource_type).into(),
        (&intent.payload).into(),
        a.created_at.into(),
        Arg::Text(intent.request_id.clone()),
        a.created_at.into(),
    ]
}

/// The resources an action names, each once.
fn resources_of(a: &NewAction) -> Vec<i64> {
    let mut resources = a.resources.clone();
    resources.sort_unstable();
    resources.dedup();
    resources
}

/// How a finished attempt leaves an action.
#[derive(Debug, Clone, PartialEq)]
pub enum ActionOutcome {
    Done,
    /// Try again at `not_before`.
    Retry {
        error: String,
        not_before: DateTime<Utc>,
    },
    Failed {
        error: String,
    },
    /// Failed without being tried: its attempts were spent. The claim that found so is not
    /// counted as an attempt.
    GaveUp {
        error: String,
    },
}

/// The statement of a list of actions, newest first: from `actions_lease` for a lease,
/// `actions_project` for a project, the primary key otherwise.
fn actions_query(filter: &ActionFilter) -> (String, Vec<Arg>) {
    let mut args: Vec<Arg> = Vec::new();
    let mut conditions: Vec<String> = Vec::new();
    let bind = |args: &mut Vec<Arg>, arg: Arg| {
        args.push(arg);
        format!("${}", args.len())
    };
    if !filter.statuses.is_empty() {
        let marks: Vec<String> = filter
            .statuses
            .iter()
            .map(|s| bind(&mut args, s.as_str().into()))
            .collect();
        conditions.push(format!("a.status IN ({})", marks.join(", ")));
    }
    if let Some(lease_id) = &filter.lease_id {
        let mark = bind(&mut args, lease_id.as_str().into());
        conditions.push(format!("a.lease_id = {mark}"));
    }
    if let Some(project_id) = &filter.project_id {
        let mark = bind(&mut args, project_id.as_str().into());
        conditions.push(format!("a.project_id = {mark}"));
    }
    if let Some(seq) = filter.before_seq {
        let mark = bind(&mut args, seq.into());
        conditions.push(format!("a.seq < {mark}"));
    }
    let limit = bind(&mut args, (filter.limit as i64).into());
    let filter = if conditions.is_empty() {
        String::new()
    } else {
        format!("WHERE {}", conditions.join(" AND "))
    };
    let sql = format!(
        "SELECT {ACTION_COLUMNS} FROM actions a {filter} ORDER BY a.seq DESC LIMIT {limit}"
    );
    (sql, args)
}

impl Tx {
    /// Records an action; returns its sequence number.
    pub async fn insert_action(&mut self, a: &NewAction) -> DbResult<i64> {
        self.recorded_actions = true;
        let sql = format!("{INSERT_ACTION} RETURNING seq");
        let rows = self.fetch_rows(&sql, action_args(a)).await?;
        let seq: i64 = match rows.first() {
            Some(row) => row.try_get("seq")?,
            None => return Err(crate::DbError::Corrupt("insert returned no seq".into())),
        };
        for id in resources_of(a) {
            self.write(
                "INSERT INTO action_resources (seq, resource_type, resource_id) VALUES ($1, $2, $3)",
                vec![seq.into(), (&a.intent.resource_type).into(), id.into()],
            )
            .await?;
        }
        Ok(seq)
    }

    /// [`Tx::insert_action`] for a caller that needs no seq (the scheduler, recording a
    /// burst of hand-overs): on SQLite it waits in the queue of writes instead of costing a
    /// round trip of its own.
    pub async fn queue_action(&mut self, a: &NewAction) -> DbResult<()> {
        if self.backend == Backend::Postgres {
            return self.insert_action(a).await.map(|_| ());
        }
        self.recorded_actions = true;
        self.write(INSERT_ACTION, action_args(a)).await?;
        for id in resources_of(a) {
            // The one writer's last insert has the highest seq (AUTOINCREMENT never reuses
            // one), and nothing else inserts actions in between.
            self.write(
                "INSERT INTO action_resources (seq, resource_type, resource_id) \
                 VALUES ((SELECT MAX(seq) FROM actions), $1, $2)",
                vec![(&a.intent.resource_type).into(), id.into()],
            )
            .await?;
        }
        Ok(())
    }

    /// Claims up to `limit` actions that may run now, for `claim_for`: pending ones that are
    /// due and running ones whose claim expired, each only if no earlier action of its lease
    /// or on one of its resources is still open. On PostgreSQL rows another replica is
    /// claiming are skipped, so each action goes to one worker.
    pub async fn claim_actions(
        &mut self,
        now: DateTime<Utc>,
        worker: &str,
        claim_for: Duration,
        limit: usize,
    ) -> DbResult<Vec<ActionRecord>> {
        self.claim(now, worker, claim_for, limit, None).await
    }

    /// Claims action `seq` if it may run now (as `claim_actions` would).
    pub async fn claim_action(
        &mut self,
        seq: i64,
        now: DateTime<Utc>,
        worker: &str,
        claim_for: Duration,
    ) -> DbResult<Option<ActionRecord>> {
        Ok(self
            .claim(now, worker, claim_for, 1, Some(seq))
            .await?
            .into_iter()
            .next())
    }

    async fn claim(
        &mut self,
        now: DateTime<Utc>,
        worker: &str,
        claim_for: Duration,
        limit: usize,
        only: Option<i64>,
    ) -> DbResult<Vec<ActionRecord>> {
        // What a repairing reconciler pass holds is not claimed (see `repairs`); the shared
        // lock makes a hold and a claim see each other.
        self.advisory_lock_shared(crate::repairs::REPAIR_LOCK)
            .await?;
        let lock = match self.backend() {
            Backend::Postgres => " FOR UPDATE OF a SKIP LOCKED",
            Backend::Sqlite => "",
        };
        let sql = format!(
            "SELECT a.seq FROM actions a \
             WHERE ((a.status = 'pending' AND a.not_before <= $1) \
                    OR (a.status = 'running' AND a.claimed_until < $1)) \
             AND NOT EXISTS (SELECT 1 FROM actions b WHERE b.lease_id = a.lease_id \
                 AND b.seq < a.seq AND b.status IN {OPEN}) \
             AND NOT EXISTS (SELECT 1 FROM action_resources r \
                 JOIN action_resources s ON s.resource_type = r.resource_type \
                     AND s.resource_id = r.resource_id AND s.seq < r.seq \
                 JOIN actions b ON b.seq = s.seq AND b.status IN {OPEN} \
                 WHERE r.seq = a.seq) \
             AND NOT EXISTS (SELECT 1 FROM repair_holds h JOIN task_claims c \
                 ON c.name = '{RECONCILE_TASK}' AND c.holder = h.holder AND c.held_until > $1 \
                 WHERE h.lease_id = a.lease_id OR EXISTS (SELECT 1 FROM action_resources r \
                     WHERE r.seq = a.seq AND r.resource_type = h.resource_type \
                     AND r.resource_id = h.resource_id)) \
             {only_filter} ORDER BY a.seq LIMIT $2{lock}",
            only_filter = if only.is_some() { "AND a.seq = $3" } else { "" }
        );
        let mut args: Vec<Arg> = vec![to_secs(now).into(), (limit as i64).into()];
        if let Some(seq) = only {
            args.push(seq.into());
        }
        // A claim of whatever is due reads the queue as it is now (see `fetch_rows_replanned`);
        // one action's, by its key, plans the same whatever the backlog.
        let rows = if only.is_some() {
            self.fetch_rows(&sql, args).await?
        } else {
            self.fetch_rows_replanned(&sql, args).await?
        };
        let mut claimed = Vec::with_capacity(rows.len());
        for row in rows {
            let seq: i64 = row.try_get("seq")?;
            // A running action claimed again is one whose last attempt did not report back.
            let sql = format!(
                "UPDATE actions SET status = 'running', claimed_by = $1, claimed_until = $2, \
                 attempts = attempts + 1, first_tried_at = COALESCE(first_tried_at, $3), \
                 lost_attempts = lost_attempts + CASE WHEN status = 'running' THEN 1 ELSE 0 END, \
                 updated_at = $3 WHERE seq = $4 RETURNING {}",
                ACTION_COLUMNS.replace("a.", "")
            );
            let updated = self
                .fetch_rows(
                    &sql,
                    vec![
                        worker.into(),
                        (now + claim_for).into(),
                        now.into(),
                        seq.into(),
                    ],
                )
                .await?;
            if let Some(row) = updated.first() {
                claimed.push(action_from_row(row)?);
            }
        }
        Ok(claimed)
    }

    /// Holds `worker`'s claim of running action `seq` until `until`. Returns false when the
    /// claim was lost meanwhile (it expired and another worker took the action).
    pub async fn renew_action_claim(
        &mut self,
        seq: i64,
        worker: &str,
        until: DateTime<Utc>,
    ) -> DbResult<bool> {
        let rows = self
            .fetch_rows(
                "UPDATE actions SET claimed_until = $1 \
                 WHERE seq = $2 AND status = 'running' AND claimed_by = $3 RETURNING seq",
                vec![until.into(), seq.into(), worker.into()],
            )
            .await?;
        Ok(!rows.is_empty())
    }

    /// Records the outcome of `worker`'s attempt. Returns false (and changes nothing) when
    /// the claim was lost meanwhile: it expired and another worker took the action.
    pub async fn finish_action(
        &mut self,
        seq: i64,
        worker: &str,
        outcome: &ActionOutcome,
        now: DateTime<Utc>,
    ) -> DbResult<bool> {
        let (status, error, not_before, untried) = match outcome {
            ActionOutcome::Done => ("done", None, None, 0_i64),
            ActionOutcome::Retry { error, not_before } => {
                ("pending", Some(error.clone()), Some(*not_before), 0)
            }
            ActionOutcome::Failed { error } => ("failed", Some(error.clone()), None, 0),
            ActionOutcome::GaveUp { error } => ("failed", Some(error.clone()), None, 1),
        };
        let rows = self
            .fetch_rows(
                "UPDATE actions SET status = $1, last_error = COALESCE($2, last_error), \
                 not_before = COALESCE($3, not_before), claimed_by = NULL, claimed_until = NULL, \
                 updated_at = $4, attempts = attempts - $7 \
                 WHERE seq = $5 AND status = 'running' AND claimed_by = $6 RETURNING seq",
                vec![
                    status.into(),
                    Arg::Text(error),
                    not_before.into(),
                    now.into(),
                    seq.into(),
                    worker.into(),
                    untried.into(),
                ],
            )
            .await?;
        Ok(!rows.is_empty())
    }

    /// Ends the lease's pending actions of `kind` that no worker has taken yet: cancelled if
    /// never tried, failed if tried and waiting for another attempt.
    pub async fn cancel_pending_actions(
        &mut self,
        lease_id: &str,
        kind: &str,
        now: DateTime<Utc>,
    ) -> DbResult<()> {
        // One that was tried and is waiting to be tried again failed: what it was to do was
        // never done, and its event and lease say so. One never tried is only cancelled.
        self.write(
            "UPDATE actions SET status = CASE WHEN attempts > 0 THEN 'failed' \
             ELSE 'cancelled' END, last_error = CASE WHEN attempts > 0 THEN \
             'not done before the lease ended: ' || COALESCE(last_error, '') \
             ELSE last_error END, updated_at = $1 \
             WHERE lease_id = $2 AND kind = $3 AND status = 'pending'",
            vec![now.into(), lease_id.into(), kind.into()],
        )
        .await
    }

    /// Gives up the lease's actions of `kind` that were tried and wait for another attempt
    /// (failed, with `why` before their last error); those never tried are left to run.
    pub async fn give_up_retries(
        &mut self,
        lease_id: &str,
        kind: &str,
        why: &str,
        now: DateTime<Utc>,
    ) -> DbResult<()> {
        self.write(
            "UPDATE actions SET status = 'failed', \
             last_error = $1 || COALESCE(last_error, ''), updated_at = $2 \
             WHERE lease_id = $3 AND kind = $4 AND status = 'pending' AND attempts > 0",
            vec![why.into(), now.into(), lease_id.into(), kind.into()],
        )
        .await
    }

    /// How many of the lease's actions for `purpose` are open, and how many failed.
    pub async fn action_counts(&mut self, lease_id: &str, purpose: &str) -> DbResult<(i64, i64)> {
        Ok(self
            .action_counts_of_leases(&[lease_id])
            .await?
            .into_iter()
            .find(|(_, p, _, _)| p == purpose)
            .map_or((0, 0), |(_, _, open, failed)| (open, failed)))
    }

    /// [`Tx::action_counts`] of several leases, for every purpose they have actions of:
    /// `(lease id, purpose, open, failed)`.
    pub async fn action_counts_of_leases(
        &mut self,
        ids: &[&str],
    ) -> DbResult<Vec<(String, String, i64, i64)>> {
        self.fetch_all_in(
            ids,
            |list| {
                format!(
                    "SELECT lease_id, purpose, \
                     CAST(SUM(CASE WHEN status IN {OPEN} THEN 1 ELSE 0 END) AS BIGINT) AS open, \
                     CAST(SUM(CASE WHEN status = 'failed' THEN 1 ELSE 0 END) AS BIGINT) AS failed \
                     FROM actions WHERE lease_id IN ({list}) GROUP BY lease_id, purpose"
                )
            },
            |row| {
                Ok((
                    row.try_get("lease_id")?,
                    row.try_get("purpose")?,
                    row.try_get("open")?,
                    row.try_get("failed")?,
                ))
            },
        )
        .await
    }

    /// The lease's actions, oldest first.
    pub async fn actions_of_lease(&mut self, lease_id: &str) -> DbResult<Vec<ActionRecord>> {
        let sql =
            format!("SELECT {ACTION_COLUMNS} FROM actions a WHERE a.lease_id = $1 ORDER BY a.seq");
        let rows = self.fetch_rows(&sql, vec![lease_id.into()]).await?;
        rows.iter().map(action_from_row).collect()
    }

    /// Whether this database ever had reservation `id`: its row, or an action of it (a
    /// deleted lease's actions stay). What the cloud holds under an id it never had was not
    /// made through it: everything blazar-rs makes for a reservation is made by an action
    /// recorded first. This holds while actions are never purged; a purge of old actions
    /// would have to keep one per reservation, or the reconciler would leave the orphans
    /// of those reservations.
    pub async fn reservation_recorded(&mut self, id: &str) -> DbResult<bool> {
        let rows = self
            .fetch_rows(
                "SELECT 1 AS one FROM reservations WHERE id = $1 \
                 UNION ALL SELECT 1 AS one FROM actions WHERE reservation_id = $1 LIMIT 1",
                vec![id.into()],
            )
            .await?;
        Ok(!rows.is_empty())
    }

    pub async fn get_action(&mut self, seq: i64) -> DbResult<Option<ActionRecord>> {
        let sql = format!("SELECT {ACTION_COLUMNS} FROM actions a WHERE a.seq = $1");
        let rows = self.fetch_rows(&sql, vec![seq.into()]).await?;
        rows.first().map(action_from_row).transpose()
    }

    /// The actions `filter` selects, newest first, at most `filter.limit`.
    pub async fn list_actions(&mut self, filter: &ActionFilter) -> DbResult<Vec<ActionRecord>> {
        let (sql, args) = actions_query(filter);
        let rows = self.fetch_rows(&sql, args).await?;
        rows.iter().map(action_from_row).collect()
    }

    /// When a worker should look again: the earliest pending action's `not_before` or running
    /// action's claim expiry.
    pub async fn next_action_time(&mut self) -> DbResult<Option<DateTime<Utc>>> {
        let rows = self
            .fetch_rows(
                "SELECT MIN(CASE WHEN status = 'pending' THEN not_before ELSE claimed_until END) \
                 AS t FROM actions WHERE status IN ('pending', 'running')",
                vec![],
            )
            .await?;
        let t: Option<i64> = match rows.first() {
            Some(row) => row.try_get("t")?,
            None => None,
        };
        from_opt_secs(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plans::{plan, scratch_store};

    /// SQLite's plan of a member's page of actions: their project's from its index, newest
    /// first, without reading (or sorting) every project's.
    #[tokio::test]
    async fn a_projects_actions_are_read_from_its_index_on_sqlite() {
        let (_dir, store) = scratch_store().await;
        let mut tx = store.read().await.unwrap();
        let (sql, args) = actions_query(&ActionFilter {
            project_id: Some("alpha".into()),
            before_seq: Some(1_000),
            limit: 100,
            ..ActionFilter::default()
        });
        let plan = plan(&mut tx, &sql, args).await;
        assert_eq!(
            plan,
            ["SEARCH a USING INDEX actions_project (project_id=? AND seq<?)"],
            "{plan:?}"
        );
        tx.commit().await.unwrap();
        store.close().await;
    }
}
