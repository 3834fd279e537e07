//! Notifications: Blazar's lease notifications (`lease.create`, `lease.update`,
//! `lease.delete`, `lease.event.*`) and ours (healing's, and `lease.create.refused` /
//! `lease.update.refused` for usage enforcement and quotas), written to the outbox in the
//! transaction of the change they describe (a refusal, which changes nothing, in its own), and published after commit by one publisher at
//! a time per notification (claimed in the database), in order per lease, at least once.
//!
//! The service knows Blazar's payload, which is the contract consumers read; how a
//! notification travels (oslo.messaging over RabbitMQ) is the [`NotificationSink`]'s.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use blazar_core::Notification;
use blazar_core::{Event, Lease, LeaseStatus, LeaseView, Reservation};
use blazar_db::Tx;
use chrono::{DateTime, Utc};
use serde_json::{Map, Value, json};

use crate::{Identity, Service, ServiceError, ServiceResult, new_id};

/// Where published notifications go (a message broker). `publish` answers once the
/// notification is safely with it (a publisher confirm), or an error saying why not; the
/// notification is then offered again later, with the ones after it of the same lease.
#[async_trait]
pub trait NotificationSink: Send + Sync {
    async fn publish(&self, notification: &Notification) -> Result<(), String>;
}

/// `2030-01-01T10:00:00.000000`, as Blazar's notifications show lease and event dates.
fn format_t(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%dT%H:%M:%S%.6f").to_string()
}

/// `2030-01-01 10:00:00` (microseconds only when there are some), as Blazar shows
/// `created_at` and `updated_at`.
fn format_space(t: DateTime<Utc>) -> String {
    if t.timestamp_subsec_micros() == 0 {
        t.format("%Y-%m-%d %H:%M:%S").to_string()
    } else {
        t.format("%Y-%m-%d %H:%M:%S%.6f").to_string()
    }
}

fn reservation_payload(r: &Reservation) -> Value {
    let mut m = Map::new();
    m.insert("id".into(), json!(r.id));
    m.insert("lease_id".into(), json!(r.lease_id));
    m.insert("resource_id".into(), json!(r.resource_id));
    m.insert("resource_type".into(), json!(r.resource_type()));
    m.insert("status".into(), json!(r.status.to_string()));
    m.insert("missing_resources".into(), json!(r.missing_resources));
    m.insert("resources_changed".into(), json!(r.resources_changed));
    m.insert("created_at".into(), json!(format_space(r.created_at)));
    m.insert("updated_at".into(), json!(r.updated_at.map(format_space)));
    m.extend(r.spec.fields());
    Value::Object(m)
}

fn event_payload(e: &Event) -> Value {
    json!({
        "id": e.id,
        "lease_id": e.lease_id,
        "event_type": e.event_type.to_string(),
        "time": format_t(e.time),
        "status": e.status.to_string(),
        "created_at": format_space(e.created_at),
        "updated_at": e.updated_at.map(format_space),
    })
}

/// Blazar's lease notification payload (`format_lease_payload`): the lease as its API
/// shows it, with `lease_id` for `id`.
pub fn lease_payload(view: &LeaseView) -> Value {
    let l = &view.lease;
    json!({
        "lease_id": l.id,
        "user_id": l.user_id,
        "project_id": l.project_id,
        "trust_id": l.trust_id,
        "start_date": format_t(l.start),
        "end_date": format_t(l.end),
        "status": l.status.to_string(),
        "reservations": view.reservations.iter().map(reservation_payload).collect::<Vec<_>>(),
        "events": view.events.iter().map(event_payload).collect::<Vec<_>>(),
        "name": l.name,
        "created_at": format_space(l.created_at),
        "updated_at": l.updated_at.map(format_space),
        "degraded": l.degraded,
    })
}

/// What a run of the publisher did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PublishReport {
    pub sent: usize,
    /// Why publishing stopped early, if it did (the broker is away, say).
    pub error: Option<String>,
}

/// Notifications claimed at once; a claim is short, so a publisher that dies leaves little
/// waiting for its claim to expire.
const CLAIM_BATCH: usize = 100;

/// How long a claim lasts: longer than publishing a batch takes when the broker answers.
const CLAIM_FOR_SECONDS: i64 = 60;

/// How long a publisher goes on sending what it claimed: half the claim, so that the last
/// send (bounded by the sink's own timeout, 10 s for the broker) and the mark that it was
/// sent are done before the claim runs out.
const PUBLISH_WITHIN: std::time::Duration =
    std::time::Duration::from_secs(CLAIM_FOR_SECONDS as u64 / 2);

/// Every notification type the service writes: what a webhook may ask for.
pub(crate) const EVENT_TYPES: &[&str] = &[
    "lease.create",
    "lease.update",
    "lease.delete",
    "lease.event.start_lease",
    "lease.event.end_lease",
    "lease.event.before_end_lease",
    "lease.event.before_end_lease.stop",
    "lease.degraded",
    "lease.healed",
    "reservation.resources_changed",
    "lease.create.refused",
    "lease.update.refused",
];

