//! [`KeystoneTrusts`]: Keystone's trust API (`/v3/OS-TRUST/trusts`) as blazar-service's
//! [`Trusts`] needs it. A trust is made with the caller's own token (Keystone lets only the
//! trustor make one), to the service user the session logs in as; it is deleted with the
//! caller's token when the create it was made for fails, and with the service's
//! credentials when its lease is deleted.

use async_trait::async_trait;
use blazar_service::{Identity, TrustError, Trusts, UserToken};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::error::{Error, message_of};
use crate::session::Session;

pub struct KeystoneTrusts {
    /// The service user's own session: who trusts are made to, and who deletes them.
    session: Session,
}

/// The body of `POST /v3/OS-TRUST/trusts` Blazar sends: trustor the caller, trustee the
/// service user, the caller's project and roles (each once), impersonation, no expiry (a
/// lease may be extended; the trust goes with the lease).
fn trust_request(identity: &Identity, trustee_user_id: &str) -> Value {
    let mut roles: Vec<&str> = Vec::new();
    for role in &identity.roles {
        if !roles.iter().any(|r| r.eq_ignore_ascii_case(role)) {
            roles.push(role);
        }
    }
    json!({"trust": {
        "trustor_user_id": identity.user_id,
        "trustee_user_id": trustee_user_id,
        "project_id": identity.project_id,
        "roles": roles.iter().map(|name| json!({"name": name})).collect::<Vec<_>>(),
        "impersonation": true,
    }})
}

/// Keystone's answer to a trust call as a [`TrustError`]: its no (4xx) is a refusal, its
/// failures (5xx) an outage.
fn refusal(status: StatusCode, body: &Value, what: &str) -> TrustError {
    let message = format!("{what}: {status} {}", message_of(body));
    if status.is_server_error() {
        TrustError::Unavailable(message)
    } else {
        TrustError::Refused(message)
    }
}

/// A failure of the service's own session as a [`TrustError`]: Keystone or the service's
/// credentials not working is never the caller's fault.
fn session_error(e: Error) -> TrustError {
    TrustError::Unavailable(e.to_string())
}

impl KeystoneTrusts {
    pub fn new(session: Session) -> KeystoneTrusts {
        KeystoneTrusts { session }
    }

    /// One call to the trust API with `token`, answering the status and body.
    async fn call(
        &self,
        method: Method,
        path: &str,
        token: &str,
        body: Option<&Value>,
    ) -> Result<(StatusCode, Value), TrustError> {
        let url = self.session.identity_url(path);
        let mut request = self
            .session
            .http()
            .request(method.clone(), &url)
            .header("x-auth-token", token)
            .header("accept", "application/json");
        if let Some(id) = blazar_service::current_request_id() {
            request = request.header("x-openstack-request-id", id);
        }
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = crate::session::send(&method, request)
            .await
            .map_err(|e| TrustError::Unavailable(format!("identity {method} {path}: {e}")))?;
        let status = response.status();
        let text = response.text().await.unwrap_or_default();
        Ok((status, serde_json::from_str(&text).unwrap_or(Value::Null)))
    }
}

#[async_trait]
impl Trusts for KeystoneTrusts {
    async fn create(&self, identity: &Identity, token: &UserToken) -> Result<String, TrustError> {
        let trustee = self.session.user_id().await.map_err(session_error)?;
        let body = trust_request(identity, &trustee);
        let (status, answer) = self
            .call(
                Method::POST,
                "/OS-TRUST/trusts",
                token.expose(),
                Some(&body),
            )
            .await?;
        if !status.is_success() {
            return Err(refusal(status, &answer, "creating the trust"));
        }
        answer["trust"]["id"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| TrustError::Unavailable("Keystone made a trust without an id".into()))
    }

    async fn delete_as_trustor(&self, trust_id: &str, token: &UserToken) -> Result<(), TrustError> {
        let path = format!("/OS-TRUST/trusts/{trust_id}");
        let (status, answer) = self
            .call(Method::DELETE, &path, token.expose(), None)
            .await?;
        match status {
            s if s.is_success() || s == StatusCode::NOT_FOUND => Ok(()),
            s => Err(refusal(s, &answer, "deleting the trust")),
        }
    }

    async fn delete(&self, trust_id: &str) -> Result<(), TrustError> {
        let path = format!("/OS-TRUST/trusts/{trust_id}");
        let mut renew = false;
        loop {
            let token = self
                .session
                .token_value(renew)
                .await
                .map_err(session_error)?;
            let (status, answer) = self.call(Method::DELETE, &path, &token, None).await?;
            match status {
                s if s.is_success() || s == StatusCode::NOT_FOUND => return Ok(()),
                StatusCode::UNAUTHORIZED if !renew => renew = true,
                s => return Err(refusal(s, &answer, "deleting the trust")),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trust_is_the_callers_roles_in_the_callers_project_impersonated() {
        let identity = Identity {
            user_id: "u1".into(),
            project_id: "p1".into(),
            roles: vec!["member".into(), "reader".into(), "Member".into()],
        };
        assert_eq!(
            trust_request(&identity, "svc"),
            json!({"trust": {
                "trustor_user_id": "u1",
                "trustee_user_id": "svc",
                "project_id": "p1",
                "roles": [{"name": "member"}, {"name": "reader"}],
                "impersonation": true,
            }})
        );
    }

    #[test]
    fn keystone_saying_no_is_a_refusal_and_failing_an_outage() {
        let body =
            json!({"error": {"code": 403, "message": "Delegated tokens cannot manage trusts."}});
        assert_eq!(
            refusal(StatusCode::FORBIDDEN, &body, "creating the trust"),
            TrustError::Refused(
                "creating the trust: 403 Forbidden Delegated tokens cannot manage trusts.".into()
            )
        );
        assert!(matches!(
            refusal(StatusCode::BAD_GATEWAY, &Value::Null, "x"),
            TrustError::Unavailable(_)
        ));
        assert!(matches!(
            session_error(Error::Auth("refused".into())),
            TrustError::Unavailable(_)
        ));
    }
}
