//! Webhooks: registered through the API, delivered to a real HTTP receiver, signed, retried
//! with growing pauses, dead-lettered, redelivered, and sent once among replicas.

use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use chrono::TimeDelta;
use serde_json::{Value, json};

use crate::harness::{TestApp, t};

/// What a receiver got: path, headers of interest and the body.
#[derive(Clone, Debug)]
struct Received {
    path: String,
    event: String,
    delivery: String,
    timestamp: i64,
    signature: String,
    request_id: String,
    body: String,
}

#[derive(Clone)]
struct Receiver {
    got: Arc<Mutex<Vec<Received>>>,
    status: Arc<Mutex<u16>>,
    /// Requests to `/slow` wait for a permit before they are answered.
    slow: Arc<tokio::sync::Semaphore>,
}

impl Receiver {
    async fn start() -> (Receiver, String) {
        let receiver = Receiver {
            got: Arc::default(),
            status: Arc::new(Mutex::new(204)),
            slow: Arc::new(tokio::sync::Semaphore::new(0)),
        };
        let app = axum::Router::new()
            .route("/{*path}", axum::routing::post(receive))
            .with_state(receiver.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        (receiver, base)
    }

    fn answer(&self, status: u16) {
        *self.status.lock().unwrap() = status;
    }

    fn at(&self, path: &str) -> Vec<Received> {
        self.got
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.path == path)
            .cloned()
            .collect()
    }

    /// Waits until `path` has received `count` requests; fails with `what` after 20 s.
    async fn wait_for(&self, path: &str, count: usize, what: &str) {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
        while self.at(path).len() < count {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{what} ({} of {count} at {path})",
                self.at(path).len()
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }
}

async fn receive(
    State(receiver): State<Receiver>,
    axum::extract::Path(path): axum::extract::Path<String>,
    headers: HeaderMap,
    body: String,
) -> axum::response::Response {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string()
    };
    receiver.got.lock().unwrap().push(Received {
        path: format!("/{path}"),
        event: header("x-blazar-event"),
        delivery: header("x-blazar-delivery"),
        timestamp: header("x-blazar-timestamp").parse().unwrap_or(-1),
        signature: header("x-blazar-signature"),
        request_id: header("x-openstack-request-id"),
        body,
    });
    if path == "slow" {
        let _ = receiver.slow.acquire().await;
    }
    // An endpoint that always fails, beside those that answer as told.
    if path.starts_with("failing") {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    }
    let status = *receiver.status.lock().unwrap();
    StatusCode::from_u16(status).unwrap().into_response()
}

/// A lease asking for nothing, whose create is one event for every webhook.
fn empty_lease(name: &str) -> Value {
    json!({"name": name, "start_date": "2030-01-01 10:00", "end_date": "2030-01-01 12:00",
           "reservations": [], "events": []})
}

fn lease_body(name: &str) -> Value {
    json!({
        "name": name,
        "start_date": "2030-01-01 10:00",
        "end_date": "2030-01-01 12:00",
        "reservations": [{
            "resource_type": "physical:host",
            "min": 1, "max": 1,
            "hypervisor_properties": "", "resource_properties": ""
        }],
        "events": []
    })
}

async fn deliver(app: &TestApp) -> blazar_service::DeliveryReport {
    let poster = blazar_openstack::WebhookPoster::new(true).unwrap();
    app.service.deliver_webhooks(&poster).await.unwrap()
}

