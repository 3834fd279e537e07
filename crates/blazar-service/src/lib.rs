//! The use cases of blazar-rs: leases, hosts, allocations and the event scheduler. Each use
//! case runs in one database transaction; an allocation is decided and written in the same
//! transaction that the database checks for overlaps.

/// Runs a block in a transaction (`write` or `read`) and commits it; a block that lost a race
/// to a concurrent transaction is run again from the start. Inside the block `tx` is the
/// `&mut Tx`; `return Ok(..)` commits, `return Err(..)` and `?` roll back.
///
/// With `dry_run = <bool>` true, the block's answer is returned and everything it wrote is
/// rolled back (nobody is woken): a dry run decides exactly as the real call would.
///
/// A macro rather than a function taking an async closure: such closures are not `Send` on
/// stable Rust yet, and the API serves requests on a multi-threaded runtime.
macro_rules! in_tx {
    ($service:expr, $begin:ident, |$tx:ident| $body:block) => {
        in_tx!($service, $begin, dry_run = false, |$tx| $body)
    };
    ($service:expr, $begin:ident, dry_run = $dry_run:expr, |$tx:ident| $body:block) => {{
        let mut attempt: u32 = 0;
        loop {
            attempt += 1;
            let result: $crate::ServiceResult<_> = async {
                let mut owned = $service.store.$begin().await?;
                // The block runs in its own async block so that a `return` inside it ends the
                // block, not the attempt: its value is still committed below.
                let value: $crate::ServiceResult<_> = async {
                    let $tx: &mut blazar_db::Tx = &mut owned;
                    $body
                }
                .await;
                let value = value?;
                if $dry_run {
                    owned.rollback().await?;
                    return Ok(value);
                }
                let recorded = owned.recorded_actions();
                let notified = owned.recorded_notifications();
                let delivering = owned.wrote_webhook_deliveries();
                let changed = owned.changed_leases();
                let deferred = owned.take_after_commit();
                owned.commit().await?;
                for run in deferred {
                    run();
                }
                $service.signal_peers($crate::peers::marks(
                    changed || notified,
                    recorded,
                    notified,
                    delivering,
                ));
                if changed || notified {
                    $service.announce_lease_change();
                }
                if recorded {
                    $service.wake_workers();
                }
                if notified {
                    $service.wake_publisher();
                }
                if delivering {
                    $service.wake_webhooks();
                }
                Ok(value)
            }
            .await;
            if let Some(done) = $service.settle(result, attempt).await {
                break done;
            }
        }
    }};
}

mod actions;
mod allocation_list;
mod backend;
mod batch;
mod enforcement;
pub mod feeds;
mod healing;
mod hosts;
mod instance;
mod inventory;
mod leases;
mod monitor;
mod notifications;
mod observe;
mod offers;
mod peers;
mod policy;
mod pool;
mod presence;
mod quotas;
mod reallocation;
mod reconcile;
mod refusal;
mod resources;
mod scheduler;
mod timeline;
pub mod tokens;
mod trusts;
mod turns;
mod webhooks;

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

use blazar_db::{Backend as StoreBackend, DbError};
use chrono::{DateTime, Duration, Timelike, Utc};
use tokio::sync::Notify;

