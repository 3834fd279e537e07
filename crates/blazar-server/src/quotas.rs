//! `/v1/quotas`: per-project limits (ours; Blazar has none).

use axum::extract::State;

use crate::extract::Path;
use axum::response::{IntoResponse, Response};

use crate::convert::{Envelope, from_wire, to_wire};
use crate::error::ApiResult;
use crate::extract::{Caller, JsonObject};
use crate::state::AppState;

pub async fn list_quotas(
    State(state): State<AppState>,
    Caller(identity): Caller,
) -> ApiResult<impl IntoResponse> {
    let quotas: Vec<_> = state
        .service
        .list_quotas(&identity)
        .await?
        .into_iter()
        .map(to_wire::quota)
        .collect();
    Ok(Envelope("quotas", quotas))
}

pub async fn show_quota(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Path(project_id): Path<String>,
) -> ApiResult<impl IntoResponse> {
    let quota = state.service.get_quota(&identity, &project_id).await?;
    Ok(Envelope("quota", to_wire::quota(quota)))
}

pub async fn update_quota(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Path(project_id): Path<String>,
    JsonObject(body): JsonObject,
) -> ApiResult<impl IntoResponse> {
    state
        .service
        .authorize_quota_change(&identity, &project_id)?;
    let changes = from_wire::quota_changes(body)?;
    let quota = state
        .service
        .set_quota(&identity, &project_id, &changes)
        .await?;
    Ok(Envelope("quota", to_wire::quota(quota)))
}

pub async fn delete_quota(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Path(project_id): Path<String>,
) -> ApiResult<Response> {
    state.service.delete_quota(&identity, &project_id).await?;
    Ok(crate::reply::no_content())
}