#[tokio::test]
async fn a_project_receives_its_own_events_signed_and_in_order() {
    let mut app = TestApp::spawn().await;
    let (receiver, base) = Receiver::start().await;
    app.create_host("compute-1", json!({})).await;
    app.create_host("compute-2", json!({})).await;

    app.act_as("alpha", "alpha-user", "member");
    let r = app
        .post(
            "/v1/webhooks",
            json!({
                "url": format!("{base}/alpha"),
                "event_types": ["lease.delete", "lease.create", "lease.event.start_lease"],
                "description": "alpha's billing"
            }),
        )
        .await;
    r.assert_status(StatusCode::CREATED);
    let hook = r.body["webhook"].clone();
    let secret = hook["secret"].as_str().unwrap().to_string();
    assert_eq!(secret.len(), 64);
    assert_eq!(hook["project_id"], "alpha");
    assert_eq!(
        hook["event_types"],
        json!(["lease.create", "lease.delete", "lease.event.start_lease"])
    );
    let hook_id = hook["id"].as_str().unwrap().to_string();
    // Only admins take every project's events; bad input is a 400.
    let r = app
        .post(
            "/v1/webhooks",
            json!({"url": format!("{base}/x"), "all_projects": true}),
        )
        .await;
    r.assert_status(StatusCode::FORBIDDEN);
    for bad in [
        json!({"url": "ftp://example.org/"}),
        json!({}),
        json!({"url": format!("{base}/x"), "event_types": "lease.create"}),
        json!({"url": format!("{base}/x"), "colour": "red"}),
        json!({"url": format!("{base}/x"), "event_types": ["lease create"]}),
        // A type no notification has: the webhook would never hear anything.
        json!({"url": format!("{base}/x"), "event_types": ["lease.created"]}),
    ] {
        let r = app.post("/v1/webhooks", bad.clone()).await;
        r.assert_status(StatusCode::BAD_REQUEST);
        assert!(r.body["error_message"].is_string(), "{bad}: {}", r.body);
    }
    let r = app
        .post(
            "/v1/webhooks",
            json!({"url": format!("{base}/x"), "event_types": ["nope"]}),
        )
        .await;
    assert!(
        r.message().contains("Unknown event type \"nope\"")
            && r.message().contains("lease.event.start_lease"),
        "{}",
        r.body
    );
    let alpha_lease = app.post("/v1/leases", lease_body("a")).await;
    let alpha_lease = alpha_lease.body["lease"]["id"]
        .as_str()
        .unwrap()
        .to_string();

    app.act_as_admin();
    let r = app
        .post(
            "/v1/webhooks",
            json!({"url": format!("{base}/all"), "all_projects": true}),
        )
        .await;
    r.assert_status(StatusCode::CREATED);
    assert_eq!(r.body["webhook"]["project_id"], Value::Null);
    // A project id Keystone could not have made, or a description no column can hold, is
    // refused for webhooks and calendar feeds alike.
    for (path, body) in [
        (
            "/v1/webhooks",
            json!({"url": format!("{base}/x"), "project_id": "p".repeat(65)}),
        ),
        (
            "/v1/webhooks",
            json!({"url": format!("{base}/x"), "description": "a\u{0}b"}),
        ),
        ("/v1/ical-feeds", json!({"project_id": "p".repeat(65)})),
        ("/v1/ical-feeds", json!({"description": "a\u{0}b"})),
    ] {
        let r = app.post(path, body.clone()).await;
        assert_eq!(
            r.status,
            StatusCode::BAD_REQUEST,
            "{path} {body}: {}",
            r.body
        );
    }

    app.act_as("beta", "beta-user", "member");
    let beta_lease = app.post("/v1/leases", lease_body("b")).await;
    let beta_lease = beta_lease.body["lease"]["id"].as_str().unwrap().to_string();
    // Beta sees neither alpha's webhook nor the admin's.
    let r = app.get("/v1/webhooks").await;
    assert_eq!(r.body["webhooks"], json!([]));
    app.get(&format!("/v1/webhooks/{hook_id}"))
        .await
        .assert_status(StatusCode::NOT_FOUND);

    app.tick_at(t(2030, 1, 1, 10, 0)).await;
    app.act_as("alpha", "alpha-user", "member");
    app.delete(&format!("/v1/leases/{alpha_lease}"))
        .await
        .assert_status(StatusCode::NO_CONTENT);
    let report = deliver(&app).await;
    assert_eq!(report.retried + report.dead, 0, "{report:?}");

    let alpha = receiver.at("/alpha");
    let kinds: Vec<&str> = alpha.iter().map(|r| r.event.as_str()).collect();
    assert_eq!(
        kinds,
        ["lease.create", "lease.event.start_lease", "lease.delete"]
    );
    for got in &alpha {
        let body: Value = serde_json::from_str(&got.body).unwrap();
        assert_eq!(body["lease_id"], alpha_lease.as_str());
        assert_eq!(body["payload"]["project_id"], "alpha");
        assert_eq!(body["event_type"], got.event.as_str());
        assert_eq!(body["id"], got.delivery.as_str());
        assert_eq!(
            got.signature,
            blazar_service::webhook_signature(&secret, got.timestamp, &got.body)
        );
        assert!((got.timestamp - app.service.now().timestamp()).abs() < 60);
    }
    // A signature made with another timestamp or secret does not match.
    let first = &alpha[0];
    assert_ne!(
        first.signature,
        blazar_service::webhook_signature(&secret, first.timestamp + 1, &first.body)
    );
    // The all-projects webhook got beta's events too.
    let all = receiver.at("/all");
    assert!(all.iter().any(|r| r.body.contains(&beta_lease)), "{all:?}");
    assert!(all.iter().any(|r| r.event == "lease.delete"), "{all:?}");

    // The list never shows the secret; deliveries say how they went.
    let r = app.get("/v1/webhooks").await;
    let listed = r.body["webhooks"].as_array().unwrap();
    assert_eq!(listed.len(), 1);
    assert!(listed[0].get("secret").is_none());
    assert_eq!(
        listed[0]["event_types"],
        json!(["lease.create", "lease.delete", "lease.event.start_lease"])
    );
    let shown = app.get(&format!("/v1/webhooks/{hook_id}")).await;
    assert_eq!(
        shown.body["webhook"]["event_types"],
        listed[0]["event_types"]
    );
    let r = app.get(&format!("/v1/webhooks/{hook_id}/deliveries")).await;
    r.assert_status(StatusCode::OK);
    let deliveries = r.body["deliveries"].as_array().unwrap();
    assert_eq!(deliveries.len(), 3);
    for d in deliveries {
        assert_eq!(d["status"], "delivered");
        assert_eq!(d["attempts"], 1);
        assert_eq!(d["last_result"], "204");
    }
    app.get(&format!("/v1/webhooks/{hook_id}/deliveries?status=lost"))
        .await
        .assert_status(StatusCode::BAD_REQUEST);
    let r = app
        .get(&format!("/v1/webhooks/{hook_id}/deliveries?state=dead"))
        .await;
    r.assert_status(StatusCode::BAD_REQUEST);
    assert_eq!(
        r.message(),
        "Unknown parameter state; a delivery list takes status, limit, marker"
    );
    // Pages, newest first: each after the last delivery of the page before.
    let ids = |r: &blazar_testkit::Response| -> Vec<String> {
        r.body["deliveries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["id"].as_str().unwrap().to_string())
            .collect()
    };
    let all = ids(&listed_deliveries(&app, &hook_id, "").await);
    let first = ids(&listed_deliveries(&app, &hook_id, "?limit=2").await);
    assert_eq!(first, all[..2]);
    let rest =
        ids(&listed_deliveries(&app, &hook_id, &format!("?limit=2&marker={}", first[1])).await);
    assert_eq!(rest, all[2..]);
    for bad in ["?limit=0", "?limit=x", "?marker=not-a-delivery"] {
        app.get(&format!("/v1/webhooks/{hook_id}/deliveries{bad}"))
            .await
            .assert_status(StatusCode::BAD_REQUEST);
    }

    // Deleted, it receives nothing more.
    app.delete(&format!("/v1/webhooks/{hook_id}"))
        .await
        .assert_status(StatusCode::NO_CONTENT);
    app.post("/v1/leases", lease_body("a2")).await;
    deliver(&app).await;
    assert_eq!(receiver.at("/alpha").len(), 3);
}

/// A server whose retries start 60 s apart (`max_attempts` of them, if given), one host,
/// and project alpha's webhook on an endpoint that answers 500, after alpha created lease
/// "a": the app acting as alpha, the receiver, the webhook's id and the lease's.
async fn failing_hook(max_attempts: Option<u32>) -> (TestApp, Receiver, String, String) {
    let mut app = TestApp::builder()
        .configure(|cli| {
            cli.webhook_max_attempts = max_attempts;
            cli.webhook_retry_base = Some(60.0);
        })
        .spawn()
        .await;
    let (receiver, base) = Receiver::start().await;
    receiver.answer(500);
    app.create_host("compute-1", json!({})).await;
    app.act_as("alpha", "alpha-user", "member");
    let r = app
        .post("/v1/webhooks", json!({"url": format!("{base}/hook")}))
        .await;
    let hook_id = r.body["webhook"]["id"].as_str().unwrap().to_string();
    let lease = app.post("/v1/leases", lease_body("a")).await;
    let lease = lease.body["lease"]["id"].as_str().unwrap().to_string();
    (app, receiver, hook_id, lease)
}

#[tokio::test]
async fn failures_back_off_die_and_are_redelivered_in_lease_order() {
    let (app, receiver, hook_id, lease) = failing_hook(Some(3)).await;

    let report = deliver(&app).await;
    assert_eq!((report.delivered, report.retried, report.dead), (0, 1, 0));
    // Not due again yet: nothing is sent.
    assert_eq!(
        deliver(&app).await,
        blazar_service::DeliveryReport::default()
    );
    // A later event of the same lease waits behind the failing one.
    app.delete(&format!("/v1/leases/{lease}"))
        .await
        .assert_status(StatusCode::NO_CONTENT);
    let start = app.service.now();
    app.set_time(start + TimeDelta::seconds(60));
    assert_eq!(deliver(&app).await.retried, 1);
    let kinds: Vec<String> = receiver
        .at("/hook")
        .iter()
        .map(|r| r.event.clone())
        .collect();
    assert_eq!(kinds, ["lease.create", "lease.create"]);
    // The pause doubles: 120 s after the second attempt, the third, which is the last.
    app.set_time(start + TimeDelta::seconds(60 + 119));
    assert_eq!(
        deliver(&app).await,
        blazar_service::DeliveryReport::default()
    );
    app.set_time(start + TimeDelta::seconds(60 + 120));
    let report = deliver(&app).await;
    assert_eq!(report.dead, 1, "{report:?}");
    // With the create dead, the delete goes (and fails once).
    assert_eq!(
        receiver.at("/hook").last().map(|r| r.event.clone()),
        Some("lease.delete".into())
    );
    let r = app
        .get(&format!("/v1/webhooks/{hook_id}/deliveries?status=dead"))
        .await;
    let dead = r.body["deliveries"].as_array().unwrap().clone();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0]["event_type"], "lease.create");
    assert_eq!(dead[0]["attempts"], 3);
    assert_eq!(dead[0]["last_result"], "500");
    // The dead letter shows in the metrics.
    let text = app.metrics_text().await;
    assert!(
        text.lines()
            .any(|l| l.contains("webhook_deliveries_dead") && l.ends_with(" 1")),
        "{text}"
    );

    // The endpoint is back; the dead letter is offered again and goes before the delete.
    receiver.answer(200);
    let dead_id = dead[0]["id"].as_str().unwrap();
    app.post(
        &format!("/v1/webhooks/{hook_id}/deliveries/{dead_id}/redeliver"),
        json!({}),
    )
    .await
    .assert_status(StatusCode::ACCEPTED);
    app.post(
        &format!("/v1/webhooks/{hook_id}/deliveries/nope/redeliver"),
        json!({}),
    )
    .await
    .assert_status(StatusCode::NOT_FOUND);
    assert_eq!(deliver(&app).await.delivered, 1);
    app.set_time(start + TimeDelta::seconds(60 + 120 + 60));
    assert_eq!(deliver(&app).await.delivered, 1);
    let kinds: Vec<String> = receiver
        .at("/hook")
        .iter()
        .map(|r| r.event.clone())
        .collect();
    assert_eq!(
        kinds,
        [
            "lease.create",
            "lease.create",
            "lease.create",
            "lease.delete",
            "lease.create",
            "lease.delete"
        ]
    );
    let r = app
        .get(&format!(
            "/v1/webhooks/{hook_id}/deliveries?status=delivered"
        ))
        .await;
    assert_eq!(r.body["deliveries"].as_array().unwrap().len(), 2);
    // Deliveries that succeeded are forgotten after a week.
    app.set_time(start + TimeDelta::days(8));
    deliver(&app).await;
    let r = app.get(&format!("/v1/webhooks/{hook_id}/deliveries")).await;
    assert_eq!(r.body["deliveries"], json!([]));
}

