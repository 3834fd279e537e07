//! Watching the service: `/metrics`, `/healthz` and `/readyz`, the global request id on
//! outbound calls and in logs, the long poll on a lease and the lease event stream.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use blazar_service::Clock;
use chrono::TimeDelta;
use reqwest::Method;
use serde_json::{Value, json};

use crate::harness::{TestApp, TestDatabase, t};
use crate::support::{ServerProcess, free_port};

/// One sample of an exposition: name, labels, value.
type Sample = (String, HashMap<String, String>, f64);

/// Parses the text exposition strictly: every line is a comment or a sample, the last one
/// `# EOF`; anything else fails the test.
fn parse_exposition(text: &str) -> Vec<Sample> {
    assert!(text.ends_with("# EOF\n"), "no EOF marker:\n{text}");
    let mut samples = Vec::new();
    for line in text.lines() {
        if line.starts_with('#') {
            assert!(
                line.starts_with("# HELP ")
                    || line.starts_with("# TYPE ")
                    || line.starts_with("# UNIT ")
                    || line == "# EOF",
                "bad comment line {line:?}"
            );
            continue;
        }
        let (series, value) = line.rsplit_once(' ').expect("a sample line");
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("bad value in {line:?}"));
        let (name, labels) = match series.split_once('{') {
            None => (series.to_string(), HashMap::new()),
            Some((name, rest)) => {
                let body = rest.strip_suffix('}').expect("closing brace");
                let labels = body
                    .split("\",")
                    .filter(|pair| !pair.is_empty())
                    .map(|pair| {
                        let (k, v) = pair.split_once("=\"").expect("label=\"value\"");
                        (k.to_string(), v.trim_end_matches('"').to_string())
                    })
                    .collect();
                (name.to_string(), labels)
            }
        };
        assert!(
            name.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
            "bad metric name {name:?}"
        );
        samples.push((name, labels, value));
    }
    samples
}

