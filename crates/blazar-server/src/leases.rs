//! `/v1/leases`: handlers.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;

use crate::extract::Path;
use axum::http::{HeaderValue, StatusCode};
use axum::response::IntoResponse;
use axum::response::sse::{Event, KeepAlive, Sse};
use blazar_api::PoolResource;
use blazar_core::LeaseFilter;
use blazar_core::{LeaseStatus, LeaseView};
use blazar_service::{Identity, LeaseBatch, LeaseList, Listed, Look, ServiceResult};

use crate::convert::{Envelope, from_wire, to_wire};
use crate::error::{ApiError, ApiResult};
use crate::extract::{Caller, JsonObject, Query, Wire};
use crate::lease_cache::LeaseCache;
use crate::state::AppState;
use crate::stream::{Batches, Pieces, stream_json};

pub async fn list_leases(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Query(query): Query,
) -> ApiResult<impl IntoResponse> {
    // Blazar takes no filter here (it lists every lease whatever the query): an empty
    // value filters nothing, as if it were not given.
    let given = |key: &str| query.get(key).filter(|v| !v.is_empty()).cloned();
    if let Some(status) = given("status")
        && status.parse::<LeaseStatus>().is_err()
    {
        let known: Vec<&str> = LeaseStatus::ALL.iter().map(|s| s.as_str()).collect();
        return Err(ApiError::bad_request(format!(
            "Invalid lease status {status}; use one of {}",
            known.join(", ")
        )));
    }
    let filter = LeaseFilter {
        project_id: given("project_id"),
        user_id: given("user_id"),
        status: given("status"),
        name: given("name"),
        ..LeaseFilter::default()
    };
    let list = state.service.lease_list(&identity, &filter).await?;
    let source = LeaseStream {
        list,
        cache: state.leases.clone(),
    };
    stream_json(br#"{"leases":["#.to_vec(), source).await
}

/// A lease list written a batch of leases at a time as the client reads it. Leases rendered
/// by an earlier list are reused while their revision stands (see `lease_cache`); the bytes
/// are those `Envelope("leases", ...)` would write.
struct LeaseStream {
    list: LeaseList,
    cache: Arc<LeaseCache>,
}

impl Batches for LeaseStream {
    type Batch = LeaseBatch<Bytes>;

    async fn next_batch(&mut self) -> ServiceResult<Option<LeaseBatch<Bytes>>> {
        let cache = &self.cache;
        self.list
            .next_batch(|id, revision| cache.get(id, revision))
            .await
    }

    fn write_batch(&self, batch: LeaseBatch<Bytes>, out: &mut Pieces, mut written: bool) -> bool {
        for entry in batch.leases {
            let json = match entry {
                Listed::Kept(json) => json,
                Listed::Fresh(revision, view) => {
                    let id = view.lease.id.clone();
                    match serde_json::to_vec(&to_wire::lease(*view)) {
                        Ok(json) => {
                            let json = Bytes::from(json);
                            self.cache.insert(id, revision, json.clone());
                            json
                        }
                        // Strings and numbers always serialise; should one not, the answer
                        // stays valid.
                        Err(e) => {
                            tracing::error!(error = %e, lease.id = %id, "lease left out of a list");
                            continue;
                        }
                    }
                }
            };
            // The rendering the cache holds, not a copy of it, and a static comma: nothing
            // is allocated per lease.
            if written {
                out.shared(Bytes::from_static(b","));
            }
            out.shared(json);
            written = true;
        }
        written
    }

    fn suffix(&self) -> Vec<u8> {
        b"]}".to_vec()
    }
}

/// `POST /v1/leases`; with `?dry_run=true` the same answer (the would-be lease, with what
/// each reservation would be granted as `allocations`, or the same refusal) and nothing
/// written. A refusal carries `reasons` beside Blazar's message.
pub async fn create_lease(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Query(query): Query,
    headers: axum::http::HeaderMap,
    Wire(body): Wire<blazar_api::NewLease>,
) -> ApiResult<impl IntoResponse> {
    async {
        let dry_run = crate::reply::strict_flag(&query, "dry_run")?;
        let mut request = from_wire::new_lease(body)?;
        // The caller's Keystone token makes the lease's trust (act_for_user = trust); a
        // dry run makes none.
        if !dry_run && state.service.makes_trusts() {
            request.user_token = crate::auth::user_token(&headers);
        }
        let lease = if dry_run {
            let tried = state
                .service
                .dry_run_create_lease(&identity, &request)
                .await?;
            let withheld = state
                .service
                .withheld_grants(&identity, &tried.view)
                .await?;
            to_wire::lease_with_grants(tried.view, &tried.grants, &withheld)
        } else {
            to_wire::lease(state.service.create_lease(&identity, &request).await?)
        };
        Ok((StatusCode::CREATED, Envelope("lease", lease)))
    }
    .await
    .map_err(ApiError::explained)
}

/// `POST /v1/leases/offers` (additive): the windows in which a lease request fits.
pub async fn lease_offers(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Wire(body): Wire<blazar_api::OfferRequest>,
) -> ApiResult<impl IntoResponse> {
    // Refused as a create with the same request is, reasons included.
    async {
        let request = from_wire::offer_request(body)?;
        let offers = state.service.lease_offers(&identity, &request).await?;
        Ok(Json(to_wire::offers(offers)))
    }
    .await
    .map_err(ApiError::explained)
}

/// `GET /v1/leases/{id}/extension` (additive): whether and how far a lease can be extended.
pub async fn lease_extension(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Path(id): Path<String>,
    Query(query): Query,
) -> ApiResult<impl IntoResponse> {
    let ask = from_wire::extension_ask(&query)?;
    let extension = state.service.lease_extension(&identity, &id, ask).await?;
    Ok(Envelope("extension", to_wire::extension(extension)))
}

/// `GET /v1/leases/{id}/actions`: what was done in the cloud for the lease (additive).
pub async fn lease_actions(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Path(id): Path<String>,
) -> ApiResult<impl IntoResponse> {
    let actions = state.service.lease_actions(&identity, &id).await?;
    let actions: Vec<_> = actions.iter().map(to_wire::action).collect();
    Ok(Envelope("actions", actions))
}

/// `GET /v1/actions` (additive): actions of every lease the caller may see, deleted leases
/// included, newest first, a page at a time.
pub async fn list_actions(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Query(query): Query,
) -> ApiResult<impl IntoResponse> {
    let filter = from_wire::action_filter(&query)?;
    let actions = state.service.list_actions(&identity, &filter).await?;
    let actions: Vec<_> = actions.iter().map(to_wire::action).collect();
    Ok(Envelope("actions", actions))
}

/// `GET /v1/leases/{id}/hosts` (Chameleon): the hosts of the lease's host reservations.
pub async fn lease_hosts(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Path(id): Path<String>,
) -> ApiResult<impl IntoResponse> {
    let hosts: Vec<_> = state
        .service
        .lease_hosts(&identity, &id)
        .await?
        .into_iter()
        .map(to_wire::host)
        .collect();
    Ok(Envelope("hosts", hosts))
}

async fn lease_pool(
    state: &AppState,
    identity: &blazar_service::Identity,
    id: &str,
    kind: &str,
) -> ApiResult<Vec<PoolResource>> {
    Ok(state
        .service
        .lease_pool_resources(identity, id, kind)
        .await?
        .into_iter()
        .map(|r| to_wire::pool_resource(r, false))
        .collect())
}

/// `GET /v1/leases/{id}/networks` (Chameleon): the segments of its network reservations.
pub async fn lease_networks(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Path(id): Path<String>,
) -> ApiResult<impl IntoResponse> {
    let networks = lease_pool(&state, &identity, &id, "network").await?;
    Ok(Envelope("networks", networks))
}

/// `GET /v1/leases/{id}/devices` (Chameleon): the devices of its device reservations.
pub async fn lease_devices(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Path(id): Path<String>,
) -> ApiResult<impl IntoResponse> {
    let devices = lease_pool(&state, &identity, &id, "device").await?;
    Ok(Envelope("devices", devices))
}

/// How long a long poll waits when it names no `timeout`.
const DEFAULT_WAIT: Duration = Duration::from_secs(30);

/// `GET /v1/leases/{id}`; with `?allocations=true` each reservation also lists what it was
/// granted (`allocations`: resource type and id, dates, units), which Blazar's object lacks.
/// With `?wait_for=STATUS[&timeout=S]` (additive) it answers once the lease is in that
/// status or can no longer get there, or after the timeout with the lease as it is then;
/// such an answer carries `Blazar-Wait-For`, so a client knows the server waited.
pub async fn show_lease(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Path(id): Path<String>,
    Query(query): Query,
    headers: axum::http::HeaderMap,
) -> ApiResult<axum::response::Response> {
    let (lease, waited) = match query.get("wait_for") {
        None => (state.service.get_lease(&identity, &id).await?, None),
        Some(target) => {
            let target: LeaseStatus = target.to_ascii_uppercase().parse().map_err(|_| {
                let known: Vec<&str> = LeaseStatus::ALL.iter().map(|s| s.as_str()).collect();
                ApiError::bad_request(format!(
                    "Invalid wait_for status {target}; use one of {}",
                    known.join(", ")
                ))
            })?;
            let timeout = match query.get("timeout") {
                None => DEFAULT_WAIT,
                Some(text) => match text.parse::<f64>() {
                    Ok(s) if s.is_finite() && s >= 0.0 => Duration::from_secs_f64(s.min(86_400.0)),
                    _ => {
                        return Err(ApiError::bad_request(format!(
                            "Invalid timeout {text}; give a number of seconds"
                        )));
                    }
                },
            }
            .min(state.observe.max_wait);
            let Some(_permit) = state.waiter(&identity.project_id) else {
                // No wait to spare: a lease that is unknown, in the status, or past it is
                // still answered (404, or the lease); only a real wait is refused.
                let lease = state.service.get_lease(&identity, &id).await?;
                if lease.lease.status == target || !lease.lease.status.can_still_become(target) {
                    return waited_reply(&state, &identity, &id, &query, lease, target).await;
                }
                return Ok(crate::error::too_many_waiters());
            };
            let mut stopping = state.stopping.clone();
            let began = std::time::Instant::now();
            let lease = tokio::select! {
                waited = state.service.wait_for_lease(&identity, &id, target, timeout) => waited?,
                () = stopped(&mut stopping) => state.service.get_lease(&identity, &id).await?,
            };
            // A wait past the token recheck interval asks who the caller is again before it
            // answers, as an event stream does: a token revoked meanwhile gets its 401.
            if began.elapsed() >= state.observe.recheck {
                match state.auth.identify(&headers).await {
                    Ok(now) if now == identity => {}
                    Ok(_) => return Ok(state.auth.unauthorized().into_response()),
                    Err(failure) => return Ok(failure.into_response()),
                }
            }
            (lease, Some(target))
        }
    };
    match waited {
        Some(target) => waited_reply(&state, &identity, &id, &query, lease, target).await,
        None => lease_reply(&state, &identity, &id, &query, lease).await,
    }
}

async fn lease_reply(
    state: &AppState,
    identity: &Identity,
    id: &str,
    query: &std::collections::HashMap<String, String>,
    lease: LeaseView,
) -> ApiResult<axum::response::Response> {
    let body = if crate::reply::flag(query, "allocations") {
        let grants = state.service.lease_grants(identity, id).await?;
        // The lease's own holdings, booked: its project may see them.
        to_wire::lease_with_grants(lease, &grants, &Default::default())
    } else {
        to_wire::lease(lease)
    };
    Ok(Envelope("lease", body).into_response())
}

/// The lease after a `wait_for`, marked so that the client knows the server waited.
async fn waited_reply(
    state: &AppState,
    identity: &Identity,
    id: &str,
    query: &std::collections::HashMap<String, String>,
    lease: LeaseView,
    target: LeaseStatus,
) -> ApiResult<axum::response::Response> {
    let mut response = lease_reply(state, identity, id, query, lease).await?;
    if let Ok(value) = HeaderValue::from_str(target.as_str()) {
        response.headers_mut().insert("blazar-wait-for", value);
    }
    Ok(response)
}

/// `GET /v1/leases/events` (additive): the lease events of the caller's project (an
/// admin's: every project's, or `?project_id=`'s) as server-sent events, each one's data a
/// JSON object and its id the event's place in the outbox. Starts after `Last-Event-ID`
/// (or `?after=`), else with the events from now on; a stream cut resumes where it stopped.
pub async fn lease_events(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Query(query): Query,
    headers: axum::http::HeaderMap,
) -> ApiResult<axum::response::Response> {
    let after =
        match headers
            .get("last-event-id")
            .map(|v| v.to_str().unwrap_or("").trim().to_string())
            .or_else(|| query.get("after").cloned())
        {
            None => None,
            Some(text) if text.is_empty() => None,
            // Event ids count up from 1 (0: before the first).
            Some(text) => Some(text.parse::<i64>().ok().filter(|id| *id >= 0).ok_or_else(
                || ApiError::bad_request(format!("Invalid event id {text}; give an event's id")),
            )?),
        };
    let Some(permit) = state.waiter(&identity.project_id) else {
        return Ok(crate::error::too_many_waiters());
    };
    let reader = state
        .service
        .lease_events(
            &identity,
            after,
            // Empty is no filter, as on the other lists.
            query.get("project_id").filter(|p| !p.is_empty()).cloned(),
        )
        .await?;
    // What identifies the caller, kept to ask again while the stream is open.
    let mut credentials = axum::http::HeaderMap::new();
    for name in ["x-auth-token", "x-project-id", "x-user-id", "x-roles"] {
        if let Some(value) = headers.get(name) {
            credentials.insert(name, value.clone());
        }
    }
    let stream = EventStream {
        service: state.service.clone(),
        reader,
        pending: std::collections::VecDeque::new(),
        changes: state.service.lease_changes(),
        stopping: state.stopping.clone(),
        caller: Recheck {
            auth: state.auth.clone(),
            credentials,
            identity,
            every: state.observe.recheck,
            last: std::time::Instant::now(),
        },
        look: Look::Changed,
        _permit: permit,
    };
    let events = futures::stream::unfold(stream, EventStream::next);
    Ok(Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response())
}

/// Completes when the server starts stopping.
async fn stopped(stopping: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = stopping.wait_for(|stopped| *stopped).await;
}

/// The state of one event stream; it holds a waiter permit for as long as it is open.
struct EventStream {
    service: blazar_service::Service,
    reader: blazar_service::LeaseEvents,
    pending: std::collections::VecDeque<blazar_core::SequencedNotification>,
    changes: tokio::sync::watch::Receiver<u64>,
    stopping: tokio::sync::watch::Receiver<bool>,
    caller: Recheck,
    /// Why it looks at the outbox next.
    look: Look,
    _permit: crate::state::WaiterPermit,
}

/// A stream's caller, identified again every so often: a token revoked or expired while
/// the stream is open ends it, as it would refuse the caller's next request.
struct Recheck {
    auth: std::sync::Arc<crate::auth::Auth>,
    credentials: axum::http::HeaderMap,
    identity: blazar_service::Identity,
    every: std::time::Duration,
    last: std::time::Instant,
}

impl Recheck {
    /// Whether the caller is still who the stream was opened for (asked when due). Anything
    /// else ends the stream, an authentication service that cannot answer included: the
    /// client reconnects with its last event id once it is back.
    async fn holds(&mut self) -> bool {
        if self.last.elapsed() < self.every {
            return true;
        }
        self.last = std::time::Instant::now();
        match self.auth.identify(&self.credentials).await {
            Ok(identity) if identity == self.identity => true,
            Ok(_) => {
                tracing::info!(user.id = %self.identity.user_id, "event stream ended: its caller's token now says otherwise");
                false
            }
            Err(_) => {
                tracing::info!(user.id = %self.identity.user_id, "event stream ended: its caller's token no longer holds");
                false
            }
        }
    }
}

impl EventStream {
    /// The next event, waiting for one as long as it takes; `None` ends the stream (the
    /// server stops, or the database failed: the client resumes from its last event).
    async fn next(mut self) -> Option<(Result<Event, std::convert::Infallible>, Self)> {
        loop {
            if !self.caller.holds().await {
                return None;
            }
            if let Some(event) = self.pending.pop_front() {
                let seq = event.seq;
                let data = match serde_json::to_string(&to_wire::lease_event(event)) {
                    Ok(data) => data,
                    Err(e) => {
                        tracing::error!(error = %e, "rendering a lease event");
                        return None;
                    }
                };
                let sse = Event::default().id(seq.to_string()).data(data);
                return Some((Ok(sse), self));
            }
            if *self.stopping.borrow() {
                return None;
            }
            self.changes.borrow_and_update();
            match self
                .service
                .next_lease_events(&mut self.reader, self.look)
                .await
            {
                Ok(events) if !events.is_empty() => {
                    self.pending.extend(events);
                    continue;
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "lease event stream ended");
                    return None;
                }
            }
            self.look = tokio::select! {
                _ = self.changes.changed() => Look::Changed,
                () = tokio::time::sleep(blazar_service::WAIT_POLL) => Look::Polled,
                () = stopped(&mut self.stopping) => return None,
            };
        }
    }
}