/// A lease's later deliveries, never tried, wait as long as the one ahead of them that
/// failed (not due, so a poll does not look at them), and are due again as soon as it is
/// delivered.
#[tokio::test]
async fn deliveries_behind_a_failing_one_wait_as_long_as_it_does() {
    let (app, receiver, hook_id, lease) = failing_hook(None).await;
    // One queued before the failure, one after it.
    app.put(
        &format!("/v1/leases/{lease}"),
        json!({"end_date": "2030-01-01 13:00"}),
    )
    .await
    .assert_status(StatusCode::OK);
    let start = app.service.now();
    assert_eq!(deliver(&app).await.retried, 1);
    app.delete(&format!("/v1/leases/{lease}"))
        .await
        .assert_status(StatusCode::NO_CONTENT);
    let pending = listed_deliveries(&app, &hook_id, "?status=pending").await;
    let times: Vec<(&str, &str)> = pending.body["deliveries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            (
                d["event_type"].as_str().unwrap(),
                d["next_attempt_at"].as_str().unwrap(),
            )
        })
        .collect();
    let retry = blazar_api::dates::format_space(start + TimeDelta::seconds(60));
    assert_eq!(times.len(), 3, "{}", pending.body);
    assert!(
        times.iter().all(|(_, at)| *at == retry),
        "all wait for the retry at {retry}: {times:?}"
    );

    receiver.answer(200);
    app.set_time(start + TimeDelta::seconds(60));
    assert_eq!(
        deliver(&app).await.delivered,
        3,
        "the create, the update, then the delete"
    );
    let kinds: Vec<String> = receiver
        .at("/hook")
        .iter()
        .map(|r| r.event.clone())
        .collect();
    assert_eq!(
        kinds,
        [
            "lease.create",
            "lease.create",
            "lease.update",
            "lease.delete"
        ]
    );
}

