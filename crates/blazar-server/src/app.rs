//! The router: Blazar's v1 routes, version discovery, health, readiness and metrics, and the
//! middleware every response goes through (request ids, metrics, microversion headers,
//! `.json` suffixes, body limit).

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, patch, post};
use blazar_service::{AllocationKind, Reallocated};
use tracing::Instrument;

use crate::convert::{Envelope, to_wire};
use crate::error::{ApiError, framework_error, method_not_allowed_fallback, not_found_fallback};
use crate::state::AppState;
use crate::{calendar, hosts, ical, inventory, leases, quotas, timeline, webhooks};

/// Largest request body accepted; a lease request is a few kilobytes.
pub const MAX_BODY_BYTES: usize = 1024 * 1024;

pub fn router(state: AppState) -> Router {
    let v1 = Router::new()
        .route(
            "/leases",
            get(leases::list_leases).post(leases::create_lease),
        )
        .route(
            "/leases/{lease_id}",
            get(leases::show_lease)
                .put(leases::update_lease)
                .delete(leases::delete_lease),
        )
        .route("/leases/offers", post(leases::lease_offers))
        .route("/leases/events", get(leases::lease_events))
        .route("/leases/{lease_id}/extension", get(leases::lease_extension))
        .route("/leases/{lease_id}/actions", get(leases::lease_actions))
        .route("/actions", get(leases::list_actions))
        // Chameleon's per-lease views.
        .route("/leases/{lease_id}/hosts", get(leases::lease_hosts))
        .route("/leases/{lease_id}/networks", get(leases::lease_networks))
        .route("/leases/{lease_id}/devices", get(leases::lease_devices))
        .route("/os-hosts", get(hosts::list_hosts).post(hosts::create_host))
        .route(
            "/os-hosts/allocations",
            get(|s, c, q| inventory::allocations(s, c, q, AllocationKind::Hosts)),
        )
        .route(
            "/os-hosts/properties",
            get(|s, c, q| inventory::properties(s, c, q, AllocationKind::Hosts)),
        )
        .route("/os-hosts/timeline", get(timeline::host_timeline))
        .route(
            "/os-hosts/timeline/properties",
            get(timeline::host_timeline_properties),
        )
        .route(
            "/os-hosts/properties/{property_name}",
            patch(|s, c, p, b| inventory::update_property(s, c, p, b, AllocationKind::Hosts)),
        )
        .route(
            "/os-hosts/{host_id}",
            get(hosts::show_host)
                .put(hosts::update_host)
                .delete(hosts::delete_host),
        )
        .route(
            "/os-hosts/{host_id}/allocation",
            get(|s, c, p, q| inventory::allocation(s, c, p, q, AllocationKind::Hosts))
                .put(|s, c, p, b| hosts::reallocate(s, c, p, b, Reallocated::Host)),
        )
        .route("/handovers", get(hosts::list_handovers))
        .route("/reconcile", post(hosts::reconcile))
        .route("/notifications", get(inventory::list_notifications))
        .route("/quotas", get(quotas::list_quotas))
        .route("/ical-feeds", get(ical::list_feeds).post(ical::create_feed))
        .route("/ical-feeds/{feed_id}", delete(ical::delete_feed))
        .route(
            "/webhooks",
            get(webhooks::list_webhooks).post(webhooks::create_webhook),
        )
        .route(
            "/webhooks/{webhook_id}",
            get(webhooks::get_webhook).delete(webhooks::delete_webhook),
        )
        .route(
            "/webhooks/{webhook_id}/deliveries",
            get(webhooks::list_deliveries),
        )
        .route(
            "/webhooks/{webhook_id}/deliveries/{delivery_id}/redeliver",
            post(webhooks::redeliver),
        )
        .route(
            "/quotas/{project_id}",
            get(quotas::show_quota)
                .put(quotas::update_quota)
                .delete(quotas::delete_quota),
        )
        .nest("/floatingips", inventory::floatingip_routes())
        .nest("/networks", inventory::network_routes())
        .nest("/devices", inventory::device_routes())
        .nest("/flavors", inventory::flavor_routes())
        .fallback(not_found_fallback)
        .method_not_allowed_fallback(method_not_allowed_fallback)
        .layer(middleware::from_fn(microversion))
        // Outside the microversion check, as keystonemiddleware wraps Blazar's app; inside
        // request ids, so a 401 carries one too. `/`, `/versions`, `/healthz` and the
        // calendar page stay open (the page's data calls carry the user's token).
        .layer(middleware::from_fn_with_state(state.clone(), authenticate));

    Router::new()
        .route("/", get(versions))
        .route("/versions", get(versions))
        .route("/healthz", get(health))
        .route("/readyz", get(ready))
        .route("/metrics", get(crate::metrics::metrics))
        .nest("/v1", v1)
        .merge(calendar::routes())
        .merge(ical::routes())
        .fallback(not_found_fallback)
        .method_not_allowed_fallback(method_not_allowed_fallback)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(middleware::from_fn(dry_run_only_where_taken))
        // Inside request ids, so that what it logs carries them.
        .layer(middleware::from_fn_with_state(
            state.clone(),
            crate::metrics::track,
        ))
        .layer(middleware::from_fn(request_id))
        .with_state(state)
}

