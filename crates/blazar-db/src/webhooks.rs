//! Webhooks and their deliveries. A delivery row is written for every matching webhook in
//! the transaction that writes a notification (see [`Tx::insert_notification`]); deliverers
//! claim due rows in short transactions of their own and record each attempt's outcome.

use std::sync::LazyLock;

use chrono::{DateTime, Duration, Utc};
use serde_json::Value;
use sqlx::Row;
use sqlx::any::AnyRow;

use blazar_core::{Webhook, WebhookDelivery};

use crate::{Arg, Columns, DbError, DbResult, Tx, from_secs, to_secs};

const COLUMNS: &str = "id, project_id, url, secret, description, created_by, created_at";

fn webhook_from_row(row: &AnyRow) -> DbResult<Webhook> {
    Ok(Webhook {
        id: row.try_get("id")?,
        project_id: row.try_get("project_id")?,
        url: row.try_get("url")?,
        secret: row.try_get("secret")?,
        event_types: Vec::new(),
        description: row.try_get("description")?,
        created_by: row.try_get("created_by")?,
        created_at: from_secs(row.try_get("created_at")?)?,
    })
}

/// The statement writing a pending delivery of notification `n` (the one row of `source`
/// aliased `n`, or the rows a caller's condition leaves) to every webhook of the
/// project given by the placeholder `project`, or of every project, that takes its event
/// type; `request` is the placeholder of the request id the deliveries carry. A delivery
/// queued behind an earlier one of its lease is due when that one is (the claim passes
/// over it until then, so it need not be looked at on every poll of a failing endpoint).
pub(crate) fn fan_out(source: &str, project: &str, request: &str) -> String {
    format!(
        "INSERT INTO webhook_deliveries (webhook_id, notification_id, seq, lease_id, status, \
             attempts, next_attempt_at, request_id, created_at) \
         SELECT w.id, n.id, n.written, n.lease_id, 'pending', 0, \
                COALESCE((SELECT h.next_attempt_at FROM webhook_deliveries h \
                          WHERE h.webhook_id = w.id AND h.lease_id = n.lease_id \
                          AND h.status = 'pending' ORDER BY h.seq LIMIT 1), n.created_at), \
                {request}, n.created_at \
         FROM webhooks w, {source} \
         WHERE (w.project_id IS NULL OR w.project_id = {project}) \
         AND (NOT EXISTS (SELECT 1 FROM webhook_event_types t WHERE t.webhook_id = w.id) \
              OR EXISTS (SELECT 1 FROM webhook_event_types t \
                         WHERE t.webhook_id = w.id AND t.event_type = n.event_type))"
    )
}

const DELIVERY_COLUMNS: &str = "d.webhook_id, d.notification_id, n.event_type, d.lease_id, \
     d.status, CAST(d.attempts AS BIGINT) AS attempts, d.next_attempt_at, d.last_attempt_at, \
     d.last_result, d.created_at, d.claimed_until";

fn delivery_from_row(row: &AnyRow, now: DateTime<Utc>) -> DbResult<WebhookDelivery> {
    let last: Option<i64> = row.try_get("last_attempt_at")?;
    let claimed_until: Option<i64> = row.try_get("claimed_until")?;
    let status: String = row.try_get("status")?;
    Ok(WebhookDelivery {
        webhook_id: row.try_get("webhook_id")?,
        notification_id: row.try_get("notification_id")?,
        event_type: row.try_get("event_type")?,
        lease_id: row.try_get("lease_id")?,
        // A claim that has run out is a worker that died: nobody is sending it.
        sending: status == "pending" && claimed_until.is_some_and(|until| until >= now.timestamp()),
        status,
        attempts: row.try_get("attempts")?,
        next_attempt_at: from_secs(row.try_get("next_attempt_at")?)?,
        last_attempt_at: last.map(from_secs).transpose()?,
        last_result: row.try_get("last_result")?,
        created_at: from_secs(row.try_get("created_at")?)?,
    })
}

