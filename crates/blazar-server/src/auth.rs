//! Authentication: who a request acts as, in one of three modes (noauth for development,
//! Keystone tokens, standalone tokens), and Keystone's 401 for requests that are not
//! (the middleware that applies it is in `app.rs`).

use std::sync::Arc;

use axum::Json;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use blazar_api::{AuthError, AuthErrorDetail, ErrorBody};
use blazar_service::Identity;

use crate::ids::keystone_like_id;
use crate::keystone::{Keystone, KeystoneError, Verdict};
use crate::tokens::TokenAuth;

/// How requests are authenticated.
#[derive(Clone)]
pub enum Auth {
    /// Development mode: every request acts as an admin of a default project unless the
    /// `X-Project-Id`, `X-User-Id` and `X-Roles` headers say otherwise.
    NoAuth { default: Identity },
    /// `X-Auth-Token` validated by Keystone.
    Keystone(Arc<Keystone>),
    /// `X-Auth-Token` made by `blazar-server token create`.
    Tokens(TokenAuth),
}

/// Why a request is not let through.
#[derive(Debug)]
pub enum AuthFailure {
    /// No token, or one that is unknown, revoked or expired: Keystone's 401.
    Unauthorized { www_authenticate: Option<String> },
    /// A valid Keystone token not scoped to a project.
    NotProjectScoped,
    /// The token could not be checked (Keystone or the database is down): 503.
    Unavailable,
    /// noauth identity headers that no stored lease could carry: 400, saying which.
    BadIdentity(String),
}

impl IntoResponse for AuthFailure {
    fn into_response(self) -> Response {
        match self {
            // keystonemiddleware's body, which OpenStack clients recognise.
            AuthFailure::Unauthorized { www_authenticate } => {
                let mut response = (
                    StatusCode::UNAUTHORIZED,
                    Json(keystone_error(
                        401,
                        "Unauthorized",
                        "The request you have made requires authentication.",
                    )),
                )
                    .into_response();
                if let Some(value) = www_authenticate.and_then(|v| HeaderValue::from_str(&v).ok()) {
                    response.headers_mut().insert("www-authenticate", value);
                }
                response
            }
            AuthFailure::NotProjectScoped => (
                StatusCode::FORBIDDEN,
                Json(ErrorBody {
                    error_code: 403,
                    error_message: "The token is not scoped to a project; Blazar needs a \
                                    project-scoped token"
                        .into(),
                    error_name: serde_json::Value::from(403),
                    reasons: None,
                }),
            )
                .into_response(),
            AuthFailure::BadIdentity(message) => (
                StatusCode::BAD_REQUEST,
                Json(ErrorBody {
                    error_code: 400,
                    error_message: message,
                    error_name: serde_json::Value::from(400),
                    reasons: None,
                }),
            )
                .into_response(),
            AuthFailure::Unavailable => (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(keystone_error(
                    503,
                    "Service Unavailable",
                    "The token could not be validated; try again later.",
                )),
            )
                .into_response(),
        }
    }
}

/// keystonemiddleware's error body.
fn keystone_error(code: u16, title: &str, message: &str) -> AuthError {
    AuthError {
        error: AuthErrorDetail {
            code,
            title: title.to_string(),
            message: message.to_string(),
        },
    }
}

fn header(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map(str::to_string)
}

/// The token a request authenticates with, in the token modes: `X-Auth-Token` given once.
/// Given twice it names nobody (a proxy would join them, as WSGI does, into a token
/// Keystone refuses): never whichever comes first.
fn auth_token(headers: &HeaderMap) -> Option<String> {
    if headers.get_all("x-auth-token").iter().nth(1).is_some() {
        return None;
    }
    header(headers, "x-auth-token")
}

/// A noauth identity header as text: one that is there must be usable, since falling back
/// to the default identity (an admin) would hand a caller who meant another project the
/// default project's leases.
fn noauth_text<'a>(name: &str, value: &'a HeaderValue) -> Result<&'a str, AuthFailure> {
    value
        .to_str()
        .map(str::trim)
        .map_err(|_| AuthFailure::BadIdentity(format!("{name} must be printable ASCII")))
}

/// The project or user id a noauth caller names, if any: given once and not empty.
fn noauth_id(headers: &HeaderMap, name: &str) -> Result<Option<String>, AuthFailure> {
    let mut values = headers.get_all(name).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(AuthFailure::BadIdentity(format!(
            "{name} is given more than once"
        )));
    }
    let value = noauth_text(name, value)?;
    if value.is_empty() {
        return Err(AuthFailure::BadIdentity(format!("{name} is empty")));
    }
    Ok(Some(value.to_string()))
}

/// Longest user or project id or role name a noauth caller may give: what Blazar's columns
/// hold (Keystone's own ids are 64 characters).
const MAX_NOAUTH_ID: usize = 255;
/// Most roles a noauth caller may give.
const MAX_NOAUTH_ROLES: usize = 64;

/// Refuses noauth identities that leases and logs cannot carry: ids longer than a column,
/// control characters, an endless list of roles.
fn check_noauth_identity(identity: &Identity) -> Result<(), AuthFailure> {
    let fields = [
        ("X-Project-Id", identity.project_id.as_str()),
        ("X-User-Id", identity.user_id.as_str()),
    ];
    let roles = identity.roles.iter().map(|r| ("X-Roles", r.as_str()));
    for (name, value) in fields.into_iter().chain(roles) {
        if value.chars().count() > MAX_NOAUTH_ID {
            return Err(AuthFailure::BadIdentity(format!(
                "{name} is longer than {MAX_NOAUTH_ID} characters"
            )));
        }
        if value.chars().any(char::is_control) {
            return Err(AuthFailure::BadIdentity(format!(
                "{name} holds control characters"
            )));
        }
    }
    if identity.roles.len() > MAX_NOAUTH_ROLES {
        return Err(AuthFailure::BadIdentity(format!(
            "X-Roles names more than {MAX_NOAUTH_ROLES} roles"
        )));
    }
    Ok(())
}