/// `?dry_run` is taken by lease creates and updates, and by `POST /v1/reconcile`. Elsewhere
/// a change asked for as a dry run is refused rather than carried out (other query
/// parameters a route does not know are ignored, as Blazar ignores them, but this one asks
/// not to change anything).
async fn dry_run_only_where_taken(req: Request, next: Next) -> Response {
    let asks = req.uri().query().is_some_and(|q| {
        q.split('&')
            .any(|pair| pair.split('=').next() == Some("dry_run"))
    });
    if asks && !matches!(req.method(), &Method::GET | &Method::HEAD) {
        let path = req.uri().path().trim_end_matches('/');
        let lease_write = match path.strip_prefix("/v1/leases") {
            // Offers change nothing either way.
            Some("") | Some("/offers") => req.method() == Method::POST,
            Some(rest) => {
                req.method() == Method::PUT && rest.starts_with('/') && !rest[1..].contains('/')
            }
            None => path == "/v1/reconcile" && req.method() == Method::POST,
        };
        if !lease_write {
            return ApiError::bad_request(
                "dry_run is taken by lease creates and updates and by reconciliations only; \
                 nothing was changed",
            )
            .into_response();
        }
    }
    next.run(req).await
}

/// Blazar serves every route with a `.json` suffix too. Rewriting must happen before routing,
/// so it wraps the router rather than being one of its layers.
pub fn strip_json_suffix(mut req: Request) -> Request {
    let path = req.uri().path();
    if let Some(stripped) = path.strip_suffix(".json")
        && !stripped.is_empty()
        && stripped != "/"
    {
        let mut new = stripped.to_string();
        if let Some(q) = req.uri().query() {
            new.push('?');
            new.push_str(q);
        }
        if let Ok(uri) = new.parse() {
            *req.uri_mut() = uri;
        }
    }
    req
}

/// oslo.middleware's `request_id` and `global_request_id`: every response gets an id of its
/// own in `x-openstack-request-id`; an inbound `X-OpenStack-Request-Id: req-<uuid>` is the
/// global id that outbound calls caused by the request carry (ours when there is none, or
/// it is malformed).
async fn request_id(req: Request, next: Next) -> Response {
    let id = format!("req-{}", uuid::Uuid::new_v4());
    // The global request id (oslo's): the caller's, when it sent a well-formed one, else
    // ours. Actions this request records carry it to the calls they make.
    let global = req
        .headers()
        .get("x-openstack-request-id")
        .and_then(|v| v.to_str().ok())
        .filter(|v| {
            v.strip_prefix("req-")
                .is_some_and(|u| uuid::Uuid::parse_str(u).is_ok())
        })
        .map(str::to_string)
        .unwrap_or_else(|| id.clone());
    // Every log line of the request carries both ids, as oslo.log shows `request_id` and
    // `global_request_id`.
    let span = tracing::info_span!(
        "request",
        request.id = %id,
        request.global_id = %global,
        http.method = %req.method(),
    );
    let mut response = blazar_service::with_request_id(global, next.run(req))
        .instrument(span)
        .await;
    if let Ok(value) = HeaderValue::from_str(&id) {
        response
            .headers_mut()
            .insert("x-openstack-request-id", value);
    }
    response
}

/// The version a request asked for with `OpenStack-API-Version: reservation X.Y`.
fn requested_version(headers: &HeaderMap) -> Result<String, Box<Response>> {
    let mut requested: Option<String> = None;
    for value in headers.get_all("openstack-api-version") {
        let Ok(text) = value.to_str() else { continue };
        for item in text.split(',') {
            let mut words = item.split_whitespace();
            if let (Some(service), Some(version)) = (words.next(), words.next())
                && service.eq_ignore_ascii_case("reservation")
            {
                requested = Some(version.to_string());
            }
        }
    }
    let Some(version) = requested else {
        return Ok("1.0".to_string());
    };
    if version.eq_ignore_ascii_case("latest") {
        return Ok("1.0".to_string());
    }
    let well_formed = version.split_once('.').is_some_and(|(major, minor)| {
        let digits = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_digit());
        digits(major)
            && digits(minor)
            && !major.starts_with('0')
            && (minor == "0" || !minor.starts_with('0'))
    });
    if !well_formed {
        return Err(Box::new(framework_error(
            StatusCode::BAD_REQUEST,
            &format!(
                "API Version String {version} is of invalid format. Must be of format MajorNum.MinorNum."
            ),
        )));
    }
    if version != "1.0" {
        return Err(Box::new(framework_error(
            StatusCode::NOT_ACCEPTABLE,
            &format!(
                "Version {version} is not supported by the API. Minimum is 1.0 and maximum is 1.0."
            ),
        )));
    }
    Ok(version)
}