/// A new outbox row of type `event_type` (one of `EVENT_TYPES`), caused by the request
/// being served, if any.
pub(crate) fn new_notification(
    event_type: &str,
    lease_id: Option<String>,
    payload: Value,
    created_at: DateTime<Utc>,
) -> Notification {
    debug_assert!(EVENT_TYPES.contains(&event_type), "{event_type}");
    Notification {
        id: new_id(),
        event_type: event_type.to_string(),
        lease_id,
        payload,
        created_at,
        request_id: crate::current_request_id(),
    }
}

impl Service {
    /// Writes the lease notification `event_type` (`lease.create`, ...) with `view` as it is
    /// now, in the transaction making the change.
    pub(crate) async fn notify_lease_view(
        &self,
        tx: &mut Tx,
        event_type: &str,
        view: &LeaseView,
    ) -> ServiceResult<()> {
        tx.insert_notification(&new_notification(
            event_type,
            Some(view.lease.id.clone()),
            lease_payload(view),
            self.now(),
        ))
        .await?;
        Ok(())
    }

    /// Writes `lease.event.<event>` for each event that just finished, with the lease as
    /// the caller holds it (read in `tx` and kept in step with what it did).
    pub(crate) async fn notify_events_done(
        &self,
        tx: &mut Tx,
        view: &LeaseView,
        finished: &[blazar_core::EventType],
    ) -> ServiceResult<()> {
        for event in finished {
            self.notify_lease_view(tx, &format!("lease.event.{event}"), view)
                .await?;
        }
        Ok(())
    }

    /// Writes `lease.delete` with the lease as Blazar shows it while deleting it.
    pub(crate) async fn notify_lease_deleted(
        &self,
        tx: &mut Tx,
        lease: &Lease,
        reservations: Vec<Reservation>,
        events: Vec<Event>,
    ) -> ServiceResult<()> {
        let mut view = LeaseView {
            lease: lease.clone(),
            reservations,
            events,
        };
        view.lease.status = LeaseStatus::Deleting;
        view.lease.updated_at = Some(self.now());
        self.notify_lease_view(tx, "lease.delete", &view).await
    }

    /// Writes `lease.create.refused` or `lease.update.refused` (ours) when a usage-enforcement
    /// filter or a quota refused the request, so that operators and accounting hear of what
    /// was turned away, not only of what was granted. Nothing was written by the refused
    /// request, so the notification goes in a transaction of its own; failing to write it
    /// leaves the refusal as it was.
    pub(crate) async fn notify_refusal(
        &self,
        identity: &Identity,
        event_type: &str,
        lease_id: Option<&str>,
        lease_name: Option<&str>,
        error: &ServiceError,
    ) {
        let ServiceError::Refused(refused) = error else {
            return;
        };
        let filters: Vec<&str> = refused
            .reasons
            .iter()
            .filter_map(|r| r.filter.as_deref())
            .collect();
        let quotas: Vec<Value> = refused
            .reasons
            .iter()
            .filter_map(|r| r.quota.as_ref())
            .map(|q| {
                json!({
                    "name": q.kind.as_str(),
                    "limit": q.limit,
                    "in_use": q.in_use,
                    "requested": q.requested,
                })
            })
            .collect();
        if filters.is_empty() && quotas.is_empty() {
            return;
        }
        let payload = json!({
            "lease_id": lease_id,
            "lease_name": lease_name,
            "project_id": identity.project_id,
            "user_id": identity.user_id,
            "message": refused.message,
            "filters": filters,
            "quotas": quotas,
        });
        let row = new_notification(
            event_type,
            lease_id.map(str::to_string),
            payload,
            self.now(),
        );
        let written = in_tx!(self, write, |tx| {
            let mut row = row.clone();
            // Filed under the lease's project (an admin may be refused an update of another
            // project's lease): its webhooks and event streams hear of it, the caller's
            // project's do not.
            if let Some(id) = lease_id
                && let Some(lease) = tx.get_lease(id).await?
            {
                row.payload["project_id"] = json!(lease.project_id);
            }
            tx.insert_notification(&row).await?;
            Ok(())
        });
        match written {
            Ok(()) => self.wake_publisher(),
            Err(e) => tracing::warn!(error = %e, event_type, "refusal notification not written"),
        }
    }

    /// Wakes this process's publisher: notifications were committed.
    pub(crate) fn wake_publisher(&self) {
        self.publish_wake.notify_one();
    }

    /// Publishes every unsent notification this process may claim now, through `sink`,
    /// until none is left or the sink fails (the rest wait for the next run).
    pub async fn publish_notifications(
        &self,
        sink: &dyn NotificationSink,
    ) -> ServiceResult<PublishReport> {
        self.publish_until(sink, &AtomicBool::new(false)).await
    }

