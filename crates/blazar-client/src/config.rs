//! Where to connect and as whom, gathered like every OpenStack client does: command-line
//! options over `OS_*` variables over the cloud named by `OS_CLOUD` in clouds.yaml.

use std::path::{Path, PathBuf};

use yaml_rust2::{Yaml, YamlLoader};

use crate::auth::{self, Credentials, Named};
use crate::client::{Client, http_client};
use crate::error::{Error, Result};

/// Connection settings; `None` means "not given here", so layers can be merged.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ConnectOptions {
    pub cloud: Option<String>,
    /// `none`, `admin_token`, `password`, `token`, `v3applicationcredential` (and their
    /// keystoneauth aliases).
    pub auth_type: Option<String>,
    pub auth_url: Option<String>,
    /// Blazar's URL, skipping the catalog (`--os-endpoint`, `BLAZAR_URL`).
    pub endpoint: Option<String>,
    pub token: Option<String>,
    pub username: Option<String>,
    pub user_id: Option<String>,
    pub password: Option<String>,
    pub project_name: Option<String>,
    pub project_id: Option<String>,
    pub user_domain_name: Option<String>,
    pub user_domain_id: Option<String>,
    pub project_domain_name: Option<String>,
    pub project_domain_id: Option<String>,
    pub application_credential_id: Option<String>,
    pub application_credential_name: Option<String>,
    pub application_credential_secret: Option<String>,
    pub region_name: Option<String>,
    /// Catalog interface: `public` (default), `internal` or `admin`.
    pub interface: Option<String>,
    pub cacert: Option<PathBuf>,
    pub insecure: Option<bool>,
}

impl std::fmt::Debug for ConnectOptions {
    // Credentials are shown only as present or absent.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let secret = |s: &Option<String>| s.as_ref().map(|_| "***");
        f.debug_struct("ConnectOptions")
            .field("cloud", &self.cloud)
            .field("auth_type", &self.auth_type)
            .field("auth_url", &self.auth_url)
            .field("endpoint", &self.endpoint)
            .field("token", &secret(&self.token))
            .field("username", &self.username)
            .field("user_id", &self.user_id)
            .field("password", &secret(&self.password))
            .field("project_name", &self.project_name)
            .field("project_id", &self.project_id)
            .field("region_name", &self.region_name)
            .field("interface", &self.interface)
            .finish_non_exhaustive()
    }
}

/// How requests are authenticated, once the layers are merged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthType {
    /// No authentication: `X-Auth-Token: notused` (noauth servers).
    None,
    /// A token sent as is to a known endpoint (keystoneauth's `admin_token`).
    AdminToken,
    Password,
    Token,
    ApplicationCredential,
}

