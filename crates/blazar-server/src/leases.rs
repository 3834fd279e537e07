//! `/v1/leases`: request parsing and handlers.

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::IntoResponse;
use blazar_api::dates::{InputDate, parse_input, parse_minute};
use blazar_core::LeaseFilter;
use blazar_core::LeaseStatus;
use blazar_core::When;
use blazar_service::{LeaseUpdate, Listed, NewLease, ServiceError};
use serde_json::{Map, Value, json};

use crate::convert;
use crate::error::{ApiError, ApiResult};
use crate::extract::{Caller, JsonObject, Query};
use crate::state::AppState;

/// Lease fields the server sets; a request naming one is refused rather than ignored.
const PROTECTED_LEASE_FIELDS: &[&str] = &[
    "id",
    "project_id",
    "user_id",
    "trust_id",
    "status",
    "degraded",
    "created_at",
    "updated_at",
];

fn check_fields(body: &Map<String, Value>, allowed: &[&str]) -> ApiResult<()> {
    let mut protected = Vec::new();
    let mut unknown = Vec::new();
    for key in body.keys() {
        if allowed.contains(&key.as_str()) {
            continue;
        }
        if PROTECTED_LEASE_FIELDS.contains(&key.as_str()) {
            protected.push(key.as_str());
        } else {
            unknown.push(key.as_str());
        }
    }
    if !protected.is_empty() {
        return Err(ApiError::bad_request(format!(
            "{} cannot be set: the server manages these fields",
            protected.join(", ")
        )));
    }
    if !unknown.is_empty() {
        return Err(ApiError::bad_request(format!(
            "Unknown field(s) {}; accepted fields: {}",
            unknown.join(", "),
            allowed.join(", ")
        )));
    }
    Ok(())
}

fn string_field(body: &Map<String, Value>, key: &str) -> ApiResult<Option<String>> {
    match body.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(ApiError::bad_request(format!(
            "Malformed parameter {key}: expected a string, got {other}"
        ))),
    }
}

fn invalid_date(value: &str) -> ApiError {
    ApiError::bad_request(format!(
        "{value} is an invalid date. Required format: %Y-%m-%d %H:%M"
    ))
}

fn when_field(body: &Map<String, Value>, key: &str) -> ApiResult<Option<When>> {
    let Some(text) = string_field(body, key)? else {
        return Ok(None);
    };
    match parse_input(&text) {
        Some(InputDate::Now) => Ok(Some(When::Now)),
        Some(InputDate::At(t)) => Ok(Some(When::At(t))),
        None => Err(invalid_date(&text)),
    }
}

fn before_end_field(body: &Map<String, Value>) -> ApiResult<Option<chrono::DateTime<chrono::Utc>>> {
    match string_field(body, "before_end_date")? {
        None => Ok(None),
        Some(text) => parse_minute(&text)
            .map(Some)
            .ok_or_else(|| invalid_date(&text)),
    }
}

fn reservations_field(body: &Map<String, Value>) -> ApiResult<Option<Vec<Map<String, Value>>>> {
    match body.get("reservations") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, item)| match item {
                Value::Object(map) => Ok(map.clone()),
                other => Err(ApiError::bad_request(format!(
                    "Malformed parameter reservations: item {} must be an object, got {other}",
                    i + 1
                ))),
            })
            .collect::<ApiResult<Vec<_>>>()
            .map(Some),
        Some(other) => Err(ApiError::bad_request(format!(
            "Malformed parameter reservations: expected a list, got {other}"
        ))),
    }
}

pub fn parse_new_lease(body: &Map<String, Value>) -> ApiResult<NewLease> {
    check_fields(
        body,
        &[
            "name",
            "start_date",
            "end_date",
            "before_end_date",
            "reservations",
            "events",
        ],
    )?;
    let missing: Vec<&str> = ["name", "start_date", "end_date"]
        .into_iter()
        .filter(|k| body.get(*k).is_none_or(Value::is_null))
        .collect();
    if !missing.is_empty() {
        return Err(ApiError::bad_request(format!(
            "Missing parameter {}",
            missing.join(", ")
        )));
    }
    match body.get("events") {
        None | Some(Value::Null) => {}
        Some(Value::Array(items)) if items.is_empty() => {}
        Some(_) => {
            return Err(ApiError::bad_request(
                "Custom lease events are not supported: send \"events\": [] or leave it out; \
                 the start, end and before-end events are created from the dates",
            ));
        }
    }
    Ok(NewLease {
        name: string_field(body, "name")?.unwrap_or_default(),
        start: when_field(body, "start_date")?.unwrap_or(When::Now),
        end: when_field(body, "end_date")?.unwrap_or(When::Now),
        before_end: before_end_field(body)?,
        reservations: reservations_field(body)?.unwrap_or_default(),
    })
}

pub fn parse_lease_update(body: &Map<String, Value>) -> ApiResult<LeaseUpdate> {
    check_fields(
        body,
        &[
            "name",
            "start_date",
            "end_date",
            "before_end_date",
            "reservations",
        ],
    )?;
    Ok(LeaseUpdate {
        name: string_field(body, "name")?,
        start: when_field(body, "start_date")?,
        end: when_field(body, "end_date")?,
        before_end: before_end_field(body)?,
        reservations: reservations_field(body)?,
    })
}

