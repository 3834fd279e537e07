//! Blazar's `ExternalServiceFilter`: usage enforcement delegated to a site's own service
//! (an accounting service, such as Chameleon's portal), over Blazar's protocol exactly:
//! `POST <endpoint>` with `{"context": .., "lease": ..}` (and `current_lease` for
//! `check-update`), `X-Auth-Token` when a token is configured; `204` allows, `403` with
//! `{"message": ..}` refuses with that message, anything else refuses with Blazar's
//! generic message. Unlike Blazar, every call is bounded: no answer in time is a refusal.

use std::time::Duration;

use async_trait::async_trait;
use blazar_service::{
    Denial, EnforcedLease, EnforcementContext, OnEndError, RefusalKind, UsageFilter,
};
use serde_json::{Value, json};
use url::Url;

/// Blazar's answer when the service refuses without a message it can pass on.
pub const GENERIC_DENY_MESSAGE: &str = "External service enforcement filter denied the request.";

/// The filter's options, as Blazar's `[enforcement]` group names them (plus a timeout).
#[derive(Debug, Clone, Default)]
pub struct ExternalServiceConfig {
    /// `external_service_base_endpoint`: `check-create`, `check-update` and `on-end` are
    /// resolved against it as relative references (so a base without a trailing `/` loses
    /// its last path segment, as Python's `urljoin` does for Blazar).
    pub base_endpoint: Option<String>,
    pub check_create_endpoint: Option<String>,
    pub check_update_endpoint: Option<String>,
    pub on_end_endpoint: Option<String>,
    /// Sent as `X-Auth-Token` when not empty.
    pub token: String,
    /// Longest a call may take, connection included.
    pub timeout: Duration,
}

pub struct ExternalServiceFilter {
    check_create: Option<Url>,
    check_update: Option<Url>,
    on_end: Option<Url>,
    token: String,
    http: reqwest::Client,
}

/// An http(s) URL with a host, or the reason it is not one (Blazar's checks at startup).
fn checked_url(url: &str) -> Result<Url, String> {
    let parsed =
        Url::parse(url).map_err(|e| format!("ExternalService URL is invalid: {url}: {e}"))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(format!("ExternalService URL scheme must be http(s): {url}"));
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(format!("ExternalService URL must have netloc: {url}"));
    }
    Ok(parsed)
}

impl ExternalServiceFilter {
    /// Checks the endpoints as Blazar does when it loads the filter: each an http(s) URL
    /// with a host, and at least one of the three resolved.
    pub fn new(config: &ExternalServiceConfig) -> Result<Self, String> {
        let base = config
            .base_endpoint
            .as_deref()
            .map(checked_url)
            .transpose()?;
        let endpoint =
            |method: &str, replacement: &Option<String>| -> Result<Option<Url>, String> {
                match (replacement, &base) {
                    (Some(url), _) => checked_url(url).map(Some),
                    (None, Some(base)) => base
                        .join(method)
                        .map(Some)
                        .map_err(|e| format!("ExternalService URL {base} + {method}: {e}")),
                    (None, None) => Ok(None),
                }
            };
        let filter = ExternalServiceFilter {
            check_create: endpoint("check-create", &config.check_create_endpoint)?,
            check_update: endpoint("check-update", &config.check_update_endpoint)?,
            on_end: endpoint("on-end", &config.on_end_endpoint)?,
            token: config.token.clone(),
            http: reqwest::Client::builder()
                .timeout(config.timeout)
                .connect_timeout(config.timeout)
                .build()
                .map_err(|e| format!("ExternalService HTTP client: {e}"))?,
        };
        if filter.check_create.is_none() && filter.check_update.is_none() && filter.on_end.is_none()
        {
            return Err("ExternalService has no endpoints set.".into());
        }
        Ok(filter)
    }

    /// The endpoints in use: check-create, check-update, on-end.
    pub fn endpoints(&self) -> [Option<&str>; 3] {
        [&self.check_create, &self.check_update, &self.on_end].map(|u| u.as_ref().map(Url::as_str))
    }

    /// One call; `Ok` on 204, else the message to refuse with. Transport failures and
    /// timeouts are refusals with the generic message (logged with their cause).
    async fn post(&self, url: &Url, body: &Value) -> Result<(), Outcome> {
        let mut request = self.http.post(url.clone()).json(body);
        if !self.token.is_empty() {
            request = request.header("X-Auth-Token", &self.token);
        }
        // The global request id of the API call (or, for `on-end`, of the call that ended
        // the lease), so the site's service logs can be matched with ours.
        if let Some(id) = blazar_service::current_request_id() {
            request = request.header("X-OpenStack-Request-Id", id);
        }
        let response = match request.send().await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(url = %url, error = %e, timeout = e.is_timeout(), "external enforcement service unreachable");
                return Err(Outcome::Unreachable(e.to_string()));
            }
        };
        let status = response.status();
        if status == reqwest::StatusCode::NO_CONTENT {
            return Ok(());
        }
        // The body is logged, never shown: it may hold what the user must not see.
        let text = match capped_text(response).await {
            Ok(text) => text,
            Err(e) => {
                tracing::warn!(url = %url, error = %e, "external enforcement service answer cut short");
                return Err(Outcome::Unreachable(e.to_string()));
            }
        };
        if status == reqwest::StatusCode::FORBIDDEN
            && let Ok(Value::Object(body)) = serde_json::from_str::<Value>(&text)
            && let Some(message) = body.get("message")
        {
            let message = match message {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            return Err(Outcome::Refused(message));
        }
        tracing::debug!(url = %url, status = status.as_u16(), body = %text, "external enforcement service refused without a message");
        Err(Outcome::Status(status.as_u16()))
    }

    async fn check(&self, url: &Option<Url>, body: Value) -> Result<(), Denial> {
        let Some(url) = url else {
            return Ok(());
        };
        self.post(url, &body).await.map_err(|outcome| Denial {
            kind: RefusalKind::BadRequest,
            message: match outcome {
                Outcome::Refused(message) => message,
                Outcome::Status(_) | Outcome::Unreachable(_) => GENERIC_DENY_MESSAGE.into(),
            },
            field: None,
        })
    }
}