fn sample(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    samples
        .iter()
        .find(|(n, l, _)| {
            n == name
                && labels
                    .iter()
                    .all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|(_, _, v)| *v)
}

async fn scrape(app: &TestApp) -> (String, Vec<Sample>) {
    let response = app
        .client
        .get(format!("{}/metrics", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert!(
        response.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("application/openmetrics-text"),
    );
    let text = response.text().await.unwrap();
    let samples = parse_exposition(&text);
    (text, samples)
}

fn host_lease_body(name: &str, start: &str, end: &str) -> Value {
    json!({
        "name": name, "start_date": start, "end_date": end, "before_end_date": null,
        "events": [],
        "reservations": [{"resource_type": "physical:host", "min": 1, "max": 1,
                          "hypervisor_properties": "", "resource_properties": ""}],
    })
}

#[tokio::test]
async fn metrics_count_requests_by_route_template_status_refusals_and_event_lag() {
    let app = TestApp::spawn().await;
    app.create_host("compute-1", json!({})).await;
    let missing = [uuid::Uuid::new_v4(), uuid::Uuid::new_v4()];
    for id in missing {
        let r = app.get(&format!("/v1/leases/{id}")).await;
        assert_eq!(r.status, StatusCode::NOT_FOUND);
    }
    app.get("/v1/leases").await.assert_status(StatusCode::OK);
    app.get("/v1/no/such/thing").await;
    let r = app
        .post(
            "/v1/leases",
            host_lease_body("a", "2030-01-01 10:00", "2030-01-01 12:00"),
        )
        .await;
    r.assert_status(StatusCode::CREATED);
    // The only host is taken: refused for want of resources.
    let r = app
        .post(
            "/v1/leases",
            host_lease_body("b", "2030-01-01 11:00", "2030-01-01 13:00"),
        )
        .await;
    r.assert_status(StatusCode::CONFLICT);
    // The start runs 30 s late.
    app.tick_at(t(2030, 1, 1, 10, 0) + TimeDelta::seconds(30))
        .await;

    let (text, samples) = scrape(&app).await;
    let requests = "blazar_http_requests_total";
    assert_eq!(
        sample(
            &samples,
            requests,
            &[
                ("route", "/v1/leases/{lease_id}"),
                ("method", "GET"),
                ("status", "404")
            ]
        ),
        Some(2.0),
        "{text}"
    );
    assert_eq!(
        sample(
            &samples,
            requests,
            &[
                ("route", "/v1/leases"),
                ("method", "POST"),
                ("status", "409")
            ]
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(
            &samples,
            requests,
            &[("route", "unmatched"), ("status", "404")]
        ),
        Some(1.0)
    );
    // Paths never become labels.
    assert!(!text.contains("no/such"), "{text}");
    for id in missing {
        assert!(!text.contains(&id.to_string()), "{text}");
    }
    assert!(
        sample(
            &samples,
            "blazar_http_request_duration_seconds_count",
            &[
                ("route", "/v1/leases"),
                ("method", "GET"),
                ("status", "200")
            ]
        )
        .is_some_and(|n| n >= 1.0)
    );
    assert_eq!(
        sample(
            &samples,
            "blazar_lease_refusals_total",
            &[("reason", "resources")]
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(&samples, "blazar_event_lag_seconds_count", &[]),
        Some(1.0)
    );
    assert_eq!(
        sample(&samples, "blazar_event_lag_seconds_sum", &[]),
        Some(30.0)
    );
    assert_eq!(
        sample(&samples, "blazar_leases", &[("status", "ACTIVE")]),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(&samples, "blazar_leases", &[("status", "PENDING")]),
        Some(0.0)
    );
    assert_eq!(sample(&samples, "blazar_database_up", &[]), Some(1.0));
    // Without a transport URL nothing is published: create and start wait in the outbox.
    assert_eq!(
        sample(&samples, "blazar_outbox_unsent_notifications", &[]),
        Some(2.0)
    );
    assert_eq!(sample(&samples, "blazar_actions_open", &[]), Some(0.0));
    assert_eq!(sample(&samples, "blazar_actions_failed", &[]), Some(0.0));
    assert!(sample(&samples, "blazar_database_connections_max", &[]).is_some_and(|n| n >= 1.0));
    // The app's clock is fixed far from the real time: on PostgreSQL the database's clock
    // is that far ahead of it (or behind); SQLite's clock is the process's own.
    let skew = sample(&samples, "blazar_clock_skew_seconds", &[]).unwrap_or(f64::NAN);
    let skew_ms = app
        .service
        .clock_skew()
        .await
        .unwrap()
        .map(|s| s.num_milliseconds());
    if app.database().is_postgres() {
        let expected = (chrono::Utc::now() - app.clock.now()).as_seconds_f64();
        assert!(
            (skew - expected).abs() < 5.0,
            "{skew} s, expected {expected} s"
        );
        let expected_ms = (chrono::Utc::now() - app.clock.now()).num_milliseconds();
        assert!(
            skew_ms.is_some_and(|ms| (ms - expected_ms).abs() < 5_000),
            "{skew_ms:?}"
        );
    } else {
        assert_eq!(skew, 0.0);
        assert_eq!(skew_ms, None);
    }

    // A lease asked to start now, twenty seconds into a minute, is given that minute; run
    // five seconds after the request, its start is five seconds late, not twenty-five.
    app.create_host("compute-2", json!({})).await;
    app.set_time(t(2030, 1, 1, 10, 5) + TimeDelta::seconds(20));
    app.post(
        "/v1/leases",
        host_lease_body("now", "now", "2030-01-01 10:30"),
    )
    .await
    .assert_status(StatusCode::CREATED);
    app.tick_at(t(2030, 1, 1, 10, 5) + TimeDelta::seconds(25))
        .await;
    let (text, samples) = scrape(&app).await;
    assert_eq!(
        sample(&samples, "blazar_event_lag_seconds_count", &[]),
        Some(2.0),
        "{text}"
    );
    assert_eq!(
        sample(&samples, "blazar_event_lag_seconds_sum", &[]),
        Some(35.0),
        "{text}"
    );

    // A create over a project quota is counted as refused by the quota.
    app.put("/v1/quotas/admin-project", json!({"hosts": 0}))
        .await
        .assert_status(StatusCode::OK);
    app.post(
        "/v1/leases",
        host_lease_body("over", "2030-01-02 10:00", "2030-01-02 11:00"),
    )
    .await
    .assert_status(StatusCode::FORBIDDEN);
    let (text, samples) = scrape(&app).await;
    assert_eq!(
        sample(
            &samples,
            "blazar_lease_refusals_total",
            &[("reason", "quota")]
        ),
        Some(1.0),
        "{text}"
    );
}

#[tokio::test]
async fn metrics_access_can_require_an_admin() {
    let app = TestApp::builder()
        .configure(|cli| cli.metrics_access = Some(blazar_server::metrics::MetricsAccess::Admin))
        .spawn()
        .await;
    let scrape_as = |roles: &'static str| {
        app.client
            .get(format!("{}/metrics", app.base))
            .header("X-Project-Id", "alpha")
            .header("X-Roles", roles)
            .send()
    };
    assert_eq!(
        scrape_as("member").await.unwrap().status(),
        StatusCode::FORBIDDEN
    );
    assert_eq!(scrape_as("admin").await.unwrap().status(), StatusCode::OK);
}

#[tokio::test]
async fn healthz_and_readyz_follow_the_database() {
    let app = TestApp::spawn().await;
    for path in ["/healthz", "/readyz"] {
        let r = app.get(path).await;
        assert_eq!(r.status, StatusCode::OK, "{path}");
        assert_eq!(r.body, json!({"status": "ok"}));
    }
    // Blazar's version discovery is unchanged.
    assert_eq!(app.get("/").await.status, StatusCode::MULTIPLE_CHOICES);

    // The database goes away.
    app.store().close().await;
    let r = app.get("/readyz").await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(r.body, json!({"status": "database unreachable"}));
    // Requests are told to come back, in Blazar's error format, with no detail of the
    // database in it.
    let r = app.get("/v1/leases").await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.body);
    assert_eq!(r.body["error_code"], 503);
    assert_eq!(
        r.body["error_message"],
        "The database is unavailable just now; try again later"
    );
    let (_, samples) = scrape(&app).await;
    assert_eq!(sample(&samples, "blazar_database_up", &[]), Some(0.0));
}

/// Every connection held (requests queued behind a long change) is not a lost database:
/// `/healthz` answers `busy` within a few seconds rather than 503 after the pool's 30 s, so
/// a liveness probe does not restart replicas that only wait their turn.
#[tokio::test]
async fn healthz_says_busy_when_every_connection_is_in_use() {
    let app = TestApp::builder().max_connections(2).spawn().await;
    // Every connection of the pool, taken as the server's own tasks let go of theirs.
    let mut held = Vec::new();
    while let Ok(tx) =
        tokio::time::timeout(std::time::Duration::from_millis(500), app.store().read()).await
    {
        held.push(tx.unwrap());
    }
    assert!(app.store().pool_saturated(), "{:?}", app.store().pool_use());
    let r = app.get("/healthz").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(r.body, json!({"status": "busy"}));
    drop(held);
    let r = app.get("/healthz").await;
    assert_eq!(r.body, json!({"status": "ok"}));
}

/// A stand-in for a site's accounting service that records the request id of every call.
#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Vec<Call>>>);

/// An endpoint called and the request id it was sent.
type Call = (String, Option<String>);

async fn record(
    State(recorder): State<Recorder>,
    axum::extract::Path(endpoint): axum::extract::Path<String>,
    headers: HeaderMap,
) -> axum::response::Response {
    let id = headers
        .get("x-openstack-request-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    recorder.0.lock().unwrap().push((endpoint, id));
    StatusCode::NO_CONTENT.into_response()
}

#[tokio::test]
async fn the_global_request_id_reaches_outbound_calls_and_the_response_keeps_its_own() {
    let recorder = Recorder::default();
    let service = axum::Router::new()
        .route("/blazar/{endpoint}", axum::routing::post(record))
        .with_state(recorder.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, service).await;
    });
    let app = TestApp::builder()
        .configure(|cli| {
            cli.enabled_filters = vec!["ExternalServiceFilter".into()];
            cli.external_service_base_endpoint = Some(format!("http://{addr}/blazar/"));
            cli.external_service_timeout = Some(5.0);
        })
        .spawn()
        .await;
    app.create_host("compute-1", json!({})).await;

    let global = format!("req-{}", uuid::Uuid::new_v4());
    let r = app
        .call(
            None,
            Method::POST,
            "/v1/leases",
            Some(host_lease_body("a", "2030-01-01 10:00", "2030-01-01 12:00")),
            &[("X-OpenStack-Request-Id", &global)],
        )
        .await;
    r.assert_status(StatusCode::CREATED);
    let own = r.headers["x-openstack-request-id"].to_str().unwrap();
    assert!(own.starts_with("req-") && own != global, "{own}");
    let id = r.body["lease"]["id"].as_str().unwrap().to_string();
    assert_eq!(
        recorder.0.lock().unwrap().clone(),
        vec![("check-create".to_string(), Some(global.clone()))]
    );

    // A malformed id is not passed on: the call carries the response's own id instead.
    recorder.0.lock().unwrap().clear();
    let r = app
        .call(
            None,
            Method::PUT,
            &format!("/v1/leases/{id}"),
            Some(json!({"end_date": "2030-01-01 13:00"})),
            &[("X-OpenStack-Request-Id", "req-not-a-uuid; drop table")],
        )
        .await;
    r.assert_status(StatusCode::OK);
    let own = r.headers["x-openstack-request-id"].to_str().unwrap();
    assert_eq!(
        recorder.0.lock().unwrap().clone(),
        vec![("check-update".to_string(), Some(own.to_string()))]
    );

    // The delete's id travels with the `on-end` action the workers carry out later.
    recorder.0.lock().unwrap().clear();
    let deleting = format!("req-{}", uuid::Uuid::new_v4());
    let r = app
        .call(
            None,
            Method::DELETE,
            &format!("/v1/leases/{id}"),
            None,
            &[("X-OpenStack-Request-Id", &deleting)],
        )
        .await;
    r.assert_status(StatusCode::NO_CONTENT);
    app.run_actions().await;
    assert_eq!(
        recorder.0.lock().unwrap().clone(),
        vec![("on-end".to_string(), Some(deleting))]
    );
}

#[tokio::test]
async fn json_logs_carry_the_global_request_id_on_every_line_of_the_request() {
    let db = TestDatabase::new().await;
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let server = ServerProcess::start(&[
        "--listen",
        &listen,
        "--database-url",
        &db.url,
        "--log-format",
        "json",
    ])
    .await;
    let global = format!("req-{}", uuid::Uuid::new_v4());
    let r = reqwest::Client::new()
        .post(format!("http://{listen}/v1/leases"))
        .header("X-OpenStack-Request-Id", &global)
        .json(&json!({"name": "logged", "start_date": "2030-01-01 10:00",
                      "end_date": "2030-01-01 12:00", "reservations": [], "events": []}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let own = r.headers()["x-openstack-request-id"]
        .to_str()
        .unwrap()
        .to_string();
    let logs = server.stop().await;
    let lines: Vec<Value> = logs
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|_| panic!("not JSON: {line}")))
        .collect();
    assert!(
        lines
            .iter()
            .any(|l| l["fields"]["message"] == "blazar-server ready"),
        "{logs}"
    );
    let created = lines
        .iter()
        .find(|l| l["fields"]["message"] == "lease created")
        .unwrap_or_else(|| panic!("no 'lease created' line:\n{logs}"));
    assert_eq!(created["level"], "INFO");
    assert_eq!(created["span"]["request.global_id"], global.as_str());
    assert_eq!(created["span"]["request.id"], own.as_str());
}

/// Waits until `n` long polls or streams hold a permit (the server counts them).
async fn until_waiting(app: &TestApp, n: usize) {
    for _ in 0..2_000 {
        if app.state.waiters_in_use() == n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("{n} waiter(s) never arrived");
}

#[tokio::test]
async fn a_long_poll_answers_when_the_lease_starts_or_at_its_timeout() {
    let app = TestApp::spawn().await;
    app.create_host("compute-1", json!({})).await;
    let r = app
        .post(
            "/v1/leases",
            host_lease_body("a", "2030-01-01 10:00", "2030-01-01 12:00"),
        )
        .await;
    let id = r.body["lease"]["id"].as_str().unwrap().to_string();

    // At its timeout, with the lease as it is.
    let started = Instant::now();
    let r = app
        .get(&format!("/v1/leases/{id}?wait_for=ACTIVE&timeout=0.3"))
        .await;
    r.assert_status(StatusCode::OK);
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert_eq!(r.body["lease"]["status"], "PENDING");
    assert_eq!(r.headers["blazar-wait-for"], "ACTIVE");

    // As soon as the lease starts.
    let client = app.client.clone();
    let url = format!("{}/v1/leases/{id}?wait_for=active&timeout=60", app.base);
    let started = Instant::now();
    let waiting = tokio::spawn(async move { client.get(url).send().await.unwrap() });
    until_waiting(&app, 1).await;
    app.tick_at(t(2030, 1, 1, 10, 0)).await;
    let answer = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the long poll answered")
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(answer.status(), StatusCode::OK);
    let body: Value = answer.json().await.unwrap();
    assert_eq!(body["lease"]["status"], "ACTIVE");
    until_waiting(&app, 0).await;

    // A status the lease can no longer reach answers at once; a bad one is a 400.
    let started = Instant::now();
    let r = app
        .get(&format!("/v1/leases/{id}?wait_for=PENDING&timeout=60"))
        .await;
    assert_eq!(r.body["lease"]["status"], "ACTIVE");
    assert!(started.elapsed() < Duration::from_secs(10));
    let r = app.get(&format!("/v1/leases/{id}?wait_for=SOON")).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    let r = app
        .get(&format!("/v1/leases/{id}?wait_for=ACTIVE&timeout=-1"))
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn a_long_poll_notices_a_change_made_by_another_replica() {
    let app = TestApp::spawn().await;
    let replica = app.replica().await;
    app.create_host("compute-1", json!({})).await;
    let r = app
        .post(
            "/v1/leases",
            host_lease_body("a", "2030-01-01 10:00", "2030-01-01 12:00"),
        )
        .await;
    let id = r.body["lease"]["id"].as_str().unwrap().to_string();
    let client = app.client.clone();
    let url = format!("{}/v1/leases/{id}?wait_for=ACTIVE&timeout=60", app.base);
    let waiting = tokio::spawn(async move { client.get(url).send().await.unwrap() });
    until_waiting(&app, 1).await;
    // The other process runs the start; this one only sees it in the database.
    replica.tick_at(t(2030, 1, 1, 10, 0)).await;
    let answer = tokio::time::timeout(Duration::from_secs(15), waiting)
        .await
        .expect("the long poll answered")
        .unwrap();
    let body: Value = answer.json().await.unwrap();
    assert_eq!(body["lease"]["status"], "ACTIVE");
}

/// A server with `max_waiters` waiter slots and a pending lease of no reservations to wait
/// on (its id).
async fn app_with_waiters(max_waiters: usize) -> (TestApp, String) {
    let app = TestApp::builder()
        .configure(|cli| cli.max_waiters = Some(max_waiters))
        .spawn()
        .await;
    let r = app
        .post(
            "/v1/leases",
            json!({"name": "a", "start_date": "2030-01-01 10:00", "end_date": "2030-01-01 12:00",
                   "reservations": [], "events": []}),
        )
        .await;
    let id = r.body["lease"]["id"].as_str().unwrap().to_string();
    (app, id)
}

/// One project holds at most a quarter of the waiter slots: the others' long polls and
/// streams are still answered while it holds its share.
#[tokio::test]
async fn one_project_cannot_take_every_waiter_slot() {
    let (app, id) = app_with_waiters(8).await;
    let as_project = |project: &'static str| {
        let request = app
            .client
            .get(format!("{}/v1/leases/events", app.base))
            .header("X-Project-Id", project)
            .header("X-User-Id", "u")
            .header("X-Roles", "member");
        async move { request.send().await.unwrap() }
    };
    // Two streams are alpha's share of eight slots.
    let first = as_project("alpha").await;
    let second = as_project("alpha").await;
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(second.status(), StatusCode::OK);
    until_waiting(&app, 2).await;
    let third = as_project("alpha").await;
    assert_eq!(third.status(), StatusCode::SERVICE_UNAVAILABLE);
    // A long poll that would wait counts toward the same share; one on a lease alpha
    // cannot see is refused as a plain read is (Blazar's policy answer, 403).
    let own = app
        .client
        .post(format!("{}/v1/leases", app.base))
        .header("X-Project-Id", "alpha")
        .header("X-User-Id", "u")
        .header("X-Roles", "member")
        .json(&json!({"name": "own", "start_date": "2030-01-01 10:00",
                      "end_date": "2030-01-01 12:00", "reservations": [], "events": []}))
        .send()
        .await
        .unwrap();
    assert_eq!(own.status(), StatusCode::CREATED);
    let own: Value = own.json().await.unwrap();
    let own_id = own["lease"]["id"].as_str().unwrap();
    let poll = |lease: &str| {
        app.client
            .get(format!(
                "{}/v1/leases/{lease}?wait_for=ACTIVE&timeout=1",
                app.base
            ))
            .header("X-Project-Id", "alpha")
            .header("X-User-Id", "u")
            .header("X-Roles", "member")
            .send()
    };
    assert_eq!(
        poll(own_id).await.unwrap().status(),
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(poll(&id).await.unwrap().status(), StatusCode::FORBIDDEN);
    // Another project is still served.
    let other = as_project("beta").await;
    assert_eq!(other.status(), StatusCode::OK);
    until_waiting(&app, 3).await;
    // A stream that ends gives its slot back to its project.
    drop(first);
    until_waiting(&app, 2).await;
    let again = as_project("alpha").await;
    assert_eq!(again.status(), StatusCode::OK);
    drop((second, other, again));
    until_waiting(&app, 0).await;
}

/// `--max-waiters 0` opens no stream and lets no poll wait; plain reads are served.
#[tokio::test]
async fn no_waiter_slots_serve_no_stream_and_no_waiting_poll() {
    let (app, id) = app_with_waiters(0).await;
    for path in [
        format!("/v1/leases/{id}?wait_for=ACTIVE&timeout=1"),
        "/v1/leases/events".to_string(),
    ] {
        let r = app.get(&path).await;
        assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{path}");
        assert_eq!(r.body["error_code"], 503);
    }
    // Already in the status asked: answered at once, no slot needed.
    let r = app.get(&format!("/v1/leases/{id}?wait_for=PENDING")).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(
        app.get(&format!("/v1/leases/{id}")).await.status,
        StatusCode::OK
    );
}

#[tokio::test]
async fn waiters_beyond_the_limit_are_answered_503() {
    let (app, id) = app_with_waiters(1).await;
    let client = app.client.clone();
    let url = format!("{}/v1/leases/{id}?wait_for=ACTIVE&timeout=1", app.base);
    let first = tokio::spawn(async move { client.get(url).send().await.unwrap() });
    until_waiting(&app, 1).await;
    for path in [
        format!("/v1/leases/{id}?wait_for=ACTIVE&timeout=1"),
        "/v1/leases/events".to_string(),
    ] {
        let r = app.get(&path).await;
        assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{path}");
        assert_eq!(r.headers["retry-after"], "1");
        assert_eq!(r.body["error_code"], 503);
    }
    // A plain read is never refused, nor a poll that need not wait, and an unknown
    // lease is a 404 still.
    app.get(&format!("/v1/leases/{id}"))
        .await
        .assert_status(StatusCode::OK);
    let r = app.get(&format!("/v1/leases/{id}?wait_for=PENDING")).await;
    r.assert_status(StatusCode::OK);
    assert_eq!(r.headers["blazar-wait-for"], "PENDING");
    app.get("/v1/leases/3f6a0a52-0000-4000-8000-000000000000?wait_for=ACTIVE")
        .await
        .assert_status(StatusCode::NOT_FOUND);
    assert_eq!(first.await.unwrap().status(), StatusCode::OK);
    until_waiting(&app, 0).await;
    let r = app.get(&format!("/v1/leases/{id}?wait_for=PENDING")).await;
    r.assert_status(StatusCode::OK);
}

/// An open event stream, read event by event.
struct Events {
    response: reqwest::Response,
    buffer: String,
}

impl Events {
    async fn open(app: &TestApp, headers: &[(&str, &str)]) -> Events {
        Events::open_at(app, "", headers).await
    }

    /// A stream of `/v1/leases/events<query>`.
    async fn open_at(app: &TestApp, query: &str, headers: &[(&str, &str)]) -> Events {
        let mut request = app
            .client
            .get(format!("{}/v1/leases/events{query}", app.base));
        for (k, v) in app.as_identity.iter() {
            request = request.header(k, v);
        }
        for (k, v) in headers {
            request = request.header(*k, *v);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.headers()["content-type"], "text/event-stream");
        Events {
            response,
            buffer: String::new(),
        }
    }

    /// The next event's id and data (keep-alive comments skipped).
    async fn next(&mut self) -> (i64, Value) {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                let mut id = None;
                let mut data = None;
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("id:") {
                        id = Some(v.trim().parse().unwrap());
                    } else if let Some(v) = line.strip_prefix("data:") {
                        data = Some(serde_json::from_str(v.trim()).unwrap());
                    }
                }
                if let (Some(id), Some(data)) = (id, data) {
                    return (id, data);
                }
                continue;
            }
            let chunk = tokio::time::timeout(Duration::from_secs(10), self.response.chunk())
                .await
                .expect("an event within 10 s")
                .unwrap()
                .expect("the stream is still open");
            self.buffer.push_str(std::str::from_utf8(&chunk).unwrap());
        }
    }

    /// The next `n` events as (event type, lease id, status).
    async fn take(&mut self, n: usize) -> Vec<(i64, String, String, String)> {
        let mut events = Vec::new();
        for _ in 0..n {
            let (id, data) = self.next().await;
            assert_eq!(data["seq"], id);
            events.push((
                id,
                data["event_type"].as_str().unwrap().to_string(),
                data["lease_id"].as_str().unwrap().to_string(),
                data["status"].as_str().unwrap_or("").to_string(),
            ));
        }
        events
    }
}

#[tokio::test]
async fn the_event_stream_delivers_in_order_resumes_and_keeps_projects_apart() {
    let mut app = TestApp::spawn().await;
    app.create_host("compute-1", json!({})).await;
    app.create_host("compute-2", json!({})).await;
    app.act_as("alpha", "alpha-user", "member");
    let alpha_lease = app
        .post(
            "/v1/leases",
            host_lease_body("a", "2030-01-01 10:00", "2030-01-01 12:00"),
        )
        .await;
    let alpha_lease = alpha_lease.body["lease"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let mut alpha_live = Events::open(&app, &[]).await;
    app.act_as("beta", "beta-user", "member");
    let beta_lease = app
        .post(
            "/v1/leases",
            host_lease_body("b", "2030-01-01 10:00", "2030-01-01 12:00"),
        )
        .await;
    let beta_lease = beta_lease.body["lease"]["id"].as_str().unwrap().to_string();
    app.act_as_admin();
    app.tick_at(t(2030, 1, 1, 10, 0)).await;

    // The admin sees every project's, from the start of the outbox.
    let mut all = Events::open(&app, &[("Last-Event-ID", "0")]).await;
    let events = all.take(4).await;
    let summary: Vec<(&str, &str, &str)> = events
        .iter()
        .map(|(_, kind, lease, status)| (kind.as_str(), lease.as_str(), status.as_str()))
        .collect();
    assert_eq!(
        summary[..2],
        [
            ("lease.create", alpha_lease.as_str(), "PENDING"),
            ("lease.create", beta_lease.as_str(), "PENDING"),
        ]
    );
    let mut starts: Vec<_> = summary[2..].to_vec();
    starts.sort();
    let mut expected = vec![
        ("lease.event.start_lease", alpha_lease.as_str(), "ACTIVE"),
        ("lease.event.start_lease", beta_lease.as_str(), "ACTIVE"),
    ];
    expected.sort();
    assert_eq!(starts, expected);
    assert!(events.windows(2).all(|w| w[0].0 < w[1].0), "{events:?}");
    // An empty `project_id` is no filter, as on the other lists.
    let mut unfiltered = Events::open_at(&app, "?project_id=", &[("Last-Event-ID", "0")]).await;
    assert_eq!(unfiltered.take(4).await, events);

    // Resumed after the first event, the stream goes on with the second.
    let first = events[0].0.to_string();
    let mut resumed = Events::open(&app, &[("Last-Event-ID", &first)]).await;
    assert_eq!(resumed.take(3).await, events[1..].to_vec());

    // Alpha's live stream (opened after its create) has its start only, not beta's events.
    let alpha_events = alpha_live.take(1).await;
    assert_eq!(alpha_events[0].1, "lease.event.start_lease");
    assert_eq!(alpha_events[0].2, alpha_lease);
    // And from the start of the outbox, still only its own.
    app.act_as("alpha", "alpha-user", "member");
    let mut alpha_all = Events::open(&app, &[("Last-Event-ID", "0")]).await;
    let mine = alpha_all.take(2).await;
    assert!(
        mine.iter().all(|(_, _, lease, _)| *lease == alpha_lease),
        "{mine:?}"
    );
    // An id past the last event (kept across a restore of the database) reads on from now.
    let mut beyond = Events::open(&app, &[("Last-Event-ID", "999999")]).await;
    // A new event reaches the open streams at once.
    app.delete(&format!("/v1/leases/{alpha_lease}"))
        .await
        .assert_status(StatusCode::NO_CONTENT);
    let deleted = alpha_all.take(1).await;
    assert_eq!(deleted[0].1, "lease.delete");
    assert_eq!(beyond.take(1).await, deleted);
    for bad in ["x", "-1", "1.5"] {
        let r = app
            .call(
                None,
                Method::GET,
                "/v1/leases/events",
                None,
                &[("Last-Event-ID", bad)],
            )
            .await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{bad}");
    }
}

#[tokio::test]
async fn an_open_event_stream_outlives_the_idle_connection_timeout() {
    let mut app = TestApp::spawn_limited(
        TestDatabase::new().await,
        blazar_service::Settings::default(),
        blazar_server::listener::ConnectionLimits {
            header_read_timeout: Duration::from_millis(300),
            idle_timeout: Duration::from_millis(300),
            ..Default::default()
        },
    )
    .await;
    app.create_host("compute-1", json!({})).await;
    app.act_as("alpha", "alpha-user", "member");
    let mut events = Events::open(&app, &[]).await;
    // Several sweeps of idle connections pass while the stream has nothing to say.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let lease = app
        .post(
            "/v1/leases",
            host_lease_body("a", "2030-01-01 10:00", "2030-01-01 12:00"),
        )
        .await;
    lease.assert_status(StatusCode::CREATED);
    let created = events.take(1).await;
    assert_eq!(created[0].1, "lease.create");
    assert_eq!(created[0].2, lease.body["lease"]["id"].as_str().unwrap());
}

/// Creates committed side by side (on PostgreSQL, in transactions that overlap) each get an
/// event of their own place: ids strictly increase, and a stream resumed after any of them
/// goes on with exactly the events after it, none skipped, none repeated.
#[tokio::test]
async fn events_written_side_by_side_resume_after_any_of_them() {
    const LEASES: usize = 16;
    let app = TestApp::spawn().await;
    for i in 0..LEASES {
        app.create_host(&format!("compute-{i}"), json!({})).await;
    }
    let creates = (0..LEASES).map(|i| {
        app.post(
            "/v1/leases",
            host_lease_body(&format!("l{i}"), "2030-01-01 10:00", "2030-01-01 12:00"),
        )
    });
    for created in futures::future::join_all(creates).await {
        created.assert_status(StatusCode::CREATED);
    }

    let mut all = Events::open(&app, &[("Last-Event-ID", "0")]).await;
    let events = all.take(LEASES).await;
    assert!(events.windows(2).all(|w| w[0].0 < w[1].0), "{events:?}");
    let leases: std::collections::HashSet<&str> = events
        .iter()
        .map(|(_, _, lease, _)| lease.as_str())
        .collect();
    assert_eq!(leases.len(), LEASES, "{events:?}");
    for (k, (id, ..)) in events.iter().enumerate().take(LEASES - 1) {
        let mut resumed = Events::open(&app, &[("Last-Event-ID", &id.to_string())]).await;
        assert_eq!(resumed.take(LEASES - k - 1).await, events[k + 1..].to_vec());
    }
}

/// A member's stream reads on through other projects' events at once: more of them than a
/// batch before the member's own does not make it wait for a poll per batch.
#[tokio::test]
async fn a_members_stream_passes_over_other_projects_events_at_once() {
    let mut app = TestApp::spawn().await;
    app.create_host("compute-1", json!({})).await;
    app.act_as("beta", "beta-user", "member");
    let r = app
        .post(
            "/v1/leases",
            host_lease_body("b", "2030-01-01 10:00", "2030-01-01 12:00"),
        )
        .await;
    let beta = format!("/v1/leases/{}", r.body["lease"]["id"].as_str().unwrap());
    for i in 0..450 {
        app.put(&beta, json!({"name": format!("b{i}")}))
            .await
            .assert_status(StatusCode::OK);
    }
    app.act_as("alpha", "alpha-user", "member");
    app.post(
        "/v1/leases",
        host_lease_body("a", "2030-01-02 10:00", "2030-01-02 12:00"),
    )
    .await
    .assert_status(StatusCode::CREATED);
    let alpha = blazar_service::Identity {
        user_id: "alpha-user".into(),
        project_id: "alpha".into(),
        roles: vec!["member".into()],
    };
    let mut reader = app
        .service
        .lease_events(&alpha, Some(0), None)
        .await
        .unwrap();
    let events = app
        .service
        .next_lease_events(&mut reader, blazar_service::Look::Changed)
        .await
        .unwrap();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].notification.event_type, "lease.create");
    assert_eq!(
        events[0].notification.payload_text("project_id"),
        Some("alpha")
    );
}

/// Streams of one process share its reads of the outbox; events another replica writes
/// reach them by the poll, in order, and several streams of one caller all get them.
#[tokio::test]
async fn event_streams_see_what_another_replica_writes() {
    let app = TestApp::spawn().await;
    let replica = app.replica().await;
    for i in 0..3 {
        app.create_host(&format!("compute-{i}"), json!({})).await;
    }
    let mut streams = Vec::new();
    for _ in 0..3 {
        streams.push(Events::open(&app, &[]).await);
    }
    let mut ids = Vec::new();
    for i in 0..3 {
        let r = replica
            .post(
                "/v1/leases",
                host_lease_body(&format!("r{i}"), "2030-01-01 10:00", "2030-01-01 12:00"),
            )
            .await;
        r.assert_status(StatusCode::CREATED);
        ids.push(r.body["lease"]["id"].as_str().unwrap().to_string());
    }
    for stream in &mut streams {
        let events = stream.take(3).await;
        let leases: Vec<&str> = events.iter().map(|(_, _, l, _)| l.as_str()).collect();
        assert_eq!(leases, ids);
        assert!(events.iter().all(|(_, kind, ..)| kind == "lease.create"));
    }
}
