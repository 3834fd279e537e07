//! The event scheduler: runs due `start_lease`, `end_lease` and `before_end_lease` events.
//!
//! Due events run in write transactions (up to 50 each, in time order) that claim them,
//! apply their effects and mark them done, so an event runs exactly once even with several
//! manager processes or a crash half-way: a rolled-back event is still due and runs again,
//! and one that fails whatever is tried is set aside as ERROR with its lease (Blazar's
//! handling of an event whose handler raised) so the events behind it run. One scheduler at
//! a time runs events (a transaction-scoped advisory lock on PostgreSQL, the single writer on SQLite),
//! which keeps them in global time order across processes, so back-to-back leases hand a
//! resource over end-before-start.

use std::collections::HashMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;

use blazar_core::reservation::BeforeEnd;
use blazar_core::{ActionKind, ActionPurpose, EventStatus, EventType, ReservationStatus};
use blazar_core::{Allocation, Event, Lease, LeaseView, Reservation};
use blazar_db::Tx;
use chrono::{DateTime, Utc};
use futures::FutureExt;

use crate::actions::settle_lease_status;
use crate::leases::{group_by_lease, lock_views};
use crate::{Service, ServiceError, ServiceResult};

/// What one tick did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TickReport {
    pub executed: usize,
    pub failed: usize,
}

/// How a lease's start or end moves its reservations (see [`Service::hand_over`]).
struct HandOver {
    kind: ActionKind,
    purpose: ActionPurpose,
    /// Which reservations take part, by status.
    applies: fn(ReservationStatus) -> bool,
    /// The status a reservation that holds nothing moves to, if any.
    settled: fn(ReservationStatus) -> Option<ReservationStatus>,
}

/// A start hands over what each pending reservation holds; one that holds nothing is
/// active at once.
const START: HandOver = HandOver {
    kind: ActionKind::Start,
    purpose: ActionPurpose::LeaseStart,
    applies: |status| status == ReservationStatus::Pending,
    settled: |_| Some(ReservationStatus::Active),
};

/// An end takes back whatever may have been handed over, even by a start that failed
/// half-way (a take-back of something never handed over is a no-op); a reservation that
/// holds nothing is deleted at once, unless it is in ERROR.
const END: HandOver = HandOver {
    kind: ActionKind::Stop,
    purpose: ActionPurpose::LeaseEnd,
    applies: |status| status != ReservationStatus::Deleted,
    settled: |status| (status != ReservationStatus::Error).then_some(ReservationStatus::Deleted),
};

/// A lease as a tick's transaction has it: read once for a batch of due events (a few
/// queries for the whole batch, not several per event), and kept in step with what the
/// events do to it, since two events of one lease may run in one batch.
struct LeaseState {
    view: LeaseView,
    allocations: Vec<Allocation>,
}

/// Locks the leases `ids` (in id order) and reads them with their events, reservations
/// and allocations. Leases that are gone are left out.
async fn load_states(tx: &mut Tx, ids: &[&str]) -> ServiceResult<HashMap<String, LeaseState>> {
    let views = lock_views(tx, ids).await?;
    let mut allocations = group_by_lease(tx.allocations_of_leases(ids).await?, |a| &a.lease_id);
    Ok(views
        .into_iter()
        .map(|view| {
            let id = view.lease.id.clone();
            let allocations = allocations.remove(&id).unwrap_or_default();
            (id, LeaseState { view, allocations })
        })
        .collect())
}

/// The allocations of `allocations` that reservation `reservation_id` holds.
fn held(allocations: &[Allocation], reservation_id: &str) -> Vec<Allocation> {
    allocations
        .iter()
        .filter(|a| a.reservation_id == reservation_id)
        .cloned()
        .collect()
}

/// What running one event did.
struct Ran {
    /// When the events it ran along with itself were due: a before-end that waited for
    /// the start runs with the end.
    along: Vec<DateTime<Utc>>,
    done: DoneLine,
}

