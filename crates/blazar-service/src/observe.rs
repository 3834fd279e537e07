//! What lets people and programs watch the service instead of asking it again and again:
//! counts for monitoring, the lateness of events, waiting on a lease until it reaches a
//! status, and the lease events of the notification outbox read as a stream.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use blazar_core::{LeaseStatus, LeaseView, SequencedNotification};
use blazar_db::PoolUse;
use chrono::{DateTime, Utc};

use crate::{Identity, Service, ServiceResult};

/// Told how late each event ran (the time from when it was due to when its transaction
/// committed).
pub type EventObserver = Arc<dyn Fn(Duration) + Send + Sync>;

/// How often a wait on a lease reads it again when nothing in this process woke it: the
/// change may come from another replica whose signal was lost (`peers.rs`).
pub const WAIT_POLL: Duration = Duration::from_secs(2);

/// What `/metrics` reads from the database at scrape time.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Monitoring {
    /// Leases per status (Blazar's spelling).
    pub leases: Vec<(String, i64)>,
    /// Notifications not published yet.
    pub unsent_notifications: i64,
    /// Outside-world actions pending or running.
    pub open_actions: i64,
    /// Outside-world actions given up on (the lease, if it still exists, shows them).
    pub failed_actions: i64,
    /// Webhook deliveries waiting for their (next) attempt.
    pub webhook_pending: i64,
    /// Webhook deliveries given up on (dead letters).
    pub webhook_dead: i64,
    pub pool: PoolUse,
    /// How far the database's clock is ahead of this replica's (behind when negative), on
    /// PostgreSQL: see [`Service::clock_skew`].
    pub clock_skew: Option<chrono::Duration>,
}

/// A clock further from the database's than this is worth an operator's look: well inside
/// the margin of an action's claim (a minute), far above what NTP keeps.
pub const CLOCK_SKEW_WARNING: chrono::Duration = chrono::Duration::seconds(2);
/// How often a disagreement that lasts is said again.
pub const CLOCK_SKEW_REPEAT: Duration = Duration::from_secs(600);

/// What the clock watch says about one reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ClockVerdict {
    Disagree,
    AgreeAgain,
}

/// The clock watch's memory: when it last said the clocks disagree, while they do.
#[derive(Debug, Default)]
struct ClockWatch {
    warned_at: Option<std::time::Instant>,
}

impl ClockWatch {
    fn observe(&mut self, skew: chrono::Duration, at: std::time::Instant) -> Option<ClockVerdict> {
        if skew.abs() > CLOCK_SKEW_WARNING {
            if self
                .warned_at
                .is_some_and(|t| at.duration_since(t) < CLOCK_SKEW_REPEAT)
            {
                return None;
            }
            self.warned_at = Some(at);
            return Some(ClockVerdict::Disagree);
        }
        self.warned_at.take().map(|_| ClockVerdict::AgreeAgain)
    }
}

/// A reader of the lease events after a point in the outbox, for one caller. Places in the
/// outbox are final once readable (`Tx::sequence_notifications`), so reading after the
/// last place delivered misses nothing and repeats nothing.
pub struct LeaseEvents {
    identity: Identity,
    /// `None`: every project's (an admin who asked for all).
    project: Option<String>,
    cursor: i64,
}

impl LeaseEvents {
    /// The sequence number of the last event delivered (or where reading started).
    pub fn cursor(&self) -> i64 {
        self.cursor
    }

    /// Whether the event is one of the projects this reader follows.
    fn sees(&self, row: &SequencedNotification) -> bool {
        self.project
            .as_ref()
            .is_none_or(|p| row.notification.payload_text("project_id") == Some(p.as_str()))
    }
}

/// Why an event stream looks at the outbox again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Look {
    /// It just opened, or a commit of this process changed a lease: it must see that commit.
    Changed,
    /// Its poll came round (another replica's commits): a read of a moment ago will do.
    Polled,
}

/// Rows read at once by an event stream.
const EVENT_BATCH: usize = 200;

/// Rows of the outbox a process keeps for its event streams once read (a few MB at most).
const TAIL_ROWS: usize = 2048;