pub use actions::{ActionReport, current_request_id, with_request_id};
pub use allocation_list::{AllocationBatch, AllocationKind, AllocationList, AllocationListRequest};
pub use backend::{
    Action, ActionError, ActionOutput, Backend, HandoverChange, HostHealth, InventoryError,
    PoolCheck, StandaloneBackend,
};
pub use blazar_core::time::truncate_to_minute;
/// Rows some use cases answer with as they are read.
pub use blazar_db::{AllocationView, GrantRow};
/// The database handle and how to open it: the server opens the store once and hands it to
/// the service; everything it reads or writes goes through the service's use cases.
pub use blazar_db::{SqliteSync, Store, StoreOptions};
pub use enforcement::{
    Denial, EnforcedLease, Enforcement, EnforcementContext, MaxLeaseDurationFilter, OnEndError,
    UsageFilter,
};
pub use hosts::{AllocationEntry, HostList, NO_DATA_TO_UPDATE, PropertyListing};
pub use instance::Ratios;
pub use inventory::{DEVICES, FLOATINGIPS, KindSpec, NETWORKS};
pub use leases::{DryRun, LeaseBatch, LeaseList, LeaseUpdate, Listed, NewLease, check_name};
pub use monitor::MonitorReport;
pub use notifications::{NotificationSink, PublishReport, lease_payload};
pub use observe::{EventObserver, LeaseEvents, Look, Monitoring, WAIT_POLL};
pub use offers::{
    DEFAULT_OFFERS, DEFAULT_SEARCH_DAYS, Extension, ExtensionAsk, LeaseOffer, MAX_OFFERS,
    MAX_SEARCH_DAYS, OfferRequest, OfferedReservation, OfferedResource, SearchWindow,
};
pub use policy::{Authorizer, DefaultPolicy, Target, policy_denied};
pub use quotas::{
    HostWeight, ProjectQuota, QUOTAS_DELETE, QUOTAS_GET, QUOTAS_PUT, QuotaSettings, QuotaUsage,
    format_amount,
};
pub use reallocation::{Reallocated, ReallocationFilter};
pub use reconcile::{DesiredState, HeldHosts, ReconcileReport, RepairPass};
pub use refusal::{Availability, Reason, RefusalKind, Refused, Requested, ReservationRef, Retry};
pub use resources::Grant;
pub use scheduler::TickReport;
pub use timeline::{TIMELINE_RULE, TimelineBatch, TimelineReader, TimelineRequest};
pub use trusts::{TrustError, Trusts, UserToken};
pub use turns::{MONITOR_TURN, RECONCILE_TURN};
pub use webhooks::{
    DELIVERIES_LISTED, DeliveryReport, NewWebhook, WebhookRequest, WebhookSender, WebhookSettings,
    internal_destination, is_internal_address, webhook_signature,
};

/// Errors a use case reports. Each maps to one HTTP status; the message is for the user.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ServiceError {
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    /// A create or update refused (4xx), with the reasons a program can read beside the
    /// message (boxed: errors travel in every `Result`).
    #[error("{}", .0.message)]
    Refused(Box<Refused>),
    /// A concurrent transaction won a race; the whole use case may be run again.
    #[error("conflict with a concurrent request: {0}")]
    Retry(String),
    /// Rows the use case would share-lock are being changed by a concurrent transaction:
    /// it runs again once that one has ended.
    #[error("conflict with a concurrent change of {table}")]
    RetryAfter { table: &'static str, ids: Vec<i64> },
    /// The cloud could not be asked just now (503): try again later.
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    Internal(String),
}

impl From<DbError> for ServiceError {
    fn from(e: DbError) -> Self {
        match e {
            DbError::Overlap => ServiceError::Retry("an allocation was taken concurrently".into()),
            DbError::Retryable(m) => ServiceError::Retry(m),
            DbError::RowsBusy { table, ids } => ServiceError::RetryAfter { table, ids },
            DbError::Duplicate(m) => ServiceError::Conflict(format!("already exists: {m}")),
            DbError::NotUnique(m) => ServiceError::Conflict(m),
            DbError::Rejected(m) => ServiceError::BadRequest(format!("Invalid value: {m}")),
            // The cause (which may name hosts or paths) is logged here, once; the caller is
            // told to come back.
            e @ DbError::Unavailable(_) => {
                tracing::error!(error = %e, "database unavailable");
                ServiceError::Unavailable(
                    "The database is unavailable just now; try again later".into(),
                )
            }
            other => ServiceError::Internal(other.to_string()),
        }
    }
}

impl From<blazar_core::Refusal> for ServiceError {
    fn from(e: blazar_core::Refusal) -> Self {
        match e {
            blazar_core::Refusal::Invalid(m) => ServiceError::BadRequest(m),
            blazar_core::Refusal::BadDate { field, message } => {
                ServiceError::BadRequest(message).with_reason(Reason::field(field))
            }
            blazar_core::Refusal::Conflict(m) => ServiceError::Conflict(m),
        }
    }
}

