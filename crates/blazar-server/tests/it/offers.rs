//! "When can I have it?": offers, the earliest-window create and extension checks.

use futures::future::join_all;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::harness::TestApp;

fn hosts(min: i64, max: i64, props: &str) -> Value {
    json!({"resource_type": "physical:host", "min": min, "max": max,
           "hypervisor_properties": "", "resource_properties": props})
}

fn lease(name: &str, start: &str, end: &str, reservations: Value) -> Value {
    json!({"name": name, "start_date": start, "end_date": end, "events": [],
           "reservations": reservations})
}

/// `2030-01-01T10:00:00.000000` as `2030-01-01 10:00`, the form a create takes.
fn input_date(output: &Value) -> String {
    let text = output.as_str().unwrap();
    format!("{} {}", &text[..10], &text[11..16])
}

/// Books an offer with a plain create of its dates and the same reservations, and checks
/// that it is granted exactly what the offer said.
async fn book(app: &TestApp, name: &str, offer: &Value, reservations: &Value) -> String {
    let r = app
        .post(
            "/v1/leases",
            lease(
                name,
                &input_date(&offer["start_date"]),
                &input_date(&offer["end_date"]),
                reservations.clone(),
            ),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{offer}: {}", r.body);
    let id = r.body["lease"]["id"].as_str().unwrap().to_string();
    let mut offered: Vec<String> = offer["reservations"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| {
            ["physical:host", "virtual:instance", "flavor:instance"]
                .contains(&r["resource_type"].as_str().unwrap())
        })
        .flat_map(|r| r["resources"].as_array().unwrap().clone())
        .map(|x| x["id"].as_str().unwrap().to_string())
        .collect();
    offered.sort();
    offered.dedup();
    if !offered.is_empty() {
        assert_eq!(app.hosts_of(&id).await, offered, "{offer}");
    }
    id
}

async fn offers(app: &TestApp, body: Value) -> Vec<Value> {
    let r = app.post("/v1/leases/offers", body).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    r.body["offers"].as_array().unwrap().clone()
}

#[tokio::test]
async fn offers_are_the_earliest_windows_and_booking_one_succeeds() {
    let app = TestApp::spawn().await;
    for i in 1..=4 {
        let rack = if i <= 3 { "r1" } else { "r2" };
        app.create_host(&format!("h{i}"), json!({"rack": rack}))
            .await;
    }
    // h1 and h2 busy until 12:00, h3 from 11:00 to 14:00; h4 is another rack.
    let r = app
        .post(
            "/v1/leases",
            lease(
                "a",
                "2030-01-01 09:00",
                "2030-01-01 12:00",
                json!([hosts(2, 2, r#"["=", "$rack", "r1"]"#)]),
            ),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    assert_eq!(
        app.hosts_of(r.body["lease"]["id"].as_str().unwrap()).await,
        ["1", "2"]
    );
    let r = app
        .post(
            "/v1/leases",
            lease(
                "b",
                "2030-01-01 11:00",
                "2030-01-01 14:00",
                json!([hosts(1, 1, r#"["=", "$rack", "r1"]"#)]),
            ),
        )
        .await;
    assert_eq!(
        app.hosts_of(r.body["lease"]["id"].as_str().unwrap()).await,
        ["3"]
    );

    let request = json!([hosts(2, 2, r#"["=", "$rack", "r1"]"#)]);
    let found = offers(
        &app,
        json!({"reservations": request, "duration": 180,
               "not_before": "2030-01-01 08:00", "not_after": "2030-01-02 08:00", "limit": 3}),
    )
    .await;
    // 08:00 to 09:00 is too short before lease a; from 12:00 h1 and h2 are free again.
    assert_eq!(found.len(), 3, "{found:?}");
    // Numbers may come as strings of them, the limit as the duration.
    let as_text = offers(
        &app,
        json!({"reservations": request, "duration": "180",
               "not_before": "2030-01-01 08:00", "not_after": "2030-01-02 08:00", "limit": "3"}),
    )
    .await;
    assert_eq!(as_text, found);
    assert_eq!(found[0]["start_date"], "2030-01-01T12:00:00.000000");
    assert_eq!(found[0]["end_date"], "2030-01-01T15:00:00.000000");
    assert_eq!(found[0]["duration"], 180);
    assert_eq!(found[1]["start_date"], "2030-01-01T15:00:00.000000");
    let granted = &found[0]["reservations"][0];
    assert_eq!(granted["resource_type"], "physical:host");
    assert_eq!(granted["amount"], 2);
    assert_eq!(
        granted["resources"],
        json!([{"id": "1", "name": "h1"}, {"id": "2", "name": "h2"}])
    );

    // The offer is bookable as it is, and afterwards the next one is later.
    book(&app, "first", &found[0], &request).await;
    let again = offers(
        &app,
        json!({"reservations": request, "duration": 180,
               "not_before": "2030-01-01 08:00", "not_after": "2030-01-02 08:00"}),
    )
    .await;
    // At 14:00 only h3 is free again; from 15:00 all three are.
    assert_eq!(again[0]["start_date"], "2030-01-01T15:00:00.000000");
    assert_eq!(
        again[0]["reservations"][0]["resources"],
        json!([{"id": "1", "name": "h1"}, {"id": "2", "name": "h2"}])
    );
    book(&app, "second", &again[0], &request).await;
}

#[tokio::test]
async fn offers_for_mixed_types_grant_every_reservation() {
    let app = TestApp::spawn().await;
    app.create_host(
        "big",
        json!({"vcpus": 8, "memory_mb": 16384, "local_gb": 100}),
    )
    .await;
    app.create_host(
        "small",
        json!({"vcpus": 2, "memory_mb": 4096, "local_gb": 20}),
    )
    .await;
    let r = app
        .post(
            "/v1/networks",
            json!({"network_type": "vlan", "physical_network": "physnet1", "segment_id": "1001"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let request = json!([
        {"resource_type": "virtual:instance", "amount": 3, "vcpus": 2, "memory_mb": 2048,
         "disk_gb": 10, "affinity": null, "resource_properties": ""},
        {"resource_type": "network", "network_name": "net", "resource_properties": ""},
    ]);
    let found = offers(
        &app,
        json!({"reservations": request, "duration": 60, "not_before": "2030-01-01 10:00"}),
    )
    .await;
    assert_eq!(found.len(), 5);
    assert_eq!(found[0]["start_date"], "2030-01-01T10:00:00.000000");
    let instances = &found[0]["reservations"][0];
    assert_eq!(instances["resource_type"], "virtual:instance");
    assert_eq!(instances["amount"], 3);
    let slots: i64 = instances["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["slots"].as_i64().unwrap())
        .sum();
    assert_eq!(slots, 3);
    let network = &found[0]["reservations"][1];
    assert_eq!(network["resource_type"], "network");
    assert_eq!(network["resources"][0]["name"], "physnet1:1001");
    assert!(network["resources"][0].get("slots").is_none());
    let id = book(&app, "mixed", &found[0], &request).await;
    let shown = app.get(&format!("/v1/leases/{id}")).await;
    assert_eq!(shown.status, StatusCode::OK);
    // The segment is taken for that hour now: the next offer starts when it is over.
    let next = offers(
        &app,
        json!({"reservations": request, "duration": 60, "not_before": "2030-01-01 10:00",
               "limit": 1}),
    )
    .await;
    assert_eq!(next[0]["start_date"], "2030-01-01T11:00:00.000000");
}

#[tokio::test]
async fn longest_offers_with_a_range_of_durations() {
    let app = TestApp::spawn().await;
    app.create_host("h1", json!({})).await;
    for (name, start, end) in [
        ("a", "2030-01-01 10:00", "2030-01-01 11:00"),
        ("b", "2030-01-01 15:00", "2030-01-01 16:00"),
    ] {
        let r = app
            .post(
                "/v1/leases",
                lease(name, start, end, json!([hosts(1, 1, "")])),
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    }
    let found = offers(
        &app,
        json!({"reservations": [hosts(1, 1, "")], "min_duration": 60, "max_duration": 300,
               "not_before": "2030-01-01 08:00", "not_after": "2030-01-01 18:00",
               "order": "longest"}),
    )
    .await;
    let windows: Vec<(String, String)> = found
        .iter()
        .map(|o| (input_date(&o["start_date"]), input_date(&o["end_date"])))
        .collect();
    assert_eq!(
        windows,
        [
            ("2030-01-01 11:00".into(), "2030-01-01 15:00".into()),
            ("2030-01-01 08:00".into(), "2030-01-01 10:00".into()),
            ("2030-01-01 16:00".into(), "2030-01-01 18:00".into()),
        ]
    );
}

/// An offer's dates, as printed, bound the next search as they are: a client pages through
/// windows by passing the last offer's `end_date` as `not_before`.
#[tokio::test]
async fn offers_dates_as_printed_bound_the_next_search() {
    let app = TestApp::spawn().await;
    app.create_host("h1", json!({})).await;
    let request = json!([hosts(1, 1, "")]);
    let first = offers(
        &app,
        json!({"reservations": request, "duration": 60,
               "not_before": "2030-01-01 08:00", "not_after": "2030-01-02 08:00", "limit": 1}),
    )
    .await;
    assert_eq!(first[0]["end_date"], "2030-01-01T09:00:00.000000");
    let next = offers(
        &app,
        json!({"reservations": request, "duration": 60, "limit": 1,
               "not_before": first[0]["end_date"], "not_after": "2030-01-02T08:00:00.000000"}),
    )
    .await;
    assert_eq!(next[0]["start_date"], "2030-01-01T09:00:00.000000");
    // Windows are searched by the minute: a start with seconds rounds up, an end down.
    let inward = offers(
        &app,
        json!({"reservations": request, "duration": 60,
               "not_before": "2030-01-01T09:00:30.500000",
               "not_after": "2030-01-01T10:01:59.000000"}),
    )
    .await;
    assert_eq!(inward.len(), 1, "{inward:?}");
    assert_eq!(inward[0]["start_date"], "2030-01-01T09:01:00.000000");
    assert_eq!(inward[0]["end_date"], "2030-01-01T10:01:00.000000");
    let r = app
        .post(
            "/v1/leases/offers",
            json!({"reservations": request, "duration": 60,
                   "not_before": "2030-01-01T09:00:30.500000",
                   "not_after": "2030-01-01T10:00:59.000000"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
    for bad in [
        "2030-01-01T09:00",
        "2030-02-30T09:00:00.000000",
        "+2030-01-01T09:00:00",
    ] {
        let r = app
            .post(
                "/v1/leases/offers",
                json!({"reservations": request, "duration": 60, "not_before": bad}),
            )
            .await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{bad}: {}", r.body);
    }
    // A create's dates keep Blazar's one form.
    let r = app
        .post(
            "/v1/leases",
            lease(
                "t",
                "2030-01-01T09:00:00.000000",
                "2030-01-01 10:00",
                request.clone(),
            ),
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
}

#[tokio::test]
async fn offer_requests_are_checked_like_creates() {
    let app = TestApp::spawn().await;
    app.create_host("h1", json!({"rack": "r1"})).await;
    let ok = hosts(1, 1, "");
    let cases = [
        (json!({"reservations": [ok], "duration": 0}), "duration"),
        (
            json!({"reservations": [ok], "duration": "soon"}),
            "duration",
        ),
        (json!({"reservations": [ok]}), "Missing parameter duration"),
        (
            json!({"reservations": [ok], "duration": 60, "min_duration": 30}),
            "not both",
        ),
        (
            json!({"reservations": [ok], "min_duration": 90, "max_duration": 30}),
            "max_duration",
        ),
        (json!({"reservations": [], "duration": 60}), "reservations"),
        (
            json!({"reservations": [ok], "duration": 60, "limit": 0}),
            "limit",
        ),
        (
            json!({"reservations": [ok], "duration": 60, "limit": -1}),
            "limit",
        ),
        (
            json!({"reservations": [ok], "duration": 60, "limit": "five"}),
            "limit",
        ),
        (
            json!({"reservations": [ok], "duration": 60, "order": "best"}),
            "order",
        ),
        (
            json!({"reservations": [ok], "duration": 60, "color": "red"}),
            "Unknown field",
        ),
        (
            json!({"reservations": [ok], "duration": 60, "not_before": "tomorrow"}),
            "invalid date",
        ),
        (
            json!({"reservations": [ok], "duration": 60, "not_before": "2030-01-02 00:00",
                   "not_after": "2030-01-01 00:00"}),
            "not_after",
        ),
        (
            json!({"reservations": [ok], "duration": 60, "not_before": "2030-01-01 00:00",
                   "not_after": "2032-01-01 00:00"}),
            "366 days",
        ),
        (
            json!({"reservations": [ok], "duration": 120, "not_before": "2030-01-01 00:00",
                   "not_after": "2030-01-01 01:00"}),
            "cannot fit between",
        ),
        (
            json!({"reservations": [hosts(1, 1, r#"["=", "$colour", "red"]"#)], "duration": 60}),
            "Unknown property $colour",
        ),
        (
            json!({"reservations": [{"resource_type": "physical:host", "min": 2, "max": 1}],
                   "duration": 60}),
            "min",
        ),
        (
            json!({"reservations": [{"resource_type": "teleporter"}], "duration": 60}),
            "teleporter",
        ),
        (
            json!({"reservations": [ok], "duration": 60, "name": "n".repeat(81)}),
            "the limit is 80",
        ),
        // Durations of any size are a 400, never date arithmetic that overflows.
        (
            json!({"reservations": [ok], "duration": 153_722_867_237_713_i64}),
            "longer than 366 days",
        ),
        (
            json!({"reservations": [ok], "min_duration": 60, "max_duration": i64::MAX}),
            "longer than 366 days",
        ),
    ];
    for (body, expected) in cases {
        let r = app.post("/v1/leases/offers", body.clone()).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{body}: {}", r.body);
        assert!(r.message().contains(expected), "{body}: {}", r.message());
        assert_eq!(r.body["error_code"], 400);
    }
    // The same body a create with the same reservations gets, its reasons included.
    let unknown = json!([hosts(1, 1, r#"["=", "$colour", "red"]"#)]);
    let offered = app
        .post(
            "/v1/leases/offers",
            json!({"reservations": unknown, "duration": 60}),
        )
        .await;
    let created = app
        .post(
            "/v1/leases",
            json!({"name": "x", "start_date": "2030-01-01 10:00",
                   "end_date": "2030-01-01 11:00", "reservations": unknown}),
        )
        .await;
    assert!(offered.body.get("reasons").is_some(), "{}", offered.body);
    assert_eq!(offered.body["reasons"], created.body["reasons"]);
    // Nothing fits: an empty list, not an error.
    let none = offers(
        &app,
        json!({"reservations": [hosts(2, 2, "")], "duration": 60}),
    )
    .await;
    assert!(none.is_empty());
}

/// Offers tell a member whose query names a private property when, not which hosts: the
/// hosts that match would tell the property's values.
#[tokio::test]
async fn offers_name_no_resource_picked_by_a_private_property() {
    let mut app = TestApp::spawn().await;
    app.create_host("h1", json!({"secret": "x"})).await;
    app.create_host("h2", json!({"secret": "y"})).await;
    app.patch("/v1/os-hosts/properties/secret", json!({"private": true}))
        .await
        .assert_status(StatusCode::OK);
    let body = json!({"reservations": [hosts(1, 1, r#"["==", "$secret", "x"]"#)],
                      "duration": 60, "not_before": "2030-01-01 00:00"});
    let seen = offers(&app, body.clone()).await;
    assert_eq!(seen[0]["reservations"][0]["resources"][0]["name"], "h1");
    app.act_as("demo", "alice", "member");
    let told = offers(&app, body).await;
    assert_eq!(told[0]["start_date"], seen[0]["start_date"]);
    assert_eq!(told[0]["reservations"][0]["resources"], json!([]));
    // One host was asked for: that one is granted is no secret.
    assert_eq!(told[0]["reservations"][0]["amount"], 1);
    // How many of a range would be granted is.
    let ranged = offers(
        &app,
        json!({"reservations": [hosts(1, 2, r#"["==", "$secret", "x"]"#)], "duration": 60,
               "not_before": "2030-01-01 00:00"}),
    )
    .await;
    assert_eq!(ranged[0]["reservations"][0]["resources"], json!([]));
    assert_eq!(ranged[0]["reservations"][0]["amount"], json!(null));
    // Without the private property the member sees what it would get.
    let plain = offers(
        &app,
        json!({"reservations": [hosts(1, 1, "")], "duration": 60,
               "not_before": "2030-01-01 00:00"}),
    )
    .await;
    assert_eq!(
        plain[0]["reservations"][0]["resources"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    // A dry run books nothing either: it says the lease fits, not on which hosts.
    let dry = |query: &str| {
        lease(
            "dry",
            "2030-01-01 10:00",
            "2030-01-01 11:00",
            json!([hosts(1, 2, query)]),
        )
    };
    let r = app
        .post("/v1/leases?dry_run=true", dry(r#"["==", "$secret", "x"]"#))
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let reservation = &r.body["lease"]["reservations"][0];
    assert!(reservation.get("allocations").is_none(), "{}", r.body);
    let r = app.post("/v1/leases?dry_run=true", dry("")).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let granted = &r.body["lease"]["reservations"][0]["allocations"];
    assert_eq!(granted.as_array().map(Vec::len), Some(2), "{}", r.body);
    // An admin is told.
    app.act_as_admin();
    let r = app
        .post("/v1/leases?dry_run=true", dry(r#"["==", "$secret", "x"]"#))
        .await;
    let granted = &r.body["lease"]["reservations"][0]["allocations"];
    assert_eq!(granted.as_array().map(Vec::len), Some(1), "{}", r.body);
}

#[tokio::test]
async fn earliest_create_books_the_first_offer() {
    let app = TestApp::spawn().await;
    app.create_host("h1", json!({})).await;
    let r = app
        .post(
            "/v1/leases",
            lease(
                "a",
                "2029-12-31 08:30",
                "2029-12-31 10:00",
                json!([hosts(1, 1, "")]),
            ),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let r = app
        .post(
            "/v1/leases",
            json!({"name": "soon", "start_date": "earliest", "duration": 45,
                   "reservations": [hosts(1, 1, "")]}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    // 08:00 to 08:30 is too short; the host is free from 10:00.
    assert_eq!(r.body["lease"]["start_date"], "2029-12-31T10:00:00.000000");
    assert_eq!(r.body["lease"]["end_date"], "2029-12-31T10:45:00.000000");
    let before_end = r.body["lease"]["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["event_type"] == "before_end_lease")
        .map(|e| e["time"].clone());
    assert_eq!(before_end, Some(json!("2029-12-31T10:00:00.000000")));

    let cases = [
        (
            json!({"name": "x", "start_date": "earliest", "reservations": [hosts(1, 1, "")]}),
            "Missing parameter duration",
        ),
        // In any case: a search all the same, not a date missing its end.
        (
            json!({"name": "x", "start_date": "EARLIEST", "reservations": [hosts(1, 1, "")]}),
            "Missing parameter duration",
        ),
        (
            json!({"name": "x", "start_date": "earliest", "duration": 60,
                "end_date": "2030-01-01 00:00", "reservations": [hosts(1, 1, "")]}),
            "end_date cannot be given",
        ),
        (
            json!({"name": "x", "start_date": "2030-01-01 00:00", "end_date": "2030-01-01 01:00",
                "duration": 60, "reservations": [hosts(1, 1, "")]}),
            "only taken with start_date",
        ),
        (
            json!({"name": "x", "start_date": "earliest", "duration": 153_722_867_237_713_i64,
                "reservations": [hosts(1, 1, "")]}),
            "longer than 366 days",
        ),
    ];
    for (body, expected) in cases {
        let r = app.post("/v1/leases", body.clone()).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{body}: {}", r.body);
        assert!(r.message().contains(expected), "{body}: {}", r.message());
    }
    // No window in the search: 409, nothing written.
    let r = app
        .post(
            "/v1/leases",
            json!({"name": "never", "start_date": "earliest", "duration": 60,
                   "not_after": "2029-12-31 09:00", "reservations": [hosts(1, 1, "")]}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.body);
    assert!(
        r.message().contains("No window of 60 minute(s)"),
        "{}",
        r.message()
    );
    let reason = &r.body["reasons"][0];
    assert_eq!(reason["reservation"], 1, "{}", r.body);
    assert_eq!(reason["resource_type"], "physical:host");
    assert_eq!(reason["requested"]["min"], 1, "{}", r.body);
    // A reservation of instances is named by its own type, not the hosts they run on.
    let r = app
        .post(
            "/v1/leases",
            json!({"name": "never", "start_date": "earliest", "duration": 60,
                   "not_after": "2029-12-31 09:00",
                   "reservations": [{"resource_type": "virtual:instance", "amount": 1,
                                     "vcpus": 1, "memory_mb": 512, "disk_gb": 1,
                                     "affinity": null, "resource_properties": ""}]}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.body);
    assert_eq!(
        r.body["reasons"][0]["resource_type"], "virtual:instance",
        "{}",
        r.body
    );
    assert_eq!(
        app.get("/v1/leases").await.body["leases"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
}

/// Fifty concurrent `earliest` creates for one host get fifty consecutive windows that do
/// not overlap: the search and the booking are one transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_concurrent_earliest_creates_get_consecutive_windows() {
    let app = TestApp::spawn().await;
    app.create_host("only", json!({})).await;
    let requests = (0..50).map(|i| {
        app.post(
            "/v1/leases",
            json!({"name": format!("e{i}"), "start_date": "earliest", "duration": 60,
                   "not_before": "2030-01-01 00:00", "reservations": [hosts(1, 1, "")]}),
        )
    });
    let responses = join_all(requests).await;
    let mut starts: Vec<String> = responses
        .iter()
        .map(|r| {
            assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
            r.body["lease"]["start_date"].as_str().unwrap().to_string()
        })
        .collect();
    starts.sort();
    let expected: Vec<String> = (0..50)
        .map(|h| {
            let t = chrono::NaiveDate::from_ymd_opt(2030, 1, 1)
                .unwrap()
                .and_hms_opt(0, 0, 0)
                .unwrap()
                + chrono::Duration::hours(h);
            t.format("%Y-%m-%dT%H:%M:%S%.6f").to_string()
        })
        .collect();
    assert_eq!(starts, expected);
}

/// `earliest` creates racing creates of fixed dates for the same host: a fixed create may
/// lose its hour to an earliest one, but an earliest create is never refused while later
/// windows are free (on PostgreSQL its search may read a window a fixed create is about to
/// take; it then searches again), and no two leases share an hour.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn earliest_creates_racing_fixed_ones_are_never_refused() {
    let app = TestApp::spawn().await;
    app.create_host("only", json!({})).await;
    let earliest = (0..20).map(|i| {
        app.post(
            "/v1/leases",
            json!({"name": format!("e{i}"), "start_date": "earliest", "duration": 60,
                   "not_before": "2030-01-01 00:00", "reservations": [hosts(1, 1, "")]}),
        )
    });
    let fixed = (0..20).map(|h| {
        app.post(
            "/v1/leases",
            json!({"name": format!("f{h}"),
                   "start_date": format!("2030-01-01 {h:02}:00"),
                   "end_date": format!("2030-01-01 {:02}:00", h + 1),
                   "reservations": [hosts(1, 1, "")]}),
        )
    });
    let (earliest, fixed) = tokio::join!(join_all(earliest), join_all(fixed));
    let mut starts = Vec::new();
    for r in &earliest {
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
        starts.push(r.body["lease"]["start_date"].as_str().unwrap().to_string());
    }
    for r in &fixed {
        match r.status {
            StatusCode::CREATED => {
                starts.push(r.body["lease"]["start_date"].as_str().unwrap().to_string())
            }
            StatusCode::CONFLICT => {}
            other => panic!("{other}: {}", r.body),
        }
    }
    let booked = starts.len();
    starts.sort();
    starts.dedup();
    assert_eq!(starts.len(), booked, "one lease per hour: {starts:?}");
}

#[tokio::test]
async fn extension_checks_say_whether_and_how_far() {
    let mut app = TestApp::spawn().await;
    app.create_host("h1", json!({})).await;
    let mine = app
        .post(
            "/v1/leases",
            lease(
                "mine",
                "2030-01-01 10:00",
                "2030-01-01 12:00",
                json!([hosts(1, 1, "")]),
            ),
        )
        .await;
    let id = mine.body["lease"]["id"].as_str().unwrap().to_string();
    let r = app
        .post(
            "/v1/leases",
            lease(
                "next",
                "2030-01-01 14:00",
                "2030-01-01 16:00",
                json!([hosts(1, 1, "")]),
            ),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED);

    let r = app
        .get(&format!("/v1/leases/{id}/extension?prolong_for=1h"))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let e = &r.body["extension"];
    assert_eq!(e["possible"], true);
    assert_eq!(e["requested_end_date"], "2030-01-01T13:00:00.000000");
    assert_eq!(e["latest_end_date"], "2030-01-01T14:00:00.000000");
    assert_eq!(e["end_date"], "2030-01-01T12:00:00.000000");

    let r = app
        .get(&format!(
            "/v1/leases/{id}/extension?end_date=2030-01-01%2015:00"
        ))
        .await;
    let e = &r.body["extension"];
    assert_eq!(e["possible"], false, "{e}");
    // The refusal's own sentence ends before the advice starts.
    assert!(
        e["reason"].as_str().unwrap().ends_with(
            ". Keeping the resources it holds, it can end at 2030-01-01 14:00 at the latest."
        ),
        "{e}"
    );
    // The form dates are shown in is taken too, so a shown end can be asked about as it is.
    let shown = app
        .get(&format!(
            "/v1/leases/{id}/extension?end_date=2030-01-01T15:00:00.000000"
        ))
        .await;
    assert_eq!(shown.status, StatusCode::OK, "{}", shown.body);
    assert_eq!(shown.body["extension"], r.body["extension"]);
    // The answer agrees with an update.
    let refused = app
        .put(
            &format!("/v1/leases/{id}"),
            json!({"end_date": "2030-01-01 15:00"}),
        )
        .await;
    assert_eq!(refused.status, StatusCode::CONFLICT);
    let granted = app
        .put(
            &format!("/v1/leases/{id}"),
            json!({"end_date": "2030-01-01 14:00"}),
        )
        .await;
    assert_eq!(granted.status, StatusCode::OK, "{}", granted.body);
    let r = app.get(&format!("/v1/leases/{id}/extension")).await;
    assert_eq!(
        r.body["extension"]["latest_end_date"],
        json!(null),
        "{}",
        r.body
    );
    assert!(r.body["extension"].get("possible").is_none());

    for bad in [
        "prolong_for=soon",
        "end_date=later",
        "prolong_for=1h&end_date=2030-01-01%2015:00",
        "x=1",
    ] {
        let r = app.get(&format!("/v1/leases/{id}/extension?{bad}")).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{bad}: {}", r.body);
    }
    // A span that reads well but is too long says so, not that it is malformed.
    let r = app
        .get(&format!("/v1/leases/{id}/extension?prolong_for=400d"))
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
    assert!(
        r.message().contains("between 1 minute and 366 days"),
        "{}",
        r.message()
    );
    assert_eq!(
        app.get("/v1/leases/nope/extension").await.status,
        StatusCode::NOT_FOUND
    );
    // Near the calendar's last minute: no answer past it.
    let last = app
        .post(
            "/v1/leases",
            lease(
                "last",
                "9999-12-31 10:00",
                "9999-12-31 12:00",
                json!([hosts(1, 1, "")]),
            ),
        )
        .await;
    assert_eq!(last.status, StatusCode::CREATED, "{}", last.body);
    let last = last.body["lease"]["id"].as_str().unwrap().to_string();
    let r = app
        .get(&format!("/v1/leases/{last}/extension?prolong_for=30d"))
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
    let r = app.get(&format!("/v1/leases/{last}/extension")).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(
        r.body["extension"]["searched_until"], "9999-12-31T23:59:00.000000",
        "{}",
        r.body
    );
    assert_eq!(
        r.body["extension"]["latest_end_date"], "9999-12-31T23:59:00.000000",
        "{}",
        r.body
    );
    // Another project may not ask about the lease.
    app.act_as("other-project", "other-user", "member");
    let r = app.get(&format!("/v1/leases/{id}/extension")).await;
    r.assert_denied("blazar:leases:get");
}

/// An extension the update grants by moving the lease to other resources is possible; the
/// check says it does not keep them, and how far it would go on them.
#[tokio::test]
async fn an_extension_that_moves_the_lease_is_possible_and_says_so() {
    let app = TestApp::spawn().await;
    let h1 = app.create_host("h1", json!({"pin": "yes"})).await;
    let mine = app
        .post(
            "/v1/leases",
            lease(
                "mine",
                "2030-01-01 10:00",
                "2030-01-01 12:00",
                json!([hosts(1, 1, "")]),
            ),
        )
        .await;
    let id = mine.body["lease"]["id"].as_str().unwrap().to_string();
    assert_eq!(app.hosts_of(&id).await, vec![h1.clone()]);
    let h2 = app.create_host("h2", json!({"pin": "no"})).await;
    let r = app
        .post(
            "/v1/leases",
            lease(
                "pinned",
                "2030-01-01 13:00",
                "2030-01-01 16:00",
                json!([hosts(1, 1, r#"["==", "$pin", "yes"]"#)]),
            ),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let pinned = r.body["lease"]["id"].as_str().unwrap().to_string();

    let r = app
        .get(&format!("/v1/leases/{id}/extension?prolong_for=2h"))
        .await;
    let e = &r.body["extension"];
    assert_eq!(e["possible"], true, "{e}");
    assert_eq!(e["keeps_resources"], false, "{e}");
    assert_eq!(e["latest_end_date"], "2030-01-01T13:00:00.000000");
    assert!(e.get("reason").is_none(), "{e}");
    let r = app
        .get(&format!("/v1/leases/{id}/extension?prolong_for=30m"))
        .await;
    assert_eq!(r.body["extension"]["keeps_resources"], true, "{}", r.body);
    // The update agrees, and moves it.
    let r = app
        .put(
            &format!("/v1/leases/{id}"),
            json!({"end_date": "2030-01-01 14:00"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(app.hosts_of(&id).await, vec![h2]);
    assert_eq!(app.hosts_of(&pinned).await, vec![h1]);
}

/// Offers start at a whole minute a create made a moment later still takes: not in the
/// minute that is already running.
#[tokio::test]
async fn offers_start_at_a_minute_a_create_still_takes() {
    let app = TestApp::spawn().await;
    app.create_host("h1", json!({})).await;
    app.set_time(
        chrono::DateTime::parse_from_rfc3339("2030-01-01T10:32:30Z")
            .unwrap()
            .to_utc(),
    );
    let found = offers(
        &app,
        json!({"reservations": [hosts(1, 1, "")], "duration": 60, "limit": 1}),
    )
    .await;
    assert_eq!(found[0]["start_date"], "2030-01-01T10:33:00.000000");
    // Seconds later, in the next minute, the offer is booked as given.
    app.set_time(
        chrono::DateTime::parse_from_rfc3339("2030-01-01T10:33:05Z")
            .unwrap()
            .to_utc(),
    );
    book(&app, "at-once", &found[0], &json!([hosts(1, 1, "")])).await;

    // A create's body without its dates is an offer request as it is.
    let body = json!({"name": "n", "events": [], "before_end_date": null,
                      "reservations": [hosts(1, 1, "")], "duration": 60});
    assert_eq!(offers(&app, body).await.len(), 5);
    let r = app
        .post(
            "/v1/leases/offers",
            json!({"reservations": [hosts(1, 1, "")], "duration": 60,
                   "start_date": "2030-01-02 00:00"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.message().contains("not_before"), "{}", r.message());
    // A warning date would fit some windows and not others: refused, as with "earliest".
    let r = app
        .post(
            "/v1/leases/offers",
            json!({"reservations": [hosts(1, 1, "")], "duration": 60,
                   "before_end_date": "2030-01-02 00:30"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
    assert!(r.message().contains("before_end_date"), "{}", r.message());
    let r = app
        .post(
            "/v1/leases/offers",
            json!({"reservations": [hosts(1, 1, "")], "duration": 60, "not_after": "now"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
    assert!(
        r.message().contains("not_after cannot be now"),
        "{}",
        r.message()
    );
}

/// On random inventories and bookings, every offer is granted, as offered, to a plain
/// create of its dates made at once.
#[tokio::test]
async fn every_offer_is_bookable_as_offered() {
    let mut seed: u64 = 0x5eed_cafe;
    let mut next = move |n: u64| {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (seed >> 33) % n
    };
    for scenario in 0..6 {
        let app = TestApp::spawn().await;
        for h in 0..5 {
            let rack = if next(2) == 0 { "r1" } else { "r2" };
            app.create_host(
                &format!("s{scenario}h{h}"),
                json!({"rack": rack, "vcpus": 4, "memory_mb": 8192, "local_gb": 100}),
            )
            .await;
        }
        // Random bookings over one day, some refused (that is fine).
        for i in 0..8 {
            let start = next(20);
            let len = 1 + next(5);
            let reservation = if next(3) == 0 {
                json!({"resource_type": "virtual:instance", "amount": 1 + next(3), "vcpus": 1,
                       "memory_mb": 1024, "disk_gb": 10, "affinity": null,
                       "resource_properties": ""})
            } else {
                hosts(1, 1 + next(2) as i64, "")
            };
            app.post(
                "/v1/leases",
                lease(
                    &format!("bg{i}"),
                    &format!("2030-01-01 {start:02}:00"),
                    &format!("2030-01-01 {:02}:30", (start + len).min(23)),
                    json!([reservation]),
                ),
            )
            .await;
        }
        let request = json!([
            hosts(1, 1 + next(2) as i64, if next(2) == 0 { r#"["=", "$rack", "r1"]"# } else { "" }),
            {"resource_type": "virtual:instance", "amount": 1 + next(4), "vcpus": 2,
             "memory_mb": 1024, "disk_gb": 10, "affinity": if next(2) == 0 { json!(null) } else { json!(false) },
             "resource_properties": ""},
        ]);
        let found = offers(
            &app,
            json!({"reservations": request, "duration": 60 + 30 * next(4),
                   "not_before": "2030-01-01 00:00", "not_after": "2030-01-02 12:00"}),
        )
        .await;
        for (i, offer) in found.iter().enumerate() {
            let id = book(&app, &format!("offer{i}"), offer, &request).await;
            // The instances land where the offer put them.
            let r = app
                .get(&format!("/v1/os-hosts/allocations?lease_id={id}"))
                .await;
            assert_eq!(r.status, StatusCode::OK);
            let r = app.delete(&format!("/v1/leases/{id}")).await;
            assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.body);
        }
    }
}

/// Blazar answers a floating-IP shortfall with a 400, not the 409 of the other types; it is
/// still a shortfall: it names the next offer, and `earliest` searches past it.
#[tokio::test]
async fn floating_ip_shortfalls_are_blazars_400_and_earliest_searches_past_them() {
    let app = TestApp::spawn().await;
    crate::inventory::fip(&app, "net-1", "172.24.4.10").await;
    let fip = json!([{"resource_type": "virtual:floatingip", "network_id": "net-1",
                      "amount": 1, "required_floatingips": []}]);
    let r = app
        .post(
            "/v1/leases",
            lease("a", "2030-01-01 10:00", "2030-01-01 12:00", fip.clone()),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    for path in ["/v1/leases?dry_run=true", "/v1/leases"] {
        let r = app
            .post(
                path,
                lease("b", "2030-01-01 11:00", "2030-01-01 12:00", fip.clone()),
            )
            .await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
        assert_eq!(r.body["error_code"], 400, "{}", r.body);
        assert!(
            r.message().starts_with("Not enough floating IPs available"),
            "{}",
            r.message()
        );
        assert_eq!(
            r.body["reasons"][0]["next_offer"],
            json!({"start_date": "2030-01-01T12:00:00.000000",
                   "end_date": "2030-01-01T13:00:00.000000"}),
            "{}",
            r.body
        );
    }
    let r = app
        .post(
            "/v1/leases",
            json!({"name": "c", "start_date": "earliest", "duration": 30,
                   "not_before": "2030-01-01 10:30", "reservations": fip}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    assert_eq!(r.body["lease"]["start_date"], "2030-01-01T12:00:00.000000");
}

#[tokio::test]
async fn refusals_name_the_next_offer_of_the_whole_lease() {
    let app = TestApp::spawn().await;
    for i in 1..=3 {
        app.create_host(&format!("h{i}"), json!({})).await;
    }
    let busy = |name: &str, start: &str, end: &str, n: i64| {
        lease(name, start, end, json!([hosts(n, n, "")]))
    };
    // Two hosts busy from 09:00 to 12:00, the third from 11:00 to 14:00.
    let mut ids = Vec::new();
    for (name, start, end, n) in [
        ("a", "2030-01-01 09:00", "2030-01-01 12:00", 2),
        ("b", "2030-01-01 11:00", "2030-01-01 14:00", 1),
    ] {
        let r = app.post("/v1/leases", busy(name, start, end, n)).await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
        ids.push(r.body["lease"]["id"].as_str().unwrap().to_string());
    }

    // Two hosts for three hours from 10:00 do not fit; the same window from 12:00 does,
    // and it is what the offer search answers for the same request.
    let refused_request = busy("c", "2030-01-01 10:00", "2030-01-01 13:00", 2);
    for path in ["/v1/leases?dry_run=true", "/v1/leases"] {
        let r = app.post(path, refused_request.clone()).await;
        assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.body);
        assert_eq!(
            r.body["reasons"][0]["next_offer"],
            json!({"start_date": "2030-01-01T12:00:00.000000",
                   "end_date": "2030-01-01T15:00:00.000000"}),
            "{}",
            r.body
        );
    }
    let found = offers(
        &app,
        json!({"reservations": [hosts(2, 2, "")], "duration": 180,
               "not_before": "2030-01-01 10:00"}),
    )
    .await;
    assert_eq!(found[0]["start_date"], "2030-01-01T12:00:00.000000");

    // The next offer is for the whole lease: with a second reservation of one more host,
    // three hosts are needed together, free only once lease b is over.
    let both = lease(
        "d",
        "2030-01-01 10:00",
        "2030-01-01 13:00",
        json!([hosts(2, 2, ""), hosts(1, 1, "")]),
    );
    let r = app.post("/v1/leases", both).await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.body);
    let next = &r.body["reasons"][0]["next_offer"];
    assert_eq!(
        next["start_date"], "2030-01-01T14:00:00.000000",
        "{}",
        r.body
    );
    // Booking it as named succeeds.
    let r = app
        .post(
            "/v1/leases",
            lease(
                "d",
                &input_date(&next["start_date"]),
                &input_date(&next["end_date"]),
                json!([hosts(2, 2, ""), hosts(1, 1, "")]),
            ),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);

    // A refused update of a lease that has not started: where the lease could move to,
    // its own hours not counting against it. Lease a stretched to 15:00 needs two hosts for
    // six hours; they are free from 09:00 to 14:00 only (d takes all three from 14:00 to
    // 17:00), so the next such window starts at 17:00.
    let r = app
        .put(
            &format!("/v1/leases/{}", ids[0]),
            json!({"end_date": "2030-01-01 15:00"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.body);
    assert_eq!(
        r.body["reasons"][0]["next_offer"],
        json!({"start_date": "2030-01-01T17:00:00.000000",
               "end_date": "2030-01-01T23:00:00.000000"}),
        "{}",
        r.body
    );
}

/// A pending lease moved to start now asks for a start within the current minute; it has
/// not started, so its refusal names where it could go.
#[tokio::test]
async fn an_update_of_a_pending_lease_to_start_now_names_the_next_offer() {
    let app = TestApp::spawn().await;
    app.create_host("h1", json!({})).await;
    let r = app
        .post(
            "/v1/leases",
            lease(
                "busy",
                "2030-01-01 10:00",
                "2030-01-01 11:00",
                json!([hosts(1, 1, "")]),
            ),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let r = app
        .post(
            "/v1/leases",
            lease(
                "later",
                "2030-01-01 12:00",
                "2030-01-01 13:00",
                json!([hosts(1, 1, "")]),
            ),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let later = r.body["lease"]["id"].as_str().unwrap().to_string();
    // Twenty seconds into 10:15, while the host is busy.
    app.set_time(
        chrono::DateTime::parse_from_rfc3339("2030-01-01T10:15:20Z")
            .unwrap()
            .to_utc(),
    );
    let r = app
        .put(
            &format!("/v1/leases/{later}"),
            json!({"start_date": "now", "end_date": "2030-01-01 10:45"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.body);
    // Thirty minutes from when the host is free, the lease's own hours not in the way.
    assert_eq!(
        r.body["reasons"][0]["next_offer"],
        json!({"start_date": "2030-01-01T11:00:00.000000",
               "end_date": "2030-01-01T11:30:00.000000"}),
        "{}",
        r.body
    );
}

#[tokio::test]
async fn instance_offers_over_many_hosts_are_granted_as_offered() {
    let app = TestApp::spawn().await;
    // More hosts than two probes of the instance search read (32, then 64 more); the first
    // 40 are full from 10:00 to 12:00 and host 110 is in use, so where the instances go
    // depends on how far the search reads: a search of every host would pack onto 110.
    let mut ids = Vec::new();
    for i in 1..=120 {
        ids.push(
            app.create_host(
                &format!("c{i:02}"),
                json!({"vcpus": 4, "memory_mb": 8192, "local_gb": 100, "n": i.to_string()}),
            )
            .await,
        );
    }
    let instances = |amount: i64, vcpus: i64| {
        json!([{"resource_type": "virtual:instance", "amount": amount, "vcpus": vcpus,
                "memory_mb": 1024, "disk_gb": 10, "affinity": false,
                "resource_properties": ""}])
    };
    let r = app
        .post(
            "/v1/leases",
            lease(
                "full",
                "2030-01-01 10:00",
                "2030-01-01 12:00",
                instances(40, 4),
            ),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let held = app.hosts_of(r.body["lease"]["id"].as_str().unwrap()).await;
    let mut first = ids[..40].to_vec();
    first.sort();
    assert_eq!(held, first, "the first hosts in id order");
    let r = app
        .post(
            "/v1/leases",
            lease(
                "one",
                "2030-01-01 09:00",
                "2030-01-01 13:00",
                json!([{"resource_type": "virtual:instance", "amount": 1, "vcpus": 2,
                        "memory_mb": 1024, "disk_gb": 10, "affinity": null,
                        "resource_properties": r#"["==", "$n", "110"]"#}]),
            ),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);

    for (amount, affinity) in [(3, "false"), (2, "null"), (1, "true")] {
        let mut request = instances(amount, 2);
        request[0]["affinity"] = serde_json::from_str(affinity).unwrap();
        let found = offers(
            &app,
            json!({"reservations": request, "duration": 60,
                   "not_before": "2030-01-01 10:00", "limit": 1}),
        )
        .await;
        assert_eq!(found[0]["start_date"], "2030-01-01T10:00:00.000000");
        book(&app, &format!("i{amount}"), &found[0], &request).await;
    }
}

/// More hosts than a search's probe reads (256), all taken from 10:00 to 12:00 but host
/// `free`; a probe over the others finds nothing before 12:00.
async fn all_taken_but(free: usize) -> TestApp {
    let app = TestApp::spawn().await;
    for i in 1..=300 {
        app.create_host(&format!("p{i:03}"), json!({"n": i.to_string()}))
            .await;
    }
    let others = json!(["!=", "$n", free.to_string()]).to_string();
    let r = app
        .post(
            "/v1/leases",
            lease(
                "most",
                "2030-01-01 10:00",
                "2030-01-01 12:00",
                json!([hosts(299, 299, &others)]),
            ),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    app
}

/// An `earliest` create probes the hosts creates take last (the end of the preference
/// order); where every one of them is taken, the window still starts where any host is
/// free, found by reading them all.
#[tokio::test]
async fn earliest_creates_look_past_the_probed_hosts() {
    let app = all_taken_but(1).await;
    let earliest = |name: &str, min: i64, not_before: &str| {
        json!({"name": name, "start_date": "earliest", "duration": 60,
               "not_before": not_before, "reservations": [hosts(min, min, "")]})
    };
    let expected = [
        // The one host left free.
        ("one", 1, "2030-01-01 10:00", "2030-01-01T10:00:00.000000"),
        // That host again, once the first has ended.
        ("two", 1, "2030-01-01 10:00", "2030-01-01T11:00:00.000000"),
        // Two of them free at once from 12:00 (the first probe answers).
        ("three", 2, "2030-01-01 12:00", "2030-01-01T12:00:00.000000"),
        // More than a probe holds.
        (
            "four",
            280,
            "2030-01-01 10:30",
            "2030-01-01T12:00:00.000000",
        ),
    ];
    for (name, min, not_before, start) in expected {
        let r = app
            .post("/v1/leases", earliest(name, min, not_before))
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{name}: {}", r.body);
        assert_eq!(r.body["lease"]["start_date"], start, "{name}");
    }
}

/// Offers probe the first hosts of the preference order (those a create of the offer would
/// be granted); where every one of them is taken, the offers come from the rest, and each
/// is booked as offered.
#[tokio::test]
async fn offers_over_many_hosts_look_past_the_probed_ones() {
    let app = all_taken_but(300).await;
    let starts = |found: &[Value]| -> Vec<String> {
        found
            .iter()
            .map(|o| o["start_date"].as_str().unwrap().to_string())
            .collect()
    };
    let cases = [
        // One host is free while the others are taken: the offers start with it.
        (
            1,
            "2030-01-01 10:00",
            [
                "2030-01-01T10:00:00.000000",
                "2030-01-01T11:00:00.000000",
                "2030-01-01T12:00:00.000000",
            ],
        ),
        // Every host is free from 12:00: the first probe answers.
        (
            2,
            "2030-01-01 12:00",
            [
                "2030-01-01T12:00:00.000000",
                "2030-01-01T13:00:00.000000",
                "2030-01-01T14:00:00.000000",
            ],
        ),
    ];
    for (i, (count, not_before, expected)) in cases.into_iter().enumerate() {
        let request = json!([hosts(count, count, "")]);
        let found = offers(
            &app,
            json!({"reservations": request, "duration": 60,
                   "not_before": not_before, "limit": 3}),
        )
        .await;
        assert_eq!(starts(&found), expected, "{not_before}");
        book(&app, &format!("b{i}"), &found[0], &request).await;
    }
}

/// The last days of year 9999: a window found there ends by its last minute (the wire
/// cannot write a later date), and a search that starts at that minute has no room.
#[tokio::test]
async fn earliest_windows_end_by_the_last_writable_minute() {
    let app = TestApp::spawn().await;
    app.create_host("h1", json!({})).await;
    let r = app
        .post(
            "/v1/leases",
            json!({"name": "late", "start_date": "earliest", "duration": 1440,
                   "not_before": "9999-12-30 12:00", "reservations": [hosts(1, 1, "")]}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    assert_eq!(r.body["lease"]["end_date"], "9999-12-31T12:00:00.000000");
    let r = app
        .post(
            "/v1/leases",
            json!({"name": "later", "start_date": "earliest", "duration": 60,
                   "not_before": "9999-12-31 23:59", "reservations": [hosts(1, 1, "")]}),
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
    // It names what the caller sent, not the default end it did not.
    assert!(
        r.message()
            .contains("not_before (9999-12-31 23:59) leaves no time"),
        "{}",
        r.message()
    );
    let r = app
        .post(
            "/v1/leases/offers",
            json!({"duration": 30, "not_before": "9999-12-31 23:00",
                   "reservations": [hosts(1, 1, "")]}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let found = r.body["offers"].as_array().unwrap();
    assert!(!found.is_empty(), "{}", r.body);
    for offer in found {
        assert!(offer["end_date"].as_str().unwrap() <= "9999-12-31T23:59:00.000000");
    }
    assert_eq!(
        app.get("/v1/leases").await.body["leases"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
}

/// A lease of more reservations than anyone books is refused before any search.
#[tokio::test]
async fn a_lease_of_too_many_reservations_is_refused() {
    let app = TestApp::spawn().await;
    app.create_host("h1", json!({})).await;
    let many: Vec<Value> = (0..101).map(|_| hosts(1, 1, "")).collect();
    for (path, body) in [
        (
            "/v1/leases",
            json!({"name": "many", "start_date": "earliest", "duration": 60,
                   "reservations": many}),
        ),
        (
            "/v1/leases",
            lease("many", "2030-01-01 10:00", "2030-01-01 11:00", json!(many)),
        ),
        (
            "/v1/leases/offers",
            json!({"duration": 60, "reservations": many}),
        ),
    ] {
        let r = app.post(path, body).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{path}: {}", r.body);
        assert!(
            r.message().contains("at most 100 reservations"),
            "{}",
            r.message()
        );
    }
    assert!(
        app.get("/v1/leases").await.body["leases"]
            .as_array()
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn a_lease_longer_than_the_default_search_is_still_offered() {
    let app = TestApp::spawn().await;
    app.create_host("h1", json!({})).await;
    // Forty days: the default search reaches thirty days past the longest duration.
    let found = offers(
        &app,
        json!({"reservations": [hosts(1, 1, "")], "duration": 40 * 24 * 60,
               "not_before": "2040-01-01 00:00", "limit": 1}),
    )
    .await;
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0]["start_date"], "2040-01-01T00:00:00.000000");
    assert_eq!(found[0]["end_date"], "2040-02-10T00:00:00.000000");
}

/// A leap second (`:60`) is no time stamp of this service: a search or an `earliest` create
/// that names one is refused, instead of starting a second before the next minute.
#[tokio::test]
async fn a_leap_second_is_refused_as_a_date() {
    let app = TestApp::spawn().await;
    app.create_host("h", json!({})).await;
    let reservations = json!([{"resource_type": "physical:host", "min": 1, "max": 1,
                               "hypervisor_properties": "", "resource_properties": ""}]);
    let leap = "2031-05-01T10:00:60.000000";
    let r = app
        .post(
            "/v1/leases/offers",
            json!({"reservations": reservations, "duration": 60, "not_before": leap}),
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
    let r = app
        .post(
            "/v1/leases",
            json!({"name": "leap", "start_date": "earliest", "duration": 60,
                   "not_before": leap, "reservations": reservations}),
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
    assert_eq!(app.get("/v1/leases").await.body["leases"], json!([]));
    let r = app
        .get("/v1/os-hosts/timeline?start=9999-12-31T23:58:60.000000")
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
}