/// How stale the outbox tail may be for a stream that looks again only because its poll
/// came round (for other replicas' events): polls of many streams share one read a second.
const TAIL_POLL_STALENESS: Duration = Duration::from_secs(1);

/// The newest rows of the outbox, read once for all of this process's event streams. Every
/// change of a lease wakes every stream; each reading the outbox for itself cost a read
/// transaction (and on PostgreSQL a sequencing write) per stream per change, so a thousand
/// open streams made every lease create wait behind a thousand reads. A stream whose cursor
/// is inside the tail takes its rows from memory; one further behind (resuming from an old
/// id, or after a burst longer than the tail) reads the database itself until it catches up.
#[derive(Default)]
pub(crate) struct OutboxTail {
    /// One read of the outbox at a time: a stream that waited for another's read uses it.
    reading: tokio::sync::Mutex<()>,
    rows: std::sync::RwLock<TailRows>,
}

#[derive(Default)]
struct TailRows {
    /// `(floor, last)`: the tail holds every row with `floor < seq <= last`, in order.
    /// `None` until the first read.
    span: Option<(i64, i64)>,
    rows: VecDeque<SequencedNotification>,
    /// When the last read began: it saw every commit made before then.
    read_at: Option<Instant>,
}

impl OutboxTail {
    fn rows(&self) -> std::sync::RwLockReadGuard<'_, TailRows> {
        // The rows are replaced whole under the lock: a panic elsewhere cannot leave them
        // half-written.
        self.rows
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The events after `reader`'s cursor that it may see, moving the cursor to the end of
    /// the tail; `None` when the cursor is behind the tail.
    fn take(&self, reader: &mut LeaseEvents) -> Option<Vec<SequencedNotification>> {
        let tail = self.rows();
        let (floor, last) = tail.span?;
        if reader.cursor < floor {
            return None;
        }
        let from = tail.rows.partition_point(|row| row.seq <= reader.cursor);
        let events = tail
            .rows
            .range(from..)
            .filter(|row| reader.sees(row))
            .cloned()
            .collect();
        reader.cursor = reader.cursor.max(last);
        Some(events)
    }

    /// Adds what a read found after the tail's end (`fresh`, ending at `last`), or starts
    /// the tail over at `last` when the read did not reach the end (`fresh` is `None`).
    fn extend(&self, fresh: Option<Vec<SequencedNotification>>, last: i64, read_at: Instant) {
        let mut tail = self
            .rows
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let floor = match (fresh, tail.span) {
            (Some(fresh), Some((floor, _))) => {
                tail.rows.extend(fresh);
                floor
            }
            _ => {
                tail.rows.clear();
                last
            }
        };
        let mut floor = floor;
        while tail.rows.len() > TAIL_ROWS {
            if let Some(row) = tail.rows.pop_front() {
                floor = floor.max(row.seq);
            }
        }
        tail.span = Some((floor, last));
        tail.read_at = Some(read_at);
    }
}

/// Batches one read of a member's stream goes through at most while none of their events
/// is the member's project's: 20,000 rows, then the stream reads again at its next wake.
const BATCHES_PER_READ: usize = 100;

impl Service {
    /// Reports how late each event ran to `observer`.
    pub fn with_event_observer(mut self, observer: EventObserver) -> Self {
        self.event_observer = Some(observer);
        self
    }

    pub(crate) fn observe_event_lag(&self, now: DateTime<Utc>, due: DateTime<Utc>) {
        if let Some(observer) = &self.event_observer {
            observer((now - due).to_std().unwrap_or_default());
        }
    }

    /// Tells waiters in this process that a lease may have changed.
    pub(crate) fn announce_lease_change(&self) {
        self.lease_changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// A receiver that sees every commit of this process that changed a lease.
    pub fn lease_changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.lease_changes.subscribe()
    }

    /// The counts `/metrics` shows, in one read transaction.
    pub async fn monitoring(&self) -> ServiceResult<Monitoring> {
        let (leases, unsent_notifications, actions, webhooks) = in_tx!(self, read, |tx| {
            Ok((
                tx.lease_status_counts().await?,
                tx.unsent_notifications().await?,
                tx.action_gauges().await?,
                tx.webhook_delivery_counts().await?,
            ))
        })?;
        let clock_skew = self.clock_skew().await?;
        Ok(Monitoring {
            clock_skew,
            leases,
            unsent_notifications,
            open_actions: actions.open,
            failed_actions: actions.failed,
            webhook_pending: webhooks.pending,
            webhook_dead: webhooks.dead,
            pool: self.store.pool_use(),
        })
    }