pub async fn list_leases(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Query(query): Query,
) -> ApiResult<impl IntoResponse> {
    if let Some(status) = query.get("status")
        && status.parse::<LeaseStatus>().is_err()
    {
        let known: Vec<&str> = LeaseStatus::ALL.iter().map(|s| s.as_str()).collect();
        return Err(ApiError::bad_request(format!(
            "Invalid lease status {status}; use one of {}",
            known.join(", ")
        )));
    }
    let filter = LeaseFilter {
        project_id: query.get("project_id").cloned(),
        user_id: query.get("user_id").cloned(),
        status: query.get("status").cloned(),
        name: query.get("name").cloned(),
        ..LeaseFilter::default()
    };
    // Leases rendered by an earlier list are reused while their revision stands (see
    // `lease_cache`); the answer is the bytes `Json(Envelope("leases", ...))` would write.
    let cache = &state.leases;
    let listed = state
        .service
        .list_leases_reusing(&identity, &filter, |id, revision| cache.get(id, revision))
        .await?;
    let mut parts = Vec::with_capacity(listed.len());
    for entry in listed {
        parts.push(match entry {
            Listed::Kept(json) => json,
            Listed::Fresh(revision, view) => {
                let id = view.lease.id.clone();
                let json = Bytes::from(
                    serde_json::to_vec(&convert::lease(*view))
                        .map_err(|e| ServiceError::Internal(format!("rendering a lease: {e}")))?,
                );
                cache.insert(id, revision, json.clone());
                json
            }
        });
    }
    let size = parts.iter().map(|p| p.len() + 1).sum::<usize>() + 16;
    let mut body = Vec::with_capacity(size);
    body.extend_from_slice(br#"{"leases":["#);
    for (i, part) in parts.iter().enumerate() {
        if i > 0 {
            body.push(b',');
        }
        body.extend_from_slice(part);
    }
    body.extend_from_slice(b"]}");
    Ok((
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body,
    ))
}

pub async fn create_lease(
    State(state): State<AppState>,
    Caller(identity): Caller,
    JsonObject(body): JsonObject,
) -> ApiResult<impl IntoResponse> {
    let request = parse_new_lease(&body)?;
    let lease = state.service.create_lease(&identity, &request).await?;
    Ok((
        StatusCode::CREATED,
        Json(convert::Envelope("lease", convert::lease(lease))),
    ))
}

/// `GET /v1/leases/{id}`; with `?allocations=true` each reservation also lists what it was
/// granted (`allocations`: resource type and id, dates, units), which Blazar's object lacks.
/// `GET /v1/leases/{id}/actions`: what was done in the cloud for the lease (additive).
pub async fn lease_actions(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Path(id): Path<String>,
) -> ApiResult<impl IntoResponse> {
    let actions = state.service.lease_actions(&identity, &id).await?;
    let actions: Vec<blazar_api::Action> = actions.iter().map(convert::action).collect();
    Ok(Json(serde_json::json!({ "actions": actions })))
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
        .map(convert::host)
        .collect();
    Ok(Json(convert::Envelope("hosts", hosts)))
}

async fn lease_pool(
    state: &AppState,
    identity: &blazar_service::Identity,
    id: &str,
    kind: &str,
) -> ApiResult<Vec<Value>> {
    Ok(state
        .service
        .lease_pool_resources(identity, id, kind)
        .await?
        .into_iter()
        .map(|r| crate::inventory::resource(r, false))
        .collect())
}

/// `GET /v1/leases/{id}/networks` (Chameleon): the segments of its network reservations.
pub async fn lease_networks(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Path(id): Path<String>,
) -> ApiResult<impl IntoResponse> {
    let networks = lease_pool(&state, &identity, &id, "network").await?;
    Ok(Json(serde_json::json!({ "networks": networks })))
}

/// `GET /v1/leases/{id}/devices` (Chameleon): the devices of its device reservations.
pub async fn lease_devices(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Path(id): Path<String>,
) -> ApiResult<impl IntoResponse> {
    let devices = lease_pool(&state, &identity, &id, "device").await?;
    Ok(Json(serde_json::json!({ "devices": devices })))
}

pub async fn show_lease(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Path(id): Path<String>,
    Query(query): Query,
) -> ApiResult<impl IntoResponse> {
    let lease = state.service.get_lease(&identity, &id).await?;
    let mut body =
        serde_json::to_value(convert::lease(lease)).map_err(|e| crate::error::ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: e.to_string(),
        })?;
    if crate::reply::flag(&query, "allocations") {
        let grants = state.service.lease_grants(&identity, &id).await?;
        if let Some(reservations) = body.get_mut("reservations").and_then(Value::as_array_mut) {
            for reservation in reservations {
                let rid = reservation["id"].as_str().unwrap_or_default().to_string();
                let granted: Vec<Value> = grants
                    .iter()
                    .filter(|g| g.reservation_id == rid)
                    .map(|g| {
                        json!({
                            "resource_type": g.resource_type,
                            "resource_id": g.resource_id,
                            "start_date": blazar_api::dates::format_t(g.start),
                            "end_date": blazar_api::dates::format_t(g.end),
                            "units": g.units,
                        })
                    })
                    .collect();
                reservation["allocations"] = Value::Array(granted);
            }
        }
    }
    Ok(Json(convert::Envelope("lease", body)))
}

pub async fn update_lease(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Path(id): Path<String>,
    JsonObject(body): JsonObject,
) -> ApiResult<impl IntoResponse> {
    let update = parse_lease_update(&body)?;
    let lease = state.service.update_lease(&identity, &id, &update).await?;
    Ok(Json(convert::Envelope("lease", convert::lease(lease))))
}

pub async fn delete_lease(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Path(id): Path<String>,
) -> ApiResult<axum::response::Response> {
    state.service.delete_lease(&identity, &id).await?;
    Ok(crate::reply::no_content())
}