/// The log line of an event that ran, written once its transaction committed (a crash
/// before the commit runs it again, and an operator would read it done twice).
struct DoneLine {
    lease_id: String,
    kind: EventType,
    status: blazar_core::LeaseStatus,
    lag_ms: i64,
}

impl DoneLine {
    fn log(&self) {
        tracing::info!(
            lease.id = %self.lease_id, event.type = %self.kind, lease.status = %self.status,
            lag_ms = self.lag_ms, "event done"
        );
    }
}

/// What a run of events in one transaction did: counts, when each was due, what to log.
type EventsRun = (TickReport, Vec<DateTime<Utc>>, Vec<DoneLine>);

/// Whether the lease of `events` has a start that has not finished: not run yet, or its
/// hand-overs still running.
fn start_unfinished(events: &[Event]) -> bool {
    events.iter().any(|e| {
        e.event_type == EventType::StartLease
            && matches!(e.status, EventStatus::Undone | EventStatus::InProgress)
    })
}

/// Whether a failure of the scheduler's work says nothing about the events it ran: the
/// database away or a race lost (also once retries ran out). The same events are run again
/// at the next poll; any other failure is taken as the events' own.
fn passing(e: &ServiceError) -> bool {
    matches!(
        e,
        ServiceError::Unavailable(_)
            | ServiceError::Retry(_)
            | ServiceError::RetryAfter { .. }
            | ServiceError::Conflict(_)
    )
}

/// Ticks in a row an event must fail on its own before it is set aside.
const SET_ASIDE_AFTER: u32 = 3;

/// Upper bound of events run by one tick, so a flood of due events cannot starve shutdown.
const MAX_EVENTS_PER_TICK: usize = 10_000;

/// Due events run in one transaction, in time order: at the top of the hour a large site
/// starts hundreds of leases at once, and one commit each (an fsync on SQLite) would make the
/// last of them start seconds late. Small enough that writers waiting for the lock wait
/// tens of milliseconds at most; a failure rolls back the batch, whose events run again.
const EVENTS_PER_TRANSACTION: usize = 50;

/// How often the scheduler looks for tables whose planner statistics went stale
/// (`Store::refresh_statistics`): much sooner than autovacuum's minute, because a burst of
/// allocations slows every create until the planner knows about it.
const STATISTICS_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);

impl Service {
    /// Runs every event due at `now`, in time order (ends before starts at the same instant).
    ///
    /// A batch that fails for a reason other than the database being away or a lost race
    /// (stored data that does not read back, a handler that fails whatever it is given)
    /// would fail again at every tick and hold up every event behind it; its events are then
    /// run one per transaction, and one that still fails is set aside as ERROR.
    pub async fn tick(&self, now: DateTime<Utc>) -> ServiceResult<TickReport> {
        let mut report = TickReport::default();
        while report.executed + report.failed < MAX_EVENTS_PER_TICK {
            let (batch, drained) = match self.run_batch(now).await {
                Ok(done) => done,
                Err(e) if passing(&e) => return Err(e),
                Err(e) => {
                    tracing::warn!(error = %e, "a batch of events failed; running them one by one");
                    self.run_one_by_one(now, EVENTS_PER_TRANSACTION).await?
                }
            };
            report.executed += batch.executed;
            report.failed += batch.failed;
            if drained {
                break;
            }
        }
        Ok(report)
    }

    /// Runs up to [`EVENTS_PER_TRANSACTION`] due events in one transaction. Returns what it
    /// did and whether no more events are due.
    async fn run_batch(&self, now: DateTime<Utc>) -> ServiceResult<(TickReport, bool)> {
        let ((batch, dues, lines), drained) = in_tx!(self, write, |tx| {
            tx.lock_scheduler().await?;
            let due_events = tx.claim_due_events(now, EVENTS_PER_TRANSACTION).await?;
            let drained = due_events.len() < EVENTS_PER_TRANSACTION;
            Ok((self.run_events(tx, due_events, now).await?, drained))
        })?;
        // Observed once they committed: a rolled-back batch is run again later.
        for due in dues {
            self.observe_event_lag(now, due);
        }
        lines.iter().for_each(DoneLine::log);
        Ok((batch, drained))
    }

