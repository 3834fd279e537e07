//! The client's one error type: what went wrong, said so that a user knows what to change.

use reqwest::StatusCode;

/// Everything a call to Blazar (or to Keystone on its way there) can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The server answered with an error status. `message` is Blazar's `error_message`, or
    /// the best text found in another error shape; the CLI prints it as `ERROR: <message>`
    /// like python-blazarclient does.
    #[error("{message}")]
    Api {
        status: StatusCode,
        message: String,
        /// Why a lease create or update was refused, item by item (empty otherwise).
        reasons: Vec<blazar_api::RefusalReason>,
    },

    /// The server could not be reached, or the connection broke.
    #[error("cannot reach {url}: {detail}")]
    Unreachable { url: String, detail: String },

    /// The server answered 2xx with a body that is not what Blazar sends.
    #[error("unexpected response from {url}: {detail}")]
    Decode { url: String, detail: String },

    /// Keystone refused the credentials, or its catalog has no Blazar endpoint.
    #[error("{0}")]
    Auth(String),

    /// The connection settings are incomplete or contradictory (flags, `OS_*` variables,
    /// clouds.yaml).
    #[error("{0}")]
    Config(String),
}

impl Error {
    /// The HTTP status of an API error, if this is one.
    pub fn status(&self) -> Option<StatusCode> {
        match self {
            Error::Api { status, .. } => Some(*status),
            _ => None,
        }
    }

    pub(crate) fn unreachable(url: &str, error: &reqwest::Error) -> Error {
        // reqwest's Display stops at the outermost layer ("error sending request"); the cause
        // chain holds the useful part ("Connection refused", a TLS complaint, ...).
        let mut detail = error.to_string();
        let mut source = std::error::Error::source(error);
        while let Some(cause) = source {
            let text = cause.to_string();
            if !detail.contains(&text) {
                detail.push_str(": ");
                detail.push_str(&text);
            }
            source = cause.source();
        }
        Error::Unreachable {
            url: url.to_string(),
            detail,
        }
    }
}

/// The message of an error body, whatever its shape: Blazar's `error_message` (shapes (a)
/// and (c) of the spec), Keystone's `{"error": {"message": ...}}`, or the raw text.
pub(crate) fn error_message(text: &str) -> String {
    let Ok(body) = serde_json::from_str::<serde_json::Value>(text) else {
        return text.trim().to_string();
    };
    if let Some(message) = body.get("error_message").and_then(|m| m.as_str()) {
        return message.to_string();
    }
    if let Some(message) = body
        .get("error")
        .and_then(|e| e.get("message"))
        .and_then(|m| m.as_str())
    {
        return message.to_string();
    }
    if let Some(message) = body.get("message").and_then(|m| m.as_str()) {
        return message.to_string();
    }
    text.trim().to_string()
}

/// The `reasons` of a refused lease create or update; none in any other body.
pub(crate) fn error_reasons(text: &str) -> Vec<blazar_api::RefusalReason> {
    serde_json::from_str::<blazar_api::ErrorBody>(text)
        .ok()
        .and_then(|body| body.reasons)
        .unwrap_or_default()
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_from_every_error_shape() {
        let cases = [
            (
                r#"{"error_code": 404, "error_message": "Object with {'lease_id': 'x'} not found", "error_name": 404}"#,
                "Object with {'lease_id': 'x'} not found",
            ),
            (
                r#"{"error": 405, "error_message": "The method is not allowed for the requested URL."}"#,
                "The method is not allowed for the requested URL.",
            ),
            (
                r#"{"error": {"code": 401, "title": "Unauthorized", "message": "The request you have made requires authentication."}}"#,
                "The request you have made requires authentication.",
            ),
            ("<html>Bad Gateway</html>\n", "<html>Bad Gateway</html>"),
        ];
        for (body, expected) in cases {
            assert_eq!(error_message(body), expected, "{body}");
            assert!(error_reasons(body).is_empty(), "{body}");
        }
    }

    #[test]
    fn reasons_of_a_refusal() {
        let body = r#"{"error_code": 409, "error_message": "Not enough hosts available",
            "error_name": 409, "reasons": [
                {"reservation": 1, "resource_type": "physical:host", "requested": {"min": 2, "max": 3}},
                {"reservation": "r-1", "matching": 4, "free": 1, "next_offer": null},
                {"rule": "blazar:leases:post"}]}"#;
        let reasons = error_reasons(body);
        assert_eq!(reasons.len(), 3);
        assert_eq!(
            reasons[0].reservation,
            Some(blazar_api::ReservationRef::Position(1))
        );
        assert_eq!(reasons[0].requested.as_ref().and_then(|r| r.max), Some(3));
        assert_eq!(
            reasons[1].reservation,
            Some(blazar_api::ReservationRef::Id("r-1".into()))
        );
        assert_eq!(
            reasons[1].next_offer,
            Some(None),
            "null is there, not absent"
        );
        assert_eq!(reasons[0].next_offer, None);
        assert_eq!(reasons[2].rule.as_deref(), Some("blazar:leases:post"));
    }
}
