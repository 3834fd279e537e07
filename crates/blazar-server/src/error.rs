//! The one mapping from use-case errors to HTTP, in Blazar's error envelopes.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use blazar_api::{ErrorBody, FrameworkError, RefusalReason};
use blazar_service::{RefusalKind, ServiceError};
use serde_json::Value;

/// An error answered in Blazar's application error shape:
/// `{"error_code": N, "error_message": "...", "error_name": N}`, plus `reasons` for a
/// refused lease create or update.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub reasons: Option<Vec<RefusalReason>>,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            reasons: None,
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::NOT_FOUND, message)
    }

    /// This error with `reason` added (a refused lease create or update).
    pub fn with_reason(mut self, reason: RefusalReason) -> Self {
        self.reasons.get_or_insert_with(Vec::new).push(reason);
        self
    }

    /// A refusal of a lease create or update: its body carries a `reasons` list, empty when
    /// nothing more than the message is known.
    pub fn explained(mut self) -> Self {
        if self.status.is_client_error() {
            self.reasons.get_or_insert_with(Vec::new);
        }
        self
    }
}

impl From<ServiceError> for ApiError {
    fn from(e: ServiceError) -> Self {
        let status = match &e {
            ServiceError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ServiceError::Forbidden(_) => StatusCode::FORBIDDEN,
            ServiceError::NotFound(_) => StatusCode::NOT_FOUND,
            ServiceError::Conflict(_) | ServiceError::Retry(_) => StatusCode::CONFLICT,
            ServiceError::Refused(r) => match r.kind {
                RefusalKind::BadRequest => StatusCode::BAD_REQUEST,
                RefusalKind::Forbidden => StatusCode::FORBIDDEN,
                RefusalKind::NotFound => StatusCode::NOT_FOUND,
                RefusalKind::Conflict => StatusCode::CONFLICT,
            },
            ServiceError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ServiceError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        match e {
            ServiceError::Refused(r) => ApiError {
                status,
                message: r.message,
                reasons: Some(
                    r.reasons
                        .iter()
                        .map(crate::convert::to_wire::reason)
                        .collect(),
                ),
            },
            other => ApiError::new(status, other.to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            // The cause is logged once, here; the user gets a generic body.
            tracing::error!(error = %self.message, "internal error");
            let body = ErrorBody {
                error_code: 500,
                error_message: "Internal Server Error".into(),
                error_name: Value::from("INTERNAL_SERVER_ERROR"),
                reasons: None,
            };
            return (StatusCode::INTERNAL_SERVER_ERROR, Json(body)).into_response();
        }
        let code = self.status.as_u16();
        let body = ErrorBody {
            error_code: code,
            error_message: self.message,
            error_name: Value::from(code),
            reasons: self.reasons,
        };
        (self.status, Json(body)).into_response()
    }
}

/// Blazar's framework error shape, for unknown URLs, wrong methods and version problems:
/// `{"error": N, "error_message": "..."}`.
pub fn framework_error(status: StatusCode, message: &str) -> Response {
    (
        status,
        Json(FrameworkError {
            error: status.as_u16(),
            error_message: message.to_string(),
        }),
    )
        .into_response()
}

pub async fn not_found_fallback() -> Response {
    framework_error(
        StatusCode::NOT_FOUND,
        "The requested URL was not found on the server. If you entered the URL manually please \
         check your spelling and try again.",
    )
}

pub async fn method_not_allowed_fallback() -> Response {
    framework_error(
        StatusCode::METHOD_NOT_ALLOWED,
        "The method is not allowed for the requested URL.",
    )
}

pub type ApiResult<T> = Result<T, ApiError>;