    /// How far the database's clock is ahead of this replica's (behind when negative), on
    /// PostgreSQL; `None` on SQLite, whose clock is the process's own. Replicas judge
    /// claims and due events by their own clocks: two that disagree by more than a claim's
    /// margin could both take one action, and a fast one starts leases early. The read's
    /// round trip is split evenly, so the figure is good to half of it.
    pub async fn clock_skew(&self) -> ServiceResult<Option<chrono::Duration>> {
        in_tx!(self, read, |tx| {
            let before = self.clock.now();
            let database = tx.database_clock().await?;
            let after = self.clock.now();
            Ok(database.map(|database| database - (before + (after - before) / 2)))
        })
    }

    /// Compares this replica's clock with the database's every `every` until `shutdown`,
    /// on PostgreSQL (on SQLite it returns at once), and says so in the log when they
    /// disagree by more than [`CLOCK_SKEW_WARNING`]: again every [`CLOCK_SKEW_REPEAT`] while
    /// they do, and once when they agree again.
    pub async fn run_clock_watch(&self, every: Duration, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut watch = ClockWatch::default();
        loop {
            match self.clock_skew().await {
                Ok(None) => return,
                Ok(Some(skew)) => match watch.observe(skew, std::time::Instant::now()) {
                    Some(ClockVerdict::Disagree) => tracing::warn!(
                        skew_ms = skew.num_milliseconds(),
                        "this replica's clock and the database's disagree (skew_ms: how far the \
                         database is ahead); replicas judge claims and due events by their own \
                         clocks: keep them synchronised (NTP)"
                    ),
                    Some(ClockVerdict::AgreeAgain) => tracing::info!(
                        skew_ms = skew.num_milliseconds(),
                        "this replica's clock agrees with the database's again"
                    ),
                    None => {}
                },
                Err(e) => {
                    tracing::debug!(error = %e, "clock watch: cannot read the database's clock")
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = &mut shutdown => return,
            }
        }
    }

    /// Waits until lease `id` is `target`, can no longer become it, or `timeout` passes,
    /// and answers the lease as it is then (as `get_lease` would; a lease deleted meanwhile
    /// is a 404). Woken by this process's commits, and reads the lease every
    /// [`WAIT_POLL`] for changes other replicas make.
    pub async fn wait_for_lease(
        &self,
        identity: &Identity,
        id: &str,
        target: LeaseStatus,
        timeout: Duration,
    ) -> ServiceResult<LeaseView> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut changes = self.lease_changes();
        loop {
            // Marked seen before reading, so that a change committed after this read wakes
            // the wait below.
            changes.borrow_and_update();
            let view = self.get_lease(identity, id).await?;
            if !view.lease.status.can_still_become(target) || view.lease.status == target {
                return Ok(view);
            }
            let poll = tokio::time::Instant::now() + WAIT_POLL;
            tokio::select! {
                _ = changes.changed() => {}
                () = tokio::time::sleep_until(poll.min(deadline)) => {}
            }
            if tokio::time::Instant::now() >= deadline {
                return self.get_lease(identity, id).await;
            }
        }
    }

    /// Gives committed notifications their places in the outbox's order (PostgreSQL; on
    /// SQLite they have them at commit, and no write transaction is taken).
    pub(crate) async fn sequence_notifications(&self) -> ServiceResult<()> {
        if self.store.backend() == blazar_db::Backend::Postgres {
            in_tx!(self, write, |tx| {
                tx.sequence_notifications().await?;
                Ok(())
            })?;
        }
        Ok(())
    }

