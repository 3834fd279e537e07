//! The blazar-rs server: Blazar's v1 REST API over axum and the lease event scheduler. This
//! is the only crate that knows HTTP.

pub mod allocations;
pub mod app;
pub mod auth;
pub mod calendar;
pub mod commands;
pub mod config;
pub mod convert;
pub mod error;
pub mod extract;
pub mod hosts;
pub mod ical;
pub mod ids;
pub mod inventory;
pub mod keystone;
pub mod lease_cache;
pub mod leases;
pub mod listener;
pub mod metrics;
pub mod policy;
pub mod quotas;
pub mod reply;
pub mod secret;
pub mod state;
pub mod stream;
pub mod timeline;
pub mod tokens;
pub mod webhooks;

use std::sync::Arc;

use blazar_service::{
    Backend, Clock, Service, Settings, StandaloneBackend, Store, StoreOptions, SystemClock,
};
use tokio::sync::watch;
use tower::Layer;

use crate::auth::Auth;
use crate::config::{AuthMode, Config, Role};
use crate::state::AppState;

/// Builds the application state from a configuration.
pub async fn build_state(config: &Config) -> anyhow::Result<AppState> {
    StateBuilder::new(config).build().await
}

/// Makes the authentication of a state from its store.
type AuthMaker<'a> = Box<dyn FnOnce(&Store) -> Auth + Send + 'a>;

/// How the application state is put together: the policy, the store, the authentication and
/// the service, in that order. Production builds it from the configuration alone
/// ([`build_state`]); tests replace the clock, the backend, the settings, the policy or the
/// authentication, and everything else is built as production builds it.
pub struct StateBuilder<'a> {
    config: &'a Config,
    clock: Arc<dyn Clock>,
    backend: Option<Arc<dyn Backend>>,
    settings: Option<Settings>,
    policy: Option<policy::Policy>,
    auth: Option<AuthMaker<'a>>,
    trusts: Option<(Arc<dyn blazar_service::Trusts>, bool)>,
}

impl<'a> StateBuilder<'a> {
    /// Everything from `config`, on the system clock.
    pub fn new(config: &'a Config) -> Self {
        StateBuilder {
            config,
            clock: Arc::new(SystemClock),
            backend: None,
            settings: None,
            policy: None,
            auth: None,
            trusts: None,
        }
    }

    /// The clock of the service and of token validation.
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// What carries out actions, instead of the configured backend.
    pub fn backend(mut self, backend: Arc<dyn Backend>) -> Self {
        self.backend = Some(backend);
        self
    }

    /// The service's settings, instead of those the configuration gives.
    pub fn settings(mut self, settings: Settings) -> Self {
        self.settings = Some(settings);
        self
    }

    /// The policy, instead of loading the configured policy file.
    pub fn policy(mut self, policy: policy::Policy) -> Self {
        self.policy = Some(policy);
        self
    }

    /// Keystone's trusts reached through `trusts`, made at every lease create if `make`,
    /// instead of as auth mode keystone and `act_for_user` say.
    pub fn trusts(mut self, trusts: Arc<dyn blazar_service::Trusts>, make: bool) -> Self {
        self.trusts = Some((trusts, make));
        self
    }

    /// Authentication made from the store, instead of the configured mode's.
    pub fn auth_with(mut self, auth: impl FnOnce(&Store) -> Auth + Send + 'a) -> Self {
        self.auth = Some(Box::new(auth));
        self
    }