/// `PUT /v1/leases/{id}`; `?dry_run=true` as for a create.
pub async fn update_lease(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Path(id): Path<String>,
    Query(query): Query,
    JsonObject(body): JsonObject,
) -> ApiResult<impl IntoResponse> {
    async {
        let dry_run = crate::reply::strict_flag(&query, "dry_run")?;
        let update = match from_wire::read(body).and_then(from_wire::lease_update) {
            Ok(update) => update,
            // Blazar finds the lease (404) before it reads the request's fields.
            Err(bad_input) => {
                state.service.get_lease(&identity, &id).await?;
                return Err(bad_input);
            }
        };
        let mut lease = if dry_run {
            let tried = state
                .service
                .dry_run_update_lease(&identity, &id, &update)
                .await?;
            let withheld = state
                .service
                .withheld_grants(&identity, &tried.view)
                .await?;
            to_wire::lease_with_grants(tried.view, &tried.grants, &withheld)
        } else {
            to_wire::lease(state.service.update_lease(&identity, &id, &update).await?)
        };
        // Blazar answers from inside the update's status transition: the lease shows
        // UPDATING there, and its settled status from the next read on. A dry run answers
        // what the update would.
        lease.status = LeaseStatus::Updating.as_str().to_string();
        Ok(Envelope("lease", lease))
    }
    .await
    .map_err(ApiError::explained)
}

pub async fn delete_lease(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Path(id): Path<String>,
) -> ApiResult<axum::response::Response> {
    state.service.delete_lease(&identity, &id).await?;
    Ok(crate::reply::no_content())
}