    /// Runs `events` (claimed, in time order) in `tx`, each with its lease locked and read
    /// once. Returns what they did and the times they were due.
    async fn run_events(
        &self,
        tx: &mut Tx,
        events: Vec<Event>,
        now: DateTime<Utc>,
    ) -> ServiceResult<EventsRun> {
        let mut batch = TickReport::default();
        let mut dues = Vec::new();
        let mut lines = Vec::new();
        let mut ids: Vec<&str> = events.iter().map(|e| e.lease_id.as_str()).collect();
        ids.sort_unstable();
        ids.dedup();
        let mut states = load_states(tx, &ids).await?;
        for event in events {
            let due = due_of(&event);
            let Some(state) = states.get_mut(&event.lease_id) else {
                continue;
            };
            // A panic in a handler is that event's failure, not the scheduler's end.
            let ran = AssertUnwindSafe(self.run_event(tx, event, state, now))
                .catch_unwind()
                .await
                .map_err(|_| ServiceError::Internal("the event's handler panicked".into()))?;
            let Some(ran) = ran? else {
                continue;
            };
            batch.executed += 1 + ran.along.len();
            dues.push(due);
            dues.extend(ran.along);
            lines.push(ran.done);
        }
        Ok((batch, dues, lines))
    }

    /// Runs up to `limit` due events one per transaction, naming each before running it: an
    /// event that fails for a reason that would not pass is set aside as ERROR with its
    /// lease, in a transaction of its own, and the events behind it run.
    async fn run_one_by_one(
        &self,
        now: DateTime<Utc>,
        limit: usize,
    ) -> ServiceResult<(TickReport, bool)> {
        let mut report = TickReport::default();
        for _ in 0..limit {
            let Some((id, lease_id)) =
                in_tx!(self, read, |tx| { Ok(tx.first_due_event(now).await?) })?
            else {
                return Ok((report, true));
            };
            let ran = in_tx!(self, write, |tx| {
                tx.lock_scheduler().await?;
                let events = tx.due_event(&id, now).await?.into_iter().collect();
                self.run_events(tx, events, now).await
            });
            match ran {
                Ok((batch, dues, lines)) => {
                    self.forget_failures(&id);
                    report.executed += batch.executed;
                    report.failed += batch.failed;
                    for due in dues {
                        self.observe_event_lag(now, due);
                    }
                    lines.iter().for_each(DoneLine::log);
                }
                Err(e) if passing(&e) => return Err(e),
                // Not yet: a failure that goes away by the next ticks sets nothing aside. This
                // tick ends here (what ran stays done); the events behind it wait for those
                // ticks.
                Err(e) if self.count_failure(&id) < SET_ASIDE_AFTER => {
                    tracing::warn!(
                        event.id = %id, lease.id = %lease_id, error = %e,
                        "event failed; tried again at the next tick"
                    );
                    return Ok((report, true));
                }
                Err(e) => {
                    self.forget_failures(&id);
                    let failed = in_tx!(self, write, |tx| {
                        tx.lock_scheduler().await?;
                        Ok(tx.fail_event(&id, &lease_id, now).await?)
                    })?;
                    if failed {
                        tracing::error!(
                            event.id = %id, lease.id = %lease_id, error = %e,
                            "event failed; it and its lease are in ERROR"
                        );
                        report.failed += 1;
                    }
                }
            }
        }
        Ok((report, false))
    }

    /// Counts one more tick on which event `id` failed on its own; returns how many in a row.
    fn count_failure(&self, id: &str) -> u32 {
        let mut failures = self
            .event_failures
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Bounded: the events failing at once are few; a full map starts over.
        if failures.len() >= 1_000 {
            failures.clear();
        }
        let count = failures.entry(id.to_string()).or_default();
        *count += 1;
        *count
    }

