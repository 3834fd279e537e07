//! `TestApp`: the real server on a loopback port over its own database, built as production
//! builds it, on a clock tests move by hand.

use std::sync::Arc;

use blazar_db::Store;
use blazar_server::StateBuilder;
use blazar_server::auth::Auth;
use blazar_server::config::{AuthMode, Cli, Config};
use blazar_server::listener::ConnectionLimits;
use blazar_server::policy::Policy;
use blazar_server::state::AppState;
use blazar_service::{Backend, ManualClock, Service, Settings, StandaloneBackend, TickReport};
use chrono::{DateTime, Utc};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tokio::sync::oneshot;

use crate::database::TestDatabase;
use crate::epoch;

/// The noauth identity of requests without identity headers (an admin).
pub const NOAUTH_PROJECT: &str = "admin-project";
pub const NOAUTH_USER: &str = "admin-user";

/// Makes the authentication from the store.
type AuthMaker = Box<dyn FnOnce(&Store) -> Auth + Send>;

/// What a [`TestApp`] is made of; everything not set is what production does with an empty
/// configuration (noauth, Blazar's default policy, the standalone backend).
pub struct TestAppBuilder {
    db: Option<Arc<TestDatabase>>,
    settings: Settings,
    limits: ConnectionLimits,
    backend: Arc<dyn Backend>,
    auth_mode: AuthMode,
    auth: Option<AuthMaker>,
    policy: Option<Policy>,
    max_connections: u32,
    start: DateTime<Utc>,
    auto_actions: bool,
    trusts: Option<(Arc<dyn blazar_service::Trusts>, bool)>,
    /// Options as the command line would set them (the database and auth are the kit's).
    cli: Cli,
}

impl Default for TestAppBuilder {
    fn default() -> Self {
        TestAppBuilder {
            db: None,
            settings: Settings::default(),
            limits: ConnectionLimits::default(),
            backend: Arc::new(StandaloneBackend),
            auth_mode: AuthMode::Noauth,
            auth: None,
            policy: None,
            max_connections: 16,
            start: epoch(),
            auto_actions: true,
            trusts: None,
            cli: Cli::default(),
        }
    }
}

impl TestAppBuilder {
    /// On this database (shared: a replica's), instead of a new one.
    pub fn database(mut self, db: Arc<TestDatabase>) -> Self {
        self.db = Some(db);
        self
    }

    pub fn settings(mut self, settings: Settings) -> Self {
        self.settings = settings;
        self
    }

    /// The connection loop's limits.
    pub fn limits(mut self, limits: ConnectionLimits) -> Self {
        self.limits = limits;
        self
    }

    /// What carries out the actions the service records.
    pub fn backend(mut self, backend: Arc<dyn Backend>) -> Self {
        self.backend = backend;
        self
    }

    /// The configured authentication mode (`tokens` validates on the app's clock).
    pub fn auth_mode(mut self, mode: AuthMode) -> Self {
        self.auth_mode = mode;
        self
    }

    /// Authentication made by the test (a Keystone on a fake, tokens on a clock of their own).
    pub fn auth_with(mut self, auth: impl FnOnce(&Store) -> Auth + Send + 'static) -> Self {
        self.auth = Some(Box::new(auth));
        self
    }