    /// [`Self::publish_notifications`], stopping early once `stop` is set: what is claimed
    /// and not sent yet is given back at once (unclaimed) for another process to send, so
    /// that a process asked to stop does not first publish the whole outbox.
    async fn publish_until(
        &self,
        sink: &dyn NotificationSink,
        stop: &AtomicBool,
    ) -> ServiceResult<PublishReport> {
        let mut report = PublishReport::default();
        loop {
            if stop.load(Ordering::SeqCst) {
                return Ok(report);
            }
            let now = self.now();
            let claimed = in_tx!(self, write, |tx| {
                tx.lock_notification_claims().await?;
                tx.sequence_notifications().await?;
                Ok(tx
                    .claim_notifications(
                        now,
                        &self.worker_id,
                        chrono::Duration::seconds(CLAIM_FOR_SECONDS),
                        CLAIM_BATCH,
                    )
                    .await?)
            })?;
            if claimed.is_empty() {
                return Ok(report);
            }
            let claimed_at = std::time::Instant::now();
            let mut sent = Vec::with_capacity(claimed.len());
            let mut failure = None;
            // One at a time, in order: a lease's later notification never overtakes one
            // that failed.
            for n in &claimed {
                // Past half the claim, the rest is given back: a slow broker must not let
                // the claim run out while this publisher still sends, or another replica
                // would claim and send the same notifications again.
                if claimed_at.elapsed() >= PUBLISH_WITHIN || stop.load(Ordering::SeqCst) {
                    break;
                }
                match sink.publish(n).await {
                    Ok(()) => sent.push(n.id.clone()),
                    Err(e) => {
                        failure = Some(e);
                        break;
                    }
                }
            }
            let unsent: Vec<String> = claimed
                .iter()
                .skip(sent.len())
                .map(|n| n.id.clone())
                .collect();
            let now = self.now();
            in_tx!(self, write, |tx| {
                tx.mark_notifications_sent(&sent, now).await?;
                tx.release_notifications(&unsent, &self.worker_id).await?;
                Ok(())
            })?;
            report.sent += sent.len();
            if let Some(e) = failure {
                report.error = Some(e);
                return Ok(report);
            }
        }
    }

    /// Publishes notifications through `sink` until `shutdown`: when a commit wrote some,
    /// at least every `poll` (other replicas' notifications, expired claims), and after a
    /// failure with a doubling pause (1 s to 1 min) while the sink stays away.
    pub async fn run_publisher(
        &self,
        sink: &dyn NotificationSink,
        poll: std::time::Duration,
        shutdown: impl Future<Output = ()>,
    ) {
        tokio::pin!(shutdown);
        let mut backoff = std::time::Duration::from_secs(1);
        let mut failing = false;
        let stop = AtomicBool::new(false);
        loop {
            // A stop asked for during a run ends it after the notification being sent, and
            // the run gives back the rest of its claim.
            let run = self.publish_until(sink, &stop);
            tokio::pin!(run);
            let outcome = tokio::select! {
                outcome = &mut run => outcome,
                () = &mut shutdown => {
                    stop.store(true, Ordering::SeqCst);
                    if let Err(e) = run.await {
                        tracing::warn!(error = %e, "could not give back the notifications claimed");
                    }
                    break;
                }
            };
            let wait = match outcome {
                Ok(PublishReport { error: None, sent }) => {
                    if failing {
                        tracing::info!(sent, "notifications flowing again");
                    }
                    failing = false;
                    backoff = std::time::Duration::from_secs(1);
                    poll
                }
                Ok(PublishReport {
                    error: Some(error),
                    sent,
                }) => {
                    if !failing {
                        tracing::warn!(error = %error, sent, "could not publish notifications; they wait in the outbox");
                    }
                    failing = true;
                    let wait = backoff;
                    backoff = (backoff * 2).min(std::time::Duration::from_secs(60));
                    wait
                }
                Err(e) => {
                    tracing::error!(error = %e, "could not read the notification outbox");
                    poll
                }
            };
            tokio::select! {
                _ = self.publish_wake.notified(), if !failing => {}
                _ = tokio::time::sleep(wait) => {}
                _ = &mut shutdown => break,
            }
        }
        tracing::info!("notification publisher stopped");
    }

    /// How many notifications wait in the outbox.
    pub async fn unsent_notifications(&self) -> ServiceResult<i64> {
        in_tx!(self, read, |tx| { Ok(tx.unsent_notifications().await?) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn dates_are_blazars() {
        let Some(t) = Utc.with_ymd_and_hms(2030, 1, 1, 10, 5, 0).single() else {
            panic!("valid date");
        };
        assert_eq!(format_t(t), "2030-01-01T10:05:00.000000");
        assert_eq!(format_space(t), "2030-01-01 10:05:00");
        let precise = t + chrono::Duration::microseconds(4_321);
        assert_eq!(format_t(precise), "2030-01-01T10:05:00.004321");
        assert_eq!(format_space(precise), "2030-01-01 10:05:00.004321");
    }
}
