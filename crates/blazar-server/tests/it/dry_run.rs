//! `?dry_run=true` on lease create and update (the same answer, nothing written), and the
//! `reasons` a refused create or update carries beside Blazar's message.

use blazar_core::LeaseFilter;
use blazar_server::auth::Auth;
use blazar_server::policy::Policy;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::harness::{Response, TestApp, t};
use crate::matrix::AuthApp;

async fn three_hosts(app: &TestApp) -> Vec<String> {
    let mut ids = Vec::new();
    for name in ["compute-1", "compute-2", "compute-3"] {
        ids.push(app.create_host(name, json!({"vcpus": 8})).await);
    }
    ids
}

fn hosts_request(name: &str, start: &str, end: &str, reservations: &[(i64, i64)]) -> Value {
    let reservations: Vec<Value> = reservations
        .iter()
        .map(|(min, max)| {
            json!({"resource_type": "physical:host", "min": min, "max": max,
                   "hypervisor_properties": "", "resource_properties": ""})
        })
        .collect();
    json!({"name": name, "start_date": start, "end_date": end, "before_end_date": null,
           "events": [], "reservations": reservations})
}

/// The resources a dry run's body says each reservation would be granted, in order.
fn granted(lease: &Value) -> Vec<Vec<String>> {
    lease["reservations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let mut ids: Vec<String> = r["allocations"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| a["resource_id"].as_str().unwrap().to_string())
                .collect();
            ids.sort();
            ids
        })
        .collect()
}

/// What the database holds that a lease write could change, as the API shows it.
async fn everything(app: &TestApp) -> Value {
    let mut all = serde_json::Map::new();
    for path in [
        "/v1/leases",
        "/v1/os-hosts/allocations",
        "/v1/notifications",
        "/v1/handovers",
    ] {
        let r = app.get(path).await;
        r.assert_status(StatusCode::OK);
        all.insert(path.to_string(), r.body);
    }
    Value::Object(all)
}

async fn revisions(app: &TestApp) -> Vec<(String, i64)> {
    let mut tx = app.store().read().await.unwrap();
    let revisions = tx.lease_revisions(&LeaseFilter::default()).await.unwrap();
    // Ended now: a transaction left open would hold the test database past the test.
    tx.commit().await.unwrap();
    revisions
}

/// The lease minus what differs between two creates of the same request.
fn comparable(lease: &Value) -> Value {
    let mut lease = lease.clone();
    let object = lease.as_object_mut().unwrap();
    for key in ["id", "trust_id"] {
        object.remove(key);
    }
    for list in ["reservations", "events"] {
        for item in object[list].as_array_mut().unwrap() {
            let item = item.as_object_mut().unwrap();
            for key in ["id", "lease_id", "resource_id", "allocations"] {
                item.remove(key);
            }
        }
    }
    lease
}

#[tokio::test]
async fn a_dry_run_create_answers_as_the_create_would_and_writes_nothing() {
    let app = TestApp::spawn().await;
    three_hosts(&app).await;
    let before = everything(&app).await;
    let request = hosts_request(
        "trial",
        "2030-01-01 10:00",
        "2030-01-01 12:00",
        &[(1, 1), (2, 2)],
    );

    let dry = app.post("/v1/leases?dry_run=true", request.clone()).await;
    dry.assert_status(StatusCode::CREATED);
    let would = dry.body["lease"].clone();
    assert_eq!(would["name"], "trial");
    assert_eq!(would["status"], "PENDING");
    assert_eq!(would["start_date"], "2030-01-01T10:00:00.000000");
    assert_eq!(would["end_date"], "2030-01-01T12:00:00.000000");
    assert!(would["id"].as_str().is_some_and(|id| id.len() == 36));
    let grants = granted(&would);
    assert_eq!(grants.iter().map(Vec::len).collect::<Vec<_>>(), [1, 2]);
    let alloc = &would["reservations"][1]["allocations"][0];
    assert_eq!(alloc["resource_type"], "physical:host");
    assert_eq!(alloc["start_date"], "2030-01-01T10:00:00.000000");
    assert_eq!(alloc["end_date"], "2030-01-01T12:00:00.000000");

    // Nothing was written, and nothing is due: no lease, allocation, notification or
    // hand-over, no event for the scheduler, no action for the workers.
    assert_eq!(everything(&app).await, before);
    assert_eq!(app.tick_at(t(2030, 1, 1, 10, 0)).await.executed, 0);
    assert_eq!(app.run_actions().await.done, 0);
    assert_eq!(everything(&app).await, before);
    app.set_time(t(2029, 12, 31, 8, 0));

    // The real create of the same request gets the same answer and the same hosts.
    let real = app.post("/v1/leases", request).await;
    real.assert_status(StatusCode::CREATED);
    let lease = &real.body["lease"];
    assert_eq!(comparable(lease), comparable(&would));
    let id = lease["id"].as_str().unwrap();
    let shown = app.get(&format!("/v1/leases/{id}?allocations=true")).await;
    assert_eq!(granted(&shown.body["lease"]), grants);
}