    /// A policy instead of Blazar's defaults (as a policy file would give).
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policy = Some(policy);
        self
    }

    /// The store's pool size.
    pub fn max_connections(mut self, n: u32) -> Self {
        self.max_connections = n;
        self
    }

    /// Where the clock starts, instead of [`epoch`].
    pub fn clock_at(mut self, start: DateTime<Utc>) -> Self {
        self.start = start;
        self
    }

    /// Whether writes and ticks carry out the actions they record before returning.
    pub fn auto_actions(mut self, on: bool) -> Self {
        self.auto_actions = on;
        self
    }

    /// Keystone's trusts reached through `trusts` (a fake), made at every lease create if
    /// `make`.
    pub fn trusts(mut self, trusts: Arc<dyn blazar_service::Trusts>, make: bool) -> Self {
        self.trusts = Some((trusts, make));
        self
    }

    /// Sets configuration options as the command line or environment would (usage
    /// enforcement, ...).
    pub fn configure(mut self, set: impl FnOnce(&mut Cli)) -> Self {
        set(&mut self.cli);
        self
    }

    pub async fn spawn(self) -> TestApp {
        let db = match self.db {
            Some(db) => db,
            None => Arc::new(TestDatabase::new().await),
        };
        let config = Config::resolve(Cli {
            database_url: Some(db.url.clone()),
            max_connections: Some(self.max_connections),
            auth: Some(self.auth_mode),
            noauth_project_id: Some(NOAUTH_PROJECT.into()),
            noauth_user_id: Some(NOAUTH_USER.into()),
            // Tests receive webhooks on this machine, under every auth mode.
            webhook_allow_internal: self.cli.webhook_allow_internal.or(Some(true)),
            ..self.cli
        })
        .expect("test configuration");
        let clock = Arc::new(ManualClock::new(self.start));
        let mut builder = StateBuilder::new(&config)
            .clock(clock.clone())
            .backend(self.backend)
            .settings(self.settings);
        if let Some(policy) = self.policy {
            builder = builder.policy(policy);
        }
        if let Some(auth) = self.auth {
            builder = builder.auth_with(auth);
        }
        if let Some((trusts, make)) = self.trusts {
            builder = builder.trusts(trusts, make);
        }
        let state = builder.build().await.expect("build the application");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (stop, stopped) = oneshot::channel::<()>();
        let served = state.clone();
        let limits = self.limits;
        tokio::spawn(async move {
            let _ = blazar_server::serve_with_limits(listener, served, limits, async move {
                let _ = stopped.await;
            })
            .await;
        });
        TestApp {
            base: format!("http://{addr}"),
            client: reqwest::Client::builder()
                .pool_max_idle_per_host(0)
                .build()
                .expect("client"),
            clock,
            service: state.service.clone(),
            state,
            as_identity: Vec::new(),
            auto_actions: self.auto_actions,
            stop: Some(stop),
            db,
        }
    }
}

pub struct TestApp {
    /// `http://127.0.0.1:PORT`, without `/v1`.
    pub base: String,
    pub client: reqwest::Client,
    pub clock: Arc<ManualClock>,
    pub service: Service,
    pub state: AppState,
    /// Identity headers sent with every request (empty: the noauth admin).
    pub as_identity: Vec<(String, String)>,
    /// Whether writes and ticks carry out the actions they record before returning, as
    /// the server's workers would right after commit. Off, a test drives them itself.
    pub auto_actions: bool,
    stop: Option<oneshot::Sender<()>>,
    /// Shared with replicas; the last one to go drops the database.
    db: Arc<TestDatabase>,
}

/// One response: status, headers and the body as JSON (`Null` when empty).
#[derive(Debug)]
pub struct Response {
    pub status: StatusCode,
    pub headers: reqwest::header::HeaderMap,
    pub body: Value,
}