/// Most of an answer's body that is read: a refusal's message is a sentence, and a service
/// that misbehaves must not make the server hold whatever it streams until the timeout.
/// A longer body is cut here, so it no longer parses and counts as a refusal without one.
const MAX_ANSWER: usize = 64 * 1024;

/// The body of `response`, its first [`MAX_ANSWER`] bytes at most.
async fn capped_text(mut response: reqwest::Response) -> Result<String, reqwest::Error> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await? {
        let room = MAX_ANSWER - body.len();
        body.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if body.len() >= MAX_ANSWER {
            break;
        }
    }
    Ok(String::from_utf8_lossy(&body).into_owned())
}

/// How a call that did not allow went.
enum Outcome {
    /// 403 with a message.
    Refused(String),
    /// Any other status.
    Status(u16),
    /// No answer (refused connection, timeout, cut short).
    Unreachable(String),
}

#[async_trait]
impl UsageFilter for ExternalServiceFilter {
    fn name(&self) -> &'static str {
        "ExternalServiceFilter"
    }

    fn local(&self) -> bool {
        false
    }

    fn reads_allocations(&self) -> bool {
        self.check_create.is_some() || self.check_update.is_some()
    }

    fn wants_on_end(&self) -> bool {
        self.on_end.is_some()
    }

    async fn check_create(
        &self,
        context: &EnforcementContext,
        lease: &EnforcedLease,
    ) -> Result<(), Denial> {
        let body = json!({"context": context.to_value(), "lease": lease.values});
        self.check(&self.check_create, body).await
    }

    async fn check_update(
        &self,
        context: &EnforcementContext,
        current: &EnforcedLease,
        new: &EnforcedLease,
    ) -> Result<(), Denial> {
        let body = json!({
            "context": context.to_value(),
            "current_lease": current.values,
            "lease": new.values,
        });
        self.check(&self.check_update, body).await
    }

    async fn on_end(&self, context: &Value, lease: &Value) -> Result<(), OnEndError> {
        let Some(url) = &self.on_end else {
            return Ok(());
        };
        let body = json!({"context": context, "lease": lease});
        match self.post(url, &body).await {
            Ok(()) => Ok(()),
            // Blazar only logs a refused on-end; another try would be refused again.
            Err(Outcome::Refused(message)) => {
                Err(OnEndError::Permanent(format!("on-end refused: {message}")))
            }
            Err(Outcome::Status(status)) if status < 500 => {
                Err(OnEndError::Permanent(format!("on-end answered {status}")))
            }
            Err(Outcome::Status(status)) => {
                Err(OnEndError::Transient(format!("on-end answered {status}")))
            }
            Err(Outcome::Unreachable(e)) => Err(OnEndError::Transient(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(base: Option<&str>, create: Option<&str>) -> ExternalServiceConfig {
        ExternalServiceConfig {
            base_endpoint: base.map(str::to_string),
            check_create_endpoint: create.map(str::to_string),
            timeout: Duration::from_secs(1),
            ..ExternalServiceConfig::default()
        }
    }

    /// Base, check-create override, and the three endpoints expected.
    type Row<'a> = (Option<&'a str>, Option<&'a str>, [Option<&'a str>; 3]);

    #[test]
    fn endpoints_resolve_as_blazar_resolves_them() {
        let rows: &[Row] = &[
            (
                Some("http://acct:8080/blazar/"),
                None,
                [
                    Some("http://acct:8080/blazar/check-create"),
                    Some("http://acct:8080/blazar/check-update"),
                    Some("http://acct:8080/blazar/on-end"),
                ],
            ),
            // urljoin: without a trailing slash the last segment is replaced.
            (
                Some("https://acct/api"),
                None,
                [
                    Some("https://acct/check-create"),
                    Some("https://acct/check-update"),
                    Some("https://acct/on-end"),
                ],
            ),
            (
                Some("http://acct/"),
                Some("http://other/create"),
                [
                    Some("http://other/create"),
                    Some("http://acct/check-update"),
                    Some("http://acct/on-end"),
                ],
            ),
            (
                None,
                Some("http://other/create"),
                [Some("http://other/create"), None, None],
            ),
        ];
        for (base, create, expected) in rows {
            let filter = ExternalServiceFilter::new(&config(*base, *create)).unwrap();
            assert_eq!(filter.endpoints(), *expected, "{base:?} {create:?}");
        }
    }

    #[test]
    fn bad_endpoints_are_refused_at_startup() {
        let rows: &[(Option<&str>, Option<&str>, &str)] = &[
            (None, None, "ExternalService has no endpoints set."),
            (Some("ftp://acct/"), None, "scheme must be http(s)"),
            (None, Some("file:///tmp/x"), "scheme must be http(s)"),
            (Some("acct:8080"), None, "scheme must be http(s)"),
            (Some("not a url"), None, "invalid"),
        ];
        for (base, create, expected) in rows {
            let err = ExternalServiceFilter::new(&config(*base, *create))
                .err()
                .unwrap_or_default();
            assert!(err.contains(expected), "{base:?} {create:?}: {err}");
        }
    }
}
