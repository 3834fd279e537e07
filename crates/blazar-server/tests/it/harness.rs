//! `TestApp`: a real server on a loopback port over its own database (a temp SQLite file, or
//! a fresh PostgreSQL schema when `BLAZAR_TEST_DATABASE_URL` is set), with a fixed clock that
//! tests move by hand.

use std::sync::Arc;

use blazar_db::{Store, StoreOptions};
use blazar_server::auth::Auth;
use blazar_server::listener::ConnectionLimits;
use blazar_server::state::AppState;
use blazar_service::{Backend, ManualClock, Service, Settings, StandaloneBackend, TickReport};
use chrono::{DateTime, TimeZone, Utc};
use reqwest::StatusCode;
use serde_json::Value;
use sqlx::Connection;
use tokio::sync::oneshot;

pub fn t(y: i32, mo: u32, d: u32, h: u32, mi: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(y, mo, d, h, mi, 0).unwrap()
}

/// The time the clock starts at in every test.
pub fn epoch() -> DateTime<Utc> {
    t(2029, 12, 31, 8, 0)
}

/// A database only this test uses.
pub struct TestDatabase {
    pub url: String,
    _dir: Option<tempfile::TempDir>,
    schema: Option<(String, String)>,
}

pub fn postgres_url() -> Option<String> {
    std::env::var("BLAZAR_TEST_DATABASE_URL")
        .ok()
        .filter(|u| !u.is_empty())
}

impl TestDatabase {
    pub async fn new() -> TestDatabase {
        match postgres_url() {
            Some(base) => {
                let schema = format!("t_{}", uuid::Uuid::new_v4().simple());
                let mut conn = sqlx::PgConnection::connect(&base)
                    .await
                    .expect("connect to PostgreSQL");
                // Database-wide and idempotent; tests create it concurrently, so a lost race
                // (a duplicate key) is fine.
                let _ = sqlx::query("CREATE EXTENSION IF NOT EXISTS btree_gist WITH SCHEMA public")
                    .execute(&mut conn)
                    .await;
                sqlx::query(&format!("CREATE SCHEMA {schema}"))
                    .execute(&mut conn)
                    .await
                    .expect("create schema");
                conn.close().await.ok();
                let sep = if base.contains('?') { '&' } else { '?' };
                let url = format!("{base}{sep}options=-c%20search_path%3D{schema}%2Cpublic");
                TestDatabase {
                    url,
                    _dir: None,
                    schema: Some((base, schema)),
                }
            }
            None => {
                let dir = tempfile::tempdir().expect("temp dir");
                let url = format!("sqlite://{}", dir.path().join("blazar.db").display());
                TestDatabase {
                    url,
                    _dir: Some(dir),
                    schema: None,
                }
            }
        }
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        if let Some((base, schema)) = self.schema.take() {
            // Drop runs outside any runtime guarantee, so the cleanup gets its own.
            let _ = std::thread::spawn(move || {
                let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                else {
                    return;
                };
                rt.block_on(async move {
                    if let Ok(mut conn) = sqlx::PgConnection::connect(&base).await {
                        let _ = sqlx::query(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
                            .execute(&mut conn)
                            .await;
                        let _ = conn.close().await;
                    }
                });
            })
            .join();
        }
    }
}

pub struct TestApp {
    pub base: String,
    pub client: reqwest::Client,
    pub clock: Arc<ManualClock>,
    pub service: Service,
    /// Identity headers sent with every request (empty: the noauth admin).
    pub as_identity: Vec<(String, String)>,
    /// Whether writes and ticks carry out the actions they record before returning, as
    /// the server's workers would right after commit. Off, a test drives them itself.
    pub auto_actions: bool,
    stop: Option<oneshot::Sender<()>>,
    /// Kept so the database lives as long as the app.
    _db: TestDatabase,
}

pub struct Response {
    pub status: StatusCode,
    pub headers: reqwest::header::HeaderMap,
    pub body: Value,
}

impl Response {
    pub fn message(&self) -> String {
        self.body["error_message"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }
}

impl TestApp {
    pub async fn spawn() -> TestApp {
        Self::spawn_with(Settings::default()).await
    }

