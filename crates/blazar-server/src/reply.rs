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

/// A strong entity tag for a body: the first 128 bits of its SHA-256, so the same bytes get
/// the same tag in every replica and after every restart.
pub fn etag_of(body: &[u8]) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(body);
    let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    format!("\"{hex}\"")
}

/// Whether the client already holds `etag` (`If-None-Match` names it, weakly compared as
/// RFC 9110 asks, or is `*`): the answer is then 304 without the body.
pub fn holds_etag(request: &axum::http::HeaderMap, etag: &str) -> bool {
    request
        .get_all(axum::http::header::IF_NONE_MATCH)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|tag| tag.trim().trim_start_matches("W/"))
        .any(|tag| tag == "*" || tag == etag)
}

/// `body` as the answer to a GET that may be revalidated: with its `ETag`, or 304 with the
/// tag alone when the client holds it. `decorate` adds the headers both answers carry.
pub fn revalidated(
    request: &axum::http::HeaderMap,
    body: String,
    decorate: impl FnOnce(&mut axum::http::HeaderMap),
) -> Response {
    let etag = etag_of(body.as_bytes());
    let mut response = match holds_etag(request, &etag) {
        true => StatusCode::NOT_MODIFIED.into_response(),
        false => (StatusCode::OK, body).into_response(),
    };
    let headers = response.headers_mut();
    if let Ok(value) = axum::http::HeaderValue::from_str(&etag) {
        headers.insert(axum::http::header::ETAG, value);
    }
    decorate(headers);
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::{HeaderMap, HeaderValue, header::IF_NONE_MATCH};

    #[test]
    fn an_etag_is_held_when_if_none_match_names_it() {
        let tag = etag_of(b"body");
        assert_eq!(tag.len(), 34);
        assert_ne!(tag, etag_of(b"other"));
        let with = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(IF_NONE_MATCH, HeaderValue::from_str(value).unwrap());
            headers
        };
        assert!(holds_etag(&with(&tag), &tag));
        assert!(holds_etag(&with(&format!("\"x\", W/{tag}")), &tag));
        assert!(holds_etag(&with("*"), &tag));
        assert!(!holds_etag(&with("\"x\""), &tag));
        assert!(!holds_etag(&HeaderMap::new(), &tag));
    }
}