#[tokio::test]
async fn a_refused_dry_run_create_is_the_same_refusal_and_writes_nothing() {
    let app = TestApp::spawn().await;
    three_hosts(&app).await;
    let before = everything(&app).await;
    // The first reservation fits; the second does not: nothing of either may stay.
    let request = hosts_request(
        "too-big",
        "2030-01-01 10:00",
        "2030-01-01 12:00",
        &[(1, 1), (3, 3)],
    );
    let dry = app.post("/v1/leases?dry_run=1", request.clone()).await;
    dry.assert_status(StatusCode::CONFLICT);
    assert_eq!(everything(&app).await, before);
    let real = app.post("/v1/leases", request).await;
    assert_eq!(real.status, dry.status);
    assert_eq!(real.body, dry.body);
    assert_eq!(
        dry.body,
        json!({
            "error_code": 409,
            "error_message": "Not enough hosts available for reservation 2 (physical:host, min \
                3): 3 host(s) match the filters and are reservable, 2 of them free from \
                2030-01-01 10:00 to 2030-01-01 12:00",
            "error_name": 409,
            "reasons": [{
                "reservation": 2,
                "resource_type": "physical:host",
                "requested": {"min": 3, "max": 3},
                "matching": 3,
                "free": 2,
                "start_date": "2030-01-01T10:00:00.000000",
                "end_date": "2030-01-01T12:00:00.000000",
                // Four hosts together never fit in three: no next offer.
                "next_offer": null,
            }],
        })
    );
    assert_eq!(everything(&app).await, before);
    assert_eq!(app.tick_at(t(2030, 1, 1, 10, 0)).await.executed, 0);
}

#[tokio::test]
async fn a_dry_run_update_leaves_the_lease_as_it_was() {
    let app = TestApp::spawn().await;
    three_hosts(&app).await;
    let r = app
        .post(
            "/v1/leases",
            hosts_request("first", "2030-01-01 10:00", "2030-01-01 12:00", &[(3, 3)]),
        )
        .await;
    r.assert_status(StatusCode::CREATED);
    let id = r.body["lease"]["id"].as_str().unwrap().to_string();
    let reservation = r.body["lease"]["reservations"][0]["id"].clone();
    app.post(
        "/v1/leases",
        hosts_request("next", "2030-01-01 13:00", "2030-01-01 15:00", &[(1, 1)]),
    )
    .await
    .assert_status(StatusCode::CREATED);
    // A real update now would stamp 09:00.
    app.set_time(t(2029, 12, 31, 9, 0));
    let path = format!("/v1/leases/{id}");
    let shown = app.get(&path).await.body;
    let before = everything(&app).await;
    let revisions_before = revisions(&app).await;

    // Into the other lease's hours: the refusal names the reservation by id.
    let busy = app
        .put(
            &format!("{path}?dry_run=true"),
            json!({"end_date": "2030-01-01 14:00"}),
        )
        .await;
    busy.assert_status(StatusCode::CONFLICT);
    assert_eq!(
        busy.body["reasons"],
        json!([{
            "reservation": reservation,
            "resource_type": "physical:host",
            "requested": {"min": 3, "max": 3},
            "matching": 3,
            "free": 2,
            "start_date": "2030-01-01T10:00:00.000000",
            "end_date": "2030-01-01T14:00:00.000000",
            // Where the four hours would fit, the lease's own hours not counting.
            "next_offer": {"start_date": "2030-01-01T15:00:00.000000",
                           "end_date": "2030-01-01T19:00:00.000000"},
        }])
    );
    let real = app
        .put(&path, json!({"end_date": "2030-01-01 14:00"}))
        .await;
    assert_eq!(real.body, busy.body, "the real update is refused alike");

    // Into free time: the would-be lease, with its new end and what it would hold.
    let free = app
        .put(
            &format!("{path}?dry_run=yes"),
            json!({"end_date": "2030-01-01 12:30"}),
        )
        .await;
    free.assert_status(StatusCode::OK);
    let would = &free.body["lease"];
    assert_eq!(would["end_date"], "2030-01-01T12:30:00.000000");
    assert_eq!(would["updated_at"], "2029-12-31 09:00:00");
    // As a real update answers: from inside its status transition.
    assert_eq!(would["status"], "UPDATING");
    assert_eq!(
        would["reservations"][0]["allocations"][0]["end_date"],
        "2030-01-01T12:30:00.000000"
    );
    assert_eq!(granted(would)[0].len(), 3);

    assert_eq!(app.get(&path).await.body, shown);
    assert_eq!(everything(&app).await, before);
    assert_eq!(revisions(&app).await, revisions_before);
}