#[tokio::test]
async fn internal_destinations_are_refused_unless_the_operator_allows_them() {
    let mut app = TestApp::builder()
        .configure(|cli| cli.webhook_allow_internal = Some(false))
        .spawn()
        .await;
    app.act_as("alpha", "alpha-user", "member");
    for url in [
        "http://127.0.0.1:8080/hook",
        "http://169.254.169.254/latest/meta-data/",
        "http://[::1]/hook",
        "http://10.0.0.7/hook",
        "http://localhost:9000/hook",
    ] {
        let r = app.post("/v1/webhooks", json!({"url": url})).await;
        r.assert_status(StatusCode::BAD_REQUEST);
        assert!(
            r.message().contains("internal address"),
            "{url}: {}",
            r.body
        );
    }
    app.post(
        "/v1/webhooks",
        json!({"url": "https://hooks.example.org/a"}),
    )
    .await
    .assert_status(StatusCode::CREATED);

    // A webhook registered while internal destinations were allowed is not sent to once
    // they are not: the delivery fails and says why, and the endpoint sees nothing.
    let mut app = TestApp::spawn().await;
    let (receiver, base) = Receiver::start().await;
    app.create_host("compute-1", json!({})).await;
    app.act_as("alpha", "alpha-user", "member");
    let r = app
        .post("/v1/webhooks", json!({"url": format!("{base}/hook")}))
        .await;
    r.assert_status(StatusCode::CREATED);
    let hook_id = r.body["webhook"]["id"].as_str().unwrap().to_string();
    app.post("/v1/leases", lease_body("a"))
        .await
        .assert_status(StatusCode::CREATED);
    let refusing = blazar_openstack::WebhookPoster::new(false).unwrap();
    let report = app.service.deliver_webhooks(&refusing).await.unwrap();
    assert_eq!((report.delivered, report.retried), (0, 1));
    assert!(receiver.at("/hook").is_empty());
    let r = app.get(&format!("/v1/webhooks/{hook_id}/deliveries")).await;
    let last = r.body["deliveries"][0]["last_result"]
        .as_str()
        .unwrap_or("");
    assert!(last.contains("internal address"), "{}", r.body);
}

/// At most 25, also when 40 registrations race.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_project_has_at_most_25_webhooks() {
    let mut app = TestApp::spawn().await;
    app.act_as("alpha", "alpha-user", "member");
    let racing = (0..40).map(|i| {
        app.post(
            "/v1/webhooks",
            json!({"url": format!("https://hooks.example.org/{i}")}),
        )
    });
    let answers = futures::future::join_all(racing).await;
    let created = answers
        .iter()
        .filter(|r| r.status == StatusCode::CREATED)
        .count();
    assert_eq!(created, 25);
    assert!(
        answers
            .iter()
            .all(|r| matches!(r.status, StatusCode::CREATED | StatusCode::BAD_REQUEST))
    );
    let r = app
        .post(
            "/v1/webhooks",
            json!({"url": "https://hooks.example.org/26"}),
        )
        .await;
    r.assert_status(StatusCode::BAD_REQUEST);
    assert!(r.message().contains("at most 25 webhooks"), "{}", r.body);
    app.act_as("beta", "beta-user", "member");
    app.post(
        "/v1/webhooks",
        json!({"url": "https://hooks.example.org/b"}),
    )
    .await
    .assert_status(StatusCode::CREATED);
}

#[tokio::test]
async fn replicas_deliver_each_event_once() {
    let app = TestApp::spawn().await;
    let replica = app.replica().await;
    let (receiver, base) = Receiver::start().await;
    for i in 0..10 {
        app.create_host(&format!("compute-{i}"), json!({})).await;
    }
    app.post(
        "/v1/webhooks",
        json!({"url": format!("{base}/hook"), "all_projects": true}),
    )
    .await
    .assert_status(StatusCode::CREATED);
    for i in 0..10 {
        app.post("/v1/leases", lease_body(&format!("l{i}")))
            .await
            .assert_status(StatusCode::CREATED);
    }
    let (a, b) = tokio::join!(deliver(&app), deliver(&replica));
    assert_eq!(a.delivered + b.delivered, 10, "{a:?} {b:?}");
    let mut ids: Vec<String> = receiver
        .at("/hook")
        .into_iter()
        .map(|r| r.delivery)
        .collect();
    assert_eq!(ids.len(), 10);
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 10);
}