    fn forget_failures(&self, id: &str) {
        self.event_failures
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(id);
    }

    /// Applies one event inside the transaction that claimed it: records the actions it
    /// implies and moves the statuses. Returns `None` when it turned out not to be due any
    /// more. A database failure rolls everything back so the event runs again later.
    async fn run_event(
        &self,
        tx: &mut Tx,
        mut event: Event,
        state: &mut LeaseState,
        now: DateTime<Utc>,
    ) -> ServiceResult<Option<Ran>> {
        let LeaseState {
            view:
                LeaseView {
                    lease,
                    reservations,
                    events,
                },
            allocations,
        } = state;
        // As read under the lease lock: an update that committed meanwhile may have moved
        // the event or the lease may have changed; then it is not ours to run now.
        match events.iter().find(|e| e.id == event.id) {
            Some(e) if e.status == EventStatus::Undone && e.time <= now => event = e.clone(),
            _ => return Ok(None),
        }
        // A before-end waits for its lease's start to finish (it may have run just now, in
        // this transaction): the scheduler is woken when it does.
        if event.event_type == EventType::BeforeEndLease && start_unfinished(events) {
            return Ok(None);
        }
        let kind = event.event_type;
        // Events that finish in this transaction, announced once the lease is settled.
        let mut finished = Vec::new();
        // When the events run along with this one were due.
        let mut ran_along = Vec::new();

        match kind {
            EventType::StartLease => {
                // Hand-overs happen after commit (`actions.rs`); the lease is STARTING until
                // they are done.
                event.status = self
                    .hand_over(tx, lease, reservations, allocations, &START, now)
                    .await?;
            }
            EventType::EndLease => {
                // Hand-overs nobody has started yet are not started at all; the start event
                // is settled without them.
                tx.cancel_pending_actions(&lease.id, ActionKind::Start.as_str(), now)
                    .await?;
                // Nor does a `before_end` snapshot that failed and waits for another attempt
                // hold the end back: as in Blazar, a failed before-end action does not keep
                // a lease from ending. One never tried yet (due in this same tick) runs
                // first, and the take-back waits for it.
                tx.give_up_retries(
                    &lease.id,
                    ActionKind::Snapshot.as_str(),
                    "not done before the lease ended: ",
                    now,
                )
                .await?;
                // What runs along before the end is announced before the end changes
                // anything, with the lease as it then stands, as Blazar runs an overdue start
                // and a before-end ahead of the end.
                let mut before = Vec::new();
                if self
                    .settle_event(
                        tx,
                        &lease.id,
                        events,
                        EventType::StartLease,
                        ActionPurpose::LeaseStart,
                        now,
                    )
                    .await?
                {
                    // The start is over (what it did not hand over yet, it never will): its
                    // reservations are in force until the end takes them back.
                    for reservation in reservations.iter_mut() {
                        if reservation.status == ReservationStatus::Pending {
                            reservation.status = ReservationStatus::Active;
                            reservation.updated_at = Some(now);
                            tx.update_reservation(reservation).await?;
                        }
                    }
                    settle_lease_status(tx, lease, events, false, now).await?;
                    before.push(EventType::StartLease);
                }
                // A before-end that waited for the start runs now, before the end.
                if let Some(before_end) = events.iter_mut().find(|e| {
                    e.event_type == EventType::BeforeEndLease
                        && e.status == EventStatus::Undone
                        && e.time <= now
                }) {
                    self.before_end(tx, lease, reservations, allocations, now)
                        .await?;
                    let due = due_of(before_end);
                    before_end.status = EventStatus::Done;
                    before_end.updated_at = Some(now);
                    tx.update_event(before_end).await?;
                    before.push(EventType::BeforeEndLease);
                    ran_along.push(due);
                }
                if !before.is_empty() {
                    let view = LeaseView {
                        lease: lease.clone(),
                        reservations: reservations.clone(),
                        events: events.clone(),
                    };
                    self.notify_events_done(tx, &view, &before).await?;
                }
                // Usage enforcement hears of the lease as it was when it ended.
                let ended = if self.enforcement.wants_on_end() {
                    Some(LeaseView {
                        lease: lease.clone(),
                        reservations: reservations.clone(),
                        events: events.clone(),
                    })
                } else {
                    None
                };
                event.status = self
                    .hand_over(tx, lease, reservations, allocations, &END, now)
                    .await?;
                if let Some(ended) = ended {
                    self.record_on_end(tx, &ended, allocations).await?;
                }
            }
            EventType::BeforeEndLease => {
                self.before_end(tx, lease, reservations, allocations, now)
                    .await?;
                event.status = EventStatus::Done;
            }
        }
        event.updated_at = Some(now);
        tx.update_event(&event).await?;
        if let Some(kept) = events.iter_mut().find(|e| e.id == event.id) {
            *kept = event.clone();
        }

        // A lease whose start failed stays in ERROR through its end.
        settle_lease_status(tx, lease, events, false, now).await?;
        // Blazar announces an event once its handler is through; here that is now, or when
        // the last of its actions finishes (`actions.rs`).
        if event.status == EventStatus::Done {
            finished.push(kind);
        }
        self.notify_events_done(tx, &state.view, &finished).await?;
        let lease = &state.view.lease;
        let done = DoneLine {
            lease_id: lease.id.clone(),
            kind,
            status: lease.status,
            lag_ms: (now - event.time).num_milliseconds(),
        };
        Ok(Some(Ran {
            along: ran_along,
            done,
        }))
    }