/// A delivery claimed for sending: where to, with what key, and the event itself.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimedDelivery {
    pub webhook_id: String,
    /// The webhook's project; `None` for an every-project webhook.
    pub project_id: Option<String>,
    pub url: String,
    pub secret: String,
    pub notification_id: String,
    pub event_type: String,
    pub lease_id: Option<String>,
    pub payload: Value,
    pub created_at: DateTime<Utc>,
    /// Attempts made before this one.
    pub attempts: i64,
    /// The global request id of the API call that caused the event.
    pub request_id: Option<String>,
    /// What the last attempt reported, if any did.
    pub last_result: Option<String>,
    /// Whether the last claim of it was never reported on (its worker died while sending).
    pub unreported: bool,
    /// Whether its webhook's endpoint gave no answer in time at its latest attempt.
    pub silent: bool,
}

/// A webhook with a delivery due, as a claim reads it.
struct DueWebhook {
    id: String,
    project_id: Option<String>,
    url: String,
    secret: String,
    silent: bool,
}

/// Deliveries counted by status, for monitoring.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeliveryCounts {
    pub pending: i64,
    pub dead: i64,
}

impl Tx {
    pub async fn insert_webhook(&mut self, webhook: &Webhook) -> DbResult<()> {
        let (sql, args) = Columns::default()
            .set("id", &webhook.id)
            .set("project_id", webhook.project_id.clone())
            .set("url", &webhook.url)
            .set("secret", &webhook.secret)
            .set("description", &webhook.description)
            .set("created_by", webhook.created_by.clone())
            .set("created_at", webhook.created_at)
            .insert("webhooks");
        self.write(&sql, args).await?;
        for event_type in &webhook.event_types {
            self.write(
                "INSERT INTO webhook_event_types (webhook_id, event_type) VALUES ($1, $2)",
                vec![(&webhook.id).into(), event_type.into()],
            )
            .await?;
        }
        Ok(())
    }

    /// Fills in the event types of `hooks`, read in one query: those of the webhooks that
    /// `condition` (on `w`, the webhooks table, with `args`) selects.
    async fn with_event_types(
        &mut self,
        mut hooks: Vec<Webhook>,
        condition: &str,
        args: Vec<Arg>,
    ) -> DbResult<Vec<Webhook>> {
        if hooks.is_empty() {
            return Ok(hooks);
        }
        let rows = self
            .fetch_rows(
                &format!(
                    "SELECT t.webhook_id, t.event_type FROM webhook_event_types t \
                     JOIN webhooks w ON w.id = t.webhook_id{condition} \
                     ORDER BY t.webhook_id, t.event_type"
                ),
                args,
            )
            .await?;
        let mut types: std::collections::HashMap<String, Vec<String>> = Default::default();
        for row in &rows {
            types
                .entry(row.try_get("webhook_id")?)
                .or_default()
                .push(row.try_get("event_type")?);
        }
        for hook in &mut hooks {
            hook.event_types = types.remove(&hook.id).unwrap_or_default();
        }
        Ok(hooks)
    }

    pub async fn webhook(&mut self, id: &str) -> DbResult<Option<Webhook>> {
        let sql = format!("SELECT {COLUMNS} FROM webhooks WHERE id = $1");
        match self
            .fetch_optional_as(&sql, vec![id.into()], webhook_from_row)
            .await?
        {
            Some(hook) => Ok(self
                .with_event_types(vec![hook], " WHERE w.id = $1", vec![id.into()])
                .await?
                .pop()),
            None => Ok(None),
        }
    }

