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
use crate::state::AppState;

/// Blazar treats any non-empty value of `detail`/`all` as true; so do we, except the
/// explicit negatives a user would expect to mean false.
pub(crate) fn flag(query: &std::collections::HashMap<String, String>, key: &str) -> bool {
    query.get(key).is_some_and(|v| {
        !v.is_empty() && !matches!(v.to_ascii_lowercase().as_str(), "false" | "0" | "no")
    })
}

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
    Ok(crate::app::no_content())
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
        PropertyListing::Names(names) => names.into_iter().map(|n| json!({ "property": n })).collect(),
        PropertyListing::Detail(details) => details
            .into_iter()
            .map(|p| json!({ "property": p.property_name, "private": p.private, "values": p.values }))
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