    pub async fn spawn_with(settings: Settings) -> TestApp {
        let db = TestDatabase::new().await;
        Self::spawn_on(db, settings).await
    }

    pub async fn spawn_on(db: TestDatabase, settings: Settings) -> TestApp {
        Self::spawn_limited(db, settings, ConnectionLimits::default()).await
    }

    /// A server whose connection loop runs under `limits`.
    pub async fn spawn_limited(
        db: TestDatabase,
        settings: Settings,
        limits: ConnectionLimits,
    ) -> TestApp {
        Self::spawn_full(db, settings, limits, Arc::new(StandaloneBackend)).await
    }

    /// A server whose outside-world actions go to `backend`.
    pub async fn spawn_backend(backend: Arc<dyn Backend>) -> TestApp {
        Self::spawn_full(
            TestDatabase::new().await,
            Settings::default(),
            ConnectionLimits::default(),
            backend,
        )
        .await
    }

    /// Another server on this app's database with its own backend, as a replica.
    pub async fn replica_with(&self, backend: Arc<dyn Backend>) -> TestApp {
        let db = TestDatabase {
            url: self._db.url.clone(),
            _dir: None,
            schema: None,
        };
        Self::spawn_full(
            db,
            Settings::default(),
            ConnectionLimits::default(),
            backend,
        )
        .await
    }

    pub async fn spawn_full(
        db: TestDatabase,
        settings: Settings,
        limits: ConnectionLimits,
        backend: Arc<dyn Backend>,
    ) -> TestApp {
        let store = Store::connect(&StoreOptions {
            url: db.url.clone(),
            max_connections: 16,
            ..Default::default()
        })
        .await
        .expect("open test database");
        let clock = Arc::new(ManualClock::new(epoch()));
        let service = Service::new(store, clock.clone(), settings, backend);
        let state = AppState::new(service.clone(), Auth::noauth("admin-project", "admin-user"));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (stop, stopped) = oneshot::channel::<()>();
        tokio::spawn(async move {
            let _ = blazar_server::serve_with_limits(listener, state, limits, async move {
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
            service,
            as_identity: Vec::new(),
            auto_actions: true,
            stop: Some(stop),
            _db: db,
        }
    }

    /// Another server on this app's database, as a second replica would be (it neither
    /// owns nor cleans up the database; drop it first).
    pub async fn replica(&self) -> TestApp {
        let db = TestDatabase {
            url: self._db.url.clone(),
            _dir: None,
            schema: None,
        };
        Self::spawn_on(db, Settings::default()).await
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

    pub async fn request(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Response {
        let write = method != reqwest::Method::GET;
        let mut req = self
            .client
            .request(method, format!("{}{}", self.base, path));
        for (k, v) in &self.as_identity {
            req = req.header(k, v);
        }
        if let Some(body) = body {
            req = req.json(&body);
        }
        let resp = req.send().await.expect("request");
        let status = resp.status();
        let headers = resp.headers().clone();
        let text = resp.text().await.expect("body");
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
        self.request(reqwest::Method::GET, path, None).await
    }

    pub async fn post(&self, path: &str, body: Value) -> Response {
        self.request(reqwest::Method::POST, path, Some(body)).await
    }

    pub async fn put(&self, path: &str, body: Value) -> Response {
        self.request(reqwest::Method::PUT, path, Some(body)).await
    }

    pub async fn patch(&self, path: &str, body: Value) -> Response {
        self.request(reqwest::Method::PATCH, path, Some(body)).await
    }

    pub async fn delete(&self, path: &str) -> Response {
        self.request(reqwest::Method::DELETE, path, None).await
    }

    /// Sends raw bytes with the given content type.
    pub async fn raw(
        &self,
        method: reqwest::Method,
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
        let mut body = serde_json::json!({ "name": name });
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
            serde_json::json!({
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
