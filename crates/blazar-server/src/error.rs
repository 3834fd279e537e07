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
    /// For a refused lease create or update, what refused it (the `reason` label of
    /// `/metrics`' refusal counter).
    pub refusal: Option<&'static str>,
    /// An `error_name` other than the status code, where Blazar answers one.
    pub name: Option<&'static str>,
    /// Answered in the framework's shape (`{"error": N, "error_message"}`) rather than the
    /// application's, where Blazar's web layer answers before any of its code runs.
    pub framework: bool,
}

/// A response extension naming what refused a lease create or update, read by the
/// metrics middleware.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RefusalLabel(pub &'static str);

/// The kind of thing that refused, from a refusal's reasons: a usage-enforcement filter, a
/// project quota, a policy rule, resources that are not free, or a field of the request.
fn refusal_label(refused: &blazar_service::Refused) -> &'static str {
    let any = |f: fn(&blazar_service::Reason) -> bool| refused.reasons.iter().any(f);
    if any(|r| r.filter.is_some()) {
        "enforcement"
    } else if any(|r| r.quota.is_some()) {
        "quota"
    } else if any(|r| r.rule.is_some()) {
        "policy"
    } else if any(|r| r.availability.is_some() || r.resource_type.is_some()) {
        "resources"
    } else if any(|r| r.field.is_some()) {
        "request"
    } else {
        match refused.kind {
            RefusalKind::BadRequest => "request",
            RefusalKind::Forbidden => "policy",
            RefusalKind::NotFound => "not_found",
            RefusalKind::Conflict => "conflict",
        }
    }
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            reasons: None,
            refusal: None,
            name: None,
            framework: false,
        }
    }

    /// An error Blazar's web layer answers in its own shape (see [`framework_error`]).
    pub fn framework(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            framework: true,
            ..ApiError::new(status, message)
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
            self.refusal.get_or_insert(match self.status {
                StatusCode::FORBIDDEN => "policy",
                StatusCode::NOT_FOUND => "not_found",
                StatusCode::CONFLICT => "conflict",
                _ => "request",
            });
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
            ServiceError::Conflict(_)
            | ServiceError::Retry(_)
            | ServiceError::RetryAfter { .. } => StatusCode::CONFLICT,
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
                refusal: Some(refusal_label(&r)),
                message: r.message,
                reasons: Some(
                    r.reasons
                        .iter()
                        .map(crate::convert::to_wire::reason)
                        .collect(),
                ),
                name: None,
                framework: false,
            },
            other => ApiError::new(status, other.to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        // A cloud that cannot be asked just now is the caller's to know (503, try again
        // later, with the message); any other server error is logged and kept generic.
        if self.status.is_server_error() && self.status != StatusCode::SERVICE_UNAVAILABLE {
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
        let message = shortened(self.message);
        if self.framework {
            return framework_error(self.status, &message);
        }
        let code = self.status.as_u16();
        let body = ErrorBody {
            error_code: code,
            error_message: message,
            error_name: self.name.map_or(Value::from(code), Value::from),
            reasons: self.reasons,
        };
        let mut response = (self.status, Json(body)).into_response();
        if let Some(label) = self.refusal {
            response.extensions_mut().insert(RefusalLabel(label));
        }
        response
    }
}

/// The longest error message answered: one that quotes what it refuses (a filter, a
/// date, a body) quotes at most this much of it, not a 64 KiB query back to its sender.
const MAX_MESSAGE_BYTES: usize = 2_048;

/// `message`, cut at [`MAX_MESSAGE_BYTES`] (on a character's edge) with a word of how long
/// it was.
fn shortened(message: String) -> String {
    if message.len() <= MAX_MESSAGE_BYTES {
        return message;
    }
    let mut end = MAX_MESSAGE_BYTES;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}... ({} bytes in all)", &message[..end], message.len())
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

/// 503 for a long poll or event stream beyond `max_waiters`, in Blazar's error shape, with
/// `Retry-After`: the client may poll plainly or try again.
pub fn too_many_waiters() -> Response {
    let body = ErrorBody {
        error_code: 503,
        error_message: "Too many requests are waiting on leases; try again later".into(),
        error_name: Value::from(503),
        reasons: None,
    };
    let mut response = (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response();
    response.headers_mut().insert(
        axum::http::header::RETRY_AFTER,
        axum::http::HeaderValue::from_static("1"),
    );
    response
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

#[cfg(test)]
mod tests {
    use super::*;

    async fn answer(e: ServiceError) -> (StatusCode, serde_json::Value) {
        let response = ApiError::from(e).into_response();
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 16)
            .await
            .unwrap();
        (status, serde_json::from_slice(&bytes).unwrap())
    }

    #[tokio::test]
    async fn a_cloud_that_cannot_be_asked_is_a_503_with_its_message() {
        let (status, body) = answer(ServiceError::Unavailable(
            "Nova did not answer; try again later".into(),
        ))
        .await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(body["error_code"], 503);
        assert_eq!(
            body["error_message"],
            "Nova did not answer; try again later"
        );
        // Other server errors stay generic: their cause is for the log, not the caller.
        let (status, body) = answer(ServiceError::Internal("disk on fire".into())).await;
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(body["error_message"], "Internal Server Error");
    }

    #[tokio::test]
    async fn long_messages_are_cut_on_a_character_edge() {
        // What a refusal quotes back of a 60 kB filter, in two-byte characters.
        let quoted = "é".repeat(30_000);
        let (status, body) =
            answer(ServiceError::BadRequest(format!("Invalid filter {quoted}"))).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        let message = body["error_message"].as_str().unwrap();
        assert!(
            message.len() < MAX_MESSAGE_BYTES + 40,
            "{} bytes",
            message.len()
        );
        assert!(message.starts_with("Invalid filter éé"), "{message}");
        assert!(message.ends_with("... (60015 bytes in all)"), "{message}");
        // A message of ordinary length is answered whole.
        let (_, body) = answer(ServiceError::BadRequest("Invalid date".into())).await;
        assert_eq!(body["error_message"], "Invalid date");
    }
}
