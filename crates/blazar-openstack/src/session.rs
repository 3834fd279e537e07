//! A Keystone v3 session: a service token (password or application credential), renewed
//! before it expires and once more on a 401, and the catalog it came with.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tokio::sync::Mutex;

use crate::error::{Error, Result, message_of, tolerate, with_causes};

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

    /// The same service and request id with other headers (another microversion).
    pub(crate) fn with_headers(&self, headers: Vec<(&'static str, String)>) -> Api<'a> {
        Api { headers, ..*self }
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

    /// A list that may come in pages (Nova answers at most its `max_limit`, 1,000 by
    /// default, and a `<key>_links` "next" link): every page's `key` items, gathered as one
    /// body `{key: [...]}`.
    pub(crate) async fn get_all(&self, path: &str, key: &str) -> Result<Value> {
        // A cloud that kept answering "next" would otherwise be followed forever.
        const MAX_PAGES: usize = 1_000;
        let mut all = Vec::new();
        let mut page_path = path.to_string();
        let mut markers = std::collections::HashSet::new();
        for _ in 0..MAX_PAGES {
            let page = self.get(&page_path).await?;
            all.extend(items(&page, key).cloned());
            let Some(marker) = next_marker(&page, key) else {
                return Ok(serde_json::json!({ key: all }));
            };
            // A list cut short is worse than none: the monitor fails hosts missing from it.
            if !markers.insert(marker.clone()) {
                break;
            }
            let joint = if path.contains('?') { '&' } else { '?' };
            page_path = format!(
                "{path}{joint}marker={}",
                crate::placement::urlencode(&marker)
            );
        }
        Err(Error::Decode(format!(
            "{path}: the pages of {key} do not end (after {} items)",
            all.len()
        )))
    }

    /// Deletes what `path` names; already gone is fine.
    pub(crate) async fn delete(&self, path: &str) -> Result<()> {
        tolerate(
            self.call(Method::DELETE, path, None).await,
            Error::is_not_found,
        )
    }
}

/// More tries after a request failed in transport, before any answer came. Services behind
/// gunicorn, uwsgi or Apache close idle keep-alive connections after a few seconds, and a
/// request written on one just as it closes fails with nothing received: a normal event,
/// not an outage, so it must not fail a lease start or a reconcile pass.
const TRANSPORT_RETRIES: u32 = 2;
const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// GET, HEAD, PUT and DELETE mean the same sent twice (RFC 9110, 9.2.2).
fn is_idempotent(method: &Method) -> bool {
    [Method::GET, Method::HEAD, Method::PUT, Method::DELETE].contains(method)
}

/// Whether a request that failed with `e` may be sent again: any idempotent request that
/// did not time out (a timed-out request may still be running there, and a retry would only
/// double the wait), and any request that never reached the service (no connection).
fn worth_another_try(method: &Method, e: &reqwest::Error) -> bool {
    e.is_connect() || (is_idempotent(method) && !e.is_timeout())
}

/// Sends `request` (whose method is `method`), again after a transport failure where
/// [`worth_another_try`] says so.
pub(crate) async fn send(
    method: &Method,
    request: reqwest::RequestBuilder,
) -> reqwest::Result<reqwest::Response> {
    let mut tries = 0;
    loop {
        // A JSON body is bytes, so the builder clones; one that would not is sent once.
        let Some(again) = request.try_clone() else {
            return request.send().await;
        };
        match again.send().await {
            Err(e) if tries < TRANSPORT_RETRIES && worth_another_try(method, &e) => {
                tries += 1;
                tokio::time::sleep(RETRY_PAUSE * tries).await;
            }
            result => return result,
        }
    }
}

/// The elements of list `key` of a service's answer (none when it has no such list).
pub(crate) fn items<'v>(body: &'v Value, key: &str) -> impl Iterator<Item = &'v Value> {
    body[key].as_array().into_iter().flatten()
}

