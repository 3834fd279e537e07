//! `Client`: authenticated requests to Blazar's v1 API, its envelopes and error bodies, and a
//! typed method per endpoint.

use std::fmt;

use blazar_api::{
    Allocation, Host, HostUpdate, Lease, LeaseUpdate, NewHost, PropertyDetail, PropertyName,
    PropertyUpdate, ResourceProperty, Timeline,
};
use reqwest::{Method, StatusCode};
use serde::de::{DeserializeOwned, DeserializeSeed, IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The body of `POST /v1/leases`, as python-blazarclient sends it.
pub use blazar_api::NewLease;

use crate::error::{Error, Result, error_message, error_reasons};

/// What the client sends as `User-Agent`.
pub const USER_AGENT: &str = concat!("blazar-rs-client/", env!("CARGO_PKG_VERSION"));

/// The token sent when authentication is off, as keystoneauth's `none` plugin does: some
/// deployments put a token-checking proxy in front that only wants the header present.
pub const NOAUTH_TOKEN: &str = "notused";

/// A connection to one Blazar endpoint (the catalog URL, ending in `/v1`).
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    endpoint: String,
    token: Option<String>,
    /// Trace each request and response status on stderr (the CLI's `--debug`).
    debug: bool,
}

impl fmt::Debug for Client {
    // The token is a credential; it never goes into logs or panics.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("endpoint", &self.endpoint)
            .field("token", &self.token.as_ref().map(|_| "***"))
            .finish()
    }
}

/// Adds `/v1` to an endpoint given as a bare server address (`http://host:1234`), so both
/// that and the catalog form (`http://host:1234/v1`) work; any other path is kept as given
/// (deployments behind a prefix such as `/reservation/v1`).
pub fn normalize_endpoint(url: &str) -> Result<String> {
    let trimmed = url.trim().trim_end_matches('/');
    let parsed = reqwest::Url::parse(trimmed).map_err(|e| {
        Error::Config(format!(
            "invalid Blazar endpoint {trimmed:?}: {e}; give a URL such as http://127.0.0.1:1234/v1"
        ))
    })?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(Error::Config(format!(
            "invalid Blazar endpoint {trimmed:?}: the scheme must be http or https"
        )));
    }
    if parsed.path().is_empty() || parsed.path() == "/" {
        Ok(format!("{trimmed}/v1"))
    } else {
        Ok(trimmed.to_string())
    }
}

/// Finds `key` in a JSON object and deserializes only that value, whatever else the object
/// holds: Blazar wraps every body in a one-key envelope (`{"lease": {...}}`).
struct Envelope<'a, T> {
    key: &'a str,
    marker: std::marker::PhantomData<T>,
}

impl<'de, T: Deserialize<'de>> DeserializeSeed<'de> for Envelope<'_, T> {
    type Value = Option<T>;