impl From<blazar_core::SpecError> for ServiceError {
    fn from(e: blazar_core::SpecError) -> Self {
        ServiceError::BadRequest(e.0)
    }
}

pub type ServiceResult<T> = Result<T, ServiceError>;

/// Who is asking: from the token (or the noauth headers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub user_id: String,
    pub project_id: String,
    pub roles: Vec<String>,
}

impl Identity {
    pub fn is_admin(&self) -> bool {
        self.has_role("admin")
    }

    /// Keystone's implied roles: admin implies member, member implies reader.
    pub fn is_member(&self) -> bool {
        self.is_admin() || self.has_role("member")
    }

    pub fn is_reader(&self) -> bool {
        self.is_member() || self.has_role("reader")
    }

    fn has_role(&self, role: &str) -> bool {
        self.roles.iter().any(|r| r.eq_ignore_ascii_case(role))
    }
}

/// Where the current time comes from; tests inject a fixed clock.
pub trait Clock: Send + Sync {
    fn now(&self) -> DateTime<Utc>;
}

pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
}

/// The wait from `now` until `t`: none once `t` has come, never more than `poll`. `now` is
/// the clock's own reading: [`Service::now`] is whole seconds, and a wait reckoned from it
/// overshot by up to a second, so a lease due at the top of a minute started as much as a
/// second late.
pub(crate) fn wait_until(
    t: DateTime<Utc>,
    now: DateTime<Utc>,
    poll: std::time::Duration,
) -> std::time::Duration {
    (t - now)
        .to_std()
        .unwrap_or(std::time::Duration::ZERO)
        .min(poll)
}

/// A clock that only moves when told to.
pub struct ManualClock(Mutex<DateTime<Utc>>);

impl ManualClock {
    pub fn new(t: DateTime<Utc>) -> Self {
        ManualClock(Mutex::new(t))
    }

    pub fn set(&self, t: DateTime<Utc>) {
        if let Ok(mut guard) = self.0.lock() {
            *guard = t;
        }
    }
}

impl Clock for ManualClock {
    fn now(&self) -> DateTime<Utc> {
        match self.0.lock() {
            Ok(guard) => *guard,
            Err(poisoned) => *poisoned.into_inner(),
        }
    }
}

/// Behaviour settings of the reservation engine.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Minutes a resource stays unavailable after a lease ends (Blazar's `cleaning_time`).
    pub cleaning_minutes: i64,
    /// Default offset of the `before_end_lease` event; 0 disables it.
    pub minutes_before_end_lease: i64,
    /// Allocation ratios of hosts that set none (`cpu_allocation_ratio`, ... capabilities).
    pub ratios: Ratios,
    /// Outside-world actions carried out at once by one process.
    pub action_workers: usize,
    /// How long an action that keeps failing transiently is retried, from its first
    /// attempt, before it fails for good.
    pub action_retry_for: std::time::Duration,
    /// At most this many attempts of an action, whatever its retry span has left; none
    /// when `None`.
    pub action_max_attempts: Option<u32>,
    /// Longest one attempt may take; then it counts as a transient failure.
    pub action_timeout: std::time::Duration,
    /// About how many allocations one batch of a streamed allocation list or timeline
    /// holds: each sizes its batches of resources by what the last one held, so that the
    /// memory a reader holds stays this size however dense the allocations are.
    pub list_batch_allocations: usize,
    /// How often a running reconciliation pass renews its claim; each renewal holds it
    /// four times as long, so a replica that stops mid-pass keeps others out that long.
    pub claim_renewal: std::time::Duration,
    /// How often a worker renews the claim of an action it is carrying out; each renewal
    /// holds it four times as long, so the actions of a process killed mid-attempt are
    /// taken over that soon.
    pub action_claim_renewal: std::time::Duration,
    /// The pause after a failed reconciler pass (the cloud away), doubling while passes
    /// fail, up to the interval; the first pass after start comes after half of it.
    pub reconcile_retry: std::time::Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            cleaning_minutes: 0,
            minutes_before_end_lease: 60,
            ratios: Ratios::default(),
            action_workers: 16,
            // Half an hour of retries, at most 30 s apart: an outage of a cloud API (a
            // restart, an upgrade) delays a start or an end instead of failing the lease,
            // and the lease goes on within 30 s of the API's return.
            action_retry_for: std::time::Duration::from_secs(30 * 60),
            action_max_attempts: None,
            action_timeout: std::time::Duration::from_secs(300),
            list_batch_allocations: 2_500,
            claim_renewal: std::time::Duration::from_secs(30),
            action_claim_renewal: std::time::Duration::from_secs(15),
            reconcile_retry: std::time::Duration::from_secs(30),
        }
    }
}

