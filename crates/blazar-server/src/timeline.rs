//! `GET /v1/<resources>/timeline` (additive): occupancy calendars of hosts, floating IPs,
//! network segments and devices.

use axum::Json;
use axum::extract::State;
use axum::response::IntoResponse;

use crate::convert::{Envelope, from_wire, to_wire};
use crate::error::ApiResult;
use crate::extract::{Caller, Query};
use crate::state::AppState;

/// The timeline of `resource_type`, as the query string asks.
pub async fn show_timeline(
    state: &AppState,
    identity: &blazar_service::Identity,
    query: &std::collections::HashMap<String, String>,
    resource_type: &'static str,
) -> ApiResult<impl IntoResponse + use<>> {
    let request = from_wire::timeline_request(query)?;
    let timeline = state
        .service
        .timeline(identity, resource_type, &request)
        .await?;
    Ok(Json(Envelope(
        "timeline",
        to_wire::timeline(resource_type, timeline),
    )))
}

/// `GET /v1/os-hosts/timeline`.
pub async fn host_timeline(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Query(query): Query,
) -> ApiResult<impl IntoResponse> {
    show_timeline(&state, &identity, &query, blazar_core::PHYSICAL_HOST).await
}

/// The properties the timeline of `resource_type` may be grouped by, with their values.
pub async fn show_timeline_properties(
    state: &AppState,
    identity: &blazar_service::Identity,
    resource_type: &'static str,
) -> ApiResult<impl IntoResponse + use<>> {
    let listing = state
        .service
        .timeline_properties(identity, resource_type)
        .await?;
    Ok(Json(Envelope(
        "resource_properties",
        to_wire::property_listing(listing),
    )))
}

/// `GET /v1/os-hosts/timeline/properties`.
pub async fn host_timeline_properties(
    State(state): State<AppState>,
    Caller(identity): Caller,
) -> ApiResult<impl IntoResponse> {
    show_timeline_properties(&state, &identity, blazar_core::PHYSICAL_HOST).await
}
