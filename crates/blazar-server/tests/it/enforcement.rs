//! Usage enforcement as Blazar's: `MaxLeaseDurationFilter`, and `ExternalServiceFilter`
//! against a small accounting service on loopback that records what it is sent and answers
//! as told (allow, refuse with or without a message, fail, or not in time).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response as AxumResponse};
use blazar_server::config::Cli;
use serde_json::{Value, json};

use crate::harness::{TestApp, t};

/// How the accounting service answers one endpoint.
#[derive(Clone)]
enum Answer {
    Allow,
    Refuse(&'static str),
    RefuseWithoutMessage,
    /// A refusal with a message in a body of several megabytes.
    RefuseAtLength,
    Fail,
    Slow(Duration),
}

/// One request the service received.
#[derive(Clone, Debug)]
struct Received {
    endpoint: String,
    token: Option<String>,
    body: Value,
}

#[derive(Clone, Default)]
struct Accounting {
    answers: Arc<Mutex<HashMap<String, Answer>>>,
    received: Arc<Mutex<Vec<Received>>>,
}

impl Accounting {
    fn answer(&self, endpoint: &str, answer: Answer) {
        self.answers
            .lock()
            .unwrap()
            .insert(endpoint.to_string(), answer);
    }

    fn received(&self, endpoint: &str) -> Vec<Received> {
        self.received
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.endpoint == endpoint)
            .cloned()
            .collect()
    }

    fn clear(&self) {
        self.received.lock().unwrap().clear();
    }
}

async fn endpoint(
    State(service): State<Accounting>,
    Path(endpoint): Path<String>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> AxumResponse {
    service.received.lock().unwrap().push(Received {
        endpoint: endpoint.clone(),
        token: headers
            .get("x-auth-token")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string),
        body,
    });
    let answer = service
        .answers
        .lock()
        .unwrap()
        .get(&endpoint)
        .cloned()
        .unwrap_or(Answer::Allow);
    match answer {
        Answer::Allow => StatusCode::NO_CONTENT.into_response(),
        Answer::Refuse(message) => {
            (StatusCode::FORBIDDEN, Json(json!({"message": message}))).into_response()
        }
        Answer::RefuseWithoutMessage => (StatusCode::FORBIDDEN, "no").into_response(),
        Answer::RefuseAtLength => (
            StatusCode::FORBIDDEN,
            Json(json!({"message": "long", "padding": "x".repeat(4 << 20)})),
        )
            .into_response(),
        Answer::Fail => (StatusCode::INTERNAL_SERVER_ERROR, "internal detail").into_response(),
        Answer::Slow(wait) => {
            tokio::time::sleep(wait).await;
            StatusCode::NO_CONTENT.into_response()
        }
    }
}