impl Settings {
    pub fn cleaning(&self) -> Duration {
        Duration::minutes(self.cleaning_minutes.max(0))
    }
}

/// The application: storage, time, the outside world, and the scheduler's doorbell.
#[derive(Clone)]
pub struct Service {
    store: Store,
    clock: Arc<dyn Clock>,
    settings: Settings,
    backend: Arc<dyn Backend>,
    authorizer: Arc<dyn Authorizer>,
    host_cache: Arc<resources::HostCache>,
    /// The cloud's answers to `trait:` requirements (flavor:instance).
    trait_hosts: Arc<instance::TraitHosts>,
    wake: Arc<Notify>,
    /// Rung after a commit that recorded actions.
    action_wake: Arc<Notify>,
    /// Rung after a commit that wrote notifications.
    publish_wake: Arc<Notify>,
    /// Rung after a commit that wrote notifications (and so, perhaps, webhook deliveries).
    webhook_wake: Arc<Notify>,
    /// Rung when a gone worker's claims were ended: a reconciler pass of its may have
    /// stopped half-way through a repair.
    reconcile_wake: Arc<Notify>,
    /// How webhook deliveries are tried.
    webhooks: Arc<webhooks::WebhookSettings>,
    /// When this process last purged old webhook deliveries (epoch seconds).
    webhooks_purged: Arc<AtomicI64>,
    /// Who claims actions in this process (claims name their worker, so a late finish of an
    /// expired claim cannot overwrite another worker's).
    worker_id: Arc<str>,
    /// When the scheduler next looks at the events (epoch milliseconds; `i64::MIN` while it is
    /// looking): a write wakes it only for an event due before then.
    scheduler_plan: Arc<AtomicI64>,
    /// How many ticks in a row each event failed on its own (see `Service::tick`): set
    /// aside only when the failure outlasts a few of them.
    event_failures: Arc<std::sync::Mutex<std::collections::HashMap<String, u32>>>,
    /// Group commit of lease creates (SQLite only; see `batch`).
    batcher: Option<Arc<batch::CreateBatcher>>,
    /// Permits for reads whose answer grows with the whole history (a batch of an allocation
    /// list or a timeline, see `Service::large_read_permit`).
    large_reads: Arc<tokio::sync::Semaphore>,
    /// Permits for window searches read outside a writing transaction (offers, the next
    /// offer of a refusal, how far a lease can be extended; see `Service::search_permit`).
    searches: Arc<tokio::sync::Semaphore>,
    /// The usage-enforcement filters an operator enabled (none by default).
    enforcement: Arc<enforcement::Enforcement>,
    /// Moved after every commit that changed a lease, so that requests waiting on a lease
    /// in this process look again at once (so does a signal of another process, `peers.rs`;
    /// a lost one is polled for).
    lease_changes: Arc<tokio::sync::watch::Sender<u64>>,
    /// The newest outbox rows, read once for all of this process's event streams.
    outbox_tail: Arc<observe::OutboxTail>,
    /// Told how late each event ran (metrics).
    event_observer: Option<EventObserver>,
    /// Per-project limits (none by default).
    quotas: Arc<quotas::QuotaSettings>,
    /// What this process's commits have to tell the other processes on the database.
    peer_signals: Arc<peers::PeerSignals>,
    /// Keystone trusts of leases (auth mode keystone), and whether creates make them.
    trusts: Option<trusts::TrustSettings>,
}