    fn deserialize<D: serde::Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> std::result::Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de, T: Deserialize<'de>> Visitor<'de> for Envelope<'_, T> {
    type Value = Option<T>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "a JSON object with the key {:?}", self.key)
    }

    fn visit_map<A: MapAccess<'de>>(
        self,
        mut map: A,
    ) -> std::result::Result<Self::Value, A::Error> {
        let mut found = None;
        while let Some(key) = map.next_key::<String>()? {
            if key == self.key {
                found = Some(map.next_value::<T>()?);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(found)
    }
}

fn unwrap_envelope<T: DeserializeOwned>(url: &str, body: &[u8], key: &str) -> Result<T> {
    let seed = Envelope::<T> {
        key,
        marker: std::marker::PhantomData,
    };
    let mut deserializer = serde_json::Deserializer::from_slice(body);
    match seed.deserialize(&mut deserializer) {
        Ok(Some(value)) => Ok(value),
        Ok(None) => Err(Error::Decode {
            url: url.to_string(),
            detail: format!("the body has no {key:?} key"),
        }),
        Err(e) => Err(Error::Decode {
            url: url.to_string(),
            detail: e.to_string(),
        }),
    }
}

impl Client {
    /// A client for `endpoint` (normalized with [`normalize_endpoint`]) sending `token` as
    /// `X-Auth-Token`; `None` sends keystoneauth's placeholder token.
    pub fn new(endpoint: &str, token: Option<String>) -> Result<Client> {
        let http = http_client(None, false)?;
        Self::with_http(http, endpoint, token)
    }

    /// Like [`Client::new`] with a prepared `reqwest::Client` (custom CA, proxy, timeouts).
    pub fn with_http(
        http: reqwest::Client,
        endpoint: &str,
        token: Option<String>,
    ) -> Result<Client> {
        Ok(Client {
            http,
            endpoint: normalize_endpoint(endpoint)?,
            token,
            debug: false,
        })
    }

    /// Traces every request (method, URL, body) and response (status, body) on stderr; the
    /// token is never shown.
    pub fn with_debug(mut self, debug: bool) -> Client {
        self.debug = debug;
        self
    }

    /// The Blazar endpoint requests go to, e.g. `http://127.0.0.1:1234/v1`.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Sends one request and returns the raw body of a 2xx answer; any other status becomes
    /// [`Error::Api`] with the server's message.
    pub async fn send(&self, method: Method, path: &str, body: Option<&Value>) -> Result<Vec<u8>> {
        Ok(self.send_for_headers(method, path, body).await?.1)
    }

    /// Like [`Client::send`], with the answer's headers.
    pub async fn send_for_headers(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(reqwest::header::HeaderMap, Vec<u8>)> {
        let url = format!("{}{}", self.endpoint, path);
        if self.debug {
            let body = body.map(|b| format!(" {b}")).unwrap_or_default();
            eprintln!("REQ: {method} {url}{body}");
        }
        let mut request = self
            .http
            .request(method, &url)
            .header("Accept", "application/json")
            .header(
                "X-Auth-Token",
                self.token.as_deref().unwrap_or(NOAUTH_TOKEN),
            );
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = request
            .send()
            .await
            .map_err(|e| Error::unreachable(&url, &e))?;
        let status = response.status();
        let headers = response.headers().clone();
        let bytes = response
            .bytes()
            .await
            .map_err(|e| Error::unreachable(&url, &e))?;
        if self.debug {
            eprintln!(
                "RESP: [{}] {}",
                status.as_u16(),
                String::from_utf8_lossy(&bytes)
            );
        }
        if status.is_client_error() || status.is_server_error() {
            let text = String::from_utf8_lossy(&bytes);
            let mut message = error_message(&text);
            if message.is_empty() {
                message = format!("{status} from {url}");
            }
            return Err(Error::Api {
                status,
                message,
                reasons: error_reasons(&text),
            });
        }
        Ok((headers, bytes.to_vec()))
    }

    /// `GET` a path and return the value under `key` of the envelope, with the answer's
    /// headers.
    pub async fn get_with_headers<T: DeserializeOwned>(
        &self,
        path: &str,
        key: &str,
    ) -> Result<(reqwest::header::HeaderMap, T)> {
        let (headers, body) = self.send_for_headers(Method::GET, path, None).await?;
        Ok((headers, unwrap_envelope(&self.url(path), &body, key)?))
    }

    /// `GET` a path and return the value under `key` of the envelope.
    pub async fn get<T: DeserializeOwned>(&self, path: &str, key: &str) -> Result<T> {
        let body = self.send(Method::GET, path, None).await?;
        unwrap_envelope(&self.url(path), &body, key)
    }

    /// `POST` a JSON body (a `blazar_api` request type, or any JSON) and return the value
    /// under `key` of the answer.
    pub async fn post<T: DeserializeOwned, B: Serialize + ?Sized>(
        &self,
        path: &str,
        key: &str,
        body: &B,
    ) -> Result<T> {
        let answer = self.send(Method::POST, path, Some(&to_json(body)?)).await?;
        unwrap_envelope(&self.url(path), &answer, key)
    }

    /// `PUT` a JSON body and return the value under `key` of the answer.
    pub async fn put<T: DeserializeOwned, B: Serialize + ?Sized>(
        &self,
        path: &str,
        key: &str,
        body: &B,
    ) -> Result<T> {
        let answer = self.send(Method::PUT, path, Some(&to_json(body)?)).await?;
        unwrap_envelope(&self.url(path), &answer, key)
    }

    /// `PATCH` a JSON body and return the value under `key` of the answer.
    pub async fn patch<T: DeserializeOwned, B: Serialize + ?Sized>(
        &self,
        path: &str,
        key: &str,
        body: &B,
    ) -> Result<T> {
        let answer = self
            .send(Method::PATCH, path, Some(&to_json(body)?))
            .await?;
        unwrap_envelope(&self.url(path), &answer, key)
    }

    /// `DELETE` a path; the body of the answer (204, or 200 on Chameleon's resources) is
    /// ignored.
    pub async fn delete(&self, path: &str) -> Result<()> {
        self.send(Method::DELETE, path, None).await.map(|_| ())
    }

    fn url(&self, path: &str) -> String {
        format!("{}{}", self.endpoint, path)
    }

    pub async fn list_leases(&self) -> Result<Vec<Lease>> {
        self.get("/leases", "leases").await
    }

    pub async fn get_lease(&self, lease_id: &str) -> Result<Lease> {
        self.get(&format!("/leases/{}", segment(lease_id)), "lease")
            .await
    }

    pub async fn create_lease(&self, lease: &NewLease) -> Result<Lease> {
        self.post("/leases", "lease", lease).await
    }

    /// `PUT /v1/leases/{id}` with any of `name`, `start_date`, `end_date`,
    /// `before_end_date`, `reservations`.
    pub async fn update_lease(&self, lease_id: &str, changes: &LeaseUpdate) -> Result<Lease> {
        self.put(&format!("/leases/{}", segment(lease_id)), "lease", changes)
            .await
    }

    pub async fn delete_lease(&self, lease_id: &str) -> Result<()> {
        self.delete(&format!("/leases/{}", segment(lease_id))).await
    }

    /// One page of the occupancy timeline of `resources` (`/os-hosts`, `/floatingips`,
    /// `/networks`, `/devices`).
    pub async fn timeline(&self, resources: &str, query: &TimelineQuery) -> Result<Timeline> {
        self.get(
            &format!("{resources}/timeline{}", query.to_query_string()),
            "timeline",
        )
        .await
    }

    pub async fn list_hosts(&self) -> Result<Vec<Host>> {
        self.get("/os-hosts", "hosts").await
    }

    pub async fn get_host(&self, host_id: &str) -> Result<Host> {
        self.get(&format!("/os-hosts/{}", segment(host_id)), "host")
            .await
    }

    /// Enrols a host: `name` plus hypervisor facts and extra capabilities as flat keys (a
    /// `name` among them wins).
    pub async fn create_host(&self, name: &str, extra: &Map<String, Value>) -> Result<Host> {
        let mut values = extra.clone();
        let name = values
            .shift_remove("name")
            .unwrap_or_else(|| Value::String(name.to_string()));
        let body = NewHost {
            name: Some(name),
            values,
        };
        self.post("/os-hosts", "host", &body).await
    }

    /// Sets extra capabilities; a `null` value removes one.
    pub async fn update_host(&self, host_id: &str, values: &Map<String, Value>) -> Result<Host> {
        let body = HostUpdate {
            values: values.clone(),
        };
        self.put(&format!("/os-hosts/{}", segment(host_id)), "host", &body)
            .await
    }

    pub async fn delete_host(&self, host_id: &str) -> Result<()> {
        self.delete(&format!("/os-hosts/{}", segment(host_id)))
            .await
    }

    pub async fn host_allocations(&self) -> Result<Vec<Allocation>> {
        self.get("/os-hosts/allocations", "allocations").await
    }

    pub async fn host_allocation(&self, host_id: &str) -> Result<Allocation> {
        self.get(
            &format!("/os-hosts/{}/allocation", segment(host_id)),
            "allocation",
        )
        .await
    }

    pub async fn host_property_names(&self, all: bool) -> Result<Vec<PropertyName>> {
        let query = if all { "?all=True" } else { "" };
        self.get(
            &format!("/os-hosts/properties{query}"),
            "resource_properties",
        )
        .await
    }

    pub async fn host_property_details(&self, all: bool) -> Result<Vec<PropertyDetail>> {
        let query = if all { "&all=True" } else { "" };
        self.get(
            &format!("/os-hosts/properties?detail=True{query}"),
            "resource_properties",
        )
        .await
    }

    pub async fn set_host_property_private(
        &self,
        name: &str,
        private: bool,
    ) -> Result<ResourceProperty> {
        self.patch(
            &format!("/os-hosts/properties/{}", segment(name)),
            "resource_property",
            &PropertyUpdate {
                private: Some(Value::Bool(private)),
                ..PropertyUpdate::default()
            },
        )
        .await
    }
}

fn to_json<B: Serialize + ?Sized>(body: &B) -> Result<Value> {
    serde_json::to_value(body).map_err(|e| Error::Config(format!("cannot encode the request: {e}")))
}

/// What to ask a timeline for (`GET /v1/<resources>/timeline`); absent parts take the
/// server's defaults (from now, for a week, every resource).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TimelineQuery {
    /// Blazar's input format (`YYYY-MM-DD HH:MM`, UTC) or `now`.
    pub start: Option<String>,
    pub end: Option<String>,
    /// A property query, as in `resource_properties`.
    pub query: Option<String>,
    pub limit: Option<usize>,
    pub marker: Option<String>,
}

impl TimelineQuery {
    /// The query string, `?` included (empty when nothing is asked).
    fn to_query_string(&self) -> String {
        let limit = self.limit.map(|l| l.to_string());
        let pairs = [
            ("start", self.start.as_deref()),
            ("end", self.end.as_deref()),
            ("query", self.query.as_deref()),
            ("limit", limit.as_deref()),
            ("marker", self.marker.as_deref()),
        ];
        query_string(&pairs)
    }
}

/// A query string of the pairs that have a value, `?` included (empty when none has),
/// each value percent-encoded.
pub fn query_string(pairs: &[(&str, Option<&str>)]) -> String {
    let parts: Vec<String> = pairs
        .iter()
        .filter_map(|(k, v)| v.map(|v| format!("{k}={}", query_value(v))))
        .collect();
    if parts.is_empty() {
        String::new()
    } else {
        format!("?{}", parts.join("&"))
    }
}

/// Percent-encodes a query string value: everything but unreserved characters, so `&`, `=`,
/// `+` and `$` in a property query arrive as typed.
fn query_value(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// Percent-encodes one path segment, so that a name with `/`, `?` or spaces stays one
/// segment.
pub fn segment(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~:@!$&'()*+,;=".contains(&byte) {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// The HTTP client every request goes through: rustls with the system's CAs, plus `cacert`
/// if given; `insecure` skips verification, as `--insecure` does for OpenStack clients.
pub fn http_client(cacert: Option<&std::path::Path>, insecure: bool) -> Result<reqwest::Client> {
    let mut builder = reqwest::Client::builder()
        .user_agent(USER_AGENT)
        .connect_timeout(std::time::Duration::from_secs(30));
    if let Some(path) = cacert {
        let pem = std::fs::read(path).map_err(|e| {
            Error::Config(format!("cannot read the CA bundle {}: {e}", path.display()))
        })?;
        let certificates = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| {
            Error::Config(format!(
                "{} is not a PEM certificate bundle: {e}",
                path.display()
            ))
        })?;
        for certificate in certificates {
            builder = builder.add_root_certificate(certificate);
        }
    }
    if insecure {
        builder = builder.danger_accept_invalid_certs(true);
    }
    builder
        .build()
        .map_err(|e| Error::Config(format!("cannot set up HTTPS: {e}")))
}

/// Whether an error is "this object does not exist".
pub fn is_not_found(error: &Error) -> bool {
    error.status() == Some(StatusCode::NOT_FOUND)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints() {
        let cases = [
            ("http://127.0.0.1:1234", "http://127.0.0.1:1234/v1"),
            ("http://127.0.0.1:1234/", "http://127.0.0.1:1234/v1"),
            ("http://127.0.0.1:1234/v1", "http://127.0.0.1:1234/v1"),
            ("http://127.0.0.1:1234/v1/", "http://127.0.0.1:1234/v1"),
            (
                "https://cloud/reservation/v1",
                "https://cloud/reservation/v1",
            ),
        ];
        for (given, expected) in cases {
            assert_eq!(normalize_endpoint(given).unwrap(), expected, "{given}");
        }
        assert!(normalize_endpoint("127.0.0.1:1234").is_err());
        assert!(normalize_endpoint("ftp://x/v1").is_err());
    }

    #[test]
    fn envelopes() {
        let body = br#"{"lease": {"id": "x"}, "other": [1, 2]}"#;
        let value: Value = unwrap_envelope("u", body, "lease").unwrap();
        assert_eq!(value, serde_json::json!({"id": "x"}));
        assert!(unwrap_envelope::<Value>("u", body, "host").is_err());
        assert!(unwrap_envelope::<Value>("u", b"[]", "host").is_err());
    }

    #[test]
    fn path_segments() {
        assert_eq!(segment("compute-1"), "compute-1");
        assert_eq!(segment("a b/c?d"), "a%20b%2Fc%3Fd");
    }
}