impl AuthType {
    pub fn parse(text: &str) -> Result<AuthType> {
        match text.trim().to_ascii_lowercase().as_str() {
            "none" | "noauth" => Ok(AuthType::None),
            "admin_token" | "token_endpoint" => Ok(AuthType::AdminToken),
            "password" | "v3password" => Ok(AuthType::Password),
            "token" | "v3token" => Ok(AuthType::Token),
            "v3applicationcredential" | "applicationcredential" | "application_credential" => {
                Ok(AuthType::ApplicationCredential)
            }
            other => Err(Error::Config(format!(
                "unsupported auth type {other:?}; use one of none, admin_token, password, token, \
                 v3applicationcredential"
            ))),
        }
    }
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn truthy(text: &str) -> bool {
    matches!(
        text.trim().to_ascii_lowercase().as_str(),
        "1" | "true" | "yes" | "on"
    )
}

impl ConnectOptions {
    /// The `OS_*` variables (and `BLAZAR_URL`), as keystoneauth reads them.
    pub fn from_env() -> ConnectOptions {
        ConnectOptions {
            cloud: env("OS_CLOUD"),
            auth_type: env("OS_AUTH_TYPE").or_else(|| env("OS_AUTH_PLUGIN")),
            auth_url: env("OS_AUTH_URL"),
            endpoint: env("OS_ENDPOINT")
                .or_else(|| env("OS_ENDPOINT_OVERRIDE"))
                .or_else(|| env("BLAZAR_URL")),
            token: env("OS_TOKEN"),
            username: env("OS_USERNAME"),
            user_id: env("OS_USER_ID"),
            password: env("OS_PASSWORD"),
            project_name: env("OS_PROJECT_NAME").or_else(|| env("OS_TENANT_NAME")),
            project_id: env("OS_PROJECT_ID").or_else(|| env("OS_TENANT_ID")),
            user_domain_name: env("OS_USER_DOMAIN_NAME"),
            user_domain_id: env("OS_USER_DOMAIN_ID"),
            project_domain_name: env("OS_PROJECT_DOMAIN_NAME"),
            project_domain_id: env("OS_PROJECT_DOMAIN_ID"),
            application_credential_id: env("OS_APPLICATION_CREDENTIAL_ID"),
            application_credential_name: env("OS_APPLICATION_CREDENTIAL_NAME"),
            application_credential_secret: env("OS_APPLICATION_CREDENTIAL_SECRET"),
            region_name: env("OS_REGION_NAME"),
            interface: env("OS_INTERFACE").or_else(|| env("OS_ENDPOINT_TYPE")),
            cacert: env("OS_CACERT").map(PathBuf::from),
            insecure: env("OS_INSECURE").map(|v| truthy(&v)),
        }
    }

    /// Keeps every field set here and takes the others from `lower`.
    pub fn or(self, lower: ConnectOptions) -> ConnectOptions {
        ConnectOptions {
            cloud: self.cloud.or(lower.cloud),
            auth_type: self.auth_type.or(lower.auth_type),
            auth_url: self.auth_url.or(lower.auth_url),
            endpoint: self.endpoint.or(lower.endpoint),
            token: self.token.or(lower.token),
            username: self.username.or(lower.username),
            user_id: self.user_id.or(lower.user_id),
            password: self.password.or(lower.password),
            project_name: self.project_name.or(lower.project_name),
            project_id: self.project_id.or(lower.project_id),
            user_domain_name: self.user_domain_name.or(lower.user_domain_name),
            user_domain_id: self.user_domain_id.or(lower.user_domain_id),
            project_domain_name: self.project_domain_name.or(lower.project_domain_name),
            project_domain_id: self.project_domain_id.or(lower.project_domain_id),
            application_credential_id: self
                .application_credential_id
                .or(lower.application_credential_id),
            application_credential_name: self
                .application_credential_name
                .or(lower.application_credential_name),
            application_credential_secret: self
                .application_credential_secret
                .or(lower.application_credential_secret),
            region_name: self.region_name.or(lower.region_name),
            interface: self.interface.or(lower.interface),
            cacert: self.cacert.or(lower.cacert),
            insecure: self.insecure.or(lower.insecure),
        }
    }

    /// Fills what is still unset from the cloud named by `cloud`, if any, in the first
    /// clouds.yaml found (see [`clouds_yaml_paths`]), merged with its secure.yaml.
    pub fn with_clouds_yaml(self) -> Result<ConnectOptions> {
        let Some(name) = self.cloud.clone() else {
            return Ok(self);
        };
        let Some(path) = clouds_yaml_paths("clouds.yaml")
            .into_iter()
            .find(|p| p.is_file())
        else {
            let searched: Vec<String> = clouds_yaml_paths("clouds.yaml")
                .iter()
                .map(|p| p.display().to_string())
                .collect();
            return Err(Error::Config(format!(
                "cloud {name:?} was asked for (OS_CLOUD or --os-cloud) but no clouds.yaml was \
                 found; looked in {}",
                searched.join(", ")
            )));
        };
        let mut cloud = read_cloud(&path, &name)?.ok_or_else(|| {
            let known = cloud_names(&path).unwrap_or_default();
            Error::Config(format!(
                "cloud {name:?} is not in {}; it defines: {}",
                path.display(),
                if known.is_empty() {
                    "no clouds".to_string()
                } else {
                    known.join(", ")
                }
            ))
        })?;
        if let Some(secure) = clouds_yaml_paths("secure.yaml")
            .into_iter()
            .find(|p| p.is_file())
            && let Some(secrets) = read_cloud(&secure, &name)?
        {
            cloud = secrets.or(cloud);
        }
        Ok(self.or(cloud))
    }