#[tokio::test]
async fn a_running_server_delivers_as_soon_as_the_event_commits() {
    let db = crate::harness::TestDatabase::new().await;
    let listen = format!("127.0.0.1:{}", crate::support::free_port());
    let server = crate::support::ServerProcess::start(&[
        "--listen",
        &listen,
        "--database-url",
        &db.url,
        "--poll-interval",
        "10",
    ])
    .await;
    let (receiver, base) = Receiver::start().await;
    let http = reqwest::Client::new();
    let r = http
        .post(format!("http://{listen}/v1/webhooks"))
        .json(&json!({"url": format!("{base}/hook"), "event_types": ["lease.create"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let global = format!("req-{}", uuid::Uuid::new_v4());
    let r = http
        .post(format!("http://{listen}/v1/leases"))
        .header("X-OpenStack-Request-Id", &global)
        .json(&empty_lease("hooked"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    // Woken by the commit, not by its poll (10 s, longer than this wait).
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    while receiver.at("/hook").is_empty() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let got = receiver.at("/hook");
    assert_eq!(got.len(), 1, "{}", server.logs());
    assert_eq!(got[0].event, "lease.create");
    assert!(got[0].body.contains("\"hooked\""));
    // The delivery carries the global request id of the call that caused the event.
    assert_eq!(got[0].request_id, global);
    server.stop().await;
}

/// An app whose webhooks wait 60 s for an answer, with `hosts` hosts, an all-projects
/// webhook at each of `paths` of a receiver, and one lease created.
async fn hooked_app(paths: &[&str], hosts: usize) -> (TestApp, Receiver) {
    let app = TestApp::builder()
        .configure(|cli| cli.webhook_timeout = Some(60.0))
        .spawn()
        .await;
    let (receiver, base) = Receiver::start().await;
    for i in 1..=hosts {
        app.create_host(&format!("compute-{i}"), json!({})).await;
    }
    for path in paths {
        app.post(
            "/v1/webhooks",
            json!({"url": format!("{base}/{path}"), "all_projects": true}),
        )
        .await
        .assert_status(StatusCode::CREATED);
    }
    app.post("/v1/leases", lease_body("a"))
        .await
        .assert_status(StatusCode::CREATED);
    (app, receiver)
}

#[tokio::test]
async fn a_slow_endpoint_does_not_hold_up_other_webhooks() {
    let (app, receiver) = hooked_app(&["slow", "fast"], 2).await;
    // Counts only grow, so waiting for one endpoint and then the other waits for both.
    let wait_for = async |fast: usize, slow: usize, what: &str| {
        receiver.wait_for("/fast", fast, what).await;
        receiver.wait_for("/slow", slow, what).await;
    };
    let check = async {
        // The fast endpoint has its delivery while the slow one still holds its own.
        wait_for(1, 1, "the fast endpoint waited for the slow one").await;
        // An event written while the slow endpoint still holds its delivery goes out to
        // the fast one at once, not after the slow one's answer.
        app.post("/v1/leases", lease_body("b"))
            .await
            .assert_status(StatusCode::CREATED);
        wait_for(2, 1, "a later event waited for the slow endpoint").await;
        // Each lease's events stay in order at the slow endpoint: the second lease's
        // goes out beside the first's, which is still unanswered.
        wait_for(2, 2, "the slow endpoint's second delivery").await;
        receiver.slow.add_permits(2);
    };
    let (report, ()) = tokio::join!(deliver(&app), check);
    assert_eq!(report.delivered, 4, "{report:?}");
}

#[tokio::test]
async fn the_deliveries_of_a_stopped_deliverer_go_out_once_its_attempt_would_have_ended() {
    let (app, receiver) = hooked_app(&["slow"], 1).await;
    // A deliverer stops (its process killed) while its POST waits for an answer.
    let started = app.service.now();
    let stopped = tokio::time::timeout(std::time::Duration::from_secs(2), deliver(&app)).await;
    assert!(stopped.is_err(), "the slow endpoint answered");
    assert_eq!(receiver.at("/slow").len(), 1);
    let replica = app.replica().await;
    receiver.slow.add_permits(10);
    // Its claim covers one attempt (the 60 s timeout) and the write of its outcome...
    replica.set_time(started + TimeDelta::seconds(75));
    assert_eq!(deliver(&replica).await.delivered, 0);
    assert_eq!(receiver.at("/slow").len(), 1);
    // ...and no more: then another deliverer sends it again.
    replica.set_time(started + TimeDelta::seconds(95));
    assert_eq!(deliver(&replica).await.delivered, 1);
    let got = receiver.at("/slow");
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].delivery, got[1].delivery);
    // Both were made, the one whose deliverer never reported back included.
    let hooks = replica.get("/v1/webhooks").await;
    let hook_id = hooks.body["webhooks"][0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let r = replica
        .get(&format!("/v1/webhooks/{hook_id}/deliveries"))
        .await;
    let d = &r.body["deliveries"][0];
    assert_eq!(
        (&d["status"], &d["attempts"]),
        (&json!("delivered"), &json!(2))
    );
}

/// Project alpha's webhook on a receiver's `/hook`, and a lease of alpha's whose create it
/// is to be told of: the receiver and the webhook's id.
async fn alpha_hooked_lease(app: &mut TestApp) -> (Receiver, String) {
    let (receiver, base) = Receiver::start().await;
    app.create_host("compute-1", json!({})).await;
    app.act_as("alpha", "alpha-user", "member");
    let r = app
        .post("/v1/webhooks", json!({"url": format!("{base}/hook")}))
        .await;
    let hook_id = r.body["webhook"]["id"].as_str().unwrap().to_string();
    app.post("/v1/leases", lease_body("a")).await;
    (receiver, hook_id)
}

/// The deliveries due at `now` that `worker` (of another replica, say) takes for a minute.
async fn claim_as(
    app: &TestApp,
    worker: &str,
    now: chrono::DateTime<chrono::Utc>,
) -> Vec<blazar_db::ClaimedDelivery> {
    let mut tx = app.service.store().write().await.unwrap();
    let claimed = tx
        .claim_webhook_deliveries(
            now,
            worker,
            chrono::Duration::minutes(1),
            10,
            &[],
            &[],
            false,
            |_, _, _| true,
        )
        .await
        .unwrap();
    tx.commit().await.unwrap();
    claimed
}

#[tokio::test]
async fn a_delivery_whose_every_deliverer_died_is_dead_without_another_send() {
    let mut app = TestApp::builder()
        .configure(|cli| cli.webhook_max_attempts = Some(3))
        .spawn()
        .await;
    let (receiver, hook_id) = alpha_hooked_lease(&mut app).await;
    // Three deliverers in turn take it and die before reporting back (the delivery
    // kills them, say): their claims run out, and each was an attempt.
    let mut now = app.service.now();
    for dying in ["w1", "w2", "w3"] {
        assert_eq!(claim_as(&app, dying, now).await.len(), 1, "{dying}");
        now += TimeDelta::minutes(2);
    }
    app.set_time(now);
    let report = deliver(&app).await;
    assert_eq!(report.dead, 1, "{report:?}");
    assert!(receiver.at("/hook").is_empty(), "sent a fourth time");
    let r = app
        .get(&format!("/v1/webhooks/{hook_id}/deliveries?status=dead"))
        .await;
    let d = &r.body["deliveries"][0];
    assert_eq!(d["attempts"], 3);
    assert!(
        d["last_result"]
            .as_str()
            .unwrap()
            .contains("did not report back"),
        "{d}"
    );
}

#[tokio::test]
async fn a_delivery_being_made_is_not_offered_again() {
    let mut app = TestApp::spawn().await;
    let (_receiver, hook_id) = alpha_hooked_lease(&mut app).await;
    // A worker (of another replica, say) has taken the delivery and is sending it.
    let now = app.service.now();
    let claimed = claim_as(&app, "busy-worker", now).await;
    assert_eq!(claimed.len(), 1);
    // The listing says so: the attempt is counted, its result not known yet.
    let listed = app.get(&format!("/v1/webhooks/{hook_id}/deliveries")).await;
    let d = &listed.body["deliveries"][0];
    assert_eq!(
        (d["sending"].clone(), d["attempts"].clone()),
        (json!(true), json!(1)),
        "{d}"
    );
    assert_eq!(d["last_result"], Value::Null, "{d}");
    let path = format!(
        "/v1/webhooks/{hook_id}/deliveries/{}/redeliver",
        claimed[0].notification_id
    );
    let r = app.post(&path, json!({})).await;
    r.assert_status(StatusCode::CONFLICT);
    assert!(r.message().contains("being made"), "{}", r.message());
    // Once its claim has run out (the worker died), it may be offered again.
    app.set_time(now + TimeDelta::minutes(2));
    let listed = app.get(&format!("/v1/webhooks/{hook_id}/deliveries")).await;
    assert_eq!(
        listed.body["deliveries"][0]["sending"], false,
        "{}",
        listed.body
    );
    app.post(&path, json!({}))
        .await
        .assert_status(StatusCode::ACCEPTED);
}

#[tokio::test]
async fn a_project_whose_endpoints_hang_leaves_room_to_the_others() {
    let mut app = TestApp::builder()
        .configure(|cli| cli.webhook_timeout = Some(60.0))
        .spawn()
        .await;
    let (receiver, base) = Receiver::start().await;
    app.act_as("tarpit", "t-user", "member");
    for _ in 0..4 {
        app.post("/v1/webhooks", json!({"url": format!("{base}/slow")}))
            .await
            .assert_status(StatusCode::CREATED);
    }
    for i in 0..10 {
        app.post("/v1/leases", empty_lease(&format!("t{i}")))
            .await
            .assert_status(StatusCode::CREATED);
    }
    app.act_as("other", "o-user", "member");
    app.post("/v1/webhooks", json!({"url": format!("{base}/fast")}))
        .await
        .assert_status(StatusCode::CREATED);
    app.post("/v1/leases", empty_lease("o"))
        .await
        .assert_status(StatusCode::CREATED);
    let check = async {
        // Forty deliveries that hang come first, and there are sixteen slots: the other
        // project's one still goes out while they hang.
        receiver
            .wait_for(
                "/fast",
                1,
                "the other project waited for the endpoints that hang",
            )
            .await;
        // Never more than the project's share of six at once.
        let hanging = receiver.at("/slow").len();
        assert!(
            (1..=6).contains(&hanging),
            "{hanging} in flight for one project"
        );
        receiver.slow.add_permits(1_000);
    };
    let (report, ()) = tokio::join!(deliver(&app), check);
    assert_eq!(report.delivered, 41, "{report:?}");
}

/// An app whose webhooks wait `timeout` seconds for an answer, with project `tarpit`'s
/// webhooks at each of `urls` of a receiver, and `leases` of its leases created (one event
/// each, for every webhook).
async fn tarpit(timeout: f64, urls: &[&str], leases: usize) -> (TestApp, Receiver) {
    let mut app = TestApp::builder()
        .configure(move |cli| cli.webhook_timeout = Some(timeout))
        .spawn()
        .await;
    let (receiver, base) = Receiver::start().await;
    app.act_as("tarpit", "t-user", "member");
    for url in urls {
        app.post("/v1/webhooks", json!({"url": format!("{base}/{url}")}))
            .await
            .assert_status(StatusCode::CREATED);
    }
    for i in 0..leases {
        app.post("/v1/leases", empty_lease(&format!("t{i}")))
            .await
            .assert_status(StatusCode::CREATED);
    }
    (app, receiver)
}

/// One project's endpoint that hangs, with many deliveries due, leaves room to the same
/// project's other endpoint: it took all the project's slots, and the other waited for the
/// hanging ones' timeouts.
#[tokio::test]
async fn an_endpoint_that_hangs_leaves_room_to_its_projects_others() {
    let (app, receiver) = tarpit(60.0, &["slow", "fast"], 10).await;
    let check = async {
        // Ten events for each endpoint, in the order they happened, the two interleaved:
        // the fast endpoint has all ten while the slow one still holds its own.
        receiver
            .wait_for(
                "/fast",
                10,
                "the fast endpoint waited for the one that hangs",
            )
            .await;
        // Never more than the webhook's share of four at once.
        let hanging = receiver.at("/slow").len();
        assert!(
            (1..=4).contains(&hanging),
            "{hanging} in flight for one endpoint"
        );
        receiver.slow.add_permits(1_000);
    };
    let (report, ()) = tokio::join!(deliver(&app), check);
    assert_eq!(report.delivered, 20, "{report:?}");
}

/// Endpoints that give no answer in time are tried one delivery at a time once an attempt
/// went unanswered: two of them in one project took every slot the project had for each
/// timeout, and its endpoint that answers waited minutes behind them.
#[tokio::test]
async fn endpoints_that_do_not_answer_are_tried_one_delivery_at_a_time() {
    let (app, receiver) = tarpit(1.0, &["slow?one", "slow?two", "fast"], 12).await;
    let report = deliver(&app).await;
    assert_eq!(receiver.at("/fast").len(), 12, "{report:?}");
    // The first attempts of each silent endpoint go out together (at most its share of
    // the project's slots); once they went unanswered, the rest wait for their retries
    // rather than each holding a slot for its own timeout.
    let tried = receiver.at("/slow").len();
    assert!(
        (2..=6).contains(&tried),
        "{tried} attempts at the endpoints that never answer"
    );
    // Once their retries are due, each endpoint gets one (its earliest), not every one due
    // at once; the rest wait for the retry's answer.
    let later = app.service.now() + TimeDelta::hours(1);
    app.set_time(later);
    deliver(&app).await;
    assert_eq!(
        receiver.at("/slow").len(),
        tried + 2,
        "retries at the endpoints that never answer"
    );
    receiver.slow.add_permits(1_000);
}

/// A project's endpoints take turns: two that fail, with a backlog of retries due, no longer
/// keep its new endpoint waiting until each of theirs has been tried again (taken oldest
/// first, the retries filled the project's share claim after claim).
#[tokio::test]
async fn endpoints_take_turns_behind_a_backlog_of_retries() {
    let mut app = TestApp::spawn().await;
    let (receiver, base) = Receiver::start().await;
    app.act_as("alpha", "alpha-user", "member");
    for path in ["failing-one", "failing-two"] {
        app.post("/v1/webhooks", json!({"url": format!("{base}/{path}")}))
            .await
            .assert_status(StatusCode::CREATED);
    }
    for i in 0..12 {
        app.post("/v1/leases", empty_lease(&format!("old{i}")))
            .await
            .assert_status(StatusCode::CREATED);
    }
    let report = deliver(&app).await;
    assert_eq!(report.retried, 24, "{report:?}");
    // Every retry is due; a new endpoint is told of a new lease.
    let later = app.service.now() + TimeDelta::hours(1);
    app.set_time(later);
    app.post("/v1/webhooks", json!({"url": format!("{base}/new")}))
        .await
        .assert_status(StatusCode::CREATED);
    app.post("/v1/leases", empty_lease("new"))
        .await
        .assert_status(StatusCode::CREATED);
    let before = receiver.got.lock().unwrap().len();
    let report = deliver(&app).await;
    assert_eq!(report.delivered, 1, "{report:?}");
    let order: Vec<String> = receiver.got.lock().unwrap()[before..]
        .iter()
        .map(|r| r.path.clone())
        .collect();
    assert_eq!(order.len(), 27, "{order:?}");
    // Sent in the first claim (six at once at most for a project), not after the backlog.
    let at = order.iter().position(|p| p == "/new");
    assert!(at.is_some_and(|i| i < 6), "sent {at:?}-th: {order:?}");
}

/// Endpoints that do not answer hold at most half the slots together, whatever their
/// projects: eighteen of three projects, each tried one delivery at a time, took all sixteen
/// for a whole timeout, and another project's endpoint that answers waited behind them.
#[tokio::test]
async fn silent_endpoints_leave_room_to_those_that_answer() {
    let mut app = TestApp::builder()
        .configure(|cli| cli.webhook_timeout = Some(1.0))
        .spawn()
        .await;
    let (receiver, base) = Receiver::start().await;
    for p in 0..3 {
        app.act_as(&format!("hanging-{p}"), "h-user", "member");
        for w in 0..6 {
            app.post(
                "/v1/webhooks",
                json!({"url": format!("{base}/slow?{p}-{w}")}),
            )
            .await
            .assert_status(StatusCode::CREATED);
        }
        app.post("/v1/leases", empty_lease(&format!("h{p}")))
            .await
            .assert_status(StatusCode::CREATED);
    }
    app.act_as("answering", "a-user", "member");
    app.post("/v1/webhooks", json!({"url": format!("{base}/fast")}))
        .await
        .assert_status(StatusCode::CREATED);
    app.post("/v1/leases", empty_lease("a0"))
        .await
        .assert_status(StatusCode::CREATED);
    // None of the eighteen is answered: all are silent, their retries waiting.
    let report = deliver(&app).await;
    assert_eq!((report.delivered, report.retried), (1, 18), "{report:?}");
    let unanswered = receiver.at("/slow").len();

    // Their retries are due, and the answering endpoint has a new delivery.
    let later = app.service.now() + TimeDelta::hours(1);
    app.set_time(later);
    app.post("/v1/leases", empty_lease("a1"))
        .await
        .assert_status(StatusCode::CREATED);
    let check = async {
        receiver
            .wait_for("/fast", 2, "the answering endpoint's delivery")
            .await;
        let hanging = receiver.at("/slow").len() - unanswered;
        assert!(
            (1..=8).contains(&hanging),
            "{hanging} silent attempts in flight before the answering endpoint's"
        );
    };
    let (report, ()) = tokio::join!(deliver(&app), check);
    assert_eq!((report.delivered, report.retried), (1, 18), "{report:?}");
    receiver.slow.add_permits(1_000);
}

/// An endpoint stays silent until it answers, whatever became of the deliveries it left
/// unanswered: once those went dead, new ones still go one at a time (they went four at
/// once, each holding a slot for a whole timeout); once it answers, side by side again.
#[tokio::test]
async fn an_endpoint_stays_silent_after_its_unanswered_deliveries_die() {
    let mut app = TestApp::builder()
        .configure(|cli| {
            cli.webhook_timeout = Some(3.0);
            cli.webhook_max_attempts = Some(1);
        })
        .spawn()
        .await;
    let (receiver, base) = Receiver::start().await;
    app.act_as("tarpit", "t-user", "member");
    app.post("/v1/webhooks", json!({"url": format!("{base}/slow")}))
        .await
        .assert_status(StatusCode::CREATED);
    let create = |i: usize| empty_lease(&format!("t{i}"));
    app.post("/v1/leases", create(0))
        .await
        .assert_status(StatusCode::CREATED);
    // Its one attempt gets no answer: the delivery is dead at once.
    let report = deliver(&app).await;
    assert_eq!(report.dead, 1, "{report:?}");
    for i in 1..=4 {
        app.post("/v1/leases", create(i))
            .await
            .assert_status(StatusCode::CREATED);
    }
    // One at a time: each new delivery is tried alone and dies unanswered.
    let check = async {
        for sent in 2..=5 {
            receiver
                .wait_for("/slow", sent, "the next delivery to a silent endpoint")
                .await;
            // Deliveries claimed together go out within milliseconds of each other; the
            // next one alone only after this one's 3 s timeout, far past this look.
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            assert_eq!(
                receiver.at("/slow").len(),
                sent,
                "deliveries sent at once to an endpoint that does not answer"
            );
        }
    };
    let (report, ()) = tokio::join!(deliver(&app), check);
    assert_eq!(report.dead, 4, "{report:?}");

    // It answers the next one: the three after it go side by side (all three sent before
    // any is answered; one at a time, each would die unanswered).
    for i in 5..=8 {
        app.post("/v1/leases", create(i))
            .await
            .assert_status(StatusCode::CREATED);
    }
    receiver.slow.add_permits(1);
    let check = async {
        receiver
            .wait_for("/slow", 6, "the probe of the endpoint")
            .await;
        receiver
            .wait_for("/slow", 9, "the deliveries after the endpoint answered")
            .await;
        receiver.slow.add_permits(1_000);
    };
    let (report, ()) = tokio::join!(deliver(&app), check);
    assert_eq!(report.delivered, 4, "{report:?}");
}

/// A webhook's deliveries as listed with `query`.
async fn listed_deliveries(app: &TestApp, hook_id: &str, query: &str) -> blazar_testkit::Response {
    let r = app
        .get(&format!("/v1/webhooks/{hook_id}/deliveries{query}"))
        .await;
    r.assert_status(StatusCode::OK);
    r
}

/// A delivery that failed once, found with no attempt left after the allowed attempts were
/// lowered (a restart with a smaller `--webhook-max-attempts`), is dead with what its last
/// attempt got, not as if its deliverer had died.
#[tokio::test]
async fn lowered_attempts_keep_the_last_result_of_a_delivery_they_end() {
    let mut app = TestApp::builder()
        .configure(|cli| cli.webhook_max_attempts = Some(5))
        .spawn()
        .await;
    let (receiver, hook_id) = alpha_hooked_lease(&mut app).await;
    receiver.answer(500);
    assert_eq!(deliver(&app).await.retried, 1);
    let lowered = TestApp::builder()
        .database(app.database().clone())
        .configure(|cli| cli.webhook_max_attempts = Some(1))
        .spawn()
        .await;
    lowered.set_time(app.service.now() + TimeDelta::hours(1));
    let report = deliver(&lowered).await;
    assert_eq!(report.dead, 1, "{report:?}");
    assert_eq!(receiver.at("/hook").len(), 1, "sent again");
    let r = lowered
        .get(&format!("/v1/webhooks/{hook_id}/deliveries?status=dead"))
        .await;
    let result = r.body["deliveries"][0]["last_result"].as_str().unwrap();
    assert_eq!(
        result,
        "gave up after 1 attempts, the 1 now allowed; the last: 500"
    );
}

/// Webhooks and calendar feeds are a project's outward channels: its readers may list them,
/// only its members (and admins) make, delete or redeliver them.
#[tokio::test]
async fn readers_see_webhooks_and_feeds_but_only_members_change_them() {
    let (mut app, _receiver, hook_id, _lease) = failing_hook(None).await;
    assert_eq!(deliver(&app).await.retried, 1);
    let pending = listed_deliveries(&app, &hook_id, "?status=pending").await;
    let delivery = pending.body["deliveries"][0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let feed = app
        .post("/v1/ical-feeds", json!({"description": "team"}))
        .await;
    feed.assert_status(StatusCode::CREATED);
    let feed_id = feed.body["ical_feed"]["id"].as_str().unwrap().to_string();

    app.act_as("alpha", "alpha-reader", "reader");
    app.get("/v1/webhooks").await.assert_status(StatusCode::OK);
    app.get(&format!("/v1/webhooks/{hook_id}/deliveries"))
        .await
        .assert_status(StatusCode::OK);
    app.get("/v1/ical-feeds")
        .await
        .assert_status(StatusCode::OK);
    for r in [
        app.post("/v1/webhooks", json!({"url": "https://example.org/r"}))
            .await,
        app.delete(&format!("/v1/webhooks/{hook_id}")).await,
        app.post(
            &format!("/v1/webhooks/{hook_id}/deliveries/{delivery}/redeliver"),
            json!({}),
        )
        .await,
        app.post("/v1/ical-feeds", json!({"description": "mine"}))
            .await,
        app.delete(&format!("/v1/ical-feeds/{feed_id}")).await,
    ] {
        r.assert_status(StatusCode::FORBIDDEN);
    }
    app.act_as("alpha", "alpha-user", "member");
    app.get(&format!("/v1/webhooks/{hook_id}"))
        .await
        .assert_status(StatusCode::OK);
    app.delete(&format!("/v1/ical-feeds/{feed_id}"))
        .await
        .assert_status(StatusCode::NO_CONTENT);
}