    /// A reader of the lease events `identity` may see, after outbox position `after`
    /// (`None`: from now on). Members see their project's; admins every project's, or
    /// `project`'s when they name one.
    pub async fn lease_events(
        &self,
        identity: &Identity,
        after: Option<i64>,
        project: Option<String>,
    ) -> ServiceResult<LeaseEvents> {
        self.authorize_own("blazar:leases:get", identity)?;
        let project = if self.is_admin(identity) {
            project
        } else {
            Some(identity.project_id.clone())
        };
        self.sequence_notifications().await?;
        let last = in_tx!(self, read, |tx| { Ok(tx.last_notification_seq().await?) })?;
        // An id past the last event (a client that kept ids across a restore of the
        // database) reads on from now, rather than waiting silently for the outbox to
        // reach it.
        let cursor = match after {
            Some(after) => after.clamp(0, last),
            None => last,
        };
        Ok(LeaseEvents {
            identity: identity.clone(),
            project,
            cursor,
        })
    }

    /// Reads the outbox after the tail's end, unless a read that began at or after `fresh`
    /// has already (one read at a time; the others wait for it and use it).
    async fn read_tail(&self, fresh: Instant) -> ServiceResult<()> {
        let tail = &self.outbox_tail;
        let _reading = tail.reading.lock().await;
        let after = {
            let rows = tail.rows();
            if rows.read_at.is_some_and(|at| at >= fresh) {
                return Ok(());
            }
            rows.span.map(|(_, last)| last)
        };
        let read_at = Instant::now();
        self.sequence_notifications().await?;
        let (fresh_rows, last) = in_tx!(self, read, |tx| {
            let Some(mut cursor) = after else {
                return Ok((None, tx.last_notification_seq().await?));
            };
            let mut rows = Vec::new();
            while rows.len() < TAIL_ROWS {
                let batch = tx.notifications_after(cursor, EVENT_BATCH).await?;
                let caught_up = batch.len() < EVENT_BATCH;
                cursor = batch.last().map_or(cursor, |row| row.seq.max(cursor));
                rows.extend(batch);
                if caught_up {
                    return Ok((Some(rows), cursor));
                }
            }
            // More came than the tail holds: it starts over at the outbox's end, and the
            // streams behind it read the rest themselves.
            Ok((None, tx.last_notification_seq().await?))
        })?;
        tail.extend(fresh_rows, last, read_at);
        Ok(())
    }

