//! Prometheus metrics: requests by route template and status with their latency, lease
//! refusals by what refused, how late events ran (counted as they happen), and, read from
//! the database at each scrape, leases by status, the notification outbox, the action
//! backlog and the connection pools.
//!
//! Labels only take bounded values: the route is the matched template
//! (`/v1/leases/{lease_id}`), never the path, so a client probing random URLs adds nothing.

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use axum::Extension;
use axum::extract::{ConnectInfo, MatchedPath, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::error::RefusalLabel;
use crate::state::AppState;

/// Who may read `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum MetricsAccess {
    /// Clients on the loopback address only (a scraper on the same host, or a sidecar).
    #[default]
    Loopback,
    /// Anyone who can reach the API port (the counts reveal no names).
    Open,
    /// Requests authenticated as an admin (the scraper sends a token).
    Admin,
}

type HttpLabels = [(&'static str, String); 3];
type ReasonLabel = [(&'static str, &'static str); 1];
type StatusLabel = [(&'static str, String); 1];

fn request_histogram() -> Histogram {
    // 1 ms to about 16 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 15))
}

/// Every metric of one server; each state has its own registry, so tests never share one.
pub struct Metrics {
    registry: Registry,
    requests: Family<HttpLabels, Counter>,
    durations: Family<HttpLabels, Histogram, fn() -> Histogram>,
    refusals: Family<ReasonLabel, Counter>,
    event_lag: Histogram,
    leases: Family<StatusLabel, Gauge>,
    unsent_notifications: Gauge,
    webhook_pending: Gauge,
    webhook_dead: Gauge,
    open_actions: Gauge,
    failed_actions: Gauge,
    database_up: Gauge,
    clock_skew: Gauge<f64, AtomicU64>,
    pool_open: Gauge,
    pool_idle: Gauge,
    pool_max: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("blazar");
        let requests = Family::<HttpLabels, Counter>::default();
        registry.register(
            "http_requests",
            "HTTP requests answered, by route template, method and status",
            requests.clone(),
        );
        let durations: Family<HttpLabels, Histogram, fn() -> Histogram> =
            Family::new_with_constructor(request_histogram);
        registry.register(
            "http_request_duration_seconds",
            "Time to answer a request (until the response head; streamed bodies excluded)",
            durations.clone(),
        );
        let refusals = Family::<ReasonLabel, Counter>::default();
        registry.register(
            "lease_refusals",
            "Lease creates and updates refused, by what refused them (resources, enforcement, policy, request, conflict, not_found)",
            refusals.clone(),
        );
        // 100 ms to about 27 min.
        let event_lag = Histogram::new(exponential_buckets(0.1, 2.0, 15));
        registry.register(
            "event_lag_seconds",
            "How late lease events ran after they were due",
            event_lag.clone(),
        );
        let leases = Family::<StatusLabel, Gauge>::default();
        registry.register("leases", "Leases by status", leases.clone());
        let gauge = |registry: &mut Registry, name: &str, help: &str| {
            let g = Gauge::default();
            registry.register(name, help, g.clone());
            g
        };
        let unsent_notifications = gauge(
            &mut registry,
            "outbox_unsent_notifications",
            "Notifications in the outbox not published yet",
        );
        let webhook_pending = gauge(
            &mut registry,
            "webhook_deliveries_pending",
            "Webhook deliveries waiting for their next attempt",
        );
        let webhook_dead = gauge(
            &mut registry,
            "webhook_deliveries_dead",
            "Webhook deliveries given up on after their last attempt",
        );
        let open_actions = gauge(
            &mut registry,
            "actions_open",
            "Outside-world actions pending or running",
        );
        let failed_actions = gauge(
            &mut registry,
            "actions_failed",
            "Outside-world actions given up on after their last attempt, ever (only grows: \
             alert on an increase)",
        );
        let database_up = gauge(
            &mut registry,
            "database_up",
            "1 when the last scrape could read the database",
        );
        let pool_open = gauge(
            &mut registry,
            "database_connections_open",
            "Database connections open (idle or in use)",
        );
        let pool_idle = gauge(
            &mut registry,
            "database_connections_idle",
            "Database connections open and idle",
        );
        let pool_max = gauge(
            &mut registry,
            "database_connections_max",
            "Database connections the pools may open",
        );
        let clock_skew = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "clock_skew_seconds",
            "How far the database's clock is ahead of this process's, behind when negative \
             (PostgreSQL; 0 on SQLite, whose clock is the process's own)",
            clock_skew.clone(),
        );
        Metrics {
            registry,
            requests,
            durations,
            refusals,
            event_lag,
            leases,
            unsent_notifications,
            webhook_pending,
            webhook_dead,
            open_actions,
            failed_actions,
            database_up,
            pool_open,
            pool_idle,
            pool_max,
            clock_skew,
        }
    }

    /// The histogram the scheduler reports event lateness to.
    pub fn event_lag(&self) -> Histogram {
        self.event_lag.clone()
    }

    fn observe_request(
        &self,
        route: String,
        method: &Method,
        status: StatusCode,
        elapsed: Duration,
        refusal: Option<RefusalLabel>,
    ) {
        let labels: HttpLabels = [
            ("route", route),
            ("method", method_label(method).to_string()),
            ("status", status.as_u16().to_string()),
        ];
        self.requests.get_or_create(&labels).inc();
        self.durations
            .get_or_create(&labels)
            .observe(elapsed.as_secs_f64());
        if let Some(RefusalLabel(reason)) = refusal {
            self.refusals.get_or_create(&[("reason", reason)]).inc();
        }
    }

    /// The exposition, with the database counts read now.
    async fn render(&self, service: &blazar_service::Service) -> Result<String, std::fmt::Error> {
        match service.monitoring().await {
            Ok(m) => {
                self.database_up.set(1);
                // Every status is shown, so one that emptied reads 0 rather than its last
                // count.
                for status in blazar_core::LeaseStatus::ALL {
                    let count = m
                        .leases
                        .iter()
                        .find(|(s, _)| s == status.as_str())
                        .map_or(0, |(_, n)| *n);
                    self.leases
                        .get_or_create(&[("status", status.as_str().to_string())])
                        .set(count);
                }
                self.unsent_notifications.set(m.unsent_notifications);
                self.webhook_pending.set(m.webhook_pending);
                self.webhook_dead.set(m.webhook_dead);
                self.open_actions.set(m.open_actions);
                self.failed_actions.set(m.failed_actions);
                self.pool_open.set(i64::from(m.pool.open));
                self.pool_idle.set(i64::from(m.pool.idle));
                self.pool_max.set(i64::from(m.pool.max));
                self.clock_skew
                    .set(m.clock_skew.map_or(0.0, |skew| skew.as_seconds_f64()));
            }
            Err(e) => {
                tracing::warn!(error = %e, "metrics: cannot read the database");
                self.database_up.set(0);
            }
        }
        let mut text = String::new();
        encode(&mut text, &self.registry)?;
        Ok(text)
    }
}

/// Methods as labels: the standard ones, anything else as `other` (bounded).
fn method_label(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        _ => "other",
    }
}

/// Middleware: counts and times every request under its route template.
pub async fn track(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |p| p.as_str().to_string());
    let method = req.method().clone();
    let started = std::time::Instant::now();
    let response = next.run(req).await;
    state.metrics.observe_request(
        route,
        &method,
        response.status(),
        started.elapsed(),
        response.extensions().get::<RefusalLabel>().copied(),
    );
    response
}

/// `GET /metrics`: the Prometheus (OpenMetrics) text exposition, to whom `metrics_access`
/// allows.
pub async fn metrics(
    State(state): State<AppState>,
    peer: Option<Extension<ConnectInfo<std::net::SocketAddr>>>,
    headers: HeaderMap,
) -> Response {
    let allowed = match state.observe.metrics_access {
        MetricsAccess::Open => true,
        MetricsAccess::Loopback => {
            peer.is_some_and(|Extension(ConnectInfo(addr))| addr.ip().is_loopback())
        }
        MetricsAccess::Admin => match state.auth.identify(&headers).await {
            Ok(identity) => identity.is_admin(),
            Err(failure) => return failure.into_response(),
        },
    };
    if !allowed {
        return crate::error::framework_error(
            StatusCode::FORBIDDEN,
            "Metrics are not available to this client.",
        );
    }
    match state.metrics.render(&state.service).await {
        Ok(text) => (
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static(
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                ),
            )],
            text,
        )
            .into_response(),
        Err(e) => {
            tracing::error!(error = %e, "metrics: cannot encode");
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    }
}