    /// The webhooks of one project (its own, not the all-project ones), or every webhook.
    pub async fn list_webhooks(&mut self, project_id: Option<&str>) -> DbResult<Vec<Webhook>> {
        let (condition, args): (&str, Vec<Arg>) = match project_id {
            Some(project) => (" WHERE w.project_id = $1", vec![project.into()]),
            None => ("", Vec::new()),
        };
        let sql = format!("SELECT {COLUMNS} FROM webhooks w{condition} ORDER BY created_at, id");
        let hooks = self
            .fetch_all_as(&sql, args.clone(), webhook_from_row)
            .await?;
        self.with_event_types(hooks, condition, args).await
    }

    /// How many webhooks project `project_id` has (`None`: the all-project ones).
    pub async fn count_webhooks(&mut self, project_id: Option<&str>) -> DbResult<i64> {
        let rows = match project_id {
            Some(p) => {
                self.fetch_rows(
                    "SELECT CAST(COUNT(*) AS BIGINT) AS n FROM webhooks WHERE project_id = $1",
                    vec![p.into()],
                )
                .await?
            }
            None => {
                self.fetch_rows(
                    "SELECT CAST(COUNT(*) AS BIGINT) AS n FROM webhooks WHERE project_id IS NULL",
                    vec![],
                )
                .await?
            }
        };
        match rows.first() {
            Some(row) => Ok(row.try_get("n")?),
            None => Ok(0),
        }
    }

    /// Forgets deliveries that succeeded before `before` (dead ones are kept until their
    /// webhook is deleted); answers how many went.
    pub async fn purge_webhook_deliveries(&mut self, before: DateTime<Utc>) -> DbResult<u64> {
        let done = sqlx::query(
            "DELETE FROM webhook_deliveries WHERE status = 'delivered' AND last_attempt_at < $1",
        )
        .bind(to_secs(before))
        .execute(self.conn().await?)
        .await?;
        Ok(done.rows_affected())
    }

    /// Deletes a webhook and its deliveries; false if there was none.
    pub async fn delete_webhook(&mut self, id: &str) -> DbResult<bool> {
        let done = sqlx::query("DELETE FROM webhooks WHERE id = $1")
            .bind(id)
            .execute(self.conn().await?)
            .await?;
        Ok(done.rows_affected() > 0)
    }

    /// Writes a pending delivery of notification `id` (just inserted) to every webhook of
    /// project `project_id` or of every project that takes its event type (SQLite; on
    /// PostgreSQL the notification's own statement writes them).
    pub(crate) async fn fan_out_to_webhooks(
        &mut self,
        id: &str,
        project_id: Option<&str>,
        request_id: Option<&str>,
    ) -> DbResult<()> {
        static SQL: LazyLock<String> =
            LazyLock::new(|| format!("{} AND n.id = $1", fan_out("notifications n", "$2", "$3")));
        self.write(
            &SQL,
            vec![
                id.into(),
                Arg::Text(project_id.map(String::from)),
                Arg::Text(request_id.map(String::from)),
            ],
        )
        .await
    }

    /// A webhook's deliveries, latest first, at most `limit`; only those of `status` if given.
    /// `now` tells which are being sent (claimed by a worker whose claim still runs).
    pub async fn webhook_deliveries(
        &mut self,
        webhook_id: &str,
        status: Option<&str>,
        before_seq: Option<i64>,
        limit: usize,
        now: DateTime<Utc>,
    ) -> DbResult<Vec<WebhookDelivery>> {
        let mut filter = String::new();
        let mut args: Vec<Arg> = vec![webhook_id.into()];
        if let Some(s) = status {
            args.push(s.into());
            filter.push_str(&format!(" AND d.status = ${}", args.len()));
        }
        if let Some(seq) = before_seq {
            args.push(seq.into());
            filter.push_str(&format!(" AND d.seq < ${}", args.len()));
        }
        let limit_at = args.len() + 1;
        args.push((limit as i64).into());
        let sql = format!(
            "SELECT {DELIVERY_COLUMNS} FROM webhook_deliveries d \
             JOIN notifications n ON n.id = d.notification_id \
             WHERE d.webhook_id = $1{filter} ORDER BY d.seq DESC LIMIT ${limit_at}"
        );
        self.fetch_all_as(&sql, args, |row| delivery_from_row(row, now))
            .await
    }

