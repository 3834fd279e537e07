//! A Keystone v3 session: a service token (password or application credential), renewed
//! before it expires and once more on a 401, and the catalog it came with.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tokio::sync::Mutex;

use crate::error::{Error, Result, message_of, tolerate};

#[derive(Debug, Clone)]
pub enum Credentials {
    Password {
        username: String,
        password: String,
        user_domain: String,
        project: String,
        project_domain: String,
    },
    ApplicationCredential {
        id: String,
        secret: String,
    },
}

#[derive(Debug, Clone)]
pub struct SessionConfig {
    /// Keystone's v3 URL, e.g. `http://keystone:5000/v3`.
    pub auth_url: String,
    pub credentials: Credentials,
    pub region: Option<String>,
    /// Catalog interface: `public`, `internal` or `admin`.
    pub interface: String,
    /// Endpoints by service type that replace the catalog's (`compute`, `placement`, ...).
    pub endpoint_overrides: HashMap<String, String>,
    /// Bound on every outbound request.
    pub timeout: Duration,
}

#[derive(Debug, Clone)]
struct Token {
    value: String,
    expires_at: DateTime<Utc>,
    /// The id of the user the token is for (a trust-scoped token's: the trustor's).
    user_id: String,
    /// service type -> (interface, region, url)
    catalog: Vec<(String, String, Option<String>, String)>,
}

/// What a session's token is scoped to.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Scope {
    /// The credentials' own project.
    Configured,
    /// Another project, by id.
    Project(String),
    /// A Keystone trust whose trustee is the service user, by id.
    Trust(String),
}

pub struct Session {
    http: reqwest::Client,
    config: SessionConfig,
    scope: Scope,
    token: Mutex<Option<Token>>,
}

/// A request beyond method and path.
#[derive(Debug, Default, Clone)]
pub struct Call<'a> {
    pub body: Option<Value>,
    /// Extra headers (microversions).
    pub headers: Vec<(&'static str, String)>,
    /// The global request id to send as `X-OpenStack-Request-ID`.
    pub request_id: Option<&'a str>,
}

/// What a service answered: status and body (JSON, or `Null` when empty or not JSON).
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: StatusCode,
    pub body: Value,
}

/// Calls to one service, each with the service's own headers (microversions) and the
/// request id, answering the body: what the Nova, Neutron and Placement clients share.
pub(crate) struct Api<'a> {
    session: &'a Session,
    service_type: &'static str,
    headers: Vec<(&'static str, String)>,
    request_id: Option<&'a str>,
}

impl<'a> Api<'a> {
    pub(crate) fn new(
        session: &'a Session,
        service_type: &'static str,
        headers: Vec<(&'static str, String)>,
        request_id: Option<&'a str>,
    ) -> Api<'a> {
        Api {
            session,
            service_type,
            headers,
            request_id,
        }
    }

    pub(crate) async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value> {
        let call = Call {
            body,
            headers: self.headers.clone(),
            request_id: self.request_id,
        };
        Ok(self
            .session
            .call(self.service_type, method, path, call)
            .await?
            .body)
    }

    pub(crate) async fn get(&self, path: &str) -> Result<Value> {
        self.call(Method::GET, path, None).await
    }

    /// Deletes what `path` names; already gone is fine.
    pub(crate) async fn delete(&self, path: &str) -> Result<()> {
        tolerate(
            self.call(Method::DELETE, path, None).await,
            Error::is_not_found,
        )
    }
}

/// The elements of list `key` of a service's answer (none when it has no such list).
pub(crate) fn items<'v>(body: &'v Value, key: &str) -> impl Iterator<Item = &'v Value> {
    body[key].as_array().into_iter().flatten()
}

impl Session {
    pub fn new(config: SessionConfig) -> Result<Session> {
        let http = reqwest::Client::builder()
            .timeout(config.timeout)
            .connect_timeout(config.timeout.min(Duration::from_secs(10)))
            .build()
            .map_err(|e| Error::Config(format!("HTTP client: {e}")))?;
        Ok(Session {
            http,
            config,
            scope: Scope::Configured,
            token: Mutex::new(None),
        })
    }