/// The `marker` of a paged list's "next" link (`<key>_links`), if there is a next page.
fn next_marker(body: &Value, key: &str) -> Option<String> {
    let link = items(body, &format!("{key}_links")).find(|l| l["rel"].as_str() == Some("next"))?;
    let url = url::Url::parse(link["href"].as_str()?).ok()?;
    url.query_pairs()
        .find(|(k, _)| k == "marker")
        .map(|(_, v)| v.into_owned())
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
        // Issuing a token twice is harmless: the request is sent again like an idempotent one.
        let response = send(
            &Method::PUT,
            self.http.post(&url).json(&json!({ "auth": auth })),
        )
        .await
        .map_err(|e| Error::Unreachable(format!("keystone: {}", with_causes(&e))))?;
        let status = response.status();
        let value = response
            .headers()
            .get("x-subject-token")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let body: Value = response.json().await.unwrap_or(Value::Null);
        // Keystone failing or asking callers to slow down is worth another try; a refusal
        // is not.
        if status.is_server_error() || status == StatusCode::TOO_MANY_REQUESTS {
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
        let mut tries = 0;
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
            let unreachable = |e: reqwest::Error| {
                Error::Unreachable(format!(
                    "{service_type} {method} {path}: {}",
                    with_causes(&e)
                ))
            };
            let response = send(&method, request).await.map_err(unreachable)?;
            let status = response.status();
            if status == StatusCode::UNAUTHORIZED && !renew {
                renew = true;
                continue;
            }
            let text = match response.text().await {
                Ok(text) => text,
                Err(_) if tries < TRANSPORT_RETRIES && is_idempotent(&method) => {
                    tries += 1;
                    tokio::time::sleep(RETRY_PAUSE * tries).await;
                    continue;
                }
                Err(e) => return Err(unreachable(e)),
            };
            let body = serde_json::from_str(&text).unwrap_or(Value::Null);
            if status.is_success() {
                return Ok(Answer { status, body });
            }
            return Err(Error::Status {
                service: service_type.to_string(),
                request: format!("{method} {path}"),
                status: status.as_u16(),
                message: if body.is_null() {
                    crate::error::one_line(&text)
                } else {
                    message_of(&body)
                },
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex as StdMutex};

    use super::*;

    /// An HTTP/1.1 endpoint that answers every request with `200 {}` (and a token header),
    /// except that it closes the connection without a word on the requests whose numbers
    /// are in `drop`: the way a server's keep-alive timeout meets a request in flight.
    /// Records the request lines it saw.
    fn flaky_server(drop: &'static [usize]) -> (String, Arc<StdMutex<Vec<String>>>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let seen = Arc::new(StdMutex::new(Vec::new()));
        let count = Arc::new(AtomicUsize::new(0));
        let recorded = seen.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (seen, count) = (recorded.clone(), count.clone());
                std::thread::spawn(move || serve(stream, drop, &seen, &count));
            }
        });
        (url, seen)
    }

    fn serve(stream: TcpStream, drop: &[usize], seen: &StdMutex<Vec<String>>, count: &AtomicUsize) {
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let mut stream = stream;
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            let mut length = 0;
            loop {
                let mut header = String::new();
                reader.read_line(&mut header).unwrap();
                if header.trim().is_empty() {
                    break;
                }
                if let Some((name, value)) = header.split_once(':')
                    && name.eq_ignore_ascii_case("content-length")
                {
                    length = value.trim().parse().unwrap();
                }
            }
            let mut body = vec![0; length];
            reader.read_exact(&mut body).unwrap();
            seen.lock().unwrap().push(line.trim().to_string());
            if drop.contains(&count.fetch_add(1, Ordering::SeqCst)) {
                return;
            }
            // A list of three in pages of two (Nova's `<key>_links`), and a list whose
            // "next" link never ends.
            let body = if line.contains("/os-hypervisors/detail?marker=b ") {
                r#"{"hypervisors": [{"id": "c"}]}"#
            } else if line.contains("/os-hypervisors/detail ") {
                r#"{"hypervisors": [{"id": "a"}, {"id": "b"}], "hypervisors_links": [
                    {"rel": "next", "href": "http://nova/v2.1/os-hypervisors/detail?limit=2&marker=b"}]}"#
            } else if line.contains("/os-hypervisors/loop") {
                r#"{"hypervisors": [{"id": "z"}], "hypervisors_links": [{"rel": "next",
                    "href": "http://nova/v2.1/os-hypervisors/loop?marker=z"}]}"#
            } else {
                r#"{"token": {"user": {"id": "u"}, "catalog": []}}"#
            };
            write!(
                stream,
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nx-subject-token: t\r\n\
                 content-length: {}\r\n\r\n{body}",
                body.len()
            )
            .unwrap();
        }
    }

    fn session(url: &str) -> Session {
        Session::new(SessionConfig {
            auth_url: format!("{url}/v3"),
            credentials: Credentials::ApplicationCredential {
                id: "id".into(),
                secret: "secret".into(),
            },
            region: None,
            interface: "public".into(),
            endpoint_overrides: HashMap::from([("compute".to_string(), url.to_string())]),
            timeout: Duration::from_secs(5),
        })
        .unwrap()
    }

    /// An HTTP/1.1 endpoint that answers every request with `status` and `{}`.
    fn answering(status: u16) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut stream = stream;
                let mut length = 0;
                loop {
                    let mut header = String::new();
                    if reader.read_line(&mut header).unwrap_or(0) == 0 {
                        break;
                    }
                    if let Some((name, value)) = header.split_once(':')
                        && name.eq_ignore_ascii_case("content-length")
                    {
                        length = value.trim().parse().unwrap();
                    }
                    if header.trim().is_empty() {
                        let mut body = vec![0; length];
                        reader.read_exact(&mut body).unwrap();
                        write!(
                            stream,
                            "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\n\
                             content-length: 2\r\nconnection: close\r\n\r\n{{}}"
                        )
                        .unwrap();
                        break;
                    }
                }
            }
        });
        url
    }

    #[tokio::test]
    async fn keystone_asking_to_slow_down_is_worth_another_try_a_refusal_is_not() {
        let error = session(&answering(429))
            .call("compute", Method::GET, "/servers", Call::default())
            .await
            .unwrap_err();
        assert!(error.is_transient(), "{error:?}");
        let error = session(&answering(401))
            .call("compute", Method::GET, "/servers", Call::default())
            .await
            .unwrap_err();
        assert!(matches!(error, Error::Auth(_)), "{error:?}");
        assert!(!error.is_transient());
    }

    #[tokio::test]
    async fn a_paged_list_is_read_to_its_last_page() {
        let (url, seen) = flaky_server(&[]);
        let session = session(&url);
        let api = Api::new(&session, "compute", Vec::new(), None);
        let all = api
            .get_all("/os-hypervisors/detail", "hypervisors")
            .await
            .unwrap();
        let ids: Vec<&str> = items(&all, "hypervisors")
            .filter_map(|h| h["id"].as_str())
            .collect();
        assert_eq!(ids, ["a", "b", "c"]);
        let seen = seen.lock().unwrap().clone();
        assert_eq!(
            seen[1..],
            [
                "GET /os-hypervisors/detail HTTP/1.1",
                "GET /os-hypervisors/detail?marker=b HTTP/1.1"
            ]
        );
        // Pages that never end are an error, not a list cut short.
        let endless = api.get_all("/os-hypervisors/loop", "hypervisors").await;
        assert!(matches!(endless, Err(Error::Decode(_))), "{endless:?}");
    }

    #[tokio::test]
    async fn a_request_lost_with_its_connection_is_sent_again() {
        // Request 0 is the token, 1 is lost, 2 is the same GET again.
        let (url, seen) = flaky_server(&[1]);
        let answer = session(&url)
            .call("compute", Method::GET, "/servers", Call::default())
            .await
            .unwrap();
        assert_eq!(answer.status, StatusCode::OK);
        let seen = seen.lock().unwrap().clone();
        assert_eq!(
            seen,
            [
                "POST /v3/auth/tokens HTTP/1.1",
                "GET /servers HTTP/1.1",
                "GET /servers HTTP/1.1"
            ]
        );
    }

    #[tokio::test]
    async fn a_post_that_reached_the_service_is_not_sent_twice() {
        let (url, seen) = flaky_server(&[1]);
        let error = session(&url)
            .call("compute", Method::POST, "/servers", Call::default())
            .await
            .unwrap_err();
        assert!(matches!(error, Error::Unreachable(_)), "{error:?}");
        assert_eq!(seen.lock().unwrap().len(), 2);
    }

    #[tokio::test]
    async fn a_service_that_keeps_dropping_requests_is_unreachable_after_three_tries() {
        let (url, seen) = flaky_server(&[1, 2, 3, 4]);
        let error = session(&url)
            .call("compute", Method::DELETE, "/servers/x", Call::default())
            .await
            .unwrap_err();
        assert!(matches!(error, Error::Unreachable(_)), "{error:?}");
        assert_eq!(seen.lock().unwrap().len(), 4);
    }
}