    pub async fn build(self) -> anyhow::Result<AppState> {
        let config = self.config;
        // The policy first: a bad file stops the start before anything else is touched.
        let policy = match self.policy {
            Some(policy) => policy,
            None => policy::Policy::load(config.policy_file.as_deref())?,
        };
        if let Some(path) = policy.path() {
            tracing::info!(policy.file = %path.display(), "policy file loaded");
        }
        let store = Store::connect(&StoreOptions {
            url: config.database_url.clone(),
            max_connections: config.max_connections,
            sqlite_sync: config.sqlite_sync(),
        })
        .await
        .map_err(|e| {
            anyhow::anyhow!("cannot open database {}: {e}", redact(&config.database_url))
        })?;
        let auth = match self.auth {
            Some(make) => make(&store),
            None => match config.auth {
                AuthMode::Noauth => Auth::noauth(&config.noauth_project_id, &config.noauth_user_id),
                AuthMode::Tokens => {
                    Auth::tokens(tokens::TokenAuth::new(store.clone(), self.clock.clone()))
                }
                AuthMode::Keystone => Auth::keystone(
                    keystone::Keystone::connect(config.keystone_settings()?, self.clock.clone())
                        .await?,
                ),
            },
        };
        let settings = self.settings.unwrap_or_else(|| settings(config));
        warn_if_attempts_cut_retries(&settings);
        let backend = match self.backend {
            Some(backend) => backend,
            None => backend(config)?,
        };
        let enforcement = config.usage_enforcement()?;
        if !enforcement.filter_names().is_empty() {
            tracing::info!(filters = ?enforcement.filter_names(), "usage enforcement enabled");
        }
        let metrics = Arc::new(metrics::Metrics::new());
        let event_lag = metrics.event_lag();
        let mut service = Service::new(store, self.clock, settings, backend)
            .with_authorizer(Arc::new(policy))
            .with_enforcement(enforcement)
            .with_quotas(config.quotas.clone())
            .with_webhook_settings(config.webhooks.clone())
            .with_event_observer(Arc::new(move |lag| event_lag.observe(lag.as_secs_f64())));
        if let Some((trusts, make)) = self.trusts {
            service = service.with_trusts(trusts, make);
        } else if config.auth == AuthMode::Keystone {
            // Whatever the mode now, the trusts of leases made in trust mode go with them.
            let session = blazar_openstack::Session::new(config.openstack_session()?)
                .map_err(|e| anyhow::anyhow!("keystone trusts: {e}"))?;
            let make = config.act_for_user == crate::config::ActForUser::Trust;
            service = service.with_trusts(
                Arc::new(blazar_openstack::KeystoneTrusts::new(session)),
                make,
            );
            tracing::info!(
                act_for_user = if make { "trust" } else { "project" },
                "acting for users in their projects"
            );
        }
        Ok(AppState::with_metrics(
            service,
            auth,
            metrics,
            config.observe_settings(),
        ))
    }
}

/// The service's settings the configuration gives.
fn settings(config: &Config) -> Settings {
    Settings {
        cleaning_minutes: config.cleaning_minutes,
        minutes_before_end_lease: config.minutes_before_end_lease,
        ratios: config.ratios,
        action_workers: config.action_workers,
        action_retry_for: config.action_retry_for,
        action_max_attempts: config.action_attempts,
        action_timeout: config.action_timeout,
        ..Settings::default()
    }
}

/// `--action-attempts` once counted retries up to 5 minutes apart (12 spanned about 23
/// minutes); pauses now stop at 30 s, so a cap kept from then ends retries much sooner than
/// `--action-retry-minutes`. Said once at start.
fn warn_if_attempts_cut_retries(settings: &Settings) {
    let Some(max) = settings.action_max_attempts else {
        return;
    };
    let allowed: i64 = (1..max)
        .map(|n| blazar_core::action_backoff(n).num_seconds())
        .sum();
    let span = settings.action_retry_for.as_secs();
    if u64::try_from(allowed).is_ok_and(|a| a < span) {
        tracing::warn!(
            action_attempts = max,
            retries_for_s = allowed,
            action_retry_minutes = span / 60,
            "--action-attempts ends an action's retries before --action-retry-minutes does \
             (pauses grow to 30 s); leave it unset to retry for the whole span"
        );
    }
}

/// The backend the configuration asks for.
fn backend(config: &Config) -> anyhow::Result<Arc<dyn Backend>> {
    Ok(match config.backend {
        crate::config::BackendKind::Standalone => Arc::new(StandaloneBackend),
        crate::config::BackendKind::Openstack => {
            let cloud = blazar_openstack::Cloud::new(config.openstack_session()?)
                .map_err(|e| anyhow::anyhow!("openstack backend: {e}"))?;
            let o = &config.openstack;
            tracing::info!(
                freepool = %o.freepool, interface = %o.interface,
                region = o.region.as_deref().unwrap_or("(any)"), "openstack backend"
            );
            Arc::new(blazar_openstack::OpenStackBackend::new(
                cloud,
                blazar_openstack::OpenStackSettings {
                    freepool: o.freepool.clone(),
                    owner_key: o.owner_key.clone(),
                    az_prefix: o.az_prefix.clone(),
                    server_delete_timeout: config.server_delete_wait(),
                },
            ))
        }
    })
}

/// A database URL without its password, for logs and errors.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let credentials = &url[scheme + 3..at];
            match credentials.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..scheme + 3], &url[at..]),
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}