    /// Where delivery `notification_id` of webhook `webhook_id` stands in its list (its
    /// `seq`), if the webhook has it: a page marker.
    pub async fn webhook_delivery_seq(
        &mut self,
        webhook_id: &str,
        notification_id: &str,
    ) -> DbResult<Option<i64>> {
        let row = self
            .fetch_rows(
                "SELECT seq FROM webhook_deliveries WHERE webhook_id = $1 AND notification_id = $2",
                vec![webhook_id.into(), notification_id.into()],
            )
            .await?;
        match row.first() {
            Some(r) => Ok(Some(sqlx::Row::try_get(r, "seq")?)),
            None => Ok(None),
        }
    }

    /// Claims up to `limit` due deliveries for `worker` until `now + claim_for`: each only
    /// if no earlier delivery of the same lease to the same webhook is still pending, so a
    /// subscriber sees a lease's events in order; none of the webhooks of `skip_projects`
    /// (`None`: the every-project ones) nor `skip_webhooks`, which have their share in
    /// flight, nor the silent ones (below) with `skip_silent`. The webhooks take turns, those served least lately first: one delivery of
    /// each (its longest due; the oldest of equally due), then the next of each.
    /// A webhook whose endpoint gave no answer in time at its latest attempt (`silent`) is
    /// tried one delivery at a time until it answers again: none while one is being sent,
    /// its unanswered deliveries' retries first (the earliest, when due; the others wait
    /// while it is not), else its longest due delivery, one per claim. An endpoint that
    /// does not answer holds a slot for the whole timeout of each attempt, and taking all
    /// its due deliveries at once (their retries included, all due together after one
    /// timeout; or new ones once the unanswered had gone dead) held up the other endpoints,
    /// its project's included, for minutes.
    /// Each webhook is asked for its own few candidates through its index of pending
    /// deliveries: one query over every due delivery read the whole backlog at each claim
    /// when the webhooks it belonged to could take none of it (silent, or at their share),
    /// and an endpoint that fails fast is claimed for as often as it answers.
    /// A claim counts as an attempt: one whose worker dies before it reports back was
    /// still made, and a delivery that kills every worker that tries it still runs out of
    /// attempts. `attempts` in the answer is the count before this one.
    /// Of the candidates, in that order, only those `admit` takes (given the webhook's
    /// project, the webhook and whether it is silent) are claimed: the caller's room per project and webhook.
    /// On PostgreSQL, call [`Tx::lock_webhook_claims`] first.
    #[allow(clippy::too_many_arguments)]
    pub async fn claim_webhook_deliveries(
        &mut self,
        now: DateTime<Utc>,
        worker: &str,
        claim_for: Duration,
        limit: usize,
        skip_projects: &[Option<String>],
        skip_webhooks: &[String],
        skip_silent: bool,
        mut admit: impl FnMut(Option<&str>, &str, bool) -> bool + Send,
    ) -> DbResult<Vec<ClaimedDelivery>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        // The webhooks served least lately are asked first, until there are candidates
        // enough (those beyond `limit` are for the ones `admit` turns down), and take turns:
        // each one's longest due first, then each one's next. Taken oldest first over all
        // webhooks, an endpoint's backlog of retries kept a new endpoint of its project
        // waiting until the backlog had had its attempts.
        let scan = limit.saturating_mul(4);
        let mut candidates: Vec<(usize, usize, ClaimedDelivery)> = Vec::new();
        for (turn, hook) in self
            .due_webhooks(now, skip_projects, skip_webhooks, skip_silent)
            .await?
            .iter()
            .enumerate()
        {
            if candidates.len() >= scan {
                break;
            }
            let wanted = if hook.silent { 1 } else { limit };
            let found = self.webhook_candidates(hook, now, wanted).await?;
            candidates.extend(
                found
                    .into_iter()
                    .enumerate()
                    .map(|(rank, c)| (rank, turn, c)),
            );
        }
        candidates.sort_by_key(|(rank, turn, _)| (*rank, *turn));
        let mut claimed: Vec<ClaimedDelivery> = Vec::with_capacity(limit);
        for (_, _, d) in candidates {
            if claimed.len() == limit {
                break;
            }
            if admit(d.project_id.as_deref(), &d.webhook_id, d.silent) {
                claimed.push(d);
            }
        }
        // The webhooks' rows before their deliveries', in the order a webhook's delete
        // takes them (PostgreSQL).
        let mut served: Vec<&str> = claimed.iter().map(|d| d.webhook_id.as_str()).collect();
        served.sort_unstable();
        served.dedup();
        for id in served {
            self.write(
                "UPDATE webhooks SET last_claimed_at = $1 WHERE id = $2",
                vec![to_secs(now).into(), id.into()],
            )
            .await?;
        }
        for d in &claimed {
            self.write(
                "UPDATE webhook_deliveries SET claimed_by = $1, claimed_until = $2, \
                     attempts = attempts + 1 \
                 WHERE webhook_id = $3 AND notification_id = $4",
                vec![
                    worker.into(),
                    (now + claim_for).into(),
                    (&d.webhook_id).into(),
                    (&d.notification_id).into(),
                ],
            )
            .await?;
        }
        Ok(claimed)
    }

    /// The webhooks with a pending delivery due at `now` and not being sent, those claimed
    /// from least lately first (then longest due), but those of `skip_projects` and
    /// `skip_webhooks` and the silent ones with a delivery being sent or an unanswered one
    /// waiting for its retry (all the silent ones with `skip_silent`).
    async fn due_webhooks(
        &mut self,
        now: DateTime<Utc>,
        skip_projects: &[Option<String>],
        skip_webhooks: &[String],
        skip_silent: bool,
    ) -> DbResult<Vec<DueWebhook>> {
        let mut args: Vec<Arg> = vec![to_secs(now).into()];
        let mut skip = String::new();
        if skip_silent {
            skip.push_str(" AND w.silent = 0");
        }
        if !skip_projects.is_empty() {
            skip.push_str(&format!(
                " AND COALESCE(w.project_id, '') NOT IN ({})",
                crate::placeholders(args.len() + 1, skip_projects.len())
            ));
            args.extend(
                skip_projects
                    .iter()
                    .map(|p| Arg::from(p.clone().unwrap_or_default())),
            );
        }
        if !skip_webhooks.is_empty() {
            skip.push_str(&format!(
                " AND w.id NOT IN ({})",
                crate::placeholders(args.len() + 1, skip_webhooks.len())
            ));
            args.extend(skip_webhooks.iter().map(Arg::from));
        }
        // Only webhooks that may give a delivery: one whose due ones are all being sent, or
        // a silent one while it sends one or waits for an unanswered one's retry, would be
        // asked, and stay first in the turns, at every claim, for hours of backoff. A claim
        // that runs holds `claimed_by`; a finished attempt clears it whatever the delivery
        // became, so the status is not asked there (it would lead SQLite to the larger index
        // of pending deliveries). The silent result is written out, as the partial index's
        // condition is.
        let sql = format!(
            "SELECT id, project_id, url, secret, silent FROM ( \
                 SELECT w.id, w.project_id, w.url, w.secret, w.last_claimed_at, \
                     CAST(w.silent AS BIGINT) AS silent, \
                     (SELECT d.next_attempt_at FROM webhook_deliveries d{pending} \
                      WHERE d.webhook_id = w.id AND d.status = 'pending' \
                      AND (d.claimed_until IS NULL OR d.claimed_until < $1) \
                      ORDER BY d.next_attempt_at LIMIT 1) AS due_at \
                 FROM webhooks w \
                 WHERE (w.silent = 0 OR ( \
                     NOT EXISTS (SELECT 1 FROM webhook_deliveries f{claimed} \
                         WHERE f.webhook_id = w.id AND f.claimed_by IS NOT NULL \
                         AND f.claimed_until >= $1) \
                     AND NOT EXISTS (SELECT 1 FROM webhook_deliveries r{silent_index} \
                         WHERE r.webhook_id = w.id AND r.status = 'pending' \
                         AND r.last_result = '{no_answer}' AND r.next_attempt_at > $1))){skip}) due \
             WHERE due_at <= $1 ORDER BY COALESCE(last_claimed_at, 0), due_at, id",
            pending = self.sqlite_hint(" INDEXED BY webhook_deliveries_pending"),
            claimed = self.sqlite_hint(" INDEXED BY webhook_deliveries_claimed"),
            silent_index = self.sqlite_hint(" INDEXED BY webhook_deliveries_silent"),
            no_answer = blazar_core::WEBHOOK_NO_ANSWER,
        );
        let rows = self.fetch_rows(&sql, args).await?;
        rows.iter()
            .map(|row| {
                Ok(DueWebhook {
                    id: row.try_get("id")?,
                    project_id: row.try_get("project_id")?,
                    url: row.try_get("url")?,
                    secret: row.try_get("secret")?,
                    silent: row.try_get::<i64, _>("silent")? != 0,
                })
            })
            .collect()
    }

    /// Up to `wanted` deliveries of `hook` that may be claimed at `now`, longest due first;
    /// for a silent webhook, the one it is to be tried with, if any.
    async fn webhook_candidates(
        &mut self,
        hook: &DueWebhook,
        now: DateTime<Utc>,
        wanted: usize,
    ) -> DbResult<Vec<ClaimedDelivery>> {
        let mut only = String::new();
        let mut args: Vec<Arg> = vec![hook.id.as_str().into(), to_secs(now).into()];
        if hook.silent {
            // Its unanswered deliveries' retries: none until they are all due, then the
            // earliest. The result is written out, as the partial index's condition is
            // (a parameter would not tell SQLite the index holds the rows).
            let sql = format!(
                "SELECT MIN(seq) AS first, MAX(next_attempt_at) AS latest \
                 FROM webhook_deliveries{silent_index} \
                 WHERE webhook_id = $1 AND status = 'pending' AND last_result = '{silent}'",
                silent_index = self.sqlite_hint(" INDEXED BY webhook_deliveries_silent"),
                silent = blazar_core::WEBHOOK_NO_ANSWER,
            );
            let rows = self.fetch_rows(&sql, vec![hook.id.as_str().into()]).await?;
            let retries = match rows.first() {
                Some(row) => (
                    row.try_get::<Option<i64>, _>("first")?,
                    row.try_get::<Option<i64>, _>("latest")?,
                ),
                None => (None, None),
            };
            if let (Some(first), Some(latest)) = retries {
                if latest > to_secs(now) {
                    return Ok(Vec::new());
                }
                args.push(first.into());
                only = format!(" AND d.seq = ${}", args.len());
            }
        }
        args.push((wanted as i64).into());
        let sql = format!(
            "SELECT d.notification_id, n.event_type, d.lease_id, n.payload, n.created_at, \
                 CAST(d.attempts AS BIGINT) AS attempts, d.request_id, d.last_result, \
                 d.claimed_by \
             FROM webhook_deliveries d{pending} \
             JOIN notifications n ON n.id = d.notification_id \
             WHERE d.webhook_id = $1 AND d.status = 'pending' AND d.next_attempt_at <= $2 \
             AND (d.claimed_until IS NULL OR d.claimed_until < $2){only} \
             AND NOT EXISTS (SELECT 1 FROM webhook_deliveries b \
                 WHERE b.webhook_id = d.webhook_id AND b.lease_id = d.lease_id \
                 AND b.status = 'pending' AND b.seq < d.seq) \
             ORDER BY d.next_attempt_at, d.seq LIMIT ${}",
            args.len(),
            pending = self.sqlite_hint(" INDEXED BY webhook_deliveries_pending"),
        );
        // Planned for this webhook's backlog, not from a plan made for another's.
        let rows = self.fetch_rows_replanned(&sql, args).await?;
        rows.iter()
            .map(|row| {
                let payload: String = row.try_get("payload")?;
                Ok(ClaimedDelivery {
                    webhook_id: hook.id.clone(),
                    project_id: hook.project_id.clone(),
                    url: hook.url.clone(),
                    secret: hook.secret.clone(),
                    notification_id: row.try_get("notification_id")?,
                    event_type: row.try_get("event_type")?,
                    lease_id: row.try_get("lease_id")?,
                    payload: serde_json::from_str(&payload).map_err(|_| {
                        DbError::Corrupt(format!("notification payload {payload:?}"))
                    })?,
                    created_at: from_secs(row.try_get("created_at")?)?,
                    attempts: row.try_get("attempts")?,
                    request_id: row.try_get("request_id")?,
                    last_result: row.try_get("last_result")?,
                    unreported: row.try_get::<Option<String>, _>("claimed_by")?.is_some(),
                    silent: hook.silent,
                })
            })
            .collect()
    }

    /// Records how the attempt of a delivery `worker` holds went: `status` is `delivered`,
    /// `dead`, or `pending` with its next attempt at `next_attempt_at`. The claim counted
    /// the attempt in advance; one given up without being sent (`sent` false) is taken
    /// off again. Relative, so that a count reset meanwhile stays reset.
    #[allow(clippy::too_many_arguments)]
    pub async fn record_webhook_attempt(
        &mut self,
        webhook_id: &str,
        notification_id: &str,
        worker: &str,
        now: DateTime<Utc>,
        status: &str,
        sent: bool,
        result: &str,
        next_attempt_at: DateTime<Utc>,
    ) -> DbResult<()> {
        // What the endpoint did at its latest attempt (an attempt given up unsent tells
        // nothing of it): silent until it answers again. The webhook's row first, as a
        // webhook's delete takes it before its deliveries (PostgreSQL), so the two never
        // wait for each other in a circle.
        if sent {
            self.write(
                "UPDATE webhooks SET silent = $1 WHERE id = $2",
                vec![
                    i64::from(result == blazar_core::WEBHOOK_NO_ANSWER).into(),
                    webhook_id.into(),
                ],
            )
            .await?;
        }
        self.write(
            "UPDATE webhook_deliveries SET status = $1, attempts = attempts - $2, \
                 last_attempt_at = $3, last_result = $4, next_attempt_at = $5, \
                 claimed_by = NULL, claimed_until = NULL \
             WHERE webhook_id = $6 AND notification_id = $7 AND claimed_by = $8 \
             AND status = 'pending'",
            vec![
                status.into(),
                i64::from(!sent).into(),
                now.into(),
                result.into(),
                next_attempt_at.into(),
                webhook_id.into(),
                notification_id.into(),
                worker.into(),
            ],
        )
        .await?;
        // The deliveries of the same lease behind it, never tried (they cannot be before it
        // goes), wait as long as it does: not due, a claim's walk through the webhook's
        // pending deliveries by due time stops before them instead of checking each against
        // the one ahead every poll (a member's dead endpoints with a backlog of thousands
        // made every poll slow). Once it is delivered or dead they are due at once.
        let (time, compare) = match status {
            "pending" => (next_attempt_at, "<"),
            _ => (now, ">"),
        };
        // Through the lease's own deliveries (SQLite is told): by due time it walked every
        // pending delivery of the webhook due before the retry, thousands behind a failing
        // endpoint, at each attempt.
        let sql = format!(
            "UPDATE webhook_deliveries{order} SET next_attempt_at = $1 \
             WHERE webhook_id = $2 AND status = 'pending' AND attempts = 0 \
             AND claimed_by IS NULL AND next_attempt_at {compare} $1 \
             AND lease_id = (SELECT h.lease_id FROM webhook_deliveries h \
                             WHERE h.webhook_id = $2 AND h.notification_id = $3) \
             AND seq > (SELECT h.seq FROM webhook_deliveries h \
                        WHERE h.webhook_id = $2 AND h.notification_id = $3)",
            order = self.sqlite_hint(" INDEXED BY webhook_deliveries_order"),
        );
        self.write(
            &sql,
            vec![time.into(), webhook_id.into(), notification_id.into()],
        )
        .await
    }

    /// Gives back the deliveries `worker` has claimed and not reported on (it is shutting
    /// down and stopped sending them), their attempts not counted: they were not finished,
    /// and another process may take them at once instead of when the claims run out.
    /// Answers how many.
    pub async fn release_webhook_claims(&mut self, worker: &str) -> DbResult<u64> {
        let done = self
            .execute(
                "UPDATE webhook_deliveries SET attempts = attempts - 1, \
                     claimed_by = NULL, claimed_until = NULL \
                 WHERE claimed_by = $1 AND status = 'pending' AND attempts > 0",
                vec![worker.into()],
            )
            .await?;
        Ok(done)
    }

    /// Offers a delivery again at `now`, with its attempts counted afresh: `None` if the
    /// webhook has no such delivery, `Some(false)` if a worker is delivering it right now
    /// (its claim runs: resetting it would send it twice and lose that attempt's result).
    pub async fn redeliver_webhook(
        &mut self,
        webhook_id: &str,
        notification_id: &str,
        now: DateTime<Utc>,
    ) -> DbResult<Option<bool>> {
        let done = sqlx::query(
            "UPDATE webhook_deliveries SET status = 'pending', attempts = 0, \
                 next_attempt_at = $1, claimed_by = NULL, claimed_until = NULL \
             WHERE webhook_id = $2 AND notification_id = $3 \
               AND NOT (status = 'pending' AND claimed_until IS NOT NULL \
                        AND claimed_until > $1)",
        )
        .bind(to_secs(now))
        .bind(webhook_id)
        .bind(notification_id)
        .execute(self.conn().await?)
        .await?;
        if done.rows_affected() > 0 {
            return Ok(Some(true));
        }
        let exists = sqlx::query(
            "SELECT 1 AS one FROM webhook_deliveries WHERE webhook_id = $1 AND notification_id = $2",
        )
        .bind(webhook_id)
        .bind(notification_id)
        .fetch_optional(self.conn().await?)
        .await?;
        Ok(exists.map(|_| false))
    }

    /// Pending and dead deliveries over every webhook.
    pub async fn webhook_delivery_counts(&mut self) -> DbResult<DeliveryCounts> {
        let rows = self
            .fetch_rows(
                "SELECT status, CAST(COUNT(*) AS BIGINT) AS n FROM webhook_deliveries \
                 WHERE status IN ('pending', 'dead') GROUP BY status",
                vec![],
            )
            .await?;
        let mut counts = DeliveryCounts::default();
        for row in &rows {
            let status: String = row.try_get("status")?;
            let n: i64 = row.try_get("n")?;
            match status.as_str() {
                "pending" => counts.pending = n,
                _ => counts.dead = n,
            }
        }
        Ok(counts)
    }

    /// Serialises, on PostgreSQL, the claiming of webhook deliveries among replicas, and a
    /// redelivery against a claim.
    pub async fn lock_webhook_claims(&mut self) -> DbResult<()> {
        self.advisory_lock(7_355_611).await
    }
}
