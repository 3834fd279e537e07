//! Small pieces of responses and queries shared by the handlers.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

/// Blazar's answer to a delete: 204, empty body, still labelled JSON.
pub fn no_content() -> Response {
    (
        StatusCode::NO_CONTENT,
        [(axum::http::header::CONTENT_TYPE, "application/json")],
    )
        .into_response()
}

/// A boolean query parameter read strictly, as oslo's `bool_from_string(strict=True)`:
/// absent is false; a value that is neither true nor false is a 400 naming the parameter,
/// because guessing wrong about `dry_run` would write what was only meant to be tried.
pub fn strict_flag(
    query: &std::collections::HashMap<String, String>,
    key: &str,
) -> crate::error::ApiResult<bool> {
    let Some(value) = query.get(key) else {
        return Ok(false);
    };
    match value.trim().to_ascii_lowercase().as_str() {
        "1" | "t" | "true" | "on" | "y" | "yes" => Ok(true),
        "0" | "f" | "false" | "off" | "n" | "no" => Ok(false),
        _ => Err(crate::error::ApiError::bad_request(format!(
            "Invalid value {value:?} for {key}: use true or false"
        ))
        .with_reason(blazar_api::RefusalReason {
            field: Some(key.to_string()),
            ..blazar_api::RefusalReason::default()
        })),
    }
}

/// Blazar treats any non-empty value of `detail`/`all` as true; so do we, except the
/// explicit negatives a user would expect to mean false.
pub fn flag(query: &std::collections::HashMap<String, String>, key: &str) -> bool {
    query.get(key).is_some_and(|v| {
        !v.is_empty() && !matches!(v.to_ascii_lowercase().as_str(), "false" | "0" | "no")
    })
}

/// A 201 whose body is the created object under `key`.
pub fn created<T: serde::Serialize>(key: &'static str, object: T) -> Response {
    (
        StatusCode::CREATED,
        axum::Json(crate::convert::Envelope(key, object)),
    )
        .into_response()
}