impl Response {
    /// `error_message` of Blazar's error shape.
    pub fn message(&self) -> String {
        self.body["error_message"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    #[track_caller]
    pub fn assert_status(&self, status: StatusCode) {
        assert_eq!(self.status, status, "{}", self.body);
    }

    /// Asserts Blazar's 403 for `rule`.
    #[track_caller]
    pub fn assert_denied(&self, rule: &str) {
        assert_eq!(self.status, StatusCode::FORBIDDEN, "{rule}: {}", self.body);
        assert_eq!(
            self.body["error_message"],
            format!("Policy doesn't allow {rule} to be performed"),
            "{}",
            self.body
        );
    }

    /// Asserts keystonemiddleware's 401.
    #[track_caller]
    pub fn assert_unauthorized(&self) {
        assert_eq!(self.status, StatusCode::UNAUTHORIZED, "{}", self.body);
        assert_eq!(
            self.body,
            json!({"error": {
                "code": 401,
                "title": "Unauthorized",
                "message": "The request you have made requires authentication.",
            }})
        );
        assert!(self.headers.contains_key("x-openstack-request-id"));
    }
}

impl TestApp {
    /// Everything as production builds it from an empty configuration, on a new database.
    pub fn builder() -> TestAppBuilder {
        TestAppBuilder::default()
    }

    pub async fn spawn() -> TestApp {
        Self::builder().spawn().await
    }

    pub async fn spawn_with(settings: Settings) -> TestApp {
        Self::builder().settings(settings).spawn().await
    }

    pub async fn spawn_on(db: TestDatabase, settings: Settings) -> TestApp {
        Self::builder()
            .database(Arc::new(db))
            .settings(settings)
            .spawn()
            .await
    }

    /// A server whose connection loop runs under `limits`.
    pub async fn spawn_limited(
        db: TestDatabase,
        settings: Settings,
        limits: ConnectionLimits,
    ) -> TestApp {
        Self::builder()
            .database(Arc::new(db))
            .settings(settings)
            .limits(limits)
            .spawn()
            .await
    }

    /// A server whose outside-world actions go to `backend`.
    pub async fn spawn_backend(backend: Arc<dyn Backend>) -> TestApp {
        Self::builder().backend(backend).spawn().await
    }

    pub async fn spawn_full(
        db: TestDatabase,
        settings: Settings,
        limits: ConnectionLimits,
        backend: Arc<dyn Backend>,
    ) -> TestApp {
        Self::builder()
            .database(Arc::new(db))
            .settings(settings)
            .limits(limits)
            .backend(backend)
            .spawn()
            .await
    }

    /// Another server on this app's database, as a second replica would be.
    pub async fn replica(&self) -> TestApp {
        Self::builder().database(self.db.clone()).spawn().await
    }

    /// Another server on this app's database with its own backend, as a replica.
    pub async fn replica_with(&self, backend: Arc<dyn Backend>) -> TestApp {
        Self::builder()
            .database(self.db.clone())
            .backend(backend)
            .spawn()
            .await
    }

    /// The database this app runs on.
    pub fn database(&self) -> &Arc<TestDatabase> {
        &self.db
    }

    pub fn store(&self) -> &Store {
        self.service.store()
    }

    /// Requests from now on act as this project, user and roles.
    pub fn act_as(&mut self, project: &str, user: &str, roles: &str) {
        self.as_identity = vec![
            ("X-Project-Id".into(), project.into()),
            ("X-User-Id".into(), user.into()),
            ("X-Roles".into(), roles.into()),
        ];
    }

    pub fn act_as_admin(&mut self) {
        self.as_identity.clear();
    }

    /// A request with the app's identity headers; the body must be JSON (or nothing). A
    /// write then carries out the actions it recorded, unless `auto_actions` is off.
    pub async fn request(&self, method: Method, path: &str, body: Option<Value>) -> Response {
        let write = method != Method::GET;
        let mut req = self
            .client
            .request(method, format!("{}{}", self.base, path));
        for (k, v) in &self.as_identity {
            req = req.header(k, v);
        }
        let (status, headers, text) = send(req, body).await;
        let body = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text)
                .unwrap_or_else(|_| panic!("non-JSON body for {path}: {text}"))
        };
        // What workers do right after a commit in a server, done before the test looks.
        if write && self.auto_actions {
            self.run_actions().await;
        }
        Response {
            status,
            headers,
            body,
        }
    }

    pub async fn get(&self, path: &str) -> Response {
        self.request(Method::GET, path, None).await
    }

    /// The text of `GET /metrics`, as a scraper on the loopback address reads it.
    pub async fn metrics_text(&self) -> String {
        let response = self
            .client
            .get(format!("{}/metrics", self.base))
            .send()
            .await
            .expect("scrape /metrics");
        assert_eq!(response.status(), StatusCode::OK);
        response.text().await.expect("metrics text")
    }

    pub async fn post(&self, path: &str, body: Value) -> Response {
        self.request(Method::POST, path, Some(body)).await
    }

    pub async fn put(&self, path: &str, body: Value) -> Response {
        self.request(Method::PUT, path, Some(body)).await
    }

    pub async fn patch(&self, path: &str, body: Value) -> Response {
        self.request(Method::PATCH, path, Some(body)).await
    }

    pub async fn delete(&self, path: &str) -> Response {
        self.request(Method::DELETE, path, None).await
    }

