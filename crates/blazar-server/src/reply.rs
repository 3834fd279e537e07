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

/// Blazar treats any non-empty value of `detail`/`all` as true; so do we, except the
/// explicit negatives a user would expect to mean false.
pub fn flag(query: &std::collections::HashMap<String, String>, key: &str) -> bool {
    query.get(key).is_some_and(|v| {
        !v.is_empty() && !matches!(v.to_ascii_lowercase().as_str(), "false" | "0" | "no")
    })
}