/// Descriptors kept for everything but client connections: the database pool, log files,
/// outbound calls.
const RESERVED_FILES: u64 = 256;

/// The configured connection limits, with the bound lowered if the process may not open
/// that many files (after raising its soft limit to the hard one).
fn connection_limits(config: &Config) -> listener::ConnectionLimits {
    let mut limits = config.connections;
    if let Some(files) = listener::raise_open_file_limit() {
        let room = files
            .saturating_sub(RESERVED_FILES + u64::from(config.max_connections))
            .max(1);
        if (limits.max_connections as u64) > room {
            tracing::warn!(
                max_client_connections = limits.max_connections,
                open_file_limit = files,
                "the open-file limit is too low for max_client_connections; using {room}"
            );
            limits.max_connections = usize::try_from(room).unwrap_or(1);
        }
        tracing::debug!(
            open_file_limit = files,
            max_client_connections = limits.max_connections,
            "connection bound"
        );
    }
    limits
}

/// Runs the server until SIGINT or SIGTERM.
pub async fn run(config: Config) -> anyhow::Result<()> {
    config.check_noauth_exposure()?;
    let state = build_state(&config).await?;
    if config.auth == AuthMode::Noauth && config.serves_api() {
        tracing::warn!(
            listen = %config.listen,
            "authentication is off (noauth): every request may act as any project, admin included"
        );
    }
    // The port is taken before any work is: a process that cannot serve (the port in use)
    // must not first register as a worker and claim events, actions or notifications.
    let listener = if config.role != Role::Manager {
        Some(
            tokio::net::TcpListener::bind(config.listen)
                .await
                .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", config.listen))?,
        )
    } else {
        None
    };
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        shutdown_signal().await;
        let _ = stop_tx.send(true);
    });
    // Presence ends last: until every loop has given back what it claimed, a process killed
    // while stopping must still be found gone, so that its claims are taken over at once.
    let (presence_tx, presence_rx) = watch::channel(false);
    let wait_stop = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stopped| *stopped).await;
    };

    // Every replica compares its clock with the database's (on PostgreSQL): claims and due
    // events are judged by each replica's own clock.
    {
        let service = state.service.clone();
        let stop = wait_stop(stop_rx.clone());
        tokio::spawn(async move {
            service
                .run_clock_watch(std::time::Duration::from_secs(60), stop)
                .await
        });
    }

    // On PostgreSQL, replicas wake each other's loops and waiters when a commit left them
    // work, instead of leaving it to their next poll.
    {
        let service = state.service.clone();
        let stop = wait_stop(stop_rx.clone());
        tokio::spawn(async move { service.run_peer_signals(stop).await });
    }

    let scheduler = if config.role != Role::Api {
        // Processes that claim work say they are alive, and take over at once what one
        // that died had claimed.
        let presence = {
            let service = state.service.clone();
            let stop = wait_stop(presence_rx.clone());
            tokio::spawn(async move { service.run_presence(stop).await })
        };
        let service = state.service.clone();
        let poll = config.poll_interval;
        let stop = wait_stop(stop_rx.clone());
        tracing::info!(poll_ms = poll.as_millis() as u64, "event scheduler started");
        let scheduler = tokio::spawn(async move { service.run_scheduler(poll, stop).await });
        // Workers carry out the actions events and requests record, after their commit.
        let service = state.service.clone();
        let stop = wait_stop(stop_rx.clone());
        tracing::info!(workers = config.action_workers, "action workers started");
        let workers = tokio::spawn(async move { service.run_workers(poll, stop).await });
        // The monitor only has something to ask with a backend that knows the hosts' health.
        // Nova's notifications, when read, wake the monitor (and the reconciler) between
        // their timed passes.
        let wakes = match &config.nova_notifications {
            Some(nova) => {
                let wakes = blazar_openstack::nova_events::Wakes {
                    monitor: Arc::new(tokio::sync::Notify::new()),
                    reconciler: config
                        .reconcile_interval
                        .map(|_| Arc::new(tokio::sync::Notify::new())),
                };
                let settings = nova.listener_settings();
                // Who blazar-rs is in the cloud, asked of Keystone by the listener.
                let session = blazar_openstack::Session::new(config.openstack_session()?)
                    .map_err(|e| anyhow::anyhow!("nova notifications: {e}"))?;
                let stop = wait_stop(stop_rx.clone());
                let listening = wakes.clone();
                tokio::spawn(async move {
                    blazar_openstack::nova_events::listen(settings, listening, session, stop).await
                });
                Some(wakes)
            }
            None => None,
        };
        let monitor = match (config.monitor_interval, config.backend) {
            (Some(every), crate::config::BackendKind::Openstack) => {
                let service = state.service.clone();
                let stop = wait_stop(stop_rx.clone());
                let wake = wakes.as_ref().map(|w| w.monitor.clone());
                tracing::info!(
                    interval_s = every.as_secs(),
                    nova_notifications = wake.is_some(),
                    "host monitor started"
                );
                Some(tokio::spawn(async move {
                    service.run_monitor(every, wake, stop).await
                }))
            }
            _ => None,
        };
        let reconciler = match (config.reconcile_interval, config.backend) {
            (Some(every), crate::config::BackendKind::Openstack) => {
                let service = state.service.clone();
                let stop = wait_stop(stop_rx.clone());
                let wake = wakes.as_ref().and_then(|w| w.reconciler.clone());
                tracing::info!(
                    interval_s = every.as_secs(),
                    nova_notifications = wake.is_some(),
                    "reconciler started"
                );
                Some(tokio::spawn(async move {
                    service.run_reconciler(every, wake, stop).await
                }))
            }
            _ => None,
        };
        // Notifications go out from the processes that run events, as Blazar's manager
        // sends them; the outbox is shared, so any replica may publish any of them.
        let publisher = match &config.notifications {
            Some(notifications) => {
                let notifier =
                    blazar_openstack::RabbitNotifier::new(notifications.notifier_settings())
                        .map_err(|e| anyhow::anyhow!("notifications: {e}"))?;
                let service = state.service.clone();
                let stop = wait_stop(stop_rx.clone());
                tracing::info!(
                    transport_url = %redact(notifications.transport_url.expose()),
                    exchange = %notifications.exchange,
                    topics = ?notifications.topics,
                    "notification publisher started"
                );
                Some(tokio::spawn(async move {
                    service.run_publisher(&notifier, poll, stop).await
                }))
            }
            None => None,
        };
        // Webhook deliveries go out from the same processes; any of them may deliver any.
        let deliverer = {
            let poster = blazar_openstack::WebhookPoster::new(config.webhooks.allow_internal)
                .map_err(|e| anyhow::anyhow!("webhooks: {e}"))?;
            let service = state.service.clone();
            let stop = wait_stop(stop_rx.clone());
            tokio::spawn(async move { service.run_webhook_deliverer(&poster, poll, stop).await })
        };
        Some((
            scheduler, workers, monitor, reconciler, publisher, deliverer, presence,
        ))
    } else {
        None
    };

    if let Some(listener) = listener {
        tracing::info!(
            listen = %config.listen,
            database = %redact(&config.database_url),
            role = ?config.role,
            auth = state.auth.mode(),
            "blazar-server ready"
        );
        let limits = connection_limits(&config);
        serve_with_limits(listener, state.clone(), limits, wait_stop(stop_rx.clone())).await?;
    } else {
        tracing::info!(database = %redact(&config.database_url), "blazar-server ready (manager only)");
        wait_stop(stop_rx.clone()).await;
    }
    if let Some((scheduler, workers, monitor, reconciler, publisher, deliverer, presence)) =
        scheduler
    {
        let _ = scheduler.await;
        let _ = workers.await;
        let _ = deliverer.await;
        for task in [monitor, reconciler, publisher].into_iter().flatten() {
            let _ = task.await;
        }
        let _ = presence_tx.send(true);
        let _ = presence.await;
    }
    state.service.store().close().await;
    tracing::info!("blazar-server stopped");
    Ok(())
}

/// Serves the API on `listener` with the default connection limits until `shutdown`
/// completes, letting requests in flight finish.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_with_limits(
        listener,
        state,
        listener::ConnectionLimits::default(),
        shutdown,
    )
    .await
}

/// Serves the API on `listener` under `limits` until `shutdown` completes.
pub async fn serve_with_limits(
    listener: tokio::net::TcpListener,
    state: AppState,
    limits: listener::ConnectionLimits,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app =
        tower::util::MapRequestLayer::new(app::strip_json_suffix).layer(app::router(state.clone()));
    // Event streams and long polls end first, or a graceful shutdown would wait for them.
    let shutdown = async move {
        shutdown.await;
        state.stop_watchers();
    };
    listener::serve(listener, app, limits, shutdown).await
}

async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::error!(error = %e, "cannot listen for SIGINT");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = terminate => {},
    }
    tracing::info!("shutting down");
}