    /// Decides how to authenticate from what is set, as keystoneauth would.
    pub fn auth_type(&self) -> Result<AuthType> {
        if let Some(explicit) = &self.auth_type {
            return AuthType::parse(explicit);
        }
        Ok(match (&self.auth_url, &self.endpoint) {
            (Some(_), _) if self.application_credential_secret.is_some() => {
                AuthType::ApplicationCredential
            }
            (Some(_), _) if self.password.is_some() => AuthType::Password,
            (Some(_), _) if self.token.is_some() => AuthType::Token,
            (Some(_), _) => AuthType::Password,
            (None, Some(_)) if self.token.is_some() => AuthType::AdminToken,
            (None, Some(_)) => AuthType::None,
            (None, None) => {
                return Err(Error::Config(
                    "no Blazar to talk to: give its URL with --os-endpoint (or BLAZAR_URL), e.g. \
                     `--os-endpoint http://127.0.0.1:1234/v1 --os-auth-type none`, or Keystone \
                     credentials with OS_AUTH_URL and OS_USERNAME/OS_PASSWORD/OS_PROJECT_NAME, or \
                     a cloud of clouds.yaml with OS_CLOUD"
                        .into(),
                ));
            }
        })
    }

    fn credentials(&self, auth_type: AuthType) -> Result<Credentials> {
        let user = Named {
            id: self.user_id.clone(),
            name: self.username.clone(),
            domain_id: self.user_domain_id.clone(),
            domain_name: self.user_domain_name.clone(),
        };
        let project = Named {
            id: self.project_id.clone(),
            name: self.project_name.clone(),
            domain_id: self.project_domain_id.clone(),
            domain_name: self.project_domain_name.clone(),
        };
        let project = (project.id.is_some() || project.name.is_some()).then_some(project);
        match auth_type {
            AuthType::Password => Ok(Credentials::Password {
                user,
                password: self.password.clone().ok_or_else(|| {
                    Error::Config(
                        "password authentication needs a password: set OS_PASSWORD (or \
                         --os-password)"
                            .into(),
                    )
                })?,
                project,
            }),
            AuthType::Token => Ok(Credentials::Token {
                token: self.token.clone().ok_or_else(|| {
                    Error::Config("token authentication needs OS_TOKEN (or --os-token)".into())
                })?,
                project,
            }),
            AuthType::ApplicationCredential => Ok(Credentials::ApplicationCredential {
                id: self.application_credential_id.clone(),
                name: self.application_credential_name.clone(),
                user: (user.id.is_some() || user.name.is_some()).then_some(user),
                secret: self.application_credential_secret.clone().ok_or_else(|| {
                    Error::Config(
                        "application credential authentication needs \
                         OS_APPLICATION_CREDENTIAL_SECRET"
                            .into(),
                    )
                })?,
            }),
            AuthType::None | AuthType::AdminToken => Err(Error::Config(
                "this auth type does not talk to Keystone".into(),
            )),
        }
    }