/// How many window searches run at once in a process: one per core (at least two). A search
/// is CPU work over the occupancy it read, whose size grows with the candidates and the
/// history in its window; more at once than cores finishes none sooner. Unbounded, 64 at
/// once at 10,000 hosts and a million allocations took a fresh server to 197 MB, bounded
/// to 144 MB, at the same rate (docs/performance.md). Those waiting queue in arrival order.
fn search_permits() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get().max(2))
}

/// How many times a use case is re-run after losing a race to a concurrent transaction.
const MAX_ATTEMPTS: u32 = 12;

impl Service {
    pub fn new(
        store: Store,
        clock: Arc<dyn Clock>,
        settings: Settings,
        backend: Arc<dyn Backend>,
    ) -> Self {
        let store_backend = store.backend();
        let cache = Arc::new(resources::HostCache::default());
        let trait_hosts = Arc::new(instance::TraitHosts::default());
        Service {
            store,
            clock,
            settings,
            backend,
            authorizer: Arc::new(DefaultPolicy),
            host_cache: cache,
            trait_hosts,
            wake: Arc::new(Notify::new()),
            action_wake: Arc::new(Notify::new()),
            publish_wake: Arc::new(Notify::new()),
            webhook_wake: Arc::new(Notify::new()),
            reconcile_wake: Arc::new(Notify::new()),
            webhooks: Arc::new(webhooks::WebhookSettings::default()),
            webhooks_purged: Arc::new(AtomicI64::new(i64::MIN)),
            worker_id: Arc::from(new_id().as_str()),
            scheduler_plan: Arc::new(AtomicI64::new(i64::MIN)),
            event_failures: Arc::default(),
            large_reads: Arc::new(tokio::sync::Semaphore::new(2)),
            searches: Arc::new(tokio::sync::Semaphore::new(search_permits())),
            enforcement: Arc::new(enforcement::Enforcement::default()),
            lease_changes: Arc::new(tokio::sync::watch::Sender::new(0)),
            outbox_tail: Arc::default(),
            peer_signals: Arc::default(),
            event_observer: None,
            quotas: Arc::new(quotas::QuotaSettings::default()),
            trusts: None,
            // PostgreSQL runs writers side by side; SQLite queues them, so batch there.
            batcher: (store_backend == StoreBackend::Sqlite
                && tokio::runtime::Handle::try_current().is_ok())
            .then(batch::CreateBatcher::start)
            .and_then(|started| match started {
                Ok(batcher) => Some(Arc::new(batcher)),
                Err(e) => {
                    tracing::warn!(error = %e, "no create batching: could not start its thread");
                    None
                }
            }),
        }
    }

    /// Replaces Blazar's default policy rules.
    pub fn with_authorizer(mut self, authorizer: Arc<dyn Authorizer>) -> Self {
        self.authorizer = authorizer;
        self
    }

