//! Webhooks (ours): `/v1/webhooks` to register, list, show and delete them, and
//! `/v1/webhooks/{id}/deliveries` to see how each event's delivery went and to offer a
//! dead one again.

use axum::extract::State;

use crate::extract::Path;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use crate::convert::{Envelope, from_wire, to_wire};
use crate::error::{ApiError, ApiResult};
use crate::extract::{Caller, JsonObject, Query};
use crate::state::AppState;

const FIELDS: [&str; 5] = [
    "url",
    "event_types",
    "project_id",
    "all_projects",
    "description",
];

pub async fn list_webhooks(
    State(state): State<AppState>,
    Caller(identity): Caller,
) -> ApiResult<impl IntoResponse> {
    let hooks: Vec<_> = state
        .service
        .list_webhooks(&identity)
        .await?
        .into_iter()
        .map(|w| to_wire::webhook(w, false))
        .collect();
    Ok(Envelope("webhooks", hooks))
}

pub async fn create_webhook(
    State(state): State<AppState>,
    Caller(identity): Caller,
    JsonObject(body): JsonObject,
) -> ApiResult<Response> {
    if let Some(key) = body.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(ApiError::bad_request(format!(
            "unknown field {key}: a webhook takes {}",
            FIELDS.join(", ")
        )));
    }
    let text = |key: &str| -> ApiResult<Option<String>> {
        match body.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(ApiError::bad_request(format!("{key} must be a string"))),
        }
    };
    let url = text("url")?.ok_or_else(|| ApiError::bad_request("url is required"))?;
    let event_types = match body.get("event_types") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| {
                v.as_str()
                    .map(String::from)
                    .ok_or_else(|| ApiError::bad_request("event_types must be a list of strings"))
            })
            .collect::<ApiResult<_>>()?,
        Some(_) => {
            return Err(ApiError::bad_request(
                "event_types must be a list of strings",
            ));
        }
    };
    let all_projects = match body.get("all_projects") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(ApiError::bad_request("all_projects must be true or false")),
    };
    let webhook = state
        .service
        .create_webhook(
            &identity,
            blazar_service::NewWebhook {
                url,
                event_types,
                project_id: text("project_id")?,
                all_projects,
                description: text("description")?.unwrap_or_default(),
            },
        )
        .await?;
    let wire = to_wire::webhook(webhook, true);
    Ok(crate::reply::created("webhook", wire))
}

pub async fn get_webhook(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Path(id): Path<String>,
) -> ApiResult<impl IntoResponse> {
    let webhook = state.service.get_webhook(&identity, &id).await?;
    Ok(Envelope("webhook", to_wire::webhook(webhook, false)))
}

pub async fn delete_webhook(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Path(id): Path<String>,
) -> ApiResult<Response> {
    state.service.delete_webhook(&identity, &id).await?;
    Ok(crate::reply::no_content())
}

/// `GET /v1/webhooks/{id}/deliveries[?status=pending|delivered|dead]`, latest first.
pub async fn list_deliveries(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Path(id): Path<String>,
    Query(query): Query,
) -> ApiResult<impl IntoResponse> {
    from_wire::only_known(&query, &["status", "limit", "marker"], "a delivery list")?;
    let limit = from_wire::query_limit(&query)?;
    let marker = query
        .get("marker")
        .map(|m| m.trim())
        .filter(|m| !m.is_empty());
    let deliveries: Vec<_> = state
        .service
        .webhook_deliveries(
            &identity,
            &id,
            query.get("status").map(String::as_str),
            limit,
            marker,
        )
        .await?
        .into_iter()
        .map(to_wire::webhook_delivery)
        .collect();
    Ok(Envelope("deliveries", deliveries))
}

/// `POST /v1/webhooks/{id}/deliveries/{delivery_id}/redeliver`: the delivery is tried
/// again at once, its attempts counted afresh.
pub async fn redeliver(
    State(state): State<AppState>,
    Caller(identity): Caller,
    Path((id, delivery_id)): Path<(String, String)>,
) -> ApiResult<Response> {
    state
        .service
        .redeliver_webhook(&identity, &id, &delivery_id)
        .await?;
    Ok(StatusCode::ACCEPTED.into_response())
}