    /// The same service user scoped to project `project_id`, to act in that project (server
    /// groups belong to the project that makes them). The operator gives the service user a
    /// role there (an inherited role on the domain covers every project).
    pub fn for_project(&self, project_id: &str) -> Result<Session> {
        self.rescoped(Scope::Project(project_id.to_string()))
    }

    /// The service user acting through trust `trust_id`, which a user gave it: with
    /// impersonation the token is the trustor's, in the trust's project, with the roles it
    /// delegates (what Blazar's plugins do with `create_ctx_from_trust`).
    pub fn for_trust(&self, trust_id: &str) -> Result<Session> {
        self.rescoped(Scope::Trust(trust_id.to_string()))
    }

    fn rescoped(&self, scope: Scope) -> Result<Session> {
        if matches!(
            self.config.credentials,
            Credentials::ApplicationCredential { .. }
        ) {
            return Err(Error::Config(
                "an application credential is bound to its own project; acting in a user's \
                 project needs the service user's password"
                    .into(),
            ));
        }
        Ok(Session {
            http: self.http.clone(),
            config: self.config.clone(),
            scope,
            token: Mutex::new(None),
        })
    }

    /// Keystone's identity API URL of `path` (`/OS-TRUST/trusts`, ...).
    pub(crate) fn identity_url(&self, path: &str) -> String {
        format!("{}{path}", self.config.auth_url.trim_end_matches('/'))
    }

    pub(crate) fn http(&self) -> &reqwest::Client {
        &self.http
    }

    /// The id of the user this session authenticates as (logging in if it has not yet).
    pub async fn user_id(&self) -> Result<String> {
        Ok(self.token(false).await?.user_id)
    }

    /// The session's token, renewed a minute before it expires or (`renew`) after a 401.
    pub(crate) async fn token_value(&self, renew: bool) -> Result<String> {
        Ok(self.token(renew).await?.value)
    }