    /// Authenticates (if needed), finds the endpoint and returns a ready client.
    pub async fn connect(&self) -> Result<Client> {
        let http = http_client(self.cacert.as_deref(), self.insecure.unwrap_or(false))?;
        let auth_type = self.auth_type()?;
        let need_endpoint = |what: &str| {
            Error::Config(format!(
                "auth type {what} needs Blazar's URL: pass --os-endpoint \
                 http://HOST:1234/v1 (or set BLAZAR_URL)"
            ))
        };
        match auth_type {
            AuthType::None => {
                let endpoint = self
                    .endpoint
                    .as_deref()
                    .ok_or_else(|| need_endpoint("none"))?;
                Client::with_http(http, endpoint, None)
            }
            AuthType::AdminToken => {
                let endpoint = self
                    .endpoint
                    .as_deref()
                    .ok_or_else(|| need_endpoint("admin_token"))?;
                let token = self.token.clone().ok_or_else(|| {
                    Error::Config("auth type admin_token needs OS_TOKEN (or --os-token)".into())
                })?;
                Client::with_http(http, endpoint, Some(token))
            }
            AuthType::Password | AuthType::Token | AuthType::ApplicationCredential => {
                let auth_url = self.auth_url.as_deref().ok_or_else(|| {
                    Error::Config(
                        "Keystone authentication needs OS_AUTH_URL (or --os-auth-url), e.g. \
                         http://keystone:5000/v3"
                            .into(),
                    )
                })?;
                let credentials = self.credentials(auth_type)?;
                let session = auth::authenticate(&http, auth_url, &credentials).await?;
                let endpoint = match &self.endpoint {
                    Some(endpoint) => endpoint.clone(),
                    None => auth::find_endpoint(
                        &session.catalog,
                        "reservation",
                        self.interface.as_deref().unwrap_or("public"),
                        self.region_name.as_deref(),
                    )?,
                };
                Client::with_http(http, &endpoint, Some(session.token))
            }
        }
    }
}

/// Where clouds.yaml (or secure.yaml) is looked for, first match wins: the file named by
/// `OS_CLIENT_CONFIG_FILE` (`OS_CLIENT_SECURE_FILE`), the current directory, the user's
/// config directory, `/etc/openstack`.
pub fn clouds_yaml_paths(file: &str) -> Vec<PathBuf> {
    let mut paths = Vec::new();
    let override_var = if file == "secure.yaml" {
        "OS_CLIENT_SECURE_FILE"
    } else {
        "OS_CLIENT_CONFIG_FILE"
    };
    if let Some(explicit) = env(override_var) {
        paths.push(PathBuf::from(explicit));
    }
    paths.push(PathBuf::from(file));
    if let Some(config) = env("XDG_CONFIG_HOME") {
        paths.push(Path::new(&config).join("openstack").join(file));
    } else if let Some(home) = env("HOME") {
        paths.push(Path::new(&home).join(".config/openstack").join(file));
    }
    paths.push(Path::new("/etc/openstack").join(file));
    paths
}

fn load_yaml(path: &Path) -> Result<Yaml> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::Config(format!("cannot read {}: {e}", path.display())))?;
    let mut docs = YamlLoader::load_from_str(&text)
        .map_err(|e| Error::Config(format!("{} is not valid YAML: {e}", path.display())))?;
    Ok(if docs.is_empty() {
        Yaml::Null
    } else {
        docs.swap_remove(0)
    })
}

fn cloud_names(path: &Path) -> Result<Vec<String>> {
    let doc = load_yaml(path)?;
    Ok(doc["clouds"]
        .as_hash()
        .map(|h| h.keys().filter_map(scalar).collect())
        .unwrap_or_default())
}

/// A scalar as text; clouds.yaml files hold project ids and the like as numbers too.
fn scalar(value: &Yaml) -> Option<String> {
    match value {
        Yaml::String(s) | Yaml::Real(s) => Some(s.clone()),
        Yaml::Integer(i) => Some(i.to_string()),
        Yaml::Boolean(b) => Some(b.to_string()),
        _ => None,
    }
}

/// One cloud of a clouds.yaml (or secure.yaml) file, if the file defines it.
fn read_cloud(path: &Path, name: &str) -> Result<Option<ConnectOptions>> {
    let doc = load_yaml(path)?;
    let cloud = &doc["clouds"][name];
    if cloud.is_badvalue() || cloud.is_null() {
        return Ok(None);
    }
    Ok(Some(cloud_options(cloud)))
}

