//! Keystone v3: getting a token (password, token or application credential) and finding
//! Blazar's endpoint (service type `reservation`) in the catalog that comes with it.

use serde::Deserialize;
use serde_json::{Value, json};

use crate::error::{Error, Result, error_message};

/// Who is asking for a token.
#[derive(Clone, PartialEq, Eq)]
pub enum Credentials {
    Password {
        user: Named,
        password: String,
        project: Option<Named>,
    },
    /// An existing token, exchanged for a project-scoped one (with a catalog).
    Token {
        token: String,
        project: Option<Named>,
    },
    /// An application credential: by id, or by name with its user. Its scope is fixed.
    ApplicationCredential {
        id: Option<String>,
        name: Option<String>,
        user: Option<Named>,
        secret: String,
    },
}

impl std::fmt::Debug for Credentials {
    // Passwords, tokens and secrets never reach a log line or a panic message.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Credentials::Password { user, project, .. } => f
                .debug_struct("Password")
                .field("user", user)
                .field("project", project)
                .finish_non_exhaustive(),
            Credentials::Token { project, .. } => f
                .debug_struct("Token")
                .field("project", project)
                .finish_non_exhaustive(),
            Credentials::ApplicationCredential { id, name, user, .. } => f
                .debug_struct("ApplicationCredential")
                .field("id", id)
                .field("name", name)
                .field("user", user)
                .finish_non_exhaustive(),
        }
    }
}

/// A user or a project, by id or by name within a domain (by id or name).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Named {
    pub id: Option<String>,
    pub name: Option<String>,
    pub domain_id: Option<String>,
    pub domain_name: Option<String>,
}

impl Named {
    fn to_json(&self) -> Value {
        if let Some(id) = &self.id {
            return json!({ "id": id });
        }
        // keystoneauth requires a domain with a name; "Default" is what every deployment
        // tool creates, so it is the default here rather than an error.
        let domain = match (&self.domain_id, &self.domain_name) {
            (Some(id), _) => json!({ "id": id }),
            (None, Some(name)) => json!({ "name": name }),
            (None, None) => json!({ "name": "Default" }),
        };
        json!({ "name": self.name.clone().unwrap_or_default(), "domain": domain })
    }

    fn is_set(&self) -> bool {
        self.id.is_some() || self.name.is_some()
    }
}