    /// A request with `X-Auth-Token: token` (if any) and exactly `headers` besides (not the
    /// app's identity); a body that is not JSON reads as `Null`. Carries out no actions.
    pub async fn call(
        &self,
        token: Option<&str>,
        method: Method,
        path: &str,
        body: Option<Value>,
        headers: &[(&str, &str)],
    ) -> Response {
        let mut req = self.client.request(method, format!("{}{path}", self.base));
        if let Some(token) = token {
            req = req.header("X-Auth-Token", token);
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let (status, headers, text) = send(req, body).await;
        Response {
            status,
            headers,
            body: serde_json::from_str(&text).unwrap_or(Value::Null),
        }
    }

    /// Sends raw bytes with the given content type; a body that is not JSON reads as a
    /// string.
    pub async fn raw(
        &self,
        method: Method,
        path: &str,
        content_type: &str,
        body: &'static str,
    ) -> Response {
        let resp = self
            .client
            .request(method, format!("{}{}", self.base, path))
            .header("content-type", content_type)
            .body(body)
            .send()
            .await
            .expect("request");
        let status = resp.status();
        let headers = resp.headers().clone();
        let text = resp.text().await.expect("body");
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        Response {
            status,
            headers,
            body,
        }
    }

    pub fn set_time(&self, t: DateTime<Utc>) {
        self.clock.set(t);
    }

    /// Runs the scheduler once at the clock's time: the events due then.
    pub async fn tick(&self) -> TickReport {
        self.tick_at(self.service.now()).await
    }

    /// Moves the clock to `t` and runs the events due then.
    pub async fn tick_at(&self, t: DateTime<Utc>) -> TickReport {
        self.clock.set(t);
        let report = self.service.tick(t).await.expect("tick");
        if self.auto_actions {
            self.run_actions().await;
        }
        report
    }

    /// Carries out every runnable action now, as the server's workers would.
    pub async fn run_actions(&self) -> blazar_service::ActionReport {
        self.service
            .run_actions(self.service.now())
            .await
            .expect("actions")
    }

    pub async fn create_host(&self, name: &str, extra: Value) -> String {
        let mut body = json!({ "name": name });
        if let (Some(obj), Value::Object(extra)) = (body.as_object_mut(), extra) {
            obj.extend(extra);
        }
        let r = self.post("/v1/os-hosts", body).await;
        assert_eq!(
            r.status,
            StatusCode::CREATED,
            "create host {name}: {}",
            r.body
        );
        r.body["host"]["id"].as_str().unwrap().to_string()
    }

    /// Creates a physical:host lease and returns the whole response.
    pub async fn host_lease(
        &self,
        name: &str,
        start: &str,
        end: &str,
        min: i64,
        max: i64,
        props: &str,
    ) -> Response {
        self.post(
            "/v1/leases",
            json!({
                "name": name,
                "start_date": start,
                "end_date": end,
                "before_end_date": null,
                "events": [],
                "reservations": [{
                    "resource_type": "physical:host",
                    "min": min,
                    "max": max,
                    "hypervisor_properties": "",
                    "resource_properties": props,
                }],
            }),
        )
        .await
    }

    /// Host ids allocated to a lease, sorted.
    pub async fn hosts_of(&self, lease_id: &str) -> Vec<String> {
        let r = self
            .get(&format!("/v1/os-hosts/allocations?lease_id={lease_id}"))
            .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.body);
        let mut ids: Vec<String> = r.body["allocations"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|a| !a["reservations"].as_array().unwrap().is_empty())
            .map(|a| a["resource_id"].as_str().unwrap().to_string())
            .collect();
        ids.sort();
        ids
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// Sends `req` with `body` as JSON, if any: the answer's status, headers and text.
async fn send(
    mut req: reqwest::RequestBuilder,
    body: Option<Value>,
) -> (reqwest::StatusCode, reqwest::header::HeaderMap, String) {
    if let Some(body) = body {
        req = req.json(&body);
    }
    let resp = req.send().await.expect("request");
    let status = resp.status();
    let headers = resp.headers().clone();
    let text = resp.text().await.expect("body");
    (status, headers, text)
}