    /// The next lease events of `reader`, in outbox order (empty when there are none yet).
    /// `look` says how fresh the answer must be.
    pub async fn next_lease_events(
        &self,
        reader: &mut LeaseEvents,
        look: Look,
    ) -> ServiceResult<Vec<SequencedNotification>> {
        // Permission may have been withdrawn since the stream opened.
        self.authorize_own("blazar:leases:get", &reader.identity)?;
        let now = Instant::now();
        let fresh = match look {
            Look::Changed => now,
            Look::Polled => now.checked_sub(TAIL_POLL_STALENESS).unwrap_or(now),
        };
        self.read_tail(fresh).await?;
        if let Some(events) = self.outbox_tail.take(reader) {
            return Ok(events);
        }
        // Behind the tail: the stream reads the outbox itself.
        self.sequence_notifications().await?;
        let mut events = Vec::new();
        // Other projects' events are passed over here: a member's stream reads on through
        // them at once (up to a bound of work per call) instead of one batch per wait.
        for _ in 0..BATCHES_PER_READ {
            let rows = in_tx!(self, read, |tx| {
                Ok(tx.notifications_after(reader.cursor, EVENT_BATCH).await?)
            })?;
            let caught_up = rows.len() < EVENT_BATCH;
            for row in rows {
                reader.cursor = reader.cursor.max(row.seq);
                if reader.sees(&row) {
                    events.push(row);
                }
            }
            if caught_up || !events.is_empty() {
                break;
            }
        }
        Ok(events)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(seq: i64, project: &str) -> SequencedNotification {
        SequencedNotification {
            seq,
            notification: blazar_core::Notification {
                id: format!("n{seq}"),
                event_type: "lease.create".into(),
                lease_id: None,
                payload: serde_json::json!({"project_id": project}),
                created_at: chrono::DateTime::UNIX_EPOCH,
                request_id: None,
            },
        }
    }

    fn reader(project: Option<&str>, cursor: i64) -> LeaseEvents {
        LeaseEvents {
            identity: Identity {
                user_id: "u".into(),
                project_id: project.unwrap_or("admin").into(),
                roles: vec![],
            },
            project: project.map(str::to_string),
            cursor,
        }
    }

    fn seqs(events: &[SequencedNotification]) -> Vec<i64> {
        events.iter().map(|e| e.seq).collect()
    }

    #[test]
    fn the_outbox_tail_serves_readers_inside_it_and_sends_the_others_to_the_database() {
        let tail = OutboxTail::default();
        let mut early = reader(None, 3);
        assert_eq!(tail.take(&mut early), None, "nothing read yet");
        let at = Instant::now();
        // The first read only finds where the outbox ends.
        tail.extend(None, 10, at);
        tail.extend(Some(vec![row(11, "a"), row(13, "b"), row(14, "a")]), 14, at);
        assert_eq!(tail.take(&mut early), None, "behind the tail");
        assert_eq!(early.cursor, 3);

        let mut all = reader(None, 10);
        assert_eq!(seqs(&tail.take(&mut all).unwrap()), [11, 13, 14]);
        assert_eq!(all.cursor, 14);
        assert_eq!(seqs(&tail.take(&mut all).unwrap()), Vec::<i64>::new());
        let mut a = reader(Some("a"), 11);
        assert_eq!(seqs(&tail.take(&mut a).unwrap()), [14]);
        assert_eq!(a.cursor, 14);
        // Rows the reader has seen (read from the database past the tail) are not repeated.
        let mut ahead = reader(None, 20);
        assert_eq!(seqs(&tail.take(&mut ahead).unwrap()), Vec::<i64>::new());
        assert_eq!(ahead.cursor, 20);
        // Events other projects follow move the cursor on all the same.
        let mut b = reader(Some("b"), 13);
        tail.extend(Some(vec![row(15, "a")]), 15, at);
        assert_eq!(seqs(&tail.take(&mut b).unwrap()), Vec::<i64>::new());
        assert_eq!(b.cursor, 15);
    }

    #[test]
    fn the_outbox_tail_keeps_its_newest_rows_and_starts_over_after_a_read_it_could_not_finish() {
        let tail = OutboxTail::default();
        let at = Instant::now();
        tail.extend(None, 0, at);
        let many: Vec<SequencedNotification> =
            (1..=TAIL_ROWS as i64 + 5).map(|s| row(s, "a")).collect();
        tail.extend(Some(many), TAIL_ROWS as i64 + 5, at);
        assert_eq!(
            tail.take(&mut reader(None, 4)),
            None,
            "rows 1-5 left the tail"
        );
        let mut from_five = reader(None, 5);
        let events = tail.take(&mut from_five).unwrap();
        assert_eq!(events.len(), TAIL_ROWS);
        assert_eq!(events.first().map(|e| e.seq), Some(6));

        // A read that stopped short: readers inside the old tail read the rest themselves.
        let last = TAIL_ROWS as i64 + 5;
        tail.extend(None, last + 9_000, at);
        assert_eq!(tail.take(&mut reader(None, last)), None);
        let mut now = reader(None, last + 9_000);
        assert_eq!(seqs(&tail.take(&mut now).unwrap()), Vec::<i64>::new());
    }

    #[test]
    fn the_clock_watch_warns_on_disagreement_again_after_a_while_and_once_on_agreement() {
        let start = std::time::Instant::now();
        let at = |s: u64| start + Duration::from_secs(s);
        let ms = chrono::Duration::milliseconds;
        let mut watch = ClockWatch::default();
        let readings = [
            (0, ms(150), None),
            (60, ms(-2_500), Some(ClockVerdict::Disagree)),
            (120, ms(3_000), None),
            (660, ms(2_100), Some(ClockVerdict::Disagree)),
            (720, ms(2_000), Some(ClockVerdict::AgreeAgain)),
            (780, ms(0), None),
            (840, ms(-40_000), Some(ClockVerdict::Disagree)),
        ];
        for (second, skew, expected) in readings {
            assert_eq!(
                watch.observe(skew, at(second)),
                expected,
                "at {second} s, {skew}"
            );
        }
    }
}