/// A token and the catalog Keystone returned with it.
#[derive(Clone)]
pub struct Session {
    pub token: String,
    pub catalog: Vec<Service>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Service {
    #[serde(rename = "type")]
    pub service_type: String,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub endpoints: Vec<Endpoint>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Endpoint {
    pub interface: String,
    pub url: String,
    #[serde(default)]
    pub region: Option<String>,
    #[serde(default)]
    pub region_id: Option<String>,
}

#[derive(Deserialize)]
struct TokenBody {
    token: TokenInfo,
}

#[derive(Deserialize)]
struct TokenInfo {
    #[serde(default)]
    catalog: Vec<Service>,
}

/// `http://keystone:5000`, `.../v3` and `.../v3/` all name the same v3 API.
pub fn tokens_url(auth_url: &str) -> String {
    let base = auth_url.trim().trim_end_matches('/');
    if base.ends_with("/v3") {
        format!("{base}/auth/tokens")
    } else {
        format!("{base}/v3/auth/tokens")
    }
}

fn request_body(credentials: &Credentials) -> Result<Value> {
    let scope = |project: &Option<Named>| -> Option<Value> {
        project
            .as_ref()
            .filter(|p| p.is_set())
            .map(|p| json!({ "project": p.to_json() }))
    };
    let (identity, scope) = match credentials {
        Credentials::Password {
            user,
            password,
            project,
        } => {
            if !user.is_set() {
                return Err(Error::Config(
                    "password authentication needs a user: set OS_USERNAME (or --os-username)"
                        .into(),
                ));
            }
            let mut user_json = user.to_json();
            if let Some(object) = user_json.as_object_mut() {
                object.insert("password".into(), Value::String(password.clone()));
            }
            (
                json!({ "methods": ["password"], "password": { "user": user_json } }),
                scope(project),
            )
        }
        Credentials::Token { token, project } => (
            json!({ "methods": ["token"], "token": { "id": token } }),
            scope(project),
        ),
        Credentials::ApplicationCredential {
            id,
            name,
            user,
            secret,
        } => {
            let credential = match (id, name, user) {
                (Some(id), _, _) => json!({ "id": id, "secret": secret }),
                (None, Some(name), Some(user)) if user.is_set() => {
                    json!({ "name": name, "user": user.to_json(), "secret": secret })
                }
                _ => {
                    return Err(Error::Config(
                        "application credential authentication needs \
                         OS_APPLICATION_CREDENTIAL_ID, or OS_APPLICATION_CREDENTIAL_NAME with \
                         OS_USERNAME"
                            .into(),
                    ));
                }
            };
            (
                json!({ "methods": ["application_credential"], "application_credential": credential }),
                None,
            )
        }
    };
    let mut auth = json!({ "identity": identity });
    if let (Some(scope), Some(object)) = (scope, auth.as_object_mut()) {
        object.insert("scope".into(), scope);
    }
    Ok(json!({ "auth": auth }))
}

/// `POST /v3/auth/tokens`: a token from `X-Subject-Token` and the catalog from the body.
pub async fn authenticate(
    http: &reqwest::Client,
    auth_url: &str,
    credentials: &Credentials,
) -> Result<Session> {
    let url = tokens_url(auth_url);
    let body = request_body(credentials)?;
    let response = http
        .post(&url)
        .header("Accept", "application/json")
        .json(&body)
        .send()
        .await
        .map_err(|e| Error::unreachable(&url, &e))?;
    let status = response.status();
    let token = response
        .headers()
        .get("x-subject-token")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let text = response
        .text()
        .await
        .map_err(|e| Error::unreachable(&url, &e))?;
    if !status.is_success() {
        let hint = match status.as_u16() {
            401 => {
                "; check the user name, password (or token, application credential), \
                 project and domains"
            }
            404 => {
                "; check OS_AUTH_URL: it should be Keystone's URL, such as http://keystone:5000/v3"
            }
            _ => "",
        };
        return Err(Error::Auth(format!(
            "Keystone at {url} refused to issue a token ({status}): {}{hint}",
            error_message(&text)
        )));
    }
    let Some(token) = token else {
        return Err(Error::Auth(format!(
            "Keystone at {url} answered without an X-Subject-Token header; is OS_AUTH_URL \
             Keystone's URL?"
        )));
    };
    let body: TokenBody = serde_json::from_str(&text).map_err(|e| Error::Decode {
        url: url.clone(),
        detail: e.to_string(),
    })?;
    Ok(Session {
        token,
        catalog: body.token.catalog,
    })
}

/// keystoneauth accepts the old `publicURL` spellings too.
fn normalize_interface(interface: &str) -> String {
    interface
        .trim()
        .trim_end_matches("URL")
        .to_ascii_lowercase()
}

/// The URL of `service_type` for `interface` (and `region`, if given) in a catalog.
pub fn find_endpoint(
    catalog: &[Service],
    service_type: &str,
    interface: &str,
    region: Option<&str>,
) -> Result<String> {
    let interface = normalize_interface(interface);
    let Some(service) = catalog.iter().find(|s| s.service_type == service_type) else {
        let mut known: Vec<&str> = catalog.iter().map(|s| s.service_type.as_str()).collect();
        known.sort_unstable();
        let known = if known.is_empty() {
            "the catalog is empty (is a project set? OS_PROJECT_NAME or OS_PROJECT_ID)".to_string()
        } else {
            format!("it has: {}", known.join(", "))
        };
        return Err(Error::Auth(format!(
            "the Keystone catalog has no {service_type:?} service; {known}. Register Blazar's \
             endpoint in Keystone, or give it directly with --os-endpoint"
        )));
    };
    let in_region = |e: &&Endpoint| {
        region.is_none_or(|r| e.region.as_deref() == Some(r) || e.region_id.as_deref() == Some(r))
    };
    service
        .endpoints
        .iter()
        .filter(in_region)
        .find(|e| normalize_interface(&e.interface) == interface)
        .map(|e| e.url.clone())
        .ok_or_else(|| {
            let available: Vec<String> = service
                .endpoints
                .iter()
                .map(|e| match e.region.as_deref().or(e.region_id.as_deref()) {
                    Some(r) => format!("{} in {r}", e.interface),
                    None => e.interface.clone(),
                })
                .collect();
            Error::Auth(format!(
                "the {service_type:?} service has no {interface} endpoint{}; it has: {}. Set \
                 OS_INTERFACE or OS_REGION_NAME accordingly",
                region
                    .map(|r| format!(" in region {r}"))
                    .unwrap_or_default(),
                if available.is_empty() {
                    "none".to_string()
                } else {
                    available.join(", ")
                }
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn catalog() -> Vec<Service> {
        serde_json::from_value(json!([
            {"type": "identity", "endpoints": [{"interface": "public", "url": "http://ks/v3", "region": "r1"}]},
            {"type": "reservation", "name": "blazar", "endpoints": [
                {"interface": "public", "url": "http://pub/v1", "region": "r1", "region_id": "r1"},
                {"interface": "internal", "url": "http://int/v1", "region": "r1"},
                {"interface": "public", "url": "http://pub2/v1", "region": "r2"}
            ]}
        ]))
        .unwrap()
    }

    #[test]
    fn catalog_lookup() {
        let c = catalog();
        assert_eq!(
            find_endpoint(&c, "reservation", "public", None).unwrap(),
            "http://pub/v1"
        );
        assert_eq!(
            find_endpoint(&c, "reservation", "publicURL", Some("r2")).unwrap(),
            "http://pub2/v1"
        );
        assert_eq!(
            find_endpoint(&c, "reservation", "internal", None).unwrap(),
            "http://int/v1"
        );
        let missing = find_endpoint(&c, "reservation", "admin", None)
            .unwrap_err()
            .to_string();
        assert!(missing.contains("no admin endpoint"), "{missing}");
        let no_service = find_endpoint(&c, "compute", "public", None)
            .unwrap_err()
            .to_string();
        assert!(
            no_service.contains("it has: identity, reservation"),
            "{no_service}"
        );
    }

    #[test]
    fn token_urls() {
        assert_eq!(
            tokens_url("http://ks:5000"),
            "http://ks:5000/v3/auth/tokens"
        );
        assert_eq!(
            tokens_url("http://ks:5000/v3/"),
            "http://ks:5000/v3/auth/tokens"
        );
        assert_eq!(
            tokens_url("https://c/identity/v3"),
            "https://c/identity/v3/auth/tokens"
        );
    }

    #[test]
    fn password_body() {
        let body = request_body(&Credentials::Password {
            user: Named {
                name: Some("alice".into()),
                domain_name: Some("Users".into()),
                ..Named::default()
            },
            password: "s3cret".into(),
            project: Some(Named {
                name: Some("demo".into()),
                ..Named::default()
            }),
        })
        .unwrap();
        assert_eq!(
            body,
            json!({"auth": {
                "identity": {"methods": ["password"], "password": {"user": {
                    "name": "alice", "domain": {"name": "Users"}, "password": "s3cret"}}},
                "scope": {"project": {"name": "demo", "domain": {"name": "Default"}}}
            }})
        );
    }

    #[test]
    fn secrets_stay_out_of_debug_output() {
        let credentials = Credentials::Password {
            user: Named::default(),
            password: "s3cret".into(),
            project: None,
        };
        assert!(!format!("{credentials:?}").contains("s3cret"));
    }
}