    /// What a lease's before-end does: `before_end: snapshot` (host reservations) records
    /// an image of every server on the hosts, as Blazar's host plugin makes them.
    async fn before_end(
        &self,
        tx: &mut Tx,
        lease: &Lease,
        reservations: &[Reservation],
        allocations: &[Allocation],
        now: DateTime<Utc>,
    ) -> ServiceResult<()> {
        tracing::info!(lease.id = %lease.id, lease.end = %lease.end, "lease ends soon");
        for reservation in reservations {
            if reservation.status == ReservationStatus::Active
                && reservation.spec.before_end() == Some(BeforeEnd::Snapshot)
            {
                self.record_action(
                    tx,
                    lease,
                    reservation,
                    (ActionKind::Snapshot, ActionPurpose::BeforeEnd),
                    &held(allocations, &reservation.id),
                    now,
                )
                .await?;
            }
        }
        Ok(())
    }

    /// Records `how.kind` for each reservation `how.applies` to, handing over or taking back
    /// what it holds. One that holds nothing moves at once to the status `how.settled`
    /// gives (if any); the others move when their actions finish. Returns the status of the
    /// event: in progress while actions are open.
    async fn hand_over(
        &self,
        tx: &mut Tx,
        lease: &Lease,
        reservations: &mut [Reservation],
        allocations: &[Allocation],
        how: &HandOver,
        now: DateTime<Utc>,
    ) -> ServiceResult<EventStatus> {
        let mut recorded = false;
        for reservation in reservations.iter_mut() {
            if !(how.applies)(reservation.status) {
                continue;
            }
            let held = held(allocations, &reservation.id);
            let recorded_one = match how.kind {
                ActionKind::Stop => {
                    self.record_take_back(tx, lease, reservation, how.purpose, &held, now)
                        .await?
                }
                _ => {
                    self.record_action(tx, lease, reservation, (how.kind, how.purpose), &held, now)
                        .await?
                }
            };
            if recorded_one {
                recorded = true;
                continue;
            }
            if let Some(status) = (how.settled)(reservation.status) {
                reservation.status = status;
                reservation.updated_at = Some(now);
                tx.update_reservation(reservation).await?;
            }
        }
        Ok(if recorded {
            EventStatus::InProgress
        } else {
            EventStatus::Done
        })
    }

