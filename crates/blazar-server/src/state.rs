//! What every handler can reach.

use std::sync::Arc;
use std::time::Duration;

use blazar_service::Service;
use tokio::sync::{Semaphore, watch};

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
}

impl Default for ObserveSettings {
    fn default() -> Self {
        ObserveSettings {
            metrics_access: MetricsAccess::default(),
            max_waiters: 1024,
            max_wait: Duration::from_secs(300),
        }
    }
}

#[derive(Clone)]
pub struct AppState {
    pub service: Service,
    pub auth: Arc<Auth>,
    /// Rendered leases, reused by lease lists while their revision stands.
    pub leases: Arc<LeaseCache>,
    pub metrics: Arc<Metrics>,
    pub observe: ObserveSettings,
    /// Permits for long polls and event streams (`observe.max_waiters`).
    pub waiters: Arc<Semaphore>,
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
        AppState {
            service,
            auth: Arc::new(auth),
            leases: Arc::new(LeaseCache::default()),
            metrics,
            observe,
            waiters: Arc::new(Semaphore::new(observe.max_waiters)),
            stopping,
            stop: Arc::new(stop),
        }
    }

    /// Ends the event streams and waits in progress: the server is stopping.
    pub fn stop_watchers(&self) {
        let _ = self.stop.send(true);
    }
}