    /// Enables usage-enforcement filters (Blazar's `[enforcement] enabled_filters`).
    pub fn with_enforcement(mut self, enforcement: enforcement::Enforcement) -> Self {
        self.enforcement = Arc::new(enforcement);
        self
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The current time to the second: the precision of every stored timestamp, so what a
    /// write returns equals what a later read shows.
    pub fn now(&self) -> DateTime<Utc> {
        let now = self.clock.now();
        now.with_nanosecond(0).unwrap_or(now)
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Wakes the scheduler if an event at `due` comes before its next planned look (in
    /// milliseconds, as the scheduler sleeps). Waking it for nothing would cost a pass over
    /// the events for every write.
    pub(crate) fn wake_scheduler_for(&self, due: DateTime<Utc>) {
        if due <= self.clock.now() + peers::EVENT_HORIZON {
            self.signal_peers(peers::EVENTS);
        }
        let plan = self.scheduler_plan.load(Ordering::SeqCst);
        if plan == i64::MIN || due.timestamp_millis() < plan {
            self.wake.notify_one();
        }
    }

    /// Decides what happens after one attempt of a transaction: done (`Some`), or run it
    /// again after a short, jittered pause because it lost a race (`None`).
    async fn settle<T>(&self, result: ServiceResult<T>, attempt: u32) -> Option<ServiceResult<T>> {
        match result {
            Err(ServiceError::Retry(reason)) if attempt < MAX_ATTEMPTS => {
                tracing::debug!(attempt, reason = %reason, "transaction lost a race, retrying");
                // Spread retries so racing transactions do not collide again in lockstep.
                let jitter = u64::from(uuid::Uuid::new_v4().as_bytes()[0] % 16);
                tokio::time::sleep(std::time::Duration::from_millis(
                    2 + jitter * u64::from(attempt),
                ))
                .await;
                None
            }
            Err(ServiceError::RetryAfter { table, ids }) if attempt < MAX_ATTEMPTS => {
                tracing::debug!(
                    attempt,
                    table,
                    "waiting for a concurrent change, then retrying"
                );
                // Holding nothing now, so waiting for the change closes no circle.
                if let Err(e) = self.store.wait_for_rows(table, &ids).await {
                    return Some(Err(e.into()));
                }
                None
            }
            Err(ServiceError::Retry(reason)) => Some(Err(ServiceError::Conflict(format!(
                "the request kept conflicting with concurrent requests ({reason}); try again"
            )))),
            Err(ServiceError::RetryAfter { table, .. }) => {
                Some(Err(ServiceError::Conflict(format!(
                    "the request kept conflicting with concurrent changes of {table}; try again"
                ))))
            }
            other => Some(other),
        }
    }
}

/// Refuses text no column can hold (PostgreSQL's text refuses NUL) and, in a name (which
/// logs, aggregates and clouds show), any control character.
pub(crate) fn check_text(key: &str, text: &str, name: bool) -> ServiceResult<()> {
    if text.contains('\0') || (name && text.chars().any(char::is_control)) {
        return Err(ServiceError::BadRequest(format!(
            "Malformed parameter {key}: control characters are not allowed"
        )));
    }
    Ok(())
}

/// Refuses what cannot be a Keystone project id: empty or blank, longer than Keystone's 64
/// characters, or with control characters.
pub(crate) fn check_project_id(project_id: &str) -> ServiceResult<()> {
    if project_id.trim().is_empty()
        || project_id.chars().count() > 64
        || project_id.chars().any(char::is_control)
    {
        return Err(ServiceError::BadRequest(format!(
            "Invalid project id {:?}: not blank, at most 64 characters, no control characters",
            project_id.chars().take(64).collect::<String>()
        )));
    }
    Ok(())
}

/// The id of a new row (lease, reservation, event, notification, resource): a UUID that
/// starts with its creation time (version 7), so that rows are added at the end of the
/// indexes on these ids instead of at random places in them. Random ids made every create
/// touch pages spread over the whole of those indexes, which years of history make far
/// larger than any page cache; clients see a UUID in Blazar's form as before.
pub(crate) fn new_id() -> String {
    uuid::Uuid::now_v7().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use std::time::Duration;

    #[test]
    fn waits_are_reckoned_from_the_clock_not_from_whole_seconds() {
        let due = Utc.with_ymd_and_hms(2026, 11, 26, 20, 34, 0).unwrap();
        let poll = Duration::from_secs(5);
        let at = |ms: i64| due + chrono::TimeDelta::milliseconds(ms);
        assert_eq!(wait_until(due, at(-400), poll), Duration::from_millis(400));
        assert_eq!(wait_until(due, at(-60_000), poll), poll);
        assert_eq!(wait_until(due, at(0), poll), Duration::ZERO);
        assert_eq!(wait_until(due, at(250), poll), Duration::ZERO);

        // What the scheduler sleeps 0.4 s before an event: 0.4 s, where the whole-second
        // `now()` made it a full second.
        let service_clock = ManualClock::new(at(-400));
        assert_eq!(
            wait_until(due, service_clock.now(), poll),
            Duration::from_millis(400)
        );
        let whole = service_clock.now().with_nanosecond(0).unwrap();
        assert_eq!(wait_until(due, whole, poll), Duration::from_secs(1));
    }
}