    /// The time of the earliest event not run yet (`None` if there is none or on a read
    /// failure, which is logged; the next poll tries again).
    async fn next_event_time(&self) -> Option<DateTime<Utc>> {
        match in_tx!(self, read, |tx| { Ok(tx.next_event_time().await?) }) {
            Ok(next) => next,
            Err(e) => {
                tracing::error!(error = %e, "could not read the next event time");
                None
            }
        }
    }

    /// Runs the scheduler until `shutdown` completes: a tick whenever an event falls due,
    /// when woken by a new lease, and at least every `poll` (events written by other
    /// processes are seen at the next poll).
    pub async fn run_scheduler(
        &self,
        poll: std::time::Duration,
        shutdown: impl Future<Output = ()>,
    ) {
        tokio::pin!(shutdown);
        let mut statistics_checked = std::time::Instant::now();
        let mut statistics: Option<tokio::task::JoinHandle<()>> = None;
        // Until it has been done once (the database may not answer at start): lowered
        // default ratios leave slots over capacity until then.
        let mut capacities_checked = false;
        loop {
            if !capacities_checked {
                match self.recheck_capacities().await {
                    Ok(_) => capacities_checked = true,
                    Err(e) => tracing::error!(error = %e,
                        "checking instance slots against their hosts' capacity failed; retrying at the next poll"),
                }
            }
            // Writes committed from here on wake the scheduler again, whatever their time.
            self.scheduler_plan.store(i64::MIN, Ordering::SeqCst);
            let now = self.now();
            let mut next = self.next_event_time().await;
            let mut backlog = false;
            // The write lock only when an event is due: on SQLite every writer waits for it.
            if next.is_some_and(|t| t <= now) {
                match self.tick(now).await {
                    Ok(report) => {
                        backlog = report.executed + report.failed >= MAX_EVENTS_PER_TICK;
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "scheduler tick failed; retrying at the next poll");
                    }
                }
                next = self.next_event_time().await;
            }
            if let Err(e) = self.heal_pending(now).await {
                tracing::error!(error = %e, "healing failed; retrying at the next poll");
            }
            // On a task of its own, one at a time: vacuuming a large table takes seconds,
            // which events must not wait for.
            if statistics_checked.elapsed() >= STATISTICS_INTERVAL
                && statistics.as_ref().is_none_or(|task| task.is_finished())
            {
                statistics_checked = std::time::Instant::now();
                let store = self.store.clone();
                statistics = Some(tokio::spawn(async move {
                    match store.refresh_statistics().await {
                        Ok(tables) if !tables.is_empty() => {
                            tracing::debug!(?tables, "vacuumed and refreshed planner statistics");
                        }
                        Ok(_) => {}
                        Err(e) => {
                            tracing::warn!(error = %e, "could not refresh planner statistics");
                        }
                    }
                }));
            }
            // The clock's own reading, not the whole seconds of `now()`: the sleep ends when
            // the event is due, and the plan is the instant it ends.
            let at = self.clock.now();
            let wait = match next {
                Some(t) if t > at => crate::wait_until(t, at, poll),
                _ if backlog => std::time::Duration::ZERO,
                _ => poll,
            };
            let plan = at + chrono::Duration::from_std(wait).unwrap_or_default();
            self.scheduler_plan
                .store(plan.timestamp_millis(), Ordering::SeqCst);
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = self.wake.notified() => {}
                _ = &mut shutdown => break,
            }
        }
        // A vacuum cut short is harmless: the next one starts over.
        if let Some(task) = statistics {
            task.abort();
        }
        tracing::info!("scheduler stopped");
    }
}

/// When an event was due, for its lag: its time, or when it was written or last moved if
/// that came later. A lease asked to start (or end) "now" is given the current minute, which
/// had begun before the request came; it is late only from the request on.
fn due_of(event: &Event) -> DateTime<Utc> {
    event.time.max(event.updated_at.unwrap_or(event.created_at))
}