/// The accounting service on a loopback port; its base URL ends in `/blazar/`.
async fn accounting() -> (Accounting, String) {
    let service = Accounting::default();
    let app = axum::Router::new()
        .route("/blazar/{endpoint}", axum::routing::post(endpoint))
        .with_state(service.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (service, format!("http://{addr}/blazar/"))
}

async fn app_with(set: impl FnOnce(&mut Cli)) -> TestApp {
    TestApp::builder().configure(set).spawn().await
}

/// An app with `ExternalServiceFilter` on a fresh accounting service, a 1 s timeout, and
/// two hosts.
async fn external_app() -> (TestApp, Accounting) {
    let (service, base) = accounting().await;
    let app = app_with(|cli| {
        cli.enabled_filters = vec!["ExternalServiceFilter".into()];
        cli.external_service_base_endpoint = Some(base);
        cli.external_service_token = Some("acct-secret".parse().unwrap());
        cli.external_service_timeout = Some(1.0);
    })
    .await;
    app.create_host("compute-1", json!({"vcpus": 8, "su_factor": "2"}))
        .await;
    app.create_host("compute-2", json!({"vcpus": 8})).await;
    (app, service)
}

fn lease(name: &str, start: &str, end: &str) -> Value {
    json!({
        "name": name, "start_date": start, "end_date": end, "before_end_date": null,
        "events": [],
        "reservations": [{"resource_type": "physical:host", "min": 1, "max": 1,
                          "hypervisor_properties": "",
                          "resource_properties": "[\"=\", \"$su_factor\", \"2\"]"}],
    })
}

async fn lease_count(app: &TestApp) -> usize {
    app.get("/v1/leases").await.body["leases"]
        .as_array()
        .unwrap()
        .len()
}

#[tokio::test]
async fn max_lease_duration_refuses_creates_with_403_and_updates_with_400() {
    let mut app = app_with(|cli| {
        cli.enabled_filters = vec!["MaxLeaseDurationFilter".into()];
        cli.max_lease_duration = Some(86_400);
        cli.max_lease_duration_exempt_project_ids = vec!["friends".into()];
    })
    .await;
    app.create_host("compute-1", json!({"vcpus": 8})).await;

    let too_long = json!({"name": "long", "start_date": "2030-01-01 10:00",
        "end_date": "2030-01-02 10:01", "reservations": [], "events": []});
    let message = "Lease duration of 86460 seconds must be less than or equal to the maximum \
                   lease duration of 86400 seconds.";
    for path in ["/v1/leases", "/v1/leases?dry_run=true"] {
        let r = app.post(path, too_long.clone()).await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{path}: {:?}", r.body);
        assert_eq!(r.body["error_message"], message);
        assert_eq!(r.body["error_code"], 403);
        assert_eq!(
            r.body["reasons"],
            json!([{"filter": "MaxLeaseDurationFilter", "field": "end_date"}])
        );
    }
    assert_eq!(lease_count(&app).await, 0);

    // A day exactly is allowed; extending it past the limit is a 400 and changes nothing.
    let r = app
        .post(
            "/v1/leases",
            json!({"name": "day", "start_date": "2030-01-01 10:00",
                   "end_date": "2030-01-02 10:00", "reservations": [], "events": []}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
    let id = r.body["lease"]["id"].as_str().unwrap().to_string();
    let r = app
        .put(
            &format!("/v1/leases/{id}"),
            json!({"end_date": "2030-01-03 10:00"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{:?}", r.body);
    assert_eq!(
        r.body["error_message"],
        "Lease duration of 172800 seconds must be less than or equal to the maximum lease \
         duration of 86400 seconds."
    );
    assert_eq!(r.body["reasons"][0]["filter"], "MaxLeaseDurationFilter");
    let shown = app.get(&format!("/v1/leases/{id}")).await;
    assert_eq!(
        shown.body["lease"]["end_date"],
        "2030-01-02T10:00:00.000000"
    );
    // A rename is never put to the filters.
    let r = app
        .put(&format!("/v1/leases/{id}"), json!({"name": "renamed"}))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);

    // An exempt project may hold longer leases.
    app.act_as("friends", "friend", "member");
    let r = app.post("/v1/leases", too_long).await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
}

#[tokio::test]
async fn external_service_is_asked_before_a_create_with_blazars_body() {
    let (app, service) = external_app().await;
    let r = app
        .post(
            "/v1/leases",
            lease("charged", "2030-01-01 10:00", "2030-01-01 12:00"),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);

    let asked = service.received("check-create");
    assert_eq!(asked.len(), 1);
    assert_eq!(asked[0].token.as_deref(), Some("acct-secret"));
    let body = &asked[0].body;
    assert_eq!(
        body["context"],
        json!({"user_id": "admin-user", "project_id": "admin-project",
               "auth_url": null, "region_name": null})
    );
    let sent = &body["lease"];
    assert_eq!(sent["name"], "charged");
    assert_eq!(sent["start_date"], "2030-01-01T10:00:00");
    assert_eq!(sent["end_date"], "2030-01-01T12:00:00");
    assert_eq!(sent["status"], "CREATING");
    assert_eq!(sent["project_id"], "admin-project");
    let reservation = &sent["reservations"][0];
    assert_eq!(reservation["resource_type"], "physical:host");
    assert_eq!(reservation["min"], 1);
    // The host it would hold, as Blazar's host plugin gives it: capabilities flattened in.
    let host = &reservation["allocations"][0];
    assert_eq!(host["hypervisor_hostname"], "compute-1");
    assert_eq!(host["su_factor"], "2");
    assert_eq!(host["vcpus"], 8);
    assert_eq!(reservation["allocations"].as_array().unwrap().len(), 1);
    assert!(service.received("on-end").is_empty());
}

#[tokio::test]
async fn external_service_refusals_answer_blazars_400s_and_write_nothing() {
    let (app, service) = external_app().await;
    let generic = "External service enforcement filter denied the request.";
    let rows = [
        (
            Answer::Refuse("Insufficient service units"),
            "Insufficient service units",
        ),
        (Answer::RefuseWithoutMessage, generic),
        // Read up to a bound only: past it the body no longer parses.
        (Answer::RefuseAtLength, generic),
        (Answer::Fail, generic),
    ];
    for (answer, message) in rows {
        service.answer("check-create", answer);
        let r = app
            .post(
                "/v1/leases",
                lease("refused", "2030-01-01 10:00", "2030-01-01 12:00"),
            )
            .await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{message}: {:?}", r.body);
        assert_eq!(r.body["error_message"], message);
        assert_eq!(r.body["error_code"], 400);
        assert_eq!(
            r.body["reasons"],
            json!([{"filter": "ExternalServiceFilter"}])
        );
    }
    assert_eq!(lease_count(&app).await, 0);
    // A refused create is not a lease that ends: nothing to tell.
    app.run_actions().await;
    assert!(service.received("on-end").is_empty());
}

#[tokio::test]
async fn an_external_service_that_does_not_answer_in_time_refuses() {
    let (app, service) = external_app().await;
    service.answer("check-create", Answer::Slow(Duration::from_secs(20)));
    let began = Instant::now();
    let r = app
        .post(
            "/v1/leases",
            lease("slow", "2030-01-01 10:00", "2030-01-01 12:00"),
        )
        .await;
    let took = began.elapsed();
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{:?}", r.body);
    assert_eq!(
        r.body["error_message"],
        "External service enforcement filter denied the request."
    );
    assert!(took < Duration::from_secs(5), "took {took:?}");
    assert_eq!(lease_count(&app).await, 0);
}

#[tokio::test]
async fn a_dry_run_does_not_ask_the_external_service() {
    let (app, service) = external_app().await;
    service.answer("check-create", Answer::Refuse("no"));
    let r = app
        .post(
            "/v1/leases?dry_run=true",
            lease("trial", "2030-01-01 10:00", "2030-01-01 12:00"),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
    assert!(service.received("check-create").is_empty());
    assert_eq!(lease_count(&app).await, 0);
}

/// An `earliest` create is held to the window the filters were asked about: when that
/// window is taken while they decide, it is never booked at other dates nobody asked them
/// about; it searches again and asks them about the next window.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_earliest_create_books_only_the_window_the_filters_allowed() {
    let (app, service) = external_app().await;
    let r = app
        .post(
            "/v1/leases",
            lease("other", "2030-01-01 03:00", "2030-01-01 04:00"),
        )
        .await;
    let other = format!("/v1/leases/{}", r.body["lease"]["id"].as_str().unwrap());
    service.answer("check-create", Answer::Slow(Duration::from_millis(600)));
    let mut earliest = lease("e", "earliest", "");
    earliest["duration"] = json!(60);
    earliest["not_before"] = json!("2030-01-01 00:00");
    earliest.as_object_mut().unwrap().remove("end_date");
    let (created, moved) = tokio::join!(app.post("/v1/leases", earliest), async {
        // While the filters think: the other lease moves into the first free hour.
        tokio::time::sleep(Duration::from_millis(200)).await;
        app.put(
            &other,
            json!({"start_date": "2030-01-01 00:00", "end_date": "2030-01-01 01:00"}),
        )
        .await
    });
    moved.assert_status(StatusCode::OK);
    let asked = service.received("check-create");
    // After the other lease's own create.
    let starts: Vec<&Value> = asked
        .iter()
        .skip(1)
        .map(|a| &a.body["lease"]["start_date"])
        .collect();
    assert_eq!(
        starts,
        [&json!("2030-01-01T00:00:00"), &json!("2030-01-01T01:00:00")],
        "the first window, then the next one once the first was taken"
    );
    created.assert_status(StatusCode::CREATED);
    assert_eq!(
        created.body["lease"]["start_date"],
        "2030-01-01T01:00:00.000000"
    );
}

/// The filters allow an update of the lease as a trial read it; when the lease changes
/// before the update is written, they are asked again about the lease as it is then.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_update_is_put_to_the_filters_again_when_the_lease_changed_meanwhile() {
    let (app, service) = external_app().await;
    let r = app
        .post(
            "/v1/leases",
            lease("grow", "2030-01-01 10:00", "2030-01-01 12:00"),
        )
        .await;
    let id = r.body["lease"]["id"].as_str().unwrap().to_string();
    let path = format!("/v1/leases/{id}");
    service.answer("check-update", Answer::Slow(Duration::from_millis(600)));
    let (prolonged, renamed) = tokio::join!(
        app.put(&path, json!({"end_date": "2030-01-01 14:00"})),
        async {
            // While the filters think about the first trial.
            tokio::time::sleep(Duration::from_millis(200)).await;
            app.put(&path, json!({"name": "renamed"})).await
        }
    );
    renamed.assert_status(StatusCode::OK);
    prolonged.assert_status(StatusCode::OK);
    let asked = service.received("check-update");
    assert_eq!(asked.len(), 2, "{asked:?}");
    assert_eq!(prolonged.body["lease"]["name"], "renamed");
    assert_eq!(
        prolonged.body["lease"]["end_date"],
        "2030-01-01T14:00:00.000000"
    );
}

#[tokio::test]
async fn updates_send_the_current_and_the_new_lease() {
    let (app, service) = external_app().await;
    let r = app
        .post(
            "/v1/leases",
            lease("grow", "2030-01-01 10:00", "2030-01-01 12:00"),
        )
        .await;
    let id = r.body["lease"]["id"].as_str().unwrap().to_string();
    let reservation_id = r.body["lease"]["reservations"][0]["id"]
        .as_str()
        .unwrap()
        .to_string();

    service.answer(
        "check-update",
        Answer::Refuse("Not enough service units to extend"),
    );
    let r = app
        .put(
            &format!("/v1/leases/{id}"),
            json!({"end_date": "2030-01-01 14:00"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{:?}", r.body);
    assert_eq!(
        r.body["error_message"],
        "Not enough service units to extend"
    );
    let shown = app.get(&format!("/v1/leases/{id}")).await;
    assert_eq!(
        shown.body["lease"]["end_date"],
        "2030-01-01T12:00:00.000000"
    );

    let asked = service.received("check-update");
    assert_eq!(asked.len(), 1);
    let body = &asked[0].body;
    assert_eq!(asked[0].token.as_deref(), Some("acct-secret"));
    assert_eq!(body["context"]["project_id"], "admin-project");
    let current = &body["current_lease"];
    assert_eq!(current["id"], id.as_str());
    assert_eq!(current["end_date"], "2030-01-01T12:00:00");
    assert_eq!(current["reservations"][0]["id"], reservation_id.as_str());
    assert_eq!(
        current["reservations"][0]["allocations"][0]["hypervisor_hostname"],
        "compute-1"
    );
    let new = &body["lease"];
    assert_eq!(new["start_date"], "2030-01-01T10:00:00");
    assert_eq!(new["end_date"], "2030-01-01T14:00:00");
    assert_eq!(
        new["reservations"][0]["allocations"][0]["hypervisor_hostname"],
        "compute-1"
    );

    service.answer("check-update", Answer::Allow);
    let r = app
        .put(
            &format!("/v1/leases/{id}"),
            json!({"end_date": "2030-01-01 14:00"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    assert_eq!(r.body["lease"]["end_date"], "2030-01-01T14:00:00.000000");
}

#[tokio::test]
async fn on_end_is_told_after_the_end_and_after_an_early_delete_only() {
    let (app, service) = external_app().await;
    // An end: told once, with the lease as it ended and what it held.
    let r = app
        .post(
            "/v1/leases",
            lease("ends", "2030-01-01 10:00", "2030-01-01 12:00"),
        )
        .await;
    let ended = r.body["lease"]["id"].as_str().unwrap().to_string();
    app.tick_at(t(2030, 1, 1, 10, 0)).await;
    assert!(service.received("on-end").is_empty());
    app.tick_at(t(2030, 1, 1, 12, 0)).await;
    let told = service.received("on-end");
    assert_eq!(told.len(), 1, "{told:?}");
    assert_eq!(told[0].token.as_deref(), Some("acct-secret"));
    assert_eq!(told[0].body["lease"]["id"], ended.as_str());
    assert_eq!(told[0].body["lease"]["end_date"], "2030-01-01T12:00:00");
    assert_eq!(
        told[0].body["lease"]["reservations"][0]["allocations"][0]["hypervisor_hostname"],
        "compute-1"
    );
    assert_eq!(told[0].body["context"]["project_id"], "admin-project");
    let shown = app.get(&format!("/v1/leases/{ended}")).await;
    assert_eq!(shown.body["lease"]["status"], "TERMINATED");
    // Deleting the terminated lease tells nothing more.
    service.clear();
    app.delete(&format!("/v1/leases/{ended}")).await;
    assert!(service.received("on-end").is_empty());

    // An early delete of a lease that never started: told.
    let r = app
        .post(
            "/v1/leases",
            lease("gone", "2030-01-02 10:00", "2030-01-02 12:00"),
        )
        .await;
    let gone = r.body["lease"]["id"].as_str().unwrap().to_string();
    let r = app.delete(&format!("/v1/leases/{gone}")).await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    let told = service.received("on-end");
    assert_eq!(told.len(), 1);
    assert_eq!(told[0].body["lease"]["id"], gone.as_str());
    assert_eq!(told[0].body["lease"]["status"], "PENDING");
}

#[tokio::test]
async fn a_failing_on_end_never_holds_up_the_lease_end() {
    let (app, service) = external_app().await;
    service.answer("on-end", Answer::Fail);
    let r = app
        .post(
            "/v1/leases",
            lease("ends", "2030-01-01 10:00", "2030-01-01 12:00"),
        )
        .await;
    let id = r.body["lease"]["id"].as_str().unwrap().to_string();
    app.tick_at(t(2030, 1, 1, 10, 0)).await;
    app.tick_at(t(2030, 1, 1, 12, 0)).await;
    assert_eq!(service.received("on-end").len(), 1);
    let shown = app.get(&format!("/v1/leases/{id}")).await;
    assert_eq!(shown.body["lease"]["status"], "TERMINATED");
    // It is tried again later (a 5xx is transient), and succeeds once the service is back.
    let actions = app.get(&format!("/v1/leases/{id}/actions")).await;
    let on_end = actions.body["actions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["kind"] == "on_end")
        .cloned()
        .unwrap();
    assert_eq!(on_end["status"], "pending", "{on_end:?}");
    service.answer("on-end", Answer::Allow);
    app.set_time(t(2030, 1, 1, 12, 10));
    app.run_actions().await;
    assert_eq!(service.received("on-end").len(), 2);
}

#[tokio::test]
async fn unknown_filters_and_bad_endpoints_stop_the_start() {
    use blazar_server::config::Config;
    let bad = |set: fn(&mut Cli)| {
        let mut cli = Cli::default();
        set(&mut cli);
        Config::resolve(cli).and_then(|c| c.usage_enforcement().map(|_| ()))
    };
    let err = bad(|c| c.enabled_filters = vec!["QuotaFilter".into()]).unwrap_err();
    assert!(err.to_string().contains("QuotaFilter"), "{err}");
    let err = bad(|c| c.enabled_filters = vec!["ExternalServiceFilter".into()]).unwrap_err();
    assert!(err.to_string().contains("no endpoints"), "{err}");
    let err = bad(|c| {
        c.enabled_filters = vec!["ExternalServiceFilter".into()];
        c.external_service_base_endpoint = Some("ftp://acct/".into());
    })
    .unwrap_err();
    assert!(err.to_string().contains("http(s)"), "{err}");
}

/// The notifications of refusals (`*.refused`), in order, read as an admin; the app acts
/// as alpha's member again afterwards.
async fn refusal_notifications(app: &mut TestApp) -> Vec<Value> {
    app.act_as_admin();
    let notes = app.get("/v1/notifications").await.body["notifications"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["event_type"].as_str().unwrap().ends_with(".refused"))
        .cloned()
        .collect();
    app.act_as("alpha", "ada", "member");
    notes
}

/// What enforcement and quotas turn away is announced too (`lease.create.refused`,
/// `lease.update.refused`: ours), with the filter or quota that refused; a dry run, or a
/// refusal for any other reason, announces nothing.
#[tokio::test]
async fn refusals_by_filters_and_quotas_are_notified() {
    let mut app = app_with(|cli| {
        cli.enabled_filters = vec!["MaxLeaseDurationFilter".into()];
        cli.max_lease_duration = Some(86_400);
        cli.quota_hosts = Some(1);
    })
    .await;
    for name in ["compute-1", "compute-2"] {
        app.create_host(name, json!({})).await;
    }
    app.act_as("alpha", "ada", "member");
    let hosts = |n: i64| {
        json!([{"resource_type": "physical:host", "min": n, "max": n,
                "hypervisor_properties": "", "resource_properties": ""}])
    };
    let body = |name: &str, end: &str, n: i64| {
        json!({"name": name, "start_date": "2030-01-01 10:00", "end_date": end,
               "reservations": hosts(n), "events": []})
    };
    let r = app
        .post(
            "/v1/leases?dry_run=true",
            body("long", "2030-01-03 10:00", 1),
        )
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.body);
    let r = app
        .post("/v1/leases", body("too-many", "2030-01-01 12:00", 3))
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.body);
    assert!(
        refusal_notifications(&mut app).await.is_empty(),
        "a dry run or a shortfall is not announced"
    );

    let r = app
        .post("/v1/leases", body("long", "2030-01-03 10:00", 1))
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.body);
    let r = app
        .post("/v1/leases", body("two", "2030-01-01 12:00", 2))
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.body);
    let r = app
        .post("/v1/leases", body("one", "2030-01-01 12:00", 1))
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let id = r.body["lease"]["id"].as_str().unwrap().to_string();
    let r = app
        .put(
            &format!("/v1/leases/{id}"),
            json!({"end_date": "2030-01-05 10:00"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);

    let notes = refusal_notifications(&mut app).await;
    let kinds: Vec<&str> = notes
        .iter()
        .map(|n| n["event_type"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        [
            "lease.create.refused",
            "lease.create.refused",
            "lease.update.refused"
        ]
    );
    let payload = |i: usize| notes[i]["payload"].clone();
    assert_eq!(payload(0)["filters"], json!(["MaxLeaseDurationFilter"]));
    assert_eq!(payload(0)["lease_name"], "long");
    assert_eq!(payload(0)["lease_id"], Value::Null);
    assert_eq!(payload(0)["project_id"], "alpha");
    assert_eq!(payload(0)["user_id"], "ada");
    assert!(
        payload(0)["message"]
            .as_str()
            .unwrap()
            .contains("maximum lease duration")
    );
    assert_eq!(payload(1)["quotas"][0]["name"], "hosts");
    assert_eq!(payload(1)["quotas"][0]["limit"], 1);
    assert_eq!(payload(1)["filters"], json!([]));
    assert_eq!(payload(2)["lease_id"], id.as_str());
    assert_eq!(payload(2)["filters"], json!(["MaxLeaseDurationFilter"]));

    // An admin refused an update of alpha's lease: filed under alpha, whose webhooks and
    // streams hear of it, with the admin as the user who asked.
    app.act_as_admin();
    let r = app
        .put(
            &format!("/v1/leases/{id}"),
            json!({"end_date": "2030-01-06 10:00"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
    let notes = refusal_notifications(&mut app).await;
    let last = &notes.last().unwrap()["payload"];
    assert_eq!(last["project_id"], "alpha");
    assert_eq!(last["user_id"], "admin-user");
}

/// Offers are what a create would be granted: a request whose shortest lease the maximum
/// duration refuses is refused as its create would be, and no offer is longer than it.
#[tokio::test]
async fn offers_keep_to_the_maximum_lease_duration() {
    let app = app_with(|cli| {
        cli.enabled_filters = vec!["MaxLeaseDurationFilter".into()];
        cli.max_lease_duration = Some(86_400);
    })
    .await;
    app.create_host("compute-1", json!({})).await;
    let hosts = json!([{"resource_type": "physical:host", "min": 1, "max": 1,
                        "hypervisor_properties": "", "resource_properties": ""}]);
    let r = app
        .post(
            "/v1/leases/offers",
            json!({"reservations": hosts, "duration": 2880}),
        )
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.body);
    assert_eq!(
        r.body["reasons"],
        json!([{"filter": "MaxLeaseDurationFilter", "field": "end_date"}])
    );
    let r = app
        .post(
            "/v1/leases/offers",
            json!({"reservations": hosts, "min_duration": 60, "max_duration": 2880,
                   "order": "longest", "limit": 3}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let offers = r.body["offers"].as_array().unwrap();
    assert!(!offers.is_empty(), "{}", r.body);
    for offer in offers {
        let start = chrono::NaiveDateTime::parse_from_str(
            offer["start_date"].as_str().unwrap(),
            "%Y-%m-%dT%H:%M:%S%.f",
        )
        .unwrap();
        let end = chrono::NaiveDateTime::parse_from_str(
            offer["end_date"].as_str().unwrap(),
            "%Y-%m-%dT%H:%M:%S%.f",
        )
        .unwrap();
        assert_eq!(end - start, chrono::Duration::days(1), "{offer}");
    }
}

/// The start dates of leases all created (201), in order.
fn created_starts(responses: Vec<crate::harness::Response>) -> Vec<String> {
    let mut starts: Vec<String> = responses
        .iter()
        .map(|r| {
            assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
            r.body["lease"]["start_date"].as_str().unwrap().to_string()
        })
        .collect();
    starts.sort();
    starts
}

/// With a usage filter on, an `earliest` create is held to the window the filter was asked
/// about; one that loses that window to a concurrent create searches and asks again, so
/// concurrent `earliest` creates still all get windows, one after another.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_earliest_creates_under_a_filter_all_get_windows() {
    let app = app_with(|cli| {
        cli.enabled_filters = vec!["MaxLeaseDurationFilter".into()];
        cli.max_lease_duration = Some(86_400);
    })
    .await;
    app.create_host("only", json!({})).await;
    let requests = (0..24).map(|i| {
        app.post(
            "/v1/leases",
            json!({"name": format!("e{i}"), "start_date": "earliest", "duration": 45,
                   "not_before": "2030-01-01 10:00",
                   "reservations": [{"resource_type": "physical:host", "min": 1, "max": 1,
                                     "hypervisor_properties": "", "resource_properties": ""}]}),
        )
    });
    let mut starts = created_starts(futures::future::join_all(requests).await);
    starts.dedup();
    assert_eq!(starts.len(), 24, "{starts:?}");
}

/// The same under a project quota: concurrent `earliest` creates of one project each lose
/// the window another took to the quota rather than to the host, and search again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_earliest_creates_under_a_filter_and_a_quota_all_get_windows() {
    let mut app = app_with(|cli| {
        cli.enabled_filters = vec!["MaxLeaseDurationFilter".into()];
        cli.max_lease_duration = Some(86_400);
        cli.quota_hosts = Some(1);
    })
    .await;
    for name in ["h1", "h2", "h3"] {
        app.create_host(name, json!({})).await;
    }
    app.act_as("alpha", "ada", "member");
    let requests = (0..4).map(|i| {
        app.post(
            "/v1/leases",
            json!({"name": format!("e{i}"), "start_date": "earliest", "duration": 60,
                   "not_before": "2030-01-01 10:00",
                   "reservations": [{"resource_type": "physical:host", "min": 1, "max": 1,
                                     "hypervisor_properties": "", "resource_properties": ""}]}),
        )
    });
    let starts = created_starts(futures::future::join_all(requests).await);
    assert_eq!(
        starts,
        [
            "2030-01-01T10:00:00.000000",
            "2030-01-01T11:00:00.000000",
            "2030-01-01T12:00:00.000000",
            "2030-01-01T13:00:00.000000"
        ],
        "one host at a time for the project, so one lease an hour"
    );
}