fn cloud_options(cloud: &Yaml) -> ConnectOptions {
    let auth = &cloud["auth"];
    let get = |key: &str| scalar(&auth[key]).filter(|s| !s.is_empty());
    let top = |key: &str| scalar(&cloud[key]).filter(|s| !s.is_empty());
    // `verify: false` is openstacksdk's spelling of --insecure; `insecure: true` is older.
    let insecure = match (&cloud["verify"], &cloud["insecure"]) {
        (Yaml::Boolean(verify), _) => Some(!verify),
        (_, Yaml::Boolean(insecure)) => Some(*insecure),
        _ => None,
    };
    ConnectOptions {
        cloud: None,
        auth_type: top("auth_type"),
        auth_url: get("auth_url"),
        endpoint: top("reservation_endpoint_override").or_else(|| top("endpoint_override")),
        token: get("token"),
        username: get("username"),
        user_id: get("user_id"),
        password: get("password"),
        project_name: get("project_name").or_else(|| get("tenant_name")),
        project_id: get("project_id").or_else(|| get("tenant_id")),
        user_domain_name: get("user_domain_name").or_else(|| get("domain_name")),
        user_domain_id: get("user_domain_id").or_else(|| get("domain_id")),
        project_domain_name: get("project_domain_name").or_else(|| get("domain_name")),
        project_domain_id: get("project_domain_id").or_else(|| get("domain_id")),
        application_credential_id: get("application_credential_id"),
        application_credential_name: get("application_credential_name"),
        application_credential_secret: get("application_credential_secret"),
        region_name: top("region_name"),
        interface: top("interface"),
        cacert: top("cacert").map(PathBuf::from),
        insecure,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auth_type_is_inferred_like_keystoneauth() {
        let endpoint = ConnectOptions {
            endpoint: Some("http://x/v1".into()),
            ..ConnectOptions::default()
        };
        assert_eq!(endpoint.auth_type().unwrap(), AuthType::None);
        let admin_token = ConnectOptions {
            token: Some("t".into()),
            ..endpoint.clone()
        };
        assert_eq!(admin_token.auth_type().unwrap(), AuthType::AdminToken);
        let password = ConnectOptions {
            auth_url: Some("http://ks/v3".into()),
            password: Some("p".into()),
            ..ConnectOptions::default()
        };
        assert_eq!(password.auth_type().unwrap(), AuthType::Password);
        let explicit = ConnectOptions {
            auth_type: Some("noauth".into()),
            ..password
        };
        assert_eq!(explicit.auth_type().unwrap(), AuthType::None);
        let nothing = ConnectOptions::default()
            .auth_type()
            .unwrap_err()
            .to_string();
        assert!(nothing.contains("--os-endpoint"), "{nothing}");
    }

    #[test]
    fn clouds_yaml_entry() {
        let doc = YamlLoader::load_from_str(
            "clouds:\n  mine:\n    auth:\n      auth_url: http://ks:5000/v3\n      username: alice\n      project_id: 1234\n      user_domain_name: Default\n    region_name: RegionOne\n    interface: internal\n    verify: false\n",
        )
        .unwrap();
        let options = cloud_options(&doc[0]["clouds"]["mine"]);
        assert_eq!(options.auth_url.as_deref(), Some("http://ks:5000/v3"));
        assert_eq!(options.username.as_deref(), Some("alice"));
        assert_eq!(options.project_id.as_deref(), Some("1234"));
        assert_eq!(options.region_name.as_deref(), Some("RegionOne"));
        assert_eq!(options.interface.as_deref(), Some("internal"));
        assert_eq!(options.insecure, Some(true));
    }

    #[test]
    fn layers_keep_the_higher_value() {
        let high = ConnectOptions {
            username: Some("flag".into()),
            ..ConnectOptions::default()
        };
        let low = ConnectOptions {
            username: Some("file".into()),
            password: Some("p".into()),
            ..ConnectOptions::default()
        };
        let merged = high.or(low);
        assert_eq!(merged.username.as_deref(), Some("flag"));
        assert_eq!(merged.password.as_deref(), Some("p"));
    }
}