async fn microversion(req: Request, next: Next) -> Response {
    let version = match requested_version(req.headers()) {
        Ok(v) => v,
        Err(response) => return *response,
    };
    let mut response = next.run(req).await;
    let headers = response.headers_mut();
    if let Ok(value) = HeaderValue::from_str(&format!("reservation {version}")) {
        headers.insert("openstack-api-version", value);
    }
    headers.insert("vary", HeaderValue::from_static("OpenStack-API-Version"));
    response
}

async fn versions(headers: HeaderMap) -> Response {
    let host = headers
        .get("host")
        .and_then(|h| h.to_str().ok())
        .unwrap_or("127.0.0.1:1234");
    let body = Envelope("versions", [to_wire::version(host)]);
    (StatusCode::MULTIPLE_CHOICES, axum::Json(body)).into_response()
}

/// `GET /healthz` (liveness): 200 while the database answers, or while every connection is
/// in use (`busy`); 503 when no connection can be had otherwise.
async fn health(axum::extract::State(state): axum::extract::State<AppState>) -> Response {
    let store = state.service.store();
    let attempt = tokio::time::timeout(HEALTH_WAIT, store.read()).await;
    let Ok(opened) = attempt else {
        // Every connection busy (writers queued behind a long change, say) is not an
        // unreachable database: restarting the process would not help it, and a liveness
        // probe must not do that to every replica at once.
        if store.pool_saturated() {
            return (StatusCode::OK, axum::Json(to_wire::health("busy"))).into_response();
        }
        tracing::error!("health check: no database connection within {HEALTH_WAIT:?}");
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(to_wire::health("database unreachable")),
        )
            .into_response();
    };
    match opened {
        Ok(tx) => {
            let _ = tx.commit().await;
            (StatusCode::OK, axum::Json(to_wire::health("ok"))).into_response()
        }
        Err(e) => {
            tracing::error!(error = %e, "health check: database unreachable");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                axum::Json(to_wire::health("database unreachable")),
            )
                .into_response()
        }
    }
}

/// How long `/healthz` waits for a database connection before it judges.
const HEALTH_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// `GET /readyz`: 200 when the database answers and has every migration this build knows,
/// 503 otherwise (a load balancer then sends requests elsewhere).
async fn ready(State(state): State<AppState>) -> Response {
    match state.service.store().pending_migrations().await {
        Ok(pending) if pending.is_empty() => {
            (StatusCode::OK, axum::Json(to_wire::health("ok"))).into_response()
        }
        Ok(pending) => {
            tracing::warn!(migrations.pending = ?pending, "not ready: migrations not applied");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                axum::Json(to_wire::health("migrations not applied")),
            )
                .into_response()
        }
        Err(e) => {
            tracing::warn!(error = %e, "not ready: database unreachable");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                axum::Json(to_wire::health("database unreachable")),
            )
                .into_response()
        }
    }
}

/// Middleware: establishes who the request acts as before any handler runs, or answers 401.
/// The identity travels in the request's extensions, where `Caller` finds it.
pub async fn authenticate(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    // Marked sensitive, the token shows as "Sensitive" in any debug output of the headers.
    for name in ["x-auth-token", "x-subject-token"] {
        if let Some(value) = req.headers_mut().get_mut(name) {
            value.set_sensitive(true);
        }
    }
    match state.auth.identify(req.headers()).await {
        Ok(identity) => {
            req.extensions_mut().insert(identity);
            next.run(req).await
        }
        Err(failure) => {
            // Inside a nested router the URI has lost its prefix; the original keeps it.
            let path = req
                .extensions()
                .get::<axum::extract::OriginalUri>()
                .map_or_else(
                    || req.uri().path().to_string(),
                    |uri| uri.path().to_string(),
                );
            tracing::debug!(
                auth.mode = state.auth.mode(),
                http.path = %path,
                "request not authenticated"
            );
            failure.into_response()
        }
    }
}