/// The caller's own token, as sent: what a Keystone trust is made with.
pub fn user_token(headers: &HeaderMap) -> Option<blazar_service::UserToken> {
    header(headers, "x-auth-token").map(blazar_service::UserToken::new)
}

/// In noauth mode a token `noauth:<user>:<project>:<role>[,<role>...]` (or `peer:...`, the
/// spelling of the reference test bed) acts as that user and project, for clients that cannot
/// send identity headers. Any other token (such as keystoneauth's `notused`) is ignored.
fn identity_from_token(token: &str) -> Option<Identity> {
    let parts: Vec<&str> = token.split(':').collect();
    match parts.as_slice() {
        ["noauth" | "peer", user, project, roles] if !user.is_empty() && !project.is_empty() => {
            Some(Identity {
                user_id: keystone_like_id("user", user),
                project_id: keystone_like_id("project", project),
                roles: roles
                    .split(',')
                    .filter(|r| !r.is_empty())
                    .map(str::to_string)
                    .collect(),
            })
        }
        _ => None,
    }
}

impl Auth {
    pub fn noauth(project_id: &str, user_id: &str) -> Auth {
        Auth::NoAuth {
            default: Identity {
                user_id: user_id.to_string(),
                project_id: project_id.to_string(),
                roles: vec!["admin".into(), "member".into(), "reader".into()],
            },
        }
    }

    pub fn keystone(keystone: Keystone) -> Auth {
        Auth::Keystone(Arc::new(keystone))
    }

    pub fn tokens(tokens: TokenAuth) -> Auth {
        Auth::Tokens(tokens)
    }

    /// The mode's name, as in the configuration.
    pub fn mode(&self) -> &'static str {
        match self {
            Auth::NoAuth { .. } => "noauth",
            Auth::Keystone(_) => "keystone",
            Auth::Tokens(_) => "tokens",
        }
    }

    /// Who the request acts as. In the token modes the identity headers of noauth are
    /// ignored: only the token speaks.
    pub async fn identify(&self, headers: &HeaderMap) -> Result<Identity, AuthFailure> {
        match self {
            Auth::Keystone(keystone) => {
                let token = auth_token(headers).ok_or_else(|| self.unauthorized())?;
                match keystone.validate(&token).await {
                    Ok(Verdict::Valid(principal)) => {
                        tracing::debug!(
                            user.id = %principal.user_id,
                            user.domain = %principal.user_domain_id,
                            project.id = %principal.project_id,
                            project.domain = %principal.project_domain_id,
                            "authenticated by Keystone"
                        );
                        Ok(principal.identity())
                    }
                    Ok(Verdict::Invalid) => Err(self.unauthorized()),
                    Ok(Verdict::NotProjectScoped) => Err(AuthFailure::NotProjectScoped),
                    Err(e) => {
                        match &e {
                            KeystoneError::Refused(_) => {
                                tracing::error!(error = %e, "cannot validate tokens")
                            }
                            KeystoneError::Unavailable(_) => {
                                tracing::warn!(error = %e, "cannot validate a token")
                            }
                        }
                        Err(AuthFailure::Unavailable)
                    }
                }
            }
            Auth::Tokens(tokens) => {
                let token = auth_token(headers).ok_or_else(|| self.unauthorized())?;
                match tokens.identify(&token).await {
                    Ok(Some(identity)) => Ok(identity),
                    Ok(None) => Err(self.unauthorized()),
                    Err(e) => {
                        tracing::error!(error = %e, "cannot read API tokens");
                        Err(AuthFailure::Unavailable)
                    }
                }
            }
            Auth::NoAuth { default } => {
                let mut identity = header(headers, "x-auth-token")
                    .and_then(|token| identity_from_token(&token))
                    .unwrap_or_else(|| default.clone());
                if let Some(project) = noauth_id(headers, "X-Project-Id")? {
                    identity.project_id = project;
                }
                if let Some(user) = noauth_id(headers, "X-User-Id")? {
                    identity.user_id = user;
                }
                // Every X-Roles header counts (as a proxy joining them would send them);
                // an empty one means no roles, never the default's.
                let mut given = None;
                for value in headers.get_all("x-roles") {
                    let value = noauth_text("X-Roles", value)?;
                    given.get_or_insert_with(Vec::new).extend(
                        value
                            .split(',')
                            .map(|r| r.trim().to_string())
                            .filter(|r| !r.is_empty()),
                    );
                }
                if let Some(roles) = given {
                    identity.roles = roles;
                }
                check_noauth_identity(&identity)?;
                Ok(identity)
            }
        }
    }

    pub(crate) fn unauthorized(&self) -> AuthFailure {
        AuthFailure::Unauthorized {
            www_authenticate: match self {
                Auth::Keystone(keystone) => {
                    Some(format!("Keystone uri=\"{}\"", keystone.public_uri()))
                }
                Auth::Tokens(_) | Auth::NoAuth { .. } => None,
            },
        }
    }
}
