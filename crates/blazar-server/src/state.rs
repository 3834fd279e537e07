//! What every handler can reach.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use blazar_service::Service;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};

use crate::auth::Auth;
use crate::lease_cache::LeaseCache;
use crate::metrics::{Metrics, MetricsAccess};

/// Settings of the endpoints that watch the service (`/metrics`, long polls, event streams).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ObserveSettings {
    pub metrics_access: MetricsAccess,
    /// Long polls and event streams open at once; more are answered 503.
    pub max_waiters: usize,
    /// The longest `timeout` a long poll may ask for.
    pub max_wait: Duration,
    /// How often an open event stream checks that its caller's credentials still hold.
    pub recheck: Duration,
}

/// Of `max_waiters`, the most one project may hold at once (a quarter): one client cannot
/// take every slot and leave the other projects' long polls and streams to 503.
pub const PROJECT_SHARE: usize = 4;

impl Default for ObserveSettings {
    fn default() -> Self {
        ObserveSettings {
            metrics_access: MetricsAccess::default(),
            max_waiters: 1024,
            max_wait: Duration::from_secs(300),
            recheck: Duration::from_secs(60),
        }
    }
}

/// What every handler can reach, behind one shared pointer: axum clones the state for
/// every extractor and middleware layer of every request, and a profile of lease creates
/// showed cloning and dropping the fields one by one (some thirty reference counts) as
/// about 2 % of the server's CPU.
#[derive(Clone)]
pub struct AppState(Arc<Shared>);

impl std::ops::Deref for AppState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

/// The state itself (see [`AppState`]).
pub struct Shared {
    pub service: Service,
    pub auth: Arc<Auth>,
    /// Rendered leases, reused by lease lists while their revision stands.
    pub leases: Arc<LeaseCache>,
    pub metrics: Arc<Metrics>,
    pub observe: ObserveSettings,
    /// Permits for long polls and event streams (`observe.max_waiters`).
    waiters: Arc<Semaphore>,
    /// How many of them each project holds.
    held_by_project: Arc<Mutex<HashMap<String, usize>>>,
    /// Becomes true when the server stops: event streams end so that shutdown does not wait
    /// for clients that never hang up.
    pub stopping: watch::Receiver<bool>,
    stop: Arc<watch::Sender<bool>>,
}

impl AppState {
    pub fn new(service: Service, auth: Auth) -> AppState {
        AppState::with_metrics(
            service,
            auth,
            Arc::new(Metrics::new()),
            ObserveSettings::default(),
        )
    }

    /// A state whose service already reports to `metrics`.
    pub fn with_metrics(
        service: Service,
        auth: Auth,
        metrics: Arc<Metrics>,
        observe: ObserveSettings,
    ) -> AppState {
        let (stop, stopping) = watch::channel(false);
        AppState(Arc::new(Shared {
            service,
            auth: Arc::new(auth),
            leases: Arc::new(LeaseCache::default()),
            metrics,
            observe,
            waiters: Arc::new(Semaphore::new(observe.max_waiters)),
            held_by_project: Arc::default(),
            stopping,
            stop: Arc::new(stop),
        }))
    }

    /// Ends the event streams and waits in progress: the server is stopping.
    pub fn stop_watchers(&self) {
        let _ = self.stop.send(true);
    }

    /// How many long polls and event streams are open.
    pub fn waiters_in_use(&self) -> usize {
        self.observe
            .max_waiters
            .saturating_sub(self.waiters.available_permits())
    }

    /// A slot for one long poll or event stream of `project_id`, or `None` when every slot
    /// is taken or the project holds its share of them.
    pub fn waiter(&self, project_id: &str) -> Option<WaiterPermit> {
        let share = (self.observe.max_waiters / PROJECT_SHARE).max(1);
        let mut held = self
            .held_by_project
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let count = held.entry(project_id.to_string()).or_default();
        if *count >= share {
            return None;
        }
        let permit = self.waiters.clone().try_acquire_owned().ok()?;
        *count += 1;
        Some(WaiterPermit {
            _permit: permit,
            held_by_project: self.held_by_project.clone(),
            project_id: project_id.to_string(),
        })
    }
}

/// One long poll's or event stream's slot; given back when dropped.
pub struct WaiterPermit {
    _permit: OwnedSemaphorePermit,
    held_by_project: Arc<Mutex<HashMap<String, usize>>>,
    project_id: String,
}

impl Drop for WaiterPermit {
    fn drop(&mut self) {
        let mut held = self
            .held_by_project
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(count) = held.get_mut(&self.project_id) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                held.remove(&self.project_id);
            }
        }
    }
}
