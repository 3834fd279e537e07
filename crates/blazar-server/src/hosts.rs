//! `/v1/os-hosts`: inventory, properties, allocations; and `/v1/handovers`.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use blazar_service::PropertyListing;
use serde_json::{Value, json};

use crate::convert;
use crate::error::ApiResult;
use crate::extract::{Caller, JsonObject, Query};
use crate::reply::flag;
use crate::state::AppState;

pub async fn list_hosts(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Query(query): Query,
) -> ApiResult<impl IntoResponse> {
    let name = query
        .get("hypervisor_hostname")
        .or_else(|| query.get("name"));
    let reservable = query
        .get("reservable")
        .map(|v| v.eq_ignore_ascii_case("true") || v == "1");
    let hosts: Vec<_> = state
        .service
        .list_hosts(&identity)
        .await?
        .into_iter()
        .filter(|h| name.is_none_or(|n| &h.facts.hypervisor_hostname == n))
        .filter(|h| reservable.is_none_or(|r| h.reservable == r))
        .map(convert::host)
        .collect();
    Ok(Json(convert::Envelope("hosts", hosts)))
}

pub async fn create_host(
    State(state): State<AppState>,
    Caller(identity): Caller,
    JsonObject(body): JsonObject,
) -> ApiResult<impl IntoResponse> {
    let host = state.service.create_host(&identity, &body).await?;
    Ok((
        StatusCode::CREATED,
        Json(convert::Envelope("host", convert::host(host))),
    ))
}

pub async fn show_host(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Path(id): Path<String>,
) -> ApiResult<impl IntoResponse> {
    let host = state.service.get_host(&identity, &id).await?;
    Ok(Json(convert::Envelope("host", convert::host(host))))
}

pub async fn update_host(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Path(id): Path<String>,
    JsonObject(body): JsonObject,
) -> ApiResult<impl IntoResponse> {
    let host = state.service.update_host(&identity, &id, &body).await?;
    Ok(Json(convert::Envelope("host", convert::host(host))))
}

pub async fn delete_host(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Path(id): Path<String>,
) -> ApiResult<axum::response::Response> {
    state.service.delete_host(&identity, &id).await?;
    Ok(crate::reply::no_content())
}

pub async fn list_host_allocations(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Query(query): Query,
) -> ApiResult<impl IntoResponse> {
    let entries = state
        .service
        .host_allocations(
            &identity,
            None,
            query.get("lease_id").map(String::as_str),
            query.get("reservation_id").map(String::as_str),
        )
        .await?;
    let allocations: Vec<_> = entries.into_iter().map(convert::allocation).collect();
    Ok(Json(convert::Envelope("allocations", allocations)))
}

pub async fn show_host_allocation(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Path(id): Path<String>,
    Query(query): Query,
) -> ApiResult<Json<Value>> {
    let mut entries = state
        .service
        .host_allocations(
            &identity,
            Some(&id),
            query.get("lease_id").map(String::as_str),
            query.get("reservation_id").map(String::as_str),
        )
        .await?;
    let entry = entries.pop().map(convert::allocation);
    Ok(Json(json!({ "allocation": entry })))
}

/// The body of Chameleon's re-allocation: which reservations of the resource to move.
pub(crate) fn reallocation_filter(
    body: &serde_json::Map<String, Value>,
) -> ApiResult<blazar_service::ReallocationFilter> {
    let text = |key: &str| -> ApiResult<Option<String>> {
        match body.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) if !s.trim().is_empty() => Ok(Some(s.trim().to_string())),
            Some(other) => Err(crate::error::ApiError::bad_request(format!(
                "Malformed parameter {key}: expected an id, got {other}"
            ))),
        }
    };
    if let Some(key) = body
        .keys()
        .find(|k| k.as_str() != "lease_id" && k.as_str() != "reservation_id")
    {
        return Err(crate::error::ApiError::bad_request(format!(
            "Unknown field {key}; a re-allocation takes lease_id and reservation_id"
        )));
    }
    Ok(blazar_service::ReallocationFilter {
        lease_id: text("lease_id")?,
        reservation_id: text("reservation_id")?,
    })
}

/// `PUT /v1/os-hosts/{id}/allocation` (Chameleon): moves reservations off the host.
pub async fn reallocate_host(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Path(id): Path<String>,
    JsonObject(body): JsonObject,
) -> ApiResult<Json<Value>> {
    let filter = reallocation_filter(&body)?;
    let entry = state
        .service
        .reallocate_host(&identity, &id, &filter)
        .await?;
    Ok(Json(json!({ "allocation": convert::allocation(entry) })))
}

/// `POST /v1/reconcile` (admin, additive): compares the cloud with the database once and
/// repairs what differs; `{"dry_run": true}` only reports.
pub async fn reconcile(
    State(state): State<AppState>,
    Caller(identity): Caller,
    JsonObject(body): JsonObject,
) -> ApiResult<Json<Value>> {
    let dry_run = match body.get("dry_run") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(other) => {
            return Err(crate::error::ApiError {
                status: StatusCode::BAD_REQUEST,
                message: format!(
                    "Malformed parameter dry_run: expected true or false, got {other}"
                ),
            });
        }
    };
    if let Some(key) = body.keys().find(|k| k.as_str() != "dry_run") {
        return Err(crate::error::ApiError {
            status: StatusCode::BAD_REQUEST,
            message: format!("Unknown field {key}"),
        });
    }
    let report = state.service.reconcile_for(&identity, !dry_run).await?;
    Ok(Json(json!({ "reconcile": report })))
}

pub async fn list_host_properties(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Query(query): Query,
) -> ApiResult<Json<Value>> {
    let listing = state
        .service
        .list_host_properties(&identity, flag(&query, "detail"), flag(&query, "all"))
        .await?;
    Ok(Json(
        json!({ "resource_properties": property_listing(listing) }),
    ))
}

/// The `resource_properties` list: names, or names with values in detail mode.
pub(crate) fn property_listing(listing: PropertyListing) -> Vec<Value> {
    match listing {
        PropertyListing::Names(names) => names
            .into_iter()
            .map(|n| json!({ "property": n }))
            .collect(),
        PropertyListing::Detail(details) => details
            .into_iter()
            .map(|p| {
                let mut entry =
                    json!({ "property": p.property_name, "private": p.private, "values": p.values });
                // Chameleon's flag, only where set: Blazar's listing stays as it is.
                if p.is_unique {
                    entry["is_unique"] = json!(true);
                }
                entry
            })
            .collect(),
    }
}

pub async fn update_host_property(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Path(name): Path<String>,
    JsonObject(body): JsonObject,
) -> ApiResult<Json<Value>> {
    let property = state
        .service
        .update_host_property(&identity, &name, &body)
        .await?;
    Ok(Json(
        json!({ "resource_property": convert::resource_property(property) }),
    ))
}

/// `GET /v1/handovers[?resource_type=..][&lease_id=..][&all=true]`: who holds which resource
/// now (`all` includes past hand-overs).
pub async fn list_handovers(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Query(query): Query,
) -> ApiResult<Json<Value>> {
    let rows = state
        .service
        .handovers(
            &identity,
            query.get("resource_type").map(String::as_str),
            query.get("lease_id").map(String::as_str),
            flag(&query, "all"),
        )
        .await?;
    let handovers: Vec<_> = rows.into_iter().map(convert::handover).collect();
    Ok(Json(json!({ "handovers": handovers })))
}