    async fn authenticate(&self) -> Result<Token> {
        let identity = match &self.config.credentials {
            Credentials::Password {
                username,
                password,
                user_domain,
                ..
            } => json!({"methods": ["password"], "password": {"user": {
                "name": username, "domain": {"name": user_domain}, "password": password}}}),
            Credentials::ApplicationCredential { id, secret } => json!({
                "methods": ["application_credential"],
                "application_credential": {"id": id, "secret": secret}}),
        };
        let mut auth = json!({"identity": identity});
        if let Credentials::Password {
            project,
            project_domain,
            ..
        } = &self.config.credentials
        {
            auth["scope"] = match &self.scope {
                Scope::Project(id) => json!({"project": {"id": id}}),
                Scope::Trust(id) => json!({"OS-TRUST:trust": {"id": id}}),
                Scope::Configured => {
                    json!({"project": {"name": project, "domain": {"name": project_domain}}})
                }
            };
        }
        let url = format!("{}/auth/tokens", self.config.auth_url.trim_end_matches('/'));
        let response = self
            .http
            .post(&url)
            .json(&json!({ "auth": auth }))
            .send()
            .await
            .map_err(|e| Error::Unreachable(format!("keystone: {e}")))?;
        let status = response.status();
        let value = response
            .headers()
            .get("x-subject-token")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let body: Value = response.json().await.unwrap_or(Value::Null);
        // Keystone failing is worth another try; a refusal is not.
        if status.is_server_error() {
            return Err(Error::Status {
                service: "identity".into(),
                request: "POST /auth/tokens".into(),
                status: status.as_u16(),
                message: message_of(&body),
            });
        }
        if !status.is_success() {
            let what = match &self.scope {
                Scope::Trust(id) => format!(
                    "keystone refused the service user's login through trust {id} (deleted, \
                     expired, or its roles no longer held by its user?)"
                ),
                _ => "keystone refused the service credentials".to_string(),
            };
            return Err(Error::Auth(format!(
                "{what} ({status}): {}",
                message_of(&body)
            )));
        }
        let value = value.ok_or_else(|| Error::Auth("keystone sent no token".into()))?;
        let expires_at = body["token"]["expires_at"]
            .as_str()
            .and_then(|s| DateTime::parse_from_rfc3339(s).ok())
            .map(|t| t.with_timezone(&Utc))
            .unwrap_or_else(|| Utc::now() + chrono::Duration::minutes(30));
        let mut catalog = Vec::new();
        for service in body["token"]["catalog"].as_array().into_iter().flatten() {
            let kind = service["type"].as_str().unwrap_or_default();
            for e in items(service, "endpoints") {
                catalog.push((
                    kind.to_string(),
                    e["interface"].as_str().unwrap_or_default().to_string(),
                    e["region_id"]
                        .as_str()
                        .or_else(|| e["region"].as_str())
                        .map(str::to_string),
                    e["url"].as_str().unwrap_or_default().to_string(),
                ));
            }
        }
        Ok(Token {
            value,
            expires_at,
            user_id: body["token"]["user"]["id"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            catalog,
        })
    }

    /// A valid token, renewed a minute before it expires.
    async fn token(&self, renew: bool) -> Result<Token> {
        let mut guard = self.token.lock().await;
        if let Some(t) = guard.as_ref()
            && !renew
            && t.expires_at - chrono::Duration::seconds(60) > Utc::now()
        {
            return Ok(t.clone());
        }
        let fresh = self.authenticate().await?;
        *guard = Some(fresh.clone());
        Ok(fresh)
    }

    /// The endpoint of `service_type`: the override, else the catalog's entry for the
    /// configured interface and region.
    pub async fn endpoint(&self, service_type: &str) -> Result<String> {
        if let Some(url) = self.config.endpoint_overrides.get(service_type) {
            return Ok(url.trim_end_matches('/').to_string());
        }
        let token = self.token(false).await?;
        token
            .catalog
            .iter()
            .find(|(kind, interface, region, _)| {
                kind == service_type
                    && *interface == self.config.interface
                    && (self.config.region.is_none() || *region == self.config.region)
            })
            .map(|(_, _, _, url)| url.trim_end_matches('/').to_string())
            .ok_or_else(|| {
                Error::Config(format!(
                    "no {} endpoint for {service_type}{} in the catalog",
                    self.config.interface,
                    self.config
                        .region
                        .as_ref()
                        .map(|r| format!(" in region {r}"))
                        .unwrap_or_default()
                ))
            })
    }

    /// One call to a service, with a fresh token and one more try after a 401.
    pub async fn call(
        &self,
        service_type: &str,
        method: Method,
        path: &str,
        call: Call<'_>,
    ) -> Result<Answer> {
        let base = self.endpoint(service_type).await?;
        let url = format!("{base}{path}");
        let mut renew = false;
        loop {
            let token = self.token(renew).await?;
            let mut request = self
                .http
                .request(method.clone(), &url)
                .header("x-auth-token", &token.value)
                .header("accept", "application/json");
            for (name, value) in &call.headers {
                request = request.header(*name, value);
            }
            // The action's request id, or, for calls made while serving a request (flavor
            // and host look-ups), that request's global id.
            if let Some(id) = call
                .request_id
                .map(str::to_string)
                .or_else(blazar_service::current_request_id)
            {
                request = request.header("x-openstack-request-id", id);
            }
            if let Some(body) = &call.body {
                request = request.json(body);
            }
            let response = request
                .send()
                .await
                .map_err(|e| Error::Unreachable(format!("{service_type} {method} {path}: {e}")))?;
            let status = response.status();
            if status == StatusCode::UNAUTHORIZED && !renew {
                renew = true;
                continue;
            }
            let text = response
                .text()
                .await
                .map_err(|e| Error::Unreachable(format!("{service_type} {method} {path}: {e}")))?;
            let body = serde_json::from_str(&text).unwrap_or(Value::Null);
            if status.is_success() {
                return Ok(Answer { status, body });
            }
            return Err(Error::Status {
                service: service_type.to_string(),
                request: format!("{method} {path}"),
                status: status.as_u16(),
                message: if body.is_null() {
                    text.chars().take(300).collect()
                } else {
                    message_of(&body)
                },
            });
        }
    }
}

