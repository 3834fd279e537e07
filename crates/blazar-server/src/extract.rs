//! Our own extractors: every malformed request is answered in Blazar's error format with a
//! 4xx, never with the framework's plain-text rejections.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::StatusCode;
use axum::http::header::{CONTENT_ENCODING, CONTENT_TYPE};
use axum::http::request::Parts;
use blazar_service::Identity;
use serde_json::{Map, Value};

use crate::error::ApiError;
use crate::state::AppState;

/// A JSON object body. An empty body is `{}` (as in Blazar); anything but an object is a 400.
pub struct JsonObject(pub Map<String, Value>);

impl FromRequest<AppState> for JsonObject {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        if let Some(content_type) = req.headers().get(CONTENT_TYPE) {
            let text = content_type.to_str().unwrap_or_default();
            let essence = text.split(';').next().unwrap_or_default().trim();
            if !essence.eq_ignore_ascii_case("application/json") {
                // Blazar's web layer refuses it before its handlers run, in its own shape.
                return Err(ApiError::framework(
                    StatusCode::BAD_REQUEST,
                    format!("Content type '{text}' isn't supported"),
                ));
            }
        }
        // A body is read as sent: one the client says it compressed is refused rather than
        // parsed as garbage (decompressing would let a small body grow past every limit).
        if let Some(encoding) = req.headers().get(CONTENT_ENCODING) {
            let text = encoding.to_str().unwrap_or_default().trim();
            if !text.eq_ignore_ascii_case("identity") {
                let shown: String = text.chars().take(40).collect();
                return Err(ApiError::new(
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    format!("Content encoding '{shown}' isn't supported; send the body as is"),
                ));
            }
        }
        let bytes = Bytes::from_request(req, state).await.map_err(|rejection| {
            ApiError::new(
                if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                    StatusCode::PAYLOAD_TOO_LARGE
                } else {
                    StatusCode::BAD_REQUEST
                },
                format!(
                    "The request body could not be read: {}",
                    rejection.body_text()
                ),
            )
        })?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(JsonObject(Map::new()));
        }
        match serde_json::from_slice::<Value>(&bytes) {
            Ok(Value::Object(map)) => Ok(JsonObject(map)),
            Ok(other) => Err(ApiError::bad_request(format!(
                "The request body must be a JSON object, got {}",
                kind_of(&other)
            ))),
            Err(e) => Err(ApiError::bad_request(format!(
                "The request body is not valid JSON: {e}"
            ))),
        }
    }
}

/// A request body read into a `blazar-api` request type, through [`JsonObject`] (so a body
/// that is not a JSON object gets the same answer).
pub struct Wire<T>(pub T);

impl<T: serde::de::DeserializeOwned> FromRequest<AppState> for Wire<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        let JsonObject(body) = JsonObject::from_request(req, state).await?;
        crate::convert::from_wire::read(body).map(Wire)
    }
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// The caller's identity, as the authentication middleware established it (or, on a route
/// outside it, as the configured authentication says now).
pub struct Caller(pub Identity);

impl FromRequestParts<AppState> for Caller {
    type Rejection = crate::auth::AuthFailure;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        if let Some(identity) = parts.extensions.get::<Identity>() {
            return Ok(Caller(identity.clone()));
        }
        state.auth.identify(&parts.headers).await.map(Caller)
    }
}

/// Query parameters as a flat map (last value wins, as in Blazar).
pub struct Query(pub std::collections::HashMap<String, String>);

impl<S: Send + Sync> FromRequestParts<S> for Query {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let query = parts.uri.query().unwrap_or_default();
        let pairs: Vec<(String, String)> = serde_urlencoded_pairs(query)?;
        Ok(Query(pairs.into_iter().collect()))
    }
}

fn serde_urlencoded_pairs(query: &str) -> Result<Vec<(String, String)>, ApiError> {
    axum::extract::Query::<Vec<(String, String)>>::try_from_uri(
        &format!("/?{query}")
            .parse()
            .map_err(|_| ApiError::bad_request("The query string is malformed"))?,
    )
    .map(|q| q.0)
    .map_err(|e| ApiError::bad_request(format!("The query string is malformed: {e}")))
}

/// Path parameters, as axum's `Path` but refused in Blazar's error format (a segment that
/// is not UTF-8 once decoded, such as `%FF`, is a 400 with the usual body).
pub struct Path<T>(pub T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned + Send> FromRequestParts<S> for Path<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(value)) => Ok(Path(value)),
            Err(rejection) => Err(ApiError::new(
                rejection.status(),
                format!("Malformed path: {}", rejection.body_text()),
            )),
        }
    }
}