#[tokio::test]
async fn a_dry_run_is_refused_by_policy_as_the_call_would_be() {
    let mut app = TestApp::spawn().await;
    three_hosts(&app).await;
    let owned = app
        .post(
            "/v1/leases",
            hosts_request("admins", "2030-01-01 10:00", "2030-01-01 12:00", &[(1, 1)]),
        )
        .await;
    let id = owned.body["lease"]["id"].as_str().unwrap().to_string();
    let request = hosts_request("r", "2030-01-01 10:00", "2030-01-01 12:00", &[(1, 1)]);

    app.act_as("alpha", "alice", "reader");
    let r = app.post("/v1/leases?dry_run=true", request.clone()).await;
    r.assert_denied("blazar:leases:post");
    assert_eq!(r.body["reasons"], json!([{"rule": "blazar:leases:post"}]));

    app.act_as("alpha", "alice", "member");
    let r = app
        .put(
            &format!("/v1/leases/{id}?dry_run=true"),
            json!({"name": "mine"}),
        )
        .await;
    r.assert_denied("blazar:leases:get");
    assert_eq!(r.body["reasons"], json!([{"rule": "blazar:leases:get"}]));
}

/// A dry run asked of a change that has none is refused, never carried out.
#[tokio::test]
async fn a_dry_run_of_another_change_is_refused_and_changes_nothing() {
    let app = TestApp::spawn().await;
    let hosts = three_hosts(&app).await;
    let r = app
        .post(
            "/v1/leases",
            hosts_request("a", "2030-01-01 10:00", "2030-01-01 12:00", &[(1, 1)]),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let lease = r.body["lease"]["id"].as_str().unwrap().to_string();
    let before = everything(&app).await;
    let host = &hosts[0];
    let changes = [
        app.delete(&format!("/v1/leases/{lease}?dry_run=true"))
            .await,
        app.delete(&format!("/v1/os-hosts/{}?dry_run=false", hosts[2]))
            .await,
        app.put(
            &format!("/v1/os-hosts/{host}?dry_run=true"),
            json!({"gpu": "true"}),
        )
        .await,
        app.put("/v1/quotas/p1?dry_run=true", json!({"hosts": 1}))
            .await,
        app.post(
            "/v1/os-hosts.json?dry_run=true",
            json!({"name": "compute-9"}),
        )
        .await,
    ];
    for r in changes {
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
        assert!(r.message().contains("dry_run"), "{}", r.message());
    }
    assert_eq!(everything(&app).await, before);
    let listed = app.get("/v1/os-hosts").await.body["hosts"].clone();
    assert_eq!(listed.as_array().unwrap().len(), 3, "{listed}");
    assert!(
        listed
            .as_array()
            .unwrap()
            .iter()
            .all(|h| h.get("gpu").is_none())
    );
    let quota = app.get("/v1/quotas/p1").await;
    assert_eq!(quota.status, StatusCode::OK, "{}", quota.body);
    assert_eq!(
        quota.body["quota"]["overrides"],
        json!({}),
        "{}",
        quota.body
    );
    // Lease creates and updates take it; offers and reads are not changes.
    let r = app
        .put(
            &format!("/v1/leases/{lease}?dry_run=true"),
            json!({"name": "b"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let r = app
        .post(
            "/v1/leases/offers?dry_run=true",
            json!({"reservations": [{"resource_type": "physical:host", "min": 1, "max": 1,
                   "hypervisor_properties": "", "resource_properties": ""}],
                   "duration": 60}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let r = app.get(&format!("/v1/leases/{lease}?dry_run=true")).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
}

#[tokio::test]
async fn bad_dry_run_values_are_refused() {
    let app = TestApp::spawn().await;
    three_hosts(&app).await;
    let request = hosts_request("r", "2030-01-01 10:00", "2030-01-01 12:00", &[(1, 1)]);
    for value in ["maybe", "", "2", "truee"] {
        let r = app
            .post(&format!("/v1/leases?dry_run={value}"), request.clone())
            .await;
        r.assert_status(StatusCode::BAD_REQUEST);
        assert_eq!(
            r.message(),
            format!("Invalid value {value:?} for dry_run: use true or false")
        );
        assert_eq!(r.body["reasons"], json!([{"field": "dry_run"}]));
    }
    assert_eq!(app.get("/v1/leases").await.body, json!({"leases": []}));
    // An explicit false is the real call.
    let r = app.post("/v1/leases?dry_run=False", request).await;
    r.assert_status(StatusCode::CREATED);
    assert!(
        r.body["lease"]["reservations"][0]
            .get("allocations")
            .is_none()
    );
    assert_eq!(app.get("/v1/leases").await.body["leases"][0]["name"], "r");
}

#[tokio::test]
async fn other_refusals_of_a_create_or_update_carry_reasons_too() {
    let app = TestApp::spawn().await;
    three_hosts(&app).await;
    let cases: [(Value, Value); 3] = [
        (
            hosts_request("r", "2030-01-01 12:00", "2030-01-01 10:00", &[(1, 1)]),
            json!([{"field": "end_date"}]),
        ),
        (
            hosts_request("", "2030-01-01 10:00", "2030-01-01 12:00", &[(1, 1)]),
            json!([{"field": "name"}]),
        ),
        (
            hosts_request("r", "2030-01-01 10:00", "2030-01-01 12:00", &[(2, 1)]),
            json!([{"reservation": 1, "resource_type": "physical:host"}]),
        ),
    ];
    for (request, reasons) in cases {
        for path in ["/v1/leases", "/v1/leases?dry_run=true"] {
            let r = app.post(path, request.clone()).await;
            r.assert_status(StatusCode::BAD_REQUEST);
            assert_eq!(r.body["reasons"], reasons, "{request}");
        }
    }
    // Errors of other calls keep Blazar's body exactly.
    let r = app.get("/v1/leases/nope").await;
    assert_eq!(r.body.as_object().unwrap().len(), 3, "{}", r.body);
}

const ALPHA_MEMBER: &[(&str, &str)] = &[
    ("X-Project-Id", "alpha"),
    ("X-User-Id", "alice"),
    ("X-Roles", "member"),
];
const BETA_MEMBER: &[(&str, &str)] = &[
    ("X-Project-Id", "beta"),
    ("X-User-Id", "bob"),
    ("X-Roles", "member"),
];

async fn call(
    app: &AuthApp,
    method: Method,
    path: &str,
    body: Value,
    who: &[(&str, &str)],
) -> Response {
    app.call(None, method, path, Some(body), who).await
}

/// Two hosts with a private property; project beta holds both, and an address.
async fn busy_cloud(policy: Policy) -> (AuthApp, Vec<String>) {
    let app = AuthApp::spawn(|_| Auth::noauth("admin-project", "admin-user"), policy).await;
    for (path, body) in [
        ("/v1/os-hosts", json!({"name": "h1", "secret_rack": "r1"})),
        ("/v1/os-hosts", json!({"name": "h2", "secret_rack": "r2"})),
        (
            "/v1/floatingips",
            json!({"floating_network_id": "net-1", "floating_ip_address": "10.0.0.5"}),
        ),
    ] {
        let r = call(&app, Method::POST, path, body, &[]).await;
        r.assert_status(StatusCode::CREATED);
    }
    let r = call(
        &app,
        Method::PATCH,
        "/v1/os-hosts/properties/secret_rack",
        json!({"private": true}),
        &[],
    )
    .await;
    r.assert_status(StatusCode::OK);
    let mut secrets = Vec::new();
    for body in [
        hosts_request(
            "beta-secret-hosts",
            "2030-01-01 10:00",
            "2030-01-01 12:00",
            &[(2, 2)],
        ),
        json!({"name": "beta-secret-address", "start_date": "2030-01-01 10:00",
               "end_date": "2030-01-01 12:00",
               "reservations": [{"resource_type": "virtual:floatingip", "network_id": "net-1",
                                 "amount": 1, "required_floatingips": ["10.0.0.5"]}]}),
    ] {
        let r = call(&app, Method::POST, "/v1/leases", body, BETA_MEMBER).await;
        r.assert_status(StatusCode::CREATED);
        secrets.push(r.body["lease"]["id"].as_str().unwrap().to_string());
        secrets.push(r.body["lease"]["name"].as_str().unwrap().to_string());
    }
    (app, secrets)
}

fn private_hosts(query: &str) -> Value {
    json!({"name": "l", "start_date": "2030-01-01 11:00", "end_date": "2030-01-01 13:00",
           "reservations": [{"resource_type": "physical:host", "min": 1, "max": 1,
                             "hypervisor_properties": "", "resource_properties": query}]})
}

#[tokio::test]
async fn reasons_hide_counts_when_they_may_not_be_told_and_never_name_other_projects() {
    let private_query = r#"["==", "$secret_rack", "r1"]"#;
    let address = json!({"name": "a", "start_date": "2030-01-01 11:00",
        "end_date": "2030-01-01 13:00",
        "reservations": [{"resource_type": "virtual:floatingip", "network_id": "net-1",
                          "amount": 1, "required_floatingips": ["10.0.0.5"]}]});
    let bare_hosts = json!([{"reservation": 1, "resource_type": "physical:host",
                             "requested": {"min": 1, "max": 1}}]);

    let (app, secrets) = busy_cloud(Policy::load(None).unwrap()).await;
    for dry in ["", "?dry_run=true"] {
        let path = format!("/v1/leases{dry}");
        // Counts are for everyone, over public properties...
        let r = call(&app, Method::POST, &path, private_hosts(""), ALPHA_MEMBER).await;
        r.assert_status(StatusCode::CONFLICT);
        assert_eq!(r.body["reasons"][0]["matching"], 2);
        assert_eq!(r.body["reasons"][0]["free"], 0);
        let r = call(&app, Method::POST, &path, address.clone(), ALPHA_MEMBER).await;
        r.assert_status(StatusCode::BAD_REQUEST);
        assert_eq!(
            r.body["reasons"],
            json!([{"reservation": 1, "resource_type": "virtual:floatingip",
                    "requested": {"amount": 1, "network_id": "net-1",
                                  "required_floatingips": ["10.0.0.5"]},
                    "matching": 1, "free": 0,
                    "start_date": "2030-01-01T11:00:00.000000",
                    "end_date": "2030-01-01T13:00:00.000000",
                    "next_offer": {"start_date": "2030-01-01T12:00:00.000000",
                                   "end_date": "2030-01-01T14:00:00.000000"}}])
        );
        let text = r.body.to_string();
        for secret in &secrets {
            assert!(!text.contains(secret.as_str()), "{secret} in {text}");
        }
        // ...not over a private one, which they would tell a member about.
        let r = call(
            &app,
            Method::POST,
            &path,
            private_hosts(private_query),
            ALPHA_MEMBER,
        )
        .await;
        r.assert_status(StatusCode::CONFLICT);
        assert_eq!(r.message(), "Not enough hosts available");
        assert_eq!(r.body["reasons"], bare_hosts);
        let r = call(&app, Method::POST, &path, private_hosts(private_query), &[]).await;
        assert_eq!(r.body["reasons"][0]["matching"], 1, "an admin is told");
    }

    // An operator who keeps counts from members.
    let policy = Policy::from_yaml("\"blazar:leases:explain_refusal\": \"rule:admin\"\n").unwrap();
    let (app, _) = busy_cloud(policy).await;
    let r = call(
        &app,
        Method::POST,
        "/v1/leases?dry_run=true",
        private_hosts(""),
        ALPHA_MEMBER,
    )
    .await;
    r.assert_status(StatusCode::CONFLICT);
    assert_eq!(r.message(), "Not enough hosts available");
    assert_eq!(r.body["reasons"], bare_hosts);
    let r = call(
        &app,
        Method::POST,
        "/v1/leases?dry_run=true",
        address,
        ALPHA_MEMBER,
    )
    .await;
    assert_eq!(r.message(), "Not enough floating IPs available");
    assert_eq!(
        r.body["reasons"],
        json!([{"reservation": 1, "resource_type": "virtual:floatingip",
                "requested": {"amount": 1, "network_id": "net-1",
                              "required_floatingips": ["10.0.0.5"]}}])
    );
}
