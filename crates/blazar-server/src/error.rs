//! The one mapping from use-case errors to HTTP, in Blazar's error envelopes.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use blazar_api::{ErrorBody, FrameworkError};
use blazar_service::ServiceError;
use serde_json::Value;

/// An error answered in Blazar's application error shape:
/// `{"error_code": N, "error_message": "...", "error_name": N}`.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
}

impl ApiError {
    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
        }
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::NOT_FOUND,
            message: message.into(),
        }
    }
}

impl From<ServiceError> for ApiError {
    fn from(e: ServiceError) -> Self {
        let status = match &e {
            ServiceError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ServiceError::Forbidden(_) => StatusCode::FORBIDDEN,
            ServiceError::NotFound(_) => StatusCode::NOT_FOUND,
            ServiceError::Conflict(_) | ServiceError::Retry(_) => StatusCode::CONFLICT,
            ServiceError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ServiceError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError {
            status,
            message: e.to_string(),
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
            };
            return (StatusCode::INTERNAL_SERVER_ERROR, Json(body)).into_response();
        }
        let code = self.status.as_u16();
        let body = ErrorBody {
            error_code: code,
            error_message: self.message,
            error_name: Value::from(code),
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
